//! Snapshots and clones made durable by the next commit
//! ([`Durability::Deferred`]): the call touches no device and waits for no
//! commit in flight; the new volume reads exactly the source at the call
//! and nothing written after; a power cut before the next commit loses it
//! whole (never part of it), and after that commit it is as durable as any
//! other.
// A test crate: unwrap, expect and panic are how a test reports failure
// (the workspace denies them in the code it ships; clippy.toml allows
// them in #[test] functions, this in the helpers around them).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use arbor_engine::{Durability, Pool, VolumeId};
use arbor_io::{BlockDevice, SimDisk};
use common::*;

const VOL: u64 = 1 << 20;

fn read_all(pool: &Pool, id: VolumeId) -> Vec<u8> {
    let mut buf = vec![0u8; VOL as usize];
    pool.read(id, 0, &mut buf).unwrap();
    buf
}

/// Asserts two images are equal, naming the first 512-byte sector that differs.
#[track_caller]
fn assert_same(got: &[u8], want: &[u8]) {
    assert_eq!(got.len(), want.len());
    if let Some(at) = got.iter().zip(want).position(|(a, b)| a != b) {
        panic!("they differ first at sector {}", at / 512);
    }
}

/// Runs `f` on a thread of its own and returns what it returns; fails
/// with `hang` if it has not returned after 120 s. The limit is only a
/// guard against a hang: without it a regression would deadlock the test.
#[track_caller]
fn finishes<T: Send + 'static>(hang: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (done, finished) = mpsc::channel();
    let worker = std::thread::spawn(move || {
        let result = f();
        let _ = done.send(());
        result
    });
    finished.recv_timeout(Duration::from_secs(120)).expect(hang);
    worker.join().unwrap()
}

fn pool_from_image(image: Vec<u8>) -> Pool {
    let dev: Arc<dyn BlockDevice> = Arc::new(SimDisk::from_image(image));
    let pool = Pool::open(dev, &open_opts()).expect("a crash image opens");
    assert_clean(&pool);
    pool
}

#[test]
fn a_deferred_snapshot_touches_no_device_and_reads_its_point_in_time() {
    let (disk, pool) = sim_pool(64 * MIB, 4096);
    let v = pool.create_volume("v", VOL).unwrap();
    let before = pattern(1, 0, VOL as usize);
    pool.write(v, 0, &before).unwrap();
    let ops = disk.handle().op_counts();
    let snap = pool.snapshot_with("v@s", Durability::Deferred).unwrap();
    let clone = pool
        .clone_snapshot_with("v@s", "c", Durability::Deferred)
        .unwrap();
    let group = pool
        .snapshot_group_with(&["c@g".into()], Durability::Deferred)
        .unwrap();
    assert_eq!(
        disk.handle().op_counts(),
        ops,
        "a deferred snapshot wrote or flushed"
    );
    assert!(pool.info(snap).unwrap().snapshot);
    assert!(!pool.info(snap).unwrap().durable);
    assert!(!pool.info(clone).unwrap().durable);
    assert!(pool.info(v).unwrap().durable);
    // Later writes to the source and the clone change neither snapshot.
    pool.write(v, 4096, &pattern(2, 4096, 8192)).unwrap();
    pool.write(clone, 0, &pattern(3, 0, 4096)).unwrap();
    assert_same(&read_all(&pool, snap), &before);
    assert_same(&read_all(&pool, group[0]), &before);
    let mut clone_now = before.clone();
    clone_now[..4096].copy_from_slice(&pattern(3, 0, 4096));
    assert_same(&read_all(&pool, clone), &clone_now);
    // A committed snapshot still commits, and makes the others durable:
    // with changes no log record describes (the deferred ones) in the open
    // transaction, it is not logged (docs/FORMAT.md §6.4.2).
    let committed = pool.snapshot_with("v@t", Durability::Committed).unwrap();
    assert_ne!(
        disk.handle().op_counts().1,
        ops.1,
        "a committed snapshot flushed nothing"
    );
    for id in [snap, clone, group[0], committed] {
        assert!(pool.info(id).unwrap().durable);
    }
    assert_eq!(pool.pool_stats().unwrap().logged_snapshots, 0);
    assert_clean(&pool);
}

