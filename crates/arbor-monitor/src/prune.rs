//! The prune planner: which snapshots to destroy, and why every other one
//! is kept.
//!
//! [`plan`] applies a [`Retention`] rule to a volume's snapshots; the
//! daemon carries out [`PrunePlan::destroy`]. [`space_aware`] optionally
//! extends a plan when the pool is too full.
//!
//! # Rules
//!
//! * Only policy-made snapshots are ever destroyed; the user's own are kept
//!   with [`Reason::NotPolicy`]. The retention rule is evaluated over the
//!   policy-made snapshots only.
//! * A held snapshot ([`Reason::Held`]) or one a replication target still
//!   needs ([`Reason::NeededByReplication`]) is never destroyed, and its
//!   reason says so even if retention would drop it.
//! * The newest policy snapshot is never destroyed ([`Reason::Newest`]); if
//!   several share the latest creation second, all of them count as the
//!   newest.
//! * A policy snapshot created after `now` (the clock was stepped back) is
//!   never destroyed ([`Reason::FromFuture`]): ages computed from an
//!   untrustworthy clock must not destroy data.
//! * Otherwise a policy snapshot is kept if the retention rule keeps it
//!   ([`Reason::KeptBy`], naming the first rule that does) and destroyed
//!   ([`Reason::Retention`]) if not.
//!
//! Reasons are assigned in the order listed: `NotPolicy`, `Held`,
//! `NeededByReplication`, `Newest`, `FromFuture`, `KeptBy`.
//!
//! Both lists are sorted oldest first (by creation time, then name, then
//! input order), so a plan is deterministic. The planner is pure and total:
//! it never panics, whatever the candidates or the (possibly invalid,
//! hand-built) rule.
//!
//! Re-planning the survivors at the same `now` destroys nothing more: the
//! newest snapshot survives, so the grid's anchor does not move, and every
//! snapshot a class or grid bucket kept is still the newest (classes) or
//! among the oldest (grid) of its bucket.

use std::fmt;

use crate::retention::Retention;

/// One snapshot of a volume, as the daemon sees it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Candidate {
    /// Snapshot name (the part after `volume@`).
    pub name: String,
    /// Creation time, Unix seconds (UTC).
    pub created: u64,
    /// Whether the snapshot was made by this policy (its name parses with
    /// the policy's prefix, see [`crate::names::parse`]).
    pub policy_made: bool,
    /// Hold tags on the snapshot; a held snapshot is never destroyed.
    pub held: Vec<String>,
    /// Whether this is the newest snapshot a replication target still needs
    /// as the base of its next incremental send.
    pub needed: bool,
    /// Bytes referenced only by this snapshot: roughly what destroying it
    /// frees.
    pub exclusive_bytes: u64,
}

/// Why a snapshot is destroyed or kept.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Reason {
    /// Destroy: no retention rule keeps it.
    Retention,
    /// Destroy: the pool is over its space threshold (see [`space_aware`]).
    SpaceAware,
    /// Keep: the named retention rule keeps it (`"hourly"`,
    /// `"grid 24x1h"`, ...).
    KeptBy(String),
    /// Keep: it carries these hold tags.
    Held(Vec<String>),
    /// Keep: a replication target still needs it.
    NeededByReplication,
    /// Keep: it was not made by the policy.
    NotPolicy,
    /// Keep: it is the newest policy snapshot.
    Newest,
    /// Keep: it was created after `now` (clock stepped back).
    FromFuture,
}

impl Reason {
    /// Whether this reason belongs in [`PrunePlan::destroy`].
    pub fn is_destroy(&self) -> bool {
        matches!(self, Reason::Retention | Reason::SpaceAware)
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::Retention => f.write_str("not kept by retention"),
            Reason::SpaceAware => f.write_str("pool above space threshold"),
            Reason::KeptBy(rule) => write!(f, "kept by {rule}"),
            Reason::Held(tags) => write!(f, "held ({})", tags.join(", ")),
            Reason::NeededByReplication => f.write_str("needed by replication"),
            Reason::NotPolicy => f.write_str("not made by the policy"),
            Reason::Newest => f.write_str("newest policy snapshot"),
            Reason::FromFuture => f.write_str("created in the future (clock stepped back?)"),
        }
    }
}

