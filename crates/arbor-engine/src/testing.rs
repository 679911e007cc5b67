//! Fixtures shared by the engine's layer unit tests: the open transaction of
//! a fresh pool on a simulated disk, a structural check of one tree, a
//! reference-count check of a set of trees, and a way to drop a tree the
//! test owns (what reclaim does, written here without the layers above).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use arbor_format::{BlockRef, NodeBody, TreeKind, BLOCK_SIZE};
use arbor_io::{BlockDevice, SimDisk};

use crate::meta::btree::TreeMut;
use crate::meta::{decode_map_value, recover, Meta, Recovered, Resume};
use crate::pool::{choose_superblock, CreateOptions, OpenOptions, Pool};
use crate::store::{Geometry, Store};

/// Size of the simulated disk: about 3,000 data chunks of 4 KiB (three
/// data-space-map pages) after 4 MiB of metadata.
pub(crate) const DEVICE_BYTES: u64 = 16 << 20;
/// 1,024 metadata blocks (64 of them the reserve).
pub(crate) const METADATA_BYTES: u64 = 4 << 20;

/// The open transaction of a freshly created, empty pool: no trees, every
/// space-map count zero. The pool is created through [`Pool::create`], closed,
/// and its last commit resumed here so the test owns the `Meta` outright.
pub(crate) fn fresh_meta() -> Meta {
    fresh_meta_with(4096)
}

/// [`fresh_meta`] with chunks of `chunk_size` bytes.
pub(crate) fn fresh_meta_with(chunk_size: u32) -> Meta {
    let (store, resume) = fresh_store_with(chunk_size);
    let meta =
        Meta::resume(store, resume, OpenOptions::default().dirty_node_limit).expect("resume");
    assert_eq!(
        meta.used(arbor_format::SmKind::Meta),
        0,
        "a fresh pool has no nodes"
    );
    assert_eq!(
        meta.used(arbor_format::SmKind::Data),
        0,
        "a fresh pool has no data"
    );
    meta
}

/// The store of a freshly created, empty pool of 4 KiB chunks, its last
/// commit recovered (every space-map page at home), for the tests of the
/// layers below the transaction.
pub(crate) fn fresh_store() -> Arc<Store> {
    fresh_store_with(4096).0
}

fn fresh_store_with(chunk_size: u32) -> (Arc<Store>, Resume) {
    let dev: Arc<dyn BlockDevice> = Arc::new(SimDisk::new(DEVICE_BYTES));
    let create = CreateOptions {
        chunk_size,
        metadata_bytes: Some(METADATA_BYTES),
        journal_pages: Some(16),
        ..CreateOptions::default()
    };
    let open = OpenOptions::default();
    drop(Pool::create(Arc::clone(&dev), &create, &open).expect("create a pool"));
    let sb = choose_superblock(dev.as_ref()).expect("read the superblock");
    let store = Arc::new(Store::new(
        dev,
        Geometry::new(&sb.superblock, sb.version),
        open.cache_bytes / BLOCK_SIZE,
    ));
    match recover(&store).expect("recover the last commit") {
        Recovered::Intact { resume, .. } => (store, resume),
        Recovered::ImagesDamaged { why, .. } => panic!("{why}"),
    }
}

/// One leaf of a tree: the key range its parents give it, and its entries.
pub(crate) struct Leaf {
    pub lo: u64,
    pub hi: u64,
    pub keys: Vec<u64>,
}

/// What [`check_tree`] saw of a tree.
pub(crate) struct Shape {
    /// Level of the root (leaves are level 0); `None` for the empty tree.
    pub level: Option<u8>,
    pub nodes: usize,
    pub leaves: Vec<Leaf>,
}

impl Shape {
    pub fn entries(&self) -> usize {
        self.leaves.iter().map(|l| l.keys.len()).sum()
    }
}

/// Walks the tree at `root` and panics unless it keeps the B-tree
/// invariants documented in `meta/btree.rs`: no node is empty or over capacity,
/// keys are strictly increasing, every leaf key lies in the range its
/// parents route to it, levels step down by one to the leaves at 0, and
/// every node is of `kind`.
pub(crate) fn check_tree(meta: &Meta, root: BlockRef, kind: TreeKind) -> Shape {
    let mut shape = Shape {
        level: None,
        nodes: 0,
        leaves: Vec::new(),
    };
    if root.is_none() {
        return shape;
    }
    let level = meta.node(root).expect("read the root").level;
    shape.level = Some(level);
    walk(meta, root, kind, level, 0, u64::MAX, &mut shape);
    shape
}

