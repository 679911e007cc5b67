//! Scenario tests of the engine's user-visible behaviour.
// A test crate: unwrap, expect and panic are how a test reports failure
// (the workspace denies them in the code it ships; clippy.toml allows
// them in #[test] functions, this in the helpers around them).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod common;

use std::sync::Arc;

use arbor_engine::{Error, Pool, Refusal, Resource, VolumeId};
use common::*;

fn read(pool: &arbor_engine::Pool, id: VolumeId, offset: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0xAAu8; len];
    pool.read(id, offset, &mut buf).unwrap();
    buf
}

#[test]
fn thin_volume_reads_zeros_and_round_trips_writes() {
    let (_disk, pool) = sim_pool(64 * MIB, 4096);
    let v = pool.create_volume("vm1", 8 * MIB).unwrap();
    assert_eq!(read(&pool, v, 0, 8192), vec![0; 8192]);
    let data = pattern(1, 1024, 10_240);
    pool.write(v, 1024, &data).unwrap();
    assert_eq!(read(&pool, v, 1024, 10_240), data);
    assert_eq!(read(&pool, v, 0, 1024), vec![0; 1024]);
    assert_eq!(pool.info(v).unwrap().mapped_bytes, 3 * 4096);
    assert_clean(&pool);
}

#[test]
fn snapshot_is_frozen_and_clone_diverges() {
    let (_disk, pool) = sim_pool(64 * MIB, 4096);
    let v = pool.create_volume("vm1", 4 * MIB).unwrap();
    pool.write(v, 0, &pattern(1, 0, 65536)).unwrap();
    let s = pool.snapshot("vm1@mon").unwrap();
    pool.write(v, 4096, &pattern(2, 4096, 4096)).unwrap();
    assert_eq!(read(&pool, s, 0, 65536), pattern(1, 0, 65536));
    assert!(matches!(
        pool.write(s, 0, &[0; 512]),
        Err(Error::Refused(Refusal::ReadOnly(_)))
    ));
    let c = pool.clone_snapshot("vm1@mon", "ci-1").unwrap();
    pool.write(c, 0, &pattern(3, 0, 512)).unwrap();
    assert_eq!(read(&pool, s, 0, 512), pattern(1, 0, 512));
    assert_eq!(read(&pool, c, 0, 512), pattern(3, 0, 512));
    assert_eq!(read(&pool, c, 4096, 4096), pattern(1, 4096, 4096));
    assert_eq!(read(&pool, v, 4096, 4096), pattern(2, 4096, 4096));
    assert_eq!(pool.diff(s, v).unwrap(), vec![(4096, 4096)]);
    assert_eq!(pool.diff(v, c).unwrap(), vec![(0, 8192)]);
    assert_clean(&pool);
}

#[test]
fn delete_with_descendants_then_reclaim_frees_space() {
    let (_disk, pool) = sim_pool(64 * MIB, 4096);
    let v = pool.create_volume("vm1", 16 * MIB).unwrap();
    pool.write(v, 0, &pattern(1, 0, 8 * MIB as usize)).unwrap();
    pool.snapshot("vm1@a").unwrap();
    let c = pool.clone_snapshot("vm1@a", "c1").unwrap();
    pool.write(v, 0, &pattern(2, 0, MIB as usize)).unwrap();
    let used_before = pool.pool_stats().unwrap().data_used_bytes;
    pool.delete("vm1").unwrap();
    pool.delete("vm1@a").unwrap();
    assert!(pool.pool_stats().unwrap().reclaim_pending);
    while pool.reclaim(100).unwrap() > 0 {}
    let stats = pool.pool_stats().unwrap();
    assert!(!stats.reclaim_pending);
    assert_eq!(
        used_before - stats.data_used_bytes,
        MIB,
        "only vm1's own 1 MiB is freed"
    );
    assert_eq!(read(&pool, c, 0, 4096), pattern(1, 0, 4096));
    assert_eq!(pool.volume_stats(c).unwrap().exclusive_bytes, 8 * MIB);
    assert_clean(&pool);
}

#[test]
fn rollback_to_an_older_snapshot_keeps_newer_ones() {
    let (_disk, pool) = sim_pool(64 * MIB, 4096);
    let v = pool.create_volume("db", MIB).unwrap();
    pool.write(v, 0, &pattern(1, 0, 4096)).unwrap();
    pool.snapshot("db@one").unwrap();
    pool.write(v, 0, &pattern(2, 0, 4096)).unwrap();
    let two = pool.snapshot("db@two").unwrap();
    pool.write(v, 0, &pattern(3, 0, 4096)).unwrap();
    pool.rollback("db", "db@one").unwrap();
    assert_eq!(read(&pool, v, 0, 4096), pattern(1, 0, 4096));
    assert_eq!(read(&pool, two, 0, 4096), pattern(2, 0, 4096));
    while pool.reclaim(100).unwrap() > 0 {}
    assert_clean(&pool);
}

