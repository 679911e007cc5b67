//! Send and receive through the daemon: the stream is the body of the
//! request or response, produced and consumed piece by piece (a bounded
//! channel between the HTTP side and a blocking task over the engine), so
//! memory stays bounded whatever the volume size.

use std::sync::Arc;

use arbor_engine::{guid_hex, Pool};
use arbor_stream::busy::{Claim, Claims};
use arbor_stream::format::{Compression, ResumeToken};
use arbor_stream::heal::Healer;
use arbor_stream::receive::RbdReceiver;
use arbor_stream::receive::{resume_token, ReceiveOptions, Received, Receiver};
use arbor_stream::send::{Raw, SendFormat, SendRequest, Sender};
use arbor_stream::StreamFailure;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::StreamExt;
use tokio::sync::{mpsc, oneshot};
use tracing::{info, warn};

use super::api_error::{engine_task_failed, ApiError, ApiResult};
use crate::error::DaemonError;
use crate::in_use::InUse;
use crate::replication::Replication;
use arbor_api::model::{
    HealedView, ReceiveQuery, ReceiveStatusView, ReceivedView, SendEstimateView, SendQuery,
    StreamCompression, StreamFormat,
};

/// What sends and receives need; cheap to clone.
#[derive(Clone)]
pub struct Streams {
    pool: Arc<Pool>,
    /// Receives refuse a volume NBD clients have open; sends pin their
    /// snapshots here.
    in_use: InUse,
    /// Volumes a receive is running into: one at a time each.
    receiving: Arc<Claims>,
    /// A replica receives only by replication.
    replication: Arc<Replication>,
}

impl Streams {
    pub fn new(
        pool: Arc<Pool>,
        in_use: InUse,
        receiving: Arc<Claims>,
        replication: Arc<Replication>,
    ) -> Self {
        Self {
            pool,
            in_use,
            receiving,
            replication,
        }
    }
}

/// Stream pieces in flight between the engine task and the connection:
/// with pieces of about a megabyte, what a send or receive holds in memory.
const IN_FLIGHT: usize = 4;

fn request_of(q: &SendQuery) -> Result<SendRequest, ApiError> {
    let level = q.level.unwrap_or(3);
    if !(1..=19).contains(&level) {
        return Err(ApiError::from(DaemonError::Invalid(format!(
            "zstd level {level} is not 1 to 19"
        ))));
    }
    let compression = match q.compression {
        StreamCompression::None => Compression::None,
        StreamCompression::Zstd => Compression::Zstd { level },
        StreamCompression::Best => Compression::Best { level },
    };
    let resume = match &q.resume {
        Some(token) => Some(
            ResumeToken::decode(token)
                .map_err(|e| ApiError::from(DaemonError::Invalid(e.to_string())))?,
        ),
        None => None,
    };
    let target = match (&q.snapshot, &resume) {
        (Some(s), None) => s.clone(),
        (None, Some(_)) => String::new(),
        _ => {
            return Err(ApiError::from(DaemonError::Invalid(
                "give either a snapshot or a resume token".into(),
            )))
        }
    };
    if resume.is_some() && q.from.is_some() {
        return Err(ApiError::from(DaemonError::Invalid(
            "a resume token already names the base".into(),
        )));
    }
    Ok(SendRequest {
        target,
        base: q.from.clone(),
        resume,
        compression,
        format: match q.format {
            StreamFormat::Arbor => SendFormat::Arbor,
            StreamFormat::RbdDiff => SendFormat::RbdDiff,
        },
        raw: if q.raw { Raw::Yes } else { Raw::No },
    })
}