#[test]
fn a_power_cut_before_the_next_commit_loses_the_snapshot_whole() {
    let (disk, pool) = sim_pool(64 * MIB, 4096);
    let v = pool.create_volume("v", VOL).unwrap();
    let durable = pattern(1, 0, VOL as usize);
    pool.write(v, 0, &durable).unwrap();
    pool.flush().unwrap();
    pool.write(v, 0, &pattern(2, 0, 8192)).unwrap();
    let mut at_snapshot = durable.clone();
    at_snapshot[..8192].copy_from_slice(&pattern(2, 0, 8192));
    pool.snapshot_with("v@s", Durability::Deferred).unwrap();
    pool.clone_snapshot_with("v@s", "c", Durability::Deferred)
        .unwrap();
    pool.write(v, 65536, &pattern(3, 65536, 4096)).unwrap();

    // Power lost now: nothing since the last flush is durable, so neither
    // new volume exists, and the volume is as flushed.
    let crashed = pool_from_image(disk.handle().durable_image());
    assert!(crashed.lookup("v@s").is_err());
    assert!(crashed.lookup("c").is_err());
    assert_same(&read_all(&crashed, crashed.lookup("v").unwrap()), &durable);

    // Any subset of the unflushed writes: both or neither, and exact.
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(18);
    for _ in 0..20 {
        let crashed = pool_from_image(disk.handle().crash_image(&mut rng));
        match (crashed.lookup("v@s"), crashed.lookup("c")) {
            (Ok(s), Ok(c)) => {
                assert_same(&read_all(&crashed, s), &at_snapshot);
                assert_same(&read_all(&crashed, c), &at_snapshot);
            }
            (Err(_), Err(_)) => {}
            _ => panic!("a crash kept the clone without its snapshot, or the reverse"),
        }
    }

    // The next commit makes them durable, exactly as they were taken.
    pool.flush().unwrap();
    let crashed = pool_from_image(disk.handle().durable_image());
    assert_same(
        &read_all(&crashed, crashed.lookup("v@s").unwrap()),
        &at_snapshot,
    );
    assert_same(
        &read_all(&crashed, crashed.lookup("c").unwrap()),
        &at_snapshot,
    );
}

#[test]
fn a_deferred_snapshot_does_not_wait_for_a_commit_in_flight() {
    let disk = SimDisk::new(64 * MIB);
    let gated = Arc::new(FlushGate::new(disk));
    let dev: Arc<dyn BlockDevice> = gated.clone();
    let pool = Arc::new(Pool::create(dev, &small_opts(4096), &open_opts()).unwrap());
    let v = pool.create_volume("v", VOL).unwrap();
    pool.write(v, 0, &pattern(1, 0, 65536)).unwrap();
    let early = pool.snapshot_with("v@early", Durability::Deferred).unwrap();

    // A flush stalls in the device, holding its commit (and `early`, which
    // it records) in phase B.
    gated.close();
    let flusher = {
        let pool = pool.clone();
        std::thread::spawn(move || pool.flush())
    };
    gated.wait_for_blocked_flush();
    assert!(
        !pool.info(early).unwrap().durable,
        "durable before its commit is"
    );

    // The snapshot is taken, and writes go on, while that commit waits.
    let snap = {
        let pool = pool.clone();
        finishes(
            "the deferred snapshot waited for the commit in flight",
            move || pool.snapshot_with("v@s", Durability::Deferred),
        )
    }
    .unwrap();
    assert!(
        gated.blocked.load(Ordering::SeqCst),
        "the commit was not in flight"
    );
    pool.write(v, 0, &pattern(2, 0, 4096)).unwrap();
    gated.open();
    flusher.join().unwrap().unwrap();
    assert!(pool.info(early).unwrap().durable);
    assert!(!pool.info(snap).unwrap().durable);
    let mut expected = vec![0u8; VOL as usize];
    expected[..65536].copy_from_slice(&pattern(1, 0, 65536));
    assert_same(&read_all(&pool, snap), &expected);
    pool.flush().unwrap();
    assert_clean(&pool);
    let reopened = pool_from_image(gated.disk.handle().durable_image());
    assert_same(
        &read_all(&reopened, reopened.lookup("v@s").unwrap()),
        &expected,
    );
}

