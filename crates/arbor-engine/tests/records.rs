//! No single point of failure in the commit record (format version 9,
//! docs/FORMAT.md §4 "Version 9"): single-block damage to a copy of the
//! newest commit record, to one of its page images or to a superblock copy
//! opens the pool at its newest commit, every acknowledged write intact,
//! and the damaged copy is rewritten; a version 8 pool keeps its protocol
//! (a damaged newest record falls back to the previous commit).
// A test crate: unwrap, expect and panic are how a test reports failure
// (the workspace denies them in the code it ships; clippy.toml allows
// them in #[test] functions, this in the helpers around them).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;

use arbor_engine::{CreateOptions, Pool};
use arbor_format::{CommitRecord, FormatVersion, Superblock, BLOCK_SIZE};
use arbor_io::{BlockDevice, SimDisk};
use common::*;

const BS: usize = BLOCK_SIZE;
const VOL: u64 = MIB;

fn v(number: u16) -> FormatVersion {
    FormatVersion::new(number).unwrap()
}

fn pool_of(disk: &SimDisk, version: FormatVersion) -> Pool {
    let dev: Arc<dyn BlockDevice> = Arc::new(disk.clone());
    let opts = CreateOptions {
        format_version: version,
        ..small_opts(4096)
    };
    Pool::create(dev, &opts, &open_opts()).unwrap()
}

/// A pool of `version` whose last commit changed volume "a" (its writes
/// acknowledged by a flush) after an earlier commit that did not. Returns
/// the disk and what "a" holds after the last commit.
fn two_commits(version: FormatVersion) -> (SimDisk, Vec<u8>) {
    let disk = SimDisk::new(16 * MIB);
    let pool = pool_of(&disk, version);
    let a = pool.create_volume("a", VOL).unwrap();
    pool.write(a, 0, &pattern(1, 0, 64 << 10)).unwrap();
    pool.flush().unwrap();
    pool.write(a, 128 << 10, &pattern(2, 128 << 10, 32 << 10))
        .unwrap();
    pool.flush().unwrap();
    let want = read_a(&pool);
    drop(pool);
    (disk, want)
}

fn read_a(pool: &Pool) -> Vec<u8> {
    let mut buf = vec![0u8; VOL as usize];
    pool.read(pool.lookup("a").unwrap(), 0, &mut buf).unwrap();
    buf
}

fn block(disk: &SimDisk, b: u64) -> Vec<u8> {
    let mut buf = vec![0u8; BS];
    disk.read_at(&mut buf, b * BS as u64).unwrap();
    buf
}

fn put(disk: &SimDisk, b: u64, data: &[u8]) {
    disk.write_at(data, b * BS as u64).unwrap();
    disk.flush().unwrap();
}

fn flip(disk: &SimDisk, b: u64, byte: usize) {
    let mut data = block(disk, b);
    data[byte] ^= 0x10;
    put(disk, b, &data);
}

fn superblock(disk: &SimDisk) -> Superblock {
    Superblock::decode(&block(disk, 0), disk.size()).unwrap()
}

/// The newest commit's area (first block) and record.
fn newest(disk: &SimDisk) -> (u64, CommitRecord) {
    superblock(disk)
        .journal_start
        .iter()
        .filter_map(|a| {
            let record = CommitRecord::decode(&block(disk, a.get())).ok()?;
            Some((a.get(), record))
        })
        .max_by_key(|(_, r)| r.txn.get())
        .unwrap()
}

fn journal_pages(disk: &SimDisk) -> u64 {
    u64::from(superblock(disk).journal_pages.get())
}

/// Opens `disk` and checks it is at commit `txn` with "a" reading `want`,
/// `check` without problems and naming what opening repaired.
fn opens_at(disk: &SimDisk, txn: u64, want: &[u8], repaired: &str) {
    let pool = reopen(disk);
    assert_eq!(read_a(&pool), want, "an acknowledged write was lost");
    let report = pool.check().unwrap();
    assert!(report.problems.is_empty(), "{:#?}", report.problems);
    assert!(
        report.warnings.iter().any(|w| w.contains(repaired)),
        "check does not list what opening repaired ({repaired}): {:#?}",
        report.warnings
    );
    drop(pool);
    // Repaired for good: the next open finds nothing to repair.
    let pool = reopen(disk);
    assert_eq!(read_a(&pool), want);
    let report = pool.check().unwrap();
    assert!(
        !report.warnings.iter().any(|w| w.contains(repaired)),
        "{:#?}",
        report.warnings
    );
    assert!(newest(disk).1.txn.get() >= txn);
}

#[test]
fn version_9_commits_write_their_record_twice_after_their_images() {
    let (disk, _) = two_commits(FormatVersion::NEWEST);
    let (area, record) = newest(&disk);
    let last = area + journal_pages(&disk);
    assert_eq!(block(&disk, area), block(&disk, last), "the second copy");
    assert!(u64::from(record.page_count.get()) < journal_pages(&disk));
}

