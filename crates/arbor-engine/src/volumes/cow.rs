//! Copy-on-write volumes in the volume layer: their snapshots (epochs),
//! the copies their writes plan and map, and the sweep of copies no epoch
//! reads any more (docs/FORMAT.md §6.1, docs/ARCHITECTURE.md
//! "Copy-on-write volumes").

use arbor_format::{
    store_key, Backing, BlockRef, CowState, DataLayout, DeviceIdentity, Home, VolumeKind,
    VolumeRecord, MAX_COW_CHUNKS, MAX_EPOCH,
};

use std::collections::HashMap;

use super::Volumes;
use crate::error::{Capability, Conflict, Error, Invalid, Result, Unsupported};
use crate::snapstore::{SnapStore, SnapStoreMut, StoreEntry};

/// A copy planned for one chunk of a copy-on-write volume: its content
/// now goes to data chunk `pchunk`, for epochs `first ..= last`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CopyPlan {
    pub chunk: u64,
    pub first: u64,
    pub last: u64,
    pub pchunk: u64,
}

/// The name ending of a *loose home*: a hidden copy-on-write record
/// (`{id}%home`, its own id; `%` is never part of a volume name) holding
/// part of an in-pool home that no volume owns: one being built a commit at
/// a time, or left to free (a big home destroyed, or a build that failed or
/// that a power cut interrupted). Reclaim frees it from its end, a step at
/// a time (docs/FORMAT.md §6.1, "Homes larger than one commit").
const LOOSE_HOME: &str = "%home";

/// What a home grows by ([`Volumes::grow_home`]), or the whole new home it
/// moves to ([`Volumes::move_home`]).
pub enum HomeGrowth {
    /// Data chunks set aside, allocated by the growth.
    Run(std::ops::Range<u64>),
    /// A loose home built for the growth, whose references it takes.
    Loose(u64),
}

/// Whether `rec` is a loose home (see [`LOOSE_HOME`]).
pub(crate) fn is_loose_home(rec: &VolumeRecord) -> bool {
    rec.name.ends_with(LOOSE_HOME)
        && matches!(
            rec.layout,
            DataLayout::Cow(CowState {
                home: Home::Pool { .. },
                ..
            })
        )
}

/// Whether people see `rec`: a volume or snapshot, not a receive, hold,
/// property or loose home.
pub(crate) fn is_visible(rec: &VolumeRecord) -> bool {
    rec.kind.is_visible() && !is_loose_home(rec)
}

impl Volumes {
    fn check_cow_supported(&self) -> Result<()> {
        if !self.meta.geo().version().has_cow_volumes() || !self.has_identities() {
            return Err(Unsupported::Format(Capability::CowVolumes).into());
        }
        Ok(())
    }

    /// The copy-on-write state of volume `id`.
    pub fn cow_state(&self, id: u64) -> Result<(CowState, &VolumeRecord)> {
        let rec = self.volume(id)?;
        match rec.layout {
            DataLayout::Cow(cow) => Ok((cow, rec)),
            DataLayout::Row => Err(Error::inconsistent(format!(
                "{} is not a copy-on-write volume",
                rec.name
            ))),
        }
    }

    /// Fails unless a copy-on-write volume of `chunks` chunks can be made.
    pub fn check_cow_home(&self, chunks: u64) -> Result<()> {
        self.check_cow_supported()?;
        if chunks > MAX_COW_CHUNKS {
            let cs = self.meta.geo().chunk_size;
            return Err(Invalid::CowTooLarge {
                max_chunks: MAX_COW_CHUNKS,
                max_bytes: MAX_COW_CHUNKS.saturating_mul(cs),
            }
            .into());
        }
        Ok(())
    }

    /// Finds and sets aside a home of `chunks` data chunks for a
    /// copy-on-write volume (see `Meta::reserve_data_run`).
    pub fn reserve_home(&mut self, chunks: u64) -> Result<std::ops::Range<u64>> {
        self.meta.reserve_data_run(chunks)
    }

    pub fn unreserve_home(&mut self, run: &std::ops::Range<u64>) {
        self.meta.unreserve_data(run)
    }

