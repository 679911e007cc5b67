//! Alerts (docs/MONITOR.md §5): conditions the monitor finds each tick,
//! kept as a set whose changes — raised, more or less severe, cleared —
//! are what gets logged, so a condition that lasts is logged once, not
//! every second.
//!
//! Every alert has hysteresis: it is raised (or made worse) at the first
//! sample that finds it, but goes down or clears only after
//! [`CLEAR_AFTER_SAMPLES`] samples in a row found it less severe or gone;
//! a space alert moreover stays until use is [`SPACE_CLEAR_MARGIN_PERCENT`]
//! points under its threshold. A condition that hovers at its edge is one
//! alert, not a stream of raises and clears.

use std::collections::{BTreeMap, VecDeque};

use tracing::{info, warn};

use crate::space::SpaceWatch;
use arbor_api::model::{AlertKind, AlertView, ReplicaPairView, Severity};

/// Replication lag thresholds, in pair intervals, and their floors: a pair
/// a few cycles behind warns, ten behind is critical.
const LAG_WARN_INTERVALS: u64 = 3;
const LAG_WARN_MIN_SECS: u64 = 60;
const LAG_CRIT_INTERVALS: u64 = 10;
const LAG_CRIT_MIN_SECS: u64 = 600;
/// Failed runs in a row at which a policy's failure alert turns critical.
pub const CRITICAL_FAILURES: u32 = 3;
/// Samples (monitor ticks) in a row that must find an alert's condition
/// gone, or less severe, before the alert clears or goes down.
pub const CLEAR_AFTER_SAMPLES: u32 = 5;
/// Percentage points under a space threshold (data or metadata use, a
/// policy's space-prune threshold) that use must fall to before what it
/// raised clears.
pub const SPACE_CLEAR_MARGIN_PERCENT: u8 = 3;
/// Most snapshot names a `space_pruned` alert lists (newest; its count
/// covers them all).
pub const SPACE_PRUNED_NAMES: usize = 8;

/// A condition found now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Condition {
    pub kind: AlertKind,
    pub severity: Severity,
    pub subject: String,
    pub message: String,
}

impl Condition {
    pub fn new(kind: AlertKind, severity: Severity, subject: &str, message: String) -> Self {
        Self {
            kind,
            severity,
            subject: subject.to_owned(),
            message,
        }
    }
}

/// Data or metadata use past the configured thresholds (increasing): a
/// warning from the lowest, critical from the highest when there are two
/// or more. `held`: the severity its alert has now, whose thresholds hold
/// until use is [`SPACE_CLEAR_MARGIN_PERCENT`] points under them.
pub fn space(
    kind: AlertKind,
    name: &str,
    used: u64,
    total: u64,
    watch: &SpaceWatch,
    held: Option<Severity>,
) -> Option<Condition> {
    let c = watch.crossing_held(
        used,
        total,
        held.map(|s| s == Severity::Critical),
        SPACE_CLEAR_MARGIN_PERCENT,
    )?;
    Some(Condition::new(
        kind,
        if c.last {
            Severity::Critical
        } else {
            Severity::Warning
        },
        name,
        format!(
            "{name} space is {}% used (threshold {}%)",
            c.percent, c.threshold
        ),
    ))
}

/// A policy volume whose newest policy snapshot is `age` seconds old.
pub fn snapshot_age(volume: &str, age: u64, warn: u64, crit: u64) -> Option<Condition> {
    let severity = if age >= crit {
        Severity::Critical
    } else if age >= warn {
        Severity::Warning
    } else {
        return None;
    };
    Some(Condition::new(
        AlertKind::SnapshotAge,
        severity,
        volume,
        format!(
            "the newest scheduled snapshot of {volume} is {} old (warn at {}, critical at {})",
            human_secs(age),
            human_secs(warn),
            human_secs(crit)
        ),
    ))
}

