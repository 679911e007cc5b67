//! `/v1/backups`: backups of this pool's snapshots into the configured
//! repositories (`backup_repositories`, docs/BACKUP.md), and restores from
//! them into new volumes. The repository code is `arbor-backup`; this is
//! its glue: which repositories exist (replaced by a reload), this host's
//! name in backups, the snapshot pinned while it is read, and the views.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use arbor_api::model::{
    BackupJobView, BackupListView, BackupPruneRequest, BackupPruneView, BackupRepositoryView,
    BackupRequest, BackupView, PrunedBackupView, RestoreRequest, RestoreView, VerifyRequest,
    VerifyView,
};
use arbor_backup::format::ObjectId;
use arbor_backup::spec::RepoSpec;
use arbor_backup::{BackupError, Listing, LiveRestore, Made, Progress, PruneOptions, Repository};
use arbor_engine::{Pool, VolumeId};
use arbor_stream::busy::Pins;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use tracing::{info, warn};

use crate::api_error::{ApiError, ApiResult};
use crate::backup_jobs::{JobKind, Jobs};
use crate::backup_schedule::{BackupPolicy, Schedules};
use crate::destroy::Destroyer;
use crate::error::DaemonError;
use crate::restores::{LiveRestores, Slot};

/// The configured repositories and what backups need of the daemon.
pub struct Backups {
    repositories: RwLock<BTreeMap<String, RepoSpec>>,
    /// This host's name in the backups it makes.
    host: String,
    pool: Arc<Pool>,
    /// Snapshots being read (destroying one needs force meanwhile).
    pins: Arc<Pins>,
    /// Scheduled backups (`backup_schedule.rs`).
    schedules: Schedules,
    /// Destroys the backup snapshots no backup needs any more.
    destroyer: Destroyer,
    /// Operations under way and the totals of those ended.
    jobs: Jobs,
    /// Changes of the pool's list of restores under way, one at a time.
    restoring: tokio::sync::Mutex<()>,
    /// The volumes that serve while their restores fill them.
    restores: Arc<LiveRestores>,
}

/// The pool property listing the restores under way (JSON: their volumes
/// and when each began): a restore cut off by the daemon's end leaves its
/// volume half written, and the next start deletes it, or, for an instant
/// restore (whose volume clients have used), takes it up again.
const RESTORING: &str = "arbor.backup.restoring";

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct RestoreUnderWay {
    volume: String,
    started_unix: u64,
    /// An instant restore's repository and backup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    instant: Option<InstantOf>,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct InstantOf {
    repository: String,
    backup: String,
}

/// The longest wait between attempts to take up a restore after a restart.
const MAX_RESUME_WAIT: std::time::Duration = std::time::Duration::from_secs(300);

impl Backups {
    pub fn new(
        repositories: &[(String, RepoSpec)],
        schedules: Vec<BackupPolicy>,
        host: String,
        pool: Arc<Pool>,
        pins: Arc<Pins>,
        destroyer: Destroyer,
        restores: Arc<LiveRestores>,
    ) -> Arc<Self> {
        Arc::new(Backups {
            repositories: RwLock::new(repositories.iter().cloned().collect()),
            host,
            pool,
            pins,
            schedules: Schedules::new(schedules),
            destroyer,
            jobs: Jobs::default(),
            restoring: tokio::sync::Mutex::new(()),
            restores,
        })
    }

    /// A reload's repositories and schedules, in force for the next
    /// operation.
    pub fn set(&self, repositories: &[(String, RepoSpec)], schedules: Vec<BackupPolicy>) {
        *self.repositories.write().unwrap_or_else(|p| p.into_inner()) =
            repositories.iter().cloned().collect();
        self.schedules.set(schedules);
    }

    pub(crate) fn schedules(&self) -> &Schedules {
        &self.schedules
    }

    pub(crate) fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    pub(crate) fn host(&self) -> &str {
        &self.host
    }

    pub(crate) fn destroyer(&self) -> &Destroyer {
        &self.destroyer
    }

    /// The alerts of the scheduled backups.
    pub fn conditions(&self, now: u64) -> Vec<crate::alerts::Condition> {
        let mut conditions = self.schedules.conditions(now);
        conditions.extend(self.restores.conditions(&self.pool));
        conditions
    }

