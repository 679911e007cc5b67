//! Data checksums (FORMAT.md §6.4) through the public API: a pool whose
//! volumes, snapshots and clones were written every way the write path
//! knows (new chunks whole, partial extents and their extensions, in place,
//! unaligned writes that read and rewrite whole blocks, zeroes) has random
//! data blocks damaged on its device: bit flips, zeroed blocks, blocks
//! swapped and blocks written where another belongs. Every read then
//! returns exactly what the model holds or fails with `Error::Damaged`:
//! never a wrong byte; and with the damage undone, everything reads again.
// A test crate: unwrap, expect and panic are how a test reports failure
// (the workspace denies them in the code it ships; clippy.toml allows
// them in #[test] functions, this in the helpers around them).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::{BTreeMap, BTreeSet};

use arbor_engine::{Error, Pool, VolumeId};
use arbor_io::{BlockDevice, SimDisk};
use common::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const CS: u64 = 16384;
const BLOCK: usize = 4096;
const VOLUME: u64 = 1 << 20;
/// The first bytes of every 4 KiB block the test writes: how it finds
/// data blocks on the device.
const TAG: &[u8; 8] = b"ARBRDATA";

/// One block of test data: the tag, then bytes that name the writer.
fn block(seed: u64) -> Vec<u8> {
    let mut b: Vec<u8> = (0..BLOCK as u64)
        .map(|i| (seed.wrapping_mul(0x9e37_79b9).wrapping_add(i * 31) >> 3) as u8)
        .collect();
    b[..8].copy_from_slice(TAG);
    b
}

struct World {
    pool: Pool,
    disk: SimDisk,
    model: BTreeMap<String, (VolumeId, Vec<u8>)>,
}

impl World {
    /// A pool with checksums and one volume `name`, made by `create`, its
    /// blocks written whole (new chunks), each with data of its own.
    fn with_volume(
        name: &str,
        create: impl FnOnce(&Pool) -> arbor_engine::Result<VolumeId>,
    ) -> World {
        let disk = SimDisk::new(64 * MIB);
        let pool = small_journal_pool(&disk, CS as u32);
        assert!(pool.format_version().has_data_checksums());
        let id = create(&pool).unwrap();
        let mut w = World {
            pool,
            disk,
            model: BTreeMap::new(),
        };
        w.model.insert(name.into(), (id, vec![0; VOLUME as usize]));
        let all: Vec<u8> = (0..VOLUME / BLOCK as u64)
            .flat_map(|b| block(b + 1))
            .collect();
        w.write(name, 0, &all);
        w
    }

    fn write(&mut self, name: &str, at: u64, data: &[u8]) {
        let (id, content) = self.model.get_mut(name).unwrap();
        self.pool.write(*id, at, data).unwrap();
        content[at as usize..at as usize + data.len()].copy_from_slice(data);
    }

    fn zero(&mut self, name: &str, at: u64, len: u64) {
        let (id, content) = self.model.get_mut(name).unwrap();
        self.pool.write_zeroes(*id, at, len, true).unwrap();
        content[at as usize..(at + len) as usize].fill(0);
    }

    fn snapshot(&mut self, snap: &str) {
        let id = self.pool.snapshot(snap).unwrap();
        let (vol, _) = snap.split_once('@').unwrap();
        let content = self.model[vol].1.clone();
        self.model.insert(snap.to_string(), (id, content));
    }

    fn clone_of(&mut self, snap: &str, name: &str) {
        let id = self.pool.clone_snapshot(snap, name).unwrap();
        let content = self.model[snap].1.clone();
        self.model.insert(name.to_string(), (id, content));
    }

    /// Reads every volume, snapshot and clone: the (name, block) reads that
    /// fail as damaged. Panics on a wrong byte or another error.
    fn read_all(&self) -> Vec<(String, u64)> {
        let mut damaged = Vec::new();
        for (name, (id, content)) in &self.model {
            let mut buf = vec![0u8; VOLUME as usize];
            match self.pool.read(*id, 0, &mut buf) {
                Ok(()) => {
                    assert!(buf == *content, "{name}: a whole read returned wrong bytes");
                    continue;
                }
                Err(Error::Damaged(_)) => {}
                Err(e) => panic!("{name}: {e}"),
            }
            // Block by block, with unaligned reads too: each is exact or
            // damaged.
            for b in 0..VOLUME / BLOCK as u64 {
                let at = b * BLOCK as u64;
                let mut one = vec![0u8; BLOCK];
                match self.pool.read(*id, at, &mut one) {
                    Ok(()) => assert!(
                        one == content[at as usize..at as usize + BLOCK],
                        "{name}: block {b} read wrong bytes"
                    ),
                    Err(Error::Damaged(_)) => {
                        damaged.push((name.clone(), b));
                        let mut part = vec![0u8; 512];
                        let r = self.pool.read(*id, at + 1024, &mut part);
                        assert!(
                            matches!(r, Err(Error::Damaged(_))),
                            "{name}: part of damaged block {b}: {r:?}"
                        );
                    }
                    Err(e) => panic!("{name} block {b}: {e}"),
                }
            }
        }
        damaged
    }

    /// Device offsets of the blocks that hold test data.
    fn tagged_blocks(&self) -> Vec<u64> {
        let image = self.disk.handle().visible_image();
        image
            .chunks(BLOCK)
            .enumerate()
            .filter(|(_, b)| &b[..8] == TAG)
            .map(|(i, _)| (i * BLOCK) as u64)
            .collect()
    }
}

/// What the pool's damage record lists: (name, block) of every reader.
fn listed(w: &World) -> BTreeSet<(String, u64)> {
    let report = w.pool.damage().unwrap();
    assert_eq!(report.unlisted, 0);
    report
        .blocks
        .iter()
        .flat_map(|d| {
            assert_eq!(d.readers.len(), d.reader_count);
            d.readers
                .iter()
                .map(|(name, at)| (name.clone(), at / BLOCK as u64))
        })
        .collect()
}