#[test]
fn a_deferred_snapshot_of_a_copy_on_write_volume_is_committed() {
    let (disk, pool) = sim_pool(64 * MIB, 4096);
    let v = pool.create_cow_volume("v", VOL).unwrap();
    pool.write(v, 0, &pattern(1, 0, 8192)).unwrap();
    let ops = disk.handle().op_counts();
    pool.snapshot_with("v@s", Durability::Deferred).unwrap();
    assert!(disk.handle().op_counts().1 > ops.1, "it did not flush");
    let crashed = pool_from_image(disk.handle().durable_image());
    let s = crashed.lookup("v@s").unwrap();
    let mut buf = vec![0u8; 8192];
    crashed.read(s, 0, &mut buf).unwrap();
    assert_eq!(buf, pattern(1, 0, 8192));
}

/// A device whose next write, once armed, waits until it is released; the
/// writes after it go through.
struct WriteGate {
    disk: SimDisk,
    /// (armed, blocked, released)
    state: std::sync::Mutex<(bool, bool, bool)>,
    changed: std::sync::Condvar,
}

impl WriteGate {
    fn new(disk: SimDisk) -> Self {
        Self {
            disk,
            state: std::sync::Mutex::new((false, false, false)),
            changed: std::sync::Condvar::new(),
        }
    }

    fn arm(&self) {
        *self.state.lock().unwrap() = (true, false, false);
    }

    fn wait_for_blocked_write(&self) {
        let mut state = self.state.lock().unwrap();
        while !state.1 {
            state = self.changed.wait(state).unwrap();
        }
    }

    fn release(&self) {
        self.state.lock().unwrap().2 = true;
        self.changed.notify_all();
    }
}

impl BlockDevice for WriteGate {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.disk.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        let mut state = self.state.lock().unwrap();
        if state.0 {
            *state = (false, true, false);
            self.changed.notify_all();
            while !state.2 {
                state = self.changed.wait(state).unwrap();
            }
        }
        drop(state);
        self.disk.write_at(buf, offset)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.disk.flush()
    }
    fn size(&self) -> u64 {
        self.disk.size()
    }
}

fn gated_pool() -> (Arc<WriteGate>, Arc<Pool>) {
    let gated = Arc::new(WriteGate::new(SimDisk::new(64 * MIB)));
    let dev: Arc<dyn BlockDevice> = gated.clone();
    let pool = Arc::new(Pool::create(dev, &small_opts(4096), &open_opts()).unwrap());
    (gated, pool)
}

#[test]
fn a_deferred_snapshot_does_not_wait_for_another_volumes_write() {
    let (gated, pool) = gated_pool();
    let a = pool.create_volume("a", VOL).unwrap();
    let b = pool.create_volume("b", VOL).unwrap();
    pool.write(a, 0, &pattern(1, 0, 65536)).unwrap();
    pool.write(b, 0, &pattern(2, 0, 65536)).unwrap();
    pool.flush().unwrap();

    // A write to `b` (in place) stalls in the device.
    gated.arm();
    let writer = {
        let pool = pool.clone();
        std::thread::spawn(move || pool.write(b, 4096, &pattern(3, 4096, 4096)))
    };
    gated.wait_for_blocked_write();

    // `a` is snapshotted, cloned, written and read meanwhile.
    let (snap, clone, buf) = {
        let pool = pool.clone();
        finishes("the snapshot of `a` waited for a write to `b`", move || {
            let snap = pool.snapshot_with("a@s", Durability::Deferred)?;
            let clone = pool.clone_snapshot_with("a@s", "c", Durability::Deferred)?;
            pool.write(a, 0, &pattern(4, 0, 4096))?;
            let mut buf = vec![0u8; 8192];
            pool.read(a, 0, &mut buf)?;
            Ok::<_, arbor_engine::Error>((snap, clone, buf))
        })
    }
    .unwrap();
    assert_eq!(buf[..4096], pattern(4, 0, 4096)[..]);
    assert_eq!(buf[4096..], pattern(1, 4096, 4096)[..]);
    gated.release();
    writer.join().unwrap().unwrap();

    let mut want_a = vec![0u8; VOL as usize];
    want_a[..65536].copy_from_slice(&pattern(1, 0, 65536));
    assert_same(&read_all(&pool, snap), &want_a);
    assert_same(&read_all(&pool, clone), &want_a);
    let mut want_b = vec![0u8; VOL as usize];
    want_b[..65536].copy_from_slice(&pattern(2, 0, 65536));
    want_b[4096..8192].copy_from_slice(&pattern(3, 4096, 4096));
    assert_same(&read_all(&pool, b), &want_b);
    pool.flush().unwrap();
    assert_clean(&pool);
}

