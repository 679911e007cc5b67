//! Copy-on-write volumes whose home in the pool is bigger than one commit
//! can allocate or free (`--layout cow`; docs/FORMAT.md §6.1, "Homes larger
//! than one commit"): built a commit at a time as a hidden loose home that
//! takes the volume's name in its last commit, and freed by reclaim a step
//! at a time. A power cut at any point leaves the volume whole or absent,
//! and whatever it leaves behind is freed by reclaim.
// A test crate: unwrap, expect and panic are how a test reports failure
// (the workspace denies them in the code it ships; clippy.toml allows
// them in #[test] functions, this in the helpers around them).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;

use arbor_engine::{CreateOptions, Pool, VolumeId};
use arbor_io::{BlockDevice, SimDisk};
use common::*;
use rand::rngs::StdRng;
use rand::SeedableRng;

const CS: u64 = 4096;

/// A pool whose commits journal 16 space-map pages: a home is built in
/// steps of 8 pages (8,160 chunks, about 32 MiB) and freed in steps of
/// 4 pages' worth (4,080 chunks).
fn small_journal_pool(disk: &SimDisk) -> Pool {
    common::small_journal_pool(disk, CS as u32)
}

fn open(image: Vec<u8>) -> (SimDisk, Pool) {
    let disk = SimDisk::from_image(image);
    let pool = reopen(&disk);
    (disk, pool)
}

fn data_free(pool: &Pool) -> u64 {
    let stats = pool.pool_stats().unwrap();
    stats.data_bytes - stats.data_used_bytes
}

fn reclaim_all(pool: &Pool) {
    while pool.reclaim(1000).expect("reclaim") > 0 {}
    assert!(!pool.pool_stats().unwrap().reclaim_pending);
}

fn names(pool: &Pool) -> Vec<String> {
    pool.list().unwrap().into_iter().map(|i| i.name).collect()
}

fn read_at(pool: &Pool, id: VolumeId, offset: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    pool.read(id, offset, &mut buf).unwrap();
    buf
}

#[test]
fn a_home_bigger_than_one_commit_is_built_in_steps_and_freed_by_reclaim() {
    let disk = SimDisk::new(160 * MIB);
    let pool = small_journal_pool(&disk);
    let base = data_used(&pool);
    // 25,600 chunks: three full steps and a part, with a partial last chunk.
    let size = 100 * MIB - 512;
    let txn = pool.pool_stats().unwrap().txn;
    let id = pool.create_cow_volume("big", size).unwrap();
    assert!(
        pool.pool_stats().unwrap().txn >= txn + 5,
        "not built in steps"
    );
    assert_eq!(names(&pool), ["big"]);
    assert_eq!(pool.info(id).unwrap().size, size);
    assert_eq!(data_used(&pool), base + (100 * MIB));
    assert!(!pool.pool_stats().unwrap().reclaim_pending);
    assert_clean(&pool);

    // It works as any copy-on-write volume: writes at both ends, a snapshot
    // that keeps its point in time.
    let last = size - 8192;
    pool.write(id, 0, &pattern(1, 0, 8192)).unwrap();
    pool.write(id, last, &pattern(2, last, 8192)).unwrap();
    pool.snapshot("big@s").unwrap();
    pool.write(id, 0, &pattern(3, 0, 4096)).unwrap();
    let snap = pool.lookup("big@s").unwrap();
    assert_eq!(read_at(&pool, snap, 0, 8192), pattern(1, 0, 8192));
    assert_eq!(read_at(&pool, id, 0, 4096), pattern(3, 0, 4096));
    assert_eq!(read_at(&pool, id, last, 8192), pattern(2, last, 8192));
    assert_eq!(read_at(&pool, id, MIB, 4096), vec![0; 4096]);
    pool.flush().unwrap();
    drop(pool);
    let pool = reopen(&disk);
    assert_clean(&pool);
    let id = pool.lookup("big").unwrap();
    assert_eq!(read_at(&pool, id, last, 8192), pattern(2, last, 8192));

    // Destroyed, its home goes to reclaim, which frees it a step at a time.
    pool.delete("big@s").unwrap();
    pool.delete("big").unwrap();
    assert!(names(&pool).is_empty());
    assert!(pool.pool_stats().unwrap().reclaim_pending);
    assert_clean(&pool);
    let mut steps = 0;
    while pool.reclaim(1).unwrap() > 0 {
        steps += 1;
        assert_clean(&pool);
    }
    assert!(steps >= 7, "freed in {steps} steps");
    assert_eq!(data_used(&pool), base);
    assert!(!pool.pool_stats().unwrap().reclaim_pending);

    // The space is whole again: the same home fits once more.
    pool.create_cow_volume("again", size).unwrap();
    assert_clean(&pool);
}

