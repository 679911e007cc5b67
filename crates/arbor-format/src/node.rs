//! B-tree nodes. All trees share one node format: u64 keys, and either child
//! pointers (internal nodes, level > 0) or fixed-size values whose size is
//! set by the tree kind (leaves, level 0). Mapping leaves of version 6
//! pools are *packed*: the same entries in memory, variable-length records
//! on disk ([`crate::packed`]).

use crate::header::{self, BlockType, HEADER_SIZE};
use crate::packed::{self, PACKED_LEAF_MAX};
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
    /// Data checksums (version 10): leaf number → the sums of a run of
    /// chunks ([`crate::SumsLeaf`], one entry per leaf).
    Sums = 6,
    /// Data regions written in place since their sums last committed
    /// (version 10): region number → the transaction that added it.
    Intents = 7,
}

impl TreeKind {
    /// Bytes of a leaf value in memory.
    pub fn value_len(self) -> usize {
        match self {
            TreeKind::Mapping => MapValue::ENCODED_LEN,
            _ => self.fixed_value_len(),
        }
    }

    /// Bytes of a leaf value in a fixed (not packed) leaf on disk: a
    /// mapping value there has no base ([`MapValue::FIXED_LEN`]).
    pub fn fixed_value_len(self) -> usize {
        match self {
            TreeKind::Mapping => MapValue::FIXED_LEN,
            TreeKind::Volumes => VolumeRecord::ENCODED_LEN_V1,
            TreeKind::Queue => BlockRef::ENCODED_LEN,
            TreeKind::VolumeTable => VolumeRecord::ENCODED_LEN,
            TreeKind::Sums => crate::sums::SUMS_VALUE_LEN,
            TreeKind::Intents => 8,
        }
    }

    /// The tree and whether the leaf is packed, from a node's kind byte.
    fn from_u8(raw: u8) -> Result<(Self, bool), FormatError> {
        match raw {
            1 => Ok((TreeKind::Mapping, false)),
            2 => Ok((TreeKind::Volumes, false)),
            3 => Ok((TreeKind::Queue, false)),
            4 => Ok((TreeKind::VolumeTable, false)),
            6 => Ok((TreeKind::Sums, false)),
            7 => Ok((TreeKind::Intents, false)),
            PACKED_MAPPING_KIND => Ok((TreeKind::Mapping, true)),
            other => Err(FormatError::Invalid(format!("tree kind {other}"))),
        }
    }
}

/// The kind byte of a packed mapping leaf (version 6).
const PACKED_MAPPING_KIND: u8 = 5;

/// How full a node is, or may be: its entries' encoded bytes and their
/// number. A node fits its block when both are within [`Node::limit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub bytes: usize,
    pub entries: usize,
}

impl Usage {
    /// Whether `self` is within `num / den` of `limit` in both measures.
    pub fn within(self, limit: Usage, num: usize, den: usize) -> bool {
        self.bytes * den <= limit.bytes * num && self.entries * den <= limit.entries * num
    }
}

/// Most entries an internal node holds.
pub const fn internal_capacity() -> usize {
    (BLOCK_SIZE - NODE_HEADER_SIZE) / INTERNAL_ENTRY_LEN
}

/// Most entries a leaf of `tree` holds.
pub fn leaf_capacity(tree: TreeKind) -> usize {
    (BLOCK_SIZE - NODE_HEADER_SIZE) / (8 + tree.fixed_value_len())
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
    /// A mapping leaf written packed (version 6 pools); false for every
    /// other node.
    pub packed: bool,
}

impl Node {
    pub fn new_leaf(tree: TreeKind) -> Self {
        Self {
            tree,
            level: 0,
            keys: Vec::new(),
            body: NodeBody::Leaf(Vec::new()),
            packed: false,
        }
    }

    /// Whether this node is a leaf that may be written packed (a mapping
    /// leaf: the encoding serves the 24-byte mapping values only).
    pub fn packable(&self) -> bool {
        self.tree == TreeKind::Mapping && matches!(self.body, NodeBody::Leaf(_))
    }

    /// The node written packed, if it is [`Self::packable`] and fits packed.
    pub fn into_packed(mut self) -> Result<Self, Self> {
        if !self.packable() {
            return Err(self);
        }
        let was = self.packed;
        self.packed = true;
        if self.fits() {
            Ok(self)
        } else {
            self.packed = was;
            Err(self)
        }
    }

