//! The monitor over a real engine pool (on a simulated disk) with a fake
//! clock: policies kept in the pool, scheduled group snapshots, one
//! catch-up after downtime, retention, holds, replication's holds, snapshots
//! in use, space-aware pruning, a dry run that lists exactly what the
//! prune then destroys, and the scrub schedule kept in the pool.
// A test crate: unwrap, expect and panic are how a test reports failure
// (the workspace denies them in the code it ships; clippy.toml allows
// them in #[test] functions, this in the helpers around them).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use arbor_engine::{CreateOptions, OpenOptions, Pool, VolumeId};
use arbor_io::{BlockDevice, SimDisk};
use arbor_monitor::engine::{self, Listing, Stored};
use arbor_monitor::tick::{self, VolumeOutcome, VolumePlan};
use arbor_monitor::{Policy, Reason, Retention, Schedule};

const MIB: u64 = 1 << 20;
/// 2026-03-10T10:17:00Z.
const T0: u64 = 1_773_137_820;
const DAY: u64 = 86_400;

fn pool_on(disk: &SimDisk) -> Pool {
    let dev: Arc<dyn BlockDevice> = Arc::new(disk.clone());
    let opts = CreateOptions {
        chunk_size: 4096,
        metadata_bytes: Some(4 * MIB),
        ..Default::default()
    };
    Pool::create(dev, &opts, &OpenOptions::default()).unwrap()
}

fn reopen(disk: &SimDisk) -> Pool {
    let dev: Arc<dyn BlockDevice> = Arc::new(disk.clone());
    Pool::open(dev, &OpenOptions::default()).unwrap()
}

fn policy(pool: &Pool, volumes: &[&str], schedule: &str, retention: &str) -> Stored {
    let ids = volumes.iter().map(|v| pool.lookup(v).unwrap().0).collect();
    let schedule: Schedule = schedule.parse().unwrap();
    let retention: Retention = retention.parse().unwrap();
    let policy = Policy::new(ids, schedule, retention);
    let key = engine::new_key(VolumeId(policy.volumes[0]), &[]);
    engine::store(pool, &key, &policy).unwrap();
    Stored { key, policy }
}

fn not_in_use(_: VolumeId) -> Option<String> {
    None
}

/// What a turn did.
#[derive(Default)]
struct Turn {
    /// The scheduled snapshot's name (after `@`), or why it failed.
    taken: Option<Result<String, arbor_engine::Error>>,
    pruned: Option<Vec<VolumeOutcome>>,
}

/// The prune plans of `p` at `now` from the pool's state, with what
/// `in_use` says counted as a hold (as the daemon does).
fn plans(
    pool: &Pool,
    p: &Policy,
    now: u64,
    in_use: &dyn Fn(VolumeId) -> Option<String>,
) -> Vec<VolumePlan> {
    let listing = Listing::of(pool).unwrap();
    let mut volumes = engine::candidates(pool, &listing, p).unwrap();
    for (id, c) in volumes.iter_mut().flat_map(|v| v.snapshots.iter_mut()) {
        if let Some(user) = in_use(*id) {
            c.held.push(user);
        }
    }
    tick::prune_plans(p, &volumes, engine::usage(pool).unwrap(), now)
}

/// Carries out `plans` with `destroy`, in order, as the daemon does.
fn execute(
    plans: &[VolumePlan],
    destroy: &mut dyn FnMut(&str) -> Result<(), String>,
) -> Vec<VolumeOutcome> {
    plans
        .iter()
        .map(|p| {
            let results = p.plan.destroy.iter().map(|d| destroy(&d.name)).collect();
            VolumeOutcome::of(p, results)
        })
        .collect()
}

/// One policy's turn at `now`, planned by `tick` and carried out as the
/// daemon's monitor carries it out.
fn turn(
    pool: &Pool,
    p: &Policy,
    now: u64,
    last_prune: Option<u64>,
    destroy: &mut dyn FnMut(&str) -> Result<(), String>,
) -> Turn {
    let listing = Listing::of(pool).unwrap();
    let mut turn = Turn::default();
    if let Some(due) = tick::snapshot_due(p, &listing, now) {
        let group = due.unwrap();
        turn.taken = Some(pool.snapshot_group(&group.full).map(|_| group.snap));
    }
    let usage = engine::usage(pool).unwrap();
    let taken = matches!(turn.taken, Some(Ok(_)));
    if tick::prune_due(p, taken, last_prune, now, usage) {
        turn.pruned = Some(execute(&plans(pool, p, now, &not_in_use), destroy));
    }
    turn
}

