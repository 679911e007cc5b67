//! Property test: long random sequences of volume operations against a
//! simple in-memory model of every volume's bytes. After every sequence each
//! volume reads exactly as the model says and `check` is clean. Along the way:
//! diffs cover every byte that differs, and deleting a volume frees exactly
//! its reported exclusive bytes.
// A test crate: unwrap, expect and panic are how a test reports failure
// (the workspace denies them in the code it ships; clippy.toml allows
// them in #[test] functions, this in the helpers around them).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeMap;

use arbor_engine::{Durability, Error, Pool, Refusal, VolumeId};
use arbor_io::SimDisk;
use common::*;
use proptest::prelude::*;
use proptest::strategy::ValueTree;

/// Chunk sizes the model runs at: 4 KiB (nothing is copied), and 16 and
/// 64 KiB, where a write of whole 4 KiB blocks into a shared chunk maps a
/// partial extent (FORMAT.md §6.3) and later writes extend, overwrite or
/// copy it.
const CHUNK: u64 = 4096;
const CHUNK_16K: u64 = 16384;
const CHUNK_64K: u64 = 65536;
const MAX_VOL_SECTORS: u64 = 1024; // 512 KiB

#[derive(Debug, Clone)]
enum Op {
    Create {
        sectors: u64,
    },
    Write {
        vol: usize,
        sector: u64,
        sectors: u64,
        tag: u64,
    },
    /// Whole 4 KiB blocks, exactly (no jitter): the writes that make,
    /// extend, copy and stack partial extents at larger chunks.
    Blocks {
        vol: usize,
        block: u64,
        blocks: u64,
        tag: u64,
    },
    Discard {
        vol: usize,
        sector: u64,
        sectors: u64,
    },
    Zero {
        vol: usize,
        sector: u64,
        sectors: u64,
        keep: bool,
    },
    /// `deferred`: durable at the next commit (`Durability::Deferred`), so
    /// later writes in the same transaction must not reach it.
    Snapshot {
        vol: usize,
        deferred: bool,
    },
    Clone {
        snap: usize,
        deferred: bool,
    },
    Delete {
        any: usize,
    },
    Rollback {
        vol: usize,
        snap: usize,
    },
    Resize {
        vol: usize,
        sectors: u64,
    },
    Rename {
        any: usize,
    },
    Diff {
        a: usize,
        b: usize,
    },
    Reclaim {
        nodes: usize,
    },
    Flush,
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    op_mix(12, 6, 3)
}

/// Operations for larger chunks, where whole-block writes into chunks
/// that snapshots share make, extend, copy and stack partial extents: the
/// same kinds as [`op`], weighted towards those writes and snapshots.
fn partial_op() -> impl Strategy<Value = Op> {
    op_mix(3, 14, 4)
}

/// Every kind of operation; `write`, `blocks` and `snapshot` weigh plain
/// writes, whole-block writes and snapshots against the others.
fn op_mix(write: u32, blocks: u32, snapshot: u32) -> impl Strategy<Value = Op> {
    let idx = 0usize..64;
    prop_oneof![
        2 => (8u64..MAX_VOL_SECTORS).prop_map(|sectors| Op::Create { sectors }),
        write => (idx.clone(), 0u64..MAX_VOL_SECTORS, 1u64..64, any::<u64>())
            .prop_map(|(vol, sector, sectors, tag)| Op::Write { vol, sector, sectors, tag }),
        blocks => (idx.clone(), 0u64..MAX_VOL_SECTORS / 8, 1u64..4, any::<u64>())
            .prop_map(|(vol, block, blocks, tag)| Op::Blocks { vol, block, blocks, tag }),
        2 => (idx.clone(), 0u64..MAX_VOL_SECTORS, 1u64..64).prop_map(|(vol, sector, sectors)| Op::Discard { vol, sector, sectors }),
        1 => (idx.clone(), 0u64..MAX_VOL_SECTORS, 1u64..64, any::<bool>())
            .prop_map(|(vol, sector, sectors, keep)| Op::Zero { vol, sector, sectors, keep }),
        snapshot => (idx.clone(), any::<bool>()).prop_map(|(vol, deferred)| Op::Snapshot { vol, deferred }),
        2 => (idx.clone(), any::<bool>()).prop_map(|(snap, deferred)| Op::Clone { snap, deferred }),
        2 => idx.clone().prop_map(|any| Op::Delete { any }),
        1 => (idx.clone(), idx.clone()).prop_map(|(vol, snap)| Op::Rollback { vol, snap }),
        1 => (idx.clone(), 1u64..MAX_VOL_SECTORS).prop_map(|(vol, sectors)| Op::Resize { vol, sectors }),
        1 => idx.clone().prop_map(|any| Op::Rename { any }),
        1 => (idx.clone(), idx.clone()).prop_map(|(a, b)| Op::Diff { a, b }),
        1 => (1usize..50).prop_map(|nodes| Op::Reclaim { nodes }),
        1 => Just(Op::Flush),
        1 => Just(Op::Reopen),
    ]
}

