//! Exhaustion campaign: random sequences of every public operation on a
//! pool whose data and metadata regions and journal are tiny, so that
//! `NoSpace` and `MetadataFull` happen all the time, with a concurrent
//! writer on a volume of its own. Seeds run on one of three pools (by seed
//! modulo 3): one whose data region is the tight one (6 MiB); one whose
//! 1 MiB of metadata is (160 MiB of data), which bursts of scattered writes
//! and snapshots fill with leaves; and a *scattered* one, where a volume's
//! chunks lie one in sixteen over 32 space-map pages, twice what the
//! 16-page journal holds, so a discard or a shrink of much of it must
//! bound its work to fit.
//!
//! What must hold:
//! * an operation that fails leaves the pool exactly as before it (the
//!   volumes it names, their sizes and contents, and the list of names);
//! * only the failures a full pool explains happen (never `Failed`,
//!   corruption or a broken invariant);
//! * after every commit `check` is clean;
//! * reopens and power cuts (right after a flush) are interleaved: every
//!   acknowledged flushed write reads back. (Cuts at every point between
//!   flushes are the power-cut campaign's.)
//!
//! One seed in four makes its new volumes encrypted (docs/FORMAT.md §6.6,
//! one data key, 512-byte units; sizes and resizes whole chunks), its key
//! loaded again after every reopen and power cut: the same rules hold for
//! them, through the cipher.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use arbor_engine::{
    CreateOptions, Durability, Error, GrowOptions, Pool, Refusal, Resource, VolumeId,
};
use arbor_io::model::pattern;
use arbor_io::{BlockDevice, SimDisk};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::{no_panic, small_open_opts, Tally, MIB};

const CHUNK: u64 = 4096;
const SECTOR: u64 = 512;
const WRITER_VOLUME: &str = "w";

#[derive(Debug, Default)]
pub struct Outcome {
    pub operations: u64,
    pub resource_failures: u64,
    /// Per operation and error: how often it ran out.
    pub ran_out: BTreeMap<String, u64>,
    /// Writes of the concurrent writer that ran out (each checked unchanged).
    pub writer_ran_out: u64,
    pub commits_checked: u64,
    pub reopens: u64,
    pub power_cuts: u64,
    pub writer_ops: u64,
    /// Shrinks of the writer's volume raced by writes near its end.
    pub resize_races: u64,
    /// Runs whose new volumes were encrypted.
    pub encrypted_runs: u64,
    /// Online growths of the pool (with the writer writing).
    pub growths: u64,
    /// Writes that did not fit an empty transaction's journal and ran in
    /// pieces (`PoolStats::split_units`, summed over every open).
    pub split_units: u64,
    /// How chunk writes landed (`PoolStats::chunk_writes`, summed over
    /// every open): the plans the campaign reached.
    pub chunk_writes: arbor_engine::ChunkWrites,
    pub failures: Vec<String>,
}

impl Tally for Outcome {
    fn add(&mut self, o: Self) {
        self.operations += o.operations;
        self.resource_failures += o.resource_failures;
        for (k, v) in o.ran_out {
            *self.ran_out.entry(k).or_default() += v;
        }
        self.writer_ran_out += o.writer_ran_out;
        self.commits_checked += o.commits_checked;
        self.reopens += o.reopens;
        self.power_cuts += o.power_cuts;
        self.encrypted_runs += o.encrypted_runs;
        self.writer_ops += o.writer_ops;
        self.resize_races += o.resize_races;
        self.growths += o.growths;
        self.split_units += o.split_units;
        self.chunk_writes += o.chunk_writes;
        self.failures.extend(o.failures);
    }
    fn failures(&self) -> &[String] {
        &self.failures
    }
}

impl Outcome {
    /// "write: NoSpace 12, MetadataFull 3; snapshot: ..." for reports.
    pub fn ran_out_summary(&self) -> String {
        let mut out = String::new();
        for (k, v) in &self.ran_out {
            let _ = write!(out, "{}{k} {v}", if out.is_empty() { "" } else { ", " });
        }
        out
    }

    /// Operation kinds that ran out of data space and of metadata at least once.
    pub fn ran_out_of(&self, error: &str) -> Vec<&str> {
        self.ran_out
            .keys()
            .filter_map(|k| k.strip_suffix(error).map(|op| op.trim_end_matches(": ")))
            .collect()
    }
}