    /// The restores under way, as the pool lists them.
    fn restores_under_way(pool: &Pool) -> Vec<RestoreUnderWay> {
        match pool.property(None, RESTORING) {
            Ok(Some(bytes)) => serde_json::from_slice(&bytes).unwrap_or_else(|e| {
                warn!(error = %e, "the list of restores under way does not parse: ignored");
                Vec::new()
            }),
            _ => Vec::new(),
        }
    }

    /// Adds (`Some`) or removes a restore in the pool's list, durably.
    async fn mark_restore(
        &self,
        volume: &str,
        entry: Option<RestoreUnderWay>,
    ) -> Result<(), ApiError> {
        let _one = self.restoring.lock().await;
        let pool = Arc::clone(&self.pool);
        let volume = volume.to_owned();
        tokio::task::spawn_blocking(move || -> Result<(), DaemonError> {
            // A pool of a format before properties (version 4) keeps no
            // list: a cut-off restore's volume stays there.
            if !pool.format_version().has_properties() {
                return Ok(());
            }
            let mut list = Self::restores_under_way(&pool);
            list.retain(|r| r.volume != volume);
            list.extend(entry);
            if list.is_empty() {
                pool.remove_property(None, RESTORING)?;
            } else {
                let json = serde_json::to_vec(&list).map_err(DaemonError::internal)?;
                pool.set_property(None, RESTORING, &json)?;
            }
            Ok(())
        })
        .await
        .map_err(|e| ApiError::from(DaemonError::internal(e)))?
        .map_err(ApiError::from)
    }

    /// At start, before anything is served: deletes the volumes of
    /// restores a previous run of the daemon left half done (each only if
    /// it was made after its restore began: never a volume that was there
    /// before), and takes up the instant ones, whose volumes clients have
    /// used: listed at once (their requests wait for the restore), run
    /// once their repositories answer.
    pub fn recover_restores(self: &Arc<Self>) -> Result<(), DaemonError> {
        let list = Self::restores_under_way(&self.pool);
        let mut kept = Vec::new();
        for r in &list {
            let Ok(id) = self.pool.lookup(&r.volume) else {
                continue;
            };
            let info = self.pool.info(id)?;
            if info.snapshot || info.created_unix_secs < r.started_unix {
                warn!(volume = %r.volume, "a restore was cut off before it made its volume; the volume of that name is older and stays");
                continue;
            }
            let Some(of) = &r.instant else {
                warn!(volume = %r.volume, "a restore was cut off (the daemon stopped): its half-written volume is deleted");
                self.destroyer.destroy(&r.volume, true)?;
                continue;
            };
            info!(volume = %r.volume, repository = %of.repository, backup = %of.backup, "an instant restore was cut off (the daemon stopped): it is taken up again");
            self.pool.set_incomplete(
                id,
                Some(format!("being restored from backup {}", of.backup)),
            );
            let slot = Slot::new(
                &of.repository,
                &of.backup,
                info.size,
                Some(format!(
                    "taken up after a restart once repository {} answers",
                    of.repository
                )),
            );
            self.restores.insert(id, Arc::clone(&slot));
            tokio::spawn(Arc::clone(self).resume(r.volume.clone(), id, of.clone(), slot));
            kept.push(r.clone());
        }
        if kept.len() != list.len() {
            if kept.is_empty() {
                self.pool.remove_property(None, RESTORING)?;
            } else {
                let json = serde_json::to_vec(&kept).map_err(DaemonError::internal)?;
                self.pool.set_property(None, RESTORING, &json)?;
            }
        }
        Ok(())
    }

