//! Copy-on-write B-trees over u64 keys with reference-counted, shared nodes
//! (Rodeh, "B-trees, shadowing, and clones").
//!
//! A tree is named by its root [`BlockRef`]; `BlockRef::NONE` is the empty
//! tree. [`Tree`] reads one (get-less-or-equal, predecessor search, range
//! iteration); [`TreeMut`] changes one (insert, remove, remove a key range,
//! share, release), borrowing the transaction: every change shadows the
//! path from the root (see [`Meta::shadow`]) and moves the tree's root;
//! nodes shared with other trees are never modified in place. The
//! transaction's node API (allocate, shadow, take and put back a dirty
//! node, add and drop node references) is private to `meta` and this
//! module, so no other layer can change a node.
//!
//! Invariants checked by `check` and relied on here:
//! * keys in a node are strictly increasing; child `i` of an internal node
//!   holds only keys in `[keys[i], keys[i + 1])` (for `i = 0`, from the
//!   parent's lower bound);
//! * a child's level is its parent's level minus one; leaves are level 0;
//! * no node is empty (empty nodes are removed, an internal root with one
//!   child is replaced by the child).

use arbor_format::{BlockRef, Node, NodeBody, TreeKind, Usage, MAX_LEVEL};

use crate::error::{Error, Result};
use crate::meta::{Meta, NodeView};
use crate::walk::{walk, Descend, Place, Visitor};

/// The most bytes [`TreeMut::update_spans`] logs span by span; a change of
/// more logs a copy of the whole leaf.
pub(crate) const PATCH_BYTES_MAX: usize = 256;

/// Index of the child of an internal node whose range holds `key`.
fn child_index(keys: &[u64], key: u64) -> usize {
    keys.partition_point(|&k| k <= key).saturating_sub(1)
}

fn children(node: &Node) -> Result<&Vec<BlockRef>> {
    match &node.body {
        NodeBody::Internal(c) => Ok(c),
        NodeBody::Leaf(_) => Err(Error::inconsistent("expected an internal node")),
    }
}

fn children_mut(node: &mut Node) -> Result<&mut Vec<BlockRef>> {
    match &mut node.body {
        NodeBody::Internal(c) => Ok(c),
        NodeBody::Leaf(_) => Err(Error::inconsistent("expected an internal node")),
    }
}

fn leaf_values_mut(node: &mut Node) -> Result<&mut Vec<u8>> {
    match &mut node.body {
        NodeBody::Leaf(v) => Ok(v),
        NodeBody::Internal(_) => Err(Error::inconsistent("expected a leaf")),
    }
}

/// Checks the level step from a parent to a child read from disk, so a
/// damaged pool cannot send a descent into a cycle.
fn check_child_level(parent: &Node, child: &Node, tree: TreeKind) -> Result<()> {
    if child.level + 1 != parent.level || child.tree != tree {
        return Err(Error::inconsistent(format!(
            "child node at level {} ({:?}) under a level-{} {:?} node",
            child.level, child.tree, parent.level, tree
        )));
    }
    Ok(())
}

/// Moves the upper half of an overfull node into a new node value (half
/// by bytes for a packed leaf). Both halves fit: an overfull node is over
/// by one entry at most.
fn split_off_upper(meta: &Meta, node: &mut Node) -> Result<Node> {
    let at = node.split_point();
    let upper = split_off_upper_at(node, at);
    if !meta.node_fits(node) || !meta.node_fits(&upper) {
        return Err(Error::inconsistent(format!(
            "a split node's halves do not fit: {:?} and {:?}",
            node.usage(),
            upper.usage()
        )));
    }
    Ok(upper)
}

/// Bytes packed-leaf entry `i` of `node` takes after the entry keyed `prev`.
fn entry_bytes(node: &Node, i: usize, prev: Option<u64>) -> usize {
    let vlen = node.tree.value_len();
    match &node.body {
        NodeBody::Leaf(values) => {
            arbor_format::packed_entry_len(prev, node.keys[i], &values[i * vlen..(i + 1) * vlen])
        }
        NodeBody::Internal(_) => 0,
    }
}

/// Moves the entries of `node` from `at` on into a new node value.
fn split_off_upper_at(node: &mut Node, at: usize) -> Node {
    let keys = node.keys.split_off(at);
    let body = match &mut node.body {
        NodeBody::Internal(c) => NodeBody::Internal(c.split_off(at)),
        NodeBody::Leaf(v) => NodeBody::Leaf(v.split_off(at * node.tree.value_len())),
    };
    Node {
        tree: node.tree,
        level: node.level,
        keys,
        body,
        packed: node.packed,
    }
}

/// What [`TreeMut::remove_range`] took out of a tree.
pub(crate) struct RangeRemoval {
    /// Entries removed from leaves the range bounds cut, in key order.
    pub removed: Vec<(u64, Vec<u8>)>,
    /// Subtrees wholly inside the range, detached unread: the caller owns
    /// one reference to each.
    pub detached: Vec<BlockRef>,
}

/// A leaf entry found by [`Tree::get_le`]: its key, value bytes, and
/// the exclusive upper bound of the key range its leaf covers.
pub(crate) struct Found {
    pub key: u64,
    pub value: Vec<u8>,
    pub leaf_upper: u64,
}

/// The entries of neighbouring leaves `left` and `right` divided anew,
/// half each by bytes, each keeping its encoding; `None` when they are
/// not both leaves or a half would be more than 15/16 full (room for
/// the next inserts, which would otherwise spill straight back).
fn rebalanced(meta: &Meta, left: BlockRef, right: BlockRef) -> Result<Option<(Node, Node)>> {
    let (l, r) = (meta.node(left)?, meta.node(right)?);
    if l.level != 0 || r.level != 0 {
        return Ok(None);
    }
    let mut all: Node = (*l).clone();
    all.keys.extend_from_slice(&r.keys);
    if let (NodeBody::Leaf(a), NodeBody::Leaf(b)) = (&mut all.body, &r.body) {
        a.extend_from_slice(b);
    }
    let at = all.split_point();
    if at == 0 || at >= all.len() {
        return Ok(None);
    }
    let mut upper = split_off_upper_at(&mut all, at);
    upper.packed = r.packed;
    let room = |n: &Node| n.usage().within(meta.node_limit(n), 15, 16);
    Ok((room(&all) && room(&upper)).then_some((all, upper)))
}

/// Read access to one B-tree: the transaction it lives in, its kind and its
/// root (`BlockRef::NONE`: the empty tree). Copying it copies the borrow.
#[derive(Clone, Copy)]
pub(crate) struct Tree<'a> {
    meta: &'a Meta,
    kind: TreeKind,
    root: BlockRef,
}

impl<'a> Tree<'a> {
    pub fn new(meta: &'a Meta, kind: TreeKind, root: BlockRef) -> Self {
        Self { meta, kind, root }
    }

