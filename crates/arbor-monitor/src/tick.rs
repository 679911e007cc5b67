//! One policy's turn of a monitor tick, as a plan (sans-I/O): which group
//! snapshot is due now and under which name ([`snapshot_due`]), whether
//! the policy prunes ([`prune_due`]), and which snapshots each of its
//! volumes loses and why ([`prune_plans`]). The daemon carries the plan
//! out against the pool (the snapshot, the destroys) and hands the
//! results back ([`VolumeOutcome::of`]) for its run state and alerts.
//!
//! A turn is planned in two steps, because its prune sees the snapshot
//! the turn took: [`snapshot_due`] from the listing before, then, once the
//! daemon took it (or it failed), [`prune_due`] and [`prune_plans`] from
//! the pool's state after.

use arbor_engine::VolumeId;

use crate::listing::Listing;
use crate::names;
use crate::policy::Policy;
use crate::prune::{self, Candidate, Decision, PrunePlan};

/// When a policy prunes: after its snapshot, at least every this many
/// seconds, and whenever the pool is past its space threshold.
pub const PRUNE_EVERY_SECS: u64 = 60;

/// The pool's data space, as far as pruning asks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Bytes of data in use.
    pub used: u64,
    /// Bytes of data the pool holds.
    pub total: u64,
}

impl Usage {
    /// Whether the use is past `percent` of the pool (never without one).
    pub fn over(&self, percent: Option<u8>) -> bool {
        percent
            .is_some_and(|p| u128::from(self.used) * 100 > u128::from(self.total) * u128::from(p))
    }
}

/// The scheduled snapshot of a policy's volumes: one group snapshot, in
/// one commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupSnapshot {
    /// The snapshot's name (the part after `@`), the same for every volume.
    pub snap: String,
    /// Full names (`volume@snap`), one per volume of the policy that
    /// exists, in the policy's order.
    pub full: Vec<String>,
}

/// Why a due snapshot cannot be taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SnapshotRefusal {
    /// None of the policy's volumes exists.
    NoVolume,
    /// Every name for a snapshot at this time is taken; the base name.
    NamesTaken(String),
}

/// The group snapshot `policy` takes at `now`, if its schedule says one is
/// due (its last run is the newest snapshot it made): under a name none of
/// its volumes has yet.
pub fn snapshot_due(
    policy: &Policy,
    listing: &Listing,
    now: u64,
) -> Option<Result<GroupSnapshot, SnapshotRefusal>> {
    if !policy.schedule.due(listing.last_run(policy, now), now) {
        return None;
    }
    let members = listing.members(policy);
    if members.is_empty() {
        return Some(Err(SnapshotRefusal::NoVolume));
    }
    let taken = |snap: &str| {
        members.iter().any(|v| {
            listing
                .snapshots_of(v.id.0)
                .iter()
                .any(|s| s.name.split_once('@').is_some_and(|(_, n)| n == snap))
        })
    };
    let Some(snap) = names::unique(&policy.prefix, now, taken) else {
        return Some(Err(SnapshotRefusal::NamesTaken(names::snapshot_name(
            &policy.prefix,
            now,
        ))));
    };
    let full = members
        .iter()
        .map(|v| format!("{}@{snap}", v.name))
        .collect();
    Some(Ok(GroupSnapshot { snap, full }))
}

/// Whether `policy` prunes at `now`: after a snapshot it took
/// (`snapshot_taken`), when it has not pruned for [`PRUNE_EVERY_SECS`]
/// (`last_prune`, never: it has not), or while the pool is past its space
/// threshold.
pub fn prune_due(
    policy: &Policy,
    snapshot_taken: bool,
    last_prune: Option<u64>,
    now: u64,
    usage: Usage,
) -> bool {
    snapshot_taken
        || last_prune.is_none_or(|t| now.saturating_sub(t) >= PRUNE_EVERY_SECS)
        || usage.over(policy.space_prune_percent)
}