    /// Takes up an instant restore after a restart, once its repository
    /// answers (retried with backoff; each failure shown in the volume's
    /// view), then fills the volume.
    async fn resume(self: Arc<Self>, volume: String, id: VolumeId, of: InstantOf, slot: Arc<Slot>) {
        let mut wait = std::time::Duration::from_secs(1);
        loop {
            if self.pool.lookup(&volume).ok() != Some(id) {
                info!(volume = %volume, "the volume of a restore to take up was deleted");
                self.pool.set_incomplete(id, None);
                self.restores.remove(id);
                let _ = self.mark_restore(&volume, None).await;
                return;
            }
            let attempt = async {
                let repo = self.open(&of.repository).await?;
                let found = repo.find(&of.backup).await.map_err(ApiError::from)?;
                LiveRestore::resume(
                    &repo,
                    &found.id,
                    Arc::clone(&self.pool),
                    &volume,
                    Arc::new(Progress::default()),
                )
                .await
                .map_err(ApiError::from)
            }
            .await;
            match attempt {
                Ok(live) => {
                    slot.set_live(Arc::clone(&live));
                    info!(volume = %volume, backup = %of.backup, "instant restore taken up");
                    self.run_fill(of.repository.clone(), slot, live).await;
                    return;
                }
                Err(e) => {
                    warn!(volume = %volume, error = %e.message(), "an instant restore cannot be taken up yet; retrying in {wait:?}");
                    slot.set_note(Some(format!(
                        "taken up after a restart once repository {} answers: {}",
                        of.repository,
                        e.message()
                    )));
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(MAX_RESUME_WAIT);
                }
            }
        }
    }

    /// Fills an instant restore's volume, as a job. Complete, the volume
    /// leaves the lists; its volume deleted, the restore ends; failed
    /// blocks keep it listed (their reads fail) until the next start
    /// retries them.
    async fn run_fill(
        self: Arc<Self>,
        repository: String,
        slot: Arc<Slot>,
        live: Arc<LiveRestore>,
    ) {
        let volume = live.name().to_owned();
        let id = live.volume();
        let job = self.jobs.start_with(
            JobKind::Restore,
            &repository,
            &volume,
            Arc::clone(live.progress()),
        );
        let filled = live.fill().await;
        job.end(filled.is_ok());
        let gone = self.pool.lookup(&volume).ok() != Some(id);
        match filled {
            Ok(blocks) => {
                info!(volume = %volume, backup = %live.backup(), blocks, "instant restore complete");
                self.restores.remove(id);
                if let Err(e) = self.mark_restore(&volume, None).await {
                    warn!(volume = %volume, error = %e.message(), "a complete restore stays listed in the pool: the next start checks it again");
                }
            }
            Err(e) if gone => {
                info!(volume = %volume, error = %arbor_backup::error_chain(&e), "the volume of an instant restore was deleted: the restore ends");
                live.release().await;
                self.pool.set_incomplete(id, None);
                self.restores.remove(id);
                let _ = self.mark_restore(&volume, None).await;
            }
            Err(e) => {
                let why = arbor_backup::error_chain(&e);
                warn!(volume = %volume, error = %why, "an instant restore ended incomplete: its missing blocks fail reads; the next start retries them");
                slot.set_note(Some(why));
            }
        }
    }

    /// The configured repositories, with their schedules at `now`.
    pub fn repository_views(&self, now: u64) -> Vec<BackupRepositoryView> {
        let repositories = self.repositories.read().unwrap_or_else(|p| p.into_inner());
        repositories
            .iter()
            .map(|(name, spec)| BackupRepositoryView {
                name: name.clone(),
                url: spec.url.clone(),
                schedule: self.schedules.view(name, now),
            })
            .collect()
    }

    /// The dashboard's backup view.
    pub fn overview(&self, now: u64) -> arbor_api::model::BackupsOverview {
        arbor_api::model::BackupsOverview {
            repositories: self.repository_views(now),
            jobs: self.jobs.views(),
        }
    }

    /// What the metrics show of backups: the jobs under way, the totals
    /// of those ended, and when each volume known here was last backed up
    /// (through this daemon, or by its repository's list for a scheduled
    /// one).
    pub fn metrics_report(&self) -> crate::metrics::BackupReport {
        crate::metrics::BackupReport {
            running: self.jobs.views(),
            totals: self
                .jobs
                .totals()
                .into_iter()
                .map(|((repository, kind), t)| (repository, kind.name(), t))
                .collect(),
            last_success: self
                .schedules
                .last_backups()
                .into_iter()
                .map(|((repository, volume), at)| (repository, volume, at))
                .collect(),
        }
    }

    /// Every backup in `repository`, oldest first.
    pub(crate) async fn list_backups(&self, repository: &str) -> Result<Vec<Listing>, ApiError> {
        let repo = self.open(repository).await?;
        repo.list()
            .await
            .map_err(|e| ApiError::from(e).context(format!("backup repository {repository}")))
    }

