//! The pool's volumes and snapshots as the monitor sees them, from one
//! listing: which snapshots a policy made (by their names), and its last
//! run. Pure: the listing is data ([`crate::engine`] lists the pool).

use std::collections::HashMap;

use arbor_engine::{VolumeId, VolumeInfo};

use crate::names;
use crate::policy::Policy;

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
    /// The listing of `all` the pool's volumes and snapshots.
    pub fn new(all: Vec<VolumeInfo>) -> Self {
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
        Self { by_id, snapshots }
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
