//! Bad input: garbage, truncated pools, flipped bits in metadata and in the
//! superblock, and bad API arguments give clear errors (or open the other
//! superblock copy), never a panic or wrong data.
// A test crate: unwrap, expect and panic are how a test reports failure
// (the workspace denies them in the code it ships; clippy.toml allows
// them in #[test] functions, this in the helpers around them).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;

use arbor_engine::{Error, Fault, OpenOptions, Pool, Refusal};
use arbor_io::{BlockDevice, SimDisk};
use common::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn open_image(image: Vec<u8>) -> Result<Pool, Error> {
    let dev: Arc<dyn BlockDevice> = Arc::new(SimDisk::from_image(image));
    Pool::open(dev, &OpenOptions::default())
}

/// A pool with some volumes, snapshots and data; returns its image.
fn populated_image() -> Vec<u8> {
    populated_image_of(arbor_format::FormatVersion::NEWEST)
}

/// [`populated_image`] of format `version`.
fn populated_image_of(version: arbor_format::FormatVersion) -> Vec<u8> {
    let disk = SimDisk::new(32 * MIB);
    let opts = arbor_engine::CreateOptions {
        format_version: version,
        ..small_opts(4096)
    };
    let dev: Arc<dyn BlockDevice> = Arc::new(disk.clone());
    let pool = Pool::create(dev, &opts, &open_opts()).unwrap();
    let v = pool.create_volume("vm1", 4 * MIB).unwrap();
    for i in 0..200u64 {
        pool.write(v, i * 8192, &pattern(i, i * 8192, 4096))
            .unwrap();
    }
    pool.snapshot("vm1@a").unwrap();
    pool.clone_snapshot("vm1@a", "c1").unwrap();
    pool.write(v, 0, &pattern(999, 0, 4096)).unwrap();
    pool.close().unwrap();
    disk.handle().durable_image()
}

#[test]
fn garbage_and_empty_devices_are_not_pools() {
    assert!(matches!(
        open_image(vec![0; 8 * MIB as usize]),
        Err(Error::Stop(Fault::NotAPool))
    ));
    let mut rng = StdRng::seed_from_u64(5);
    let garbage: Vec<u8> = (0..8 * MIB).map(|_| rng.gen()).collect();
    assert!(matches!(
        open_image(garbage),
        Err(Error::Stop(Fault::NotAPool))
    ));
    assert!(matches!(
        open_image(vec![0; 100]),
        Err(Error::Stop(Fault::NotAPool))
    ));
}

#[test]
fn truncated_pool_is_rejected() {
    let image = populated_image();
    for len in [4096usize, 16 * 4096, image.len() / 2, image.len() - 4096] {
        let err = open_image(image[..len].to_vec())
            .err()
            .expect("a truncated pool must not open");
        assert!(
            matches!(
                err,
                Error::Stop(Fault::Corrupt { .. }) | Error::Stop(Fault::NotAPool)
            ),
            "{len}: {err}"
        );
    }
}

#[test]
fn one_damaged_superblock_copy_opens_from_the_other() {
    let clean = populated_image();
    let mut image = clean.clone();
    image[100] ^= 0x01;
    let disk = SimDisk::from_image(image.clone());
    let dev: Arc<dyn BlockDevice> = Arc::new(disk.clone());
    let pool = Pool::open(dev, &OpenOptions::default()).expect("second superblock copy is used");
    // Opening rewrote the damaged copy from the other (so a later fault in
    // that one is survived too), and check lists what it did.
    let report = pool.check().unwrap();
    assert!(
        report
            .warnings
            .iter()
            .any(|w| w.contains("superblock copy 0")),
        "check reports the damaged copy: {:?}",
        report.warnings
    );
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    drop(pool);
    assert_eq!(disk.handle().durable_image()[..4096], clean[..4096]);
    image[4096 + 100] ^= 0x01;
    assert!(matches!(
        open_image(image),
        Err(Error::Stop(Fault::Corrupt { .. }))
    ));
}

#[test]
fn flipped_bits_in_metadata_never_panic_or_return_wrong_data() {
    flipped_bits_in_metadata(arbor_format::FormatVersion::NEWEST);
}

#[test]
fn flipped_bits_in_version_8_metadata_never_panic_or_return_wrong_data() {
    flipped_bits_in_metadata(arbor_format::FormatVersion::new(8).unwrap());
}

