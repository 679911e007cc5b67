//! Writes, write-zeroes, discards and the zeroing of a grown volume's old
//! tail: each is carried out as one or more *units*, and a unit is atomic.
//! It completes, or it fails and leaves the pool exactly as before.
//!
//! A unit runs under the I/O gate (no commit, snapshot or clone runs before
//! it ends) and the stripe locks of every chunk it touches (no other write
//! or discard changes those chunks' mappings meanwhile):
//! 1. **plan**, one metadata step: each chunk is decided in place or
//!    redirected, and every new chunk is allocated;
//! 2. the new chunks are written whole (the old data or zeros around the
//!    write; only the write's blocks into a chunk that is a hole on the
//!    device, zeros around them: `write_fresh_or_whole`);
//! 3. **map**, one metadata step: every redirected chunk is mapped and a
//!    discard's whole chunks are unmapped;
//! 4. the in-place chunks are overwritten.
//!
//! A failed step is undone whole (`Volumes::atomic`), and the chunks allocated
//! in step 1 are freed when step 2 or 3 fails, so nothing changes until step
//! 3 succeeds, after which only the device can fail. A unit that runs out of
//! data or metadata space makes room (reclaim, commit) and runs once more; one
//! that does not fit the open transaction's journal room runs again after a
//! commit, and then alone, with the pool to itself (`Pool::apply_alone`).
//! One that does not fit even an empty transaction (thousands of chunks
//! whose space-map entries are scattered over more pages than the journal
//! holds) runs in pieces, each its own transaction, and stays atomic as a
//! whole: its volume's tree is held as it was before the first piece, and
//! put back if a later piece fails.
//!
//! A unit covers at most [`unit_chunks`] chunks: any request of the NBD
//! maximum payload, wherever it starts. Longer write-zeroes (and writes
//! through the engine API) go unit by unit; each unit is atomic.

use std::ops::Range;
use std::sync::RwLockReadGuard;

use super::*;
use crate::mapping::{Mapped, PARTIAL_BLOCK};
use crate::sums::BlockSums;
use crate::volumes::{Blocks, ChunkPlan, ChunkWanted};

/// Bytes of one write request served whole by one unit: the NBD maximum
/// payload (arbor-nbd `MAX_PAYLOAD`).
const UNIT_BYTES: u64 = 32 << 20;
/// Longest run of consecutive *new* chunks merged into one device write (at
/// least one chunk is always written whole). New chunks are usually parts
/// of the pool file not in the page cache yet, and longer writes there make
/// Linux cache them in large folios, after which every 4 KiB write into
/// such a folio costs far more: after a fill with 1 MiB runs, 4 KiB random
/// writes ran at 43-46k IOPS instead of 83-93k (ext4,
/// `ext4_block_write_begin`), while the fill itself gained nothing
/// measurable from runs longer than 64 KiB. Runs of in-place chunks are not
/// limited (the whole run is one write: their pages are usually cached
/// already, and one write per run is what made large overwrites fast).
const MAX_NEW_CHUNK_WRITE: u64 = 64 << 10;
/// Longest run of consecutive new chunks merged into one device write for
/// a unit written past the page cache ([`Unit::uncached`]): its pages leave
/// the cache once written back, so no large folio stays behind to slow
/// later small writes; the run is bounded only so that one write starts
/// its writeback early.
const MAX_UNCACHED_WRITE: u64 = 4 << 20;

/// Chunks a unit covers at most with chunks of `cs` bytes: a request of
/// `UNIT_BYTES` that does not start on a chunk boundary touches one more.
fn unit_chunks(cs: u64) -> u64 {
    UNIT_BYTES / cs + 1
}

/// What a unit writes.
#[derive(Debug, Clone, Copy)]
pub(super) enum Fill<'a> {
    /// These bytes (as many as the unit's length).
    Data(&'a [u8]),
    Zeros,
}

/// One atomic piece of a write, write-zeroes or discard.
#[derive(Debug, Clone, Copy)]
pub(super) struct Unit<'a> {
    pub id: VolumeId,
    pub offset: u64,
    pub len: u64,
    pub fill: Fill<'a>,
    /// A discard: whole chunks are unmapped, and the parts of partial chunks
    /// are zeroed where mapped. Discards may use the metadata reserve (they
    /// free space; their partial ends copy at most two chunks).
    pub unmap: bool,
    /// May write past the size up to the end of the last chunk (only to
    /// zero that tail before a grow makes it part of the volume).
    pub past_end: bool,
    /// Bulk data nothing reads soon (a restore's fill): its new chunks are
    /// written to leave the host's page cache once written back
    /// ([`BlockDevice::write_uncached`]), in runs of up to
    /// [`MAX_UNCACHED_WRITE`]. Chunks overwritten in place go through the
    /// cache: clients may be reading them.
    pub uncached: bool,
    /// The cipher of an encrypted volume (`pool/crypt.rs`): the data is
    /// ciphertext already; what the unit itself would store as zeros in a
    /// chunk it maps is encrypted with it.
    pub cipher: Option<&'a arbor_crypt::VolumeCipher>,
    /// The data is an encrypted volume's stored bytes already (a raw
    /// receive), in whole chunks: nothing to encrypt, no zeros of its own.
    // Read only by a debug assertion (`assert_cipher_given`).
    #[cfg_attr(not(debug_assertions), allow(dead_code))]
    pub stored: bool,
}

impl<'a> Unit<'a> {
    /// Writes `data` at `offset`.
    pub fn data(id: VolumeId, offset: u64, data: &'a [u8]) -> Self {
        Self {
            id,
            offset,
            len: data.len() as u64,
            fill: Fill::Data(data),
            unmap: false,
            past_end: false,
            uncached: false,
            cipher: None,
            stored: false,
        }
    }

    /// Makes `[offset, offset + len)` read as zeros; with `unmap`, whole
    /// chunks are unmapped (a discard), else zeros are written.
    pub fn zeros(id: VolumeId, offset: u64, len: u64, unmap: bool) -> Self {
        Self {
            id,
            offset,
            len,
            fill: Fill::Zeros,
            unmap,
            past_end: false,
            uncached: false,
            cipher: None,
            stored: false,
        }
    }

    fn end(&self) -> u64 {
        self.offset + self.len
    }

    /// Every chunk the unit touches.
    fn chunk_range(&self, cs: u64) -> Range<u64> {
        self.offset / cs..self.end().div_ceil(cs)
    }