#[test]
fn a_deferred_snapshot_waits_for_its_volumes_write_in_flight() {
    let (gated, pool) = gated_pool();
    let v = pool.create_volume("v", VOL).unwrap();
    pool.write(v, 0, &pattern(1, 0, 8192)).unwrap();
    pool.snapshot("v@old").unwrap();
    // Chunk 1 is the volume's own again; chunk 0 is still shared.
    pool.write(v, 4096, &pattern(2, 4096, 4096)).unwrap();
    pool.flush().unwrap();
    // Written again after that commit: its region of the pool is listed
    // as written in place from the next commit on (FORMAT.md §6.4), so
    // chunk 1 is overwritten in place below.
    pool.write(v, 4096, &pattern(2, 4096, 4096)).unwrap();
    pool.flush().unwrap();

    // One write over both chunks: chunk 0 is redirected (its new chunk is
    // written first, and stalls), chunk 1 is written in place after.
    gated.arm();
    let writer = {
        let pool = pool.clone();
        std::thread::spawn(move || pool.write(v, 0, &pattern(3, 0, 8192)))
    };
    gated.wait_for_blocked_write();
    let snapper = {
        let pool = pool.clone();
        std::thread::spawn(move || pool.snapshot_with("v@s", Durability::Deferred))
    };
    // Not needed for the test to pass: it gives a snapshot that does not
    // wait the time to be taken mid-write, which the checks below catch.
    std::thread::sleep(Duration::from_millis(100));
    gated.release();
    writer.join().unwrap().unwrap();
    let snap = snapper.join().unwrap().unwrap();

    // The snapshot holds the write whole: it waited for it. Taken in the
    // middle, it would hold chunk 0's old data and chunk 1's new.
    let mut want = vec![0u8; VOL as usize];
    want[..8192].copy_from_slice(&pattern(3, 0, 8192));
    assert_same(&read_all(&pool, snap), &want);
    // And later writes leave it alone.
    pool.write(v, 0, &pattern(4, 0, 8192)).unwrap();
    assert_same(&read_all(&pool, snap), &want);
    pool.flush().unwrap();
    assert_clean(&pool);
}

#[test]
fn a_deferred_snapshot_does_not_wait_for_its_volumes_redirected_write() {
    let (gated, pool) = gated_pool();
    let v = pool.create_volume("v", VOL).unwrap();
    pool.write(v, 0, &pattern(1, 0, 8192)).unwrap();
    pool.snapshot("v@old").unwrap();

    // Both chunks are shared with `v@old`: the write redirects them, and
    // its first new chunk stalls in the device.
    gated.arm();
    let writer = {
        let pool = pool.clone();
        std::thread::spawn(move || pool.write(v, 0, &pattern(2, 0, 8192)))
    };
    gated.wait_for_blocked_write();
    let snap = {
        let pool = pool.clone();
        finishes(
            "the snapshot waited for a write that writes no chunk it maps",
            move || pool.snapshot_with("v@s", Durability::Deferred),
        )
    }
    .unwrap();
    gated.release();
    writer.join().unwrap().unwrap();

    // Taken before the write mapped anything: none of it.
    let mut before = vec![0u8; VOL as usize];
    before[..8192].copy_from_slice(&pattern(1, 0, 8192));
    assert_same(&read_all(&pool, snap), &before);
    let mut after = vec![0u8; VOL as usize];
    after[..8192].copy_from_slice(&pattern(2, 0, 8192));
    assert_same(&read_all(&pool, v), &after);
    // The next writes go in place only where the volume alone maps them.
    pool.write(v, 0, &pattern(3, 0, 8192)).unwrap();
    assert_same(&read_all(&pool, snap), &before);
    pool.flush().unwrap();
    assert_clean(&pool);
    let reopened = pool_from_image(gated.disk.handle().durable_image());
    assert_same(
        &read_all(&reopened, reopened.lookup("v@s").unwrap()),
        &before,
    );
}
