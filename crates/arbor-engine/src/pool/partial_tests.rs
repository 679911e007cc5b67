//! Partial extents (format version 7) through the layers below the write
//! that makes them: the read path splits them by their mask, a write over
//! one copies both of its chunks, `check` counts both references, and
//! deleting and reclaiming frees both. The partials here are mapped by
//! `Volumes::map_partial`, as a sub-chunk write will map them.

use super::*;

const CS: u64 = 16 << 10;
const BLOCK: usize = 4096;

fn pool(version: u16) -> Pool {
    let dev: Arc<dyn BlockDevice> = Arc::new(arbor_io::SimDisk::new(64 << 20));
    let opts = CreateOptions {
        chunk_size: CS as u32,
        metadata_bytes: Some(4 << 20),
        format_version: version,
        ..Default::default()
    };
    Pool::create(dev, &opts, &OpenOptions::default()).unwrap()
}

fn read(pool: &Pool, id: VolumeId, offset: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    pool.read(id, offset, &mut buf).unwrap();
    buf
}

/// Chunk `c` of a volume written with `fill(c, block)` in every block.
fn chunk_of(c: u64, fill: impl Fn(u64, usize) -> u8) -> Vec<u8> {
    (0..CS as usize).map(|i| fill(c, i / BLOCK)).collect()
}

/// A volume `a` of four chunks written whole (block `b` of chunk `c` holds
/// `10 * c + b + 1`), snapshotted as `a@s`, with chunk 1 made partial:
/// blocks 1 and 2 (mask 0b0110) in a new chunk holding 0xee there.
/// Returns the pool, `a`, and the new chunk.
fn with_partial() -> (Pool, VolumeId, u64) {
    let pool = pool(arbor_format::FORMAT_VERSION);
    let a = pool.create_volume("a", 4 * CS).unwrap();
    for c in 0..4 {
        pool.write(
            a,
            c * CS,
            &chunk_of(c, |c, b| (10 * c + b as u64 + 1) as u8),
        )
        .unwrap();
    }
    pool.snapshot("a@s").unwrap();
    let pchunk = pool
        .meta
        .write()
        .unwrap()
        .map_partial(a.0, 1, 0b0110)
        .unwrap();
    let geo = &pool.store.geo;
    pool.store
        .dev
        .write_at(&[0xee; 2 * BLOCK], geo.chunk_offset(pchunk) + BLOCK as u64)
        .unwrap();
    (pool, a, pchunk)
}

fn original(c: u64, b: usize) -> u8 {
    (10 * c + b as u64 + 1) as u8
}

#[test]
fn a_read_takes_the_masked_blocks_from_the_new_chunk_and_the_rest_from_the_base() {
    let (pool, a, _) = with_partial();
    let want: Vec<u8> = (0..4)
        .flat_map(|c| {
            chunk_of(c, |c, b| {
                if c == 1 && (b == 1 || b == 2) {
                    0xee
                } else {
                    original(c, b)
                }
            })
        })
        .collect();
    assert!(read(&pool, a, 0, want.len()) == want);
    // Reads that start and end inside the partial chunk, at every block
    // boundary and across them.
    for from in (0..=CS as usize).step_by(1024) {
        for to in (from..=CS as usize).step_by(3072) {
            let got = read(&pool, a, CS + from as u64, to - from);
            assert!(
                got[..] == want[CS as usize + from..CS as usize + to],
                "{from}..{to}"
            );
        }
    }
    // The snapshot still reads the base whole.
    let s = pool.lookup("a@s").unwrap();
    assert!(read(&pool, s, CS, CS as usize) == chunk_of(1, original));
}

#[test]
fn check_counts_both_references_of_a_partial_and_survives_a_reopen() {
    let (pool, a, _) = with_partial();
    pool.flush().unwrap();
    let report = pool.check().unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
    let dev = Arc::clone(&pool.store.dev);
    drop(pool);
    let pool = Pool::open(dev, &OpenOptions::default()).unwrap();
    assert_eq!(read(&pool, a, CS + BLOCK as u64, BLOCK), vec![0xee; BLOCK]);
    assert_eq!(read(&pool, a, CS, BLOCK), vec![original(1, 0); BLOCK]);
    assert!(pool.check().unwrap().is_clean());
}

#[test]
fn a_write_over_a_partial_copies_both_of_its_chunks() {
    let (pool, a, _) = with_partial();
    // Block 3 of chunk 1, and a few bytes inside block 1.
    pool.write(a, CS + 3 * BLOCK as u64, &[0x33; BLOCK])
        .unwrap();
    pool.write(a, CS + BLOCK as u64 + 100, &[0x44; 8]).unwrap();
    let mut want = chunk_of(1, |c, b| match b {
        1 | 2 => 0xee,
        3 => 0x33,
        _ => original(c, b),
    });
    want[BLOCK + 100..BLOCK + 108].fill(0x44);
    assert!(read(&pool, a, CS, CS as usize) == want);
    let s = pool.lookup("a@s").unwrap();
    assert!(read(&pool, s, CS, CS as usize) == chunk_of(1, original));
    pool.flush().unwrap();
    assert!(pool.check().unwrap().is_clean());
}

#[test]
fn deleting_everything_frees_both_chunks_of_a_partial() {
    for snapshot_first in [true, false] {
        let (pool, a, _) = with_partial();
        pool.flush().unwrap();
        let used = pool.pool_stats().unwrap().data_used_bytes;
        // Four chunks of `a@s`, and the partial's own.
        assert_eq!(used, 5 * CS);
        let order = if snapshot_first {
            ["a@s", "a"]
        } else {
            ["a", "a@s"]
        };
        for name in order {
            pool.delete(name).unwrap();
            pool.reclaim(1000).unwrap();
            pool.flush().unwrap();
            assert!(pool.check().unwrap().is_clean(), "after deleting {name}");
        }
        assert_eq!(pool.pool_stats().unwrap().data_used_bytes, 0);
        let _ = a;
    }
}

#[test]
fn discarding_a_partial_drops_both_references() {
    let (pool, a, _) = with_partial();
    pool.discard(a, CS, CS).unwrap();
    assert_eq!(read(&pool, a, CS, CS as usize), vec![0; CS as usize]);
    pool.flush().unwrap();
    assert!(pool.check().unwrap().is_clean());
    pool.delete("a@s").unwrap();
    pool.reclaim(1000).unwrap();
    pool.flush().unwrap();
    // Chunks 0, 2 and 3 of `a`.
    assert_eq!(pool.pool_stats().unwrap().data_used_bytes, 3 * CS);
    assert!(pool.check().unwrap().is_clean());
}

#[test]
fn a_pool_older_than_version_7_refuses_a_partial() {
    let pool = pool(6);
    let a = pool.create_volume("a", CS).unwrap();
    pool.write(a, 0, &[1; CS as usize]).unwrap();
    pool.meta
        .write()
        .unwrap()
        .map_partial(a.0, 0, 0b0001)
        .unwrap();
    let mut buf = vec![0u8; BLOCK];
    assert!(matches!(
        pool.read(a, 0, &mut buf),
        Err(Error::Inconsistent(_))
    ));
}
