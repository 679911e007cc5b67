//! Exhaustion campaign: random sequences of every public operation on a
//! pool whose data and metadata regions and journal are tiny, so that
//! `NoSpace` and `MetadataFull` happen all the time, with a concurrent
//! writer on a volume of its own.
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

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use arbor_engine::{CreateOptions, Error, Pool, VolumeId};
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
    pub commits_checked: u64,
    pub reopens: u64,
    pub power_cuts: u64,
    pub writer_ops: u64,
    pub failures: Vec<String>,
}

impl Tally for Outcome {
    fn add(&mut self, o: Self) {
        self.operations += o.operations;
        self.resource_failures += o.resource_failures;
        self.commits_checked += o.commits_checked;
        self.reopens += o.reopens;
        self.power_cuts += o.power_cuts;
        self.writer_ops += o.writer_ops;
        self.failures.extend(o.failures);
    }
    fn failures(&self) -> &[String] {
        &self.failures
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

fn is_resource(e: &Error) -> bool {
    matches!(e, Error::NoSpace | Error::MetadataFull)
}

/// Errors a random operation may legitimately get besides running out.
fn is_refusal(e: &Error) -> bool {
    matches!(
        e,
        Error::NotFound(_)
            | Error::AlreadyExists(_)
            | Error::InvalidArgument(_)
            | Error::InvalidName { .. }
            | Error::ReadOnly(_)
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
        return Err(format!("{when}: names {names:?}, model {want:?}"));
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
        if let Some(at) = data.iter().zip(&vol.data).position(|(a, b)| a != b) {
            return Err(format!("{when}: {} differs at byte {at}", info.name));
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

/// One campaign run: `steps` operations from `seed`. With `spanning`,
/// writes, and discards and zeroes with partial ends, may span several
/// chunks. Those are not atomic yet when space runs out part way (a
/// multi-chunk write is planned and mapped chunk by chunk): docs/RELIABILITY.md.
pub fn run(seed: u64, steps: usize, spanning: bool) -> Outcome {
    let mut out = Outcome::default();
    if let Err(e) = no_panic(|| run_inner(seed, steps, spanning, &mut out)) {
        out.failures.push(format!("seed {seed}: {e}"));
    }
    out
}

fn run_inner(seed: u64, steps: usize, spanning: bool, out: &mut Outcome) -> Result<(), String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut disk = SimDisk::new(6 * MIB);
    let dev: Arc<dyn BlockDevice> = Arc::new(disk.clone());
    let opts = CreateOptions {
        chunk_size: CHUNK as u32,
        metadata_bytes: Some(MIB),
        journal_pages: Some(16),
    };
    let mut pool =
        Arc::new(Pool::create(dev, &opts, &small_open_opts()).map_err(|e| e.to_string())?);
    let mut model = Model::new();
    let mut next_name = 0u64;
    // The concurrent writer's volume: outside the model, checked by the writer.
    pool.create_volume(WRITER_VOLUME, 2 * MIB)
        .map_err(|e| e.to_string())?;
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
        let before = model.clone();
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
        // Each arm updates the model when the operation succeeds.
        let (what, result): (String, Result<(), Error>) = match kind {
            0..=34 => {
                let v = target.clone();
                let size = model[&v].data.len() as u64;
                let (off, mut len) = sector_range(&mut rng, size, 512 * 1024);
                if !spanning {
                    len = len.min(CHUNK - off % CHUNK);
                }
                let data = pattern(rng.gen(), off, len as usize);
                let id = pool.lookup(&v).map_err(|e| format!("{when}: {e}"))?;
                let r = pool.write(id, off, &data);
                if r.is_ok() {
                    let m = model.get_mut(&v).ok_or("model")?;
                    m.data[off as usize..(off + len) as usize].copy_from_slice(&data);
                }
                (format!("write {v} {off}+{len}"), r)
            }
            35..=44 => {
                let v = target.clone();
                let size = model[&v].data.len() as u64;
                let (mut off, mut len) = sector_range(&mut rng, size, size);
                if !spanning && off / CHUNK != (off + len - 1) / CHUNK {
                    // Whole chunks only (no partial ends to zero).
                    off = off.div_ceil(CHUNK) * CHUNK;
                    let end = ((off + len) / CHUNK * CHUNK).max(off);
                    len = end - off;
                }
                let id = pool.lookup(&v).map_err(|e| format!("{when}: {e}"))?;
                let r = if len == 0 {
                    Ok(())
                } else if rng.gen_bool(0.5) {
                    pool.discard(id, off, len)
                } else {
                    pool.write_zeroes(
                        id,
                        off,
                        len,
                        rng.gen_bool(0.3) && (spanning || len <= CHUNK),
                    )
                };
                if r.is_ok() {
                    let m = model.get_mut(&v).ok_or("model")?;
                    m.data[off as usize..(off + len) as usize].fill(0);
                }
                (format!("discard/zero {v} {off}+{len}"), r)
            }
            45..=52 => create(&pool, &mut model, &mut next_name, &mut rng),
            53..=62 => {
                let v = target.clone();
                next_name += 1;
                let name = format!("{v}@s{next_name}");
                let r = pool.snapshot(&name).map(|_| ());
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
                let r = pool.clone_snapshot(&s, &name).map(|_| ());
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
            81..=86 => {
                let v = target.clone();
                let size = model[&v].data.len() as u64;
                let new = rng.gen_range(1..=(2 * size / SECTOR).min(16 * MIB / SECTOR)) * SECTOR;
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
            90..=92 => (
                "reclaim".into(),
                pool.reclaim(rng.gen_range(1..200)).map(|_| ()),
            ),
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
                if is_resource(&e) {
                    out.resource_failures += 1;
                }
                model = before;
                compare(&pool, &model, &format!("{when}: after failed {what} ({e})"))?;
            }
            Err(e) => return Err(format!("{when}: {what}: {e}")),
        }
    }
    writer.stop(out)?;
    pool.flush()
        .map_err(|e| format!("seed {seed}: final flush: {e}"))?;
    check_clean(&pool, &format!("seed {seed}: end"))?;
    compare(&pool, &model, &format!("seed {seed}: end"))
}

fn create(
    pool: &Pool,
    model: &mut Model,
    next_name: &mut u64,
    rng: &mut StdRng,
) -> (String, Result<(), Error>) {
    *next_name += 1;
    let name = format!("v{next_name}");
    let size = rng.gen_range(1..=8 * MIB / SECTOR) * SECTOR;
    let r = pool.create_volume(&name, size).map(|_| ());
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
    handle: Option<std::thread::JoinHandle<Result<u64, String>>>,
}

impl Writer {
    fn start(pool: &Arc<Pool>, seed: u64) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let (pool, flag) = (Arc::clone(pool), Arc::clone(&stop));
        let handle = std::thread::spawn(move || -> Result<u64, String> {
            let id = pool.lookup(WRITER_VOLUME).map_err(|e| e.to_string())?;
            let mut model = read_all(&pool, id)?;
            let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed);
            let mut ops = 0;
            while !flag.load(Ordering::Relaxed) {
                ops += 1;
                let (off, len) = sector_range(&mut rng, model.len() as u64, 32 * 1024);
                let range = off as usize..(off + len) as usize;
                let data = pattern(rng.gen(), off, len as usize);
                match pool.write(id, off, &data) {
                    Ok(()) => model[range].copy_from_slice(&data),
                    Err(e) if is_resource(&e) => {
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
                // Pacing only (the main sequence must get the locks too).
                std::thread::sleep(std::time::Duration::from_micros(100));
            }
            let now = read_all(&pool, id)?;
            if now != model {
                return Err("writer: volume w differs from its model".into());
            }
            Ok(ops)
        });
        Self {
            stop,
            handle: Some(handle),
        }
    }

    fn stop(&mut self, out: &mut Outcome) -> Result<(), String> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            out.writer_ops += h.join().map_err(|_| "writer panicked".to_string())??;
        }
        Ok(())
    }
}
