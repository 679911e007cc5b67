//! Data checksums: the layer over the checksum tree (docs/FORMAT.md §6.4,
//! version 10).
//!
//! The tree is keyed by physical chunk, so a chunk that any number of
//! snapshots and clones share has one set of sums. Each block of 4 KiB
//! has a crc32c or none (written before the pool had checksums, or a
//! block of a partial's chunk that no mapping reads). The one place that
//! reads and changes the tree: [`ChunkSums`] for one chunk's blocks,
//! [`set_blocks`] and [`forget_chunk`] to change them in the open
//! transaction.
//!
//! Built in steps (issue 40): the tree, its leaves and `check`'s walk of it
//! exist; the write path that fills it and the reads that verify against
//! it come next, with version 10. Until then only the tests call the
//! functions below.
#![allow(dead_code)]

use arbor_format::{block_sum, SumsGeometry, SumsLeaf, TreeKind, SUM_BLOCK};

use crate::error::{Error, Result};
use crate::meta::btree::Tree;
use crate::meta::Meta;

/// The sums of one chunk's blocks (index = block within the chunk).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ChunkSums {
    blocks: Vec<Option<u32>>,
}

/// A block whose data does not match its sum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Mismatch {
    /// The block within the chunk.
    pub block: u32,
    pub stored: u32,
    pub computed: u32,
}

impl ChunkSums {
    /// The sums of chunk `pchunk` in the transaction.
    pub fn of(meta: &Meta, pchunk: u64) -> Result<Self> {
        let geo = meta.geo().sums;
        let slot = geo.slot(pchunk);
        let leaf = match Tree::new(meta, TreeKind::Sums, meta.sums_root()).get_le(slot.leaf)? {
            Some(found) if found.key == slot.leaf => Some(decode(geo, slot.leaf, &found.value)?),
            _ => None,
        };
        let blocks = (0..geo.blocks())
            .map(|b| leaf.as_ref().and_then(|l| l.get(slot.index, b)))
            .collect();
        Ok(Self { blocks })
    }

    /// The sum of block `block`, if it has one.
    pub fn get(&self, block: u32) -> Option<u32> {
        self.blocks.get(block as usize).copied().flatten()
    }

    /// Checks `data`, the chunk's bytes from block `first` on (whole
    /// blocks), against the sums: the first block that has a sum and does
    /// not match it.
    pub fn verify(&self, first: u32, data: &[u8]) -> Option<Mismatch> {
        debug_assert!(data.len().is_multiple_of(SUM_BLOCK));
        data.chunks(SUM_BLOCK)
            .zip(first..)
            .find_map(|(bytes, block)| {
                let stored = self.get(block)?;
                let computed = block_sum(bytes);
                (stored != computed).then_some(Mismatch {
                    block,
                    stored,
                    computed,
                })
            })
    }
}

fn decode(geo: SumsGeometry, leaf: u64, value: &[u8]) -> Result<SumsLeaf> {
    SumsLeaf::decode(geo, value).map_err(|e| Error::corrupt(format!("checksum leaf {leaf}"), e))
}

/// The sums of whole blocks of data, in order.
pub(crate) fn compute(data: &[u8]) -> Vec<Option<u32>> {
    debug_assert!(data.len().is_multiple_of(SUM_BLOCK));
    data.chunks(SUM_BLOCK).map(|b| Some(block_sum(b))).collect()
}

/// Sets the sums of chunk `pchunk`'s blocks from `first` on (None clears
/// one), in the open transaction.
pub(crate) fn set_blocks(
    meta: &mut Meta,
    pchunk: u64,
    first: u32,
    sums: &[Option<u32>],
) -> Result<()> {
    let geo = meta.geo().sums;
    let Some(end) = u32::try_from(sums.len())
        .ok()
        .and_then(|n| first.checked_add(n))
        .filter(|&end| end <= geo.blocks())
    else {
        return Err(Error::inconsistent(format!(
            "sums of blocks {first}+{} of a chunk of {} blocks",
            sums.len(),
            geo.blocks()
        )));
    };
    let slot = geo.slot(pchunk);
    meta.with_sums_tree(|tree| {
        let mut leaf = match tree.read().get_le(slot.leaf)? {
            Some(found) if found.key == slot.leaf => decode(geo, slot.leaf, &found.value)?,
            _ => SumsLeaf::empty(geo),
        };
        for (block, &sum) in (first..end).zip(sums) {
            leaf.set(slot.index, block, sum);
        }
        if leaf.is_empty() {
            tree.remove(slot.leaf)?;
        } else {
            tree.insert(slot.leaf, leaf.as_bytes())?;
        }
        Ok(())
    })
}

