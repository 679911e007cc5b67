//! The daemon's sockets: the control API and NBD, each on a Unix socket in
//! the data directory and optionally on TCP.
//!
//! Unix sockets are made owner-only. The API on TCP authenticates every
//! request (`auth.rs`) and serves HTTPS when TLS is configured; without
//! TLS it listens only on loopback. NBD does not authenticate clients.

use std::fmt;
use std::fs::Permissions;
use std::io::ErrorKind;
use std::net::SocketAddr;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use arbor_tls::handshakes::Handshakes;
use arbor_tls::{Tls, TlsError};
use axum::{Extension, Router};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;
use tracing::{debug, info, warn};

use super::auth::Peer;
use crate::config::ApiConfig;
use crate::nbd_export::PoolExports;
use crate::reload::Shared;

/// A TLS client must finish its handshake within this time, so a stalled
/// one cannot keep a connection slot.
pub const API_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// A request's headers must arrive within this time, counted from when the
/// connection is ready for them (so also between the requests of a
/// kept-alive connection: an idle connection is closed after it).
pub const API_HEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// The first byte of a TLS handshake record.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// The control API's sockets: the data directory's Unix socket, and
/// optionally TCP (HTTPS with TLS, else plain HTTP on loopback only).
pub struct ApiListeners {
    unix: (UnixListener, SocketFile),
    tcp: Option<TcpApi>,
}

/// The API's TCP listener, its TLS (replaced by a reload, for the next
/// connection) and its connection limit.
struct TcpApi {
    listener: TcpListener,
    tls: Option<Arc<Shared<Tls>>>,
    max_connections: usize,
}

impl ApiListeners {
    /// Binds TCP first: once the Unix socket exists, both accept.
    pub async fn bind(socket: &Path, config: &ApiConfig) -> Result<Self> {
        let tcp = match config.listen {
            Some(addr) => {
                // The config check already refused this; plain HTTP would
                // carry tokens and data, so make sure twice.
                if !addr.ip().is_loopback() && config.tls.is_none() {
                    bail!("refusing to serve the API on {addr} without TLS (tls_ca, tls_cert, tls_key)");
                }
                let tls = match &config.tls {
                    Some(files) => Some(Shared::new(
                        Tls::load(files).context("the API's TLS (tls_ca, tls_cert, tls_key)")?,
                    )),
                    None => None,
                };
                let listener = TcpListener::bind(addr).await.with_context(|| {
                    format!("cannot listen for the API on {addr} (another daemon? set api_listen, or --api-listen none)")
                })?;
                Some(TcpApi {
                    listener,
                    tls,
                    max_connections: config.max_connections,
                })
            }
            None => None,
        };
        let unix = bind_unix(socket, |p| UnixListener::bind(p)).await?;
        Ok(Self { unix, tcp })
    }

    /// The DNS names of the TCP listener's certificate (none without TLS).
    pub fn tls_names(&self) -> Vec<String> {
        self.tcp
            .as_ref()
            .and_then(|t| t.tls.as_ref())
            .map(|tls| tls.get().dns_names().to_vec())
            .unwrap_or_default()
    }

    /// The TCP listener's certificates, which a reload replaces (none
    /// without an HTTPS listener).
    pub fn live_tls(&self) -> Option<Arc<Shared<Tls>>> {
        self.tcp.as_ref().and_then(|t| t.tls.clone())
    }

    /// Serves `router` until `stop`, then waits for in-flight requests.
    pub async fn serve(self, router: Router, stop: CancellationToken) -> Result<()> {
        let (unix, _socket_file) = self.unix;
        // The owner's socket: trusted without credentials.
        let local = router.clone().layer(Extension(Peer::Local));
        let on_unix =
            axum::serve(unix, local).with_graceful_shutdown(stop.clone().cancelled_owned());
        match self.tcp {
            Some(tcp) => {
                let (a, b) = tokio::join!(on_unix, tcp.serve(router, stop));
                a.context("API server failed").and(b)
            }
            None => on_unix.await.context("API server failed"),
        }
    }
}

