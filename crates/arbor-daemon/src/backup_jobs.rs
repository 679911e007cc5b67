//! Backup operations under way and what they have done: each backup,
//! restore, verify and prune the daemon runs is a job while it runs (its
//! progress read by `GET /v1/backup-jobs`, the CLI's progress bars and the
//! dashboard), and counted when it ends (metrics).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use arbor_api::model::BackupJobView;
use arbor_backup::Progress;

/// What a job does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum JobKind {
    Backup,
    Restore,
    Verify,
    Prune,
}

impl JobKind {
    pub fn name(self) -> &'static str {
        match self {
            JobKind::Backup => "backup",
            JobKind::Restore => "restore",
            JobKind::Verify => "verify",
            JobKind::Prune => "prune",
        }
    }
}

struct Job {
    kind: JobKind,
    repository: String,
    /// The snapshot backed up, the volume restored into.
    subject: String,
    started_unix: u64,
    started: Instant,
    progress: Arc<Progress>,
}

/// Per repository and kind of job: how many ended well and not, and the
/// bytes they moved to or from the store.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    pub succeeded: u64,
    pub failed: u64,
    pub store_bytes: u64,
}

/// The jobs under way and the totals of those ended.
#[derive(Default)]
pub struct Jobs {
    next: AtomicU64,
    running: Mutex<BTreeMap<u64, Job>>,
    totals: Mutex<BTreeMap<(String, JobKind), Totals>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every change under these locks is whole (an insert or a removal).
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A job under way: ended by [`Running::end`], or counted as failed when
/// dropped (a request cancelled).
pub struct Running<'a> {
    jobs: &'a Jobs,
    id: u64,
    ended: bool,
    pub progress: Arc<Progress>,
}

impl Running<'_> {
    /// Ends the job, counting it as it went.
    pub fn end(mut self, ok: bool) {
        self.ended = true;
        self.jobs.end(self.id, ok);
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        if !self.ended {
            self.jobs.end(self.id, false);
        }
    }
}

impl Jobs {
    /// A job starting now.
    pub fn start(&self, kind: JobKind, repository: &str, subject: &str) -> Running<'_> {
        self.start_with(kind, repository, subject, Arc::default())
    }

    /// A job starting now whose progress began to count before.
    pub fn start_with(
        &self,
        kind: JobKind,
        repository: &str,
        subject: &str,
        progress: Arc<Progress>,
    ) -> Running<'_> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        lock(&self.running).insert(
            id,
            Job {
                kind,
                repository: repository.to_owned(),
                subject: subject.to_owned(),
                started_unix: crate::clock::unix_now(),
                started: Instant::now(),
                progress: Arc::clone(&progress),
            },
        );
        Running {
            jobs: self,
            id,
            ended: false,
            progress,
        }
    }

    fn end(&self, id: u64, ok: bool) {
        let Some(job) = lock(&self.running).remove(&id) else {
            return;
        };
        let mut totals = lock(&self.totals);
        let t = totals.entry((job.repository, job.kind)).or_default();
        if ok {
            t.succeeded += 1;
        } else {
            t.failed += 1;
        }
        t.store_bytes = t
            .store_bytes
            .saturating_add(job.progress.store_bytes.load(Ordering::Relaxed));
    }

    /// The jobs under way, oldest first.
    pub fn views(&self) -> Vec<BackupJobView> {
        lock(&self.running)
            .iter()
            .map(|(&id, job)| {
                let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
                let p = &job.progress;
                let (total, done) = (load(&p.total_bytes), load(&p.done_bytes));
                let secs = job.started.elapsed().as_secs_f64();
                let rate = if secs > 0.0 {
                    (done as f64 / secs) as u64
                } else {
                    0
                };
                BackupJobView {
                    id,
                    kind: job.kind.name().to_owned(),
                    repository: job.repository.clone(),
                    subject: job.subject.clone(),
                    started_unix: job.started_unix,
                    total_bytes: total,
                    done_bytes: done,
                    store_bytes: load(&p.store_bytes),
                    objects: load(&p.objects),
                    rate_bytes_per_sec: rate,
                    eta_secs: (rate > 0 && total >= done).then(|| (total - done) / rate),
                }
            })
            .collect()
    }

    /// The totals of the jobs ended, by repository and kind.
    pub fn totals(&self) -> BTreeMap<(String, JobKind), Totals> {
        lock(&self.totals).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_is_listed_while_it_runs_and_counted_when_it_ends() {
        let jobs = Jobs::default();
        let running = jobs.start(JobKind::Backup, "r", "vm1@a");
        running.progress.total_bytes.store(100, Ordering::Relaxed);
        running.progress.done_bytes.store(40, Ordering::Relaxed);
        running.progress.store_bytes.store(7, Ordering::Relaxed);
        let views = jobs.views();
        assert_eq!(views.len(), 1);
        assert_eq!(
            (views[0].kind.as_str(), views[0].subject.as_str()),
            ("backup", "vm1@a")
        );
        assert_eq!((views[0].total_bytes, views[0].done_bytes), (100, 40));
        running.end(true);
        // Dropped without an end (a cancelled request): a failure.
        drop(jobs.start(JobKind::Backup, "r", "vm1@b"));
        assert!(jobs.views().is_empty());
        assert_eq!(
            jobs.totals()[&("r".to_owned(), JobKind::Backup)],
            Totals {
                succeeded: 1,
                failed: 1,
                store_bytes: 7
            }
        );
    }
}