/// The snapshots of one of a policy's volumes, as pruning weighs them.
#[derive(Debug, Clone)]
pub struct VolumeCandidates {
    /// The volume's name.
    pub volume: String,
    /// Its snapshots (with their ids, for what the daemon knows of them).
    pub snapshots: Vec<(VolumeId, Candidate)>,
}

/// The prune plan of one volume.
#[derive(Debug, Clone)]
pub struct VolumePlan {
    /// The volume's name.
    pub volume: String,
    /// Full names (`volume@snap`) in the decisions.
    pub plan: PrunePlan,
}

/// The prune of every volume of `policy` at `now`: retention, then, if the
/// policy opts in and the pool's data use is past its threshold,
/// space-aware pruning, each volume counting what those before it free.
pub fn prune_plans(
    policy: &Policy,
    volumes: &[VolumeCandidates],
    usage: Usage,
    now: u64,
) -> Vec<VolumePlan> {
    let mut used = usage.used;
    volumes
        .iter()
        .map(|volume| {
            let candidates: Vec<Candidate> =
                volume.snapshots.iter().map(|(_, c)| c.clone()).collect();
            let mut plan = prune::plan(&candidates, &policy.retention, now);
            if let Some(threshold) = policy.space_prune_percent {
                plan = prune::space_aware(&plan, used, usage.total, threshold);
            }
            used = used.saturating_sub(plan.frees());
            VolumePlan {
                volume: volume.volume.clone(),
                plan,
            }
        })
        .collect()
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

impl VolumeOutcome {
    /// The outcome of `plan` given how each of its destroys went, in
    /// order (a destroy without a result did not happen: it failed). A
    /// dry run reports every destroy as done, so it and a prune from the
    /// same plan list the same snapshots.
    pub fn of(plan: &VolumePlan, results: Vec<Result<(), String>>) -> Self {
        let mut results = results.into_iter();
        let mut outcome = VolumeOutcome {
            volume: plan.volume.clone(),
            destroyed: Vec::new(),
            kept: plan.plan.keep.clone(),
            failed: Vec::new(),
        };
        for d in &plan.plan.destroy {
            match results.next() {
                Some(Ok(())) => outcome.destroyed.push(d.clone()),
                Some(Err(e)) => outcome.failed.push((d.clone(), e)),
                None => outcome
                    .failed
                    .push((d.clone(), "the destroy did not run".to_owned())),
            }
        }
        outcome
    }

    /// A dry run's outcome of `plan`: every planned destroy listed.
    pub fn dry_run(plan: &VolumePlan) -> Self {
        Self::of(plan, vec![Ok(()); plan.plan.destroy.len()])
    }
}

#[cfg(test)]
mod tests {
    use arbor_engine::{VolumeInfo, VolumeLayout};
    use proptest::prelude::*;

    use super::*;
    use crate::names::snapshot_name;

    /// 2026-03-10T10:17:00Z.
    const T0: u64 = 1_773_137_820;

    fn info(id: u64, name: &str, parent: Option<u64>, created: u64) -> VolumeInfo {
        VolumeInfo {
            id: VolumeId(id),
            name: name.to_owned(),
            snapshot: parent.is_some(),
            size: 1 << 20,
            parent: parent.map(VolumeId),
            created_txn: 1,
            durable: true,
            created_unix_secs: created,
            mapped_bytes: 0,
            guid: None,
            layout: VolumeLayout::Row,
            key_slot: None,
        }
    }

    /// Volumes `db` (1) and `logs` (2), with `db`'s snapshots made at
    /// `stamps` by the policy (id 10 on).
    fn listing(stamps: &[u64]) -> Listing {
        let mut all = vec![info(1, "db", None, T0), info(2, "logs", None, T0)];
        for (i, &t) in stamps.iter().enumerate() {
            let name = format!("db@{}", snapshot_name("auto", t));
            all.push(info(10 + i as u64, &name, Some(1), t));
        }
        Listing::new(all)
    }

    fn policy(volumes: Vec<u64>, schedule: &str, retention: &str) -> Policy {
        Policy::new(
            volumes,
            schedule.parse().unwrap(),
            retention.parse().unwrap(),
        )
    }

    #[test]
    fn a_snapshot_is_due_by_the_schedule_and_the_newest_policy_snapshot() {
        let p = policy(vec![1, 2], "every 10m", "frequent=5");
        // Never run: due at once, for every volume, in the policy's order.
        let due = snapshot_due(&p, &listing(&[]), T0).unwrap().unwrap();
        assert_eq!(due.snap, snapshot_name("auto", T0));
        assert_eq!(
            due.full,
            vec![format!("db@{}", due.snap), format!("logs@{}", due.snap)]
        );
        // Run 9 minutes ago: not due; 10 minutes ago: due.
        assert!(snapshot_due(&p, &listing(&[T0 - 540]), T0).is_none());
        assert!(snapshot_due(&p, &listing(&[T0 - 600]), T0).is_some());
        // A snapshot stamped in the future (a clock stepped back) does not
        // count as the last run.
        assert!(snapshot_due(&p, &listing(&[T0 + 3600]), T0).is_some());
    }

    #[test]
    fn a_snapshot_of_no_volume_is_refused() {
        // Of none of the policy's volumes: a refusal, not a snapshot.
        let gone = policy(vec![7], "every 1m", "frequent=5");
        assert_eq!(
            snapshot_due(&gone, &listing(&[]), T0),
            Some(Err(SnapshotRefusal::NoVolume))
        );
        // Only the policy's own volumes are snapshotted.
        let p = policy(vec![2], "every 1m", "frequent=5");
        let due = snapshot_due(&p, &listing(&[]), T0).unwrap().unwrap();
        assert_eq!(due.full, vec![format!("logs@{}", due.snap)]);
    }

    #[test]
    fn a_prune_is_due_after_a_snapshot_each_minute_and_past_the_threshold() {
        let mut p = policy(vec![1], "daily", "daily=7");
        let calm = Usage {
            used: 10,
            total: 100,
        };
        let full = Usage {
            used: 90,
            total: 100,
        };
        // (snapshot taken, last prune, usage, threshold) -> due
        let table = [
            (true, Some(T0), calm, None, true),
            (false, None, calm, None, true),
            (false, Some(T0 - PRUNE_EVERY_SECS + 1), calm, None, false),
            (false, Some(T0 - PRUNE_EVERY_SECS), calm, None, true),
            (false, Some(T0), full, None, false),
            (false, Some(T0), full, Some(80), true),
            (false, Some(T0), calm, Some(80), false),
            // A prune "later" than now (a clock stepped back) waits.
            (false, Some(T0 + 5), calm, None, false),
        ];
        for (taken, last, usage, threshold, due) in table {
            p.space_prune_percent = threshold;
            assert_eq!(
                prune_due(&p, taken, last, T0, usage),
                due,
                "{taken} {last:?} {usage:?} {threshold:?}"
            );
        }
    }

    fn candidates(volume: &str, stamps: &[u64], bytes: u64) -> VolumeCandidates {
        VolumeCandidates {
            volume: volume.to_owned(),
            snapshots: stamps
                .iter()
                .enumerate()
                .map(|(i, &t)| {
                    let c = Candidate {
                        name: format!("{volume}@{}", snapshot_name("auto", t)),
                        created: t,
                        policy_made: true,
                        held: Vec::new(),
                        needed: false,
                        exclusive_bytes: bytes,
                    };
                    (VolumeId(i as u64 + 10), c)
                })
                .collect(),
        }
    }

    #[test]
    fn retention_prunes_each_volume_and_space_counts_what_those_before_free() {
        let stamps: Vec<u64> = (0..6).map(|i| T0 - i * 60).collect();
        let mut p = policy(vec![1, 2], "every 1m", "frequent=2");
        let volumes = [
            candidates("db", &stamps, 10),
            candidates("logs", &stamps, 10),
        ];
        let calm = Usage {
            used: 0,
            total: 1000,
        };
        let plans = prune_plans(&p, &volumes, calm, T0);
        assert_eq!(plans.len(), 2);
        for plan in &plans {
            assert_eq!(plan.plan.keep.len(), 2, "{plan:?}");
            assert_eq!(plan.plan.destroy.len(), 4, "{plan:?}");
        }
        // Past a threshold, db's prune beyond retention frees enough: logs
        // keeps what retention keeps.
        p.retention = "frequent=6".parse().unwrap();
        p.space_prune_percent = Some(50);
        let tight = Usage {
            used: 520,
            total: 1000,
        };
        let plans = prune_plans(&p, &volumes, tight, T0);
        assert!(!plans[0].plan.destroy.is_empty());
        assert!(plans[1].plan.destroy.is_empty(), "{:?}", plans[1]);
    }

    #[test]
    fn an_outcome_reports_each_destroy_as_it_went() {
        let stamps: Vec<u64> = (0..4).map(|i| T0 - i * 60).collect();
        let p = policy(vec![1], "every 1m", "frequent=1");
        let plans = prune_plans(&p, &[candidates("db", &stamps, 1)], Usage::default(), T0);
        let plan = &plans[0];
        assert_eq!(plan.plan.destroy.len(), 3);
        let dry = VolumeOutcome::dry_run(plan);
        assert_eq!(dry.destroyed, plan.plan.destroy);
        assert_eq!(dry.kept, plan.plan.keep);
        let real = VolumeOutcome::of(plan, vec![Ok(()), Err("busy".to_owned()), Ok(())]);
        assert_eq!(real.destroyed.len(), 2);
        assert_eq!(
            real.failed,
            vec![(plan.plan.destroy[1].clone(), "busy".to_owned())]
        );
        assert_ne!(real, dry);
        assert_eq!(VolumeOutcome::of(plan, vec![Ok(()); 3]), dry);
    }

    proptest! {
        /// Whatever the snapshots and the pool's use: every snapshot is
        /// decided once (destroyed or kept, never both, never twice),
        /// the newest policy snapshot of a volume is never destroyed, and
        /// a due snapshot's name is none a volume has.
        #[test]
        fn nothing_twice(
            ages in proptest::collection::vec(0u64..40 * 86_400, 0..40),
            used in 0u64..2000,
            threshold in proptest::option::of(1u8..100),
            retention in prop::sample::select(vec!["frequent=3", "hourly=2,daily=3", "daily=7,weekly=4"]),
        ) {
            let mut stamps: Vec<u64> = ages.iter().map(|a| T0 - a).collect();
            stamps.sort_unstable();
            stamps.dedup();
            let mut p = policy(vec![1, 2], "hourly", retention);
            p.space_prune_percent = threshold;
            let volumes = [candidates("db", &stamps, 7), candidates("logs", &stamps, 3)];
            let usage = Usage { used, total: 1000 };
            for plan in prune_plans(&p, &volumes, usage, T0) {
                let mut seen: Vec<&String> = plan
                    .plan
                    .destroy
                    .iter()
                    .chain(&plan.plan.keep)
                    .map(|d| &d.name)
                    .collect();
                prop_assert_eq!(seen.len(), stamps.len());
                seen.sort_unstable();
                seen.dedup();
                prop_assert_eq!(seen.len(), stamps.len());
                if let Some(&newest) = stamps.last() {
                    let name = format!("{}@{}", plan.volume, snapshot_name("auto", newest));
                    prop_assert!(plan.plan.destroy.iter().all(|d| d.name != name));
                }
            }
            let listing = listing(&stamps);
            if let Some(due) = snapshot_due(&p, &listing, T0) {
                let due = due.unwrap();
                for full in &due.full {
                    let volume = if full.starts_with("db@") { 1 } else { 2 };
                    prop_assert!(listing.snapshots_of(volume).iter().all(|s| &s.name != full));
                }
            }
        }
    }
}