/// A daemon's tick for one policy with `pool.delete` as the destroy.
fn tick(pool: &Pool, p: &Policy, now: u64, last_prune: &mut Option<u64>) -> Turn {
    let turn = turn(pool, p, now, *last_prune, &mut |name| {
        pool.delete(name).map_err(|e| e.to_string())
    });
    if turn.pruned.is_some() {
        *last_prune = Some(now);
    }
    turn
}

fn snapshots(pool: &Pool, volume: &str) -> Vec<String> {
    let prefix = format!("{volume}@");
    pool.list()
        .unwrap()
        .into_iter()
        .filter(|v| v.name.starts_with(&prefix))
        .map(|v| v.name)
        .collect()
}

#[test]
fn policies_live_in_the_pool_and_survive_reopen() {
    let disk = SimDisk::new(64 * MIB);
    let pool = pool_on(&disk);
    pool.create_volume("db", MIB).unwrap();
    pool.create_volume("logs", MIB).unwrap();
    let stored = policy(&pool, &["db", "logs"], "hourly at :30", "hourly=24,daily=7");
    pool.set_property(None, "other", b"not a policy").unwrap();
    pool.set_property(None, "policy.99", b"{broken").unwrap();
    drop(pool);
    let pool = reopen(&disk);
    let loaded = engine::load(&pool).unwrap();
    assert_eq!(loaded.policies, vec![stored.clone()]);
    assert_eq!(loaded.damaged.len(), 1, "a damaged policy is reported");
    assert_eq!(loaded.damaged[0].0, "policy.99");
    assert_eq!(
        engine::new_key(VolumeId(stored.policy.volumes[0]), &loaded.policies),
        "policy.1.1"
    );
    assert!(engine::remove(&pool, &stored.key).unwrap());
    assert!(engine::load(&pool).unwrap().policies.is_empty());
}

#[test]
fn the_scrub_schedule_lives_in_the_pool_and_a_damaged_one_is_an_error() {
    use arbor_monitor::scrub::SCRUB_SCHEDULE_KEY;
    let disk = SimDisk::new(64 * MIB);
    let pool = pool_on(&disk);
    assert!(engine::scrub_schedule(&pool).unwrap().is_none());
    let weekly: Schedule = "weekly on sun at 02:00".parse().unwrap();
    engine::store_scrub_schedule(&pool, &weekly).unwrap();
    drop(pool);
    let pool = reopen(&disk);
    assert_eq!(engine::scrub_schedule(&pool).unwrap(), Some(Ok(weekly)));
    assert_eq!(
        pool.property(None, SCRUB_SCHEDULE_KEY).unwrap().unwrap(),
        b"weekly on sun at 02:00"
    );
    // A value no schedule parses from: an error that says so.
    pool.set_property(None, SCRUB_SCHEDULE_KEY, b"now and then")
        .unwrap();
    let damaged = engine::scrub_schedule(&pool).unwrap().unwrap().unwrap_err();
    assert!(
        damaged.to_string().contains("invalid schedule"),
        "{damaged}"
    );
    assert!(engine::remove_scrub_schedule(&pool).unwrap());
    assert!(!engine::remove_scrub_schedule(&pool).unwrap());
    assert!(engine::scrub_schedule(&pool).unwrap().is_none());
}

