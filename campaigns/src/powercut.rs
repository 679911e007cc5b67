//! Power-cut campaign by record and replay (the dm-log-writes / CrashMonkey
//! method).
//!
//! A random workload runs on a pool whose device is a [`RecordingDevice`]:
//! writes and discards on several volumes, flushes, snapshots, clones of
//! snapshots, deletes, rollbacks, shrinks (and growing back), renames, new
//! volumes and reclaim. After each
//! operation, the device events it produced are replayed one by one and the
//! campaign cuts power at chosen points of the replay: just before and just
//! after every flush, and at random events. At each cut it builds crash
//! images (every write since the last flush kept; none kept; random subsets
//! with torn writes) and checks each one:
//!
//! * the pool opens and `check` is clean;
//! * every volume that existed at the last completed operation exists,
//!   unless the operation in flight deletes it; no other volume exists except
//!   the one the operation in flight creates; a rename in flight shows all
//!   its names old or all new (a volume's snapshots follow it atomically);
//! * a snapshot or clone taken with deferred durability
//!   (`Durability::Deferred`) may be missing until an operation that commits
//!   (a flush, any other management operation) completes after it; if it is
//!   there, it reads exactly as it did when it was taken;
//! * a committed snapshot that the pool made durable by a record of its
//!   intent log instead of a commit (FORMAT.md §6.4.2, told by the pool's
//!   `logged_snapshots` count) commits nothing: until a commit, it may read
//!   after a cut as its volume may (the replay takes it onto the durable
//!   commit), and after one exactly as taken;
//! * every sector of every volume reads as its value at the last completed
//!   flush (or management operation, which commits) or as a value written
//!   there since ([`Possible`]): acknowledged data is intact, and no volume
//!   shows data it never held (every write carries a unique pattern);
//! * now and then, the recovered pool keeps working: it reclaims everything,
//!   takes a write, reopens and checks clean.
//!
//! One seed in three runs it with encrypted volumes (docs/FORMAT.md §6.6:
//! 512-byte units, every volume under one data key whose record the pool's
//! key store holds): each crash image is opened, its key loaded from the
//! image's own key store, and read against the same model, so a cut never
//! leaves a chunk whose bytes decrypt to anything but what was written or
//! zeros.

use std::collections::BTreeMap;
use std::sync::Arc;

use arbor_engine::{Durability, Pool, VolumeId};
use arbor_io::model::{pattern, Possible};
use arbor_io::{BlockDevice, IoEvent, OverlayDevice, Recording, RecordingDevice, SimDisk};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::cut::Cutter;
use crate::{no_panic, small_create_opts, small_open_opts, MIB};

const SECTOR: usize = 512;
const VOL_BYTES: usize = 256 * 1024;
/// 8 MiB of journals, 4 MiB of metadata nodes and ~6 MiB of data: room for
/// about 24 volumes' worth of exclusive data, so the allocator wraps and
/// reuses freed chunks within a run.
const POOL_BYTES: u64 = 18 * MIB;
const MAX_VOLUMES: usize = 14;

/// How hard one run of the campaign tries.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    pub seed: u64,
    /// Operations in the workload.
    pub steps: usize,
    /// Chance (percent) of a cut at an event that is not next to a flush.
    pub random_cut_percent: u32,
    /// Crash images per cut point with unflushed writes (at least 2: all
    /// kept and none kept; the rest are random subsets with torn writes).
    pub variants: usize,
    /// Every this many images, the recovered pool is also exercised.
    pub exercise_every: u64,
    /// Encrypted volumes (their sizes and shrinks whole chunks).
    pub encrypted: bool,
}

impl Config {
    pub fn new(seed: u64) -> Self {
        Self {
            seed,
            steps: 300,
            random_cut_percent: 5,
            variants: 4,
            exercise_every: 25,
            encrypted: seed % 3 == 2,
        }
    }
}

/// What one or more runs did.
#[derive(Debug, Default, Clone)]
pub struct Outcome {
    pub runs: u64,
    /// Runs with encrypted volumes.
    pub encrypted_runs: u64,
    pub steps: u64,
    pub events: u64,
    pub flushes: u64,
    /// Writes made durable alone (the intent log's records).
    pub durable_writes: u64,
    /// Committed snapshots the pool logged instead of committing.
    pub logged_snapshots: u64,
    /// Points of the event log where power was cut.
    pub cut_points: u64,
    /// Crash images built and verified (several per cut point).
    pub images: u64,
    pub failures: Vec<String>,
}