#[test]
fn reopen_preserves_everything() {
    let (disk, pool) = sim_pool(64 * MIB, 8192);
    let v = pool.create_volume("vm1", 4 * MIB).unwrap();
    pool.write(v, 512, &pattern(7, 512, 100_000 / 512 * 512))
        .unwrap();
    pool.snapshot("vm1@s").unwrap();
    pool.rename("vm1", "vm2").unwrap();
    pool.close().unwrap();
    let pool = reopen(&disk);
    let v = pool.lookup("vm2").unwrap();
    let s = pool.lookup("vm2@s").unwrap();
    let len = 100_000 / 512 * 512;
    assert_eq!(read(&pool, v, 512, len), pattern(7, 512, len));
    assert_eq!(read(&pool, s, 512, len), pattern(7, 512, len));
    assert_clean(&pool);
}

#[test]
fn discard_resize_and_allocation_map() {
    let (_disk, pool) = sim_pool(64 * MIB, 4096);
    let v = pool.create_volume("vm1", MIB).unwrap();
    pool.write(v, 0, &pattern(1, 0, 65536)).unwrap();
    pool.discard(v, 4096 + 512, 3 * 4096).unwrap();
    let mut expect = pattern(1, 0, 65536);
    expect[4096 + 512..4 * 4096 + 512].fill(0);
    assert_eq!(read(&pool, v, 0, 65536), expect);
    let map = pool.allocation_map(v, 0, 65536).unwrap();
    assert!(
        map.iter()
            .any(|r| !r.mapped && r.offset == 8192 && r.len == 8192),
        "{map:?}"
    );
    pool.resize(v_name(&pool, v).as_str(), 6000 / 512 * 512)
        .unwrap();
    pool.resize("vm1", MIB).unwrap();
    let after = read(&pool, v, 0, 8192);
    assert_eq!(&after[..5632], &expect[..5632]);
    assert_eq!(&after[5632..], &vec![0; 8192 - 5632][..]);
    assert_clean(&pool);
}

fn v_name(pool: &arbor_engine::Pool, id: VolumeId) -> String {
    pool.info(id).unwrap().name
}

/// Regression: on a full pool, once a volume's only snapshot is destroyed
/// and reclaimed, its chunks are its own again and overwriting them needs
/// no new space (the in-place rule once demanded a fresh chunk for every
/// chunk mapped before the volume was last shared).
#[test]
fn after_its_snapshot_is_gone_a_full_volume_is_overwritten_without_new_space() {
    let (_disk, pool) = sim_pool(24 * MIB, 65536);
    let total = pool.pool_stats().unwrap().data_bytes;
    let v = pool.create_volume("big", total).unwrap();
    for offset in (0..total).step_by(MIB as usize) {
        let len = MIB.min(total - offset) as usize;
        pool.write(v, offset, &vec![1u8; len]).unwrap();
    }
    pool.snapshot("big@s").unwrap();
    assert!(matches!(
        pool.write(v, 0, &[2u8; 4096]),
        Err(Error::Exhausted(Resource::DataSpace))
    ));
    pool.delete("big@s").unwrap();
    while pool.reclaim(1000).unwrap() > 0 {}
    pool.write(v, 0, &vec![3u8; MIB as usize]).unwrap();
    pool.write(v, total - 4096, &[4u8; 4096]).unwrap();
    pool.flush().unwrap();
    assert!(read(&pool, v, 0, MIB as usize) == vec![3u8; MIB as usize]);
    assert!(read(&pool, v, total - 8192, 8192) == [[1u8; 4096], [4u8; 4096]].concat());
    assert_clean(&pool);
}

#[test]
fn full_pool_fails_writes_cleanly_and_recovers_after_delete() {
    let (_disk, pool) = sim_pool(24 * MIB, 65536);
    let total = pool.pool_stats().unwrap().data_bytes;
    let v = pool.create_volume("big", total * 2).unwrap();
    let chunk = vec![1u8; 65536];
    let mut written = 0;
    let err = loop {
        match pool.write(v, written, &chunk) {
            Ok(()) => written += 65536,
            Err(e) => break e,
        }
    };
    assert!(
        matches!(err, Error::Exhausted(Resource::DataSpace)),
        "{err}"
    );
    assert_eq!(written, total);
    let other = pool.create_volume("other", MIB).unwrap();
    assert!(matches!(
        pool.write(other, 0, &chunk),
        Err(Error::Exhausted(Resource::DataSpace))
    ));
    pool.delete("big").unwrap();
    while pool.reclaim(1000).unwrap() > 0 {}
    pool.write(other, 0, &chunk).unwrap();
    assert_clean(&pool);
}