    /// Backs up `snapshot` into `repository`, the snapshot pinned while it
    /// is read.
    pub(crate) async fn backup_snapshot(
        &self,
        repository: &str,
        snapshot: &str,
    ) -> Result<Made, ApiError> {
        let id = self.pool.lookup(snapshot).map_err(DaemonError::from)?;
        let _pinned = self.pins.pin(vec![id]);
        let repo = self.open(repository).await?;
        let job = self.jobs.start(JobKind::Backup, repository, snapshot);
        let made = repo
            .backup(Arc::clone(&self.pool), snapshot, &self.host, &job.progress)
            .await;
        job.end(made.is_ok());
        let made = made.map_err(|e| {
            ApiError::from(e).context(format!("backing up {snapshot} to {repository}"))
        })?;
        self.schedules.backed_up(
            repository,
            &made.manifest.volume,
            made.manifest.completed_unix_ms / 1000,
            made.id.to_string(),
        );
        info!(
            repository = %repository,
            snapshot = %snapshot,
            backup = %made.id,
            incremental = made.base.is_some(),
            added_bytes = made.manifest.added_bytes,
            resumed_after_pieces = made.resumed_pieces,
            "backed up"
        );
        Ok(made)
    }

    fn spec(&self, name: &str) -> Result<RepoSpec, ApiError> {
        // Replaced whole: a poisoned lock still holds a whole value.
        let repositories = self.repositories.read().unwrap_or_else(|p| p.into_inner());
        repositories.get(name).cloned().ok_or_else(|| {
            let known: Vec<&str> = repositories.keys().map(String::as_str).collect();
            ApiError::from(DaemonError::NotFound(format!(
                "no backup repository {name:?} is configured (backup_repositories: {})",
                if known.is_empty() {
                    "none".to_owned()
                } else {
                    known.join(", ")
                }
            )))
        })
    }

    async fn open(&self, name: &str) -> Result<Repository, ApiError> {
        self.spec(name)?
            .open()
            .await
            .map_err(|e| ApiError::from(e).context(format!("backup repository {name}")))
    }
}

fn view(listing: &Listing) -> BackupView {
    let m = &listing.manifest;
    BackupView {
        id: listing.id.to_string(),
        volume: m.volume.clone(),
        snapshot: m.snapshot.clone(),
        host: m.host.clone(),
        created_unix: m.created_unix,
        completed_unix: m.completed_unix_ms / 1000,
        size: m.size,
        mapped_bytes: m.blocks.saturating_mul(u64::from(m.block_size)).min(m.size),
        parent: m.parent.clone(),
        added_blobs: m.added_blobs,
        added_bytes: m.added_bytes,
    }
}

/// `GET /v1/backups`.
pub async fn repositories(State(backups): State<Arc<Backups>>) -> Json<Vec<BackupRepositoryView>> {
    Json(backups.repository_views(crate::clock::unix_now()))
}

/// `GET /v1/backup-jobs`: the backups, restores, verifies and prunes under
/// way, with their progress.
pub async fn jobs(State(backups): State<Arc<Backups>>) -> Json<Vec<BackupJobView>> {
    Json(backups.jobs.views())
}

/// `GET /v1/backups/{repository}`.
pub async fn list(
    State(backups): State<Arc<Backups>>,
    Path(name): Path<String>,
) -> ApiResult<Json<BackupListView>> {
    let repo = backups.open(&name).await?;
    let listed = repo.list().await.map_err(ApiError::from)?;
    Ok(Json(BackupListView {
        repository: name,
        url: repo.location().to_string(),
        id: repo.id().to_owned(),
        block_size: repo.block_size(),
        backups: listed.iter().map(view).collect(),
    }))
}

/// `POST /v1/backups/{repository}`: backs up a snapshot; answered when the
/// backup is complete.
pub async fn create(
    State(backups): State<Arc<Backups>>,
    Path(name): Path<String>,
    Json(req): Json<BackupRequest>,
) -> ApiResult<(StatusCode, Json<BackupView>)> {
    let made = backups.backup_snapshot(&name, &req.snapshot).await?;
    let listing = Listing {
        id: made.id,
        manifest: made.manifest,
    };
    Ok((StatusCode::CREATED, Json(view(&listing))))
}

