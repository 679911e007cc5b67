//! Regression tests for failure paths: every public operation either
//! completes or leaves the pool exactly as it was, whatever runs out
//! (issue: "every engine operation completes or leaves no trace").
// A test crate: unwrap, expect and panic are how a test reports failure
// (the workspace denies them in the code it ships; clippy.toml allows
// them in #[test] functions, this in the helpers around them).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use arbor_engine::{CreateOptions, Error, Fault, Pool, Refusal, Resource, VolumeId};
use arbor_io::{BlockDevice, SimDisk};
use common::*;

const CHUNK: u64 = 4096;

fn tiny_meta_pool(size: u64, metadata: u64) -> (SimDisk, Pool) {
    let disk = SimDisk::new(size);
    let dev: Arc<dyn BlockDevice> = Arc::new(disk.clone());
    let opts = CreateOptions {
        chunk_size: CHUNK as u32,
        metadata_bytes: Some(metadata),
        ..Default::default()
    };
    (
        disk,
        Pool::create(dev, &opts, &open_opts()).expect("create"),
    )
}

fn meta_used_fraction(pool: &Pool) -> f64 {
    let s = pool.pool_stats().unwrap();
    s.metadata_used_bytes as f64 / s.metadata_bytes as f64
}

fn read_all(pool: &Pool, v: VolumeId, size: u64) -> Vec<u8> {
    let mut buf = vec![0; size as usize];
    pool.read(v, 0, &mut buf).unwrap();
    buf
}

/// Compares a volume with its model a MiB at a time (no second copy of a
/// large volume in memory).
fn assert_volume(pool: &Pool, v: VolumeId, model: &[u8], what: &str) {
    let mut buf = vec![0; MIB as usize];
    for (i, want) in model.chunks(MIB as usize).enumerate() {
        let got = &mut buf[..want.len()];
        pool.read(v, i as u64 * MIB, got).unwrap();
        assert!(got == want, "{what}: MiB {i} differs");
    }
}

fn is_resource(e: &Error) -> bool {
    matches!(
        e,
        Error::Exhausted(Resource::Metadata) | Error::Exhausted(Resource::DataSpace)
    )
}

/// Fills about 60% of a 1 MiB metadata region with scattered single-chunk
/// extents (about 65,000: packed leaves take about 10 bytes per extent
/// written in order) and commits; returns the volume, its size and its
/// contents.
fn fill_scattered(pool: &Pool) -> (VolumeId, u64, Vec<u8>) {
    let size = 640 * MIB;
    let v = pool.create_volume("v", size).unwrap();
    let mut model = vec![0u8; size as usize];
    let mut chunk = 0;
    while meta_used_fraction(pool) < 0.6 {
        let data = pattern(chunk, 0, CHUNK as usize);
        pool.write(v, chunk * CHUNK, &data).unwrap();
        model[(chunk * CHUNK) as usize..((chunk + 1) * CHUNK) as usize].copy_from_slice(&data);
        chunk += 2;
        assert!(chunk * CHUNK < size, "metadata never reached 60%");
    }
    pool.flush().unwrap();
    (v, size, model)
}