/// Volumes written every way: returns the world, flushed.
fn build(seed: u64) -> World {
    let mut w = World::with_volume("v", |p| p.create_volume("v", VOLUME));
    let mut rng = StdRng::seed_from_u64(seed);
    w.pool.flush().unwrap();
    w.snapshot("v@s1");
    // Partial extents under the snapshot, then their extensions.
    for c in (0..VOLUME / CS).step_by(3) {
        let b = rng.gen_range(0..4u64);
        w.write("v", c * CS + b * BLOCK as u64, &block(1000 + c));
        w.write("v", c * CS + ((b + 1) % 4) * BLOCK as u64, &block(2000 + c));
    }
    // Redirected chunks, written whole and in part (copies around the write).
    for c in (1..VOLUME / CS).step_by(5) {
        let data: Vec<u8> = (0..4).flat_map(|b| block(3000 + c * 4 + b)).collect();
        w.write("v", c * CS, &data);
    }
    w.pool.flush().unwrap();
    // In place (chunks mapped since the snapshot, the commit durable), and
    // unaligned writes that keep each block's tag.
    for c in (1..VOLUME / CS).step_by(5) {
        w.write("v", c * CS + BLOCK as u64, &block(4000 + c));
        let mut small = vec![0u8; 512];
        rng.fill(&mut small[..]);
        w.write("v", c * CS + 2 * BLOCK as u64 + 1024, &small);
    }
    w.zero("v", 7 * CS + 8, 100);
    w.clone_of("v@s1", "c");
    for c in (0..VOLUME / CS).step_by(7) {
        w.write("c", c * CS + 2 * BLOCK as u64, &block(5000 + c));
    }
    w.snapshot("v@s2");
    w.write("v", 3 * CS, &block(6000));
    w.pool.flush().unwrap();
    w
}

/// Damages random data blocks of `w` one trial at a time (one bit
/// flipped, zeroed, swapped with another block, another block's data
/// written over it), then reads every volume, snapshot and clone: each
/// block reads exactly or fails as damaged, the damage record lists
/// exactly the readers the reads found, and `after` gets the trial and
/// what was found; then the damage is undone and everything reads whole.
/// Returns the trials whose damage a read found, of those that changed a
/// block.
fn damage_campaign(
    w: &mut World,
    seed: u64,
    trials: usize,
    mut after: impl FnMut(&World, usize, &[(String, u64)]),
) -> usize {
    assert!(w.read_all().is_empty(), "an undamaged pool reads whole");
    let tagged = w.tagged_blocks();
    assert!(tagged.len() > 200, "{} data blocks found", tagged.len());
    let mut rng = StdRng::seed_from_u64(seed);
    let mut detected = 0;
    for trial in 0..trials {
        let a = tagged[rng.gen_range(0..tagged.len())];
        let b = tagged[rng.gen_range(0..tagged.len())];
        let mut old_a = vec![0u8; BLOCK];
        let mut old_b = vec![0u8; BLOCK];
        w.disk.read_at(&mut old_a, a).unwrap();
        w.disk.read_at(&mut old_b, b).unwrap();
        match trial % 4 {
            // One bit (past the tag, so the block is still found).
            0 => {
                let mut bad = old_a.clone();
                let bit = rng.gen_range(64..BLOCK * 8);
                bad[bit / 8] ^= 1 << (bit % 8);
                w.disk.write_at(&bad, a).unwrap();
            }
            // Zeroed.
            1 => w.disk.write_at(&vec![0u8; BLOCK], a).unwrap(),
            // Swapped with another block.
            2 => {
                w.disk.write_at(&old_b, a).unwrap();
                w.disk.write_at(&old_a, b).unwrap();
            }
            // Another block's data written here (misdirected).
            _ => w.disk.write_at(&old_b, a).unwrap(),
        }
        let damaged = w.read_all();
        if old_a != old_b || trial % 4 < 2 {
            detected += usize::from(!damaged.is_empty());
        }
        // The pool's damage record lists exactly what the reads found:
        // every volume, snapshot and clone that reads a damaged block.
        assert_eq!(
            listed(w),
            damaged.iter().cloned().collect::<BTreeSet<_>>(),
            "trial {trial}: the damage listed"
        );
        after(w, trial, &damaged);
        w.disk.write_at(&old_a, a).unwrap();
        w.disk.write_at(&old_b, b).unwrap();
        assert!(
            w.read_all().is_empty(),
            "trial {trial}: undone, it reads whole"
        );
        assert!(
            listed(w).is_empty(),
            "trial {trial}: undone, nothing listed"
        );
    }
    detected
}

#[test]
fn every_read_of_a_damaged_block_fails_and_no_wrong_byte_is_served() {
    let mut w = build(1);
    let detected = damage_campaign(&mut w, 2, 60, |_, _, _| {});
    // Every tagged block is live in this pool except the old copies that
    // redirects left (freed): most trials hit a live one.
    assert!(
        detected >= 30,
        "only {detected} of 60 damages were seen by reads"
    );
    w.write("v", 0, &block(7));
    assert_clean(&w.pool);
}

#[test]
fn overwriting_a_damaged_block_whole_heals_it_and_a_partial_write_into_it_fails() {
    let w = build(3);
    let (id, content) = w.model["v"].clone();
    // The device block `v` reads its chunk 11's block 1 from (written in
    // place above: unique content).
    let want = &content[(11 * CS) as usize + BLOCK..(11 * CS) as usize + 2 * BLOCK];
    let image = w.disk.handle().visible_image();
    let at = image
        .chunks(BLOCK)
        .position(|b| b == want)
        .expect("the block is on the device") as u64
        * BLOCK as u64;
    let mut bad = want.to_vec();
    bad[100] ^= 0x40;
    w.disk.write_at(&bad, at).unwrap();
    // Durable, as damage on a disk is (the restart below sees the device
    // as it was last flushed).
    w.disk.flush().unwrap();
    let offset = 11 * CS + BLOCK as u64;
    let mut buf = vec![0u8; BLOCK];
    assert!(matches!(
        w.pool.read(id, offset, &mut buf),
        Err(Error::Damaged(_))
    ));
    // A write of part of the block would keep damaged bytes under a new
    // checksum: refused as damaged.
    assert!(matches!(
        w.pool.write(id, offset + 512, &[1u8; 512]),
        Err(Error::Damaged(_))
    ));
    // Recorded durably, with who reads it and when it was found; once per
    // run however often it is read.
    let found = w.pool.damage_found();
    assert!(found >= 2, "two reads found it");
    let report = w.pool.damage().unwrap();
    assert_eq!(report.blocks.len(), 1);
    let d = &report.blocks[0];
    assert_eq!(d.device_offset, at);
    // `v@s2` was taken after the write: it shares the block.
    assert_eq!(
        d.readers,
        [("v".to_string(), offset), ("v@s2".to_string(), offset)]
    );
    assert_ne!(d.stored, d.computed);
    assert!(d.found_unix > 1_700_000_000 && d.last_unix == d.found_unix);
    // Dropped, not closed: its region stays in the in-place intent set, so
    // the open recomputes that region's sums, all but the damaged block's
    // (recorded): its damage does not become data.
    drop(w.pool);
    let pool = reopen(&w.disk);
    assert!(matches!(
        pool.read(id, offset, &mut buf),
        Err(Error::Damaged(_))
    ));
    assert_eq!(pool.damage_found(), 1);
    assert_eq!(pool.damage().unwrap(), report, "kept across a restart");
    // The whole block written: it reads again; the snapshot still reads
    // the damaged one, until it is deleted.
    let fresh = block(99);
    pool.write(id, offset, &fresh).unwrap();
    pool.read(id, offset, &mut buf).unwrap();
    assert_eq!(buf, fresh);
    let report = pool.damage().unwrap();
    assert_eq!(report.blocks[0].readers, [("v@s2".to_string(), offset)]);
    pool.delete("v@s2").unwrap();
    while pool.reclaim(1 << 20).unwrap() > 0 {}
    pool.flush().unwrap();
    assert!(pool.damage().unwrap().is_empty(), "its last reader gone");
    assert_clean(&pool);
}

