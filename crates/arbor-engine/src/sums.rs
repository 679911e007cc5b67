//! Data checksums: the layer over the checksum tree (docs/FORMAT.md §6.4,
//! version 10).
//!
//! The tree is keyed by physical chunk, so a chunk that any number of
//! snapshots and clones share has one set of sums. Each block of 4 KiB
//! has a crc32c or none (written before the pool had checksums, or a
//! block of a partial's chunk that no mapping reads). The one place that
//! reads and changes the tree: [`ChunkSums`] for one chunk's blocks,
//! [`ReadSums`] for a read's, [`set_blocks`] and [`forget_range`] to change them in the open
//! transaction.

use arbor_format::{block_sum, SumsLeaf, TreeKind, SUM_BLOCK, SUM_BLOCK_U64};

use crate::error::{Damage, Error, Result};
use crate::meta::btree::Tree;
use crate::meta::Meta;
use crate::store::Geometry;

/// The sums of one chunk's blocks (index = block within the chunk).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ChunkSums {
    pchunk: u64,
    blocks: Vec<Option<u32>>,
}

/// `f` of the value of leaf `key` of the open transaction's tree, as the
/// tree holds it (not copied), or of None if there is no such leaf (no
/// chunk of it has sums). The one lookup of a leaf: sums are read from it
/// with `SumsLeaf::lookup`, or changed through [`change_leaf`] (`check`
/// parses every leaf whole).
fn with_leaf<T>(meta: &Meta, key: u64, f: impl FnOnce(Option<&[u8]>) -> T) -> Result<T> {
    Tree::new(meta, TreeKind::Sums, meta.sums_root()).get_with(key, f)
}

/// The sums of blocks `blocks` of chunk `pchunk`, from its leaf's value.
fn lookup_blocks(
    geo: arbor_format::SumsGeometry,
    value: Option<&[u8]>,
    pchunk: u64,
    blocks: std::ops::Range<u32>,
) -> impl Iterator<Item = Option<u32>> + '_ {
    let index = geo.slot(pchunk).index;
    blocks.map(move |b| value.and_then(|v| SumsLeaf::lookup(geo, v, index, b)))
}

impl ChunkSums {
    /// The sums of chunk `pchunk` in the transaction.
    pub fn of(meta: &Meta, pchunk: u64) -> Result<Self> {
        let geo = meta.geo().sums;
        let blocks = with_leaf(meta, geo.slot(pchunk).leaf, |value| {
            lookup_blocks(geo, value, pchunk, 0..geo.blocks()).collect()
        })?;
        Ok(Self { pchunk, blocks })
    }

    /// The sum of block `block`, if it has one.
    pub fn get(&self, block: u32) -> Option<u32> {
        self.blocks.get(block as usize).copied().flatten()
    }

    /// How many of the chunk's blocks have no sum.
    pub fn missing(&self) -> u64 {
        self.blocks.iter().filter(|s| s.is_none()).count() as u64
    }

    /// Checks `data`, the chunk's bytes from block `first` on (whole
    /// blocks), against the sums: the first block that has a sum and does
    /// not match it.
    pub fn verify(&self, first: u32, data: &[u8]) -> Result<(), Damage> {
        debug_assert!(data.len().is_multiple_of(SUM_BLOCK));
        for (bytes, block) in data.chunks(SUM_BLOCK).zip(first..) {
            check(self.pchunk, block, self.get(block), bytes)?;
        }
        Ok(())
    }
}

fn check(pchunk: u64, block: u32, stored: Option<u32>, bytes: &[u8]) -> Result<(), Damage> {
    let Some(stored) = stored else {
        return Ok(());
    };
    let computed = block_sum(bytes);
    if stored == computed {
        Ok(())
    } else {
        Err(Damage {
            pchunk,
            block,
            stored,
            computed,
        })
    }
}

/// The sums a read needs, taken from the transaction under the lock that
/// resolved its mapping, to verify the data after the lock is released.
#[derive(Debug, Default)]
pub(crate) struct ReadSums {
    /// Device ranges of whole blocks: where each starts, and the sum of
    /// each of its blocks, if it has one.
    ranges: Vec<(u64, Vec<Option<u32>>)>,
}

