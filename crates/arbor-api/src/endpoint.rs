//! Where the CLI finds the daemon's API, and with which credentials: the
//! data directory's Unix socket (trusted, no credentials), or `--api URL`
//! over TCP with a bearer token and, for `https://`, TLS verified against
//! `--tls-ca` and an optional client certificate (docs/CLI.md).

use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use hyper::header::{AUTHORIZATION, HOST, WWW_AUTHENTICATE};
use hyper::{HeaderMap, Method, Request, Uri};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpStream, UnixStream};
use tokio_rustls::TlsConnector;
use tracing::warn;

use crate::error::ClientError;
use crate::error_code::ErrorCode;

/// The API's TCP port when a URL names none.
pub const DEFAULT_PORT: u16 = 10810;
/// Connecting, and the TLS handshake, must be done within this time.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest token file read: a token is 87 bytes.
const MAX_TOKEN_FILE: u64 = 4096;

/// The command line's say on where the daemon is (`--api` and its
/// credentials); without `api`, the data directory's socket.
#[derive(Debug, Clone, Default)]
pub struct Remote {
    pub api: Option<String>,
    pub token_file: Option<PathBuf>,
    pub tls_ca: Option<PathBuf>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
}

/// A connection to the daemon, whichever way it goes.
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

#[derive(Clone)]
pub enum Endpoint {
    Unix { data_dir: PathBuf, socket: PathBuf },
    Tcp(Tcp),
}

#[derive(Clone)]
pub struct Tcp {
    /// As given, for messages.
    url: String,
    /// Host name or address (IPv6 without brackets), and port.
    host: String,
    port: u16,
    /// The `Host` header: `host:port`.
    authority: String,
    tls: Option<TlsConnector>,
    token: Option<String>,
}

fn usage(message: String) -> anyhow::Error {
    ClientError::Invalid(message).into()
}

/// An API URL: `https://` or `http://`, a host (a DNS name, an IPv4
/// address, or an IPv6 address in brackets), an optional port; no path
/// but `/`, no query, no user. Returns (https, host without brackets,
/// port).
pub fn parse_url(text: &str) -> Result<(bool, String, u16)> {
    let bad = |why: &str| {
        usage(format!(
            "--api {text:?}: {why} (expected https://HOST[:PORT], or http://127.0.0.1[:PORT] on \
             this host)"
        ))
    };
    let uri: Uri = text.parse().map_err(|_| bad("not a URL"))?;
    let https = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        _ => return Err(bad("the scheme must be https or http")),
    };
    let authority = uri.authority().ok_or_else(|| bad("no host"))?;
    if authority.as_str().contains('@') {
        return Err(bad("no user name or password in the URL"));
    }
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
        return Err(bad("no path or query: the commands add their own"));
    }
    let host = authority.host();
    // What follows the host: nothing, or `:PORT`.
    let port = match authority.as_str().get(host.len()..) {
        None | Some("") => DEFAULT_PORT,
        Some(rest) => rest
            .strip_prefix(':')
            .and_then(|p| p.parse::<u16>().ok())
            .ok_or_else(|| bad("the port must be a number from 0 to 65535"))?,
    };
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if host.is_empty() {
        return Err(bad("no host"));
    }
    Ok((https, host.to_owned(), port))
}