impl crate::Tally for Outcome {
    fn failures(&self) -> &[String] {
        &self.failures
    }

    fn add(&mut self, other: Outcome) {
        self.runs += other.runs;
        self.encrypted_runs += other.encrypted_runs;
        self.steps += other.steps;
        self.events += other.events;
        self.flushes += other.flushes;
        self.durable_writes += other.durable_writes;
        self.logged_snapshots += other.logged_snapshots;
        self.cut_points += other.cut_points;
        self.images += other.images;
        self.failures.extend(other.failures);
    }
}

#[derive(Debug, Clone)]
struct VolModel {
    possible: Possible,
    /// For a snapshot, the name of the volume it was taken of.
    snapshot_of: Option<String>,
    /// A delete of this volume is in flight: it may already be gone.
    maybe_gone: bool,
    /// Taken with deferred durability, and nothing has committed since: a
    /// power cut may lose it (whole).
    tentative: bool,
}

/// Data of a write; its debug form is its length only.
#[derive(Clone)]
struct Bytes(Vec<u8>);

impl std::fmt::Debug for Bytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} bytes", self.0.len())
    }
}

#[derive(Debug, Clone)]
enum Op {
    Write {
        vol: String,
        offset: usize,
        data: Bytes,
    },
    Discard {
        vol: String,
        offset: usize,
        len: usize,
    },
    Flush,
    Create {
        name: String,
    },
    Snapshot {
        vol: String,
        name: String,
        deferred: bool,
    },
    Clone {
        snap: String,
        name: String,
        deferred: bool,
    },
    Delete {
        name: String,
    },
    Rollback {
        vol: String,
        snap: String,
    },
    /// Shrinks the volume to `shrink_to` bytes, then grows it back: the
    /// tail must read as zeros, never as what it held before.
    Resize {
        vol: String,
        shrink_to: usize,
    },
    /// Renames a volume (its snapshots follow) or a snapshot.
    Rename {
        from: String,
        to: String,
    },
    Reclaim {
        nodes: usize,
    },
}

struct Campaign {
    cfg: Config,
    /// The data key of an encrypted run.
    key: Option<crate::RunKey>,
    rng: StdRng,
    pool: Pool,
    recording: Recording,
    cutter: Cutter,
    /// Crash images verified so far.
    verified: u64,
    vols: BTreeMap<String, VolModel>,
    /// A volume the operation in flight creates: it may or may not exist.
    pending_new: Option<(String, Possible)>,
    /// The (old, new) names of a rename in flight: all old or all new.
    pending_rename: Vec<(String, String)>,
    next_name: u64,
    step: usize,
    outcome: Outcome,
}

/// Runs one recorded workload and verifies every chosen cut point.
pub fn run(cfg: Config) -> Outcome {
    let mut rng = StdRng::seed_from_u64(cfg.seed);
    let chunk = if cfg.seed.is_multiple_of(2) {
        4096
    } else {
        16384
    };
    let disk = SimDisk::new(POOL_BYTES);
    let (dev, recording) = RecordingDevice::new(Arc::new(disk));
    let dev: Arc<dyn BlockDevice> = Arc::new(dev);
    let mut outcome = Outcome {
        runs: 1,
        encrypted_runs: u64::from(cfg.encrypted),
        ..Outcome::default()
    };
    let pool = match Pool::create(dev, &small_create_opts(chunk), &small_open_opts()) {
        Ok(pool) => pool,
        Err(e) => {
            outcome
                .failures
                .push(format!("seed {}: create: {e}", cfg.seed));
            return outcome;
        }
    };
    let key = if cfg.encrypted {
        match crate::RunKey::create(&pool) {
            Ok(key) => Some(key),
            Err(e) => {
                outcome
                    .failures
                    .push(format!("seed {}: key: {e}", cfg.seed));
                return outcome;
            }
        }
    } else {
        None
    };
    // The pool's creation (and an encrypted run's key store) is replayed
    // without cuts: a pool that was never completely created need not open.
    let mut cutter = Cutter::new(POOL_BYTES, cfg.random_cut_percent, cfg.variants);
    if let Err(e) = cutter.skip(recording.take()) {
        outcome.failures.push(format!("seed {}: {e}", cfg.seed));
        return outcome;
    }
    let mut campaign = Campaign {
        cfg,
        key,
        rng: StdRng::seed_from_u64(rng.gen()),
        pool,
        recording,
        cutter,
        verified: 0,
        vols: BTreeMap::new(),
        pending_new: None,
        pending_rename: Vec::new(),
        next_name: 0,
        step: 0,
        outcome,
    };
    for _ in 0..3 {
        let name = campaign.fresh_name("v");
        if campaign.step(Op::Create { name }).is_err() {
            return campaign.finish();
        }
    }
    while campaign.step < cfg.steps {
        let op = campaign.choose();
        if campaign.step(op).is_err() {
            break;
        }
    }
    campaign.finish()
}

