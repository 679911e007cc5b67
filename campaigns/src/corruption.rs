//! Corruption campaign: damage one structure of a rich pool at a time and
//! check that arbor notices and never returns wrong data.
//!
//! Each seed builds two pools: one of format version 8, and one created as
//! version 8 and upgraded to the newest (10) before its last commits (so a
//! stale superblock copy is a version 8 one, and the newest commits use the
//! protocol of version 9 and later: images before the record, the record
//! twice).
//!
//! The pool holds volumes, snapshots, clones of snapshots in a deep chain
//! (clone of a snapshot of a clone ...), and a deleted volume whose tree
//! waits in the reclaim queue. Each trial damages blocks of one class
//! (superblock copy 0 or 1, the newest or the older journal record, the
//! newest journal's page images, metadata or data space-map home pages,
//! volume-table, mapping or reclaim-queue nodes) in one way (a flipped bit,
//! a zeroed block, two blocks swapped, a block reverted to an older version).
//! Then:
//!
//! * opening either refuses (allowed except for damage to one superblock
//!   copy or to a journal record, where the other copy must be used), or
//!   opens; in a version 9 pool, single-block damage to a superblock copy,
//!   a copy of the newest or the older commit record or the newest
//!   commit's page images (a flipped bit, a zeroed block, a lost write, or
//!   two page images swapped) must open at the newest commit: every read
//!   exact, the volume its last commit deleted gone;
//! * every read of every volume returns the known contents or an error,
//!   never other data; no unknown volume appears, no known one vanishes;
//! * unless opening healed the damage (journal replay rewrites home pages)
//!   or refused, `check` reports it (a problem; for journal records, whose
//!   damage a power cut also leaves, a warning);
//! * `repair` either refuses (allowed only for damaged tree nodes, which it
//!   documents it cannot rebuild) or leaves a pool that opens, checks clean
//!   and reads back every volume exactly.

use std::collections::BTreeMap;
use std::sync::Arc;

use arbor_engine::{repair, Pool};
use arbor_format::{CommitRecord, FormatVersion, Superblock, BLOCK_SIZE};
use arbor_io::model::pattern;
use arbor_io::{BlockDevice, OverlayDevice, SimDisk};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::{no_panic, small_create_opts, small_open_opts, MIB};

const BS: usize = BLOCK_SIZE;
const VOL_BYTES: u64 = MIB;
const POOL_BYTES: u64 = 28 * MIB;

/// A damaged structure class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Target {
    SuperblockCopy0,
    SuperblockCopy1,
    NewestCommitRecord,
    /// The newest record's second copy, in its area's last block (version 9).
    NewestCommitRecordCopy,
    OlderCommitRecord,
    NewestJournalPages,
    MetaSpaceMap,
    DataSpaceMap,
    VolumeTableNode,
    MappingNode,
    /// A packed mapping leaf (format version 6, node kind 5).
    PackedLeaf,
    QueueNode,
    /// A node of the data checksum tree (format version 10, node kind 6).
    /// (The in-place intent set, kind 7, is empty in a pool closed cleanly,
    /// as these are.)
    SumsNode,
}

/// How a block is damaged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Damage {
    BitFlip,
    Zeroed,
    /// Swapped with another block of the same class (or any live metadata block).
    Swapped,
    /// Reverted to its contents of an earlier commit (a lost write).
    Stale,
}

pub const TARGETS: [Target; 13] = [
    Target::SuperblockCopy0,
    Target::SuperblockCopy1,
    Target::NewestCommitRecord,
    Target::NewestCommitRecordCopy,
    Target::OlderCommitRecord,
    Target::NewestJournalPages,
    Target::MetaSpaceMap,
    Target::DataSpaceMap,
    Target::VolumeTableNode,
    Target::MappingNode,
    Target::PackedLeaf,
    Target::QueueNode,
    Target::SumsNode,
];
pub const DAMAGES: [Damage; 4] = [
    Damage::BitFlip,
    Damage::Zeroed,
    Damage::Swapped,
    Damage::Stale,
];

/// The format versions whose pools each seed builds (see the module
/// documentation).
pub const VERSIONS: [u16; 2] = [8, arbor_format::FORMAT_VERSION];

/// Whether a pool of format `version` has blocks of class `target`.
pub fn has_target(version: u16, target: Target) -> bool {
    match target {
        Target::NewestCommitRecordCopy => mirrored(version),
        Target::SumsNode => {
            FormatVersion::new(version).is_ok_and(FormatVersion::has_data_checksums)
        }
        _ => true,
    }
}

