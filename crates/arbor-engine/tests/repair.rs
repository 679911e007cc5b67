//! `check` reports every damaged structure; `repair` rebuilds what can be
//! rebuilt (superblock copies, space maps, a damaged reclaim queue) and
//! refuses what cannot (damaged volume trees).
// A test crate: unwrap, expect and panic are how a test reports failure
// (the workspace denies them in the code it ships; clippy.toml allows
// them in #[test] functions, this in the helpers around them).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;

use arbor_engine::{repair, Error, Fault, Pool};
use arbor_format::{CommitRecord, Superblock, BLOCK_SIZE};
use arbor_io::{BlockDevice, SimDisk};
use common::*;

const BS: usize = BLOCK_SIZE;

/// A pool with volumes, a snapshot, a clone and a deleted volume whose
/// tree waits in the reclaim queue. Returns the disk and each live
/// volume's contents.
fn populated() -> (SimDisk, Vec<(String, Vec<u8>)>) {
    let (disk, pool) = sim_pool(32 * MIB, 4096);
    let v = pool.create_volume("vm1", MIB).unwrap();
    let doomed = pool.create_volume("doomed", MIB).unwrap();
    for i in 0..128u64 {
        pool.write(v, i * 8192, &pattern(i, i * 8192, 4096))
            .unwrap();
        pool.write(doomed, i * 4096, &pattern(i + 500, i * 4096, 4096))
            .unwrap();
    }
    pool.snapshot("vm1@a").unwrap();
    pool.clone_snapshot("vm1@a", "c1").unwrap();
    let c1 = pool.lookup("c1").unwrap();
    pool.write(c1, 4096, &pattern(777, 4096, 8192)).unwrap();
    pool.delete("doomed").unwrap();
    let contents = ["vm1", "vm1@a", "c1"]
        .iter()
        .map(|n| (n.to_string(), read_all(&pool, n)))
        .collect();
    pool.close().unwrap();
    (disk, contents)
}

fn read_all(pool: &Pool, name: &str) -> Vec<u8> {
    let mut buf = vec![0u8; MIB as usize];
    pool.read(pool.lookup(name).unwrap(), 0, &mut buf).unwrap();
    buf
}

fn geometry(image: &[u8]) -> Superblock {
    Superblock::decode(&image[..BS], image.len() as u64).unwrap()
}

fn newest_commit(image: &[u8]) -> CommitRecord {
    let sb = geometry(image);
    sb.journal_start
        .iter()
        .filter_map(|a| {
            let at = a.get() as usize * BS;
            CommitRecord::decode(&image[at..at + BS]).ok()
        })
        .max_by_key(|r| r.txn.get())
        .unwrap()
}

fn zero_block(disk: &SimDisk, block: u64) {
    disk.write_at(&[0u8; BS], block * BS as u64).unwrap();
    disk.flush().unwrap();
}

fn problems(pool: &Pool) -> Vec<String> {
    pool.check().expect("check runs to the end").problems
}

fn repair_disk(disk: &SimDisk) -> arbor_engine::Result<arbor_engine::RepairReport> {
    let dev: Arc<dyn BlockDevice> = Arc::new(disk.clone());
    repair(dev, &open_opts())
}

fn assert_contents(pool: &Pool, contents: &[(String, Vec<u8>)]) {
    for (name, data) in contents {
        assert!(read_all(pool, name) == *data, "{name} changed");
    }
}

#[test]
fn check_reports_a_damaged_superblock_copy_and_repair_rewrites_it() {
    let (disk, contents) = populated();
    // Damaged while the pool is open (opening rewrites a damaged copy from
    // the other: tests/records.rs).
    let pool = reopen(&disk);
    let mut byte = [0u8; 1];
    disk.read_at(&mut byte, 100).unwrap();
    disk.write_at(&[byte[0] ^ 0x04], 100).unwrap();
    disk.flush().unwrap();
    let found = problems(&pool);
    assert!(
        found.iter().any(|p| p.contains("superblock copy 0")),
        "{found:?}"
    );
    drop(pool);
    let report = repair_disk(&disk).unwrap();
    assert!(
        report
            .actions
            .iter()
            .any(|a| a.contains("superblock copy 0")),
        "{report:?}"
    );
    let pool = reopen(&disk);
    assert_clean(&pool);
    assert_contents(&pool, &contents);
}

