//! The volume layer: the volume table, the family tree (snapshot, clone,
//! rollback, delete), the write plan of the data path and reclaim, over
//! the mapping trees and the transaction. [`Volumes`] owns the transaction:
//! the pool reads it through [`Volumes::meta`] and changes it only through
//! this layer's operations, each inside an atomic step
//! ([`Volumes::atomic`]). Everything here runs under the pool's metadata
//! lock.

use arbor_format::{BlockRef, Guid, Layout, Partial, TreeKind, VolumeKind, VolumeRecord};
use std::collections::{HashMap, HashSet};

use crate::error::{Capability, Conflict, Error, Invalid, Result, Unsupported};
use crate::mapping::{Layers, Mapped, Mapping, MappingMut};
use crate::meta::btree::{Tree, TreeMut};
use crate::meta::{unix_now, CommitJob, Meta, Privilege, VolumeRoots};
use crate::table::VolumeTable;

mod cow;
pub(crate) use cow::{is_loose_home, is_visible, CopyPlan, HomeGrowth};

/// The volume layer over the open transaction (see the module comment).
pub(crate) struct Volumes {
    meta: Meta,
    /// The volume records, names and share times of the open transaction.
    table: VolumeTable,
    /// The volume table's tree, as of the last [`Self::store_table`].
    root: BlockRef,
    /// Its layout: [`TreeKind::VolumeTable`] (version 3, identities), or
    /// [`TreeKind::Volumes`] in a pool not yet upgraded (or upgraded by a
    /// call a power cut interrupted: [`Self::convert_table`] finishes it).
    kind: TreeKind,
    next_id: u64,
    /// The open transaction of the last management change that is durable
    /// only at the next commit and in no log record (a deferred snapshot
    /// or clone): while it is newer than the durable commit, snapshots are
    /// not logged (`Pool::log_snapshots`), since a replay onto that commit
    /// would not find the state they were taken in. 0: none since open.
    unlogged_change_txn: u64,
    /// Per volume, chunks it mapped new (allocated in that transaction)
    /// after a share of its tree in the same open transaction (a deferred
    /// or logged snapshot): exclusive to it from then on, though their
    /// extents' generation equals the share's transaction
    /// (`try_in_place`). Emptied for a volume at each share of its tree;
    /// an entry goes when an in-place write moves its extent's generation
    /// past the share. Memory only, and conservative: a lost entry costs
    /// one redirect, and a stale one (a step that failed after it, a chunk
    /// freed since) is never asked about a chunk the volume did not map
    /// new itself, since nothing else gives it a chunk without a share.
    fresh_after_share: HashMap<u64, HashSet<u64>>,
}

/// A fresh random identity (never all zeros, which means none): for a
/// snapshot made here, or received from a stream that carries none (an
/// `rbd diff`).
pub fn new_guid() -> Guid {
    loop {
        let guid: Guid = rand::random();
        if guid != [0; 16] {
            return guid;
        }
    }
}

/// What an atomic write does to one chunk, decided in its planning step
/// (see `Pool::apply` in `pool/write.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ChunkPlan {
    /// The chunk is mapped and referenced by this volume alone, in the open
    /// transaction and in every state a power cut can recover to: overwrite
    /// it once every redirected chunk of the write is mapped.
    InPlace(u64),
    /// Write a complete new chunk (`new`, already allocated), then map it.
    /// `old` is what the chunk mapped when planning, whose data fills the
    /// parts of the chunk a partial write does not cover.
    Redirect { old: Option<Mapped>, new: u64 },
    /// Write the new chunk of `to` (already allocated: `to.phys`), then map
    /// the partial extent `to` (FORMAT.md §6.3), which reads the blocks of
    /// its mask from the new chunk and the others from what `old`, the
    /// chunk's mapping when planning, read them from. The new chunk holds
    /// the write's blocks and `keep`: blocks of its mask whose old contents
    /// it must hold, read from `old` (those the write does not cover
    /// whole): the layers folded into it, and blocks the write touches only
    /// in part.
    Partial { old: Mapped, to: Mapped, keep: u32 },
    /// The chunk is a partial extent whose chunk this volume alone
    /// references (as for [`ChunkPlan::InPlace`]), and the write covers
    /// only blocks outside its mask, whole: write them into `pchunk` (no
    /// reader sees them yet), then map the partial with `add` in its mask
    /// (a chunk mapped whole once the mask is full).
    Extend {
        pchunk: u64,
        partial: Partial,
        add: u32,
    },
    /// Nothing to write: a chunk a discard zeroes only where mapped, and it
    /// is not.
    Skip,
}

/// One chunk a write plans: the chunk number, and whether it is only
/// written where mapped (the partial ends of a discard).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ChunkWanted {
    pub chunk: u64,
    pub only_if_mapped: bool,
    /// The 4 KiB blocks of the chunk the write touches, if the pool may
    /// hold partial extents and the write does not cover the whole chunk.
    pub blocks: Option<Blocks>,
}

/// The blocks of one chunk that a write touches (bit `i`: block `i`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Blocks {
    pub touched: u32,
    /// Every touched block is covered whole.
    pub whole: bool,
}

/// A volume's tree kept as it was by [`Volumes::hold_tree`].
pub(crate) struct HeldTree {
    id: u64,
    root: BlockRef,
    mapped_chunks: u64,
}

/// Where a write ends, checked against the volume's size when the write is
/// planned and when it is mapped, under the metadata lock: a write in
/// flight when a shrink sets the size can no longer land past the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WriteEnd {
    /// The byte offset the write ends at.
    pub end: u64,
    /// May go past the size up to the end of the last chunk (only to zero
    /// that tail before a grow makes it part of the volume).
    pub past_end: bool,
}

/// The answer of [`Volumes::try_in_place`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum InPlaceCheck {
    /// Overwrite this physical chunk.
    Yes(u64),
    /// See [`ChunkPlan::Extend`].
    Extend {
        pchunk: u64,
        partial: Partial,
        add: u32,
    },
    /// Not in place; `mapped` is what the chunk maps to now, if anything.
    No { mapped: Option<Mapped> },
}

impl Volumes {
    /// The volume layer of `meta`'s last commit: its volume records are
    /// read from the table's tree.
    pub fn resume(meta: Meta) -> Result<Self> {
        let roots = VolumeRoots::of(meta.last_record());
        let kind = table_kind(&meta, roots.root)?;
        let mut records = Vec::new();
        Tree::new(&meta, kind, roots.root).for_each(0, u64::MAX, &mut |id, value| {
            let rec = decode_record(kind, value)
                .map_err(|e| Error::corrupt(format!("volume record {id}"), e))?;
            records.push((id, rec));
            Ok(true)
        })?;
        Ok(Self {
            meta,
            table: VolumeTable::load(records)?,
            root: roots.root,
            kind,
            next_id: roots.next_id,
            unlogged_change_txn: 0,
            fresh_after_share: HashMap::new(),
        })
    }