#[derive(Clone, Debug, PartialEq)]
struct Vol {
    snapshot: bool,
    /// For a snapshot, its volume's name (renames follow).
    data: Vec<u8>,
}

/// The pool as the campaign knows it: every name and its contents.
type Model = BTreeMap<String, Vol>;

/// Operations that free space: they must work when metadata is full.
const FREE_SPACE: [&str; 4] = ["delete", "rollback", "reclaim", "flush"];

fn is_resource(e: &Error) -> bool {
    matches!(
        e,
        Error::Exhausted(Resource::DataSpace) | Error::Exhausted(Resource::Metadata)
    )
}

/// What the tally calls a resource error: the names it had before errors
/// were classes (`NoSpace`, `MetadataFull`), which the reports quote.
fn resource_name(e: &Error) -> &'static str {
    match e {
        Error::Exhausted(Resource::DataSpace) => "NoSpace",
        Error::Exhausted(Resource::Metadata) => "MetadataFull",
        _ => "other",
    }
}

/// Errors a random operation may legitimately get besides running out.
fn is_refusal(e: &Error) -> bool {
    matches!(
        e,
        Error::Refused(Refusal::NotFound(_))
            | Error::Refused(Refusal::AlreadyExists(_))
            | Error::Refused(Refusal::Invalid(_))
            | Error::Refused(Refusal::InvalidName { .. })
            | Error::Refused(Refusal::ReadOnly(_))
    )
}

fn read_all(pool: &Pool, id: VolumeId) -> Result<Vec<u8>, String> {
    let size = pool.info(id).map_err(|e| e.to_string())?.size;
    let mut buf = vec![0; size as usize];
    pool.read(id, 0, &mut buf).map_err(|e| e.to_string())?;
    Ok(buf)
}

/// Compares the whole pool with the model.
fn compare(pool: &Pool, model: &Model, when: &str) -> Result<(), String> {
    let mut list = pool.list().map_err(|e| format!("{when}: list: {e}"))?;
    // The concurrent writer's volume is checked by the writer.
    list.retain(|i| i.name != WRITER_VOLUME);
    let names: Vec<&String> = list.iter().map(|i| &i.name).collect();
    let want: Vec<&String> = model.keys().collect();
    if names != want {
        let extra: Vec<_> = names.iter().filter(|n| !model.contains_key(**n)).collect();
        let missing: Vec<_> = want.iter().filter(|n| !names.contains(n)).collect();
        return Err(format!(
            "{when}: the pool has {extra:?} the model has not, and lacks {missing:?}"
        ));
    }
    for info in &list {
        let vol = &model[&info.name];
        if info.snapshot != vol.snapshot || info.size != vol.data.len() as u64 {
            return Err(format!(
                "{when}: {} is snapshot={} size={}, model snapshot={} size={}",
                info.name,
                info.snapshot,
                info.size,
                vol.snapshot,
                vol.data.len()
            ));
        }
        let data =
            read_all(pool, info.id).map_err(|e| format!("{when}: read {}: {e}", info.name))?;
        if data != vol.data {
            let at = data.iter().zip(&vol.data).position(|(a, b)| a != b);
            return Err(format!("{when}: {} differs at byte {at:?}", info.name));
        }
    }
    Ok(())
}

fn check_clean(pool: &Pool, when: &str) -> Result<(), String> {
    let report = pool.check().map_err(|e| format!("{when}: check: {e}"))?;
    if report.is_clean() {
        Ok(())
    } else {
        Err(format!(
            "{when}: check: {:?}",
            &report.problems[..report.problems.len().min(5)]
        ))
    }
}

fn sector_range(rng: &mut StdRng, size: u64, max: u64) -> (u64, u64) {
    let sectors = size / SECTOR;
    let off = rng.gen_range(0..sectors);
    let len = rng.gen_range(1..=(max / SECTOR).min(sectors - off));
    (off * SECTOR, len * SECTOR)
}

/// One campaign run: `steps` operations from `seed`.
pub fn run(seed: u64, steps: usize) -> Outcome {
    let mut out = Outcome::default();
    if let Err(e) = no_panic(|| run_inner(seed, steps, &mut out)) {
        out.failures.push(format!("seed {seed}: {e}"));
    }
    out
}