impl TcpApi {
    /// Accepts up to `max_connections` at once, each served on a task of
    /// its own: the TLS handshake (bounded in time), then HTTP/1.1 with
    /// the connection's [`Peer`] in every request.
    ///
    /// When every slot is taken, a new connection drops the one longest in
    /// its TLS handshake to make room ([`Handshakes`], as the NBD and
    /// replication listeners do), so connections that stall before or
    /// inside their handshake cannot keep a client out, not even for the
    /// handshake timeout; a connection past its handshake is never dropped
    /// this way (without TLS, on loopback, there is no handshake: a new
    /// connection waits for a free slot).
    async fn serve(self, router: Router, stop: CancellationToken) -> Result<()> {
        let slots = Arc::new(Semaphore::new(self.max_connections));
        let handshakes = Handshakes::new();
        let mut connections = JoinSet::new();
        loop {
            let (tcp, remote) = tokio::select! {
                _ = stop.cancelled() => break,
                accepted = self.listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // Out of file descriptors, or a connection reset
                        // before it was accepted: try again shortly.
                        warn!(error = %e, "API: cannot accept a connection");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            // At the limit, this connection waits here (and later ones in
            // the listen backlog, costing no memory) while the oldest
            // handshake, if any, is dropped for it.
            let permit = tokio::select! {
                _ = stop.cancelled() => break,
                permit = handshakes.slot(&slots) => {
                    permit.context("the API's connection limit was closed")?
                }
            };
            while connections.try_join_next().is_some() {}
            // The certificates in force now (a reload replaces them).
            let acceptor = self
                .tls
                .as_ref()
                .map(|t| t.get().acceptor_client_optional());
            connections.spawn(connection(
                tcp,
                remote,
                acceptor,
                Arc::clone(&handshakes),
                router.clone(),
                stop.clone(),
                permit,
            ));
        }
        while connections.join_next().await.is_some() {}
        Ok(())
    }
}

/// One TCP connection; `_slot` is its place under the connection limit.
async fn connection(
    tcp: TcpStream,
    remote: SocketAddr,
    acceptor: Option<TlsAcceptor>,
    handshakes: Arc<Handshakes>,
    router: Router,
    stop: CancellationToken,
    _slot: OwnedSemaphorePermit,
) {
    // Requests and answers are small and interactive.
    let _ = tcp.set_nodelay(true);
    let Some(acceptor) = acceptor else {
        let peer = Peer::Tcp {
            remote,
            certificate: None,
        };
        return serve_http(tcp, peer, router, stop).await;
    };
    // In the line of handshakes a newcomer may drop, until it is done.
    let place = handshakes.enter();
    // Until the handshake is done, a shutdown need not wait for it.
    let handshake = async {
        let deadline = Instant::now() + API_HANDSHAKE_TIMEOUT;
        let mut first = [0u8; 1];
        match tokio::time::timeout_at(deadline, tcp.peek(&mut first)).await {
            Ok(Ok(1)) => {}
            Ok(Ok(_)) | Ok(Err(_)) => return None,
            Err(_) => {
                debug!(%remote, "API: no TLS handshake in time");
                return None;
            }
        }
        if first[0] != TLS_HANDSHAKE_RECORD {
            refuse_plain_http(tcp, remote, deadline).await;
            return None;
        }
        match tokio::time::timeout_at(deadline, acceptor.accept(tcp)).await {
            Ok(Ok(tls)) => {
                // Done: off the line before the client's first request
                // can be answered, so a newcomer never drops a session.
                place.leave();
                Some(tls)
            }
            Ok(Err(e)) => {
                warn!(%remote, error = %e, "API: TLS handshake failed");
                None
            }
            Err(_) => {
                warn!(%remote, "API: TLS handshake not finished in time");
                None
            }
        }
    };
    let tls = tokio::select! {
        _ = stop.cancelled() => return,
        () = place.dropped() => {
            debug!(%remote, "API: all slots taken, the oldest handshake dropped");
            return;
        }
        tls = handshake => match tls {
            Some(tls) => tls,
            None => return,
        },
    };
    let certificate = match arbor_tls::peer_identity(tls.get_ref().1) {
        Ok(identity) => Some(identity),
        Err(TlsError::NoPeerCertificate) => None,
        Err(e) => {
            // Verified by the CA, but nameless: it cannot be listed in
            // api_clients, so the client needs a token.
            warn!(%remote, error = %e, "API: a client certificate without a usable identity");
            None
        }
    };
    let peer = Peer::Tcp {
        remote,
        certificate,
    };
    serve_http(tls, peer, router, stop).await
}

/// A client that speaks plain HTTP to the HTTPS listener gets a 400 that
/// says so, then the connection is closed. The request's head is read
/// whole first (up to [`PLAIN_HEAD_LIMIT`]), however many segments it came
/// in, and what the client sends after the answer is drained until it
/// closes: a close with unread data resets the connection, which can cost
/// the client the answer, or fail its own writes of the rest.
async fn refuse_plain_http(mut tcp: TcpStream, remote: SocketAddr, deadline: Instant) {
    debug!(%remote, "API: plain HTTP on the HTTPS listener");
    let body =
        r#"{"code":"bad_request","message":"this is the arbor API over HTTPS: use https://"}"#;
    let answer = format!(
        "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout_at(deadline, async {
        let mut head = Vec::new();
        let mut piece = [0u8; 1024];
        let mut ended = false;
        while !ended && head.len() < PLAIN_HEAD_LIMIT {
            match tcp.read(&mut piece).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    // Only the new bytes, and the three before them, can
                    // complete the blank line that ends the head.
                    let from = head.len().saturating_sub(3);
                    head.extend_from_slice(&piece[..n]);
                    ended = head[from..].windows(4).any(|w| w == b"\r\n\r\n");
                }
            }
        }
        tcp.write_all(answer.as_bytes()).await?;
        tcp.shutdown().await?;
        let mut drained = 0;
        while drained < PLAIN_DRAIN_LIMIT {
            match tcp.read(&mut piece).await {
                Ok(0) | Err(_) => break,
                Ok(n) => drained += n,
            }
        }
        Ok::<(), std::io::Error>(())
    })
    .await;
}