/// Defect 1: metadata running out in the middle of writes to many committed
/// leaves. Each write shadows a committed leaf; with `hold`, a snapshot keeps
/// every leaf's committed copy, so the commit a full pool tries before it
/// reports full frees nothing, and writes really run out once the shadows
/// have taken the free blocks. Each failed write leaves the pool as it was,
/// flushes succeed, the pool checks clean, and every acknowledged write is
/// there after reopen; the snapshot keeps its contents, and once it is
/// deleted and reclaimed writes fit again. Without `hold` no write may fail:
/// the commit frees the shadowed copies.
fn metadata_full_mid_transaction(new_chunks: bool, hold: bool) {
    let (disk, pool) = tiny_meta_pool(400 * MIB, MIB);
    let (v, size, mut model) = fill_scattered(&pool);
    let held = model.clone();
    if hold {
        pool.snapshot("v@hold").unwrap();
    }
    let mut failures = 0;
    let mut successes = 0;
    // Chunks in every committed leaf (a leaf holds up to 448 extents, here
    // every other chunk), in one transaction: no flush in between.
    for round in 0..3u64 {
        let mut chunk = round * 7 + u64::from(new_chunks);
        while chunk * CHUNK < size {
            let data = pattern(1000 + chunk, round, CHUNK as usize);
            let at = chunk * CHUNK;
            match pool.write(v, at, &data) {
                Ok(()) => {
                    model[at as usize..(at + CHUNK) as usize].copy_from_slice(&data);
                    successes += 1;
                }
                Err(e) if is_resource(&e) => {
                    failures += 1;
                    let mut now = vec![0; CHUNK as usize];
                    pool.read(v, at, &mut now).unwrap();
                    assert_eq!(
                        now,
                        &model[at as usize..(at + CHUNK) as usize],
                        "a failed write changed chunk {chunk}"
                    );
                }
                Err(e) => panic!("write of chunk {chunk}: {e}"),
            }
            chunk += 120;
        }
    }
    eprintln!("{successes} writes succeeded, {failures} ran out of space");
    assert!(successes > 0, "no write fitted");
    if hold {
        assert!(failures > 0, "metadata never ran out");
    } else {
        assert_eq!(failures, 0, "writes failed that a commit made room for");
    }
    pool.flush().expect("flush after running out of metadata");
    assert_clean(&pool);
    assert_volume(&pool, v, &model, "after running out");
    drop(pool);
    let pool = reopen(&disk);
    assert_clean(&pool);
    let v = pool.lookup("v").unwrap();
    assert_volume(&pool, v, &model, "acknowledged writes lost");
    if hold {
        let snap = pool.lookup("v@hold").unwrap();
        assert_volume(&pool, snap, &held, "the snapshot changed");
        pool.delete("v@hold").expect("delete on a full pool");
        while pool.reclaim(1000).expect("reclaim on a full pool") > 0 {}
        pool.flush().unwrap();
        // Every leaf can be shadowed again.
        let mut chunk = 3;
        while chunk * CHUNK < size {
            let data = pattern(5000 + chunk, 0, CHUNK as usize);
            pool.write(v, chunk * CHUNK, &data)
                .expect("a write after the snapshot's space came back");
            model[(chunk * CHUNK) as usize..((chunk + 1) * CHUNK) as usize].copy_from_slice(&data);
            chunk += 120;
        }
        assert_volume(&pool, v, &model, "after the space came back");
    }
    // The pool still works.
    pool.create_volume("after", MIB).unwrap();
    pool.write(v, 0, &pattern(7, 0, 4096)).unwrap();
    pool.flush().unwrap();
    assert_clean(&pool);
}

#[test]
fn metadata_full_overwriting_committed_leaves() {
    metadata_full_mid_transaction(false, true);
}

#[test]
fn metadata_full_writing_new_chunks_into_committed_leaves() {
    metadata_full_mid_transaction(true, true);
}

#[test]
fn shadowed_leaves_a_commit_frees_make_room_for_writes() {
    metadata_full_mid_transaction(false, false);
}

/// What a test knows of a pool: every volume's name, size and contents.
#[derive(Clone, PartialEq, Debug)]
struct Model(HashMap<String, (u64, Vec<u8>)>);

impl Model {
    fn of(pool: &Pool) -> Self {
        let mut m = HashMap::new();
        for info in pool.list().unwrap() {
            let data = read_all(pool, info.id, info.size);
            m.insert(info.name.clone(), (info.size, data));
        }
        Model(m)
    }
}

