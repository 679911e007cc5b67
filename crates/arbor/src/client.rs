//! [`Control`] through a running daemon: each call is one HTTP/1.1 request
//! to its API, on a Unix socket or a loopback TCP address.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::header::{CONTENT_TYPE, HOST};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpStream, UnixStream};
use tokio::runtime::Runtime;

use crate::control::Control;
use crate::model::{
    CheckView, CloneRequest, CreateVolumeRequest, ErrorBody, PoolView, Range, ReclaimView,
    RenameRequest, ResizeRequest, RollbackRequest, SnapshotRequest, StatsView, VolumeView,
};
use crate::size::ByteSize;

/// Where the daemon's API listens.
enum Endpoint {
    Unix(PathBuf),
    Tcp(SocketAddr),
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Unix(path) => write!(f, "{}", path.display()),
            Endpoint::Tcp(addr) => write!(f, "{addr}"),
        }
    }
}

pub struct DaemonClient {
    endpoint: Endpoint,
    runtime: Runtime,
}

impl DaemonClient {
    /// `address` is an `IP:PORT` the API listens on, or else the path of its
    /// Unix socket.
    pub fn new(address: &Path) -> Result<Self> {
        let endpoint = match address.to_str().and_then(|a| a.parse().ok()) {
            Some(addr) => Endpoint::Tcp(addr),
            None => Endpoint::Unix(address.to_owned()),
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .context("cannot start the I/O runtime")?;
        Ok(Self { endpoint, runtime })
    }

    fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        decode(&self.send(Method::GET, path, None)?)
    }

    fn post<T: DeserializeOwned>(&self, path: &str, body: &impl Serialize) -> Result<T> {
        let body = serde_json::to_vec(body).context("cannot encode the request")?;
        decode(&self.send(Method::POST, path, Some(body))?)
    }

    /// Sends one request; a non-2xx answer becomes an error carrying the
    /// daemon's message.
    fn send(&self, method: Method, path: &str, body: Option<Vec<u8>>) -> Result<Bytes> {
        let (status, bytes) = self
            .runtime
            .block_on(self.exchange(method, path, body))
            .with_context(|| {
                format!(
                    "cannot talk to the arbor daemon at {} (is `arbor serve` running?)",
                    self.endpoint
                )
            })?;
        if status.is_success() {
            return Ok(bytes);
        }
        match serde_json::from_slice::<ErrorBody>(&bytes) {
            Ok(error) => Err(anyhow!(error.message)),
            Err(_) => bail!(
                "the daemon answered {status}: {}",
                String::from_utf8_lossy(&bytes)
            ),
        }
    }

    async fn exchange(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(StatusCode, Bytes)> {
        let request = Request::builder()
            .method(method)
            .uri(path)
            .header(HOST, "arbor")
            .header(CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body.unwrap_or_default())))?;
        match &self.endpoint {
            Endpoint::Unix(socket) => send_over(UnixStream::connect(socket).await?, request).await,
            Endpoint::Tcp(addr) => send_over(TcpStream::connect(addr).await?, request).await,
        }
    }
}

/// One request on a fresh connection.
async fn send_over<S>(stream: S, request: Request<Full<Bytes>>) -> Result<(StatusCode, Bytes)>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    // Drives the connection until the response has been read.
    let driver = tokio::spawn(connection);
    let response = sender.send_request(request).await?;
    let status = response.status();
    let bytes = response.into_body().collect().await?.to_bytes();
    drop(sender);
    driver.await??;
    Ok((status, bytes))
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

impl Control for DaemonClient {
    fn pool_info(&self) -> Result<PoolView> {
        self.get("/v1/pool")
    }

    fn list(&self) -> Result<Vec<VolumeView>> {
        self.get("/v1/volumes")
    }

    fn create_volume(&self, name: &str, size: u64) -> Result<VolumeView> {
        let request = CreateVolumeRequest {
            name: name.to_owned(),
            size: ByteSize(size),
        };
        self.post("/v1/volumes", &request)
    }

    fn snapshot(&self, name: &str) -> Result<VolumeView> {
        let request = SnapshotRequest {
            name: name.to_owned(),
        };
        self.post("/v1/snapshots", &request)
    }

    fn clone_snapshot(&self, snapshot: &str, name: &str) -> Result<VolumeView> {
        let request = CloneRequest {
            snapshot: snapshot.to_owned(),
            name: name.to_owned(),
        };
        self.post("/v1/clones", &request)
    }

    fn delete(&self, name: &str) -> Result<()> {
        self.send(Method::DELETE, &volume_path(name), None)
            .map(drop)
    }

    fn rollback(&self, volume: &str, snapshot: &str) -> Result<VolumeView> {
        let request = RollbackRequest {
            snapshot: snapshot.to_owned(),
        };
        self.post(&format!("{}/rollback", volume_path(volume)), &request)
    }

    fn resize(&self, name: &str, size: u64) -> Result<VolumeView> {
        let request = ResizeRequest {
            size: ByteSize(size),
        };
        self.post(&format!("{}/resize", volume_path(name)), &request)
    }

    fn rename(&self, from: &str, to: &str) -> Result<VolumeView> {
        let request = RenameRequest { to: to.to_owned() };
        self.post(&format!("{}/rename", volume_path(from)), &request)
    }

    fn stats(&self, name: &str) -> Result<StatsView> {
        self.get(&format!("{}/stats", volume_path(name)))
    }

    fn diff(&self, a: &str, b: &str) -> Result<Vec<Range>> {
        self.get(&format!("/v1/diff?a={}&b={}", encode(a), encode(b)))
    }

    fn check(&self) -> Result<CheckView> {
        decode(&self.send(Method::POST, "/v1/check", None)?)
    }

    fn reclaim(&self) -> Result<ReclaimView> {
        decode(&self.send(Method::POST, "/v1/reclaim", None)?)
    }

    fn flush(&self) -> Result<()> {
        self.send(Method::POST, "/v1/flush", None).map(drop)
    }
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