fn durability(deferred: bool) -> Durability {
    if deferred {
        Durability::Deferred
    } else {
        Durability::Committed
    }
}

#[derive(Debug, Clone)]
struct ModelVolume {
    data: Vec<u8>,
    snapshot: bool,
    /// Name of the volume a snapshot was taken of.
    origin: Option<String>,
}

struct Harness {
    chunk: u64,
    disk: SimDisk,
    pool: Option<Pool>,
    model: BTreeMap<String, ModelVolume>,
    counter: u64,
}

impl Harness {
    fn pool(&self) -> &Pool {
        self.pool.as_ref().expect("pool is open")
    }

    fn names(&self, snapshots: Option<bool>) -> Vec<String> {
        self.model
            .iter()
            .filter(|(_, v)| snapshots.is_none_or(|s| v.snapshot == s))
            .map(|(n, _)| n.clone())
            .collect()
    }

    fn pick(&self, snapshots: Option<bool>, i: usize) -> Option<String> {
        let names = self.names(snapshots);
        (!names.is_empty()).then(|| names[i % names.len()].clone())
    }

    fn id(&self, name: &str) -> VolumeId {
        self.pool().lookup(name).unwrap()
    }

    fn fresh(&mut self, prefix: &str) -> String {
        self.counter += 1;
        format!("{prefix}{}", self.counter)
    }

    /// Clamps a sector range to the volume; None when empty. I/O is
    /// byte-granular (NBD clients that negotiate no block size send any
    /// offset and length): two thirds of the ranges are moved off sector
    /// boundaries at either end, by amounts derived from the range.
    fn clamp(&self, name: &str, sector: u64, sectors: u64) -> Option<(u64, u64)> {
        let size = self.model[name].data.len() as u64;
        let jitter = (sector.wrapping_mul(7919) ^ sectors.wrapping_mul(104_729)) % (3 * 512 * 512);
        let (head, tail) = if jitter < 512 * 512 {
            (0, 0)
        } else {
            (jitter % 512, jitter / 512 % 512)
        };
        let offset = (sector * 512 + head) % size;
        let len = (sectors * 512).saturating_sub(tail).min(size - offset);
        (len > 0).then_some((offset, len))
    }