#[test]
fn a_damaged_copy_of_the_newest_record_opens_at_the_newest_commit() {
    for copy in ["first", "last"] {
        for damage in ["flip", "zero", "stale"] {
            let (disk, want) = two_commits(FormatVersion::NEWEST);
            let (area, record) = newest(&disk);
            let txn = record.txn.get();
            let at = if copy == "first" {
                area
            } else {
                area + journal_pages(&disk)
            };
            let good = block(&disk, area);
            match damage {
                "flip" => flip(&disk, at, 100),
                "zero" => put(&disk, at, &[0u8; BS]),
                // A lost write: the block as it was before (the area's
                // record of two commits before, or nothing).
                _ => {
                    let older = txn - 2;
                    let mut stale = CommitRecord::decode(&good).unwrap();
                    stale.txn = zerocopy::little_endian::U64::new(older);
                    put(&disk, at, &stale.encode(FormatVersion::NEWEST).unwrap());
                }
            }
            opens_at(&disk, txn, &want, "record copy");
            assert_eq!(newest(&disk).1.txn.get(), txn, "{copy} {damage}");
            assert_eq!(block(&disk, at), good, "{copy} {damage}: rewritten");
        }
    }
}

#[test]
fn a_damaged_page_image_of_the_newest_commit_rebuilds_the_space_maps() {
    for damage in ["flip", "zero"] {
        let (disk, want) = two_commits(FormatVersion::NEWEST);
        let (area, record) = newest(&disk);
        assert!(record.page_count.get() > 0);
        match damage {
            "flip" => flip(&disk, area + 1, 2000),
            _ => put(&disk, area + 1, &[0u8; BS]),
        }
        opens_at(&disk, record.txn.get() + 1, &want, "rebuilt");
        // The rebuilt state works on: a write, a reopen, a clean check.
        let pool = reopen(&disk);
        let a = pool.lookup("a").unwrap();
        pool.write(a, 512 << 10, &pattern(3, 512 << 10, 64 << 10))
            .unwrap();
        pool.flush().unwrap();
        drop(pool);
        assert_clean(&reopen(&disk));
    }
}

/// Version 8 keeps its protocol: a damaged newest record is a torn commit,
/// and the pool opens at the previous one.
#[test]
fn a_version_8_pool_falls_back_to_the_previous_commit() {
    let (disk, want) = two_commits(v(8));
    let (area, record) = newest(&disk);
    assert_eq!(block(&disk, area + journal_pages(&disk)), vec![0u8; BS]);
    flip(&disk, area, 100);
    let pool = reopen(&disk);
    assert_ne!(read_a(&pool), want, "version 8 falls back");
    drop(pool);
    assert_eq!(newest(&disk).1.txn.get(), record.txn.get() - 1);
}

#[test]
fn a_damaged_superblock_copy_is_rewritten_on_open() {
    for slot in 0..2u64 {
        let (disk, want) = two_commits(FormatVersion::NEWEST);
        let good = block(&disk, slot);
        let txn = newest(&disk).1.txn.get();
        flip(&disk, slot, 60);
        opens_at(&disk, txn, &want, "superblock copy");
        assert_eq!(block(&disk, slot), good);
    }
}

/// An upgrade to 9 whose write of superblock copy 0 was lost: copy 1 says
/// 9, version 9 commits follow; the pool opens as version 9 at its newest
/// commit (the first copy that verifies would say 8 and refuse them).
#[test]
fn an_upgrade_to_9_survives_a_lost_superblock_write() {
    let disk = SimDisk::new(16 * MIB);
    let pool = pool_of(&disk, v(8));
    let a = pool.create_volume("a", VOL).unwrap();
    pool.write(a, 0, &pattern(1, 0, 64 << 10)).unwrap();
    pool.flush().unwrap();
    let old = block(&disk, 0);
    assert!(pool.upgrade().unwrap());
    assert!(pool.format_version().has_mirrored_commit_records());
    pool.write(a, 256 << 10, &pattern(2, 256 << 10, 64 << 10))
        .unwrap();
    pool.flush().unwrap();
    let want = read_a(&pool);
    drop(pool);
    let txn = newest(&disk).1.txn.get();
    put(&disk, 0, &old);
    opens_at(&disk, txn, &want, "superblock copy 0");
    assert!(reopen(&disk).format_version().is_newest());
}

/// Upgrade 8 -> 9: the pool keeps serving, its next commits use the
/// version 9 protocol (two record copies), its version 8 records stay valid
/// (a reopen before any version 9 commit opens at them).
#[test]
fn a_version_8_pool_upgrades_to_9_and_serves() {
    let disk = SimDisk::new(16 * MIB);
    let pool = pool_of(&disk, v(8));
    let a = pool.create_volume("a", VOL).unwrap();
    pool.write(a, 0, &pattern(1, 0, 64 << 10)).unwrap();
    // Unflushed changes in the open transaction when the upgrade begins.
    pool.write(a, 64 << 10, &pattern(4, 64 << 10, 64 << 10))
        .unwrap();
    assert!(pool.upgrade().unwrap());
    assert!(!pool.upgrade().unwrap(), "already the newest version");
    let before = read_a(&pool);
    drop(pool);
    let pool = reopen(&disk);
    assert!(pool.format_version().is_newest());
    assert_eq!(
        read_a(&pool),
        before,
        "the version 8 records of a version 9 pool"
    );
    let a = pool.lookup("a").unwrap();
    pool.write(a, 256 << 10, &pattern(2, 256 << 10, 64 << 10))
        .unwrap();
    pool.flush().unwrap();
    let want = read_a(&pool);
    drop(pool);
    let (area, _) = newest(&disk);
    assert_eq!(
        block(&disk, area),
        block(&disk, area + journal_pages(&disk))
    );
    let pool = reopen(&disk);
    assert_eq!(read_a(&pool), want);
    assert_clean(&pool);
}
