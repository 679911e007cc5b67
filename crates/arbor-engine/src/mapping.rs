//! A volume's chunk map: logical chunk → physical chunk, stored as extents
//! (runs of consecutive chunks written in the same transaction) in a
//! mapping tree.
//!
//! Invariants:
//! * extents never overlap;
//! * an extent lies wholly inside the key range of the leaf holding it (so a
//!   lookup only needs the leaf whose range holds the chunk);
//! * each mapped chunk holds one data-space-map reference per extent that
//!   names it.

use arbor_format::{BlockRef, MapValue, TreeKind, MAX_EXTENT_CHUNKS};

use crate::error::{Error, Result};
use crate::meta::Meta;

/// One run of mapped chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Extent {
    pub start: u64,
    pub len: u32,
    pub pchunk: u64,
    pub gen: u64,
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

    fn from_entry(key: u64, value: &[u8], data_chunks: u64) -> Result<Self> {
        let v = MapValue::decode(value)
            .map_err(|e| Error::corrupt(format!("mapping entry {key}"), e))?;
        let fits = v
            .pchunk
            .checked_add(u64::from(v.len))
            .is_some_and(|end| end <= data_chunks)
            && key.checked_add(u64::from(v.len)).is_some();
        if !fits {
            return Err(Error::inconsistent(format!(
                "mapping entry {key} points past the data region (chunk {} + {})",
                v.pchunk, v.len
            )));
        }
        Ok(Self {
            start: key,
            len: v.len,
            pchunk: v.pchunk,
            gen: v.gen,
        })
    }

    fn encode(&self) -> [u8; MapValue::ENCODED_LEN] {
        let mut out = [0u8; MapValue::ENCODED_LEN];
        MapValue {
            pchunk: self.pchunk,
            len: self.len,
            gen: self.gen,
        }
        .encode(&mut out);
        out
    }
}

impl Meta {
    /// The extent covering `chunk`, if any, and the upper bound of its leaf.
    pub fn map_lookup(&self, root: BlockRef, chunk: u64) -> Result<Option<(Extent, u64)>> {
        let Some(found) = self.tree_get_le(root, chunk)? else {
            return Ok(None);
        };
        let extent = Extent::from_entry(found.key, &found.value, self.store.geo.data_chunks)?;
        Ok(extent.covers(chunk).then_some((extent, found.leaf_upper)))
    }

    /// Calls `f` for every extent overlapping `[from, to)`, in order.
    pub fn map_extents(
        &self,
        root: BlockRef,
        from: u64,
        to: u64,
        f: &mut dyn FnMut(Extent) -> Result<bool>,
    ) -> Result<()> {
        if from >= to {
            return Ok(());
        }
        if let Some((e, _)) = self.map_lookup(root, from)? {
            if e.start < from && !f(e)? {
                return Ok(());
            }
        }
        let data_chunks = self.store.geo.data_chunks;
        self.tree_for_each(root, from, to, &mut |key, value| {
            f(Extent::from_entry(key, value, data_chunks)?)
        })
    }

    fn put_extent(&mut self, root: BlockRef, e: Extent) -> Result<BlockRef> {
        self.tree_insert(root, TreeKind::Mapping, e.start, &e.encode())
    }

    /// Removes extent `e` and re-inserts the parts of it outside `[from, to)`.
    /// References of the re-inserted parts are unchanged; the caller owns the
    /// references of the removed part.
    fn cut_extent(
        &mut self,
        mut root: BlockRef,
        e: Extent,
        from: u64,
        to: u64,
    ) -> Result<BlockRef> {
        root = self.tree_remove(root, e.start)?.0;
        if e.start < from {
            let len = (from - e.start) as u32;
            root = self.put_extent(root, Extent { len, ..e })?;
        }
        if to < e.end() {
            let right = Extent {
                start: to,
                len: (e.end() - to) as u32,
                pchunk: e.phys(to),
                gen: e.gen,
            };
            root = self.put_extent(root, right)?;
        }
        Ok(root)
    }

    /// Maps logical `chunk` to physical `pchunk` as written in this
    /// transaction. The caller transfers one reference to `pchunk`; the
    /// previous physical chunk (if any) is returned and its reference passes
    /// to the caller. Shadows the path, so afterwards the leaf is exclusive.
    pub fn map_set(
        &mut self,
        root: BlockRef,
        chunk: u64,
        pchunk: u64,
    ) -> Result<(BlockRef, Option<u64>)> {
        self.map_set_as(root, chunk, pchunk, self.txn)
    }