/// Defect 1, management operations: with metadata full, snapshot, clone,
/// create, rename, resize, discard, a group snapshot, a property set and
/// delete either work or leave the pool as it was; delete, rollback and
/// reclaim keep working.
#[test]
fn metadata_full_during_every_operation_leaves_no_trace() {
    let (disk, pool) = tiny_meta_pool(96 * MIB, MIB);
    let size = 16 * MIB;
    let v = pool.create_volume("v", size).unwrap();
    pool.write(v, 0, &pattern(1, 0, (4 * MIB) as usize))
        .unwrap();
    // A second volume, for group snapshots with v.
    pool.create_volume("w", MIB).unwrap();
    // Snapshots followed by scattered writes until a write runs out of
    // metadata, then snapshots alone until one does too (they need less):
    // the operations below then find metadata really full.
    let mut snaps = 0u64;
    let mut i = 0u64;
    let mut writes = true;
    loop {
        let name = format!("v@s{snaps}");
        match pool.snapshot(&name) {
            Ok(_) => snaps += 1,
            Err(e) if is_resource(&e) => {
                assert!(
                    matches!(
                        pool.lookup(&name),
                        Err(Error::Refused(Refusal::NotFound(_)))
                    ),
                    "the failed snapshot {name} is listed"
                );
                break;
            }
            Err(e) => panic!("{e}"),
        }
        for _ in 0..if writes { 16 } else { 0 } {
            i += 1;
            let at = ((i * 131) % (size / CHUNK)) * CHUNK;
            match pool.write(v, at, &pattern(i, 0, CHUNK as usize)) {
                Ok(()) => {}
                Err(e) if is_resource(&e) => {
                    writes = false;
                    break;
                }
                Err(e) => panic!("{e}"),
            }
        }
    }
    assert!(snaps > 3, "only {snaps} snapshots fit");
    pool.flush().unwrap();
    assert_clean(&pool);
    // Every operation, repeatedly, on a full pool.
    let mut resource_failures = 0;
    for round in 0..40u64 {
        let before = Model::of(&pool);
        let property = pool.property(None, "p").unwrap();
        let s = round % snaps;
        let result = match round % 10 {
            8 => pool
                .snapshot_group(&[format!("v@g{round}"), format!("w@g{round}")])
                .map(|_| ()),
            9 => pool.set_property(None, "p", &pattern(round, 0, 3000)),
            0 => pool.snapshot(&format!("v@x{round}")).map(|_| ()),
            1 => pool
                .clone_snapshot(&format!("v@s{s}"), &format!("c{round}"))
                .map(|_| ()),
            2 => pool.create_volume(&format!("n{round}"), MIB).map(|_| ()),
            3 => pool
                .rename("v", &format!("v{round}"))
                .and_then(|()| pool.rename(&format!("v{round}"), "v")),
            4 => pool.resize("v", size - CHUNK * (round + 1) - 512),
            5 => pool.discard(v, CHUNK * (round * 13 % 1000) + 512, 3 * CHUNK),
            6 => pool.write(
                v,
                CHUNK * (round * 29 % 1000),
                &pattern(round, 0, 2 * CHUNK as usize),
            ),
            _ => pool.write_zeroes(v, CHUNK * (round * 17 % 1000), 5 * CHUNK, false),
        };
        match result {
            Ok(()) => {}
            Err(e) if is_resource(&e) => {
                resource_failures += 1;
                assert_eq!(
                    Model::of(&pool),
                    before,
                    "round {round}: a failed operation left a trace"
                );
                assert_eq!(
                    pool.property(None, "p").unwrap(),
                    property,
                    "round {round}: a failed set changed the property"
                );
            }
            Err(e) => panic!("round {round}: {e}"),
        }
        pool.flush().expect("flush");
        assert_clean(&pool);
    }
    assert!(resource_failures > 0, "metadata never ran out");
    // Operations that free space work on a full pool.
    for s in 0..snaps {
        pool.delete(&format!("v@s{s}"))
            .expect("delete on a full pool");
        pool.flush().unwrap();
    }
    while pool.reclaim(1000).expect("reclaim on a full pool") > 0 {}
    assert_clean(&pool);
    let model = Model::of(&pool);
    drop(pool);
    let pool = reopen(&disk);
    assert_eq!(Model::of(&pool), model);
    assert_clean(&pool);
    pool.write(pool.lookup("v").unwrap(), 0, &pattern(9, 0, 65536))
        .unwrap();
}

