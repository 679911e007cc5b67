//! A volume's chunk map: logical chunk → physical chunk, stored as extents
//! (runs of consecutive chunks written in the same transaction) in a
//! mapping tree.
//!
//! Invariants:
//! * extents never overlap;
//! * an extent lies wholly inside the key range of the leaf holding it (so a
//!   lookup only needs the leaf whose range holds the chunk);
//! * each mapped chunk holds one data-space-map reference per extent that
//!   names it: as its run, or as a partial extent's base;
//! * a partial extent (format version 7) is one chunk long, its mask names
//!   blocks of the chunk and not all of them ([`partial_rule`]); from
//!   version 8 it may have middle layers ([`Layers`]).

use arbor_format::{
    BlockRef, Layer, MapValue, Partial, TreeKind, MAX_EXTENT_CHUNKS, MAX_PARTIAL_BLOCKS,
    MAX_PARTIAL_MIDS,
};

use crate::error::{Error, Result};
use crate::meta::btree::{Tree, TreeMut};
use crate::meta::Meta;
use crate::store::Geometry;

/// Middle layers a partial extent may have in this pool.
pub(crate) fn max_mids(geo: &Geometry) -> usize {
    if geo.version().has_middle_layers() {
        MAX_PARTIAL_MIDS
    } else {
        0
    }
}

/// Bytes of one block of a partial extent's mask.
pub(crate) const PARTIAL_BLOCK: u64 = 4096;

/// Blocks of a chunk that a partial extent's mask covers, if this pool
/// may hold partial extents: version 7 or later, chunks of 2 to 32 blocks.
pub(crate) fn partial_blocks(geo: &Geometry) -> Option<u32> {
    let blocks = geo.chunk_size / PARTIAL_BLOCK;
    (geo.version().has_partial_extents()
        && geo.chunk_size.is_multiple_of(PARTIAL_BLOCK)
        && (2..=u64::from(MAX_PARTIAL_BLOCKS)).contains(&blocks))
    .then_some(blocks as u32)
}

/// The mask of every block of a chunk, if this pool may hold partial
/// extents: a partial's mask is never this (it is then a whole chunk).
pub(crate) fn full_mask(geo: &Geometry) -> Option<u32> {
    // 2 to 32 blocks: the shift stays below 64.
    partial_blocks(geo).map(|blocks| ((1u64 << blocks) - 1) as u32)
}

/// What is wrong with partial extent `p` of chunk `pchunk` in a pool of
/// geometry `geo`, if anything: the one place that says what a valid
/// partial is (decoding and `check` both ask it).
pub(crate) fn partial_rule(geo: &Geometry, pchunk: u64, p: &Partial) -> Option<String> {
    let Some(all) = full_mask(geo) else {
        return Some(format!(
            "a partial extent in a version {} pool of {}-byte chunks",
            geo.version(),
            geo.chunk_size
        ));
    };
    if p.mask & !all != 0 || p.mask == all {
        return Some(format!(
            "partial extent mask {:#x} for {}-byte chunks",
            p.mask, geo.chunk_size
        ));
    }
    if p.base >= geo.data_chunks() || p.base == pchunk {
        return Some(format!("partial extent base {} (chunk {pchunk})", p.base));
    }
    if p.mid_count() > max_mids(geo) {
        return Some(format!(
            "a partial extent of {} middle layers in a version {} pool",
            p.mid_count(),
            geo.version()
        ));
    }
    let mut given = p.mask;
    for (i, layer) in p.layers().enumerate() {
        if layer.mask & !all != 0 || layer.mask & given != 0 {
            return Some(format!(
                "partial extent layer mask {:#x} over {given:#x} for {}-byte chunks",
                layer.mask, geo.chunk_size
            ));
        }
        given |= layer.mask;
        // Checked on every decode: no allocation, at most two layers.
        let seen = layer.chunk == pchunk
            || layer.chunk == p.base
            || p.layers().take(i).any(|newer| newer.chunk == layer.chunk);
        if layer.chunk >= geo.data_chunks() || seen {
            return Some(format!(
                "partial extent layer chunk {} (chunk {pchunk}, base {})",
                layer.chunk, p.base
            ));
        }
    }
    // The base gives at least one block (else the last layer is the base).
    if given == all {
        return Some(format!(
            "partial extent whose layers give every block (chunk {pchunk}, base {})",
            p.base
        ));
    }
    None
}

/// Most data chunks one logical chunk reads from, and one more: a write
/// puts its new chunk in front before any folds.
const MAX_LAYERS: usize = MAX_PARTIAL_MIDS + 3;

/// The data chunks one logical chunk reads from, newest first, each with
/// the blocks it gives (masks disjoint, together every block of the
/// chunk): the one place that turns a mapping into layers and back. A
/// chunk mapped whole is one layer; a partial extent its chunk, its middle
/// layers and its base.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layers {
    list: [(u64, u32); MAX_LAYERS],
    len: usize,
}

impl Layers {
    /// The layers of `m` in a pool whose chunks' blocks are `all`.
    pub fn of(m: Mapped, all: u32) -> Self {
        let mut layers = Self {
            list: [(0, 0); MAX_LAYERS],
            len: 0,
        };
        match m.partial {
            None => layers.push((m.phys, all)),
            Some(p) => {
                layers.push((m.phys, p.mask));
                let mut given = p.mask;
                for l in p.layers() {
                    layers.push((l.chunk, l.mask));
                    given |= l.mask;
                }
                layers.push((p.base, all & !given));
            }
        }
        layers
    }