    /// The blocks of chunk `chunk` the unit touches, if the pool may hold
    /// partial extents (`partials`) and the unit does not cover the chunk.
    fn blocks(&self, chunk: u64, cs: u64, partials: bool) -> Option<Blocks> {
        let span = self.span(chunk, cs);
        let (from, to) = (span.start - chunk * cs, span.end - chunk * cs);
        if !partials || to - from == cs || from >= to {
            return None;
        }
        let (first, last) = (from / PARTIAL_BLOCK, (to - 1) / PARTIAL_BLOCK);
        // At most 32 blocks a chunk (`partials` says so): no shift overflows.
        let touched = ((1u64 << (last + 1)) - (1u64 << first)) as u32;
        Some(Blocks {
            touched,
            whole: from % PARTIAL_BLOCK == 0 && to % PARTIAL_BLOCK == 0,
        })
    }

    /// The blocks of chunk `chunk` the unit covers whole, as a partial
    /// extent's mask (for a pool that holds partials: at most 32 blocks a
    /// chunk, so no shift overflows).
    fn covered(&self, chunk: u64, cs: u64) -> u32 {
        let span = self.span(chunk, cs);
        let (from, to) = (span.start - chunk * cs, span.end - chunk * cs);
        let (first, end) = (from.div_ceil(PARTIAL_BLOCK), to / PARTIAL_BLOCK);
        if first >= end {
            return 0;
        }
        ((1u64 << end) - (1u64 << first)) as u32
    }

    /// Whether the unit covers chunk `chunk` whole.
    fn covers(&self, chunk: u64, cs: u64) -> bool {
        let span = self.span(chunk, cs);
        span.end - span.start == cs
    }

    /// What a new partial extent in chunk `chunk` that keeps the old
    /// contents of `keep` (see [`ChunkPlan::Partial`]) reads: the blocks of
    /// it the unit does not cover whole (a write over all of them reads
    /// nothing).
    fn kept(&self, chunk: u64, cs: u64, keep: u32) -> u32 {
        keep & !self.covered(chunk, cs)
    }

    /// The chunks the unit plans, and the whole chunks it unmaps.
    /// `partials`: the pool may hold partial extents.
    fn chunks(&self, cs: u64, partials: bool) -> (Vec<ChunkWanted>, Range<u64>) {
        let all = self.chunk_range(cs);
        if !self.unmap {
            let wanted = all
                .map(|chunk| ChunkWanted {
                    chunk,
                    only_if_mapped: false,
                    blocks: self.blocks(chunk, cs, partials),
                })
                .collect();
            return (wanted, 0..0);
        }
        let whole = self.offset.div_ceil(cs)..self.end() / cs;
        let partial = |chunk| ChunkWanted {
            chunk,
            only_if_mapped: true,
            blocks: self.blocks(chunk, cs, partials),
        };
        if whole.is_empty() {
            // No whole chunk inside: the range lies within one or two chunks.
            return (all.map(partial).collect(), 0..0);
        }
        let mut wanted = Vec::with_capacity(2);
        if whole.start > all.start {
            wanted.push(partial(all.start));
        }
        if whole.end < all.end {
            wanted.push(partial(whole.end));
        }
        (wanted, whole)
    }

    fn privilege(&self) -> Privilege {
        if self.unmap {
            Privilege::Reserve
        } else {
            Privilege::Normal
        }
    }

    /// The part `[from, to)` of this unit (byte offsets of the volume).
    fn part(&self, from: u64, to: u64) -> Unit<'a> {
        let fill = match self.fill {
            Fill::Data(d) => {
                Fill::Data(&d[(from - self.offset) as usize..(to - self.offset) as usize])
            }
            Fill::Zeros => Fill::Zeros,
        };
        Unit {
            offset: from,
            len: to - from,
            fill,
            ..*self
        }
    }

    /// Two halves split at a chunk boundary, if the unit spans more than one
    /// chunk.
    fn halves(&self, cs: u64) -> Option<(Unit<'a>, Unit<'a>)> {
        let chunks = self.chunk_range(cs);
        let mid = (chunks.start + chunks.end) / 2 * cs;
        (mid > self.offset && mid < self.end())
            .then(|| (self.part(self.offset, mid), self.part(mid, self.end())))
    }

    /// The bytes of the unit inside chunk `chunk`.
    fn span(&self, chunk: u64, cs: u64) -> Range<u64> {
        (chunk * cs).max(self.offset)..((chunk + 1) * cs).min(self.end())
    }

    /// [`Self::sums`], sliced from `pre` (the sums of the whole unit,
    /// block-aligned, computed already) when there is one.
    fn sums_from(&self, pre: Option<&[Option<u32>]>, span: Range<u64>) -> Vec<Option<u32>> {
        match pre {
            Some(pre) => {
                let block = |at: u64| ((at - self.offset) / SUM_BLOCK) as usize;
                pre[block(span.start)..block(span.end)].to_vec()
            }
            None => self.sums(span),
        }
    }

    /// The sums of the unit's bytes in `span`, whole blocks.
    fn sums(&self, span: Range<u64>) -> Vec<Option<u32>> {
        match self.fill {
            Fill::Data(d) => {
                let from = (span.start - self.offset) as usize;
                crate::sums::compute(&d[from..from + (span.end - span.start) as usize])
            }
            Fill::Zeros => {
                vec![
                    Some(arbor_format::zero_block_sum());
                    ((span.end - span.start) / SUM_BLOCK) as usize
                ]
            }
        }
    }
}

/// Block size of data checksums.
const SUM_BLOCK: u64 = arbor_format::SUM_BLOCK_U64;

/// What a unit's in-place chunks write, prepared before its mapping step
/// (which records their sums with the rest of the unit): in a pool with
/// checksums, a chunk whose span does not start and end on a block
/// boundary is written whole blocks from a buffer (the blocks it keeps
/// part of read, and verified, first).
#[derive(Default)]
struct InPlace {
    sums: Vec<BlockSums>,
    /// The unit's bytes widened to whole blocks, and where they start.
    widened: Option<(u64, Vec<u8>)>,
}

impl InPlace {
    /// What the in-place step writes for `unit`: the widened copy if there
    /// is one, else the unit itself.
    fn unit<'s>(&'s self, unit: &Unit<'s>) -> Unit<'s> {
        match &self.widened {
            Some((offset, data)) => Unit {
                offset: *offset,
                len: data.len() as u64,
                fill: Fill::Data(data),
                ..*unit
            },
            None => *unit,
        }
    }
}

/// The sums of what `source` writes into each in-place chunk of `plans`,
/// its span's whole blocks given by `sums_of`.
fn in_place_sums(
    source: &Unit<'_>,
    wanted: &[ChunkWanted],
    plans: &[ChunkPlan],
    cs: u64,
    sums_of: impl Fn(Range<u64>) -> Vec<Option<u32>>,
) -> Vec<BlockSums> {
    wanted
        .iter()
        .zip(plans)
        .filter_map(|(w, plan)| {
            let ChunkPlan::InPlace(phys) = *plan else {
                return None;
            };
            let span = source.span(w.chunk, cs);
            Some(BlockSums {
                pchunk: phys,
                // Below the chunk's block count (a chunk is at most 1 MiB).
                first: ((span.start % cs) / SUM_BLOCK) as u32,
                sums: sums_of(span),
            })
        })
        .collect()
}

