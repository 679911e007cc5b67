//! The daemon's sockets: the control API and NBD, each on a Unix socket in
//! the data directory and optionally on TCP (loopback only for the API).
//!
//! Neither protocol authenticates clients, so Unix sockets are made
//! owner-only, and the API (which can delete volumes) never listens beyond
//! this machine.

use std::fmt;
use std::fs::Permissions;
use std::io::ErrorKind;
use std::net::SocketAddr;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use axum::Router;
use tokio::net::{TcpListener, UnixListener, UnixStream};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::nbd_export::PoolExports;

/// The control API's sockets: the data directory's Unix socket, and
/// optionally a loopback TCP address.
pub struct ApiListeners {
    unix: (UnixListener, SocketFile),
    tcp: Option<TcpListener>,
}

impl ApiListeners {
    pub async fn bind(socket: &Path, tcp: Option<SocketAddr>) -> Result<Self> {
        let unix = bind_unix(socket, |p| UnixListener::bind(p)).await?;
        let tcp = match tcp {
            Some(addr) => {
                // The config check already refused this; the API can destroy
                // volumes, so make sure twice.
                if !addr.ip().is_loopback() {
                    bail!("refusing to serve the API on {addr}: it has no authentication");
                }
                let listener = TcpListener::bind(addr).await.with_context(|| {
                    format!("cannot listen for the API on {addr} (another daemon? set api_listen, or --api-listen none)")
                })?;
                Some(listener)
            }
            None => None,
        };
        Ok(Self { unix, tcp })
    }

    /// Serves `router` until `stop`, then waits for in-flight requests.
    pub async fn serve(self, router: Router, stop: CancellationToken) -> Result<()> {
        let (unix, _socket_file) = self.unix;
        let on_unix = axum::serve(unix, router.clone())
            .with_graceful_shutdown(stop.clone().cancelled_owned());
        match self.tcp {
            Some(tcp) => {
                let on_tcp =
                    axum::serve(tcp, router).with_graceful_shutdown(stop.cancelled_owned());
                let (a, b) = tokio::join!(on_unix, on_tcp);
                a.and(b).context("API server failed")
            }
            None => on_unix.await.context("API server failed"),
        }
    }
}

impl fmt::Display for ApiListeners {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unix:{}", self.unix.1 .0.display())?;
        if let Some(addr) = self.tcp.as_ref().and_then(|l| l.local_addr().ok()) {
            write!(f, ", http://{addr}")?;
        }
        Ok(())
    }
}

/// The NBD server's sockets: the data directory's Unix socket, and
/// optionally TCP.
pub struct NbdListeners {
    listeners: Vec<arbor_nbd::Listener>,
    socket_files: Vec<SocketFile>,
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
            nbd.listeners.push(listener.with_security(tcp_security));
        }
        Ok(nbd)
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
