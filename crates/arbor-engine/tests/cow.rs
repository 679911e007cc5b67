//! Copy-on-write volumes on an external device (`Pool::attach_origin`):
//! the device stays a plain raw disk, snapshots read their point in time
//! from the store's copies, one copy per chunk whatever the number of
//! snapshots, and failures leave the device untouched.
// A test crate: unwrap, expect and panic are how a test reports failure
// (the workspace denies them in the code it ships; clippy.toml allows
// them in #[test] functions, this in the helpers around them).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;

use arbor_engine::{DeviceIdentity, Error, Pool, Refusal, Resource, VolumeId, VolumeLayout};
use arbor_io::{BlockDevice, SimDisk};
use common::*;

const CS: u64 = 4096;
const ORIGIN: u64 = 256 * 1024;

fn identity(n: u64) -> DeviceIdentity {
    DeviceIdentity { dev: 7, ino: n }
}

fn fill(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| seed.wrapping_mul(31).wrapping_add((i / 512) as u8) | 1)
        .collect()
}

/// A pool and an origin device filled with `fill(1, ..)`, attached as `disk`.
fn attached() -> (SimDisk, Pool, SimDisk, VolumeId) {
    let (disk, pool) = sim_pool(32 * MIB, CS as u32);
    let origin = SimDisk::from_image(fill(1, ORIGIN as usize));
    let dev: Arc<dyn BlockDevice> = Arc::new(origin.clone());
    let id = pool.attach_origin("disk", dev, identity(1)).unwrap();
    (disk, pool, origin, id)
}

/// Fills the pool's data space with volume `filler`.
fn fill_pool(pool: &Pool) {
    let filler = pool.create_volume("filler", 64 * MIB).unwrap();
    let mut at = 0;
    while pool.write(filler, at, &[1u8; 65536]).is_ok() {
        at += 65536;
    }
    while pool.write(filler, at, &[1u8; 4096]).is_ok() {
        at += 4096;
    }
}

fn read(pool: &Pool, id: VolumeId, len: u64) -> Vec<u8> {
    let mut buf = vec![0u8; len as usize];
    pool.read(id, 0, &mut buf).unwrap();
    buf
}

#[test]
fn snapshots_keep_their_point_in_time_and_the_device_stays_raw() {
    let (_disk, pool, origin, disk) = attached();
    let before = read(&pool, disk, ORIGIN);
    assert_eq!(before, fill(1, ORIGIN as usize));
    let s1 = pool.snapshot("disk@s1").unwrap();
    pool.write(disk, 4096 + 512, &[9u8; 8192]).unwrap();
    let mut now = before.clone();
    now[4608..4608 + 8192].fill(9);
    assert_eq!(read(&pool, disk, ORIGIN), now);
    assert_eq!(read(&pool, s1, ORIGIN), before);
    // The device itself holds the volume's current content.
    assert_eq!(origin.handle().visible_image(), now);
    // Three chunks were copied once.
    match pool.info(disk).unwrap().layout {
        VolumeLayout::CowExternal { store_bytes, epoch } => {
            assert_eq!((store_bytes, epoch), (3 * CS, 1));
        }
        other => panic!("{other:?}"),
    }
    // A second write of the same chunks copies nothing more.
    pool.write(disk, 4096, &[8u8; 4096]).unwrap();
    now[4096..8192].fill(8);
    assert_eq!(read(&pool, s1, ORIGIN), before);
    assert_eq!(read(&pool, disk, ORIGIN), now);
    assert_eq!(pool.volume_stats(s1).unwrap().exclusive_bytes, 3 * CS);
    assert_clean(&pool);
}

#[test]
fn one_copy_per_chunk_whatever_the_number_of_snapshots() {
    let (_disk, pool, _origin, disk) = attached();
    for i in 0..100 {
        pool.snapshot(&format!("disk@s{i}")).unwrap();
    }
    let used = pool.pool_stats().unwrap().data_used_bytes;
    pool.write(disk, 0, &[5u8; 4096]).unwrap();
    assert_eq!(pool.pool_stats().unwrap().data_used_bytes, used + CS);
    for i in 0..100 {
        let s = pool.lookup(&format!("disk@s{i}")).unwrap();
        assert_eq!(read(&pool, s, ORIGIN), fill(1, ORIGIN as usize));
    }
    assert_clean(&pool);
}

#[test]
fn clones_of_snapshots_are_writable_and_independent() {
    let (_disk, pool, _origin, disk) = attached();
    pool.snapshot("disk@s1").unwrap();
    let clone = pool.clone_snapshot("disk@s1", "c1").unwrap();
    let base = fill(1, ORIGIN as usize);
    // A partial write of an unmapped chunk of the clone keeps what the
    // epoch reads around it.
    pool.write(clone, 512, &[3u8; 1024]).unwrap();
    pool.write(disk, 0, &[4u8; 8192]).unwrap();
    let mut want = base.clone();
    want[512..1536].fill(3);
    assert_eq!(read(&pool, clone, ORIGIN), want);
    // A snapshot of the clone reads through the same epoch.
    let cs1 = pool.snapshot("c1@x").unwrap();
    pool.write(clone, 8192, &[6u8; 4096]).unwrap();
    assert_eq!(read(&pool, cs1, ORIGIN), want);
    want[8192..12288].fill(6);
    assert_eq!(read(&pool, clone, ORIGIN), want);
    // The snapshot of the origin can go: the clone keeps its epoch alive.
    pool.delete("disk@s1").unwrap();
    while pool.reclaim(1024).unwrap() > 0 {}
    assert_eq!(read(&pool, clone, ORIGIN), want);
    pool.write(disk, 16384, &[7u8; 4096]).unwrap();
    assert_eq!(read(&pool, clone, ORIGIN), want);
    // Discards and zeroing of a clone write zeros (it cannot unmap).
    pool.discard(clone, 0, 4096).unwrap();
    want[0..4096].fill(0);
    assert_eq!(read(&pool, clone, ORIGIN), want);
    assert_clean(&pool);
    // Destroying every reader frees every copy.
    pool.delete("c1@x").unwrap();
    pool.delete("c1").unwrap();
    while pool.reclaim(1024).unwrap() > 0 {}
    match pool.info(disk).unwrap().layout {
        VolumeLayout::CowExternal { store_bytes, .. } => assert_eq!(store_bytes, 0),
        other => panic!("{other:?}"),
    }
    assert_clean(&pool);
}

#[test]
fn rollback_writes_back_what_differs_and_keeps_the_snapshots() {
    let (_disk, pool, origin, disk) = attached();
    pool.snapshot("disk@a").unwrap();
    pool.write(disk, 0, &[2u8; 16384]).unwrap();
    let after_a = read(&pool, disk, ORIGIN);
    let b = pool.snapshot("disk@b").unwrap();
    pool.write(disk, 8192, &[3u8; 16384]).unwrap();
    pool.rollback("disk", "disk@a").unwrap();
    assert_eq!(read(&pool, disk, ORIGIN), fill(1, ORIGIN as usize));
    assert_eq!(origin.handle().visible_image(), fill(1, ORIGIN as usize));
    assert_eq!(read(&pool, b, ORIGIN), after_a);
    pool.rollback("disk", "disk@b").unwrap();
    assert_eq!(read(&pool, disk, ORIGIN), after_a);
    assert_clean(&pool);
}

