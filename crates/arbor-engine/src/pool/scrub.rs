//! The scrub's mechanism: reads every live data chunk once, by physical
//! chunk (a chunk that a thousand snapshots share is read once), and
//! verifies every block that has a sum (docs/FORMAT.md §6.4). The pace,
//! the cursor kept across restarts and the progress are the caller's
//! (`arbor-daemon`'s scrub): this is one bounded step at a time, holding
//! no lock while it reads.
//!
//! A block that does not match its sum is read again, with its sum, with
//! the pool gate held exclusive (no write in flight: an in-place write
//! changes data and sum under it, not at one instant); only a mismatch
//! then is damage, noted as a read's is (`Pool::after_damage`).
//!
//! A block of a live chunk that has no sum (written before the pool had
//! checksums, a home's block not written since the home was built, a
//! partial's block outside its mask) is given one from what the device
//! holds, so that after one scrub every block of an upgraded pool is
//! covered (docs/FORMAT.md §6.4, "Sums added by the scrub"): again with
//! the gate exclusive, so no write is between the read and the sum, and
//! not while a home is being built (its copy is written without sums).
//! A pool whose metadata cannot take them keeps scrubbing without.

use super::*;
use crate::sums::{BlockSums, ChunkSums};

/// Largest device read of one scrub step: a run of consecutive live
/// chunks, up to this many bytes.
const READ_RUN_BYTES: u64 = 1 << 20;
/// The alignment of the scrub's read buffers (a page: what direct I/O
/// needs of memory).
const ALIGN: usize = 4096;
/// Device reads a step keeps in flight (threads, each reading and summing
/// its runs in turn).
const READS_IN_FLIGHT: usize = 8;
/// Most chunks one step looks at (live or not), so that a step over a
/// sparse pool still returns soon.
const STEP_CHUNKS: u64 = 1 << 16;

/// What one scrub step did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScrubStep {
    /// The chunk the next step starts at; at or past `data_chunks` when
    /// the scrub is done.
    pub next: u64,
    /// The pool's data chunks now (the end of the scrub).
    pub data_chunks: u64,
    /// Live chunks read, and their bytes.
    pub chunks: u64,
    pub bytes: u64,
    /// Blocks verified against their sums, and those found damaged.
    pub verified_blocks: u64,
    pub damaged_blocks: u64,
    /// Blocks that had no sum and were given one.
    pub sums_added: u64,
}

impl Pool {
    /// Scrubs live data chunks from chunk `from` on, reading at most about
    /// `max_bytes` (at least one run) and looking at most at 65,536 chunks.
    pub fn scrub_step(&self, from: u64, max_bytes: u64) -> Result<ScrubStep> {
        let cs = self.chunk_size();
        // Under the lock: the live chunks of the step and their sums.
        let (data_chunks, live) = {
            let meta = self.read_meta()?;
            let data_chunks = meta.meta().entries(arbor_format::SmKind::Data);
            let end = from.saturating_add(STEP_CHUNKS).min(data_chunks);
            let budget = max_bytes.max(cs).div_ceil(cs);
            let mut live: Vec<(u64, ChunkSums)> = Vec::new();
            let mut c = from;
            while c < end && (live.len() as u64) < budget {
                if meta.meta().data_count(c)? > 0 {
                    live.push((c, ChunkSums::of(meta.meta(), c)?));
                }
                c += 1;
            }
            (data_chunks, (live, c))
        };
        let (live, next) = live;
        let mut step = ScrubStep {
            next,
            data_chunks,
            ..ScrubStep::default()
        };
        // Runs of consecutive chunks, one device read each, several in
        // flight (a device reads faster with a queue, and both cores sum).
        let mut runs: Vec<&[(u64, ChunkSums)]> = Vec::new();
        let mut i = 0;
        while i < live.len() {
            let mut j = i + 1;
            while j < live.len()
                && live[j].0 == live[j - 1].0 + 1
                && (j - i + 1) as u64 * cs <= READ_RUN_BYTES
            {
                j += 1;
            }
            runs.push(&live[i..j]);
            i = j;
        }
        let next_run = std::sync::atomic::AtomicUsize::new(0);
        let results: Vec<Result<(u64, u64, u64)>> = if let [run] = runs[..] {
            // One run (a busy pace's short step): read here, no thread.
            vec![self.scrub_run(run, &mut Vec::new())]
        } else {
            std::thread::scope(|s| {
                let workers: Vec<_> = (0..READS_IN_FLIGHT.min(runs.len()))
                    .map(|_| {
                        s.spawn(|| -> Result<(u64, u64, u64)> {
                            let (mut verified, mut damaged, mut added) = (0, 0, 0);
                            let mut buf = Vec::new();
                            loop {
                                let k = next_run.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                let Some(run) = runs.get(k) else {
                                    return Ok((verified, damaged, added));
                                };
                                let (v, d, a) = self.scrub_run(run, &mut buf)?;
                                verified += v;
                                damaged += d;
                                added += a;
                            }
                        })
                    })
                    .collect();
                workers
                    .into_iter()
                    .map(|w| {
                        w.join()
                            .unwrap_or_else(|_| Err(Error::inconsistent("a scrub reader panicked")))
                    })
                    .collect()
            })
        };
        for r in results {
            let (verified, damaged, added) = r?;
            step.verified_blocks += verified;
            step.damaged_blocks += damaged;
            step.sums_added += added;
        }
        step.chunks = live.len() as u64;
        step.bytes = live.len() as u64 * cs;
        Ok(step)
    }