fn run_inner(seed: u64, steps: usize, out: &mut Outcome) -> Result<(), String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let metadata_tight = seed % 3 == 1;
    let scattered = seed % 3 == 2;
    let mut disk = SimDisk::new(match (metadata_tight, scattered) {
        (true, _) => 160 * MIB,
        (_, true) => 136 * MIB,
        _ => 6 * MIB,
    });
    let dev: Arc<dyn BlockDevice> = Arc::new(disk.clone());
    // Half the plain runs at 16 KiB chunks, where whole-block writes make
    // partial extents (FORMAT.md §6.3) and reclaim fills them.
    let chunk = if seed.is_multiple_of(6) {
        4 * CHUNK
    } else {
        CHUNK
    };
    let opts = CreateOptions {
        chunk_size: chunk as u32,
        metadata_bytes: Some(MIB),
        journal_pages: Some(16),
        ..CreateOptions::default()
    };
    let mut pool =
        Arc::new(Pool::create(dev, &opts, &small_open_opts()).map_err(|e| e.to_string())?);
    let key = if seed % 4 == 3 {
        out.encrypted_runs += 1;
        Some(crate::RunKey::create(&pool)?)
    } else {
        None
    };
    let mut model = Model::new();
    let mut next_name = 0u64;
    // The concurrent writer's volume: outside the model, checked by the writer.
    pool.create_volume(WRITER_VOLUME, 2 * MIB)
        .map_err(|e| e.to_string())?;
    if metadata_tight {
        fill_metadata(&pool, &mut model, &mut next_name, &mut rng)?;
    }
    if scattered {
        scatter(&pool, &mut model, &mut next_name, &mut rng)?;
    }
    let mut writer = Writer::start(&pool, seed);
    for step in 0..steps {
        out.operations += 1;
        let names: Vec<String> = model.keys().cloned().collect();
        let vols: Vec<&String> = names.iter().filter(|n| !model[*n].snapshot).collect();
        let snaps: Vec<&String> = names.iter().filter(|n| model[*n].snapshot).collect();
        let pick = |rng: &mut StdRng, from: &[&String]| -> Option<String> {
            (!from.is_empty()).then(|| from[rng.gen_range(0..from.len())].clone())
        };
        let when = format!("seed {seed} step {step}");
        // The operation, and what it acts on: a volume, a snapshot or any
        // name. With nothing of that kind yet, it creates a volume instead.
        let mut kind = rng.gen_range(0..100);
        let target = match kind {
            0..=44 | 53..=62 | 81..=89 => pick(&mut rng, &vols),
            63..=68 | 77..=80 => pick(&mut rng, &snaps),
            69..=76 => pick(&mut rng, &names.iter().collect::<Vec<_>>()),
            _ => Some(String::new()),
        };
        let target = target.unwrap_or_else(|| {
            kind = 45;
            String::new()
        });
        // Each arm updates the model only when its operation succeeds, so
        // after a failure the model is the state before it.
        let (what, result): (String, Result<(), Error>) = match kind {
            32..=34 => brim(&pool, &mut model, &target, &mut next_name, &mut rng)?,
            0..=31 => {
                let v = target.clone();
                let id = pool.lookup(&v).map_err(|e| format!("{when}: {e}"))?;
                let size = model[&v].data.len() as u64;
                // A burst of scattered small writes (each its own call; one
                // extent each, so they fill metadata) or one write of up to
                // 512 KiB over several chunks.
                let most = if metadata_tight { 256 } else { 64 };
                let burst = if rng.gen_bool(0.4) {
                    rng.gen_range(2..=most)
                } else {
                    1
                };
                let mut result = (String::new(), Ok(()));
                for _ in 0..burst {
                    let (mut off, mut len) =
                        sector_range(&mut rng, size, if burst > 1 { 4096 } else { 512 * 1024 });
                    if chunk > CHUNK && size >= 4096 && rng.gen_bool(0.5) {
                        // One to three whole 4 KiB blocks (all of a
                        // partial's base, some of its mask: every plan of
                        // a partial extent).
                        let blocks = rng.gen_range(1..=3u64).min(size / 4096);
                        let last = size / 4096 * 4096 - blocks * 4096;
                        (off, len) = ((off / 4096 * 4096).min(last), blocks * 4096);
                    }
                    let data = pattern(rng.gen(), off, len as usize);
                    let r = pool.write(id, off, &data);
                    let what = format!("write {v} {off}+{len}");
                    match r {
                        Ok(()) => {
                            let m = model.get_mut(&v).ok_or("model")?;
                            m.data[off as usize..(off + len) as usize].copy_from_slice(&data);
                        }
                        Err(e) => {
                            result = (what, Err(e));
                            break;
                        }
                    }
                }
                result
            }
            35..=44 => {
                let v = target.clone();
                let size = model[&v].data.len() as u64;
                let (off, len) = sector_range(&mut rng, size, size);
                let id = pool.lookup(&v).map_err(|e| format!("{when}: {e}"))?;
                let (op, r) = match rng.gen_range(0..10) {
                    0..=4 => ("discard", pool.discard(id, off, len)),
                    5..=7 => ("zero", pool.write_zeroes(id, off, len, false)),
                    _ => ("zero-keep", pool.write_zeroes(id, off, len, true)),
                };
                if r.is_ok() {
                    let m = model.get_mut(&v).ok_or("model")?;
                    m.data[off as usize..(off + len) as usize].fill(0);
                }
                (format!("{op} {v} {off}+{len}"), r)
            }
            45..=52 => create(&pool, &mut model, &mut next_name, &mut rng, key.as_ref()),
            53..=62 => {
                let v = target.clone();
                next_name += 1;
                let name = format!("{v}@s{next_name}");
                let r = pool.snapshot_with(&name, alternate(next_name)).map(|_| ());
                if r.is_ok() {
                    let data = model[&v].data.clone();
                    model.insert(
                        name.clone(),
                        Vol {
                            snapshot: true,
                            data,
                        },
                    );
                }
                (format!("snapshot {name}"), r)
            }
            63..=68 => {
                let s = target.clone();
                next_name += 1;
                let name = format!("c{next_name}");
                let r = pool
                    .clone_snapshot_with(&s, &name, alternate(next_name))
                    .map(|_| ());
                if r.is_ok() {
                    let data = model[&s].data.clone();
                    model.insert(
                        name.clone(),
                        Vol {
                            snapshot: false,
                            data,
                        },
                    );
                }
                (format!("clone {s} {name}"), r)
            }
            69..=76 => {
                let n = target.clone();
                let r = pool.delete(&n);
                if r.is_ok() {
                    model.remove(&n);
                }
                (format!("delete {n}"), r)
            }
            77..=80 => {
                let s = target.clone();
                let v = s.split('@').next().unwrap_or_default().to_owned();
                let r = pool.rollback(&v, &s);
                if r.is_ok() {
                    let data = model[&s].data.clone();
                    model.get_mut(&v).ok_or("model")?.data = data;
                }
                (format!("rollback {v} {s}"), r)
            }
            81..=86 if rng.gen_bool(0.3) => {
                writer.stop(out)?;
                let r = resize_race(&pool, seed ^ step as u64, &when, out);
                writer = Writer::start(&pool, seed + step as u64);
                r?
            }
            81..=86 => {
                let v = target.clone();
                let size = model[&v].data.len() as u64;
                // An encrypted volume's sizes are whole chunks.
                let encrypted = pool
                    .lookup(&v)
                    .and_then(|id| pool.info(id))
                    .map_err(|e| format!("{when}: {e}"))?
                    .key_slot
                    .is_some();
                let unit = if encrypted { chunk } else { SECTOR };
                let new = rng.gen_range(1..=(2 * size / unit).clamp(1, 16 * MIB / unit)) * unit;
                let r = pool.resize(&v, new);
                if r.is_ok() {
                    model
                        .get_mut(&v)
                        .ok_or("model")?
                        .data
                        .resize(new as usize, 0);
                }
                (format!("resize {v} {size}->{new}"), r)
            }
            87..=89 => {
                let v = target.clone();
                next_name += 1;
                let to = format!("r{next_name}");
                let r = pool.rename(&v, &to);
                if r.is_ok() {
                    let moved: Vec<String> = model
                        .keys()
                        .filter(|n| *n == &v || n.starts_with(&format!("{v}@")))
                        .cloned()
                        .collect();
                    for n in moved {
                        let vol = model.remove(&n).ok_or("model")?;
                        model.insert(n.replacen(&v, &to, 1), vol);
                    }
                }
                (format!("rename {v} {to}"), r)
            }
            90..=91 => (
                "reclaim".into(),
                pool.reclaim(rng.gen_range(1..200))
                    .and_then(|_| pool.fill_partials(rng.gen_range(1..200)))
                    .map(|_| ()),
            ),
            92 => {
                // A small growth, online: the writer keeps writing. Too
                // much metadata for the room added is refused.
                let size = disk.size() + rng.gen_range(16..=128) * chunk;
                let metadata_bytes = rng.gen_bool(0.5).then(|| rng.gen_range(0..=32) * 4096);
                let r = pool.grow(&GrowOptions {
                    size: Some(size),
                    metadata_bytes,
                });
                if r.is_ok() {
                    out.growths += 1;
                    check_clean(&pool, &format!("{when}: after growth"))?;
                    compare(&pool, &model, &format!("{when}: after growth"))?;
                }
                (format!("grow {size} {metadata_bytes:?}"), r.map(|_| ()))
            }
            93..=96 => {
                let r = pool.flush();
                if r.is_ok() {
                    out.commits_checked += 1;
                    check_clean(&pool, &when)?;
                }
                ("flush".into(), r)
            }
            _ => {
                // A reopen (close and open) or a power cut, right after a
                // flush: everything acknowledged and flushed must read back.
                let cut = kind > 98;
                writer.stop(out)?;
                match pool.flush() {
                    Ok(()) => {
                        if let Ok(stats) = pool.pool_stats() {
                            out.split_units += stats.split_units;
                            out.chunk_writes += stats.chunk_writes;
                        }
                        if cut {
                            disk = SimDisk::from_image(disk.handle().durable_image());
                            out.power_cuts += 1;
                        } else {
                            out.reopens += 1;
                        }
                        drop(pool);
                        let dev: Arc<dyn BlockDevice> = Arc::new(disk.clone());
                        let when =
                            format!("{when}: after {}", if cut { "power cut" } else { "reopen" });
                        pool = Arc::new(
                            Pool::open(dev, &small_open_opts())
                                .map_err(|e| format!("{when}: open: {e}"))?,
                        );
                        if let Some(key) = &key {
                            key.load(&pool).map_err(|e| format!("{when}: {e}"))?;
                        }
                        compare(&pool, &model, &when)?;
                        check_clean(&pool, &when)?;
                    }
                    Err(e) if is_resource(&e) => {}
                    Err(e) => return Err(format!("{when}: flush: {e}")),
                }
                writer = Writer::start(&pool, seed + step as u64);
                ((if cut { "power cut" } else { "reopen" }).into(), Ok(()))
            }
        };
        match result {
            Ok(()) => {}
            Err(e) if is_resource(&e) || is_refusal(&e) => {
                let op = what.split(' ').next().unwrap_or_default();
                if matches!(e, Error::Exhausted(Resource::Metadata)) && FREE_SPACE.contains(&op) {
                    return Err(format!(
                        "{when}: {what} ran out of metadata (it frees space, so it may use the reserve)"
                    ));
                }
                if is_resource(&e) {
                    out.resource_failures += 1;
                    let key = format!("{op}: {}", resource_name(&e));
                    *out.ran_out.entry(key).or_default() += 1;
                }
                compare(&pool, &model, &format!("{when}: after failed {what} ({e})"))?;
            }
            Err(e) => return Err(format!("{when}: {what}: {e}")),
        }
    }
    writer.stop(out)?;
    if let Ok(stats) = pool.pool_stats() {
        out.split_units += stats.split_units;
        out.chunk_writes += stats.chunk_writes;
    }
    pool.flush()
        .map_err(|e| format!("seed {seed}: final flush: {e}"))?;
    check_clean(&pool, &format!("seed {seed}: end"))?;
    compare(&pool, &model, &format!("seed {seed}: end"))
}

