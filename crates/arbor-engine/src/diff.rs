//! Differences between two mapping trees, found by walking only what is not
//! shared, and per-volume exclusive-space accounting.
//!
//! The diff walks both trees as two sequences of pieces that each partition
//! the chunk space `[0, u64::MAX)`. A piece is either a subtree not yet
//! expanded or a run of chunks with a known mapping. At every step both front
//! pieces start at the same chunk (the invariant). Two subtree pieces with
//! the same block and the same range are identical and skipped whole: that is
//! what makes the cost follow the size of the change, not of the volume.

use arbor_format::{BlockRef, Node, NodeBody, TreeKind};

use crate::error::{Error, Result};
use crate::mapping::Mapping;
use crate::meta::Meta;
use crate::walk::{verify, walk, Descend, Place, Visitor};

#[derive(Debug, Clone, Copy)]
enum Piece {
    /// The subtree at `node`, where its parent puts it.
    Subtree { node: BlockRef, at: Place },
    /// Chunks `[lo, hi)` map to physical chunks from `phys` on, or are
    /// unmapped. Equal `phys` means equal contents, partial extents
    /// included: a partial's chunk is mapped by one partial (one mask, one
    /// base) while it is shared, and a mask grows only while its chunk is
    /// not shared.
    Run { lo: u64, hi: u64, phys: Option<u64> },
}

impl Piece {
    fn lo(&self) -> u64 {
        match *self {
            Piece::Subtree { at, .. } => at.lo,
            Piece::Run { lo, .. } => lo,
        }
    }

    fn hi(&self) -> u64 {
        match *self {
            Piece::Subtree { at, .. } => at.hi,
            Piece::Run { hi, .. } => hi,
        }
    }
}

/// One side of the walk: the transaction its tree lives in, and pieces in
/// reverse order (the next piece is last).
struct Side<'a> {
    meta: &'a Meta,
    pieces: Vec<Piece>,
}

impl<'a> Side<'a> {
    fn new(map: Mapping<'a>) -> Self {
        let root = map.tree().root();
        let piece = if root.is_none() {
            Piece::Run {
                lo: 0,
                hi: u64::MAX,
                phys: None,
            }
        } else {
            Piece::Subtree {
                node: root,
                at: Place::root(TreeKind::Mapping),
            }
        };
        Side {
            meta: map.tree().meta(),
            pieces: vec![piece],
        }
    }

    /// Replaces the front subtree piece by its children (or its runs).
    fn expand(&mut self) -> Result<()> {
        let Some(Piece::Subtree { node, at }) = self.pieces.pop() else {
            return Err(Error::inconsistent("diff: expanding a run"));
        };
        let (lo, hi) = (at.lo, at.hi);
        let n = self.meta.node(node)?;
        if let Some(damage) = verify(node.block, &n, &at).into_iter().next() {
            return Err(Error::inconsistent(format!("diff: {}", damage.what)));
        }
        let mut pieces = Vec::new();
        match &n.body {
            NodeBody::Internal(children) => {
                // Verified above: the children's ranges are in order and
                // inside this node's.
                for (i, child) in children.iter().enumerate() {
                    let at = at.child(&n, i);
                    if at.hi > at.lo {
                        pieces.push(Piece::Subtree { node: *child, at });
                    }
                }
            }
            NodeBody::Leaf(_) => {
                let mut pos = lo;
                for i in 0..n.len() {
                    let v = crate::meta::decode_map_value(&n, i)?;
                    let start = n.keys[i].clamp(pos, hi);
                    let end = n.keys[i].saturating_add(u64::from(v.len)).clamp(start, hi);
                    if start > pos {
                        pieces.push(Piece::Run {
                            lo: pos,
                            hi: start,
                            phys: None,
                        });
                    }
                    if end > start {
                        let phys = v.pchunk + (start - n.keys[i]);
                        pieces.push(Piece::Run {
                            lo: start,
                            hi: end,
                            phys: Some(phys),
                        });
                    }
                    pos = pos.max(end);
                }
                if pos < hi {
                    pieces.push(Piece::Run {
                        lo: pos,
                        hi,
                        phys: None,
                    });
                }
            }
        }
        self.pieces.extend(pieces.into_iter().rev());
        Ok(())
    }