    /// Splits the set-aside run `run` at `at`: both parts stay set aside,
    /// each ended by its own [`Self::unreserve_home`] (or its allocation).
    pub fn split_reserved_home(
        &mut self,
        run: &std::ops::Range<u64>,
        at: u64,
    ) -> (std::ops::Range<u64>, std::ops::Range<u64>) {
        debug_assert!(run.contains(&at));
        self.meta.unreserve_data(run);
        let (head, tail) = (run.start..at, at..run.end);
        self.meta.reserve_data(head.clone());
        self.meta.reserve_data(tail.clone());
        (head, tail)
    }

    /// Adds copy-on-write volume `name` of `size` bytes whose home is the
    /// data chunks of `run` (set aside, and zeroed, by the caller), which
    /// it allocates.
    pub fn add_pool_cow_volume(
        &mut self,
        name: String,
        size: u64,
        run: std::ops::Range<u64>,
    ) -> Result<u64> {
        let cs = self.meta.geo().chunk_size;
        if run.end - run.start != size.div_ceil(cs) {
            return Err(Error::inconsistent("a home of the wrong length"));
        }
        let first = run.start;
        self.meta.alloc_data_run(run)?;
        self.add_cow_volume(name, size, Home::Pool { first })
    }

    /// Frees the home of copy-on-write volume record `rec` (removed), if it
    /// is in the pool: at once if one step of [`Self::shrink_loose_home`]
    /// would, else by handing it to a loose home, which reclaim frees a
    /// step at a time (its references move, no count changes).
    pub(super) fn free_home(&mut self, rec: &VolumeRecord) -> Result<()> {
        if let DataLayout::Cow(CowState {
            home: Home::Pool { first },
            ..
        }) = rec.layout
        {
            let chunks = rec.size_bytes.div_ceil(self.meta.geo().chunk_size);
            if chunks <= self.home_free_step() {
                self.meta.dec_data_range(first, chunks)?;
            } else {
                self.add_loose_home(first, chunks)?;
            }
        }
        Ok(())
    }

    /// Chunks one step frees from a loose home: four space-map pages'
    /// worth (they span five at most), which an empty transaction of any
    /// pool journals.
    pub fn home_free_step(&self) -> u64 {
        4 * arbor_format::SM_ENTRIES_PER_PAGE as u64
    }

    /// A loose home holding the `chunks` data chunks from `first`, whose
    /// references the caller gives it (allocated in the same step, or
    /// taken from a removed record). Returns its id.
    fn add_loose_home(&mut self, first: u64, chunks: u64) -> Result<u64> {
        let cs = self.meta.geo().chunk_size;
        let size = chunks
            .checked_mul(cs)
            .ok_or_else(|| Error::inconsistent("a home past 2^64 bytes"))?;
        let name = format!("{}{LOOSE_HOME}", self.next_id);
        self.add_cow_volume(name, size, Home::Pool { first })
    }

    /// The first step of a home built a commit at a time: a loose home
    /// holding the data chunks of `run` (set aside and zeroed by the
    /// caller), which it allocates. Returns its id.
    pub fn begin_home(&mut self, run: std::ops::Range<u64>) -> Result<u64> {
        self.check_cow_supported()?;
        let (first, chunks) = (run.start, run.end - run.start);
        self.meta.alloc_data_run(run)?;
        self.add_loose_home(first, chunks)
    }

    /// A further step of a home being built: loose home `id` grows by the
    /// data chunks of `run`, which must follow its end (set aside and
    /// zeroed by the caller), and which it allocates.
    pub fn extend_home(&mut self, id: u64, run: std::ops::Range<u64>) -> Result<()> {
        let (first, chunks) = self.loose_home(id)?;
        if first.checked_add(chunks) != Some(run.start) {
            return Err(Error::inconsistent(format!(
                "a home of {chunks} chunks from {first} extended from chunk {}",
                run.start
            )));
        }
        let total = chunks + (run.end - run.start);
        self.check_cow_home(total)?;
        let size = total
            .checked_mul(self.meta.geo().chunk_size)
            .ok_or_else(|| Error::inconsistent("a home past 2^64 bytes"))?;
        self.meta.alloc_data_run(run)?;
        self.update_volume(id, |rec| rec.size_bytes = size)
    }