fn walk(meta: &Meta, r: BlockRef, kind: TreeKind, level: u8, lo: u64, hi: u64, shape: &mut Shape) {
    let node = meta.node(r).expect("read a node").clone();
    shape.nodes += 1;
    assert_eq!(node.tree, kind, "node {r:?} of the wrong tree");
    assert_eq!(node.level, level, "node {r:?} at the wrong level");
    assert!(!node.is_empty(), "empty node {r:?}");
    assert!(
        node.fits(),
        "node {r:?} holds {:?}, limit {:?}",
        node.usage(),
        node.limit()
    );
    assert!(
        node.keys.windows(2).all(|w| w[0] < w[1]),
        "keys of {r:?} not increasing: {:?}",
        node.keys
    );
    match &node.body {
        NodeBody::Leaf(values) => {
            assert_eq!(level, 0, "leaf {r:?} above level 0");
            assert_eq!(values.len(), node.len() * kind.value_len());
            assert!(
                node.keys.iter().all(|&k| lo <= k && k < hi),
                "leaf {r:?} keys {:?} outside [{lo}, {hi})",
                node.keys
            );
            shape.leaves.push(Leaf {
                lo,
                hi,
                keys: node.keys.clone(),
            });
        }
        NodeBody::Internal(children) => {
            assert!(level > 0, "internal node {r:?} at level 0");
            assert_eq!(children.len(), node.len());
            assert!(
                node.keys[1..].iter().all(|&k| lo < k && k < hi),
                "separators of {r:?} {:?} outside ({lo}, {hi})",
                node.keys
            );
            for (i, &child) in children.iter().enumerate() {
                let child_lo = if i == 0 { lo } else { node.keys[i] };
                let child_hi = node.keys.get(i + 1).copied().unwrap_or(hi);
                walk(meta, child, kind, level - 1, child_lo, child_hi, shape);
            }
        }
    }
}

/// Distinct nodes and data chunks referenced by a set of trees.
pub(crate) struct Refs {
    pub nodes: usize,
    pub data_chunks: usize,
}

/// Recomputes the reference counts the trees at `roots` hold (one per root
/// listed, one per parent pointer from a distinct node, one data reference
/// per chunk of each extent in a distinct mapping leaf) and panics unless
/// the space maps agree, entry by entry and in their `used` totals. The
/// trees must be the only holders of references in `meta`, apart from
/// `other_data` data chunks the test holds itself.
pub(crate) fn check_refs(meta: &Meta, roots: &[BlockRef], other_data: usize) -> Refs {
    let mut node_refs: HashMap<u64, u32> = HashMap::new();
    let mut data_refs: HashMap<u64, u32> = HashMap::new();
    let mut seen = HashSet::new();
    let mut stack: Vec<BlockRef> = Vec::new();
    for &root in roots.iter().filter(|r| !r.is_none()) {
        *node_refs.entry(root.block).or_default() += 1;
        stack.push(root);
    }
    while let Some(r) = stack.pop() {
        if !seen.insert(r.block) {
            continue;
        }
        let node = meta.node(r).expect("read a node").clone();
        match &node.body {
            NodeBody::Internal(children) => {
                for &child in children {
                    *node_refs.entry(child.block).or_default() += 1;
                    stack.push(child);
                }
            }
            NodeBody::Leaf(_) if node.tree == TreeKind::Mapping => {
                for i in 0..node.len() {
                    let v = decode_map_value(&node, i).expect("decode an extent");
                    for (start, len) in v.chunk_runs() {
                        for p in start..start + len {
                            *data_refs.entry(p).or_default() += 1;
                        }
                    }
                }
            }
            NodeBody::Leaf(_) => {}
        }
    }
    for (&block, &expected) in &node_refs {
        assert_eq!(
            meta.meta_count(block).expect("meta count"),
            expected,
            "reference count of node block {block}"
        );
    }
    assert_eq!(
        meta.used(arbor_format::SmKind::Meta) as usize,
        node_refs.len(),
        "metadata blocks in use vs. nodes reachable (a leak or a lost node)"
    );
    for (&chunk, &expected) in &data_refs {
        assert_eq!(
            meta.data_count(chunk).expect("data count"),
            expected,
            "reference count of data chunk {chunk}"
        );
    }
    assert_eq!(
        meta.used(arbor_format::SmKind::Data) as usize,
        data_refs.len() + other_data,
        "data chunks in use vs. chunks referenced"
    );
    Refs {
        nodes: node_refs.len(),
        data_chunks: data_refs.len(),
    }
}

/// Drops one reference to the tree at `r`, freeing (recursively) whatever
/// it alone held: child nodes, and the data chunks of mapping extents.
pub(crate) fn drop_tree(meta: &mut Meta, r: BlockRef) {
    if r.is_none() {
        return;
    }
    let released = TreeMut::new(meta, TreeKind::Mapping, r).release();
    let Some(node) = released.expect("drop a node reference") else {
        return;
    };
    match &node.body {
        NodeBody::Internal(children) => {
            for &child in children {
                drop_tree(meta, child);
            }
        }
        NodeBody::Leaf(_) if node.tree == TreeKind::Mapping => {
            for i in 0..node.len() {
                let v = decode_map_value(&node, i).expect("decode an extent");
                for (start, len) in v.chunk_runs() {
                    meta.dec_data_range(start, len)
                        .expect("drop data references");
                }
            }
        }
        NodeBody::Leaf(_) => {}
    }
}
