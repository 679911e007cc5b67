//! Property test: random sequences of writes to a copy-on-write volume (on
//! an external device, or with its home in the pool), snapshots of it, clones of the snapshots, writes
//! and snapshots of the clones, rollbacks, destroys, reclaim, flushes and
//! restarts, against a model of every volume's bytes. After every step
//! each volume reads as the model says and the device itself, read
//! without arbor, holds the origin's model; at the end `check` is clean,
//! and once every snapshot and clone is destroyed and reclaimed, no copy
//! is left behind.
// A test crate: unwrap, expect and panic are how a test reports failure
// (the workspace denies them in the code it ships; clippy.toml allows
// them in #[test] functions, this in the helpers around them).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use arbor_engine::{DeviceIdentity, Error, Pool, Resource, VolumeId, VolumeLayout};
use arbor_io::{BlockDevice, SimDisk};
use common::*;
use proptest::prelude::*;

const CS: u64 = 4096;
/// Not a whole number of chunks: the last chunk is partial.
const ORIGIN: u64 = 24 * CS + 1536;
const SECTORS: u64 = ORIGIN / 512;
const ID: DeviceIdentity = DeviceIdentity { dev: 1, ino: 2 };
/// A copy-on-write volume of one chunk created right after an in-pool
/// home, so that its growths move it.
const WALL: &str = "wall";

#[derive(Debug, Clone)]
enum Op {
    WriteOrigin {
        sector: u64,
        sectors: u64,
        tag: u8,
    },
    ZeroOrigin {
        sector: u64,
        sectors: u64,
    },
    Snapshot,
    Clone {
        snap: usize,
    },
    WriteClone {
        clone: usize,
        sector: u64,
        sectors: u64,
        tag: u8,
    },
    DiscardClone {
        clone: usize,
        sector: u64,
        sectors: u64,
    },
    SnapshotClone {
        clone: usize,
    },
    RollbackClone {
        clone: usize,
        snap: usize,
    },
    Rollback {
        snap: usize,
    },
    Delete {
        reader: usize,
    },
    Reclaim,
    Flush,
    Reopen,
    /// The volume grows by this many chunks (a home in the pool in place,
    /// or moving when the chunks after it are taken).
    Grow {
        chunks: u64,
    },
}

fn range() -> impl Strategy<Value = (u64, u64)> {
    (0..SECTORS).prop_flat_map(|s| (Just(s), 1..=(SECTORS - s).min(40)))
}

fn op() -> impl Strategy<Value = Op> {
    let idx = 0usize..32;
    prop_oneof![
        12 => (range(), any::<u8>()).prop_map(|((sector, sectors), tag)| Op::WriteOrigin { sector, sectors, tag }),
        2 => range().prop_map(|(sector, sectors)| Op::ZeroOrigin { sector, sectors }),
        5 => Just(Op::Snapshot),
        3 => idx.clone().prop_map(|snap| Op::Clone { snap }),
        6 => (idx.clone(), range(), any::<u8>()).prop_map(|(clone, (sector, sectors), tag)| Op::WriteClone { clone, sector, sectors, tag }),
        1 => (idx.clone(), range()).prop_map(|(clone, (sector, sectors))| Op::DiscardClone { clone, sector, sectors }),
        2 => idx.clone().prop_map(|clone| Op::SnapshotClone { clone }),
        1 => (idx.clone(), idx.clone()).prop_map(|(clone, snap)| Op::RollbackClone { clone, snap }),
        2 => idx.clone().prop_map(|snap| Op::Rollback { snap }),
        3 => idx.prop_map(|reader| Op::Delete { reader }),
        1 => Just(Op::Reclaim),
        1 => Just(Op::Flush),
        1 => Just(Op::Reopen),
        1 => (1u64..4).prop_map(|chunks| Op::Grow { chunks }),
    ]
}

fn bytes(tag: u8, sector: u64, sectors: u64) -> Vec<u8> {
    (0..sectors * 512)
        .map(|i| tag.wrapping_add(((sector * 512 + i) / 512) as u8) | 1)
        .collect()
}

struct World {
    disk: SimDisk,
    /// The external device (None: the volume's home is in the pool).
    device: Option<SimDisk>,
    pool: Option<Pool>,
    origin: Vec<u8>,
    /// Every snapshot and clone by name: its model.
    readers: BTreeMap<String, Vec<u8>>,
    next: u32,
}