    /// The last step of a home built a commit at a time: loose home `id`
    /// becomes copy-on-write volume `name` of `size` bytes (its whole home).
    pub fn finish_home(&mut self, id: u64, name: String, size: u64) -> Result<()> {
        let (_, chunks) = self.loose_home(id)?;
        if size.div_ceil(self.meta.geo().chunk_size) != chunks {
            return Err(Error::inconsistent(format!(
                "a home of {chunks} chunks finished as {size} bytes"
            )));
        }
        self.ensure_name_free(&name)?;
        self.rename_volume(id, name)?;
        self.update_volume(id, |rec| rec.size_bytes = size)
    }

    /// Sets aside the data chunks right after the home of in-pool
    /// copy-on-write volume `id`, up to `chunks` in all (`NoSpace` if any
    /// is taken or past the home's region). Returns them.
    pub fn reserve_home_growth(&mut self, id: u64, chunks: u64) -> Result<std::ops::Range<u64>> {
        self.check_cow_home(chunks)?;
        let (first, now) = self.pool_home(id)?;
        let run = first + now..first + chunks;
        self.meta.reserve_data_after(run.clone())?;
        Ok(run)
    }

    /// Grows in-pool copy-on-write volume `id` from `old_size` to
    /// `new_size` bytes, its home by the data chunks of `run` (set aside
    /// and zeroed by the caller, right after the home), which it allocates,
    /// or by those of loose home `loose`, whose references it takes.
    pub fn grow_home(
        &mut self,
        id: u64,
        old_size: u64,
        new_size: u64,
        added: HomeGrowth,
    ) -> Result<()> {
        let cs = self.meta.geo().chunk_size;
        let (first, now) = self.home_of_size(id, old_size)?;
        let (start, chunks) = self.home_growth_run(&added)?;
        if start != first + now || (now + chunks) != new_size.div_ceil(cs) {
            return Err(Error::inconsistent(format!(
                "a home of {now} chunks from {first} grown by {chunks} from {start} to {new_size} bytes"
            )));
        }
        self.take_home_growth(added)?;
        self.set_volume_size(id, new_size)
    }

    /// Moves the home of in-pool copy-on-write volume `id` (`old_size`
    /// bytes) to `to`, its whole new home of `new_size` bytes, which holds
    /// the volume's content already (written by the caller): the data
    /// chunks of a run set aside, which it allocates, or those of a loose
    /// home, whose references it takes. The old home passes to a loose home
    /// (its references move, no count changes), which reclaim frees.
    pub fn move_home(
        &mut self,
        id: u64,
        old_size: u64,
        new_size: u64,
        to: HomeGrowth,
    ) -> Result<()> {
        let cs = self.meta.geo().chunk_size;
        let (first, now) = self.home_of_size(id, old_size)?;
        let (start, chunks) = self.home_growth_run(&to)?;
        if chunks != new_size.div_ceil(cs) || chunks < now || new_size < old_size {
            return Err(Error::inconsistent(format!(
                "a home of {now} chunks moved to {chunks} chunks from {start} for {new_size} bytes"
            )));
        }
        self.take_home_growth(to)?;
        self.update_volume(id, |rec| {
            if let DataLayout::Cow(cow) = &mut rec.layout {
                cow.home = Home::Pool { first: start };
            }
            rec.size_bytes = new_size;
        })?;
        // After the volume leaves it: a run is the home of one record.
        self.add_loose_home(first, now)?;
        Ok(())
    }