fn is_loopback(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The token in `path`: one line, as `arbor token create` prints it.
fn read_token_file(path: &Path) -> Result<String> {
    let bytes = arbor_io::small_file::read_bounded(path, MAX_TOKEN_FILE)
        .with_context(|| format!("cannot read the token file {}", path.display()))?
        .ok_or_else(|| ClientError::NotFound(format!("token file {} not found", path.display())))?;
    if let Ok(meta) = std::fs::metadata(path) {
        if meta.permissions().mode() & 0o077 != 0 {
            warn!(
                "the token file {} can be read by other users: chmod 600 it",
                path.display()
            );
        }
    }
    let text = String::from_utf8(bytes).unwrap_or_default();
    checked_token(text.trim(), &format!("the token file {}", path.display()))
}

fn checked_token(token: &str, origin: &str) -> Result<String> {
    if crate::token::well_formed(token) {
        Ok(token.to_owned())
    } else {
        Err(usage(format!(
            "{origin} does not hold an arbor token (one line arbor_ID_SECRET, as `arbor token \
             create` prints it)"
        )))
    }
}

impl Endpoint {
    /// The daemon `remote` names, or the one serving `data_dir`.
    pub fn new(data_dir: &Path, remote: &Remote) -> Result<Self> {
        let Some(url) = &remote.api else {
            return Ok(Endpoint::Unix {
                data_dir: data_dir.to_owned(),
                socket: data_dir.join("api.sock"),
            });
        };
        let (https, host, port) = parse_url(url)?;
        let token = match (&remote.token_file, std::env::var("ARBOR_TOKEN")) {
            (Some(path), _) => Some(read_token_file(path)?),
            (None, Ok(token)) if !token.trim().is_empty() => {
                Some(checked_token(token.trim(), "ARBOR_TOKEN")?)
            }
            _ => None,
        };
        let identity = match (&remote.tls_cert, &remote.tls_key) {
            (Some(cert), Some(key)) => Some((cert.clone(), key.clone())),
            (None, None) => None,
            _ => return Err(usage("--tls-cert and --tls-key go together".into())),
        };
        let tls = if https {
            let ca = remote.tls_ca.clone().ok_or_else(|| {
                usage(format!(
                    "--api {url} needs --tls-ca FILE (or ARBOR_TLS_CA): the CA bundle that \
                     signed the daemon's certificate (the daemon's tls_ca)"
                ))
            })?;
            let connector = arbor_tls::client_connector(&arbor_tls::ClientFiles { ca, identity })
                .map_err(|e| usage(e.to_string()))?;
            // Checked now, used at each connection.
            arbor_tls::server_name(&host).map_err(|e| usage(e.to_string()))?;
            Some(connector)
        } else {
            if !is_loopback(&host) {
                return Err(usage(format!(
                    "--api {url}: plain http only reaches a daemon on this host (loopback); \
                     use https:// with --tls-ca, so that the token and the data are encrypted"
                )));
            }
            if identity.is_some() {
                return Err(usage(
                    "--tls-cert and --tls-key need an https:// --api".into(),
                ));
            }
            None
        };
        let authority = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        Ok(Endpoint::Tcp(Tcp {
            url: url.clone(),
            host,
            port,
            authority,
            tls,
            token,
        }))
    }

    /// A new connection to the daemon.
    pub async fn connect(&self) -> Result<Box<dyn Io>> {
        match self {
            Endpoint::Unix { data_dir, socket } => {
                let stream = UnixStream::connect(socket)
                    .await
                    .map_err(|e| unix_connect_error(data_dir, socket, e))?;
                Ok(Box::new(stream))
            }
            Endpoint::Tcp(tcp) => tokio::time::timeout(CONNECT_TIMEOUT, tcp.connect())
                .await
                .map_err(|_| {
                    anyhow::anyhow!(
                        "no answer from {} within {} s",
                        tcp.url,
                        CONNECT_TIMEOUT.as_secs()
                    )
                })?,
        }
    }

    /// A request to `path` with the headers every request carries: `Host`,
    /// and over TCP the token.
    pub fn request(&self, method: Method, path: &str) -> hyper::http::request::Builder {
        let builder = Request::builder().method(method).uri(path);
        match self {
            Endpoint::Unix { .. } => builder.header(HOST, "arbor"),
            Endpoint::Tcp(tcp) => {
                let builder = builder.header(HOST, &tcp.authority);
                match &tcp.token {
                    Some(token) => builder.header(AUTHORIZATION, format!("Bearer {token}")),
                    None => builder,
                }
            }
        }
    }

    /// The message for an API error, with what to do about refused
    /// credentials.
    pub fn explain(&self, code: ErrorCode, headers: &HeaderMap, message: String) -> String {
        let Endpoint::Tcp(tcp) = self else {
            return message;
        };
        let challenge = headers
            .get(WWW_AUTHENTICATE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        match code {
            ErrorCode::Unauthorized if tcp.token.is_none() => format!(
                "the daemon at {} needs credentials: pass a token with --token-file FILE (or \
                 ARBOR_TOKEN_FILE, or ARBOR_TOKEN), made with `arbor token create NAME --scope \
                 read|admin` on the daemon's host, or a client certificate listed in its \
                 api_clients with --tls-cert and --tls-key",
                tcp.url
            ),
            ErrorCode::Unauthorized => format!(
                "{message}. Pass a valid token with --token-file FILE (or ARBOR_TOKEN_FILE, or \
                 ARBOR_TOKEN): `arbor token create NAME --scope read|admin` on the daemon's host \
                 makes one"
            ),
            ErrorCode::Forbidden if challenge.contains("insufficient_scope") => format!(
                "{message}. Use an admin token (`arbor token create NAME --scope admin` on the \
                 daemon's host), or run the command there"
            ),
            _ => message,
        }
    }
}

impl Tcp {
    async fn connect(&self) -> Result<Box<dyn Io>> {
        let stream = TcpStream::connect((self.host.as_str(), self.port))
            .await
            .map_err(|e| {
                if e.kind() == std::io::ErrorKind::ConnectionRefused {
                    ClientError::DaemonNotRunning(format!(
                        "nothing answers at {} (connection refused): is `arbor serve` \
                         running there, with api_listen on that address?",
                        self.url
                    ))
                    .into()
                } else {
                    anyhow::Error::new(e).context(format!(
                        "cannot connect to the arbor daemon at {}",
                        self.url
                    ))
                }
            })?;
        let _ = stream.set_nodelay(true);
        let Some(connector) = &self.tls else {
            return Ok(Box::new(stream));
        };
        let name = arbor_tls::server_name(&self.host)?;
        let tls = connector.connect(name, stream).await.map_err(|e| {
            anyhow::anyhow!(
                "TLS with {} failed: {e}. Check that --tls-ca is the CA that signed the \
                     daemon's certificate, that {} is one of the certificate's names, and that \
                     the daemon serves HTTPS (it does when tls_ca, tls_cert and tls_key are set)",
                self.url,
                self.host
            )
        })?;
        Ok(Box::new(tls))
    }
}

fn unix_connect_error(data_dir: &Path, socket: &Path, err: std::io::Error) -> anyhow::Error {
    let dir = data_dir.display();
    match err.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => {
            ClientError::DaemonNotRunning(format!(
                "no arbor daemon is running for data directory {dir} (nothing listens on {}); \
                 start one with `arbor serve --data-dir {dir}`, or point --data-dir or \
                 ARBOR_DATA_DIR at the running one, or --api at a daemon over TCP",
                socket.display()
            ))
            .into()
        }
        _ => anyhow::Error::new(err).context(format!(
            "cannot connect to the arbor daemon at {}",
            socket.display()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let ok = |text: &str| parse_url(text).unwrap();
        assert_eq!(
            ok("https://arbor.example"),
            (true, "arbor.example".into(), 10810)
        );
        assert_eq!(
            ok("https://arbor.example:443/"),
            (true, "arbor.example".into(), 443)
        );
        assert_eq!(
            ok("http://127.0.0.1:18810"),
            (false, "127.0.0.1".into(), 18810)
        );
        assert_eq!(ok("https://[::1]:7"), (true, "::1".into(), 7));
        for bad in [
            "arbor.example",
            "ftp://arbor.example",
            "https://",
            "https://user:pw@arbor.example",
            "https://arbor.example/v1",
            "https://arbor.example/?x=1",
            "https://arbor.example:99999",
            "not a url",
        ] {
            let err = parse_url(bad).unwrap_err();
            assert!(
                matches!(err.downcast_ref(), Some(ClientError::Invalid(_))),
                "{bad}"
            );
            assert!(err.to_string().contains("--api"), "{bad}: {err}");
        }
    }

    #[test]
    fn plain_http_only_on_loopback_and_https_needs_a_ca() {
        let remote = |api: &str| Remote {
            api: Some(api.to_owned()),
            ..Remote::default()
        };
        let dir = Path::new("/nonexistent");
        for ok in ["http://127.0.0.1:1", "http://localhost", "http://[::1]:1"] {
            assert!(Endpoint::new(dir, &remote(ok)).is_ok(), "{ok}");
        }
        let err = Endpoint::new(dir, &remote("http://10.0.0.1"))
            .err()
            .unwrap();
        assert!(err.to_string().contains("use https://"), "{err}");
        let err = Endpoint::new(dir, &remote("https://10.0.0.1"))
            .err()
            .unwrap();
        assert!(err.to_string().contains("--tls-ca"), "{err}");
        let only_cert = Remote {
            tls_cert: Some("c.pem".into()),
            ..remote("http://127.0.0.1")
        };
        let err = Endpoint::new(dir, &only_cert).err().unwrap();
        assert!(err.to_string().contains("go together"), "{err}");
    }

    #[test]
    fn token_files_hold_one_token() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        let token = format!("arbor_{}_{}", "a".repeat(16), "b".repeat(64));
        std::fs::write(&path, format!("{token}\n")).unwrap();
        assert_eq!(read_token_file(&path).unwrap(), token);
        std::fs::write(&path, "password123\n").unwrap();
        let err = read_token_file(&path).unwrap_err();
        assert!(
            err.to_string().contains("does not hold an arbor token"),
            "{err}"
        );
        std::fs::write(&path, vec![b'a'; 5000]).unwrap();
        assert!(read_token_file(&path).is_err());
        let err = read_token_file(&dir.path().join("missing")).unwrap_err();
        assert!(
            matches!(err.downcast_ref(), Some(ClientError::NotFound(_))),
            "{err}"
        );
    }
}