/// The crash rule: in-place overwrites acknowledged but not flushed when
/// the power goes (some landed, some not, one torn) read after the reopen
/// as whatever the device holds, never as damage; what the last flush made
/// durable reads exactly; and the set of regions written in place is
/// empty again, so the next crash has nothing old to recompute.
#[test]
fn a_power_cut_during_in_place_writes_is_never_taken_for_damage() {
    for seed in 0..12u64 {
        let World { pool, disk, model } = World::with_volume("v", |p| p.create_volume("v", VOLUME));
        let v = model["v"].0;
        pool.flush().unwrap();
        // Each chunk once more after that commit: redirected, its region
        // listed as written in place from this commit on.
        let second: Vec<u8> = (0..VOLUME / BLOCK as u64)
            .flat_map(|b| block(b + 7777))
            .collect();
        pool.write(v, 0, &second).unwrap();
        pool.flush().unwrap();
        let durable = second.clone();
        // In place now; never flushed.
        let mut rng = StdRng::seed_from_u64(seed);
        let (pool, crashed, mut got) =
            cut_after_unflushed_writes(pool, &disk, v, &durable, &mut rng, seed);
        assert_clean(&pool);
        // Closed cleanly: nothing listed, so a crash now changes nothing.
        pool.close().unwrap();
        let image = crashed.handle().durable_image();
        let pool = reopen(&SimDisk::from_image(image));
        assert_eq!(pool.pool_stats().unwrap().in_place_regions, 0);
        pool.read(v, 0, &mut got).unwrap();
    }
}

/// 40 writes to volume `v` of `pool` (whole blocks and 512-byte pieces at
/// random, never flushed), then a power cut that tears or drops them at
/// random: the pool opened again from what the device kept, and the
/// volume read whole, which must succeed, every block not written since
/// reading as `durable`.
fn cut_after_unflushed_writes(
    pool: Pool,
    disk: &SimDisk,
    v: VolumeId,
    durable: &[u8],
    rng: &mut StdRng,
    seed: u64,
) -> (Pool, SimDisk, Vec<u8>) {
    let mut touched = vec![false; (VOLUME / BLOCK as u64) as usize];
    for _ in 0..40 {
        let b = rng.gen_range(0..VOLUME / BLOCK as u64);
        let at = b * BLOCK as u64;
        let len = if rng.gen_bool(0.3) { 512 } else { BLOCK };
        let mut data = vec![0u8; len];
        rng.fill(&mut data[..]);
        pool.write(v, at + if len == 512 { 1024 } else { 0 }, &data)
            .unwrap();
        touched[b as usize] = true;
    }
    let image = disk.handle().crash_image(rng);
    drop(pool);
    let crashed = SimDisk::from_image(image);
    let pool = reopen(&crashed);
    let mut got = vec![0u8; VOLUME as usize];
    pool.read(v, 0, &mut got)
        .unwrap_or_else(|e| panic!("seed {seed}: a read after the power cut: {e}"));
    for (b, &t) in touched.iter().enumerate() {
        let r = b * BLOCK..(b + 1) * BLOCK;
        if !t {
            assert!(
                got[r.clone()] == durable[r],
                "seed {seed}: block {b} lost its flushed data"
            );
        }
    }
    (pool, crashed, got)
}

/// The sums of chunks that are freed go with them: a volume written and
/// deleted leaves the metadata as it found it.
#[test]
fn the_sums_of_freed_chunks_go_with_them() {
    let disk = SimDisk::new(64 * MIB);
    let pool = small_journal_pool(&disk, CS as u32);
    pool.flush().unwrap();
    let before = pool.pool_stats().unwrap().metadata_used_bytes;
    let v = pool.create_volume("v", 8 * MIB).unwrap();
    let data: Vec<u8> = (0..8 * MIB / BLOCK as u64).flat_map(block).collect();
    pool.write(v, 0, &data).unwrap();
    pool.flush().unwrap();
    assert!(pool.pool_stats().unwrap().metadata_used_bytes > before + 2 * BLOCK as u64);
    pool.delete("v").unwrap();
    while pool.reclaim(1000).unwrap() > 0 {}
    pool.flush().unwrap();
    assert_eq!(pool.pool_stats().unwrap().metadata_used_bytes, before);
    assert_clean(&pool);
}

/// Flips one bit after the tag in each of `n` random tagged data blocks
/// of `w`'s device (the same block may be drawn twice), from `seed`.
fn flip_bits(w: &World, seed: u64, n: usize) {
    let tagged = w.tagged_blocks();
    let mut rng = StdRng::seed_from_u64(seed);
    for _ in 0..n {
        let at = tagged[rng.gen_range(0..tagged.len())];
        let mut bytes = vec![0u8; BLOCK];
        w.disk.read_at(&mut bytes, at).unwrap();
        bytes[rng.gen_range(8..BLOCK)] ^= 1 << rng.gen_range(0..8);
        w.disk.write_at(&bytes, at).unwrap();
    }
}

/// Runs a scrub to its end in small steps: the steps' totals.
fn scrub_all(pool: &Pool) -> arbor_engine::ScrubStep {
    let mut total = arbor_engine::ScrubStep::default();
    let mut at = 0;
    loop {
        let step = pool.scrub_step(at, 64 * 1024).unwrap();
        assert!(
            step.next > at || step.next >= step.data_chunks,
            "a step moves on"
        );
        total.chunks += step.chunks;
        total.bytes += step.bytes;
        total.verified_blocks += step.verified_blocks;
        total.damaged_blocks += step.damaged_blocks;
        total.sums_added += step.sums_added;
        total.data_chunks = step.data_chunks;
        at = step.next;
        if at >= step.data_chunks {
            return total;
        }
    }
}