/// `POST /v1/backups/{repository}/restore`: restores a backup into a new
/// volume; answered when it is complete.
pub async fn restore(
    State(backups): State<Arc<Backups>>,
    Path(name): Path<String>,
    Json(req): Json<RestoreRequest>,
) -> ApiResult<(StatusCode, Json<RestoreView>)> {
    arbor_engine::check_volume_name(&req.volume).map_err(DaemonError::from)?;
    if backups.pool.lookup(&req.volume).is_ok() {
        return Err(ApiError::from(DaemonError::from(
            arbor_engine::Error::Refused(arbor_engine::Refusal::AlreadyExists(req.volume.clone())),
        )));
    }
    let repo = backups.open(&name).await?;
    let found = repo.find(&req.backup).await.map_err(ApiError::from)?;
    if req.instant {
        return instant_restore(&backups, &name, &repo, found.id, &req.volume)
            .await
            .map(|view| (StatusCode::CREATED, Json(view)))
            .map_err(|e| e.context(format!("restoring backup {} into {}", found.id, req.volume)));
    }
    // Listed in the pool while it runs: cut off, the next start deletes
    // what it wrote.
    backups
        .mark_restore(
            &req.volume,
            Some(RestoreUnderWay {
                volume: req.volume.clone(),
                started_unix: crate::clock::unix_now(),
                instant: None,
            }),
        )
        .await?;
    let job = backups.jobs.start(JobKind::Restore, &name, &req.volume);
    let restored = repo
        .restore(
            &found.id,
            Arc::clone(&backups.pool),
            &req.volume,
            &job.progress,
        )
        .await;
    job.end(restored.is_ok());
    backups.mark_restore(&req.volume, None).await?;
    let restored = restored.map_err(|e| {
        ApiError::from(e).context(format!("restoring backup {} into {}", found.id, req.volume))
    })?;
    info!(repository = %name, backup = %found.id, volume = %req.volume, "restored");
    Ok((
        StatusCode::CREATED,
        Json(RestoreView {
            backup: found.id.to_string(),
            volume: restored.volume,
            size: restored.size,
            restored_bytes: restored
                .blocks
                .saturating_mul(u64::from(repo.block_size()))
                .min(restored.size),
            instant: false,
        }),
    ))
}

/// Makes the volume of an instant restore, lists it (exports and views go
/// through its restore from the start), and fills it in the background.
async fn instant_restore(
    backups: &Arc<Backups>,
    repository: &str,
    repo: &Repository,
    backup: ObjectId,
    volume: &str,
) -> Result<RestoreView, ApiError> {
    // Without the pool's list of restores, a restore cut off could not be
    // taken up, and its volume would serve holes as zeros.
    if !backups.pool.format_version().has_properties() {
        return Err(ApiError::from(DaemonError::from(
            arbor_engine::Error::from(arbor_engine::Refusal::Unsupported(
                arbor_engine::Unsupported::Format(arbor_engine::Capability::Properties),
            )),
        )));
    }
    // Listed in the pool before its volume exists: cut off, the next
    // start takes it up.
    backups
        .mark_restore(
            volume,
            Some(RestoreUnderWay {
                volume: volume.to_owned(),
                started_unix: crate::clock::unix_now(),
                instant: Some(InstantOf {
                    repository: repository.to_owned(),
                    backup: backup.to_string(),
                }),
            }),
        )
        .await?;
    // No export opens it between its making and its listing.
    let _making = backups.restores.making(volume);
    let live = match LiveRestore::create(
        repo,
        &backup,
        Arc::clone(&backups.pool),
        volume,
        true,
        Arc::new(Progress::default()),
    )
    .await
    {
        Ok(live) => live,
        Err(e) => {
            backups.mark_restore(volume, None).await?;
            return Err(ApiError::from(e));
        }
    };
    let slot = Slot::new(repository, &backup.to_string(), live.size(), None);
    slot.set_live(Arc::clone(&live));
    backups.restores.insert(live.volume(), Arc::clone(&slot));
    info!(repository = %repository, backup = %backup, volume = %volume, "instant restore: the volume serves while it fills");
    let size = live.size();
    tokio::spawn(Arc::clone(backups).run_fill(repository.to_owned(), slot, live));
    Ok(RestoreView {
        backup: backup.to_string(),
        volume: volume.to_owned(),
        size,
        restored_bytes: 0,
        instant: true,
    })
}

