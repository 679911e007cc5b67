//! The daemon's HTTP control API: JSON endpoints over the daemon's
//! services ([`Services`]).
//!
//! Every error response, including those axum produces itself (unknown
//! route, wrong method, malformed or oversized body), carries an
//! [`ErrorBody`], so clients need to handle only one error shape.

use std::sync::Arc;

use arbor_engine::Pool;
use axum::body::to_bytes;
use axum::extract::{DefaultBodyLimit, FromRef, Path, Query, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{middleware, Extension, Json, Router};
use serde::Serialize;

use super::api_error::{ApiError, ApiResult};
use super::auth::{self, Auth, Caller};
use super::control::PoolControl;
use super::handler::{blocking, not_replica};
use super::monitor::Monitor;
use super::origins::Origins;
use super::replication::Replication;
use super::stream::Streams;
use super::{monitor_api, replica_api, stream, token_api};
use arbor_api::error_code::ErrorCode;
use arbor_api::model::{
    AttachOriginRequest, CallerView, CheckView, CloneRequest, CreateVolumeRequest, DestroyQuery,
    DetachQuery, DiffQuery, GroupSnapshotRequest, GrowRequest, GrowView, HoldRequest, MetadataPage,
    MetadataQuery, OriginView, OverviewView, PoolView, Range, ReclaimView, RenameRequest,
    ResizeRequest, RollbackRequest, SnapshotRequest, SnapshotsQuery, StatsView, UpgradeView,
    VolumeView,
};

/// Request bodies are a few small JSON fields; anything bigger is a mistake or abuse.
const BODY_LIMIT: usize = 64 * 1024;

/// The services the API's handlers act on: each handler takes only those
/// it needs (`State<T>` for any `T` here, through [`FromRef`]).
#[derive(Clone)]
pub struct Services {
    pub control: PoolControl,
    pub origins: Origins,
    pub monitor: Arc<Monitor>,
    pub replication: Arc<Replication>,
    pub streams: Streams,
    pub pool: Arc<Pool>,
    pub history: Arc<crate::history::History>,
    pub reloader: Arc<crate::reload::Reloader>,
    pub backups: Arc<crate::backups::Backups>,
}

macro_rules! from_services {
    ($($field:ident: $type:ty),*) => {$(
        impl FromRef<Services> for $type {
            fn from_ref(services: &Services) -> Self {
                services.$field.clone()
            }
        }
    )*};
}

from_services!(
    control: PoolControl,
    origins: Origins,
    monitor: Arc<Monitor>,
    replication: Arc<Replication>,
    streams: Streams,
    pool: Arc<Pool>,
    history: Arc<crate::history::History>,
    reloader: Arc<crate::reload::Reloader>,
    backups: Arc<crate::backups::Backups>
);

/// The API's routes for `services`, guarded by `auth` (who may do what)
/// and by the `Host`/`Origin` check, which accepts IP addresses,
/// `localhost`, `arbor` and `names` (the DNS names of the listener's TLS
/// certificate).
pub fn router(services: Services, auth: Arc<Auth>, names: Vec<String>) -> Router {
    let names: Arc<[String]> = names.into();
    Router::new()
        .route("/v1/pool", get(pool_info))
        .route("/v1/history", get(history))
        .route("/v1/config/reload", post(config_reload))
        .route("/v1/pool/grow", post(grow))
        .route("/v1/pool/upgrade", post(upgrade))
        .route("/v1/pool/damage", get(damage))
        .route(
            "/v1/scrub",
            get(scrub_status).post(scrub_start).delete(scrub_stop),
        )
        .route(
            "/v1/scrub/schedule",
            axum::routing::put(scrub_schedule).delete(scrub_unschedule),
        )
        .route("/v1/volumes", get(list).post(create_volume))
        .route("/v1/volumes/{name}", axum::routing::delete(delete))
        .route("/v1/volumes/{name}/rollback", post(rollback))
        .route("/v1/volumes/{name}/resize", post(resize))
        .route("/v1/volumes/{name}/rename", post(rename))
        .route("/v1/volumes/{name}/stats", get(stats))
        .route("/v1/volumes/{name}/qos", axum::routing::put(set_qos))
        .route("/v1/volumes/{name}/key", axum::routing::put(key_change))
        .route("/v1/volumes/{name}/key/load", axum::routing::post(key_load))
        .route(
            "/v1/volumes/{name}/key/unload",
            axum::routing::post(key_unload),
        )
        .route("/v1/snapshots", get(snapshots).post(snapshot))
        .route("/v1/snapshots/{name}/holds", post(hold))
        .route("/v1/snapshots/{name}/allocated", get(allocated))
        .route("/v1/snapshots/{name}/changed", get(changed))
        .route(
            "/v1/snapshots/{name}/holds/{tag}",
            axum::routing::delete(release),
        )
        .route("/v1/clones", post(clone_snapshot))
        .route("/v1/origins", get(origins).post(attach_origin))
        .route("/v1/origins/{name}", axum::routing::delete(detach_origin))
        .route("/v1/diff", get(diff))
        .route("/v1/flush", post(flush))
        .route("/v1/check", post(check))
        .route("/v1/reclaim", post(reclaim))
        .route("/v1/send", get(stream::send))
        .route("/v1/send/estimate", get(stream::estimate))
        .route(
            "/v1/receive/{volume}",
            post(stream::receive)
                // The body is a stream of any length, consumed as it comes.
                .layer(DefaultBodyLimit::disable())
                .get(stream::status)
                .delete(stream::abort),
        )
        .route(
            "/v1/heal/{volume}",
            // The body is a stream of any length, consumed as it comes.
            post(stream::heal).layer(DefaultBodyLimit::disable()),
        )
        .route(
            "/v1/replicas",
            get(replica_api::list).post(replica_api::add),
        )
        .route(
            "/v1/replicas/{volume}",
            axum::routing::delete(replica_api::remove),
        )
        .route("/v1/replicas/{volume}/run", post(replica_api::run))
        .route("/v1/replicas/{volume}/resync", post(replica_api::resync))
        .route("/v1/replicas/{volume}/promote", post(replica_api::promote))
        .route("/v1/replicas/{volume}/demote", post(replica_api::demote))
        .route("/v1/backups", get(crate::backups::repositories))
        .route("/v1/backup-jobs", get(crate::backups::jobs))
        .route(
            "/v1/backups/{repository}",
            get(crate::backups::list).post(crate::backups::create),
        )
        .route(
            "/v1/backups/{repository}/restore",
            post(crate::backups::restore),
        )
        .route(
            "/v1/backups/{repository}/verify",
            post(crate::backups::verify),
        )
        .route(
            "/v1/backups/{repository}/prune",
            post(crate::backups::prune),
        )
        .route("/v1/overview", get(overview))
        .route("/v1/whoami", get(whoami))
        .route("/v1/policies", get(monitor_api::list))
        .route(
            "/v1/policies/{volume}",
            get(monitor_api::show)
                .put(monitor_api::set)
                .delete(monitor_api::clear),
        )
        .route("/v1/prune", post(monitor_api::prune))
        .route("/v1/alerts", get(monitor_api::alerts))
        .route("/v1/snapshots/group", post(snapshot_group))
        .route(
            "/v1/tokens",
            get(token_api::list)
                .post(token_api::create)
                .with_state(Arc::clone(&auth)),
        )
        .route(
            "/v1/tokens/{name}",
            axum::routing::delete(token_api::revoke).with_state(Arc::clone(&auth)),
        )
        .route("/", get(dashboard))
        .route("/ui", get(dashboard))
        .route("/metrics", get(metrics))
        .fallback(unknown_endpoint)
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .layer(middleware::from_fn_with_state(auth, auth::authenticate))
        .layer(middleware::from_fn_with_state(names, same_site_only))
        .layer(middleware::map_response(errors_as_json))
        .with_state(services)
}

/// Whether `host` (a `Host` header: name or address, maybe a port) is one
/// this API answers to: an IP address, `localhost`, `arbor` (the CLI's
/// name on the Unix socket), or one of `names` (its TLS certificate's: a
/// page that rebinds another name cannot pass the certificate check).
/// Anything else is a name that may have been rebound to loopback by a web
/// page.
fn own_host(host: &str, names: &[String]) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        // [v6]:port
        return rest
            .split_once(']')
            .is_some_and(|(v6, _)| v6.parse::<std::net::Ipv6Addr>().is_ok());
    } else {
        host.rsplit_once(':')
            .filter(|(_, port)| port.parse::<u16>().is_ok())
            .map_or(host, |(name, _)| name)
    };
    name.parse::<std::net::IpAddr>().is_ok()
        || name.eq_ignore_ascii_case("localhost")
        || name == "arbor"
        || names.iter().any(|n| n.eq_ignore_ascii_case(name))
}