/// `GET /v1/send/estimate`: what the stream would carry, from the metadata.
pub async fn estimate(
    State(c): State<Streams>,
    Query(q): Query<SendQuery>,
) -> ApiResult<Json<SendEstimateView>> {
    let req = request_of(&q)?;
    let pool = Arc::clone(&c.pool);
    tokio::task::spawn_blocking(move || {
        let sender = Sender::new(&pool, &req).map_err(ApiError::from)?;
        let stats = sender.estimate().map_err(ApiError::from)?;
        let header = sender.header();
        let name_of = |guid: &arbor_stream::format::Guid| {
            pool.find_guid(&guid.0)
                .ok()
                .flatten()
                .and_then(|id| pool.info(id).ok())
                .map(|i| i.name)
        };
        Ok(Json(SendEstimateView {
            snapshot: header.name.clone(),
            from: header.base.as_ref().and_then(name_of),
            resume_offset: header.resume_offset,
            volume_size: header.volume_size,
            data_bytes: stats.data_bytes,
            zero_bytes: stats.zero_bytes,
            records: stats.records,
            stream_bytes_max: stats.stream_bytes,
        }))
    })
    .await
    .map_err(engine_task_failed)?
}

/// `GET /v1/send`: the stream, as the response body. Errors found before
/// the first byte (no such snapshot, no shared history) are ordinary error
/// responses; one met later ends the body early, which the client sees as
/// a broken stream (and the receiver as a truncated one).
pub async fn send(State(c): State<Streams>, Query(q): Query<SendQuery>) -> ApiResult<Response> {
    let req = request_of(&q)?;
    let pool = Arc::clone(&c.pool);
    let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(IN_FLIGHT);
    let (ready_tx, ready_rx) = oneshot::channel::<Result<(), ApiError>>();
    let pins = Arc::clone(c.in_use.pins());
    tokio::task::spawn_blocking(move || produce(&pool, &pins, &req, &tx, ready_tx));
    ready_rx
        .await
        .map_err(|_| ApiError::from(DaemonError::msg("the send task ended")))??;
    let body = Body::from_stream(futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    }));
    Ok((
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/vnd.arbor.stream")],
        body,
    )
        .into_response())
}

fn produce(
    pool: &Pool,
    pins: &Arc<arbor_stream::busy::Pins>,
    req: &SendRequest,
    tx: &mpsc::Sender<Result<Bytes, std::io::Error>>,
    ready: oneshot::Sender<Result<(), ApiError>>,
) {
    let mut sender = match Sender::new(pool, req) {
        Ok(sender) => sender,
        Err(e) => {
            let _ = ready.send(Err(ApiError::from(e)));
            return;
        }
    };
    // Destroying the snapshots this send reads needs force meanwhile.
    let _pinned = sender.pin(pins);
    let _ = ready.send(Ok(()));
    let name = sender.header().name.clone();
    match sender.pump(|piece| tx.blocking_send(Ok(Bytes::from(piece))).is_ok()) {
        Ok(true) => {
            let stats = sender.stats();
            info!(snapshot = %name, bytes = stats.stream_bytes, data = stats.data_bytes, "sent");
        }
        Ok(false) => info!(snapshot = %name, "the receiving side of a send went away"),
        Err(e) => {
            warn!(snapshot = %name, error = %e, "send failed part way");
            let _ = tx.blocking_send(Err(std::io::Error::other(e.to_string())));
        }
    }
}

/// Claims `volume` for one receive, or says which is running.
fn claim(claims: &Arc<Claims>, volume: &str) -> Result<Claim, ApiError> {
    claims.claim(volume).ok_or_else(|| {
        ApiError::from(DaemonError::Busy(format!(
            "a receive into {volume} is already running"
        )))
    })
}

