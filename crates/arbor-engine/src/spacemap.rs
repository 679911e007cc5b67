//! Reference-counted space maps: one 32-bit count per metadata block or data
//! chunk, in pages of [`SM_ENTRIES_PER_PAGE`].
//!
//! Invariants:
//! * a count is the number of references to the entry from committed or
//!   in-transaction metadata (tree nodes, leaf extents, reclaim-queue entries);
//! * an entry whose count fell to zero in the current transaction stays in
//!   `pending_free` until commit, because the last committed state may still
//!   reference it: it is never handed out again before then;
//! * a page is read from, in order: this transaction's dirty copy, the last
//!   commit's image (its home copy is written only by the next commit, so
//!   this image is the only current copy), then the store (cache or home).
//!
//! Every change made between [`SpaceMap::savepoint`] and
//! [`SpaceMap::release`] is logged, so [`SpaceMap::rollback`] can restore
//! the map exactly as it was at the savepoint (see `volumes::Volumes::atomic`).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use arbor_format::{SmKind, SmPage, SM_ENTRIES_PER_PAGE};

use crate::error::{Error, Invalid, Result};
use crate::store::Store;
use crate::undo::{Mark, UndoLog};

const PER_PAGE: u64 = SM_ENTRIES_PER_PAGE as u64;

/// One logged change, undone in reverse order.
enum Undo {
    /// `entry` held `count` before it was set.
    Count {
        entry: u64,
        count: u32,
    },
    /// The page became dirty (it was clean before).
    PageDirtied(u32),
    PendingAdded(u64),
    FreshAdded(u64),
    FullSet(u32),
}

/// What a rollback restores besides the logged changes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SmSavepoint {
    used: u64,
    cursor: u64,
    mark: Mark,
}

pub(crate) struct SpaceMap {
    pub kind: SmKind,
    entries: u64,
    /// Pages changed in this transaction (copy-on-write from the clean cache).
    dirty: HashMap<u32, SmPage>,
    /// Pages journalled by the last commit whose home copies are not yet
    /// written. Never evicted: they are the only current copies.
    committed: HashMap<u32, Arc<SmPage>>,
    /// Pages of the transaction being committed (between phases A and C).
    inflight: HashMap<u32, Arc<SmPage>>,
    /// Entries freed by the transaction being committed: not allocatable
    /// until its commit is durable.
    frozen_free: HashSet<u64>,
    pending_free: HashSet<u64>,
    /// Entries allocated in this transaction, and in the one being
    /// committed: no durable commit references them yet.
    fresh: HashSet<u64>,
    fresh_frozen: HashSet<u64>,
    /// Open pins (see [`SpaceMap::pin`]) and the entries freed by commits
    /// while one was open: not allocatable until the last pin goes.
    pins: u32,
    pinned_free: HashSet<u64>,
    /// Runs of free entries set aside (in memory only) for an allocation
    /// that prepares them first (a copy-on-write volume's home, zeroed
    /// before it is allocated): not handed out meanwhile.
    reserved: Vec<std::ops::Range<u64>>,
    /// Entries with a non-zero count.
    used: u64,
    /// Next-fit allocation cursor.
    cursor: u64,
    /// Pages known to have no free entry (a hint, cleared when one is freed).
    full: Vec<bool>,
    /// How to undo the changes since the oldest open savepoint.
    log: UndoLog<Undo>,
}

fn split(entry: u64) -> (u32, usize) {
    // entry < entries ≤ pages * PER_PAGE and pages fit in u32 (checked in new()).
    ((entry / PER_PAGE) as u32, (entry % PER_PAGE) as usize)
}

impl SpaceMap {
    pub fn new(kind: SmKind, entries: u64, used: u64, cursor: u64) -> Result<Self> {
        let pages = entries.div_ceil(PER_PAGE);
        if pages > u64::from(u32::MAX) {
            return Err(Invalid::SpaceMapTooLarge.into());
        }
        if used > entries {
            return Err(Error::inconsistent(format!(
                "commit record counts {used} {kind:?} entries in use of {entries}"
            )));
        }
        Ok(Self {
            kind,
            entries,
            dirty: HashMap::new(),
            committed: HashMap::new(),
            inflight: HashMap::new(),
            frozen_free: HashSet::new(),
            pending_free: HashSet::new(),
            fresh: HashSet::new(),
            fresh_frozen: HashSet::new(),
            pins: 0,
            pinned_free: HashSet::new(),
            reserved: Vec::new(),
            used,
            cursor: if cursor < entries { cursor } else { 0 },
            full: vec![false; pages as usize],
            log: UndoLog::default(),
        })
    }

    /// Entries of the map (every region's).
    pub fn entries(&self) -> u64 {
        self.entries
    }

    /// Adds entries at the end (a growth: the new entries' pages are
    /// formatted, and those sharing the last page with old entries hold
    /// zeros there). The caller commits before anything else can fail.
    pub fn grow(&mut self, entries: u64) -> Result<()> {
        debug_assert!(self.log.idle(), "a growth inside an operation");
        if entries < self.entries {
            return Err(Error::inconsistent("a space map cannot shrink"));
        }
        let pages = entries.div_ceil(PER_PAGE);
        let pages = usize::try_from(pages)
            .ok()
            .filter(|&p| p as u64 <= u64::from(u32::MAX))
            .ok_or(Invalid::SpaceMapTooLarge)?;
        // The old last page may have gained entries.
        if let Some(last) = self.full.last_mut() {
            *last = false;
        }
        self.full.resize(pages, false);
        self.entries = entries;
        Ok(())
    }

