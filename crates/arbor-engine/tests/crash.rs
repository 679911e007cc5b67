//! Crash test: power is cut at a random operation; the disk keeps a random
//! subset of the writes not yet flushed (one possibly torn). After each cut
//! the pool must open, `check` must be clean, everything acknowledged by a
//! completed flush (or a completed snapshot/delete/rollback, which commit;
//! a snapshot the pool logged instead, docs/FORMAT.md §6.4.2, commits
//! nothing and may read after a cut as its volume may, until a commit)
//! must read back, and no sector may show data that was never written there.
// A test crate: unwrap, expect and panic are how a test reports failure
// (the workspace denies them in the code it ships; clippy.toml allows
// them in #[test] functions, this in the helpers around them).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use arbor_engine::{Pool, VolumeId};
use arbor_io::{BlockDevice, CrashKind, CrashReplayer, IoEvent, RecordingDevice, SimDisk};
use common::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const SECTOR: usize = 512;
const VOL_BYTES: usize = 512 * 1024;
/// About 12 MiB of metadata regions (4 MiB nodes, 8 MiB journals) plus
/// ~1 MiB of data: twice the volume, so the next-fit allocator wraps every
/// few transactions and freed chunks are reused soon after they are freed.
const POOL_BYTES: u64 = 13 * MIB;

struct Run {
    rng: StdRng,
    volume: Possible,
    /// Snapshots known to exist (durable): exact contents once committed,
    /// what their volume may read as while only logged.
    snapshots: BTreeMap<String, Possible>,
    /// A snapshot whose creation was interrupted: it may or may not exist.
    in_doubt: Option<(String, Possible)>,
    deleted_in_doubt: Option<String>,
    next_snap: u32,
}

impl Run {
    /// Performs one random operation; Err once the device has lost power.
    fn step(&mut self, pool: &Pool, v: VolumeId) -> Result<(), arbor_engine::Error> {
        let result = self.step_inner(pool, v);
        if std::env::var_os("ARBOR_CRASH_TRACE").is_some() {
            let last = self
                .volume
                .since
                .last()
                .map(|(o, d)| (o / SECTOR, d.len() / SECTOR));
            eprintln!(
                "step -> {result:?}; last since (sector, sectors): {last:?}; since len {}",
                self.volume.since.len()
            );
        }
        result
    }

    fn step_inner(&mut self, pool: &Pool, v: VolumeId) -> Result<(), arbor_engine::Error> {
        match self.rng.gen_range(0..100) {
            0..=59 => {
                let sectors = self.rng.gen_range(1..=64usize);
                let offset = self.rng.gen_range(0..VOL_BYTES / SECTOR - sectors) * SECTOR;
                let data = pattern(self.rng.gen(), offset as u64, sectors * SECTOR);
                self.volume.since.push((offset, data.clone()));
                pool.write(v, offset as u64, &data)
            }
            60..=67 => {
                let sectors = self.rng.gen_range(1..=64usize);
                let offset = self.rng.gen_range(0..VOL_BYTES / SECTOR - sectors) * SECTOR;
                self.volume.since.push((offset, vec![0; sectors * SECTOR]));
                pool.discard(v, offset as u64, (sectors * SECTOR) as u64)
            }
            68..=79 => {
                pool.flush()?;
                self.committed();
                Ok(())
            }
            80..=87 => {
                self.next_snap += 1;
                let name = format!("vol@s{}", self.next_snap);
                self.in_doubt = Some((name.clone(), self.volume.clone()));
                let logged = pool.pool_stats()?.logged_snapshots;
                pool.snapshot(&name)?;
                self.in_doubt = None;
                self.snapshots.insert(name, self.volume.clone());
                if pool.pool_stats()?.logged_snapshots == logged {
                    self.committed();
                }
                Ok(())
            }
            88..=93 => {
                let Some(name) = self.snapshots.keys().next().cloned() else {
                    return Ok(());
                };
                self.deleted_in_doubt = Some(name.clone());
                pool.delete(&name)?;
                self.deleted_in_doubt = None;
                self.snapshots.remove(&name);
                self.committed();
                Ok(())
            }
            94..=96 => {
                let Some((name, data)) = self
                    .snapshots
                    .iter()
                    .last()
                    .map(|(n, d)| (n.clone(), d.current()))
                else {
                    return Ok(());
                };
                // Unflushed writes before a rollback may or may not survive a
                // crash during it; after it the volume equals the snapshot.
                self.volume.since.push((0, data.clone()));
                pool.rollback("vol", &name)?;
                self.volume = Possible::new(data);
                self.committed();
                Ok(())
            }
            _ => pool.reclaim(self.rng.gen_range(1..20)).map(|_| ()),
        }
    }

