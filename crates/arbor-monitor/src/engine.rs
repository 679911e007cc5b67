//! The monitor over the engine: policies kept in the pool (as properties,
//! docs/FORMAT.md §6), the snapshots a policy made, a scheduled run (one
//! group snapshot of all its volumes, in one commit) and the prune plan
//! from the pool's state. The daemon supplies the clock, says which
//! snapshots are in use (open over NBD, being sent), and destroys.
//!
//! A policy's last run is not stored: it is the newest snapshot the policy
//! made (by its name's timestamp), so it survives restarts and moves with
//! the pool, and a destroyed snapshot is simply not counted.

use std::collections::HashMap;

use arbor_engine::{Error, Pool, VolumeId, VolumeInfo};

use crate::names;
use crate::policy::Policy;
use crate::prune::{self, Candidate, Decision, PrunePlan};

/// Pool property keys of policies start with this.
pub const POLICY_KEY_PREFIX: &str = "policy.";
/// Hold tags that replication puts on the snapshot a target still needs
/// (`replica-to:...` on a source, `replica:upstream` on a replica).
pub const REPLICATION_HOLD_PREFIX: &str = "replica";

/// A policy as stored in the pool, under its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    /// Its pool property key (`policy.N`).
    pub key: String,
    /// The policy.
    pub policy: Policy,
}

/// What loading the pool's policies found.
#[derive(Debug, Default)]
pub struct Loaded {
    /// The policies that decode.
    pub policies: Vec<Stored>,
    /// Keys whose value does not decode, with why (never silently dropped).
    pub damaged: Vec<(String, String)>,
}

/// Every policy in the pool, sorted by key.
pub fn load(pool: &Pool) -> Result<Loaded, Error> {
    let mut loaded = Loaded::default();
    for key in pool.property_keys(None)? {
        if !key.starts_with(POLICY_KEY_PREFIX) {
            continue;
        }
        let Some(bytes) = pool.property(None, &key)? else {
            continue;
        };
        match Policy::decode(&bytes) {
            Ok(policy) => loaded.policies.push(Stored { key, policy }),
            Err(e) => loaded.damaged.push((key, e.to_string())),
        }
    }
    Ok(loaded)
}

/// Stores `policy` under `key` (validated first; atomic and durable).
pub fn store(pool: &Pool, key: &str, policy: &Policy) -> Result<(), Error> {
    policy
        .validate()
        .map_err(|e| Error::invalid_request(e.to_string()))?;
    pool.set_property(None, key, &policy.encode())
}

/// Removes the policy under `key`; whether there was one.
pub fn remove(pool: &Pool, key: &str) -> Result<bool, Error> {
    pool.remove_property(None, key)
}

/// A key for a new policy whose first volume is `first`, unused in `taken`.
pub fn new_key(first: VolumeId, taken: &[Stored]) -> String {
    let base = format!("{POLICY_KEY_PREFIX}{}", first.0);
    let used = |k: &str| taken.iter().any(|s| s.key == k);
    if !used(&base) {
        return base;
    }
    // At most one key per stored policy is taken, so one of the first
    // `taken.len() + 1` suffixes is free.
    (1..=taken.len() + 1)
        .map(|n| format!("{base}.{n}"))
        .find(|k| !used(k))
        .unwrap_or(base)
}

/// The time in the name of snapshot `full` (`volume@snap`, a snapshot of
/// one of a policy's volumes) if the policy with `prefix` made it: the one
/// rule by which a policy's snapshots are told from the user's (counted,
/// aged, pruned, and shown so by the API).
pub fn policy_stamp(prefix: &str, full: &str) -> Option<u64> {
    let (_, snap) = full.split_once('@')?;
    names::parse(prefix, snap)
}

/// One snapshot a policy made.
#[derive(Debug, Clone)]
pub struct PolicySnapshot {
    /// The snapshot.
    pub info: VolumeInfo,
    /// The time in its name.
    pub stamp: u64,
}

/// The pool's volumes by id, and each volume's snapshots, from one
/// listing.
pub struct Listing {
    by_id: HashMap<VolumeId, VolumeInfo>,
    snapshots: HashMap<VolumeId, Vec<VolumeInfo>>,
}