/// Found by the exhaustion campaign: snapshots stored their volume records at
/// commit time with the metadata reserve, so snapshots alone could use up
/// the reserve; the snapshot whose commit then failed stayed listed although
/// it had returned `MetadataFull`. Now each one fails whole, the reserve is
/// left for the operations that free space, and those work.
#[test]
fn snapshots_that_fill_metadata_fail_whole_and_leave_the_reserve() {
    let (disk, pool) = tiny_meta_pool(16 * MIB, MIB);
    let v = pool.create_volume("v", MIB).unwrap();
    pool.write(v, 0, &pattern(1, 0, CHUNK as usize)).unwrap();
    let mut snaps = 0u64;
    let error = loop {
        match pool.snapshot(&format!("v@s{snaps}")) {
            Ok(_) => snaps += 1,
            Err(e) => break e,
        }
        assert!(snaps < 100_000, "metadata never ran out");
    };
    assert!(
        matches!(error, Error::Exhausted(Resource::Metadata)),
        "{error}"
    );
    assert!(
        matches!(
            pool.lookup(&format!("v@s{snaps}")),
            Err(Error::Refused(Refusal::NotFound(_)))
        ),
        "the failed snapshot is listed"
    );
    assert_eq!(pool.list().unwrap().len() as u64, snaps + 1);
    pool.flush().expect("flush on a full pool");
    assert_clean(&pool);
    // What frees space works with metadata full.
    for s in (0..snaps).step_by(2) {
        pool.delete(&format!("v@s{s}"))
            .expect("delete on a full pool");
    }
    while pool.reclaim(1000).expect("reclaim on a full pool") > 0 {}
    pool.flush().unwrap();
    assert_clean(&pool);
    pool.snapshot("v@again").expect("room again after deletes");
    let model = Model::of(&pool);
    drop(pool);
    let pool = reopen(&disk);
    assert_eq!(Model::of(&pool), model);
    assert_clean(&pool);
}

/// Defect 2: discard, write-zeroes and shrink of a range whose chunks lie in
/// more space-map pages than the journal holds.
#[test]
fn scattered_discard_zero_and_shrink_fit_the_journal() {
    for op in ["discard", "zeroes", "shrink"] {
        let pages = 16u32;
        let per_page = 1020u64;
        // A's chunks land one in every 8, so they span 8x more pages than chunks.
        let a_chunks = per_page * u64::from(pages) * 3 / 8;
        let disk = SimDisk::new(200 * MIB);
        let dev: Arc<dyn BlockDevice> = Arc::new(disk.clone());
        let opts = CreateOptions {
            chunk_size: CHUNK as u32,
            metadata_bytes: Some(8 * MIB),
            journal_pages: Some(pages),
            ..CreateOptions::default()
        };
        let pool = Pool::create(dev, &opts, &open_opts()).unwrap();
        let a_size = a_chunks * CHUNK;
        let a = pool.create_volume("a", a_size).unwrap();
        let b = pool.create_volume("b", a_chunks * 7 * CHUNK).unwrap();
        for c in 0..a_chunks {
            pool.write(a, c * CHUNK, &pattern(1, c * CHUNK, CHUNK as usize))
                .unwrap();
            pool.write(
                b,
                c * 7 * CHUNK,
                &pattern(2, c * 7 * CHUNK, 7 * CHUNK as usize),
            )
            .unwrap();
        }
        pool.flush().unwrap();
        let b_model = read_all(&pool, b, a_chunks * 7 * CHUNK);
        let keep = 3 * CHUNK + 512;
        match op {
            "discard" => pool.discard(a, keep, a_size - keep).unwrap(),
            "zeroes" => pool.write_zeroes(a, keep, a_size - keep, false).unwrap(),
            _ => pool.resize("a", keep).unwrap(),
        }
        pool.flush().unwrap_or_else(|e| panic!("{op}: flush: {e}"));
        assert_clean(&pool);
        while pool.reclaim(1000).unwrap() > 0 {}
        pool.flush().unwrap();
        drop(pool);
        let pool = reopen(&disk);
        assert_clean(&pool);
        let a = pool.lookup("a").unwrap();
        let got = read_all(&pool, a, pool.info(a).unwrap().size);
        assert_eq!(
            &got[..keep as usize],
            &pattern(1, 0, keep as usize)[..],
            "{op}"
        );
        assert!(
            got[keep as usize..].iter().all(|&b| b == 0),
            "{op}: not zero"
        );
        assert_eq!(
            read_all(&pool, pool.lookup("b").unwrap(), a_chunks * 7 * CHUNK),
            b_model
        );
    }
}