/// Shrinks the writer's volume while a thread writes near its end, then
/// grows it back: whatever the interleaving, no write lands past the end
/// once the shrink has returned, so the grown tail reads as zeros. (A write
/// is atomic: one that ends past the new size fails whole.) The writer is
/// stopped; it reloads its model when it starts again.
fn resize_race(
    pool: &Arc<Pool>,
    seed: u64,
    when: &str,
    out: &mut Outcome,
) -> Result<(String, Result<(), Error>), String> {
    let id = pool.lookup(WRITER_VOLUME).map_err(|e| e.to_string())?;
    let size = pool.info(id).map_err(|e| e.to_string())?.size;
    let mut rng = StdRng::seed_from_u64(seed);
    let shrunk = size - rng.gen_range(1..2 * CHUNK / SECTOR) * SECTOR;
    let stop = Arc::new(AtomicBool::new(false));
    let writes = Arc::new(AtomicU64::new(0));
    let racer = {
        let (pool, stop, writes) = (Arc::clone(pool), Arc::clone(&stop), Arc::clone(&writes));
        std::thread::spawn(move || -> Result<(), String> {
            while !stop.load(Ordering::Relaxed) {
                let off = size - rng.gen_range(1..=3 * CHUNK / SECTOR) * SECTOR;
                let len = rng.gen_range(1..=(size - off) / SECTOR) * SECTOR;
                match pool.write(id, off, &pattern(rng.gen(), off, len as usize)) {
                    Ok(()) | Err(Error::Refused(Refusal::Invalid(_))) => {}
                    Err(e) if is_resource(&e) => {}
                    Err(e) => return Err(format!("racer: {e}")),
                }
                writes.fetch_add(1, Ordering::Relaxed);
            }
            Ok(())
        })
    };
    // Let the racer get going (synchronisation, not timing: the check
    // below holds whatever the interleaving).
    while writes.load(Ordering::Relaxed) < 2 && !racer.is_finished() {
        std::thread::yield_now();
    }
    let shrink = pool.resize(WRITER_VOLUME, shrunk);
    stop.store(true, Ordering::Relaxed);
    racer.join().map_err(|_| "racer panicked".to_string())??;
    let what = format!("resize-race {WRITER_VOLUME} {size}->{shrunk}");
    if shrink.is_err() {
        return Ok((what, shrink));
    }
    out.resize_races += 1;
    match pool.resize(WRITER_VOLUME, size) {
        Ok(()) => {}
        Err(e) if is_resource(&e) => return Ok((format!("{what}->{size}"), Err(e))),
        Err(e) => return Err(format!("{when}: {what}: grow: {e}")),
    }
    let mut tail = vec![0u8; (size - shrunk) as usize];
    pool.read(id, shrunk, &mut tail)
        .map_err(|e| e.to_string())?;
    if let Some(at) = tail.iter().position(|b| *b != 0) {
        return Err(format!(
            "{when}: {what}->{size}: byte {} past the shrink's end is not zero: a write landed after the shrink returned",
            shrunk + at as u64
        ));
    }
    Ok((what, Ok(())))
}

