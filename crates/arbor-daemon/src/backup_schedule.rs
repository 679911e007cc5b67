//! Scheduled backups (docs/BACKUP.md, "Scheduled backups"): a
//! repository in `backup_repositories` with a `schedule` backs up its
//! `volumes` when the schedule says, each from a snapshot of its own
//! (`VOLUME@backup-<time>`), and prunes by its `keep` at most once a day.
//! After a backup the volume's older backup snapshots, no longer the base
//! of any repository's next backup (no hold), are destroyed.
//!
//! When is the monitor's (`arbor_monitor::Schedule`, pure); this module is
//! the daemon's side: the state of each run, kept in memory and started
//! from the repository's own list (a restarted daemon knows when each
//! volume was last backed up), the failures and their backoff, and the
//! alerts: a failed run, and a volume whose newest backup is overdue.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use arbor_api::model::{AlertKind, BackupScheduleView, ScheduledVolumeView, Severity};
use arbor_monitor::{Retention, Schedule};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::alerts::{Condition, CRITICAL_FAILURES};
use crate::backups::Backups;

/// The prefix of the snapshots scheduled backups take.
pub const SNAPSHOT_PREFIX: &str = "backup";
/// The property (of the snapshot) that marks one as a scheduled backup's:
/// the repository's name.
const SCHEDULED_MARK: &str = "arbor.backup.scheduled";
/// How often the schedules are looked at.
const TICK: Duration = Duration::from_secs(5);
/// Least time between two scheduled prunes of a repository.
pub const PRUNE_EVERY_SECS: u64 = 24 * 3600;
/// A failed run is tried again after a minute, doubling with each failure
/// in a row up to an hour (and never later than the schedule's next run).
const RETRY_FIRST_SECS: u64 = 60;
const RETRY_MAX_SECS: u64 = 3600;
/// A volume's newest backup is overdue (warning) at this many schedule
/// periods, critical at the second (as snapshot ages are).
const OVERDUE_WARN_PERIODS: u64 = 2;
const OVERDUE_CRIT_PERIODS: u64 = 4;

/// A repository's schedule, as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupPolicy {
    pub repository: String,
    pub volumes: Vec<String>,
    pub schedule: Schedule,
    /// Which backups a scheduled prune keeps; none: no scheduled prune.
    pub keep: Option<Retention>,
}

/// A volume's newest backup from this host in a repository: when it
/// completed (Unix seconds), and its id.
#[derive(Debug, Clone, PartialEq, Eq)]
struct LastBackup {
    at: u64,
    id: String,
}

/// How one volume's scheduled backups fail.
#[derive(Debug, Clone, Default)]
struct VolumeRun {
    /// Failed runs in a row, the last one's error and when it was.
    failures: u32,
    last_error: Option<String>,
    last_attempt: Option<u64>,
}

/// How a repository's schedule goes.
#[derive(Debug, Clone, Default)]
struct RepoRun {
    /// Its list was read (when each volume was last backed up).
    seeded: bool,
    /// When it was first seen scheduled: the age of a volume never backed
    /// up counts from here.
    since: u64,
    last_prune: Option<u64>,
    /// Failed prunes (or list reads) in a row, and the last error.
    failures: u32,
    last_error: Option<String>,
    last_attempt: Option<u64>,
}

/// The schedules in force and how their runs go.
#[derive(Default)]
pub struct Schedules {
    policies: Mutex<Vec<BackupPolicy>>,
    repos: Mutex<BTreeMap<String, RepoRun>>,
    volumes: Mutex<BTreeMap<(String, String), VolumeRun>>,
    /// Each volume's newest backup by (repository, volume): every one this
    /// daemon made, scheduled or not, and for scheduled volumes the
    /// repository's newest from this host, read at the first look.
    last: Mutex<BTreeMap<(String, String), LastBackup>>,
    /// Only one tick runs at a time.
    ticking: tokio::sync::Mutex<()>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every change under these locks is whole (an insert or a field set).
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// When a run that failed `failures` times in a row, last at `last`, may
/// be tried again.
fn retry_at(failures: u32, last: Option<u64>) -> u64 {
    if failures == 0 {
        return 0;
    }
    let wait = RETRY_FIRST_SECS
        .saturating_mul(1u64 << failures.saturating_sub(1).min(6))
        .min(RETRY_MAX_SECS);
    last.unwrap_or(0).saturating_add(wait)
}

impl Schedules {
    pub fn new(policies: Vec<BackupPolicy>) -> Self {
        let s = Schedules::default();
        s.set(policies);
        s
    }