/// Runs `op` on a fresh small-journal pool (made ready by `setup`, then
/// flushed) with a power cut after its first `cut` device writes and
/// flushes, for `cut` = 0, 1, ... until `op` returns before the cut (at
/// least 11 of them: `op` takes several commits). `check(cut, pool,
/// returned, base)` sees the durable image and one crash image of each
/// cut, opened and checked clean; `returned`: `op` had returned with
/// power on; `base`: the pool's data bytes used before `op`.
fn cut_at_every_point(
    seed: u64,
    setup: impl Fn(&Pool),
    op: impl Fn(&Pool) -> bool,
    mut check: impl FnMut(u64, &Pool, bool, u64),
) {
    let mut rng = StdRng::seed_from_u64(seed);
    for cut in 0.. {
        let disk = SimDisk::new(64 * MIB);
        let pool = small_journal_pool(&disk);
        setup(&pool);
        pool.flush().unwrap();
        let base = data_used(&pool);
        let handle = disk.handle();
        handle.cut_power_after(cut);
        let returned = op(&pool) && handle.is_powered();
        handle.cut_power();
        for image in [handle.durable_image(), handle.crash_image(&mut rng)] {
            let (_disk2, pool2) = open(image);
            assert_clean(&pool2);
            check(cut, &pool2, returned, base);
            assert_clean(&pool2);
        }
        if returned {
            assert!(cut > 10, "it takes several commits");
            break;
        }
    }
}

/// A power cut at every write or flush of the build (and torn or partial
/// unflushed writes): the pool opens clean with the volume whole (every
/// chunk zero, its full size) or absent, and reclaim then frees whatever
/// the build left, so the pool's space is exactly what it was, or that
/// plus the home.
#[test]
fn a_power_cut_during_a_build_leaves_the_volume_whole_or_absent() {
    let size = 40 * MIB; // two steps: 8,160 chunks and 2,080
    let (mut absent, mut whole) = (0, 0);
    cut_at_every_point(
        41,
        |pool| {
            let v = pool.create_volume("v", MIB).unwrap();
            pool.write(v, 0, &pattern(5, 0, 8192)).unwrap();
        },
        |pool| pool.create_cow_volume("big", size).is_ok(),
        |cut, pool2, built, base| {
            let present = match pool2.lookup("big") {
                Ok(id) => {
                    whole += 1;
                    assert_eq!(pool2.info(id).unwrap().size, size, "cut {cut}");
                    for at in [0, size / 2, size - 4096] {
                        assert_eq!(read_at(pool2, id, at, 4096), vec![0; 4096], "cut {cut}");
                    }
                    true
                }
                Err(_) => {
                    assert!(!built, "cut {cut}: a build that returned was lost");
                    absent += 1;
                    false
                }
            };
            assert_eq!(names(pool2).len(), 1 + usize::from(present));
            reclaim_all(pool2);
            let home = if present { size } else { 0 };
            assert_eq!(data_used(pool2), base + home, "cut {cut}");
            assert_clean(pool2);
            let v = pool2.lookup("v").unwrap();
            assert_eq!(read_at(pool2, v, 0, 8192), pattern(5, 0, 8192));
            // Then the space is whole again: room for the same home.
            if present {
                pool2.delete("big").unwrap();
                reclaim_all(pool2);
                assert_eq!(data_used(pool2), base, "cut {cut}");
            }
            pool2.create_cow_volume("next", size).unwrap();
        },
    );
    assert!(absent > 0 && whole > 0, "absent {absent}, whole {whole}");
}