impl Campaign {
    fn finish(mut self) -> Outcome {
        self.outcome.events = self.cutter.replay.events();
        self.outcome.flushes = self.cutter.replay.flushes();
        self.outcome.durable_writes = self.cutter.replay.durable_writes();
        self.outcome.logged_snapshots = self.logged_snapshots();
        self.outcome.cut_points = self.cutter.cut_points;
        self.outcome.images = self.cutter.images;
        self.outcome.steps = self.step as u64;
        self.outcome
    }

    fn fresh_name(&mut self, prefix: &str) -> String {
        self.next_name += 1;
        format!("{prefix}{}", self.next_name)
    }

    fn writable(&self) -> Vec<String> {
        self.vols
            .iter()
            .filter(|(_, v)| v.snapshot_of.is_none())
            .map(|(n, _)| n.clone())
            .collect()
    }

    fn snapshots(&self) -> Vec<String> {
        self.vols
            .iter()
            .filter(|(_, v)| v.snapshot_of.is_some())
            .map(|(n, _)| n.clone())
            .collect()
    }

    fn pick(&mut self, names: &[String]) -> Option<String> {
        (!names.is_empty()).then(|| names[self.rng.gen_range(0..names.len())].clone())
    }

    fn free_chunks(&self) -> u64 {
        self.pool
            .pool_stats()
            .map(|s| (s.data_bytes - s.data_used_bytes) / s.chunk_size)
            .unwrap_or(0)
    }