    /// The transaction the tree lives in.
    pub fn meta(&self) -> &'a Meta {
        self.meta
    }

    pub fn root(&self) -> BlockRef {
        self.root
    }

    /// The entry with the greatest key ≤ `key` *within the leaf whose range
    /// holds `key`* (an entry in an earlier leaf is not returned: mapping
    /// extents never cross their leaf's upper bound, so it cannot cover `key`).
    pub fn get_le(&self, key: u64) -> Result<Option<Found>> {
        self.get_le_with(key, |found, value, leaf_upper| Found {
            key: found,
            value: value.to_vec(),
            leaf_upper,
        })
    }

    /// [`Self::get_le`] without copying the value: `f` gets the entry's
    /// key, its value as the node holds it, and the leaf's upper bound.
    pub fn get_le_with<T>(
        &self,
        key: u64,
        f: impl FnOnce(u64, &[u8], u64) -> T,
    ) -> Result<Option<T>> {
        Ok(self
            .find_le(key)?
            .map(|(leaf, i, upper)| f(leaf.keys[i], leaf.value(i), upper)))
    }

    /// `f` of the value of `key` as the node holds it (not copied), or of
    /// None if the tree has no entry `key`.
    pub fn get_with<T>(&self, key: u64, f: impl FnOnce(Option<&[u8]>) -> T) -> Result<T> {
        Ok(match self.find_le(key)? {
            Some((leaf, i, _)) if leaf.keys[i] == key => f(Some(leaf.value(i))),
            _ => f(None),
        })
    }

    /// The leaf whose range holds `key`, the index in it of the entry with
    /// the greatest key ≤ `key`, and the leaf's upper bound; None if the
    /// leaf has no such entry.
    fn find_le(&self, key: u64) -> Result<Option<(NodeView<'a>, usize, u64)>> {
        if self.root.is_none() {
            return Ok(None);
        }
        let mut upper = u64::MAX;
        let mut node = self.meta.node(self.root)?;
        let tree = node.tree;
        loop {
            let child = match &node.body {
                NodeBody::Leaf(_) => {
                    let i = node.keys.partition_point(|&k| k <= key);
                    return Ok(i.checked_sub(1).map(|i| (node, i, upper)));
                }
                NodeBody::Internal(children) => {
                    let i = child_index(&node.keys, key);
                    if let Some(&next) = node.keys.get(i + 1) {
                        upper = upper.min(next);
                    }
                    let child = self.meta.node(children[i])?;
                    check_child_level(&node, &child, tree)?;
                    child
                }
            };
            node = child;
        }
    }

    /// The entry with the greatest key ≤ `key` anywhere in the tree (unlike
    /// [`Self::get_le`], which looks only in the leaf whose range holds
    /// `key`): snapshot stores key an entry by its first epoch, and the
    /// entry covering an epoch may sit in an earlier leaf. Reads at most two
    /// paths: a subtree that holds nothing ≤ `key` is the one whose range
    /// holds it, and the one before it is non-empty and wholly below.
    pub fn get_below(&self, key: u64) -> Result<Option<(u64, Vec<u8>)>> {
        if self.root.is_none() {
            return Ok(None);
        }
        let node = self.meta.node(self.root)?;
        let tree = node.tree;
        self.get_below_in(&node, tree, key)
    }

    fn get_below_in(
        &self,
        node: &Node,
        tree: TreeKind,
        key: u64,
    ) -> Result<Option<(u64, Vec<u8>)>> {
        match &node.body {
            NodeBody::Leaf(_) => {
                let i = node.keys.partition_point(|&k| k <= key);
                Ok((i > 0).then(|| (node.keys[i - 1], node.value(i - 1).to_vec())))
            }
            NodeBody::Internal(children) => {
                let at = child_index(&node.keys, key);
                for i in (0..=at).rev() {
                    let child = self.meta.node(children[i])?;
                    check_child_level(node, &child, tree)?;
                    if let Some(found) = self.get_below_in(&child, tree, key)? {
                        return Ok(Some(found));
                    }
                }
                Ok(None)
            }
        }
    }

    /// Calls `f(key, value)` for each leaf entry with key in `[from, to)`, in
    /// order, until `f` returns false.
    pub fn for_each(
        &self,
        from: u64,
        to: u64,
        f: &mut dyn FnMut(u64, &[u8]) -> Result<bool>,
    ) -> Result<()> {
        /// Visits the leaves that overlap `[from, to)`.
        struct InRange<'f> {
            from: u64,
            to: u64,
            f: &'f mut dyn FnMut(u64, &[u8]) -> Result<bool>,
        }
        impl Visitor for InRange<'_> {
            fn keys(&self) -> Option<std::ops::Range<u64>> {
                Some(self.from..self.to)
            }
            fn visit(&mut self, _r: BlockRef, node: &Node, _at: &Place) -> Result<Descend> {
                if let NodeBody::Leaf(_) = node.body {
                    let start = node.keys.partition_point(|&k| k < self.from);
                    for i in start..node.len() {
                        if node.keys[i] >= self.to || !(self.f)(node.keys[i], node.value(i))? {
                            return Ok(Descend::Stop);
                        }
                    }
                }
                Ok(Descend::Children)
            }
        }
        if from >= to {
            return Ok(());
        }
        let meta = self.meta;
        walk(
            &|r| meta.node(r),
            self.root,
            self.kind,
            &mut InRange { from, to, f },
        )
        .map(|_| ())
    }

    /// The smallest key in the tree and its value.
    pub fn first(&self) -> Result<Option<(u64, Vec<u8>)>> {
        let mut first = None;
        self.for_each(0, u64::MAX, &mut |k, v| {
            first = Some((k, v.to_vec()));
            Ok(false)
        })?;
        Ok(first)
    }
}

/// A B-tree being changed in the open transaction: the only code that
/// changes nodes (through the transaction's node API, private to `meta`
/// and this module). Every change shadows the path from the root (see
/// [`Meta::shadow`]) and moves the root; nodes shared with other trees are
/// never modified in place. A change that fails leaves the root as it was
/// (the caller's step then undoes whatever it did below).
pub(crate) struct TreeMut<'a> {
    meta: &'a mut Meta,
    kind: TreeKind,
    root: BlockRef,
}

impl<'a> TreeMut<'a> {
    pub fn new(meta: &'a mut Meta, kind: TreeKind, root: BlockRef) -> Self {
        Self { meta, kind, root }
    }

    /// The tree's root after the changes so far.
    pub fn root(&self) -> BlockRef {
        self.root
    }