/// A power cut in the middle of freeing a loose home: the pool opens
/// clean, and reclaim goes on until all of it is free.
#[test]
fn a_power_cut_while_a_home_is_freed_loses_nothing_and_leaks_nothing() {
    let disk = SimDisk::new(64 * MIB);
    let pool = small_journal_pool(&disk);
    let base = data_used(&pool);
    pool.create_cow_volume("big", 40 * MIB).unwrap();
    let v = pool.create_volume("v", MIB).unwrap();
    pool.write(v, 0, &pattern(6, 0, 4096)).unwrap();
    pool.delete("big").unwrap();
    pool.flush().unwrap();
    let mut images = Vec::new();
    while pool.reclaim(1).unwrap() > 0 {
        images.push(disk.handle().durable_image());
    }
    assert!(images.len() >= 3, "freed in {} steps", images.len());
    let v_chunks = data_used(&pool) - base;
    let last = images.len() - 1;
    for (i, image) in images.into_iter().enumerate() {
        let (_disk2, pool2) = open(image);
        assert_clean(&pool2);
        assert!(i == last || pool2.pool_stats().unwrap().reclaim_pending);
        reclaim_all(&pool2);
        assert_eq!(data_used(&pool2), base + v_chunks);
        assert_eq!(
            read_at(&pool2, pool2.lookup("v").unwrap(), 0, 4096),
            pattern(6, 0, 4096)
        );
        assert_clean(&pool2);
    }
}

/// A device that runs `hook` once: at the first write of 1 MiB or more
/// (the zeroing of a home, which holds no lock of the pool's), or with
/// `at_flush`, at the first flush (a commit's phase B, which holds only
/// the commit lock). Its writes of 1 MiB or more (a home's zeroing or
/// copy) fail while `fail_big` is set.
struct Hooked {
    disk: SimDisk,
    hook: std::sync::Mutex<Option<Box<dyn FnOnce() + Send>>>,
    at_flush: bool,
    fail_big: std::sync::atomic::AtomicBool,
}

impl Hooked {
    fn run_hook(&self) {
        let hook = self.hook.lock().unwrap().take();
        if let Some(hook) = hook {
            hook();
        }
    }
}

impl BlockDevice for Hooked {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.disk.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        if !self.at_flush && buf.len() >= MIB as usize {
            self.run_hook();
            if self.fail_big.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(std::io::Error::other("injected write failure"));
            }
        }
        self.disk.write_at(buf, offset)
    }
    fn flush(&self) -> std::io::Result<()> {
        if self.at_flush {
            self.run_hook();
        }
        self.disk.flush()
    }
    fn size(&self) -> u64 {
        self.disk.size()
    }
}

/// A small-journal pool (as [`small_journal_pool`]) on a [`Hooked`] device.
fn hooked_pool(size: u64, at_flush: bool) -> (SimDisk, Arc<Hooked>, Arc<Pool>) {
    let disk = SimDisk::new(size);
    let hooked = Arc::new(Hooked {
        disk: disk.clone(),
        hook: std::sync::Mutex::new(None),
        at_flush,
        fail_big: false.into(),
    });
    let dev: Arc<dyn BlockDevice> = hooked.clone();
    let opts = CreateOptions {
        chunk_size: CS as u32,
        metadata_bytes: Some(4 * MIB),
        journal_pages: Some(16),
        ..Default::default()
    };
    let pool = Arc::new(Pool::create(dev, &opts, &open_opts()).unwrap());
    (disk, hooked, pool)
}

/// A build that fails at its last step (its name was taken meanwhile)
/// frees what it allocated before it returns: no trace, nothing pending.
#[test]
fn a_build_that_fails_leaves_no_trace() {
    let (disk, hooked, pool) = hooked_pool(64 * MIB, false);
    let base = data_used(&pool);
    let weak = Arc::downgrade(&pool);
    *hooked.hook.lock().unwrap() = Some(Box::new(move || {
        let pool = weak.upgrade().unwrap();
        pool.create_volume("big", MIB).unwrap();
    }));
    match pool.create_cow_volume("big", 40 * MIB) {
        Err(arbor_engine::Error::Refused(arbor_engine::Refusal::AlreadyExists(_))) => {}
        other => panic!("{other:?}"),
    }
    assert!(
        hooked.hook.lock().unwrap().is_none(),
        "the hook did not run"
    );
    assert_eq!(names(&pool), ["big"]);
    assert_eq!(data_used(&pool), base);
    assert!(!pool.pool_stats().unwrap().reclaim_pending);
    assert_clean(&pool);
    pool.create_cow_volume("other", 40 * MIB).unwrap();
    assert_clean(&pool);
    drop(pool);
    let pool = reopen(&disk);
    assert_eq!(names(&pool), ["big", "other"]);
    assert_clean(&pool);
}

