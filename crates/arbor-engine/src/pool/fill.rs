//! Filling partial extents (FORMAT.md §6.3): a partial pins its base and
//! its middle layers, chunks its volume mapped before, for the blocks
//! outside its mask. Once nothing else references its own chunk and one of
//! those (the snapshot that shared it is gone), the fill copies the blocks
//! of all of them into the partial's own chunk and maps that chunk whole,
//! which frees the ones only it held.
//!
//! The copy writes only blocks outside the mask, which no mapping of the
//! partial's chunk reads, in the open state or in any state a power cut
//! can recover to (a mask grows only while its chunk is one volume's alone,
//! and every mapping of the chunk has a mask within the current one). So a
//! fill changes nothing anybody reads until its mapping step, one metadata
//! step that keeps the extent's generation (it is not a write: diffs and
//! incremental sends do not see it).
//!
//! Fillable partials are found by a sweep over every volume's map, a
//! bounded number of extents per call, from a cursor. The sweep is wanted
//! after an open and after reclaim dropped references; a full pass that
//! finds nothing, with no new reason to look since it began, ends it.

use super::*;
use crate::mapping::{Mapped, Mapping};

/// Extents one call looks at, at most (bounds how long it holds the
/// metadata lock for reading).
const SCAN_EXTENTS: usize = 4096;

/// What [`Pool::fill_one`] did.
enum Filled {
    Yes,
    /// No longer the sweep's partial, or no longer nobody else's.
    No,
    /// Its mapping step did not fit the open transaction's journal room:
    /// commit (with no lock of the fill held) and fill it again.
    AfterCommit,
}

/// One fillable partial, as the sweep found it.
#[derive(Debug, Clone, Copy)]
struct Candidate {
    id: u64,
    chunk: u64,
    mapped: Mapped,
}

impl Pool {
    /// Asks for a sweep for fillable partial extents (references dropped).
    pub(super) fn want_fill(&self) {
        self.fill.want();
    }

    /// Whether a sweep for fillable partial extents is wanted.
    pub fn fill_wanted(&self) -> bool {
        self.fill.wanted()
    }

    /// Fills up to `max` partial extents whose chunks nothing else
    /// references, sweeping on until it has or the sweep ends (each step
    /// looks at a bounded number of extents under the metadata lock, none
    /// is held between steps); returns how many it filled and commits if
    /// any (the bases are free once durable). Returns 0 once a full pass
    /// filled nothing.
    pub fn fill_partials(&self, max: usize) -> Result<usize> {
        if crate::mapping::partial_blocks(&self.store.geo).is_none() {
            self.fill.end();
            return Ok(0);
        }
        let mut filled = 0;
        // Passes that reached the last volume: two at most per call, so a
        // call ends even if a partial the sweep finds cannot be filled.
        let mut wraps = 0;
        while filled < max && wraps < 2 {
            let Some((candidates, wrapped)) = self.sweep_step(max - filled)? else {
                break;
            };
            wraps += u32::from(wrapped);
            for c in candidates {
                // Keeps the transaction within its bounds, as writes do.
                self.commit_if_needed()?;
                let mut done = self.fill_one_noted(c)?;
                if let Filled::AfterCommit = done {
                    self.commit_open()?;
                    done = self.fill_one_noted(c)?;
                }
                match done {
                    Filled::Yes => {
                        filled += 1;
                        self.fill.filled();
                    }
                    Filled::No => {}
                    // A fill's step fits an empty transaction (two
                    // space-map pages and one leaf path).
                    Filled::AfterCommit => return Err(Error::Exhausted(Resource::Journal)),
                }
            }
        }
        if filled > 0 {
            self.commit_open()?;
        }
        Ok(filled)
    }

    /// Looks at up to [`SCAN_EXTENTS`] extents from the cursor; returns the
    /// fillable partials found (at most `max`, maybe none), or `None` when
    /// the sweep ended or is not wanted.
    /// With them, whether this step reached the last volume.
    fn sweep_step(&self, max: usize) -> Result<Option<(Vec<Candidate>, bool)>> {
        // The sweep's lock is a leaf: not held while the metadata lock is
        // waited for (the pool's status takes the two the other way round).
        let Some(start) = self.fill.start() else {
            return Ok(None);
        };
        let meta = self.read_meta()?;
        let ids: Vec<(u64, BlockRef)> = meta
            .table()
            .iter()
            .filter(|(id, rec)| *id >= start.0 && !rec.root.is_none())
            .map(|(id, rec)| (id, rec.root))
            .collect();
        let mut found = Vec::new();
        let mut seen = 0;
        let mut cursor = None;
        for (id, root) in ids {
            let from = if id == start.0 { start.1 } else { 0 };
            let mut next = None;
            Mapping::new(meta.meta(), root).extents(from, u64::MAX, &mut |e| {
                seen += 1;
                if e.partial.is_some() && nobody_else(meta.meta(), e.at(e.start))? {
                    found.push(Candidate {
                        id,
                        chunk: e.start,
                        mapped: e.at(e.start),
                    });
                }
                if seen >= SCAN_EXTENTS || found.len() >= max {
                    next = Some(e.end());
                    return Ok(false);
                }
                Ok(true)
            })?;
            if let Some(next) = next {
                cursor = Some((id, next));
                break;
            }
        }
        drop(meta);
        Ok(self
            .fill
            .advance(start, cursor, !found.is_empty())
            .map(|wrapped| (found, wrapped)))
    }

