//! Online growth (format version 2): a pool grows onto a larger device
//! while clients write, the grown space is used, a power cut at any moment
//! of a growth opens the pool at the size before or after it, and version 1
//! pools open unchanged and grow only once upgraded.
// A test crate: unwrap, expect and panic are how a test reports failure
// (the workspace denies them in the code it ships; clippy.toml allows
// them in #[test] functions, this in the helpers around them).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};

use arbor_engine::{CreateOptions, Error, GrowOptions, Pool, Refusal, Resource, VolumeId};
use arbor_io::{BlockDevice, SimDisk};
use common::*;
use rand::rngs::StdRng;
use rand::SeedableRng;

const CHUNK: u64 = 4096;

use arbor_format::FORMAT_VERSION;

fn pool_on(disk: &SimDisk, metadata: u64, version: u16) -> Pool {
    let dev: Arc<dyn BlockDevice> = Arc::new(disk.clone());
    let opts = CreateOptions {
        chunk_size: CHUNK as u32,
        metadata_bytes: Some(metadata),
        journal_pages: Some(64),
        format_version: arbor_format::FormatVersion::new(version).unwrap(),
        ..Default::default()
    };
    Pool::create(dev, &opts, &open_opts()).expect("create")
}

fn open(image: Vec<u8>) -> (SimDisk, Pool) {
    let disk = SimDisk::from_image(image);
    let dev: Arc<dyn BlockDevice> = Arc::new(disk.clone());
    let pool = Pool::open(dev, &open_opts()).expect("open");
    (disk, pool)
}

/// Writes chunk-sized patterns at `chunks` until the data space runs out;
/// returns the chunks written (all acknowledged).
fn fill_data(pool: &Pool, v: VolumeId, tag: u64, chunks: impl Iterator<Item = u64>) -> Vec<u64> {
    let mut written = Vec::new();
    for c in chunks {
        match pool.write(v, c * CHUNK, &pattern(tag + c, 0, CHUNK as usize)) {
            Ok(()) => written.push(c),
            Err(Error::Exhausted(Resource::DataSpace)) => break,
            Err(e) => panic!("write of chunk {c}: {e}"),
        }
    }
    written
}

fn assert_chunks(pool: &Pool, v: VolumeId, tag: u64, chunks: &[u64]) {
    let mut buf = vec![0u8; CHUNK as usize];
    for &c in chunks {
        pool.read(v, c * CHUNK, &mut buf).unwrap();
        assert!(
            buf == pattern(tag + c, 0, CHUNK as usize),
            "chunk {c} does not read back"
        );
    }
}

