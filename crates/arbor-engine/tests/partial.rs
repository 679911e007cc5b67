//! Partial extents (FORMAT.md §6.3) through the public API: 4 KiB writes
//! into chunks a snapshot shares map partials; once the snapshot is gone,
//! the fill copies each base's blocks into its partial's chunk and frees
//! the base. A power cut at every write or flush of a fill (and torn
//! unflushed writes) leaves the volume reading as it did, the pool clean,
//! and the space exactly recoverable.
// A test crate: unwrap, expect and panic are how a test reports failure
// (the workspace denies them in the code it ships; clippy.toml allows
// them in #[test] functions, this in the helpers around them).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use arbor_engine::{Pool, VolumeId};
use arbor_io::SimDisk;
use common::*;
use rand::rngs::StdRng;
use rand::SeedableRng;
use std::sync::Arc;

const CS: u64 = 16384;
const BLOCK: usize = 4096;
const CHUNKS: u64 = 24;

fn make_pool(disk: &SimDisk) -> Pool {
    small_journal_pool(disk, CS as u32)
}

fn read_all(pool: &Pool, id: VolumeId) -> Vec<u8> {
    let mut buf = vec![0u8; (CHUNKS * CS) as usize];
    pool.read(id, 0, &mut buf).unwrap();
    buf
}

/// Volume `v` written whole, snapshotted, then one or two 4 KiB blocks
/// written into every chunk (partials); returns what `v` reads.
fn setup(pool: &Pool) -> Vec<u8> {
    let v = pool.create_volume("v", CHUNKS * CS).unwrap();
    let mut model: Vec<u8> = (0..CHUNKS * CS).map(|i| (i / 512 % 251) as u8).collect();
    pool.write(v, 0, &model).unwrap();
    pool.snapshot("v@s").unwrap();
    for c in 0..CHUNKS {
        for b in [c % 4, (c + 2) % 4].iter().take(1 + (c % 2) as usize) {
            let at = (c * CS) as usize + *b as usize * BLOCK;
            let data = vec![(c * 4 + b + 1) as u8; BLOCK];
            pool.write(v, at as u64, &data).unwrap();
            model[at..at + BLOCK].copy_from_slice(&data);
        }
    }
    model
}

/// The partials pin their bases while the snapshot holds them, and not
/// after it is deleted and the fill ran: then the pool uses what the
/// volume maps and nothing more.
#[test]
fn a_fill_frees_the_bases_once_the_snapshot_is_gone() {
    let disk = SimDisk::new(64 * MIB);
    let pool = make_pool(&disk);
    let model = setup(&pool);
    let v = pool.lookup("v").unwrap();
    // The snapshot's chunks, and one new chunk per written chunk: the
    // writes copied nothing.
    assert_eq!(data_used(&pool), 2 * CHUNKS * CS);
    // While the snapshot holds the bases, nothing is filled.
    assert_eq!(pool.fill_partials(1000).unwrap(), 0);
    assert!(!pool.fill_wanted());
    pool.delete("v@s").unwrap();
    while pool.reclaim(1000).unwrap() > 0 {}
    // Bases held by the partials alone, which the pool's status says.
    assert_eq!(data_used(&pool), 2 * CHUNKS * CS);
    assert!(pool.fill_wanted());
    assert!(pool.pool_stats().unwrap().fill_pending);
    assert_eq!(pool.fill_partials(1000).unwrap(), CHUNKS as usize);
    assert_eq!(data_used(&pool), CHUNKS * CS);
    assert!(read_all(&pool, v) == model);
    assert_eq!(pool.fill_partials(1000).unwrap(), 0);
    assert!(!pool.fill_wanted());
    assert!(!pool.pool_stats().unwrap().fill_pending);
    assert_clean(&pool);
    // Reopened: the same, and no partial left to fill.
    drop(pool);
    let pool = reopen(&disk);
    assert!(read_all(&pool, v) == model);
    assert_eq!(pool.fill_partials(1000).unwrap(), 0);
    assert_eq!(data_used(&pool), CHUNKS * CS);
}

/// A snapshot of a volume with partials shares them; the volume then
/// writes its chunks whole, and once the first snapshot is gone, the fill
/// of the second's partials frees the bases.
#[test]
fn a_snapshots_partials_are_filled_too() {
    let disk = SimDisk::new(64 * MIB);
    let pool = make_pool(&disk);
    let model = setup(&pool);
    pool.snapshot("v@t").unwrap();
    let v = pool.lookup("v").unwrap();
    let t = pool.lookup("v@t").unwrap();
    let now = vec![0xaa; (CHUNKS * CS) as usize];
    pool.write(v, 0, &now).unwrap();
    pool.delete("v@s").unwrap();
    while pool.reclaim(1000).unwrap() > 0 {}
    let before = data_used(&pool);
    assert_eq!(pool.fill_partials(1000).unwrap(), CHUNKS as usize);
    assert_eq!(before - data_used(&pool), CHUNKS * CS);
    assert!(read_all(&pool, t) == model);
    assert!(read_all(&pool, v) == now);
    assert_clean(&pool);
}

