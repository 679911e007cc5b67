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
use std::ops::Range;

use crate::sums::{BlockSums, ChunkSums};

/// Largest device read of one scrub step: a run of consecutive live
/// chunks, up to this many bytes.
const READ_RUN_BYTES: u64 = 1 << 20;
/// The alignment of the scrub's read buffers (a page: what direct I/O
/// needs of memory).
const ALIGN: usize = 4096;
/// Device reads a scrub keeps in flight (threads, each reading and summing
/// its runs in turn).
const READS_IN_FLIGHT: usize = 8;
/// Steps whose reads [`Pool::scrub`] queues at once: the next step's
/// reads are queued while this one's are in flight, so that the readers
/// never run dry at a step's end.
const STEPS_AHEAD: usize = 2;
/// Most chunks one step looks at (live or not), so that a step over a
/// sparse pool still returns soon.
const STEP_CHUNKS: u64 = 1 << 16;

/// `len` bytes of `buf`, aligned to a page, so that a device opened for
/// direct I/O reads straight into them (no bounce copy).
fn aligned(buf: &mut Vec<u8>, len: usize) -> &mut [u8] {
    buf.resize(len + ALIGN, 0);
    let skip = buf.as_ptr().align_offset(ALIGN).min(ALIGN);
    &mut buf[skip..skip + len]
}

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
    /// Blocks that had no sum and were not given one because a home was
    /// being built meanwhile (its copy is written without sums): a later
    /// step over them gives them one.
    pub sums_deferred: u64,
}

/// One step's live chunks, in jobs (one per leaf of the checksum tree)
/// of runs of consecutive chunks (one device read each). A job's sums are
/// looked up by its reader: one leaf each, so that the leaves of several
/// jobs are read at once, beside the data reads, not one after another in
/// the plan, and no two readers read the same leaf.
struct Plan {
    /// The step's `next` and `data_chunks`, and its chunks and bytes.
    step: ScrubStep,
    jobs: Vec<Job>,
}

/// Consecutive live chunks: one device read.
type Run = std::ops::Range<u64>;

/// The runs of live chunks whose sums are in one leaf of the checksum tree.
type Job = Vec<Run>;

/// What a reader gives back for one job: the index of its step, and the
/// job's counts.
type JobDone = (u64, Result<Counts>);

/// What reading a run or a job found.
#[derive(Debug, Clone, Copy, Default)]
struct Counts {
    verified: u64,
    damaged: u64,
    added: u64,
    deferred: u64,
}

impl Counts {
    fn add(&mut self, other: Counts) {
        self.verified += other.verified;
        self.damaged += other.damaged;
        self.added += other.added;
        self.deferred += other.deferred;
    }

    fn add_to(self, step: &mut ScrubStep) {
        step.verified_blocks += self.verified;
        step.damaged_blocks += self.damaged;
        step.sums_added += self.added;
        step.sums_deferred += self.deferred;
    }
}

/// The jobs waiting for a reader, shared by the readers of a scrub.
#[derive(Default)]
struct Queue {
    /// The jobs with the index of their step; `closed`: no more will come.
    state: Mutex<(std::collections::VecDeque<(u64, Job)>, bool)>,
    ready: std::sync::Condvar,
}

/// Closes its queue when dropped.
struct CloseOnDrop<'a>(&'a Queue);

impl Drop for CloseOnDrop<'_> {
    fn drop(&mut self) {
        self.0.close();
    }
}

impl Queue {
    fn lock(&self) -> std::sync::MutexGuard<'_, (std::collections::VecDeque<(u64, Job)>, bool)> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn push(&self, step: u64, jobs: Vec<Job>) {
        self.lock().0.extend(jobs.into_iter().map(|j| (step, j)));
        self.ready.notify_all();
    }

    /// Drops the jobs no reader has taken and lets the readers end.
    fn close(&self) {
        let mut state = self.lock();
        state.0.clear();
        state.1 = true;
        drop(state);
        self.ready.notify_all();
    }

    /// Whether the queue is closed (the scrub stopped).
    fn closed(&self) -> bool {
        self.lock().1
    }

    /// The next job; None once closed.
    fn take(&self) -> Option<(u64, Job)> {
        let mut state = self.lock();
        loop {
            if let Some(job) = state.0.pop_front() {
                return Some(job);
            }
            if state.1 {
                return None;
            }
            state = self.ready.wait(state).unwrap_or_else(|p| p.into_inner());
        }
    }
}