impl ReadSums {
    /// Takes the sums of the blocks of the device range `[at, at + len)`
    /// (rounded out to whole blocks).
    pub fn add_range(&mut self, meta: &Meta, at: u64, len: u64) -> Result<()> {
        let geo = meta.geo();
        let (first, end) = block_span(at, len);
        let mut sums = Vec::with_capacity(((end - first) / SUM_BLOCK_U64) as usize);
        let mut pos = first;
        while pos < end {
            let Some((pchunk, within)) = geo.chunk_at(pos) else {
                return Err(Error::inconsistent(format!(
                    "a read of device byte {pos}, outside the data"
                )));
            };
            let upto = (end - pos).min(geo.chunk_size - within);
            // Below the chunk's block count, u32s.
            let blocks = (within / SUM_BLOCK_U64) as u32..((within + upto) / SUM_BLOCK_U64) as u32;
            with_leaf(meta, geo.sums.slot(pchunk).leaf, |value| {
                sums.extend(lookup_blocks(geo.sums, value, pchunk, blocks))
            })?;
            pos += upto;
        }
        self.ranges.push((first, sums));
        Ok(())
    }

    /// Checks `data`, read from device byte `at` (a block boundary), block
    /// by block against the sums taken.
    pub fn verify(&self, geo: &Geometry, at: u64, data: &[u8]) -> Result<()> {
        debug_assert!(at.is_multiple_of(SUM_BLOCK_U64) && data.len().is_multiple_of(SUM_BLOCK));
        let blocks = data.len() / SUM_BLOCK;
        // Every range verified was added.
        let taken = self.ranges.iter().find_map(|(start, sums)| {
            let skip = usize::try_from(at.checked_sub(*start)? / SUM_BLOCK_U64).ok()?;
            sums.get(skip..skip.checked_add(blocks)?)
        });
        let Some(taken) = taken else {
            return Err(Error::inconsistent(format!(
                "verifying device bytes from {at} whose sums were not taken"
            )));
        };
        for (i, (bytes, &stored)) in data.chunks(SUM_BLOCK).zip(taken).enumerate() {
            let pos = at + (i * SUM_BLOCK) as u64;
            let Some((pchunk, within)) = geo.chunk_at(pos) else {
                continue;
            };
            // Below the chunk's block count, a u32.
            check(pchunk, (within / SUM_BLOCK_U64) as u32, stored, bytes)?;
        }
        Ok(())
    }
}

/// The whole blocks around `[at, at + len)`: their first byte and the end.
pub(crate) fn block_span(at: u64, len: u64) -> (u64, u64) {
    let first = at - at % SUM_BLOCK_U64;
    (first, (at + len).next_multiple_of(SUM_BLOCK_U64))
}

/// The sums of whole blocks of data, in order.
pub(crate) fn compute(data: &[u8]) -> Vec<Option<u32>> {
    debug_assert!(data.len().is_multiple_of(SUM_BLOCK));
    data.chunks(SUM_BLOCK).map(|b| Some(block_sum(b))).collect()
}

/// Changes leaf `key` of the open transaction's tree with `f` where its
/// node holds it (the path shadowed, the value neither copied out nor
/// back: the hot path of every write), and removes it once it holds no
/// sum. A missing leaf is made by `f` if `create` (stored only if it then
/// holds a sum), else left missing. The value is checked for its length
/// only (`check` parses every leaf whole).
fn change_leaf(
    meta: &mut Meta,
    key: u64,
    create: bool,
    f: impl Fn(&mut SumsLeaf<&mut [u8]>),
) -> Result<()> {
    change_leaf_within(meta, key, create, None, f)
}

/// [`change_leaf`], where `f` changes only the value's bytes `spans` when
/// given (the open step then logs only those: `TreeMut::update_spans`).
fn change_leaf_within(
    meta: &mut Meta,
    key: u64,
    create: bool,
    spans: Option<&[std::ops::Range<usize>]>,
    f: impl Fn(&mut SumsLeaf<&mut [u8]>),
) -> Result<()> {
    let geo = meta.geo().sums;
    let corrupt = |e| Error::corrupt(format!("checksum leaf {key}"), e);
    meta.with_own_tree(TreeKind::Sums, |tree| {
        let change = |value: &mut [u8]| {
            SumsLeaf::over(geo, value).map(|mut leaf| {
                f(&mut leaf);
                leaf.is_empty()
            })
        };
        let changed = match spans {
            Some(spans) => tree.update_spans(key, spans, change)?,
            None => tree.update(key, change)?,
        };
        match changed {
            Some(Err(e)) => Err(corrupt(e)),
            Some(Ok(true)) => tree.remove(key).map(drop),
            Some(Ok(false)) => Ok(()),
            None if create => {
                let mut value = vec![0u8; arbor_format::SUMS_VALUE_LEN];
                let mut leaf = SumsLeaf::over(geo, &mut value).map_err(corrupt)?;
                f(&mut leaf);
                if leaf.is_empty() {
                    return Ok(());
                }
                tree.insert(key, &value)
            }
            None => Ok(()),
        }
    })
}