    /// Entries with a non-zero count.
    pub fn used(&self) -> u64 {
        self.used
    }

    /// The next-fit allocation cursor (kept in the commit record).
    pub fn cursor(&self) -> u64 {
        self.cursor
    }

    /// Entries that can be allocated now: not referenced, and not freed by a
    /// transaction that has not committed yet (those the last durable
    /// commit may still reference).
    pub fn allocatable(&self) -> u64 {
        // Every pending or frozen entry has a zero count, so it is not in
        // `used`: the subtraction cannot underflow on a consistent map, and
        // saturates on a damaged one.
        (self.entries - self.used)
            .saturating_sub(self.pending_free.len() as u64)
            .saturating_sub(self.frozen_free.len() as u64)
            .saturating_sub(self.pinned_free.len() as u64)
    }

    /// Keeps every entry the last commit references from being allocated
    /// again until [`Self::unpin`]: entries later commits free stay
    /// reserved, so a reader of that commit's blocks (a live `check`) finds
    /// them unchanged. Call with no commit in flight.
    pub fn pin(&mut self) {
        self.pins += 1;
    }

    /// Ends a [`Self::pin`]; after the last one the entries freed meanwhile
    /// become allocatable.
    pub fn unpin(&mut self) {
        debug_assert!(self.pins > 0, "unpin without pin");
        self.pins = self.pins.saturating_sub(1);
        if self.pins == 0 {
            for entry in self.pinned_free.drain() {
                self.full[(entry / PER_PAGE) as usize] = false;
            }
        }
    }

    // ---- savepoints ------------------------------------------------------------

    /// Starts logging changes so that [`Self::rollback`] can undo them.
    pub fn savepoint(&mut self) -> SmSavepoint {
        SmSavepoint {
            used: self.used,
            cursor: self.cursor,
            mark: self.log.begin(),
        }
    }

    /// Keeps the changes since `sp`.
    pub fn release(&mut self, sp: SmSavepoint) {
        self.log.release(sp.mark);
    }

    /// Undoes every change since `sp`, restoring the map exactly.
    pub fn rollback(&mut self, sp: SmSavepoint) {
        let mut log = std::mem::take(&mut self.log);
        log.rollback(sp.mark, |undo| match undo {
            Undo::Count { entry, count } => {
                let (page, slot) = split(entry);
                // Logged after the page became dirty, undone before it is cleaned.
                if let Some(p) = self.dirty.get_mut(&page) {
                    p.counts[slot] = count;
                }
            }
            Undo::PageDirtied(page) => {
                self.dirty.remove(&page);
            }
            Undo::PendingAdded(entry) => {
                self.pending_free.remove(&entry);
            }
            Undo::FreshAdded(entry) => {
                self.fresh.remove(&entry);
            }
            Undo::FullSet(page) => self.full[page as usize] = false,
        });
        self.log = log;
        self.used = sp.used;
        self.cursor = sp.cursor;
    }

    /// True when `entry` was allocated after the last durable commit (in this
    /// transaction or the one being committed): no durable commit references
    /// it. The commit in flight may, once it lands: a crash after that
    /// recovers to its state ([`Self::allocated_in_open_txn`] is the
    /// stricter fact).
    pub fn allocated_since_durable(&self, entry: u64) -> bool {
        self.fresh.contains(&entry) || self.fresh_frozen.contains(&entry)
    }

    /// True when `entry` was allocated in the open transaction: no state a
    /// crash can recover to, now or once the commit in flight lands,
    /// references it.
    pub fn allocated_in_open_txn(&self, entry: u64) -> bool {
        self.fresh.contains(&entry)
    }

    /// The entries the open transaction freed (count down to 0), sorted.
    pub fn freed_in_txn(&self) -> Vec<u64> {
        let mut freed: Vec<u64> = self.pending_free.iter().copied().collect();
        freed.sort_unstable();
        freed
    }

    /// Entries freed but not yet allocatable (waiting for a commit).
    pub fn awaiting_commit(&self) -> bool {
        !self.pending_free.is_empty() || !self.frozen_free.is_empty()
    }

    /// The newest committed page images whose home copies are not written
    /// yet (with no commit in flight: exactly the last commit's pages).
    /// Every other page's committed copy is at home until the next commit.
    pub fn committed_pages(&self) -> HashMap<u32, Arc<SmPage>> {
        let mut pages = self.committed.clone();
        pages.extend(self.inflight.iter().map(|(i, p)| (*i, Arc::clone(p))));
        pages
    }

    pub fn dirty_pages(&self) -> usize {
        self.dirty.len()
    }

    fn check_entry(&self, entry: u64) -> Result<()> {
        if entry >= self.entries {
            return Err(Error::inconsistent(format!(
                "{:?} space-map entry {entry} beyond the end ({})",
                self.kind, self.entries
            )));
        }
        Ok(())
    }

    pub fn get(&self, store: &Store, entry: u64) -> Result<u32> {
        self.check_entry(entry)?;
        let (page, slot) = split(entry);
        self.with_counts(store, page, |counts| counts[slot])
    }

    /// The newest copy of a page outside this transaction.
    fn clean_page(&self, store: &Store, page: u32) -> Result<Arc<SmPage>> {
        match self
            .inflight
            .get(&page)
            .or_else(|| self.committed.get(&page))
        {
            Some(p) => Ok(Arc::clone(p)),
            None => store.read_sm_page(self.kind, page),
        }
    }