    /// Whether a mapping leaf holds a partial extent (in memory: a value
    /// whose base word is set).
    fn has_partial(&self) -> bool {
        match &self.body {
            NodeBody::Leaf(values) if self.tree == TreeKind::Mapping => values
                .chunks_exact(MapValue::ENCODED_LEN)
                .any(|v| v[MapValue::FIXED_LEN..].iter().any(|&b| b != 0)),
            _ => false,
        }
    }

    /// Its entries' size as encoded.
    pub fn usage(&self) -> Usage {
        let bytes = match &self.body {
            NodeBody::Leaf(values) if self.packed => packed::entries_len(None, &self.keys, values),
            // A fixed leaf holds no partial extent: one that has any must
            // be split until its halves are written packed.
            NodeBody::Leaf(_) if self.has_partial() => BLOCK_SIZE + 1,
            NodeBody::Leaf(_) => self.len() * (8 + self.tree.fixed_value_len()),
            NodeBody::Internal(_) => self.len() * INTERNAL_ENTRY_LEN,
        };
        Usage {
            bytes,
            entries: self.weight(),
        }
    }

    /// Its entries counted against the entry limit: one each, and two for
    /// a partial extent with middle layers in a mapping leaf
    /// ([`packed::weight`]).
    pub fn weight(&self) -> usize {
        match &self.body {
            NodeBody::Leaf(values) if self.tree == TreeKind::Mapping => packed::weight(values),
            _ => self.len(),
        }
    }

    /// The most its block holds.
    pub fn limit(&self) -> Usage {
        if self.packed {
            return Usage {
                bytes: BLOCK_SIZE - NODE_HEADER_SIZE,
                entries: PACKED_LEAF_MAX,
            };
        }
        let entry = match self.body {
            NodeBody::Internal(_) => INTERNAL_ENTRY_LEN,
            NodeBody::Leaf(_) => 8 + self.tree.fixed_value_len(),
        };
        Usage {
            bytes: self.capacity() * entry,
            entries: self.capacity(),
        }
    }

    /// Whether the node can be encoded (the B-tree splits a node that
    /// does not fit before it is written).
    pub fn fits(&self) -> bool {
        self.usage().within(self.limit(), 1, 1)
    }

    /// The usage of `self` followed by `right` as one node of `self`'s
    /// encoding (keys of `right` above those of `self`).
    pub fn merged_usage(&self, right: &Node) -> Usage {
        let entries = self.weight() + right.weight();
        let bytes = match (&self.body, &right.body) {
            (NodeBody::Leaf(a), NodeBody::Leaf(b)) if self.packed => {
                packed::entries_len(None, &self.keys, a)
                    + packed::entries_len(self.keys.last().copied(), &right.keys, b)
            }
            // Fixed entries: the same size each.
            _ => (self.len() + right.len()) * (self.limit().bytes / self.capacity().max(1)),
        };
        Usage { bytes, entries }
    }