/// A scrub reads every live chunk once (shared ones too: once) and finds
/// exactly the damage that reading every volume, snapshot and clone finds,
/// recorded the same way; on a sound pool it finds none.
#[test]
fn a_scrub_reads_each_live_chunk_once_and_finds_exactly_what_reads_find() {
    let w = build(5);
    let clean = scrub_all(&w.pool);
    assert_eq!(clean.damaged_blocks, 0);
    let stats = w.pool.pool_stats().unwrap();
    assert_eq!(
        clean.bytes, stats.data_used_bytes,
        "every live chunk read once"
    );
    assert!(clean.verified_blocks > 200);
    flip_bits(&w, 6, 8);
    let scrubbed = scrub_all(&w.pool);
    let by_scrub = listed(&w);
    // Each damaged block found once (a damaged block that no mapping
    // reads, of a partial's base, is found but not listed).
    assert!(scrubbed.damaged_blocks <= 8);
    assert!(scrubbed.damaged_blocks as usize >= w.pool.damage().unwrap().blocks.len());
    let by_reads: BTreeSet<(String, u64)> = w.read_all().into_iter().collect();
    assert!(!by_reads.is_empty(), "some damage hit live blocks");
    assert_eq!(by_scrub, by_reads, "the scrub finds what reads find");
}

/// Runs `Pool::scrub` from chunk `from` in steps of `step_bytes`, stopped
/// after `stop_after` steps (None: never): the steps told, in order.
fn scrub_streamed(
    pool: &Pool,
    from: u64,
    step_bytes: u64,
    stop_after: Option<usize>,
) -> Vec<arbor_engine::ScrubStep> {
    let mut told = Vec::new();
    pool.scrub(from, step_bytes, |step| {
        told.push(*step);
        stop_after.is_none_or(|n| told.len() < n)
    })
    .unwrap();
    told
}

/// The totals of steps.
fn totals(steps: &[arbor_engine::ScrubStep]) -> (u64, u64, u64, u64) {
    steps.iter().fold((0, 0, 0, 0), |t, s| {
        (
            t.0 + s.chunks,
            t.1 + s.bytes,
            t.2 + s.verified_blocks,
            t.3 + s.damaged_blocks,
        )
    })
}

/// `Pool::scrub` (steps read back to back, the next one's reads queued
/// while this one's are in flight) tells every step in order, the last one
/// too, even when it reads nothing (a scrub whose last step read nothing
/// once never heard of its end and started again forever); each step goes
/// on where the one before it stopped; and a scrub stopped after any step
/// and gone on from that step's `next` reads and finds exactly what one
/// run of it does, and what `Pool::scrub_step` does, damage included.
#[test]
fn a_streamed_scrub_tells_every_step_and_goes_on_exactly_where_it_stopped() {
    let w = build(8);
    flip_bits(&w, 8, 6);
    // Scrubs give sums to blocks that have none (a step whose journal is
    // full gives none: a later one does): from then on every scrub
    // verifies the same blocks.
    let by_steps = (0..5)
        .map(|_| scrub_all(&w.pool))
        .find(|s| s.sums_added == 0)
        .expect("every block has a sum after a few scrubs");
    assert!(by_steps.damaged_blocks > 0, "some damage is live");
    let want = (
        by_steps.chunks,
        by_steps.bytes,
        by_steps.verified_blocks,
        by_steps.damaged_blocks,
    );
    // One chunk a step: the step after the last live chunk reads nothing
    // (the pool's last chunks are free) and reaches the end.
    let stats = w.pool.pool_stats().unwrap();
    assert!(stats.data_used_bytes < stats.data_bytes);
    for step_bytes in [CS, 64 * 1024, 32 << 20] {
        let all = scrub_streamed(&w.pool, 0, step_bytes, None);
        let last = all.last().unwrap();
        assert!(last.next >= last.data_chunks, "the end is told");
        assert!(
            all[..all.len() - 1].iter().all(|s| s.next < s.data_chunks),
            "only the last step reaches the end"
        );
        assert!(all
            .windows(2)
            .all(|p| p[0].next < p[1].next || p[1].chunks == 0));
        assert_eq!(totals(&all), want, "{step_bytes}-byte steps");
        if step_bytes == CS {
            assert_eq!(last.chunks, 0, "the last step read nothing");
        }
        // Stopped after any step, and gone on from there.
        let stops: Vec<usize> = (1..all.len()).step_by(all.len() / 12 + 1).collect();
        for stop in stops.into_iter().chain([all.len() - 1]).filter(|&n| n >= 1) {
            let first = scrub_streamed(&w.pool, 0, step_bytes, Some(stop));
            assert_eq!(first.len(), stop, "stopped where asked");
            assert_eq!(first[..], all[..stop]);
            let rest = scrub_streamed(&w.pool, first[stop - 1].next, step_bytes, None);
            let mut both = first;
            both.extend(rest);
            assert_eq!(totals(&both), want, "stopped after step {stop}");
        }
    }
}

/// Each reader's damaged blocks, as a heal of it sees them
/// (`Pool::damaged_in`), are those of `damaged` (what reads found).
fn assert_damaged_in(w: &World, damaged: &BTreeSet<(String, u64)>, seed: u64) {
    for (name, (id, _)) in &w.model {
        let want: Vec<u64> = damaged
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, b)| b * BLOCK as u64)
            .collect();
        assert_eq!(w.pool.damaged_in(*id).unwrap(), want, "seed {seed}: {name}");
    }
}

