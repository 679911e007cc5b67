//! A copy-on-write volume's snapshot store: for each chunk the volume
//! overwrote while a snapshot still saw its old content, one copy per
//! range of epochs (docs/FORMAT.md §6.1).
//!
//! The store is a mapping tree (same nodes, counts, checking and reclaim)
//! whose keys are [`store_key`]`(chunk, first epoch)` and whose entries are
//! single chunks with the last epoch they serve ([`StoreValue`]). For one
//! chunk the ranges are disjoint and increasing, so:
//! * the copy epoch `e` reads is the entry with the greatest key ≤
//!   `(chunk, e)`, if its range reaches `e`;
//! * the newest epoch a chunk has a copy for is the `last` of the entry
//!   with the greatest key ≤ `(chunk, MAX_EPOCH)`.
//!
//! Both are one predecessor search ([`Tree::get_below`]): O(log n),
//! whatever the number of snapshots.

use arbor_format::{
    split_store_key, store_key, BlockRef, StoreValue, TreeKind, MAX_COW_CHUNKS, MAX_EPOCH,
};

use crate::error::{Error, Result};
use crate::meta::btree::{Tree, TreeMut};
use crate::meta::Meta;

/// One entry of a snapshot store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StoreEntry {
    pub chunk: u64,
    pub first: u64,
    pub last: u64,
    pub pchunk: u64,
    pub gen: u64,
}

impl StoreEntry {
    pub fn key(&self) -> u64 {
        store_key(self.chunk, self.first)
    }

    fn from_entry(key: u64, value: &[u8], data_chunks: u64) -> Result<Self> {
        let v = StoreValue::decode(key, value)
            .map_err(|e| Error::corrupt(format!("snapshot-store entry {key:#x}"), e))?;
        if v.pchunk >= data_chunks {
            return Err(Error::inconsistent(format!(
                "snapshot-store entry {key:#x} points past the data region (chunk {})",
                v.pchunk
            )));
        }
        let (chunk, first) = split_store_key(key);
        Ok(Self {
            chunk,
            first,
            last: v.last,
            pchunk: v.pchunk,
            gen: v.gen,
        })
    }
}

/// Read access to a copy-on-write volume's snapshot store: its tree in
/// the transaction.
#[derive(Clone, Copy)]
pub(crate) struct SnapStore<'a> {
    tree: Tree<'a>,
}

impl<'a> SnapStore<'a> {
    /// The store whose tree's root is `root`.
    pub fn new(meta: &'a Meta, root: BlockRef) -> Self {
        Self {
            tree: Tree::new(meta, TreeKind::Mapping, root),
        }
    }

    fn below(&self, key: u64) -> Result<Option<StoreEntry>> {
        match self.tree.get_below(key)? {
            Some((k, value)) => {
                StoreEntry::from_entry(k, &value, self.tree.meta().geo().data_chunks()).map(Some)
            }
            None => Ok(None),
        }
    }

    /// The copy of `chunk` that epoch `epoch` reads, if the volume has
    /// overwritten the chunk since that epoch began.
    pub fn lookup(&self, chunk: u64, epoch: u64) -> Result<Option<StoreEntry>> {
        debug_assert!(chunk < MAX_COW_CHUNKS && (1..=MAX_EPOCH).contains(&epoch));
        Ok(self
            .below(store_key(chunk, epoch))?
            .filter(|c| c.chunk == chunk && c.last >= epoch))
    }

    /// The newest copy of `chunk` (the one with the highest epochs), if any.
    pub fn newest(&self, chunk: u64) -> Result<Option<StoreEntry>> {
        Ok(self
            .below(store_key(chunk, MAX_EPOCH))?
            .filter(|c| c.chunk == chunk))
    }

    /// Calls `f` for every entry from key `from` on, in key order (chunk,
    /// then epochs), until it returns false.
    pub fn for_each(&self, from: u64, f: &mut dyn FnMut(StoreEntry) -> Result<bool>) -> Result<()> {
        let data_chunks = self.tree.meta().geo().data_chunks();
        self.tree.for_each(from, u64::MAX, &mut |key, value| {
            f(StoreEntry::from_entry(key, value, data_chunks)?)
        })
    }
}

/// A snapshot store being changed in the open transaction.
pub(crate) struct SnapStoreMut<'a> {
    tree: TreeMut<'a>,
}

impl<'a> SnapStoreMut<'a> {
    /// The store whose tree's root is `root`.
    pub fn new(meta: &'a mut Meta, root: BlockRef) -> Self {
        Self {
            tree: TreeMut::new(meta, TreeKind::Mapping, root),
        }
    }

    /// The tree's root after the changes so far.
    pub fn root(&self) -> BlockRef {
        self.tree.root()
    }

    /// The transaction, for the references the caller holds.
    pub fn meta_mut(&mut self) -> &mut Meta {
        self.tree.meta_mut()
    }

    /// Adds entry `copy`; the caller transfers one reference to its chunk.
    pub fn insert(&mut self, copy: StoreEntry) -> Result<()> {
        let mut value = [0u8; StoreValue::ENCODED_LEN];
        StoreValue {
            pchunk: copy.pchunk,
            last: copy.last,
            gen: copy.gen,
        }
        .encode(&mut value);
        self.tree.insert(copy.key(), &value)
    }

    /// Removes the entry with key `key`; its chunk's reference passes to the
    /// caller.
    pub fn remove(&mut self, key: u64) -> Result<Option<StoreEntry>> {
        let data_chunks = self.tree.meta().geo().data_chunks();
        let value = self.tree.remove(key)?;
        value
            .map(|v| StoreEntry::from_entry(key, &v, data_chunks))
            .transpose()
    }
}