/// `POST /v1/backups/{repository}/verify`: reads the repository back and
/// lists what is wrong; answered when done.
pub async fn verify(
    State(backups): State<Arc<Backups>>,
    Path(name): Path<String>,
    Json(req): Json<VerifyRequest>,
) -> ApiResult<Json<VerifyView>> {
    let sample = req.sample_percent.unwrap_or(100);
    if !(1..=100).contains(&sample) {
        return Err(ApiError::from(DaemonError::Invalid(format!(
            "sample_percent {sample}: from 1 to 100"
        ))));
    }
    let repo = backups.open(&name).await?;
    let job = backups.jobs.start(JobKind::Verify, &name, "");
    let v = repo.verify(sample, &job.progress).await;
    job.end(v.is_ok());
    let v = v.map_err(|e| ApiError::from(e).context(format!("verifying {name}")))?;
    info!(repository = %name, packs_read = v.packs_read, problems = v.problem_count, "verified");
    Ok(Json(VerifyView {
        repository: name,
        backups: v.backups,
        packs_total: v.packs_total,
        packs_read: v.packs_read,
        blobs_checked: v.blobs_checked,
        bytes_read: v.bytes_read,
        problems: v.problems,
        problem_count: v.problem_count,
    }))
}

/// Which backups `retention` keeps: the snapshot planner of the monitor
/// (`arbor_monitor::prune::plan`), run over each volume's backups from each
/// host, every backup counted as made by the policy and none held (the
/// newest of each, by snapshot time then completion, is kept whatever the
/// rule). Returns every backup's
/// decision: whether it is forgotten, and why.
pub fn retention_decisions(
    all: &[Listing],
    retention: Option<&arbor_monitor::Retention>,
    now: u64,
) -> Vec<(ObjectId, bool, String)> {
    let Some(retention) = retention else {
        return all
            .iter()
            .map(|l| (l.id, false, "no retention given".to_owned()))
            .collect();
    };
    let mut groups: BTreeMap<(&str, &str), Vec<&Listing>> = BTreeMap::new();
    for l in all {
        groups
            .entry((l.manifest.host.as_str(), l.manifest.volume.as_str()))
            .or_default()
            .push(l);
    }
    let mut out = Vec::with_capacity(all.len());
    for group in groups.values() {
        // Named so that names sort in the order the backups completed:
        // of backups of snapshots taken in one second, the last is the
        // newest.
        let name = |l: &Listing| format!("{:020}-{}", l.manifest.completed_unix_ms, l.id);
        let candidates: Vec<arbor_monitor::Candidate> = group
            .iter()
            .map(|l| arbor_monitor::Candidate {
                name: name(l),
                created: l.manifest.created_unix,
                policy_made: true,
                held: Vec::new(),
                needed: false,
                exclusive_bytes: l.manifest.added_bytes,
            })
            .collect();
        let plan = arbor_monitor::prune::plan_with(
            &candidates,
            retention,
            now,
            arbor_monitor::Newest::LastByName,
        );
        for (decisions, forget) in [(plan.destroy, true), (plan.keep, false)] {
            for d in decisions {
                if let Some(l) = group.iter().find(|l| name(l) == d.name) {
                    out.push((l.id, forget, d.reason.to_string()));
                }
            }
        }
    }
    out
}

/// `POST /v1/backups/{repository}/prune`: forgets the backups the
/// retention given does not keep and deletes what no backup needs (a dry
/// run only says what); answered when done.
pub async fn prune(
    State(backups): State<Arc<Backups>>,
    Path(name): Path<String>,
    Json(req): Json<BackupPruneRequest>,
) -> ApiResult<Json<BackupPruneView>> {
    let retention = req
        .keep
        .as_deref()
        .map(str::parse::<arbor_monitor::Retention>)
        .transpose()
        .map_err(|e| ApiError::from(DaemonError::Invalid(format!("keep: {e}"))))?;
    let repack = req.repack_unused_percent.unwrap_or(25);
    if !(1..=100).contains(&repack) {
        return Err(ApiError::from(DaemonError::Invalid(format!(
            "repack_unused_percent {repack}: from 1 to 100"
        ))));
    }
    let now = crate::clock::unix_now();
    let view = backups
        .prune_by(&name, retention.as_ref(), req.dry_run, repack, now)
        .await?;
    Ok(Json(view))
}