    fn push(&mut self, layer: (u64, u32)) {
        // Callers stay within MAX_LAYERS: a mapping has at most
        // MAX_LAYERS - 1, and one is put in front of them.
        self.list[self.len] = layer;
        self.len += 1;
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// The layers, newest first: (data chunk, blocks it gives).
    pub fn iter(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.list[..self.len].iter().copied()
    }

    /// Takes `blocks` from every layer; a layer left without blocks goes.
    pub fn take(&mut self, blocks: u32) {
        let mut kept = 0;
        for i in 0..self.len {
            let (chunk, mask) = self.list[i];
            if mask & !blocks != 0 {
                self.list[kept] = (chunk, mask & !blocks);
                kept += 1;
            }
        }
        self.len = kept;
    }

    /// Removes layer `i`; returns it.
    pub fn remove(&mut self, i: usize) -> (u64, u32) {
        let layer = self.list[i];
        self.list.copy_within(i + 1..self.len, i);
        self.len -= 1;
        layer
    }

    /// Puts `layer` in front (newest).
    pub fn push_front(&mut self, layer: (u64, u32)) {
        self.list.copy_within(0..self.len, 1);
        self.list[0] = layer;
        self.len += 1;
    }

    /// Adds `blocks` to the first layer's (taking them from the others).
    pub fn grow_first(&mut self, blocks: u32) {
        let (chunk, mask) = self.remove(0);
        self.take(blocks);
        self.push_front((chunk, mask | blocks));
    }

    /// The mapping: the first layer's chunk, and unless it is the only one,
    /// a partial with the middle ones and the last as its base. At least
    /// one layer and at most [`MAX_PARTIAL_MIDS`] middle ones.
    pub fn mapped(&self) -> Mapped {
        debug_assert!((1..=MAX_PARTIAL_MIDS + 2).contains(&self.len));
        let (phys, mask) = self.list[0];
        if self.len == 1 {
            return Mapped::whole(phys);
        }
        let mut mids = [None; MAX_PARTIAL_MIDS];
        for (mid, &(chunk, mask)) in mids.iter_mut().zip(&self.list[1..self.len - 1]) {
            *mid = Some(Layer { chunk, mask });
        }
        Mapped {
            phys,
            partial: Some(Partial {
                mask,
                mids,
                base: self.list[self.len - 1].0,
            }),
        }
    }
}

/// What one logical chunk maps to: a data chunk, and for a partial extent
/// the base that the blocks outside its mask read from. It holds one
/// reference on each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Mapped {
    pub phys: u64,
    pub partial: Option<Partial>,
}

impl Mapped {
    /// A chunk mapped whole.
    pub fn whole(phys: u64) -> Self {
        Self {
            phys,
            partial: None,
        }
    }

    /// The data chunks it holds a reference on each: its own, then a
    /// partial's middle layers and base.
    pub fn chunks(&self) -> impl Iterator<Item = u64> + '_ {
        std::iter::once(self.phys).chain(self.partial.into_iter().flat_map(Partial::chunks))
    }

    /// Drops the references it holds (the caller owned them).
    pub fn dec_refs(&self, meta: &mut Meta) -> Result<()> {
        for chunk in self.chunks() {
            meta.dec_data(chunk)?;
        }
        Ok(())
    }

    /// The chunks `self` references and `to` does not: the references a
    /// change from `self` to `to` drops (the others pass to `to`).
    pub fn dropped_for(&self, to: &Mapped) -> Vec<u64> {
        self.chunks()
            .filter(|c| !to.chunks().any(|t| t == *c))
            .collect()
    }

    /// Where the bytes of the chunk live, as runs `(offsets within the
    /// chunk, data chunk)` in order, covering `[0, chunk_size)`: the whole
    /// chunk from `phys`, or a partial extent's runs of blocks from `phys`
    /// (its mask), from its middle layers (theirs) and from its base (the
    /// rest). The one place that splits a partial chunk.
    pub fn runs(&self, chunk_size: u64) -> Vec<(std::ops::Range<u64>, u64)> {
        if self.partial.is_none() {
            return vec![(0..chunk_size, self.phys)];
        }
        // A partial is only read in a pool of chunks of 2 to 32 blocks
        // (`partial_rule`): no shift overflows.
        let blocks = chunk_size / PARTIAL_BLOCK;
        let layers = Layers::of(*self, ((1u64 << blocks) - 1) as u32);
        let mut runs: Vec<(std::ops::Range<u64>, u64)> = Vec::new();
        for block in 0..blocks {
            let Some((from, _)) = layers.iter().find(|(_, mask)| (mask >> block) & 1 == 1) else {
                continue;
            };
            let range = block * PARTIAL_BLOCK..(block + 1) * PARTIAL_BLOCK;
            match runs.last_mut() {
                Some((last, chunk)) if *chunk == from => last.end = range.end,
                _ => runs.push((range, from)),
            }
        }
        runs
    }
}

/// One run of mapped chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Extent {
    pub start: u64,
    pub len: u32,
    pub pchunk: u64,
    pub gen: u64,
    /// A partial extent's mask and base (then `len` is 1).
    pub partial: Option<Partial>,
}

impl Extent {
    pub fn end(&self) -> u64 {
        self.start + u64::from(self.len)
    }

    pub fn covers(&self, chunk: u64) -> bool {
        self.start <= chunk && chunk < self.end()
    }

    /// Physical chunk backing logical `chunk` (which the extent covers).
    pub fn phys(&self, chunk: u64) -> u64 {
        self.pchunk + (chunk - self.start)
    }

    /// What logical `chunk` (which the extent covers) maps to.
    pub fn at(&self, chunk: u64) -> Mapped {
        Mapped {
            phys: self.phys(chunk),
            partial: self.partial,
        }
    }

