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
//! the map exactly as it was at the savepoint (see `meta::Meta::atomic`).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use arbor_format::{SmKind, SmPage, SM_ENTRIES_PER_PAGE};

use crate::error::{Error, Result};
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
            return Err(Error::InvalidArgument("space map too large".into()));
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
            used,
            cursor: if cursor < entries { cursor } else { 0 },
            full: vec![false; pages as usize],
            log: UndoLog::default(),
        })
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
    /// transaction or the one being committed): a power cut now recovers to
    /// a state that does not reference it.
    pub fn allocated_since_durable(&self, entry: u64) -> bool {
        self.fresh.contains(&entry) || self.fresh_frozen.contains(&entry)
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
        if let Some(p) = self.dirty.get(&page) {
            return Ok(p.counts[slot]);
        }
        Ok(self.clean_page(store, page)?.counts[slot])
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

    pub fn inc_range(&mut self, store: &Store, start: u64, len: u64) -> Result<()> {
        for entry in start..self.range_end(start, len)? {
            self.inc(store, entry)?;
        }
        Ok(())
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
        let counts: &[u32; SM_ENTRIES_PER_PAGE] = match self.dirty.get(&page) {
            Some(p) => &p.counts,
            None => {
                let clean = self.clean_page(store, page)?;
                return Ok(self.scan(&clean.counts, page, first, end));
            }
        };
        Ok(self.scan(counts, page, first, end))
    }

    fn scan(
        &self,
        counts: &[u32; SM_ENTRIES_PER_PAGE],
        page: u32,
        first: u64,
        end: u64,
    ) -> Option<u64> {
        let base = u64::from(page) * PER_PAGE;
        (first..end).find(|&e| {
            counts[(e - base) as usize] == 0
                && !self.pending_free.contains(&e)
                && !self.frozen_free.contains(&e)
        })
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
        for entry in self.frozen_free.drain() {
            self.full[(entry / PER_PAGE) as usize] = false;
        }
    }
}