impl Backups {
    /// Prunes `repository`: forgets what `retention` does not keep (none:
    /// nothing) at `now`, and deletes what no backup needs.
    pub(crate) async fn prune_by(
        &self,
        repository: &str,
        retention: Option<&arbor_monitor::Retention>,
        dry_run: bool,
        repack_unused_percent: u8,
        now: u64,
    ) -> Result<BackupPruneView, ApiError> {
        let repo = self.open(repository).await?;
        let mut decided: Vec<(Listing, bool, String)> = Vec::new();
        let choose = |all: &[Listing]| {
            let decisions = retention_decisions(all, retention, now);
            let mut forget = Vec::new();
            for (id, gone, reason) in decisions {
                if let Some(l) = all.iter().find(|l| l.id == id) {
                    if gone {
                        forget.push(id);
                    }
                    decided.push((l.clone(), gone, reason));
                }
            }
            forget
        };
        let options = PruneOptions {
            dry_run,
            repack_unused_percent,
            ..PruneOptions::default()
        };
        let job = self.jobs.start(JobKind::Prune, repository, "");
        let p = repo.prune(choose, options, &job.progress).await;
        job.end(p.is_ok());
        let p = p.map_err(|e| ApiError::from(e).context(format!("pruning {repository}")))?;
        info!(
            repository = %repository,
            dry_run = p.dry_run,
            forgotten = p.forgotten.len(),
            deleted_packs = p.deleted_packs.len(),
            repacked_packs = p.repacked_packs.len(),
            small_packs = p.small_packs.len(),
            bytes_before = p.bytes_before,
            bytes_after = p.bytes_after,
            "pruned"
        );
        decided.sort_by(|a, b| {
            (a.0.manifest.completed_unix_ms, a.0.id).cmp(&(b.0.manifest.completed_unix_ms, b.0.id))
        });
        let (forgotten, kept): (Vec<_>, Vec<_>) = decided.into_iter().partition(|d| d.1);
        let views = |list: Vec<(Listing, bool, String)>| {
            list.into_iter()
                .map(|(l, _, reason)| PrunedBackupView {
                    backup: view(&l),
                    reason,
                })
                .collect()
        };
        Ok(BackupPruneView {
            repository: repository.to_owned(),
            dry_run: p.dry_run,
            forgotten: views(forgotten),
            kept: views(kept),
            deleted_packs: p.deleted_packs,
            repacked_packs: p.repacked_packs,
            small_packs: p.small_packs,
            replaced_indexes: p.replaced_indexes,
            written_packs: p.written_packs,
            written_indexes: p.written_indexes,
            kept_blobs: p.kept_blobs,
            removed_blobs: p.removed_blobs,
            bytes_before: p.bytes_before,
            bytes_after: p.bytes_after,
            stale_locks: p.stale_locks,
            kept_checkpoints: p.kept_checkpoints,
            deleted_checkpoints: p.deleted_checkpoints,
        })
    }
}

/// The API's code for each backup failure.
pub fn code_of(err: &BackupError) -> arbor_api::error_code::ErrorCode {
    use arbor_api::error_code::ErrorCode;
    use arbor_backup::store::StoreErrorKind;
    match err {
        BackupError::Store(e) => match e.kind {
            StoreErrorKind::NotFound => ErrorCode::NotFound,
            StoreErrorKind::Config => ErrorCode::InvalidArgument,
            StoreErrorKind::Refused | StoreErrorKind::Unavailable => ErrorCode::StoreUnavailable,
        },
        BackupError::Damaged { .. } | BackupError::Format(_) => ErrorCode::Corrupt,
        BackupError::Engine(e) => crate::api_error::code_of_engine(e),
        BackupError::NotFound(_) => ErrorCode::NotFound,
        BackupError::Refused(_) => ErrorCode::InvalidArgument,
        BackupError::Locked(_) => ErrorCode::Busy,
        BackupError::Internal(_) => ErrorCode::Internal,
    }
}
