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
use arbor_backup::{BackupError, Listing, Made, PruneOptions, Repository};
use arbor_engine::Pool;
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
}

/// The pool property listing the restores under way (JSON: their volumes
/// and when each began): a restore cut off by the daemon's end leaves its
/// volume half written, and the next start deletes it.
const RESTORING: &str = "arbor.backup.restoring";

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct RestoreUnderWay {
    volume: String,
    started_unix: u64,
}

impl Backups {
    pub fn new(
        repositories: &[(String, RepoSpec)],
        schedules: Vec<BackupPolicy>,
        host: String,
        pool: Arc<Pool>,
        pins: Arc<Pins>,
        destroyer: Destroyer,
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
        self.schedules.conditions(now)
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
    async fn mark_restore(&self, volume: &str, started: Option<u64>) -> Result<(), ApiError> {
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
            if let Some(started_unix) = started {
                list.push(RestoreUnderWay {
                    volume,
                    started_unix,
                });
            }
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

    /// At start: deletes the volumes of restores a previous run of the
    /// daemon left half done (each only if it was made after its restore
    /// began: never a volume that was there before), then clears the list.
    pub fn recover_restores(&self) -> Result<(), DaemonError> {
        let list = Self::restores_under_way(&self.pool);
        for r in &list {
            let Ok(id) = self.pool.lookup(&r.volume) else {
                continue;
            };
            let info = self.pool.info(id)?;
            if info.snapshot || info.created_unix_secs < r.started_unix {
                warn!(volume = %r.volume, "a restore was cut off before it made its volume; the volume of that name is older and stays");
                continue;
            }
            warn!(volume = %r.volume, "a restore was cut off (the daemon stopped): its half-written volume is deleted");
            self.destroyer.destroy(&r.volume, true)?;
        }
        if !list.is_empty() {
            self.pool.remove_property(None, RESTORING)?;
        }
        Ok(())
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
    // Listed in the pool while it runs: cut off, the next start deletes
    // what it wrote.
    backups
        .mark_restore(&req.volume, Some(crate::clock::unix_now()))
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
        }),
    ))
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
            replaced_indexes: p.replaced_indexes,
            written_packs: p.written_packs,
            written_indexes: p.written_indexes,
            kept_blobs: p.kept_blobs,
            removed_blobs: p.removed_blobs,
            bytes_before: p.bytes_before,
            bytes_after: p.bytes_after,
            stale_locks: p.stale_locks,
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