impl Pool {
    /// Scrubs live data chunks from chunk `from` on, reading at most about
    /// `max_bytes` (at least one run) and looking at most at 65,536 chunks:
    /// one step of [`Pool::scrub`] (a busy pool's short step is read here,
    /// with no thread).
    pub fn scrub_step(&self, from: u64, max_bytes: u64) -> Result<ScrubStep> {
        self.scrub_step_within(from, u64::MAX, max_bytes)
    }

    /// [`Pool::scrub_step`] of the chunks before `end` only.
    pub(super) fn scrub_step_within(
        &self,
        from: u64,
        end: u64,
        max_bytes: u64,
    ) -> Result<ScrubStep> {
        let plan = self.scrub_plan(from, end, max_bytes)?;
        if plan.step.bytes <= READ_RUN_BYTES {
            let mut step = plan.step;
            let mut buf = Vec::new();
            for run in plan.jobs.into_iter().flatten() {
                let data = aligned(&mut buf, self.run_bytes(&run)?);
                self.scrub_run(run, data)?.add_to(&mut step);
            }
            return Ok(step);
        }
        let mut out = plan.step;
        self.scrub_planned(plan, end, max_bytes, 1, |step| {
            out = *step;
            false
        })?;
        Ok(out)
    }

    /// Scrubs live data chunks from chunk `from` on, in steps of about
    /// `step_bytes` (as [`Pool::scrub_step`]'s), without a pause between
    /// them: the next step's chunks are looked up and its reads queued
    /// while this one's are in flight, so the device never waits for the
    /// scrub. After each step, in order, `go_on` is told what it did (its
    /// `next` is where a scrub stopped after it goes on from: every chunk
    /// before it has been read and verified) and says whether to go on.
    /// Returns after the step that reaches the end, the first step
    /// `go_on` stops at, or an error (the steps told before it stand);
    /// reads of later steps in flight then are waited for and not told.
    pub fn scrub(
        &self,
        from: u64,
        step_bytes: u64,
        go_on: impl FnMut(&ScrubStep) -> bool,
    ) -> Result<()> {
        self.scrub_within(from..u64::MAX, step_bytes, go_on)
    }

    /// [`Pool::scrub`] of the chunks of `range` only: its last step is the
    /// one whose `next` reaches the range's end (or the pool's).
    pub(super) fn scrub_within(
        &self,
        range: Range<u64>,
        step_bytes: u64,
        go_on: impl FnMut(&ScrubStep) -> bool,
    ) -> Result<()> {
        let plan = self.scrub_plan(range.start, range.end, step_bytes)?;
        self.scrub_planned(plan, range.end, step_bytes, STEPS_AHEAD, go_on)
    }

