//! The one tree walker. Every walk over a B-tree (range iteration, the
//! changed-since and exclusive-space walks, `check`) goes through [`walk`],
//! which reads each node, verifies it against where its parent puts it
//! ([`verify`]: kind, level, key range, key order, not empty) and hands it
//! to a [`Visitor`] that decides what to skip. A damaged pool therefore
//! cannot send any walk into a cycle, past the deepest possible tree, or
//! outside a parent's key range unnoticed. The diff's two-tree merge walks
//! lazily and calls [`verify`] itself.

use std::ops::{Deref, Range};

use arbor_format::{BlockRef, Node, NodeBody, TreeKind, MAX_LEVEL};

use crate::error::{Error, Result};

/// Where a node sits in its tree: the kind and level its parent expects
/// (`None` for a root) and the key range `[lo, hi)` its parent gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Place {
    pub tree: TreeKind,
    pub level: Option<u8>,
    pub lo: u64,
    pub hi: u64,
}

impl Place {
    /// The root of a tree of kind `tree`, holding every key.
    pub fn root(tree: TreeKind) -> Self {
        Self {
            tree,
            level: None,
            lo: 0,
            hi: u64::MAX,
        }
    }

    /// Where child `i` of `node` (at this place) sits.
    pub fn child(&self, node: &Node, i: usize) -> Self {
        Self {
            tree: self.tree,
            level: Some(node.level.saturating_sub(1)),
            lo: if i == 0 {
                self.lo
            } else {
                node.keys[i].max(self.lo)
            },
            hi: node.keys.get(i + 1).map_or(self.hi, |&k| k.min(self.hi)),
        }
    }
}

/// What is wrong with a node, as [`verify`] finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Damage {
    /// The node cannot be read as the node its parent names (wrong kind or
    /// level): nothing below it can be trusted, so the walk does not descend.
    pub structural: bool,
    pub what: String,
}

/// Checks `node` (block `block`) against `at`; returns every problem found.
pub(crate) fn verify(block: u64, node: &Node, at: &Place) -> Vec<Damage> {
    let mut found = Vec::new();
    let mut problem = |structural, what: String| found.push(Damage { structural, what });
    if node.tree != at.tree || at.level.is_some_and(|l| l != node.level) {
        problem(
            true,
            format!(
                "node {block} is a level-{} {:?} node where a level-{:?} {:?} node belongs",
                node.level, node.tree, at.level, at.tree
            ),
        );
        return found;
    }
    if node.level > MAX_LEVEL {
        problem(true, format!("node {block} is at level {}", node.level));
        return found;
    }
    let internal = matches!(node.body, NodeBody::Internal(_));
    if internal != (node.level > 0) {
        problem(
            true,
            format!(
                "node {block} is {} at level {}",
                if internal { "internal" } else { "a leaf" },
                node.level
            ),
        );
        return found;
    }
    if node.is_empty() {
        problem(false, format!("node {block} is empty"));
    }
    if node.keys.windows(2).any(|w| w[0] >= w[1]) {
        problem(false, format!("node {block} has keys out of order"));
    }
    if node.keys.iter().any(|&k| k < at.lo || k >= at.hi) {
        problem(
            false,
            format!(
                "node {block} has keys outside its range [{}, {})",
                at.lo, at.hi
            ),
        );
    }
    found
}

/// What a visitor wants after seeing a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Descend {
    /// Walk its children (internal nodes; ignored for leaves). Subtrees
    /// are skipped before they are read, by [`Visitor::enter`].
    Children,
    /// End the whole walk.
    Stop,
}

/// What a walk does at each node.
pub(crate) trait Visitor {
    /// The keys the walk is about, if not all: subtrees outside them are
    /// neither read nor entered (found by binary search in each internal
    /// node).
    fn keys(&self) -> Option<Range<u64>> {
        None
    }

    /// Before block `r` is read: false skips it and its subtree unread
    /// (a range outside the walk's, a shared or older subtree, a node
    /// already seen).
    fn enter(&mut self, _r: BlockRef, _at: &Place) -> Result<bool> {
        Ok(true)
    }

    /// A node read and verified (`damage` empty, or only non-structural).
    fn visit(&mut self, r: BlockRef, node: &Node, at: &Place) -> Result<Descend>;