    fn apply(&mut self, op: &Op) {
        match *op {
            Op::Create { sectors } => {
                let name = self.fresh("v");
                self.pool().create_volume(&name, sectors * 512).unwrap();
                let vol = ModelVolume {
                    data: vec![0; (sectors * 512) as usize],
                    snapshot: false,
                    origin: None,
                };
                self.model.insert(name, vol);
            }
            Op::Write {
                vol,
                sector,
                sectors,
                tag,
            } => {
                let Some(name) = self.pick(Some(false), vol) else {
                    return;
                };
                let Some((offset, len)) = self.clamp(&name, sector, sectors) else {
                    return;
                };
                let data = pattern(tag, offset, len as usize);
                self.pool().write(self.id(&name), offset, &data).unwrap();
                self.model.get_mut(&name).unwrap().data[offset as usize..(offset + len) as usize]
                    .copy_from_slice(&data);
            }
            Op::Blocks {
                vol,
                block,
                blocks,
                tag,
            } => {
                let Some(name) = self.pick(Some(false), vol) else {
                    return;
                };
                let whole = self.model[&name].data.len() as u64 / 4096;
                if whole == 0 {
                    return;
                }
                let offset = block % whole * 4096;
                let len = (blocks * 4096).min(whole * 4096 - offset);
                let data = pattern(tag, offset, len as usize);
                self.pool().write(self.id(&name), offset, &data).unwrap();
                self.model.get_mut(&name).unwrap().data[offset as usize..(offset + len) as usize]
                    .copy_from_slice(&data);
            }
            Op::Discard {
                vol,
                sector,
                sectors,
            }
            | Op::Zero {
                vol,
                sector,
                sectors,
                keep: false,
            } => {
                let Some(name) = self.pick(Some(false), vol) else {
                    return;
                };
                let Some((offset, len)) = self.clamp(&name, sector, sectors) else {
                    return;
                };
                self.pool().discard(self.id(&name), offset, len).unwrap();
                self.model.get_mut(&name).unwrap().data[offset as usize..(offset + len) as usize]
                    .fill(0);
            }
            Op::Zero {
                vol,
                sector,
                sectors,
                keep: true,
            } => {
                let Some(name) = self.pick(Some(false), vol) else {
                    return;
                };
                let Some((offset, len)) = self.clamp(&name, sector, sectors) else {
                    return;
                };
                self.pool()
                    .write_zeroes(self.id(&name), offset, len, true)
                    .unwrap();
                self.model.get_mut(&name).unwrap().data[offset as usize..(offset + len) as usize]
                    .fill(0);
                let map = self
                    .pool()
                    .allocation_map(self.id(&name), offset, len)
                    .unwrap();
                assert!(
                    map.iter().all(|r| r.mapped),
                    "write_zeroes with keep_allocation left holes: {map:?}"
                );
            }
            Op::Snapshot { vol, deferred } => {
                let Some(name) = self.pick(Some(false), vol) else {
                    return;
                };
                let snap = format!("{name}@{}", self.fresh("s"));
                self.pool()
                    .snapshot_with(&snap, durability(deferred))
                    .unwrap();
                let data = self.model[&name].data.clone();
                self.model.insert(
                    snap,
                    ModelVolume {
                        data,
                        snapshot: true,
                        origin: Some(name),
                    },
                );
            }
            Op::Clone { snap, deferred } => {
                let Some(snap) = self.pick(Some(true), snap) else {
                    return;
                };
                let name = self.fresh("c");
                self.pool()
                    .clone_snapshot_with(&snap, &name, durability(deferred))
                    .unwrap();
                let data = self.model[&snap].data.clone();
                self.model.insert(
                    name,
                    ModelVolume {
                        data,
                        snapshot: false,
                        origin: None,
                    },
                );
            }
            Op::Delete { any } => {
                let Some(name) = self.pick(None, any) else {
                    return;
                };
                self.delete_and_check_freed(&name);
            }
            Op::Rollback { vol, snap } => {
                let Some(name) = self.pick(Some(false), vol) else {
                    return;
                };
                let snaps: Vec<String> = self
                    .names(Some(true))
                    .into_iter()
                    .filter(|s| self.model[s].origin.as_deref() == Some(name.as_str()))
                    .collect();
                if snaps.is_empty() {
                    return;
                }
                let snap_name = snaps[snap % snaps.len()].clone();
                self.pool().rollback(&name, &snap_name).unwrap();
                let data = self.model[&snap_name].data.clone();
                self.model.get_mut(&name).unwrap().data = data;
            }
            Op::Resize { vol, sectors } => {
                let Some(name) = self.pick(Some(false), vol) else {
                    return;
                };
                self.pool().resize(&name, sectors * 512).unwrap();
                self.model
                    .get_mut(&name)
                    .unwrap()
                    .data
                    .resize((sectors * 512) as usize, 0);
            }
            Op::Rename { any } => {
                let Some(name) = self.pick(Some(false), any) else {
                    return;
                };
                let new_name = self.fresh("r");
                self.pool().rename(&name, &new_name).unwrap();
                let vol = self.model.remove(&name).unwrap();
                self.model.insert(new_name.clone(), vol);
                let prefix = format!("{name}@");
                for snap in self.names(Some(true)) {
                    if let Some(rest) = snap.strip_prefix(&prefix) {
                        let mut s = self.model.remove(&snap).unwrap();
                        s.origin = Some(new_name.clone());
                        self.model.insert(format!("{new_name}@{rest}"), s);
                    }
                }
            }
            Op::Diff { a, b } => {
                let (Some(a), Some(b)) = (self.pick(None, a), self.pick(None, b)) else {
                    return;
                };
                self.check_diff(&a, &b);
            }
            Op::Reclaim { nodes } => {
                self.pool().reclaim(nodes).unwrap();
                self.pool().fill_partials(nodes).unwrap();
            }
            Op::Flush => self.pool().flush().unwrap(),
            Op::Reopen => {
                self.pool.take().unwrap().close().unwrap();
                self.pool = Some(reopen(&self.disk));
            }
        }
    }

    /// Deleting a volume frees exactly its exclusive bytes, once reclaimed.
    fn delete_and_check_freed(&mut self, name: &str) {
        let pool = self.pool();
        let id = self.id(name);
        while pool.reclaim(1000).unwrap() > 0 {}
        let exclusive = pool.volume_stats(id).unwrap().exclusive_bytes;
        let before = pool.pool_stats().unwrap().data_used_bytes;
        pool.delete(name).unwrap();
        assert!(matches!(
            pool.lookup(name),
            Err(Error::Refused(Refusal::NotFound(_)))
        ));
        while pool.reclaim(1000).unwrap() > 0 {}
        let after = pool.pool_stats().unwrap().data_used_bytes;
        assert_eq!(
            before - after,
            exclusive,
            "deleting {name} freed a different amount than its exclusive bytes"
        );
        self.model.remove(name);
    }