/// Sets the sums of chunk `pchunk`'s blocks from `first` on (None clears
/// one), in the open transaction.
#[cfg(test)]
pub(crate) fn set_blocks(
    meta: &mut Meta,
    pchunk: u64,
    first: u32,
    sums: &[Option<u32>],
) -> Result<()> {
    record(
        meta,
        &[BlockSums {
            pchunk,
            first,
            sums: sums.to_vec(),
        }],
    )
}

/// Clears every sum of the chunks of `chunks`, one leaf at a time (chunks
/// allocated again: nothing they held before is their data now).
pub(crate) fn forget_range(meta: &mut Meta, chunks: std::ops::Range<u64>) -> Result<()> {
    let geo = meta.geo().sums;
    let mut pchunk = chunks.start;
    while pchunk < chunks.end {
        let slot = geo.slot(pchunk);
        let in_leaf = (u64::from(geo.chunks() - slot.index)).min(chunks.end - pchunk);
        // Below the leaf's chunk count, u32s.
        let indices = slot.index..slot.index + in_leaf as u32;
        // Looked at where the node holds it first: most chunks allocated
        // have no sums left (a commit clears those it frees), and a leaf
        // changed for nothing would be shadowed and written.
        let any = with_leaf(meta, slot.leaf, |value| {
            value.is_some_and(|v| {
                indices
                    .clone()
                    .any(|i| (0..geo.blocks()).any(|b| SumsLeaf::lookup(geo, v, i, b).is_some()))
            })
        })?;
        if any {
            change_leaf(meta, slot.leaf, false, |leaf| {
                for index in indices.clone() {
                    leaf.clear_chunk(index);
                }
            })?;
        }
        pchunk += in_leaf;
    }
    Ok(())
}

/// Clears the sums of the chunks the open transaction freed (a step before
/// its commit), so that the tree holds sums of live chunks only, and a
/// leaf whose chunks are all free goes.
pub(crate) fn forget_freed(meta: &mut Meta) -> Result<()> {
    let freed = meta.data_freed_in_txn();
    let mut i = 0;
    while i < freed.len() {
        let start = freed[i];
        let mut end = start + 1;
        while i + 1 < freed.len() && freed[i + 1] == end {
            i += 1;
            end += 1;
        }
        forget_range(meta, start..end)?;
        i += 1;
    }
    Ok(())
}

/// Sums to record for some blocks of one data chunk, from block `first` on
/// (None: the block has none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BlockSums {
    pub pchunk: u64,
    pub first: u32,
    pub sums: Vec<Option<u32>>,
}