    fn page_mut(&mut self, store: &Store, page: u32) -> Result<&mut SmPage> {
        if !self.dirty.contains_key(&page) {
            let clean = self.clean_page(store, page)?;
            self.dirty.insert(page, (*clean).clone());
            self.log.push(Undo::PageDirtied(page));
        }
        // Inserted just above when missing.
        self.dirty
            .get_mut(&page)
            .ok_or_else(|| Error::inconsistent("dirty space-map page vanished"))
    }

    fn set(&mut self, store: &Store, entry: u64, count: u32) -> Result<()> {
        let (page, slot) = split(entry);
        let counts = &mut self.page_mut(store, page)?.counts;
        let old = std::mem::replace(&mut counts[slot], count);
        self.log.push(Undo::Count { entry, count: old });
        Ok(())
    }

    /// Adds one reference to an entry that is already referenced.
    pub fn inc(&mut self, store: &Store, entry: u64) -> Result<()> {
        let count = self.get(store, entry)?;
        if count == 0 {
            return Err(Error::inconsistent(format!(
                "{:?} entry {entry}: new reference to an unreferenced entry",
                self.kind
            )));
        }
        let next = count.checked_add(1).ok_or_else(|| {
            Error::inconsistent(format!("{:?} entry {entry}: count overflow", self.kind))
        })?;
        self.set(store, entry, next)
    }

    /// Drops one reference; returns the new count. At zero the entry becomes
    /// pending-free until commit.
    pub fn dec(&mut self, store: &Store, entry: u64) -> Result<u32> {
        let count = self.get(store, entry)?;
        let Some(next) = count.checked_sub(1) else {
            return Err(Error::inconsistent(format!(
                "{:?} entry {entry}: dropping a reference that does not exist",
                self.kind
            )));
        };
        if next == 0 {
            // The used counter comes from the commit record: a damaged one
            // can be below the real count.
            self.used = self.used.checked_sub(1).ok_or_else(|| {
                Error::inconsistent(format!("{:?} used counter below the counts", self.kind))
            })?;
            if self.pending_free.insert(entry) {
                self.log.push(Undo::PendingAdded(entry));
            }
        }
        self.set(store, entry, next)?;
        Ok(next)
    }

    /// The end of `[start, start + len)`, or an error if it overflows (a damaged extent).
    fn range_end(&self, start: u64, len: u64) -> Result<u64> {
        start.checked_add(len).ok_or_else(|| {
            Error::inconsistent(format!("{:?} range {start}+{len} overflows", self.kind))
        })
    }

    /// Adds one reference to each entry of `[start, start + len)`.
    #[cfg(test)]
    pub fn inc_range(&mut self, store: &Store, start: u64, len: u64) -> Result<()> {
        self.inc_ranges(store, &mut [(start, len)])
    }