/// A full pool grows while four writers keep writing; their writes that
/// failed with `NoSpace` succeed afterwards, in the new space, and every
/// acknowledged write reads back, also after a reopen.
#[test]
fn a_full_pool_grows_online_while_clients_write() {
    let disk = SimDisk::new(24 * MIB);
    let pool = Arc::new(pool_on(&disk, 2 * MIB, 2));
    let before = pool.pool_stats().unwrap();
    let size = 256 * MIB;
    let vols: Vec<VolumeId> = (0..4)
        .map(|i| pool.create_volume(&format!("v{i}"), size).unwrap())
        .collect();
    // Fill the data space; every volume's writes stop with NoSpace.
    let mut written: Vec<Vec<u64>> = vols
        .iter()
        .enumerate()
        .map(|(i, &v)| fill_data(&pool, v, i as u64 * 1_000_000, 0..))
        .collect();
    assert_eq!(
        pool.write(vols[0], (size / 2) & !(CHUNK - 1), &[1; 4096])
            .err()
            .map(|e| e.to_string()),
        Some(Error::Exhausted(Resource::DataSpace).to_string())
    );
    let grown = AtomicBool::new(false);
    let start = Barrier::new(5);
    let after: Vec<Vec<u64>> = std::thread::scope(|s| {
        let writers: Vec<_> = vols
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                let (pool, grown, start) = (&pool, &grown, &start);
                let first = written[i].last().map_or(0, |c| c + 1);
                s.spawn(move || {
                    start.wait();
                    let mut mine = Vec::new();
                    let mut c = first;
                    // Until the growth is done, writes may fail for space;
                    // afterwards each one must succeed (120 chunks each fit).
                    while mine.len() < 120 {
                        let done = grown.load(Ordering::SeqCst);
                        match pool.write(v, c * CHUNK, &pattern(i as u64 * 1_000_000 + c, 0, 4096))
                        {
                            Ok(()) => {
                                mine.push(c);
                                c += 1;
                            }
                            Err(Error::Exhausted(Resource::DataSpace)) if !done => {
                                std::thread::yield_now()
                            }
                            Err(e) => panic!("writer {i}, chunk {c} (grown: {done}): {e}"),
                        }
                    }
                    mine
                })
            })
            .collect();
        start.wait();
        let report = pool
            .grow(&GrowOptions {
                size: Some(40 * MIB),
                metadata_bytes: None,
            })
            .unwrap();
        grown.store(true, Ordering::SeqCst);
        assert!(report.old_pool_bytes <= before.pool_bytes, "{report:?}");
        assert_eq!(report.new_pool_bytes, 40 * MIB);
        assert!(report.data_bytes_added > 15 * MIB, "{report:?}");
        writers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    for (w, more) in written.iter_mut().zip(after) {
        w.extend(more);
    }
    let stats = pool.pool_stats().unwrap();
    assert!(stats.data_bytes > before.data_bytes + 15 * MIB, "{stats:?}");
    assert!(stats.metadata_bytes > before.metadata_bytes, "{stats:?}");
    assert!(
        stats.data_used_bytes > before.data_bytes,
        "the grown space holds data: {stats:?}"
    );
    assert_eq!(stats.pool_bytes, 40 * MIB);
    // The rest of the grown space fills up too (the entries of the space
    // maps' straddled pages included), and check counts it all.
    for (i, &v) in vols.iter().enumerate() {
        let next = written[i].last().map_or(0, |c| c + 1);
        let more = fill_data(&pool, v, i as u64 * 1_000_000, next..);
        written[i].extend(more);
    }
    let full = pool.pool_stats().unwrap();
    assert!(
        full.data_bytes - full.data_used_bytes < 4 * CHUNK,
        "{full:?}"
    );
    assert_clean(&pool);
    for (i, &v) in vols.iter().enumerate() {
        assert_chunks(&pool, v, i as u64 * 1_000_000, &written[i]);
    }
    drop(Arc::try_unwrap(pool).ok().expect("one owner").close());
    let pool = reopen(&disk);
    assert_eq!(pool.pool_stats().unwrap().data_bytes, full.data_bytes);
    assert_clean(&pool);
    for (i, &v) in vols.iter().enumerate() {
        assert_chunks(&pool, v, i as u64 * 1_000_000, &written[i]);
    }
}

/// `MetadataFull` is curable: a growth that adds mostly metadata lets the
/// operations that failed succeed.
#[test]
fn growing_metadata_cures_metadata_full() {
    let disk = SimDisk::new(160 * MIB);
    let pool = pool_on(&disk, MIB, 2);
    let v = pool.create_volume("v", 512 * MIB).unwrap();
    // Scattered single chunks fill metadata long before data.
    let mut written = Vec::new();
    let mut c = 0;
    loop {
        match pool.write(v, c * CHUNK, &pattern(c, 0, CHUNK as usize)) {
            Ok(()) => written.push(c),
            Err(Error::Exhausted(Resource::Metadata)) => break,
            Err(e) => panic!("{e}"),
        }
        c += 2;
    }
    let failed = c;
    let before = pool.pool_stats().unwrap();
    let report = pool
        .grow(&GrowOptions {
            size: Some(162 * MIB),
            metadata_bytes: Some(MIB + 512 * 1024),
        })
        .unwrap();
    assert_eq!(report.metadata_bytes_added, MIB + 512 * 1024);
    let after = pool.pool_stats().unwrap();
    assert_eq!(
        after.metadata_bytes,
        before.metadata_bytes + MIB + 512 * 1024
    );
    pool.snapshot("v@s").unwrap();
    // More nodes than the old region holds: they live in the grown one.
    let mut c = failed;
    while pool.pool_stats().unwrap().metadata_used_bytes <= before.metadata_bytes + 64 * 1024 {
        pool.write(v, c * CHUNK, &pattern(c, 0, CHUNK as usize))
            .unwrap_or_else(|e| panic!("chunk {c} after the growth: {e}"));
        written.push(c);
        c += 2;
        assert!(
            c < failed + 40_000,
            "metadata use never passed the old region"
        );
    }
    assert_clean(&pool);
    pool.close().unwrap();
    let pool = reopen(&disk);
    assert_clean(&pool);
    assert_chunks(&pool, v, 0, &written);
}