    /// Drops the front run's chunks below `to`.
    fn consume_to(&mut self, to: u64) {
        if let Some(Piece::Run { lo, hi, phys }) = self.pieces.pop() {
            if to < hi {
                let phys = phys.map(|p| p + (to - lo));
                self.pieces.push(Piece::Run { lo: to, hi, phys });
            }
        }
    }
}

/// Calls `emit(lo, hi)` for every chunk range inside chunks `[from,
/// to)` where the trees map differently (ranges come in increasing
/// order, possibly adjacent). Pieces wholly before `from` are skipped
/// without reading their nodes, and the walk stops at `to`, so a window
/// costs the trees' depth plus what differs in it.
pub(crate) fn diff_trees(
    a: Mapping<'_>,
    b: Mapping<'_>,
    from: u64,
    to: u64,
    emit: &mut dyn FnMut(u64, u64) -> Result<()>,
) -> Result<()> {
    let mut left = Side::new(a);
    let mut right = Side::new(b);
    while let (Some(&pa), Some(&pb)) = (left.pieces.last(), right.pieces.last()) {
        if pa.lo() >= to {
            break;
        }
        // Before the window: drop what ends there on both sides without
        // reading it; a wider piece is expanded (below) or cut.
        let end = pa.hi().min(pb.hi());
        if end <= from && pa.lo() == pb.lo() {
            match (pa, pb) {
                (Piece::Run { .. }, Piece::Run { .. }) => {
                    left.consume_to(end);
                    right.consume_to(end);
                    continue;
                }
                _ if pa.hi() == pb.hi() => {
                    left.pieces.pop();
                    right.pieces.pop();
                    continue;
                }
                (Piece::Subtree { .. }, Piece::Run { .. }) if pa.hi() == end => {
                    left.pieces.pop();
                    right.consume_to(end);
                    continue;
                }
                (Piece::Run { .. }, Piece::Subtree { .. }) if pb.hi() == end => {
                    right.pieces.pop();
                    left.consume_to(end);
                    continue;
                }
                // The narrower is a subtree inside the wider one:
                // expand the wider (as the walk does anyway).
                _ => {}
            }
        }
        if pa.lo() != pb.lo() {
            return Err(Error::inconsistent(
                "diff: walks out of step (damaged tree ranges)",
            ));
        }
        match (pa, pb) {
            (Piece::Subtree { node: na, .. }, Piece::Subtree { node: nb, .. })
                if na.block == nb.block && pa.hi() == pb.hi() =>
            {
                left.pieces.pop();
                right.pieces.pop();
            }
            (Piece::Subtree { .. }, Piece::Subtree { .. }) => {
                // Expand the wider one: the narrower may match a child of it.
                if pa.hi() >= pb.hi() {
                    left.expand()?;
                }
                if pb.hi() >= pa.hi() {
                    right.expand()?;
                }
            }
            (Piece::Subtree { .. }, Piece::Run { .. }) => left.expand()?,
            (Piece::Run { .. }, Piece::Subtree { .. }) => right.expand()?,
            (
                Piece::Run {
                    lo,
                    hi: ha,
                    phys: xa,
                },
                Piece::Run {
                    hi: hb, phys: xb, ..
                },
            ) => {
                let end = ha.min(hb);
                let (lo_in, end_in) = (lo.max(from), end.min(to));
                if xa != xb && lo_in < end_in {
                    emit(lo_in, end_in)?;
                }
                left.consume_to(end);
                right.consume_to(end);
            }
        }
    }
    Ok(())
}