#[test]
fn changed_since_a_snapshot_reports_later_writes_only() {
    let (_disk, pool) = sim_pool(64 * MIB, 4096);
    let v = pool.create_volume("vm1", 8 * MIB).unwrap();
    pool.write(v, 0, &pattern(1, 0, MIB as usize)).unwrap();
    let s = pool.snapshot("vm1@base").unwrap();
    // Taken in the open transaction (logged, docs/FORMAT.md §6.4.2): the
    // writes after it would share its transaction until the next commit.
    pool.flush().unwrap();
    let since = pool.info(s).unwrap().created_txn;
    assert!(pool.changed_since(v, since).unwrap().is_empty());
    pool.write(v, 4096 * 10, &pattern(2, 0, 8192)).unwrap();
    pool.write(v, 4 * MIB, &pattern(3, 0, 512)).unwrap();
    pool.flush().unwrap();
    pool.write(v, 4 * MIB + 4096, &pattern(4, 0, 4096)).unwrap();
    assert_eq!(
        pool.changed_since(v, since).unwrap(),
        vec![(40960, 8192), (4 * MIB, 8192)]
    );
    assert_eq!(pool.changed_since(s, since).unwrap(), vec![]);
    assert_eq!(
        pool.changed_since(v, 0)
            .unwrap()
            .iter()
            .map(|r| r.1)
            .sum::<u64>(),
        MIB + 8192
    );
}

#[test]
fn full_metadata_still_allows_delete_reclaim_and_recovery() {
    use std::sync::Arc;
    let disk = arbor_io::SimDisk::new(64 * MIB);
    let dev: Arc<dyn arbor_io::BlockDevice> = Arc::new(disk.clone());
    let opts = arbor_engine::CreateOptions {
        chunk_size: 4096,
        metadata_bytes: Some(MIB),
        ..Default::default()
    };
    let pool = arbor_engine::Pool::create(dev, &opts, &open_opts()).unwrap();
    let v = pool.create_volume("vm1", 32 * MIB).unwrap();
    pool.write(v, 0, &pattern(1, 0, 4 * MIB as usize)).unwrap();
    // Each snapshot followed by scattered writes pins a diverged copy of the
    // tree's path: metadata runs out long before data does.
    let mut snaps = 0;
    let err = 'fill: loop {
        if let Err(e) = pool.snapshot(&format!("vm1@s{snaps}")) {
            break e;
        }
        snaps += 1;
        for i in 0..8u64 {
            if let Err(e) = pool.write(
                v,
                ((snaps * 37 + i * 131) % 1024) * 4096,
                &pattern(snaps, 0, 4096),
            ) {
                break 'fill e;
            }
        }
    };
    assert!(matches!(err, Error::Exhausted(Resource::Metadata)), "{err}");
    assert!(snaps > 5, "only {snaps} snapshots fit");
    // Reads still work, and so do delete and reclaim, from the reserve.
    read(&pool, v, 0, 4096);
    for s in 0..snaps {
        pool.delete(&format!("vm1@s{s}")).unwrap();
    }
    while pool.reclaim(1000).unwrap() > 0 {}
    pool.write(v, 0, &pattern(2, 0, 65536)).unwrap();
    assert_eq!(read(&pool, v, 0, 65536), pattern(2, 0, 65536));
    assert_clean(&pool);
}