#[test]
fn detach_is_refused_while_snapshots_read_through_and_leaves_a_raw_disk() {
    let (_disk, pool, origin, disk) = attached();
    pool.snapshot("disk@a").unwrap();
    pool.write(disk, 0, &[2u8; 4096]).unwrap();
    assert!(matches!(
        pool.detach_origin("disk"),
        Err(Error::Refused(Refusal::Conflict(_)))
    ));
    assert!(matches!(
        pool.delete("disk"),
        Err(Error::Refused(Refusal::Conflict(_)))
    ));
    pool.delete("disk@a").unwrap();
    pool.detach_origin("disk").unwrap();
    assert!(pool.lookup("disk").is_err());
    let mut want = fill(1, ORIGIN as usize);
    want[..4096].fill(2);
    assert_eq!(origin.handle().durable_image(), want, "flushed on detach");
    while pool.reclaim(1024).unwrap() > 0 {}
    assert_eq!(pool.pool_stats().unwrap().data_used_bytes, 0);
    assert_clean(&pool);
}

#[test]
fn a_full_pool_fails_the_write_and_leaves_the_device_untouched() {
    let (_disk, pool, origin, disk) = attached();
    pool.snapshot("disk@a").unwrap();
    fill_pool(&pool);
    let device = origin.handle().visible_image();
    assert!(matches!(
        pool.write(disk, 0, &[9u8; 4096]),
        Err(Error::Exhausted(Resource::DataSpace))
    ));
    assert_eq!(
        origin.handle().visible_image(),
        device,
        "the device was written"
    );
    let snap = pool.lookup("disk@a").unwrap();
    assert_eq!(read(&pool, snap, ORIGIN), fill(1, ORIGIN as usize));
    // Room again: the write goes through.
    pool.delete("filler").unwrap();
    while pool.reclaim(1024).unwrap() > 0 {}
    pool.write(disk, 0, &[9u8; 4096]).unwrap();
    assert_eq!(read(&pool, snap, ORIGIN), fill(1, ORIGIN as usize));
    assert_clean(&pool);
}

#[test]
fn a_restart_needs_the_same_device_again() {
    let (disk, pool, origin, id) = attached();
    pool.snapshot("disk@a").unwrap();
    pool.write(id, 0, &[2u8; 4096]).unwrap();
    pool.flush().unwrap();
    drop(pool);
    let pool = reopen(&disk);
    let info = pool.origins().unwrap();
    assert_eq!(info.len(), 1);
    assert!(!info[0].attached);
    let mut buf = [0u8; 512];
    assert!(matches!(
        pool.read(id, 0, &mut buf),
        Err(Error::Refused(Refusal::Origin(_)))
    ));
    // A rollback with nothing to write to is refused, not recorded.
    assert!(matches!(
        pool.rollback("disk", "disk@a"),
        Err(Error::Refused(Refusal::Origin(_)))
    ));
    assert_eq!(pool.origins().unwrap()[0].rollback_epoch, 0);
    let snap = pool.lookup("disk@a").unwrap();
    // Reads of the snapshot need the device for chunks never copied.
    assert!(matches!(
        pool.read(snap, 8192, &mut buf),
        Err(Error::Refused(Refusal::Origin(_)))
    ));
    // Another device, or the same one shrunk, is refused.
    let other: Arc<dyn BlockDevice> = Arc::new(SimDisk::new(ORIGIN));
    assert!(matches!(
        pool.attach_origin("disk", other, identity(2)),
        Err(Error::Refused(Refusal::Conflict(_)))
    ));
    let smaller: Arc<dyn BlockDevice> = Arc::new(SimDisk::new(ORIGIN - 4096));
    assert!(matches!(
        pool.attach_origin("disk", smaller, identity(1)),
        Err(Error::Refused(Refusal::Conflict(_)))
    ));
    // A file (an inode number) seen smaller was truncated: what it held
    // past that is lost, whatever its size now, and recorded so; a block
    // device's number may name another disk for now, so nothing is.
    let o = &pool.origins().unwrap()[0];
    assert_eq!(o.loss.map(|l| l.from), Some(ORIGIN - 4096));
    let block = DeviceIdentity { dev: 7, ino: 0 };
    let smaller: Arc<dyn BlockDevice> = Arc::new(SimDisk::new(ORIGIN - 4096));
    assert!(matches!(
        pool.attach_origin("disk", smaller, block),
        Err(Error::Refused(Refusal::Conflict(_)))
    ));
    assert_eq!(
        pool.origins().unwrap()[0].loss.map(|l| l.from),
        Some(ORIGIN - 4096)
    );
    // The same disk under a new number (a block device after a reboot):
    // recorded again by whoever knows it is the same disk, then attached.
    pool.reidentify_origin("disk", identity(3)).unwrap();
    let dev: Arc<dyn BlockDevice> = Arc::new(origin.clone());
    assert!(matches!(
        pool.attach_origin("disk", dev, identity(1)),
        Err(Error::Refused(Refusal::Conflict(_)))
    ));
    let dev: Arc<dyn BlockDevice> = Arc::new(origin.clone());
    assert!(matches!(
        pool.attach_origin("disk", dev, identity(3)),
        Err(Error::Refused(Refusal::Conflict(_)))
    ));
    let dev: Arc<dyn BlockDevice> = Arc::new(origin.clone());
    pool.attach_origin_with("disk", dev, identity(3), true)
        .unwrap();
    assert!(matches!(
        pool.reidentify_origin("disk", identity(4)),
        Err(Error::Refused(Refusal::Conflict(_)))
    ));
    // Short of the loss, its point in time; past it, an error.
    let kept = (ORIGIN - 4096) as usize;
    assert_eq!(
        read(&pool, snap, kept as u64),
        fill(1, ORIGIN as usize)[..kept]
    );
    assert!(matches!(
        pool.read(snap, ORIGIN - 4096, &mut buf),
        Err(Error::Refused(Refusal::Origin(_)))
    ));
    assert_eq!(read(&pool, id, 4096)[..], [2u8; 4096][..]);
    // The same device cannot be a second volume.
    let again: Arc<dyn BlockDevice> = Arc::new(origin.clone());
    assert!(matches!(
        pool.attach_origin("twin", again, identity(3)),
        Err(Error::Refused(Refusal::AlreadyExists(_)))
    ));
    assert_clean(&pool);
}

#[test]
fn a_cow_volume_in_the_pool_is_contiguous_zeroed_and_freed_with_it() {
    let (disk, pool) = sim_pool(32 * MIB, CS as u32);
    // Freed chunks with old data: a new home must not show it.
    let junk = pool.create_volume("junk", 4 * MIB).unwrap();
    pool.write(junk, 0, &vec![0xee; 4 * MIB as usize]).unwrap();
    pool.delete("junk").unwrap();
    while pool.reclaim(4096).unwrap() > 0 {}
    let before = pool.pool_stats().unwrap().data_used_bytes;
    let id = pool.create_cow_volume("db", MIB + 512).unwrap();
    assert!(matches!(
        pool.info(id).unwrap().layout,
        VolumeLayout::CowInPool { .. }
    ));
    assert_eq!(read(&pool, id, MIB + 512), vec![0u8; (MIB + 512) as usize]);
    let home = (MIB + 512).div_ceil(CS) * CS;
    assert_eq!(pool.pool_stats().unwrap().data_used_bytes, before + home);
    // Data goes in place: one contiguous run of the pool's device.
    let data = fill(4, (MIB + 512) as usize);
    pool.write(id, 0, &data).unwrap();
    pool.flush().unwrap();
    let image = disk.handle().durable_image();
    assert!(
        image.windows(data.len()).any(|w| w == &data[..]),
        "the volume's data is not one run of the device"
    );
    // Snapshots, then a restart: the home is found again.
    let s = pool.snapshot("db@a").unwrap();
    pool.write(id, 4096, &[1u8; 4096]).unwrap();
    drop(pool);
    let pool = reopen(&disk);
    assert_eq!(read(&pool, s, MIB + 512), data);
    assert_eq!(read(&pool, id, 4096 * 2)[4096..], [1u8; 4096][..]);
    assert!(pool.origins().unwrap().is_empty(), "not an external device");
    assert_clean(&pool);
    assert!(matches!(
        pool.delete("db"),
        Err(Error::Refused(Refusal::Conflict(_)))
    ));
    pool.delete("db@a").unwrap();
    pool.delete("db").unwrap();
    while pool.reclaim(4096).unwrap() > 0 {}
    assert_eq!(pool.pool_stats().unwrap().data_used_bytes, 0);
    assert_clean(&pool);
}