/// Healing (FORMAT.md §6.4): damaged blocks of volumes, snapshots and
/// clones (shared chunks, partial extents, blocks written in place) are
/// rewritten with good copies by where one reader reads them, which heals
/// every reader; bytes that do not match a block's sum are refused; a
/// block that is not damaged is never written, whatever it is given; and
/// the healed device is byte-identical to what it was before the damage.
#[test]
fn healing_repairs_exactly_the_damaged_blocks_for_every_sharer_and_never_another() {
    for seed in [5u64, 6, 7] {
        let w = build(seed);
        let before = w.disk.handle().visible_image();
        let tagged = w.tagged_blocks();
        let mut rng = StdRng::seed_from_u64(seed * 31);
        for _ in 0..12 {
            let a = tagged[rng.gen_range(0..tagged.len())];
            let mut bad = vec![0u8; BLOCK];
            w.disk.read_at(&mut bad, a).unwrap();
            let bit = rng.gen_range(0..BLOCK * 8);
            bad[bit / 8] ^= 1 << (bit % 8);
            w.disk.write_at(&bad, a).unwrap();
        }
        w.disk.flush().unwrap();
        let damaged: BTreeSet<(String, u64)> = w.read_all().into_iter().collect();
        assert!(!damaged.is_empty(), "seed {seed}: some damage is live");
        assert_eq!(listed(&w), damaged, "seed {seed}");
        let live: Vec<u64> = w
            .pool
            .damage()
            .unwrap()
            .blocks
            .iter()
            .map(|d| d.device_offset)
            .collect();
        assert_damaged_in(&w, &damaged, seed);
        // Unaligned: refused before anything is looked at.
        let (vid, _) = w.model["v"].clone();
        assert!(matches!(
            w.pool.heal(vid, 512, &[0u8; BLOCK]),
            Err(Error::Refused(arbor_engine::Refusal::Invalid(_)))
        ));
        // Wrong bytes for a damaged block: refused, still damaged.
        let (name, b) = damaged.iter().next().unwrap().clone();
        let (id, content) = w.model[&name].clone();
        let mut wrong = content[(b as usize) * BLOCK..(b as usize + 1) * BLOCK].to_vec();
        wrong[7] ^= 1;
        let got = w.pool.heal(id, b * BLOCK as u64, &wrong).unwrap();
        assert_eq!((got.healed, got.rejected), (0, 1), "seed {seed}");
        assert!(listed(&w).contains(&(name.clone(), b)));
        // Any bytes for blocks that are not damaged: nothing written.
        let image = w.disk.handle().visible_image();
        for (name, (id, _)) in &w.model {
            let all = vec![0xA5u8; VOLUME as usize];
            let got = w.pool.heal(*id, 0, &all).unwrap();
            assert_eq!(got.healed, 0, "seed {seed}: {name}");
            let damaged_here = damaged.iter().filter(|(n, _)| n == name).count() as u64;
            assert_eq!(got.rejected, damaged_here, "seed {seed}: {name}");
            assert_eq!(
                got.rejected + got.not_damaged,
                VOLUME / BLOCK as u64,
                "seed {seed}: {name}"
            );
        }
        assert!(
            w.disk.handle().visible_image() == image,
            "seed {seed}: a heal with wrong bytes changed the device"
        );
        // Good bytes, by one reader of each damaged block: every reader is
        // healed, with the whole volume given (its good blocks untouched).
        let mut healed = 0;
        let mut seen = BTreeSet::new();
        for (name, b) in &damaged {
            let (id, content) = &w.model[name];
            let offsets = w.pool.damaged_in(*id).unwrap();
            if !offsets.contains(&(b * BLOCK as u64)) {
                // Healed already, through another reader of its chunk.
                continue;
            }
            if seen.insert(name.clone()) {
                let got = w.pool.heal(*id, 0, content).unwrap();
                assert_eq!(got.rejected, 0, "seed {seed}: {name}");
                assert_eq!(got.healed, offsets.len() as u64, "seed {seed}: {name}");
                healed += got.healed;
            }
        }
        assert!(healed > 0);
        assert!(
            w.read_all().is_empty(),
            "seed {seed}: healed, it reads whole"
        );
        assert!(listed(&w).is_empty(), "seed {seed}");
        assert_eq!(w.pool.damage_count().unwrap(), 0, "seed {seed}");
        let after = w.disk.handle().visible_image();
        for at in live {
            let block = at as usize..at as usize + BLOCK;
            assert!(
                after[block.clone()] == before[block],
                "seed {seed}: the healed block at {at} is what it was before the damage"
            );
        }
        // Healed durably: a restart finds nothing.
        drop(w.pool);
        let pool = reopen(&w.disk);
        assert_eq!(pool.damage_count().unwrap(), 0, "seed {seed}");
        assert!(pool.damage().unwrap().is_empty());
        assert_clean(&pool);
    }
}

/// Blocks a fill copies into a partial's own chunk (FORMAT.md §6.3) get
/// their sums in the step that maps the chunk whole: damaged afterwards,
/// they are found. A layer's block damaged before the fill is never copied
/// under a new sum: that partial is left unfilled, the damage listed, and
/// its reads still fail.
#[test]
fn a_fill_checksums_what_it_copies_and_never_copies_damage() {
    let disk = SimDisk::new(64 * MIB);
    let pool = small_journal_pool(&disk, CS as u32);
    let v = pool.create_volume("v", VOLUME).unwrap();
    let all: Vec<u8> = (0..VOLUME / BLOCK as u64)
        .flat_map(|b| block(b + 1))
        .collect();
    pool.write(v, 0, &all).unwrap();
    pool.snapshot("v@s").unwrap();
    let mut model = all.clone();
    // One block of chunks 0..8 written: partials whose bases hold the rest.
    for c in 0..8u64 {
        let at = (c * CS) as usize;
        let data = block(500 + c);
        pool.write(v, at as u64, &data).unwrap();
        model[at..at + BLOCK].copy_from_slice(&data);
    }
    pool.flush().unwrap();
    // Chunk 5's block 2, in its base: damaged before the fill.
    let base_block = &all[(5 * CS) as usize + 2 * BLOCK..(5 * CS) as usize + 3 * BLOCK];
    let image = disk.handle().visible_image();
    let find = |image: &[u8], want: &[u8]| {
        image
            .chunks(BLOCK)
            .position(|b| b == want)
            .expect("on the device") as u64
            * BLOCK as u64
    };
    let at = find(&image, base_block);
    let mut bad = base_block.to_vec();
    bad[9] ^= 1;
    disk.write_at(&bad, at).unwrap();
    disk.flush().unwrap();
    pool.delete("v@s").unwrap();
    while pool.reclaim(1000).unwrap() > 0 {}
    let filled = pool.fill_partials(1000).unwrap();
    assert_eq!(filled, 7, "every partial but the damaged one's");
    let mut buf = vec![0u8; BLOCK];
    assert!(matches!(
        pool.read(v, 5 * CS + 2 * BLOCK as u64, &mut buf),
        Err(Error::Damaged(_))
    ));
    let report = pool.damage().unwrap();
    assert_eq!(report.blocks.len(), 1);
    assert_eq!(
        report.blocks[0].readers,
        [("v".to_string(), 5 * CS + 2 * BLOCK as u64)]
    );
    // A copied block of a filled chunk (chunk 3's block 1), damaged after
    // the fill: found by its new sum.
    let copied = &model[(3 * CS) as usize + BLOCK..(3 * CS) as usize + 2 * BLOCK];
    let image = disk.handle().visible_image();
    let positions: Vec<u64> = image
        .chunks(BLOCK)
        .enumerate()
        .filter(|(_, b)| *b == copied)
        .map(|(i, _)| (i * BLOCK) as u64)
        .collect();
    // The old base copy (freed) and the filled chunk's copy.
    assert!(!positions.is_empty());
    for at in positions {
        let mut bad = copied.to_vec();
        bad[9] ^= 1;
        disk.write_at(&bad, at).unwrap();
    }
    disk.flush().unwrap();
    assert!(matches!(
        pool.read(v, 3 * CS + BLOCK as u64, &mut buf),
        Err(Error::Damaged(_))
    ));
    // Everything else reads as the model.
    for b in 0..VOLUME / BLOCK as u64 {
        let off = b * BLOCK as u64;
        if off == 5 * CS + 2 * BLOCK as u64 || off == 3 * CS + BLOCK as u64 {
            continue;
        }
        pool.read(v, off, &mut buf).unwrap();
        assert_eq!(buf, model[off as usize..off as usize + BLOCK], "block {b}");
    }
}