/// Refuses what a web page of another site could make a browser send to
/// the loopback API: a `Host` that is some other name (DNS rebinding), or
/// a changing request from another origin (cross-site request forgery;
/// a JSON body alone does not stop a form or a `no-cors` fetch).
async fn same_site_only(
    State(names): State<Arc<[String]>>,
    request: axum::extract::Request,
    next: middleware::Next,
) -> Result<Response, ApiError> {
    let headers = request.headers();
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("");
    if !host.is_empty() && !own_host(host, &names) {
        let mut known = String::from("its address, localhost, arbor");
        for name in names.iter() {
            known.push_str(", ");
            known.push_str(name);
        }
        return Err(ApiError::new(
            ErrorCode::Forbidden,
            format!("the API answers to {known}, not {host:?}"),
        ));
    }
    let reads = matches!(
        *request.method(),
        axum::http::Method::GET | axum::http::Method::HEAD
    );
    if let (false, Some(origin)) = (reads, headers.get(header::ORIGIN)) {
        let origin = origin.to_str().unwrap_or("");
        let same = origin
            .strip_prefix("http://")
            .or_else(|| origin.strip_prefix("https://"))
            .is_some_and(|o| !host.is_empty() && o.eq_ignore_ascii_case(host));
        if !same {
            return Err(ApiError::new(
                ErrorCode::Forbidden,
                format!("a request from {origin:?} may not change anything here"),
            ));
        }
    }
    Ok(next.run(request).await)
}