/// Fills the pool to the brim: snapshots of volume `v`, each followed by a
/// burst of scattered one-sector writes (whole blocks in a few chunks, at
/// chunks of several blocks) until a write runs out of metadata,
/// then snapshots alone until one runs out (at most 64 rounds). Returns the
/// operation that failed and its error, for the caller's checks; the
/// operations after it then run on a full pool.
fn brim(
    pool: &Pool,
    model: &mut Model,
    v: &str,
    next_name: &mut u64,
    rng: &mut StdRng,
) -> Result<(String, Result<(), Error>), String> {
    let id = pool.lookup(v).map_err(|e| e.to_string())?;
    let size = model[v].data.len() as u64;
    let chunk = pool.pool_stats().map_err(|e| e.to_string())?.chunk_size;
    // At chunks of several blocks, whole blocks in the volume's first four
    // chunks: each snapshot shares them, so the writes make, extend, copy
    // and stack partial extents (FORMAT.md §6.3) until space runs out.
    let hot = (chunk > 4096).then_some((size / 4096).min(4 * chunk / 4096));
    let mut writes = true;
    for _ in 0..64 {
        *next_name += 1;
        let snap = format!("{v}@s{next_name}");
        if let Err(e) = pool.snapshot(&snap) {
            return Ok((format!("snapshot {snap}"), Err(e)));
        }
        let data = model[v].data.clone();
        model.insert(
            snap,
            Vol {
                snapshot: true,
                data,
            },
        );
        for _ in 0..if writes { 16 } else { 0 } {
            let (off, len) = match hot.filter(|&h| h > 0) {
                Some(hot) => {
                    let blocks = rng.gen_range(1..=3u64).min(hot);
                    (rng.gen_range(0..=hot - blocks) * 4096, blocks * 4096)
                }
                None => (rng.gen_range(0..size / SECTOR) * SECTOR, SECTOR),
            };
            let bytes = pattern(rng.gen(), off, len as usize);
            match pool.write(id, off, &bytes) {
                // Writes need more metadata than a snapshot: go on with
                // snapshots alone until one runs out too.
                Err(Error::Exhausted(Resource::Metadata)) => {
                    writes = false;
                    break;
                }
                Err(e) => return Ok((format!("write {v} {off}+{len}"), Err(e))),
                Ok(()) => {}
            }
            let m = model.get_mut(v).ok_or("model")?;
            m.data[off as usize..(off + len) as usize].copy_from_slice(&bytes);
        }
    }
    Ok(("brim".into(), Ok(())))
}