/// A copy-on-write volume with its home in the pool, written every way
/// (whole blocks, unaligned writes that read and rewrite whole blocks,
/// zeroes), snapshotted (its store's copies) and cloned (the clone reading
/// the home and the copies through an epoch, and its own chunks): returns
/// the world, flushed.
fn build_home(seed: u64) -> World {
    let mut w = World::with_volume("h", |p| p.create_cow_volume("h", VOLUME));
    let mut rng = StdRng::seed_from_u64(seed);
    for c in (0..VOLUME / CS).step_by(3) {
        let mut small = vec![0u8; 512];
        rng.fill(&mut small[..]);
        w.write("h", c * CS + BLOCK as u64 + 1024, &small);
    }
    w.zero("h", 5 * CS + 8, 100);
    w.pool.flush().unwrap();
    w.snapshot("h@s1");
    // Copies for the snapshot, then the home written over them.
    for c in (0..VOLUME / CS).step_by(4) {
        w.write("h", c * CS + 2 * BLOCK as u64, &block(1000 + c));
    }
    w.clone_of("h@s1", "c");
    for c in (0..VOLUME / CS).step_by(7) {
        w.write("c", c * CS + 3 * BLOCK as u64, &block(2000 + c));
    }
    w.snapshot("h@s2");
    w.write("h", 3 * CS + 1000, &block(3000)[..BLOCK - 1000]);
    w.pool.flush().unwrap();
    w
}

/// The home in the pool of a copy-on-write volume is checksummed as the
/// rest of the pool's data is (FORMAT.md §6.4): damage to any of its
/// blocks, or to its snapshots' copies or its clone's chunks, fails every
/// read that sees it, in the volume and in the snapshots and clones that
/// read the home through an epoch; the damage record lists exactly those
/// readers; and undone, everything reads whole again.
#[test]
fn a_home_in_the_pool_is_checksummed_and_every_reader_of_a_damaged_block_is_refused() {
    let mut w = build_home(11);
    let mut home_hits = 0;
    // Every tagged block is live in this pool: every trial that changed a
    // block is seen, and the scrub finds what the reads found.
    let detected = damage_campaign(&mut w, 12, 40, |w, trial, damaged| {
        home_hits += usize::from(damaged.iter().any(|(n, _)| n == "h"));
        let found = scrub_all(&w.pool).damaged_blocks;
        assert_eq!(
            found > 0,
            !damaged.is_empty(),
            "trial {trial}: the scrub finds the damage the reads find"
        );
    });
    assert!(detected >= 35, "only {detected} of 40 damages were seen");
    assert!(home_hits >= 10, "only {home_hits} trials hit the home");
    // A damaged home block is never copied for a snapshot: a write to its
    // chunk while h@s2 still needs the old content fails.
    let (id, content) = w.model["h"].clone();
    let image = w.disk.handle().visible_image();
    let find = |logical: usize| {
        image
            .chunks(BLOCK)
            .position(|b| b == &content[logical..logical + BLOCK])
            .map(|i| (i * BLOCK) as u64)
            .unwrap()
    };
    let damage = |at: u64| {
        let mut bad = vec![0u8; BLOCK];
        w.disk.read_at(&mut bad, at).unwrap();
        bad[100] ^= 4;
        w.disk.write_at(&bad, at).unwrap();
    };
    // Block 1 of chunk 1: not written since h@s2 (no copy yet).
    let at = find(CS as usize + BLOCK);
    damage(at);
    assert!(matches!(
        w.pool.write(id, CS + 3 * BLOCK as u64, &block(8888)),
        Err(Error::Damaged(_))
    ));
    // Undone, every reader reads what it read before (the failed write
    // left nothing; only the damage record changed).
    w.disk
        .write_at(&content[CS as usize + BLOCK..CS as usize + 2 * BLOCK], at)
        .unwrap();
    assert!(w.read_all().is_empty());
    // Block 0 of chunk 3 (written after h@s2, so copied for both snapshots
    // already): a write into part of it fails and changes nothing; one of
    // the whole block gives it new data and a new sum.
    let b = 3 * CS / BLOCK as u64;
    let at = find((b as usize) * BLOCK);
    damage(at);
    let mut damaged_bytes = vec![0u8; BLOCK];
    w.disk.read_at(&mut damaged_bytes, at).unwrap();
    assert!(matches!(
        w.pool.write(id, b * BLOCK as u64 + 10, &[1u8; 10]),
        Err(Error::Damaged(_))
    ));
    let mut now = vec![0u8; BLOCK];
    w.disk.read_at(&mut now, at).unwrap();
    assert!(now == damaged_bytes, "nothing written");
    w.write("h", b * BLOCK as u64, &block(9999));
    assert!(w.read_all().is_empty());
    assert_clean(&w.pool);
}