impl Listing {
    /// Lists the pool once.
    pub fn of(pool: &Pool) -> Result<Self, Error> {
        let all = pool.list()?;
        let mut snapshots: HashMap<VolumeId, Vec<VolumeInfo>> = HashMap::new();
        for info in &all {
            if let (true, Some(parent)) = (info.snapshot, info.parent) {
                snapshots.entry(parent).or_default().push(info.clone());
            }
        }
        let by_id = all
            .into_iter()
            .filter(|v| !v.snapshot)
            .map(|v| (v.id, v))
            .collect();
        Ok(Self { by_id, snapshots })
    }

    /// Writable volume `id`, if it exists.
    pub fn volume(&self, id: u64) -> Option<&VolumeInfo> {
        self.by_id.get(&VolumeId(id))
    }

    /// The snapshots of volume `id`.
    pub fn snapshots_of(&self, id: u64) -> &[VolumeInfo] {
        self.snapshots
            .get(&VolumeId(id))
            .map_or(&[][..], Vec::as_slice)
    }

    /// The snapshots `policy` made of volume `id`, oldest first.
    pub fn policy_snapshots(&self, policy: &Policy, id: u64) -> Vec<PolicySnapshot> {
        let mut found: Vec<PolicySnapshot> = self
            .snapshots_of(id)
            .iter()
            .filter_map(|info| {
                let stamp = policy_stamp(&policy.prefix, &info.name)?;
                Some(PolicySnapshot {
                    info: info.clone(),
                    stamp,
                })
            })
            .collect();
        found.sort_by(|a, b| (a.stamp, &a.info.name).cmp(&(b.stamp, &b.info.name)));
        found
    }

    /// The policy's volumes that exist, in its order.
    pub fn members<'a>(&'a self, policy: &Policy) -> Vec<&'a VolumeInfo> {
        policy
            .volumes
            .iter()
            .filter_map(|&id| self.volume(id))
            .collect()
    }

    /// The policy's last run: the newest time in the name of a snapshot it
    /// made of any of its volumes, not after `now` (a snapshot stamped in
    /// the future, after the clock was stepped back, does not count: the
    /// schedule goes on from now).
    pub fn last_run(&self, policy: &Policy, now: u64) -> Option<u64> {
        policy
            .volumes
            .iter()
            .flat_map(|&id| self.policy_snapshots(policy, id))
            .map(|s| s.stamp)
            .filter(|&t| t <= now)
            .max()
    }
}

/// Takes the policy's scheduled snapshot of all its volumes at `now`, in
/// one commit (a consistency group), under one name that none of them
/// has yet. Returns that name (the part after `@`).
pub fn take(pool: &Pool, listing: &Listing, policy: &Policy, now: u64) -> Result<String, Error> {
    let members = listing.members(policy);
    if members.is_empty() {
        return Err(Error::not_found(
            "none of the policy's volumes exists".to_owned(),
        ));
    }
    let taken = |snap: &str| {
        members.iter().any(|v| {
            listing
                .snapshots_of(v.id.0)
                .iter()
                .any(|s| s.name.split_once('@').is_some_and(|(_, n)| n == snap))
        })
    };
    let snap = names::unique(&policy.prefix, now, taken).ok_or_else(|| {
        Error::conflict(format!(
            "every name for a snapshot at {} is taken",
            names::snapshot_name(&policy.prefix, now)
        ))
    })?;
    let full: Vec<String> = members
        .iter()
        .map(|v| format!("{}@{snap}", v.name))
        .collect();
    pool.snapshot_group(&full)?;
    Ok(snap)
}

/// The prune plan of one volume.
#[derive(Debug, Clone)]
pub struct VolumePlan {
    /// The volume's name.
    pub volume: String,
    /// Full names (`volume@snap`) in the decisions.
    pub plan: PrunePlan,
}