    /// Whether the volume table has the version 3 layout (identities,
    /// receives).
    pub fn has_identities(&self) -> bool {
        self.kind == TreeKind::VolumeTable
    }

    /// Rewrites a version 1 volume table as a version 3 one, giving every
    /// volume and snapshot an identity (run in a step, in a version 3 pool:
    /// a failure leaves the old table). Returns false when there was
    /// nothing to do.
    pub fn convert_table(&mut self) -> Result<bool> {
        if self.kind == TreeKind::VolumeTable {
            return Ok(false);
        }
        if !self.meta.geo().version().has_identities() {
            return Err(Error::inconsistent(
                "a version 3 volume table in a pool of an older version",
            ));
        }
        let ids: Vec<u64> = self.table.iter().map(|(id, _)| id).collect();
        for &id in &ids {
            let mut tree = TreeMut::new(&mut self.meta, self.kind, self.root);
            tree.remove(id)?;
            self.root = tree.root();
            self.table.update(id, |rec| rec.guid = new_guid())?;
        }
        if !self.root.is_none() {
            return Err(Error::inconsistent(
                "the old volume table holds records the open table does not",
            ));
        }
        // Every record is dirty now (its identity changed): all go into
        // the new tree.
        self.kind = TreeKind::VolumeTable;
        self.store_table()?;
        Ok(true)
    }

    /// The volume table of the open transaction.
    pub fn table(&self) -> &VolumeTable {
        &self.table
    }

    /// The id the next volume will get.
    pub fn next_volume_id(&self) -> u64 {
        self.next_id
    }

    /// What the next commit record says of this layer.
    pub fn roots(&self) -> VolumeRoots {
        VolumeRoots {
            root: self.root,
            next_id: self.next_id,
        }
    }

    /// Whether anything changed since the last commit.
    pub fn has_changes(&self) -> bool {
        self.meta.has_txn_changes() || self.table.has_changes()
    }

    /// Whether the open state is exactly the last durable commit: no commit
    /// in flight and nothing changed since.
    pub fn matches_durable(&self) -> bool {
        !self.meta.commit_in_flight() && !self.has_changes()
    }

    /// The transaction, to read (lookups, statistics, a check's capture).
    pub fn meta(&self) -> &Meta {
        &self.meta
    }

    /// Takes idle regions out of the in-place intent set (`crate::intents`);
    /// only with no in-place write in flight.
    pub fn evict_intents(&mut self, idle: std::time::Duration) -> Result<usize> {
        crate::intents::evict(&mut self.meta, idle)
    }

    /// Adds the regions writes found missing to the in-place intent set
    /// (run as a step of its own: `crate::intents`).
    pub fn add_wanted_intents(&mut self) -> Result<bool> {
        crate::intents::add_wanted(&mut self.meta)
    }

    /// Whether data chunks `pchunks` (of a copy-on-write volume's home in
    /// the pool) may be overwritten in place now as far as the crash rule
    /// goes (`crate::intents::ready_for`); the regions of those that may
    /// not are wanted in the set ([`Self::add_wanted_intents`]).
    pub fn ready_in_place(&mut self, pchunks: std::ops::Range<u64>) -> Result<bool> {
        let mut ready = true;
        for pchunk in pchunks {
            ready &= crate::intents::ready_for(&mut self.meta, pchunk)?;
        }
        Ok(ready)
    }

    /// Whether writes found regions missing from the in-place intent set.
    pub fn wants_intents(&self) -> bool {
        !self.meta.intents_wanted.is_empty()
    }

    /// The transaction a write must see durable to overwrite in place what
    /// its plan redirected for the crash rule (`crate::intents::take_await`).
    pub fn take_intents_await(&mut self) -> Option<u64> {
        crate::intents::take_await(&mut self.meta)
    }

    /// Clears the sums of the chunks the open transaction freed.
    pub fn forget_freed_sums(&mut self) -> Result<()> {
        if self.meta.geo().version().has_data_checksums() {
            crate::sums::forget_freed(&mut self.meta)?;
        }
        Ok(())
    }

    /// Takes region `region` out of the in-place intent set.
    pub fn remove_intent(&mut self, region: u64) -> Result<()> {
        crate::intents::remove(&mut self.meta, region)
    }

    /// Adds `regions` to the in-place intent set (those an open found in
    /// the intent log: `crate::intents`).
    pub fn add_intents(&mut self, regions: &[u64]) -> Result<()> {
        crate::intents::add(&mut self.meta, regions)
    }

    /// Regions made durable by intent log records up to block `next` of
    /// the log area (`crate::intents::LogState::note`).
    pub fn note_intent_log(&mut self, regions: &[u64], next: u64) {
        self.meta.intent_log.note(regions, next)
    }

    /// Notes a management change of the open transaction that no log
    /// record describes (see `unlogged_change_txn`).
    pub fn note_unlogged_change(&mut self) {
        self.unlogged_change_txn = self.meta.txn();
    }

    /// Whether a management change since commit `durable` is in no log
    /// record.
    pub fn unlogged_change_since(&self, durable: u64) -> bool {
        self.unlogged_change_txn > durable
    }

    /// Takes again, onto the commit the pool opened at, a snapshot that a
    /// snapshot record of the intent log lists (FORMAT.md §6.4.2), with
    /// its logged id, identity, creation time and name. An error if the
    /// record does not apply to this commit: its source is not a writable
    /// redirect-on-write volume named as the snapshot's volume part, its
    /// name is taken, or its id is below the next volume id.
    pub fn replay_snapshot(&mut self, s: &arbor_format::LoggedSnapshot) -> Result<()> {
        let apply = |m: &mut Self| -> Result<()> {
            let (volume, _) = crate::names::split_snapshot_name(&s.name)?;
            let source = m.writable_volume(s.source)?;
            if source.name != volume {
                return Err(Error::inconsistent(format!(
                    "its source, volume {}, is named {}",
                    s.source, source.name
                )));
            }
            if matches!(source.layout, arbor_format::DataLayout::Cow(_)) {
                return Err(Error::inconsistent("its source is a copy-on-write volume"));
            }
            m.ensure_name_free(&s.name)?;
            if s.id < m.next_id {
                return Err(Error::inconsistent(format!(
                    "its id {} is below the next volume id {}",
                    s.id, m.next_id
                )));
            }
            m.next_id = s.id;
            let id = m.share_volume(s.source, s.name.clone(), VolumeKind::Snapshot)?;
            if id != s.id {
                return Err(Error::inconsistent(format!("it was given id {id}")));
            }
            m.update_volume(id, |rec| {
                rec.guid = s.guid;
                rec.created_unix_secs = s.created_unix_secs;
            })
        };
        apply(self).map_err(|e| {
            Error::inconsistent(format!(
                "the intent log's snapshot record of {} (id {}) does not apply to the commit the pool opens at: {e}",
                s.name, s.id
            ))
        })
    }