/// A pool in a file of a temporary directory, buffered.
struct FilePool {
    _dir: tempfile::TempDir,
    path: std::path::PathBuf,
}

impl FilePool {
    fn new(size: u64) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pool");
        drop(arbor_io::FileDevice::create_file(&path, size).unwrap());
        Self { _dir: dir, path }
    }

    fn device(&self) -> Arc<dyn BlockDevice> {
        Arc::new(arbor_io::FileDevice::open(&self.path).unwrap())
    }

    fn create(&self) -> Pool {
        Pool::create(self.device(), &small_opts(CS as u32), &open_opts()).unwrap()
    }

    fn open(&self) -> Pool {
        Pool::open(self.device(), &open_opts()).unwrap()
    }
}

/// The same on a pool in a real file, where a home of a MiB or more is
/// zeroed without writing (`fallocate`, see `FileDevice::write_zeroes`): it
/// reads as zeros over chunks that held another volume's data, in the
/// page cache and after a reopen, and a growth into such chunks does too.
#[test]
fn a_home_zeroed_in_a_real_file_never_shows_freed_data() {
    let file = FilePool::new(64 * MIB);
    let pool = file.create();
    let junk = pool.create_volume("junk", 24 * MIB).unwrap();
    pool.write(junk, 0, &vec![0xee; 24 * MIB as usize]).unwrap();
    pool.flush().unwrap();
    pool.delete("junk").unwrap();
    while pool.reclaim(4096).unwrap() > 0 {}
    pool.flush().unwrap();
    let id = pool.create_cow_volume("db", 4 * MIB).unwrap();
    assert_eq!(read(&pool, id, 4 * MIB), vec![0u8; 4 * MIB as usize]);
    pool.resize("db", 12 * MIB).unwrap();
    assert_eq!(read(&pool, id, 12 * MIB), vec![0u8; 12 * MIB as usize]);
    pool.write(id, MIB, &[7u8; 4096]).unwrap();
    pool.flush().unwrap();
    drop(pool);
    let pool = file.open();
    let mut expected = vec![0u8; 12 * MIB as usize];
    expected[MIB as usize..MIB as usize + 4096].fill(7);
    assert!(read(&pool, id, 12 * MIB) == expected, "after a reopen");
    assert_clean(&pool);
}

/// Zeroing a range of a copy-on-write volume's home in a real file (large
/// enough to be zeroed without writing) zeroes exactly that range of that
/// volume: the rest of it, a neighbouring home and a snapshot keep their
/// data, in the page cache and after a reopen.
#[test]
fn zeroing_part_of_a_home_in_a_real_file_touches_nothing_else() {
    let file = FilePool::new(64 * MIB);
    let pool = file.create();
    let len = 8 * MIB as usize;
    let a = pool.create_cow_volume("a", 8 * MIB).unwrap();
    let b = pool.create_cow_volume("b", 8 * MIB).unwrap();
    let (data_a, data_b) = (fill(5, len), fill(6, len));
    pool.write(a, 0, &data_a).unwrap();
    pool.write(b, 0, &data_b).unwrap();
    let snap = pool.snapshot("b@s").unwrap();
    pool.write_zeroes(b, 2 * MIB, 4 * MIB, true).unwrap();
    pool.write_zeroes(a, 3 * MIB, 2 * MIB, true).unwrap();
    let mut want_a = data_a.clone();
    want_a[3 * MIB as usize..5 * MIB as usize].fill(0);
    let mut want_b = data_b.clone();
    want_b[2 * MIB as usize..6 * MIB as usize].fill(0);
    let check = |pool: &Pool, when: &str| {
        assert!(read(pool, a, 8 * MIB) == want_a, "a {when}");
        assert!(read(pool, b, 8 * MIB) == want_b, "b {when}");
        assert!(read(pool, snap, 8 * MIB) == data_b, "b@s {when}");
    };
    check(&pool, "at once");
    pool.flush().unwrap();
    drop(pool);
    let pool = file.open();
    check(&pool, "after a reopen");
    assert_clean(&pool);
}

/// A home larger than one commit can allocate is built over several
/// (tests/big_home.rs has the details): what it does not use of the pool
/// stays usable, and a home that does not fit is refused with nothing set
/// aside.
#[test]
fn a_cow_volume_larger_than_one_commit_is_built_and_the_rest_stays_usable() {
    let disk = SimDisk::new(160 * MIB);
    let dev: Arc<dyn BlockDevice> = Arc::new(disk);
    let opts = arbor_engine::CreateOptions {
        journal_pages: Some(16),
        ..small_opts(CS as u32)
    };
    let pool = Pool::create(dev, &opts, &open_opts()).unwrap();
    let big = pool.create_cow_volume("big", 100 * MIB).unwrap();
    assert_eq!(pool.info(big).unwrap().size, 100 * MIB);
    match pool.create_cow_volume("more", 100 * MIB) {
        Err(Error::Exhausted(Resource::DataSpace)) => {}
        other => panic!("{other:?}"),
    }
    let v = pool.create_volume("v", 40 * MIB).unwrap();
    pool.write(v, 0, &vec![1u8; 40 * MIB as usize]).unwrap();
    assert_clean(&pool);
}

/// A real file under an attached volume that shrinks, or is replaced by
/// nothing, gives a clear error on reads and writes (never a panic), and
/// the pool goes on.
#[test]
fn a_device_that_shrinks_under_the_volume_gives_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("disk.raw");
    std::fs::write(&path, fill(1, ORIGIN as usize)).unwrap();
    let dev: Arc<dyn BlockDevice> = Arc::new(arbor_io::FileDevice::open(&path).unwrap());
    let (_disk, pool) = sim_pool(32 * MIB, CS as u32);
    let id = pool.attach_origin("disk", dev, identity(1)).unwrap();
    let snap = pool.snapshot("disk@a").unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(ORIGIN / 2)
        .unwrap();
    let mut buf = vec![0u8; 8192];
    match pool.read(id, ORIGIN - 8192, &mut buf) {
        Err(Error::Refused(Refusal::Origin(why))) => {
            assert!(why.to_string().contains("shrank"), "{why}")
        }
        other => panic!("{other:?}"),
    }
    match pool.read(snap, ORIGIN - 8192, &mut buf) {
        Err(Error::Refused(Refusal::Origin(why))) => {
            assert!(why.to_string().contains("shrank"), "{why}")
        }
        other => panic!("{other:?}"),
    }
    // A write past the new end must copy the old chunk first, which it
    // cannot read: it fails, and the snapshot is not invalidated.
    assert!(matches!(
        pool.write(id, ORIGIN - 4096, &[1u8; 4096]),
        Err(Error::Refused(Refusal::Origin(_)))
    ));
    // The rest of the pool works.
    let v = pool.create_volume("v", MIB).unwrap();
    pool.write(v, 0, &[2u8; 4096]).unwrap();
    pool.flush().unwrap();
    assert_clean(&pool);
}