/// A home in the pool grows in place into the free chunks after it: in
/// one commit when they fit one, else built in steps and joined in the
/// last. The volume keeps its data, reads zeros in the new part, and its
/// snapshot keeps its size and content. (Its copies are allocated after
/// the growths: where they land, the home could not grow any more.)
#[test]
fn a_home_grows_in_place_into_the_free_chunks_after_it() {
    let disk = SimDisk::new(128 * MIB);
    let pool = small_journal_pool(&disk);
    let base = data_used(&pool);
    let a = pool.create_cow_volume("a", MIB).unwrap();
    pool.write(a, 0, &pattern(1, 0, MIB as usize)).unwrap();
    pool.snapshot("a@s").unwrap();

    // 512 chunks more: one commit.
    pool.resize("a", 3 * MIB).unwrap();
    assert_eq!(pool.info(a).unwrap().size, 3 * MIB);
    assert_eq!(read_at(&pool, a, MIB, 4096), vec![0; 4096]);
    assert_clean(&pool);

    // 14,592 chunks more: two steps into a loose home, then joined.
    let txn = pool.pool_stats().unwrap().txn;
    pool.resize("a", 60 * MIB).unwrap();
    assert!(
        pool.pool_stats().unwrap().txn >= txn + 3,
        "not grown in steps"
    );
    assert_eq!(names(&pool), ["a", "a@s"]);
    assert!(!pool.pool_stats().unwrap().reclaim_pending);
    assert_eq!(data_used(&pool), base + 60 * MIB);

    // Writes, each the first to its chunk while the snapshot lives.
    pool.write(a, 0, &pattern(3, 0, 4096)).unwrap();
    pool.write(a, 2 * MIB, &pattern(2, 2 * MIB, 4096)).unwrap();
    pool.write(a, 60 * MIB - 4096, &pattern(4, 0, 4096))
        .unwrap();
    let snap = pool.lookup("a@s").unwrap();
    assert_eq!(pool.info(snap).unwrap().size, MIB);
    assert_eq!(
        read_at(&pool, snap, 0, MIB as usize),
        pattern(1, 0, MIB as usize)
    );
    pool.flush().unwrap();
    drop(pool);
    let pool = reopen(&disk);
    assert_clean(&pool);
    let a = pool.lookup("a").unwrap();
    assert_eq!(pool.info(a).unwrap().size, 60 * MIB);
    assert_eq!(read_at(&pool, a, 0, 4096), pattern(3, 0, 4096));
    assert_eq!(read_at(&pool, a, 4096, 4096), pattern(1, 4096, 4096));
    assert_eq!(read_at(&pool, a, 2 * MIB, 4096), pattern(2, 2 * MIB, 4096));
    assert_eq!(read_at(&pool, a, 30 * MIB, 4096), vec![0; 4096]);
    assert_eq!(
        read_at(&pool, a, 60 * MIB - 4096, 4096),
        pattern(4, 0, 4096)
    );
    // The home and the snapshot's copies (of the first chunk, and of the
    // grown part's chunks written while the snapshot lives).
    let copies = data_used(&pool) - base - 60 * MIB;
    assert!(copies > 0 && copies <= 3 * CS, "{copies} bytes of copies");
    // The copies took the chunks after the home: it moves to grow (built
    // in steps into a loose home), with its data and its snapshot's.
    let copies_before = data_used(&pool) - base - 60 * MIB;
    pool.resize("a", 61 * MIB).unwrap();
    reclaim_all(&pool);
    assert_eq!(data_used(&pool), base + 61 * MIB + copies_before);
    assert_eq!(read_at(&pool, a, 0, 4096), pattern(3, 0, 4096));
    assert_eq!(read_at(&pool, a, 4096, 4096), pattern(1, 4096, 4096));
    assert_eq!(read_at(&pool, a, 2 * MIB, 4096), pattern(2, 2 * MIB, 4096));
    assert_eq!(
        read_at(&pool, a, 60 * MIB - 4096, 4096),
        pattern(4, 0, 4096)
    );
    assert_eq!(
        read_at(&pool, a, 60 * MIB, MIB as usize),
        vec![0; MIB as usize]
    );
    assert_eq!(
        read_at(&pool, snap, 0, MIB as usize),
        pattern(1, 0, MIB as usize)
    );
    assert_clean(&pool);
    // Destroyed, all of it comes back.
    pool.delete("a@s").unwrap();
    pool.delete("a").unwrap();
    reclaim_all(&pool);
    assert_eq!(data_used(&pool), base);
    assert_clean(&pool);
}

