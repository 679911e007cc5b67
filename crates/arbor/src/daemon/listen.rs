//! The daemon's sockets: the control API, on a Unix socket or a loopback
//! TCP address, and NBD, on a Unix socket and/or TCP.
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
use tracing::warn;

use crate::nbd_export::PoolExports;

/// Where the control API listens.
#[derive(Debug, Clone)]
pub enum ApiAddress {
    Unix(PathBuf),
    Tcp(SocketAddr),
}

pub enum ApiListener {
    Unix(UnixListener, SocketFile),
    Tcp(TcpListener),
}

impl ApiListener {
    pub async fn bind(address: &ApiAddress) -> Result<Self> {
        match address {
            ApiAddress::Unix(path) => {
                let (listener, file) = bind_unix(path, |p| UnixListener::bind(p)).await?;
                Ok(ApiListener::Unix(listener, file))
            }
            ApiAddress::Tcp(addr) => {
                if !addr.ip().is_loopback() {
                    bail!("refusing to serve the API on {addr}: it has no authentication, use a loopback address or --api-socket");
                }
                let listener = TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("cannot listen on {addr}"))?;
                Ok(ApiListener::Tcp(listener))
            }
        }
    }

    /// Serves `router` until `stop`, then waits for in-flight requests.
    pub async fn serve(self, router: Router, stop: CancellationToken) -> Result<()> {
        let shutdown = stop.cancelled_owned();
        match self {
            ApiListener::Unix(listener, _socket_file) => axum::serve(listener, router)
                .with_graceful_shutdown(shutdown)
                .await
                .context("API server failed"),
            ApiListener::Tcp(listener) => axum::serve(listener, router)
                .with_graceful_shutdown(shutdown)
                .await
                .context("API server failed"),
        }
    }
}

impl fmt::Display for ApiListener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ApiListener::Unix(_, file) => write!(f, "unix:{}", file.0.display()),
            ApiListener::Tcp(listener) => match listener.local_addr() {
                Ok(addr) => write!(f, "http://{addr}"),
                Err(_) => f.write_str("tcp"),
            },
        }
    }
}

/// The NBD server's sockets.
pub struct NbdListeners {
    listeners: Vec<arbor_nbd::Listener>,
    socket_files: Vec<SocketFile>,
}

impl NbdListeners {
    /// Binds the sockets asked for; `None` when NBD is not wanted.
    pub async fn bind(socket: Option<&Path>, tcp: Option<SocketAddr>) -> Result<Option<Self>> {
        let mut nbd = Self {
            listeners: Vec::new(),
            socket_files: Vec::new(),
        };
        if let Some(path) = socket {
            let (listener, file) = bind_unix(path, |p| arbor_nbd::Listener::bind_unix(p)).await?;
            nbd.listeners.push(listener);
            nbd.socket_files.push(file);
        }
        if let Some(addr) = tcp {
            if !addr.ip().is_loopback() {
                // Serving block devices to other hosts is a legitimate choice,
                // but whoever can connect can read and write every volume.
                warn!(%addr, "NBD has no authentication: any host that can reach this address can read and write every volume");
            }
            let listener = arbor_nbd::Listener::bind_tcp(addr)
                .await
                .with_context(|| format!("cannot listen for NBD on {addr}"))?;
            nbd.listeners.push(listener);
        }
        Ok((!nbd.listeners.is_empty()).then_some(nbd))
    }

    /// Serves `exports` until `stop`, then lets connections finish the
    /// requests they have in flight.
    pub async fn serve(self, exports: PoolExports, stop: CancellationToken) -> Result<()> {
        let config = arbor_nbd::ServerConfig::default();
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
