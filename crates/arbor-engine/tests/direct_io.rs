//! A pool on a real file opened with direct I/O (`O_DIRECT`): the engine's
//! reads (a read of several pieces is one batch), writes of any alignment,
//! snapshots, commits (whose metadata blocks go out as one batch) and
//! recovery give exactly what the same operations give through the page
//! cache, with batches through io_uring or by threads, and the pool opens
//! either way afterwards.
// A test crate: unwrap, expect and panic are how a test reports failure
// (the workspace denies them in the code it ships; clippy.toml allows
// them in #[test] functions, this in the helpers around them).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use arbor_engine::{CreateOptions, OpenOptions, Pool, VolumeId};
use arbor_io::{Batches, CacheMode, FileDevice};
use rand::{Rng, SeedableRng};

const MIB: u64 = 1 << 20;
const VOLUME: u64 = 8 * MIB;

fn open(path: &std::path::Path, mode: CacheMode) -> Pool {
    let dev = FileDevice::open_with(path, mode).unwrap();
    assert_eq!(dev.cache_mode(), mode);
    Pool::open(Arc::new(dev), &OpenOptions::default()).unwrap()
}

fn read_all(pool: &Pool, id: VolumeId) -> Vec<u8> {
    let mut buf = vec![0u8; VOLUME as usize];
    pool.read(id, 0, &mut buf).unwrap();
    buf
}

#[test]
fn a_pool_on_direct_io_matches_its_model_and_reopens_either_way() {
    matches_its_model_and_reopens(Batches::IoUring);
}

#[test]
fn a_pool_on_direct_io_with_threads_for_batches_matches_its_model() {
    matches_its_model_and_reopens(Batches::Threads);
}

fn matches_its_model_and_reopens(batches: Batches) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pool");
    let mut dev = FileDevice::create_file_with(&path, 256 * MIB, CacheMode::Direct).unwrap();
    dev.set_batches(batches);
    assert_eq!(dev.batches(), batches, "io_uring refused here");
    let pool = Pool::create(
        Arc::new(dev),
        &CreateOptions {
            chunk_size: 16 * 1024,
            ..Default::default()
        },
        &OpenOptions::default(),
    )
    .unwrap();
    let id = pool.create_volume("v", VOLUME).unwrap();
    let mut model = vec![0u8; VOLUME as usize];
    let mut snapshots: Vec<(String, Vec<u8>)> = Vec::new();
    let mut rng = rand::rngs::StdRng::seed_from_u64(18);
    for round in 0..600 {
        match rng.gen_range(0..20) {
            0 => {
                let name = format!("v@s{round}");
                pool.snapshot(&name).unwrap();
                snapshots.push((name, model.clone()));
            }
            1 => pool.flush().unwrap(),
            2 | 3 => {
                // A range across chunks mapped by several writes (and
                // snapshots), into memory of any alignment.
                let len = rng.gen_range(1..300_000);
                let offset = rng.gen_range(0..=VOLUME - len as u64);
                let skip = rng.gen_range(0..2) * rng.gen_range(1..512);
                let mut buf = vec![0u8; skip + len];
                pool.read(id, offset, &mut buf[skip..]).unwrap();
                let at = offset as usize;
                assert!(
                    buf[skip..] == model[at..at + len],
                    "{batches:?} round {round}"
                );
            }
            _ => {
                // Aligned blocks and arbitrary byte ranges, some across chunks.
                let len = match rng.gen_range(0..3) {
                    0 => 4096 * rng.gen_range(1..9),
                    1 => rng.gen_range(1..5000),
                    _ => rng.gen_range(1..70_000),
                };
                let offset = match rng.gen_bool(0.5) {
                    true => rng.gen_range(0..(VOLUME - len as u64) / 4096) * 4096,
                    false => rng.gen_range(0..=VOLUME - len as u64),
                };
                let mut data = vec![0u8; len];
                rng.fill(&mut data[..]);
                pool.write(id, offset, &data).unwrap();
                model[offset as usize..offset as usize + len].copy_from_slice(&data);
            }
        }
    }
    assert_eq!(read_all(&pool, id), model);
    pool.close().unwrap();
    for mode in [CacheMode::Buffered, CacheMode::Direct] {
        let pool = open(&path, mode);
        let report = pool.check().unwrap();
        assert!(report.is_clean(), "{mode:?}: {:?}", report.problems);
        let id = pool.lookup("v").unwrap();
        assert_eq!(read_all(&pool, id), model, "{mode:?}");
        for (name, content) in &snapshots {
            let snap = pool.lookup(name).unwrap();
            assert!(read_all(&pool, snap) == *content, "{mode:?}: {name}");
        }
        pool.close().unwrap();
    }
}