    /// Records data checksums of chunks written (`crate::sums`).
    pub fn record_sums(&mut self, sums: &[crate::sums::BlockSums]) -> Result<()> {
        crate::sums::record(&mut self.meta, sums)
    }

    /// Runs `f` as one atomic step of the open transaction (see
    /// [`Meta::begin_step`]): if it fails, the volume layer and everything
    /// below are exactly as before the call.
    pub fn atomic<T>(
        &mut self,
        privilege: Privilege,
        f: impl FnOnce(&mut Self) -> Result<T>,
    ) -> Result<T> {
        let step = self.meta.begin_step(privilege);
        let (table, root, kind, next_id) =
            (self.table.savepoint(), self.root, self.kind, self.next_id);
        let result = f(self);
        let result = self.meta.end_step(step, result);
        match result {
            Ok(_) => self.table.release(table),
            Err(_) => {
                self.table.rollback(table);
                self.root = root;
                self.kind = kind;
                self.next_id = next_id;
            }
        }
        result
    }

    /// Writes the changed volume records into the volume table's tree (run
    /// inside a step: a failure gives the table its changes back).
    pub fn store_table(&mut self) -> Result<()> {
        let (removed, dirty) = self.table.take_changes();
        for &id in &removed {
            let mut tree = TreeMut::new(&mut self.meta, self.kind, self.root);
            tree.remove(id)?;
            self.root = tree.root();
        }
        for (id, rec) in dirty {
            let mut value = [0u8; VolumeRecord::ENCODED_LEN];
            let value = match self.kind {
                TreeKind::VolumeTable => {
                    rec.encode(&mut value);
                    &value[..]
                }
                _ => {
                    rec.encode_v1(&mut value);
                    &value[..VolumeRecord::ENCODED_LEN_V1]
                }
            };
            let mut tree = TreeMut::new(&mut self.meta, self.kind, self.root);
            tree.insert(id, value)?;
            self.root = tree.root();
        }
        Ok(())
    }

    /// Phase A of a commit: stores the volume records the writes changed
    /// (management operations store theirs in their own step:
    /// `Pool::manage`), with the reserve, then freezes the transaction
    /// ([`Meta::begin_commit`]).
    pub fn begin_commit(&mut self) -> Result<CommitJob> {
        self.atomic(Privilege::Reserve, Self::store_table)?;
        let roots = self.roots();
        self.meta.begin_commit(roots)
    }

    /// Commits in one go (phases A, B and C), for a caller that has the
    /// pool to itself (creation). On error the pool must not be used.
    pub fn commit(&mut self) -> Result<()> {
        let job = self.begin_commit()?;
        job.write(self.meta.store(), None)?;
        self.finish_commit(job);
        Ok(())
    }

    /// Phase C of a commit ([`Meta::finish_commit`]).
    pub fn finish_commit(&mut self, job: CommitJob) {
        self.meta.finish_commit(job)
    }

    /// Takes on a grown region ([`Meta::grow`]).
    pub fn grow(&mut self, layout: Layout) -> Result<()> {
        self.meta.grow(layout)
    }

    /// See [`Meta::pin_committed_meta`].
    pub fn pin_committed_meta(&mut self) {
        self.meta.pin_committed_meta()
    }

    pub fn unpin_committed_meta(&mut self) {
        self.meta.unpin_committed_meta()
    }

    /// Ends a [`Self::hold_tree`] whatever [`Self::release_tree`] did.
    pub fn unhold_tree(&mut self) {
        self.meta.unhold_queue_entry()
    }

    #[cfg(test)]
    pub fn set_meta_reserve(&mut self, blocks: u64) {
        self.meta.set_meta_reserve(blocks)
    }

    pub fn volume(&self, id: u64) -> Result<&VolumeRecord> {
        self.table
            .get(id)
            .ok_or_else(|| Error::not_found(format!("volume id {id}")))
    }

    /// The id of the volume or snapshot named `name` (receives in progress,
    /// holds and properties are not found by name: see
    /// [`Self::receiving_id`]).
    pub fn volume_id(&self, name: &str) -> Result<u64> {
        self.table
            .id_of(name)
            .filter(|&id| self.table.get(id).is_some_and(cow::is_visible))
            .ok_or_else(|| Error::not_found(name.to_owned()))
    }

    /// The receive in progress into volume `volume`, if any.
    pub fn receiving_id(&self, volume: &str) -> Option<u64> {
        self.table.id_of(&receiving_name(volume)).filter(|&id| {
            self.table
                .get(id)
                .is_some_and(|r| r.kind == VolumeKind::Receiving)
        })
    }

    /// The volume or snapshot whose identity is `guid`.
    pub fn guid_id(&self, guid: &Guid) -> Option<u64> {
        if *guid == [0; 16] {
            return None;
        }
        self.table
            .iter()
            .find(|(_, r)| cow::is_visible(r) && r.guid == *guid)
            .map(|(id, _)| id)
    }

    /// Adds the hidden volume a receive into `volume` is applied to: empty
    /// (a full stream) or sharing the base snapshot's tree (an incremental
    /// one). Its size is the base's; the caller resizes it.
    pub fn add_receiving(
        &mut self,
        volume: &str,
        base: Option<u64>,
        size: u64,
        state: arbor_format::ReceiveState,
    ) -> Result<u64> {
        if !self.has_identities() {
            return Err(Unsupported::Format(Capability::Receive).into());
        }
        if let Some(base) = base {
            let rec = self.volume(base)?;
            if rec.backing.is_some() || rec.layout != arbor_format::DataLayout::Row {
                return Err(Unsupported::IncrementalOntoCow(rec.name.clone()).into());
            }
        }
        let name = receiving_name(volume);
        self.ensure_name_free(&name)?;
        let id = match base {
            Some(base) => self.share_volume(base, name, VolumeKind::Receiving)?,
            None => self.add_volume(name, VolumeKind::Receiving, size, BlockRef::NONE, 0, 0),
        };
        self.update_volume(id, |rec| {
            rec.guid = [0; 16];
            rec.receive = state;
        })?;
        Ok(id)
    }

    /// The tags holding snapshot `id`, sorted.
    pub fn holds(&self, id: u64) -> Vec<String> {
        let prefix = hold_prefix(id);
        let mut tags: Vec<String> = self
            .table
            .iter()
            .filter(|(_, r)| r.kind == VolumeKind::Hold && r.parent == id)
            .filter_map(|(_, r)| r.name.strip_prefix(&prefix).map(str::to_owned))
            .collect();
        tags.sort();
        tags
    }

    /// Holds snapshot `id` with `tag` (a name-like word). Returns false if
    /// it already held it.
    pub fn add_hold(&mut self, id: u64, tag: &str) -> Result<bool> {
        let rec = self.visible_volume(id)?;
        if rec.kind != VolumeKind::Snapshot {
            return Err(Invalid::HoldOfVolume(rec.name.clone()).into());
        }
        if !self.has_identities() {
            return Err(Unsupported::Format(Capability::Holds).into());
        }
        let name = format!("{}{tag}", hold_prefix(id));
        if self.table.id_of(&name).is_some() {
            return Ok(false);
        }
        let hold = self.add_volume(name, VolumeKind::Hold, 0, BlockRef::NONE, id, 0);
        self.update_volume(hold, |r| r.guid = [0; 16])?;
        Ok(true)
    }