/// Writes an 8 MiB volume one chunk in sixteen, the fifteen between going to
/// a ballast volume that is then deleted and reclaimed: the volume's chunks
/// lie over 32 space-map pages (the journal holds 16).
fn scatter(
    pool: &Pool,
    model: &mut Model,
    next_name: &mut u64,
    rng: &mut StdRng,
) -> Result<(), String> {
    const SIZE: u64 = 8 * MIB;
    const BETWEEN: u64 = 15;
    let e = |e: Error| format!("scattering: {e}");
    *next_name += 1;
    let name = format!("v{next_name}");
    let id = pool.create_volume(&name, SIZE).map_err(e)?;
    let ballast = pool.create_volume("ballast", SIZE * BETWEEN).map_err(e)?;
    let mut data = vec![0; SIZE as usize];
    for chunk in 0..SIZE / CHUNK {
        let off = chunk * CHUNK;
        let bytes = pattern(rng.gen(), off, CHUNK as usize);
        pool.write(id, off, &bytes).map_err(e)?;
        data[off as usize..(off + CHUNK) as usize].copy_from_slice(&bytes);
        let at = chunk * BETWEEN * CHUNK;
        pool.write(ballast, at, &vec![1; (BETWEEN * CHUNK) as usize])
            .map_err(e)?;
    }
    pool.delete("ballast").map_err(e)?;
    while pool.reclaim(4096).map_err(e)? > 0 {}
    pool.flush().map_err(e)?;
    model.insert(
        name,
        Vol {
            snapshot: false,
            data,
        },
    );
    Ok(())
}