    /// Drops the references of chunks `[from, to)` of the extent (which it
    /// covers): their data chunks, and a partial extent's base.
    fn release(&self, meta: &mut Meta, from: u64, to: u64) -> Result<()> {
        match self.partial {
            // One chunk, which `[from, to)` covers.
            Some(_) => self.at(self.start).dec_refs(meta),
            None => meta.dec_data_range(self.phys(from), to - from),
        }
    }

    /// An extent that is not partial.
    pub fn whole(start: u64, len: u32, pchunk: u64, gen: u64) -> Self {
        Self {
            start,
            len,
            pchunk,
            gen,
            partial: None,
        }
    }

    pub(crate) fn from_entry(key: u64, value: &[u8], geo: &Geometry) -> Result<Self> {
        let v = MapValue::decode(value)
            .map_err(|e| Error::corrupt(format!("mapping entry {key}"), e))?;
        let fits = v
            .pchunk
            .checked_add(u64::from(v.len))
            .is_some_and(|end| end <= geo.data_chunks())
            && key.checked_add(u64::from(v.len)).is_some();
        if !fits {
            return Err(Error::inconsistent(format!(
                "mapping entry {key} points past the data region (chunk {} + {})",
                v.pchunk, v.len
            )));
        }
        if let Some(what) = v.partial.and_then(|p| partial_rule(geo, v.pchunk, &p)) {
            return Err(Error::inconsistent(format!("mapping entry {key}: {what}")));
        }
        Ok(Self {
            start: key,
            len: v.len,
            pchunk: v.pchunk,
            gen: v.gen,
            partial: v.partial,
        })
    }

    fn encode(&self) -> [u8; MapValue::ENCODED_LEN] {
        let mut out = [0u8; MapValue::ENCODED_LEN];
        MapValue {
            partial: self.partial,
            ..MapValue::whole(self.pchunk, self.len, self.gen)
        }
        .encode(&mut out);
        out
    }
}

/// Read access to a volume's map: its mapping tree in the transaction.
/// Every read looks up its extents through it: a copy of two references,
/// no allocation.
#[derive(Clone, Copy)]
pub(crate) struct Mapping<'a> {
    tree: Tree<'a>,
}

impl<'a> Mapping<'a> {
    /// The map whose tree's root is `root`.
    pub fn new(meta: &'a Meta, root: BlockRef) -> Self {
        Self {
            tree: Tree::new(meta, TreeKind::Mapping, root),
        }
    }

    /// Its tree, to read.
    pub fn tree(&self) -> Tree<'a> {
        self.tree
    }

    /// The extent covering `chunk`, if any, and the upper bound of its leaf.
    pub fn lookup(&self, chunk: u64) -> Result<Option<(Extent, u64)>> {
        let Some(found) = self.tree.get_le(chunk)? else {
            return Ok(None);
        };
        let extent = Extent::from_entry(found.key, &found.value, self.tree.meta().geo())?;
        Ok(extent.covers(chunk).then_some((extent, found.leaf_upper)))
    }

    /// Calls `f` for every extent overlapping `[from, to)`, in order.
    pub fn extents(
        &self,
        from: u64,
        to: u64,
        f: &mut dyn FnMut(Extent) -> Result<bool>,
    ) -> Result<()> {
        if from >= to {
            return Ok(());
        }
        if let Some((e, _)) = self.lookup(from)? {
            if e.start < from && !f(e)? {
                return Ok(());
            }
        }
        let geo = self.tree.meta().geo();
        self.tree.for_each(from, to, &mut |key, value| {
            f(Extent::from_entry(key, value, geo)?)
        })
    }
}

/// A volume's map being changed in the open transaction: its mapping tree
/// ([`TreeMut`]) and the data references its extents hold.
pub(crate) struct MappingMut<'a> {
    tree: TreeMut<'a>,
}

impl<'a> MappingMut<'a> {
    /// The map whose tree's root is `root`.
    pub fn new(meta: &'a mut Meta, root: BlockRef) -> Self {
        Self {
            tree: TreeMut::new(meta, TreeKind::Mapping, root),
        }
    }

    /// The tree's root after the changes so far.
    pub fn root(&self) -> BlockRef {
        self.tree.root()
    }

