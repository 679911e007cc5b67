//! Concurrency test: many threads on many volumes while snapshots, clones,
//! deletes, reclaim and commits run at the same time. Each thread keeps a
//! model of what it owns; at the end (and along the way) every volume and
//! snapshot reads as its owner's model says, and `check` is clean.
// A test crate: unwrap, expect and panic are how a test reports failure
// (the workspace denies them in the code it ships; clippy.toml allows
// them in #[test] functions, this in the helpers around them).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;

use arbor_engine::{Durability, Pool, VolumeId};
use common::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const VOL: usize = 256 * 1024;
const SECTOR: usize = 512;

fn read_all(pool: &Pool, id: VolumeId, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    pool.read(id, 0, &mut buf).unwrap();
    buf
}

fn durability(i: usize) -> Durability {
    if i.is_multiple_of(2) {
        Durability::Deferred
    } else {
        Durability::Committed
    }
}

/// A thread that owns one volume family: writes, snapshots, clones of its
/// snapshots, deletes, verifying its model as it goes.
fn family_worker(pool: Arc<Pool>, t: usize, iterations: usize) {
    let mut rng = StdRng::seed_from_u64(t as u64);
    let name = format!("fam{t}");
    let v = pool.create_volume(&name, VOL as u64).unwrap();
    let mut model = vec![0u8; VOL];
    let mut snaps: Vec<(String, Vec<u8>)> = Vec::new();
    let mut clones: Vec<(VolumeId, Vec<u8>)> = Vec::new();
    for i in 0..iterations {
        match rng.gen_range(0..100) {
            0..=69 => {
                let sectors = rng.gen_range(1..=32usize);
                let offset = rng.gen_range(0..VOL / SECTOR - sectors) * SECTOR;
                let data = pattern(rng.gen(), offset as u64, sectors * SECTOR);
                pool.write(v, offset as u64, &data).unwrap();
                model[offset..offset + data.len()].copy_from_slice(&data);
            }
            70..=79 => {
                let snap = format!("{name}@{i}");
                // Half deferred: those take only this volume's gate, while
                // the other families write.
                pool.snapshot_with(&snap, durability(i)).unwrap();
                snaps.push((snap, model.clone()));
            }
            80..=85 if !snaps.is_empty() => {
                let (snap, data) = &snaps[rng.gen_range(0..snaps.len())];
                let clone = pool
                    .clone_snapshot_with(snap, &format!("{name}-c{i}"), durability(i / 2))
                    .unwrap();
                let mut data = data.clone();
                let patch = pattern(rng.gen(), 0, 4096);
                pool.write(clone, 0, &patch).unwrap();
                data[..4096].copy_from_slice(&patch);
                clones.push((clone, data));
            }
            86..=92 if snaps.len() > 2 => {
                let (snap, _) = snaps.remove(rng.gen_range(0..snaps.len()));
                pool.delete(&snap).unwrap();
            }
            93..=95 if !clones.is_empty() => {
                let (clone, _) = clones.remove(0);
                let clone_name = pool.info(clone).unwrap().name;
                pool.delete(&clone_name).unwrap();
            }
            _ => {
                assert!(
                    read_all(&pool, v, VOL) == model,
                    "{name} diverged from its model"
                );
            }
        }
    }
    assert!(
        read_all(&pool, v, VOL) == model,
        "{name} diverged from its model"
    );
    for (snap, data) in &snaps {
        let id = pool.lookup(snap).unwrap();
        assert!(read_all(&pool, id, VOL) == *data, "{snap} changed");
    }
    for (clone, data) in &clones {
        assert!(
            read_all(&pool, *clone, VOL) == *data,
            "clone of {name} diverged"
        );
    }
}

/// Two threads write interleaved sectors of the same chunks of one volume:
/// partial-chunk copy-on-write must not lose either thread's writes.
fn interleaved_worker(
    pool: Arc<Pool>,
    v: VolumeId,
    parity: usize,
    iterations: usize,
) -> Vec<Option<Vec<u8>>> {
    let mut rng = StdRng::seed_from_u64(1000 + parity as u64);
    let sectors = VOL / SECTOR;
    let mut mine: Vec<Option<Vec<u8>>> = vec![None; sectors];
    for _ in 0..iterations {
        let s = rng.gen_range(0..sectors / 2) * 2 + parity;
        let data = pattern(rng.gen(), (s * SECTOR) as u64, SECTOR);
        pool.write(v, (s * SECTOR) as u64, &data).unwrap();
        mine[s] = Some(data);
    }
    mine
}

#[test]
fn many_threads_many_volumes_with_background_work() {
    let (disk, pool) = sim_pool(128 * MIB, 4096);
    // Slow flushes keep commits in their unlocked write phase for a while,
    // so I/O and metadata changes run against the in-flight overlays.
    disk.handle()
        .set_flush_delay(std::time::Duration::from_millis(2));
    let pool = Arc::new(pool);
    let shared = pool.create_volume("shared", VOL as u64).unwrap();
    let stop = Arc::new(AtomicBool::new(false));

    let background = {
        let (pool, stop) = (Arc::clone(&pool), Arc::clone(&stop));
        thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                pool.reclaim(16).unwrap();
                if n.is_multiple_of(3) {
                    pool.flush().unwrap();
                }
                // Snapshots of the shared volume race with the interleaved writers.
                if n.is_multiple_of(5) {
                    pool.snapshot_with(&format!("shared@bg{n}"), durability(n as usize / 5))
                        .unwrap();
                }
                if n % 5 == 2 && n > 10 {
                    let _ = pool.delete(&format!("shared@bg{}", n - 12));
                }
                n += 1;
                thread::yield_now();
            }
        })
    };

    let families: Vec<_> = (0..8)
        .map(|t| {
            let pool = Arc::clone(&pool);
            thread::spawn(move || family_worker(pool, t, 1500))
        })
        .collect();
    let interleaved: Vec<_> = (0..2)
        .map(|parity| {
            let pool = Arc::clone(&pool);
            thread::spawn(move || interleaved_worker(pool, shared, parity, 20_000))
        })
        .collect();

    for f in families {
        f.join().unwrap();
    }
    let results: Vec<_> = interleaved.into_iter().map(|h| h.join().unwrap()).collect();
    stop.store(true, Ordering::Relaxed);
    background.join().unwrap();

    let data = read_all(&pool, shared, VOL);
    for s in 0..VOL / SECTOR {
        let expected = results[s % 2][s].clone().unwrap_or_else(|| vec![0; SECTOR]);
        assert!(
            data[s * SECTOR..(s + 1) * SECTOR] == expected[..],
            "shared sector {s} lost a write"
        );
    }
    while pool.reclaim(1000).unwrap() > 0 {}
    assert_clean(&pool);
}