fn mirrored(version: u16) -> bool {
    FormatVersion::new(version).is_ok_and(FormatVersion::has_mirrored_commit_records)
}

/// Counts for one (version, target, damage).
#[derive(Debug, Default, Clone, Copy)]
pub struct Tally {
    pub trials: u64,
    /// Opening refused the pool.
    pub refused: u64,
    /// Opening healed the damage (journal replay rewrote the blocks).
    pub healed: u64,
    /// Reads that failed with an error (never wrong data: that is a failure).
    pub failed_reads: u64,
    /// `check` reported the damage as a problem (or a warning, for journal records).
    pub detected: u64,
    pub repaired: u64,
    pub repair_refused: u64,
}

#[derive(Debug, Default, Clone)]
pub struct Outcome {
    pub pools: u64,
    pub tallies: BTreeMap<(u16, Target, Damage), Tally>,
    pub failures: Vec<String>,
}

impl Outcome {
    pub fn trials(&self) -> u64 {
        self.tallies.values().map(|t| t.trials).sum()
    }
}

impl crate::Tally for Outcome {
    fn failures(&self) -> &[String] {
        &self.failures
    }

    fn add(&mut self, other: Outcome) {
        self.pools += other.pools;
        for (k, t) in other.tallies {
            let e = self.tallies.entry(k).or_default();
            e.trials += t.trials;
            e.refused += t.refused;
            e.healed += t.healed;
            e.failed_reads += t.failed_reads;
            e.detected += t.detected;
            e.repaired += t.repaired;
            e.repair_refused += t.repair_refused;
        }
        self.failures.extend(other.failures);
    }
}

/// The undamaged pool and what it must read as.
struct Built {
    image: Vec<u8>,
    /// The undamaged image after an open (which writes the newest journal's
    /// page images to their home blocks).
    opened: Vec<u8>,
    /// The image one commit earlier than the last but one (for stale blocks).
    earlier: Vec<u8>,
    contents: BTreeMap<String, Vec<u8>>,
    /// Deleted last, so a fallback to the previous commit may show it.
    doomed: (String, Vec<u8>),
    classes: BTreeMap<Target, Vec<u64>>,
    live: Vec<u64>,
}