/// Clears every sum of chunk `pchunk` (a chunk allocated again: nothing
/// it held before is its data now).
pub(crate) fn forget_chunk(meta: &mut Meta, pchunk: u64) -> Result<()> {
    let none = vec![None; meta.geo().sums.blocks() as usize];
    set_blocks(meta, pchunk, 0, &none)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::fresh_meta_with;

    #[test]
    fn sums_set_in_a_transaction_read_back_and_commit_in_the_record() {
        let mut meta = fresh_meta_with(16384);
        let data: Vec<u8> = (0..16384u32).map(|i| (i * 7 % 251) as u8).collect();
        let sums = compute(&data);
        set_blocks(&mut meta, 300, 0, &sums).unwrap();
        // A neighbour in the same leaf, and a chunk in another leaf.
        set_blocks(&mut meta, 301, 2, &sums[..1]).unwrap();
        set_blocks(&mut meta, 1000, 0, &sums).unwrap();
        let check = |meta: &Meta| {
            let got = ChunkSums::of(meta, 300).unwrap();
            assert_eq!(got.verify(0, &data), None);
            let near = ChunkSums::of(meta, 301).unwrap();
            assert_eq!(
                (near.get(0), near.get(1), near.get(2), near.get(3)),
                (None, None, sums[0], None)
            );
            assert_eq!(ChunkSums::of(meta, 1000).unwrap(), got);
            assert_eq!(ChunkSums::of(meta, 5).unwrap().get(0), None);
        };
        check(&meta);
        meta.commit().unwrap();
        check(&meta);
        let root: arbor_format::BlockRef = meta.last_record().sums_root.into();
        assert_eq!(root, meta.sums_root());
        assert!(!root.is_none());
    }

    #[test]
    fn a_flipped_bit_is_the_first_mismatch_and_blocks_without_sums_pass() {
        let mut meta = fresh_meta_with(16384);
        let mut data = vec![0x5au8; 16384];
        let sums = compute(&data);
        set_blocks(&mut meta, 7, 0, &sums).unwrap();
        set_blocks(&mut meta, 7, 3, &[None]).unwrap();
        let got = ChunkSums::of(&meta, 7).unwrap();
        data[2 * 4096 + 17] ^= 4;
        data[3 * 4096] ^= 1;
        let m = got.verify(0, &data).expect("the flip is found");
        assert_eq!(m.block, 2);
        assert_eq!(m.stored, sums[2].unwrap());
        assert_eq!(m.computed, block_sum(&data[2 * 4096..3 * 4096]));
        // Block 3 has no sum: its damage is not detectable.
        assert_eq!(got.verify(3, &data[3 * 4096..]), None);
        // From block 1 on, the same first mismatch.
        assert_eq!(got.verify(1, &data[4096..]), Some(m));
    }

    #[test]
    fn forgetting_every_sum_of_a_leaf_removes_it() {
        let mut meta = fresh_meta_with(4096);
        set_blocks(&mut meta, 42, 0, &[Some(1)]).unwrap();
        assert!(!meta.sums_root().is_none());
        forget_chunk(&mut meta, 42).unwrap();
        assert!(meta.sums_root().is_none());
        assert!(set_blocks(&mut meta, 42, 1, &[Some(1)]).is_err());
        assert!(set_blocks(&mut meta, 42, u32::MAX, &[Some(1)]).is_err());
    }

    #[test]
    fn a_failed_step_leaves_the_sums_as_they_were() {
        let mut meta = fresh_meta_with(16384);
        set_blocks(&mut meta, 9, 0, &[Some(1); 4]).unwrap();
        let step = meta.begin_step(crate::meta::Privilege::Normal);
        let result: Result<()> = set_blocks(&mut meta, 9, 0, &[Some(2); 4])
            .and_then(|()| set_blocks(&mut meta, 5000, 0, &[Some(3); 4]))
            .and_then(|()| Err(Error::inconsistent("injected".to_string())));
        assert!(meta.end_step(step, result).is_err());
        assert_eq!(ChunkSums::of(&meta, 9).unwrap().get(0), Some(1));
        assert_eq!(ChunkSums::of(&meta, 5000).unwrap().get(0), None);
    }
}