/// Healing a home in the pool: each reader's damaged blocks (the volume's
/// own, and those its snapshots and clone read through an epoch) are
/// listed by `damaged_in`, healed by one reader's good copy for all of
/// them, byte-identical to what they were.
#[test]
fn a_home_in_the_pool_is_healed_for_every_reader() {
    for seed in [21u64, 22] {
        let w = build_home(seed);
        let before = w.disk.handle().visible_image();
        let tagged = w.tagged_blocks();
        let mut rng = StdRng::seed_from_u64(seed);
        for _ in 0..10 {
            let a = tagged[rng.gen_range(0..tagged.len())];
            let mut bad = vec![0u8; BLOCK];
            w.disk.read_at(&mut bad, a).unwrap();
            bad[rng.gen_range(8..BLOCK)] ^= 1 << rng.gen_range(0..8);
            w.disk.write_at(&bad, a).unwrap();
        }
        let damaged: BTreeSet<(String, u64)> = w.read_all().into_iter().collect();
        assert!(
            damaged.iter().any(|(n, _)| n == "h"),
            "seed {seed}: the home was hit"
        );
        assert_eq!(listed(&w), damaged, "seed {seed}");
        assert_damaged_in(&w, &damaged, seed);
        // Wrong bytes are refused.
        let (id, content) = w.model["h"].clone();
        let wrong = vec![0x5Au8; VOLUME as usize];
        let got = w.pool.heal(id, 0, &wrong).unwrap();
        assert_eq!(got.healed, 0);
        for (name, (id, content)) in &w.model {
            let offsets = w.pool.damaged_in(*id).unwrap();
            if offsets.is_empty() {
                continue;
            }
            let got = w.pool.heal(*id, 0, content).unwrap();
            assert_eq!(got.rejected, 0, "seed {seed}: {name}");
            assert_eq!(got.healed, offsets.len() as u64, "seed {seed}: {name}");
        }
        assert!(w.read_all().is_empty(), "seed {seed}: healed");
        assert!(listed(&w).is_empty());
        assert!(
            w.disk
                .handle()
                .visible_image()
                .chunks(BLOCK)
                .zip(before.chunks(BLOCK))
                .filter(|(_, b)| &b[..8] == TAG)
                .all(|(a, b)| a == b),
            "seed {seed}: every data block is what it was"
        );
        let _ = content;
        assert_eq!(scrub_all(&w.pool).damaged_blocks, 0);
        assert_clean(&w.pool);
    }
}

/// The crash rule for a home in the pool: blocks written in place and not
/// flushed read, after a power cut, as old, new or torn content, never as
/// damage; flushed blocks read exactly.
#[test]
fn a_power_cut_during_writes_to_a_home_in_the_pool_is_never_taken_for_damage() {
    for seed in 0..10u64 {
        let World { pool, disk, model } =
            World::with_volume("h", |p| p.create_cow_volume("h", VOLUME));
        let (h, durable) = model["h"].clone();
        pool.flush().unwrap();
        let mut rng = StdRng::seed_from_u64(seed);
        if seed % 2 == 1 {
            // A snapshot: later writes copy first.
            pool.snapshot("h@s").unwrap();
        }
        let (pool, _crashed, mut got) =
            cut_after_unflushed_writes(pool, &disk, h, &durable, &mut rng, seed);
        if seed % 2 == 1 {
            let s = pool.lookup("h@s").unwrap();
            pool.read(s, 0, &mut got).unwrap();
            assert!(got == durable, "seed {seed}: the snapshot is as taken");
        }
        assert_eq!(scrub_all(&pool).damaged_blocks, 0, "seed {seed}");
        assert_eq!(pool.damage_count().unwrap(), 0, "seed {seed}");
        assert_clean(&pool);
    }
}

/// A pool upgraded to version 10 (FORMAT.md §6.4, "Sums added by the
/// scrub"): the blocks written before have no sums, so damage to them is
/// not seen; one scrub gives every block of every live chunk a sum (row
/// volumes, their snapshots' shared and partial chunks, a home in the
/// pool), a second has none left to give, and from then on every damage
/// is seen, as in a pool created at version 10.
#[test]
fn a_scrub_gives_sums_to_the_blocks_written_before_the_upgrade() {
    // A scrub in steps, and one streamed (whose readers added sums at
    // once, and once lost some to each other: the homes lock they took
    // was exclusive).
    sums_for_blocks_written_before_the_upgrade(false);
    sums_for_blocks_written_before_the_upgrade(true);
}

fn sums_for_blocks_written_before_the_upgrade(streamed: bool) {
    let disk = SimDisk::new(64 * MIB);
    let dev: std::sync::Arc<dyn BlockDevice> = std::sync::Arc::new(disk.clone());
    let create = arbor_engine::CreateOptions {
        format_version: arbor_format::FormatVersion::new(9).unwrap(),
        journal_pages: Some(16),
        ..small_opts(CS as u32)
    };
    let pool = Pool::create(dev, &create, &open_opts()).unwrap();
    assert!(!pool.format_version().has_data_checksums());
    let mut w = World {
        pool,
        disk,
        model: BTreeMap::new(),
    };
    for (name, cow) in [("v", false), ("h", true)] {
        let id = if cow {
            w.pool.create_cow_volume(name, VOLUME).unwrap()
        } else {
            w.pool.create_volume(name, VOLUME).unwrap()
        };
        w.model.insert(name.into(), (id, vec![0; VOLUME as usize]));
        let all: Vec<u8> = (0..VOLUME / BLOCK as u64)
            .flat_map(|b| block(b + if cow { 500 } else { 1 }))
            .collect();
        w.write(name, 0, &all);
    }
    w.snapshot("v@s");
    w.snapshot("h@s");
    // Partial extents (blocks outside their masks) and store copies.
    for c in (0..VOLUME / CS).step_by(3) {
        w.write("v", c * CS + BLOCK as u64, &block(1000 + c));
        w.write("h", c * CS + 2 * BLOCK as u64, &block(2000 + c));
    }
    w.pool.flush().unwrap();
    assert!(w.pool.upgrade().unwrap());
    assert!(w.pool.format_version().has_data_checksums());
    // Old blocks: damage to them is not seen yet.
    let tagged = w.tagged_blocks();
    let mut old = vec![0u8; BLOCK];
    w.disk.read_at(&mut old, tagged[5]).unwrap();
    let mut bad = old.clone();
    bad[200] ^= 1;
    w.disk.write_at(&bad, tagged[5]).unwrap();
    let served_wrong = w.model.values().any(|(id, content)| {
        let mut buf = vec![0u8; VOLUME as usize];
        w.pool.read(*id, 0, &mut buf).unwrap();
        buf != *content
    });
    assert!(served_wrong, "no sums yet: the damage is served");
    w.disk.write_at(&old, tagged[5]).unwrap();
    let used = w.pool.pool_stats().unwrap().data_used_bytes;
    let first = if streamed {
        let steps = scrub_streamed(&w.pool, 0, 64 * 1024, None);
        let mut total = arbor_engine::ScrubStep::default();
        for s in steps {
            total.damaged_blocks += s.damaged_blocks;
            total.sums_added += s.sums_added;
            assert_eq!(s.sums_deferred, 0, "no home is being built");
        }
        total
    } else {
        scrub_all(&w.pool)
    };
    assert_eq!(first.damaged_blocks, 0);
    assert_eq!(
        first.sums_added,
        used / BLOCK as u64,
        "every block of every live chunk got a sum"
    );
    assert_eq!(scrub_all(&w.pool).sums_added, 0, "none left to give");
    assert_clean(&w.pool);
    let detected = damage_campaign(&mut w, 31, 24, |_, _, _| {});
    assert!(detected >= 20, "only {detected} of 24 damages were seen");
    // Durable: a reopen keeps them.
    w.pool.flush().unwrap();
    let disk = w.disk.clone();
    drop(w.pool);
    let pool = reopen(&disk);
    assert_eq!(scrub_all(&pool).sums_added, 0);
    assert_clean(&pool);
}