/// The decision for one snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Decision {
    /// Snapshot name.
    pub name: String,
    /// Creation time, Unix seconds.
    pub created: u64,
    /// Why.
    pub reason: Reason,
    /// The candidate's `exclusive_bytes`: roughly what destroying it frees.
    pub frees: u64,
}

/// The outcome of planning: every candidate appears in exactly one list.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct PrunePlan {
    /// Snapshots to destroy, oldest first.
    pub destroy: Vec<Decision>,
    /// Snapshots to keep, oldest first.
    pub keep: Vec<Decision>,
}

impl PrunePlan {
    /// Sum of `frees` over [`PrunePlan::destroy`], saturating. A lower
    /// bound in practice: destroying neighbouring snapshots can free blocks
    /// they shared, which neither counted as exclusive.
    pub fn frees(&self) -> u64 {
        self.destroy
            .iter()
            .fold(0u64, |acc, d| acc.saturating_add(d.frees))
    }
}

/// Sorts decisions oldest first; the sort is stable, so ties keep their
/// input order.
fn sort_oldest_first(list: &mut [Decision]) {
    list.sort_by(|a, b| (a.created, &a.name).cmp(&(b.created, &b.name)));
}

/// Which candidates count as the newest, never destroyed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Newest {
    /// Every one created in the latest second (snapshots: their names say
    /// nothing of their order).
    LatestSecond,
    /// Only the last by creation time, then name (backups, named so that
    /// their names sort in the order they completed).
    LastByName,
}

/// Plans which of a volume's snapshots to destroy under `retention` at
/// `now`. See the module docs for the rules.
pub fn plan(candidates: &[Candidate], retention: &Retention, now: u64) -> PrunePlan {
    plan_with(candidates, retention, now, Newest::LatestSecond)
}

/// [`plan`] with the rule for which candidates are the newest.
pub fn plan_with(
    candidates: &[Candidate],
    retention: &Retention,
    now: u64,
    newest_rule: Newest,
) -> PrunePlan {
    let items: Vec<(u64, &str)> = candidates
        .iter()
        .filter(|c| c.policy_made)
        .map(|c| (c.created, c.name.as_str()))
        .collect();
    // One label per policy-made candidate, in input order.
    let mut labels = retention.labels(&items).into_iter();
    let newest = items.iter().map(|it| it.0).max();
    let last = items.iter().max().copied();
    let is_newest = |c: &Candidate| match newest_rule {
        Newest::LatestSecond => Some(c.created) == newest,
        Newest::LastByName => Some((c.created, c.name.as_str())) == last,
    };

    let mut out = PrunePlan::default();
    for c in candidates {
        let label = if c.policy_made {
            labels.next().flatten()
        } else {
            None
        };
        let reason = if !c.policy_made {
            Reason::NotPolicy
        } else if !c.held.is_empty() {
            Reason::Held(c.held.clone())
        } else if c.needed {
            Reason::NeededByReplication
        } else if is_newest(c) {
            Reason::Newest
        } else if c.created > now {
            Reason::FromFuture
        } else if let Some(rule) = label {
            Reason::KeptBy(rule)
        } else {
            Reason::Retention
        };
        let d = Decision {
            name: c.name.clone(),
            created: c.created,
            frees: c.exclusive_bytes,
            reason,
        };
        if d.reason.is_destroy() {
            out.destroy.push(d);
        } else {
            out.keep.push(d);
        }
    }
    sort_oldest_first(&mut out.destroy);
    sort_oldest_first(&mut out.keep);
    out
}

/// Whether `used` bytes are at or under `threshold` percent of `capacity`.
fn within(used: u64, capacity: u64, threshold: u8) -> bool {
    u128::from(used) * 100 <= u128::from(capacity) * u128::from(threshold)
}