impl World {
    fn new(external: bool) -> Self {
        let (disk, pool) = sim_pool(16 * MIB, CS as u32);
        let origin: Vec<u8> = (0..ORIGIN).map(|i| (i / 512) as u8 ^ 0x5a).collect();
        let device = if external {
            let device = SimDisk::from_image(origin.clone());
            let dev: Arc<dyn BlockDevice> = Arc::new(device.clone());
            pool.attach_origin("disk", dev, ID).unwrap();
            Some(device)
        } else {
            // Old data in freed chunks first: the home must not show it.
            let junk = pool.create_volume("junk", 2 * MIB).unwrap();
            pool.write(junk, 0, &vec![0xee; 2 * MIB as usize]).unwrap();
            pool.delete("junk").unwrap();
            while pool.reclaim(4096).unwrap() > 0 {}
            let id = pool.create_cow_volume("disk", ORIGIN).unwrap();
            let mut zeros = vec![1u8; ORIGIN as usize];
            pool.read(id, 0, &mut zeros).unwrap();
            assert!(zeros.iter().all(|&b| b == 0), "a new home shows old data");
            pool.write(id, 0, &origin).unwrap();
            // A home right after it (the first free run): its first
            // growth moves it.
            pool.create_cow_volume(WALL, CS).unwrap();
            None
        };
        Self {
            disk,
            device,
            pool: Some(pool),
            origin,
            readers: BTreeMap::new(),
            next: 0,
        }
    }

    fn pool(&self) -> &Pool {
        self.pool.as_ref().unwrap()
    }

    fn id(&self, name: &str) -> VolumeId {
        self.pool().lookup(name).unwrap()
    }

    fn pick(&self, i: usize, f: impl Fn(&str) -> bool) -> Option<String> {
        let names: Vec<&String> = self.readers.keys().filter(|n| f(n)).collect();
        (!names.is_empty()).then(|| names[i % names.len()].clone())
    }

    fn fresh(&mut self, prefix: &str) -> String {
        self.next += 1;
        format!("{prefix}{}", self.next)
    }

    fn apply(&mut self, op: &Op) {
        let is_clone = |n: &str| !n.contains('@');
        match *op {
            Op::WriteOrigin {
                sector,
                sectors,
                tag,
            } => {
                let data = bytes(tag, sector, sectors);
                self.pool()
                    .write(self.id("disk"), sector * 512, &data)
                    .unwrap();
                let at = (sector * 512) as usize;
                self.origin[at..at + data.len()].copy_from_slice(&data);
            }
            Op::ZeroOrigin { sector, sectors } => {
                self.pool()
                    .write_zeroes(self.id("disk"), sector * 512, sectors * 512, false)
                    .unwrap();
                let at = (sector * 512) as usize;
                self.origin[at..at + (sectors * 512) as usize].fill(0);
            }
            Op::Snapshot => {
                let name = self.fresh("disk@s");
                self.pool().snapshot(&name).unwrap();
                self.readers.insert(name, self.origin.clone());
            }
            Op::Clone { snap } => {
                let Some(snap) = self.pick(snap, |n| n.starts_with("disk@")) else {
                    return;
                };
                let name = self.fresh("c");
                self.pool().clone_snapshot(&snap, &name).unwrap();
                let model = self.readers[&snap].clone();
                self.readers.insert(name, model);
            }
            Op::WriteClone {
                clone,
                sector,
                sectors,
                tag,
            } => {
                let Some(name) = self.pick(clone, is_clone) else {
                    return;
                };
                let data = bytes(tag, sector, sectors);
                self.pool()
                    .write(self.id(&name), sector * 512, &data)
                    .unwrap();
                let at = (sector * 512) as usize;
                self.readers.get_mut(&name).unwrap()[at..at + data.len()].copy_from_slice(&data);
            }
            Op::DiscardClone {
                clone,
                sector,
                sectors,
            } => {
                let Some(name) = self.pick(clone, is_clone) else {
                    return;
                };
                self.pool()
                    .discard(self.id(&name), sector * 512, sectors * 512)
                    .unwrap();
                let at = (sector * 512) as usize;
                self.readers.get_mut(&name).unwrap()[at..at + (sectors * 512) as usize].fill(0);
            }
            Op::SnapshotClone { clone } => {
                let Some(name) = self.pick(clone, is_clone) else {
                    return;
                };
                let snap = format!("{name}@{}", self.fresh("x"));
                self.pool().snapshot(&snap).unwrap();
                let model = self.readers[&name].clone();
                self.readers.insert(snap, model);
            }
            Op::RollbackClone { clone, snap } => {
                let Some(name) = self.pick(clone, is_clone) else {
                    return;
                };
                let prefix = format!("{name}@");
                let Some(snap) = self.pick(snap, |n| n.starts_with(&prefix)) else {
                    return;
                };
                self.pool().rollback(&name, &snap).unwrap();
                let model = self.readers[&snap].clone();
                self.readers.insert(name, model);
            }
            Op::Rollback { snap } => {
                let Some(snap) = self.pick(snap, |n| n.starts_with("disk@")) else {
                    return;
                };
                self.pool().rollback("disk", &snap).unwrap();
                // A snapshot from before a growth: the part it cannot see
                // is written back as it was when first overwritten (the
                // zeros of a file enlarged).
                let size = self.origin.len();
                self.origin = self.readers[&snap].clone();
                self.origin.resize(size, 0);
            }
            Op::Delete { reader } => {
                let Some(name) = self.pick(reader, |_| true) else {
                    return;
                };
                self.pool().delete(&name).unwrap();
                self.readers.remove(&name);
            }
            Op::Reclaim => {
                self.pool().reclaim(64).unwrap();
            }
            Op::Flush => self.pool().flush().unwrap(),
            Op::Grow { chunks } => {
                let size = self.origin.len() as u64 + chunks * CS;
                let grown = self.pool().resize("disk", size);
                // A home in the pool grows in place, or moves to a free
                // run of the new size; with none, nothing changes.
                if self.device.is_none()
                    && matches!(grown, Err(Error::Exhausted(Resource::DataSpace)))
                {
                    return;
                }
                grown.unwrap();
                self.origin.resize(size as usize, 0);
            }
            Op::Reopen => {
                drop(self.pool.take());
                let pool = reopen(&self.disk);
                if let Some(device) = &self.device {
                    let dev: Arc<dyn BlockDevice> = Arc::new(device.clone());
                    pool.attach_origin("disk", dev, ID).unwrap();
                }
                self.pool = Some(pool);
            }
        }
    }