fn flipped_bits_in_metadata(version: arbor_format::FormatVersion) {
    let clean = populated_image_of(version);
    let dev_size = clean.len();
    let contents = |pool: &Pool| -> Vec<Vec<u8>> {
        ["vm1", "vm1@a", "c1"]
            .iter()
            .map(|n| {
                let mut buf = vec![0u8; 4 * MIB as usize];
                pool.read(pool.lookup(n).unwrap(), 0, &mut buf).unwrap();
                buf
            })
            .collect()
    };
    let (expected, metadata_end) = {
        let pool = open_image(clean.clone()).unwrap();
        let stats = pool.pool_stats().unwrap();
        // Everything below the data region is metadata (the data region ends the pool, up to one chunk of slack).
        let metadata_end = (stats.pool_bytes - stats.data_bytes - stats.chunk_size) as usize;
        (contents(&pool), metadata_end)
    };
    // Up to version 8, a damaged newest commit record (or page image) is
    // indistinguishable from one torn by a power cut: the pool opens at the
    // previous commit (FORMAT.md §4, as ZFS falls back to an older
    // uberblock) and `check` says so. What the volumes hold then: the
    // previous commit's contents. From version 9 the record's other copy
    // is used, and nothing is lost.
    let previous = {
        let (sb, _) =
            arbor_format::Superblock::decode_versioned(&clean[..4096], dev_size as u64).unwrap();
        let newest = sb
            .journal_start
            .iter()
            .map(|a| a.get() as usize)
            .max_by_key(|&a| {
                arbor_format::CommitRecord::decode(&clean[a * 4096..(a + 1) * 4096])
                    .map(|r| r.txn.get())
                    .unwrap_or(0)
            })
            .unwrap();
        let mut image = clean.clone();
        image[newest * 4096..(newest + 1) * 4096].fill(0);
        let pool = open_image(image).unwrap();
        let report = pool.check().unwrap();
        assert!(report.is_clean(), "{:?}", report.problems);
        contents(&pool)
    };
    if version.has_mirrored_commit_records() {
        assert!(previous == expected, "a damaged record copy cost a commit");
    } else {
        assert!(previous != expected, "the last commit changed the volumes");
    }
    let mut rng = StdRng::seed_from_u64(11);
    // Flip bits in the metadata area (journals, space maps, nodes). Chunk data
    // carries no checksum (as in dm-thin), so flips there are not detectable.
    // Flips land in blocks that hold something (most of the metadata area
    // is unused: a flip there proves nothing).
    let written: Vec<usize> = (2..metadata_end.min(dev_size) / 4096)
        .filter(|b| clean[b * 4096..(b + 1) * 4096].iter().any(|&x| x != 0))
        .collect();
    assert!(
        written.len() > 10,
        "{} metadata blocks written",
        written.len()
    );
    let mut detected = 0;
    for _ in 0..300 {
        let mut image = clean.clone();
        let at = written[rng.gen_range(0..written.len())] * 4096 + rng.gen_range(0..4096);
        image[at] ^= 1 << rng.gen_range(0..8);
        let Ok(pool) = open_image(image) else {
            detected += 1;
            continue;
        };
        let fell_back = match pool.check() {
            Ok(report) if !report.is_clean() => {
                detected += 1;
                false
            }
            Ok(report) => report
                .warnings
                .iter()
                .any(|w| w.contains("damaged or torn") || w.contains("is newer than")),
            Err(_) => false,
        };
        for (i, n) in ["vm1", "vm1@a", "c1"].iter().enumerate() {
            let Ok(id) = pool.lookup(n) else {
                detected += 1;
                continue;
            };
            let mut buf = vec![0u8; 4 * MIB as usize];
            match pool.read(id, 0, &mut buf) {
                Ok(()) if fell_back && buf == previous[i] => detected += 1,
                Ok(()) => assert!(
                    buf == expected[i],
                    "a flipped metadata bit at {at} returned wrong data for {n} (fell back: {fell_back})"
                ),
                Err(_) => detected += 1,
            }
        }
    }
    assert!(detected > 0, "no damage was ever detected");
}