    /// Gives external copy-on-write volume `id` (`size` bytes) a home in
    /// the pool: `to`, which holds its content already (written by the
    /// caller): the data chunks of a run set aside, which it allocates, or
    /// those of a loose home, whose references it takes. Its store, epochs
    /// and readers stay as they are; the device is no longer its home.
    pub fn import_home(&mut self, id: u64, size: u64, to: HomeGrowth) -> Result<()> {
        let cs = self.meta.geo().chunk_size;
        let (cow, rec) = self.cow_state(id)?;
        if !matches!(cow.home, Home::External(_)) || cow.rollback != 0 || rec.size_bytes != size {
            return Err(Conflict::HomeChanged(rec.name.clone()).into());
        }
        let (start, chunks) = self.home_growth_run(&to)?;
        if chunks != size.div_ceil(cs) {
            return Err(Error::inconsistent(format!(
                "a home of {chunks} chunks from {start} for {size} bytes"
            )));
        }
        self.take_home_growth(to)?;
        self.update_volume(id, |rec| {
            if let DataLayout::Cow(cow) = &mut rec.layout {
                cow.home = Home::Pool { first: start };
            }
        })
    }

    /// In-pool copy-on-write volume `id`'s home, as [`Self::pool_home`],
    /// while the volume is still `old_size` bytes.
    fn home_of_size(&self, id: u64, old_size: u64) -> Result<(u64, u64)> {
        let home = self.pool_home(id)?;
        let rec = self.volume(id)?;
        if rec.size_bytes != old_size {
            return Err(Invalid::ResizedMeanwhile(rec.name.clone()).into());
        }
        Ok(home)
    }

    /// The first chunk and length of the chunks `added` holds.
    fn home_growth_run(&self, added: &HomeGrowth) -> Result<(u64, u64)> {
        match *added {
            HomeGrowth::Run(ref run) => Ok((run.start, run.end - run.start)),
            HomeGrowth::Loose(loose) => self.loose_home(loose),
        }
    }

    /// Takes the chunks `added` holds for a home: allocates a run set
    /// aside, or takes a loose home's references (its record removed).
    fn take_home_growth(&mut self, added: HomeGrowth) -> Result<()> {
        match added {
            HomeGrowth::Run(run) => self.meta.alloc_data_run(run),
            HomeGrowth::Loose(loose) => self.table.remove(loose).map(drop),
        }
    }

    /// In-pool copy-on-write volume `id`'s home: its first chunk and its
    /// length in chunks.
    pub fn pool_home(&self, id: u64) -> Result<(u64, u64)> {
        self.home_run(id, false)
    }

    /// Loose home `id`: its first chunk and its length in chunks.
    fn loose_home(&self, id: u64) -> Result<(u64, u64)> {
        self.home_run(id, true)
    }

    /// The home in the pool of record `id`, which must be a loose home if
    /// `loose`, else a volume: its first chunk and its length in chunks.
    fn home_run(&self, id: u64, loose: bool) -> Result<(u64, u64)> {
        let rec = self.volume(id)?;
        match rec.layout {
            DataLayout::Cow(CowState {
                home: Home::Pool { first },
                ..
            }) if is_loose_home(rec) == loose => {
                Ok((first, rec.size_bytes.div_ceil(self.meta.geo().chunk_size)))
            }
            _ => Err(Error::inconsistent(format!(
                "{} is not {}",
                rec.name,
                if loose {
                    "a loose home"
                } else {
                    "a copy-on-write volume with its home in the pool"
                }
            ))),
        }
    }

    /// A loose home, if there is any.
    pub fn any_loose_home(&self) -> Option<u64> {
        self.table
            .iter()
            .find(|(_, r)| is_loose_home(r))
            .map(|(id, _)| id)
    }

    /// One step of freeing loose home `id`: its last
    /// [`Self::home_free_step`] chunks at most, and its record with its
    /// last chunk. Returns the chunks freed.
    pub fn shrink_loose_home(&mut self, id: u64) -> Result<u64> {
        let (first, chunks) = self.loose_home(id)?;
        let n = chunks.min(self.home_free_step());
        let left = chunks - n;
        self.meta.dec_data_range(first + left, n)?;
        if left == 0 {
            self.table.remove(id)?;
        } else {
            let size = left * self.meta.geo().chunk_size;
            self.update_volume(id, |rec| rec.size_bytes = size)?;
        }
        Ok(n)
    }