    fn verify(&self, step: usize) {
        let read = |name: &str| {
            let size = self.pool().info(self.id(name)).unwrap().size;
            let mut buf = vec![0u8; size as usize];
            self.pool().read(self.id(name), 0, &mut buf).unwrap();
            buf
        };
        assert!(
            read("disk") == self.origin,
            "step {step}: the origin differs"
        );
        if let Some(device) = &self.device {
            assert!(
                device.handle().visible_image() == self.origin,
                "step {step}: the device differs"
            );
        }
        for (name, model) in &self.readers {
            assert!(read(name) == *model, "step {step}: {name} differs");
        }
    }
}

impl World {
    /// Every pair of the volume and what reads through it: the diff covers
    /// every chunk where their models differ (an incremental stream sends
    /// what the diff finds, so a chunk missed would arrive stale).
    fn verify_diffs(&self) {
        let mut all: Vec<(&str, &Vec<u8>)> = vec![("disk", &self.origin)];
        all.extend(self.readers.iter().map(|(n, m)| (n.as_str(), m)));
        for (i, &(a, ma)) in all.iter().enumerate() {
            for &(b, mb) in &all[i + 1..] {
                let ranges = self.pool().diff(self.id(a), self.id(b)).unwrap();
                for (chunk, (ca, cb)) in ma
                    .chunks(CS as usize)
                    .zip(mb.chunks(CS as usize))
                    .enumerate()
                {
                    let at = chunk as u64 * CS;
                    let covered = ranges.iter().any(|&(o, l)| o <= at && at < o + l);
                    assert!(covered || ca == cb, "diff({a}, {b}) misses chunk {chunk}");
                }
            }
        }
    }
}

fn run(ops: &[Op], external: bool) {
    let mut w = World::new(external);
    for (step, op) in ops.iter().enumerate() {
        w.apply(op);
        w.verify(step);
        if step % 16 == 15 {
            w.verify_diffs();
        }
    }
    w.verify_diffs();
    assert_clean(w.pool());
    // Destroying every reader leaves no copy behind, and each one frees
    // exactly what its statistics said only it held.
    while w.pool().reclaim(4096).unwrap() > 0 {}
    let names: Vec<String> = w.readers.keys().rev().cloned().collect();
    for name in names {
        let exclusive = w.pool().volume_stats(w.id(&name)).unwrap().exclusive_bytes;
        let used = w.pool().pool_stats().unwrap().data_used_bytes;
        w.pool().delete(&name).unwrap();
        while w.pool().reclaim(4096).unwrap() > 0 {}
        let freed = used - w.pool().pool_stats().unwrap().data_used_bytes;
        assert_eq!(freed, exclusive, "destroying {name}");
    }
    if !external {
        w.pool().delete(WALL).unwrap();
    }
    let disk = w.id("disk");
    let home = match w.pool().info(disk).unwrap().layout {
        VolumeLayout::CowExternal { store_bytes, .. } => {
            assert_eq!(store_bytes, 0);
            0
        }
        VolumeLayout::CowInPool { store_bytes, .. } => {
            assert_eq!(store_bytes, 0);
            // Its size: it may have grown.
            w.pool().info(disk).unwrap().size.div_ceil(CS) * CS
        }
        other => panic!("{other:?}"),
    };
    assert_eq!(w.pool().pool_stats().unwrap().data_used_bytes, home);
    assert_clean(w.pool());
    // Destroying the volume frees its home.
    w.pool().delete("disk").unwrap();
    while w.pool().reclaim(4096).unwrap() > 0 {}
    assert_eq!(w.pool().pool_stats().unwrap().data_used_bytes, 0);
    assert_clean(w.pool());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn cow_volumes_match_the_model(ops in prop::collection::vec(op(), 1..80), external in any::<bool>()) {
        run(&ops, external);
    }
}