    /// A random operation, steering away from a full pool and too many volumes.
    fn choose(&mut self) -> Op {
        let writable = self.writable();
        let snapshots = self.snapshots();
        let crowded = self.vols.len() >= MAX_VOLUMES;
        // Keep room for a whole volume's exclusive data plus copy-on-write.
        let low_space = self.free_chunks() < (2 * VOL_BYTES as u64) / 4096;
        if low_space || crowded {
            // Delete a snapshot, or a volume if there are more than two.
            let victims: Vec<String> =
                if snapshots.is_empty() || (writable.len() > 2 && self.rng.gen_bool(0.3)) {
                    writable.iter().skip(1).cloned().collect()
                } else {
                    snapshots.clone()
                };
            if let Some(name) = self.pick(&victims) {
                return Op::Delete { name };
            }
            return Op::Reclaim { nodes: 1 << 20 };
        }
        let Some(vol) = self.pick(&writable) else {
            return Op::Create {
                name: self.fresh_name("v"),
            };
        };
        match self.rng.gen_range(0..100) {
            0..=44 => {
                // Half of them whole 4 KiB blocks: at 16 KiB chunks, the
                // writes that make and extend partial extents.
                let (sectors, offset) = if self.rng.gen_bool(0.5) {
                    let blocks = self.rng.gen_range(1..=4usize);
                    let at = self.rng.gen_range(0..=VOL_BYTES / 4096 - blocks) * 4096;
                    (blocks * 8, at)
                } else {
                    let sectors = self.rng.gen_range(1..=64usize);
                    (
                        sectors,
                        self.rng.gen_range(0..=VOL_BYTES / SECTOR - sectors) * SECTOR,
                    )
                };
                let data = Bytes(pattern(self.rng.gen(), offset as u64, sectors * SECTOR));
                Op::Write { vol, offset, data }
            }
            45..=51 => {
                let sectors = self.rng.gen_range(1..=96usize);
                Op::Discard {
                    vol,
                    offset: self.rng.gen_range(0..=VOL_BYTES / SECTOR - sectors) * SECTOR,
                    len: sectors * SECTOR,
                }
            }
            52..=63 => Op::Flush,
            64..=71 => Op::Snapshot {
                name: format!("{vol}@{}", self.fresh_name("s")),
                vol,
                deferred: self.rng.gen_bool(0.5),
            },
            72..=77 => match self.pick(&snapshots) {
                Some(snap) => Op::Clone {
                    snap,
                    name: self.fresh_name("c"),
                    deferred: self.rng.gen_bool(0.5),
                },
                None => Op::Flush,
            },
            78..=84 => {
                let any: Vec<String> = self.vols.keys().cloned().collect();
                match self.pick(&any) {
                    // Keep at least one writable volume.
                    Some(name) if writable.len() > 1 || !writable.contains(&name) => {
                        Op::Delete { name }
                    }
                    _ => Op::Reclaim { nodes: 8 },
                }
            }
            85..=89 => {
                let own: Vec<String> = snapshots
                    .iter()
                    .filter(|s| self.vols[*s].snapshot_of.as_deref() == Some(vol.as_str()))
                    .cloned()
                    .collect();
                match self.pick(&own) {
                    Some(snap) => Op::Rollback { vol, snap },
                    None => Op::Flush,
                }
            }
            90..=94 => Op::Reclaim {
                nodes: self.rng.gen_range(1..40),
            },
            95..=96 => Op::Resize {
                vol,
                // Any sector, so the new last chunk is often cut part-way
                // (whole chunks for an encrypted volume).
                shrink_to: match &self.key {
                    None => self.rng.gen_range(1..VOL_BYTES / SECTOR) * SECTOR,
                    Some(_) => {
                        let chunk = self.pool.chunk_size() as usize;
                        self.rng.gen_range(1..VOL_BYTES / chunk) * chunk
                    }
                },
            },
            97 => self.choose_rename(vol, &snapshots),
            _ => Op::Create {
                name: self.fresh_name("v"),
            },
        }
    }

    /// Renames `vol` (its snapshots follow), or one of the snapshots.
    fn choose_rename(&mut self, vol: String, snapshots: &[String]) -> Op {
        match self.pick(snapshots) {
            Some(snap) if self.rng.gen_bool(0.4) => {
                let owner = self.vols[&snap].snapshot_of.clone().unwrap_or_default();
                Op::Rename {
                    from: snap,
                    to: format!("{owner}@{}", self.fresh_name("t")),
                }
            }
            _ => Op::Rename {
                from: vol,
                to: self.fresh_name("r"),
            },
        }
    }

    /// The names a rename changes: the volume and each of its snapshots.
    fn renamed_names(&self, from: &str, to: &str) -> Vec<(String, String)> {
        let mut pairs = vec![(from.to_owned(), to.to_owned())];
        if self.vols[from].snapshot_of.is_none() {
            for (name, v) in &self.vols {
                if v.snapshot_of.as_deref() == Some(from) {
                    let (_, snap) = name.split_once('@').unwrap_or_default();
                    pairs.push((name.clone(), format!("{to}@{snap}")));
                }
            }
        }
        pairs
    }

    /// Runs one operation: the model first says what a crash during it may
    /// show, then the operation runs, then every cut point it produced is
    /// verified, then the model records its completion.
    fn step(&mut self, op: Op) -> Result<(), ()> {
        self.step += 1;
        if std::env::var_os("ARBOR_POWERCUT_TRACE").is_some() {
            eprintln!(
                "step {} (event {}): {op:?}",
                self.step,
                self.cutter.replay.events()
            );
        }
        self.before(&op);
        let logged_before = self.logged_snapshots();
        let result = self.execute(&op);
        let events = self.recording.take();
        if let Err(e) = result {
            self.fail(format!("{op:?} failed on a healthy device: {e}"));
            return Err(());
        }
        let logged = self.logged_snapshots() > logged_before;
        self.cut_through(events)?;
        self.after(&op, logged);
        Ok(())
    }

