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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;
    use crate::testing::{check_refs, check_tree, drop_tree, fresh_meta};

    /// (chunk, first epoch) → (last epoch, data chunk).
    type Model = BTreeMap<(u64, u64), (u64, u64)>;

    const CHUNKS: u64 = 24;
    const EPOCHS: u64 = 100;

    /// The copy epoch `epoch` of `chunk` reads, by the model.
    fn model_lookup(model: &Model, chunk: u64, epoch: u64) -> Option<(u64, u64, u64)> {
        model
            .range((chunk, 0)..=(chunk, epoch))
            .next_back()
            .filter(|(_, &(last, _))| last >= epoch)
            .map(|(&(_, first), &(last, pchunk))| (first, last, pchunk))
    }

    fn entries(meta: &Meta, root: BlockRef, from: u64) -> Vec<StoreEntry> {
        let mut out = Vec::new();
        SnapStore::new(meta, root)
            .for_each(from, &mut |copy| {
                out.push(copy);
                Ok(true)
            })
            .unwrap();
        out
    }

    /// The store at `root` against its model: every entry in key order,
    /// and for every chunk the copy each epoch reads and the newest copy.
    fn check_store(meta: &Meta, root: BlockRef, model: &Model) {
        check_tree(meta, root, TreeKind::Mapping);
        let listed: Vec<_> = entries(meta, root, 0)
            .into_iter()
            .map(|c| ((c.chunk, c.first), (c.last, c.pchunk)))
            .collect();
        let expected: Vec<_> = model.iter().map(|(k, v)| (*k, *v)).collect();
        assert_eq!(listed, expected);
        let store = SnapStore::new(meta, root);
        for chunk in 0..CHUNKS + 1 {
            for epoch in 1..=EPOCHS + 2 {
                let got = store
                    .lookup(chunk, epoch)
                    .unwrap()
                    .map(|c| (c.first, c.last, c.pchunk));
                assert_eq!(got, model_lookup(model, chunk, epoch), "{chunk}@{epoch}");
            }
            let newest = store.newest(chunk).unwrap().map(|c| (c.first, c.last));
            let expected = model
                .range((chunk, 0)..=(chunk, MAX_EPOCH))
                .next_back()
                .map(|(&(_, first), &(last, _))| (first, last));
            assert_eq!(newest, expected, "newest copy of {chunk}");
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        /// A copy of `chunk` for the epochs after its newest copy (plus
        /// `gap` epochs no copy serves), `len` epochs long.
        Insert {
            chunk: u64,
            gap: u64,
            len: u64,
        },
        /// Removes the `n`th entry (modulo their number).
        Remove(usize),
        Commit,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            8 => (0..CHUNKS, 0..3u64, 0..4u64)
                .prop_map(|(chunk, gap, len)| Op::Insert { chunk, gap, len }),
            3 => any::<usize>().prop_map(Op::Remove),
            1 => Just(Op::Commit),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: 32,
            failure_persistence: None,
            ..ProptestConfig::default()
        })]

        /// Random inserts (ranges of epochs after each chunk's newest copy,
        /// as copy-on-write writes add them), removals (as the sweep takes
        /// copies no epoch reads) and commits keep the store equal to a
        /// BTreeMap: the copy every epoch of every chunk reads, the newest
        /// copy of each chunk and the entries in key order, over enough
        /// entries for several leaves (a removal leaves separators whose
        /// entry is gone, so an epoch's copy may sit in an earlier leaf);
        /// each entry holds one reference on its chunk, and dropping the
        /// store frees every node and chunk.
        #[test]
        fn store_operations_match_a_model(ops in proptest::collection::vec(op(), 1..600)) {
            let mut meta = fresh_meta();
            let mut root = BlockRef::NONE;
            let mut model = Model::new();
            for (n, op) in ops.iter().enumerate() {
                match *op {
                    Op::Insert { chunk, gap, len } => {
                        let after = model
                            .range((chunk, 0)..=(chunk, MAX_EPOCH))
                            .next_back()
                            .map_or(0, |(_, &(last, _))| last);
                        let first = after + 1 + gap;
                        let last = first + len;
                        if last > EPOCHS {
                            continue;
                        }
                        let pchunk = meta.alloc_data().unwrap();
                        let gen = meta.txn();
                        let mut store = SnapStoreMut::new(&mut meta, root);
                        store.insert(StoreEntry { chunk, first, last, pchunk, gen }).unwrap();
                        root = store.root();
                        model.insert((chunk, first), (last, pchunk));
                    }
                    Op::Remove(i) => {
                        if model.is_empty() {
                            continue;
                        }
                        let (&(chunk, first), &(last, pchunk)) =
                            model.iter().nth(i % model.len()).unwrap();
                        let mut store = SnapStoreMut::new(&mut meta, root);
                        let copy = store.remove(store_key(chunk, first)).unwrap();
                        prop_assert_eq!(
                            copy.map(|c| (c.chunk, c.first, c.last, c.pchunk)),
                            Some((chunk, first, last, pchunk))
                        );
                        // Absent now: nothing to remove.
                        prop_assert!(store.remove(store_key(chunk, first)).unwrap().is_none());
                        store.meta_mut().dec_data(pchunk).unwrap();
                        root = store.root();
                        model.remove(&(chunk, first));
                    }
                    Op::Commit => meta.commit().unwrap(),
                }
                if n % 25 == 24 || n + 1 == ops.len() {
                    check_store(&meta, root, &model);
                    check_refs(&meta, &[root], 0);
                }
            }
            drop_tree(&mut meta, root);
            prop_assert_eq!(
                (meta.used(arbor_format::SmKind::Meta), meta.used(arbor_format::SmKind::Data)),
                (0, 0)
            );
        }
    }

    /// Iteration starts at the key asked for and stops when told to.
    #[test]
    fn for_each_starts_at_a_key_and_stops_when_told() {
        let mut meta = fresh_meta();
        let mut store = SnapStoreMut::new(&mut meta, BlockRef::NONE);
        for chunk in 0..10 {
            for first in [1, 5, 9] {
                let pchunk = store.meta_mut().alloc_data().unwrap();
                let copy = StoreEntry {
                    chunk,
                    first,
                    last: first + 3,
                    pchunk,
                    gen: 1,
                };
                store.insert(copy).unwrap();
            }
        }
        let root = store.root();
        let from = store_key(4, 5);
        let keys: Vec<u64> = entries(&meta, root, from)
            .iter()
            .map(StoreEntry::key)
            .collect();
        assert_eq!(keys.len(), 30 - 13);
        assert_eq!(keys[0], from);
        assert!(keys.windows(2).all(|w| w[0] < w[1]));
        let mut seen = 0;
        SnapStore::new(&meta, root)
            .for_each(0, &mut |_| {
                seen += 1;
                Ok(seen < 4)
            })
            .unwrap();
        assert_eq!(seen, 4);
        check_refs(&meta, &[root], 0);
    }
}