    /// Adds one reference to each entry of every range `(start, len)`,
    /// taking them in order of entry so that each page is looked up once
    /// for all the entries it holds (shadowing a shared leaf adds a
    /// reference to every chunk its extents map, scattered over many
    /// pages). Entries must already be referenced; an error leaves what was
    /// changed logged, for the step's rollback, as [`Self::inc`] does.
    pub fn inc_ranges(&mut self, store: &Store, ranges: &mut [(u64, u64)]) -> Result<()> {
        ranges.sort_unstable();
        for &(start, len) in ranges.iter() {
            let end = self.range_end(start, len)?;
            if len > 0 {
                self.check_entry(end - 1)?;
            }
        }
        let kind = self.kind;
        let recording = self.log.recording();
        let mut undo = Vec::new();
        let mut failed = None;
        let mut current: Option<(u32, &mut SmPage)> = None;
        'ranges: for &(start, len) in ranges.iter() {
            for entry in start..start + len {
                let (page, slot) = split(entry);
                let counts = match &mut current {
                    Some((p, sm)) if *p == page => &mut sm.counts,
                    _ => {
                        // One mutable borrow of the map at a time: drop the
                        // previous page's before taking the next.
                        current = None;
                        match self.page_mut(store, page) {
                            Ok(sm) => &mut current.insert((page, sm)).1.counts,
                            Err(e) => {
                                failed = Some(e);
                                break 'ranges;
                            }
                        }
                    }
                };
                let count = counts[slot];
                let Some(next) = count.checked_add(1).filter(|_| count > 0) else {
                    failed = Some(Error::inconsistent(format!(
                        "{kind:?} entry {entry}: {}",
                        if count == 0 {
                            "new reference to an unreferenced entry"
                        } else {
                            "count overflow"
                        }
                    )));
                    break 'ranges;
                };
                counts[slot] = next;
                if recording {
                    undo.push(Undo::Count { entry, count });
                }
            }
        }
        for u in undo {
            self.log.push(u);
        }
        failed.map_or(Ok(()), Err)
    }

    pub fn dec_range(&mut self, store: &Store, start: u64, len: u64) -> Result<()> {
        for entry in start..self.range_end(start, len)? {
            self.dec(store, entry)?;
        }
        Ok(())
    }

    /// Allocates a free entry (count 0, not freed in this transaction) and sets
    /// its count to 1. `None` when every entry is in use or pending free, or
    /// when fewer than `reserve` entries would remain.
    pub fn alloc(&mut self, store: &Store, reserve: u64) -> Result<Option<u64>> {
        if self.allocatable() <= reserve {
            return Ok(None);
        }
        let pages = self.full.len() as u64;
        let start_page = self.cursor / PER_PAGE;
        for step in 0..=pages {
            let page = (start_page + step) % pages;
            if self.full[page as usize] {
                continue;
            }
            let first = if step == 0 {
                self.cursor
            } else {
                page * PER_PAGE
            };
            let end = ((page + 1) * PER_PAGE).min(self.entries);
            if let Some(entry) = self.find_free_in_page(store, page as u32, first, end)? {
                self.set(store, entry, 1)?;
                self.used += 1;
                if self.fresh.insert(entry) {
                    self.log.push(Undo::FreshAdded(entry));
                }
                self.cursor = if entry + 1 < self.entries {
                    entry + 1
                } else {
                    0
                };
                return Ok(Some(entry));
            }
            if first == page * PER_PAGE && !self.full[page as usize] {
                self.full[page as usize] = true;
                self.log.push(Undo::FullSet(page as u32));
            }
        }
        Ok(None)
    }

    fn find_free_in_page(
        &self,
        store: &Store,
        page: u32,
        first: u64,
        end: u64,
    ) -> Result<Option<u64>> {
        self.with_counts(store, page, |counts| {
            (first..end).find(|&e| self.is_free(counts, e))
        })
    }

    /// Runs `f` on the counts of `page` as this transaction sees them.
    fn with_counts<T>(
        &self,
        store: &Store,
        page: u32,
        f: impl FnOnce(&[u32; SM_ENTRIES_PER_PAGE]) -> T,
    ) -> Result<T> {
        match self.dirty.get(&page) {
            Some(p) => Ok(f(&p.counts)),
            None => Ok(f(&self.clean_page(store, page)?.counts)),
        }
    }

    /// Whether entry `e`, of the page whose `counts` are given, may be
    /// allocated now: count 0, and [`Self::may_take`].
    fn is_free(&self, counts: &[u32; SM_ENTRIES_PER_PAGE], e: u64) -> bool {
        counts[(e % PER_PAGE) as usize] == 0 && self.may_take(e)
    }

    /// Whether a free entry (count 0) may be handed out: not held back
    /// ([`Self::held`]), and not set aside.
    fn may_take(&self, e: u64) -> bool {
        !self.held(e) && !self.reserved.iter().any(|r| r.contains(&e))
    }

    /// Whether a free entry is held back: freed by a transaction that is not
    /// durable yet, or pinned for a reader of the last commit.
    fn held(&self, e: u64) -> bool {
        self.pending_free.contains(&e)
            || self.frozen_free.contains(&e)
            || self.pinned_free.contains(&e)
    }

    /// The first run of `len` entries that may all be allocated and that
    /// ends at or before `limit(start)` (the end of the region holding
    /// `start`: a run must be contiguous on the device). Scans the whole map.
    pub fn find_free_run(
        &self,
        store: &Store,
        len: u64,
        limit: &dyn Fn(u64) -> u64,
    ) -> Result<Option<u64>> {
        if len == 0 || len > self.allocatable() {
            return Ok(None);
        }
        let mut start = 0u64;
        let mut end_limit = limit(0);
        for page in 0..self.full.len() as u32 {
            let base = u64::from(page) * PER_PAGE;
            let found = self.with_counts(store, page, |counts| {
                for e in base..(base + PER_PAGE).min(self.entries) {
                    let free = self.is_free(counts, e);
                    if !free || e >= end_limit {
                        start = e + u64::from(!free);
                        end_limit = limit(start);
                        if !free {
                            continue;
                        }
                    }
                    if e + 1 - start == len {
                        return Some(start);
                    }
                }
                None
            })?;
            if found.is_some() {
                return Ok(found);
            }
        }
        Ok(None)
    }

    /// Whether every entry of `run` (inside the map) is free and may be
    /// allocated now.
    pub fn run_is_free(&self, store: &Store, run: std::ops::Range<u64>) -> Result<bool> {
        if run.end > self.entries {
            return Ok(false);
        }
        let mut e = run.start;
        while e < run.end {
            // `e` is below `entries`, whose pages fit a u32.
            let (page, _) = split(e);
            let end = ((u64::from(page) + 1) * PER_PAGE).min(run.end);
            if !self.with_counts(store, page, |counts| {
                (e..end).all(|x| self.is_free(counts, x))
            })? {
                return Ok(false);
            }
            e = end;
        }
        Ok(true)
    }

    /// Sets aside `run` (free entries found by [`Self::find_free_run`]).
    pub fn reserve(&mut self, run: std::ops::Range<u64>) {
        self.reserved.push(run);
    }

    /// Ends a [`Self::reserve`].
    pub fn unreserve(&mut self, run: &std::ops::Range<u64>) {
        self.reserved.retain(|r| r != run);
    }

    /// Allocates every entry of `run` (each free; set aside by the caller),
    /// in one step. The reservation stays until the caller ends it, after
    /// the step: a step that fails and is undone (and run again after a
    /// commit) must find the run still set aside, not taken meanwhile by a
    /// write.
    pub fn alloc_run(&mut self, store: &Store, run: std::ops::Range<u64>) -> Result<()> {
        for entry in run {
            if self.get(store, entry)? != 0 || self.held(entry) {
                return Err(Error::inconsistent(format!(
                    "{:?} entry {entry} of a reserved run is taken",
                    self.kind
                )));
            }
            self.set(store, entry, 1)?;
            self.used += 1;
            if self.fresh.insert(entry) {
                self.log.push(Undo::FreshAdded(entry));
            }
        }
        Ok(())
    }

    /// The last commit's pages whose home copies the next commit writes
    /// (those this transaction changed again are superseded by its own
    /// images). They stay readable here until that commit finishes.
    pub fn home_pages_due(&self) -> Vec<Arc<SmPage>> {
        self.committed
            .iter()
            .filter(|(index, _)| !self.dirty.contains_key(index))
            .map(|(_, page)| Arc::clone(page))
            .collect()
    }

    /// Phase A: this transaction's changed pages, stamped with `txn`, become
    /// the in-flight copies, and its freed entries stay reserved until the
    /// commit is durable. Returns the pages to journal.
    pub fn freeze(&mut self, txn: u64) -> Vec<Arc<SmPage>> {
        debug_assert!(self.log.idle(), "a commit inside an operation");
        self.frozen_free = std::mem::take(&mut self.pending_free);
        self.fresh_frozen = std::mem::take(&mut self.fresh);
        let mut pages: Vec<Arc<SmPage>> = self
            .dirty
            .drain()
            .map(|(_, mut page)| {
                page.txn = txn;
                Arc::new(page)
            })
            .collect();
        pages.sort_by_key(|p| p.index);
        self.inflight = pages.iter().map(|p| (p.index, Arc::clone(p))).collect();
        pages
    }

    /// Phase C: the frozen pages are now the committed copies, and the
    /// entries freed by that transaction can be allocated again.
    pub fn thaw(&mut self) {
        self.committed = std::mem::take(&mut self.inflight);
        self.fresh_frozen.clear();
        if self.pins > 0 {
            self.pinned_free.extend(self.frozen_free.drain());
            return;
        }
        for entry in self.frozen_free.drain() {
            self.full[(entry / PER_PAGE) as usize] = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use proptest::prelude::*;
    use rand::rngs::StdRng;
    use rand::seq::SliceRandom;
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::testing::fresh_store;

    /// The store of a fresh pool: every space-map page at home is all zeros.
    fn store() -> Arc<Store> {
        fresh_store()
    }

    /// A map over every data chunk of the test pool (three pages).
    fn data_map(store: &Store, cursor: u64) -> SpaceMap {
        let entries = store.geo.data_chunks();
        assert!(entries > 2 * PER_PAGE, "the test pool spans three pages");
        SpaceMap::new(SmKind::Data, entries, 0, cursor % entries).unwrap()
    }

    /// Everything a caller can observe of a map.
    #[derive(Debug, PartialEq, Eq)]
    struct State {
        counts: Vec<u32>,
        used: u64,
        cursor: u64,
        allocatable: u64,
        dirty_pages: usize,
        awaiting_commit: bool,
        since_durable: Vec<u64>,
    }

    fn state(sm: &SpaceMap, store: &Store) -> State {
        let counts: Vec<u32> = (0..sm.entries).map(|e| sm.get(store, e).unwrap()).collect();
        let referenced = counts.iter().filter(|&&c| c > 0).count() as u64;
        assert_eq!(sm.used(), referenced, "the used counter vs. the counts");
        State {
            used: sm.used(),
            counts,
            cursor: sm.cursor(),
            allocatable: sm.allocatable(),
            dirty_pages: sm.dirty_pages(),
            awaiting_commit: sm.awaiting_commit(),
            since_durable: (0..sm.entries)
                .filter(|&e| sm.allocated_since_durable(e))
                .collect(),
        }
    }

    /// A whole commit of the map alone, as `Meta::commit` does it: the
    /// previous commit's pages due home are written there (phase B, step 1)
    /// between phase A (freeze) and phase C (thaw). The map must be the
    /// only user of its kind of pages in `store`.
    fn commit(sm: &mut SpaceMap, store: &Store, txn: &mut u64) {
        let due = sm.home_pages_due();
        sm.freeze(*txn);
        for page in due {
            let home = store.geo.sm_home(page.kind, page.index).unwrap();
            store.write_block(home, &page.encode()).unwrap();
            store.cache_sm_page(page);
        }
        sm.thaw();
        *txn += 1;
    }

    /// Allocations hand out each entry once, with a count of one, and
    /// lower `allocatable()` by one each; with a reserve they stop when
    /// only the reserve is left (and leave the map unchanged), without one
    /// they use it up; a full map allocates nothing.
    #[test]
    fn alloc_hands_out_free_entries_once_and_keeps_the_reserve() {
        let store = store();
        let mut sm = SpaceMap::new(SmKind::Data, 40, 0, 0).unwrap();
        let mut got = BTreeSet::new();
        let alloc = |sm: &mut SpaceMap, reserve: u64, got: &mut BTreeSet<u64>| {
            let before = sm.allocatable();
            let e = sm.alloc(&store, reserve).unwrap()?;
            assert!(got.insert(e), "entry {e} handed out twice");
            assert_eq!(sm.get(&store, e).unwrap(), 1);
            assert_eq!(sm.allocatable(), before - 1);
            assert!(sm.allocated_since_durable(e));
            Some(e)
        };
        let mut n = 0;
        while alloc(&mut sm, 5, &mut got).is_some() {
            n += 1;
        }
        assert_eq!((n, sm.allocatable(), sm.used()), (35, 5, 35));
        let before = state(&sm, &store);
        assert_eq!(sm.alloc(&store, 5).unwrap(), None);
        assert_eq!(sm.alloc(&store, 6).unwrap(), None);
        assert_eq!(
            state(&sm, &store),
            before,
            "a refused alloc changes nothing"
        );
        while alloc(&mut sm, 0, &mut got).is_some() {
            n += 1;
        }
        assert_eq!((n, sm.allocatable(), sm.used()), (40, 0, 40));
        assert_eq!(got, (0..40).collect());
        assert_eq!(sm.alloc(&store, 0).unwrap(), None);
    }

    /// Over a multi-page map, starting anywhere, alloc finds every entry
    /// (wrapping around); after references to a random subset are dropped
    /// (some entries only down to one) and committed, alloc hands out
    /// exactly the entries whose count fell to zero, each with count zero
    /// before the call, and nothing else.
    #[test]
    fn alloc_never_returns_a_referenced_entry() {
        let store = store();
        let mut rng = StdRng::seed_from_u64(21);
        let mut txn = 1;
        let start = PER_PAGE + 17;
        let mut sm = data_map(&store, start);
        let entries = sm.entries;
        let mut all = BTreeSet::new();
        while let Some(e) = sm.alloc(&store, 0).unwrap() {
            if all.is_empty() {
                assert_eq!(e, start, "next fit starts at the cursor");
            }
            assert!(all.insert(e));
        }
        assert_eq!(all.len() as u64, entries);
        commit(&mut sm, &store, &mut txn);
        let mut order: Vec<u64> = (0..entries).collect();
        order.shuffle(&mut rng);
        let freed: BTreeSet<u64> = order[..300].iter().copied().collect();
        for &e in &order[300..600] {
            sm.inc(&store, e).unwrap();
            assert_eq!(sm.dec(&store, e).unwrap(), 1);
        }
        for &e in &freed {
            assert_eq!(sm.dec(&store, e).unwrap(), 0);
        }
        assert_eq!(sm.allocatable(), 0, "freed entries wait for the commit");
        commit(&mut sm, &store, &mut txn);
        assert_eq!(sm.allocatable(), 300);
        let mut again = BTreeSet::new();
        for _ in 0..300 {
            let before = state(&sm, &store);
            let e = sm.alloc(&store, 0).unwrap().expect("a freed entry");
            assert_eq!(before.counts[e as usize], 0, "entry {e} was referenced");
            assert!(again.insert(e));
        }
        assert_eq!(again, freed);
        assert_eq!(sm.alloc(&store, 0).unwrap(), None);
    }

    /// An entry whose count falls to zero is not handed out again in the
    /// same transaction, nor while its commit is in flight (between freeze
    /// and thaw); once the commit is done it is allocatable again. An entry
    /// freed after the freeze waits for the next commit.
    #[test]
    fn entries_freed_in_a_transaction_wait_for_its_commit() {
        let store = store();
        let mut sm = SpaceMap::new(SmKind::Data, 40, 0, 0).unwrap();
        let first: Vec<u64> = (0..10)
            .map(|_| sm.alloc(&store, 0).unwrap().unwrap())
            .collect();
        let (three, five) = (first[3], first[5]);
        assert!(!sm.awaiting_commit());
        assert_eq!(sm.dec(&store, three).unwrap(), 0);
        assert!(sm.awaiting_commit());
        assert_eq!(sm.allocatable(), 30);
        for _ in 0..30 {
            let e = sm.alloc(&store, 0).unwrap().expect("a never-used entry");
            assert_ne!(e, three, "reallocated in the transaction that freed it");
        }
        assert_eq!(sm.allocatable(), 0);
        assert_eq!(sm.alloc(&store, 0).unwrap(), None);
        assert!(sm.allocated_since_durable(five));

        sm.freeze(1);
        assert_eq!(
            sm.alloc(&store, 0).unwrap(),
            None,
            "its commit is not durable yet"
        );
        assert!(sm.awaiting_commit());
        assert!(
            sm.allocated_since_durable(five),
            "its commit is not durable yet"
        );
        // Freed in the next transaction, while the commit is in flight.
        assert_eq!(sm.dec(&store, five).unwrap(), 0);
        sm.thaw();
        assert!(!sm.allocated_since_durable(five));
        assert!(sm.awaiting_commit(), "the entry freed after the freeze");
        assert_eq!(sm.allocatable(), 1);
        assert_eq!(sm.alloc(&store, 0).unwrap(), Some(three));
        assert_eq!(sm.get(&store, three).unwrap(), 1);
        assert_eq!(sm.alloc(&store, 0).unwrap(), None);

        sm.freeze(2);
        sm.thaw();
        assert!(!sm.awaiting_commit());
        assert_eq!(sm.alloc(&store, 0).unwrap(), Some(five));
    }

    /// Alloc skips entries freed in the open transaction even when they
    /// come before free entries in allocation order (here they alternate).
    #[test]
    fn alloc_skips_pending_entries_between_free_ones() {
        let store = store();
        let mut txn = 1;
        let mut sm = SpaceMap::new(SmKind::Data, 40, 0, 0).unwrap();
        while sm.alloc(&store, 0).unwrap().is_some() {}
        commit(&mut sm, &store, &mut txn);
        for e in (0..40).step_by(2) {
            sm.dec(&store, e).unwrap();
        }
        commit(&mut sm, &store, &mut txn);
        for e in (1..40).step_by(2) {
            sm.dec(&store, e).unwrap();
        }
        assert_eq!(sm.allocatable(), 20);
        let got: BTreeSet<u64> = (0..20)
            .map(|_| sm.alloc(&store, 0).unwrap().unwrap())
            .collect();
        assert_eq!(got, (0..40).step_by(2).collect());
        assert_eq!(sm.alloc(&store, 0).unwrap(), None);
    }

    /// `inc` and `dec` refuse to create or drop a reference that cannot
    /// exist, and entries past the end are refused.
    #[test]
    fn impossible_reference_changes_are_errors() {
        let store = store();
        let mut sm = SpaceMap::new(SmKind::Data, 40, 0, 0).unwrap();
        assert!(sm.inc(&store, 3).is_err(), "new reference to a free entry");
        assert!(
            sm.dec(&store, 3).is_err(),
            "dropping a reference that is not there"
        );
        assert!(sm.get(&store, 40).is_err());
        assert!(sm.inc_range(&store, u64::MAX, 2).is_err());
        assert!(sm.dec_range(&store, u64::MAX - 1, 5).is_err());
        let e = sm.alloc(&store, 0).unwrap().unwrap();
        assert!(sm.inc_range(&store, e, 1).is_ok());
        assert_eq!(sm.get(&store, e).unwrap(), 2);
        assert_eq!(sm.used(), 1);
    }

    /// Ranges crossing page boundaries and dropping counts to zero change
    /// the map exactly as the same changes entry by entry.
    #[test]
    fn range_changes_equal_entry_changes() {
        // Each map has a store of its own: commits write pages home.
        let (store_a, store_b) = (store(), store());
        let mut rng = StdRng::seed_from_u64(2);
        let (mut a, mut b) = (data_map(&store_a, 0), data_map(&store_b, 0));
        let mut counts = vec![0u32; a.entries as usize];
        for _ in 0..a.entries {
            let (ea, eb) = (a.alloc(&store_a, 0).unwrap(), b.alloc(&store_b, 0).unwrap());
            assert_eq!(ea, eb);
            counts[ea.unwrap() as usize] = 1;
        }
        let mut txn = 1;
        commit(&mut a, &store_a, &mut txn);
        commit(&mut b, &store_b, &mut txn);
        for round in 0..300 {
            let len = rng.gen_range(1..600u64);
            let start = if round % 3 == 0 {
                // Straddle a page boundary.
                (PER_PAGE * rng.gen_range(1..3u64)).saturating_sub(len / 2)
            } else {
                rng.gen_range(0..a.entries - len)
            };
            let range = start as usize..(start + len) as usize;
            if round % 2 == 0 && counts[range.clone()].iter().all(|&c| c > 0) {
                a.dec_range(&store_a, start, len).unwrap();
                for e in start..start + len {
                    b.dec(&store_b, e).unwrap();
                }
                counts[range].iter_mut().for_each(|c| *c -= 1);
            } else if counts[range.clone()].iter().all(|&c| c > 0) {
                a.inc_range(&store_a, start, len).unwrap();
                for e in start..start + len {
                    b.inc(&store_b, e).unwrap();
                }
                counts[range].iter_mut().for_each(|c| *c += 1);
            }
            if round % 50 == 49 {
                let sa = state(&a, &store_a);
                assert_eq!(sa, state(&b, &store_b));
                assert_eq!(sa.counts, counts);
                commit(&mut a, &store_a, &mut txn);
                commit(&mut b, &store_b, &mut txn);
            }
        }
        assert_eq!(state(&a, &store_a), state(&b, &store_b));
    }

    #[derive(Debug, Clone)]
    enum Op {
        Alloc(u64),
        Inc(usize),
        Dec(usize),
        IncRange(usize, u64),
        /// Two ranges at once, in either order, overlapping or not.
        IncRanges(usize, u64, usize, u64),
        DecRange(usize, u64),
        /// A whole commit (only outside savepoints).
        Commit,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0..3u64).prop_map(Op::Alloc),
            2 => any::<usize>().prop_map(Op::Inc),
            3 => any::<usize>().prop_map(Op::Dec),
            1 => (any::<usize>(), 1..40u64).prop_map(|(i, n)| Op::IncRange(i, n)),
            1 => (any::<usize>(), 1..40u64).prop_map(|(i, n)| Op::DecRange(i, n)),
            1 => (any::<usize>(), 1..40u64, any::<usize>(), 1..40u64)
                .prop_map(|(i, n, j, m)| Op::IncRanges(i, n, j, m)),
            1 => Just(Op::Commit),
        ]
    }

    /// Applies `ops` to the map and to `counts`, its model, skipping
    /// changes that would be errors (they are tested above). Ranges start
    /// at a referenced entry and stop before the first unreferenced one.
    fn apply(
        sm: &mut SpaceMap,
        store: &Store,
        counts: &mut [u32],
        ops: &[Op],
        txn: Option<&mut u64>,
    ) {
        let mut txn = txn;
        for op in ops {
            let referenced: Vec<usize> = (0..counts.len()).filter(|&e| counts[e] > 0).collect();
            let pick = |i: usize| referenced.get(i % referenced.len().max(1)).copied();
            let run = |i: usize, n: u64| {
                pick(i).map(|s| {
                    let len = (s..counts.len())
                        .take(n as usize)
                        .take_while(|&e| counts[e] > 0)
                        .count();
                    (s, len)
                })
            };
            match *op {
                Op::Alloc(reserve) => {
                    let allocatable = sm.allocatable();
                    match sm.alloc(store, reserve).unwrap() {
                        Some(e) => {
                            assert!(allocatable > reserve);
                            assert_eq!(counts[e as usize], 0, "alloc of a referenced entry");
                            counts[e as usize] = 1;
                        }
                        None => assert!(allocatable <= reserve),
                    }
                }
                Op::Inc(i) => {
                    if let Some(e) = pick(i) {
                        sm.inc(store, e as u64).unwrap();
                        counts[e] += 1;
                    }
                }
                Op::Dec(i) => {
                    if let Some(e) = pick(i) {
                        counts[e] -= 1;
                        assert_eq!(sm.dec(store, e as u64).unwrap(), counts[e]);
                    }
                }
                Op::IncRange(i, n) => {
                    if let Some((s, len)) = run(i, n) {
                        sm.inc_range(store, s as u64, len as u64).unwrap();
                        counts[s..s + len].iter_mut().for_each(|c| *c += 1);
                    }
                }
                Op::IncRanges(i, n, j, m) => {
                    if let (Some((s, len)), Some((t, tlen))) = (run(i, n), run(j, m)) {
                        let mut ranges = [(s as u64, len as u64), (t as u64, tlen as u64)];
                        sm.inc_ranges(store, &mut ranges).unwrap();
                        counts[s..s + len].iter_mut().for_each(|c| *c += 1);
                        counts[t..t + tlen].iter_mut().for_each(|c| *c += 1);
                    }
                }
                Op::DecRange(i, n) => {
                    if let Some((s, len)) = run(i, n) {
                        sm.dec_range(store, s as u64, len as u64).unwrap();
                        counts[s..s + len].iter_mut().for_each(|c| *c -= 1);
                    }
                }
                Op::Commit => {
                    if let Some(txn) = txn.as_deref_mut() {
                        commit(sm, store, txn);
                    }
                }
            }
        }
    }

    /// Ranges that meet an unreferenced entry part way fail with what they
    /// changed logged: rolling back restores the map exactly.
    #[test]
    fn a_failed_multi_range_increment_rolls_back_exactly() {
        let store = store();
        let mut sm = SpaceMap::new(SmKind::Data, ENTRIES, 0, 0).unwrap();
        for _ in 0..PER_PAGE + 10 {
            sm.alloc(&store, 0).unwrap().unwrap();
        }
        let mut txn = 1;
        commit(&mut sm, &store, &mut txn);
        let before = state(&sm, &store);
        let sp = sm.savepoint();
        // The second range crosses the page boundary and runs past the
        // referenced entries (PER_PAGE + 10 on).
        let mut ranges = [(PER_PAGE + 5, 10), (3, 40)];
        let err = sm.inc_ranges(&store, &mut ranges).unwrap_err();
        assert!(err.to_string().contains("unreferenced"), "{err}");
        assert_ne!(
            state(&sm, &store),
            before,
            "it changed entries before failing"
        );
        sm.rollback(sp);
        assert_eq!(state(&sm, &store), before);
    }

    /// A small map over two pages, so random operations touch both.
    const ENTRIES: u64 = PER_PAGE + 24;

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: 64,
            failure_persistence: None,
            ..ProptestConfig::default()
        })]

        /// Random allocations, increments and decrements (single and
        /// ranged) keep the counts equal to a model; rolling back to a
        /// savepoint, nested or not, restores everything observable
        /// (counts, used, cursor, allocatable(), dirty_pages(), pending
        /// frees, fresh entries) exactly as it was, and the same operations
        /// then give the same result again; releasing keeps them.
        #[test]
        fn rollback_restores_the_map_exactly(
            cursor in 0..ENTRIES,
            setup in proptest::collection::vec(op(), 0..150),
            outer in proptest::collection::vec(op(), 0..60),
            inner in proptest::collection::vec(op(), 0..60),
        ) {
            let store = store();
            // Entries near the cursor, in both pages, start referenced.
            let mut sm = SpaceMap::new(SmKind::Data, ENTRIES, 0, cursor).unwrap();
            let mut counts = vec![0u32; ENTRIES as usize];
            let mut txn = 1;
            apply(&mut sm, &store, &mut counts, &setup, Some(&mut txn));
            let s0 = state(&sm, &store);
            prop_assert_eq!(&s0.counts, &counts);
            let c0 = counts.clone();

            let sp1 = sm.savepoint();
            apply(&mut sm, &store, &mut counts, &outer, None);
            let s1 = state(&sm, &store);
            prop_assert_eq!(&s1.counts, &counts);
            let c1 = counts.clone();
            let sp2 = sm.savepoint();
            apply(&mut sm, &store, &mut counts, &inner, None);
            prop_assert_eq!(&state(&sm, &store).counts, &counts);
            sm.rollback(sp2);
            prop_assert_eq!(&state(&sm, &store), &s1, "inner rollback");
            counts = c1;
            apply(&mut sm, &store, &mut counts, &inner, None);
            sm.rollback(sp1);
            prop_assert_eq!(&state(&sm, &store), &s0, "outer rollback");
            counts = c0;

            // The same operations again, kept this time.
            let sp = sm.savepoint();
            apply(&mut sm, &store, &mut counts, &outer, None);
            sm.release(sp);
            prop_assert_eq!(&state(&sm, &store), &s1, "replay after a rollback");
            commit(&mut sm, &store, &mut txn);
            prop_assert_eq!(&state(&sm, &store).counts, &counts);
            prop_assert_eq!(sm.dirty_pages(), 0);
        }
    }
}