/// A growth inside a home's last chunk needs no chunk, even when the home
/// ends at the end of the pool's data chunks (found by the two-device
/// campaign: the growth zeroed the empty run after the home, whose offset
/// is past the device, and failed with an I/O error).
#[test]
fn a_growth_inside_the_last_chunk_of_a_home_at_the_pools_end_needs_no_chunk() {
    let disk = SimDisk::new(16 * MIB);
    let pool = small_journal_pool(&disk);
    let all = data_free(&pool);
    let a = pool.create_cow_volume("a", all - 512).unwrap();
    assert_eq!(data_free(&pool), 0);
    pool.write(a, all - 1024, &pattern(1, 0, 512)).unwrap();
    pool.resize("a", all).unwrap();
    assert_eq!(pool.info(a).unwrap().size, all);
    assert_eq!(
        read_at(&pool, a, all - 1024, 1024)[..512],
        pattern(1, 0, 512)
    );
    assert_eq!(read_at(&pool, a, all - 512, 512), vec![0; 512]);
    // Past it, there is no room to move to.
    match pool.resize("a", all + 512) {
        Err(arbor_engine::Error::Exhausted(arbor_engine::Resource::DataSpace)) => {}
        other => panic!("{other:?}"),
    }
    assert_clean(&pool);
}

/// With the chunk after its home taken by another volume, a home moves to
/// grow: its data, and what its snapshot reads from it, are copied to a
/// free run of the new size, the rest of which reads as zeros; the old
/// home is freed by reclaim. Before and after a reopen.
#[test]
fn a_home_moves_to_grow_when_the_chunks_after_it_are_taken() {
    let disk = SimDisk::new(64 * MIB);
    let pool = small_journal_pool(&disk);
    let base = data_used(&pool);
    // Freed chunks holding data, where the home moves to.
    let junk = pool.create_volume("junk", 8 * MIB).unwrap();
    pool.write(junk, 0, &pattern(8, 0, 8 * MIB as usize))
        .unwrap();
    pool.delete("junk").unwrap();
    reclaim_all(&pool);
    let a = pool.create_cow_volume("a", MIB).unwrap();
    pool.write(a, 0, &pattern(1, 0, MIB as usize)).unwrap();
    // Its home right after a's (the first free run).
    let r = pool.create_cow_volume("r", MIB).unwrap();
    pool.write(r, 0, &pattern(9, 0, MIB as usize)).unwrap();
    pool.snapshot("a@s").unwrap();
    // The snapshot's copy of chunk 0; the rest it reads from the home.
    pool.write(a, 0, &pattern(2, 0, 4096)).unwrap();
    reclaim_all(&pool);
    let used = data_used(&pool);
    pool.resize("a", 2 * MIB).unwrap();
    assert_eq!(pool.info(a).unwrap().size, 2 * MIB);
    // The old home waits for reclaim, which frees all of it.
    assert!(pool.pool_stats().unwrap().reclaim_pending);
    assert_eq!(data_used(&pool), used + 2 * MIB);
    reclaim_all(&pool);
    assert_eq!(data_used(&pool), used + MIB);
    let snap = pool.lookup("a@s").unwrap();
    let check = |pool: &Pool| {
        let a = pool.lookup("a").unwrap();
        let mut want = pattern(1, 0, MIB as usize);
        want[..4096].copy_from_slice(&pattern(2, 0, 4096));
        want.resize(2 * MIB as usize, 0);
        want[(MIB + 4096) as usize..(MIB + 8192) as usize].copy_from_slice(&pattern(
            3,
            MIB + 4096,
            4096,
        ));
        want[8192..12288].copy_from_slice(&pattern(4, 8192, 4096));
        assert_eq!(read_at(pool, a, 0, 2 * MIB as usize), want);
        assert_eq!(
            read_at(pool, pool.lookup("a@s").unwrap(), 0, MIB as usize),
            pattern(1, 0, MIB as usize)
        );
        assert_eq!(
            read_at(pool, pool.lookup("r").unwrap(), 0, MIB as usize),
            pattern(9, 0, MIB as usize)
        );
        assert_clean(pool);
    };
    // Writes to the new part, and to a chunk the snapshot still reads
    // from the home (copied first, from the new home).
    pool.write(a, MIB + 4096, &pattern(3, MIB + 4096, 4096))
        .unwrap();
    pool.write(a, 8192, &pattern(4, 8192, 4096)).unwrap();
    assert_eq!(pool.info(snap).unwrap().size, MIB);
    check(&pool);
    pool.flush().unwrap();
    drop(pool);
    let pool = reopen(&disk);
    check(&pool);
    // A home does not shrink, and sizes inside its last chunk need none.
    assert!(matches!(
        pool.resize("a", MIB / 2),
        Err(arbor_engine::Error::Refused(
            arbor_engine::Refusal::Unsupported(_)
        ))
    ));
    pool.resize("a", 2 * MIB).unwrap();
    pool.delete("a@s").unwrap();
    pool.delete("a").unwrap();
    pool.delete("r").unwrap();
    reclaim_all(&pool);
    assert_eq!(data_used(&pool), base);
    assert_clean(&pool);
}