/// Issue 39, 3: a file truncated under an attached origin fails it at the
/// first request that sees it (a write below the new end included, which
/// went through before), its loss is recorded in the pool, and it stays
/// failed when the file grows back: an attach is refused until the loss is
/// accepted. Then the snapshot taken before reads its copies and what the
/// file still holds, and fails (never zeros) where it read lost bytes; a
/// write that would copy lost bytes for it is refused; `check` lists it;
/// a rollback to it is refused; all of it after a reopen too. Once the
/// snapshot is gone, nothing is lost and everything works.
#[test]
fn an_origin_that_shrank_fails_and_its_snapshot_never_reads_zeros() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("disk.raw");
    let data = fill(1, ORIGIN as usize);
    std::fs::write(&path, &data).unwrap();
    let open_dev =
        || -> Arc<dyn BlockDevice> { Arc::new(arbor_io::FileDevice::open(&path).unwrap()) };
    let disk = SimDisk::new(32 * MIB);
    let pool = Pool::create(Arc::new(disk.clone()), &small_opts(CS as u32), &open_opts()).unwrap();
    let id = pool.attach_origin("disk", open_dev(), identity(1)).unwrap();
    let snap = pool.snapshot("disk@a").unwrap();
    // One chunk copied for disk@a before the loss.
    let last = ORIGIN - CS;
    pool.write(id, last, &[9u8; CS as usize]).unwrap();
    let half = ORIGIN / 2;
    let set_len = |len: u64| {
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(len)
            .unwrap()
    };
    set_len(half);
    // Below the new end: refused too (it went through before).
    match pool.write(id, 0, &[2u8; 4096]) {
        Err(Error::Refused(Refusal::Origin(why))) => {
            assert!(why.to_string().contains("shrank"), "{why}")
        }
        other => panic!("a write after the shrink: {other:?}"),
    }
    let mut buf = vec![0u8; 4096];
    assert!(matches!(
        pool.read(id, 0, &mut buf),
        Err(Error::Refused(Refusal::Origin(_)))
    ));
    let o = &pool.origins().unwrap()[0];
    assert!(!o.attached, "{o:?}");
    let loss = o.loss.expect("the loss is recorded");
    assert_eq!((loss.from, loss.accepted_unix), (half, 0));
    assert_eq!(
        std::fs::metadata(&path).unwrap().len(),
        half,
        "the file was not written"
    );

    // Grown back (zeros past the half) and attached: refused, after a
    // reopen too; then accepted.
    set_len(ORIGIN);
    match pool.attach_origin("disk", open_dev(), identity(1)) {
        Err(Error::Refused(Refusal::Conflict(why))) => {
            assert!(why.to_string().contains("--accept-damage"), "{why}")
        }
        other => panic!("{other:?}"),
    }
    drop(pool);
    let pool = reopen(&disk);
    match pool.attach_origin("disk", open_dev(), identity(1)) {
        Err(Error::Refused(Refusal::Conflict(why))) => {
            assert!(why.to_string().contains("shrank"), "{why}")
        }
        other => panic!("{other:?}"),
    }
    pool.attach_origin_with("disk", open_dev(), identity(1), true)
        .unwrap();
    let o = &pool.origins().unwrap()[0];
    assert!(o.attached && o.loss.unwrap().accepted_unix > 0, "{o:?}");

    let check_snapshot = |pool: &Pool| {
        // What it copied, and what the file still holds, read as they were.
        let mut below = vec![0u8; half as usize];
        pool.read(snap, 0, &mut below).unwrap();
        assert!(below == data[..half as usize], "disk@a below the loss");
        let mut copied = vec![0u8; CS as usize];
        pool.read(snap, last, &mut copied).unwrap();
        assert!(copied == data[last as usize..], "disk@a's copy");
        // What it read through the device past the loss: an error.
        let mut buf = vec![0u8; 4096];
        for at in [half, half + CS, last - CS] {
            match pool.read(snap, at, &mut buf) {
                Err(Error::Refused(Refusal::Origin(why))) => {
                    assert!(why.to_string().contains("lost"), "{why}")
                }
                Ok(()) => panic!("disk@a read {at} as data: {:?}", &buf[..8]),
                other => panic!("{other:?}"),
            }
        }
        let report = pool.check().unwrap();
        assert!(report.is_clean(), "{:?}", report.problems);
        assert_eq!(report.lost.len(), 1, "{:?}", report.lost);
        assert_eq!(report.lost[0].volume, "disk@a");
        assert_eq!(report.lost[0].bytes, half - CS);
    };
    check_snapshot(&pool);
    // The origin serves the device as it is now.
    pool.write(id, 0, &[2u8; 4096]).unwrap();
    pool.read(id, half, &mut buf).unwrap();
    assert_eq!(buf, vec![0u8; 4096]);
    // A write that would copy lost bytes for disk@a: refused, nothing written.
    match pool.write(id, half, &[3u8; 4096]) {
        Err(Error::Refused(Refusal::Origin(why))) => {
            assert!(why.to_string().contains("lost"), "{why}")
        }
        other => panic!("{other:?}"),
    }
    match pool.rollback("disk", "disk@a") {
        Err(Error::Refused(Refusal::Origin(why))) => {
            assert!(why.to_string().contains("lost"), "{why}")
        }
        other => panic!("{other:?}"),
    }
    pool.flush().unwrap();
    drop(pool);
    let pool = reopen(&disk);
    pool.attach_origin("disk", open_dev(), identity(1)).unwrap();
    check_snapshot(&pool);
    // A snapshot taken after the loss reads the device as it is.
    let b = pool.snapshot("disk@b").unwrap();
    pool.read(b, half, &mut buf).unwrap();
    assert_eq!(buf, vec![0u8; 4096]);

    pool.delete("disk@a").unwrap();
    assert!(pool.check().unwrap().lost.is_empty());
    pool.write(id, half, &[3u8; 4096]).unwrap();
    pool.read(b, half, &mut buf).unwrap();
    assert_eq!(buf, vec![0u8; 4096], "disk@b keeps its point in time");
    assert_clean(&pool);
}

/// The sweep of a destroyed snapshot's copies is paced in metadata nodes,
/// like the rest of reclaim, not one node per copy: a store of 2,048
/// dead copies fills a few dozen leaves, and a budget of 64 nodes clears
/// it in one call. (Counted per copy, a pass of 256 copies cost 256 nodes,
/// and the daemon's paced reclaim took 73 s for the copies of 1,002
/// snapshots.)
#[test]
fn one_reclaim_call_sweeps_a_store_by_its_nodes_not_its_copies() {
    const CHUNKS: u64 = 2048;
    let (_disk, pool) = sim_pool(64 * MIB, CS as u32);
    let origin = SimDisk::from_image(fill(1, (CHUNKS * CS) as usize));
    let dev: Arc<dyn BlockDevice> = Arc::new(origin.clone());
    let disk = pool.attach_origin("disk", dev, identity(1)).unwrap();
    pool.snapshot("disk@s1").unwrap();
    pool.write(disk, 0, &vec![2u8; (CHUNKS * CS) as usize])
        .unwrap();
    let store = |pool: &Pool| match pool.info(disk).unwrap().layout {
        VolumeLayout::CowExternal { store_bytes, .. } => store_bytes,
        other => panic!("{other:?}"),
    };
    assert_eq!(store(&pool), CHUNKS * CS);
    pool.delete("disk@s1").unwrap();
    let cost = pool.reclaim(64).unwrap();
    assert!(cost > 0 && cost <= 64 + 16, "{cost}");
    assert_eq!(store(&pool), 0);
    assert_eq!(pool.reclaim(64).unwrap(), 0);
    assert!(!pool.pool_stats().unwrap().reclaim_pending);
    assert_clean(&pool);
}

