//! The intent log (`crate::intents`, FORMAT.md §6.4.1): a write in place
//! into a region not yet durable in the intent set lists it by a record
//! made durable alone, not by a commit, and an open after a power cut or
//! a kill finds the record and recomputes the region's sums, so what the
//! write put on the device reads as data, never as damage.

use super::*;
use arbor_io::SimDisk;
use rand::{rngs::StdRng, SeedableRng};

const CS: u64 = 16 << 10;
const REGION: u64 = 16 << 20;

fn create(disk: &SimDisk, version: FormatVersion, log_blocks: Option<u64>) -> Pool {
    let opts = CreateOptions {
        chunk_size: CS as u32,
        metadata_bytes: Some(4 << 20),
        format_version: version,
        intent_log_blocks: log_blocks,
        ..Default::default()
    };
    Pool::create(Arc::new(disk.clone()), &opts, &OpenOptions::default()).unwrap()
}

/// A volume whose first chunk is written and committed: an in-place write
/// into it needs its region listed.
fn committed_chunk(pool: &Pool) -> VolumeId {
    let v = pool.create_volume("v", 1 << 20).unwrap();
    pool.write(v, 0, &[1; CS as usize]).unwrap();
    pool.flush().unwrap();
    v
}

/// (last committed transaction, intent log records appended).
fn counts(pool: &Pool) -> (u64, u64) {
    let stats = pool.pool_stats().unwrap();
    (stats.txn, stats.intent_log_records)
}

#[test]
fn a_write_in_place_listed_by_the_log_takes_no_commit_and_reads_back_after_a_crash() {
    let disk = SimDisk::new(64 << 20);
    let handle = disk.handle();
    let pool = create(&disk, FormatVersion::NEWEST, None);
    assert!(
        pool.store.geo.intent_log.is_some(),
        "a new pool has an intent log"
    );
    let v = committed_chunk(&pool);
    let before = counts(&pool);
    // In place into a committed chunk of a region not in the set.
    pool.write(v, 4096, &[2; 4096]).unwrap();
    let after = counts(&pool);
    assert_eq!(after.0, before.0, "the listing committed");
    assert_eq!(after.1, before.1 + 1, "no intent log record was appended");
    // A second write into the same region needs no other record.
    pool.write(v, 8192, &[3; 4096]).unwrap();
    assert_eq!(counts(&pool), after, "the region was listed twice");

    let mut rng = StdRng::seed_from_u64(13);
    let mut images = vec![
        ("kill -9", handle.visible_image()),
        ("power cut, writes lost", handle.durable_image()),
    ];
    for _ in 0..8 {
        images.push(("power cut, some writes kept", handle.crash_image(&mut rng)));
    }
    drop(pool);
    for (what, image) in images {
        let pool = Pool::open(
            Arc::new(SimDisk::from_image(image)),
            &OpenOptions::default(),
        )
        .unwrap_or_else(|e| panic!("after a {what}: {e}"));
        let mut buf = vec![0u8; CS as usize];
        pool.read(v, 0, &mut buf)
            .unwrap_or_else(|e| panic!("after a {what}, the chunk written in place: {e}"));
        assert_eq!(
            &buf[..4096],
            &[1; 4096],
            "after a {what}: the block not written"
        );
        // Each sector old or new: a power cut may tear a write.
        for (sector, new) in buf[4096..12288]
            .chunks(512)
            .zip([[2u8; 512]; 8].iter().chain(&[[3u8; 512]; 8]))
        {
            assert!(
                sector == [1; 512] || sector == new,
                "after a {what}: a sector neither old nor new"
            );
        }
        assert_eq!(
            pool.pool_stats().unwrap().in_place_regions,
            0,
            "after a {what}: the recomputed region stays listed"
        );
    }
}