/// With no free run of the new size anywhere, a growth that would move
/// the home fails with no space and changes nothing.
#[test]
fn a_home_with_no_room_to_move_to_stays_as_it_was() {
    let disk = SimDisk::new(64 * MIB);
    let pool = small_journal_pool(&disk);
    let a = pool.create_cow_volume("a", 8 * MIB).unwrap();
    pool.write(a, 0, &pattern(1, 0, MIB as usize)).unwrap();
    let r = pool.create_volume("r", 64 * MIB).unwrap();
    // Every other chunk of the rest of the pool taken.
    let free = data_free(&pool);
    for i in 0..free / CS {
        pool.write(r, i * CS, &pattern(i, 0, CS as usize)).unwrap();
    }
    for i in (0..free / CS).step_by(2) {
        pool.discard(r, i * CS, CS).unwrap();
    }
    reclaim_all(&pool);
    pool.flush().unwrap();
    let used = data_used(&pool);
    assert!(data_free(&pool) > 8 * MIB);
    match pool.resize("a", 9 * MIB) {
        Err(arbor_engine::Error::Exhausted(arbor_engine::Resource::DataSpace)) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(pool.info(a).unwrap().size, 8 * MIB);
    assert_eq!(data_used(&pool), used);
    assert!(!pool.pool_stats().unwrap().reclaim_pending);
    assert_eq!(
        read_at(&pool, a, 0, MIB as usize),
        pattern(1, 0, MIB as usize)
    );
    assert_clean(&pool);
}

/// A power cut at every write or flush of a growth in steps: the volume
/// opens at its old size or its new one with its data, clean, and reclaim
/// frees whatever the growth left.
#[test]
fn a_power_cut_during_a_growth_in_steps_leaves_the_old_or_the_new_size() {
    cut_a_growth(43, false);
}

/// The same for a move in steps (the new home built into a loose home,
/// the data copied, the move committed): the volume opens with its old
/// home or its new one, and reclaim frees the old home or the loose one.
#[test]
fn a_power_cut_during_a_move_leaves_the_old_or_the_new_home() {
    cut_a_growth(44, true);
}

/// Cuts the power at every write or flush of a growth of a 1 MiB
/// copy-on-write volume with a snapshot to 40 MiB (in steps), in place or,
/// with `moves`, moving (another home right after its own). The volume
/// opens at the old size or the new, with its data, the new part zeros;
/// its snapshot reads what it did; reclaim frees whatever the growth left;
/// and it grows again from there.
fn cut_a_growth(seed: u64, moves: bool) {
    let (old, new) = (MIB, 40 * MIB);
    let (mut olds, mut news) = (0, 0);
    let mut snap = pattern(7, 0, 8192);
    snap.resize(old as usize, 0);
    cut_at_every_point(
        seed,
        |pool| {
            let a = pool.create_cow_volume("a", old).unwrap();
            pool.write(a, 0, &pattern(7, 0, 8192)).unwrap();
            pool.snapshot("a@s").unwrap();
            if moves {
                let b = pool.create_cow_volume("b", MIB).unwrap();
                pool.write(b, 0, &pattern(6, 0, 4096)).unwrap();
            }
        },
        |pool| pool.resize("a", new).is_ok(),
        |cut, pool2, grown, base| {
            let a2 = pool2.lookup("a").unwrap();
            let size = pool2.info(a2).unwrap().size;
            if size == new {
                news += 1;
                assert_eq!(read_at(pool2, a2, new - 4096, 4096), vec![0; 4096]);
            } else {
                assert_eq!(size, old, "cut {cut}");
                assert!(!grown, "cut {cut}: a growth that returned was lost");
                olds += 1;
            }
            assert_eq!(read_at(pool2, a2, 0, 8192), pattern(7, 0, 8192));
            let s = pool2.lookup("a@s").unwrap();
            assert_eq!(read_at(pool2, s, 0, old as usize), snap, "cut {cut}");
            if moves {
                let b = pool2.lookup("b").unwrap();
                assert_eq!(read_at(pool2, b, 0, 4096), pattern(6, 0, 4096));
                assert_eq!(names(pool2), ["a", "a@s", "b"]);
            } else {
                assert_eq!(names(pool2), ["a", "a@s"]);
            }
            reclaim_all(pool2);
            assert_eq!(data_used(pool2), base + (size - old), "cut {cut}");
            assert_clean(pool2);
            pool2.resize("a", new + MIB).unwrap();
            assert_eq!(read_at(pool2, s, 0, old as usize), snap, "cut {cut}");
        },
    );
    assert!(olds > 0 && news > 0, "old {olds}, new {news}");
}

/// A move whose copy fails (the device fails a write) returns the error
/// and leaves no trace, in one commit's size and in steps: the volume
/// keeps its home, size and data, nothing waits for reclaim, and the
/// pool goes on (the move succeeds once the device does).
#[test]
fn a_move_whose_copy_fails_leaves_no_trace() {
    for new in [2 * MIB, 40 * MIB] {
        let (_disk, dev, pool) = hooked_pool(64 * MIB, false);
        let a = pool.create_cow_volume("a", MIB).unwrap();
        pool.write(a, 0, &pattern(1, 0, MIB as usize)).unwrap();
        pool.create_cow_volume("b", MIB).unwrap();
        pool.snapshot("a@s").unwrap();
        pool.flush().unwrap();
        let used = data_used(&pool);
        dev.fail_big
            .store(true, std::sync::atomic::Ordering::SeqCst);
        match pool.resize("a", new) {
            Err(arbor_engine::Error::Stop(arbor_engine::Fault::Io(e))) => {
                assert!(e.to_string().contains("injected"))
            }
            other => panic!("{new}: {other:?}"),
        }
        dev.fail_big
            .store(false, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(pool.info(a).unwrap().size, MIB);
        assert_eq!(data_used(&pool), used, "{new}");
        assert!(!pool.pool_stats().unwrap().reclaim_pending, "{new}");
        assert_eq!(
            read_at(&pool, a, 0, MIB as usize),
            pattern(1, 0, MIB as usize)
        );
        assert_clean(&pool);
        pool.resize("a", new).unwrap();
        let s = pool.lookup("a@s").unwrap();
        assert_eq!(
            read_at(&pool, s, 0, MIB as usize),
            pattern(1, 0, MIB as usize)
        );
        assert_eq!(
            read_at(&pool, a, 0, MIB as usize),
            pattern(1, 0, MIB as usize)
        );
        reclaim_all(&pool);
        assert_eq!(data_used(&pool), used + new - MIB, "{new}");
        assert_clean(&pool);
    }
}

/// A write that lands while a moving home is copied (here, in the middle
/// of the copy: after its piece was read, before it was written) reaches
/// the new home: the chunks written meanwhile are copied again. Its
/// snapshot keeps what it saw, before and after a reopen.
#[test]
fn a_write_during_the_copy_of_a_moving_home_reaches_the_new_home() {
    let (disk, hooked, pool) = hooked_pool(64 * MIB, false);
    let a = pool.create_cow_volume("a", 2 * MIB).unwrap();
    pool.write(a, 0, &pattern(1, 0, 2 * MIB as usize)).unwrap();
    pool.snapshot("a@s").unwrap();
    // Its home right after a's: a moves to grow.
    pool.create_cow_volume("b", MIB).unwrap();
    let weak = Arc::downgrade(&pool);
    // At the copy's first write (the home's 2 MiB, read already).
    *hooked.hook.lock().unwrap() = Some(Box::new(move || {
        let pool = weak.upgrade().unwrap();
        pool.write(a, 4096, &pattern(2, 4096, 8192)).unwrap();
    }));
    pool.resize("a", 3 * MIB).unwrap();
    assert!(
        hooked.hook.lock().unwrap().is_none(),
        "the hook did not run"
    );
    let mut want = pattern(1, 0, 2 * MIB as usize);
    want[4096..12288].copy_from_slice(&pattern(2, 4096, 8192));
    want.resize(3 * MIB as usize, 0);
    let check = |pool: &Pool| {
        let a = pool.lookup("a").unwrap();
        assert!(
            read_at(pool, a, 0, 3 * MIB as usize) == want,
            "the volume lost the write made during the copy"
        );
        let s = pool.lookup("a@s").unwrap();
        assert!(read_at(pool, s, 0, 2 * MIB as usize) == pattern(1, 0, 2 * MIB as usize));
        assert_clean(pool);
    };
    check(&pool);
    pool.flush().unwrap();
    drop(pool);
    let pool = reopen(&disk);
    check(&pool);
    reclaim_all(&pool);
    assert_clean(&pool);
}

/// I/O goes on while the home grows, in place or moving (its window is
/// replaced under the old one's `busy`): no request fails, and every
/// write is there after.
#[test]
fn io_goes_on_while_a_home_grows_or_moves() {
    let disk = SimDisk::new(128 * MIB);
    let pool = Arc::new(small_journal_pool(&disk));
    let a = pool.create_cow_volume("a", MIB).unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let worker = {
        let (pool, stop) = (pool.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut model = vec![0u8; MIB as usize];
            let mut i = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let at = (i * 7 % 256) * 4096;
                let data = pattern(i, at, 4096);
                pool.write(a, at, &data).unwrap();
                model[at as usize..at as usize + 4096].copy_from_slice(&data);
                let mut back = vec![0u8; 4096];
                pool.read(a, at, &mut back).unwrap();
                assert_eq!(back, data);
                i += 1;
            }
            model
        })
    };
    let used = data_used(&pool);
    for mib in [2, 3, 50, 51] {
        pool.resize("a", mib * MIB).unwrap();
        // A move leaves the old home to reclaim.
        let moved = mib == 3 || mib == 51;
        assert_eq!(pool.pool_stats().unwrap().reclaim_pending, moved, "{mib}");
        reclaim_all(&pool);
        pool.write(a, mib * MIB - 4096, &pattern(mib, 0, 4096))
            .unwrap();
        if mib == 2 || mib == 50 {
            // A home right after a's (bigger than the hole a left, the
            // first free run else): its next growth moves it.
            pool.create_cow_volume(&format!("b{mib}"), 4 * MIB).unwrap();
        }
    }
    // Two moves and two growths in place, each old home freed.
    assert_eq!(data_used(&pool), used + 50 * MIB + 8 * MIB);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let model = worker.join().unwrap();
    assert_eq!(read_at(&pool, a, 0, MIB as usize), model);
    for mib in [2, 3, 50, 51] {
        assert_eq!(
            read_at(&pool, a, mib * MIB - 4096, 4096),
            pattern(mib, 0, 4096)
        );
    }
    assert_clean(&pool);
}