/// A snapshot's exclusive bytes are the copies only its epoch reads, and
/// they follow every change: a copy two snapshots share counts for neither
/// until one of them is destroyed, and a new copy counts at once.
#[test]
fn snapshot_statistics_follow_destroys_and_new_copies() {
    let (_disk, pool, _origin, disk) = attached();
    let exclusive = |id| pool.volume_stats(id).unwrap().exclusive_bytes;
    let s1 = pool.snapshot("disk@s1").unwrap();
    pool.write(disk, 0, &[3u8; 4096]).unwrap();
    let s2 = pool.snapshot("disk@s2").unwrap();
    pool.write(disk, 0, &[4u8; 4096]).unwrap();
    pool.write(disk, 2 * CS, &[4u8; 4096]).unwrap();
    // Chunk 0: a copy for s1, another for s2. Chunk 2: one both read.
    assert_eq!((exclusive(s1), exclusive(s2)), (CS, CS));
    pool.write(disk, 4 * CS, &[5u8; 4096]).unwrap();
    assert_eq!((exclusive(s1), exclusive(s2)), (CS, CS));
    let s3 = pool.snapshot("disk@s3").unwrap();
    pool.write(disk, 0, &[6u8; 4096]).unwrap();
    assert_eq!((exclusive(s1), exclusive(s2), exclusive(s3)), (CS, CS, CS));
    pool.write(disk, 6 * CS, &[6u8; 4096]).unwrap();
    assert_eq!((exclusive(s1), exclusive(s2), exclusive(s3)), (CS, CS, CS));
    pool.delete("disk@s2").unwrap();
    // Chunks 2 and 4 are s1's alone now; chunk 6 is still read by both.
    assert_eq!((exclusive(s1), exclusive(s3)), (3 * CS, CS));
    pool.delete("disk@s1").unwrap();
    assert_eq!(exclusive(s3), 2 * CS);
    assert_clean(&pool);
}

/// Concurrent first writes share commits: while one commit is in flight,
/// the copies of first writes to other chunks go into the next
/// transaction, and one commit makes them all durable (a group commit:
/// each writer waits for the commit that covers its copy, not for one of
/// its own).
#[test]
fn concurrent_first_writes_share_one_commit() {
    use std::sync::atomic::{AtomicU64, Ordering};
    const WRITERS: u64 = 8;
    let gated = Arc::new(FlushGate::new(SimDisk::new(32 * MIB)));
    let dev: Arc<dyn BlockDevice> = gated.clone();
    let pool = Arc::new(Pool::create(dev, &small_opts(CS as u32), &open_opts()).unwrap());
    let origin = SimDisk::from_image(fill(1, ORIGIN as usize));
    let disk = pool
        .attach_origin("disk", Arc::new(origin.clone()), identity(1))
        .unwrap();
    let snap = pool.snapshot("disk@s").unwrap();
    let commits = Arc::new(AtomicU64::new(0));
    let counter = Arc::clone(&commits);
    assert!(pool.observe_commits(Box::new(move |_| {
        counter.fetch_add(1, Ordering::SeqCst);
    })));
    let write = |chunk: u64| {
        let pool = Arc::clone(&pool);
        std::thread::spawn(move || pool.write(disk, chunk * CS, &[chunk as u8 + 10; 4096]))
    };
    let store = |pool: &Pool| match pool.info(disk).unwrap().layout {
        VolumeLayout::CowExternal { store_bytes, .. } => store_bytes,
        other => panic!("{other:?}"),
    };
    // The first writer's commit stalls in the device.
    gated.close();
    let first = write(0);
    gated.wait_for_blocked_flush();
    let writers: Vec<_> = (1..=WRITERS).map(write).collect();
    // Every writer's copy is mapped in the open transaction, behind it.
    while store(&pool) < (WRITERS + 1) * CS {
        std::thread::yield_now();
    }
    gated.open();
    first.join().unwrap().unwrap();
    for writer in writers {
        writer.join().unwrap().unwrap();
    }
    assert_eq!(
        commits.load(Ordering::SeqCst),
        2,
        "one commit for the group"
    );
    let mut want = fill(1, ORIGIN as usize);
    for chunk in 0..=WRITERS {
        let at = (chunk * CS) as usize;
        want[at..at + 4096].fill(chunk as u8 + 10);
    }
    assert_eq!(origin.handle().visible_image(), want);
    assert_eq!(read(&pool, snap, ORIGIN), fill(1, ORIGIN as usize));
    assert_clean(&pool);
}

/// Diffs between snapshots of a copy-on-write volume come from its store:
/// a chunk differs between two epochs when the older one reads a copy the
/// newer one does not; the volume itself differs from an epoch where that
/// epoch reads a copy. A clone adds what its tree maps. Volumes of other
/// layouts cannot be compared with these.
#[test]
fn diffs_between_epochs_come_from_the_store() {
    let (_disk, pool, _origin, disk) = attached();
    let chunks = |a: VolumeId, b: VolumeId| -> Vec<u64> {
        let mut out = Vec::new();
        for (offset, len) in pool.diff(a, b).unwrap() {
            out.extend(offset / CS..(offset + len) / CS);
        }
        out
    };
    let write = |chunk: u64| pool.write(disk, chunk * CS, &[chunk as u8; 4096]).unwrap();
    let s1 = pool.snapshot("disk@s1").unwrap();
    write(1);
    write(3);
    let s2 = pool.snapshot("disk@s2").unwrap();
    write(3);
    write(5);
    let s3 = pool.snapshot("disk@s3").unwrap();
    assert_eq!(chunks(s1, s2), [1, 3]);
    assert_eq!(chunks(s2, s1), [1, 3]);
    assert_eq!(chunks(s2, s3), [3, 5]);
    assert_eq!(chunks(s1, s3), [1, 3, 5]);
    assert_eq!(chunks(s3, disk), [0u64; 0]);
    write(7);
    assert_eq!(chunks(s3, disk), [7]);
    assert_eq!(chunks(disk, s1), [1, 3, 5, 7]);
    assert_eq!(chunks(disk, disk), [0u64; 0]);
    // A window sees only its chunks.
    assert_eq!(
        pool.diff_in(s1, disk, 2 * CS, 6 * CS).unwrap(),
        [(3 * CS, CS), (5 * CS, CS)]
    );
    let clone = pool.clone_snapshot("disk@s2", "c").unwrap();
    pool.write(clone, 9 * CS, &[9u8; 4096]).unwrap();
    assert_eq!(chunks(s2, clone), [9]);
    assert_eq!(chunks(s1, clone), [1, 3, 9]);
    assert_eq!(chunks(disk, clone), [3, 5, 7, 9]);
    // What reads through an epoch changes only in its tree.
    assert_eq!(pool.changed_since(clone, 0).unwrap(), [(9 * CS, CS)]);
    let err = pool.changed_since(disk, 0).unwrap_err();
    assert!(err.to_string().contains("copy-on-write"), "{err}");
    // Another layout: refused, with both names.
    let plain = pool.create_volume("plain", ORIGIN).unwrap();
    let err = pool.diff(plain, s1).unwrap_err();
    assert!(
        matches!(err, Error::Refused(Refusal::Unsupported(_))),
        "{err}"
    );
    assert!(err.to_string().contains("plain and disk@s1"), "{err}");
    assert!(pool.check_diff(s1, clone).is_ok());
}