fn build(seed: u64, version: u16) -> Result<Built, String> {
    let e = |what: &str| {
        let what = what.to_owned();
        move |err: arbor_engine::Error| format!("building the pool: {what}: {err}")
    };
    let mut rng = StdRng::seed_from_u64(seed);
    let disk = SimDisk::new(POOL_BYTES);
    let dev: Arc<dyn BlockDevice> = Arc::new(disk.clone());
    let create = arbor_engine::CreateOptions {
        format_version: FormatVersion::new(8).map_err(|e| e.to_string())?,
        ..small_create_opts(4096)
    };
    let pool = Pool::create(dev, &create, &small_open_opts()).map_err(e("create"))?;
    let mut write_some = |pool: &Pool, name: &str, n: usize| -> Result<(), String> {
        let id = pool.lookup(name).map_err(e("lookup"))?;
        for _ in 0..n {
            let sectors = rng.gen_range(1..=24u64);
            let offset = rng.gen_range(0..VOL_BYTES / 512 - sectors) * 512;
            pool.write(
                id,
                offset,
                &pattern(rng.gen(), offset, sectors as usize * 512),
            )
            .map_err(e("write"))?;
        }
        Ok(())
    };
    for name in ["vm1", "vm2", "doomed"] {
        pool.create_volume(name, VOL_BYTES)
            .map_err(e("create volume"))?;
        write_some(&pool, name, 150)?;
    }
    // A deep chain: clone of a snapshot of a clone of a snapshot ...
    let mut origin = "vm1".to_owned();
    for depth in 0..6 {
        let snap = format!("{origin}@d{depth}");
        pool.snapshot(&snap).map_err(e("snapshot"))?;
        let clone = format!("chain{depth}");
        pool.clone_snapshot(&snap, &clone).map_err(e("clone"))?;
        write_some(&pool, &clone, 30)?;
        write_some(&pool, &origin, 10)?;
        origin = clone;
    }
    // A mapping tree with internal nodes: a packed leaf holds up to 448
    // extents, and this volume has 1,024 (every other chunk).
    let wide = pool
        .create_volume("wide", 8 * VOL_BYTES)
        .map_err(e("create volume"))?;
    for chunk in (0..8 * VOL_BYTES / 4096).step_by(2) {
        pool.write(wide, chunk * 4096, &pattern(chunk, chunk * 4096, 4096))
            .map_err(e("write"))?;
    }
    pool.snapshot("vm2@old").map_err(e("snapshot"))?;
    write_some(&pool, "vm2", 60)?;
    pool.delete("vm2@old").map_err(e("delete"))?;
    pool.flush().map_err(e("flush"))?;
    let earlier = disk.handle().durable_image();
    if version != 8 {
        pool.upgrade().map_err(e("upgrade"))?;
        if pool.format_version().number() != version {
            return Err(format!(
                "upgraded to {}, not {version}",
                pool.format_version()
            ));
        }
    }
    write_some(&pool, "vm2", 40)?;
    pool.flush().map_err(e("flush"))?;
    let read = |pool: &Pool, name: &str| -> Result<Vec<u8>, String> {
        let id = pool.lookup(name).map_err(e("lookup"))?;
        let size = pool.info(id).map_err(e("info"))?.size;
        let mut buf = vec![0u8; size as usize];
        pool.read(id, 0, &mut buf).map_err(e("read"))?;
        Ok(buf)
    };
    let doomed = ("doomed".to_owned(), read(&pool, "doomed")?);
    // The last commit only deletes: falling back to the one before changes
    // no other volume.
    pool.delete("doomed").map_err(e("delete"))?;
    let mut contents = BTreeMap::new();
    for info in pool.list().map_err(e("list"))? {
        contents.insert(info.name.clone(), read(&pool, &info.name)?);
    }
    pool.close().map_err(e("close"))?;
    let image = disk.handle().durable_image();
    // The blocks in use as the pool was closed (a clean close commits: the
    // in-place intent set is emptied, its nodes freed).
    let live = {
        let dev = Arc::new(OverlayDevice::new(Arc::new(image.clone())));
        let pool = Pool::open(dev, &small_open_opts()).map_err(e("open"))?;
        pool.metadata_blocks_in_use().map_err(e("blocks in use"))?
    };
    let classes = classify(&image, &live, mirrored(version))?;
    let dev = Arc::new(OverlayDevice::new(Arc::new(image.clone())));
    drop(Pool::open(dev.clone(), &small_open_opts()).map_err(e("open"))?);
    let opened = dev.image();
    Ok(Built {
        image,
        opened,
        earlier,
        contents,
        doomed,
        classes,
        live,
    })
}

/// The blocks of each target class in `image`.
fn classify(
    image: &[u8],
    live: &[u64],
    mirrored: bool,
) -> Result<BTreeMap<Target, Vec<u64>>, String> {
    let sb = Superblock::decode(&image[..BS], image.len() as u64).map_err(|e| e.to_string())?;
    let record = |area: u64| {
        let at = area as usize * BS;
        CommitRecord::decode(&image[at..at + BS]).ok()
    };
    let areas = [sb.journal_start[0].get(), sb.journal_start[1].get()];
    let (newest, older) = match (record(areas[0]), record(areas[1])) {
        (Some(a), Some(b)) if a.txn.get() > b.txn.get() => ((areas[0], a), areas[1]),
        (_, Some(b)) => ((areas[1], b), areas[0]),
        _ => return Err("the built pool lacks two commit records".into()),
    };
    let pages = u64::from(newest.1.page_count.get());
    let mut classes = BTreeMap::new();
    classes.insert(Target::SuperblockCopy0, vec![0]);
    classes.insert(Target::SuperblockCopy1, vec![1]);
    classes.insert(Target::NewestCommitRecord, vec![newest.0]);
    if mirrored {
        let last = newest.0 + u64::from(sb.journal_pages.get());
        classes.insert(Target::NewestCommitRecordCopy, vec![last]);
    }
    classes.insert(Target::OlderCommitRecord, vec![older]);
    classes.insert(
        Target::NewestJournalPages,
        (newest.0 + 1..newest.0 + 1 + pages).collect(),
    );
    classes.insert(
        Target::MetaSpaceMap,
        (sb.meta_sm_start.get()..sb.data_sm_start.get()).collect(),
    );
    classes.insert(
        Target::DataSpaceMap,
        (sb.data_sm_start.get()..sb.data_sm_start.get() + sb.data_sm_pages()).collect(),
    );
    for &block in live {
        // Byte 32 of a node is its tree kind.
        let target = match image[block as usize * BS + 32] {
            1 => Target::MappingNode,
            5 => Target::PackedLeaf,
            // Version 1 and version 3 volume tables.
            2 | 4 => Target::VolumeTableNode,
            3 => Target::QueueNode,
            6 => Target::SumsNode,
            other => return Err(format!("live block {block} has tree kind {other}")),
        };
        classes.entry(target).or_insert_with(Vec::new).push(block);
    }
    Ok(classes)
}

