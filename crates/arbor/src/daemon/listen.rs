//! Where the API listens: a Unix socket (access controlled by file
//! permissions) or a loopback TCP address. The API has no authentication of
//! its own, so it is never offered beyond this machine.

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

pub enum ApiListener {
    Unix(UnixListener, SocketFile),
    Tcp(TcpListener),
}

impl ApiListener {
    /// Binds exactly one of a Unix socket path or a loopback TCP address.
    pub async fn bind(socket: Option<&Path>, tcp: Option<SocketAddr>) -> Result<Self> {
        match (socket, tcp) {
            (Some(path), None) => bind_unix(path).await,
            (None, Some(addr)) => bind_tcp(addr).await,
            _ => bail!("give exactly one of --api-socket or --api"),
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

async fn bind_tcp(addr: SocketAddr) -> Result<ApiListener> {
    if !addr.ip().is_loopback() {
        bail!("refusing to serve the API on {addr}: it has no authentication, use a loopback address or --api-socket");
    }
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    Ok(ApiListener::Tcp(listener))
}

async fn bind_unix(path: &Path) -> Result<ApiListener> {
    remove_stale_socket(path).await?;
    let listener =
        UnixListener::bind(path).with_context(|| format!("cannot listen on {}", path.display()))?;
    let file = SocketFile(path.to_owned());
    // Whoever can connect can delete volumes: owner only.
    std::fs::set_permissions(path, Permissions::from_mode(0o600))
        .with_context(|| format!("cannot restrict permissions of {}", path.display()))?;
    Ok(ApiListener::Unix(listener, file))
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

/// The socket's path, removed when the listener is dropped.
pub struct SocketFile(PathBuf);

impl Drop for SocketFile {
    fn drop(&mut self) {
        // Nothing useful to do if it is already gone.
        let _ = std::fs::remove_file(&self.0);
    }
}