/// The dashboard: one page, everything inline, nothing fetched from
/// elsewhere; it polls `/v1/overview` and acts through the API.
const DASHBOARD: &str = include_str!("dashboard/index.html");

async fn dashboard() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            // Nothing outside this page: no external script, style or fetch.
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
                 connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; \
                 frame-ancestors 'none'",
            ),
            (header::CACHE_CONTROL, "no-store"),
        ],
        DASHBOARD,
    )
        .into_response()
}

/// `GET /v1/overview`: what the dashboard shows, in one answer, with
/// who asked.
async fn overview(
    State(c): State<PoolControl>,
    caller: Option<Extension<Caller>>,
) -> ApiResult<Json<OverviewView>> {
    let mut view = blocking(c, |c| c.overview()).await?;
    view.caller = caller.map(|Extension(caller)| caller.view());
    Ok(Json(view))
}

/// `GET /v1/whoami`: who the request authenticated as, and its scope.
async fn whoami(Extension(caller): Extension<Caller>) -> Json<CallerView> {
    Json(caller.view())
}

/// Replaces the body of an error response that is not already an
/// [`ErrorBody`] (axum's own rejections are plain text or empty).
async fn errors_as_json(response: Response) -> Response {
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v == HeaderValue::from_static("application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return response;
    }
    let reason = status.canonical_reason().unwrap_or("error");
    let text = to_bytes(response.into_body(), BODY_LIMIT)
        .await
        .map(|bytes| String::from_utf8_lossy(&bytes).trim().to_owned())
        .unwrap_or_default();
    let message = if text.is_empty() {
        reason.to_owned()
    } else {
        text
    };
    // The framework's status stands even where the code's own differs.
    ApiError::new(ErrorCode::of_status(status.as_u16()), message)
        .with_status(status)
        .into_response()
}