    /// A commit completed: every write so far is durable, and every
    /// logged snapshot exactly as taken.
    fn committed(&mut self) {
        self.volume.make_durable();
        for snapshot in self.snapshots.values_mut() {
            snapshot.make_durable();
        }
    }

    /// Keeps at least 10 chunks free (more than one write needs): drops the
    /// oldest snapshots and reclaims, then commits so that chunks freed in
    /// the open transaction become allocatable.
    fn ensure_space(&mut self, pool: &Pool) -> Result<(), arbor_engine::Error> {
        loop {
            let stats = pool.pool_stats()?;
            if (stats.data_bytes - stats.data_used_bytes) / stats.chunk_size >= 10 {
                return Ok(());
            }
            let oldest = self.snapshots.keys().next().cloned();
            if let Some(name) = &oldest {
                self.deleted_in_doubt = Some(name.clone());
                pool.delete(name)?;
                self.deleted_in_doubt = None;
                self.snapshots.remove(name);
            }
            while pool.reclaim(1000)? > 0 {}
            pool.flush()?;
            self.committed();
            if oldest.is_none() {
                return Ok(());
            }
        }
    }

    fn verify_after_crash(&self, pool: &Pool, seed: u64) {
        let report = pool.check().unwrap();
        assert!(
            report.is_clean(),
            "seed {seed}: check after crash: {:#?}",
            report.problems
        );
        let read_all = |id: VolumeId| {
            let mut buf = vec![0u8; VOL_BYTES];
            pool.read(id, 0, &mut buf).unwrap();
            buf
        };
        let v = pool.lookup("vol").unwrap();
        self.volume
            .assert_allowed(&read_all(v), &format!("seed {seed}: vol"));
        for (name, data) in &self.snapshots {
            if self.deleted_in_doubt.as_deref() == Some(name.as_str()) && pool.lookup(name).is_err()
            {
                continue;
            }
            let id = pool
                .lookup(name)
                .unwrap_or_else(|e| panic!("seed {seed}: durable snapshot {name} lost: {e}"));
            data.assert_allowed(&read_all(id), &format!("seed {seed}: snapshot {name}"));
        }
        if let Some((name, possible)) = &self.in_doubt {
            if let Ok(id) = pool.lookup(name) {
                possible.assert_allowed(&read_all(id), &format!("seed {seed}: in-doubt {name}"));
            }
        }
    }
}

fn crash_once(seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    // A data region of a few MiB: the allocator wraps around and reuses
    // freed chunks, so reuse across crashes is exercised.
    let (disk, pool) = sim_pool(
        POOL_BYTES,
        if seed.is_multiple_of(2) { 4096 } else { 16384 },
    );
    let v = pool.create_volume("vol", VOL_BYTES as u64).unwrap();
    let handle = disk.handle();
    handle.cut_power_after(rng.gen_range(1..600));
    let mut run = Run {
        rng,
        volume: Possible::new(vec![0; VOL_BYTES]),
        snapshots: BTreeMap::new(),
        in_doubt: None,
        deleted_in_doubt: None,
        next_snap: 0,
    };
    let mut steps = 0;
    loop {
        // A write that fails for space part-way leaves some chunks written:
        // keep space free so every write completes or loses power.
        if run.ensure_space(&pool).is_err() {
            break;
        }
        match run.step(&pool, v) {
            Ok(()) => {}
            Err(arbor_engine::Error::Exhausted(arbor_engine::Resource::DataSpace)) => {
                panic!("seed {seed}: out of space with free chunks reported")
            }
            Err(_) => break,
        }
        steps += 1;
        assert!(steps < 100_000, "power never failed");
    }
    assert!(
        !handle.is_powered(),
        "seed {seed}: an operation failed while the disk still had power"
    );
    drop(pool);

    let image = handle.crash_image(&mut run.rng);
    let crashed = SimDisk::from_image(image);
    let dev: Arc<dyn BlockDevice> = Arc::new(crashed.clone());
    let pool = Pool::open(dev, &open_opts())
        .unwrap_or_else(|e| panic!("seed {seed}: open after crash: {e}"));
    run.verify_after_crash(&pool, seed);

    // The recovered pool keeps working: reclaim everything, write, reopen, check.
    while pool.reclaim(1000).unwrap() > 0 {}
    let v = pool.lookup("vol").unwrap();
    pool.write(v, 0, &pattern(seed, 0, 8192)).unwrap();
    pool.close().unwrap();
    let pool = reopen(&crashed);
    assert_clean(&pool);
    let mut buf = vec![0u8; 8192];
    pool.read(pool.lookup("vol").unwrap(), 0, &mut buf).unwrap();
    assert!(
        buf == pattern(seed, 0, 8192),
        "seed {seed}: write after recovery lost"
    );
}

