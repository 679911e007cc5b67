//! Isolation campaign: a deleted volume's data never shows in another volume.
//!
//! A "secret" volume is filled with data whose every sector names itself
//! (tag, offset), snapshotted and cloned (so its chunks are shared), and the
//! whole family is deleted. Then reclaim runs in small steps while new
//! volumes are created, written partially (a partial write to a fresh chunk
//! fills the rest of the chunk), snapshotted, cloned, discarded and
//! zeroed, in a pool small enough that freed chunks are reused at once. The
//! device is recorded; power is cut at many points (every flush boundary,
//! random events, with unflushed writes kept, dropped and torn). For every
//! crash image, and for the live pool at the end: the pool opens, `check`
//! is clean, and no sector of any volume holds secret data. Every tenth
//! crash image is also put back to work (reclaim to the end, new volumes,
//! partial writes) and scanned again.

use std::sync::Arc;

use arbor_engine::Pool;
use arbor_io::model::pattern;
use arbor_io::{BlockDevice, IoEvent, OverlayDevice, Recording, RecordingDevice, SimDisk};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::cut::Cutter;
use crate::{no_panic, small_create_opts, small_open_opts, MIB};

const SECRET_TAG: u64 = 0x5EC2E7;
const SECRET_BYTES: u64 = 2 * MIB;
const VOL_BYTES: u64 = MIB / 2;
/// 12 MiB of metadata regions and ~3 MiB of data: the secret family holds
/// two thirds of it, so new volumes soon reuse its chunks.
const POOL_BYTES: u64 = 15 * MIB;

#[derive(Debug, Default, Clone)]
pub struct Outcome {
    pub runs: u64,
    pub steps: u64,
    pub cut_points: u64,
    pub images: u64,
    /// Sectors read and scanned for secret data.
    pub sectors_scanned: u64,
    pub failures: Vec<String>,
}

impl crate::Tally for Outcome {
    fn failures(&self) -> &[String] {
        &self.failures
    }

    fn add(&mut self, other: Self) {
        self.runs += other.runs;
        self.steps += other.steps;
        self.cut_points += other.cut_points;
        self.images += other.images;
        self.sectors_scanned += other.sectors_scanned;
        self.failures.extend(other.failures);
    }
}

/// True when a sector holds secret data: its first word names an offset of
/// the secret volume and the whole sector matches the pattern there.
fn is_secret(sector: &[u8]) -> bool {
    let mut word = [0u8; 8];
    word.copy_from_slice(&sector[..8]);
    let at = u64::from_le_bytes(word) ^ SECRET_TAG.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    at < SECRET_BYTES
        && at.is_multiple_of(512)
        && sector == pattern(SECRET_TAG, at, sector.len()).as_slice()
}

/// Reads every volume of `pool` but the secret's family (which a crash
/// during their deletion may leave) and fails on any secret sector.
fn scan(pool: &Pool, scanned: &mut u64) -> Result<(), String> {
    for info in pool.list().map_err(|e| format!("list: {e}"))? {
        if info.name.starts_with("secret") {
            continue;
        }
        let mut buf = vec![0u8; info.size as usize];
        pool.read(info.id, 0, &mut buf)
            .map_err(|e| format!("read {}: {e}", info.name))?;
        for (s, sector) in buf.chunks(512).enumerate() {
            if is_secret(sector) {
                return Err(format!("{} sector {s} shows the deleted secret", info.name));
            }
        }
        *scanned += buf.len() as u64 / 512;
    }
    Ok(())
}

struct Run {
    rng: StdRng,
    pool: Pool,
    recording: Recording,
    cutter: Cutter,
    next: u64,
    outcome: Outcome,
    verified: u64,
}

pub fn run(seed: u64, steps: usize) -> Outcome {
    let mut outcome = Outcome {
        runs: 1,
        ..Outcome::default()
    };
    match no_panic(|| setup(seed)) {
        Ok(run) => {
            let mut run = run;
            if let Err(e) = run.workload(steps) {
                run.outcome.failures.push(format!("seed {seed}: {e}"));
            }
            run.outcome.cut_points = run.cutter.cut_points;
            run.outcome.images = run.cutter.images;
            run.outcome
        }
        Err(e) => {
            outcome.failures.push(format!("seed {seed}: {e}"));
            outcome
        }
    }
}

fn setup(seed: u64) -> Result<Run, String> {
    let e = |err: arbor_engine::Error| format!("setup: {err}");
    let mut rng = StdRng::seed_from_u64(seed);
    let chunk = if seed.is_multiple_of(2) { 4096 } else { 16384 };
    let (dev, recording) = RecordingDevice::new(Arc::new(SimDisk::new(POOL_BYTES)));
    let dev: Arc<dyn BlockDevice> = Arc::new(dev);
    let pool = Pool::create(dev, &small_create_opts(chunk), &small_open_opts()).map_err(e)?;
    let secret = pool.create_volume("secret", SECRET_BYTES).map_err(e)?;
    const PIECE: u64 = 256 << 10;
    for at in (0..SECRET_BYTES).step_by(PIECE as usize) {
        pool.write(secret, at, &pattern(SECRET_TAG, at, PIECE as usize))
            .map_err(e)?;
    }
    pool.snapshot("secret@s").map_err(e)?;
    let clone = pool.clone_snapshot("secret@s", "secret-clone").map_err(e)?;
    // The clone diverges a little: some secret chunks are referenced once, some twice.
    for _ in 0..20 {
        let at = rng.gen_range(0..SECRET_BYTES / 512 - 8) * 512;
        pool.write(clone, at, &pattern(rng.gen(), at, 4096))
            .map_err(e)?;
    }
    pool.flush().map_err(e)?;
    let mut cutter = Cutter::new(POOL_BYTES, 10, 3);
    cutter.skip(recording.take())?;
    Ok(Run {
        rng: StdRng::seed_from_u64(rng.gen()),
        pool,
        recording,
        cutter,
        next: 0,
        outcome: Outcome {
            runs: 1,
            ..Outcome::default()
        },
        verified: 0,
    })
}