/// A path no route matches: its own code, so a client can tell "no such
/// endpoint" (a client/server version mismatch) from "no such volume".
async fn unknown_endpoint(uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        ErrorCode::UnknownEndpoint,
        format!("no API endpoint {}; see docs/API.md", uri.path()),
    )
}

fn created<T: Serialize>(value: T) -> Response {
    (StatusCode::CREATED, Json(value)).into_response()
}

async fn pool_info(State(c): State<PoolControl>) -> ApiResult<Json<PoolView>> {
    blocking(c, |c| c.pool_info()).await.map(Json)
}

async fn history(
    State(h): State<Arc<crate::history::History>>,
) -> Json<arbor_api::model::HistoryView> {
    Json(h.view())
}

async fn config_reload(
    State(reloader): State<Arc<crate::reload::Reloader>>,
) -> ApiResult<Json<arbor_api::model::ReloadView>> {
    tokio::task::spawn_blocking(move || reloader.reload())
        .await
        .map_err(super::api_error::engine_task_failed)?
        .map(Json)
        .map_err(ApiError::from)
}

async fn scrub_status(
    State(c): State<PoolControl>,
) -> ApiResult<Json<arbor_api::model::ScrubView>> {
    Ok(Json(c.scrub()))
}

async fn scrub_start(State(c): State<PoolControl>) -> ApiResult<Json<arbor_api::model::ScrubView>> {
    blocking(c, |c| c.start_scrub()).await.map(Json)
}

async fn scrub_stop(State(c): State<PoolControl>) -> ApiResult<Json<arbor_api::model::ScrubView>> {
    blocking(c, |c| c.stop_scrub()).await.map(Json)
}

async fn scrub_schedule(
    State(c): State<PoolControl>,
    Json(req): Json<arbor_api::model::ScrubScheduleRequest>,
) -> ApiResult<Json<arbor_api::model::ScrubView>> {
    blocking(c, move |c| c.set_scrub_schedule(&req.schedule))
        .await
        .map(Json)
}

async fn scrub_unschedule(
    State(c): State<PoolControl>,
) -> ApiResult<Json<arbor_api::model::ScrubView>> {
    blocking(c, |c| c.clear_scrub_schedule()).await.map(Json)
}

async fn damage(State(c): State<PoolControl>) -> ApiResult<Json<arbor_api::model::DamageView>> {
    blocking(c, |c| c.damage()).await.map(Json)
}

async fn grow(
    State(c): State<PoolControl>,
    Json(req): Json<GrowRequest>,
) -> ApiResult<Json<GrowView>> {
    blocking(c, move |c| c.grow(&req)).await.map(Json)
}

async fn upgrade(State(c): State<PoolControl>) -> ApiResult<Json<UpgradeView>> {
    blocking(c, |c| c.upgrade()).await.map(Json)
}

async fn list(State(c): State<PoolControl>) -> ApiResult<Json<Vec<VolumeView>>> {
    blocking(c, |c| c.list()).await.map(Json)
}

async fn create_volume(
    State(c): State<PoolControl>,
    Json(req): Json<CreateVolumeRequest>,
) -> ApiResult<Response> {
    blocking(c, move |c| {
        c.create_volume(
            &req.name,
            req.size.0,
            req.layout,
            req.qos.as_ref(),
            req.encryption,
        )
    })
    .await
    .map(created)
}