/// A power cut at every write or flush of a growth (and torn or partial
/// unflushed writes) opens the pool at its old size or its new one, never
/// anything else, clean, with every flushed write.
#[test]
fn a_power_cut_during_growth_opens_at_the_old_or_the_new_size() {
    let mut outcomes: HashMap<&str, usize> = HashMap::new();
    let mut rng = StdRng::seed_from_u64(12);
    for cut in 0.. {
        let disk = SimDisk::new(16 * MIB);
        let pool = pool_on(&disk, 2 * MIB, 2);
        let v = pool.create_volume("v", 64 * MIB).unwrap();
        let written = fill_data(&pool, v, 7, (0..).step_by(3).take(400));
        pool.flush().unwrap();
        // Unflushed writes in flight during the growth: they may be lost.
        pool.write(v, CHUNK, &[9; 4096]).unwrap();
        let old = pool.pool_stats().unwrap();
        let handle = disk.handle();
        handle.cut_power_after(cut);
        let result = pool.grow(&GrowOptions {
            size: Some(32 * MIB),
            metadata_bytes: None,
        });
        let finished = result.is_ok() && handle.is_powered();
        handle.cut_power();
        for round in 0..3 {
            let image = if round == 0 {
                handle.durable_image()
            } else {
                handle.crash_image(&mut rng)
            };
            let (disk2, pool2) = open(image);
            let stats = pool2.pool_stats().unwrap();
            let which = if stats.data_bytes == old.data_bytes
                && stats.metadata_bytes == old.metadata_bytes
            {
                "old"
            } else {
                assert_eq!(stats.pool_bytes, 32 * MIB, "cut {cut}: {stats:?}");
                assert!(stats.data_bytes > old.data_bytes);
                "new"
            };
            *outcomes.entry(which).or_default() += 1;
            assert_clean(&pool2);
            assert_chunks(&pool2, v, 7, &written);
            // The pool works in either size: it grows (again) and writes.
            pool2
                .grow(&GrowOptions {
                    size: Some(33 * MIB),
                    metadata_bytes: None,
                })
                .unwrap();
            let more = fill_data(&pool2, v, 5_000_000, (1..).step_by(3).take(1000));
            assert_eq!(more.len(), 1000, "cut {cut}: the grown space takes writes");
            assert_clean(&pool2);
            drop(pool2);
            drop(disk2);
        }
        if finished {
            assert!(cut > 4, "a growth takes several writes and flushes");
            break;
        }
    }
    assert!(
        outcomes.get("old").copied().unwrap_or(0) > 0,
        "{outcomes:?}"
    );
    assert!(
        outcomes.get("new").copied().unwrap_or(0) > 0,
        "{outcomes:?}"
    );
}