/// `POST /v1/receive/{volume}`: the request body is the stream. Nothing
/// becomes visible unless the whole stream arrives and verifies; an
/// interrupted one keeps its progress for `send --resume`.
pub async fn receive(
    State(c): State<Streams>,
    Path(volume): Path<String>,
    Query(q): Query<ReceiveQuery>,
    body: Body,
) -> ApiResult<Json<ReceivedView>> {
    super::handler::not_replica(&c.replication, &volume)?;
    let claim = claim(&c.receiving, &volume)?;
    if let Ok(id) = c.pool.lookup(&volume) {
        let in_use = c.in_use.clone();
        let connections = if q.force {
            0
        } else {
            tokio::task::spawn_blocking(move || in_use.settled_connections(id))
                .await
                .unwrap_or_else(|_| c.in_use.connections(id))
        };
        if connections > 0 {
            return Err(ApiError::from(DaemonError::Busy(format!(
                "{volume} is open by {connections} NBD connection(s): a receive rolls it \
                     forward under them; disconnect first, or receive with --force"
            ))));
        }
    }
    let (tx, mut rx) = mpsc::channel::<Option<Bytes>>(IN_FLIGHT);
    let pool = Arc::clone(&c.pool);
    let opts = ReceiveOptions {
        force: q.force,
        ..ReceiveOptions::default()
    };
    let target = volume.clone();
    let format = q.format;
    let task = tokio::task::spawn_blocking(move || {
        let _claim = claim;
        if format == StreamFormat::RbdDiff {
            return receive_rbd(&pool, &target, opts.force, &mut rx);
        }
        let mut receiver = Receiver::new(&pool, &target, opts);
        // `None`: the body broke off.
        while let Some(item) = rx.blocking_recv() {
            let Some(bytes) = item else {
                let token = receiver.interrupted().map_err(ApiError::from)?;
                return Err(interrupted(&target, token, "the stream broke off"));
            };
            if let Err(e) = receiver.push(&bytes) {
                let token = receiver.interrupted().ok().flatten();
                let mut api = ApiError::from(e);
                if let Some(token) = token {
                    api = api.with_hint(format!(
                        "; what arrived before is kept: resume with `arbor send --resume {}`",
                        token.encode()
                    ));
                }
                return Err(api);
            }
        }
        let received = receiver.finish().map_err(ApiError::from)?;
        info!(snapshot = %received.snapshot, bytes = received.stream_bytes, "received");
        Ok(view_of(received))
    });
    feed(body, tx).await;
    task.await.map_err(engine_task_failed)?.map(Json)
}

/// Hands a request body's pieces to the task consuming them (`None` when
/// the body broke off), then ends.
async fn feed(body: Body, tx: mpsc::Sender<Option<Bytes>>) {
    let mut frames = body.into_data_stream();
    let mut refused = false;
    while let Some(frame) = frames.next().await {
        let item = frame.ok();
        let broke = item.is_none();
        if tx.send(item).await.is_err() {
            refused = true;
            break;
        }
        if broke {
            break;
        }
    }
    drop(tx);
    if refused {
        // The task failed before the stream ended (a refused stream, a
        // missing base): read the rest and drop it, so that the client
        // finishes sending and reads this answer. Answering with the body
        // unread left the CLI blocked sending, or with a broken pipe
        // instead of the reason (regression test
        // `a_refused_receive_says_why_even_when_the_stream_is_long`). The
        // bytes are discarded as they come: no memory is held.
        while let Some(Ok(_)) = frames.next().await {}
    }
}

/// `POST /v1/heal/{volume}`: the request body is a stream of a snapshot
/// of `volume` the pool holds; it heals only that snapshot's damaged
/// blocks (nothing is received).
pub async fn heal(
    State(c): State<Streams>,
    Path(volume): Path<String>,
    body: Body,
) -> ApiResult<Json<HealedView>> {
    let (tx, mut rx) = mpsc::channel::<Option<Bytes>>(IN_FLIGHT);
    let pool = Arc::clone(&c.pool);
    let task = tokio::task::spawn_blocking(move || {
        let mut healer = Healer::new(&pool, &volume);
        while let Some(item) = rx.blocking_recv() {
            let Some(bytes) = item else {
                return Err(ApiError::from(DaemonError::BadStream(format!(
                    "heal of {volume}: the stream broke off (what it healed before stays healed)"
                ))));
            };
            healer.push(&bytes).map_err(ApiError::from)?;
        }
        let r = healer.finish().map_err(ApiError::from)?;
        info!(
            snapshot = %r.snapshot,
            damaged = r.damaged,
            healed = r.healed.healed,
            rejected = r.healed.rejected,
            remaining = r.remaining,
            "healed from a stream"
        );
        Ok(HealedView {
            snapshot: r.snapshot,
            guid: guid_hex(&r.guid.0),
            damaged: r.damaged,
            healed: r.healed.healed,
            rejected: r.healed.rejected,
            remaining: r.remaining,
            stream_bytes: r.stream_bytes,
        })
    });
    feed(body, tx).await;
    task.await.map_err(engine_task_failed)?.map(Json)
}