/// A replication pair whose recovery point is too old.
pub fn replication_lag(pair: &ReplicaPairView) -> Option<Condition> {
    let lag = pair.recovery_point_secs?;
    let warn = pair
        .interval_secs
        .saturating_mul(LAG_WARN_INTERVALS)
        .max(LAG_WARN_MIN_SECS);
    let crit = pair
        .interval_secs
        .saturating_mul(LAG_CRIT_INTERVALS)
        .max(LAG_CRIT_MIN_SECS);
    let severity = if lag >= crit {
        Severity::Critical
    } else if lag >= warn {
        Severity::Warning
    } else {
        return None;
    };
    let subject = format!("{} -> {}", pair.volume, pair.target);
    let error = pair
        .error
        .as_deref()
        .map(|e| format!("; last error: {e}"))
        .unwrap_or_default();
    Some(Condition::new(
        AlertKind::ReplicationLag,
        severity,
        &subject,
        format!(
            "{}'s copy on {} is {} behind (warn at {}, critical at {}){error}",
            pair.volume,
            pair.target,
            human_secs(lag),
            human_secs(warn),
            human_secs(crit)
        ),
    ))
}

/// The scrub stopped on an error (`why`: the error and where it stopped).
/// Critical: the pool is not verified as its schedule or its user meant it
/// to be. The scrub keeps it until a scrub runs to completion.
pub fn scrub_failed(why: &str) -> Condition {
    Condition::new(
        AlertKind::ScrubFailed,
        Severity::Critical,
        "scrub",
        format!(
            "{why} (arbor scrub status; arbor scrub start goes on: this clears when a scrub \
             runs to completion)"
        ),
    )
}

/// The pool's scrub schedule is damaged (`why`: what is wrong with it): no
/// scrub is scheduled until it is set again or cleared.
pub fn scrub_schedule_damaged(why: &str) -> Condition {
    Condition::new(
        AlertKind::ScrubScheduleDamaged,
        Severity::Warning,
        "scrub",
        format!(
            "the pool's scrub schedule is damaged, so no scrub is scheduled: {why} (arbor scrub \
             schedule sets it again, arbor scrub schedule --clear removes it)"
        ),
    )
}

/// The metadata check at the end of the last completed scrub found
/// `problems` problems in the pool's metadata.
pub fn scrub_metadata_problems(problems: u64) -> Condition {
    Condition::new(
        AlertKind::ScrubMetadataProblems,
        Severity::Critical,
        "scrub",
        format!(
            "the last scrub's metadata check found {problems} problem(s) in the pool's metadata \
             (arbor check lists them; this clears when a scrub's check finds none)"
        ),
    )
}

/// A duration as people read it: `45s`, `12m`, `3h 5m`, `2d 4h`.
pub fn human_secs(secs: u64) -> String {
    let (d, h, m, s) = (secs / 86_400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    match (d, h, m) {
        (0, 0, 0) => format!("{s}s"),
        (0, 0, _) => format!("{m}m"),
        (0, _, 0) => format!("{h}h"),
        (0, _, _) => format!("{h}h {m}m"),
        (_, 0, _) => format!("{d}d"),
        _ => format!("{d}d {h}h"),
    }
}

/// How an alert changed in an update.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Raised(AlertView),
    Severity { from: Severity, alert: AlertView },
    Cleared(AlertView),
}

/// What space-aware pruning destroyed since the pool went past a policy's
/// space threshold: the `space_pruned` condition. It lasts while the pool
/// stays past the threshold (each prune adds what it destroyed; a prune
/// that finds nothing more to destroy changes nothing) and ends when use is
/// [`SPACE_CLEAR_MARGIN_PERCENT`] points under the threshold.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SpacePruned {
    /// Snapshots destroyed so far.
    pub count: u64,
    /// The newest of them, at most [`SPACE_PRUNED_NAMES`], oldest first.
    pub names: VecDeque<String>,
}

impl SpacePruned {
    /// A prune destroyed `names` beyond retention to free space.
    pub fn pruned(&mut self, names: &[String]) {
        self.count = self.count.saturating_add(names.len() as u64);
        for name in names {
            if self.names.len() == SPACE_PRUNED_NAMES {
                self.names.pop_front();
            }
            self.names.push_back(name.clone());
        }
    }