/// Fills 65% of the metadata before a run starts: a volume of
/// scattered chunks (one extent each), then snapshots of it, each followed by
/// one write into every leaf (so the snapshot pins a copy of every leaf).
fn fill_metadata(
    pool: &Pool,
    model: &mut Model,
    next_name: &mut u64,
    rng: &mut StdRng,
) -> Result<(), String> {
    const SIZE: u64 = 8 * MIB;
    let full = |pool: &Pool| -> Result<bool, String> {
        let st = pool.pool_stats().map_err(|e| e.to_string())?;
        Ok(st.metadata_used_bytes * 100 >= st.metadata_bytes * 65)
    };
    *next_name += 1;
    let name = format!("v{next_name}");
    let id = pool.create_volume(&name, SIZE).map_err(|e| e.to_string())?;
    let mut data = vec![0; SIZE as usize];
    let mut write = |pool: &Pool, data: &mut Vec<u8>, chunk: u64| -> Result<(), Error> {
        let off = chunk * CHUNK;
        let bytes = pattern(rng.gen(), off, SECTOR as usize);
        pool.write(id, off, &bytes)?;
        data[off as usize..(off + SECTOR) as usize].copy_from_slice(&bytes);
        Ok(())
    };
    let mut result = Ok(());
    for chunk in (0..SIZE / CHUNK).step_by(2) {
        result = write(pool, &mut data, chunk);
        if result.is_err() {
            break;
        }
    }
    while result.is_ok() && !full(pool)? {
        *next_name += 1;
        let snap = format!("{name}@s{next_name}");
        if let Err(e) = pool.snapshot(&snap) {
            result = Err(e);
            break;
        }
        model.insert(
            snap,
            Vol {
                snapshot: true,
                data: data.clone(),
            },
        );
        for chunk in (0..SIZE / CHUNK).step_by(64) {
            result = write(pool, &mut data, chunk);
            if result.is_err() {
                break;
            }
        }
    }
    model.insert(
        name,
        Vol {
            snapshot: false,
            data,
        },
    );
    match result {
        Ok(()) => Ok(()),
        Err(e) if is_resource(&e) => Ok(()),
        Err(e) => Err(format!("filling metadata: {e}")),
    }
}