#[test]
fn bad_arguments_are_clear_errors() {
    let (_disk, pool) = sim_pool(32 * MIB, 4096);
    let v = pool.create_volume("vm1", MIB).unwrap();
    assert!(matches!(
        pool.create_volume("vm1", MIB),
        Err(Error::Refused(Refusal::AlreadyExists(_)))
    ));
    assert!(matches!(
        pool.create_volume("bad name", MIB),
        Err(Error::Refused(Refusal::InvalidName { .. }))
    ));
    assert!(matches!(
        pool.create_volume("x", 1000),
        Err(Error::Refused(Refusal::Invalid(_)))
    ));
    assert!(matches!(
        pool.create_volume("x", 0),
        Err(Error::Refused(Refusal::Invalid(_)))
    ));
    assert!(matches!(
        pool.create_volume("x", u64::MAX - 511),
        Err(Error::Refused(Refusal::Invalid(_)))
    ));
    // Any byte offset and length inside the volume is I/O, not a bad
    // argument (byte-granular NBD clients); past the end it is.
    pool.write(v, 100, &[9; 512]).unwrap();
    let mut around = [0u8; 1024];
    pool.read(v, 0, &mut around).unwrap();
    assert!(around[..100].iter().all(|&b| b == 0) && around[100..612].iter().all(|&b| b == 9));
    assert!(around[612..].iter().all(|&b| b == 0));
    assert!(matches!(
        pool.write(v, MIB - 100, &[0; 101]),
        Err(Error::Refused(Refusal::Invalid(_)))
    ));
    assert!(matches!(
        pool.write(v, MIB, &[0; 512]),
        Err(Error::Refused(Refusal::Invalid(_)))
    ));
    assert!(matches!(
        pool.write(v, u64::MAX - 511, &[0; 512]),
        Err(Error::Refused(Refusal::Invalid(_)))
    ));
    let mut buf = [0u8; 512];
    assert!(matches!(
        pool.read(v, MIB - 256, &mut buf),
        Err(Error::Refused(Refusal::Invalid(_)))
    ));
    assert!(matches!(
        pool.discard(v, 0, MIB + 512),
        Err(Error::Refused(Refusal::Invalid(_)))
    ));
    assert!(matches!(
        pool.snapshot("vm1"),
        Err(Error::Refused(Refusal::InvalidName { .. }))
    ));
    assert!(matches!(
        pool.snapshot("nope@x"),
        Err(Error::Refused(Refusal::NotFound(_)))
    ));
    pool.snapshot("vm1@s").unwrap();
    assert!(matches!(
        pool.snapshot("vm1@s"),
        Err(Error::Refused(Refusal::AlreadyExists(_)))
    ));
    assert!(matches!(
        pool.snapshot("vm1@s@t"),
        Err(Error::Refused(Refusal::InvalidName { .. }))
    ));
    assert!(matches!(
        pool.clone_snapshot("vm1", "c"),
        Err(Error::Refused(Refusal::Invalid(_)))
    ));
    assert!(matches!(
        pool.rollback("vm1", "vm1"),
        Err(Error::Refused(Refusal::Invalid(_)))
    ));
    assert!(matches!(
        pool.resize("vm1@s", MIB),
        Err(Error::Refused(Refusal::ReadOnly(_)))
    ));
    assert!(matches!(
        pool.rename("vm1@s", "other@s"),
        Err(Error::Refused(Refusal::Invalid(_)))
    ));
    assert!(matches!(
        pool.delete("ghost"),
        Err(Error::Refused(Refusal::NotFound(_)))
    ));
    let s = pool.lookup("vm1@s").unwrap();
    assert!(matches!(
        pool.write(s, 0, &[0; 512]),
        Err(Error::Refused(Refusal::ReadOnly(_)))
    ));
    pool.delete("vm1").unwrap();
    assert!(matches!(
        pool.read(v, 0, &mut buf),
        Err(Error::Refused(Refusal::NotFound(_)))
    ));
    // The snapshot outlives its volume.
    pool.read(s, 0, &mut buf).unwrap();
    assert_clean(&pool);
}

#[test]
fn invalid_pool_layouts_are_rejected() {
    let dev: Arc<dyn BlockDevice> = Arc::new(SimDisk::new(32 * MIB));
    for chunk in [0u32, 1000, 2048, 2 << 20] {
        let opts = arbor_engine::CreateOptions {
            chunk_size: chunk,
            metadata_bytes: None,
            ..Default::default()
        };
        assert!(matches!(
            Pool::create(Arc::clone(&dev), &opts, &open_opts()),
            Err(Error::Refused(Refusal::Invalid(_)))
        ));
    }
    let tiny: Arc<dyn BlockDevice> = Arc::new(SimDisk::new(MIB));
    assert!(matches!(
        Pool::create(tiny, &small_opts(4096), &open_opts()),
        Err(Error::Refused(Refusal::Invalid(_)))
    ));
}
