//! The client side of the control API: each call is one HTTP/1.1 request
//! to the daemon's Unix socket in the data directory, or over TCP to
//! `--api` (`endpoint`).

use std::io::{ErrorKind, Read, Write};
use std::path::Path;

use anyhow::{Context, Result};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Bytes;
use hyper::body::Frame;
use hyper::header::CONTENT_TYPE;
use hyper::{HeaderMap, Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::runtime::Runtime;

use crate::endpoint::{Endpoint, Io};
use crate::error::ClientError;
use crate::error_code::ErrorCode;
use crate::model::{
    AttachOriginRequest, CheckView, CloneRequest, CreateVolumeRequest, Durability, ErrorBody,
    GroupSnapshotRequest, GrowRequest, GrowView, HealedView, HoldRequest, OriginView,
    PolicyRequest, PolicyView, PoolView, PruneRequest, PruneView, Range, ReceiveStatusView,
    ReceivedView, ReclaimView, RenameRequest, ReplicaAddRequest, ReplicaRoleView, ReplicaRunView,
    ReplicasView, ResizeRequest, RollbackRequest, SendEstimateView, SendQuery, SnapshotRequest,
    StatsView, StreamCompression, StreamFormat, UpgradeView, VolumeView,
};
use crate::model::{
    BackupJobView, BackupListView, BackupPruneRequest, BackupPruneView, BackupRepositoryView,
    BackupRequest, BackupView, RestoreRequest, RestoreView, VerifyRequest, VerifyView,
};
use crate::model::{CreatedTokenView, TokenRequest, TokenView};
use crate::size::ByteSize;

pub use crate::endpoint::Remote;

pub struct DaemonClient {
    endpoint: Endpoint,
    runtime: Runtime,
}

impl DaemonClient {
    /// A client of the daemon `remote` names, or of the one serving
    /// `data_dir`.
    pub fn new(data_dir: &Path, remote: &Remote) -> Result<Self> {
        let endpoint = Endpoint::new(data_dir, remote)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("cannot start the I/O runtime")?;
        Ok(Self { endpoint, runtime })
    }

    /// Another client of the same daemon, with a runtime of its own: for
    /// a thread that asks while this one waits (a progress bar).
    pub fn fork(&self) -> Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("cannot start the I/O runtime")?;
        Ok(Self {
            endpoint: self.endpoint.clone(),
            runtime,
        })
    }

    /// Whether the daemon is reached over TCP (`--api`), maybe on another
    /// host: paths on this host mean nothing to it.
    pub fn is_remote(&self) -> bool {
        matches!(self.endpoint, Endpoint::Tcp(_))
    }

    fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        decode(&self.send(Method::GET, path, None)?)
    }

    fn post<T: DeserializeOwned>(&self, path: &str, body: &impl Serialize) -> Result<T> {
        let body = serde_json::to_vec(body).context("cannot encode the request")?;
        decode(&self.send(Method::POST, path, Some(body))?)
    }

    /// Sends one request; a non-2xx answer becomes a [`ClientError::Api`]
    /// with its error code and the daemon's message.
    fn send(&self, method: Method, path: &str, body: Option<Vec<u8>>) -> Result<Bytes> {
        let stream = self.runtime.block_on(self.endpoint.connect())?;
        let request = self
            .endpoint
            .request(method, path)
            .header(CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body.unwrap_or_default())))?;
        let (status, headers, bytes) = self
            .runtime
            .block_on(send_over(stream, request))
            .context("the arbor daemon broke off the request")?;
        if status.is_success() {
            return Ok(bytes);
        }
        Err(self.error_of(status, &headers, &bytes))
    }

    /// The failure an error response describes, with what to do about
    /// refused credentials.
    fn error_of(&self, status: StatusCode, headers: &HeaderMap, bytes: &[u8]) -> anyhow::Error {
        let error = serde_json::from_slice::<ErrorBody>(bytes).unwrap_or_else(|_| ErrorBody {
            code: ErrorCode::of_status(status.as_u16()),
            message: format!(
                "the daemon answered {status}: {}",
                String::from_utf8_lossy(bytes)
            ),
        });
        let message = self.endpoint.explain(error.code, headers, error.message);
        ClientError::Api {
            code: error.code,
            message,
        }
        .into()
    }
}