    /// Snapshots the pool made durable by an intent log record instead of
    /// a commit, so far.
    fn logged_snapshots(&self) -> u64 {
        self.pool
            .pool_stats()
            .map_or(0, |stats| stats.logged_snapshots)
    }

    fn fail(&mut self, what: String) {
        self.outcome
            .failures
            .push(format!("seed {} step {}: {what}", self.cfg.seed, self.step));
    }

    fn vol_mut(&mut self, name: &str) -> &mut VolModel {
        self.vols
            .get_mut(name)
            .unwrap_or_else(|| panic!("the workload chose {name}, which the model lacks"))
    }

    fn before(&mut self, op: &Op) {
        match op {
            Op::Write { vol, offset, data } => {
                self.vol_mut(vol)
                    .possible
                    .since
                    .push((*offset, data.0.clone()));
            }
            Op::Discard { vol, offset, len } => {
                self.vol_mut(vol)
                    .possible
                    .since
                    .push((*offset, vec![0; *len]));
            }
            Op::Create { name } => {
                self.pending_new = Some((name.clone(), Possible::new(vec![0; VOL_BYTES])));
            }
            // Deferred: if it survives a crash, exactly as taken.
            Op::Snapshot {
                vol,
                name,
                deferred: true,
            } => {
                let contents = self.vols[vol].possible.current();
                self.pending_new = Some((name.clone(), Possible::new(contents)));
            }
            // Committed, or logged (FORMAT.md §6.4.2): a logged snapshot
            // is taken again after a crash onto the durable commit, so it
            // may read as its volume may; a commit (any, its own included)
            // makes it exactly as taken (`after`).
            Op::Snapshot { vol, name, .. } => {
                let possible = self.vols[vol].possible.clone();
                self.pending_new = Some((name.clone(), possible));
            }
            // A snapshot's contents as taken: what a clone or a rollback
            // gets, by a commit that makes a logged one exact too.
            Op::Clone { snap, name, .. } => {
                let contents = self.vols[snap].possible.current();
                self.pending_new = Some((name.clone(), Possible::new(contents)));
            }
            Op::Delete { name } => self.vol_mut(name).maybe_gone = true,
            Op::Rollback { vol, snap } => {
                let contents = self.vols[snap].possible.current();
                self.vol_mut(vol).possible.since.push((0, contents));
            }
            Op::Resize { vol, shrink_to } => {
                let zeros = vec![0; VOL_BYTES - shrink_to];
                self.vol_mut(vol).possible.since.push((*shrink_to, zeros));
            }
            Op::Rename { from, to } => self.pending_rename = self.renamed_names(from, to),
            Op::Flush | Op::Reclaim { .. } => {}
        }
    }

    fn execute(&mut self, op: &Op) -> arbor_engine::Result<()> {
        let id = |name: &str| self.pool.lookup(name);
        match op {
            Op::Write { vol, offset, data } => self.pool.write(id(vol)?, *offset as u64, &data.0),
            Op::Discard { vol, offset, len } => {
                self.pool.discard(id(vol)?, *offset as u64, *len as u64)
            }
            Op::Flush => self.pool.flush(),
            Op::Create { name } => match &self.key {
                None => self.pool.create_volume(name, VOL_BYTES as u64).map(|_| ()),
                Some(key) => self
                    .pool
                    .create_encrypted_volume(name, VOL_BYTES as u64, key.slot)
                    .map(|_| ()),
            },
            Op::Snapshot { name, deferred, .. } => self
                .pool
                .snapshot_with(name, durability(*deferred))
                .map(|_| ()),
            Op::Clone {
                snap,
                name,
                deferred,
            } => self
                .pool
                .clone_snapshot_with(snap, name, durability(*deferred))
                .map(|_| ()),
            Op::Delete { name } => self.pool.delete(name),
            Op::Rollback { vol, snap } => self.pool.rollback(vol, snap),
            Op::Resize { vol, shrink_to } => {
                self.pool.resize(vol, *shrink_to as u64)?;
                self.pool.resize(vol, VOL_BYTES as u64)
            }
            Op::Rename { from, to } => self.pool.rename(from, to),
            // Reclaim, then the fill of partials it may have left alone.
            Op::Reclaim { nodes } => self
                .pool
                .reclaim(*nodes)
                .and_then(|_| self.pool.fill_partials(*nodes))
                .map(|_| ()),
        }
    }