    /// Where to split the node in two: the first entry of the upper part.
    pub fn split_point(&self) -> usize {
        match &self.body {
            NodeBody::Leaf(values) if self.packed => packed::split_point(&self.keys, values),
            _ => self.len() / 2,
        }
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Most entries the node holds (a packed leaf may hold fewer, by bytes).
    pub fn capacity(&self) -> usize {
        match self.body {
            NodeBody::Internal(_) => internal_capacity(),
            NodeBody::Leaf(_) if self.packed => PACKED_LEAF_MAX,
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
    /// The caller guarantees [`Self::fits`] (the B-tree splits first).
    pub fn encode(&self, block: u64, txn: u64) -> [u8; BLOCK_SIZE] {
        debug_assert!(self.fits());
        let mut out = [0u8; BLOCK_SIZE];
        put_u64(&mut out, HEADER_SIZE, block);
        put_u64(&mut out, HEADER_SIZE + 8, txn);
        out[HEADER_SIZE + 16] = if self.packed {
            PACKED_MAPPING_KIND
        } else {
            self.tree as u8
        };
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
            NodeBody::Leaf(values) if self.packed => {
                let len = packed::encode_entries(&self.keys, values, &mut out[at..]);
                out[HEADER_SIZE + 20..HEADER_SIZE + 24]
                    .copy_from_slice(&(len as u32).to_le_bytes());
            }
            NodeBody::Leaf(values) => {
                // `fits` holds: no value has bytes past the fixed length.
                let vlen = self.tree.value_len();
                let fixed = self.tree.fixed_value_len();
                for (key, value) in self.keys.iter().zip(values.chunks_exact(vlen)) {
                    put_u64(&mut out, at, *key);
                    out[at + 8..at + 8 + fixed].copy_from_slice(&value[..fixed]);
                    at += 8 + fixed;
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
        let (tree, packed) = TreeKind::from_u8(bytes[HEADER_SIZE + 16])?;
        let level = bytes[HEADER_SIZE + 17];
        if level > MAX_LEVEL {
            return Err(FormatError::Invalid(format!("node level {level}")));
        }
        let count = usize::from(u16::from_le_bytes([
            bytes[HEADER_SIZE + 18],
            bytes[HEADER_SIZE + 19],
        ]));
        if packed {
            if level != 0 {
                return Err(FormatError::Invalid(format!(
                    "packed node at level {level} (only leaves are packed)"
                )));
            }
            let body_len = u32::from_le_bytes([
                bytes[HEADER_SIZE + 20],
                bytes[HEADER_SIZE + 21],
                bytes[HEADER_SIZE + 22],
                bytes[HEADER_SIZE + 23],
            ]);
            let body_len = usize::try_from(body_len)
                .ok()
                .filter(|&n| n <= BLOCK_SIZE - NODE_HEADER_SIZE)
                .ok_or_else(|| FormatError::Invalid(format!("packed leaf of {body_len} bytes")))?;
            let (body, rest) = bytes[NODE_HEADER_SIZE..].split_at(body_len);
            let (keys, values) = packed::decode_entries(body, rest, count)?;
            return Ok(Self {
                tree,
                level,
                keys,
                body: NodeBody::Leaf(values),
                packed,
            });
        }
        let (entry_len, capacity) = if level > 0 {
            (INTERNAL_ENTRY_LEN, internal_capacity())
        } else {
            (8 + tree.fixed_value_len(), leaf_capacity(tree))
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
            let vlen = tree.value_len();
            let mut values = Vec::with_capacity(count * vlen);
            for entry in entries.chunks_exact(entry_len) {
                values.extend_from_slice(&entry[8..]);
                // In memory a mapping value has its base word (none here).
                values.resize(values.len() + vlen - (entry_len - 8), 0);
            }
            NodeBody::Leaf(values)
        };
        Ok(Self {
            tree,
            level,
            keys,
            body,
            packed,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packed::MAX_PACKED_ENTRY;

    fn leaf_with(n: usize) -> Node {
        let mut node = Node::new_leaf(TreeKind::Mapping);
        let mut values = Vec::new();
        for i in 0..n {
            node.keys.push(i as u64 * 10);
            let mut v = [0u8; MapValue::ENCODED_LEN];
            MapValue::whole(i as u64, 1, 2).encode(&mut v);
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
            packed: false,
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

    fn mapping(key_values: &[(u64, MapValue, u32)]) -> Node {
        let mut node = Node::new_leaf(TreeKind::Mapping);
        let mut values = Vec::new();
        for (key, v, word) in key_values {
            node.keys.push(*key);
            let mut raw = [0u8; MapValue::ENCODED_LEN];
            v.encode(&mut raw);
            raw[12..16].copy_from_slice(&word.to_le_bytes());
            values.extend_from_slice(&raw);
        }
        node.body = NodeBody::Leaf(values);
        node.packed = true;
        node
    }

    fn map(pchunk: u64, len: u32, gen: u64) -> MapValue {
        MapValue::whole(pchunk, len, gen)
    }

    #[test]
    fn packed_leaf_round_trips_and_is_smaller() {
        let node = mapping(&[
            (0, map(7, 1, 1), 0),
            (1, map(3, 256, 9), 0),
            (900, map(u64::MAX, 3, u64::MAX), u32::MAX),
            (u64::MAX - 1, map(0, 1, 0), 5),
            (u64::MAX, map(1 << 40, 1, 1 << 20), 0),
        ]);
        assert!(node.fits());
        let r = BlockRef { block: 40, txn: 6 };
        let bytes = node.encode(r.block, r.txn);
        assert_eq!(bytes[HEADER_SIZE + 16], PACKED_MAPPING_KIND);
        assert_eq!(Node::decode(&bytes, r).unwrap(), node);
        // One byte of head, pchunk and gen each for a dense run.
        let dense = mapping(&[(10, map(5, 1, 3), 0), (11, map(6, 1, 3), 0)]);
        assert_eq!(dense.usage().bytes, 1 + 1 + 1 + 3);
        assert!(node.clone().into_packed().is_ok());
    }

    #[test]
    fn a_full_packed_leaf_round_trips() {
        let entries: Vec<_> = (0..PACKED_LEAF_MAX as u64)
            .map(|i| (i * 3, map(100_000 + (i * 7919) % 65_536, 1, 4_000 + i), 0))
            .collect();
        let node = mapping(&entries);
        assert!(node.fits(), "{:?}", node.usage());
        let r = BlockRef { block: 9, txn: 9 };
        assert_eq!(Node::decode(&node.encode(9, 9), r).unwrap(), node);
        let mut over = entries.clone();
        over.push((PACKED_LEAF_MAX as u64 * 3, map(1, 1, 1), 0));
        assert!(!mapping(&over).fits(), "one entry too many");
    }

    fn partial(pchunk: u64, mask: u32, base: u64, gen: u64) -> MapValue {
        MapValue {
            partial: Some(crate::Partial::over(mask, base)),
            ..MapValue::whole(pchunk, 1, gen)
        }
    }

    #[test]
    fn partial_extents_round_trip_packed_and_never_fixed() {
        let node = mapping(&[
            (0, map(7, 3, 1), 0),
            (5, partial(8, 0b0010, 0, 2), 0b0010),
            (
                6,
                partial(u64::MAX, u32::MAX, u64::MAX - 1, u64::MAX),
                u32::MAX,
            ),
            (7, map(9, 1, 2), 0),
        ]);
        assert!(node.fits());
        let r = BlockRef { block: 40, txn: 6 };
        let decoded = Node::decode(&node.encode(r.block, r.txn), r).unwrap();
        assert_eq!(decoded, node);
        assert_eq!(
            MapValue::decode(decoded.value(1)).unwrap(),
            partial(8, 0b0010, 0, 2)
        );
        // head, len 0, mask, pchunk, gen, base: one byte each.
        let one = mapping(&[(5, partial(8, 0b0010, 0, 2), 0b0010)]);
        assert_eq!(one.usage().bytes, 6);
        // A fixed leaf has no room for a base: it must split until packed.
        let mut fixed = one.clone();
        fixed.packed = false;
        assert!(!fixed.fits());
        let mut whole = mapping(&[(5, map(8, 1, 2), 0)]);
        whole.packed = false;
        assert!(whole.fits());
        let r = BlockRef { block: 41, txn: 6 };
        assert_eq!(
            Node::decode(&whole.encode(r.block, r.txn), r).unwrap(),
            whole
        );
    }

    #[test]
    fn a_partial_without_a_mask_or_with_a_base_past_the_last_chunk_is_refused() {
        let r = BlockRef { block: 40, txn: 6 };
        let leaf = |entry: &[u8]| {
            let mut b = [0u8; BLOCK_SIZE];
            put_u64(&mut b, HEADER_SIZE, r.block);
            put_u64(&mut b, HEADER_SIZE + 8, r.txn);
            b[HEADER_SIZE + 16] = PACKED_MAPPING_KIND;
            b[HEADER_SIZE + 18] = 1;
            b[HEADER_SIZE + 20] = entry.len() as u8;
            b[NODE_HEADER_SIZE..NODE_HEADER_SIZE + entry.len()].copy_from_slice(entry);
            header::seal(&mut b, BlockType::Node);
            Node::decode(&b, r)
        };
        // Key 0, len flag: len 0, pchunk 8, gen 2, base 1 (no word).
        assert!(leaf(&[0b01, 0, 8, 2, 1]).is_err());
        // With a mask of 2 it is a partial.
        let ok = leaf(&[0b11, 0, 2, 8, 2, 1]).unwrap();
        assert_eq!(MapValue::decode(ok.value(0)).unwrap(), partial(8, 2, 1, 2));
        // A base of u64::MAX (ten bytes of LEB128).
        let mut far = vec![0b11, 0, 2, 8, 2];
        far.extend_from_slice(&[0xff; 9]);
        far.push(0x01);
        assert!(leaf(&far).is_err());
        // Version 8: the word 2 | 1 << 32 says one middle layer, which
        // follows the base: chunk 5, mask 4.
        let word = [0x82, 0x80, 0x80, 0x80, 0x10];
        let mut one = vec![0b11, 0];
        one.extend_from_slice(&word);
        one.extend_from_slice(&[8, 2, 1, 5, 4]);
        let got = MapValue::decode(leaf(&one).unwrap().value(0)).unwrap();
        assert_eq!(
            got.partial.unwrap(),
            crate::Partial {
                mask: 2,
                mids: [Some(crate::Layer { chunk: 5, mask: 4 }), None],
                base: 1
            }
        );
        // A layer without a mask, a layer missing, three layers.
        let mut bad = one.clone();
        *bad.last_mut().unwrap() = 0;
        assert!(leaf(&bad).is_err());
        assert!(leaf(&one[..one.len() - 2]).is_err());
        let mut three = one.clone();
        three[6] = 0x30;
        three.extend_from_slice(&[6, 8, 7, 16]);
        assert!(leaf(&three).is_err());
        // A word past 34 bits.
        let mut wide = one.clone();
        wide[6] = 0x40;
        assert!(leaf(&wide).is_err());
    }

    #[test]
    fn partials_with_middle_layers_round_trip_and_weigh_two() {
        let layered = |pchunk: u64, gen: u64, far: u64| MapValue {
            partial: Some(crate::Partial {
                mask: 0b0001,
                mids: [
                    Some(crate::Layer {
                        chunk: pchunk + 1,
                        mask: 0b0010,
                    }),
                    Some(crate::Layer {
                        chunk: far,
                        mask: 0b0100,
                    }),
                ],
                base: pchunk + 2,
            }),
            ..MapValue::whole(pchunk, 1, gen)
        };
        let node = mapping(&[
            (0, map(7, 3, 1), 0),
            (5, layered(100, 2, u64::MAX - 1), 1),
            (6, partial(8, 0b0010, 0, 2), 0b0010),
        ]);
        assert_eq!(node.weight(), 4);
        assert_eq!(node.usage().entries, 4);
        let r = BlockRef { block: 40, txn: 6 };
        let decoded = Node::decode(&node.encode(r.block, r.txn), r).unwrap();
        assert_eq!(decoded, node);
        assert_eq!(
            MapValue::decode(decoded.value(1)).unwrap(),
            layered(100, 2, u64::MAX - 1)
        );
        // A leaf of layered partials holds half as many.
        let half: Vec<_> = (0..PACKED_LEAF_MAX as u64 / 2)
            .map(|i| (i, layered(1000 + i * 3, 9, 7), 1))
            .collect();
        let full = mapping(&half);
        assert!(full.fits(), "{:?}", full.usage());
        let r = BlockRef { block: 41, txn: 9 };
        assert_eq!(Node::decode(&full.encode(r.block, r.txn), r).unwrap(), full);
        let mut over = half.clone();
        over.push((PACKED_LEAF_MAX as u64, map(1, 1, 1), 0));
        assert!(!mapping(&over).fits());
    }

    #[test]
    fn only_mapping_leaves_are_packed() {
        let mut queue = Node::new_leaf(TreeKind::Queue);
        queue.keys.push(1);
        queue.body = NodeBody::Leaf(vec![0; 16]);
        assert!(queue.into_packed().is_err());
        // A fixed leaf whose packed entries would not fit stays fixed.
        let wide: Vec<_> = (0..leaf_capacity(TreeKind::Mapping) as u64)
            .map(|i| (i << 50, map(u64::MAX - i, 200, u64::MAX), u32::MAX))
            .collect();
        let mut fixed = mapping(&wide);
        fixed.packed = false;
        assert!(fixed.fits());
        assert!(fixed.into_packed().is_err());
    }

    /// Flips the kind byte, count or length fields and re-seals: every
    /// damaged form is an error, never a panic or a different node.
    #[test]
    fn damaged_packed_leaves_are_refused() {
        let node = mapping(&[(4, map(7, 2, 1), 0), (9, map(300, 1, 2), 3)]);
        let good = node.encode(40, 6);
        let r = BlockRef { block: 40, txn: 6 };
        let reseal = |f: &dyn Fn(&mut [u8; BLOCK_SIZE])| {
            let mut b = good;
            f(&mut b);
            header::seal(&mut b, BlockType::Node);
            Node::decode(&b, r)
        };
        // Packed internal node.
        assert!(reseal(&|b| b[HEADER_SIZE + 17] = 1).is_err());
        // More entries than the bytes hold, fewer, a length past the block.
        assert!(reseal(&|b| b[HEADER_SIZE + 18] = 3).is_err());
        assert!(reseal(&|b| b[HEADER_SIZE + 18] = 1).is_err());
        assert!(reseal(&|b| b[HEADER_SIZE + 21] = 0x10).is_err());
        // A byte after the last entry.
        assert!(reseal(&|b| b[BLOCK_SIZE - 1] = 1).is_err());
        // A length of 1 written out (not the shortest form).
        let ones = mapping(&[(4, map(7, 2, 1), 0)]);
        let mut b = ones.encode(40, 6);
        let len_at = NODE_HEADER_SIZE + 1;
        assert_eq!(b[len_at], 2);
        b[len_at] = 1;
        header::seal(&mut b, BlockType::Node);
        assert!(Node::decode(&b, r).is_err());
        // A number with a needless continuation byte.
        let mut b = [0u8; BLOCK_SIZE];
        b.copy_from_slice(&ones.encode(40, 6));
        let at = NODE_HEADER_SIZE;
        let body: Vec<u8> = b[at..at + 4].to_vec();
        let mut longer = vec![body[0] | 0x80, 0];
        longer.extend_from_slice(&body[1..]);
        b[at..at + 5].copy_from_slice(&longer);
        b[HEADER_SIZE + 20] = 5;
        header::seal(&mut b, BlockType::Node);
        assert!(Node::decode(&b, r).is_err());
        // Keys past 2^64.
        let top = mapping(&[(u64::MAX, map(1, 1, 1), 0)]);
        let mut b = top.encode(40, 6);
        b[HEADER_SIZE + 18] = 2;
        let n = usize::from(b[HEADER_SIZE + 20]);
        b[NODE_HEADER_SIZE + n..NODE_HEADER_SIZE + n + 3].copy_from_slice(&[0, 1, 1]);
        b[HEADER_SIZE + 20] = (n + 3) as u8;
        header::seal(&mut b, BlockType::Node);
        assert!(Node::decode(&b, r).is_err());
    }

    proptest::proptest! {
        /// Any mapping leaf that fits round-trips, its usage is the bytes
        /// written, removing entries never makes it larger, and both sides of
        /// its split point fit.
        #[test]
        fn packed_leaves_round_trip(
            raw in proptest::collection::btree_map(
                proptest::prelude::any::<u64>(),
                (proptest::prelude::any::<u64>(), 1u32..=256, proptest::prelude::any::<u64>(),
                 proptest::prop_oneof![proptest::strategy::Just(0u32), proptest::prelude::any::<u32>()]),
                1..500,
            ),
            remove in proptest::prelude::any::<proptest::sample::Index>(),
        ) {
            let entries: Vec<_> = raw.iter().map(|(k, (p, l, g, w))| (*k, map(*p, *l, *g), *w)).collect();
            let node = mapping(&entries);
            let r = BlockRef { block: 3, txn: 4 };
            if node.fits() {
                let bytes = node.encode(3, 4);
                let used = u32::from_le_bytes(bytes[HEADER_SIZE + 20..HEADER_SIZE + 24].try_into().unwrap());
                proptest::prop_assert_eq!(used as usize, node.usage().bytes);
                proptest::prop_assert_eq!(Node::decode(&bytes, r).unwrap(), node.clone());
            }
            let mut less = entries.clone();
            less.remove(remove.index(less.len()));
            proptest::prop_assert!(mapping(&less).usage().bytes < node.usage().bytes);
            if node.len() >= 2 {
                let at = node.split_point();
                proptest::prop_assert!(at >= 1 && at < node.len());
                let lower = mapping(&entries[..at]);
                let upper = mapping(&entries[at..]);
                let half = node.usage().bytes / 2 + MAX_PACKED_ENTRY + 10;
                proptest::prop_assert!(lower.usage().bytes <= half);
                proptest::prop_assert!(upper.usage().bytes <= half);
                proptest::prop_assert_eq!(lower.merged_usage(&upper), node.usage());
            }
        }
    }

    #[test]
    fn capacities_match_the_documented_format() {
        assert_eq!(internal_capacity(), 169);
        assert_eq!(leaf_capacity(TreeKind::Mapping), 126);
        assert_eq!(leaf_capacity(TreeKind::Volumes), 15);
        assert_eq!(leaf_capacity(TreeKind::Queue), 169);
        assert_eq!(leaf_capacity(TreeKind::VolumeTable), 12);
        assert_eq!(leaf_capacity(TreeKind::Sums), 1);
        assert_eq!(leaf_capacity(TreeKind::Intents), 253);
    }
}