    /// The copy-on-write volume, other than `except`, whose home is `home`:
    /// a device or run of the pool is the home of one volume at most.
    fn volume_with_home(&self, home: Home, except: Option<u64>) -> Option<&VolumeRecord> {
        self.table
            .iter()
            .find(|(id, r)| {
                Some(*id) != except && matches!(r.layout, DataLayout::Cow(c) if c.home == home)
            })
            .map(|(_, r)| r)
    }

    /// Adds copy-on-write volume `name` of `size` bytes whose data is in
    /// `home`, with an empty snapshot store.
    pub fn add_cow_volume(&mut self, name: String, size: u64, home: Home) -> Result<u64> {
        self.check_cow_home(size.div_ceil(self.meta.geo().chunk_size))?;
        if let Some(other) = self.volume_with_home(home, None) {
            return Err(Error::already_exists(format!(
                "{} (the same device is attached as {})",
                name, other.name
            )));
        }
        self.ensure_name_free(&name)?;
        let id = self.add_volume(name, VolumeKind::Volume, size, BlockRef::NONE, 0, 0);
        self.update_volume(id, |rec| {
            rec.layout = DataLayout::Cow(CowState {
                home,
                epoch: 0,
                rollback: 0,
            })
        })?;
        Ok(id)
    }

    /// Snapshot `name` of copy-on-write volume `source`: a record reading
    /// through the volume's next epoch, O(1) (no tree is shared: the
    /// volume's later writes copy what the snapshot sees).
    pub(super) fn snapshot_cow(&mut self, source: u64, name: String) -> Result<u64> {
        let (cow, rec) = self.cow_state(source)?;
        if cow.rollback != 0 {
            return Err(Conflict::RollingBack(rec.name.clone()).into());
        }
        if cow.epoch >= MAX_EPOCH {
            return Err(Unsupported::TooManyEpochs {
                name: rec.name.clone(),
                max: MAX_EPOCH,
            }
            .into());
        }
        let size = rec.size_bytes;
        let epoch = cow.epoch + 1;
        self.update_volume(source, |rec| {
            rec.layout = DataLayout::Cow(CowState { epoch, ..cow })
        })?;
        let id = self.add_volume(name, VolumeKind::Snapshot, size, BlockRef::NONE, source, 0);
        self.update_volume(id, |rec| {
            rec.backing = Some(Backing {
                origin: source,
                epoch,
            })
        })?;
        Ok(id)
    }

    /// Whether chunk `chunk` of copy-on-write volume `id` must be copied
    /// before it is overwritten: the epochs a new copy would serve (from
    /// after the newest copy of the chunk to the newest epoch read), or
    /// None when every epoch read has its copy already (or none is read).
    pub fn copy_needed(&self, id: u64, chunk: u64) -> Result<Option<(u64, u64)>> {
        let Some(newest) = self.table.newest_live_epoch(id) else {
            return Ok(None);
        };
        let root = self.volume(id)?.root;
        let covered = SnapStore::new(&self.meta, root)
            .newest(chunk)?
            .map_or(0, |copy| copy.last);
        Ok((newest > covered).then_some((covered + 1, newest)))
    }

    /// The planning step of a copy-on-write write: allocates a data chunk
    /// for each chunk of `chunks` that needs a copy.
    pub fn plan_copies(&mut self, id: u64, chunks: std::ops::Range<u64>) -> Result<Vec<CopyPlan>> {
        self.cow_state(id)?;
        let mut plans = Vec::new();
        for chunk in chunks {
            if let Some((first, last)) = self.copy_needed(id, chunk)? {
                plans.push(CopyPlan {
                    chunk,
                    first,
                    last,
                    pchunk: self.meta.alloc_data()?,
                });
            }
        }
        Ok(plans)
    }