/// An rbd diff into `volume`: applied as it comes, abandoned on any
/// failure (the format cannot resume).
fn receive_rbd(
    pool: &Pool,
    volume: &str,
    force: bool,
    rx: &mut mpsc::Receiver<Option<Bytes>>,
) -> Result<ReceivedView, ApiError> {
    let mut receiver = RbdReceiver::new(pool, volume, force);
    while let Some(item) = rx.blocking_recv() {
        let Some(bytes) = item else {
            return Err(DaemonError::BadStream(format!(
                "receive into {volume}: the rbd diff broke off; nothing was kept"
            ))
            .into());
        };
        receiver.push(&bytes).map_err(ApiError::from)?;
    }
    let received = receiver.finish().map_err(ApiError::from)?;
    info!(snapshot = %received.snapshot, bytes = received.stream_bytes, "received an rbd diff");
    Ok(view_of(received))
}

/// What the API says of a finished receive.
fn view_of(received: Received) -> ReceivedView {
    ReceivedView {
        snapshot: received.snapshot,
        guid: guid_hex(&received.guid.0),
        stream_bytes: received.stream_bytes,
        data_bytes: received.data_bytes,
        resumed_from: received.resumed_from,
        discarded: received.discarded,
    }
}

fn interrupted(volume: &str, token: Option<ResumeToken>, why: &str) -> ApiError {
    let resume = match token {
        Some(t) => format!("; resume with `arbor send --resume {}`", t.encode()),
        None => String::new(),
    };
    DaemonError::BadStream(format!("receive into {volume}: {why}{resume}")).into()
}

/// `GET /v1/receive/{volume}`: the receive in progress, with its token.
pub async fn status(
    State(c): State<Streams>,
    Path(volume): Path<String>,
) -> ApiResult<Json<ReceiveStatusView>> {
    let pool = Arc::clone(&c.pool);
    tokio::task::spawn_blocking(move || {
        let status = pool
            .receive_status(&volume)
            .map_err(|e| ApiError::from(StreamFailure::from(e)))?
            .ok_or_else(|| {
                ApiError::from(DaemonError::NotFound(format!(
                    "no receive into {volume} is in progress"
                )))
            })?;
        let token = resume_token(&pool, &volume)
            .map_err(ApiError::from)?
            .map(|t| t.encode())
            .unwrap_or_default();
        Ok(Json(ReceiveStatusView {
            volume,
            token,
            target: guid_hex(&status.target),
            base: status.base.as_ref().map(guid_hex),
            offset: status.offset,
            size: status.size,
            stale: status.stale,
        }))
    })
    .await
    .map_err(engine_task_failed)?
}

/// `DELETE /v1/receive/{volume}`: abandons the receive in progress.
pub async fn abort(State(c): State<Streams>, Path(volume): Path<String>) -> ApiResult<StatusCode> {
    let _claim = claim(&c.receiving, &volume)?;
    let pool = Arc::clone(&c.pool);
    let name = volume.clone();
    let found = tokio::task::spawn_blocking(move || pool.abort_receive(&name))
        .await
        .map_err(engine_task_failed)?
        .map_err(|e| ApiError::from(StreamFailure::from(e)))?;
    if !found {
        return Err(ApiError::from(DaemonError::NotFound(format!(
            "no receive into {volume} is in progress"
        ))));
    }
    Ok(StatusCode::NO_CONTENT)
}