/// A chunk freed in the open transaction is still referenced by the last
/// commit: it must not be reused before that transaction commits, or a crash
/// would show another volume's data in the freed place.
#[test]
fn freed_chunk_is_not_reused_before_its_free_commits() {
    use std::sync::Arc;
    let (disk, pool) = sim_pool(14 * MIB, 4096);
    let stats = pool.pool_stats().unwrap();
    let v1 = pool.create_volume("v1", stats.data_bytes).unwrap();
    let v2 = pool.create_volume("v2", MIB).unwrap();
    pool.write(v1, 0, &pattern(1, 0, stats.data_bytes as usize))
        .unwrap();
    pool.flush().unwrap();
    assert_eq!(
        pool.pool_stats().unwrap().data_used_bytes,
        stats.data_bytes,
        "every chunk is in use"
    );
    pool.discard(v1, 0, 4096).unwrap();
    // The only chunk free is the one just discarded: the write must commit
    // the discard first (or fail), never write into it beforehand.
    pool.write(v2, 0, &pattern(2, 0, 4096)).unwrap();
    // Power fails with every write so far on disk but nothing flushed since.
    let crashed = arbor_io::SimDisk::from_image(disk.handle().visible_image());
    drop(pool);
    let dev: Arc<dyn arbor_io::BlockDevice> = Arc::new(crashed);
    let pool = arbor_engine::Pool::open(dev, &open_opts()).unwrap();
    let got = read(&pool, pool.lookup("v1").unwrap(), 0, 4096);
    assert!(
        got == pattern(1, 0, 4096) || got == vec![0; 4096],
        "v1 shows another volume's data"
    );
    assert_clean(&pool);
}

#[test]
fn commit_observer_sees_each_commit_with_changes_once() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let (_disk, pool) = sim_pool(64 * MIB, 4096);
    let seen = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&seen);
    assert!(pool.observe_commits(Box::new(move |_| {
        counter.fetch_add(1, Ordering::SeqCst);
    })));
    assert!(!pool.observe_commits(Box::new(|_| {})));
    let v = pool.create_volume("vm1", 4 * MIB).unwrap();
    assert_eq!(seen.load(Ordering::SeqCst), 1);
    pool.write(v, 0, &pattern(1, 0, 4096)).unwrap();
    pool.flush().unwrap();
    assert_eq!(seen.load(Ordering::SeqCst), 2);
    pool.flush().unwrap(); // nothing changed: no commit
    assert_eq!(seen.load(Ordering::SeqCst), 2);
}

/// How the pool wrote `pattern` to the device since the last look: the
/// lengths of the writes whose data contains it.
fn writes_carrying(recording: &arbor_io::Recording, pattern: &[u8]) -> Vec<usize> {
    recording
        .take()
        .into_iter()
        .filter_map(|event| match event {
            arbor_io::IoEvent::Write { data, .. } => data
                .windows(pattern.len())
                .any(|w| w == pattern)
                .then_some(data.len()),
            arbor_io::IoEvent::DurableWrite { .. } | arbor_io::IoEvent::Flush => None,
        })
        .collect()
}