    /// After the children of an internal node the visitor descended into.
    fn leave(&mut self, _r: BlockRef, _node: &Node, _at: &Place) -> Result<()> {
        Ok(())
    }

    /// Block `r` could not be read. The default stops the walk with the
    /// error; a checker records it and returns `Ok` (the walk goes on past
    /// the node).
    fn unreadable(&mut self, _r: BlockRef, _at: &Place, error: Error) -> Result<()> {
        Err(error)
    }

    /// Block `r` failed verification. The default stops the walk with the
    /// problem; a checker records it and returns `Ok`: the walk then goes
    /// on, into the node's children unless the damage is structural.
    fn damaged(&mut self, r: BlockRef, _at: &Place, damage: Damage) -> Result<()> {
        Err(Error::inconsistent(format!(
            "block {}: {}",
            r.block, damage.what
        )))
    }
}

/// Walks the tree of kind `tree` at `root` depth first, in key order,
/// reading nodes with `read` (see the module comment). Returns false if
/// the visitor stopped the walk.
pub(crate) fn walk<N: Deref<Target = Node>>(
    read: &impl Fn(BlockRef) -> Result<N>,
    root: BlockRef,
    tree: TreeKind,
    visitor: &mut impl Visitor,
) -> Result<bool> {
    if root.is_none() {
        return Ok(true);
    }
    walk_at(read, root, &Place::root(tree), visitor)
}

