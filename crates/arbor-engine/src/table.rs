//! The in-memory volume table of the open transaction: every volume record
//! by id, the name index, which records the next commit must store or
//! remove, and when each volume's tree was last shared.
//!
//! Its state is private: every change goes through a method that logs how
//! to undo it while a savepoint is open, so an operation that fails part
//! way leaves the table exactly as it found it (see `volumes::Volumes::atomic`).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use arbor_format::VolumeRecord;

use crate::error::{Error, Result};
use crate::undo::{Mark, UndoLog};

enum Undo {
    /// Record `id` was this before (None: absent).
    Record(u64, Option<VolumeRecord>),
    Name(String, Option<u64>),
    Dirty(u64, bool),
    Removed(u64, bool),
    Shared(u64, Option<u64>),
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct TableSavepoint(Mark);

#[derive(Default)]
pub(crate) struct VolumeTable {
    vols: BTreeMap<u64, VolumeRecord>,
    names: HashMap<String, u64>,
    /// Records changed since the last commit (stored by the next one).
    dirty: BTreeSet<u64>,
    /// Records deleted since the last commit (removed by the next one).
    removed: BTreeSet<u64>,
    /// Per volume, the last transaction in which its tree was shared (see
    /// `Meta::try_in_place`). In memory only.
    shared_txn: HashMap<u64, u64>,
    /// Live epochs: how many records read through each (copy-on-write
    /// volume, epoch) (`VolumeRecord::backing`). Derived from `vols`, kept
    /// with every change to it.
    epochs: BTreeMap<(u64, u64), u32>,
    /// Per copy-on-write volume, a value that changes whenever its record
    /// or the set of records reading through it changes (so whenever its
    /// store or its live epochs do): what is derived from them can be kept
    /// until it changes. In memory only; other records have none (a write
    /// to an ordinary volume updates its record and pays nothing here).
    versions: HashMap<u64, u64>,
    log: UndoLog<Undo>,
}

/// Source of [`VolumeTable::store_version`] values, unique in the process.
static VERSIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl VolumeTable {
    /// The table as loaded from a commit: nothing dirty.
    pub fn load(records: Vec<(u64, VolumeRecord)>) -> Result<Self> {
        let mut table = Self::default();
        for (id, rec) in records {
            if table.names.insert(rec.name.clone(), id).is_some() {
                return Err(Error::inconsistent(format!(
                    "two volumes are named {:?}",
                    rec.name
                )));
            }
            table.put(id, rec);
        }
        Ok(table)
    }

    /// Sets record `id` (the one place `vols` gains a record: the epoch
    /// index follows).
    fn put(&mut self, id: u64, rec: VolumeRecord) {
        if matches!(rec.layout, arbor_format::DataLayout::Cow(_)) {
            self.touch(id);
        }
        if let Some(b) = rec.backing {
            self.touch(b.origin);
            *self.epochs.entry((b.origin, b.epoch)).or_default() += 1;
        }
        if let Some(old) = self.vols.insert(id, rec) {
            self.unindex(&old);
        }
    }

    /// Removes record `id` (the one place `vols` loses one).
    fn take(&mut self, id: u64) -> Option<VolumeRecord> {
        let rec = self.vols.remove(&id)?;
        self.unindex(&rec);
        self.versions.remove(&id);
        Some(rec)
    }

    /// Gives record `id` a new [`Self::store_version`].
    fn touch(&mut self, id: u64) {
        let version = VERSIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.versions.insert(id, version);
    }

    fn unindex(&mut self, rec: &VolumeRecord) {
        if let Some(b) = rec.backing {
            self.touch(b.origin);
            if let std::collections::btree_map::Entry::Occupied(mut e) =
                self.epochs.entry((b.origin, b.epoch))
            {
                *e.get_mut() -= 1;
                if *e.get() == 0 {
                    e.remove();
                }
            }
        }
    }

    // ---- reading ---------------------------------------------------------------

    pub fn get(&self, id: u64) -> Option<&VolumeRecord> {
        self.vols.get(&id)
    }

    pub fn id_of(&self, name: &str) -> Option<u64> {
        self.names.get(name).copied()
    }

    pub fn iter(&self) -> impl Iterator<Item = (u64, &VolumeRecord)> {
        self.vols.iter().map(|(&id, rec)| (id, rec))
    }

    pub fn shared_txn(&self, id: u64) -> Option<u64> {
        self.shared_txn.get(&id).copied()
    }

    pub fn has_changes(&self) -> bool {
        !self.dirty.is_empty() || !self.removed.is_empty()
    }

    /// The newest epoch of copy-on-write volume `origin` that some record
    /// still reads through.
    pub fn newest_live_epoch(&self, origin: u64) -> Option<u64> {
        self.epochs
            .range((origin, 0)..=(origin, u64::MAX))
            .next_back()
            .map(|(&(_, epoch), _)| epoch)
    }

    /// Whether any record reads through an epoch in `first ..= last` of
    /// copy-on-write volume `origin`.
    pub fn live_between(&self, origin: u64, first: u64, last: u64) -> bool {
        first <= last
            && self
                .epochs
                .range((origin, first)..=(origin, last))
                .next()
                .is_some()
    }

    /// A value that changes whenever record `origin`, or the set of records
    /// reading through its epochs, changes; so it names one state of a
    /// copy-on-write volume's store and live epochs. Unique in the process:
    /// a value once seen never stands for another state. None: no such
    /// copy-on-write volume.
    pub fn store_version(&self, origin: u64) -> Option<u64> {
        self.versions.get(&origin).copied()
    }

    /// The one epoch in `first ..= last` of copy-on-write volume `origin`
    /// that records read through, if exactly one is.
    pub fn sole_live_epoch(&self, origin: u64, first: u64, last: u64) -> Option<u64> {
        if first > last {
            return None;
        }
        let mut live = self.epochs.range((origin, first)..=(origin, last));
        match (live.next(), live.next()) {
            (Some((&(_, epoch), _)), None) => Some(epoch),
            _ => None,
        }
    }

    /// How many records read through epoch `epoch` of copy-on-write volume
    /// `origin`.
    pub fn readers_of_epoch(&self, origin: u64, epoch: u64) -> u32 {
        self.epochs.get(&(origin, epoch)).copied().unwrap_or(0)
    }

    /// How many live epochs copy-on-write volume `origin` has, and how many
    /// records read through them.
    pub fn readers_of(&self, origin: u64) -> (usize, u64) {
        self.epochs
            .range((origin, 0)..=(origin, u64::MAX))
            .fold((0, 0), |(e, r), (_, &n)| (e + 1, r + u64::from(n)))
    }

    // ---- changing --------------------------------------------------------------

    fn note(&mut self, undo: impl FnOnce(&Self) -> Undo) {
        if self.log.recording() {
            let u = undo(self);
            self.log.push(u);
        }
    }

    fn mark_dirty(&mut self, id: u64) {
        if !self.dirty.contains(&id) {
            self.note(|_| Undo::Dirty(id, false));
            self.dirty.insert(id);
        }
    }

    /// Inserts a new record; the name must be free.
    pub fn insert(&mut self, id: u64, rec: VolumeRecord) {
        self.note(|t| Undo::Name(rec.name.clone(), t.names.get(&rec.name).copied()));
        self.names.insert(rec.name.clone(), id);
        self.note(|t| Undo::Record(id, t.vols.get(&id).cloned()));
        self.put(id, rec);
        self.mark_dirty(id);
    }

    /// Changes record `id` with `f`, which must not rename it (that goes
    /// through [`Self::rename`], which keeps the name index).
    pub fn update<T>(&mut self, id: u64, f: impl FnOnce(&mut VolumeRecord) -> T) -> Result<T> {
        if !self.vols.contains_key(&id) {
            return Err(Error::not_found(format!("volume id {id}")));
        }
        self.note(|t| Undo::Record(id, t.vols.get(&id).cloned()));
        self.mark_dirty(id);
        let mut rec = self
            .take(id)
            .ok_or_else(|| Error::inconsistent("volume record vanished"))?;
        #[cfg(debug_assertions)]
        let name = rec.name.clone();
        let out = f(&mut rec);
        #[cfg(debug_assertions)]
        debug_assert_eq!(rec.name, name, "volume renamed outside rename()");
        self.put(id, rec);
        Ok(out)
    }

    pub fn rename(&mut self, id: u64, new_name: String) -> Result<()> {
        let Some(rec) = self.vols.get(&id) else {
            return Err(Error::not_found(format!("volume id {id}")));
        };
        let old_name = rec.name.clone();
        self.note(|t| Undo::Record(id, t.vols.get(&id).cloned()));
        self.mark_dirty(id);
        self.note(|t| Undo::Name(old_name.clone(), t.names.get(&old_name).copied()));
        self.names.remove(&old_name);
        self.note(|t| Undo::Name(new_name.clone(), t.names.get(&new_name).copied()));
        self.names.insert(new_name.clone(), id);
        if let Some(rec) = self.vols.get_mut(&id) {
            rec.name = new_name;
        }
        Ok(())
    }

    /// Removes record `id` and returns it.
    pub fn remove(&mut self, id: u64) -> Result<VolumeRecord> {
        let Some(rec) = self.vols.get(&id) else {
            return Err(Error::not_found(format!("volume id {id}")));
        };
        let name = rec.name.clone();
        self.note(|t| Undo::Record(id, t.vols.get(&id).cloned()));
        let rec = self
            .take(id)
            .ok_or_else(|| Error::inconsistent("volume record vanished"))?;
        self.note(|t| Undo::Name(name.clone(), t.names.get(&name).copied()));
        self.names.remove(&name);
        let shared = self.shared_txn.get(&id).copied();
        self.note(|_| Undo::Shared(id, shared));
        self.shared_txn.remove(&id);
        let was_dirty = self.dirty.contains(&id);
        self.note(|_| Undo::Dirty(id, was_dirty));
        self.dirty.remove(&id);
        let was_removed = self.removed.contains(&id);
        self.note(|_| Undo::Removed(id, was_removed));
        self.removed.insert(id);
        Ok(rec)
    }

    pub fn set_shared(&mut self, id: u64, txn: u64) {
        self.note(|t| Undo::Shared(id, t.shared_txn.get(&id).copied()));
        self.shared_txn.insert(id, txn);
    }

    /// Hands over the records to store and the ids to remove, and starts a
    /// clean slate (logged: a failed step gets them back).
    pub fn take_changes(&mut self) -> (Vec<u64>, Vec<(u64, VolumeRecord)>) {
        let removed: Vec<u64> = std::mem::take(&mut self.removed).into_iter().collect();
        let dirty_ids = std::mem::take(&mut self.dirty);
        for &id in &removed {
            self.note(|_| Undo::Removed(id, true));
        }
        for &id in &dirty_ids {
            self.note(|_| Undo::Dirty(id, true));
        }
        let dirty = dirty_ids
            .into_iter()
            .filter_map(|id| self.vols.get(&id).map(|r| (id, r.clone())))
            .collect();
        (removed, dirty)
    }

    // ---- savepoints --------------------------------------------------------------

    pub fn savepoint(&mut self) -> TableSavepoint {
        TableSavepoint(self.log.begin())
    }

    pub fn release(&mut self, sp: TableSavepoint) {
        self.log.release(sp.0);
    }

    pub fn rollback(&mut self, sp: TableSavepoint) {
        let mut log = std::mem::take(&mut self.log);
        log.rollback(sp.0, |undo| match undo {
            Undo::Record(id, Some(rec)) => self.put(id, rec),
            Undo::Record(id, None) => {
                self.take(id);
            }
            Undo::Name(name, Some(id)) => {
                self.names.insert(name, id);
            }
            Undo::Name(name, None) => {
                self.names.remove(&name);
            }
            Undo::Dirty(id, was) => set_member(&mut self.dirty, id, was),
            Undo::Removed(id, was) => set_member(&mut self.removed, id, was),
            Undo::Shared(id, Some(txn)) => {
                self.shared_txn.insert(id, txn);
            }
            Undo::Shared(id, None) => {
                self.shared_txn.remove(&id);
            }
        });
        self.log = log;
    }
}

fn set_member(set: &mut BTreeSet<u64>, id: u64, member: bool) {
    if member {
        set.insert(id);
    } else {
        set.remove(&id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arbor_format::{BlockRef, VolumeKind};

    fn rec(name: &str) -> VolumeRecord {
        VolumeRecord {
            root: BlockRef::NONE,
            size_bytes: 4096,
            parent: 0,
            created_txn: 1,
            created_unix_secs: 0,
            mapped_chunks: 0,
            kind: VolumeKind::Volume,
            name: name.into(),
            guid: [1; 16],
            receive: Default::default(),
            layout: Default::default(),
            backing: None,
            key_slot: None,
        }
    }

    fn state(t: &VolumeTable) -> String {
        format!(
            "{:?} {:?} {:?} {:?} {:?}",
            t.vols,
            {
                let mut n: Vec<_> = t.names.iter().collect();
                n.sort();
                n
            },
            t.dirty,
            t.removed,
            {
                let mut s: Vec<_> = t.shared_txn.iter().collect();
                s.sort();
                s
            },
        ) + &format!(" {:?}", t.epochs)
    }

    #[test]
    fn rollback_restores_every_kind_of_change() {
        let mut t = VolumeTable::load(vec![(1, rec("a")), (2, rec("b"))]).unwrap();
        t.set_shared(1, 5);
        let before = state(&t);
        let sp = t.savepoint();
        t.insert(3, rec("c"));
        t.rename(1, "z".into()).unwrap();
        t.update(2, |r| r.size_bytes = 8192).unwrap();
        t.remove(2).unwrap();
        t.set_shared(3, 9);
        t.remove(1).unwrap();
        assert_ne!(state(&t), before);
        t.rollback(sp);
        assert_eq!(state(&t), before);
        assert!(t.log.is_empty());
    }

    #[test]
    fn release_keeps_changes_and_nested_rollback_undoes_only_its_own() {
        let mut t = VolumeTable::load(vec![(1, rec("a"))]).unwrap();
        let outer = t.savepoint();
        t.insert(2, rec("b"));
        let after_insert = state(&t);
        let inner = t.savepoint();
        t.rename(2, "c".into()).unwrap();
        t.rollback(inner);
        assert_eq!(state(&t), after_insert);
        t.release(outer);
        assert_eq!(t.id_of("b"), Some(2));
        assert!(t.log.is_empty());
    }

    #[test]
    #[should_panic(expected = "volume renamed outside rename()")]
    fn update_refuses_renames() {
        let mut t = VolumeTable::load(vec![(1, rec("a"))]).unwrap();
        let _ = t.update(1, |r| r.name = "x".into());
    }
}