/// Plans the prune of every volume of `policy` at `now`: retention, then,
/// if the policy opts in and the pool's data use is past its threshold,
/// space-aware pruning. `in_use` names what keeps a snapshot from being
/// destroyed besides its holds (an NBD client, a send), if anything.
pub fn plan(
    pool: &Pool,
    listing: &Listing,
    policy: &Policy,
    now: u64,
    in_use: &dyn Fn(VolumeId) -> Option<String>,
) -> Result<Vec<VolumePlan>, Error> {
    let stats = pool.pool_stats()?;
    let mut used = stats.data_used_bytes;
    let mut plans = Vec::new();
    for volume in listing.members(policy) {
        let mut candidates = Vec::new();
        for snap in listing.snapshots_of(volume.id.0) {
            let stamp = policy_stamp(&policy.prefix, &snap.name);
            let mut held = pool.holds(snap.id)?;
            let needed = held.iter().any(|t| t.starts_with(REPLICATION_HOLD_PREFIX));
            if needed {
                held.retain(|t| !t.starts_with(REPLICATION_HOLD_PREFIX));
            }
            if let Some(user) = in_use(snap.id) {
                held.push(user);
            }
            let exclusive_bytes = match stamp {
                Some(_) => pool.volume_stats(snap.id)?.exclusive_bytes,
                None => 0,
            };
            candidates.push(Candidate {
                name: snap.name.clone(),
                created: stamp.unwrap_or(snap.created_unix_secs),
                policy_made: stamp.is_some(),
                held,
                needed,
                exclusive_bytes,
            });
        }
        let mut volume_plan = prune::plan(&candidates, &policy.retention, now);
        if let Some(threshold) = policy.space_prune_percent {
            volume_plan = prune::space_aware(&volume_plan, used, stats.data_bytes, threshold);
        }
        used = used.saturating_sub(volume_plan.frees());
        plans.push(VolumePlan {
            volume: volume.name.clone(),
            plan: volume_plan,
        });
    }
    Ok(plans)
}

/// What a prune did to one volume's snapshots (or, in a dry run, would).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeOutcome {
    /// The volume's name.
    pub volume: String,
    /// Destroyed (in a dry run: to be), oldest first.
    pub destroyed: Vec<Decision>,
    /// Kept, with why.
    pub kept: Vec<Decision>,
    /// Planned but refused by the destroy, with its error.
    pub failed: Vec<(Decision, String)>,
}

/// Carries out `plans` with `destroy` (a full snapshot name), or with
/// `dry_run` only reports them: a dry run and a prune made from the same
/// plans list the same snapshots.
pub fn execute(
    plans: &[VolumePlan],
    dry_run: bool,
    destroy: &mut dyn FnMut(&str) -> Result<(), String>,
) -> Vec<VolumeOutcome> {
    plans
        .iter()
        .map(|p| {
            let mut outcome = VolumeOutcome {
                volume: p.volume.clone(),
                destroyed: Vec::new(),
                kept: p.plan.keep.clone(),
                failed: Vec::new(),
            };
            for d in &p.plan.destroy {
                match if dry_run { Ok(()) } else { destroy(&d.name) } {
                    Ok(()) => outcome.destroyed.push(d.clone()),
                    Err(e) => outcome.failed.push((d.clone(), e)),
                }
            }
            outcome
        })
        .collect()
}

/// What one policy's turn of a tick did.
#[derive(Debug, Default)]
pub struct Turn {
    /// The scheduled snapshot taken (its name after `@`), or why it failed.
    pub taken: Option<Result<String, Error>>,
    /// The prune, if one was due.
    pub pruned: Option<Vec<VolumeOutcome>>,
}

/// When a policy prunes: after its snapshot, at least every this many
/// seconds, and whenever the pool is past its space threshold.
pub const PRUNE_EVERY_SECS: u64 = 60;

/// One policy's turn at `now`: its scheduled snapshot if due, then its
/// prune if due (`last_prune`: when it last pruned). `in_use` and
/// `destroy` as in [`plan`] and [`execute`].
pub fn turn(
    pool: &Pool,
    policy: &Policy,
    now: u64,
    last_prune: Option<u64>,
    in_use: &dyn Fn(VolumeId) -> Option<String>,
    destroy: &mut dyn FnMut(&str) -> Result<(), String>,
) -> Result<Turn, Error> {
    let mut listing = Listing::of(pool)?;
    let mut turn = Turn::default();
    if policy.schedule.due(listing.last_run(policy, now), now) {
        match take(pool, &listing, policy, now) {
            Err(e) if e.stops_pool() => return Err(e),
            Ok(snap) => {
                listing = Listing::of(pool)?;
                turn.taken = Some(Ok(snap));
            }
            Err(e) => turn.taken = Some(Err(e)),
        }
    }
    let over_threshold = match policy.space_prune_percent {
        Some(threshold) => {
            let s = pool.pool_stats()?;
            u128::from(s.data_used_bytes) * 100 > u128::from(s.data_bytes) * u128::from(threshold)
        }
        None => false,
    };
    let prune_due = matches!(turn.taken, Some(Ok(_)))
        || last_prune.is_none_or(|t| now.saturating_sub(t) >= PRUNE_EVERY_SECS)
        || over_threshold;
    if prune_due {
        let plans = plan(pool, &listing, policy, now, in_use)?;
        turn.pruned = Some(execute(&plans, false, destroy));
    }
    Ok(turn)
}
