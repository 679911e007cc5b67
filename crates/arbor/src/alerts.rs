//! Alerts (docs/MONITOR.md §4): conditions the monitor finds each tick,
//! kept as a set whose changes — raised, more or less severe, cleared —
//! are what gets logged, so a condition that lasts is logged once, not
//! every second.

use std::collections::BTreeMap;

use tracing::{info, warn};

use crate::model::{AlertKind, AlertView, ReplicaPairView, Severity};
use crate::space::SpaceWatch;

/// Replication lag thresholds, in pair intervals, and their floors: a pair
/// a few cycles behind warns, ten behind is critical.
const LAG_WARN_INTERVALS: u64 = 3;
const LAG_WARN_MIN_SECS: u64 = 60;
const LAG_CRIT_INTERVALS: u64 = 10;
const LAG_CRIT_MIN_SECS: u64 = 600;
/// Failed runs in a row at which a policy's failure alert turns critical.
pub const CRITICAL_FAILURES: u32 = 3;

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
/// or more.
pub fn space(
    kind: AlertKind,
    name: &str,
    used: u64,
    total: u64,
    watch: &SpaceWatch,
) -> Option<Condition> {
    let c = watch.crossing(used, total)?;
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

/// The active alerts.
#[derive(Debug, Default)]
pub struct Book {
    active: BTreeMap<(AlertKind, String), AlertView>,
}

impl Book {
    /// Makes `found` the active set at `now`: an alert keeps its `since`
    /// while it stays at its severity or goes down, and a new one or one
    /// that got worse starts now. Returns the changes, each also logged.
    pub fn update(&mut self, found: Vec<Condition>, now: u64) -> Vec<Change> {
        let mut next = BTreeMap::new();
        let mut changes = Vec::new();
        for c in found {
            let key = (c.kind, c.subject.clone());
            let since = match self.active.get(&key) {
                Some(old) if old.severity >= c.severity => old.since_unix_secs,
                _ => now,
            };
            let alert = AlertView {
                kind: c.kind,
                severity: c.severity,
                subject: c.subject,
                message: c.message,
                since_unix_secs: since,
            };
            match self.active.get(&key) {
                None => changes.push(Change::Raised(alert.clone())),
                Some(old) if old.severity != alert.severity => changes.push(Change::Severity {
                    from: old.severity,
                    alert: alert.clone(),
                }),
                Some(_) => {}
            }
            next.insert(key, alert);
        }
        for (key, old) in std::mem::take(&mut self.active) {
            if !next.contains_key(&key) {
                changes.push(Change::Cleared(old));
            }
        }
        self.active = next;
        for change in &changes {
            log(change);
        }
        changes
    }

    /// The active alerts, critical first, then by kind and subject.
    pub fn active(&self) -> Vec<AlertView> {
        let mut all: Vec<AlertView> = self.active.values().cloned().collect();
        all.sort_by(|a, b| (b.severity, a.kind, &a.subject).cmp(&(a.severity, b.kind, &b.subject)));
        all
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
        // Worse: a change, since restarts; better: a change, since kept.
        let crit = cond(AlertKind::DataUsage, Severity::Critical, "data");
        assert!(matches!(
            &book.update(vec![crit], 200)[..],
            [Change::Severity {
                from: Severity::Warning,
                ..
            }]
        ));
        assert_eq!(book.active()[0].since_unix_secs, 200);
        assert_eq!(book.update(vec![a()], 300).len(), 1);
        assert_eq!(book.active()[0].since_unix_secs, 200);
        // Gone: cleared once.
        assert!(matches!(
            &book.update(vec![], 400)[..],
            [Change::Cleared(_)]
        ));
        assert!(book.update(vec![], 401).is_empty());
        assert!(book.active().is_empty());
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
        assert_eq!(space(AlertKind::DataUsage, "data", 79, 100, &watch), None);
        let w = space(AlertKind::DataUsage, "data", 85, 100, &watch).unwrap();
        assert_eq!(w.severity, Severity::Warning);
        let c = space(AlertKind::DataUsage, "data", 95, 100, &watch).unwrap();
        assert_eq!(c.severity, Severity::Critical);
        // One threshold: a warning only.
        let one = SpaceWatch::new(vec![80]);
        let one = space(AlertKind::DataUsage, "data", 99, 100, &one).unwrap();
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