/// Version 1 pools open and keep writing version 1; growth asks for an
/// upgrade; the upgrade survives a reopen and the pool then grows.
#[test]
fn version_1_pools_stay_version_1_until_upgraded() {
    let disk = SimDisk::new(24 * MIB);
    let pool = pool_on(&disk, 2 * MIB, 1);
    let v = pool.create_volume("v", 64 * MIB).unwrap();
    let written = fill_data(&pool, v, 3, (0..).step_by(2).take(300));
    pool.close().unwrap();
    let header_version = |disk: &SimDisk, block: u64| {
        let mut raw = [0u8; 8];
        disk.read_at(&mut raw, block * 4096).unwrap();
        u16::from_le_bytes([raw[4], raw[5]])
    };
    assert_eq!(header_version(&disk, 0), 1);
    assert_eq!(header_version(&disk, 1), 1);
    let pool = reopen(&disk);
    assert_eq!(pool.format_version().number(), 1);
    disk.extend(40 * MIB).unwrap();
    let e = pool.grow(&GrowOptions::default()).unwrap_err();
    assert!(matches!(e, Error::Refused(Refusal::Invalid(_))), "{e}");
    assert!(e.to_string().contains("upgrade"), "{e}");
    pool.write(v, 0, &[5; 4096]).unwrap();
    pool.flush().unwrap();
    assert_eq!(header_version(&disk, 0), 1, "no silent upgrade");
    // Journal area A starts at block 2: its record (if any) is version 1 too.
    assert!(header_version(&disk, 2) <= 1);
    assert_eq!(
        pool.guid(v).unwrap(),
        None,
        "a version 1 table has no identities"
    );
    assert!(pool.upgrade().unwrap());
    assert!(!pool.upgrade().unwrap(), "already the newest version");
    assert_eq!(header_version(&disk, 0), FORMAT_VERSION);
    assert_eq!(header_version(&disk, 1), FORMAT_VERSION);
    let guid = pool.guid(v).unwrap().expect("the upgrade gives identities");
    assert_clean(&pool);
    pool.close().unwrap();
    let pool = reopen(&disk);
    assert_eq!(pool.format_version().number(), FORMAT_VERSION);
    assert_eq!(pool.guid(v).unwrap(), Some(guid), "identities are durable");
    let report = pool.grow(&GrowOptions::default()).unwrap();
    assert_eq!(report.new_pool_bytes, 40 * MIB);
    let more = fill_data(&pool, v, 3, (1..).step_by(2).take(3000));
    assert_eq!(more.len(), 3000);
    assert_clean(&pool);
    let mut buf = [0u8; 4096];
    pool.read(v, 0, &mut buf).unwrap();
    assert_eq!(buf, [5; 4096]);
    assert_chunks(&pool, v, 3, &written[1..]);
    assert_chunks(&pool, v, 3, &more);
}

/// Growth refuses what it cannot do, with a clear error and no change:
/// shrinking, a device with no room, more growths than a commit record
/// describes.
#[test]
fn growth_refuses_what_it_cannot_do_and_changes_nothing() {
    let disk = SimDisk::new(16 * MIB);
    let pool = pool_on(&disk, 2 * MIB, 2);
    let v = pool.create_volume("v", 8 * MIB).unwrap();
    pool.write(v, 0, &[1; 4096]).unwrap();
    let before = pool.pool_stats().unwrap();
    let refused = |opts: GrowOptions| {
        let e = pool.grow(&opts).unwrap_err();
        assert!(matches!(e, Error::Refused(Refusal::Invalid(_))), "{e}");
        assert_eq!(pool.pool_stats().unwrap().data_bytes, before.data_bytes);
        e.to_string()
    };
    let e = refused(GrowOptions {
        size: Some(8 * MIB),
        metadata_bytes: None,
    });
    assert!(e.contains("shrink"), "{e}");
    let e = refused(GrowOptions::default());
    assert!(e.contains("no room"), "{e}");
    let e = refused(GrowOptions {
        size: Some(17 * MIB),
        metadata_bytes: Some(4 * MIB),
    });
    assert!(e.contains("no room"), "{e}");
    // 64 growths fit a commit record; the 65th is refused.
    for i in 1..=64 {
        pool.grow(&GrowOptions {
            size: Some(16 * MIB + i * 256 * 1024),
            metadata_bytes: None,
        })
        .unwrap_or_else(|e| panic!("growth {i}: {e}"));
    }
    let grown = pool.pool_stats().unwrap();
    let e = pool
        .grow(&GrowOptions {
            size: Some(40 * MIB),
            metadata_bytes: None,
        })
        .unwrap_err();
    assert!(e.to_string().contains("64 times"), "{e}");
    assert_eq!(pool.pool_stats().unwrap(), grown);
    assert_clean(&pool);
    // Every region's chunks are usable and survive a reopen.
    let written = fill_data(&pool, v, 11, 0..2048);
    assert_clean(&pool);
    pool.close().unwrap();
    let pool = reopen(&disk);
    assert_eq!(pool.pool_stats().unwrap().data_bytes, grown.data_bytes);
    assert_chunks(&pool, v, 11, &written);
    assert_clean(&pool);
}