/// Calls `emit(from, to)` for every chunk range whose mapping was written
/// after transaction `since` (in increasing order). A subtree whose node
/// was written in or before `since` holds only older mappings (a node is
/// rewritten whenever an entry below it changes), so it is skipped whole.
/// Unmapping leaves no generation behind: ranges discarded since are not
/// reported (`diff_trees` against a snapshot reports them).
pub(crate) fn changed_since(
    map: Mapping<'_>,
    since: u64,
    emit: &mut dyn FnMut(u64, u64) -> Result<()>,
) -> Result<()> {
    struct Newer<'e> {
        since: u64,
        emit: &'e mut dyn FnMut(u64, u64) -> Result<()>,
    }
    impl Visitor for Newer<'_> {
        fn enter(&mut self, r: BlockRef, _at: &Place) -> Result<bool> {
            Ok(r.txn > self.since)
        }
        fn visit(&mut self, _r: BlockRef, node: &Node, _at: &Place) -> Result<Descend> {
            if let NodeBody::Leaf(_) = node.body {
                for i in 0..node.len() {
                    let v = crate::meta::decode_map_value(node, i)?;
                    if v.gen > self.since {
                        (self.emit)(node.keys[i], node.keys[i].saturating_add(u64::from(v.len)))?;
                    }
                }
            }
            Ok(Descend::Children)
        }
    }
    let tree = map.tree();
    let meta = tree.meta();
    walk(
        &|r| meta.node(r),
        tree.root(),
        TreeKind::Mapping,
        &mut Newer { since, emit },
    )
    .map(|_| ())
}