async fn set_qos(
    State(c): State<PoolControl>,
    Path(name): Path<String>,
    Json(req): Json<arbor_api::model::QosRequest>,
) -> ApiResult<Json<VolumeView>> {
    blocking(c, move |c| c.set_qos(&name, &req)).await.map(Json)
}

async fn key_load(
    State(c): State<PoolControl>,
    Path(name): Path<String>,
    Json(req): Json<arbor_api::model::KeyLoadRequest>,
) -> ApiResult<Json<VolumeView>> {
    blocking(c, move |c| c.key_load(&name, req.key))
        .await
        .map(Json)
}

async fn key_unload(
    State(c): State<PoolControl>,
    Path(name): Path<String>,
) -> ApiResult<Json<VolumeView>> {
    blocking(c, move |c| c.key_unload(&name)).await.map(Json)
}

async fn key_change(
    State(c): State<PoolControl>,
    Path(name): Path<String>,
    Json(req): Json<arbor_api::model::KeyChangeRequest>,
) -> ApiResult<Json<VolumeView>> {
    blocking(c, move |c| c.key_change(&name, req.old, req.new))
        .await
        .map(Json)
}

async fn snapshot(
    State(c): State<PoolControl>,
    State(replication): State<Arc<Replication>>,
    Json(req): Json<SnapshotRequest>,
) -> ApiResult<Response> {
    not_replica(&replication, &req.name)?;
    blocking(c, move |c| c.snapshot(&req.name, req.durability))
        .await
        .map(created)
}

/// `POST /v1/snapshots/group`: snapshots of several volumes in one commit.
async fn snapshot_group(
    State(c): State<PoolControl>,
    State(replication): State<Arc<Replication>>,
    Json(req): Json<GroupSnapshotRequest>,
) -> ApiResult<Response> {
    for name in &req.names {
        not_replica(&replication, name)?;
    }
    blocking(c, move |c| c.snapshot_group(&req.names, req.durability))
        .await
        .map(|views| (StatusCode::CREATED, Json(views)).into_response())
}

async fn clone_snapshot(
    State(c): State<PoolControl>,
    Json(req): Json<CloneRequest>,
) -> ApiResult<Response> {
    blocking(c, move |c| match req.key {
        None => c.clone_snapshot(&req.snapshot, &req.name, req.durability),
        Some(keys) => c.clone_with_key(&req.snapshot, &req.name, keys),
    })
    .await
    .map(created)
}

/// `GET /v1/origins`: the volumes attached with `arbor origin attach`.
async fn origins(State(o): State<Origins>) -> ApiResult<Json<Vec<OriginView>>> {
    blocking(o, |o| o.origins()).await.map(Json)
}

/// `POST /v1/origins`: a file or block device becomes a volume, its data
/// left in place (or an origin's device is attached again).
async fn attach_origin(
    State(o): State<Origins>,
    Json(req): Json<AttachOriginRequest>,
) -> ApiResult<Response> {
    blocking(o, move |o| {
        o.attach_origin(&req.name, &req.path, req.accept_damage)
    })
    .await
    .map(created)
}