    /// The mapping step: puts the copies (written already) in the store.
    pub fn map_copies(&mut self, id: u64, plans: &[CopyPlan]) -> Result<()> {
        let mut root = self.volume(id)?.root;
        let gen = self.meta.txn();
        for plan in plans {
            // The writer holds the chunks' origin stripes and the I/O gate
            // since the plan, so nothing copied or snapshotted meanwhile: a
            // paired check.
            let needed = self.copy_needed(id, plan.chunk)?;
            if needed != Some((plan.first, plan.last)) {
                return Err(Error::inconsistent(format!(
                    "chunk {} of volume {id} needs a copy for {needed:?}, planned for {}..={}",
                    plan.chunk, plan.first, plan.last
                )));
            }
            let mut store = SnapStoreMut::new(&mut self.meta, root);
            store.insert(StoreEntry {
                chunk: plan.chunk,
                first: plan.first,
                last: plan.last,
                pchunk: plan.pchunk,
                gen,
            })?;
            root = store.root();
            self.update_volume(id, |rec| {
                rec.root = root;
                rec.mapped_chunks += 1;
            })?;
        }
        Ok(())
    }

    /// Drops the chunks of copies that were planned and not mapped.
    pub fn release_copies(&mut self, plans: &[CopyPlan]) -> Result<()> {
        for plan in plans {
            self.meta.dec_data(plan.pchunk)?;
        }
        Ok(())
    }

    /// Looks at up to `max` store entries of copy-on-write volume `id` from
    /// key `from` on, and removes those no epoch reads any more; returns
    /// where to go on (None: the end of the store was reached) and how many
    /// entries it looked at.
    pub fn sweep_copies(&mut self, id: u64, from: u64, max: usize) -> Result<(Option<u64>, usize)> {
        let (cow, rec) = self.cow_state(id)?;
        let root = rec.root;
        let mut dead = Vec::new();
        let mut seen = 0;
        let mut next = None;
        let table = &self.table;
        SnapStore::new(&self.meta, root).for_each(from, &mut |copy| {
            if seen == max {
                next = Some(copy.key());
                return Ok(false);
            }
            seen += 1;
            // A rollback in progress reads its epoch's copies too.
            let rolled_back = (copy.first..=copy.last).contains(&cow.rollback);
            if !rolled_back && !table.live_between(id, copy.first, copy.last) {
                dead.push(copy.key());
            }
            Ok(true)
        })?;
        let mut store = SnapStoreMut::new(&mut self.meta, root);
        for key in &dead {
            let copy = store.remove(*key)?;
            let copy = copy.ok_or_else(|| Error::inconsistent("a swept copy vanished"))?;
            store.meta_mut().dec_data(copy.pchunk)?;
        }
        let root = store.root();
        if !dead.is_empty() {
            let n = dead.len() as u64;
            self.update_volume(id, |rec| {
                rec.root = root;
                rec.mapped_chunks = rec.mapped_chunks.saturating_sub(n);
            })?;
        }
        Ok((next, seen))
    }

    /// Records `identity` as the device of external copy-on-write volume
    /// `id` (a disk whose device number changed; the caller knows it is the
    /// same disk). No other volume may have that identity.
    pub fn set_external_identity(&mut self, id: u64, identity: DeviceIdentity) -> Result<()> {
        let (cow, rec) = self.cow_state(id)?;
        if !matches!(cow.home, Home::External(_)) {
            return Err(Invalid::DataInPool(rec.name.clone()).into());
        }
        let home = Home::External(identity);
        if let Some(other) = self.volume_with_home(home, Some(id)) {
            return Err(Error::already_exists(format!(
                "the device of {} (that identity)",
                other.name
            )));
        }
        self.update_volume(id, |rec| {
            rec.layout = DataLayout::Cow(CowState { home, ..cow })
        })
    }

    /// Records that copy-on-write volume `id` is being rolled back to
    /// `epoch` (0: done).
    pub fn set_cow_rollback(&mut self, id: u64, epoch: u64) -> Result<()> {
        let (cow, _) = self.cow_state(id)?;
        self.update_volume(id, |rec| {
            rec.layout = DataLayout::Cow(CowState {
                rollback: epoch,
                ..cow
            })
        })
    }

    /// Fails when copy-on-write volume `id` still has readers (snapshots,
    /// their clones and the clones' snapshots).
    pub fn check_no_readers(&self, id: u64) -> Result<()> {
        let (epochs, readers) = self.table.readers_of(id);
        if readers > 0 {
            return Err(Conflict::ReadThrough {
                name: self.volume(id)?.name.clone(),
                readers,
                epochs,
            }
            .into());
        }
        Ok(())
    }