fn walk_at<N: Deref<Target = Node>>(
    read: &impl Fn(BlockRef) -> Result<N>,
    r: BlockRef,
    at: &Place,
    visitor: &mut impl Visitor,
) -> Result<bool> {
    if !visitor.enter(r, at)? {
        return Ok(true);
    }
    let node = match read(r) {
        Ok(node) => node,
        Err(e) => {
            visitor.unreadable(r, at, e)?;
            return Ok(true);
        }
    };
    let mut descend = true;
    for damage in verify(r.block, &node, at) {
        descend &= !damage.structural;
        visitor.damaged(r, at, damage)?;
    }
    if !descend {
        return Ok(true);
    }
    match visitor.visit(r, &node, at)? {
        Descend::Stop => return Ok(false),
        Descend::Children => {}
    }
    if let NodeBody::Internal(children) = &node.body {
        let keys = visitor.keys();
        // The child whose range holds the first key wanted, and those after
        // it that start below the last (keys are verified in order above).
        let first = keys.as_ref().map_or(0, |keys| {
            node.keys
                .partition_point(|&k| k <= keys.start)
                .saturating_sub(1)
        });
        for (i, &child) in children.iter().enumerate().skip(first) {
            if i > first && keys.as_ref().is_some_and(|keys| node.keys[i] >= keys.end) {
                break;
            }
            if !walk_at(read, child, &at.child(&node, i), visitor)? {
                return Ok(false);
            }
        }
        visitor.leave(r, &node, at)?;
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn r(block: u64) -> BlockRef {
        BlockRef { block, txn: 1 }
    }

    fn leaf(keys: &[u64]) -> Node {
        Node {
            tree: TreeKind::Queue,
            level: 0,
            keys: keys.to_vec(),
            body: NodeBody::Leaf(vec![0; keys.len() * TreeKind::Queue.value_len()]),
            packed: false,
        }
    }

    fn internal(level: u8, keys: &[u64], children: &[u64]) -> Node {
        Node {
            tree: TreeKind::Queue,
            level,
            keys: keys.to_vec(),
            body: NodeBody::Internal(children.iter().map(|&b| r(b)).collect()),
            packed: false,
        }
    }

    /// Records what it saw; reports damage instead of failing.
    #[derive(Default)]
    struct Seen {
        visited: Vec<u64>,
        damage: Vec<String>,
        skip: Vec<u64>,
        keys: Option<std::ops::Range<u64>>,
    }

    impl Visitor for Seen {
        fn keys(&self) -> Option<std::ops::Range<u64>> {
            self.keys.clone()
        }
        fn enter(&mut self, r: BlockRef, _at: &Place) -> Result<bool> {
            Ok(!self.skip.contains(&r.block))
        }
        fn visit(&mut self, r: BlockRef, _node: &Node, _at: &Place) -> Result<Descend> {
            self.visited.push(r.block);
            Ok(Descend::Children)
        }
        fn damaged(&mut self, _r: BlockRef, _at: &Place, damage: Damage) -> Result<()> {
            self.damage.push(damage.what);
            Ok(())
        }
    }

    /// Reads blocks from `nodes`.
    fn reader(nodes: &HashMap<u64, Node>) -> impl Fn(BlockRef) -> Result<Box<Node>> + '_ {
        |b: BlockRef| {
            nodes
                .get(&b.block)
                .cloned()
                .map(Box::new)
                .ok_or_else(|| Error::inconsistent("no such block"))
        }
    }

    fn run(nodes: &HashMap<u64, Node>, root: u64, seen: &mut Seen) -> Result<bool> {
        walk(&reader(nodes), r(root), TreeKind::Queue, seen)
    }

    #[test]
    fn a_sound_tree_is_walked_in_key_order_and_enter_skips_subtrees() {
        let nodes = HashMap::from([
            (1, internal(1, &[0, 10, 20], &[2, 3, 4])),
            (2, leaf(&[1, 5])),
            (3, leaf(&[10, 15])),
            (4, leaf(&[20])),
        ]);
        let mut seen = Seen::default();
        assert!(run(&nodes, 1, &mut seen).unwrap());
        assert_eq!(seen.visited, [1, 2, 3, 4]);
        assert!(seen.damage.is_empty(), "{:?}", seen.damage);
        let mut seen = Seen {
            skip: vec![3],
            ..Seen::default()
        };
        run(&nodes, 1, &mut seen).unwrap();
        assert_eq!(seen.visited, [1, 2, 4]);
        // Only the children whose ranges meet the keys wanted are read.
        for (keys, read) in [
            (12..18, vec![1, 3]),
            (5..11, vec![1, 2, 3]),
            (25..40, vec![1, 4]),
        ] {
            let mut seen = Seen {
                keys: Some(keys.clone()),
                ..Seen::default()
            };
            run(&nodes, 1, &mut seen).unwrap();
            assert_eq!(seen.visited, read, "{keys:?}");
        }
    }

    #[test]
    fn every_kind_of_damage_is_found_and_structural_damage_is_not_descended() {
        let nodes = HashMap::from([
            // Child 2 points back at the root: a cycle, caught by its level.
            (1, internal(1, &[0, 10, 20, 30], &[1, 3, 4, 5])),
            (3, leaf(&[12, 9])),
            (4, leaf(&[25, 40])),
            (5, leaf(&[])),
        ]);
        let mut seen = Seen::default();
        run(&nodes, 1, &mut seen).unwrap();
        assert_eq!(seen.visited, [1, 3, 4, 5], "the cycle is not followed");
        let all = seen.damage.join("; ");
        for expected in [
            "node 1 is a level-1 Queue node where a level-Some(0)",
            "node 3 has keys out of order",
            "node 3 has keys outside its range [10, 20)",
            "node 4 has keys outside its range [20, 30)",
            "node 5 is empty",
        ] {
            assert!(all.contains(expected), "{expected:?} not in {all}");
        }
        // Without a checker's visitor, the first damage ends the walk.
        struct Strict;
        impl Visitor for Strict {
            fn visit(&mut self, _r: BlockRef, _n: &Node, _at: &Place) -> Result<Descend> {
                Ok(Descend::Children)
            }
        }
        assert!(walk(&reader(&nodes), r(1), TreeKind::Queue, &mut Strict).is_err());
    }

    #[test]
    fn a_tree_of_the_wrong_kind_or_too_deep_is_refused() {
        let mut wrong = leaf(&[1]);
        wrong.tree = TreeKind::Volumes;
        let at = Place::root(TreeKind::Queue);
        assert!(verify(7, &wrong, &at)[0].structural);
        let deep = internal(MAX_LEVEL + 1, &[0], &[2]);
        assert!(verify(7, &deep, &at)[0].structural);
        let leaf_above_zero = Node {
            level: 2,
            ..leaf(&[1])
        };
        assert!(verify(7, &leaf_above_zero, &at)[0].structural);
    }
}
