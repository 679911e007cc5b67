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
        format_version: FormatVersion::new(version).unwrap(),
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
    with_partial_in(arbor_format::FORMAT_VERSION)
}

/// [`with_partial`] in a pool of format version `version`.
fn with_partial_in(version: u16) -> (Pool, VolumeId, u64) {
    let pool = pool(version);
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

/// Shared, a partial can be neither extended nor written in place: a
/// write makes a new partial in front of it. From version 8 the old one's
/// chunk and base stay under it as layers (nothing read but the parts of
/// blocks the write does not cover); in version 7, with no middle layer,
/// the layer giving the fewest blocks is copied into the new chunk.
#[test]
fn a_write_over_a_shared_partial_makes_a_new_one_in_front() {
    // Layers after each of the three writes, newest first.
    let cases: [(u16, [&[u32]; 3]); 2] = [
        (
            arbor_format::FORMAT_VERSION,
            [
                &[0b1000, 0b0110, 0b0001],
                &[0b0010, 0b1000, 0b0100, 0b0001],
                &[0b0001, 0b0010, 0b1000, 0b0100],
            ],
        ),
        (7, [&[0b1001, 0b0110], &[0b0110, 0b1001], &[0b1001, 0b0110]]),
    ];
    for (version, layers) in cases {
        let (pool, a, pchunk) = with_partial_in(version);
        pool.snapshot("a@u").unwrap();
        // Block 3 of chunk 1, and a few bytes inside block 1.
        pool.write(a, CS + 3 * BLOCK as u64, &[0x33; BLOCK])
            .unwrap();
        assert_eq!(layers_of(&pool, a, 1), layers[0], "version {version}");
        pool.write(a, CS + BLOCK as u64 + 100, &[0x44; 8]).unwrap();
        assert_eq!(layers_of(&pool, a, 1), layers[1], "version {version}");
        let mut want = chunk_of(1, |c, b| match b {
            1 | 2 => 0xee,
            3 => 0x33,
            _ => original(c, b),
        });
        want[BLOCK + 100..BLOCK + 108].fill(0x44);
        assert!(read(&pool, a, CS, CS as usize) == want);
        {
            let meta = pool.meta.read().unwrap();
            let root = meta.volume(a.0).unwrap().root;
            let (e, _) = Mapping::new(meta.meta(), root).lookup(1).unwrap().unwrap();
            assert_ne!(e.pchunk, pchunk, "a new chunk");
        }
        // Part of block 0, which only the base gave.
        pool.snapshot("a@v").unwrap();
        pool.write(a, CS + 10, &[0x45; 20]).unwrap();
        want[10..30].fill(0x45);
        assert!(read(&pool, a, CS, CS as usize) == want);
        assert_eq!(layers_of(&pool, a, 1), layers[2], "version {version}");
        let s = pool.lookup("a@s").unwrap();
        assert!(read(&pool, s, CS, CS as usize) == chunk_of(1, original));
        let u = pool.lookup("a@u").unwrap();
        assert_eq!(
            read(&pool, u, CS + BLOCK as u64, 2 * BLOCK),
            vec![0xee; 2 * BLOCK]
        );
        pool.flush().unwrap();
        assert!(pool.check().unwrap().is_clean());
        // Every snapshot gone, the fill maps the chunk whole again and
        // frees every layer.
        for snap in ["a@s", "a@u", "a@v"] {
            pool.delete(snap).unwrap();
        }
        pool.reclaim(1000).unwrap();
        while pool.fill_partials(100).unwrap() > 0 {}
        pool.flush().unwrap();
        assert_eq!(layers_of(&pool, a, 1), [0b1111], "version {version}");
        assert!(read(&pool, a, CS, CS as usize) == want);
        assert_eq!(pool.pool_stats().unwrap().data_used_bytes, 4 * CS);
        assert!(pool.check().unwrap().is_clean());
    }
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
        Err(Error::Stop(Fault::Inconsistent(_)))
    ));
}