/// Defect 3: `check` on a live pool looks at one consistent state and
/// reports no damage that is not there.
#[test]
fn check_on_a_live_pool_reports_no_false_damage() {
    let (_disk, pool) = sim_pool(64 * MIB, 4096);
    let pool = Arc::new(pool);
    let v = pool.create_volume("v", 16 * MIB).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (pool, stop) = (Arc::clone(&pool), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let at = (i * 7919 % 4096) * 4096;
                pool.write(v, at, &pattern(i, at, 4096)).unwrap();
                if i.is_multiple_of(7) {
                    pool.discard(v, ((i * 31) % 4000) * 4096, 8192).unwrap();
                }
                if i.is_multiple_of(50) {
                    pool.flush().unwrap();
                }
                if i.is_multiple_of(200) {
                    pool.snapshot(&format!("v@{i}")).unwrap();
                }
                if i.is_multiple_of(400) {
                    pool.delete(&format!("v@{}", i - 200)).unwrap();
                }
            }
            i
        })
    };
    for n in 0..30 {
        let report = pool.check().unwrap();
        assert!(
            report.is_clean(),
            "check {n} on a live pool: {:#?}",
            report.problems
        );
    }
    stop.store(true, Ordering::Relaxed);
    assert!(writer.join().unwrap() > 0);
    assert_clean(&pool);
}

/// A device that parks the first write at a chosen offset until released,
/// and tells when a write covering another chosen offset has happened.
struct Gate {
    inner: SimDisk,
    park_at: Mutex<Option<u64>>,
    parked: (Mutex<bool>, Condvar),
    watch: Mutex<Option<u64>>,
    watched: (Mutex<bool>, Condvar),
}

impl BlockDevice for Gate {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        let park = {
            self.park_at
                .lock()
                .unwrap()
                .take_if(|at| *at == offset)
                .is_some()
        };
        if park {
            let (lock, cv) = &self.parked;
            let mut released = lock.lock().unwrap();
            while !*released {
                released = cv.wait(released).unwrap();
            }
        }
        let r = self.inner.write_at(buf, offset);
        if let Some(w) = *self.watch.lock().unwrap() {
            if offset <= w && w < offset + buf.len() as u64 {
                let (lock, cv) = &self.watched;
                *lock.lock().unwrap() = true;
                cv.notify_all();
            }
        }
        r
    }
    fn flush(&self) -> std::io::Result<()> {
        self.inner.flush()
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
}