/// A write into a partial that a snapshot shares makes a new partial over
/// the same base; with both snapshots gone, the fill frees the bases and
/// the old partials' chunks are freed by reclaim.
#[test]
fn new_partials_over_a_shared_base_are_filled_once_alone() {
    let disk = SimDisk::new(64 * MIB);
    let pool = make_pool(&disk);
    let mut model = setup(&pool);
    pool.snapshot("v@t").unwrap();
    let v = pool.lookup("v").unwrap();
    for c in 0..CHUNKS {
        // A block of the mask (`setup` wrote block c % 4), in part.
        let at = (c * CS) as usize + (c % 4) as usize * BLOCK + 100;
        pool.write(v, at as u64, &[0xbb; 200]).unwrap();
        model[at..at + 200].fill(0xbb);
    }
    // Three chunks each: the base, the old partial's, the new one's.
    assert_eq!(data_used(&pool), 3 * CHUNKS * CS);
    assert!(read_all(&pool, v) == model);
    pool.delete("v@s").unwrap();
    pool.delete("v@t").unwrap();
    while pool.reclaim(1000).unwrap() > 0 {}
    assert_eq!(pool.fill_partials(1000).unwrap(), CHUNKS as usize);
    assert_eq!(data_used(&pool), CHUNKS * CS);
    assert!(read_all(&pool, v) == model);
    assert_clean(&pool);
}

/// A write into a partial that a snapshot shares, over every block its
/// base gives, makes a new partial over the old partial's chunk (which
/// holds the other blocks): nothing is read, and the old base is dropped.
/// Each snapshot keeps reading what it had; with them gone (in either
/// order), the fill leaves one chunk per chunk.
#[test]
fn a_write_over_all_that_a_partials_base_gives_makes_a_partial_over_its_chunk() {
    for newest_first in [false, true] {
        let disk = SimDisk::new(64 * MIB);
        let pool = make_pool(&disk);
        let mut model = setup(&pool);
        let at_s = read_all(&pool, pool.lookup("v@s").unwrap());
        pool.snapshot("v@t").unwrap();
        let v = pool.lookup("v").unwrap();
        let before = pool.pool_stats().unwrap().chunk_writes;
        for c in 0..CHUNKS {
            // `setup` wrote blocks c % 4 and, for odd c, (c + 2) % 4: one
            // write from the first other block to the last.
            let mask = if c % 2 == 1 {
                1 << (c % 4) | 1 << ((c + 2) % 4)
            } else {
                1 << (c % 4)
            };
            let others: Vec<usize> = (0..4).filter(|b| mask & (1 << b) == 0).collect();
            let (first, last) = (others[0], others[others.len() - 1]);
            let at = (c * CS) as usize + first * BLOCK;
            let data = vec![(0x80 + c) as u8; (last + 1 - first) * BLOCK];
            pool.write(v, at as u64, &data).unwrap();
            model[at..at + data.len()].copy_from_slice(&data);
        }
        let writes = pool.pool_stats().unwrap().chunk_writes;
        // A new partial over the old one's chunk for every chunk but those
        // with block 2 alone (c % 4 == 2), which the write covers whole:
        // a new chunk. Nothing read.
        let whole = (0..CHUNKS).filter(|c| c % 4 == 2).count() as u64;
        assert_eq!(writes.partial_over - before.partial_over, CHUNKS - whole);
        assert_eq!(writes.partial, before.partial);
        assert_eq!(writes.redirected - before.redirected, whole);
        assert_eq!(writes.partial_copied, before.partial_copied);
        assert_eq!(writes.redirected_copied, before.redirected_copied);
        assert!(read_all(&pool, v) == model);
        assert!(read_all(&pool, pool.lookup("v@s").unwrap()) == at_s);
        assert_clean(&pool);
        let order = if newest_first {
            ["v@t", "v@s"]
        } else {
            ["v@s", "v@t"]
        };
        for name in order {
            pool.delete(name).unwrap();
            while pool.reclaim(1000).unwrap() > 0 {}
            pool.fill_partials(1000).unwrap();
            assert!(read_all(&pool, v) == model);
            assert_clean(&pool);
        }
        assert_eq!(data_used(&pool), CHUNKS * CS);
        drop(pool);
        let pool = reopen(&disk);
        assert!(read_all(&pool, v) == model);
        assert_clean(&pool);
    }
}