    /// Reads one run of consecutive live chunks and verifies every block
    /// that has a sum, and gives one to those that have none: (blocks
    /// verified, blocks found damaged, sums added).
    fn scrub_run(&self, run: &[(u64, ChunkSums)], buf: &mut Vec<u8>) -> Result<(u64, u64, u64)> {
        let cs = self.chunk_size() as usize;
        let (mut verified, mut damaged) = (0, 0);
        let mut unsummed = Vec::new();
        // Aligned to a page, so that a device opened for direct I/O reads
        // straight into it (no bounce copy).
        let len = run.len() * cs;
        buf.resize(len + ALIGN, 0);
        let skip = buf.as_ptr().align_offset(ALIGN).min(ALIGN);
        let data = &mut buf[skip..skip + len];
        self.store
            .dev
            .read_at(data, self.store.geo.chunk_offset(run[0].0))?;
        for ((pchunk, sums), data) in run.iter().zip(data.chunks(cs)) {
            for (b, bytes) in (0u32..).zip(data.chunks(arbor_format::SUM_BLOCK)) {
                if sums.get(b).is_none() {
                    if unsummed.last() != Some(pchunk) {
                        unsummed.push(*pchunk);
                    }
                    continue;
                }
                verified += 1;
                if sums.verify(b, bytes).is_err() && self.scrub_confirm(*pchunk, b)? {
                    damaged += 1;
                }
            }
        }
        let added = if unsummed.is_empty() || !self.store.geo.version().has_data_checksums() {
            0
        } else {
            self.scrub_add_sums(&unsummed, buf)?
        };
        Ok((verified, damaged, added))
    }

    /// Gives every block of chunks `chunks` that has no sum one, from what
    /// the device holds, with the pool gate exclusive (no write in flight,
    /// so none between the read and the sum), unless a home is being built
    /// (its copy is written without sums). Returns the sums added; none,
    /// logged, when the metadata cannot take them.
    fn scrub_add_sums(&self, chunks: &[u64], buf: &mut Vec<u8>) -> Result<u64> {
        let Some(_no_home_built) = self.origins.no_home_building() else {
            return Ok(0);
        };
        let geo = &self.store.geo;
        let cs = geo.chunk_size as usize;
        let _gate = self.gates.commit();
        let mut add = Vec::new();
        {
            let meta = self.read_meta()?;
            buf.resize(cs, 0);
            for &pchunk in chunks {
                if meta.meta().data_count(pchunk)? == 0 {
                    // Freed since the step looked.
                    continue;
                }
                let sums = ChunkSums::of(meta.meta(), pchunk)?;
                self.store.dev.read_at(buf, geo.chunk_offset(pchunk))?;
                for (b, block) in (0u32..).zip(buf.chunks(arbor_format::SUM_BLOCK)) {
                    if sums.get(b).is_none() {
                        add.push(BlockSums {
                            pchunk,
                            first: b,
                            sums: vec![Some(arbor_format::block_sum(block))],
                        });
                    }
                }
            }
        }
        if add.is_empty() {
            return Ok(0);
        }
        let mut meta = self.write_meta()?;
        match self.mutate(&mut meta, Privilege::Normal, |m| m.record_sums(&add)) {
            Ok(()) => Ok(add.len() as u64),
            Err(e @ Error::Exhausted(_)) => {
                tracing::debug!(error = %e, blocks = add.len(), "the scrub gives no sums to blocks that have none this step: no room");
                Ok(0)
            }
            Err(e) => Err(e),
        }
    }

    /// Reads block `block` of chunk `pchunk` again with its sum, no write
    /// in flight; whether it is damaged (then noted).
    fn scrub_confirm(&self, pchunk: u64, block: u32) -> Result<bool> {
        let verified = {
            let _gate = self.gates.commit();
            let meta = self.read_meta()?;
            if meta.meta().data_count(pchunk)? == 0 {
                // Freed since the step looked.
                return Ok(false);
            }
            let sums = ChunkSums::of(meta.meta(), pchunk)?;
            let mut bytes = vec![0u8; arbor_format::SUM_BLOCK];
            self.store.dev.read_at(
                &mut bytes,
                self.store.geo.chunk_offset(pchunk)
                    + u64::from(block) * arbor_format::SUM_BLOCK_U64,
            )?;
            sums.verify(block, &bytes)
        };
        match verified {
            Ok(()) => Ok(false),
            Err(damage) => {
                self.note_damage(&damage);
                Ok(true)
            }
        }
    }
}