    /// Releases hold `tag` on snapshot `id`. Returns false if there was none.
    pub fn release_hold(&mut self, id: u64, tag: &str) -> Result<bool> {
        match self.table.id_of(&format!("{}{tag}", hold_prefix(id))) {
            Some(hold) => self.table.remove(hold).map(|_| true),
            None => Ok(false),
        }
    }

    /// The properties of `owner` (0: the pool's own) as (key, record id),
    /// sorted by key; staged values (`…%new`, see `Pool::set_property`)
    /// are not listed.
    pub fn properties(&self, owner: u64) -> Vec<(String, u64)> {
        let prefix = property_prefix(owner);
        let mut props: Vec<(String, u64)> = self
            .table
            .iter()
            .filter(|(_, r)| r.kind == VolumeKind::Property && r.parent == owner)
            .filter_map(|(id, r)| {
                let key = r.name.strip_prefix(&prefix)?;
                (!key.contains('%')).then(|| (key.to_owned(), id))
            })
            .collect();
        props.sort();
        props
    }

    /// The record holding property `key` of `owner` (`staged`: the value
    /// being written, not yet in place).
    pub fn property_id(&self, owner: u64, key: &str, staged: bool) -> Option<u64> {
        let name = property_name(owner, key, staged);
        self.table.id_of(&name).filter(|&id| {
            self.table
                .get(id)
                .is_some_and(|r| r.kind == VolumeKind::Property)
        })
    }

    /// Adds the empty record a value of property `key` of `owner` is
    /// written to (`size` bytes, a multiple of 512), named as staged; any
    /// earlier staged record of that key (a set cut short) goes first.
    pub fn add_staged_property(&mut self, owner: u64, key: &str, size: u64) -> Result<u64> {
        if owner != 0 {
            self.visible_volume(owner)?;
        }
        if let Some(old) = self.property_id(owner, key, true) {
            self.delete_volume(old)?;
        }
        let name = property_name(owner, key, true);
        let id = self.add_volume(name, VolumeKind::Property, size, BlockRef::NONE, owner, 0);
        self.update_volume(id, |r| r.guid = [0; 16])?;
        Ok(id)
    }

    /// Puts staged property record `staged` in place of the value of `key`
    /// (whose old record goes to reclaim), in the step's commit.
    pub fn install_property(&mut self, owner: u64, key: &str, staged: u64) -> Result<()> {
        if self.property_id(owner, key, true) != Some(staged) {
            return Err(Conflict::PropertySetAgain(key.to_owned()).into());
        }
        if let Some(old) = self.property_id(owner, key, false) {
            self.delete_volume(old)?;
        }
        self.table.rename(staged, property_name(owner, key, false))
    }

    /// Deletes volume or snapshot `id`. A held snapshot is refused unless
    /// `force`, which releases its holds too.
    pub fn delete_checked(&mut self, id: u64, force: bool) -> Result<()> {
        if let arbor_format::DataLayout::Cow(_) = self.volume(id)?.layout {
            self.check_no_readers(id)?;
        }
        let holds = self.holds(id);
        if !holds.is_empty() {
            if !force {
                return Err(Conflict::Held {
                    name: self.volume(id)?.name.clone(),
                    holds,
                }
                .into());
            }
            for tag in holds {
                self.release_hold(id, &tag)?;
            }
        }
        // Its properties go with it, staged ones too.
        let owned: Vec<u64> = self
            .table
            .iter()
            .filter(|(_, r)| r.kind == VolumeKind::Property && r.parent == id)
            .map(|(prop, _)| prop)
            .collect();
        for prop in owned {
            self.delete_volume(prop)?;
        }
        self.delete_volume(id)
    }

    /// Records how far receive `id` has applied its stream.
    pub fn set_received(&mut self, id: u64, offset: u64) -> Result<()> {
        self.update_volume(id, |rec| rec.receive.offset = offset)
    }

    /// Turns the finished receive `id` into its snapshot `snapshot`, with
    /// the stream's identity, of `volume`: an existing volume (an
    /// incremental stream into one of its snapshots) is rolled forward to
    /// it, its old tree going to the reclaim queue; else `volume` is
    /// created (empty from a full stream, a clone of the base). Returns the
    /// snapshot's id.
    pub fn finish_receiving(
        &mut self,
        id: u64,
        volume: &str,
        snapshot: &str,
        created_unix_secs: u64,
    ) -> Result<u64> {
        let rec = self.volume(id)?.clone();
        if rec.kind != VolumeKind::Receiving {
            return Err(Error::inconsistent(
                "finishing a volume that is not receiving",
            ));
        }
        self.ensure_name_free(snapshot)?;
        let target = rec.receive.target;
        let into = self.volume_id(volume).ok();
        if let (Some(vol), true) = (into, rec.receive.base != [0; 16]) {
            // Roll the existing volume forward to the new snapshot.
            self.writable_volume(vol)?;
            let snap = self.share_volume(id, snapshot.to_owned(), VolumeKind::Snapshot)?;
            self.update_volume(snap, |s| {
                s.guid = target;
                s.receive = Default::default();
                s.parent = vol;
                s.created_unix_secs = created_unix_secs;
            })?;
            self.rollback_volume(vol, snap)?;
            self.delete_volume(id)?;
            return Ok(snap);
        }
        // A new volume: empty (a full stream) or a clone of the base.
        self.ensure_name_free(volume)?;
        let origin = self.guid_id(&rec.receive.base).unwrap_or(0);
        self.table.rename(id, volume.to_owned())?;
        self.update_volume(id, |vol| {
            vol.kind = VolumeKind::Volume;
            vol.guid = new_guid(); // receives exist in version 3 tables only
            vol.receive = Default::default();
            vol.parent = origin;
        })?;
        let snap = self.share_volume(id, snapshot.to_owned(), VolumeKind::Snapshot)?;
        self.update_volume(snap, |s| {
            s.guid = target;
            s.created_unix_secs = created_unix_secs;
        })?;
        Ok(snap)
    }

    pub fn writable_volume(&self, id: u64) -> Result<&VolumeRecord> {
        let rec = self.volume(id)?;
        if rec.kind == VolumeKind::Snapshot {
            return Err(Error::read_only(rec.name.clone()));
        }
        Ok(rec)
    }

    /// Volume `id` unless it is a receive in progress (hidden from every
    /// caller but the receive itself) or a hold.
    pub fn visible_volume(&self, id: u64) -> Result<&VolumeRecord> {
        let rec = self.volume(id)?;
        if !cow::is_visible(rec) {
            return Err(Error::not_found(format!("volume id {id}")));
        }
        Ok(rec)
    }