/// A power cut at every write or flush of a fill: the volume reads as it
/// did, the pool checks clean, and a fill after the reopen frees exactly
/// the bases left.
#[test]
fn a_power_cut_during_a_fill_changes_nothing_anybody_reads() {
    let mut rng = StdRng::seed_from_u64(61);
    let mut cuts = 0;
    for cut in 0.. {
        let disk = SimDisk::new(64 * MIB);
        let pool = make_pool(&disk);
        let model = setup(&pool);
        pool.delete("v@s").unwrap();
        while pool.reclaim(1000).unwrap() > 0 {}
        pool.flush().unwrap();
        let handle = disk.handle();
        handle.cut_power_after(cut);
        let returned = pool.fill_partials(1000).is_ok() && handle.is_powered();
        handle.cut_power();
        drop(pool);
        for image in [handle.durable_image(), handle.crash_image(&mut rng)] {
            let disk2 = SimDisk::from_image(image);
            let pool2 = reopen(&disk2);
            assert_clean(&pool2);
            let v = pool2.lookup("v").unwrap();
            assert!(read_all(&pool2, v) == model, "cut {cut}: v changed");
            while pool2.fill_partials(1000).unwrap() > 0 {}
            assert_eq!(data_used(&pool2), CHUNKS * CS, "cut {cut}");
            assert!(
                read_all(&pool2, v) == model,
                "cut {cut}: v changed by the fill"
            );
            assert_clean(&pool2);
        }
        cuts += 1;
        if returned {
            break;
        }
    }
    assert!(
        cuts > CHUNKS,
        "a fill writes every partial's chunk: {cuts} cuts"
    );
}

/// A pool of format version `version` on a device that counts its reads,
/// with a cache that holds all of its metadata (the reads counted are data
/// reads); and the options it was opened with.
fn counting_pool(version: u16) -> (Arc<CountingReads>, Pool, arbor_engine::OpenOptions) {
    let dev = Arc::new(CountingReads {
        inner: SimDisk::new(64 * MIB),
        reads: Default::default(),
    });
    let opts = arbor_engine::OpenOptions {
        cache_bytes: 16 * MIB as usize,
        ..open_opts()
    };
    let create = arbor_engine::CreateOptions {
        format_version: arbor_format::FormatVersion::new(version).unwrap(),
        ..small_opts(CS as u32)
    };
    let pool = Pool::create(dev.clone(), &create, &opts).unwrap();
    (dev, pool, opts)
}

/// A device that counts the reads made through it.
struct CountingReads {
    inner: SimDisk,
    reads: std::sync::atomic::AtomicU64,
}

impl arbor_io::BlockDevice for CountingReads {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.reads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.inner.flush()
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
}

/// Every chunk write is counted by how it landed (`PoolStats::chunk_writes`),
/// and only the copies read the device: a write of whole blocks into a
/// partial that a snapshot shares reads nothing; parts of blocks are read
/// around the write.
#[test]
fn chunk_writes_are_counted_by_how_they_landed_and_only_copies_read() {
    use arbor_engine::ChunkWrites;
    use std::sync::atomic::Ordering;
    let (dev, pool, _) = counting_pool(arbor_format::FORMAT_VERSION);
    let v = pool.create_volume("v", 4 * CS).unwrap();
    let mut model = vec![1u8; (4 * CS) as usize];
    let counts = || pool.pool_stats().unwrap().chunk_writes;
    // Writes `len` bytes of `byte` at `at`; returns the device reads it made.
    let mut write = |at: usize, len: usize, byte: u8| {
        let before = dev.reads.load(Ordering::Relaxed);
        pool.write(v, at as u64, &vec![byte; len]).unwrap();
        model[at..at + len].fill(byte);
        dev.reads.load(Ordering::Relaxed) - before
    };
    // (Its reads are the metadata's first.)
    write(0, (4 * CS) as usize, 1);
    let mut expected = ChunkWrites {
        redirected: 4,
        ..Default::default()
    };
    assert_eq!(counts(), expected);
    pool.snapshot("v@1").unwrap();
    // Block 1 of chunk 0: a partial over the snapshot's chunk, no copy.
    assert_eq!(write(BLOCK, BLOCK, 2), 0);
    expected.partial += 1;
    // Block 2: added to it; block 1 again: in place.
    assert_eq!(write(2 * BLOCK, BLOCK, 3), 0);
    expected.extended += 1;
    assert_eq!(write(BLOCK, BLOCK, 4), 0);
    expected.in_place += 1;
    assert_eq!(counts(), expected);
    // Shared again: a write over all of the partial's blocks needs none
    // of them (a partial over the base; the old one's chunk drops).
    pool.snapshot("v@2").unwrap();
    assert_eq!(write(BLOCK, 2 * BLOCK, 5), 0);
    expected.partial_over += 1;
    assert_eq!(counts(), expected);
    // Shared again: a write beside them reads nothing either (version 8:
    // the old partial stays under the new one, a middle layer).
    pool.snapshot("v@3").unwrap();
    assert_eq!(write(3 * BLOCK, BLOCK, 6), 0);
    expected.partial_over += 1;
    // Part of a block of a chunk the snapshots share whole: a partial of
    // that block, its old contents read around the write.
    assert!(write(CS as usize + 100, 1000, 7) > 0);
    expected.partial_copied += 1;
    // Parts of every block: a whole new chunk, the old one read around it.
    assert!(write(2 * CS as usize + 100, CS as usize - 200, 8) > 0);
    expected.redirected_copied += 1;
    assert_eq!(counts(), expected);
    let mut back = vec![0u8; model.len()];
    pool.read(v, 0, &mut back).unwrap();
    assert!(back == model);
    assert_clean(&pool);
}