/// Consecutive device writes merged into one: `logical` bytes of the unit
/// go to the device at `device`.
struct Run {
    logical: Range<u64>,
    device: u64,
}

impl Pool {
    /// A unit of an encrypted volume carries its cipher (so what it stores
    /// as zeros in a chunk it maps is encrypted), unless it only unmaps
    /// whole chunks (`pool/crypt.rs`); paired with the unit's making.
    #[cfg(debug_assertions)]
    fn assert_cipher_given(&self, unit: &Unit<'_>, cs: u64) {
        let encrypted = self
            .read_meta()
            .ok()
            .and_then(|meta| meta.volume(unit.id.0).ok().map(|r| r.key_slot.is_some()));
        if encrypted == Some(true) {
            let whole = unit.offset.is_multiple_of(cs) && unit.len.is_multiple_of(cs);
            let unmaps_whole = matches!(unit.fill, Fill::Zeros) && unit.unmap && whole;
            let stored_whole = unit.stored && whole && matches!(unit.fill, Fill::Data(_));
            debug_assert!(
                unmaps_whole
                    || stored_whole
                    || (unit.cipher.is_some() && matches!(unit.fill, Fill::Data(_))),
                "a unit of encrypted volume {} without its cipher",
                unit.id.0
            );
        }
    }

    /// Carries out `unit` (any length) as a sequence of atomic units.
    pub(super) fn apply_all(&self, unit: Unit<'_>) -> Result<()> {
        let cs = self.chunk_size();
        #[cfg(debug_assertions)]
        self.assert_cipher_given(&unit, cs);
        if unit.unmap {
            // Bounded whatever the range: at most two partial chunks to
            // write, and the whole chunks unmapped with bounded work.
            return self.apply(unit);
        }
        let step = unit_chunks(cs) * cs;
        let mut at = unit.offset;
        while at < unit.end() {
            // Units end on chunk boundaries, so each covers at most
            // `unit_chunks` chunks.
            let to = ((at / cs) * cs + step).min(unit.end());
            self.apply(unit.part(at, to))?;
            at = to;
        }
        Ok(())
    }

    /// Carries out one unit atomically (see the module documentation).
    fn apply(&self, unit: Unit<'_>) -> Result<()> {
        /// Commits before a unit that does not fit the journal room is
        /// split: another writer may fill the transaction again between a
        /// commit and the unit's next try.
        const COMMITS_BEFORE_SPLIT: u32 = 2;
        let mut commits = 0;
        let mut made_room = false;
        // Once per unit: a plan that met regions not yet durable in the
        // in-place intent set makes them durable (a log record, or a
        // commit) and tries again.
        let mut waited_for_intents = false;
        // A volume reading through a copy-on-write volume's epoch fills the
        // partial chunks it redirects from what the epoch reads: no write
        // of the copy-on-write volume may change those chunks meanwhile.
        let backing = self.read_meta()?.volume(unit.id.0)?.backing;
        let _view = backing.map(|b| {
            self.origins
                .stripes(b.origin, unit.chunk_range(self.chunk_size()), false)
        });
        loop {
            self.commit_if_needed()?;
            match self.attempt(&unit, !waited_for_intents) {
                Ok(None) => return Ok(()),
                Ok(Some(txn)) => {
                    waited_for_intents = true;
                    self.list_through(txn)?;
                }
                // Entries freed since the last commit become allocatable once
                // it is durable, deleted volumes' space once reclaimed, and a
                // chunk that is this volume's alone in the open state may be
                // overwritten in place once that state is durable: make room
                // and try once more before reporting full.
                Err(
                    e @ (Error::Exhausted(Resource::DataSpace)
                    | Error::Exhausted(Resource::Metadata)),
                ) => {
                    if made_room || !self.make_room()? {
                        return Err(e);
                    }
                    made_room = true;
                }
                Err(Error::Exhausted(Resource::Journal)) if commits < COMMITS_BEFORE_SPLIT => {
                    self.commit_open()?;
                    commits += 1;
                }
                Err(Error::Exhausted(Resource::Journal)) => return self.apply_alone(&unit),
                Err(e) => return Err(e),
            }
        }
    }

    /// Carries out a unit that did not fit the journal room left by other
    /// writers, with the pool to itself: it holds the commit lock and the
    /// I/O gate (exclusive), so no other write, management operation or
    /// commit runs until it ends. It runs whole in an empty transaction if
    /// it fits one; otherwise in pieces, each a transaction of its own,
    /// after its volume's tree as it is now is *held* (`Volumes::hold_tree`):
    /// a piece that fails puts the tree back, so the unit is atomic as a
    /// whole, not piece by piece. Holding the tree makes every chunk it maps
    /// shared, so the pieces redirect all of their chunks (more data space
    /// than in place, for units that need more space-map pages than the
    /// whole journal holds: thousands of chunks scattered over a large,
    /// fragmented pool).
    fn apply_alone(&self, unit: &Unit<'_>) -> Result<()> {
        let _commit = self.committer.lock();
        let _gate = self.gates.commit();
        self.commit_held()?;
        match self.attempt_locked(unit, &mut None, false) {
            Err(Error::Exhausted(Resource::Journal)) => {}
            other => return other.map(drop),
        }
        if unit.halves(self.chunk_size()).is_none() {
            return Err(Error::Exhausted(Resource::Journal));
        }
        self.counters.split();
        let held = {
            let mut meta = self.write_meta()?;
            self.mutate(&mut meta, unit.privilege(), |m| m.hold_tree(unit.id.0))?
        };
        let result = self.apply_pieces(unit);
        let restore = match &result {
            Ok(()) => false,
            // A stopped pool is reopened from its last commit.
            Err(e) if e.stops_pool() => return result,
            Err(_) => true,
        };
        let mut meta = self.write_meta()?;
        let released = self.mutate(&mut meta, Privilege::Reserve, |m| {
            m.release_tree(&held, restore)
        });
        meta.unhold_tree();
        if let Err(e) = released {
            warn!(error = %e, "a failed write could not put its volume's tree back");
        }
        result
    }