#[test]
fn exclusive_chunks_are_overwritten_in_place_and_shared_ones_redirected() {
    const CHUNK: usize = 64 << 10;
    let disk = arbor_io::SimDisk::new(64 * MIB);
    let (recorder, recording) = arbor_io::RecordingDevice::new(Arc::new(disk));
    let pool = Pool::create(Arc::new(recorder), &small_opts(CHUNK as u32), &open_opts()).unwrap();
    let v = pool.create_volume("v", MIB).unwrap();
    pool.write(v, 0, &vec![1u8; CHUNK]).unwrap();
    pool.flush().unwrap();
    recording.take();
    let write_4k = |offset: u64, byte: u8| {
        let data = vec![byte; 4096];
        pool.write(v, offset, &data).unwrap();
        pool.flush().unwrap();
        writes_carrying(&recording, &data)
    };

    // Mapped in an earlier, durable commit and never shared, but in a
    // region of the pool the last commit does not list as written in place
    // (the crash rule of data checksums, FORMAT.md §6.4): the write lists
    // the region, makes that durable by a record of the intent log written
    // alone (§6.4.1; no commit, nothing of its data written before), then
    // writes in place.
    assert_eq!(pool.pool_stats().unwrap().in_place_regions, 0);
    let txn = pool.pool_stats().unwrap().txn;
    let data = vec![9u8; 4096];
    pool.write(v, 0, &data).unwrap();
    assert_eq!(pool.pool_stats().unwrap().in_place_regions, 1);
    assert_eq!(
        (
            pool.pool_stats().unwrap().txn,
            pool.pool_stats().unwrap().intent_log_records
        ),
        (txn, 1),
        "one intent log record for the region, no commit"
    );
    let events = recording.take();
    let flushed_before_data = events
        .iter()
        .position(|e| matches!(e, arbor_io::IoEvent::DurableWrite { .. }))
        .expect("a log record");
    let data_at = events
        .iter()
        .position(|e| matches!(e, arbor_io::IoEvent::Write { data: d, .. } if d.windows(4096).any(|w| w == &data[..])))
        .expect("the data written");
    assert!(
        flushed_before_data < data_at,
        "the region durable before the data"
    );
    assert_eq!(
        events
            .iter()
            .filter_map(|e| match e {
                arbor_io::IoEvent::Write { data: d, .. }
                    if d.windows(4096).any(|w| w == &data[..]) =>
                    Some(d.len()),
                _ => None,
            })
            .collect::<Vec<_>>(),
        [4096]
    );
    pool.flush().unwrap();
    recording.take();
    // In place.
    assert_eq!(write_4k(4096, 2), [4096]);
    // Shared with a snapshot: a new chunk, written whole in one write, the
    // block and zeros around it (a partial extent, FORMAT.md §6.3: the
    // other blocks read from the old chunk, which is not copied).
    pool.snapshot("v@s").unwrap();
    assert_eq!(write_4k(8192, 3), [CHUNK]);
    // That new chunk is the volume's alone: other blocks go into it too,
    // also after the commit that made it durable.
    assert_eq!(write_4k(12288, 4), [4096]);
    assert_eq!(write_4k(16384, 5), [4096]);
    let mut volume = vec![1u8; CHUNK];
    volume[..4096].fill(9);
    let mut snapshot = volume.clone();
    snapshot[4096..8192].fill(2);
    for (i, byte) in [2u8, 3, 4, 5].into_iter().enumerate() {
        volume[4096 * (i + 1)..4096 * (i + 2)].fill(byte);
    }
    assert!(read(&pool, v, 0, CHUNK) == volume);
    assert!(read(&pool, pool.lookup("v@s").unwrap(), 0, CHUNK) == snapshot);
    // Shared again, a write of part of a block: a whole new chunk, the
    // old one's blocks around it.
    pool.snapshot("v@t").unwrap();
    let part = vec![9u8; 1000];
    pool.write(v, 100, &part).unwrap();
    pool.flush().unwrap();
    assert_eq!(writes_carrying(&recording, &part), [CHUNK]);
    volume[100..1100].fill(9);
    assert!(read(&pool, v, 0, CHUNK) == volume);

    // A write over several exclusive chunks that lie consecutively on the
    // device (allocated one after the other here) is one device write.
    let big = |byte: u8| vec![byte; 4 * CHUNK];
    pool.write(v, CHUNK as u64, &big(6)).unwrap();
    pool.flush().unwrap();
    recording.take();
    pool.write(v, CHUNK as u64, &big(7)).unwrap();
    pool.flush().unwrap();
    assert_eq!(writes_carrying(&recording, &big(7)), [4 * CHUNK]);
    // Also when it starts and ends inside a chunk.
    let inner = vec![8u8; 4 * CHUNK - 1024];
    pool.write(v, CHUNK as u64 + 512, &inner).unwrap();
    pool.flush().unwrap();
    // (Widened to whole blocks: the pool keeps a checksum per 4 KiB
    // block, FORMAT.md §6.4, so the blocks it starts and ends in are read
    // and written whole, in the same one write.)
    assert_eq!(writes_carrying(&recording, &inner), [4 * CHUNK]);
    let mut expected = big(7);
    expected[512..4 * CHUNK - 512].fill(8);
    assert!(read(&pool, v, CHUNK as u64, 4 * CHUNK) == expected);
}

#[test]
fn an_incomplete_volume_refuses_snapshots_renames_and_resizes_until_whole() {
    let (_disk, pool) = sim_pool(64 * MIB, 4096);
    let v = pool.create_volume("dr", 4 * MIB).unwrap();
    pool.create_volume("other", 4 * MIB).unwrap();
    pool.set_incomplete(v, Some("being restored from a backup".into()));
    let refused = |e: Error| match e {
        Error::Refused(Refusal::Conflict(c)) => {
            assert!(c.to_string().starts_with("dr is being restored"), "{c}");
        }
        other => panic!("{other}"),
    };
    refused(pool.snapshot("dr@s").unwrap_err());
    // A group with it takes none of its snapshots.
    refused(
        pool.snapshot_group(&["other@g".into(), "dr@g".into()])
            .unwrap_err(),
    );
    assert!(pool.lookup("other@g").is_err());
    refused(pool.rename("dr", "dr2").unwrap_err());
    refused(pool.resize("dr", 8 * MIB).unwrap_err());
    // Reads and writes go on; other volumes are not concerned.
    pool.write(v, 0, &pattern(1, 0, 4096)).unwrap();
    assert_eq!(read(&pool, v, 0, 4096), pattern(1, 0, 4096));
    pool.snapshot("other@s").unwrap();
    pool.set_incomplete(v, None);
    pool.snapshot("dr@s").unwrap();
    pool.rename("dr", "dr2").unwrap();
    assert_clean(&pool);
}
