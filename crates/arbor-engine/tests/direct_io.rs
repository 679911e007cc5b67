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

/// A pool of 16 KiB chunks on `dev`.
fn create(dev: FileDevice) -> Pool {
    Pool::create(
        Arc::new(dev),
        &CreateOptions {
            chunk_size: 16 * 1024,
            ..Default::default()
        },
        &OpenOptions::default(),
    )
    .unwrap()
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
    let pool = create(dev);
    let history = random_history(&pool, 18, false);
    pool.close().unwrap();
    reopens_with(&path, &history);
}

/// What a volume "v" and its snapshots hold.
struct History {
    model: Vec<u8>,
    snapshots: Vec<(String, Vec<u8>)>,
}

/// Creates volume "v" and runs 600 random steps on it: snapshots, flushes,
/// reads (checked against the model) and writes, half of them uncached
/// with `uncached` (`Pool::write_uncached`).
fn random_history(pool: &Pool, seed: u64, uncached: bool) -> History {
    let id = pool.create_volume("v", VOLUME).unwrap();
    let mut model = vec![0u8; VOLUME as usize];
    let mut snapshots: Vec<(String, Vec<u8>)> = Vec::new();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
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
                    "seed {seed} round {round}"
                );
            }
            _ => {
                // Aligned blocks, whole chunks and arbitrary byte ranges,
                // some across chunks, from memory of any alignment.
                let len = match rng.gen_range(0..4) {
                    0 => 4096 * rng.gen_range(1..9),
                    1 => rng.gen_range(1..5000),
                    2 => 16384 * rng.gen_range(1..64),
                    _ => rng.gen_range(1..70_000),
                };
                let offset = match rng.gen_bool(0.5) {
                    true => rng.gen_range(0..(VOLUME - len as u64) / 4096) * 4096,
                    false => rng.gen_range(0..=VOLUME - len as u64),
                };
                let skip = rng.gen_range(0..2);
                let mut data = vec![0u8; skip + len];
                rng.fill(&mut data[..]);
                let data = &data[skip..];
                if uncached && rng.gen_bool(0.5) {
                    pool.write_uncached(id, offset, data).unwrap();
                } else {
                    pool.write(id, offset, data).unwrap();
                }
                model[offset as usize..offset as usize + len].copy_from_slice(data);
            }
        }
    }
    assert_eq!(read_all(pool, id), model);
    History { model, snapshots }
}

/// The closed pool at `path`, opened through the page cache and with
/// direct I/O, checks clean and holds `history`.
fn reopens_with(path: &std::path::Path, history: &History) {
    for mode in [CacheMode::Buffered, CacheMode::Direct] {
        let pool = open(path, mode);
        let report = pool.check().unwrap();
        assert!(report.is_clean(), "{mode:?}: {:?}", report.problems);
        let id = pool.lookup("v").unwrap();
        assert_eq!(read_all(&pool, id), history.model, "{mode:?}");
        for (name, content) in &history.snapshots {
            let snap = pool.lookup(name).unwrap();
            assert!(read_all(&pool, snap) == *content, "{mode:?}: {name}");
        }
        pool.close().unwrap();
    }
}

/// `write_uncached` on a pool through the page cache (a restore's fill):
/// mixed with ordinary writes, snapshots and flushes it gives exactly what
/// `write` gives, its new chunks carry checksums a scrub verifies, the pool
/// checks clean and reopens with the same contents; and the chunks it
/// allocates never enter the page cache, where the same writes through
/// `write` do.
#[test]
fn uncached_writes_match_the_model_and_stay_out_of_the_page_cache() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pool");
    let pool = create(FileDevice::create_file(&path, 256 * MIB).unwrap());
    let history = random_history(&pool, 19, true);
    let (mut verified, mut damaged) = (0, 0);
    pool.scrub(0, 1 << 20, |step| {
        verified += step.verified_blocks;
        damaged += step.damaged_blocks;
        true
    })
    .unwrap();
    assert_eq!(damaged, 0);
    assert!(verified > 0);

    pool.close().unwrap();
    reopens_with(&path, &history);

    // 32 MiB into a new volume of a new pool: through `write_uncached` the
    // file's cached bytes grow by no more than the metadata; through
    // `write`, by the data.
    let grown = |uncached: bool| {
        let path = dir.path().join(format!("bulk-{uncached}"));
        let pool = create(FileDevice::create_file(&path, 256 * MIB).unwrap());
        let bulk = pool.create_volume("bulk", 32 * MIB).unwrap();
        pool.flush().unwrap();
        let before = arbor_io::cached_bytes(&path).unwrap();
        let data = vec![0x5au8; 4 * MIB as usize];
        for i in 0..8 {
            if uncached {
                pool.write_uncached(bulk, i * 4 * MIB, &data).unwrap();
            } else {
                pool.write(bulk, i * 4 * MIB, &data).unwrap();
            }
        }
        pool.flush().unwrap();
        let after = arbor_io::cached_bytes(&path).unwrap();
        let mut back = vec![0u8; 32 * MIB as usize];
        pool.read(bulk, 0, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == 0x5a));
        pool.close().unwrap();
        after.saturating_sub(before)
    };
    let uncached = grown(true);
    let cached = grown(false);
    assert!(
        uncached < 4 * MIB,
        "uncached writes cached {uncached} bytes"
    );
    assert!(
        cached >= 32 * MIB,
        "cached writes cached only {cached} bytes"
    );
}