/// An origin grows: its device is enlarged (a file by arbor, a block device
/// beforehand with its own tools), then the new size recorded; its
/// snapshots keep their size and content. A power cut between the two
/// leaves a larger device, which attaches with the recorded size, and the
/// resize runs again. It never shrinks (an in-pool home's growth is in
/// `big_home.rs`).
#[test]
fn an_origin_grows_and_its_snapshots_keep_their_size() {
    let (disk, pool, origin, id) = attached();
    let snap = pool.snapshot("disk@a").unwrap();
    pool.write(id, 0, &[2u8; 4096]).unwrap();
    pool.resize("disk", 2 * ORIGIN).unwrap();
    assert_eq!(origin.size(), 2 * ORIGIN);
    assert_eq!(pool.info(id).unwrap().size, 2 * ORIGIN);
    assert_eq!(pool.info(snap).unwrap().size, ORIGIN);
    // The new part reads as the device has it (zeros, for a file), and
    // takes writes. While a snapshot from before the growth lives, a first
    // write there still copies its chunk once (no epoch's size is kept to
    // tell that none of them can see it): space, never content.
    let mut tail = vec![1u8; 8192];
    pool.read(id, ORIGIN, &mut tail).unwrap();
    assert!(tail.iter().all(|&b| b == 0));
    pool.write(id, ORIGIN + 4096, &[3u8; 4096]).unwrap();
    match pool.info(id).unwrap().layout {
        VolumeLayout::CowExternal { store_bytes, .. } => assert_eq!(store_bytes, 2 * CS),
        other => panic!("{other:?}"),
    }
    assert_eq!(read(&pool, snap, ORIGIN), fill(1, ORIGIN as usize));
    let mut want = fill(1, ORIGIN as usize);
    want[..4096].fill(2);
    want.resize(2 * ORIGIN as usize, 0);
    want[ORIGIN as usize + 4096..ORIGIN as usize + 8192].fill(3);
    assert_eq!(read(&pool, id, 2 * ORIGIN), want);
    assert_eq!(origin.handle().visible_image(), want);
    // Never smaller; the same size is nothing to do.
    assert!(matches!(
        pool.resize("disk", ORIGIN),
        Err(Error::Refused(Refusal::Unsupported(_)))
    ));
    pool.resize("disk", 2 * ORIGIN).unwrap();
    // A device grown and a size not recorded (a power cut between them):
    // attached with the recorded size, and the resize runs again.
    pool.flush().unwrap();
    origin.extend(3 * ORIGIN).unwrap();
    drop(pool);
    let pool = reopen(&disk);
    let dev: Arc<dyn BlockDevice> = Arc::new(origin.clone());
    pool.attach_origin("disk", dev, identity(1)).unwrap();
    assert_eq!(pool.info(id).unwrap().size, 2 * ORIGIN);
    assert_eq!(read(&pool, id, 2 * ORIGIN), want);
    pool.resize("disk", 3 * ORIGIN).unwrap();
    assert_eq!(pool.info(id).unwrap().size, 3 * ORIGIN);
    assert_eq!(read(&pool, snap, ORIGIN), fill(1, ORIGIN as usize));
    // A clone of the snapshot stays its size; an in-pool home grows in
    // place (tests/big_home.rs).
    pool.clone_snapshot("disk@a", "c").unwrap();
    assert!(matches!(
        pool.resize("c", 2 * ORIGIN),
        Err(Error::Refused(Refusal::Unsupported(_)))
    ));
    let home = pool.create_cow_volume("home", 64 * 1024).unwrap();
    pool.resize("home", 128 * 1024).unwrap();
    assert_eq!(pool.info(home).unwrap().size, 128 * 1024);
    assert_clean(&pool);
}

/// A power cut at any point of an origin's growth: the pool opens, the
/// device (enlarged at once, like a file's size) attaches, and the volume
/// has its old size or its new one, with its content and its snapshot's
/// intact; the growth then runs again to the end.
#[test]
fn a_power_cut_during_an_origins_growth_leaves_the_old_or_the_new_size() {
    use rand::{rngs::StdRng, SeedableRng};
    let mut rng = StdRng::seed_from_u64(16);
    let mut seen = (false, false);
    for cut in 0.. {
        let (disk, pool, origin, id) = attached();
        let snap = pool.snapshot("disk@a").unwrap();
        pool.write(id, 0, &[2u8; 8192]).unwrap();
        pool.flush().unwrap();
        let mut want = fill(1, ORIGIN as usize);
        want[..8192].fill(2);
        disk.handle().cut_power_after(cut);
        let result = pool.resize("disk", 2 * ORIGIN);
        let finished = result.is_ok() && disk.handle().is_powered();
        disk.handle().cut_power();
        drop(pool);
        for round in 0..3 {
            let image = if round == 0 {
                disk.handle().durable_image()
            } else {
                disk.handle().crash_image(&mut rng)
            };
            let pool = Pool::open(Arc::new(SimDisk::from_image(image)), &open_opts())
                .unwrap_or_else(|e| panic!("cut {cut}: {e}"));
            let device = SimDisk::from_image(origin.handle().durable_image());
            let dev: Arc<dyn BlockDevice> = Arc::new(device.clone());
            pool.attach_origin("disk", dev, identity(1))
                .unwrap_or_else(|e| panic!("cut {cut}: attach: {e}"));
            let size = pool.info(id).unwrap().size;
            match size {
                s if s == ORIGIN => seen.0 = true,
                s if s == 2 * ORIGIN => seen.1 = true,
                other => panic!("cut {cut}: size {other}"),
            }
            assert!(
                !finished || size == 2 * ORIGIN,
                "cut {cut}: returned, then lost"
            );
            assert_eq!(read(&pool, id, ORIGIN), want, "cut {cut}");
            assert_eq!(
                read(&pool, snap, ORIGIN),
                fill(1, ORIGIN as usize),
                "cut {cut}"
            );
            pool.resize("disk", 2 * ORIGIN).unwrap();
            assert_eq!(pool.info(id).unwrap().size, 2 * ORIGIN);
            assert_clean(&pool);
        }
        if finished {
            break;
        }
    }
    assert!(seen.0 && seen.1, "cuts saw both sizes: {seen:?}");
}

/// Whether an origin was written since a snapshot: no copy covers the
/// snapshot's epoch until a write after it, whatever chunk it hits.
#[test]
fn an_origin_is_unchanged_since_a_snapshot_until_written() {
    let (_disk, pool, _origin, disk) = attached();
    let s1 = pool.snapshot("disk@s1").unwrap();
    assert!(pool.unchanged_since(disk, s1).unwrap());
    pool.write(disk, 5 * CS, &[1u8; 512]).unwrap();
    assert!(!pool.unchanged_since(disk, s1).unwrap());
    let s2 = pool.snapshot("disk@s2").unwrap();
    assert!(pool.unchanged_since(disk, s2).unwrap());
    assert!(!pool.unchanged_since(disk, s1).unwrap());
    // A chunk copied already for an older epoch: still a copy for s2.
    pool.write(disk, 5 * CS, &[2u8; 512]).unwrap();
    assert!(!pool.unchanged_since(disk, s2).unwrap());
    // A clone of s2 reads through s2's epoch, which the write changed.
    let c = pool.clone_snapshot("disk@s2", "c").unwrap();
    assert!(!pool.unchanged_since(disk, c).unwrap());
    // Ordinary volumes: as same_tree.
    let v = pool.create_volume("v", MIB).unwrap();
    let vs = pool.snapshot("v@s").unwrap();
    assert!(pool.unchanged_since(v, vs).unwrap());
    pool.write(v, 0, &[1u8; 512]).unwrap();
    assert!(!pool.unchanged_since(v, vs).unwrap());
}