/// Records `all` in the open transaction, each leaf read and written
/// once for all the chunks of `all` it holds.
pub(crate) fn record(meta: &mut Meta, all: &[BlockSums]) -> Result<()> {
    let geo = meta.geo().sums;
    for s in all {
        let fits = u32::try_from(s.sums.len())
            .ok()
            .and_then(|n| s.first.checked_add(n))
            .is_some_and(|end| end <= geo.blocks());
        if !fits {
            return Err(Error::inconsistent(format!(
                "sums of blocks {}+{} of a chunk of {} blocks",
                s.first,
                s.sums.len(),
                geo.blocks()
            )));
        }
    }
    let mut order: Vec<&BlockSums> = all.iter().collect();
    order.sort_by_key(|s| s.pchunk);
    let mut i = 0;
    while i < order.len() {
        let key = geo.slot(order[i].pchunk).leaf;
        let same = order[i..]
            .iter()
            .take_while(|s| geo.slot(s.pchunk).leaf == key)
            .count();
        let group = &order[i..i + same];
        // Only the group's crcs and bits change (a leaf left empty is then
        // removed, a change logged as any other).
        let spans: Vec<std::ops::Range<usize>> = group
            .iter()
            .filter(|s| !s.sums.is_empty())
            .flat_map(|s| {
                // `fits` above: first + len <= blocks, a u32.
                geo.set_spans(geo.slot(s.pchunk).index, s.first, s.sums.len() as u32)
            })
            .collect();
        change_leaf_within(meta, key, true, Some(&spans), |leaf| {
            for s in group {
                let index = geo.slot(s.pchunk).index;
                for (block, &sum) in (s.first..).zip(&s.sums) {
                    leaf.set(index, block, sum);
                }
            }
        })?;
        i += same;
    }
    Ok(())
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
            assert_eq!(got.verify(0, &data), Ok(()));
            let near = ChunkSums::of(meta, 301).unwrap();
            assert_eq!(
                (near.get(0), near.get(1), near.get(2), near.get(3)),
                (None, None, sums[0], None)
            );
            assert_eq!(ChunkSums::of(meta, 1000).unwrap().blocks, got.blocks);
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
        let m = got.verify(0, &data).expect_err("the flip is found");
        assert_eq!(m.block, 2);
        assert_eq!(m.stored, sums[2].unwrap());
        assert_eq!(m.computed, block_sum(&data[2 * 4096..3 * 4096]));
        // Block 3 has no sum: its damage is not detectable.
        assert_eq!(got.verify(3, &data[3 * 4096..]), Ok(()));
        // From block 1 on, the same first mismatch.
        assert_eq!(got.verify(1, &data[4096..]), Err(m));
    }

    #[test]
    fn forgetting_every_sum_of_a_leaf_removes_it() {
        let mut meta = fresh_meta_with(4096);
        set_blocks(&mut meta, 42, 0, &[Some(1)]).unwrap();
        assert!(!meta.sums_root().is_none());
        forget_range(&mut meta, 42..43).unwrap();
        assert!(meta.sums_root().is_none());
        assert!(set_blocks(&mut meta, 42, 1, &[Some(1)]).is_err());
        assert!(set_blocks(&mut meta, 42, u32::MAX, &[Some(1)]).is_err());
    }

    #[test]
    fn forgetting_a_range_clears_only_it_across_leaves() {
        let mut meta = fresh_meta_with(16384);
        for c in [0, 100, 244, 245, 300, 600] {
            set_blocks(&mut meta, c, 0, &[Some(c as u32 + 1); 4]).unwrap();
        }
        forget_range(&mut meta, 100..301).unwrap();
        let has = |meta: &Meta, c| ChunkSums::of(meta, c).unwrap().get(3).is_some();
        assert!(has(&meta, 0) && has(&meta, 600));
        assert!(!has(&meta, 100) && !has(&meta, 244) && !has(&meta, 245) && !has(&meta, 300));
    }

    /// Steps that record sums (a leaf changed span by span, logged byte
    /// by byte; leaves added and emptied; the same leaf changed again in
    /// one step, before and after a change logged whole) and then fail
    /// leave every sum as before the step; those that succeed leave the
    /// model's. Checked across commits, so leaves are clean, dirty from an
    /// earlier step, or new in the step.
    #[test]
    fn failed_steps_undo_every_recorded_sum_exactly() {
        use rand::{rngs::StdRng, Rng, SeedableRng};
        use std::collections::BTreeMap;
        let mut meta = fresh_meta_with(16384);
        let blocks = meta.geo().sums.blocks();
        let mut rng = StdRng::seed_from_u64(40);
        let mut model: BTreeMap<(u64, u32), u32> = BTreeMap::new();
        let chunks = [0u64, 1, 2, 244, 245, 246, 600, 601, 5000];
        let matches = |meta: &Meta, model: &BTreeMap<(u64, u32), u32>| {
            for &c in &chunks {
                let got = ChunkSums::of(meta, c).unwrap();
                for b in 0..blocks {
                    assert_eq!(
                        got.get(b),
                        model.get(&(c, b)).copied(),
                        "chunk {c} block {b}"
                    );
                }
            }
        };
        for round in 0..200 {
            let mut after = model.clone();
            let fail = rng.gen_bool(0.5);
            let step = meta.begin_step(crate::meta::Privilege::Normal);
            let mut result: Result<()> = Ok(());
            for _ in 0..rng.gen_range(1..6) {
                let pchunk = chunks[rng.gen_range(0..chunks.len())];
                let first = rng.gen_range(0..blocks);
                let n = rng.gen_range(1..=blocks - first);
                let sums: Vec<Option<u32>> = (0..n)
                    .map(|_| rng.gen_bool(0.8).then(|| rng.gen()))
                    .collect();
                for (b, sum) in (first..).zip(&sums) {
                    match sum {
                        Some(v) => after.insert((pchunk, b), *v),
                        None => after.remove(&(pchunk, b)),
                    };
                }
                // One record per write: the same leaf changed again.
                let w = BlockSums {
                    pchunk,
                    first,
                    sums,
                };
                result = result.and_then(|()| record(&mut meta, &[w]));
                if rng.gen_bool(0.2) {
                    // A change that logs the whole leaf between patches.
                    result = result.and_then(|()| forget_range(&mut meta, 5000..5001));
                    after.retain(|&(c, _), _| c != 5000);
                }
            }
            let result = result.and_then(|()| {
                if fail {
                    Err(Error::inconsistent("injected".to_string()))
                } else {
                    Ok(())
                }
            });
            assert_eq!(meta.end_step(step, result).is_ok(), !fail);
            if !fail {
                model = after;
            }
            matches(&meta, &model);
            if round % 17 == 0 {
                meta.commit().unwrap();
                matches(&meta, &model);
            }
        }
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
