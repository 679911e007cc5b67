//! B-tree nodes. All trees share one node format: u64 keys, and either child
//! pointers (internal nodes, level > 0) or fixed-size values whose size is
//! set by the tree kind (leaves, level 0).

use crate::header::{self, BlockType, HEADER_SIZE};
use crate::records::{BlockRef, MapValue, VolumeRecord};
use crate::{get_u64, put_u64, FormatError, BLOCK_SIZE};

/// Common header + block u64 + txn u64 + tree u8 + level u8 + count u16 + reserved u32.
pub const NODE_HEADER_SIZE: usize = HEADER_SIZE + 24;
const INTERNAL_ENTRY_LEN: usize = 8 + BlockRef::ENCODED_LEN;
/// Deepest tree accepted when reading: a bound that makes descent loops finite
/// even on a damaged pool (169-way fan-out makes 16 levels far more than any
/// pool can fill).
pub const MAX_LEVEL: u8 = 16;

/// Which tree a node belongs to; it fixes the leaf value layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum TreeKind {
    /// A volume's logical chunk → physical extent map ([`MapValue`]).
    Mapping = 1,
    /// Volume id → [`VolumeRecord`], version 1 layout (no identities).
    Volumes = 2,
    /// Reclaim queue: sequence number → [`BlockRef`] of a subtree to drop.
    Queue = 3,
    /// Volume id → [`VolumeRecord`], version 3 layout (identities and
    /// receives in progress).
    VolumeTable = 4,
}

impl TreeKind {
    pub fn value_len(self) -> usize {
        match self {
            TreeKind::Mapping => MapValue::ENCODED_LEN,
            TreeKind::Volumes => VolumeRecord::ENCODED_LEN_V1,
            TreeKind::Queue => BlockRef::ENCODED_LEN,
            TreeKind::VolumeTable => VolumeRecord::ENCODED_LEN,
        }
    }

    fn from_u8(raw: u8) -> Result<Self, FormatError> {
        match raw {
            1 => Ok(TreeKind::Mapping),
            2 => Ok(TreeKind::Volumes),
            3 => Ok(TreeKind::Queue),
            4 => Ok(TreeKind::VolumeTable),
            other => Err(FormatError::Invalid(format!("tree kind {other}"))),
        }
    }
}

/// Most entries an internal node holds.
pub const fn internal_capacity() -> usize {
    (BLOCK_SIZE - NODE_HEADER_SIZE) / INTERNAL_ENTRY_LEN
}

/// Most entries a leaf of `tree` holds.
pub fn leaf_capacity(tree: TreeKind) -> usize {
    (BLOCK_SIZE - NODE_HEADER_SIZE) / (8 + tree.value_len())
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeBody {
    /// Child pointers; child `i` holds keys in `[keys[i], keys[i + 1])`.
    Internal(Vec<BlockRef>),
    /// `keys.len() * tree.value_len()` bytes of values, in key order.
    Leaf(Vec<u8>),
}

/// A decoded node. Keys are strictly increasing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub tree: TreeKind,
    pub level: u8,
    pub keys: Vec<u64>,
    pub body: NodeBody,
}