    /// Changes volume `id`'s record (logged, so a failed step undoes it).
    fn update_volume<T>(&mut self, id: u64, f: impl FnOnce(&mut VolumeRecord) -> T) -> Result<T> {
        self.table.update(id, f)
    }

    /// Fails unless volume `id` is writable and a write ending at `end`
    /// fits it.
    pub fn check_write_end(&self, id: u64, end: WriteEnd) -> Result<()> {
        let rec = self.writable_volume(id)?;
        let limit = if end.past_end {
            let cs = self.meta.geo().chunk_size;
            rec.size_bytes.div_ceil(cs) * cs
        } else {
            rec.size_bytes
        };
        if end.end > limit {
            return Err(Invalid::WriteBeyondEnd {
                end: end.end,
                name: rec.name.clone(),
                size: rec.size_bytes,
            }
            .into());
        }
        Ok(())
    }

    pub fn ensure_name_free(&self, name: &str) -> Result<()> {
        if self.table.id_of(name).is_some() {
            return Err(Error::already_exists(name.to_owned()));
        }
        Ok(())
    }

    /// Adds a volume record with a fresh id; `root` must already carry the
    /// reference the new volume owns.
    pub fn add_volume(
        &mut self,
        name: String,
        kind: VolumeKind,
        size: u64,
        root: BlockRef,
        parent: u64,
        mapped: u64,
    ) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        let rec = VolumeRecord {
            root,
            size_bytes: size,
            parent,
            created_txn: self.meta.txn(),
            created_unix_secs: unix_now(),
            mapped_chunks: mapped,
            kind,
            name,
            // A version 1 table stores no identity: the conversion gives
            // every record one.
            guid: if self.has_identities() {
                new_guid()
            } else {
                [0; 16]
            },
            receive: Default::default(),
            layout: Default::default(),
            backing: None,
            key_slot: None,
        };
        self.table.insert(id, rec);
        id
    }

    /// Every key slot a record names (volumes, snapshots, receives).
    pub fn key_slots(&self) -> std::collections::HashSet<u64> {
        self.table.iter().filter_map(|(_, r)| r.key_slot).collect()
    }

    /// Makes volume `id` encrypted with the key in slot `slot` (a volume
    /// just created, in the same step).
    pub fn set_key_slot(&mut self, id: u64, slot: u64) -> Result<()> {
        self.update_volume(id, |rec| rec.key_slot = Some(slot))
    }

    /// Creates `name` sharing the whole tree of `source` (O(1): one reference
    /// on the source's root).
    pub fn share_volume(&mut self, source: u64, name: String, kind: VolumeKind) -> Result<u64> {
        let src = self.volume(source)?.clone();
        if let arbor_format::DataLayout::Cow(_) = src.layout {
            if kind != VolumeKind::Snapshot {
                return Err(Error::inconsistent(
                    "a copy-on-write volume is shared only by its snapshots",
                ));
            }
            return self.snapshot_cow(source, name);
        }
        if !src.root.is_none() {
            self.share_tree(src.root)?;
        }
        let id = self.add_volume(
            name,
            kind,
            src.size_bytes,
            src.root,
            source,
            src.mapped_chunks,
        );
        if src.backing.is_some() || src.key_slot.is_some() {
            // A snapshot or clone reads what its source's key encrypted.
            self.update_volume(id, |rec| {
                rec.backing = src.backing;
                rec.key_slot = src.key_slot;
            })?;
        }
        self.note_shared(source);
        self.note_shared(id);
        Ok(id)
    }

    /// Records that volume `id`'s tree is shared as of this transaction.
    fn note_shared(&mut self, id: u64) {
        let txn = self.meta.txn();
        self.table.set_shared(id, txn);
        self.fresh_after_share.remove(&id);
    }

    /// The last transaction in which volume `id`'s tree was shared (a volume
    /// not shared since the pool opened: no later than the opening commit).
    fn last_shared_txn(&self, id: u64) -> u64 {
        self.table.shared_txn(id).unwrap_or(self.meta.opened_txn())
    }

    /// Adds a reference to a volume's tree (a mapping tree or a snapshot
    /// store): a snapshot, clone or held tree shares it.
    fn share_tree(&mut self, root: BlockRef) -> Result<()> {
        TreeMut::new(&mut self.meta, TreeKind::Mapping, root).share()
    }

    /// Hands a tree to the reclaim queue, which now owns its reference.
    pub fn queue_drop(&mut self, root: BlockRef) -> Result<()> {
        if !root.is_none() {
            self.meta.queue_push(root)?;
        }
        Ok(())
    }

    /// Keeps volume `id`'s tree as it is now whatever later steps and
    /// commits do to the volume, until [`Self::release_tree`]: a reference
    /// to its root goes to the reclaim queue, whose entry reclaim does not
    /// reach while it is held (after a power cut it is reclaimed like any
    /// other). The volume's chunks are shared from now on, so later writes
    /// redirect them and the held tree's data stays as it is.
    pub fn hold_tree(&mut self, id: u64) -> Result<HeldTree> {
        let rec = self.writable_volume(id)?.clone();
        if !rec.root.is_none() {
            self.share_tree(rec.root)?;
            let seq = self.meta.queue_push(rec.root)?;
            self.meta.hold_queue_entry(seq);
        }
        self.note_shared(id);
        Ok(HeldTree {
            id,
            root: rec.root,
            mapped_chunks: rec.mapped_chunks,
        })
    }

    /// Ends [`Self::hold_tree`] (the caller then calls
    /// [`Self::unhold_tree`]). With `restore`, the volume gets the held tree
    /// back, and its tree of now goes to the reclaim queue.
    pub fn release_tree(&mut self, held: &HeldTree, restore: bool) -> Result<()> {
        if !restore {
            return Ok(());
        }
        if !held.root.is_none() {
            self.share_tree(held.root)?;
        }
        let now = self.update_volume(held.id, |vol| {
            vol.mapped_chunks = held.mapped_chunks;
            std::mem::replace(&mut vol.root, held.root)
        })?;
        self.note_shared(held.id);
        self.queue_drop(now)
    }

    pub fn delete_volume(&mut self, id: u64) -> Result<()> {
        let rec = self.table.remove(id)?;
        self.free_home(&rec)?;
        self.queue_drop(rec.root)
    }

    /// Points volume `id` at snapshot `snap`'s tree; the volume's old tree
    /// goes to the reclaim queue. Later snapshots are untouched.
    pub fn rollback_volume(&mut self, id: u64, snap: u64) -> Result<()> {
        let snap_rec = self.volume(snap)?.clone();
        if !snap_rec.root.is_none() {
            self.share_tree(snap_rec.root)?;
        }
        let old_root = self.update_volume(id, |vol| {
            vol.size_bytes = snap_rec.size_bytes;
            vol.mapped_chunks = snap_rec.mapped_chunks;
            std::mem::replace(&mut vol.root, snap_rec.root)
        })?;
        self.note_shared(id);
        self.queue_drop(old_root)
    }

    pub fn rename_volume(&mut self, id: u64, new_name: String) -> Result<()> {
        self.table.rename(id, new_name)
    }

    pub fn set_volume_size(&mut self, id: u64, size: u64) -> Result<()> {
        self.update_volume(id, |vol| vol.size_bytes = size)
    }

    /// Unmaps chunks `[from, to)` of volume `id`, with bounded work whatever
    /// the range (see [`MappingMut::discard`]): subtrees inside the range go to
    /// the reclaim queue, whose background steps drop their data.
    pub fn unmap_chunks(&mut self, id: u64, from: u64, to: u64) -> Result<()> {
        let root = self.volume(id)?.root;
        let mut map = MappingMut::new(&mut self.meta, root);
        let (unmapped, detached) = map.discard(from, to)?;
        let root = map.root();
        for subtree in detached {
            self.queue_drop(subtree)?;
        }
        self.update_volume(id, |vol| {
            vol.root = root;
            vol.mapped_chunks = vol.mapped_chunks.saturating_sub(unmapped);
        })
    }

    /// The planning step of an atomic write to volume `id`: decides what
    /// each chunk of `wanted` does (see [`ChunkPlan`]) and allocates every
    /// new chunk, or fails having changed nothing once the step is undone.
    pub fn plan_chunks(
        &mut self,
        id: u64,
        wanted: &[ChunkWanted],
        end: WriteEnd,
    ) -> Result<Vec<ChunkPlan>> {
        self.check_write_end(id, end)?;
        // Whether the open state was the durable one when the step began:
        // the changes this step makes before a later chunk's check (shadowing
        // this volume's paths, allocating fresh chunks) only add references,
        // so that check may still rely on it (see `try_in_place`).
        let durable_at_start = self.matches_durable();
        let mut plans = Vec::with_capacity(wanted.len());
        for w in wanted {
            let plan = match self.try_in_place(id, w, end, durable_at_start)? {
                InPlaceCheck::Yes(phys) => ChunkPlan::InPlace(phys),
                InPlaceCheck::Extend {
                    pchunk,
                    partial,
                    add,
                } => ChunkPlan::Extend {
                    pchunk,
                    partial,
                    add,
                },
                InPlaceCheck::No { mapped: None } if w.only_if_mapped => ChunkPlan::Skip,
                InPlaceCheck::No { mapped } => {
                    let new = self.meta.alloc_data()?;
                    let partial = mapped.zip(w.blocks).and_then(|(old, b)| {
                        self.partial_plan(old, new, b)
                            .map(|(to, keep)| ChunkPlan::Partial { old, to, keep })
                    });
                    match partial {
                        Some(plan) => plan,
                        None => ChunkPlan::Redirect { old: mapped, new },
                    }
                }
            };
            plans.push(plan);
        }
        Ok(plans)
    }

    /// The partial extent (FORMAT.md §6.3) that a write of `blocks` maps
    /// in a chunk it cannot change in place, which maps `mapped`, with
    /// `new` as its chunk; and the blocks of its mask whose old contents
    /// `new` must hold (see [`ChunkPlan::Partial`]). `None` for a whole new
    /// chunk. The one place that decides a partial write's layers:
    /// * the new chunk gives the blocks the write touches; every older
    ///   layer (the chunk mapped whole, or a partial's chunk, middle layers
    ///   and base) keeps the blocks it gave that the write leaves, and one
    ///   left with none drops from the mapping (nothing is read);
    /// * blocks the write touches in part keep their old contents around
    ///   the write (read);
    /// * while that leaves more middle layers than the pool allows (two
    ///   from version 8, none before), the layer giving the fewest blocks
    ///   (the newest of equals) folds into the new chunk (read);
    /// * if the new chunk then gives every block, the write is a whole new
    ///   chunk.
    fn partial_plan(&self, mapped: Mapped, new: u64, blocks: Blocks) -> Option<(Mapped, u32)> {
        let geo = self.meta.geo();
        let all = crate::mapping::full_mask(geo)?;
        let mut layers = Layers::of(mapped, all);
        let mut mask = blocks.touched;
        let mut keep = if blocks.whole { 0 } else { blocks.touched };
        layers.take(mask);
        while layers.len() > crate::mapping::max_mids(geo) + 1 {
            let (i, _) = layers
                .iter()
                .enumerate()
                .min_by_key(|&(i, (_, m))| (m.count_ones(), i))?;
            let (_, folded) = layers.remove(i);
            mask |= folded;
            keep |= folded;
        }
        if layers.len() == 0 {
            return None;
        }
        layers.push_front((new, mask));
        Some((layers.mapped(), keep))
    }

    /// The mapping step of an atomic write, after the new chunks were
    /// written: maps every redirected chunk of `plans` (planned for
    /// `wanted`) and unmaps the whole chunks `unmap`.
    pub fn map_planned(
        &mut self,
        id: u64,
        wanted: &[ChunkWanted],
        plans: &[ChunkPlan],
        unmap: std::ops::Range<u64>,
        end: WriteEnd,
    ) -> Result<()> {
        debug_assert_eq!(wanted.len(), plans.len());
        self.check_write_end(id, end)?;
        let root = self.volume(id)?.root;
        // The writer holds the stripes of these chunks and the I/O gate, so
        // nothing changed their mappings since the plan: a paired check.
        for (w, plan) in wanted.iter().zip(plans) {
            let old = match *plan {
                ChunkPlan::Redirect { old, .. } => old,
                ChunkPlan::Partial { old, .. } => Some(old),
                ChunkPlan::Extend {
                    pchunk, partial, ..
                } => Some(Mapped {
                    phys: pchunk,
                    partial: Some(partial),
                }),
                ChunkPlan::InPlace(_) | ChunkPlan::Skip => continue,
            };
            {
                let current = Mapping::new(&self.meta, root)
                    .lookup(w.chunk)?
                    .map(|(e, _)| e.at(w.chunk));
                if current != old {
                    return Err(Error::inconsistent(format!(
                        "chunk {} of volume {id} maps to {current:?}, planned against {old:?}",
                        w.chunk
                    )));
                }
            }
        }
        let mut added = 0u64;
        let txn = self.meta.txn();
        let full_mask = crate::mapping::full_mask(self.meta.geo());
        let mut map = MappingMut::new(&mut self.meta, root);
        for (w, plan) in wanted.iter().zip(plans) {
            match *plan {
                ChunkPlan::Redirect { new, .. } => match map.set(w.chunk, new)? {
                    Some(previous) => previous.dec_refs(map.meta_mut())?,
                    None => added += 1,
                },
                // Checked above: the chunk still maps `old`.
                ChunkPlan::Partial { old, to, .. } => {
                    map.remap(w.chunk, old, to, txn)?;
                }
                ChunkPlan::Extend {
                    pchunk,
                    partial,
                    add,
                } => {
                    let old = Mapped {
                        phys: pchunk,
                        partial: Some(partial),
                    };
                    let Some(all) = full_mask else {
                        return Err(Error::inconsistent(format!(
                            "a partial extent in chunk {} of volume {id}, in a pool without them",
                            w.chunk
                        )));
                    };
                    let mut layers = Layers::of(old, all);
                    layers.grow_first(add);
                    // The layers left without blocks (all of them once the
                    // mask is full) drop.
                    map.remap(w.chunk, old, layers.mapped(), txn)?;
                }
                ChunkPlan::InPlace(_) | ChunkPlan::Skip => {}
            }
        }
        let root = map.root();
        if root != self.volume(id)?.root || added > 0 {
            self.update_volume(id, |vol| {
                vol.root = root;
                vol.mapped_chunks += added;
            })?;
        }
        if self.last_shared_txn(id) == txn {
            // Chunks this write allocated, mapped after a share in this
            // same transaction: this volume's alone (`fresh_after_share`).
            let fresh = self.fresh_after_share.entry(id).or_default();
            for plan in plans {
                match *plan {
                    ChunkPlan::Redirect { new, .. } => fresh.insert(new),
                    ChunkPlan::Partial { to, .. } => fresh.insert(to.phys),
                    _ => false,
                };
            }
        }
        if !unmap.is_empty() {
            self.unmap_chunks(id, unmap.start, unmap.end)?;
        }
        Ok(())
    }

    /// Maps chunk `chunk` of volume `id` (mapped whole now) as a partial
    /// extent over what it maps, with a new chunk holding the blocks of
    /// `mask`; returns that chunk. What a sub-chunk write will do, for the
    /// tests of the layers below it (reads, copies, check, reclaim).
    #[cfg(test)]
    pub(crate) fn map_partial(&mut self, id: u64, chunk: u64, mask: u32) -> Result<u64> {
        let root = self.writable_volume(id)?.root;
        let Some((e, _)) = Mapping::new(&self.meta, root).lookup(chunk)? else {
            return Err(Invalid::ChunkNotMapped(chunk).into());
        };
        let base = e.at(chunk);
        if base.partial.is_some() {
            return Err(Invalid::ChunkPartial(chunk).into());
        }
        let pchunk = self.meta.alloc_data()?;
        let partial = Mapped {
            phys: pchunk,
            partial: Some(arbor_format::Partial::over(mask, base.phys)),
        };
        let txn = self.meta.txn();
        let mut map = MappingMut::new(&mut self.meta, root);
        let previous = map.set_as(chunk, partial, txn)?;
        let root = map.root();
        // The base's reference passes from the old mapping to the partial.
        debug_assert_eq!(previous, Some(base));
        self.update_volume(id, |vol| vol.root = root)?;
        Ok(pchunk)
    }

    /// The mapping step of a fill (`pool/fill.rs`): chunk `chunk` of volume
    /// `id`, still the partial `expect` (the caller holds the chunk's
    /// stripe), now maps its chunk whole, which the caller filled with the
    /// blocks of its layers; the partial's references on them drop. The
    /// generation stays: a fill is not a write.
    pub fn fill_partial(&mut self, id: u64, chunk: u64, expect: Mapped) -> Result<()> {
        if expect.partial.is_none() {
            return Err(Error::inconsistent(format!(
                "fill of chunk {chunk} of volume {id}, which is not partial"
            )));
        }
        let root = self.volume(id)?.root;
        let found = Mapping::new(&self.meta, root).lookup(chunk)?;
        let Some((e, _)) = found.filter(|(e, _)| e.at(chunk) == expect) else {
            return Err(Error::inconsistent(format!(
                "chunk {chunk} of volume {id} changed while it was filled"
            )));
        };
        let mut map = MappingMut::new(&mut self.meta, root);
        map.remap(chunk, expect, Mapped::whole(expect.phys), e.gen)?;
        let root = map.root();
        self.update_volume(id, |vol| vol.root = root)
    }

    /// Drops the new chunks of `plans` (a write that did not map them).
    pub fn release_planned(&mut self, plans: &[ChunkPlan]) -> Result<()> {
        for plan in plans {
            match *plan {
                ChunkPlan::Redirect { new, .. } => {
                    self.meta.dec_data(new)?;
                }
                ChunkPlan::Partial { to, .. } => {
                    self.meta.dec_data(to.phys)?;
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Whether `chunk` of volume `id` may be overwritten in place. If it is
    /// mapped, its path is shadowed and its generation refreshed (a write
    /// follows either way). `durable_at_start`: the open state was the
    /// durable one when the step began, and has changed since only by this
    /// step's shadowing and allocations.
    fn try_in_place(
        &mut self,
        id: u64,
        w: &ChunkWanted,
        end: WriteEnd,
        durable_at_start: bool,
    ) -> Result<InPlaceCheck> {
        let chunk = w.chunk;
        self.check_write_end(id, end)?;
        let root = self.writable_volume(id)?.root;
        let Some((extent, _)) = Mapping::new(&self.meta, root).lookup(chunk)? else {
            return Ok(InPlaceCheck::No { mapped: None });
        };
        let mapped = extent.at(chunk);
        // What the write does if the chunk turns out to be this volume's
        // alone. A partial extent's blocks outside its mask read from its
        // base: a write may overwrite its masked blocks in place, or add
        // blocks it covers whole; one that does both, or covers part of an
        // unmasked block, makes a whole new chunk of both.
        let alone = match (mapped.partial, w.blocks) {
            (None, _) => InPlaceCheck::Yes(mapped.phys),
            (Some(p), Some(b)) if b.touched & !p.mask == 0 => InPlaceCheck::Yes(mapped.phys),
            (Some(p), Some(b)) if b.whole && b.touched & p.mask == 0 => InPlaceCheck::Extend {
                pchunk: mapped.phys,
                partial: p,
                add: b.touched,
            },
            (Some(_), _) => {
                return Ok(InPlaceCheck::No {
                    mapped: Some(mapped),
                })
            }
        };
        let phys = mapped.phys;
        let last_shared = self.last_shared_txn(id);
        let written_since_shared = extent.gen > last_shared;
        // An extent written in this transaction sits in a leaf shadowed in this
        // transaction: the path is exclusive, unless the tree was shared
        // since, in this same transaction (a snapshot whose durability is
        // the next commit's: `Pool::snapshot_with`). Otherwise re-map the
        // chunk as it is, generation included, which shadows the path: the
        // count below means something only on an exclusive path. The
        // generation moves only with an in-place write (below): the rule
        // "mapped after the last share" must never be claimed by a chunk a
        // redirect is about to replace, which another writer of the same
        // chunk would then overwrite in place under the copy.
        // A chunk this volume mapped new after that share (below) sits in a
        // leaf that mapping shadowed after it, and only a share, which
        // forgets it, gives the leaf another reference.
        let fresh_after_share = !written_since_shared
            && self
                .fresh_after_share
                .get(&id)
                .is_some_and(|fresh| fresh.contains(&phys));
        let shared_since = last_shared == self.meta.txn() && !fresh_after_share;
        if extent.gen != self.meta.txn() || shared_since {
            let mut map = MappingMut::new(&mut self.meta, root);
            let previous = map.set_as(chunk, mapped, extent.gen)?;
            debug_assert_eq!(previous, Some(mapped));
            let shadowed = map.root();
            self.update_volume(id, |vol| vol.root = shadowed)?;
        }
        // In place only if this volume alone references the chunk now AND no
        // state a power cut can recover to has another tree referencing it:
        // a count of 1 now says nothing of the last commit, where another
        // volume may still map the chunk (e.g. a clone whose shared leaf
        // this transaction unshared). Any of three facts rules that out:
        // * the chunk was allocated since the last durable commit, so no
        //   durable state references it, and the commit in flight, if it
        //   was allocated in that one's transaction, maps it in no other
        //   tree that anything reads: the count would show a share made in
        //   that transaction, and only a delete (which waits for the commit
        //   lock) drops one (its queued tree is only ever reclaimed). Its
        //   sums are another matter: `crate::intents::ready_for`;
        // * this volume mapped it after its tree was last shared (the
        //   dm-thin rule: a mapping newer than the last snapshot is
        //   exclusive). Only a share can give another tree this chunk, and
        //   when it was mapped here the count was 1 with the path shadowed,
        //   so no tree held it then, by this same rule at that time;
        // * the open state was the durable one when the step began: then a
        //   count of 1 after shadowing this volume's path (shadowing a shared
        //   node adds a count to each child) means the path and the chunk
        //   were this volume's alone in the durable state too. This is what
        //   frees a volume whose snapshots are gone: a full pool commits
        //   and retries a write that found no space (`Pool::write`).
        // * or, the share being in a transaction of its own no longer,
        //   this volume mapped the chunk new after that share, in the
        //   share's transaction (`fresh_after_share`): the second rule at
        //   the grain of a write, where generations cannot tell a write
        //   after a deferred or logged snapshot from one before it.
        let exclusive_since_durable = self.meta.data_allocated_since_durable(phys)
            || written_since_shared
            || durable_at_start
            || fresh_after_share;
        if self.meta.data_count(phys)? == 1 && exclusive_since_durable {
            // The crash rule of data checksums: in place only where the
            // last durable commit allows it (`crate::intents`); else this
            // write redirects, and the region joins the set.
            if matches!(alone, InPlaceCheck::Yes(_))
                && !crate::intents::ready_for(&mut self.meta, phys)?
            {
                return Ok(InPlaceCheck::No {
                    mapped: Some(mapped),
                });
            }
            if fresh_after_share && last_shared < self.meta.txn() {
                // Its generation moves past the share just below.
                if let Some(fresh) = self.fresh_after_share.get_mut(&id) {
                    fresh.remove(&phys);
                }
            }
            if extent.gen != self.meta.txn() {
                // The path is this transaction's now, so this is cheap.
                let root = self.volume(id)?.root;
                let txn = self.meta.txn();
                let mut map = MappingMut::new(&mut self.meta, root);
                map.set_as(chunk, mapped, txn)?;
                let root = map.root();
                self.update_volume(id, |vol| vol.root = root)?;
            }
            return Ok(alone);
        }
        Ok(InPlaceCheck::No {
            mapped: Some(mapped),
        })
    }

    /// Processes up to `max_items` reclaim-queue entries; returns how many.
    pub fn reclaim_step(&mut self, max_items: usize) -> Result<usize> {
        let mut done = 0;
        while done < max_items && !self.meta.needs_commit() {
            let Some(root) = self.meta.queue_pop()? else {
                break;
            };
            self.drop_tree_ref(root)?;
            done += 1;
        }
        Ok(done)
    }

    /// Drops one reference to a mapping-tree node. A node nobody else
    /// references is freed: its children's references go to the queue, its
    /// extents' data references are dropped.
    fn drop_tree_ref(&mut self, r: BlockRef) -> Result<()> {
        let Some(node) = TreeMut::new(&mut self.meta, TreeKind::Mapping, r).release()? else {
            return Ok(());
        };
        // A failed step is undone whole, so checking after the release is
        // as good as before it, and a shared node is not read at all.
        if node.tree != TreeKind::Mapping {
            return Err(Error::inconsistent(format!(
                "reclaim queue names a {:?} node",
                node.tree
            )));
        }
        match &node.body {
            arbor_format::NodeBody::Internal(children) => {
                for child in children {
                    self.queue_drop(*child)?;
                }
            }
            arbor_format::NodeBody::Leaf(_) => {
                for i in 0..node.len() {
                    let v = crate::meta::decode_map_value(&node, i)?;
                    for (start, len) in v.chunk_runs() {
                        self.meta.dec_data_range(start, len)?;
                    }
                }
            }
        }
        Ok(())
    }

    pub fn reclaim_pending(&self) -> bool {
        !self.meta.queue_root().is_none() || self.any_loose_home().is_some()
    }
}

/// The start of the names of the hold records of snapshot `id` (`%` is
/// never part of a volume name, and the id, never reused, survives renames).
fn property_prefix(owner: u64) -> String {
    format!("{owner}%prop%")
}

/// The hidden record name of property `key` of `owner`: `%` is never part
/// of a volume name or a key, so no user name can collide with it.
fn property_name(owner: u64, key: &str, staged: bool) -> String {
    let staged = if staged { "%new" } else { "" };
    format!("{}{key}{staged}", property_prefix(owner))
}

fn hold_prefix(id: u64) -> String {
    format!("{id}%hold%")
}

/// The name of the hidden record of a receive into `volume`: `%` is never
/// part of a volume name, so no user name can collide with it.
pub(crate) fn receiving_name(volume: &str) -> String {
    format!("{volume}%recv")
}

/// The layout of the volume table rooted at `root`: what its root node says
/// (either layout may be found in a version 3 pool, see
/// [`Volumes::convert_table`]); an empty table has its pool's layout.
fn table_kind(meta: &Meta, root: BlockRef) -> Result<TreeKind> {
    let kind = if root.is_none() {
        if meta.geo().version().has_identities() {
            TreeKind::VolumeTable
        } else {
            TreeKind::Volumes
        }
    } else {
        meta.node(root)?.tree
    };
    match kind {
        TreeKind::Volumes => Ok(kind),
        TreeKind::VolumeTable if meta.geo().version().has_identities() => Ok(kind),
        other => Err(Error::inconsistent(format!(
            "the volume table's root is a {other:?} node"
        ))),
    }
}

/// Decodes a volume record stored in a table of layout `kind`.
pub(crate) fn decode_record(
    kind: TreeKind,
    value: &[u8],
) -> std::result::Result<VolumeRecord, arbor_format::FormatError> {
    match kind {
        TreeKind::VolumeTable => VolumeRecord::decode(value),
        _ => VolumeRecord::decode_v1(value),
    }
}