    /// [`Self::fill_one`]; a layer's damaged block (noted, with no lock
    /// held) leaves the partial as it is.
    fn fill_one_noted(&self, c: Candidate) -> Result<Filled> {
        match self.fill_one(c) {
            Err(Error::Damaged(d)) => {
                self.note_damage(&d);
                Ok(Filled::No)
            }
            other => other,
        }
    }

    /// Fills one partial extent if it is still what the sweep found and
    /// still nobody else's. Holds the I/O gate throughout, so it never
    /// commits itself (a commit takes the gate exclusive).
    fn fill_one(&self, c: Candidate) -> Result<Filled> {
        if c.mapped.partial.is_none() {
            return Ok(Filled::No);
        }
        // As a write of the chunk: no other write or discard changes its
        // mapping meanwhile, and no snapshot of the volume shares it.
        let _gate = self.gates.io();
        let _volume = self.gates.volume(c.id);
        let _stripes = self.gates.stripes(c.id, c.chunk..c.chunk + 1);
        if !self.still_fillable(&c)? {
            return Ok(Filled::No);
        }
        let cs = self.chunk_size();
        let geo = &self.store.geo;
        let checksums = geo.version().has_data_checksums();
        let mut sums = Vec::new();
        for (run, from) in c.mapped.runs(cs) {
            if from == c.mapped.phys {
                continue;
            }
            let mut buf = vec![0u8; (run.end - run.start) as usize];
            // The layer's chunk is shared or this partial's alone: never
            // written in place meanwhile, its sums stand.
            let layer = if checksums {
                Some(crate::sums::ChunkSums::of(self.read_meta()?.meta(), from)?)
            } else {
                None
            };
            self.store
                .dev
                .read_at(&mut buf, geo.chunk_offset(from) + run.start)?;
            let whole = run.start.is_multiple_of(arbor_format::SUM_BLOCK_U64)
                && run.end.is_multiple_of(arbor_format::SUM_BLOCK_U64);
            if let (Some(layer), true) = (layer, whole) {
                // Below the chunk's block count, a u32.
                let first = (run.start / arbor_format::SUM_BLOCK_U64) as u32;
                // A damaged block is never copied under a new, valid sum.
                layer.verify(first, &buf)?;
                sums.push(crate::sums::BlockSums {
                    pchunk: c.mapped.phys,
                    first,
                    sums: crate::sums::compute(&buf),
                });
            }
            self.store
                .dev
                .write_at(&buf, geo.chunk_offset(c.mapped.phys) + run.start)?;
        }
        let mut meta = self.write_meta()?;
        match self.mutate(&mut meta, Privilege::Reserve, |m| {
            m.fill_partial(c.id, c.chunk, c.mapped)?;
            // The copied blocks' sums with the step that maps them.
            m.record_sums(&sums)
        }) {
            Ok(()) => Ok(Filled::Yes),
            // The step was undone whole; the blocks written stay unread.
            Err(Error::Exhausted(Resource::Journal)) => Ok(Filled::AfterCommit),
            Err(e) => Err(e),
        }
    }

    fn still_fillable(&self, c: &Candidate) -> Result<bool> {
        let meta = self.read_meta()?;
        let Some(rec) = meta.table().get(c.id) else {
            return Ok(false);
        };
        let Some((e, _)) = Mapping::new(meta.meta(), rec.root).lookup(c.chunk)? else {
            return Ok(false);
        };
        Ok(e.at(c.chunk) == c.mapped && nobody_else(meta.meta(), c.mapped)?)
    }
}

/// Whether the partial `m` alone references its chunk and one of its
/// layers' (its base or a middle layer): the condition of a fill, which
/// frees those.
fn nobody_else(meta: &crate::meta::Meta, m: Mapped) -> Result<bool> {
    if m.partial.is_none() || meta.data_count(m.phys)? != 1 {
        return Ok(false);
    }
    for layer in m.chunks().skip(1) {
        if meta.data_count(layer)? == 1 {
            return Ok(true);
        }
    }
    Ok(false)
}