    /// [`Pool::scrub`] from a first step already planned, up to chunk
    /// `end`, with up to `ahead` steps queued at once (1: one step at a
    /// time).
    fn scrub_planned(
        &self,
        first: Plan,
        end: u64,
        step_bytes: u64,
        ahead: usize,
        mut go_on: impl FnMut(&ScrubStep) -> bool,
    ) -> Result<()> {
        let queue = Queue::default();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<JobDone>();
        std::thread::scope(|s| {
            for _ in 0..READS_IN_FLIGHT {
                let done = done_tx.clone();
                let queue = &queue;
                s.spawn(move || {
                    // Each reader keeps its buffer: allocated once, in huge
                    // pages where the kernel has them (so that a run's read
                    // leaves as one request).
                    let mut buf = None;
                    while let Some((step, job)) = queue.take() {
                        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            self.scrub_job(job, &mut buf, queue)
                        }))
                        .unwrap_or_else(|_| Err(Error::inconsistent("a scrub reader panicked")));
                        if done.send((step, result)).is_err() {
                            return;
                        }
                    }
                });
            }
            drop(done_tx);
            // Runs not yet taken are dropped; those being read end with
            // the scope. Closed on the way out whatever way that is (a
            // `go_on` that panics too, or the scope would wait for the
            // readers forever).
            let _close = CloseOnDrop(&queue);
            self.scrub_steps(first, end, step_bytes, ahead, &queue, &done_rx, &mut go_on)
        })
    }

    /// The scrub's coordinator: plans steps ahead of the readers, gathers
    /// what they did, and tells `go_on` of each step in order.
    #[allow(clippy::too_many_arguments)]
    fn scrub_steps(
        &self,
        first: Plan,
        end: u64,
        step_bytes: u64,
        ahead: usize,
        queue: &Queue,
        done: &std::sync::mpsc::Receiver<JobDone>,
        go_on: &mut impl FnMut(&ScrubStep) -> bool,
    ) -> Result<()> {
        // The steps planned and not yet told, oldest first (the index of
        // the first is `told`), with the jobs each still waits for.
        let mut steps: std::collections::VecDeque<(ScrubStep, usize)> = Default::default();
        let mut told = 0u64;
        let mut first = Some(first);
        // Where the step after the last one planned starts (None: the
        // last one planned reaches the end).
        let mut then = None;
        loop {
            while steps.len() < ahead {
                let plan = match (first.take(), then.take()) {
                    (Some(plan), _) => plan,
                    (None, Some(from)) => self.scrub_plan(from, end, step_bytes)?,
                    (None, None) => break,
                };
                let index = told + steps.len() as u64;
                let step = plan.step;
                steps.push_back((step, plan.jobs.len()));
                queue.push(index, plan.jobs);
                then = (step.next < step.data_chunks.min(end)).then_some(step.next);
            }
            while let Some(&(step, 0)) = steps.front() {
                steps.pop_front();
                told += 1;
                // The last step is told too.
                if !go_on(&step) || step.next >= step.data_chunks.min(end) {
                    return Ok(());
                }
            }
            if steps.is_empty() {
                // Every step planned is told (they read nothing): plan on.
                if then.is_none() {
                    return Ok(());
                }
                continue;
            }
            let Some((index, result)) = done.recv().ok() else {
                return Err(Error::inconsistent("the scrub's readers stopped"));
            };
            let counts = result?;
            // Invariant: a job's step is planned and not yet told (a step
            // is told only once every one of its jobs is back).
            let waiting = index
                .checked_sub(told)
                .and_then(|i| steps.get_mut(i as usize))
                .ok_or_else(|| Error::inconsistent("a scrub job came back for no step"))?;
            counts.add_to(&mut waiting.0);
            waiting.1 -= 1;
        }
    }

    /// A reader's job: its runs read into `buf` (made at the first), until
    /// the queue closes (the scrub stopped: no one is told of this job,
    /// so the device is spared the rest of it).
    fn scrub_job(
        &self,
        job: Job,
        buf: &mut Option<arbor_io::LargeBuffer>,
        queue: &Queue,
    ) -> Result<Counts> {
        let mut done = Counts::default();
        for run in job {
            if queue.closed() {
                break;
            }
            let len = self.run_bytes(&run)?;
            if buf.is_none() {
                *buf = Some(arbor_io::LargeBuffer::new(READ_RUN_BYTES as usize)?);
            }
            let data = buf
                .as_mut()
                .and_then(|b| b.get_mut(..len))
                .ok_or_else(|| Error::inconsistent("a scrub run is longer than a read"))?;
            done.add(self.scrub_run(run, data)?);
        }
        Ok(done)
    }

    /// Looks up the live chunks of the step from chunk `from` (at most
    /// about `max_bytes` of them, at least one, among at most 65,536
    /// chunks, none at or past `end`), under the metadata lock.
    fn scrub_plan(&self, from: u64, end: u64, max_bytes: u64) -> Result<Plan> {
        let cs = self.chunk_size();
        let meta = self.read_meta()?;
        let data_chunks = meta.meta().entries(arbor_format::SmKind::Data);
        let end = from.saturating_add(STEP_CHUNKS).min(data_chunks).min(end);
        let budget = max_bytes.max(cs).div_ceil(cs);
        let sums = meta.meta().geo().sums;
        // The jobs, each with its leaf.
        let mut jobs: Vec<(u64, Job)> = Vec::new();
        let mut live = 0u64;
        let mut c = from;
        while c < end && live < budget {
            if meta.meta().data_count(c)? > 0 {
                let leaf = sums.slot(c).leaf;
                match jobs.last_mut() {
                    Some((l, job)) if *l == leaf => match job.last_mut() {
                        Some(run)
                            if run.end == c && (run.end - run.start + 1) * cs <= READ_RUN_BYTES =>
                        {
                            run.end += 1;
                        }
                        _ => job.push(c..c + 1),
                    },
                    _ => jobs.push((leaf, std::iter::once(c..c + 1).collect())),
                }
                live += 1;
            }
            c += 1;
        }
        let jobs = jobs.into_iter().map(|(_, job)| job).collect();
        Ok(Plan {
            step: ScrubStep {
                next: c,
                data_chunks,
                chunks: live,
                bytes: live * cs,
                ..ScrubStep::default()
            },
            jobs,
        })
    }

    /// The bytes of a run (at most [`READ_RUN_BYTES`]).
    fn run_bytes(&self, run: &Run) -> Result<usize> {
        (run.end - run.start)
            .checked_mul(self.chunk_size())
            .filter(|&n| n <= READ_RUN_BYTES)
            .map(|n| n as usize)
            .ok_or_else(|| Error::inconsistent("a scrub run is longer than a read"))
    }

    /// Reads one run of consecutive live chunks and verifies every block
    /// that has a sum, and gives one to those that have none.
    fn scrub_run(&self, run: Run, data: &mut [u8]) -> Result<Counts> {
        let cs = self.chunk_size() as usize;
        let sums = {
            let meta = self.read_meta()?;
            run.clone()
                .map(|c| Ok((c, ChunkSums::of(meta.meta(), c)?)))
                .collect::<Result<Vec<_>>>()?
        };
        let (mut verified, mut damaged) = (0, 0);
        let mut unsummed = Vec::new();
        // Around the host's page cache where the pool goes through it:
        // a scrub neither pays for its copy nor evicts clients' data.
        self.store
            .dev
            .read_uncached(data, self.store.geo.chunk_offset(run.start))?;
        for ((pchunk, sums), data) in sums.iter().zip(data.chunks(cs)) {
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
        let (added, deferred) =
            if unsummed.is_empty() || !self.store.geo.version().has_data_checksums() {
                (0, 0)
            } else {
                self.scrub_add_sums(&unsummed)?
            };
        Ok(Counts {
            verified,
            damaged,
            added,
            deferred,
        })
    }

    /// Gives every block of chunks `chunks` that has no sum one, from what
    /// the device holds, with the pool gate exclusive (no write in flight,
    /// so none between the read and the sum), unless a home is being built
    /// (its copy is written without sums). Returns the sums added (none,
    /// logged, when the metadata cannot take them) and the blocks left
    /// without one because a home is being built.
    fn scrub_add_sums(&self, chunks: &[u64]) -> Result<(u64, u64)> {
        let Some(_no_home_built) = self.origins.no_home_building_shared() else {
            return Ok((0, self.blocks_without_sums(chunks)?));
        };
        let geo = &self.store.geo;
        let cs = geo.chunk_size as usize;
        let _gate = self.gates.commit();
        // What the device holds, each block summed (no lock held while it
        // is read) ...
        let mut held = Vec::with_capacity(chunks.len());
        let mut buf = vec![0; cs];
        for &pchunk in chunks {
            self.store.dev.read_at(&mut buf, geo.chunk_offset(pchunk))?;
            let block_sums: Vec<u32> = buf
                .chunks(arbor_format::SUM_BLOCK)
                .map(arbor_format::block_sum)
                .collect();
            held.push((pchunk, block_sums));
        }
        // ... recorded for the blocks of chunks still live that still have
        // no sum (a chunk freed meanwhile, perhaps written again, keeps
        // what it has now).
        let mut meta = self.write_meta()?;
        let mut add = Vec::new();
        for (pchunk, block_sums) in held {
            if meta.meta().data_count(pchunk)? == 0 {
                continue;
            }
            let sums = ChunkSums::of(meta.meta(), pchunk)?;
            for (b, sum) in (0u32..).zip(block_sums) {
                if sums.get(b).is_none() {
                    add.push(BlockSums {
                        pchunk,
                        first: b,
                        sums: vec![Some(sum)],
                    });
                }
            }
        }
        if add.is_empty() {
            return Ok((0, 0));
        }
        match self.mutate(&mut meta, Privilege::Normal, |m| m.record_sums(&add)) {
            Ok(()) => Ok((add.len() as u64, 0)),
            Err(e @ Error::Exhausted(_)) => {
                tracing::debug!(error = %e, blocks = add.len(), "the scrub gives no sums to blocks that have none this step: no room");
                Ok((0, 0))
            }
            Err(e) => Err(e),
        }
    }

    /// The blocks of live chunks `chunks` that have no sum.
    fn blocks_without_sums(&self, chunks: &[u64]) -> Result<u64> {
        let meta = self.read_meta()?;
        let mut without = 0;
        for &pchunk in chunks {
            if meta.meta().data_count(pchunk)? == 0 {
                continue;
            }
            without += ChunkSums::of(meta.meta(), pchunk)?.missing();
        }
        Ok(without)
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
