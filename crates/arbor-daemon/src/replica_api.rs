//! `/v1/replicas`: replication pairs and replicas over the API (`arbor
//! replica ...`).

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::Json;

use super::api_error::{ApiError, ApiResult};
use std::sync::Arc;

use arbor_engine::Pool;

use crate::error::DaemonError;
use crate::replication::Replication;
use serde::Deserialize;

use arbor_api::model::{
    DemoteView, ReplicaAddRequest, ReplicaQuery, ReplicaRoleView, ReplicaRunView, ReplicasView,
};
use arbor_replica::state::Pair;

/// Shortest interval between cycles.
const MIN_INTERVAL_SECS: u64 = 1;
/// Interval when none is given.
const DEFAULT_INTERVAL_SECS: u64 = 60;

/// `GET /v1/replicas`.
pub async fn list(State(replication): State<Arc<Replication>>) -> Json<ReplicasView> {
    Json(replication.view())
}

/// `POST /v1/replicas`: adds a pair; its first cycle starts at once.
pub async fn add(
    State(pool): State<Arc<Pool>>,
    State(replication): State<Arc<Replication>>,
    Json(req): Json<ReplicaAddRequest>,
) -> ApiResult<(StatusCode, Json<ReplicasView>)> {
    pool.lookup(&req.volume).map_err(DaemonError::from)?;
    let remote = req
        .remote_volume
        .clone()
        .unwrap_or_else(|| req.volume.clone());
    // Both names get replication snapshots: both within the name rule.
    for name in [&req.volume, &remote] {
        arbor_engine::check_volume_name(name).map_err(|e| ApiError::from(DaemonError::from(e)))?;
    }
    let valid_target = req
        .target
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0));
    if !valid_target {
        return Err(ApiError::from(DaemonError::Invalid(format!(
            "target {:?} is not HOST:PORT",
            req.target
        ))));
    }
    let interval = req.interval_secs.unwrap_or(DEFAULT_INTERVAL_SECS);
    if interval < MIN_INTERVAL_SECS {
        return Err(ApiError::from(DaemonError::Invalid(
            "the interval must be at least 1s".into(),
        )));
    }
    if req.rate_limit == Some(0) || req.keep == Some(0) {
        return Err(ApiError::from(DaemonError::Invalid(
            "a rate limit and a retention count must be above zero (leave them out for none)"
                .into(),
        )));
    }
    let pair = Pair {
        volume: req.volume,
        target: req.target,
        remote_volume: remote,
        identity: req.identity,
        rate_limit: req.rate_limit,
        interval_secs: interval,
        keep: req.keep,
        seeded: req.seeded,
        resync: false,
    };
    replication
        .add(pair)
        .map_err(|e| ApiError::from(DaemonError::from(e)))?;
    Ok((StatusCode::CREATED, Json(replication.view())))
}

/// `DELETE /v1/replicas/{volume}`: removes the volume's pairs (to one
/// target), releasing their holds.
pub async fn remove(
    State(replication): State<Arc<Replication>>,
    Path(volume): Path<String>,
    Query(q): Query<ReplicaQuery>,
) -> ApiResult<StatusCode> {
    replication
        .remove(&volume, q.target.as_deref())
        .await
        .map_err(|e| ApiError::from(DaemonError::from(e)))?;
    Ok(StatusCode::NO_CONTENT)
}

async fn run_pairs(
    replication: &Replication,
    volume: &str,
    target: Option<&str>,
) -> ApiResult<Json<Vec<ReplicaRunView>>> {
    let results = replication.run_now(volume, target).await;
    if results.is_empty() {
        return Err(ApiError::from(DaemonError::NotFound(format!(
            "{volume} is not replicated from here"
        ))));
    }
    let mut views = Vec::new();
    for (_, result) in results {
        views.push(result.map_err(ApiError::from)?);
    }
    Ok(Json(views))
}

/// `POST /v1/replicas/{volume}/run`: a cycle now, answered when it ends.
pub async fn run(
    State(replication): State<Arc<Replication>>,
    Path(volume): Path<String>,
    Query(q): Query<ReplicaQuery>,
) -> ApiResult<Json<Vec<ReplicaRunView>>> {
    run_pairs(&replication, &volume, q.target.as_deref()).await
}

/// `POST /v1/replicas/{volume}/resync?force=true`: the next cycle rolls a
/// diverged target back to the newest common snapshot; runs it now.
pub async fn resync(
    State(replication): State<Arc<Replication>>,
    Path(volume): Path<String>,
    Query(q): Query<ReplicaQuery>,
) -> ApiResult<Json<Vec<ReplicaRunView>>> {
    if !q.force {
        return Err(ApiError::from(DaemonError::Invalid(format!(
            "a resync deletes the target's own snapshots of {volume} and discards its \
                 writes since the newest common snapshot: give --force"
        ))));
    }
    replication
        .store
        .edit_pairs(&volume, q.target.as_deref(), |p| p.resync = true)
        .map_err(|e| ApiError::from(DaemonError::from(e)))?;
    run_pairs(&replication, &volume, q.target.as_deref()).await
}

/// `POST /v1/replicas/{volume}/promote`: the replica becomes the writable
/// master.
pub async fn promote(
    State(replication): State<Arc<Replication>>,
    Path(volume): Path<String>,
) -> ApiResult<Json<ReplicaRoleView>> {
    let role = replication.promote(&volume).await?;
    Ok(Json(ReplicaRoleView {
        volume,
        source: role.source,
        path: role.path,
    }))
}

/// `POST /v1/replicas/{volume}/demote`: the volume becomes a read-only
/// replica waiting for a source.
pub async fn demote(
    State(replication): State<Arc<Replication>>,
    Path(volume): Path<String>,
    Query(q): Query<DemoteQuery>,
) -> ApiResult<Json<DemoteView>> {
    let view = replication.demote(&volume, q.dry_run)?;
    Ok(Json(view))
}

/// `?dry_run=true`: say what a demote would expose, change nothing.
#[derive(Debug, Default, Deserialize)]
pub struct DemoteQuery {
    #[serde(default)]
    pub dry_run: bool,
}