    /// The pieces of a unit run by [`Self::apply_alone`] (caller holds the
    /// commit lock and the gate): whole if it fits an empty transaction,
    /// else in halves.
    fn apply_pieces(&self, unit: &Unit<'_>) -> Result<()> {
        let mut committed_for_space = false;
        loop {
            match self.attempt_locked(unit, &mut None, false) {
                Ok(_) => return Ok(()),
                // Earlier pieces filled the transaction: commit them.
                Err(Error::Exhausted(Resource::Journal)) if self.read_meta()?.has_changes() => {
                    self.commit_held()?
                }
                Err(Error::Exhausted(Resource::Journal)) => {
                    let Some((a, b)) = unit.halves(self.chunk_size()) else {
                        return Err(Error::Exhausted(Resource::Journal));
                    };
                    self.apply_pieces(&a)?;
                    return self.apply_pieces(&b);
                }
                // Entries the earlier pieces freed are allocatable once
                // committed.
                Err(
                    Error::Exhausted(Resource::DataSpace) | Error::Exhausted(Resource::Metadata),
                ) if !committed_for_space && self.read_meta()?.meta().awaiting_commit() => {
                    committed_for_space = true;
                    self.commit_held()?;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Commits, for a caller that holds the commit lock and the gate.
    pub(super) fn commit_held(&self) -> Result<()> {
        let job = {
            let mut meta = self.write_meta()?;
            self.freeze(&mut meta)?
        };
        match job {
            Some(job) => self.complete_commit(job),
            None => Ok(()),
        }
    }

    /// One try of a unit: steps 1 to 4 of the module documentation. See
    /// [`Self::attempt_locked`] for `wait_for_intents` and what it returns.
    pub(super) fn attempt(&self, unit: &Unit<'_>, wait_for_intents: bool) -> Result<Option<u64>> {
        let _gate = self.gates.io();
        let mut volume = Some(self.gates.volume(unit.id.0));
        let _stripes = self
            .gates
            .stripes(unit.id.0, unit.chunk_range(self.chunk_size()));
        self.attempt_locked(unit, &mut volume, wait_for_intents)
    }

    /// [`Self::attempt`] for a caller that holds the gate, and the stripes
    /// of the unit's chunks or the gate exclusive. `volume`: the volume's
    /// gate, if the caller holds it; released after the plan unless a chunk
    /// is written in place. A snapshot that comes after the plan is safe
    /// for a unit that only redirects: it shares the tree as it is, without
    /// the unit's mappings (the mapping step then shadows the shared path
    /// as for any write after a snapshot, and its paired check still
    /// holds: a snapshot changes no mapping), and nothing the unit writes
    /// to the device is a chunk the snapshot maps. Written in place, a chunk
    /// the snapshot shared would change under it.
    ///
    /// With `wait_for_intents`, a plan that could not overwrite a chunk in
    /// place only for the crash rule of data checksums (its region not yet
    /// durable in the in-place intent set, `crate::intents`) is dropped,
    /// nothing written, and the transaction to commit through before the
    /// next try returned: `Some(txn)`. Without, such chunks redirect.
    fn attempt_locked(
        &self,
        unit: &Unit<'_>,
        volume: &mut Option<RwLockReadGuard<'_, ()>>,
        wait_for_intents: bool,
    ) -> Result<Option<u64>> {
        let cs = self.chunk_size();
        let partials = crate::mapping::partial_blocks(&self.store.geo).is_some();
        let (wanted, unmap) = unit.chunks(cs, partials);
        let privilege = unit.privilege();
        let end = WriteEnd {
            end: unit.end(),
            past_end: unit.past_end,
        };
        let checksums = self.store.geo.version().has_data_checksums();
        // The common overwrite in a pool with checksums (whole blocks, no
        // unmapping, every chunk in place) records its sums in the plan's
        // own step: computed here, outside the lock, by block of the unit
        // (and used for the new chunks too, if the plan redirects).
        let early_sums = (checksums
            && unmap.is_empty()
            && unit.offset.is_multiple_of(SUM_BLOCK)
            && unit.len.is_multiple_of(SUM_BLOCK))
        .then(|| unit.sums(unit.offset..unit.end()));
        let mut recorded = false;
        // What the volume reads through (fills of partial new chunks), read
        // with the plan, under the same lock.
        let (plans, backing) = {
            let mut meta = self.write_meta()?;
            let plans = self.mutate(&mut meta, privilege, |m| {
                let plans = m.plan_chunks(unit.id.0, &wanted, end)?;
                if let Some(sums) = &early_sums {
                    if plans.iter().all(|p| matches!(p, ChunkPlan::InPlace(_))) {
                        m.record_sums(&in_place_sums(unit, &wanted, &plans, cs, |span| {
                            unit.sums_from(Some(sums), span)
                        }))?;
                        recorded = true;
                    }
                }
                Ok(plans)
            });
            let await_txn = meta.take_intents_await();
            let mut listed = true;
            if meta.wants_intents() {
                // Regions of chunks the plan could not overwrite in place
                // yet (`crate::intents`): in the set from this transaction
                // on, whether or not the plan succeeded.
                // Not adding them only costs later writes their redirect.
                if let Err(e) =
                    self.mutate(&mut meta, Privilege::Reserve, |m| m.add_wanted_intents())
                {
                    if e.stops_pool() {
                        return Err(e);
                    }
                    listed = false;
                }
            }
            let plans = plans?;
            if let Some(txn) = await_txn.filter(|_| wait_for_intents && listed) {
                // Only regions not yet durable in the set kept chunks from
                // going in place: drop the plan (its new chunks), write
                // nothing, and try again once they are.
                self.mutate(&mut meta, Privilege::Reserve, |m| m.release_planned(&plans))?;
                return Ok(Some(txn));
            }
            (plans, meta.volume(unit.id.0)?.backing)
        };
        if !plans
            .iter()
            .any(|p| matches!(p, ChunkPlan::InPlace(_) | ChunkPlan::Extend { .. }))
        {
            // Snapshots of the volume need not wait for the device writes.
            // (An extended partial keeps the gate to its mapping step: a
            // snapshot in between would share its chunk under the old mask
            // while the volume maps it with the new one.)
            *volume = None;
        }
        let redirects = plans.iter().any(|p| {
            matches!(
                p,
                ChunkPlan::Redirect { .. } | ChunkPlan::Partial { .. } | ChunkPlan::Extend { .. }
            )
        });
        let maps = redirects || !unmap.is_empty();
        let mapped = self
            .prepare_in_place(unit, &wanted, &plans, checksums && !recorded)
            .and_then(|in_place| {
                if !maps && in_place.sums.is_empty() {
                    // All in place (the common overwrite) in a pool
                    // without checksums: nothing to map or record.
                    return Ok(in_place);
                }
                let mut sums = if maps {
                    self.write_new_chunks(
                        unit,
                        &wanted,
                        &plans,
                        backing,
                        checksums,
                        early_sums.as_deref(),
                    )?
                } else {
                    Vec::new()
                };
                sums.extend(in_place.sums.iter().cloned());
                let mut meta = self.write_meta()?;
                self.mutate(&mut meta, privilege, |m| {
                    if maps {
                        m.map_planned(unit.id.0, &wanted, &plans, unmap.clone(), end)?;
                    }
                    m.record_sums(&sums)
                })?;
                Ok(in_place)
            });
        let in_place = match mapped {
            Ok(in_place) => in_place,
            Err(e) => {
                // Nothing maps the new chunks: free them, unless the pool stopped
                // (a failed mapping step that stops it; not a failed data write,
                // which leaves the metadata sound and is reported to the caller).
                if self.committer.check_failed().is_ok() {
                    let mut meta = self.write_meta()?;
                    self.mutate(&mut meta, Privilege::Reserve, |m| m.release_planned(&plans))?;
                }
                return Err(e);
            }
        };
        self.write_in_place(unit, &wanted, &plans, &in_place)?;
        self.count_chunk_writes(unit, &wanted, &plans, backing.is_some());
        Ok(None)
    }

    /// Adds a unit's chunk writes to [`ChunkWrites`], by plan. `reads_through`:
    /// the volume reads an epoch where it maps nothing (as `write_new_chunks`).
    fn count_chunk_writes(
        &self,
        unit: &Unit<'_>,
        wanted: &[ChunkWanted],
        plans: &[ChunkPlan],
        reads_through: bool,
    ) {
        let cs = self.chunk_size();
        for (w, plan) in wanted.iter().zip(plans) {
            // The same decisions as `write_new_chunks` about what it reads.
            let kind = match *plan {
                ChunkPlan::InPlace(_) => ChunkWrite::InPlace,
                ChunkPlan::Extend { .. } => ChunkWrite::Extended,
                ChunkPlan::Redirect { old, .. }
                    if unit.covers(w.chunk, cs) || (old.is_none() && !reads_through) =>
                {
                    ChunkWrite::Redirected
                }
                ChunkPlan::Redirect { .. } => ChunkWrite::RedirectedCopied,
                ChunkPlan::Partial { keep, .. } if unit.kept(w.chunk, cs, keep) != 0 => {
                    ChunkWrite::PartialCopied
                }
                ChunkPlan::Partial { old, .. } if old.partial.is_some() => ChunkWrite::PartialOver,
                ChunkPlan::Partial { .. } => ChunkWrite::Partial,
                ChunkPlan::Skip => continue,
            };
            self.counters.chunk_write(kind);
        }
    }

    /// Step 2: writes every redirected chunk whole; with `checksums`,
    /// returns the sums of what it wrote (from `pre`, the unit's sums, if
    /// computed already), for the mapping step to record.
    fn write_new_chunks(
        &self,
        unit: &Unit<'_>,
        wanted: &[ChunkWanted],
        plans: &[ChunkPlan],
        backing: Option<arbor_format::Backing>,
        checksums: bool,
        pre: Option<&[Option<u32>]>,
    ) -> Result<Vec<BlockSums>> {
        let geo = &self.store.geo;
        let cs = geo.chunk_size;
        let mut sums = Vec::new();
        let mut record = |pchunk: u64, first: u64, blocks: Vec<Option<u32>>| {
            if checksums {
                sums.push(BlockSums {
                    pchunk,
                    // Below the chunk's block count (a chunk is at most 1 MiB).
                    first: (first / SUM_BLOCK) as u32,
                    sums: blocks,
                });
            }
        };
        let mut runs = Runs::new(if unit.uncached {
            MAX_UNCACHED_WRITE
        } else {
            MAX_NEW_CHUNK_WRITE
        });
        for (w, plan) in wanted.iter().zip(plans) {
            let (old, new) = match *plan {
                ChunkPlan::Redirect { old, new } => (old, new),
                // The partial's chunk whole, without the old chunk: the
                // blocks outside its mask read from its other layers.
                ChunkPlan::Partial { old, to, keep } => {
                    if let Some(run) = runs.take() {
                        self.write_run(unit, &run, unit.uncached)?;
                    }
                    let kept = unit.kept(w.chunk, cs, keep);
                    let buf = self.write_partial_chunk(unit, w.chunk, to.phys, old, kept)?;
                    if checksums {
                        // Only the blocks of its mask: no mapping reads the
                        // others from this chunk.
                        let mask = to.partial.map_or(u32::MAX, |p| p.mask);
                        let blocks = buf
                            .chunks(SUM_BLOCK as usize)
                            .enumerate()
                            .map(|(b, bytes)| {
                                (b < 32 && (mask >> b) & 1 == 1)
                                    .then(|| arbor_format::block_sum(bytes))
                            })
                            .collect();
                        record(to.phys, 0, blocks);
                    }
                    continue;
                }
                // Only the unit's blocks, into the partial's chunk: nothing
                // reads them before the mapping step sets their bits.
                ChunkPlan::Extend { pchunk: to, .. } => {
                    let span = unit.span(w.chunk, cs);
                    let within = span.start - w.chunk * cs;
                    // Whole blocks, as the plan makes sure; if not, the
                    // blocks keep no sums rather than wrong ones.
                    if within.is_multiple_of(SUM_BLOCK) && span.end.is_multiple_of(SUM_BLOCK) {
                        record(to, within, unit.sums_from(pre, span.clone()));
                    }
                    let device = geo.chunk_offset(to) + within;
                    if let Some(run) = runs.add(span, device) {
                        self.write_run(unit, &run, unit.uncached)?;
                    }
                    continue;
                }
                ChunkPlan::InPlace(_) | ChunkPlan::Skip => continue,
            };
            let span = unit.span(w.chunk, cs);
            if unit.covers(w.chunk, cs) {
                if checksums {
                    record(new, 0, unit.sums_from(pre, span.clone()));
                }
                if let Some(run) = runs.add(span, geo.chunk_offset(new)) {
                    self.write_run(unit, &run, unit.uncached)?;
                }
                continue;
            }
            // A partial chunk: the old data (or zeros) around the write.
            if let Some(run) = runs.take() {
                self.write_run(unit, &run, unit.uncached)?;
            }
            let mut buf = vec![0u8; cs as usize];
            match (old, backing) {
                (Some(old), _) => self.read_mapped(old, &mut buf)?,
                // Unmapped in a volume that reads through an epoch: what
                // the epoch reads (its origin stripe is held, see `apply`).
                (None, Some(backing)) => self.read_view_chunk(backing, w.chunk, &mut buf)?,
                // Zeros, encrypted in an encrypted volume (they are mapped
                // now: a read decrypts them).
                (None, None) => super::crypt::unit_zeros(unit.cipher, w.chunk * cs, &mut buf)?,
            }
            let at = (span.start - w.chunk * cs) as usize;
            let len = (span.end - span.start) as usize;
            match unit.fill {
                Fill::Data(d) => {
                    let from = (span.start - unit.offset) as usize;
                    buf[at..at + len].copy_from_slice(&d[from..from + len]);
                }
                Fill::Zeros => buf[at..at + len].fill(0),
            }
            self.write_fresh_or_whole(&buf, new, plain_zeros(old, backing, unit), at..at + len)?;
            if checksums {
                record(new, 0, crate::sums::compute(&buf));
            }
        }
        if let Some(run) = runs.take() {
            self.write_run(unit, &run, unit.uncached)?;
        }
        Ok(sums)
    }

    /// Writes `buf`, the new chunk `new` of a write that does not cover
    /// it: whole, or, when the rest of `buf` is plain zeros (`zeros_around`)
    /// and the chunk is a hole on the device (a part of a sparse pool file
    /// never written, used through the page cache:
    /// [`arbor_io::BlockDevice::hole`]), only the 4 KiB blocks of
    /// `written` (bytes within the chunk), and nothing for a write of
    /// zeros. The sums recorded are those of `buf` whole either way: the
    /// blocks not written read as the zeros they are summed as. A first
    /// 4 KiB write into a fresh volume thus writes 4 KiB, not the chunk
    /// (PERFORMANCE.md § 18, "First writes into holes"). The allocation
    /// made the chunk this write's alone, so nothing else writes it
    /// before the mapping step.
    fn write_fresh_or_whole(
        &self,
        buf: &[u8],
        new: u64,
        zeros_around: bool,
        written: Range<usize>,
    ) -> Result<()> {
        let at = self.store.geo.chunk_offset(new);
        if zeros_around && self.store.dev.hole(at, buf.len() as u64)? {
            let (first, end) = crate::sums::block_span(written.start as u64, written.len() as u64);
            // Within the chunk: `written` is.
            let blocks = &buf[first as usize..end as usize];
            if blocks.iter().any(|&b| b != 0) {
                self.store.dev.write_at(blocks, at + first)?;
            }
            return Ok(());
        }
        self.store.dev.write_at(buf, at)?;
        Ok(())
    }

    /// Step 2 of a partial extent: its new chunk `new`, written whole in
    /// one write: the unit's bytes in chunk `chunk`, the old contents of
    /// the blocks `kept` ([`Unit::kept`]), read from where `old` maps them
    /// (one read per run of consecutive blocks from one data chunk), and
    /// zeros elsewhere. No block outside the mask is ever read through the
    /// partial, so what it holds there only keeps the chunk one contiguous
    /// write: writing just the unit's blocks into a fresh chunk
    /// of a pool file leaves holes between them, and a file system that
    /// maps each piece as its own extent made buffered writes under
    /// snapshots 15 % slower and commits twice as long (PERFORMANCE.md
    /// § 11, "Partial extents").
    fn write_partial_chunk(
        &self,
        unit: &Unit<'_>,
        chunk: u64,
        new: u64,
        old: Mapped,
        kept: u32,
    ) -> Result<Vec<u8>> {
        let geo = &self.store.geo;
        let cs = geo.chunk_size;
        let mut buf = vec![0u8; cs as usize];
        let span = unit.span(chunk, cs);
        for (range, from) in old.runs(cs) {
            // Blocks of the run to keep, in runs of consecutive ones. A
            // partial's mask is within its chunk's blocks (32 at most).
            let (first, end) = (range.start / PARTIAL_BLOCK, range.end / PARTIAL_BLOCK);
            let mut block = first;
            while block < end {
                if (kept >> block) & 1 == 0 {
                    block += 1;
                    continue;
                }
                let start = block;
                while block < end && (kept >> block) & 1 == 1 {
                    block += 1;
                }
                let bytes = start * PARTIAL_BLOCK..block * PARTIAL_BLOCK;
                let out = &mut buf[bytes.start as usize..bytes.end as usize];
                self.store
                    .dev
                    .read_at(out, geo.chunk_offset(from) + bytes.start)?;
                self.verify_chunk_part(from, bytes.start, out)?;
            }
        }
        let at = (span.start - chunk * cs) as usize..(span.end - chunk * cs) as usize;
        match unit.fill {
            Fill::Data(d) => {
                let from = (span.start - unit.offset) as usize;
                buf[at.clone()].copy_from_slice(&d[from..from + at.len()]);
            }
            Fill::Zeros => buf[at].fill(0),
        }
        self.store.dev.write_at(&buf, geo.chunk_offset(new))?;
        Ok(buf)
    }

    /// Step 4: overwrites the in-place chunks.
    ///
    /// Runs are written in turn here and in step 2, not as one batch as a
    /// read's pieces are: with direct I/O on a pool file, 1 MiB writes
    /// under a snapshot (new chunks, in runs of 64 KiB) ran at 0.74-0.76x
    /// with their runs in flight at once (PERFORMANCE.md § 10, "io_uring
    /// for batches").
    fn write_in_place(
        &self,
        unit: &Unit<'_>,
        wanted: &[ChunkWanted],
        plans: &[ChunkPlan],
        in_place: &InPlace,
    ) -> Result<()> {
        let geo = &self.store.geo;
        let cs = geo.chunk_size;
        let unit = &in_place.unit(unit);
        let mut runs = Runs::new(u64::MAX);
        for (w, plan) in wanted.iter().zip(plans) {
            let ChunkPlan::InPlace(phys) = *plan else {
                continue;
            };
            let span = unit.span(w.chunk, cs);
            let device = geo.chunk_offset(phys) + (span.start - w.chunk * cs);
            if let Some(run) = runs.add(span, device) {
                self.write_run(unit, &run, false)?;
            }
        }
        if let Some(run) = runs.take() {
            self.write_run(unit, &run, false)?;
        }
        Ok(())
    }

    /// Before the mapping step, in a pool with `checksums`: the sums of
    /// what each in-place chunk will hold. A unit that starts or ends
    /// inside a block of an in-place chunk writes whole blocks: that block
    /// is read first, and verified (a block damaged already is not given a
    /// new sum over its damage), and the unit's bytes go into a copy
    /// widened to whole blocks, which the in-place step writes instead.
    fn prepare_in_place(
        &self,
        unit: &Unit<'_>,
        wanted: &[ChunkWanted],
        plans: &[ChunkPlan],
        checksums: bool,
    ) -> Result<InPlace> {
        let mut in_place = InPlace::default();
        if !checksums {
            return Ok(in_place);
        }
        let geo = &self.store.geo;
        let cs = geo.chunk_size;
        let in_place_at = |byte: u64| {
            wanted
                .iter()
                .zip(plans)
                .find(|(w, _)| w.chunk == byte / cs)
                .and_then(|(_, p)| match *p {
                    ChunkPlan::InPlace(phys) => Some(phys),
                    _ => None,
                })
        };
        let (first, end) = crate::sums::block_span(unit.offset, unit.len);
        let head = (first != unit.offset).then(|| in_place_at(first)).flatten();
        let tail = (end != unit.end())
            .then(|| in_place_at(end - SUM_BLOCK))
            .flatten();
        if head.is_some() || tail.is_some() {
            let mut buf = vec![0u8; (end - first) as usize];
            let last = buf.len() - SUM_BLOCK as usize;
            // The tail block is the head block in a unit inside one block.
            let tail = tail.filter(|_| last > 0 || head.is_none());
            for (phys, at) in [(head, 0), (tail, last)] {
                let Some(phys) = phys else { continue };
                let logical = first + at as u64;
                let within = logical % cs;
                let bytes = &mut buf[at..at + SUM_BLOCK as usize];
                self.store
                    .dev
                    .read_at(bytes, geo.chunk_offset(phys) + within)?;
                self.verify_chunk_part(phys, within, bytes)?;
            }
            let at = (unit.offset - first) as usize;
            match unit.fill {
                Fill::Data(d) => buf[at..at + d.len()].copy_from_slice(d),
                Fill::Zeros => buf[at..at + unit.len as usize].fill(0),
            }
            in_place.widened = Some((first, buf));
        }
        let source = in_place.unit(unit);
        in_place.sums = in_place_sums(&source, wanted, plans, cs, |span| source.sums(span));
        Ok(in_place)
    }

    /// Writes a run of the unit's bytes (or zeros); `uncached`, past the
    /// page cache.
    fn write_run(&self, unit: &Unit<'_>, run: &Run, uncached: bool) -> Result<()> {
        match unit.fill {
            Fill::Data(d) => {
                let from = (run.logical.start - unit.offset) as usize;
                let to = (run.logical.end - unit.offset) as usize;
                if uncached {
                    self.store.dev.write_uncached(&d[from..to], run.device)?;
                } else {
                    self.store.dev.write_at(&d[from..to], run.device)?;
                }
            }
            Fill::Zeros => {
                let len = run.logical.end - run.logical.start;
                self.store.dev.write_zeroes(run.device, len)?;
            }
        }
        Ok(())
    }
}

/// Whether a new chunk that does not take a whole unit's bytes holds plain
/// zeros around them: nothing mapped before, nothing read through, and no
/// cipher (an encrypted volume's zeros are ciphertext).
fn plain_zeros(
    old: Option<Mapped>,
    backing: Option<arbor_format::Backing>,
    unit: &Unit<'_>,
) -> bool {
    old.is_none() && backing.is_none() && unit.cipher.is_none()
}

/// Merges pieces that are consecutive both in the unit and on the device,
/// up to `max` bytes.
struct Runs {
    open: Option<Run>,
    max: u64,
}

impl Runs {
    fn new(max: u64) -> Self {
        Self { open: None, max }
    }

    /// Adds `logical` bytes going to `device`; returns the run this closes,
    /// if the piece does not continue it.
    fn add(&mut self, logical: Range<u64>, device: u64) -> Option<Run> {
        if let Some(run) = &mut self.open {
            let len = run.logical.end - run.logical.start;
            let fits = len + (logical.end - logical.start) <= self.max;
            if fits && run.logical.end == logical.start && run.device + len == device {
                run.logical.end = logical.end;
                return None;
            }
        }
        self.open.replace(Run { logical, device })
    }

    fn take(&mut self) -> Option<Run> {
        self.open.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(offset: u64, len: u64, unmap: bool) -> Unit<'static> {
        Unit {
            id: VolumeId(1),
            offset,
            len,
            fill: Fill::Zeros,
            unmap,
            past_end: false,
            uncached: false,
            cipher: None,
            stored: false,
        }
    }

    #[test]
    fn a_discard_plans_its_partial_ends_and_unmaps_the_whole_chunks() {
        let cs = 4096;
        let chunks = |u: Unit| {
            let (w, unmap) = u.chunks(cs, false);
            (w.iter().map(|w| w.chunk).collect::<Vec<_>>(), unmap)
        };
        assert_eq!(chunks(unit(512, 3 * cs, true)), (vec![0, 3], 1..3));
        assert_eq!(chunks(unit(0, 3 * cs, true)), (vec![], 0..3));
        assert_eq!(chunks(unit(cs - 512, 1024, true)), (vec![0, 1], 0..0));
        assert_eq!(chunks(unit(512, 1024, true)), (vec![0], 0..0));
        assert_eq!(chunks(unit(cs, cs + 512, true)), (vec![2], 1..2));
        assert!(unit(cs, cs + 512, true).chunks(cs, false).0[0].only_if_mapped);
        assert_eq!(chunks(unit(512, 2 * cs, false)), (vec![0, 1, 2], 0..0));
    }

    #[test]
    fn a_unit_names_the_blocks_it_touches_in_each_chunk_it_does_not_cover() {
        let cs = 16384;
        let blocks = |offset, len| {
            let (w, _) = unit(offset, len, false).chunks(cs, true);
            w.iter()
                .map(|w| w.blocks.map(|b| (b.touched, b.whole)))
                .collect::<Vec<_>>()
        };
        assert_eq!(blocks(4096, 4096), [Some((0b0010, true))]);
        assert_eq!(blocks(0, cs), [None]);
        assert_eq!(
            blocks(12288, 8192),
            [Some((0b1000, true)), Some((0b0001, true))]
        );
        assert_eq!(blocks(100, 4096), [Some((0b0011, false))]);
        assert_eq!(blocks(4096, 8192 + 1), [Some((0b1110, false))]);
        assert_eq!(blocks(cs - 4096, cs + 4096), [Some((0b1000, true)), None]);
        // Not in a pool without partial extents.
        let (w, _) = unit(4096, 4096, false).chunks(cs, false);
        assert_eq!(w[0].blocks, None);
        // 32 blocks: the top one.
        let big = 32 * 4096;
        let (w, _) = unit(big - 4096, 4096, false).chunks(big, true);
        assert_eq!(w[0].blocks.map(|b| b.touched), Some(1 << 31));
        let (w, _) = unit(0, big - 4096, false).chunks(big, true);
        assert_eq!(w[0].blocks.map(|b| b.touched), Some(u32::MAX >> 1));
    }

    #[test]
    fn halves_split_on_a_chunk_boundary_and_a_single_chunk_does_not_split() {
        let cs = 4096;
        let (a, b) = unit(512, 3 * cs, false)
            .halves(cs)
            .expect("four chunks split");
        assert_eq!(
            (a.offset, a.end(), b.offset, b.end()),
            (512, 2 * cs, 2 * cs, 3 * cs + 512)
        );
        assert!(unit(0, cs, false).halves(cs).is_none());
        assert!(unit(512, 1024, false).halves(cs).is_none());
        let (a, b) = unit(cs - 512, 1024, false)
            .halves(cs)
            .expect("two chunks split");
        assert_eq!((a.end(), b.offset), (cs, cs));
    }

    #[test]
    fn runs_merge_only_what_is_consecutive_in_the_unit_and_on_the_device() {
        let max = MAX_NEW_CHUNK_WRITE;
        let mut runs = Runs::new(max);
        assert!(runs.add(0..max - 10, 0).is_none());
        let closed = runs
            .add(max - 10..max + 10, max - 10)
            .expect("too long closes the run");
        assert_eq!((closed.logical, closed.device), (0..max - 10, 0));
        runs.take();
        assert!(runs.add(0..10, 100).is_none());
        assert!(runs.add(10..20, 110).is_none());
        let closed = runs.add(20..30, 200).expect("device gap closes the run");
        assert_eq!((closed.logical, closed.device), (0..20, 100));
        let closed = runs.add(40..50, 210).expect("logical gap closes the run");
        assert_eq!((closed.logical, closed.device), (20..30, 200));
        let last = runs.take().expect("open run");
        assert_eq!((last.logical, last.device), (40..50, 210));
        assert!(runs.take().is_none());
    }

    #[test]
    fn a_maximum_payload_is_one_unit_wherever_it_starts() {
        for cs in [4096u64, 16384, 1 << 20] {
            let u = unit(512, UNIT_BYTES, false);
            let range = u.chunk_range(cs);
            assert!(range.end - range.start <= unit_chunks(cs));
        }
    }
}

/// A unit split for journal room (see `Pool::apply`) is atomic as a whole,
/// not per piece. Unit tests: they set how much metadata ordinary steps may
/// allocate, one block at a time, which the public API cannot.
#[cfg(test)]
mod split_tests {

    use super::*;

    const CS: u64 = 4096;
    /// Chunks of the written volume; each lies 64 chunks from the last, so
    /// their space-map entries span more pages than the 16-page journal.
    const A_CHUNKS: u64 = 300;
    const GAP: u64 = 63;

    fn pattern(seed: u64, len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| (seed.wrapping_mul(31).wrapping_add(i as u64 / 512) % 251) as u8 | 1)
            .collect()
    }

    /// A pool whose volume `a` (snapshotted as `a@s`, so that every chunk a
    /// write touches is redirected) has its chunks scattered; returns `a`
    /// and its contents.
    fn scattered_snapshotted() -> (Pool, VolumeId, Vec<u8>) {
        let dev: Arc<dyn BlockDevice> = Arc::new(arbor_io::SimDisk::new(100 << 20));
        let opts = CreateOptions {
            chunk_size: CS as u32,
            metadata_bytes: Some(2 << 20),
            journal_pages: Some(16),
            ..CreateOptions::default()
        };
        let pool = Pool::create(dev, &opts, &OpenOptions::default()).unwrap();
        let a = pool.create_volume("a", A_CHUNKS * CS).unwrap();
        let b = pool.create_volume("b", A_CHUNKS * GAP * CS).unwrap();
        let mut model = Vec::new();
        for c in 0..A_CHUNKS {
            let data = pattern(c, CS as usize);
            pool.write(a, c * CS, &data).unwrap();
            model.extend_from_slice(&data);
            pool.write(b, c * GAP * CS, &pattern(c + 1000, (GAP * CS) as usize))
                .unwrap();
        }
        // Fill the rest of the pool, then free every other chunk of b's
        // first gaps: new chunks come one in two, so the extents of a's new
        // mappings never merge and its tree keeps its size.
        let stats = pool.pool_stats().unwrap();
        let f = pool.create_volume("f", stats.data_bytes).unwrap();
        let mut at = 0;
        for len in [1 << 20, CS] {
            while pool.write(f, at, &vec![3; len as usize]).is_ok() {
                at += len;
            }
        }
        for c in (0..A_CHUNKS * 4).step_by(2) {
            pool.discard(b, c * CS, CS).unwrap();
        }
        pool.snapshot("a@s").unwrap();
        pool.flush().unwrap();
        (pool, a, model)
    }

    fn read(pool: &Pool, id: VolumeId) -> Vec<u8> {
        let mut buf = vec![0u8; (A_CHUNKS * CS) as usize];
        pool.read(id, 0, &mut buf).unwrap();
        buf
    }

    /// Regression (long exhaustion run, seed 40094): a zero-keep over
    /// scattered shared chunks does not fit the journal whole and is split;
    /// the metadata ran out in its second piece, after the first had been
    /// applied and committed. Every count of allocatable metadata blocks in
    /// turn, from none to more than the unit needs: the call fails and the
    /// volume reads as before, or succeeds and it reads as zeros; the
    /// snapshot never changes, and the pool checks clean and still writes.
    #[test]
    fn a_split_unit_is_atomic_whatever_point_metadata_runs_out_at() {
        let (mut failed, mut succeeded, mut split) = (0, 0, 0);
        for allow in 0..200u64 {
            let (pool, a, model) = scattered_snapshotted();
            {
                let mut meta = pool.meta.write().unwrap();
                let free = meta.meta().allocatable(SmKind::Meta);
                meta.set_meta_reserve(free.saturating_sub(allow));
            }
            let splits_before = pool.counters.split_units();
            let result = pool.write_zeroes(a, 0, A_CHUNKS * CS, true);
            split += pool.counters.split_units() - splits_before;
            match &result {
                Ok(()) => {
                    assert!(read(&pool, a).iter().all(|&b| b == 0), "allow {allow}");
                    succeeded += 1;
                }
                Err(
                    Error::Exhausted(Resource::Metadata) | Error::Exhausted(Resource::DataSpace),
                ) => {
                    assert!(
                        read(&pool, a) == model,
                        "allow {allow}: {result:?} left a changed"
                    );
                    failed += 1;
                }
                Err(e) => panic!("allow {allow}: {e}"),
            }
            let snap = pool.lookup("a@s").unwrap();
            assert!(
                read(&pool, snap) == model,
                "allow {allow}: snapshot changed"
            );
            pool.flush().unwrap();
            let report = pool.check().unwrap();
            assert!(report.is_clean(), "allow {allow}: {:?}", report.problems);
            // The space is usable again once the reserve is back.
            pool.meta.write().unwrap().set_meta_reserve(64);
            pool.write(a, 0, &[7; 4096]).unwrap();
            if succeeded >= 3 {
                break;
            }
        }
        assert!(
            failed > 0 && succeeded > 0,
            "failed {failed}, succeeded {succeeded}"
        );
        assert!(split > 0, "no unit was split");
    }
}