    /// [`Meta::map_set`] with the extent's generation given: the mapping's
    /// previous generation shadows the path without claiming a write.
    pub fn map_set_as(
        &mut self,
        root: BlockRef,
        chunk: u64,
        pchunk: u64,
        gen: u64,
    ) -> Result<(BlockRef, Option<u64>)> {
        let mut root = root;
        let mut previous = None;
        if let Some((e, _)) = self.map_lookup(root, chunk)? {
            previous = Some(e.phys(chunk));
            root = self.cut_extent(root, e, chunk, chunk + 1)?;
        }
        if let Some(left) = chunk.checked_sub(1) {
            if let Some((e, leaf_upper)) = self.map_lookup(root, left)? {
                let extendable = e.end() == chunk
                    && e.pchunk + u64::from(e.len) == pchunk
                    && e.gen == gen
                    && e.len < MAX_EXTENT_CHUNKS
                    && chunk < leaf_upper;
                if extendable {
                    let grown = Extent {
                        len: e.len + 1,
                        ..e
                    };
                    return Ok((self.put_extent(root, grown)?, previous));
                }
            }
        }
        let single = Extent {
            start: chunk,
            len: 1,
            pchunk,
            gen,
        };
        Ok((self.put_extent(root, single)?, previous))
    }

    /// Unmaps every chunk in `[from, to)`, dropping their data references.
    /// Returns the new root and how many chunks were unmapped.
    pub fn map_unset_range(
        &mut self,
        root: BlockRef,
        from: u64,
        to: u64,
    ) -> Result<(BlockRef, u64)> {
        let mut root = root;
        let mut unmapped = 0;
        loop {
            let mut next = None;
            self.map_extents(root, from, to, &mut |e| {
                next = Some(e);
                Ok(false)
            })?;
            let Some(e) = next else { break };
            let cut_from = e.start.max(from);
            let cut_to = e.end().min(to);
            root = self.cut_extent(root, e, cut_from, cut_to)?;
            self.data_sm
                .dec_range(&self.store, e.phys(cut_from), cut_to - cut_from)?;
            unmapped += cut_to - cut_from;
        }
        Ok((root, unmapped))
    }

    /// Unmaps every chunk in `[from, to)` with bounded work whatever the
    /// size of the range: the extents the bounds cut are cut first, then
    /// the range is removed from the tree, which shadows at most two paths
    /// and detaches every subtree inside the range unread. Data references
    /// of the extents removed from the two boundary leaves are dropped here;
    /// the detached subtrees are returned with their references, for the
    /// caller to hand to the reclaim queue. Returns the new root, the
    /// number of chunks unmapped, and the detached subtrees.
    pub fn map_discard(
        &mut self,
        root: BlockRef,
        from: u64,
        to: u64,
    ) -> Result<(BlockRef, u64, Vec<BlockRef>)> {
        let (mut root, mut unmapped) = (root, 0);
        if from >= to {
            return Ok((root, 0, Vec::new()));
        }
        // No extent may straddle a bound once these are cut.
        if let Some((e, _)) = self.map_lookup(root, from)? {
            if e.start < from {
                let (r, n) = self.map_unset_range(root, from, e.end().min(to))?;
                (root, unmapped) = (r, unmapped + n);
            }
        }
        if let Some((e, _)) = self.map_lookup(root, to - 1)? {
            if e.end() > to {
                let (r, n) = self.map_unset_range(root, e.start.max(from), to)?;
                (root, unmapped) = (r, unmapped + n);
            }
        }
        let removal = self.tree_remove_range(root, from, to)?;
        let data_chunks = self.store.geo.data_chunks;
        for (key, value) in &removal.removed {
            let e = Extent::from_entry(*key, value, data_chunks)?;
            self.data_sm
                .dec_range(&self.store, e.pchunk, u64::from(e.len))?;
            unmapped += u64::from(e.len);
        }
        for &subtree in &removal.detached {
            self.map_extents(subtree, 0, u64::MAX, &mut |e| {
                unmapped += u64::from(e.len);
                Ok(true)
            })?;
        }
        Ok((removal.root, unmapped, removal.detached))
    }
}