/// Chunks referenced by this tree alone: reachable only through nodes with
/// a single reference, with a single reference themselves. Walks only the
/// exclusive part of the tree.
pub(crate) fn exclusive_chunks(map: Mapping<'_>) -> Result<u64> {
    struct Exclusive<'m> {
        meta: &'m Meta,
        total: u64,
    }
    impl Visitor for Exclusive<'_> {
        fn enter(&mut self, r: BlockRef, _at: &Place) -> Result<bool> {
            Ok(self.meta.meta_count(r.block)? == 1)
        }
        fn visit(&mut self, r: BlockRef, node: &Node, _at: &Place) -> Result<Descend> {
            if let NodeBody::Leaf(_) = node.body {
                for i in 0..node.len() {
                    let v = crate::meta::decode_map_value(node, i)?;
                    for (start, len) in v.chunk_runs() {
                        let end = start
                            .checked_add(len)
                            .filter(|&end| end <= self.meta.geo().data_chunks())
                            .ok_or_else(|| {
                                Error::inconsistent(format!(
                                    "leaf {}: extent at {} points past the data region",
                                    r.block, node.keys[i]
                                ))
                            })?;
                        for c in start..end {
                            if self.meta.data_count(c)? == 1 {
                                self.total += 1;
                            }
                        }
                    }
                }
            }
            Ok(Descend::Children)
        }
    }
    let tree = map.tree();
    let meta = tree.meta();
    let mut exclusive = Exclusive { meta, total: 0 };
    walk(
        &|r| meta.node(r),
        tree.root(),
        TreeKind::Mapping,
        &mut exclusive,
    )?;
    Ok(exclusive.total)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::mapping::MappingMut;
    use crate::meta::btree::TreeMut;
    use crate::testing::{check_refs, fresh_meta};

    /// Logical chunk → physical chunk.
    type Model = BTreeMap<u64, u64>;

    /// Writes `chunks` of the map at `root`, each to a newly allocated
    /// chunk, dropping what they mapped.
    fn write(meta: &mut Meta, root: BlockRef, model: &mut Model, chunks: &[u64]) -> BlockRef {
        let mut map = MappingMut::new(meta, root);
        for &chunk in chunks {
            let p = map.meta_mut().alloc_data().unwrap();
            if let Some(old) = map.set(chunk, p).unwrap() {
                old.dec_refs(map.meta_mut()).unwrap();
            }
            model.insert(chunk, p);
        }
        map.root()
    }

    /// The chunk ranges where two models differ, joined where adjacent.
    fn model_diff(a: &Model, b: &Model, from: u64, to: u64) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = Vec::new();
        for c in from..to {
            if a.get(&c) != b.get(&c) {
                match out.last_mut() {
                    Some((_, hi)) if *hi == c => *hi = c + 1,
                    _ => out.push((c, c + 1)),
                }
            }
        }
        out
    }

    fn diff(meta: &Meta, a: BlockRef, b: BlockRef, from: u64, to: u64) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = Vec::new();
        diff_trees(
            Mapping::new(meta, a),
            Mapping::new(meta, b),
            from,
            to,
            &mut |lo, hi| {
                match out.last_mut() {
                    Some((_, end)) if *end == lo => *end = hi,
                    _ => out.push((lo, hi)),
                }
                Ok(())
            },
        )
        .unwrap();
        out
    }

    /// A map shared (as a snapshot does) and then changed, by writes and a
    /// discard over several leaves: the diff of the two trees, whole and in
    /// windows, is exactly where their models differ; the changed-since
    /// walk reports exactly the chunks written after the share; and the
    /// exclusive chunks of each tree are those the other does not map to
    /// the same chunk.
    #[test]
    fn diff_changed_since_and_exclusive_chunks_match_the_models() {
        let mut meta = fresh_meta();
        let mut rng = StdRng::seed_from_u64(21);
        let mut a_model = Model::new();
        let first: Vec<u64> = (0..1200).filter(|_| rng.gen_bool(0.7)).collect();
        let a = write(&mut meta, BlockRef::NONE, &mut a_model, &first);
        meta.commit().unwrap();
        let since = meta.txn() - 1;
        TreeMut::new(&mut meta, TreeKind::Mapping, a)
            .share()
            .unwrap();
        let mut b_model = a_model.clone();
        let rewritten: Vec<u64> = (0..60).map(|_| rng.gen_range(0..1300)).collect();
        let mut b = write(&mut meta, a, &mut b_model, &rewritten);
        let mut map = MappingMut::new(&mut meta, b);
        let (_, detached) = map.discard(400, 700).unwrap();
        b = map.root();
        for subtree in detached {
            crate::testing::drop_tree(&mut meta, subtree);
        }
        b_model.retain(|c, _| !(400..700).contains(c));
        check_refs(&meta, &[a, b], 0);

        assert_eq!(
            diff(&meta, a, b, 0, u64::MAX),
            model_diff(&a_model, &b_model, 0, 1400)
        );
        for (from, to) in [(0, 100), (390, 710), (650, 1301), (1250, 5000)] {
            let expected = model_diff(&a_model, &b_model, from, to.min(1400));
            assert_eq!(
                diff(&meta, a, b, from, to),
                expected,
                "window [{from}, {to})"
            );
        }
        assert_eq!(diff(&meta, a, a, 0, u64::MAX), []);

        let mut changed = Vec::new();
        changed_since(Mapping::new(&meta, b), since, &mut |lo, hi| {
            changed.extend(lo..hi);
            Ok(())
        })
        .unwrap();
        let mut written: Vec<u64> = rewritten.clone();
        written.retain(|c| !(400..700).contains(c));
        written.sort_unstable();
        written.dedup();
        assert_eq!(changed, written);

        let alone = |mine: &Model, other: &Model| {
            mine.iter().filter(|(c, p)| other.get(c) != Some(p)).count() as u64
        };
        assert_eq!(
            exclusive_chunks(Mapping::new(&meta, a)).unwrap(),
            alone(&a_model, &b_model)
        );
        assert_eq!(
            exclusive_chunks(Mapping::new(&meta, b)).unwrap(),
            alone(&b_model, &a_model)
        );
    }
}