/// Most of a plain HTTP request's head read before the answer.
const PLAIN_HEAD_LIMIT: usize = 8192;
/// Most bytes drained after the answer, waiting for the client to close.
const PLAIN_DRAIN_LIMIT: usize = 64 * 1024;

/// HTTP/1.1 over `io` until the client closes, a header timeout, or
/// `stop` (then requests in flight finish first).
async fn serve_http<I>(io: I, peer: Peer, router: Router, stop: CancellationToken)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
        request.extensions_mut().insert(peer.clone());
        router.clone().oneshot(request)
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(API_HEADER_TIMEOUT);
    let connection = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(connection);
    let served = tokio::select! {
        served = connection.as_mut() => served,
        _ = stop.cancelled() => {
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    };
    if let Err(e) = served {
        debug!(error = %e, "API connection ended");
    }
}

impl fmt::Display for ApiListeners {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unix:{}", self.unix.1 .0.display())?;
        if let Some(tcp) = &self.tcp {
            if let Ok(addr) = tcp.listener.local_addr() {
                let scheme = if tcp.tls.is_some() { "https" } else { "http" };
                write!(f, ", {scheme}://{addr}")?;
            }
        }
        Ok(())
    }
}

/// The NBD server's sockets: the data directory's Unix socket, and
/// optionally TCP.
pub struct NbdListeners {
    listeners: Vec<arbor_nbd::Listener>,
    socket_files: Vec<SocketFile>,
    /// The TCP listener's security, which a reload replaces.
    tcp_security: Option<Arc<arbor_nbd::LiveSecurity>>,
}