#[test]
fn random_power_cuts() {
    let runs: u64 = std::env::var("ARBOR_CRASH_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(120);
    let only: Option<u64> = std::env::var("ARBOR_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok());
    for seed in (0..runs).filter(|s| only.is_none_or(|o| o == *s)) {
        crash_once(seed);
    }
}

/// A torn or damaged newest commit record of a version 8 pool falls back
/// to the previous commit (version 9 uses its other copy: tests/records.rs).
#[test]
fn damaged_newest_commit_falls_back_to_previous() {
    let disk = SimDisk::new(48 * MIB);
    let opts = arbor_engine::CreateOptions {
        format_version: arbor_format::FormatVersion::new(8).unwrap(),
        ..small_opts(4096)
    };
    let dev: Arc<dyn BlockDevice> = Arc::new(disk.clone());
    let pool = Pool::create(dev, &opts, &open_opts()).unwrap();
    let v = pool.create_volume("vol", MIB).unwrap();
    pool.write(v, 0, &pattern(1, 0, 4096)).unwrap();
    pool.flush().unwrap();
    // A write to a new chunk: its mapping exists only in the newest commit.
    pool.write(v, 8192, &pattern(2, 8192, 4096)).unwrap();
    pool.close().unwrap();
    // Find the newest commit record (journal areas start at block 2) and flip a bit in it.
    let mut image = disk.handle().durable_image();
    let journal_pages = 1024usize;
    let areas = [2 * 4096, (2 + journal_pages + 1) * 4096];
    let txn = |at: usize| u64::from_le_bytes(image[at + 32..at + 40].try_into().unwrap());
    let newest = if txn(areas[0]) > txn(areas[1]) {
        areas[0]
    } else {
        areas[1]
    };
    image[newest + 100] ^= 0x10;
    let crashed = SimDisk::from_image(image);
    let pool = reopen(&crashed);
    assert_clean(&pool);
    let mut buf = vec![0u8; 12288];
    pool.read(pool.lookup("vol").unwrap(), 0, &mut buf).unwrap();
    assert!(
        buf[..4096] == pattern(1, 0, 4096)[..],
        "data of the previous commit survives"
    );
    assert!(
        buf[8192..].iter().all(|&b| b == 0),
        "the damaged commit's mapping is gone"
    );
}

/// Power cuts while several threads write and flush their own volumes, with
/// slow flushes so commits overlap with ongoing writes and metadata changes.
/// Each thread's flushed writes survive; nothing else appears.
#[test]
fn concurrent_power_cuts() {
    let runs: u64 = std::env::var("ARBOR_CRASH_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .map_or(30, |n: u64| n / 4);
    for seed in 0..runs {
        // ~2.5 MiB of data for 2 MiB of volumes: chunks freed by one thread
        // are soon reused by another, often while the freeing commit is in flight.
        let (disk, pool) = sim_pool(POOL_BYTES + (3 * MIB) / 2, 4096);
        let handle = disk.handle();
        handle.set_flush_delay(std::time::Duration::from_micros(300));
        let volumes: Vec<VolumeId> = (0..4)
            .map(|t| {
                pool.create_volume(&format!("t{t}"), VOL_BYTES as u64)
                    .unwrap()
            })
            .collect();
        let mut rng = StdRng::seed_from_u64(seed);
        handle.cut_power_after(rng.gen_range(50..1500));
        let pool = Arc::new(pool);
        let threads: Vec<_> = volumes
            .iter()
            .enumerate()
            .map(|(t, &v)| {
                let pool = Arc::clone(&pool);
                std::thread::spawn(move || {
                    let mut rng = StdRng::seed_from_u64(seed * 100 + t as u64);
                    let mut possible = Possible::new(vec![0; VOL_BYTES]);
                    let mut snapshots = 0;
                    loop {
                        let sectors = rng.gen_range(1..=32usize);
                        let offset = rng.gen_range(0..VOL_BYTES / SECTOR - sectors) * SECTOR;
                        // Discards and copy-on-write after snapshots free chunks
                        // while other threads' commits are in flight.
                        let result = match rng.gen_range(0..20) {
                            0..=12 => {
                                let data = pattern(rng.gen(), offset as u64, sectors * SECTOR);
                                possible.since.push((offset, data.clone()));
                                pool.write(v, offset as u64, &data)
                            }
                            13..=15 => {
                                possible.since.push((offset, vec![0; sectors * SECTOR]));
                                pool.discard(v, offset as u64, (sectors * SECTOR) as u64)
                            }
                            16..=18 => pool.flush().map(|()| possible.make_durable()),
                            _ => {
                                snapshots += 1;
                                let name = format!("t{t}@s{snapshots}");
                                pool.snapshot(&name)
                                    .and_then(|_| pool.delete(&name))
                                    .and_then(|()| pool.reclaim(1000))
                                    .map(|_| possible.make_durable())
                            }
                        };
                        match result {
                            Ok(()) => {}
                            // Space held by other threads' pending frees comes back after a commit.
                            Err(arbor_engine::Error::Exhausted(
                                arbor_engine::Resource::DataSpace,
                            )) => {
                                possible.last_write_uncertain();
                                if pool.reclaim(1000).and_then(|_| pool.flush()).is_err() {
                                    return possible;
                                }
                            }
                            Err(_) => return possible,
                        }
                    }
                })
            })
            .collect();
        let possibles: Vec<Possible> = threads.into_iter().map(|h| h.join().unwrap()).collect();
        drop(pool);
        let image = handle.crash_image(&mut rng);
        let crashed = SimDisk::from_image(image);
        let pool = reopen(&crashed);
        assert_clean(&pool);
        for (t, possible) in possibles.iter().enumerate() {
            let mut buf = vec![0u8; VOL_BYTES];
            pool.read(pool.lookup(&format!("t{t}")).unwrap(), 0, &mut buf)
                .unwrap();
            possible.assert_allowed(&buf, &format!("seed {seed}: thread {t}"));
        }
    }
}

/// Regression (found by the power-cut campaign, seed 100002): a volume and
/// a clone share a leaf; the volume's write redirects its chunk, leaving the
/// old chunk with one reference (the clone's) in the open transaction; the
/// clone then overwrote that chunk in place. The last commit still maps it
/// to the volume, so after a power cut the volume showed the clone's data.
///
/// Also with the clone's write spanning two chunks, which plans the shared
/// chunk twice (an in-place run, then a redirect): the first plan once
/// stamped the chunk's mapping as written in this transaction, and the
/// second then took that for "mapped after the last share" and wrote in
/// place.
#[test]
fn clone_write_never_shows_in_its_origin_after_a_crash() {
    for (chunk, spans_two_chunks) in [
        (4096u32, false),
        (16384, false),
        (4096, true),
        (16384, true),
    ] {
        let clone_write_len = if spans_two_chunks {
            chunk as usize + 4096
        } else {
            4096
        };
        let (dev, recording) = RecordingDevice::new(Arc::new(SimDisk::new(POOL_BYTES)));
        let pool = Pool::create(Arc::new(dev), &small_opts(chunk), &open_opts()).unwrap();
        let v = pool.create_volume("vol", VOL_BYTES as u64).unwrap();
        let a = pattern(1, 0, 4096);
        pool.write(v, 0, &a).unwrap();
        pool.snapshot("vol@s").unwrap();
        let c = pool.clone_snapshot("vol@s", "clone").unwrap();
        pool.delete("vol@s").unwrap();
        while pool.reclaim(1000).unwrap() > 0 {}
        pool.flush().unwrap();
        let b = pattern(2, 0, 4096);
        pool.write(v, 0, &b).unwrap();
        let secret = pattern(3, 0, clone_write_len);
        pool.write(c, 0, &secret).unwrap();
        // Power is cut during the commit, after the flush that makes its
        // nodes and data durable and before its commit record.
        pool.flush().unwrap();
        let events = recording.take();
        let last_flushes: Vec<usize> = events
            .iter()
            .enumerate()
            .filter(|(_, e)| **e == IoEvent::Flush)
            .map(|(i, _)| i)
            .collect();
        let cut = last_flushes[last_flushes.len() - 2] + 1;
        let mut replay = CrashReplayer::new(vec![0; POOL_BYTES as usize]);
        for event in events.into_iter().take(cut) {
            replay.apply(event).unwrap();
        }
        let mut rng = StdRng::seed_from_u64(1);
        let crashed = SimDisk::from_image(replay.crash_image(CrashKind::DropAll, &mut rng));
        drop(pool);
        let pool = reopen(&crashed);
        assert_clean(&pool);
        let mut buf = vec![0u8; 4096];
        pool.read(pool.lookup("vol").unwrap(), 0, &mut buf).unwrap();
        assert!(
            buf == a || buf == b,
            "chunk {chunk}, clone write of {clone_write_len}: the origin shows data it never held"
        );
        pool.read(pool.lookup("clone").unwrap(), 0, &mut buf)
            .unwrap();
        assert!(
            buf == a || buf == secret[..4096],
            "chunk {chunk}, clone write of {clone_write_len}: the clone shows data it never held"
        );
    }
}

/// Byte-granular writes (NBD clients that negotiate no block size) under
/// power cuts: a write of part of a sector, in place into a chunk the
/// volume owns and copied into a new chunk when a snapshot shares it. At
/// every cut point the volume reads as before the write or after it (each
/// sector whole), an acknowledged flush keeps it, and the snapshot never
/// changes.
#[test]
fn partial_sector_writes_survive_power_cuts_whole() {
    let before = pattern(1, 0, 16384);
    let mut after = before.clone();
    after[100..300].copy_from_slice(&pattern(2, 100, 200));
    after[9000..9001].copy_from_slice(&[0xee]);
    let mut outcomes = [false; 2];
    for cut in 1..40u64 {
        for seed in 0..3u64 {
            let (disk, pool) = sim_pool(16 << 20, 4096);
            let v = pool.create_volume("v", 1 << 20).unwrap();
            pool.write(v, 0, &before).unwrap();
            pool.flush().unwrap();
            // After the snapshot the first two chunks are rewritten, so the
            // volume owns them again (byte 100 is written in place), while
            // the next two stay shared with it (byte 9000 is copied).
            pool.snapshot("v@s").unwrap();
            pool.write(v, 0, &before[..8192]).unwrap();
            pool.flush().unwrap();
            let handle = disk.handle();
            handle.cut_power_after(cut);
            let flushed = pool
                .write(v, 100, &after[100..300])
                .and_then(|()| pool.write(v, 9000, &after[9000..9001]))
                .and_then(|()| pool.flush())
                .is_ok();
            drop(pool);
            let mut rng = StdRng::seed_from_u64(cut * 7 + seed);
            let crashed = SimDisk::from_image(handle.crash_image(&mut rng));
            let pool = reopen(&crashed);
            let mut got = vec![0u8; 16384];
            pool.read(pool.lookup("v").unwrap(), 0, &mut got).unwrap();
            for s in 0..32 {
                let r = s * 512..(s + 1) * 512;
                assert!(
                    got[r.clone()] == before[r.clone()] || got[r.clone()] == after[r.clone()],
                    "cut {cut}: sector {s} is neither before nor after the write"
                );
            }
            if flushed {
                assert!(
                    got == after,
                    "cut {cut}: an acknowledged flush lost a write"
                );
            }
            outcomes[usize::from(got == after)] = true;
            let mut snap = vec![0u8; 16384];
            pool.read(pool.lookup("v@s").unwrap(), 0, &mut snap)
                .unwrap();
            assert!(snap == before, "cut {cut}: the snapshot changed");
            assert_clean(&pool);
        }
    }
    assert!(outcomes[0] && outcomes[1], "cuts never fell on both sides");
}