/// An origin copied into the pool (`origin detach --copy-to-pool`): the
/// device is flushed and left as it was, a plain raw disk no later write
/// touches; the volume stays, its home now in the pool, with its
/// snapshots and clones reading exactly what they did, after a reopen
/// without the device too; destroyed, all of it comes back.
#[test]
fn an_origin_copied_to_the_pool_keeps_its_snapshots_and_clones_and_frees_its_device() {
    let (disk, pool, origin, id) = attached();
    // Freed chunks holding data, where the new home may land.
    let junk = pool.create_volume("junk", MIB).unwrap();
    pool.write(junk, 0, &[0xee; MIB as usize]).unwrap();
    pool.delete("junk").unwrap();
    while pool.reclaim(1024).unwrap() > 0 {}
    let base = pool.pool_stats().unwrap().data_used_bytes;
    pool.snapshot("disk@s1").unwrap();
    pool.write(id, 4096, &[2u8; 8192]).unwrap();
    let c = pool.clone_snapshot("disk@s1", "c").unwrap();
    pool.write(c, 0, &[3u8; 4096]).unwrap();
    pool.snapshot("disk@s2").unwrap();
    pool.write(id, 64 * 1024, &[4u8; 4096]).unwrap();
    let v1 = fill(1, ORIGIN as usize);
    let mut vc = v1.clone();
    vc[..4096].fill(3);
    let mut v2 = v1.clone();
    v2[4096..12288].fill(2);
    let mut now = v2.clone();
    now[64 * 1024..68 * 1024].fill(4);
    let copies = pool.pool_stats().unwrap().data_used_bytes - base;
    // Unflushed writes on the device: the copy flushes it.
    assert_ne!(origin.handle().durable_image(), now);

    pool.copy_origin_to_pool("disk").unwrap();
    assert_eq!(origin.handle().durable_image(), now, "flushed");
    assert!(matches!(
        pool.info(id).unwrap().layout,
        VolumeLayout::CowInPool { .. }
    ));
    assert!(pool.origins().unwrap().is_empty());
    assert_eq!(
        pool.pool_stats().unwrap().data_used_bytes,
        base + copies + ORIGIN
    );
    let check = |pool: &Pool, now: &[u8], v2: &[u8]| {
        assert_eq!(read(pool, pool.lookup("disk").unwrap(), ORIGIN), now);
        assert_eq!(read(pool, pool.lookup("disk@s1").unwrap(), ORIGIN), v1);
        assert_eq!(read(pool, pool.lookup("disk@s2").unwrap(), ORIGIN), v2);
        assert_eq!(read(pool, pool.lookup("c").unwrap(), ORIGIN), vc);
        assert_clean(pool);
    };
    check(&pool, &now, &v2);
    // Writes go to the pool's copy (taking copies for the snapshots), never
    // to the device.
    pool.write(id, 0, &[5u8; 4096]).unwrap();
    pool.write(id, 8192, &[6u8; 4096]).unwrap();
    now[..4096].fill(5);
    now[8192..12288].fill(6);
    pool.flush().unwrap();
    check(&pool, &now, &v2);
    assert_eq!(origin.handle().visible_image(), {
        let mut was = v2.clone();
        was[64 * 1024..68 * 1024].fill(4);
        was
    });
    // It is not an origin any more: no device to attach, none needed.
    drop(pool);
    let pool = reopen(&disk);
    check(&pool, &now, &v2);
    let dev: Arc<dyn BlockDevice> = Arc::new(origin.clone());
    assert!(pool.attach_origin("disk", dev, identity(1)).is_err());
    // Rollback works on the new home.
    pool.rollback("disk", "disk@s2").unwrap();
    now = v2.clone();
    check(&pool, &now, &v2);
    for name in ["c", "disk@s1", "disk@s2", "disk"] {
        pool.delete(name).unwrap();
    }
    while pool.reclaim(1024).unwrap() > 0 {}
    assert_eq!(pool.pool_stats().unwrap().data_used_bytes, 0);
    assert_clean(&pool);
}

/// With no free run of the volume's size in the pool, the copy fails with
/// no space and changes nothing: the device stays attached and written
/// through, the snapshot as it was.
#[test]
fn an_origin_with_no_room_in_the_pool_stays_attached() {
    let (_disk, pool, origin, id) = attached();
    pool.snapshot("disk@a").unwrap();
    fill_pool(&pool);
    let used = pool.pool_stats().unwrap().data_used_bytes;
    assert!(matches!(
        pool.copy_origin_to_pool("disk"),
        Err(Error::Exhausted(Resource::DataSpace))
    ));
    assert_eq!(pool.pool_stats().unwrap().data_used_bytes, used);
    assert!(!pool.pool_stats().unwrap().reclaim_pending);
    assert!(matches!(
        pool.info(id).unwrap().layout,
        VolumeLayout::CowExternal { .. }
    ));
    assert_eq!(pool.origins().unwrap().len(), 1);
    pool.delete("filler").unwrap();
    while pool.reclaim(1024).unwrap() > 0 {}
    pool.write(id, 0, &[9u8; 4096]).unwrap();
    assert_eq!(&origin.handle().visible_image()[..4096], &[9u8; 4096]);
    let snap = pool.lookup("disk@a").unwrap();
    assert_eq!(read(&pool, snap, ORIGIN), fill(1, ORIGIN as usize));
    assert_clean(&pool);
}

/// A power cut at every write or flush of the pool during the copy: the
/// volume opens as the origin (its device attached again, as before) or
/// with its home in the pool (no device needed), reading its content
/// either way, its snapshot its point in time; reclaim frees whatever the
/// copy left; and the copy runs again from there.
#[test]
fn a_power_cut_while_an_origin_is_copied_to_the_pool_leaves_it_attached_or_copied() {
    use rand::{rngs::StdRng, SeedableRng};
    let mut rng = StdRng::seed_from_u64(17);
    let (mut attached_seen, mut copied_seen) = (0, 0);
    for cut in 0.. {
        let (disk, pool, origin, id) = attached();
        let snap = pool.snapshot("disk@a").unwrap();
        pool.write(id, 0, &[2u8; 8192]).unwrap();
        pool.flush().unwrap();
        let base = pool.pool_stats().unwrap().data_used_bytes;
        let mut want = fill(1, ORIGIN as usize);
        want[..8192].fill(2);
        disk.handle().cut_power_after(cut);
        let finished = pool.copy_origin_to_pool("disk").is_ok() && disk.handle().is_powered();
        disk.handle().cut_power();
        drop(pool);
        for round in 0..3 {
            let image = if round == 0 {
                disk.handle().durable_image()
            } else {
                disk.handle().crash_image(&mut rng)
            };
            let pool = Pool::open(Arc::new(SimDisk::from_image(image)), &open_opts())
                .unwrap_or_else(|e| panic!("cut {cut}: {e}"));
            assert_clean(&pool);
            let home = match pool.info(id).unwrap().layout {
                VolumeLayout::CowExternal { .. } => {
                    assert!(!finished, "cut {cut}: a copy that returned was lost");
                    attached_seen += 1;
                    let dev: Arc<dyn BlockDevice> =
                        Arc::new(SimDisk::from_image(origin.handle().durable_image()));
                    pool.attach_origin("disk", dev, identity(1))
                        .unwrap_or_else(|e| panic!("cut {cut}: attach: {e}"));
                    0
                }
                VolumeLayout::CowInPool { .. } => {
                    copied_seen += 1;
                    ORIGIN
                }
                other => panic!("cut {cut}: {other:?}"),
            };
            assert_eq!(read(&pool, id, ORIGIN), want, "cut {cut}");
            assert_eq!(
                read(&pool, snap, ORIGIN),
                fill(1, ORIGIN as usize),
                "cut {cut}"
            );
            while pool.reclaim(1024).unwrap() > 0 {}
            assert_eq!(
                pool.pool_stats().unwrap().data_used_bytes,
                base + home,
                "cut {cut}"
            );
            assert_clean(&pool);
            if home == 0 {
                pool.copy_origin_to_pool("disk").unwrap();
                assert_eq!(read(&pool, id, ORIGIN), want, "cut {cut}");
                assert_clean(&pool);
            }
        }
        if finished {
            break;
        }
    }
    assert!(
        attached_seen > 0 && copied_seen > 0,
        "attached {attached_seen}, copied {copied_seen}"
    );
}

/// A device that runs a hook once: before the first read of exactly
/// `read_len` bytes (`on_read`), or at the first flush (`on_flush`).
#[derive(Default)]
struct Hooks {
    on_read: std::sync::Mutex<Option<(usize, Hook)>>,
    on_flush: std::sync::Mutex<Option<Hook>>,
}