/// Defect 4: a write in flight while a shrink runs must not land past the
/// new end; growing again shows zeros there.
#[test]
fn shrink_racing_a_write_leaves_zeros_past_the_end() {
    let gate = Arc::new(Gate {
        inner: SimDisk::new(64 * MIB),
        park_at: Mutex::new(None),
        parked: (Mutex::new(false), Condvar::new()),
        watch: Mutex::new(None),
        watched: (Mutex::new(false), Condvar::new()),
    });
    let dev: Arc<dyn BlockDevice> = Arc::clone(&gate) as Arc<dyn BlockDevice>;
    let pool = Arc::new(Pool::create(dev, &small_opts(4096), &open_opts()).unwrap());
    let cs = pool.chunk_size();
    let v = pool.create_volume("v", 16 * cs).unwrap();
    // Chunks 10 and 11 are mapped and exclusive, not consecutive on the device.
    pool.write(v, 11 * cs, &pattern(1, 0, cs as usize)).unwrap();
    pool.write(v, 0, &pattern(1, 0, cs as usize)).unwrap();
    pool.write(v, 10 * cs, &pattern(1, 0, cs as usize)).unwrap();
    pool.flush().unwrap();
    // Park the in-place write of chunk 10, the first part of a write over
    // chunks 10 and 11. Chunks are allocated in order from the start of the
    // data region: chunk 11 got the first, chunk 0 the second, chunk 10 the third.
    let data_start = pool.data_region_offset();
    let marker = pattern(77, 0, 2 * cs as usize);
    *gate.park_at.lock().unwrap() = Some(data_start + 2 * cs);
    // Chunk 11's tail past the new size (11 * cs + 512) is what a racing write must not change.
    *gate.watch.lock().unwrap() = Some(data_start + 512);
    let writer = {
        let pool = Arc::clone(&pool);
        let marker = marker.clone();
        std::thread::spawn(move || pool.write(v, 10 * cs, &marker))
    };
    let resizer = {
        let pool = Arc::clone(&pool);
        std::thread::spawn(move || pool.resize("v", 11 * cs + 512))
    };
    // Give the shrink the chance to do whatever it does before waiting for
    // the parked write (on the old code: zero chunk 11's tail). Not a
    // pass/fail timing: the assertions below hold whichever way this goes.
    {
        let (lock, cv) = &gate.watched;
        let guard = lock.lock().unwrap();
        let _ = cv
            .wait_timeout_while(guard, Duration::from_secs(2), |seen| !*seen)
            .unwrap();
    }
    {
        let (lock, cv) = &gate.parked;
        *lock.lock().unwrap() = true;
        cv.notify_all();
    }
    let write_result = writer.join().unwrap();
    resizer.join().unwrap().unwrap();
    eprintln!("racing write: {write_result:?}");
    assert_eq!(pool.info(v).unwrap().size, 11 * cs + 512);
    pool.resize("v", 16 * cs).unwrap();
    let mut tail = vec![0xAA; (cs - 512) as usize];
    pool.read(v, 11 * cs + 512, &mut tail).unwrap();
    assert!(
        tail.iter().all(|&b| b == 0),
        "bytes past the shrunken end survived the shrink"
    );
    let mut rest = vec![0xAA; (4 * cs) as usize];
    pool.read(v, 12 * cs, &mut rest).unwrap();
    assert!(rest.iter().all(|&b| b == 0));
    pool.flush().unwrap();
    assert_clean(&pool);
}

/// A device whose writes into the data region fail while `broken` is set.
struct FailingData {
    disk: SimDisk,
    data_start: AtomicU64,
    broken: AtomicBool,
}

impl BlockDevice for FailingData {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.disk.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        if self.broken.load(Ordering::SeqCst) && offset >= self.data_start.load(Ordering::SeqCst) {
            return Err(std::io::Error::other("injected data write failure"));
        }
        self.disk.write_at(buf, offset)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.disk.flush()
    }
    fn size(&self) -> u64 {
        self.disk.size()
    }
}

/// A write whose data cannot be written to its new chunks fails whole: the
/// chunks it allocated are freed, nothing maps them, and the pool commits
/// and checks clean afterwards (found in review: the atomic write path kept
/// them allocated after a device error, a leak the next commit made durable).
#[test]
fn a_failed_data_write_leaves_no_allocated_chunk_behind() {
    let dev = Arc::new(FailingData {
        disk: SimDisk::new(32 * MIB),
        data_start: AtomicU64::new(u64::MAX),
        broken: AtomicBool::new(false),
    });
    let pool = Pool::create(
        Arc::clone(&dev) as Arc<dyn BlockDevice>,
        &CreateOptions {
            chunk_size: CHUNK as u32,
            ..Default::default()
        },
        &open_opts(),
    )
    .unwrap();
    dev.data_start
        .store(pool.data_region_offset(), Ordering::SeqCst);
    let v = pool.create_volume("v", 4 * MIB).unwrap();
    pool.write(v, 0, &pattern(1, 0, 2 * CHUNK as usize))
        .unwrap();
    pool.flush().unwrap();
    let before = Model::of(&pool);
    let used = pool.pool_stats().unwrap().data_used_bytes;
    dev.broken.store(true, Ordering::SeqCst);
    // New chunks (unmapped range), a partial one included.
    let err = pool
        .write(v, 8 * CHUNK + 512, &pattern(2, 0, 3 * CHUNK as usize))
        .unwrap_err();
    assert!(matches!(err, Error::Stop(Fault::Io(_))), "{err}");
    dev.broken.store(false, Ordering::SeqCst);
    assert_eq!(Model::of(&pool), before);
    assert_eq!(pool.pool_stats().unwrap().data_used_bytes, used);
    pool.flush().unwrap();
    assert_clean(&pool);
}