    /// Every byte that differs between two volumes lies in a reported range.
    fn check_diff(&self, a: &str, b: &str) {
        let ranges = self.pool().diff(self.id(a), self.id(b)).unwrap();
        let (da, db) = (&self.model[a].data, &self.model[b].data);
        let len = da.len().max(db.len());
        for chunk_start in (0..len).step_by(self.chunk as usize) {
            let end = (chunk_start + self.chunk as usize).min(len);
            let byte = |d: &Vec<u8>, i: usize| d.get(i).copied().unwrap_or(0);
            let differs = (chunk_start..end).any(|i| byte(da, i) != byte(db, i));
            let reported = ranges
                .iter()
                .any(|&(o, l)| o <= chunk_start as u64 && (chunk_start as u64) < o + l);
            assert!(
                !differs || reported,
                "diff {a} vs {b} misses chunk at {chunk_start}: {ranges:?}"
            );
        }
        if a == b {
            assert!(ranges.is_empty());
        }
    }

    fn verify(&self) {
        let pool = self.pool();
        let listed: Vec<String> = pool.list().unwrap().into_iter().map(|i| i.name).collect();
        assert_eq!(listed, self.names(None));
        for (name, vol) in &self.model {
            let id = self.id(name);
            assert_eq!(
                pool.info(id).unwrap().size,
                vol.data.len() as u64,
                "{name} size"
            );
            let mut buf = vec![0xEEu8; vol.data.len()];
            pool.read(id, 0, &mut buf).unwrap();
            if let Some(at) = buf.iter().zip(&vol.data).position(|(x, y)| x != y) {
                panic!("{name} differs from the model at byte {at}");
            }
        }
        assert_clean(pool);
    }
}

fn run(ops: &[Op]) {
    run_at(ops, CHUNK);
}

/// Runs `ops` at chunks of `chunk` bytes, then reclaims and fills; returns
/// the check report taken after the operations (before the reclaim).
fn run_at(ops: &[Op], chunk: u64) -> arbor_engine::CheckReport {
    let (disk, pool) = sim_pool(48 * MIB, chunk as u32);
    let mut h = Harness {
        chunk,
        disk,
        pool: Some(pool),
        model: BTreeMap::new(),
        counter: 0,
    };
    h.apply(&Op::Create { sectors: 256 });
    for op in ops {
        h.apply(op);
    }
    h.verify();
    let report = h.pool().check().unwrap();
    while h.pool().reclaim(1000).unwrap() > 0 {}
    h.verify();
    while h.pool().fill_partials(1000).unwrap() > 0 {}
    assert!(!h.pool().fill_wanted(), "a sweep that filled nothing ends");
    h.verify();
    report
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, max_shrink_iters: 2000, .. ProptestConfig::default() })]

    #[test]
    fn engine_matches_model(ops in prop::collection::vec(op(), 1..80)) {
        run(&ops);
    }

    #[test]
    fn engine_matches_model_with_partial_extents(
        ops in prop::collection::vec(partial_op(), 1..200),
        big in any::<bool>(),
    ) {
        run_at(&ops, if big { CHUNK_64K } else { CHUNK_16K });
    }
}

/// The same 600 operations every time (proptest's deterministic runner).
fn long_sequence() -> Vec<Op> {
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    prop::collection::vec(op(), 600)
        .new_tree(&mut runner)
        .unwrap()
        .current()
}

/// A long deterministic run that builds deep family trees and multi-level B-trees.
#[test]
fn long_sequence_with_deep_trees() {
    run(&long_sequence());
}

/// [`long_sequence_with_deep_trees`] at 16 KiB chunks, where writes make,
/// extend and copy partial extents.
#[test]
fn long_sequence_with_partial_extents() {
    run_at(&long_sequence(), CHUNK_16K);
}

/// 600 operations weighted to whole-block writes and snapshots at 16 KiB
/// chunks (the same every time), which must reach partial extents with
/// middle layers: the sequence tests them, not only chunks mapped whole.
#[test]
fn long_sequence_of_block_writes_makes_layered_partials() {
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let ops = prop::collection::vec(partial_op(), 600)
        .new_tree(&mut runner)
        .unwrap()
        .current();
    let report = run_at(&ops, CHUNK_16K);
    assert!(report.partial_extents > 0, "{report:?}");
    assert!(report.layered_partials > 0, "{report:?}");
}