    /// The tree as it is now, to read.
    pub fn read(&self) -> Tree<'_> {
        Tree::new(self.meta, self.kind, self.root)
    }

    /// The transaction, to read.
    pub fn meta(&self) -> &Meta {
        self.meta
    }

    /// The transaction, for the layers above to count the references their
    /// entries hold (its node API stays private).
    pub fn meta_mut(&mut self) -> &mut Meta {
        self.meta
    }

    /// Adds a reference to the tree (a snapshot or clone shares it; the
    /// empty tree needs none).
    pub fn share(&mut self) -> Result<()> {
        if self.root.is_none() {
            return Ok(());
        }
        self.meta.inc_node(self.root)
    }

    /// Drops one reference to the tree's root node. If it was the last, the
    /// node is freed and returned: the caller then owns one reference to
    /// each of its children (internal) or to each of its values' data
    /// (mapping leaf), and drops them.
    pub fn release(self) -> Result<Option<Node>> {
        let r = self.root;
        if self.meta.meta_count(r.block)? > 1 {
            self.meta.dec_node_shallow(r)?;
            return Ok(None);
        }
        let node = self.meta.node(r)?.clone();
        self.meta.dec_node_shallow(r)?;
        Ok(Some(node))
    }

    /// Changes the value of `key` where the leaf holds it (the path
    /// shadowed, nothing copied out and back), with `f`; None, and nothing
    /// shadowed, if the tree has no entry `key`. The value keeps its length;
    /// a packed leaf's byte count is worked out again when next needed.
    pub fn update<T>(&mut self, key: u64, f: impl FnOnce(&mut [u8]) -> T) -> Result<Option<T>> {
        self.update_within(key, None, f)
    }

    /// [`Self::update`] where `f` changes only the bytes `spans` of the
    /// value (offsets into it): a rollback then needs only those bytes
    /// back, so they are what the open step logs instead of a copy of the
    /// whole leaf (a checksum leaf is 4 KiB; a 4 KiB write changes five
    /// bytes of it). Spans of more than [`PATCH_BYTES_MAX`] bytes in all
    /// log the leaf as [`Self::update`] does.
    pub fn update_spans<T>(
        &mut self,
        key: u64,
        spans: &[std::ops::Range<usize>],
        f: impl FnOnce(&mut [u8]) -> T,
    ) -> Result<Option<T>> {
        let bytes: usize = spans.iter().map(|s| s.len()).sum();
        let spans = (bytes <= PATCH_BYTES_MAX).then_some(spans);
        self.update_within(key, spans, f)
    }

    fn update_within<T>(
        &mut self,
        key: u64,
        spans: Option<&[std::ops::Range<usize>]>,
        f: impl FnOnce(&mut [u8]) -> T,
    ) -> Result<Option<T>> {
        if !self.read().get_with(key, |v| v.is_some())? {
            return Ok(None);
        }
        let (root, out) = self.update_rec(self.root, key, spans, f)?;
        self.root = root;
        Ok(Some(out))
    }

    fn update_rec<T>(
        &mut self,
        r: BlockRef,
        key: u64,
        spans: Option<&[std::ops::Range<usize>]>,
        f: impl FnOnce(&mut [u8]) -> T,
    ) -> Result<(BlockRef, T)> {
        let r = self.meta.shadow(r)?;
        // An internal node changes only if its child moves (the child was
        // shadowed now): a path already this transaction's own is walked,
        // not copied for the step's undo log.
        let down = {
            let node = self.meta.node(r)?;
            if node.level == 0 {
                None
            } else {
                let i = child_index(&node.keys, key);
                Some((i, children(&node)?[i]))
            }
        };
        if let Some((i, child)) = down {
            let (moved, out) = self.update_rec(child, key, spans, f)?;
            if moved != child {
                self.meta.leaf_bytes.remove(&r.block);
                let mut node = self.meta.take_dirty(r)?;
                let set = children_mut(&mut node).map(|c| c[i] = moved);
                self.meta.put_dirty(r, node);
                set?;
            }
            return Ok((r, out));
        }
        if let Some(spans) = spans {
            let value = {
                let node = self.meta.node(r)?;
                let vlen = node.tree.value_len();
                match node.keys.binary_search(&key) {
                    Ok(i) => i * vlen..(i + 1) * vlen,
                    Err(_) => {
                        return Err(Error::inconsistent(format!(
                            "entry {key} found, then not in its leaf"
                        )))
                    }
                }
            };
            let out = self.meta.patch_dirty(r, value, spans, f)?;
            return Ok((r, out));
        }
        self.meta.leaf_bytes.remove(&r.block);
        let mut node = self.meta.take_dirty(r)?;
        let vlen = node.tree.value_len();
        let result = match node.keys.binary_search(&key) {
            Ok(i) => leaf_values_mut(&mut node).map(|v| f(&mut v[i * vlen..(i + 1) * vlen])),
            Err(_) => Err(Error::inconsistent(format!(
                "entry {key} found, then not in its leaf"
            ))),
        };
        self.meta.put_dirty(r, node);
        Ok((r, result?))
    }

    /// Inserts or replaces `key`.
    pub fn insert(&mut self, key: u64, value: &[u8]) -> Result<()> {
        debug_assert_eq!(value.len(), self.kind.value_len());
        if self.root.is_none() {
            let mut leaf = Node::new_leaf(self.kind);
            leaf.keys.push(key);
            leaf.body = NodeBody::Leaf(value.to_vec());
            self.root = self.meta.alloc_node(leaf)?;
            return Ok(());
        }
        let (left, overfull) = self.insert_rec(self.root, key, value)?;
        if !overfull {
            self.root = left;
            return Ok(());
        }
        let (separator, right) = self.split_dirty(left)?;
        let level = self.meta.node(left)?.level + 1;
        let first_key = self.meta.node(left)?.keys[0].min(key);
        self.root = self.meta.alloc_node(Node {
            tree: self.kind,
            level,
            keys: vec![first_key, separator],
            body: NodeBody::Internal(vec![left, right]),
            packed: false,
        })?;
        Ok(())
    }

    /// Inserts into the subtree at `r`; returns its new ref (dirty) and
    /// whether that node is now overfull (over by one entry at most): its
    /// parent moves entries to a sibling or splits it.
    fn insert_rec(&mut self, r: BlockRef, key: u64, value: &[u8]) -> Result<(BlockRef, bool)> {
        let r = self.meta.shadow(r)?;
        let known = self.meta.leaf_bytes.remove(&r.block);
        let mut node = self.meta.take_dirty(r)?;
        let result = self.insert_into(&mut node, key, value, known);
        let (overfull, bytes) = match result {
            Ok(Some(bytes)) => {
                let usage = Usage {
                    bytes,
                    entries: node.weight(),
                };
                (
                    !usage.within(self.meta.node_limit(&node), 1, 1),
                    Some(bytes),
                )
            }
            _ => (!self.meta.node_fits(&node), None),
        };
        self.meta.put_dirty(r, node);
        result?;
        if let (false, Some(bytes)) = (overfull, bytes) {
            self.meta.leaf_bytes.insert(r.block, bytes);
        }
        Ok((r, overfull))
    }

    /// Splits the overfull dirty node `r`; returns the separator key and
    /// the new upper node.
    fn split_dirty(&mut self, r: BlockRef) -> Result<(u64, BlockRef)> {
        let mut node = self.meta.take_dirty(r)?;
        let upper = split_off_upper(self.meta, &mut node);
        self.meta.put_dirty(r, node);
        let upper = upper?;
        let separator = upper.keys[0];
        Ok((separator, self.meta.alloc_node(upper)?))
    }

    /// Shares the entries of the overfull leaf child `i` of `parent` with
    /// a neighbour that is not shared, half each by bytes, when each half
    /// then fills at most 15/16 of a leaf, as B*-trees do: leaves stay fuller under random
    /// inserts than splitting alone leaves them (about 70 %), and metadata
    /// per mapped chunk follows. Returns whether it did. A shared neighbour
    /// is left alone (shadowing it would copy its references).
    fn spill(&mut self, parent: &mut Node, i: usize) -> Result<bool> {
        let kids = children(parent)?.clone();
        for j in [
            i.checked_sub(1),
            i.checked_add(1).filter(|&j| j < kids.len()),
        ]
        .into_iter()
        .flatten()
        {
            if self.meta.meta_count(kids[j].block)? > 1 {
                continue;
            }
            let (left, right) = (kids[i.min(j)], kids[i.max(j)]);
            let Some((lower, upper)) = rebalanced(self.meta, left, right)? else {
                continue;
            };
            let sib = self.meta.shadow(kids[j])?;
            children_mut(parent)?[j] = sib;
            let (left, right) = if j < i {
                (sib, kids[i])
            } else {
                (kids[i], sib)
            };
            let separator = upper.keys[0];
            self.meta.take_dirty(left)?;
            self.meta.put_dirty(left, lower);
            self.meta.take_dirty(right)?;
            self.meta.put_dirty(right, upper);
            parent.keys[i.max(j)] = separator;
            return Ok(true);
        }
        Ok(false)
    }

    /// Inserts into `node` (dirty); for a packed leaf returns its encoded
    /// bytes afterwards, worked out from `known` (its bytes before, when
    /// known) and the entries the insert changes.
    fn insert_into(
        &mut self,
        node: &mut Node,
        key: u64,
        value: &[u8],
        known: Option<usize>,
    ) -> Result<Option<usize>> {
        if node.level == 0 {
            let vlen = node.tree.value_len();
            let pos = node.keys.binary_search(&key);
            let bytes = node.packed.then(|| {
                let before = known.unwrap_or_else(|| node.usage().bytes);
                let i = pos.unwrap_or_else(|i| i);
                let prev = i.checked_sub(1).map(|j| node.keys[j]);
                let added = arbor_format::packed_entry_len(prev, key, value);
                match pos {
                    Ok(i) => before - entry_bytes(node, i, prev) + added,
                    Err(i) if i < node.len() => {
                        before + added + entry_bytes(node, i, Some(key))
                            - entry_bytes(node, i, prev)
                    }
                    Err(_) => before + added,
                }
            });
            let values = leaf_values_mut(node)?;
            match pos {
                Ok(i) => values[i * vlen..(i + 1) * vlen].copy_from_slice(value),
                Err(i) => {
                    values.splice(i * vlen..i * vlen, value.iter().copied());
                    node.keys.insert(i, key);
                }
            }
            debug_assert!(bytes.is_none_or(|b| b == node.usage().bytes));
            return Ok(bytes);
        }
        let i = child_index(&node.keys, key);
        if key < node.keys[0] {
            node.keys[0] = key;
        }
        let child = children(node)?[i];
        let (child, overfull) = self.insert_rec(child, key, value)?;
        children_mut(node)?[i] = child;
        if overfull && !self.spill(node, i)? {
            let (separator, right) = self.split_dirty(child)?;
            children_mut(node)?.insert(i + 1, right);
            node.keys.insert(i + 1, separator);
        }
        Ok(None)
    }

    /// Removes `key` if present; returns the removed value.
    pub fn remove(&mut self, key: u64) -> Result<Option<Vec<u8>>> {
        match self.read().get_le(key)? {
            Some(found) if found.key == key => {}
            _ => return Ok(None),
        }
        let (new_root, value) = self.remove_rec(self.root, key)?;
        self.root = match new_root {
            Some(new_root) => self.collapse_root(new_root)?,
            None => BlockRef::NONE,
        };
        Ok(Some(value))
    }

    /// Removes every entry with a key in `[from, to)`, touching only the
    /// nodes whose key range the bounds cut: at most two root-to-leaf paths
    /// are shadowed, whatever the size of the range. A subtree whose whole
    /// key range lies inside `[from, to)` is detached without being read:
    /// its reference passes to the caller (in [`RangeRemoval::detached`]),
    /// who must drop it. Leaves only lose entries, so nothing splits.
    pub fn remove_range(&mut self, from: u64, to: u64) -> Result<RangeRemoval> {
        let mut out = RangeRemoval {
            removed: Vec::new(),
            detached: Vec::new(),
        };
        let root = self.root;
        if root.is_none() || from >= to {
            return Ok(out);
        }
        let level = self.meta.node(root)?.level;
        if level > MAX_LEVEL {
            return Err(Error::inconsistent("tree too deep"));
        }
        self.root = match self.remove_range_rec(root, 0, u64::MAX, from, to, &mut out)? {
            Some(r) => self.collapse_root(r)?,
            None => BlockRef::NONE,
        };
        Ok(out)
    }

    /// [`Self::remove_range`] below `r`, whose key range is `[lo, hi)`.
    /// `None` when nothing is left of the subtree (its reference was dropped
    /// or detached).
    fn remove_range_rec(
        &mut self,
        r: BlockRef,
        lo: u64,
        hi: u64,
        from: u64,
        to: u64,
        out: &mut RangeRemoval,
    ) -> Result<Option<BlockRef>> {
        if from <= lo && hi <= to {
            out.detached.push(r);
            return Ok(None);
        }
        let r = self.meta.shadow(r)?;
        let mut node = self.meta.take_dirty(r)?;
        let result = self.remove_range_from(&mut node, lo, hi, from, to, out);
        let empty = node.is_empty();
        self.meta.put_dirty(r, node);
        result?;
        if empty {
            self.meta.dec_node_shallow(r)?;
            return Ok(None);
        }
        Ok(Some(r))
    }

    fn remove_range_from(
        &mut self,
        node: &mut Node,
        lo: u64,
        hi: u64,
        from: u64,
        to: u64,
        out: &mut RangeRemoval,
    ) -> Result<()> {
        if node.level == 0 {
            let vlen = node.tree.value_len();
            let first = node.keys.partition_point(|&k| k < from);
            let end = node.keys.partition_point(|&k| k < to);
            let values = leaf_values_mut(node)?;
            let removed: Vec<u8> = values.drain(first * vlen..end * vlen).collect();
            for (key, value) in node.keys.drain(first..end).zip(removed.chunks_exact(vlen)) {
                out.removed.push((key, value.to_vec()));
            }
            return Ok(());
        }
        let mut i = 0;
        // Children the bounds cut (shadowed, so they may merge below).
        let mut cut = Vec::new();
        while i < node.len() {
            let child_lo = if i == 0 { lo } else { node.keys[i] };
            let child_hi = node.keys.get(i + 1).copied().unwrap_or(hi);
            if child_hi <= from || child_lo >= to {
                i += 1;
                continue;
            }
            let child = children(node)?[i];
            if from > child_lo || child_hi > to {
                // Only a child the bounds cut is read; check its level.
                let child_node = self.meta.node(child)?;
                check_child_level(node, &child_node, node.tree)?;
            }
            match self.remove_range_rec(child, child_lo, child_hi, from, to, out)? {
                Some(c) => {
                    children_mut(node)?[i] = c;
                    cut.push(c);
                    i += 1;
                }
                None => {
                    children_mut(node)?.remove(i);
                    node.keys.remove(i);
                }
            }
        }
        for c in cut {
            if let Some(at) = children(node)?.iter().position(|&x| x == c) {
                self.merge_if_underfull(node, at)?;
            }
        }
        Ok(())
    }

    /// Replaces an internal root with a single child by that child, as long
    /// as there is one; the child's reference passes from the root to the
    /// tree itself.
    fn collapse_root(&mut self, mut new_root: BlockRef) -> Result<BlockRef> {
        loop {
            let only_child = {
                let node = self.meta.node(new_root)?;
                match &node.body {
                    NodeBody::Internal(c) if c.len() == 1 => c[0],
                    _ => break,
                }
            };
            // The tree now references the child directly. If the old root is
            // still referenced elsewhere, it keeps its own reference to the child.
            if self.meta.meta_count(new_root.block)? > 1 {
                self.meta.inc_node(only_child)?;
            }
            self.meta.dec_node_shallow(new_root)?;
            new_root = only_child;
        }
        Ok(new_root)
    }

    /// Removes `key` (known present) below `r`; `None` when the node emptied
    /// and was freed.
    fn remove_rec(&mut self, r: BlockRef, key: u64) -> Result<(Option<BlockRef>, Vec<u8>)> {
        let r = self.meta.shadow(r)?;
        let known = self.meta.leaf_bytes.remove(&r.block);
        let mut node = self.meta.take_dirty(r)?;
        // A packed leaf's bytes after the removal, if they were known.
        let bytes = match (
            node.level,
            node.packed,
            known,
            node.keys.binary_search(&key),
        ) {
            (0, true, Some(before), Ok(i)) => {
                let prev = i.checked_sub(1).map(|j| node.keys[j]);
                let next = if i + 1 < node.len() {
                    entry_bytes(&node, i + 1, prev) - entry_bytes(&node, i + 1, Some(key))
                } else {
                    0
                };
                // Removing never makes a leaf larger (FORMAT.md §6.2).
                Some(before + next - entry_bytes(&node, i, prev))
            }
            _ => None,
        };
        let removed = self.remove_from(&mut node, key);
        let empty = node.is_empty();
        debug_assert!(removed.is_err() || bytes.is_none_or(|b| b == node.usage().bytes));
        self.meta.put_dirty(r, node);
        let value = removed?;
        if let Some(bytes) = bytes {
            self.meta.leaf_bytes.insert(r.block, bytes);
        }
        if empty {
            self.meta.dec_node_shallow(r)?;
            return Ok((None, value));
        }
        Ok((Some(r), value))
    }

    fn remove_from(&mut self, node: &mut Node, key: u64) -> Result<Vec<u8>> {
        if node.level == 0 {
            let vlen = node.tree.value_len();
            let i = node
                .keys
                .binary_search(&key)
                .map_err(|_| Error::inconsistent(format!("key {key} vanished during removal")))?;
            node.keys.remove(i);
            return Ok(leaf_values_mut(node)?
                .drain(i * vlen..(i + 1) * vlen)
                .collect());
        }
        let i = child_index(&node.keys, key);
        let child = children(node)?[i];
        let (child, value) = self.remove_rec(child, key)?;
        match child {
            Some(c) => {
                children_mut(node)?[i] = c;
                self.merge_if_underfull(node, i)?;
            }
            None => {
                children_mut(node)?.remove(i);
                node.keys.remove(i);
            }
        }
        Ok(value)
    }

    /// Merges child `i` of `parent` with a neighbour when it has fallen below
    /// a quarter full and both fit comfortably in one node, so trees shrink
    /// as entries are removed instead of keeping many nearly empty nodes.
    /// Child `i` was just shadowed (dirty, single reference). Fullness is
    /// by entries and by bytes (packed leaves), and the merged node is
    /// measured as it would be written (the left one's encoding).
    fn merge_if_underfull(&mut self, parent: &mut Node, i: usize) -> Result<()> {
        let kids = children(parent)?;
        let underfull = {
            let child = self.meta.node(kids[i])?;
            let limit = self.meta.node_limit(&child);
            // Entries first: only a leaf with few entries is measured.
            child.len() < limit.entries / 4 && child.usage().bytes < limit.bytes / 4
        };
        if !underfull || kids.len() < 2 {
            return Ok(());
        }
        let (left, right) = if i + 1 < kids.len() {
            (i, i + 1)
        } else {
            (i - 1, i)
        };
        {
            let (l, r) = (self.meta.node(kids[left])?, self.meta.node(kids[right])?);
            if !l.merged_usage(&r).within(self.meta.node_limit(&l), 3, 4) {
                return Ok(());
            }
        }
        let left_ref = self.meta.shadow(kids[left])?;
        let right_ref = self.meta.shadow(kids[right])?;
        let right_node = self.meta.take_dirty(right_ref)?;
        let mut left_node = self.meta.take_dirty(left_ref)?;
        left_node.keys.extend_from_slice(&right_node.keys);
        let merged = match (&mut left_node.body, &right_node.body) {
            (NodeBody::Internal(a), NodeBody::Internal(b)) => {
                a.extend_from_slice(b);
                Ok(())
            }
            (NodeBody::Leaf(a), NodeBody::Leaf(b)) => {
                a.extend_from_slice(b);
                Ok(())
            }
            _ => Err(Error::inconsistent("siblings of different levels")),
        };
        self.meta.put_dirty(left_ref, left_node);
        // The right node's entries (and the references they hold) now live in
        // the left node: free the right node without touching its children.
        self.meta.put_dirty(right_ref, right_node);
        merged?;
        self.meta.dec_node_shallow(right_ref)?;
        let kids = children_mut(parent)?;
        kids[left] = left_ref;
        kids.remove(right);
        parent.keys.remove(right);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use arbor_format::{leaf_capacity, BlockRef, TreeKind};
    use proptest::prelude::*;
    use rand::rngs::StdRng;
    use rand::seq::SliceRandom;
    use rand::{Rng, SeedableRng};

    use super::{child_index, RangeRemoval, Tree, TreeMut};
    use crate::meta::Meta;
    use crate::testing::{check_refs, check_tree, drop_tree, fresh_meta, Shape};

    /// Volume-table leaves hold 15 entries of 248 bytes, so a few thousand
    /// keys make a three-level tree (internal nodes hold 169 children).
    const KIND: TreeKind = TreeKind::Volumes;

    type Model = BTreeMap<u64, Vec<u8>>;

    /// A value that names its key and a version tag.
    fn val(key: u64, tag: u8) -> Vec<u8> {
        let mut v = vec![tag; KIND.value_len()];
        v[..8].copy_from_slice(&key.to_le_bytes());
        v
    }

    fn insert(meta: &mut Meta, root: BlockRef, key: u64, value: &[u8]) -> BlockRef {
        let mut tree = TreeMut::new(meta, KIND, root);
        tree.insert(key, value).unwrap();
        tree.root()
    }

    fn remove(meta: &mut Meta, root: BlockRef, key: u64) -> (BlockRef, Option<Vec<u8>>) {
        let mut tree = TreeMut::new(meta, KIND, root);
        let value = tree.remove(key).unwrap();
        (tree.root(), value)
    }

    fn remove_range(
        meta: &mut Meta,
        root: BlockRef,
        from: u64,
        to: u64,
    ) -> (BlockRef, RangeRemoval) {
        let mut tree = TreeMut::new(meta, KIND, root);
        let removal = tree.remove_range(from, to).unwrap();
        (tree.root(), removal)
    }

    fn contents(meta: &Meta, root: BlockRef, from: u64, to: u64) -> Vec<(u64, Vec<u8>)> {
        let mut out = Vec::new();
        Tree::new(meta, KIND, root)
            .for_each(from, to, &mut |k, v| {
                out.push((k, v.to_vec()));
                Ok(true)
            })
            .unwrap();
        out
    }

    fn model_range(model: &Model, from: u64, to: u64) -> Vec<(u64, Vec<u8>)> {
        model
            .range(from..to)
            .map(|(k, v)| (*k, v.clone()))
            .collect()
    }

    /// Full check of one unshared tree against its model: structure,
    /// contents in order, and reference counts (the tree is the only
    /// holder of metadata references in `meta`).
    /// The tree at `root` is sound and holds exactly `model` (it may share
    /// nodes with other trees).
    fn assert_holds(meta: &Meta, root: BlockRef, model: &Model) -> Shape {
        let shape = check_tree(meta, root, KIND);
        assert_eq!(
            contents(meta, root, 0, u64::MAX),
            model_range(model, 0, u64::MAX)
        );
        shape
    }

    fn check_against(meta: &Meta, root: BlockRef, model: &Model) -> Shape {
        let shape = assert_holds(meta, root, model);
        assert_eq!(shape.entries(), model.len());
        assert_eq!(root.is_none(), model.is_empty());
        let refs = check_refs(meta, &[root], 0);
        assert_eq!(refs.nodes, shape.nodes);
        shape
    }

    fn insert_all(
        meta: &mut Meta,
        keys: &[u64],
        model: &mut Model,
        commit_every: usize,
    ) -> BlockRef {
        let mut root = BlockRef::NONE;
        for (n, &k) in keys.iter().enumerate() {
            root = insert(meta, root, k, &val(k, 1));
            model.insert(k, val(k, 1));
            if commit_every > 0 && n % commit_every == commit_every - 1 {
                meta.commit().unwrap();
            }
        }
        root
    }

    /// A step that fails is undone exactly, whatever it did to nodes made
    /// dirty before it or left clean: inserts of new keys and over existing
    /// ones, removals, and the splits and merges among them, in any order
    /// and any number on one leaf.
    #[test]
    fn a_failed_step_puts_back_every_node_it_changed() {
        let mut rng = StdRng::seed_from_u64(45);
        for round in 0..60 {
            let mut meta = fresh_meta();
            let mut model = Model::new();
            let mut keys: Vec<u64> = (0..400).map(|_| rng.gen_range(0..3000)).collect();
            keys.sort_unstable();
            keys.dedup();
            keys.shuffle(&mut rng);
            let commit_every = if round % 2 == 0 { 0 } else { 150 };
            let mut root = insert_all(&mut meta, &keys, &mut model, commit_every);
            // Some leaves dirty before the step, others clean.
            for _ in 0..20 {
                let k = rng.gen_range(0..3000);
                root = insert(&mut meta, root, k, &val(k, 2));
                model.insert(k, val(k, 2));
            }
            let step = meta.begin_step(crate::meta::Privilege::Normal);
            let mut r = root;
            for _ in 0..rng.gen_range(1..80) {
                let k = rng.gen_range(0..3000);
                if rng.gen_bool(0.75) {
                    r = insert(&mut meta, r, k, &val(k, 3));
                } else {
                    r = remove(&mut meta, r, k).0;
                }
            }
            let failed: crate::error::Result<()> = Err(crate::error::Resource::Metadata.into());
            assert!(meta.end_step(step, failed).is_err());
            check_against(&meta, root, &model);
        }
    }

    #[test]
    fn child_index_routes_by_lower_bounds() {
        let keys = [10, 20, 30];
        assert_eq!(child_index(&keys, 0), 0);
        assert_eq!(child_index(&keys, 10), 0);
        assert_eq!(child_index(&keys, 19), 0);
        assert_eq!(child_index(&keys, 20), 1);
        assert_eq!(child_index(&keys, 99), 2);
    }

    /// Enough inserts, in ascending, descending and random order (the last
    /// with commits in between, so clean nodes are shadowed too), split
    /// leaves and internal nodes into a three-level tree; every key is then
    /// found, ranges list exactly the model's keys in order, lookups of
    /// absent keys return at most their predecessor, and the space map
    /// counts exactly the tree's nodes.
    #[test]
    fn inserts_split_nodes_and_every_key_stays_findable() {
        let n = 3000u64;
        let ascending: Vec<u64> = (0..n).map(|i| i * 2).collect();
        let descending: Vec<u64> = ascending.iter().rev().copied().collect();
        let mut random = ascending.clone();
        random.shuffle(&mut StdRng::seed_from_u64(7));
        for (keys, commit_every) in [(ascending, 0), (descending, 0), (random, 700)] {
            let mut meta = fresh_meta();
            let mut model = Model::new();
            let root = insert_all(&mut meta, &keys, &mut model, commit_every);
            let shape = check_against(&meta, root, &model);
            assert!(
                shape.level >= Some(2),
                "leaves and internal nodes split: level {:?}",
                shape.level
            );
            assert!(shape.leaves.len() > arbor_format::internal_capacity());
            for &k in &keys {
                let found = Tree::new(&meta, KIND, root)
                    .get_le(k)
                    .unwrap()
                    .expect("key present");
                assert_eq!((found.key, found.value), (k, val(k, 1)));
                assert!(found.leaf_upper > k);
                // Odd keys are absent: at most their predecessor is found.
                let probe = k + 1;
                if let Some(found) = Tree::new(&meta, KIND, root).get_le(probe).unwrap() {
                    assert_eq!(found.key, k);
                    assert!(found.leaf_upper > probe);
                }
            }
            assert_eq!(
                Tree::new(&meta, KIND, root).first().unwrap(),
                model.iter().next().map(|(k, v)| (*k, v.clone()))
            );
            let mut rng = StdRng::seed_from_u64(8);
            for _ in 0..50 {
                let a = rng.gen_range(0..2 * n + 10);
                let b = rng.gen_range(a..2 * n + 10);
                assert_eq!(contents(&meta, root, a, b), model_range(&model, a, b));
            }
            // for_each stops when told to.
            let mut seen = 0;
            Tree::new(&meta, KIND, root)
                .for_each(0, u64::MAX, &mut |_, _| {
                    seen += 1;
                    Ok(seen < 10)
                })
                .unwrap();
            assert_eq!(seen, 10);
            // Replacing values splits nothing.
            let mut root = root;
            for &k in keys.iter().step_by(3) {
                root = insert(&mut meta, root, k, &val(k, 2));
                model.insert(k, val(k, 2));
            }
            let replaced = check_against(&meta, root, &model);
            assert_eq!(replaced.nodes, shape.nodes);
        }
    }

    /// Removing every key in random order (with commits in between) returns
    /// each value, merges underfull nodes so the tree loses nodes and
    /// levels as it empties, keeps every node non-empty, and ends with the
    /// empty tree and no metadata block in use.
    #[test]
    fn removals_merge_nodes_until_the_tree_is_empty() {
        let mut meta = fresh_meta();
        let mut model = Model::new();
        let mut keys: Vec<u64> = (0..3000).map(|i| i * 3).collect();
        let mut rng = StdRng::seed_from_u64(11);
        keys.shuffle(&mut rng);
        let mut root = insert_all(&mut meta, &keys, &mut model, 0);
        let full = check_against(&meta, root, &model);
        assert_eq!(full.level, Some(2));
        keys.shuffle(&mut rng);
        let mut last_level = full.level;
        for (n, &k) in keys.iter().enumerate() {
            // An absent key changes nothing.
            let (same, none) = remove(&mut meta, root, k + 1);
            assert_eq!((same, none), (root, None));
            let (r, value) = remove(&mut meta, root, k);
            root = r;
            assert_eq!(value, model.remove(&k));
            let left = model.len();
            if left.is_multiple_of(100) || left < 40 {
                let shape = check_against(&meta, root, &model);
                assert!(shape.level <= last_level, "removal added a level");
                last_level = shape.level;
                // Merging keeps the leaves from staying nearly empty: with
                // a tenth of the keys left, well under half the leaves remain.
                if left == 300 {
                    assert!(
                        shape.leaves.len() * 2 < full.leaves.len(),
                        "{} leaves of {} left for {left} keys",
                        shape.leaves.len(),
                        full.leaves.len()
                    );
                }
                if left <= leaf_capacity(KIND) * 3 / 4 {
                    assert!(
                        shape.level <= Some(1),
                        "{left} keys at level {:?}",
                        shape.level
                    );
                }
            }
            if n % 700 == 699 {
                meta.commit().unwrap();
            }
        }
        assert_eq!(root, BlockRef::NONE);
        assert_eq!(meta.used(arbor_format::SmKind::Meta), 0);
        assert_eq!(remove(&mut meta, root, 3), (BlockRef::NONE, None));
    }

    /// Checks one `TreeMut::remove_range` against the model: what it returns
    /// (entries cut from boundary leaves plus detached subtrees, which the
    /// test then drops) is exactly the model's range, the tree keeps the
    /// rest, and no node is left empty or leaked.
    fn remove_range_checked(
        meta: &mut Meta,
        root: BlockRef,
        model: &mut Model,
        from: u64,
        to: u64,
    ) -> (BlockRef, usize, usize) {
        let expected = model_range(model, from, to);
        let (root, removal) = remove_range(meta, root, from, to);
        let mut taken = removal.removed.clone();
        for &subtree in &removal.detached {
            assert!(!subtree.is_none());
            taken.extend(contents(meta, subtree, 0, u64::MAX));
        }
        taken.sort_by_key(|(k, _)| *k);
        assert_eq!(taken, expected, "entries taken out of [{from}, {to})");
        model.retain(|k, _| !(from..to).contains(k));
        for &subtree in &removal.detached {
            drop_tree(meta, subtree);
        }
        check_against(meta, root, model);
        (root, removal.removed.len(), removal.detached.len())
    }

    /// Range removals whose bounds fall inside leaves (so both boundary
    /// leaves lose only some entries) take out exactly the model's range,
    /// whether the range lies in one leaf, spans two, or spans whole
    /// subtrees (which are detached); prefixes, suffixes and the whole key
    /// space work too, and the tree keeps its invariants throughout.
    #[test]
    fn remove_range_cutting_leaves_matches_the_model() {
        let mut meta = fresh_meta();
        let mut model = Model::new();
        let mut keys: Vec<u64> = (0..4000).map(|i| i * 2).collect();
        keys.shuffle(&mut StdRng::seed_from_u64(5));
        let mut root = insert_all(&mut meta, &keys, &mut model, 1000);
        meta.commit().unwrap();
        // Interior points of leaves: the second key of leaf `i`.
        let inner = |meta: &Meta, root: BlockRef, i: usize| -> u64 {
            let shape = check_tree(meta, root, KIND);
            let leaf = &shape.leaves[i.min(shape.leaves.len() - 1)];
            assert!(leaf.keys.len() >= 2);
            leaf.keys[1]
        };
        // Within one leaf.
        let from = inner(&meta, root, 10);
        let (r, cut, detached) = remove_range_checked(&mut meta, root, &mut model, from, from + 1);
        root = r;
        assert_eq!((cut, detached), (1, 0));
        // Across two neighbouring leaves.
        let (from, to) = (inner(&meta, root, 20), inner(&meta, root, 21));
        let (r, cut, detached) = remove_range_checked(&mut meta, root, &mut model, from, to);
        root = r;
        assert!(cut >= 2);
        assert_eq!(detached, 0);
        // Across many leaves and whole subtrees, bounds inside leaves.
        let (from, to) = (inner(&meta, root, 30), inner(&meta, root, 250));
        let (r, cut, detached) = remove_range_checked(&mut meta, root, &mut model, from, to);
        root = r;
        assert!(cut >= 2 && detached > 0, "cut {cut}, detached {detached}");
        meta.commit().unwrap();
        // A range holding no key, an empty range, then a prefix and a suffix.
        let k = *model.keys().nth(100).unwrap();
        let (r, cut, detached) = remove_range_checked(&mut meta, root, &mut model, k + 1, k + 2);
        root = r;
        assert_eq!((cut, detached), (0, 0));
        let (r, cut, detached) = remove_range_checked(&mut meta, root, &mut model, k, k);
        root = r;
        assert_eq!((cut, detached), (0, 0));
        let to = inner(&meta, root, 5);
        root = remove_range_checked(&mut meta, root, &mut model, 0, to).0;
        let from = inner(&meta, root, 60);
        root = remove_range_checked(&mut meta, root, &mut model, from, u64::MAX).0;
        assert!(!model.is_empty());
        root = remove_range_checked(&mut meta, root, &mut model, 0, u64::MAX).0;
        assert_eq!(root, BlockRef::NONE);
        assert_eq!(meta.used(arbor_format::SmKind::Meta), 0);
    }

    /// A second reference to a root (what a snapshot takes) shares the
    /// whole tree; changing either copy afterwards (inserts, replacements,
    /// removals, range removals) shadows the nodes it touches and leaves
    /// the other copy's contents unchanged, and the reference counts stay
    /// exact. Dropping one copy leaves the other intact and alone.
    /// `update` changes a value where its leaf holds it: in an unshared
    /// tree as insert would, in a shared one on its own copy of the path
    /// (the other tree unchanged), and not at all, nothing shadowed, for a
    /// key the tree does not hold.
    #[test]
    fn update_changes_a_value_in_place_and_only_one_that_exists() {
        let mut meta = fresh_meta();
        let mut model = Model::new();
        let mut keys: Vec<u64> = (0..2000).map(|i| i * 5).collect();
        keys.shuffle(&mut StdRng::seed_from_u64(9));
        let a = insert_all(&mut meta, &keys, &mut model, 0);
        meta.commit().unwrap();
        let update = |meta: &mut Meta, root: BlockRef, key: u64, to: u8| {
            let mut tree = TreeMut::new(meta, KIND, root);
            let got = tree
                .update(key, |v| {
                    v.fill(to);
                    v.len()
                })
                .unwrap();
            (tree.root(), got)
        };
        // Absent: nothing shadowed (a shadowed root, clean since the
        // commit, would have moved).
        let (root, got) = update(&mut meta, a, 7, 1);
        assert_eq!((root, got), (a, None));
        TreeMut::new(&mut meta, KIND, a).share().unwrap();
        let mut b = a;
        let mut model_b = model.clone();
        for &k in keys.iter().take(300) {
            let (root, got) = update(&mut meta, b, k, 0xEE);
            assert_eq!(got, Some(KIND.value_len()));
            b = root;
            model_b.insert(k, vec![0xEE; KIND.value_len()]);
        }
        assert_ne!(a, b);
        assert_holds(&meta, a, &model);
        assert_holds(&meta, b, &model_b);
        check_refs(&meta, &[a, b], 0);
    }

    #[test]
    fn a_shared_tree_is_copied_on_write() {
        for commit_first in [false, true] {
            let mut meta = fresh_meta();
            let mut model_a = Model::new();
            let mut keys: Vec<u64> = (0..1500).map(|i| i * 4).collect();
            keys.shuffle(&mut StdRng::seed_from_u64(3));
            let a = insert_all(&mut meta, &keys, &mut model_a, 0);
            if commit_first {
                meta.commit().unwrap();
            }
            let nodes = check_against(&meta, a, &model_a).nodes;
            TreeMut::new(&mut meta, KIND, a).share().unwrap();
            let (mut b, mut model_b) = (a, model_a.clone());
            assert_eq!(check_refs(&meta, &[a, b], 0).nodes, nodes);

            // Change b only.
            let mut rng = StdRng::seed_from_u64(4);
            for _ in 0..200 {
                let k = rng.gen_range(0..7000u64);
                b = insert(&mut meta, b, k, &val(k, 9));
                model_b.insert(k, val(k, 9));
            }
            for _ in 0..200 {
                let k = rng.gen_range(0..1500u64) * 4;
                let (r, v) = remove(&mut meta, b, k);
                b = r;
                assert_eq!(v, model_b.remove(&k));
            }
            let (root, removal) = remove_range(&mut meta, b, 1001, 3001);
            b = root;
            for &subtree in &removal.detached {
                drop_tree(&mut meta, subtree);
            }
            model_b.retain(|k, _| !(1001..3001).contains(k));
            assert_ne!(a, b);
            assert_holds(&meta, a, &model_a);
            assert_holds(&meta, b, &model_b);
            let shared = check_refs(&meta, &[a, b], 0).nodes;
            assert!(shared < 2 * nodes, "the copies still share untouched nodes");

            // Now change a: b does not see it.
            let mut a = a;
            for k in (0..6000).step_by(7) {
                a = insert(&mut meta, a, k, &val(k, 5));
                model_a.insert(k, val(k, 5));
            }
            assert_holds(&meta, a, &model_a);
            assert_holds(&meta, b, &model_b);
            check_refs(&meta, &[a, b], 0);

            // Dropping b leaves a whole and the only user of the space map.
            drop_tree(&mut meta, b);
            check_against(&meta, a, &model_a);
            drop_tree(&mut meta, a);
            assert_eq!(meta.used(arbor_format::SmKind::Meta), 0);
        }
    }

    /// Sharing a tree adds one reference to its root and nothing else;
    /// releasing a reference while another is left frees nothing, and
    /// releasing the last one frees the root alone and hands its children's
    /// references to the caller. The empty tree is shared for free.
    #[test]
    fn share_and_release_count_references() {
        let mut meta = fresh_meta();
        let mut model = Model::new();
        let keys: Vec<u64> = (0..600).collect();
        let root = insert_all(&mut meta, &keys, &mut model, 0);
        meta.commit().unwrap();
        let nodes = check_against(&meta, root, &model).nodes;
        TreeMut::new(&mut meta, KIND, BlockRef::NONE)
            .share()
            .unwrap();
        TreeMut::new(&mut meta, KIND, root).share().unwrap();
        assert_eq!(meta.meta_count(root.block).unwrap(), 2);
        assert_eq!(check_refs(&meta, &[root, root], 0).nodes, nodes);
        let released = TreeMut::new(&mut meta, KIND, root).release().unwrap();
        assert!(released.is_none(), "another reference is left");
        let shape = check_against(&meta, root, &model);
        assert_eq!(shape.nodes, nodes);
        let used = meta.used(arbor_format::SmKind::Meta);
        let node = TreeMut::new(&mut meta, KIND, root)
            .release()
            .unwrap()
            .expect("the last reference frees the root");
        assert_eq!(meta.used(arbor_format::SmKind::Meta), used - 1);
        assert_eq!(meta.meta_count(root.block).unwrap(), 0);
        let arbor_format::NodeBody::Internal(children) = &node.body else {
            panic!("600 volume records take more than one leaf");
        };
        assert_eq!(check_refs(&meta, children, 0).nodes, nodes - 1);
        for &child in children {
            drop_tree(&mut meta, child);
        }
        assert_eq!(meta.used(arbor_format::SmKind::Meta), 0);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u64, u8),
        InsertRun(u64, u64),
        Remove(u64),
        RemoveRange(u64, u64),
        Commit,
        /// Share the current tree, as a snapshot does, and keep the copy.
        Share,
        /// Drop the oldest kept copy.
        DropShared,
    }

    const KEYS: u64 = 1000;

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (0..KEYS, any::<u8>()).prop_map(|(k, t)| Op::Insert(k, t)),
            3 => (0..KEYS, 1..120u64).prop_map(|(k, n)| Op::InsertRun(k, n)),
            4 => (0..KEYS).prop_map(Op::Remove),
            2 => (0..KEYS, 0..300u64).prop_map(|(k, n)| Op::RemoveRange(k, k + n)),
            1 => Just(Op::Commit),
            1 => Just(Op::Share),
            1 => Just(Op::DropShared),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: 64,
            failure_persistence: None,
            ..ProptestConfig::default()
        })]

        /// Random inserts, removals, range removals, commits and shared
        /// copies keep the tree equal to a BTreeMap, every kept copy equal
        /// to its model at the time it was shared, the structure valid and
        /// the reference counts exact; dropping everything frees every node.
        #[test]
        fn tree_operations_match_a_btreemap_model(ops in proptest::collection::vec(op(), 1..150)) {
            let mut meta = fresh_meta();
            let mut root = BlockRef::NONE;
            let mut model = Model::new();
            let mut shared: Vec<(BlockRef, Model)> = Vec::new();
            for (n, op) in ops.iter().enumerate() {
                match *op {
                    Op::Insert(k, t) => {
                        root = insert(&mut meta, root, k, &val(k, t));
                        model.insert(k, val(k, t));
                    }
                    Op::InsertRun(k, len) => {
                        for k in k..k + len {
                            root = insert(&mut meta, root, k, &val(k, 0));
                            model.insert(k, val(k, 0));
                        }
                    }
                    Op::Remove(k) => {
                        let (r, v) = remove(&mut meta, root, k);
                        root = r;
                        prop_assert_eq!(v, model.remove(&k));
                    }
                    Op::RemoveRange(from, to) => {
                        let expected = model_range(&model, from, to);
                        let (new_root, removal) = remove_range(&mut meta, root, from, to);
                        let mut taken = removal.removed.clone();
                        for &subtree in &removal.detached {
                            taken.extend(contents(&meta, subtree, 0, u64::MAX));
                            drop_tree(&mut meta, subtree);
                        }
                        taken.sort_by_key(|(k, _)| *k);
                        prop_assert_eq!(taken, expected);
                        root = new_root;
                        model.retain(|k, _| !(from..to).contains(k));
                    }
                    Op::Commit => meta.commit().unwrap(),
                    Op::Share => {
                        if shared.len() < 3 && !root.is_none() {
                            TreeMut::new(&mut meta, KIND, root).share().unwrap();
                            shared.push((root, model.clone()));
                        }
                    }
                    Op::DropShared => {
                        if !shared.is_empty() {
                            let (r, _) = shared.remove(0);
                            drop_tree(&mut meta, r);
                        }
                    }
                }
                prop_assert_eq!(
                    contents(&meta, root, 0, u64::MAX),
                    model_range(&model, 0, u64::MAX)
                );
                if n % 10 == 9 || n + 1 == ops.len() {
                    let shape = check_tree(&meta, root, KIND);
                    prop_assert_eq!(shape.entries(), model.len());
                    let mut roots = vec![root];
                    for (r, m) in &shared {
                        check_tree(&meta, *r, KIND);
                        prop_assert_eq!(contents(&meta, *r, 0, u64::MAX), model_range(m, 0, u64::MAX));
                        roots.push(*r);
                    }
                    check_refs(&meta, &roots, 0);
                }
            }
            drop_tree(&mut meta, root);
            for (r, _) in shared {
                drop_tree(&mut meta, r);
            }
            prop_assert_eq!(meta.used(arbor_format::SmKind::Meta), 0);
        }
    }
}