/// A log with no room left for this transaction's records lists by
/// committing, as a pool without one does; after that commit the log
/// takes records again.
#[test]
fn with_the_log_full_a_listing_commits() {
    let disk = SimDisk::new(96 << 20);
    let pool = create(&disk, FormatVersion::NEWEST, Some(1));
    let v = pool.create_volume("v", 48 << 20).unwrap();
    // Three regions' worth of committed chunks.
    let big = vec![7u8; 1 << 20];
    for mib in 0..40u64 {
        pool.write(v, mib << 20, &big).unwrap();
    }
    pool.flush().unwrap();
    let start = counts(&pool);
    pool.write(v, 0, &[1; 4096]).unwrap();
    assert_eq!(
        counts(&pool),
        (start.0, start.1 + 1),
        "the first listing is a record"
    );
    pool.write(v, REGION + (1 << 20), &[2; 4096]).unwrap();
    let full = counts(&pool);
    assert!(
        full.0 > start.0,
        "a listing with the log full did not commit"
    );
    assert_eq!(full.1, start.1 + 1, "a record beyond the log area");
    pool.write(v, 2 * REGION + (1 << 20), &[3; 4096]).unwrap();
    assert_eq!(
        counts(&pool),
        (full.0, full.1 + 1),
        "the log did not start again"
    );
}

/// A pool created before version 13 has no log area, nor does one
/// upgraded to 13 (only its superblocks change): listings commit.
#[test]
fn pools_without_a_log_area_list_by_committing() {
    let disk = SimDisk::new(64 << 20);
    let pool = create(&disk, FormatVersion::new(12).unwrap(), None);
    assert!(pool.store.geo.intent_log.is_none());
    let v = committed_chunk(&pool);
    let before = counts(&pool);
    pool.write(v, 4096, &[2; 4096]).unwrap();
    let after = counts(&pool);
    assert!(
        after.0 > before.0 && after.1 == 0,
        "a version 12 pool did not commit"
    );
    assert!(pool.upgrade().unwrap());
    assert!(pool.format_version().has_intent_log());
    // Closed cleanly: the region leaves the set.
    pool.close().unwrap();
    let pool = Pool::open(Arc::new(disk.clone()), &OpenOptions::default()).unwrap();
    assert!(
        pool.store.geo.intent_log.is_none(),
        "an upgrade made a log area"
    );
    let before = counts(&pool);
    pool.write(v, 4096, &[3; 4096]).unwrap();
    let after = counts(&pool);
    assert!(
        after.0 > before.0 && after.1 == 0,
        "an upgraded pool did not commit: {before:?} {after:?}"
    );
}

/// Regression: a region already durable in the set when the power went,
/// written in place since, is recomputed at open even when the log lists
/// another region. (The open's replay commit evicted every region idle in
/// the new process, all of them, before the recompute read the set: the
/// first region's sums stayed stale and its chunk read as damaged.)
#[test]
fn a_region_durable_in_the_set_is_recomputed_when_the_log_lists_another() {
    let disk = SimDisk::new(96 << 20);
    let handle = disk.handle();
    let pool = create(&disk, FormatVersion::NEWEST, None);
    let v = pool.create_volume("v", 48 << 20).unwrap();
    // Chunks are allocated in order: the first in region 0, the last in
    // region 1 (regions are of the pool's data, 16 MiB each).
    let big = vec![1u8; 1 << 20];
    for mib in 0..18u64 {
        pool.write(v, mib << 20, &big).unwrap();
    }
    pool.flush().unwrap();
    // Region 0 listed (by a record), then durable in the set by a commit.
    pool.write(v, 0, &[2; 4096]).unwrap();
    pool.flush().unwrap();
    // In place into it with no record (it is durable in the set), then
    // into region 1, which a record lists.
    pool.write(v, 0, &[3; CS as usize]).unwrap();
    let before = counts(&pool);
    pool.write(v, 17 << 20, &[4; 4096]).unwrap();
    assert_eq!(
        counts(&pool),
        (before.0, before.1 + 1),
        "region 1 not logged"
    );
    let image = handle.visible_image();
    drop(pool);
    let pool = Pool::open(
        Arc::new(SimDisk::from_image(image)),
        &OpenOptions::default(),
    )
    .unwrap();
    let mut buf = vec![0u8; CS as usize];
    pool.read(v, 0, &mut buf)
        .unwrap_or_else(|e| panic!("the chunk of the region durable in the set: {e}"));
    assert_eq!(buf, vec![3; CS as usize]);
    pool.read(v, 17 << 20, &mut buf).unwrap();
    assert_eq!(&buf[..4096], &[4; 4096]);
}