impl NbdListeners {
    /// Binds the Unix socket (the owner's alone: every volume, no TLS) and,
    /// if `tcp` is given, the TCP listener under `tcp_security`.
    pub async fn bind(
        socket: &Path,
        tcp: Option<SocketAddr>,
        tcp_security: arbor_nbd::Security,
    ) -> Result<Self> {
        let (listener, file) = bind_unix(socket, |p| arbor_nbd::Listener::bind_unix(p)).await?;
        let mut nbd = Self {
            listeners: vec![listener],
            socket_files: vec![file],
            tcp_security: None,
        };
        if let Some(addr) = tcp {
            let mode = tcp_security.mode();
            if mode == arbor_nbd::TlsMode::Off && !addr.ip().is_loopback() {
                // The configuration refuses this; say so if it ever changes.
                warn!(%addr, "NBD without TLS off loopback: any host that can reach this address can read and write");
            }
            let listener = arbor_nbd::Listener::bind_tcp(addr).await.with_context(|| {
                format!("cannot listen for NBD on {addr} (another daemon? set nbd_listen, or --nbd-listen none)")
            })?;
            info!(%addr, tls = ?mode, "NBD on TCP");
            let live = arbor_nbd::LiveSecurity::new(tcp_security);
            nbd.tcp_security = Some(Arc::clone(&live));
            nbd.listeners.push(listener.with_live_security(live));
        }
        Ok(nbd)
    }

    /// The TCP listener's security, which a reload replaces (none without
    /// a TCP listener).
    pub fn live_security(&self) -> Option<Arc<arbor_nbd::LiveSecurity>> {
        self.tcp_security.clone()
    }

    /// Serves `exports` until `stop`, then lets connections finish the
    /// requests they have in flight.
    pub async fn serve(
        self,
        exports: PoolExports,
        config: arbor_nbd::ServerConfig,
        stop: CancellationToken,
    ) -> Result<()> {
        arbor_nbd::serve(std::sync::Arc::new(exports), self.listeners, config, stop).await;
        drop(self.socket_files);
        Ok(())
    }
}

impl fmt::Display for NbdListeners {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let unix = self
            .socket_files
            .iter()
            .map(|s| format!("unix:{}", s.0.display()));
        let tcp = self
            .listeners
            .iter()
            .filter_map(arbor_nbd::Listener::tcp_addr);
        let all: Vec<String> = unix.chain(tcp.map(|a| format!("tcp:{a}"))).collect();
        f.write_str(&all.join(", "))
    }
}
/// Binds a Unix socket at `path` with `bind`, after clearing a stale one,
/// and restricts it to the owner. The returned guard removes the file.
async fn bind_unix<L>(
    path: &Path,
    bind: impl FnOnce(&Path) -> std::io::Result<L>,
) -> Result<(L, SocketFile)> {
    remove_stale_socket(path).await?;
    let listener = bind(path).with_context(|| format!("cannot listen on {}", path.display()))?;
    let file = SocketFile(path.to_owned());
    std::fs::set_permissions(path, Permissions::from_mode(0o600))
        .with_context(|| format!("cannot restrict permissions of {}", path.display()))?;
    Ok((listener, file))
}

/// Removes a socket left behind by a daemon that did not shut down cleanly,
/// but never a live one or anything that is not a socket.
async fn remove_stale_socket(path: &Path) -> Result<()> {
    let metadata = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("cannot stat {}", path.display())),
    };
    if !metadata.file_type().is_socket() {
        bail!("{} exists and is not a socket", path.display());
    }
    if UnixStream::connect(path).await.is_ok() {
        bail!("another process is already listening on {}", path.display());
    }
    std::fs::remove_file(path)
        .with_context(|| format!("cannot remove stale socket {}", path.display()))
}

/// A socket's path, removed when dropped.
pub struct SocketFile(PathBuf);

impl Drop for SocketFile {
    fn drop(&mut self) {
        // Nothing useful to do if it is already gone.
        let _ = std::fs::remove_file(&self.0);
    }
}