type Hook = Box<dyn FnOnce() + Send>;

struct HookedDisk {
    disk: SimDisk,
    hooks: Arc<Hooks>,
}

impl BlockDevice for HookedDisk {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        let hook = {
            let mut armed = self.hooks.on_read.lock().unwrap();
            match armed.take() {
                Some((len, hook)) if len == buf.len() => Some(hook),
                other => {
                    *armed = other;
                    None
                }
            }
        };
        if let Some(hook) = hook {
            hook();
        }
        self.disk.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.disk.write_at(buf, offset)
    }
    fn flush(&self) -> std::io::Result<()> {
        let hook = self.hooks.on_flush.lock().unwrap().take();
        if let Some(hook) = hook {
            hook();
        }
        self.disk.flush()
    }
    fn size(&self) -> u64 {
        self.disk.size()
    }
}

/// A snapshot's read that found the origin's device just before a copy
/// into the pool replaced it finishes before the copy returns, so before
/// the daemon closes the device and anything else may write it. The read
/// begins while the copy's commit flushes the pool and is paused in its
/// read of the device; the copy goes on meanwhile. (Without the wait, the
/// copy returned, the device was written by "another program", and the
/// snapshot read that.)
#[test]
fn a_snapshot_read_of_the_device_finishes_before_the_copy_to_the_pool_returns() {
    use std::sync::mpsc::channel;
    use std::sync::Mutex;
    let guard = std::time::Duration::from_secs(60);
    const READ: usize = 64 * 1024;
    let pool_hooks = Arc::new(Hooks::default());
    let pool_dev: Arc<dyn BlockDevice> = Arc::new(HookedDisk {
        disk: SimDisk::new(32 * MIB),
        hooks: pool_hooks.clone(),
    });
    let pool = Arc::new(Pool::create(pool_dev, &small_opts(CS as u32), &open_opts()).unwrap());
    let origin = SimDisk::from_image(fill(1, ORIGIN as usize));
    let origin_hooks = Arc::new(Hooks::default());
    let dev: Arc<dyn BlockDevice> = Arc::new(HookedDisk {
        disk: origin.clone(),
        hooks: origin_hooks.clone(),
    });
    pool.attach_origin("disk", dev, identity(1)).unwrap();
    pool.snapshot("disk@s").unwrap();

    // The copy's commit, paused at its first flush until the reader is in
    // its read of the device.
    let (in_flush, flushing) = channel();
    let (reader_in, reading) = channel::<()>();
    let reading = Mutex::new(reading);
    *pool_hooks.on_flush.lock().unwrap() = Some(Box::new(move || {
        in_flush.send(()).unwrap();
        reading
            .lock()
            .unwrap()
            .recv_timeout(guard)
            .expect("the reader never read");
    }));
    let copier = {
        let pool = pool.clone();
        std::thread::spawn(move || pool.copy_origin_to_pool("disk"))
    };
    flushing
        .recv_timeout(guard)
        .expect("the copy never committed");
    let (go_tx, go) = channel::<()>();
    let go = Mutex::new(go);
    *origin_hooks.on_read.lock().unwrap() = Some((
        READ,
        Box::new(move || {
            reader_in.send(()).unwrap();
            go.lock()
                .unwrap()
                .recv_timeout(guard)
                .expect("never let go");
        }),
    ));
    let reader = {
        let pool = pool.clone();
        std::thread::spawn(move || {
            let mut buf = vec![0u8; READ];
            pool.read(pool.lookup("disk@s").unwrap(), 0, &mut buf)
                .unwrap();
            buf
        })
    };
    // The reader is in its read of the device, the copy goes on: once it
    // has returned, the device is another program's to write.
    for _ in 0..500 {
        if copier.is_finished() {
            origin.write_at(&[0xee; READ], 0).unwrap();
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    go_tx.send(()).unwrap();
    let got = reader.join().unwrap();
    assert!(
        got[..] == fill(1, ORIGIN as usize)[..READ],
        "the snapshot read what was written to the device after the copy returned"
    );
    copier.join().unwrap().unwrap();
    let snap = pool.lookup("disk@s").unwrap();
    assert_eq!(read(&pool, snap, ORIGIN), fill(1, ORIGIN as usize));
    assert_clean(&pool);
}

/// The store's copies are the pool's data (FORMAT.md §6.4): each gets sums
/// when it is made; a damaged copy fails the reads of every snapshot and
/// clone that reads it (never its bytes), is listed with them and found
/// by a scrub; a clone's partial write that would copy it and a rollback
/// that would write it back to the device fail rather than pass it on;
/// healed with the good bytes, everything reads and the rollback goes.
#[test]
fn store_copies_are_checksummed_verified_listed_and_healed() {
    let (pool_disk, pool, origin, disk) = attached();
    let before = read(&pool, disk, ORIGIN);
    let s1 = pool.snapshot("disk@s1").unwrap();
    let c = pool.clone_snapshot("disk@s1", "c").unwrap();
    // Chunk 1 overwritten: its old content copied into the store.
    pool.write(disk, CS, &[9u8; CS as usize]).unwrap();
    pool.flush().unwrap();
    let good = before[CS as usize..2 * CS as usize].to_vec();
    let image = pool_disk.handle().visible_image();
    let at = image
        .chunks(CS as usize)
        .position(|b| b == good)
        .expect("the copy is in the pool") as u64
        * CS;
    let mut bad = good.clone();
    bad[77] ^= 0x20;
    pool_disk.write_at(&bad, at).unwrap();
    pool_disk.flush().unwrap();

    let mut buf = vec![0u8; CS as usize];
    for id in [s1, c] {
        assert!(matches!(
            pool.read(id, CS, &mut buf),
            Err(Error::Damaged(_))
        ));
        // Chunk 0 reads from the device, which has no sums.
        pool.read(id, 0, &mut buf).unwrap();
        assert_eq!(buf, before[..CS as usize]);
    }
    let report = pool.damage().unwrap();
    assert_eq!(report.blocks.len(), 1);
    let mut readers = report.blocks[0].readers.clone();
    readers.sort();
    assert_eq!(
        readers,
        [("c".to_string(), CS), ("disk@s1".to_string(), CS)]
    );
    assert_eq!(pool.damaged_in(s1).unwrap(), [CS]);
    assert_eq!(pool.damaged_in(c).unwrap(), [CS]);
    let mut from = 0;
    let mut found = 0;
    loop {
        let step = pool.scrub_step(from, 1 << 20).unwrap();
        found += step.damaged_blocks;
        if step.next >= step.data_chunks {
            break;
        }
        from = step.next;
    }
    assert_eq!(found, 1, "the scrub reads the store's copies");
    // Passing the damage on: refused.
    assert!(matches!(
        pool.write(c, CS + 512, &[5u8; 512]),
        Err(Error::Damaged(_))
    ));
    let device = origin.handle().visible_image();
    assert!(matches!(
        pool.rollback("disk", "disk@s1"),
        Err(Error::Damaged(_))
    ));
    assert_eq!(
        origin.handle().visible_image()[CS as usize..2 * CS as usize],
        device[CS as usize..2 * CS as usize],
        "the damaged copy was not written back to the device"
    );
    // Healed through the snapshot: the clone reads it too.
    let healed = pool.heal(s1, CS, &good).unwrap();
    assert_eq!((healed.healed, healed.rejected), (1, 0));
    for id in [s1, c] {
        pool.read(id, CS, &mut buf).unwrap();
        assert_eq!(buf, good);
    }
    assert!(pool.damage().unwrap().is_empty());
    pool.rollback("disk", "disk@s1").unwrap();
    assert_eq!(read(&pool, disk, ORIGIN), before);
    assert_eq!(origin.handle().visible_image(), before);
    assert_clean(&pool);
}