    /// A reload's schedules, in force from the next tick. The state of the
    /// volumes that stay scheduled is kept.
    pub fn set(&self, policies: Vec<BackupPolicy>) {
        *lock(&self.policies) = policies;
    }

    fn policies(&self) -> Vec<BackupPolicy> {
        lock(&self.policies).clone()
    }

    fn volume(&self, repo: &str, volume: &str) -> VolumeRun {
        lock(&self.volumes)
            .get(&(repo.to_owned(), volume.to_owned()))
            .cloned()
            .unwrap_or_default()
    }

    fn update_volume(&self, repo: &str, volume: &str, f: impl FnOnce(&mut VolumeRun)) {
        f(lock(&self.volumes)
            .entry((repo.to_owned(), volume.to_owned()))
            .or_default());
    }

    fn repo(&self, repo: &str, now: u64) -> RepoRun {
        lock(&self.repos)
            .entry(repo.to_owned())
            .or_insert_with(|| RepoRun {
                since: now,
                ..RepoRun::default()
            })
            .clone()
    }

    fn update_repo(&self, repo: &str, f: impl FnOnce(&mut RepoRun)) {
        f(lock(&self.repos).entry(repo.to_owned()).or_default());
    }

    /// Records a backup `id` of `volume` into `repository`, completed at
    /// `at` (the newest is kept).
    pub fn backed_up(&self, repository: &str, volume: &str, at: u64, id: String) {
        let mut last = lock(&self.last);
        let key = (repository.to_owned(), volume.to_owned());
        if last.get(&key).is_none_or(|l| l.at <= at) {
            last.insert(key, LastBackup { at, id });
        }
    }

    fn last(&self, repository: &str, volume: &str) -> Option<LastBackup> {
        lock(&self.last)
            .get(&(repository.to_owned(), volume.to_owned()))
            .cloned()
    }

    /// When each volume's newest backup known here completed.
    pub fn last_backups(&self) -> Vec<((String, String), u64)> {
        lock(&self.last)
            .iter()
            .map(|(k, l)| (k.clone(), l.at))
            .collect()
    }

    /// The alerts: failed runs (a warning, critical from
    /// [`CRITICAL_FAILURES`] in a row) and overdue volumes.
    pub fn conditions(&self, now: u64) -> Vec<Condition> {
        let mut out = Vec::new();
        for policy in self.policies() {
            let repo = self.repo(&policy.repository, now);
            let severity = |failures: u32| {
                if failures >= CRITICAL_FAILURES {
                    Severity::Critical
                } else {
                    Severity::Warning
                }
            };
            if repo.failures > 0 {
                out.push(Condition::new(
                    AlertKind::BackupFailed,
                    severity(repo.failures),
                    &policy.repository,
                    format!(
                        "{} ({} in a row)",
                        repo.last_error.as_deref().unwrap_or("failed"),
                        repo.failures
                    ),
                ));
            }
            let period = policy.schedule.period_secs();
            for volume in &policy.volumes {
                let run = self.volume(&policy.repository, volume);
                let last_success = self.last(&policy.repository, volume).map(|l| l.at);
                let subject = format!("{}:{volume}", policy.repository);
                if run.failures > 0 {
                    out.push(Condition::new(
                        AlertKind::BackupFailed,
                        severity(run.failures),
                        &subject,
                        format!(
                            "the scheduled backup of {volume} to {} failed: {} ({} in a row)",
                            policy.repository,
                            run.last_error.as_deref().unwrap_or("failed"),
                            run.failures
                        ),
                    ));
                }
                let age = now.saturating_sub(last_success.unwrap_or(repo.since));
                let (warn, crit) = (
                    period.saturating_mul(OVERDUE_WARN_PERIODS),
                    period.saturating_mul(OVERDUE_CRIT_PERIODS),
                );
                if age >= warn {
                    out.push(Condition::new(
                        AlertKind::BackupOverdue,
                        if age >= crit {
                            Severity::Critical
                        } else {
                            Severity::Warning
                        },
                        &subject,
                        match last_success {
                            Some(_) => format!(
                                "the newest backup of {volume} to {} is {} old (scheduled {})",
                                policy.repository,
                                crate::alerts::human_secs(age),
                                policy.schedule
                            ),
                            None => format!(
                                "{volume} has no backup in {} after {} (scheduled {})",
                                policy.repository,
                                crate::alerts::human_secs(age),
                                policy.schedule
                            ),
                        },
                    ));
                }
            }
        }
        out
    }