/// Found by the model test (`model.rs`, minimal case): a shrink leaves the
/// bytes past the new size in the last chunk, which may stay shared with a
/// snapshot; diff then reported that chunk as identical although the
/// shrunk clone reads zeros there. Diff reports it when the sizes differ.
#[test]
fn diff_reports_the_last_chunk_of_a_shrunk_clone() {
    let (_disk, pool) = tiny_meta_pool(16 * MIB, MIB);
    let v = pool.create_volume("v", 22 * CHUNK).unwrap();
    pool.write(v, 60928, &pattern(1, 60928, 90112 - 60928))
        .unwrap();
    let s = pool.snapshot("v@s").unwrap();
    let c = pool.clone_snapshot("v@s", "c").unwrap();
    pool.resize("c", 57856).unwrap();
    let ranges = pool.diff(c, s).unwrap();
    assert!(
        ranges
            .iter()
            .any(|&(o, l)| o <= 14 * CHUNK && 14 * CHUNK < o + l),
        "{ranges:?}"
    );
}

/// An origin's growth on a pool whose metadata is full: the device is
/// enlarged, the size is not recorded, the error says why, the pool
/// checks clean, and the volume keeps its size and content; with room
/// made, the growth runs again to the end.
#[test]
fn an_origins_growth_without_metadata_records_nothing() {
    const ORIGIN: u64 = 4 * MIB;
    let (_disk, pool) = tiny_meta_pool(96 * MIB, MIB);
    let device = SimDisk::from_image(pattern(9, 0, ORIGIN as usize));
    let identity = arbor_engine::DeviceIdentity { dev: 5, ino: 6 };
    let disk = pool
        .attach_origin("disk", Arc::new(device.clone()), identity)
        .unwrap();
    let size = 16 * MIB;
    let filler = pool.create_volume("f", size).unwrap();
    pool.write(filler, 0, &pattern(1, 0, (4 * MIB) as usize))
        .unwrap();
    // Snapshots followed by scattered writes until a write runs out of
    // metadata, then snapshots alone until one does too.
    let (mut snaps, mut i, mut writes) = (0u64, 0u64, true);
    loop {
        match pool.snapshot(&format!("f@s{snaps}")) {
            Ok(_) => snaps += 1,
            Err(e) if is_resource(&e) => break,
            Err(e) => panic!("{e}"),
        }
        for _ in 0..if writes { 16 } else { 0 } {
            i += 1;
            let at = ((i * 131) % (size / CHUNK)) * CHUNK;
            match pool.write(filler, at, &pattern(i, 0, CHUNK as usize)) {
                Ok(()) => {}
                Err(e) if is_resource(&e) => {
                    writes = false;
                    break;
                }
                Err(e) => panic!("{e}"),
            }
        }
    }
    pool.flush().unwrap();
    let err = pool.resize("disk", 2 * ORIGIN).unwrap_err();
    assert!(is_resource(&err), "{err}");
    assert_eq!(pool.info(disk).unwrap().size, ORIGIN);
    assert_eq!(device.size(), 2 * ORIGIN, "the device was enlarged first");
    assert_eq!(
        read_all(&pool, disk, ORIGIN),
        pattern(9, 0, ORIGIN as usize)
    );
    assert_clean(&pool);
    // Room made: the same growth goes through.
    pool.delete("f").unwrap();
    for s in 0..snaps {
        pool.delete(&format!("f@s{s}")).unwrap();
    }
    while pool.reclaim(4096).unwrap() > 0 {}
    pool.resize("disk", 2 * ORIGIN).unwrap();
    assert_eq!(pool.info(disk).unwrap().size, 2 * ORIGIN);
    assert_eq!(
        read_all(&pool, disk, ORIGIN),
        pattern(9, 0, ORIGIN as usize)
    );
    assert_clean(&pool);
}