    /// The copy-on-write volumes.
    pub fn cow_volumes(&self) -> Vec<(u64, CowState)> {
        self.table
            .iter()
            .filter(|(_, r)| !is_loose_home(r))
            .filter_map(|(id, r)| match r.layout {
                DataLayout::Cow(cow) => Some((id, cow)),
                DataLayout::Row => None,
            })
            .collect()
    }

    /// Copies epoch `epoch` of copy-on-write volume `id` reads and the
    /// volume does not (the chunks a rollback to it writes back), from key
    /// `from` on, at most `max`; and where to go on (None: done).
    pub fn copies_of_epoch(
        &self,
        id: u64,
        epoch: u64,
        from: u64,
        max: usize,
    ) -> Result<(Vec<StoreEntry>, Option<u64>)> {
        let root = self.volume(id)?.root;
        let mut found = Vec::new();
        let mut next = None;
        SnapStore::new(&self.meta, root).for_each(from, &mut |copy| {
            if found.len() == max {
                next = Some(copy.key());
                return Ok(false);
            }
            if copy.first <= epoch && epoch <= copy.last {
                found.push(copy);
            }
            Ok(true)
        })?;
        Ok((found, next))
    }

    /// Bytes of copies that only one live epoch of copy-on-write volume
    /// `origin` reads, by epoch: what destroying the last record reading
    /// that epoch would free. One walk of the store, whatever the number
    /// of epochs.
    pub fn copies_by_sole_epoch(&self, origin: u64) -> Result<HashMap<u64, u64>> {
        let root = self.volume(origin)?.root;
        let cs = self.meta.geo().chunk_size;
        let mut bytes = HashMap::new();
        let table = &self.table;
        SnapStore::new(&self.meta, root).for_each(0, &mut |copy| {
            if let Some(epoch) = table.sole_live_epoch(origin, copy.first, copy.last) {
                *bytes.entry(epoch).or_insert(0u64) += cs;
            }
            Ok(true)
        })?;
        Ok(bytes)
    }

    /// Whether copy-on-write volume `origin` was written since epoch `epoch`
    /// was taken: some copy covers it (every first write since copies its
    /// chunk for every live epoch before it). Walks the store until the
    /// first such copy.
    pub fn written_since_epoch(&self, origin: u64, epoch: u64) -> Result<bool> {
        let (_, rec) = self.cow_state(origin)?;
        let mut written = false;
        SnapStore::new(&self.meta, rec.root).for_each(0, &mut |copy| {
            written = copy.first <= epoch && epoch <= copy.last;
            Ok(!written)
        })?;
        Ok(written)
    }

    /// The chunks in `chunks` whose content differs between epoch `lo` of
    /// copy-on-write volume `origin` and epoch `hi` (> `lo`; `MAX_EPOCH`
    /// and above: the volume as it is now), in order, each once: those
    /// with a copy that `lo` reads and `hi` does not. (A chunk `lo` reads
    /// from the device was not overwritten since, so `hi` reads the same;
    /// a copy serving both holds what both read.) One walk of the store's
    /// keys for those chunks.
    pub fn epoch_changes(
        &self,
        origin: u64,
        lo: u64,
        hi: u64,
        chunks: std::ops::Range<u64>,
        emit: &mut dyn FnMut(u64) -> Result<()>,
    ) -> Result<()> {
        let (_, rec) = self.cow_state(origin)?;
        if chunks.start >= chunks.end || chunks.start >= MAX_COW_CHUNKS {
            return Ok(());
        }
        let mut last_emitted = None;
        SnapStore::new(&self.meta, rec.root).for_each(store_key(chunks.start, 0), &mut |copy| {
            if copy.chunk >= chunks.end {
                return Ok(false);
            }
            if copy.first <= lo
                && lo <= copy.last
                && copy.last < hi
                && last_emitted != Some(copy.chunk)
            {
                last_emitted = Some(copy.chunk);
                emit(copy.chunk)?;
            }
            Ok(true)
        })
    }
}