    /// The schedule of `repository`, with how each volume's runs go.
    pub fn view(&self, repository: &str, now: u64) -> Option<BackupScheduleView> {
        let policy = self
            .policies()
            .into_iter()
            .find(|p| p.repository == repository)?;
        let repo = self.repo(repository, now);
        Some(BackupScheduleView {
            schedule: policy.schedule.to_string(),
            keep: policy.keep.as_ref().map(ToString::to_string),
            last_prune_unix: repo.last_prune,
            error: repo.last_error.filter(|_| repo.failures > 0),
            volumes: policy
                .volumes
                .iter()
                .map(|v| {
                    let run = self.volume(repository, v);
                    let last = self.last(repository, v);
                    let last_success = last.as_ref().map(|l| l.at);
                    ScheduledVolumeView {
                        volume: v.clone(),
                        last_success_unix: last_success,
                        last_backup: last.map(|l| l.id),
                        failures: run.failures,
                        last_error: run.last_error,
                        next_run_unix: policy
                            .schedule
                            .next_run(last_success, now)
                            .max(retry_at(run.failures, run.last_attempt)),
                    }
                })
                .collect(),
        })
    }
}

impl Backups {
    /// Runs the schedules until `stop`: a look every few seconds.
    pub async fn run_schedules(self: Arc<Self>, stop: CancellationToken) -> anyhow::Result<()> {
        let mut ticks = crate::clock::ticker(TICK);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return Ok(()),
                _ = ticks.tick() => {}
            }
            tokio::select! {
                _ = stop.cancelled() => return Ok(()),
                _ = self.schedule_tick(crate::clock::unix_now()) => {}
            }
        }
    }

    /// One look at the schedules at `now`: every due backup, one after
    /// another, then a due prune.
    pub async fn schedule_tick(&self, now: u64) {
        let schedules = self.schedules();
        let _one = schedules.ticking.lock().await;
        for policy in schedules.policies() {
            let repo = schedules.repo(&policy.repository, now);
            if !repo.seeded {
                if now < retry_at(repo.failures, repo.last_attempt) {
                    continue;
                }
                if let Err(e) = self.seed(&policy).await {
                    schedules.update_repo(&policy.repository, |r| {
                        r.failures += 1;
                        r.last_error = Some(format!("reading its backups: {e}"));
                        r.last_attempt = Some(now);
                    });
                    continue;
                }
            }
            for volume in &policy.volumes {
                let run = schedules.volume(&policy.repository, volume);
                let last_success = schedules.last(&policy.repository, volume).map(|l| l.at);
                if !policy.schedule.due(last_success, now)
                    || now < retry_at(run.failures, run.last_attempt)
                {
                    continue;
                }
                match self.scheduled_backup(&policy.repository, volume, now).await {
                    Ok(id) => {
                        info!(repository = %policy.repository, volume = %volume, backup = %id, "scheduled backup");
                        schedules.update_volume(&policy.repository, volume, |r| {
                            r.failures = 0;
                            r.last_error = None;
                            r.last_attempt = Some(now);
                        });
                    }
                    Err(message) => {
                        warn!(repository = %policy.repository, volume = %volume, error = %message, "scheduled backup failed");
                        schedules.update_volume(&policy.repository, volume, |r| {
                            r.failures += 1;
                            r.last_error = Some(message);
                            r.last_attempt = Some(now);
                        });
                    }
                }
            }
            let repo = schedules.repo(&policy.repository, now);
            let prune_due = repo
                .last_prune
                .is_none_or(|t| now.saturating_sub(t) >= PRUNE_EVERY_SECS)
                && now >= retry_at(repo.failures, repo.last_attempt);
            let Some(keep) = policy.keep.as_ref().filter(|_| prune_due) else {
                continue;
            };
            match self
                .prune_by(&policy.repository, Some(keep), false, 25, now)
                .await
            {
                Ok(p) => {
                    info!(repository = %policy.repository, forgotten = p.forgotten.len(), deleted_packs = p.deleted_packs.len(), "scheduled prune");
                    schedules.update_repo(&policy.repository, |r| {
                        r.last_prune = Some(now);
                        r.failures = 0;
                        r.last_error = None;
                        r.last_attempt = Some(now);
                    });
                }
                Err(e) => {
                    let message = format!("its scheduled prune: {}", e.message());
                    warn!(repository = %policy.repository, error = %message, "scheduled prune failed");
                    schedules.update_repo(&policy.repository, |r| {
                        r.failures += 1;
                        r.last_error = Some(message);
                        r.last_attempt = Some(now);
                    });
                }
            }
        }
    }

    /// When each scheduled volume was last backed up from this host, from
    /// the repository's list.
    async fn seed(&self, policy: &BackupPolicy) -> Result<(), String> {
        let listed = self
            .list_backups(&policy.repository)
            .await
            .map_err(|e| e.message())?;
        let schedules = self.schedules();
        for volume in &policy.volumes {
            let newest = listed
                .iter()
                .filter(|l| l.manifest.host == self.host() && &l.manifest.volume == volume)
                .max_by_key(|l| l.manifest.completed_unix_ms);
            if let Some(l) = newest {
                schedules.backed_up(
                    &policy.repository,
                    volume,
                    l.manifest.completed_unix_ms / 1000,
                    l.id.to_string(),
                );
            }
        }
        schedules.update_repo(&policy.repository, |r| {
            r.seeded = true;
            r.failures = 0;
            r.last_error = None;
        });
        Ok(())
    }

    /// Takes `volume@backup-<now>`, backs it up, and destroys the
    /// volume's older backup snapshots that no repository holds. A failed
    /// backup's snapshot is destroyed too. Returns the backup's id.
    async fn scheduled_backup(
        &self,
        repository: &str,
        volume: &str,
        now: u64,
    ) -> Result<String, String> {
        let pool = Arc::clone(self.pool());
        let name = {
            let (pool, volume, repository) =
                (Arc::clone(&pool), volume.to_owned(), repository.to_owned());
            tokio::task::spawn_blocking(move || -> Result<String, String> {
                let id = pool.lookup(&volume).map_err(|e| format!("{volume}: {e}"))?;
                let listing =
                    arbor_monitor::engine::Listing::of(&pool).map_err(|e| e.to_string())?;
                let snapshot = arbor_monitor::names::unique(SNAPSHOT_PREFIX, now, |n| {
                    listing
                        .snapshots_of(id.0)
                        .iter()
                        .any(|s| s.name == format!("{volume}@{n}"))
                })
                .ok_or_else(|| format!("no free snapshot name for {volume} at {now}"))?;
                let name = format!("{volume}@{snapshot}");
                let taken = pool
                    .snapshot(&name)
                    .map_err(|e| format!("snapshot {name}: {e}"))?;
                // Marked as the schedule's: only marked snapshots are ever
                // destroyed by it (a user's snapshot named alike is not).
                // (A pool of a format before properties marks none.)
                if pool.format_version().has_properties() {
                    if let Err(e) = pool.set_property(Some(taken), SCHEDULED_MARK, repository.as_bytes()) {
                        warn!(snapshot = %name, error = %e, "could not mark a scheduled backup's snapshot: it will not be destroyed by the schedule");
                    }
                }
                Ok(name)
            })
            .await
            .map_err(|e| format!("a pool task: {e}"))??
        };
        let made = self.backup_snapshot(repository, &name).await;
        let keep = made.as_ref().ok().map(|_| name.clone());
        self.destroy_backup_snapshots(volume, keep.as_deref()).await;
        made.map(|m| m.id.to_string()).map_err(|e| e.message())
    }

    /// Destroys `volume`'s backup snapshots (named by [`SNAPSHOT_PREFIX`])
    /// that carry no hold, but `keep`.
    async fn destroy_backup_snapshots(&self, volume: &str, keep: Option<&str>) {
        let pool = Arc::clone(self.pool());
        let volume_name = volume.to_owned();
        let found = tokio::task::spawn_blocking(move || -> Vec<String> {
            let Ok(id) = pool.lookup(&volume_name) else {
                return Vec::new();
            };
            let Ok(listing) = arbor_monitor::engine::Listing::of(&pool) else {
                return Vec::new();
            };
            listing
                .snapshots_of(id.0)
                .iter()
                .filter(|s| {
                    s.name
                        .split_once('@')
                        .and_then(|(_, n)| arbor_monitor::names::parse(SNAPSHOT_PREFIX, n))
                        .is_some()
                })
                .filter(|s| pool.holds(s.id).is_ok_and(|h| h.is_empty()))
                // A pool of a format before properties marks none: there
                // the name says.
                .filter(|s| {
                    !pool.format_version().has_properties()
                        || pool
                            .property(Some(s.id), SCHEDULED_MARK)
                            .is_ok_and(|m| m.is_some())
                })
                .map(|s| s.name.clone())
                .collect()
        })
        .await
        .unwrap_or_default();
        for name in found.into_iter().filter(|n| Some(n.as_str()) != keep) {
            let destroyer = self.destroyer().clone();
            let which = name.clone();
            match tokio::task::spawn_blocking(move || destroyer.destroy(&which, false)).await {
                Ok(Ok(())) => {
                    info!(snapshot = %name, "destroyed a backup snapshot no backup needs")
                }
                Ok(Err(e)) => {
                    warn!(snapshot = %name, error = e.chain(), "could not destroy a backup snapshot; it stays")
                }
                Err(e) => {
                    warn!(snapshot = %name, error = %e, "could not destroy a backup snapshot")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(found: &[Condition]) -> Vec<(AlertKind, Severity, String)> {
        found
            .iter()
            .map(|c| (c.kind, c.severity, c.subject.clone()))
            .collect()
    }

    #[test]
    fn failed_and_overdue_backups_are_alerts_by_the_schedules_period() {
        let s = Schedules::new(vec![BackupPolicy {
            repository: "r".into(),
            volumes: vec!["v".into()],
            schedule: "every 1h".parse().unwrap(),
            keep: None,
        }]);
        let t0 = 1_000_000;
        assert!(s.conditions(t0).is_empty());
        // Never backed up: its age counts from when the schedule was seen.
        let late = s.conditions(t0 + 2 * 3600);
        assert_eq!(
            kinds(&late),
            vec![(AlertKind::BackupOverdue, Severity::Warning, "r:v".into())]
        );
        assert!(late[0].message.contains("has no backup"), "{late:?}");
        s.backed_up("r", "v", t0 + 2 * 3600, "b1".into());
        assert!(s.conditions(t0 + 3 * 3600).is_empty());
        assert_eq!(
            kinds(&s.conditions(t0 + 6 * 3600)),
            vec![(AlertKind::BackupOverdue, Severity::Critical, "r:v".into())]
        );
        // Failures: a warning, critical from the third in a row; a prune's
        // failure is the repository's.
        s.update_volume("r", "v", |r| {
            r.failures = 1;
            r.last_error = Some("no space".into());
        });
        s.update_repo("r", |r| r.failures = CRITICAL_FAILURES);
        let found = s.conditions(t0 + 3 * 3600);
        assert_eq!(
            kinds(&found),
            vec![
                (AlertKind::BackupFailed, Severity::Critical, "r".into()),
                (AlertKind::BackupFailed, Severity::Warning, "r:v".into()),
            ]
        );
        // A reload without the schedule: no alert of it.
        s.set(Vec::new());
        assert!(s.conditions(t0 + 100 * 3600).is_empty());
    }

    #[test]
    fn retries_back_off_from_a_minute_to_an_hour() {
        assert_eq!(retry_at(0, Some(100)), 0);
        assert_eq!(retry_at(1, Some(100)), 160);
        assert_eq!(retry_at(2, Some(100)), 220);
        assert_eq!(retry_at(7, Some(0)), 3600);
        assert_eq!(retry_at(40, Some(0)), 3600);
    }
}