/// Runs the pass over new homes to its end, streamed in 64 KiB steps: the
/// sums it added.
fn sum_new_homes(pool: &Pool) -> u64 {
    let mut added = 0;
    while pool.home_sums_pending() > 0 {
        pool.sum_new_homes(64 * 1024, true, |step| {
            assert_eq!(step.sums_deferred, 0, "no home is being built");
            added += step.sums_added;
            true
        })
        .unwrap();
    }
    added
}

/// A scrub whose caller panics in `go_on` ends with that panic, its
/// readers let go (it waited for them forever: they waited for more jobs);
/// the pool scrubs again afterwards.
#[test]
fn a_scrub_whose_caller_panics_lets_its_readers_go() {
    let w = build(5);
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        w.pool.scrub(0, 16 * 1024, |_| panic!("the caller stops"))
    }));
    assert!(panicked.is_err());
    assert_eq!(scrub_all(&w.pool).damaged_blocks, 0);
    assert_clean(&w.pool);
}

/// Where on `disk` the 4 KiB block `bytes` is (the only copy).
fn device_offset(disk: &SimDisk, bytes: &[u8]) -> u64 {
    let image = disk.handle().visible_image();
    let found: Vec<usize> = image
        .chunks(BLOCK)
        .enumerate()
        .filter(|(_, b)| *b == bytes)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(found.len(), 1, "one copy of the block on the device");
    (found[0] * BLOCK) as u64
}

/// Flips a bit of the 4 KiB block at `at` on `disk`.
fn flip_at(disk: &SimDisk, at: u64) {
    let mut bytes = vec![0u8; BLOCK];
    disk.read_at(&mut bytes, at).unwrap();
    bytes[100] ^= 4;
    disk.write_at(&bytes, at).unwrap();
}

/// The blocks of a home that its build wrote without sums (zeroed when the
/// volume is created or grown, copied when it moves to grow or takes an
/// origin's data) get them from the pass over new homes: after it, damage
/// to a block no client wrote is refused as any other's. Before it such a
/// block has no sum: the test shows that too, so that it fails if the pass
/// stopped being what covers them.
#[test]
fn the_blocks_a_home_is_built_with_get_sums_from_the_pass_over_new_homes() {
    let disk = SimDisk::new(64 * MIB);
    let pool = small_journal_pool(&disk, CS as u32);
    let blocks = VOLUME / BLOCK as u64;
    let id = pool.create_cow_volume("h", VOLUME).unwrap();
    assert_eq!(pool.home_sums_pending(), VOLUME / CS);
    let marker = block(1);
    pool.write(id, 0, &marker).unwrap();
    pool.flush().unwrap();
    let base = device_offset(&disk, &marker);
    let read = |id: VolumeId, at: u64| {
        let mut buf = vec![0u8; BLOCK];
        pool.read(id, at, &mut buf).map(|()| buf)
    };
    // Before the pass: block 1 of chunk 5 was zeroed by the build, and
    // has no sum yet.
    let unwritten = 5 * CS + BLOCK as u64;
    flip_at(&disk, base + unwritten);
    assert!(read(id, unwritten).unwrap() != vec![0u8; BLOCK]);
    flip_at(&disk, base + unwritten);
    assert_eq!(
        sum_new_homes(&pool),
        blocks - 1,
        "every block but the one written"
    );
    assert_eq!(pool.home_sums_pending(), 0);
    flip_at(&disk, base + unwritten);
    assert!(matches!(read(id, unwritten), Err(Error::Damaged(_))));
    flip_at(&disk, base + unwritten);
    assert_eq!(read(id, unwritten).unwrap(), vec![0u8; BLOCK]);

    // Grown (in place here, or moved: the pass covers both).
    pool.resize("h", 2 * VOLUME).unwrap();
    assert!(pool.home_sums_pending() >= VOLUME / CS);
    assert!(sum_new_homes(&pool) >= blocks);
    // (A home that moved left its old copy behind: a new marker finds it.)
    let marker = block(2);
    pool.write(id, 0, &marker).unwrap();
    let base = device_offset(&disk, &marker);
    let grown = VOLUME + 3 * CS;
    flip_at(&disk, base + grown);
    assert!(matches!(read(id, grown), Err(Error::Damaged(_))));
    flip_at(&disk, base + grown);
    assert_eq!(read(id, grown).unwrap(), vec![0u8; BLOCK]);

    // An origin's data copied into the pool.
    let image: Vec<u8> = (0..blocks).flat_map(|b| block(100 + b)).collect();
    let origin = SimDisk::from_image(image.clone());
    let o = pool
        .attach_origin(
            "disk",
            std::sync::Arc::new(origin),
            arbor_engine::DeviceIdentity { dev: 7, ino: 1 },
        )
        .unwrap();
    assert_eq!(pool.home_sums_pending(), 0, "a device outside the pool");
    pool.copy_origin_to_pool("disk").unwrap();
    assert_eq!(pool.home_sums_pending(), VOLUME / CS);
    assert_eq!(sum_new_homes(&pool), blocks, "every copied block");
    let copied = 7 * BLOCK as u64;
    let at = device_offset(&disk, &image[copied as usize..copied as usize + BLOCK]);
    flip_at(&disk, at);
    assert!(matches!(read(o, copied), Err(Error::Damaged(_))));
    flip_at(&disk, at);
    assert_eq!(read(o, copied).unwrap(), block(107));

    // Everything has a sum now: a scrub adds none and finds nothing.
    let scrub = scrub_all(&pool);
    assert_eq!((scrub.sums_added, scrub.damaged_blocks), (0, 0));
    assert_clean(&pool);
}