fn block_of(image: &[u8], b: u64) -> &[u8] {
    &image[b as usize * BS..(b as usize + 1) * BS]
}

/// Damages `image`; returns the blocks changed (none if the damage changes nothing).
fn damage(
    built: &Built,
    image: &mut [u8],
    target: Target,
    how: Damage,
    rng: &mut StdRng,
) -> Vec<u64> {
    let class = &built.classes[&target];
    let block = class[rng.gen_range(0..class.len())];
    let at = block as usize * BS;
    match how {
        Damage::BitFlip => {
            image[at + rng.gen_range(0..BS)] ^= 1 << rng.gen_range(0..8);
            vec![block]
        }
        Damage::Zeroed => {
            image[at..at + BS].fill(0);
            vec![block]
        }
        Damage::Swapped => {
            let pool: &Vec<u64> = if class.len() > 1 { class } else { &built.live };
            let other = pool[rng.gen_range(0..pool.len())];
            if other == block || block_of(image, other) == block_of(image, block) {
                return Vec::new();
            }
            let (a, b) = (block as usize * BS, other as usize * BS);
            let saved = image[a..a + BS].to_vec();
            image.copy_within(b..b + BS, a);
            image[b..b + BS].copy_from_slice(&saved);
            vec![block, other]
        }
        Damage::Stale => {
            let old = block_of(&built.earlier, block);
            if old == block_of(image, block) {
                return Vec::new();
            }
            image[at..at + BS].copy_from_slice(old);
            vec![block]
        }
    }
}

/// Runs every (target, damage) pair `trials` times on freshly built pools,
/// one of each of [`VERSIONS`].
pub fn run(seed: u64, trials: usize) -> Outcome {
    let mut outcome = Outcome::default();
    for version in VERSIONS {
        outcome.add_version(seed, trials, version);
    }
    outcome
}

impl Outcome {
    fn add_version(&mut self, seed: u64, trials: usize, version: u16) {
        let mut one = run_version(seed, trials, version);
        one.failures
            .iter_mut()
            .for_each(|f| *f = format!("version {version}: {f}"));
        crate::Tally::add(self, one);
    }
}

/// [`run`] for a pool of format `version`.
fn run_version(seed: u64, trials: usize, version: u16) -> Outcome {
    let mut outcome = Outcome {
        pools: 1,
        ..Outcome::default()
    };
    let built = match no_panic(|| build(seed, version)) {
        Ok(built) => built,
        Err(e) => {
            outcome.failures.push(format!("seed {seed}: {e}"));
            return outcome;
        }
    };
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed);
    for target in TARGETS.into_iter().filter(|&t| has_target(version, t)) {
        if built.classes.get(&target).is_none_or(|c| c.is_empty()) {
            outcome
                .failures
                .push(format!("seed {seed}: the pool has no {target:?} block"));
            continue;
        }
        for how in DAMAGES {
            let mut done = 0;
            let mut attempts = 0;
            while done < trials && attempts < trials * 4 {
                attempts += 1;
                let mut image = built.image.clone();
                let blocks = damage(&built, &mut image, target, how, &mut rng);
                if blocks.is_empty() {
                    continue;
                }
                done += 1;
                let tally = outcome.tallies.entry((version, target, how)).or_default();
                tally.trials += 1;
                let strict = mirrored(version);
                if let Err(e) = no_panic(|| trial(&built, image, &blocks, target, strict, tally)) {
                    outcome.failures.push(format!(
                        "seed {seed}: {target:?} {how:?} blocks {blocks:?}: {e}"
                    ));
                }
            }
        }
    }
    outcome
}