/// Whether chunk `chunk` of `id` is a partial extent now, and its mask.
fn mask_of(pool: &Pool, id: VolumeId, chunk: u64) -> Option<u32> {
    let meta = pool.meta.read().unwrap();
    let root = meta.volume(id.0).unwrap().root;
    let (e, _) = Mapping::new(meta.meta(), root)
        .lookup(chunk)
        .unwrap()
        .unwrap();
    e.partial.map(|p| p.mask)
}

/// The blocks each layer of chunk `chunk` of `id` gives, newest first
/// (one layer of every block for a chunk mapped whole).
fn layers_of(pool: &Pool, id: VolumeId, chunk: u64) -> Vec<u32> {
    let meta = pool.meta.read().unwrap();
    let root = meta.volume(id.0).unwrap().root;
    let (e, _) = Mapping::new(meta.meta(), root)
        .lookup(chunk)
        .unwrap()
        .unwrap();
    crate::mapping::Layers::of(e.at(chunk), 0b1111)
        .iter()
        .map(|(_, mask)| mask)
        .collect()
}

/// Writes of whole blocks into a shared chunk map a partial and copy
/// nothing; later ones extend it until it is whole, or overwrite its own
/// blocks in place; a write that also covers part of a block outside the
/// mask makes a whole chunk of both.
#[test]
fn writes_make_extend_and_complete_partials() {
    for version in [7, arbor_format::FORMAT_VERSION] {
        writes_make_extend_and_complete_partials_in(version);
    }
}

fn writes_make_extend_and_complete_partials_in(version: u16) {
    let layered = FormatVersion::new(version).unwrap().has_middle_layers();
    let pool = pool(version);
    let a = pool.create_volume("a", 4 * CS).unwrap();
    let mut model: Vec<u8> = (0..4).flat_map(|c| chunk_of(c, original)).collect();
    pool.write(a, 0, &model).unwrap();
    pool.snapshot("a@s").unwrap();
    let used = pool.pool_stats().unwrap().data_used_bytes;
    let mut write = |pool: &Pool, at: usize, data: &[u8]| {
        pool.write(a, at as u64, data).unwrap();
        model[at..at + data.len()].copy_from_slice(data);
        assert!(
            read(pool, a, 0, model.len()) == model,
            "after a write at {at}"
        );
    };
    let cs = CS as usize;
    // Block 2 of chunk 1: a partial, one new chunk.
    write(&pool, cs + 2 * BLOCK, &[0x21; BLOCK]);
    assert_eq!(mask_of(&pool, a, 1), Some(0b0100));
    assert_eq!(pool.pool_stats().unwrap().data_used_bytes, used + CS);
    // Block 0: extended, no new chunk.
    write(&pool, cs, &[0x22; BLOCK]);
    assert_eq!(mask_of(&pool, a, 1), Some(0b0101));
    // Inside block 2 (in the mask): in place.
    write(&pool, cs + 2 * BLOCK + 10, &[0x23; 100]);
    assert_eq!(mask_of(&pool, a, 1), Some(0b0101));
    assert_eq!(pool.pool_stats().unwrap().data_used_bytes, used + CS);
    // Blocks 1 and 3: whole, the base no longer held by `a`.
    write(&pool, cs + BLOCK, &[0x24; BLOCK]);
    write(&pool, cs + 3 * BLOCK, &[0x25; BLOCK]);
    assert_eq!(mask_of(&pool, a, 1), None);
    // Chunk 2: a partial, then a write over part of an unmasked block and
    // a masked one makes a new partial of both over the base, which keeps
    // the old contents around the write; the old partial's chunk drops.
    write(&pool, 2 * cs + BLOCK, &[0x26; BLOCK]);
    assert_eq!(mask_of(&pool, a, 2), Some(0b0010));
    write(&pool, 2 * cs + BLOCK + 100, &[0x27; BLOCK]);
    assert_eq!(layers_of(&pool, a, 2), [0b0110, 0b1001]);
    // A partial shared by a snapshot is not extended: a new partial, in
    // front of it (version 8) or with its block copied (7).
    write(&pool, 3 * cs, &[0x28; BLOCK]);
    pool.snapshot("a@t").unwrap();
    write(&pool, 3 * cs + BLOCK, &[0x29; BLOCK]);
    if layered {
        assert_eq!(layers_of(&pool, a, 3), [0b0010, 0b0001, 0b1100]);
    } else {
        assert_eq!(layers_of(&pool, a, 3), [0b0011, 0b1100]);
    }
    // Shared again, the last two blocks, all that the base gave: a new
    // partial over the older partials' chunks, which hold the other two.
    pool.snapshot("a@w").unwrap();
    write(&pool, 3 * cs + 2 * BLOCK, &[0x2a; 2 * BLOCK]);
    if layered {
        assert_eq!(layers_of(&pool, a, 3), [0b1100, 0b0010, 0b0001]);
    } else {
        assert_eq!(layers_of(&pool, a, 3), [0b1100, 0b0011]);
    }
    let w = pool.lookup("a@w").unwrap();
    let mut at_w = chunk_of(3, original);
    at_w[..BLOCK].fill(0x28);
    at_w[BLOCK..2 * BLOCK].fill(0x29);
    assert!(read(&pool, w, 3 * CS, cs) == at_w);
    let t = pool.lookup("a@t").unwrap();
    let mut at_t = chunk_of(3, original);
    at_t[..BLOCK].fill(0x28);
    assert!(read(&pool, t, 3 * CS, cs) == at_t);
    let s = pool.lookup("a@s").unwrap();
    assert!(
        read(&pool, s, 0, 4 * cs)
            == (0..4)
                .flat_map(|c| chunk_of(c, original))
                .collect::<Vec<_>>()
    );
    pool.flush().unwrap();
    let report = pool.check().unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
}