    /// The map as it is now, to read.
    pub fn read(&self) -> Mapping<'_> {
        Mapping {
            tree: self.tree.read(),
        }
    }

    /// The transaction, for the references the caller holds.
    pub fn meta_mut(&mut self) -> &mut Meta {
        self.tree.meta_mut()
    }

    /// Maps `chunk` to `to`, with generation `gen`, in place of `old` (what
    /// it maps now): the references `old` holds on chunks `to` also names
    /// pass to `to`, the others drop (a chunk new in `to` comes with the
    /// caller's reference).
    pub fn remap(&mut self, chunk: u64, old: Mapped, to: Mapped, gen: u64) -> Result<()> {
        self.set_as(chunk, to, gen)?;
        for dropped in old.dropped_for(&to) {
            self.meta_mut().dec_data(dropped)?;
        }
        Ok(())
    }

    fn put_extent(&mut self, e: Extent) -> Result<()> {
        self.tree.insert(e.start, &e.encode())
    }

    /// Removes extent `e` and re-inserts the parts of it outside `[from, to)`.
    /// References of the re-inserted parts are unchanged; the caller owns the
    /// references of the removed part.
    fn cut_extent(&mut self, e: Extent, from: u64, to: u64) -> Result<()> {
        // A partial extent is one chunk: a cut that overlaps it removes it.
        debug_assert!(e.partial.is_none() || (from <= e.start && e.end() <= to));
        self.tree.remove(e.start)?;
        if e.start < from {
            let len = (from - e.start) as u32;
            self.put_extent(Extent { len, ..e })?;
        }
        if to < e.end() {
            let right = Extent::whole(to, (e.end() - to) as u32, e.phys(to), e.gen);
            self.put_extent(right)?;
        }
        Ok(())
    }

    /// Maps logical `chunk` to physical `pchunk` as written in this
    /// transaction. The caller transfers one reference to `pchunk`; what
    /// the chunk mapped before (if anything) is returned and its references
    /// pass to the caller. Shadows the path, so afterwards the leaf is
    /// exclusive.
    pub fn set(&mut self, chunk: u64, pchunk: u64) -> Result<Option<Mapped>> {
        let txn = self.tree.meta().txn();
        self.set_as(chunk, Mapped::whole(pchunk), txn)
    }

    /// [`Self::set`] of any mapping, with the extent's generation given:
    /// the mapping's previous generation shadows the path without claiming
    /// a write.
    pub fn set_as(&mut self, chunk: u64, to: Mapped, gen: u64) -> Result<Option<Mapped>> {
        let mut previous = None;
        let pchunk = to.phys;
        if let Some((e, _)) = self.read().lookup(chunk)? {
            previous = Some(e.at(chunk));
            self.cut_extent(e, chunk, chunk + 1)?;
        }
        if let (Some(left), None) = (chunk.checked_sub(1), to.partial) {
            if let Some((e, leaf_upper)) = self.read().lookup(left)? {
                let extendable = e.partial.is_none()
                    && e.end() == chunk
                    && e.pchunk + u64::from(e.len) == pchunk
                    && e.gen == gen
                    && e.len < MAX_EXTENT_CHUNKS
                    && chunk < leaf_upper;
                if extendable {
                    let grown = Extent {
                        len: e.len + 1,
                        ..e
                    };
                    self.put_extent(grown)?;
                    return Ok(previous);
                }
            }
        }
        let single = Extent {
            partial: to.partial,
            ..Extent::whole(chunk, 1, pchunk, gen)
        };
        self.put_extent(single)?;
        Ok(previous)
    }

    /// Unmaps every chunk in `[from, to)`, dropping their data references.
    /// Returns how many chunks were unmapped.
    pub fn unset_range(&mut self, from: u64, to: u64) -> Result<u64> {
        let mut unmapped = 0;
        loop {
            let mut next = None;
            self.read().extents(from, to, &mut |e| {
                next = Some(e);
                Ok(false)
            })?;
            let Some(e) = next else { break };
            let cut_from = e.start.max(from);
            let cut_to = e.end().min(to);
            self.cut_extent(e, cut_from, cut_to)?;
            e.release(self.meta_mut(), cut_from, cut_to)?;
            unmapped += cut_to - cut_from;
        }
        Ok(unmapped)
    }

    /// Unmaps every chunk in `[from, to)` with bounded work whatever the
    /// size of the range: the extents the bounds cut are cut first, then
    /// the range is removed from the tree, which shadows at most two paths
    /// and detaches every subtree inside the range unread. Data references
    /// of the extents removed from the two boundary leaves are dropped here;
    /// the detached subtrees are returned with their references, for the
    /// caller to hand to the reclaim queue. Returns the number of chunks
    /// unmapped and the detached subtrees.
    pub fn discard(&mut self, from: u64, to: u64) -> Result<(u64, Vec<BlockRef>)> {
        let mut unmapped = 0;
        if from >= to {
            return Ok((0, Vec::new()));
        }
        // No extent may straddle a bound once these are cut.
        if let Some((e, _)) = self.read().lookup(from)? {
            if e.start < from {
                unmapped += self.unset_range(from, e.end().min(to))?;
            }
        }
        if let Some((e, _)) = self.read().lookup(to - 1)? {
            if e.end() > to {
                unmapped += self.unset_range(e.start.max(from), to)?;
            }
        }
        let removal = self.tree.remove_range(from, to)?;
        for (key, value) in &removal.removed {
            let e = Extent::from_entry(*key, value, self.tree.meta().geo())?;
            e.release(self.meta_mut(), e.start, e.end())?;
            unmapped += u64::from(e.len);
        }
        let meta = self.tree.meta();
        for &subtree in &removal.detached {
            Mapping::new(meta, subtree).extents(0, u64::MAX, &mut |e| {
                unmapped += u64::from(e.len);
                Ok(true)
            })?;
        }
        Ok((unmapped, removal.detached))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::testing::{check_refs, check_tree, drop_tree, fresh_meta, fresh_meta_with};

    /// Logical chunk → physical chunk.
    type Model = BTreeMap<u64, u64>;

    fn lookup(meta: &Meta, root: BlockRef, chunk: u64) -> Result<Option<(Extent, u64)>> {
        Mapping::new(meta, root).lookup(chunk)
    }

    /// Runs `f` on the map at `root`; returns its new root and what `f` returned.
    fn change<T>(
        meta: &mut Meta,
        root: BlockRef,
        f: impl FnOnce(&mut MappingMut) -> Result<T>,
    ) -> Result<(BlockRef, T)> {
        let mut map = MappingMut::new(meta, root);
        let out = f(&mut map)?;
        Ok((map.root(), out))
    }

    fn map_set(
        meta: &mut Meta,
        root: BlockRef,
        chunk: u64,
        pchunk: u64,
    ) -> Result<(BlockRef, Option<Mapped>)> {
        change(meta, root, |map| map.set(chunk, pchunk))
    }

    fn map_set_as(
        meta: &mut Meta,
        root: BlockRef,
        chunk: u64,
        to: Mapped,
        gen: u64,
    ) -> Result<(BlockRef, Option<Mapped>)> {
        change(meta, root, |map| map.set_as(chunk, to, gen))
    }

    fn unset_range(meta: &mut Meta, root: BlockRef, from: u64, to: u64) -> Result<(BlockRef, u64)> {
        change(meta, root, |map| map.unset_range(from, to))
    }

    fn discard(
        meta: &mut Meta,
        root: BlockRef,
        from: u64,
        to: u64,
    ) -> Result<(BlockRef, u64, Vec<BlockRef>)> {
        let (root, (unmapped, detached)) = change(meta, root, |map| map.discard(from, to))?;
        Ok((root, unmapped, detached))
    }

    fn extents(meta: &Meta, root: BlockRef, from: u64, to: u64) -> Vec<Extent> {
        let mut out = Vec::new();
        Mapping::new(meta, root)
            .extents(from, to, &mut |e| {
                out.push(e);
                Ok(true)
            })
            .unwrap();
        out
    }

    /// The rule of a partial's middle layers (version 8): masks disjoint
    /// from each other and the partial's, the base giving a block, chunks
    /// all different, and none in a version 7 pool.
    #[test]
    fn partial_rule_checks_middle_layers() {
        let meta = fresh_meta_with(16384);
        let geo = meta.geo();
        let layer = |chunk, mask| Some(Layer { chunk, mask });
        let p = |mids: [Option<Layer>; MAX_PARTIAL_MIDS]| Partial {
            mask: 0b0001,
            mids,
            base: 3,
        };
        assert_eq!(partial_rule(geo, 1, &p([layer(2, 0b0010), None])), None);
        assert_eq!(
            partial_rule(geo, 1, &p([layer(2, 0b0010), layer(4, 0b0100)])),
            None
        );
        for (what, bad) in [
            ("overlaps the mask", p([layer(2, 0b0011), None])),
            (
                "overlaps a newer layer",
                p([layer(2, 0b0110), layer(4, 0b0100)]),
            ),
            ("past the chunk", p([layer(2, 0b10000), None])),
            (
                "leaves the base nothing",
                p([layer(2, 0b0110), layer(4, 0b1000)]),
            ),
            ("the partial's chunk", p([layer(1, 0b0010), None])),
            ("the base", p([layer(3, 0b0010), None])),
            ("twice", p([layer(2, 0b0010), layer(2, 0b0100)])),
            ("past the data", p([layer(geo.data_chunks(), 0b0010), None])),
        ] {
            assert!(partial_rule(geo, 1, &bad).is_some(), "{what}");
        }
        geo.set_version(arbor_format::FormatVersion::new(7).unwrap());
        assert!(partial_rule(geo, 1, &p([layer(2, 0b0010), None])).is_some());
        assert_eq!(partial_rule(geo, 1, &Partial::over(0b0001, 3)), None);
    }

    /// Layers of a mapping and back, and what a change drops.
    #[test]
    fn layers_turn_a_mapping_into_sources_and_back() {
        let all = 0b1111;
        let whole = Mapped::whole(7);
        assert_eq!(
            Layers::of(whole, all).iter().collect::<Vec<_>>(),
            [(7, all)]
        );
        assert_eq!(Layers::of(whole, all).mapped(), whole);
        let two = Mapped {
            phys: 1,
            partial: Some(Partial {
                mask: 0b0001,
                mids: [
                    Some(Layer {
                        chunk: 2,
                        mask: 0b0100,
                    }),
                    None,
                ],
                base: 3,
            }),
        };
        let mut layers = Layers::of(two, all);
        assert_eq!(
            layers.iter().collect::<Vec<_>>(),
            [(1, 0b0001), (2, 0b0100), (3, 0b1010)]
        );
        assert_eq!(layers.mapped(), two);
        assert_eq!(
            two.runs(16384),
            [
                (0..4096, 1),
                (4096..8192, 3),
                (8192..12288, 2),
                (12288..16384, 3)
            ]
        );
        // The middle layer's block taken: it drops, and its reference.
        layers.take(0b0100);
        layers.push_front((9, 0b0100));
        let to = layers.mapped();
        assert_eq!(
            layers.iter().collect::<Vec<_>>(),
            [(9, 0b0100), (1, 0b0001), (3, 0b1010)]
        );
        assert_eq!(two.dropped_for(&to), [2]);
        // Grown to every block: whole, every other chunk dropped.
        let mut layers = Layers::of(two, all);
        layers.grow_first(0b1110);
        assert_eq!(layers.mapped(), Mapped::whole(1));
        assert_eq!(two.dropped_for(&Mapped::whole(1)), [2, 3]);
    }

    fn ext(start: u64, len: u32, pchunk: u64, gen: u64) -> Extent {
        Extent::whole(start, len, pchunk, gen)
    }

    /// Maps `chunk` to `pchunk` (whose reference the caller holds and
    /// hands over), drops the reference to the chunk it replaces, and
    /// checks that the replaced chunk is the model's.
    fn set(
        meta: &mut Meta,
        root: BlockRef,
        model: &mut Model,
        chunk: u64,
        pchunk: u64,
    ) -> BlockRef {
        let (root, previous) = map_set(meta, root, chunk, pchunk).unwrap();
        assert_eq!(
            previous,
            model.insert(chunk, pchunk).map(Mapped::whole),
            "replaced chunk of {chunk}"
        );
        if let Some(p) = previous {
            p.dec_refs(meta).unwrap();
        }
        root
    }

    /// Writes `[start, start + len)` in order, each chunk newly allocated.
    fn write(meta: &mut Meta, root: BlockRef, model: &mut Model, start: u64, len: u64) -> BlockRef {
        let mut root = root;
        for chunk in start..start + len {
            let p = meta.alloc_data().unwrap();
            root = set(meta, root, model, chunk, p);
        }
        root
    }

    /// The map at `root` against its model: extents in order, disjoint,
    /// of 1 to MAX_EXTENT_CHUNKS chunks, each inside its leaf's key range,
    /// together mapping exactly the model's chunks to its physical chunks;
    /// with `lookups`, Mapping::lookup agrees for every chunk up to past the end.
    fn check_map(meta: &Meta, root: BlockRef, model: &Model, lookups: bool) -> Vec<Extent> {
        let shape = check_tree(meta, root, TreeKind::Mapping);
        let all = extents(meta, root, 0, u64::MAX);
        assert_eq!(shape.entries(), all.len());
        let mut seen = Model::new();
        let mut end = 0;
        for e in &all {
            assert!((1..=MAX_EXTENT_CHUNKS).contains(&e.len), "{e:?}");
            assert!(e.start >= end, "overlapping extents at {e:?}");
            end = e.end();
            seen.extend((e.start..e.end()).map(|c| (c, e.phys(c))));
        }
        assert_eq!(&seen, model);
        for leaf in &shape.leaves {
            for &key in &leaf.keys {
                let (e, leaf_upper) = lookup(meta, root, key).unwrap().unwrap();
                assert_eq!((e.start, leaf_upper), (key, leaf.hi));
                assert!(
                    leaf.lo <= e.start && e.end() <= leaf.hi,
                    "{e:?} leaves its leaf"
                );
            }
        }
        if lookups {
            let last = model.keys().next_back().map_or(0, |c| c + 3);
            for chunk in 0..last {
                let found = lookup(meta, root, chunk).unwrap();
                assert_eq!(
                    found.map(|(e, _)| e.phys(chunk)),
                    model.get(&chunk).copied()
                );
            }
        }
        all
    }

    /// A partial extent is never merged with a neighbour, holds one
    /// reference on its base, and gives both back when replaced or unmapped.
    #[test]
    fn a_partial_extent_never_merges_and_holds_its_base() {
        let mut meta = fresh_meta_with(16384);
        let mut root = BlockRef::NONE;
        let base = meta.alloc_data().unwrap();
        root = map_set(&mut meta, root, 5, base).unwrap().0;
        // Chunks 4 to 6 written in order in one transaction, 5 as a partial
        // over `base`: the whole neighbours are consecutive with it on the
        // device, and still three extents.
        let p4 = meta.alloc_data().unwrap();
        let p5 = meta.alloc_data().unwrap();
        let p6 = meta.alloc_data().unwrap();
        assert_eq!((p5, p6), (p4 + 1, p4 + 2));
        root = map_set(&mut meta, root, 4, p4).unwrap().0;
        let partial = Mapped {
            phys: p5,
            partial: Some(Partial::over(0b1000, base)),
        };
        let txn = meta.txn();
        let (r, previous) = map_set_as(&mut meta, root, 5, partial, txn).unwrap();
        root = r;
        // The base's reference passes to the partial.
        assert_eq!(previous, Some(Mapped::whole(base)));
        root = map_set(&mut meta, root, 6, p6).unwrap().0;
        let got = extents(&meta, root, 0, 10);
        assert_eq!(got.len(), 3, "{got:?}");
        assert_eq!(got[1].at(5), partial);
        assert_eq!(partial.runs(16384), [(0..12288, base), (12288..16384, p5)]);
        check_refs(&meta, &[root], 0);
        // Replaced: both references come back to the caller.
        let q = meta.alloc_data().unwrap();
        let (r, previous) = map_set(&mut meta, root, 5, q).unwrap();
        root = r;
        assert_eq!(previous, Some(partial));
        partial.dec_refs(&mut meta).unwrap();
        check_refs(&meta, &[root], 0);
        // A partial unmapped by a range drops both.
        let base2 = q;
        let p = meta.alloc_data().unwrap();
        let partial = Mapped {
            phys: p,
            partial: Some(Partial::over(0b0001, base2)),
        };
        root = map_set_as(&mut meta, root, 5, partial, txn).unwrap().0;
        check_refs(&meta, &[root], 0);
        let (r, unmapped) = unset_range(&mut meta, root, 5, 6).unwrap();
        root = r;
        assert_eq!(unmapped, 1);
        check_refs(&meta, &[root], 0);
        drop_tree(&mut meta, root);
        assert_eq!(meta.used(arbor_format::SmKind::Data), 0);
    }

    /// Chunks written one after another to consecutive physical chunks in
    /// one transaction form one extent; a gap in the physical chunks, a
    /// different generation (MappingMut::set_as) or a new transaction starts a new
    /// one, the same generation given explicitly extends it, and no extent
    /// grows past MAX_EXTENT_CHUNKS.
    #[test]
    fn consecutive_writes_merge_into_one_extent() {
        let mut meta = fresh_meta();
        let mut model = Model::new();
        let g = meta.txn();
        let mut root = write(&mut meta, BlockRef::NONE, &mut model, 100, 10);
        let p0 = model[&100];
        assert!(
            (100..110).all(|c| model[&c] == p0 + (c - 100)),
            "precondition: a fresh map allocates consecutive chunks"
        );
        assert_eq!(check_map(&meta, root, &model, true), [ext(100, 10, p0, g)]);

        // A gap in the physical chunks.
        let skipped = meta.alloc_data().unwrap();
        assert_eq!(skipped, p0 + 10);
        root = write(&mut meta, root, &mut model, 110, 1);
        assert_eq!(model[&110], p0 + 11);
        // Another generation, then that generation again.
        let p = meta.alloc_data().unwrap();
        root = map_set_as(&mut meta, root, 111, Mapped::whole(p), g + 7)
            .unwrap()
            .0;
        model.insert(111, p);
        let p = meta.alloc_data().unwrap();
        root = map_set_as(&mut meta, root, 112, Mapped::whole(p), g + 7)
            .unwrap()
            .0;
        model.insert(112, p);
        assert_eq!(
            check_map(&meta, root, &model, true),
            [
                ext(100, 10, p0, g),
                ext(110, 1, p0 + 11, g),
                ext(111, 2, p0 + 12, g + 7),
            ]
        );
        // The next transaction.
        meta.commit().unwrap();
        root = write(&mut meta, root, &mut model, 113, 2);
        assert_eq!(
            check_map(&meta, root, &model, true)[3..],
            [ext(113, 2, p0 + 14, g + 1)]
        );

        // 300 consecutive chunks: 256 + 44.
        root = write(&mut meta, root, &mut model, 1000, 300);
        let q = model[&1000];
        assert_eq!(
            check_map(&meta, root, &model, true)[4..],
            [
                ext(1000, MAX_EXTENT_CHUNKS, q, g + 1),
                ext(1256, 44, q + 256, g + 1)
            ]
        );
        check_refs(&meta, &[root], 1);
    }

    /// Mapping a chunk inside an extent cuts it in three: the left part
    /// (same start and physical chunk), the new one-chunk extent, and the
    /// right part starting one past it with its physical chunk offset by
    /// the same amount and the old generation; the replaced physical chunk
    /// is returned. At an extent's first or last chunk it cuts in two.
    #[test]
    fn setting_a_chunk_inside_an_extent_cuts_it_in_three() {
        let mut meta = fresh_meta();
        let mut model = Model::new();
        let g = meta.txn();
        let mut root = write(&mut meta, BlockRef::NONE, &mut model, 10, 10);
        let p0 = model[&10];
        assert_eq!(check_map(&meta, root, &model, true), [ext(10, 10, p0, g)]);
        meta.commit().unwrap();
        let g2 = meta.txn();

        let q = meta.alloc_data().unwrap();
        let (r, previous) = map_set(&mut meta, root, 15, q).unwrap();
        root = r;
        assert_eq!(previous, Some(Mapped::whole(p0 + 5)));
        assert_eq!(meta.dec_data(p0 + 5).unwrap(), 0);
        model.insert(15, q);
        assert_eq!(
            check_map(&meta, root, &model, true),
            [ext(10, 5, p0, g), ext(15, 1, q, g2), ext(16, 4, p0 + 6, g)]
        );

        // First and last chunks of extents.
        let a = meta.alloc_data().unwrap();
        root = set(&mut meta, root, &mut model, 10, a);
        let b = meta.alloc_data().unwrap();
        root = set(&mut meta, root, &mut model, 19, b);
        assert_eq!(
            check_map(&meta, root, &model, true),
            [
                ext(10, 1, a, g2),
                ext(11, 4, p0 + 1, g),
                ext(15, 1, q, g2),
                ext(16, 3, p0 + 6, g),
                ext(19, 1, b, g2),
            ]
        );
        check_refs(&meta, &[root], 0);
    }

    /// A map of several hundred extents over several leaves: runs of one
    /// to six chunks (each run one extent) separated by gaps.
    fn scattered_map(meta: &mut Meta, model: &mut Model, seed: u64) -> BlockRef {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut root = BlockRef::NONE;
        let mut chunk = 0;
        for _ in 0..600 {
            let len = rng.gen_range(1..=6);
            root = write(meta, root, model, chunk, len);
            chunk += len + rng.gen_range(1..4);
        }
        let shape = check_tree(meta, root, TreeKind::Mapping);
        assert!(shape.leaves.len() >= 5, "{} leaves", shape.leaves.len());
        root
    }

    /// The first extent at or after `chunk` longer than `n` chunks.
    fn extent_over(meta: &Meta, root: BlockRef, chunk: u64, n: u32) -> Extent {
        extents(meta, root, chunk, u64::MAX)
            .into_iter()
            .find(|e| e.start >= chunk && e.len > n)
            .expect("a long enough extent")
    }

    /// A bound inside an extent at or after `chunk` with `n` of its chunks
    /// below the bound.
    fn after(meta: &Meta, root: BlockRef, chunk: u64, n: u32) -> u64 {
        extent_over(meta, root, chunk, n).start + u64::from(n)
    }

    /// A bound inside an extent at or after `chunk` with `n` of its chunks
    /// at or above the bound.
    fn before(meta: &Meta, root: BlockRef, chunk: u64, n: u32) -> u64 {
        extent_over(meta, root, chunk, n).end() - u64::from(n)
    }

    #[derive(Debug, Clone, Copy)]
    enum How {
        Unset,
        Discard,
    }

    /// Unmaps `[from, to)` one way or the other, drops what the caller
    /// owns, and checks the result against the model.
    fn unmap(
        meta: &mut Meta,
        root: BlockRef,
        model: &mut Model,
        how: How,
        from: u64,
        to: u64,
    ) -> (BlockRef, usize) {
        let expected = model.range(from..to).count() as u64;
        let (root, unmapped, detached) = match how {
            How::Unset => {
                let (root, unmapped) = unset_range(meta, root, from, to).unwrap();
                (root, unmapped, Vec::new())
            }
            How::Discard => discard(meta, root, from, to).unwrap(),
        };
        assert_eq!(unmapped, expected, "chunks unmapped from [{from}, {to})");
        for &subtree in &detached {
            drop_tree(meta, subtree);
        }
        model.retain(|c, _| !(from..to).contains(c));
        check_map(meta, root, model, true);
        let refs = check_refs(meta, &[root], 0);
        assert_eq!(refs.data_chunks, model.len());
        (root, detached.len())
    }

    /// MappingMut::unset_range and MappingMut::discard over ranges whose bounds cut
    /// extents (in one extent, across neighbours, across many leaves) leave
    /// exactly the chunks outside the range mapped, to the same physical
    /// chunks, report how many chunks they unmapped, and drop exactly the
    /// data references of the unmapped chunks (discard hands whole
    /// subtrees back, which the test drops).
    #[test]
    fn unset_and_discard_cut_extents_at_both_ends() {
        for how in [How::Unset, How::Discard] {
            let mut meta = fresh_meta();
            let mut model = Model::new();
            let mut root = scattered_map(&mut meta, &mut model, 9);
            meta.commit().unwrap();
            // Inside one extent.
            let from = after(&meta, root, 50, 1);
            root = unmap(&mut meta, root, &mut model, how, from, from + 1).0;
            assert!(model.contains_key(&(from - 1)) && model.contains_key(&(from + 1)));
            // From inside one extent to inside a later one, one chunk of
            // each left outside the range.
            let (from, to) = (after(&meta, root, 200, 1), before(&meta, root, 230, 1));
            root = unmap(&mut meta, root, &mut model, how, from, to).0;
            // Across many leaves, two chunks left outside at each end.
            let (from, to) = (after(&meta, root, 400, 2), before(&meta, root, 2000, 2));
            let (r, detached) = unmap(&mut meta, root, &mut model, how, from, to);
            root = r;
            if matches!(how, How::Discard) {
                assert!(detached > 0, "whole leaves are handed back");
            }
            meta.commit().unwrap();
            // Nothing mapped there, an empty range, a prefix, everything.
            root = unmap(&mut meta, root, &mut model, how, from, to).0;
            root = unmap(&mut meta, root, &mut model, how, 300, 300).0;
            let to = before(&meta, root, 100, 1);
            root = unmap(&mut meta, root, &mut model, how, 0, to).0;
            assert!(!model.is_empty());
            root = unmap(&mut meta, root, &mut model, how, 0, u64::MAX).0;
            assert_eq!(root, BlockRef::NONE);
            assert_eq!(
                (
                    meta.used(arbor_format::SmKind::Meta),
                    meta.used(arbor_format::SmKind::Data)
                ),
                (0, 0)
            );
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        /// Write `len` chunks from `start`, each newly allocated; `scatter`
        /// maps them to the allocated chunks in reverse order, so no two
        /// merge.
        Write {
            start: u64,
            len: u64,
            scatter: bool,
        },
        Unset(u64, u64),
        Discard(u64, u64),
        Commit,
        /// Share the map (as a snapshot does) and keep the copy.
        Share,
        DropShared,
    }

    const CHUNKS: u64 = 1000;

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            8 => (0..CHUNKS, 1..48u64, any::<bool>())
                .prop_map(|(start, len, scatter)| Op::Write { start, len, scatter }),
            2 => (0..CHUNKS, 0..200u64).prop_map(|(c, n)| Op::Unset(c, c + n)),
            2 => (0..CHUNKS, 0..400u64).prop_map(|(c, n)| Op::Discard(c, c + n)),
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

        /// Random writes (merging and not), unsets, discards, commits and
        /// shared copies keep the map equal to a BTreeMap of chunk →
        /// physical chunk, keep every shared copy equal to the model it was
        /// shared with, report the right number of unmapped chunks, and keep
        /// metadata and data reference counts exact; dropping everything
        /// frees every node and chunk.
        #[test]
        fn mapping_operations_match_a_model(ops in proptest::collection::vec(op(), 1..80)) {
            let mut meta = fresh_meta();
            let mut root = BlockRef::NONE;
            let mut model = Model::new();
            let mut shared: Vec<(BlockRef, Model)> = Vec::new();
            for (n, op) in ops.iter().enumerate() {
                match *op {
                    Op::Write { start, len, scatter } => {
                        if meta.allocatable(arbor_format::SmKind::Data) < len {
                            meta.commit().unwrap();
                        }
                        if meta.allocatable(arbor_format::SmKind::Data) >= len {
                            if scatter {
                                let ps: Vec<u64> =
                                    (0..len).map(|_| meta.alloc_data().unwrap()).collect();
                                for (i, &p) in ps.iter().rev().enumerate() {
                                    root = set(&mut meta, root, &mut model, start + i as u64, p);
                                }
                            } else {
                                root = write(&mut meta, root, &mut model, start, len);
                            }
                        }
                    }
                    Op::Unset(from, to) => {
                        let expected = model.range(from..to).count() as u64;
                        let (r, unmapped) = unset_range(&mut meta, root, from, to).unwrap();
                        prop_assert_eq!(unmapped, expected);
                        root = r;
                        model.retain(|c, _| !(from..to).contains(c));
                    }
                    Op::Discard(from, to) => {
                        let expected = model.range(from..to).count() as u64;
                        let (r, unmapped, detached) = discard(&mut meta, root, from, to).unwrap();
                        prop_assert_eq!(unmapped, expected);
                        for subtree in detached {
                            drop_tree(&mut meta, subtree);
                        }
                        root = r;
                        model.retain(|c, _| !(from..to).contains(c));
                    }
                    Op::Commit => meta.commit().unwrap(),
                    Op::Share => {
                        if shared.len() < 2 && !root.is_none() {
                            TreeMut::new(&mut meta, TreeKind::Mapping, root).share().unwrap();
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
                let last = n + 1 == ops.len();
                check_map(&meta, root, &model, last || n % 10 == 9);
                if last || n % 5 == 4 {
                    let mut roots = vec![root];
                    for (r, m) in &shared {
                        check_map(&meta, *r, m, false);
                        roots.push(*r);
                    }
                    check_refs(&meta, &roots, 0);
                }
            }
            drop_tree(&mut meta, root);
            for (r, _) in shared {
                drop_tree(&mut meta, r);
            }
            prop_assert_eq!((meta.used(arbor_format::SmKind::Meta), meta.used(arbor_format::SmKind::Data)), (0, 0));
        }
    }
}