/// Opens, reads, checks and repairs one damaged image. `newest_only`
/// (version 9): damage confined to one superblock copy or to the journal
/// must open at the newest commit, every read exact.
fn trial(
    built: &Built,
    image: Vec<u8>,
    blocks: &[u64],
    target: Target,
    newest_only: bool,
    tally: &mut Tally,
) -> Result<(), String> {
    let base = Arc::new(image);
    let dev = Arc::new(OverlayDevice::new(Arc::clone(&base)));
    let journal = matches!(
        target,
        Target::NewestCommitRecord
            | Target::NewestCommitRecordCopy
            | Target::OlderCommitRecord
            | Target::NewestJournalPages
    );
    // Damage to one superblock copy or to the journal alone leaves an
    // intact copy or an older commit to open from.
    let alone = blocks.iter().all(|b| built.classes[&target].contains(b));
    let must_open = alone
        && matches!(
            target,
            Target::SuperblockCopy0
                | Target::SuperblockCopy1
                | Target::NewestCommitRecord
                | Target::NewestCommitRecordCopy
                | Target::OlderCommitRecord
                | Target::NewestJournalPages
        );
    let at_newest = must_open && newest_only;
    match Pool::open(dev.clone(), &small_open_opts()) {
        Err(e) if must_open => return Err(format!("open refused a pool it can open: {e}")),
        Err(_) => tally.refused += 1,
        Ok(pool) => {
            let failed = verify_reads(built, &pool)?;
            if at_newest && failed > 0 {
                return Err(format!("{failed} reads failed after damage confined to the journal or one superblock copy"));
            }
            if at_newest && pool.lookup(&built.doomed.0).is_ok() {
                return Err(
                    "opened at an older commit (the volume the last commit deleted is back)".into(),
                );
            }
            tally.failed_reads += failed;
            let healed = blocks.iter().all(|&b| {
                let mut now = vec![0u8; BS];
                dev.read_at(&mut now, b * BS as u64).is_ok() && now == block_of(&built.opened, b)
            });
            let detected = match pool.check() {
                Err(_) => true,
                Ok(report) => {
                    !report.problems.is_empty() || (journal && !report.warnings.is_empty())
                }
            };
            if healed {
                tally.healed += 1;
            } else if detected {
                tally.detected += 1;
            } else {
                return Err("check did not report the damage".into());
            }
        }
    }
    drop(dev);
    // Repair works on the damaged image afresh (not on what the open above changed).
    let dev = Arc::new(OverlayDevice::new(base));
    match repair(dev.clone(), &small_open_opts()) {
        Err(e) => {
            let unrepairable = matches!(
                target,
                Target::MappingNode | Target::PackedLeaf | Target::VolumeTableNode
            );
            // A swap may involve a tree node even when the target is not one.
            let touches_tree = blocks.iter().any(|b| built.live.contains(b));
            if !(unrepairable || touches_tree) {
                return Err(format!("repair refused: {e}"));
            }
            tally.repair_refused += 1;
        }
        Ok(_) => {
            let pool = Pool::open(dev, &small_open_opts())
                .map_err(|e| format!("open after repair: {e}"))?;
            let report = pool
                .check()
                .map_err(|e| format!("check after repair: {e}"))?;
            if !report.problems.is_empty() {
                return Err(format!("check after repair: {:?}", report.problems));
            }
            if verify_reads(built, &pool)? > 0 {
                return Err("a read failed after a successful repair".into());
            }
            tally.repaired += 1;
        }
    }
    Ok(())
}

/// Reads every volume; returns how many reads failed. Wrong data, unknown
/// volumes and lost volumes are errors.
fn verify_reads(built: &Built, pool: &Pool) -> Result<u64, String> {
    let list = pool.list().map_err(|e| format!("list: {e}"))?;
    for info in &list {
        if !built.contents.contains_key(&info.name) && info.name != built.doomed.0 {
            return Err(format!("unknown volume {} appeared", info.name));
        }
    }
    let mut failed = 0;
    let mut check = |name: &str, want: &[u8]| -> Result<(), String> {
        let Ok(id) = pool.lookup(name) else {
            return Err(format!("volume {name} vanished"));
        };
        // Read in pieces so that one damaged leaf fails only its own range.
        const PIECE: usize = 64 << 10;
        for (i, want) in want.chunks(PIECE).enumerate() {
            let mut out = vec![0u8; want.len()];
            match pool.read(id, (i * PIECE) as u64, &mut out) {
                Ok(()) if out == want => {}
                Ok(()) => return Err(format!("{name}: wrong data at byte {}", i * PIECE)),
                Err(_) => failed += 1,
            }
        }
        Ok(())
    };
    for (name, want) in &built.contents {
        check(name, want)?;
    }
    if pool.lookup(&built.doomed.0).is_ok() {
        check(&built.doomed.0, &built.doomed.1)?;
    }
    Ok(failed)
}