    /// The pool's data use now, against the policy's threshold (`None`:
    /// it has none any more): back under it by the margin, the condition
    /// is over.
    pub fn observe(&mut self, used: u64, total: u64, threshold: Option<u8>) {
        let under = match threshold {
            None => true,
            Some(t) => {
                let clear = u128::from(t.saturating_sub(SPACE_CLEAR_MARGIN_PERCENT));
                u128::from(used) * 100 <= u128::from(total) * clear
            }
        };
        if under {
            *self = Self::default();
        }
    }

    /// The alert's condition for policy `key`, if any was destroyed.
    pub fn condition(&self, key: &str) -> Option<Condition> {
        if self.count == 0 {
            return None;
        }
        let listed: Vec<&str> = self.names.iter().map(String::as_str).collect();
        let more = self.count.saturating_sub(listed.len() as u64);
        Some(Condition::new(
            AlertKind::SpacePruned,
            Severity::Warning,
            key,
            format!(
                "the pool is past the policy's space threshold: {} snapshot{} pruned beyond \
                 retention ({}{})",
                self.count,
                if self.count == 1 { "" } else { "s" },
                listed.join(", "),
                if more > 0 {
                    format!(" and {more} older")
                } else {
                    String::new()
                }
            ),
        ))
    }
}

/// One active alert, and how long its condition has been calmer.
#[derive(Debug)]
struct Entry {
    alert: AlertView,
    /// Samples in a row that found the condition gone or less severe.
    calm: u32,
    /// The most severe condition among those samples (the latest of
    /// that severity), if any found one.
    calm_best: Option<Condition>,
}

/// The active alerts.
#[derive(Debug, Default)]
pub struct Book {
    active: BTreeMap<(AlertKind, String), Entry>,
}

impl Book {
    /// Takes `found`, the conditions of one sample at `now`: a new
    /// condition, or one that got worse, raises its alert at once (its
    /// `since` starts now); one that is gone or less severe clears or
    /// lowers it only after [`CLEAR_AFTER_SAMPLES`] samples in a row (a
    /// lowered alert keeps its `since`). Returns the changes, each also
    /// logged.
    pub fn update(&mut self, found: Vec<Condition>, now: u64) -> Vec<Change> {
        // One condition per alert: the most severe.
        let mut found_by: BTreeMap<(AlertKind, String), Condition> = BTreeMap::new();
        for c in found {
            let key = (c.kind, c.subject.clone());
            match found_by.get(&key) {
                Some(old) if old.severity > c.severity => {}
                _ => {
                    found_by.insert(key, c);
                }
            }
        }
        let mut changes = Vec::new();
        let mut next = BTreeMap::new();
        for (key, mut entry) in std::mem::take(&mut self.active) {
            match found_by.remove(&key) {
                Some(c) if c.severity >= entry.alert.severity => {
                    if c.severity > entry.alert.severity {
                        let from = entry.alert.severity;
                        entry.alert = view(c, now);
                        changes.push(Change::Severity {
                            from,
                            alert: entry.alert.clone(),
                        });
                    } else {
                        entry.alert.message = c.message;
                    }
                    entry.calm = 0;
                    entry.calm_best = None;
                }
                calmer => {
                    entry.calm = entry.calm.saturating_add(1);
                    if let Some(c) = calmer {
                        if entry
                            .calm_best
                            .as_ref()
                            .is_none_or(|best| c.severity >= best.severity)
                        {
                            entry.calm_best = Some(c);
                        }
                    }
                    if entry.calm >= CLEAR_AFTER_SAMPLES {
                        match entry.calm_best.take() {
                            None => {
                                changes.push(Change::Cleared(entry.alert));
                                continue;
                            }
                            Some(c) => {
                                let from = entry.alert.severity;
                                entry.alert = view(c, entry.alert.since_unix_secs);
                                entry.calm = 0;
                                changes.push(Change::Severity {
                                    from,
                                    alert: entry.alert.clone(),
                                });
                            }
                        }
                    }
                }
            }
            next.insert(key, entry);
        }
        for (key, c) in found_by {
            let alert = view(c, now);
            changes.push(Change::Raised(alert.clone()));
            next.insert(
                key,
                Entry {
                    alert,
                    calm: 0,
                    calm_best: None,
                },
            );
        }
        self.active = next;
        for change in &changes {
            log(change);
        }
        changes
    }