    /// The operation completed: what it did is now certain (and a commit
    /// made every earlier write durable).
    /// `logged`: a committed snapshot was made durable by an intent log
    /// record, not by a commit (the writes before it are not durable).
    fn after(&mut self, op: &Op, logged: bool) {
        let committed = match op {
            Op::Write { .. } | Op::Discard { .. } => false,
            // Reclaim commits when it did anything; assuming it did not is the
            // weaker (always true) expectation.
            Op::Reclaim { .. } => false,
            Op::Flush => true,
            Op::Create { .. } | Op::Snapshot { .. } | Op::Clone { .. } => {
                let deferred = matches!(
                    op,
                    Op::Snapshot { deferred: true, .. } | Op::Clone { deferred: true, .. }
                );
                if let Some((name, possible)) = self.pending_new.take() {
                    let snapshot_of = match op {
                        Op::Snapshot { vol, .. } => Some(vol.clone()),
                        _ => None,
                    };
                    self.vols.insert(
                        name,
                        VolModel {
                            possible,
                            snapshot_of,
                            maybe_gone: false,
                            tentative: deferred,
                        },
                    );
                }
                !deferred && !logged
            }
            Op::Delete { name } => {
                self.vols.remove(name);
                true
            }
            Op::Rollback { vol, snap } => {
                let contents = self.vols[snap].possible.current();
                self.vol_mut(vol).possible = Possible::new(contents);
                true
            }
            Op::Resize { .. } => true,
            Op::Rename { from, to } => {
                for (old, new) in std::mem::take(&mut self.pending_rename) {
                    if let Some(v) = self.vols.remove(&old) {
                        self.vols.insert(new, v);
                    }
                }
                for v in self.vols.values_mut() {
                    if v.snapshot_of.as_deref() == Some(from.as_str()) {
                        v.snapshot_of = Some(to.clone());
                    }
                }
                true
            }
        };
        if committed {
            for v in self.vols.values_mut() {
                v.possible.make_durable();
                v.tentative = false;
            }
        }
    }

    /// Replays the operation's events and verifies every crash image cut on the way.
    fn cut_through(&mut self, events: Vec<IoEvent>) -> Result<(), ()> {
        let crashes = match self.cutter.feed(events, &mut self.rng) {
            Ok(crashes) => crashes,
            Err(e) => {
                self.fail(e);
                return Err(());
            }
        };
        for crash in crashes {
            self.verified += 1;
            let exercise = self.verified.is_multiple_of(self.cfg.exercise_every);
            if let Err(e) = no_panic(|| self.verify(crash.dev, exercise)) {
                self.fail(format!(
                    "cut after event {} ({:?}): {e}",
                    crash.event, crash.kind
                ));
            }
        }
        Ok(())
    }

    /// Checks one crash image against the model.
    fn verify(&self, dev: Arc<OverlayDevice>, exercise: bool) -> Result<(), String> {
        let pool = Pool::open(dev.clone(), &small_open_opts()).map_err(|e| format!("open: {e}"))?;
        if let Some(key) = &self.key {
            key.load(&pool)?;
        }
        let report = pool.check().map_err(|e| format!("check: {e}"))?;
        if !report.is_clean() {
            return Err(format!("check: {:?}", report.problems));
        }
        let pending = self.pending_new.as_ref();
        for info in pool.list().map_err(|e| format!("list: {e}"))? {
            let known = self.vols.contains_key(&info.name)
                || pending.is_some_and(|(n, _)| *n == info.name)
                || self.pending_rename.iter().any(|(_, new)| *new == info.name);
            if !known {
                return Err(format!("volume {} exists but was never created", info.name));
            }
        }
        let renamed = self.rename_outcome(&pool)?;
        let read_all = |id: VolumeId| -> Result<Vec<u8>, String> {
            // A shrink in flight may have taken effect without the growth
            // back: past the end, the volume reads as zeros.
            let size = pool.info(id).map_err(|e| format!("info: {e}"))?.size;
            let readable = usize::try_from(size).map_or(VOL_BYTES, |s| s.min(VOL_BYTES));
            let mut buf = vec![0u8; VOL_BYTES];
            pool.read(id, 0, &mut buf[..readable])
                .map_err(|e| format!("read: {e}"))?;
            Ok(buf)
        };
        for (name, v) in &self.vols {
            let name = match renamed {
                Some(true) => self.new_name(name),
                _ => name,
            };
            match pool.lookup(name) {
                Ok(id) => v
                    .possible
                    .check(&read_all(id).map_err(|e| format!("{name}: {e}"))?)
                    .map_err(|e| format!("{name}: {e}"))?,
                Err(_) if v.maybe_gone || v.tentative => {}
                Err(e) => return Err(format!("{name} lost: {e}")),
            }
        }
        if let Some((name, possible)) = pending {
            if let Ok(id) = pool.lookup(name) {
                possible
                    .check(&read_all(id)?)
                    .map_err(|e| format!("{name} (being created): {e}"))?;
            }
        }
        if exercise {
            exercise_recovered(pool, dev, self.key.as_ref())?;
        }
        Ok(())
    }

