//! `/v1/policies`, `/v1/prune` and `/v1/alerts`: the monitor over the API
//! (`arbor policy ...`, `arbor prune`, alerts in `arbor pool status`).

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::Json;
use serde::Deserialize;

use super::api_error::{ApiError, ApiResult};
use super::handler::blocking;
use super::monitor::{unix_now, Monitor};
use crate::error::DaemonError;
use arbor_api::model::{AlertView, PolicyRequest, PolicyView, PruneRequest, PruneView};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoliciesQuery {
    pub volume: Option<String>,
}

/// `GET /v1/policies[?volume=]`.
pub async fn list(
    State(m): State<Arc<Monitor>>,
    Query(q): Query<PoliciesQuery>,
) -> ApiResult<Json<Vec<PolicyView>>> {
    blocking(m, move |m| m.views(q.volume.as_deref(), unix_now()))
        .await
        .map(Json)
}

/// `GET /v1/policies/{volume}`: the policy the volume is in.
pub async fn show(
    State(m): State<Arc<Monitor>>,
    Path(volume): Path<String>,
) -> ApiResult<Json<PolicyView>> {
    let name = volume.clone();
    let views = blocking(m, move |m| m.views(Some(&name), unix_now())).await?;
    views.into_iter().next().map(Json).ok_or_else(|| {
        ApiError::from(DaemonError::NotFound(format!(
            "{volume} has no policy (arbor policy set {volume} ...)"
        )))
    })
}

/// `PUT /v1/policies/{volume}`: sets the policy of the volume (and of the
/// volumes in `with`, snapshotted together).
pub async fn set(
    State(m): State<Arc<Monitor>>,
    Path(volume): Path<String>,
    Json(req): Json<PolicyRequest>,
) -> ApiResult<Json<PolicyView>> {
    blocking(m, move |m| m.set(&volume, &req)).await.map(Json)
}

/// `DELETE /v1/policies/{volume}`: removes the policy the volume is in;
/// its snapshots stay.
pub async fn clear(
    State(m): State<Arc<Monitor>>,
    Path(volume): Path<String>,
) -> ApiResult<StatusCode> {
    let name = volume.clone();
    if blocking(m, move |m| m.clear(&name)).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::from(DaemonError::NotFound(format!(
            "{volume} has no policy"
        ))))
    }
}

/// `POST /v1/prune`: prunes by the policies now, or with `dry_run` lists
/// what that would destroy and free.
pub async fn prune(
    State(m): State<Arc<Monitor>>,
    Json(req): Json<PruneRequest>,
) -> ApiResult<Json<PruneView>> {
    blocking(m, move |m| m.prune(&req, unix_now()))
        .await
        .map(Json)
}

/// `GET /v1/alerts`: the active alerts, critical first.
pub async fn alerts(State(m): State<Arc<Monitor>>) -> Json<Vec<AlertView>> {
    Json(m.alerts())
}