fn create(
    pool: &Pool,
    model: &mut Model,
    next_name: &mut u64,
    rng: &mut StdRng,
    key: Option<&crate::RunKey>,
) -> (String, Result<(), Error>) {
    *next_name += 1;
    let name = format!("v{next_name}");
    let (size, r) = match key {
        None => {
            let size = rng.gen_range(1..=8 * MIB / SECTOR) * SECTOR;
            (size, pool.create_volume(&name, size).map(|_| ()))
        }
        Some(key) => {
            let chunk = pool.chunk_size();
            let size = rng.gen_range(1..=8 * MIB / chunk) * chunk;
            let r = pool.create_encrypted_volume(&name, size, key.slot);
            (size, r.map(|_| ()))
        }
    };
    if r.is_ok() {
        model.insert(
            name.clone(),
            Vol {
                snapshot: false,
                data: vec![0; size as usize],
            },
        );
    }
    (format!("create {name} {size}"), r)
}

/// A thread writing its own volume `w` while the campaign runs; after each
/// failed write it checks the range is unchanged.
struct Writer {
    stop: Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<Result<(u64, u64), String>>>,
}

/// A run that fails stops its writer too (else the thread writes on,
/// unflushed, and the simulated disk's write cache grows until the
/// campaign runs out of memory: a long run was killed that way).
impl Drop for Writer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

impl Writer {
    fn start(pool: &Arc<Pool>, seed: u64) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let (pool, flag) = (Arc::clone(pool), Arc::clone(&stop));
        let handle = std::thread::spawn(move || -> Result<(u64, u64), String> {
            let id = pool.lookup(WRITER_VOLUME).map_err(|e| e.to_string())?;
            let mut model = read_all(&pool, id)?;
            let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed);
            let (mut ops, mut ran_out) = (0, 0);
            while !flag.load(Ordering::Relaxed) {
                ops += 1;
                let (off, len) = sector_range(&mut rng, model.len() as u64, 32 * 1024);
                let range = off as usize..(off + len) as usize;
                let data = pattern(rng.gen(), off, len as usize);
                let mut full = false;
                match pool.write(id, off, &data) {
                    Ok(()) => model[range].copy_from_slice(&data),
                    Err(e) if is_resource(&e) => {
                        ran_out += 1;
                        full = true;
                        let mut now = vec![0; len as usize];
                        pool.read(id, off, &mut now).map_err(|e| e.to_string())?;
                        if now != model[range] {
                            return Err(format!(
                                "writer: a failed write ({e}) changed {off}+{len}"
                            ));
                        }
                    }
                    Err(e) => return Err(format!("writer: {e}")),
                }
                // Pacing only (the main sequence must get the locks too;
                // on a full pool each failed write commits).
                std::thread::sleep(std::time::Duration::from_micros(if full {
                    2000
                } else {
                    100
                }));
            }
            let now = read_all(&pool, id)?;
            if now != model {
                return Err("writer: volume w differs from its model".into());
            }
            Ok((ops, ran_out))
        });
        Self {
            stop,
            handle: Some(handle),
        }
    }

    fn stop(&mut self, out: &mut Outcome) -> Result<(), String> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let (ops, ran_out) = h.join().map_err(|_| "writer panicked".to_string())??;
            out.writer_ops += ops;
            out.writer_ran_out += ran_out;
        }
        Ok(())
    }
}

/// Every other snapshot and clone is made durable by the next commit
/// instead of its own: out of space or metadata, either kind must leave no
/// trace. (Chosen without drawing from the workload's generator, which
/// would change every seed's path.)
fn alternate(n: u64) -> Durability {
    if n.is_multiple_of(2) {
        Durability::Deferred
    } else {
        Durability::Committed
    }
}