#[test]
fn a_run_snapshots_the_group_in_one_commit_and_catches_up_once() {
    let disk = SimDisk::new(64 * MIB);
    let pool = pool_on(&disk);
    let db = pool.create_volume("db", MIB).unwrap();
    pool.create_volume("logs", MIB).unwrap();
    let p = policy(&pool, &["db", "logs"], "hourly", "hourly=48").policy;
    let mut last_prune = None;
    // A new policy runs at once; then at each hour, not between.
    let turn = tick(&pool, &p, T0, &mut last_prune);
    let name = turn.taken.unwrap().unwrap();
    assert_eq!(name, "auto-2026-03-10T10:17:00Z");
    let a = pool
        .info(pool.lookup(&format!("db@{name}")).unwrap())
        .unwrap();
    let b = pool
        .info(pool.lookup(&format!("logs@{name}")).unwrap())
        .unwrap();
    assert_eq!(a.created_txn, b.created_txn, "one commit for the group");
    for now in (T0 + 1..T0 + 43 * 60).step_by(60) {
        assert!(
            tick(&pool, &p, now, &mut last_prune).taken.is_none(),
            "at {now}"
        );
    }
    assert!(
        tick(&pool, &p, T0 + 43 * 60, &mut last_prune)
            .taken
            .is_some(),
        "11:00"
    );
    // The daemon was down 3 days: one snapshot, not 72.
    let back = T0 + 3 * DAY + 600;
    assert!(tick(&pool, &p, back, &mut last_prune).taken.is_some());
    for now in back + 1..back + 30 {
        assert!(tick(&pool, &p, now, &mut last_prune).taken.is_none());
    }
    assert_eq!(snapshots(&pool, "db").len(), 3);
    // The policy's last run is in the pool: a new monitor (after a
    // restart) agrees.
    drop(pool);
    let pool = reopen(&disk);
    let listing = Listing::of(&pool).unwrap();
    assert_eq!(listing.last_run(&p, back + 40), Some(back));
    let _ = db;
}

/// 30 days of an hourly policy, ticking every 5 minutes: what survives is
/// exactly what sanoid-style classes keep, and a user's snapshot, a held
/// one and the one replication needs are never pruned.
#[test]
fn thirty_days_of_hourly_snapshots_keep_what_retention_says() {
    let disk = SimDisk::new(256 * MIB);
    let pool = pool_on(&disk);
    let v = pool.create_volume("vm", 4 * MIB).unwrap();
    let p = policy(
        &pool,
        &["vm"],
        "hourly at :00",
        "hourly=24,daily=7,weekly=2",
    )
    .policy;
    let mut last_prune = None;
    let mut protected = Vec::new();
    let end = T0 + 30 * DAY;
    let mut now = T0;
    while now < end {
        // Writes between snapshots give them exclusive data.
        pool.write(v, (now / 300 % 1024) * 4096, &[now as u8; 4096])
            .unwrap();
        tick(&pool, &p, now, &mut last_prune);
        if now == T0 + 2 * DAY {
            pool.snapshot("vm@mine").unwrap();
            let all = snapshots(&pool, "vm");
            let held = all.iter().find(|n| n.contains("auto-")).unwrap().clone();
            pool.hold(&held, "backup").unwrap();
            let needed = all.iter().rfind(|n| n.contains("auto-")).unwrap().clone();
            pool.hold(&needed, "replica-to:dr:vm").unwrap();
            protected = vec!["vm@mine".to_owned(), held, needed];
        }
        now += 300;
    }
    let left = snapshots(&pool, "vm");
    for name in &protected {
        assert!(left.contains(name), "{name} was pruned");
    }
    let auto = left.iter().filter(|n| n.contains("auto-")).count();
    // 24 hourly (the newest among them) + 6 more days + up to 2 weeks
    // beyond those days, plus the 2 protected policy snapshots.
    assert!(
        (30..=34).contains(&auto),
        "{auto} policy snapshots: {left:#?}"
    );
    // A dry run now lists nothing more to destroy (the prune is idempotent).
    let plans = plans(&pool, &p, end, &not_in_use);
    assert!(
        plans.iter().all(|pl| pl.plan.destroy.is_empty()),
        "{plans:#?}"
    );
    let kept: Vec<_> = plans[0]
        .plan
        .keep
        .iter()
        .map(|d| (&d.name, &d.reason))
        .collect();
    assert!(kept.contains(&(&"vm@mine".to_owned(), &Reason::NotPolicy)));
    assert!(kept.contains(&(&protected[1], &Reason::Held(vec!["backup".to_owned()]))));
    assert!(kept.contains(&(&protected[2], &Reason::NeededByReplication)));
    pool.flush().unwrap();
    assert!(pool.check().unwrap().is_clean());
}