    /// The severity of the active alert of `kind` about `subject`, if any.
    pub fn severity(&self, kind: AlertKind, subject: &str) -> Option<Severity> {
        self.active
            .get(&(kind, subject.to_owned()))
            .map(|e| e.alert.severity)
    }

    /// The active alerts, critical first, then by kind and subject.
    pub fn active(&self) -> Vec<AlertView> {
        let mut all: Vec<AlertView> = self.active.values().map(|e| e.alert.clone()).collect();
        all.sort_by(|a, b| (b.severity, a.kind, &a.subject).cmp(&(a.severity, b.kind, &b.subject)));
        all
    }
}

fn view(c: Condition, since: u64) -> AlertView {
    AlertView {
        kind: c.kind,
        severity: c.severity,
        subject: c.subject,
        message: c.message,
        since_unix_secs: since,
    }
}

fn severity_word(s: Severity) -> &'static str {
    match s {
        Severity::Warning => "warning",
        Severity::Critical => "critical",
    }
}

fn log(change: &Change) {
    match change {
        Change::Raised(a) => warn!(
            kind = ?a.kind,
            subject = %a.subject,
            severity = severity_word(a.severity),
            "alert: {}",
            a.message
        ),
        Change::Severity { from, alert } => warn!(
            kind = ?alert.kind,
            subject = %alert.subject,
            from = severity_word(*from),
            severity = severity_word(alert.severity),
            "alert now {}: {}",
            severity_word(alert.severity),
            alert.message
        ),
        Change::Cleared(a) => info!(
            kind = ?a.kind,
            subject = %a.subject,
            "alert cleared: {}",
            a.message
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cond(kind: AlertKind, severity: Severity, subject: &str) -> Condition {
        Condition::new(kind, severity, subject, format!("{subject} {severity:?}"))
    }

    #[test]
    fn changes_are_reported_once_per_state_change() {
        let mut book = Book::default();
        let a = || cond(AlertKind::DataUsage, Severity::Warning, "data");
        assert!(matches!(
            &book.update(vec![a()], 10)[..],
            [Change::Raised(_)]
        ));
        // Lasting: no change, `since` kept.
        for now in 11..100 {
            assert!(book.update(vec![a()], now).is_empty());
        }
        assert_eq!(book.active()[0].since_unix_secs, 10);
        // Worse: a change at once, since restarts; better: a change after
        // CLEAR_AFTER_SAMPLES samples, since kept.
        let crit = cond(AlertKind::DataUsage, Severity::Critical, "data");
        assert!(matches!(
            &book.update(vec![crit], 200)[..],
            [Change::Severity {
                from: Severity::Warning,
                ..
            }]
        ));
        assert_eq!(book.active()[0].since_unix_secs, 200);
        for now in 300..300 + u64::from(CLEAR_AFTER_SAMPLES) - 1 {
            assert!(book.update(vec![a()], now).is_empty());
            assert_eq!(book.active()[0].severity, Severity::Critical);
        }
        assert!(matches!(
            &book.update(vec![a()], 400)[..],
            [Change::Severity {
                from: Severity::Critical,
                ..
            }]
        ));
        assert_eq!(book.active()[0].severity, Severity::Warning);
        assert_eq!(book.active()[0].since_unix_secs, 200);
        // Gone: cleared once, after CLEAR_AFTER_SAMPLES samples.
        for now in 500..500 + u64::from(CLEAR_AFTER_SAMPLES) - 1 {
            assert!(book.update(vec![], now).is_empty());
        }
        assert!(matches!(
            &book.update(vec![], 600)[..],
            [Change::Cleared(_)]
        ));
        assert!(book.update(vec![], 601).is_empty());
        assert!(book.active().is_empty());
    }

    /// Every kind of alert, its condition found at every other sample (a
    /// condition at its edge): one raise, no clear while it flickers, one
    /// clear once it has been gone CLEAR_AFTER_SAMPLES samples.
    #[test]
    fn every_alert_flickering_at_its_edge_changes_once() {
        let pair = |lag| ReplicaPairView {
            volume: "vm".into(),
            target: "b:1".into(),
            recovery_point_secs: Some(lag),
            interval_secs: 60,
            ..Default::default()
        };
        let watch = SpaceWatch::new(vec![80, 90]);
        // A sample: the condition at its edge (`Some(true)`), just off it
        // (`Some(false)`), or well gone (`None`); and the alert's severity.
        type Sample<'a> = Box<dyn Fn(Option<bool>, Option<Severity>) -> Option<Condition> + 'a>;
        let kinds: Vec<(&str, Sample)> = vec![
            (
                "data use at 79/80 % of a threshold of 80",
                Box::new(|on, held| {
                    let used = match on {
                        Some(true) => 80,
                        Some(false) => 79,
                        None => 70,
                    };
                    space(AlertKind::DataUsage, "data", used, 100, &watch, held)
                }),
            ),
            (
                "snapshot age at its warn age",
                Box::new(|on, _| {
                    snapshot_age("vm", if on == Some(true) { 60 } else { 59 }, 60, 120)
                }),
            ),
            (
                "replication lag at its warn lag",
                Box::new(|on, _| replication_lag(&pair(if on == Some(true) { 180 } else { 179 }))),
            ),
            (
                "a policy failing every other run",
                Box::new(|on, _| {
                    (on == Some(true))
                        .then(|| cond(AlertKind::PruneFailed, Severity::Warning, "policy.1"))
                }),
            ),
        ];
        for (what, sample) in kinds {
            let mut book = Book::default();
            let mut changes = Vec::new();
            for i in 0..200u64 {
                let found = sample(Some(i % 2 == 0), book.active().first().map(|a| a.severity));
                changes.extend(book.update(found.into_iter().collect(), i));
            }
            assert_eq!(changes.len(), 1, "{what}: {changes:?}");
            assert!(matches!(changes[0], Change::Raised(_)), "{what}");
            for i in 200..200 + u64::from(CLEAR_AFTER_SAMPLES) {
                let found = sample(None, book.active().first().map(|a| a.severity));
                changes.extend(book.update(found.into_iter().collect(), i));
            }
            assert_eq!(changes.len(), 2, "{what}: {changes:?}");
            assert!(matches!(changes[1], Change::Cleared(_)), "{what}");
        }
    }

    /// Data use wandering around its thresholds (80 and 90 %) within the
    /// clear margin raises each severity once and never goes back until
    /// use falls past the margin.
    #[test]
    fn space_use_hovering_at_thresholds_changes_only_when_it_really_moves() {
        let watch = SpaceWatch::new(vec![80, 90]);
        let mut book = Book::default();
        let mut sample = |percents: &[u64], start: u64| -> Vec<Change> {
            let mut changes = Vec::new();
            for (i, &p) in percents.iter().enumerate() {
                let held = book.severity(AlertKind::DataUsage, "data");
                let found = space(AlertKind::DataUsage, "data", p, 100, &watch, held);
                changes.extend(book.update(found.into_iter().collect(), start + i as u64));
            }
            changes
        };
        let hover80: Vec<u64> = (0..60).map(|i| [79, 80, 81, 80, 78][i % 5]).collect();
        let c = sample(&hover80, 0);
        assert_eq!(c.len(), 1, "{c:?}");
        let hover90: Vec<u64> = (0..60).map(|i| [89, 90, 91, 88, 90][i % 5]).collect();
        let c = sample(&hover90, 100);
        assert_eq!(c.len(), 1, "{c:?}");
        assert!(matches!(
            c[0],
            Change::Severity {
                from: Severity::Warning,
                ..
            }
        ));
        // Under 90 by the margin, but still past 80: down to a warning once.
        let c = sample(&[85; 20], 200);
        assert_eq!(c.len(), 1, "{c:?}");
        // Under 80, within the margin: still a warning.
        assert!(sample(&[78; 20], 300).is_empty());
        // Past the margin: cleared once.
        let c = sample(&[76; 20], 400);
        assert_eq!(c.len(), 1, "{c:?}");
        assert!(matches!(c[0], Change::Cleared(_)));
    }

    /// The flapping that was found: a policy pruning beyond retention at a
    /// steady 60 % with a 50 % space threshold. It prunes every sample
    /// while past the threshold; a scheduled snapshot every third sample
    /// makes the previous one go, the prunes between destroy nothing. One
    /// alert for the whole time, cleared once the pool is back under the
    /// threshold by the margin.
    #[test]
    fn space_pruned_at_steady_use_is_one_alert() {
        let mut book = Book::default();
        let mut state = SpacePruned::default();
        let mut changes = Vec::new();
        let tick =
            |book: &mut Book, state: &mut SpacePruned, percent, destroyed: &[String], now| {
                state.pruned(destroyed);
                state.observe(percent, 100, Some(50));
                book.update(state.condition("policy.1").into_iter().collect(), now)
            };
        for now in 0..75u64 {
            let destroyed: Vec<String> = if now % 3 == 1 {
                vec![format!("pv@auto-{now}")]
            } else {
                vec![]
            };
            changes.extend(tick(&mut book, &mut state, 60, &destroyed, now));
        }
        assert_eq!(changes.len(), 1, "{changes:?}");
        assert!(matches!(changes[0], Change::Raised(_)));
        assert_eq!(state.count, 25);
        assert_eq!(state.names.len(), SPACE_PRUNED_NAMES);
        let message = &book.active()[0].message;
        assert!(
            message.contains("25 snapshots") && message.contains("pv@auto-73"),
            "{message}"
        );
        // Within the margin under the threshold: it lasts.
        for now in 75..100 {
            changes.extend(tick(&mut book, &mut state, 48, &[], now));
        }
        assert_eq!(changes.len(), 1, "{changes:?}");
        // Back under it: cleared once.
        for now in 100..120 {
            changes.extend(tick(&mut book, &mut state, 40, &[], now));
        }
        assert_eq!(changes.len(), 2, "{changes:?}");
        assert!(matches!(changes[1], Change::Cleared(_)));
    }

    #[test]
    fn critical_alerts_come_first() {
        let mut book = Book::default();
        book.update(
            vec![
                cond(AlertKind::SnapshotAge, Severity::Warning, "a"),
                cond(AlertKind::ReplicationLag, Severity::Critical, "b"),
                cond(AlertKind::DataUsage, Severity::Warning, "data"),
            ],
            1,
        );
        let order: Vec<_> = book.active().into_iter().map(|a| a.subject).collect();
        assert_eq!(order, ["b", "a", "data"]);
    }

    #[test]
    fn thresholds() {
        let watch = SpaceWatch::new(vec![80, 90]);
        assert_eq!(
            space(AlertKind::DataUsage, "data", 79, 100, &watch, None),
            None
        );
        let w = space(AlertKind::DataUsage, "data", 85, 100, &watch, None).unwrap();
        assert_eq!(w.severity, Severity::Warning);
        let c = space(AlertKind::DataUsage, "data", 95, 100, &watch, None).unwrap();
        assert_eq!(c.severity, Severity::Critical);
        // Held: each threshold holds within the margin, only the held ones.
        let held = |p, s| space(AlertKind::DataUsage, "data", p, 100, &watch, s);
        assert_eq!(
            held(88, Some(Severity::Critical)).unwrap().severity,
            Severity::Critical
        );
        assert_eq!(
            held(88, Some(Severity::Warning)).unwrap().severity,
            Severity::Warning
        );
        assert_eq!(
            held(78, Some(Severity::Warning)).unwrap().severity,
            Severity::Warning
        );
        assert_eq!(held(76, Some(Severity::Warning)), None);
        assert_eq!(held(78, None), None);
        // One threshold: a warning only.
        let one = SpaceWatch::new(vec![80]);
        let one = space(AlertKind::DataUsage, "data", 99, 100, &one, None).unwrap();
        assert_eq!(one.severity, Severity::Warning);
        assert_eq!(snapshot_age("v", 59, 60, 120), None);
        assert_eq!(
            snapshot_age("v", 60, 60, 120).unwrap().severity,
            Severity::Warning
        );
        assert_eq!(
            snapshot_age("v", 120, 60, 120).unwrap().severity,
            Severity::Critical
        );
        assert_eq!(human_secs(3 * 3600 + 5 * 60), "3h 5m");
        assert_eq!(human_secs(2 * 86_400 + 4 * 3600 + 7), "2d 4h");
    }
}