/// The same writes in a version 6 pool (no partial extents) copy chunks
/// whole, as before.
#[test]
fn a_version_6_pool_makes_no_partials() {
    let pool = pool(6);
    let a = pool.create_volume("a", CS).unwrap();
    pool.write(a, 0, &chunk_of(0, original)).unwrap();
    pool.snapshot("a@s").unwrap();
    pool.write(a, BLOCK as u64, &[9; BLOCK]).unwrap();
    assert_eq!(mask_of(&pool, a, 0), None);
}

/// Regression: the fill sweep held its own lock while it waited for the
/// metadata lock, and the pool's status took them the other way round (the
/// metadata, then the sweep's lock for `fill_pending`). With a writer
/// waiting for the metadata lock between them (a new reader then waits
/// too), the three waited for each other: a daemon under a write load hung
/// in the benchmark (its status poll, its background fill and a write).
/// The sweep's lock is a leaf now: nothing else is taken while it is held.
/// The threads are ordered by short pauses, which only make the old
/// deadlock likely; the check is that the status's step returns at all
/// (within a minute).
#[test]
fn the_fill_sweep_and_the_pool_status_never_wait_for_each_other() {
    use std::sync::mpsc;
    use std::thread;
    use std::time::Duration;
    let (pool, _, _) = with_partial();
    let pool = Arc::new(pool);
    assert!(pool.fill_wanted(), "an opened pool sweeps");
    // A reader of the metadata, as the status before `fill_pending`.
    let held = pool.meta.read().unwrap();
    // A writer waiting for it.
    let writer = thread::spawn({
        let pool = Arc::clone(&pool);
        move || drop(pool.meta.write().unwrap())
    });
    thread::sleep(Duration::from_millis(100));
    // The sweep, waiting for the metadata behind the writer.
    let sweeper = thread::spawn({
        let pool = Arc::clone(&pool);
        move || pool.fill_partials(10).map(|_| ())
    });
    thread::sleep(Duration::from_millis(100));
    // The status's second lock, the metadata still held for reading.
    let (tx, rx) = mpsc::channel();
    let status = thread::spawn({
        let pool = Arc::clone(&pool);
        move || tx.send(pool.fill_wanted()).unwrap()
    });
    let answered = rx.recv_timeout(Duration::from_secs(60));
    drop(held);
    writer.join().unwrap();
    sweeper.join().unwrap().unwrap();
    status.join().unwrap();
    assert!(answered.is_ok(), "the status waited for the sweep");
}