#[test]
fn check_reports_a_damaged_space_map_page_and_goes_on() {
    let (disk, contents) = populated();
    let image = disk.handle().durable_image();
    let sb = geometry(&image);
    let pool = reopen(&disk);
    // A commit that changes no data-map page: the newest journal then holds
    // no copy of data page 0, so nothing can rewrite it from there.
    pool.create_volume("x", MIB).unwrap();
    zero_block(&disk, sb.data_sm_start.get());
    let found = problems(&pool);
    assert!(
        found.iter().any(|p| p.contains("data chunk space map")),
        "{found:?}"
    );
    // The walk went on past the damaged page: the metadata map was compared too.
    assert_contents(&pool, &contents);
    drop(pool);
    let report = repair_disk(&disk).unwrap();
    assert!(!report.actions.is_empty());
    let pool = reopen(&disk);
    assert_clean(&pool);
    assert_contents(&pool, &contents);
    // The repaired maps are right: reclaim and new writes keep the pool clean.
    while pool.reclaim(1000).unwrap() > 0 {}
    let v = pool.lookup("vm1").unwrap();
    pool.write(v, 0, &pattern(9, 0, 65536)).unwrap();
    assert_clean(&pool);
}

#[test]
fn repair_restores_wrong_counts_from_the_trees() {
    let (disk, contents) = populated();
    let sb = geometry(&disk.handle().durable_image());
    let pool = reopen(&disk);
    // A valid but wrong page: every data chunk of page 0 looks free, so the
    // allocator would hand out chunks that volumes still map.
    let page = arbor_format::SmPage::empty(arbor_format::SmKind::Data, 0);
    disk.write_at(&page.encode(), sb.data_sm_start.get() * BS as u64)
        .unwrap();
    disk.flush().unwrap();
    let found = problems(&pool);
    assert!(
        found.iter().any(|p| p.contains("space map counts 0")),
        "{found:?}"
    );
    drop(pool);
    repair_disk(&disk).unwrap();
    let pool = reopen(&disk);
    assert_clean(&pool);
    assert_contents(&pool, &contents);
    assert!(
        repair_disk(&disk).unwrap().actions.is_empty(),
        "repair is idempotent"
    );
}

#[test]
fn repair_drops_a_damaged_reclaim_queue() {
    let (disk, contents) = populated();
    let image = disk.handle().durable_image();
    let queue_root = newest_commit(&image).queue_root.block.get();
    assert_ne!(queue_root, 0, "the deleted volume awaits reclaim");
    zero_block(&disk, queue_root);
    let pool = reopen(&disk);
    assert!(!problems(&pool).is_empty());
    let used_before = pool.pool_stats().unwrap().data_used_bytes;
    drop(pool);
    let report = repair_disk(&disk).unwrap();
    assert!(
        report.actions.iter().any(|a| a.contains("reclaim queue")),
        "{report:?}"
    );
    let pool = reopen(&disk);
    assert_clean(&pool);
    assert_contents(&pool, &contents);
    let stats = pool.pool_stats().unwrap();
    assert!(!stats.reclaim_pending);
    assert!(
        stats.data_used_bytes < used_before,
        "the deleted volume's space is free"
    );
}

#[test]
fn repair_refuses_a_damaged_volume_tree() {
    let (disk, _) = populated();
    let image = disk.handle().durable_image();
    let pool = reopen(&disk);
    let volumes_root = newest_commit(&image).volumes_root.block.get();
    let victim = pool
        .metadata_blocks_in_use()
        .unwrap()
        .into_iter()
        .find(|&b| b != volumes_root && matches!(image[b as usize * BS + 32], 1 | 5))
        .expect("a mapping node (kind 1, or 5 for a packed leaf)");
    drop(pool);
    zero_block(&disk, victim);
    let before = disk.handle().durable_image();
    let err = repair_disk(&disk).unwrap_err();
    assert!(matches!(err, Error::Stop(Fault::Inconsistent(_))), "{err}");
    assert!(err.to_string().contains("cannot repair"), "{err}");
    assert!(
        disk.handle().durable_image() == before,
        "a refused repair changes nothing"
    );
}

/// Regression (found by the open_pool fuzz target): `check` read the page
/// images of the other journal area's record without bounding its page
/// count by the journal size, and tried to allocate terabytes.
#[test]
fn check_bounds_a_hostile_journal_page_count() {
    let (disk, contents) = populated();
    let image = disk.handle().durable_image();
    let sb = geometry(&image);
    let newest = newest_commit(&image);
    let older_area = sb
        .journal_start
        .iter()
        .map(|a| a.get())
        .find(|a| {
            let at = *a as usize * BS;
            CommitRecord::decode(&image[at..at + BS]).map_or(true, |r| r.txn != newest.txn)
        })
        .unwrap();
    let mut hostile = newest;
    hostile.txn = (newest.txn.get() - 1).into();
    hostile.page_count = u32::MAX.into();
    let two = arbor_format::FormatVersion::new(2).unwrap();
    disk.write_at(&hostile.encode(two).unwrap(), older_area * BS as u64)
        .unwrap();
    disk.flush().unwrap();
    let pool = reopen(&disk);
    let report = pool.check().unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert!(
        !report.warnings.is_empty(),
        "the bad fallback record is reported"
    );
    assert_contents(&pool, &contents);
}