#[test]
fn a_dry_run_lists_exactly_what_the_prune_destroys() {
    let disk = SimDisk::new(128 * MIB);
    let pool = pool_on(&disk);
    let v = pool.create_volume("db", 4 * MIB).unwrap();
    let mut p = policy(&pool, &["db"], "every 10m", "frequent=50").policy;
    let mut last_prune = None;
    for i in 0..40u64 {
        // The same place each time: every snapshot holds its own version.
        pool.write(v, 0, &[i as u8; 8192]).unwrap();
        tick(&pool, &p, T0 + i * 600, &mut last_prune);
    }
    assert_eq!(snapshots(&pool, "db").len(), 40);
    // Tighter retention: a dry run, then the prune, at the same moment.
    p.retention = "frequent=5".parse().unwrap();
    let now = T0 + 40 * 600 - 1;
    let planned = plans(&pool, &p, now, &not_in_use);
    let dry: Vec<VolumeOutcome> = planned.iter().map(VolumeOutcome::dry_run).collect();
    let real = execute(&planned, &mut |name| {
        pool.delete(name).map_err(|e| e.to_string())
    });
    assert_eq!(dry, real, "the dry run differs from the prune");
    assert_eq!(real[0].destroyed.len(), 35);
    assert!(
        real[0].destroyed.iter().all(|d| d.frees > 0),
        "each frees its own 8 KiB"
    );
    assert_eq!(snapshots(&pool, "db").len(), 5);
}

#[test]
fn snapshots_in_use_or_refused_are_kept_and_reported() {
    let disk = SimDisk::new(64 * MIB);
    let pool = pool_on(&disk);
    pool.create_volume("db", MIB).unwrap();
    let p = policy(&pool, &["db"], "every 1m", "frequent=1").policy;
    for i in 0..4 {
        turn(&pool, &p, T0 + i * 60, Some(T0 + i * 60), &mut |_| Ok(()));
    }
    let open = pool.lookup("db@auto-2026-03-10T10:17:00Z").unwrap();
    let in_use = |id: VolumeId| (id == open).then(|| "open over NBD".to_owned());
    let plans = plans(&pool, &p, T0 + 240, &in_use);
    assert!(plans[0]
        .plan
        .keep
        .iter()
        .any(|d| d.reason == Reason::Held(vec!["open over NBD".to_owned()])));
    let out = execute(&plans, &mut |name| Err(format!("{name}: refused")));
    assert_eq!(out[0].failed.len(), 2);
    assert!(out[0].destroyed.is_empty());
    assert_eq!(snapshots(&pool, "db").len(), 4, "nothing destroyed");
}

/// Past its threshold, a space-aware policy prunes its oldest snapshots
/// beyond retention until the pool is under it; never the newest.
#[test]
fn space_aware_pruning_frees_the_pool_oldest_first() {
    let disk = SimDisk::new(48 * MIB);
    let pool = pool_on(&disk);
    let v = pool.create_volume("db", 64 * MIB).unwrap();
    let mut p = policy(&pool, &["db"], "every 1m", "frequent=100").policy;
    let mut last_prune = None;
    let mut i = 0u64;
    let data = pool.pool_stats().unwrap().data_bytes;
    // Each minute overwrites 2 MiB: every snapshot holds its own 2 MiB.
    while pool.pool_stats().unwrap().data_used_bytes < data * 85 / 100 {
        pool.write(v, 0, &vec![i as u8 + 1; 2 * MIB as usize])
            .unwrap();
        tick(&pool, &p, T0 + i * 60, &mut last_prune);
        i += 1;
    }
    let before = snapshots(&pool, "db");
    p.space_prune_percent = Some(60);
    let turn = tick(&pool, &p, T0 + i * 60, &mut last_prune);
    let pruned = &turn.pruned.unwrap()[0];
    assert!(!pruned.destroyed.is_empty());
    assert!(pruned
        .destroyed
        .iter()
        .all(|d| d.reason == Reason::SpaceAware));
    // Oldest first.
    let names: Vec<&String> = pruned.destroyed.iter().map(|d| &d.name).collect();
    assert_eq!(names, before.iter().take(names.len()).collect::<Vec<_>>());
    while pool.reclaim(1000).unwrap() > 0 {}
    let used = pool.pool_stats().unwrap().data_used_bytes;
    assert!(used * 100 <= data * 60, "{used} of {data} still used");
    assert!(snapshots(&pool, "db").len() >= 2, "the newest stays");
}