/// Consecutive chunk numbers on either side of a region's end are not
/// consecutive on the device: an extent that maps the last chunk of one
/// region and the first of the next (the allocator hands them out in
/// order, and the mapping merges them) reads back whole. (The exhaustion
/// campaign found reads of such extents returning the bytes between the
/// regions.)
#[test]
fn an_extent_across_a_region_boundary_reads_back() {
    let disk = SimDisk::new(8 * MIB);
    let pool = pool_on(&disk, MIB, 2);
    let v = pool.create_volume("v", 64 * MIB).unwrap();
    let written = fill_data(&pool, v, 21, 0..);
    let n = written.len() as u64;
    assert_eq!(written, (0..n).collect::<Vec<_>>());
    pool.grow(&GrowOptions {
        size: Some(9 * MIB),
        metadata_bytes: None,
    })
    .unwrap();
    // One write over the old end: chunks n-1 (rewritten in place or
    // redirected) and n, n+1 (new, from the grown region).
    let data: Vec<u8> = (n - 1..n + 2)
        .flat_map(|c| pattern(21 + c, 0, CHUNK as usize))
        .collect();
    pool.write(v, (n - 1) * CHUNK, &data).unwrap();
    for round in 0..2 {
        let mut buf = vec![0u8; 6 * CHUNK as usize];
        pool.read(v, (n - 3) * CHUNK, &mut buf).unwrap();
        let want: Vec<u8> = (n - 3..n + 3)
            .flat_map(|c| {
                if c < n + 2 {
                    pattern(21 + c, 0, CHUNK as usize)
                } else {
                    vec![0; CHUNK as usize]
                }
            })
            .collect();
        assert!(
            buf == want,
            "round {round}: the read across the regions differs"
        );
        pool.flush().unwrap();
    }
    assert_clean(&pool);
}

/// A size no device can take is a usage error, not an I/O failure, and
/// changes nothing.
#[test]
fn an_impossible_size_is_refused() {
    let disk = SimDisk::new(16 * MIB);
    let pool = pool_on(&disk, 2 * MIB, 2);
    let before = pool.pool_stats().unwrap();
    for size in [1u64 << 60, u64::MAX] {
        let e = pool
            .grow(&GrowOptions {
                size: Some(size),
                metadata_bytes: None,
            })
            .unwrap_err();
        assert!(matches!(e, Error::Refused(Refusal::Invalid(_))), "{e}");
    }
    assert_eq!(pool.pool_stats().unwrap(), before);
    assert_eq!(disk.size(), 16 * MIB);
    assert_clean(&pool);
}

/// An upgrade to version 3 writes both superblocks, then converts the
/// volume table in a commit of its own: a power cut between the two leaves a
/// version 3 pool with a version 1 table, which opens, works, and is
/// converted at that open.
#[test]
fn an_upgrade_cut_before_the_table_conversion_finishes_at_the_next_open() {
    let disk = SimDisk::new(24 * MIB);
    let pool = pool_on(&disk, 2 * MIB, 2);
    let v = pool.create_volume("v", 64 * MIB).unwrap();
    pool.write(v, 0, &[9; 4096]).unwrap();
    pool.snapshot("v@s").unwrap();
    pool.close().unwrap();
    // The superblocks only, as if the power went right after them.
    for block in 0..2u64 {
        let mut raw = vec![0u8; 4096];
        disk.read_at(&mut raw, block * 4096).unwrap();
        let (sb, _) = arbor_format::Superblock::decode_versioned(&raw, disk.size()).unwrap();
        let raw = sb.encode(arbor_format::FormatVersion::NEWEST).unwrap();
        disk.write_at(&raw, block * 4096).unwrap();
    }
    disk.flush().unwrap();
    let pool = reopen(&disk);
    assert_eq!(pool.format_version().number(), FORMAT_VERSION);
    let s = pool.lookup("v@s").unwrap();
    let (gv, gs) = (
        pool.guid(v).unwrap().unwrap(),
        pool.guid(s).unwrap().unwrap(),
    );
    assert_ne!(gv, gs);
    assert_clean(&pool);
    pool.close().unwrap();
    let pool = reopen(&disk);
    assert_eq!(pool.guid(s).unwrap(), Some(gs));
    let mut buf = [0u8; 4096];
    pool.read(s, 0, &mut buf).unwrap();
    assert_eq!(buf, [9; 4096]);
    assert_clean(&pool);
}