/// `DELETE /v1/origins/{name}`: the device keeps the volume's current
/// content; the volume leaves the pool, or, with `copy_to_pool`, stays
/// there with its data copied.
async fn detach_origin(
    State(o): State<Origins>,
    Path(name): Path<String>,
    Query(query): Query<DetachQuery>,
) -> ApiResult<StatusCode> {
    blocking(o, move |o| {
        if query.copy_to_pool {
            o.copy_origin_to_pool(&name)
        } else {
            o.detach_origin(&name, query.force)
        }
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn snapshots(
    State(c): State<PoolControl>,
    Query(query): Query<SnapshotsQuery>,
) -> ApiResult<Json<Vec<VolumeView>>> {
    blocking(c, move |c| c.snapshots(query.volume.as_deref()))
        .await
        .map(Json)
}

async fn hold(
    State(c): State<PoolControl>,
    Path(name): Path<String>,
    Json(req): Json<HoldRequest>,
) -> ApiResult<Json<VolumeView>> {
    blocking(c, move |c| c.hold(&name, &req.tag))
        .await
        .map(Json)
}

async fn release(
    State(c): State<PoolControl>,
    Path((name, tag)): Path<(String, String)>,
) -> ApiResult<Json<VolumeView>> {
    blocking(c, move |c| c.release(&name, &tag)).await.map(Json)
}

async fn delete(
    State(c): State<PoolControl>,
    State(replication): State<Arc<Replication>>,
    Path(name): Path<String>,
    Query(query): Query<DestroyQuery>,
) -> ApiResult<StatusCode> {
    let volume = name.clone();
    blocking(c, move |c| c.destroy(&name, query.force)).await?;
    // A destroyed replica is no replica any more: a volume created later
    // under its name is an ordinary, writable one.
    if !volume.contains('@') && replication.is_replica(&volume) {
        replication.forget(&volume)?;
    }
    Ok(StatusCode::NO_CONTENT)
}

async fn rollback(
    State(c): State<PoolControl>,
    State(replication): State<Arc<Replication>>,
    Path(name): Path<String>,
    Json(req): Json<RollbackRequest>,
) -> ApiResult<Json<VolumeView>> {
    not_replica(&replication, &name)?;
    blocking(c, move |c| c.rollback(&name, &req.snapshot))
        .await
        .map(Json)
}

async fn resize(
    State(c): State<PoolControl>,
    State(replication): State<Arc<Replication>>,
    Path(name): Path<String>,
    Json(req): Json<ResizeRequest>,
) -> ApiResult<Json<VolumeView>> {
    not_replica(&replication, &name)?;
    blocking(c, move |c| c.resize(&name, req.size.0))
        .await
        .map(Json)
}

async fn rename(
    State(c): State<PoolControl>,
    State(replication): State<Arc<Replication>>,
    Path(name): Path<String>,
    Json(req): Json<RenameRequest>,
) -> ApiResult<Json<VolumeView>> {
    // Renaming a replica's snapshot would break its match with the source's.
    not_replica(&replication, &name)?;
    blocking(c, move |c| c.rename(&name, &req.to))
        .await
        .map(Json)
}

async fn stats(
    State(c): State<PoolControl>,
    Path(name): Path<String>,
) -> ApiResult<Json<StatsView>> {
    blocking(c, move |c| c.stats(&name)).await.map(Json)
}

async fn diff(
    State(c): State<PoolControl>,
    Query(query): Query<DiffQuery>,
) -> ApiResult<Json<Vec<Range>>> {
    blocking(c, move |c| c.diff(&query.a, &query.b))
        .await
        .map(Json)
}

async fn allocated(
    State(c): State<PoolControl>,
    Path(name): Path<String>,
    Query(query): Query<MetadataQuery>,
) -> ApiResult<Json<MetadataPage>> {
    blocking(c, move |c| c.allocated(&name, &query))
        .await
        .map(Json)
}

async fn changed(
    State(c): State<PoolControl>,
    Path(name): Path<String>,
    Query(query): Query<MetadataQuery>,
) -> ApiResult<Json<MetadataPage>> {
    blocking(c, move |c| c.changed(&name, &query))
        .await
        .map(Json)
}

async fn flush(State(c): State<PoolControl>) -> ApiResult<StatusCode> {
    blocking(c, |c| c.flush()).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn check(State(c): State<PoolControl>) -> ApiResult<Json<CheckView>> {
    blocking(c, |c| c.check()).await.map(Json)
}

async fn reclaim(State(c): State<PoolControl>) -> ApiResult<Json<ReclaimView>> {
    blocking(c, |c| c.reclaim()).await.map(Json)
}

async fn metrics(State(c): State<PoolControl>) -> ApiResult<Response> {
    let text = blocking(c, |c| c.metrics_text()).await?;
    let content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8";
    Ok(([(header::CONTENT_TYPE, content_type)], text).into_response())
}