/// A home whose allocation does not fit the journal room other writes
/// left is allocated again after a commit, and a write the commit lets
/// through lands outside its run. (Found in review: the first try, undone,
/// ended the run's reservation, which only the caller now ends; this test
/// passes with the old code too, which I could not make take the run's
/// chunk here.)
#[test]
fn a_home_allocated_again_after_a_commit_keeps_its_run() {
    let (_disk, hooked, pool) = hooked_pool(128 * MIB, true);
    // 12 space-map pages' worth of chunks, shared with a snapshot.
    let x = pool.create_volume("x", 48 * MIB).unwrap();
    for m in 0..48 {
        pool.write(x, m * MIB, &pattern(m, 0, MIB as usize))
            .unwrap();
    }
    let w = pool.create_volume("w", MIB).unwrap();
    pool.snapshot("x@s").unwrap();
    // A redirect in each of 6 pages: with the page of the new chunks and
    // the metadata's, the open transaction changes 8 (the most a write
    // leaves uncommitted with this journal).
    for i in 0..6 {
        pool.write(x, i * 4 * MIB, &pattern(100 + i, 0, 4096))
            .unwrap();
    }
    // The commit the home's first try forces lets a write through, which
    // takes the first free chunk.
    let weak = Arc::downgrade(&pool);
    *hooked.hook.lock().unwrap() = Some(Box::new(move || {
        let pool = weak.upgrade().unwrap();
        pool.write(w, 0, &pattern(7, 0, 4096)).unwrap();
    }));
    // 8,160 chunks (9 pages): one commit's worth, not the room left.
    let t0 = pool.pool_stats().unwrap().txn;
    let c = pool.create_cow_volume("c", 8160 * CS).unwrap();
    assert!(
        pool.pool_stats().unwrap().txn >= t0 + 2,
        "the home fitted the first try"
    );
    assert!(hooked.hook.lock().unwrap().is_none(), "no commit ran");
    assert_eq!(read_at(&pool, w, 0, 4096), pattern(7, 0, 4096));
    pool.write(c, 0, &pattern(8, 0, 4096)).unwrap();
    assert_eq!(read_at(&pool, c, 0, 4096), pattern(8, 0, 4096));
    assert_eq!(read_at(&pool, w, 0, 4096), pattern(7, 0, 4096));
    assert_clean(&pool);
}