/// A version 7 pool keeps its partials and makes no middle layers: a write
/// into a partial a snapshot shares copies one layer. Upgraded to 8 it
/// reads the same, writes layers from then on, stays clean through a
/// reopen, and the fill still frees every layer once the snapshots go.
#[test]
fn a_version_7_pool_upgraded_to_8_gets_middle_layers() {
    use std::sync::atomic::Ordering;
    let (dev, pool, opts) = counting_pool(7);
    let v = pool.create_volume("v", CHUNKS * CS).unwrap();
    let mut model = vec![7u8; (CHUNKS * CS) as usize];
    pool.write(v, 0, &model).unwrap();
    // Writes block `b` of every chunk after a snapshot; returns the
    // device reads they made.
    let mut round = |pool: &Pool, b: usize, snap: &str| {
        pool.snapshot(snap).unwrap();
        let before = dev.reads.load(Ordering::Relaxed);
        for c in 0..CHUNKS as usize {
            let at = c * CS as usize + b * BLOCK;
            let data = vec![(c * 4 + b + 1) as u8; BLOCK];
            pool.write(v, at as u64, &data).unwrap();
            model[at..at + BLOCK].copy_from_slice(&data);
        }
        let reads = dev.reads.load(Ordering::Relaxed) - before;
        let mut back = vec![0u8; model.len()];
        pool.read(v, 0, &mut back).unwrap();
        assert!(back == model, "after {snap}");
        reads
    };
    // Version 7: the second round's writes read the first's blocks.
    assert_eq!(round(&pool, 0, "v@1"), 0);
    assert!(round(&pool, 1, "v@2") >= CHUNKS);
    let copied = pool.pool_stats().unwrap().chunk_writes.partial_copied;
    assert_eq!(copied, CHUNKS);
    assert_clean(&pool);
    // Version 8: no reads; the partials of version 7 stay under the new.
    assert!(pool.upgrade().unwrap());
    assert!(pool.format_version().is_newest());
    assert!(pool.format_version().has_middle_layers());
    assert_eq!(round(&pool, 2, "v@3"), 0);
    assert_eq!(round(&pool, 3, "v@4"), 0);
    let writes = pool.pool_stats().unwrap().chunk_writes;
    assert_eq!(writes.partial_copied, CHUNKS);
    assert_eq!(writes.partial_over, 2 * CHUNKS);
    assert_clean(&pool);
    drop(pool);
    let pool = Pool::open(dev.clone(), &opts).unwrap();
    assert!(pool.format_version().is_newest());
    let mut back = vec![0u8; model.len()];
    pool.read(v, 0, &mut back).unwrap();
    assert!(back == model);
    assert_clean(&pool);
    // Every snapshot gone: the fill maps every chunk whole again, and the
    // pool holds the volume's chunks alone.
    for snap in ["v@1", "v@2", "v@3", "v@4"] {
        pool.delete(snap).unwrap();
    }
    while pool.reclaim(1000).unwrap() > 0 {}
    while pool.fill_partials(1000).unwrap() > 0 {}
    pool.flush().unwrap();
    assert_eq!(data_used(&pool), CHUNKS * CS);
    pool.read(v, 0, &mut back).unwrap();
    assert!(back == model);
    assert_clean(&pool);
}