impl Run {
    fn workload(&mut self, steps: usize) -> Result<(), String> {
        for name in ["secret-clone", "secret@s", "secret"] {
            self.pool.delete(name).map_err(|e| format!("delete: {e}"))?;
            self.cut()?;
        }
        for _ in 0..steps {
            self.outcome.steps += 1;
            self.step()
                .map_err(|e| format!("step {}: {e}", self.outcome.steps))?;
            self.cut()?;
        }
        while self
            .pool
            .reclaim(1 << 20)
            .map_err(|e| format!("reclaim: {e}"))?
            > 0
        {}
        self.cut()?;
        scan(&self.pool, &mut self.outcome.sectors_scanned).map_err(|e| format!("live pool: {e}"))
    }

    /// One random operation; keeps free space and volume count bounded.
    fn step(&mut self) -> arbor_engine::Result<()> {
        let pool = &self.pool;
        let vols: Vec<_> = pool.list()?;
        let writable: Vec<_> = vols.iter().filter(|v| !v.snapshot).collect();
        let stats = pool.pool_stats()?;
        let free = (stats.data_bytes - stats.data_used_bytes) / stats.chunk_size;
        if free * stats.chunk_size < VOL_BYTES || vols.len() > 10 {
            // With nothing left to delete, what the deletes freed is still
            // being reclaimed.
            if !vols.is_empty() {
                let victim = &vols[self.rng.gen_range(0..vols.len())];
                pool.delete(&victim.name)?;
            }
            return pool.reclaim(1 << 20).map(|_| ());
        }
        let Some(target) =
            (!writable.is_empty()).then(|| writable[self.rng.gen_range(0..writable.len())])
        else {
            self.next += 1;
            return pool
                .create_volume(&format!("new{}", self.next), VOL_BYTES)
                .map(|_| ());
        };
        let sectors = self.rng.gen_range(1..=16u64);
        let offset = self.rng.gen_range(0..VOL_BYTES / 512 - sectors) * 512;
        match self.rng.gen_range(0..100) {
            0..=39 => pool.write(
                target.id,
                offset,
                &pattern(self.rng.gen(), offset, sectors as usize * 512),
            ),
            40..=54 => pool.reclaim(self.rng.gen_range(1..6)).map(|_| ()),
            55..=62 => {
                self.next += 1;
                pool.create_volume(&format!("new{}", self.next), VOL_BYTES)
                    .map(|_| ())
            }
            63..=70 => {
                self.next += 1;
                let snap = format!("{}@s{}", target.name, self.next);
                pool.snapshot(&snap)?;
                pool.clone_snapshot(&snap, &format!("c{}", self.next))
                    .map(|_| ())
            }
            71..=78 => pool.discard(target.id, offset, sectors * 512),
            79..=84 => pool.write_zeroes(target.id, offset, sectors * 512, true),
            _ => pool.flush(),
        }
    }

    /// Verifies the crash images cut in the events since the last call.
    fn cut(&mut self) -> Result<(), String> {
        let events: Vec<IoEvent> = self.recording.take();
        for crash in self.cutter.feed(events, &mut self.rng)? {
            self.verified += 1;
            let exercise = self.verified.is_multiple_of(10);
            let mut scanned = 0;
            let result = no_panic(|| verify(crash.dev, exercise, &mut scanned));
            self.outcome.sectors_scanned += scanned;
            if let Err(e) = result {
                self.outcome.failures.push(format!(
                    "step {} cut after event {} ({:?}): {e}",
                    self.outcome.steps, crash.event, crash.kind
                ));
            }
        }
        Ok(())
    }
}

fn verify(dev: Arc<OverlayDevice>, exercise: bool, scanned: &mut u64) -> Result<(), String> {
    let pool = Pool::open(dev, &small_open_opts()).map_err(|e| format!("open: {e}"))?;
    let report = pool.check().map_err(|e| format!("check: {e}"))?;
    if !report.problems.is_empty() {
        return Err(format!("check: {:?}", report.problems));
    }
    scan(&pool, scanned)?;
    if exercise {
        // Back to work: finish reclaim, then new volumes written partially.
        while pool.reclaim(1 << 20).map_err(|e| format!("reclaim: {e}"))? > 0 {}
        for i in 0..3u64 {
            let name = format!("after-crash-{i}");
            let Ok(id) = pool.create_volume(&name, VOL_BYTES) else {
                break;
            };
            for k in 0..8u64 {
                let at = (k * 131 + i * 17) % (VOL_BYTES / 512 - 1) * 512;
                match pool.write(id, at, &pattern(k + 1, at, 512)) {
                    Ok(())
                    | Err(arbor_engine::Error::Exhausted(arbor_engine::Resource::DataSpace)) => {}
                    Err(e) => return Err(format!("write: {e}")),
                }
            }
        }
        scan(&pool, scanned)?;
    }
    Ok(())
}