/// One request on a fresh connection.
async fn send_over(
    stream: Box<dyn Io>,
    request: Request<Full<Bytes>>,
) -> Result<(StatusCode, HeaderMap, Bytes)> {
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    // Drives the connection until the response has been read.
    let driver = tokio::spawn(connection);
    let response = sender.send_request(request).await?;
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = response.into_body().collect().await?.to_bytes();
    drop(sender);
    driver.await??;
    Ok((status, headers, bytes))
}

fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T> {
    serde_json::from_slice(bytes).context("the daemon sent a response this client cannot read")
}

/// Percent-encodes a user-supplied name for use in a URL path or query, so a
/// name with `/`, `?` or `%` reaches the daemon intact (and is rejected there
/// as an invalid name) instead of changing the request.
fn encode(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for byte in name.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

fn volume_path(name: &str) -> String {
    format!("/v1/volumes/{}", encode(name))
}

impl DaemonClient {
    pub fn pool_status(&self) -> Result<PoolView> {
        self.get("/v1/pool")
    }

    pub fn scrub_status(&self) -> Result<crate::model::ScrubView> {
        self.get("/v1/scrub")
    }

    /// Has the daemon read its configuration again and apply what can
    /// change while it runs.
    pub fn config_reload(&self) -> Result<crate::model::ReloadView> {
        decode(&self.send(Method::POST, "/v1/config/reload", None)?)
    }

    pub fn scrub_start(&self) -> Result<crate::model::ScrubView> {
        decode(&self.send(Method::POST, "/v1/scrub", None)?)
    }

    pub fn scrub_stop(&self) -> Result<crate::model::ScrubView> {
        decode(&self.send(Method::DELETE, "/v1/scrub", None)?)
    }

    pub fn scrub_schedule_set(&self, schedule: &str) -> Result<crate::model::ScrubView> {
        let request = crate::model::ScrubScheduleRequest {
            schedule: schedule.to_owned(),
        };
        let body = serde_json::to_vec(&request).context("cannot encode the request")?;
        decode(&self.send(Method::PUT, "/v1/scrub/schedule", Some(body))?)
    }

    pub fn scrub_schedule_clear(&self) -> Result<crate::model::ScrubView> {
        decode(&self.send(Method::DELETE, "/v1/scrub/schedule", None)?)
    }

    pub fn damage(&self) -> Result<crate::model::DamageView> {
        self.get("/v1/pool/damage")
    }

    pub fn grow(&self, request: &GrowRequest) -> Result<GrowView> {
        self.post("/v1/pool/grow", request)
    }

    pub fn upgrade(&self) -> Result<UpgradeView> {
        decode(&self.send(Method::POST, "/v1/pool/upgrade", None)?)
    }

    pub fn list(&self) -> Result<Vec<VolumeView>> {
        self.get("/v1/volumes")
    }

    pub fn create_volume(
        &self,
        name: &str,
        size: u64,
        layout: crate::model::CreateLayout,
        qos: Option<crate::model::QosRequest>,
        encryption: Option<crate::model::EncryptionRequest>,
    ) -> Result<VolumeView> {
        let request = CreateVolumeRequest {
            name: name.to_owned(),
            size: ByteSize(size),
            layout,
            qos,
            encryption,
        };
        self.post("/v1/volumes", &request)
    }

    /// Loads encrypted volume `name`'s key: it, and every volume sharing
    /// its key, unlock.
    pub fn key_load(&self, name: &str, key: crate::model::KeyMaterial) -> Result<VolumeView> {
        self.post(
            &format!("{}/key/load", volume_path(name)),
            &crate::model::KeyLoadRequest { key },
        )
    }

    /// Unloads encrypted volume `name`'s key: it, and every volume sharing
    /// its key, lock.
    pub fn key_unload(&self, name: &str) -> Result<VolumeView> {
        decode(&self.send(
            Method::POST,
            &format!("{}/key/unload", volume_path(name)),
            None,
        )?)
    }

    /// Wraps encrypted volume `name`'s data key with `new` instead of `old`.
    pub fn key_change(
        &self,
        name: &str,
        old: crate::model::KeyMaterial,
        new: crate::model::KeyMaterial,
    ) -> Result<VolumeView> {
        let body = serde_json::to_vec(&crate::model::KeyChangeRequest { old, new })
            .context("cannot encode the request")?;
        decode(&self.send(
            Method::PUT,
            &format!("{}/key", volume_path(name)),
            Some(body),
        )?)
    }

    /// Changes the rate limits of volume or snapshot `name`.
    pub fn set_qos(&self, name: &str, change: &crate::model::QosRequest) -> Result<VolumeView> {
        let body = serde_json::to_vec(change).context("cannot encode the request")?;
        decode(&self.send(
            Method::PUT,
            &format!("{}/qos", volume_path(name)),
            Some(body),
        )?)
    }

    pub fn snapshot(&self, name: &str, durability: Durability) -> Result<VolumeView> {
        let request = SnapshotRequest {
            name: name.to_owned(),
            durability,
        };
        self.post("/v1/snapshots", &request)
    }

    pub fn snapshot_group(
        &self,
        names: &[String],
        durability: Durability,
    ) -> Result<Vec<VolumeView>> {
        let request = GroupSnapshotRequest {
            names: names.to_vec(),
            durability,
        };
        self.post("/v1/snapshots/group", &request)
    }

    pub fn policies(&self) -> Result<Vec<PolicyView>> {
        self.get("/v1/policies")
    }

    pub fn policy(&self, volume: &str) -> Result<PolicyView> {
        self.get(&format!("/v1/policies/{}", encode(volume)))
    }

    pub fn policy_set(&self, volume: &str, request: &PolicyRequest) -> Result<PolicyView> {
        let body = serde_json::to_vec(request).context("cannot encode the request")?;
        let path = format!("/v1/policies/{}", encode(volume));
        decode(&self.send(Method::PUT, &path, Some(body))?)
    }

    pub fn policy_clear(&self, volume: &str) -> Result<()> {
        self.send(
            Method::DELETE,
            &format!("/v1/policies/{}", encode(volume)),
            None,
        )
        .map(drop)
    }

    pub fn prune(&self, request: &PruneRequest) -> Result<PruneView> {
        self.post("/v1/prune", request)
    }

    pub fn clone_snapshot(
        &self,
        snapshot: &str,
        name: &str,
        durability: Durability,
    ) -> Result<VolumeView> {
        let request = CloneRequest {
            snapshot: snapshot.to_owned(),
            name: name.to_owned(),
            durability,
            key: None,
        };
        self.post("/v1/clones", &request)
    }

    /// A clone of an encrypted snapshot with its own user key `new` (the
    /// snapshot's key `old` opens the data key it shares).
    pub fn clone_with_key(
        &self,
        snapshot: &str,
        name: &str,
        old: crate::model::KeyMaterial,
        new: crate::model::KeyMaterial,
    ) -> Result<VolumeView> {
        let request = CloneRequest {
            snapshot: snapshot.to_owned(),
            name: name.to_owned(),
            durability: Durability::default(),
            key: Some(crate::model::KeyChangeRequest { old, new }),
        };
        self.post("/v1/clones", &request)
    }

    /// Destroys a volume or snapshot; without `force`, refused while NBD
    /// clients have it open.
    pub fn destroy(&self, name: &str, force: bool) -> Result<()> {
        let path = format!("{}?force={force}", volume_path(name));
        self.send(Method::DELETE, &path, None).map(drop)
    }

    pub fn origins(&self) -> Result<Vec<OriginView>> {
        self.get("/v1/origins")
    }

    /// Attaches the file or device at `path` (absolute: the daemon's
    /// working directory is not ours) as origin `name`.
    pub fn attach_origin(&self, name: &str, path: &str, accept_damage: bool) -> Result<OriginView> {
        let request = AttachOriginRequest {
            name: name.to_owned(),
            path: path.to_owned(),
            accept_damage,
        };
        self.post("/v1/origins", &request)
    }

    /// Detaches origin `name`; with `copy_to_pool`, its data is copied
    /// into the pool first and the volume stays there.
    pub fn detach_origin(&self, name: &str, force: bool, copy_to_pool: bool) -> Result<()> {
        let path = format!(
            "/v1/origins/{}?force={force}&copy_to_pool={copy_to_pool}",
            encode(name)
        );
        self.send(Method::DELETE, &path, None).map(drop)
    }

    /// Snapshots, of `volume` only if given.
    pub fn snapshots(&self, volume: Option<&str>) -> Result<Vec<VolumeView>> {
        match volume {
            Some(volume) => self.get(&format!("/v1/snapshots?volume={}", encode(volume))),
            None => self.get("/v1/snapshots"),
        }
    }

    pub fn rollback(&self, volume: &str, snapshot: &str) -> Result<VolumeView> {
        let request = RollbackRequest {
            snapshot: snapshot.to_owned(),
        };
        self.post(&format!("{}/rollback", volume_path(volume)), &request)
    }

    pub fn resize(&self, name: &str, size: u64) -> Result<VolumeView> {
        let request = ResizeRequest {
            size: ByteSize(size),
        };
        self.post(&format!("{}/resize", volume_path(name)), &request)
    }

    pub fn rename(&self, from: &str, to: &str) -> Result<VolumeView> {
        let request = RenameRequest { to: to.to_owned() };
        self.post(&format!("{}/rename", volume_path(from)), &request)
    }

    pub fn stats(&self, name: &str) -> Result<StatsView> {
        self.get(&format!("{}/stats", volume_path(name)))
    }

    pub fn diff(&self, a: &str, b: &str) -> Result<Vec<Range>> {
        self.get(&format!("/v1/diff?a={}&b={}", encode(a), encode(b)))
    }

    pub fn check(&self) -> Result<CheckView> {
        decode(&self.send(Method::POST, "/v1/check", None)?)
    }

    /// Commits the pool (`POST /v1/flush`).
    pub fn flush(&self) -> Result<()> {
        self.send(Method::POST, "/v1/flush", None).map(drop)
    }

    pub fn reclaim(&self) -> Result<ReclaimView> {
        decode(&self.send(Method::POST, "/v1/reclaim", None)?)
    }

    pub fn hold(&self, snapshot: &str, tag: &str) -> Result<VolumeView> {
        let request = HoldRequest {
            tag: tag.to_owned(),
        };
        self.post(
            &format!("/v1/snapshots/{}/holds", encode(snapshot)),
            &request,
        )
    }

    pub fn release(&self, snapshot: &str, tag: &str) -> Result<VolumeView> {
        let path = format!("/v1/snapshots/{}/holds/{}", encode(snapshot), encode(tag));
        decode(&self.send(Method::DELETE, &path, None)?)
    }

    pub fn backup_repositories(&self) -> Result<Vec<BackupRepositoryView>> {
        self.get("/v1/backups")
    }

    pub fn backups(&self, repository: &str) -> Result<BackupListView> {
        self.get(&format!("/v1/backups/{}", encode(repository)))
    }

    /// A backup of a snapshot, answered when it is complete.
    pub fn backup_create(&self, repository: &str, request: &BackupRequest) -> Result<BackupView> {
        self.post(&format!("/v1/backups/{}", encode(repository)), request)
    }

    /// A restore into a new volume, answered when it is complete.
    pub fn backup_restore(
        &self,
        repository: &str,
        request: &RestoreRequest,
    ) -> Result<RestoreView> {
        self.post(
            &format!("/v1/backups/{}/restore", encode(repository)),
            request,
        )
    }

    /// A verify of a repository, answered when it is done.
    pub fn backup_verify(&self, repository: &str, request: &VerifyRequest) -> Result<VerifyView> {
        self.post(
            &format!("/v1/backups/{}/verify", encode(repository)),
            request,
        )
    }

    pub fn backup_jobs(&self) -> Result<Vec<BackupJobView>> {
        self.get("/v1/backup-jobs")
    }

    pub fn backup_prune(
        &self,
        repository: &str,
        request: &BackupPruneRequest,
    ) -> Result<BackupPruneView> {
        self.post(
            &format!("/v1/backups/{}/prune", encode(repository)),
            request,
        )
    }

    pub fn replicas(&self) -> Result<ReplicasView> {
        self.get("/v1/replicas")
    }

    pub fn replica_add(&self, request: &ReplicaAddRequest) -> Result<ReplicasView> {
        self.post("/v1/replicas", request)
    }

    fn replica_path(volume: &str, action: &str, target: Option<&str>, force: bool) -> String {
        let mut path = format!("/v1/replicas/{}{action}?force={force}", encode(volume));
        if let Some(t) = target {
            path += &format!("&target={}", encode(t));
        }
        path
    }

    pub fn replica_remove(&self, volume: &str, target: Option<&str>) -> Result<()> {
        let path = Self::replica_path(volume, "", target, false);
        self.send(Method::DELETE, &path, None).map(drop)
    }

    /// A cycle now (`resync`: rolling a diverged target back), answered
    /// when it ends.
    pub fn replica_run(
        &self,
        volume: &str,
        target: Option<&str>,
        resync: bool,
    ) -> Result<Vec<ReplicaRunView>> {
        let action = if resync { "/resync" } else { "/run" };
        let path = Self::replica_path(volume, action, target, resync);
        decode(&self.send(Method::POST, &path, None)?)
    }

    pub fn replica_promote(&self, volume: &str) -> Result<ReplicaRoleView> {
        let path = Self::replica_path(volume, "/promote", None, false);
        decode(&self.send(Method::POST, &path, None)?)
    }

    pub fn replica_demote(&self, volume: &str, dry_run: bool) -> Result<crate::model::DemoteView> {
        let path = format!(
            "{}&dry_run={dry_run}",
            Self::replica_path(volume, "/demote", None, false)
        );
        decode(&self.send(Method::POST, &path, None)?)
    }

    /// `send --dry-run`.
    pub fn send_estimate(&self, query: &SendQuery) -> Result<SendEstimateView> {
        self.get(&format!("/v1/send/estimate?{}", send_query(query)))
    }

    /// Streams a snapshot (or delta) into `out`, calling `progress` with
    /// the bytes written so far. Returns how many were written.
    pub fn send_stream(
        &self,
        query: &SendQuery,
        out: &mut dyn Write,
        progress: &mut dyn FnMut(u64),
    ) -> Result<u64> {
        let path = format!("/v1/send?{}", send_query(query));
        let stream = self.runtime.block_on(self.endpoint.connect())?;
        self.runtime.block_on(async {
            let request = self
                .endpoint
                .request(Method::GET, &path)
                .body(Full::new(Bytes::new()))?;
            let (mut sender, connection) =
                hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
            let driver = tokio::spawn(connection);
            let response = sender.send_request(request).await?;
            let status = response.status();
            let headers = response.headers().clone();
            let mut body = response.into_body();
            if !status.is_success() {
                let bytes = body.collect().await?.to_bytes();
                return Err(self.error_of(status, &headers, &bytes));
            }
            let mut written = 0u64;
            while let Some(frame) = body.frame().await {
                let frame = frame.context(
                    "the daemon broke off the stream (see its log); what was written is \
                     incomplete and a receiver will refuse it",
                )?;
                if let Ok(data) = frame.into_data() {
                    out.write_all(&data).context("cannot write the stream")?;
                    written += data.len() as u64;
                    progress(written);
                }
            }
            out.flush().context("cannot write the stream")?;
            drop(sender);
            driver.abort();
            Ok(written)
        })
    }

    /// Sends the stream read from `input` to be received into `volume`,
    /// calling `progress` with the bytes sent so far.
    pub fn receive_stream(
        &self,
        volume: &str,
        force: bool,
        format: StreamFormat,
        input: Box<dyn Read + Send>,
        progress: &mut dyn FnMut(u64),
    ) -> Result<ReceivedView> {
        let format = match format {
            StreamFormat::Arbor => "arbor",
            StreamFormat::RbdDiff => "rbd-diff",
        };
        let path = format!(
            "/v1/receive/{}?force={force}&format={format}",
            encode(volume)
        );
        self.post_stream(&path, input, progress)
    }

    /// Sends the stream read from `input`, of a snapshot of `volume` the
    /// pool holds, to heal that snapshot's damaged blocks.
    pub fn heal_stream(
        &self,
        volume: &str,
        input: Box<dyn Read + Send>,
        progress: &mut dyn FnMut(u64),
    ) -> Result<HealedView> {
        self.post_stream(&format!("/v1/heal/{}", encode(volume)), input, progress)
    }

    /// POSTs the stream read from `input` as the body of `path`, calling
    /// `progress` with the bytes sent so far; the answer is a `T`.
    fn post_stream<T: DeserializeOwned>(
        &self,
        path: &str,
        mut input: Box<dyn Read + Send>,
        progress: &mut dyn FnMut(u64),
    ) -> Result<T> {
        let stream = self.runtime.block_on(self.endpoint.connect())?;
        // A thread reads the input (a file or a pipe, blocking); the body
        // takes its pieces through a small channel: bounded memory.
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(4);
        let reader = std::thread::spawn(move || {
            let mut buf = vec![0u8; 1 << 20];
            loop {
                match input.read(&mut buf) {
                    Ok(0) => return,
                    Ok(n) => {
                        if tx
                            .blocking_send(Ok(Bytes::copy_from_slice(&buf[..n])))
                            .is_err()
                        {
                            return;
                        }
                    }
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) => {
                        let _ = tx.blocking_send(Err(e));
                        return;
                    }
                }
            }
        });
        let (sent_tx, sent_rx) = std::sync::mpsc::channel::<u64>();
        let result = self.runtime.block_on(async {
            let frames = futures_util::stream::unfold((rx, 0u64), move |(mut rx, sent)| {
                let sent_tx = sent_tx.clone();
                async move {
                    let item = rx.recv().await?;
                    let sent = sent + item.as_ref().map_or(0, |b| b.len() as u64);
                    let _ = sent_tx.send(sent);
                    Some((item.map(Frame::data), (rx, sent)))
                }
            });
            let request = self
                .endpoint
                .request(Method::POST, path)
                .header(CONTENT_TYPE, "application/vnd.arbor.stream")
                .body(StreamBody::new(frames))?;
            let (mut sender, connection) =
                hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
            let driver = tokio::spawn(connection);
            let response = sender.send_request(request).await;
            let response = match response {
                Ok(r) => r,
                Err(e) => {
                    return Err(anyhow::Error::new(e).context("the daemon broke off the receive"))
                }
            };
            let status = response.status();
            let headers = response.headers().clone();
            let bytes = response.into_body().collect().await?.to_bytes();
            drop(sender);
            driver.abort();
            if !status.is_success() {
                return Err(self.error_of(status, &headers, &bytes));
            }
            decode::<T>(&bytes)
        });
        while let Ok(sent) = sent_rx.try_recv() {
            progress(sent);
        }
        let _ = reader.join();
        result
    }

    pub fn tokens(&self) -> Result<Vec<TokenView>> {
        self.get("/v1/tokens")
    }

    pub fn token_create(&self, request: &TokenRequest) -> Result<CreatedTokenView> {
        self.post("/v1/tokens", request)
    }

    pub fn token_revoke(&self, name: &str) -> Result<()> {
        let path = format!("/v1/tokens/{}", encode(name));
        self.send(Method::DELETE, &path, None).map(drop)
    }

    /// The receive in progress into `volume`, with its resume token.
    pub fn receive_status(&self, volume: &str) -> Result<ReceiveStatusView> {
        self.get(&format!("/v1/receive/{}", encode(volume)))
    }

    /// Abandons the receive in progress into `volume`.
    pub fn receive_abort(&self, volume: &str) -> Result<()> {
        self.send(
            Method::DELETE,
            &format!("/v1/receive/{}", encode(volume)),
            None,
        )
        .map(drop)
    }
}

/// The query string of a send request.
fn send_query(q: &SendQuery) -> String {
    let mut parts = Vec::new();
    if let Some(s) = &q.snapshot {
        parts.push(format!("snapshot={}", encode(s)));
    }
    if let Some(f) = &q.from {
        parts.push(format!("from={}", encode(f)));
    }
    if let Some(r) = &q.resume {
        parts.push(format!("resume={}", encode(r)));
    }
    let compression = match q.compression {
        StreamCompression::None => "none",
        StreamCompression::Zstd => "zstd",
        StreamCompression::Best => "best",
    };
    parts.push(format!("compression={compression}"));
    if let Some(level) = q.level {
        parts.push(format!("level={level}"));
    }
    if q.format == StreamFormat::RbdDiff {
        parts.push("format=rbd-diff".to_owned());
    }
    if q.raw {
        parts.push("raw=true".to_owned());
    }
    parts.join("&")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_encoded_for_urls() {
        assert_eq!(encode("vm1@mon:day"), "vm1%40mon%3Aday");
        assert_eq!(encode("a/b?c=%"), "a%2Fb%3Fc%3D%25");
        assert_eq!(encode("db-1_x.img"), "db-1_x.img");
    }
}