/// Extends `plan` when the pool is too full.
///
/// If the projected use — `used_bytes` minus what `plan.destroy` frees — is
/// above `threshold_percent` (clamped to 100) of `capacity_bytes`, the
/// oldest kept snapshots that retention merely *chose* to keep (reason
/// [`Reason::KeptBy`]: policy-made, not held, not needed, not the newest,
/// not from the future) move to `destroy` with [`Reason::SpaceAware`], one
/// by one, until the projection is at or under the threshold or none is
/// left. Snapshots kept for any other reason never move.
///
/// The projection sums `frees`, which underestimates what destroying
/// several neighbouring snapshots frees, so this may plan slightly more
/// than needed; the daemon can re-plan with fresh numbers after each
/// destroy. A `capacity_bytes` of 0 (unknown) leaves the plan unchanged.
pub fn space_aware(
    plan: &PrunePlan,
    used_bytes: u64,
    capacity_bytes: u64,
    threshold_percent: u8,
) -> PrunePlan {
    let mut out = plan.clone();
    let threshold = threshold_percent.min(100);
    let mut projected = used_bytes.saturating_sub(plan.frees());
    if capacity_bytes == 0 || within(projected, capacity_bytes, threshold) {
        return out;
    }
    // Indexing below is in bounds: `movable` holds positions in `out.keep`
    // and `moving` has its length.
    let mut movable: Vec<usize> = out
        .keep
        .iter()
        .enumerate()
        .filter(|(_, d)| matches!(d.reason, Reason::KeptBy(_)))
        .map(|(i, _)| i)
        .collect();
    movable.sort_by(|&a, &b| {
        let (da, db) = (&out.keep[a], &out.keep[b]);
        (da.created, &da.name, a).cmp(&(db.created, &db.name, b))
    });
    let mut moving = vec![false; out.keep.len()];
    for i in movable {
        if within(projected, capacity_bytes, threshold) {
            break;
        }
        moving[i] = true;
        projected = projected.saturating_sub(out.keep[i].frees);
    }
    let keep = std::mem::take(&mut out.keep);
    for (d, moved) in keep.into_iter().zip(moving) {
        if moved {
            out.destroy.push(Decision {
                reason: Reason::SpaceAware,
                ..d
            });
        } else {
            out.keep.push(d);
        }
    }
    sort_oldest_first(&mut out.destroy);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::civil::{DAY, HOUR};
    use crate::retention::{GridInterval, Keep};
    use proptest::prelude::*;
    use std::collections::HashMap;

    const T0: u64 = 1_795_492_800;

    fn snap(name: &str, created: u64) -> Candidate {
        Candidate {
            name: name.to_owned(),
            created,
            policy_made: true,
            held: vec![],
            needed: false,
            exclusive_bytes: 10,
        }
    }

    fn names(list: &[Decision]) -> Vec<&str> {
        list.iter().map(|d| d.name.as_str()).collect()
    }

    fn reason_of<'a>(p: &'a PrunePlan, name: &str) -> &'a Reason {
        &p.keep
            .iter()
            .chain(&p.destroy)
            .find(|d| d.name == name)
            .unwrap()
            .reason
    }

    #[test]
    fn protections_override_retention() {
        let r: Retention = "frequent=1".parse().unwrap();
        let mut c = vec![
            snap("a", T0),
            snap("b", T0 + 1),
            snap("c", T0 + 2),
            snap("d", T0 + 3),
            snap("e", T0 + 4),
            snap("f", T0 + 5),
        ];
        c[0].held = vec!["backup".to_owned(), "x".to_owned()];
        c[1].needed = true;
        c[2].policy_made = false;
        let p = plan(&c, &r, T0 + 10);
        assert_eq!(names(&p.destroy), vec!["d", "e"]);
        assert_eq!(
            reason_of(&p, "a"),
            &Reason::Held(vec!["backup".to_owned(), "x".to_owned()])
        );
        assert_eq!(reason_of(&p, "a").to_string(), "held (backup, x)");
        assert_eq!(reason_of(&p, "b"), &Reason::NeededByReplication);
        assert_eq!(reason_of(&p, "c"), &Reason::NotPolicy);
        assert_eq!(reason_of(&p, "f"), &Reason::Newest);
        assert_eq!(reason_of(&p, "d"), &Reason::Retention);
        assert_eq!(names(&p.keep), vec!["a", "b", "c", "f"]);
        assert_eq!(p.frees(), 20);
    }

    #[test]
    fn newest_policy_snapshot_survives_even_when_grid_drops_it() {
        // keep=1 in the first bucket keeps the bucket's oldest; the newest
        // is kept by the Newest rule.
        let r: Retention = "1x1h".parse().unwrap();
        let c = vec![snap("old", T0), snap("mid", T0 + 60), snap("new", T0 + 120)];
        let p = plan(&c, &r, T0 + 120);
        assert_eq!(names(&p.destroy), vec!["mid"]);
        assert_eq!(
            reason_of(&p, "old"),
            &Reason::KeptBy("grid 1x1h".to_owned())
        );
        assert_eq!(reason_of(&p, "new"), &Reason::Newest);
    }

    /// Backups of snapshots taken in one second: only the last by name is
    /// the newest; the others are judged by the rule.
    #[test]
    fn with_last_by_name_one_of_a_second_is_the_newest() {
        let r: Retention = "frequent=1".parse().unwrap();
        let c = [snap("b-2", T0), snap("a-1", T0)];
        let all = plan(&c, &r, T0 + 10);
        assert!(all.destroy.is_empty(), "{all:?}");
        let p = plan_with(&c, &r, T0 + 10, Newest::LastByName);
        assert_eq!(names(&p.destroy), vec!["a-1"]);
        assert_eq!(reason_of(&p, "b-2"), &Reason::Newest);
    }

    #[test]
    fn user_snapshots_do_not_count() {
        // A newer user snapshot neither anchors the grid nor takes the
        // "newest" slot.
        let r: Retention = "1x1h(keep=all)".parse().unwrap();
        let mut user = snap("mine", T0 + 10 * HOUR);
        user.policy_made = false;
        let c = vec![snap("p1", T0), snap("p2", T0 + 1_800), user];
        let p = plan(&c, &r, T0 + 10 * HOUR);
        assert!(p.destroy.is_empty());
        assert_eq!(
            reason_of(&p, "p1"),
            &Reason::KeptBy("grid 1x1h(keep=all)".to_owned())
        );
        assert_eq!(reason_of(&p, "p2"), &Reason::Newest);
    }

    #[test]
    fn future_snapshots_are_kept() {
        let r: Retention = "frequent=1".parse().unwrap();
        let c = vec![snap("a", T0), snap("b", T0 + DAY), snap("c", T0 + 2 * DAY)];
        // At T0 + 1, b and c lie in the future: only a may go.
        let p = plan(&c, &r, T0 + 1);
        assert_eq!(names(&p.destroy), vec!["a"]);
        assert_eq!(reason_of(&p, "b"), &Reason::FromFuture);
        let p = plan(&c, &r, T0 + 3 * DAY);
        assert_eq!(names(&p.destroy), vec!["a", "b"]);
    }

    #[test]
    fn empty_and_degenerate_inputs() {
        let r: Retention = "hourly=1".parse().unwrap();
        assert_eq!(plan(&[], &r, 0), PrunePlan::default());
        let p = plan(&[snap("x", u64::MAX), snap("y", 0)], &r, u64::MAX);
        assert_eq!(names(&p.destroy), vec!["y"]);
    }

    #[test]
    fn space_aware_moves_oldest_unprotected() {
        let r: Retention = "frequent=10".parse().unwrap();
        let mut c: Vec<Candidate> = (0..6)
            .map(|i| snap(&format!("s{i}"), T0 + i * HOUR))
            .collect();
        c[0].held = vec!["h".to_owned()];
        c[1].needed = true;
        for (i, s) in c.iter_mut().enumerate() {
            s.exclusive_bytes = 100 * (i as u64 + 1);
        }
        let base = plan(&c, &r, T0 + DAY);
        assert!(base.destroy.is_empty());
        // Capacity 10_000, threshold 80% → limit 8_000. Used 8_500: moving
        // s2 (300) gets to 8_200, s3 (400) to 7_800.
        let p = space_aware(&base, 8_500, 10_000, 80);
        assert_eq!(names(&p.destroy), vec!["s2", "s3"]);
        assert!(p.destroy.iter().all(|d| d.reason == Reason::SpaceAware));
        assert_eq!(names(&p.keep), vec!["s0", "s1", "s4", "s5"]);
        // Already under the threshold: unchanged.
        assert_eq!(space_aware(&base, 8_000, 10_000, 80), base);
        // Hopelessly full: everything movable goes, never s0, s1 or s5.
        let p = space_aware(&base, u64::MAX, 10_000, 80);
        assert_eq!(names(&p.destroy), vec!["s2", "s3", "s4"]);
        // Capacity unknown: unchanged.
        assert_eq!(space_aware(&base, u64::MAX, 0, 80), base);
        // Frees already planned count towards the projection.
        let r2: Retention = "frequent=3".parse().unwrap();
        let base2 = plan(&c, &r2, T0 + DAY); // destroys s2 (300)
        assert_eq!(names(&base2.destroy), vec!["s2"]);
        assert_eq!(space_aware(&base2, 8_300, 10_000, 80), base2);
        let p = space_aware(&base2, 8_301, 10_000, 80);
        assert_eq!(names(&p.destroy), vec!["s2", "s3"]);
    }

    fn arb_candidates() -> impl Strategy<Value = Vec<Candidate>> {
        let created = prop_oneof![
            T0..T0 + 90 * DAY,
            T0..T0 + 4 * HOUR,
            Just(0u64),
            Just(u64::MAX),
            any::<u64>(),
        ];
        let cand = (
            "s[0-9]{1,2}",
            created,
            proptest::bool::weighted(0.85),
            prop_oneof![
                8 => Just(Vec::new()),
                1 => proptest::collection::vec("[a-z]{1,3}", 1..=2),
            ],
            proptest::bool::weighted(0.1),
            any::<u64>(),
        )
            .prop_map(
                |(name, created, policy_made, held, needed, exclusive_bytes)| Candidate {
                    name,
                    created,
                    policy_made,
                    held,
                    needed,
                    exclusive_bytes,
                },
            );
        // A volume's snapshot names are unique: the plan's decisions name
        // the snapshot they are about (found by CI: with two candidates of
        // one name, a destroy could not say which one it meant).
        proptest::collection::vec(cand, 0..60).prop_map(|all| {
            let mut seen = std::collections::HashSet::new();
            all.into_iter()
                .filter(|c| seen.insert(c.name.clone()))
                .collect()
        })
    }

    fn arb_any_retention() -> impl Strategy<Value = Retention> {
        let term = (
            any::<u32>(),
            prop_oneof![1u64..=3 * DAY, any::<u64>()],
            prop_oneof![
                Just(Keep::All),
                any::<u32>().prop_map(Keep::N),
                (0u32..4).prop_map(Keep::N)
            ],
        )
            .prop_map(|(count, length_secs, keep)| GridInterval {
                count: count % 50,
                length_secs,
                keep,
            });
        prop_oneof![
            crate::retention::tests::arb_retention(),
            proptest::collection::vec(term, 0..20).prop_map(Retention::Grid),
            proptest::array::uniform6(prop_oneof![0u32..30, any::<u32>()]).prop_map(
                |[frequent, hourly, daily, weekly, monthly, yearly]| Retention::Classes {
                    frequent,
                    hourly,
                    daily,
                    weekly,
                    monthly,
                    yearly,
                }
            ),
        ]
    }

    /// Checks the invariants every plan must satisfy.
    fn check_invariants(c: &[Candidate], p: &PrunePlan) -> Result<(), TestCaseError> {
        // destroy ∪ keep = all, disjoint (as multisets of (name, created)).
        let mut want: HashMap<(&str, u64), i64> = HashMap::new();
        for x in c {
            *want.entry((x.name.as_str(), x.created)).or_default() += 1;
        }
        for d in p.destroy.iter().chain(&p.keep) {
            *want.entry((d.name.as_str(), d.created)).or_default() -= 1;
        }
        prop_assert!(want.values().all(|&n| n == 0));
        // Destroyed ⊆ policy-made ∧ ¬held ∧ ¬needed: per identity, no more
        // destroys than destroyable candidates.
        let mut destroyable: HashMap<(&str, u64), i64> = HashMap::new();
        for x in c
            .iter()
            .filter(|x| x.policy_made && x.held.is_empty() && !x.needed)
        {
            *destroyable.entry((x.name.as_str(), x.created)).or_default() += 1;
        }
        for d in &p.destroy {
            prop_assert!(d.reason.is_destroy());
            let n = destroyable.entry((d.name.as_str(), d.created)).or_default();
            *n -= 1;
            prop_assert!(*n >= 0, "{:?} is not destroyable", d);
        }
        for d in &p.keep {
            prop_assert!(!d.reason.is_destroy());
        }
        if let Some(newest) = c.iter().filter(|x| x.policy_made).map(|x| x.created).max() {
            prop_assert!(p.destroy.iter().all(|d| d.created != newest));
        }
        for list in [&p.destroy, &p.keep] {
            prop_assert!(list
                .windows(2)
                .all(|w| (w[0].created, &w[0].name) <= (w[1].created, &w[1].name)));
        }
        Ok(())
    }

    fn survivors(c: &[Candidate], p: &PrunePlan) -> Vec<Candidate> {
        // Destroy the planned ones, one candidate per decision, keeping the
        // input order of the rest.
        let mut left: HashMap<(&str, u64), usize> = HashMap::new();
        for d in &p.destroy {
            *left.entry((d.name.as_str(), d.created)).or_default() += 1;
        }
        let mut out = Vec::new();
        for x in c {
            let k = (x.name.as_str(), x.created);
            match left.get_mut(&k) {
                Some(n) if *n > 0 && x.policy_made && x.held.is_empty() && !x.needed => *n -= 1,
                _ => out.push(x.clone()),
            }
        }
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn plan_invariants(c in arb_candidates(), r in arb_any_retention(), now in prop_oneof![Just(T0 + 90 * DAY), any::<u64>()]) {
            let p = plan(&c, &r, now);
            check_invariants(&c, &p)?;
            prop_assert_eq!(&plan(&c, &r, now), &p, "deterministic");
        }

        /// Re-planning the survivors at the same `now` destroys nothing
        /// more, for classes and for grids.
        #[test]
        fn plan_is_idempotent(c in arb_candidates(), r in arb_any_retention(), now in prop_oneof![Just(T0 + 90 * DAY), any::<u64>()]) {
            let p = plan(&c, &r, now);
            let s = survivors(&c, &p);
            let again = plan(&s, &r, now);
            prop_assert!(again.destroy.is_empty(), "{:?} then {:?}", p.destroy, again.destroy);
        }

        #[test]
        fn space_aware_invariants(
            c in arb_candidates(),
            r in arb_any_retention(),
            used in any::<u64>(),
            capacity in prop_oneof![Just(0u64), any::<u64>(), 1u64..1_000_000],
            threshold in any::<u8>(),
        ) {
            let base = plan(&c, &r, T0 + 90 * DAY);
            let p = space_aware(&base, used, capacity, threshold);
            check_invariants(&c, &p)?;
            // Only KeptBy decisions move, and the base destroys stay.
            for d in &base.destroy {
                prop_assert!(p.destroy.contains(d));
            }
            for d in p.destroy.iter().filter(|d| d.reason == Reason::SpaceAware) {
                prop_assert!(base.keep.iter().any(|k| k.name == d.name && k.created == d.created && matches!(k.reason, Reason::KeptBy(_))));
            }
            // Either under the threshold, or nothing movable is left.
            let projected = used.saturating_sub(p.frees());
            prop_assert!(
                capacity == 0
                    || within(projected, capacity, threshold.min(100))
                    || !p.keep.iter().any(|d| matches!(d.reason, Reason::KeptBy(_)))
            );
            // Moved snapshots are the oldest movable ones.
            if let Some(youngest_moved) = p.destroy.iter().filter(|d| d.reason == Reason::SpaceAware).map(|d| d.created).max() {
                prop_assert!(p.keep.iter().filter(|d| matches!(d.reason, Reason::KeptBy(_))).all(|d| d.created >= youngest_moved));
            }
        }
    }
}