    /// Whether the rename in flight took effect (`None`: none in flight), or
    /// an error if only some of its names changed.
    fn rename_outcome(&self, pool: &Pool) -> Result<Option<bool>, String> {
        if self.pending_rename.is_empty() {
            return Ok(None);
        }
        let sides: Vec<(bool, bool)> = self
            .pending_rename
            .iter()
            .map(|(old, new)| (pool.lookup(old).is_ok(), pool.lookup(new).is_ok()))
            .collect();
        // A tentative volume lost with the rename's commit has neither name.
        let decided: Vec<(bool, bool)> = self
            .pending_rename
            .iter()
            .zip(&sides)
            .filter(|((old, _), &side)| !(side == (false, false) && self.vols[old].tentative))
            .map(|(_, &side)| side)
            .collect();
        if decided.iter().all(|&side| side == (true, false)) {
            Ok(Some(false))
        } else if decided.iter().all(|&side| side == (false, true)) {
            Ok(Some(true))
        } else {
            Err(format!(
                "rename half done: {:?} (old, new) found {sides:?}",
                self.pending_rename
            ))
        }
    }

    /// The name `name` has once the rename in flight takes effect.
    fn new_name<'a>(&'a self, name: &'a str) -> &'a str {
        self.pending_rename
            .iter()
            .find(|(old, _)| old == name)
            .map_or(name, |(_, new)| new.as_str())
    }
}

/// The recovered pool keeps working: reclaim everything, write, reopen, check.
fn exercise_recovered(
    pool: Pool,
    dev: Arc<OverlayDevice>,
    key: Option<&crate::RunKey>,
) -> Result<(), String> {
    while pool.reclaim(1 << 20).map_err(|e| format!("reclaim: {e}"))? > 0 {}
    let list = pool.list().map_err(|e| format!("list: {e}"))?;
    let data = pattern(u64::MAX, 0, 8192);
    // A shrink cut short may have left a volume smaller than the write.
    let target = list
        .iter()
        .find(|v| !v.snapshot && v.size >= data.len() as u64);
    if let Some(v) = target {
        pool.write(v.id, 0, &data)
            .map_err(|e| format!("write: {e}"))?;
    }
    pool.close().map_err(|e| format!("close: {e}"))?;
    let pool = Pool::open(dev, &small_open_opts()).map_err(|e| format!("reopen: {e}"))?;
    if let Some(key) = key {
        key.load(&pool)?;
    }
    let report = pool
        .check()
        .map_err(|e| format!("check after reuse: {e}"))?;
    if !report.is_clean() {
        return Err(format!("check after reuse: {:?}", report.problems));
    }
    if let Some(v) = target {
        let mut buf = vec![0u8; 8192];
        pool.read(v.id, 0, &mut buf)
            .map_err(|e| format!("read: {e}"))?;
        if buf != data {
            return Err("a flushed write after recovery was lost".into());
        }
    }
    Ok(())
}

fn durability(deferred: bool) -> Durability {
    if deferred {
        Durability::Deferred
    } else {
        Durability::Committed
    }
}