impl Node {
    pub fn new_leaf(tree: TreeKind) -> Self {
        Self {
            tree,
            level: 0,
            keys: Vec::new(),
            body: NodeBody::Leaf(Vec::new()),
        }
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    pub fn capacity(&self) -> usize {
        match self.body {
            NodeBody::Internal(_) => internal_capacity(),
            NodeBody::Leaf(_) => leaf_capacity(self.tree),
        }
    }

    /// The value bytes of leaf entry `i` (empty for internal nodes).
    pub fn value(&self, i: usize) -> &[u8] {
        let len = self.tree.value_len();
        match &self.body {
            NodeBody::Leaf(values) => &values[i * len..(i + 1) * len],
            NodeBody::Internal(_) => &[],
        }
    }

    /// Encodes the node as block `block`, written in transaction `txn`.
    /// The caller guarantees `len() <= capacity()` (the B-tree splits first).
    pub fn encode(&self, block: u64, txn: u64) -> [u8; BLOCK_SIZE] {
        let mut out = [0u8; BLOCK_SIZE];
        put_u64(&mut out, HEADER_SIZE, block);
        put_u64(&mut out, HEADER_SIZE + 8, txn);
        out[HEADER_SIZE + 16] = self.tree as u8;
        out[HEADER_SIZE + 17] = self.level;
        out[HEADER_SIZE + 18..HEADER_SIZE + 20].copy_from_slice(&(self.len() as u16).to_le_bytes());
        let mut at = NODE_HEADER_SIZE;
        match &self.body {
            NodeBody::Internal(children) => {
                for (key, child) in self.keys.iter().zip(children) {
                    put_u64(&mut out, at, *key);
                    child.encode(&mut out[at + 8..at + INTERNAL_ENTRY_LEN]);
                    at += INTERNAL_ENTRY_LEN;
                }
            }
            NodeBody::Leaf(values) => {
                let vlen = self.tree.value_len();
                for (key, value) in self.keys.iter().zip(values.chunks_exact(vlen)) {
                    put_u64(&mut out, at, *key);
                    out[at + 8..at + 8 + vlen].copy_from_slice(value);
                    at += 8 + vlen;
                }
            }
        }
        header::seal(&mut out, BlockType::Node);
        out
    }

    /// Decodes and validates the node a parent pointer `expected` refers to.
    pub fn decode(bytes: &[u8], expected: BlockRef) -> Result<Self, FormatError> {
        header::verify(bytes, BlockType::Node)?;
        let block = get_u64(bytes, HEADER_SIZE);
        if block != expected.block {
            return Err(FormatError::Misdirected {
                expected: expected.block,
                found: block,
            });
        }
        let txn = get_u64(bytes, HEADER_SIZE + 8);
        if txn != expected.txn {
            return Err(FormatError::Stale {
                expected: expected.txn,
                found: txn,
            });
        }
        let tree = TreeKind::from_u8(bytes[HEADER_SIZE + 16])?;
        let level = bytes[HEADER_SIZE + 17];
        if level > MAX_LEVEL {
            return Err(FormatError::Invalid(format!("node level {level}")));
        }
        let count = usize::from(u16::from_le_bytes([
            bytes[HEADER_SIZE + 18],
            bytes[HEADER_SIZE + 19],
        ]));
        let (entry_len, capacity) = if level > 0 {
            (INTERNAL_ENTRY_LEN, internal_capacity())
        } else {
            (8 + tree.value_len(), leaf_capacity(tree))
        };
        if count > capacity {
            return Err(FormatError::Invalid(format!(
                "node holds {count} entries, capacity {capacity}"
            )));
        }
        let entries = &bytes[NODE_HEADER_SIZE..NODE_HEADER_SIZE + count * entry_len];
        let mut keys = Vec::with_capacity(count);
        for entry in entries.chunks_exact(entry_len) {
            let key = get_u64(entry, 0);
            if keys.last().is_some_and(|&prev| prev >= key) {
                return Err(FormatError::Invalid(
                    "node keys are not strictly increasing".into(),
                ));
            }
            keys.push(key);
        }
        let body = if level > 0 {
            if count == 0 {
                return Err(FormatError::Invalid("empty internal node".into()));
            }
            NodeBody::Internal(
                entries
                    .chunks_exact(entry_len)
                    .map(|e| BlockRef::decode(&e[8..]))
                    .collect(),
            )
        } else {
            let mut values = Vec::with_capacity(count * tree.value_len());
            for entry in entries.chunks_exact(entry_len) {
                values.extend_from_slice(&entry[8..]);
            }
            NodeBody::Leaf(values)
        };
        Ok(Self {
            tree,
            level,
            keys,
            body,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf_with(n: usize) -> Node {
        let mut node = Node::new_leaf(TreeKind::Mapping);
        let mut values = Vec::new();
        for i in 0..n {
            node.keys.push(i as u64 * 10);
            let mut v = [0u8; MapValue::ENCODED_LEN];
            MapValue {
                pchunk: i as u64,
                len: 1,
                gen: 2,
            }
            .encode(&mut v);
            values.extend_from_slice(&v);
        }
        node.body = NodeBody::Leaf(values);
        node
    }

    #[test]
    fn leaf_round_trip_full() {
        let node = leaf_with(leaf_capacity(TreeKind::Mapping));
        let r = BlockRef { block: 40, txn: 6 };
        let bytes = node.encode(r.block, r.txn);
        assert_eq!(Node::decode(&bytes, r).unwrap(), node);
    }

    #[test]
    fn internal_round_trip() {
        let node = Node {
            tree: TreeKind::Volumes,
            level: 2,
            keys: vec![0, 5, 9],
            body: NodeBody::Internal(vec![
                BlockRef { block: 1, txn: 1 },
                BlockRef { block: 2, txn: 1 },
                BlockRef { block: 3, txn: 2 },
            ]),
        };
        let bytes = node.encode(8, 3);
        assert_eq!(
            Node::decode(&bytes, BlockRef { block: 8, txn: 3 }).unwrap(),
            node
        );
    }

    #[test]
    fn misdirected_and_stale_are_detected() {
        let bytes = leaf_with(3).encode(40, 6);
        assert!(matches!(
            Node::decode(&bytes, BlockRef { block: 41, txn: 6 }),
            Err(FormatError::Misdirected { .. })
        ));
        assert!(matches!(
            Node::decode(&bytes, BlockRef { block: 40, txn: 7 }),
            Err(FormatError::Stale { .. })
        ));
    }

    #[test]
    fn capacities_match_the_documented_format() {
        assert_eq!(internal_capacity(), 169);
        assert_eq!(leaf_capacity(TreeKind::Mapping), 126);
        assert_eq!(leaf_capacity(TreeKind::Volumes), 15);
        assert_eq!(leaf_capacity(TreeKind::Queue), 169);
        assert_eq!(leaf_capacity(TreeKind::VolumeTable), 12);
    }
}
