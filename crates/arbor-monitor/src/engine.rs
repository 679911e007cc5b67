//! The monitor's reads of the engine: policies and the scrub schedule
//! kept in the pool (as properties, docs/FORMAT.md §6), the pool's listing, its data space, and
//! the snapshots pruning weighs (their holds and exclusive bytes). The
//! plans are [`crate::tick`]'s; the daemon supplies the clock, says which
//! snapshots are in use (open over NBD, being sent), and carries the plans
//! out (the group snapshot, the destroys).
//!
//! A policy's last run is not stored: it is the newest snapshot the policy
//! made (by its name's timestamp), so it survives restarts and moves with
//! the pool, and a destroyed snapshot is simply not counted.

use arbor_engine::{Error, Pool, VolumeId};

use crate::error::PolicyError;
pub use crate::listing::{policy_stamp, Listing, PolicySnapshot};
use crate::policy::Policy;
use crate::prune::Candidate;
use crate::schedule::Schedule;
use crate::scrub::{self, SCRUB_SCHEDULE_KEY};
use crate::tick::{Usage, VolumeCandidates};

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

/// The pool's scrub schedule: `None` when none is set (or the pool has
/// no data checksums, so none can be), else what its stored value parses
/// to (a damaged value: why, as the error inside).
pub fn scrub_schedule(pool: &Pool) -> Result<Option<Result<Schedule, PolicyError>>, Error> {
    if !pool.format_version().has_data_checksums() {
        return Ok(None);
    }
    Ok(pool
        .property(None, SCRUB_SCHEDULE_KEY)?
        .map(|bytes| scrub::decode(&bytes)))
}

/// Sets the pool's scrub schedule (atomic and durable). Refused in a pool
/// without data checksums: a scrub there would verify nothing.
pub fn store_scrub_schedule(pool: &Pool, schedule: &Schedule) -> Result<(), Error> {
    let version = pool.format_version();
    if !version.has_data_checksums() {
        return Err(Error::conflict(format!(
            "this pool's format (version {}) has no data checksums for a scrub to verify, so \
             it has no scrub schedule; upgrade it first (arbor pool upgrade)",
            version.number()
        )));
    }
    schedule
        .validate()
        .map_err(|e| Error::invalid_request(e.to_string()))?;
    pool.set_property(None, SCRUB_SCHEDULE_KEY, &scrub::encode(schedule))
}

/// Removes the pool's scrub schedule; whether there was one.
pub fn remove_scrub_schedule(pool: &Pool) -> Result<bool, Error> {
    if !pool.format_version().has_data_checksums() {
        return Ok(false);
    }
    pool.remove_property(None, SCRUB_SCHEDULE_KEY)
}

impl Listing {
    /// Lists the pool once.
    pub fn of(pool: &Pool) -> Result<Self, Error> {
        Ok(Self::new(pool.list()?))
    }
}

/// The pool's data space now.
pub fn usage(pool: &Pool) -> Result<Usage, Error> {
    let stats = pool.pool_stats()?;
    Ok(Usage {
        used: stats.data_used_bytes,
        total: stats.data_bytes,
    })
}

/// The snapshots of every volume of `policy`, as pruning weighs them: its
/// holds (replication's counted apart: such a snapshot is needed), and
/// the bytes a snapshot the policy made holds alone. What keeps one from
/// being destroyed besides its holds (an NBD client, a send) only the
/// daemon knows: it adds that to `held`.
pub fn candidates(
    pool: &Pool,
    listing: &Listing,
    policy: &Policy,
) -> Result<Vec<VolumeCandidates>, Error> {
    let mut volumes = Vec::new();
    for volume in listing.members(policy) {
        let mut snapshots = Vec::new();
        for snap in listing.snapshots_of(volume.id.0) {
            let stamp = policy_stamp(&policy.prefix, &snap.name);
            let mut held = pool.holds(snap.id)?;
            let needed = held.iter().any(|t| t.starts_with(REPLICATION_HOLD_PREFIX));
            if needed {
                held.retain(|t| !t.starts_with(REPLICATION_HOLD_PREFIX));
            }
            let exclusive_bytes = match stamp {
                Some(_) => pool.volume_stats(snap.id)?.exclusive_bytes,
                None => 0,
            };
            snapshots.push((
                snap.id,
                Candidate {
                    name: snap.name.clone(),
                    created: stamp.unwrap_or(snap.created_unix_secs),
                    policy_made: stamp.is_some(),
                    held,
                    needed,
                    exclusive_bytes,
                },
            ));
        }
        volumes.push(VolumeCandidates {
            volume: volume.name.clone(),
            snapshots,
        });
    }
    Ok(volumes)
}
