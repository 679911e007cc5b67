//! Who may use the API (docs/SECURITY.md): the Unix socket trusts its
//! owner; on TCP every request but the dashboard's static page needs a
//! bearer token or a client certificate listed in `api_clients`, whose
//! scope (`read`: GET and HEAD; `admin`: everything) must cover it.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, RwLock};

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tracing::{info, warn};

use super::api_error::ApiError;
use crate::config::ApiConfig;
use crate::tokens::{Rejected, TokenStore};
use arbor_api::error_code::ErrorCode;
use arbor_api::model::{CallerView, Scope};

/// How a request reached the daemon, set by the listener that accepted
/// it. A request without one is treated as an anonymous TCP client.
#[derive(Debug, Clone)]
pub enum Peer {
    /// `DATA_DIR/api.sock`: the daemon's user (mode 0600), fully trusted.
    Local,
    /// The TCP listener, with the verified identity of the client
    /// certificate, if the client presented one.
    Tcp {
        remote: SocketAddr,
        certificate: Option<String>,
    },
}

/// Who a request authenticated as, for handlers and logs.
#[derive(Debug, Clone)]
pub struct Caller {
    /// `local`, `token NAME` or `certificate IDENTITY`.
    pub who: String,
    pub scope: Scope,
}

impl Caller {
    /// As `GET /v1/whoami` shows it.
    pub fn view(&self) -> CallerView {
        CallerView {
            who: self.who.clone(),
            scope: self.scope,
        }
    }
}

/// The API's credentials: the token store and the certificate identities
/// (`api_clients`, replaced by a reload: each request looks them up).
pub struct Auth {
    pub tokens: TokenStore,
    clients: RwLock<HashMap<String, Scope>>,
}

impl Auth {
    pub fn open(data_dir: &Path, config: &ApiConfig) -> anyhow::Result<Arc<Self>> {
        Ok(Arc::new(Self {
            tokens: TokenStore::open(&data_dir.join("tokens.json"))?,
            clients: RwLock::new(config.clients.iter().cloned().collect()),
        }))
    }

    /// Puts `clients` in force (a reload): the next request of each
    /// connection is checked against them.
    pub fn set_clients(&self, clients: &[(String, Scope)]) {
        *self.clients.write().unwrap_or_else(|p| p.into_inner()) =
            clients.iter().cloned().collect();
    }

    /// The scope of certificate identity `identity`, if `api_clients`
    /// lists it.
    fn client_scope(&self, identity: &str) -> Option<Scope> {
        // A poisoned lock still holds a whole map: it is replaced whole.
        self.clients
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(identity)
            .copied()
    }
}

/// The scope a request needs; `None`: none (the dashboard's page, which
/// is static: its data comes through the authenticated endpoints).
pub fn required_scope(method: &Method, path: &str) -> Option<Scope> {
    let reads = *method == Method::GET || *method == Method::HEAD;
    if reads && (path == "/" || path == "/ui") {
        return None;
    }
    // Token management is for admins only, listing included.
    if path == "/v1/tokens" || path.starts_with("/v1/tokens/") {
        return Some(Scope::Admin);
    }
    Some(if reads { Scope::Read } else { Scope::Admin })
}

/// Requests the Unix socket alone may make, whatever the credentials:
/// attaching a device (an admin token would otherwise reach every disk the
/// daemon's user can open).
pub fn local_only(method: &Method, path: &str) -> bool {
    *method == Method::POST && path == "/v1/origins"
}

/// Whether credentials of `scope` cover a request that needs `needed`.
pub fn covers(scope: Scope, needed: Scope) -> bool {
    scope == Scope::Admin || needed == Scope::Read
}

/// The middleware: identifies the caller, checks its scope, and passes the
/// request on with a [`Caller`] in its extensions.
pub async fn authenticate(
    State(auth): State<Arc<Auth>>,
    mut request: Request,
    next: Next,
) -> Response {
    let peer = request.extensions().get::<Peer>().cloned();
    if !matches!(peer, Some(Peer::Local)) && local_only(request.method(), request.uri().path()) {
        warn!(method = %request.method(), path = request.uri().path(), "API request refused: only on the Unix socket");
        return ApiError::new(
            ErrorCode::Forbidden,
            "attaching a device is done only through the daemon's Unix socket \
             (DATA_DIR/api.sock, its owner): a network credential must not be able to \
             serve any disk the daemon can open"
                .to_owned(),
        )
        .into_response();
    }
    let needed = required_scope(request.method(), request.uri().path());
    let caller = match (&peer, needed) {
        (Some(Peer::Local), _) => Caller {
            who: "local".into(),
            scope: Scope::Admin,
        },
        (_, None) => return next.run(request).await,
        (_, Some(needed)) => {
            let remote = match &peer {
                Some(Peer::Tcp { remote, .. }) => remote.to_string(),
                _ => "an unknown peer".into(),
            };
            let certificate = match &peer {
                Some(Peer::Tcp { certificate, .. }) => certificate.as_deref(),
                _ => None,
            };
            let caller = match identify(&auth, request.headers(), certificate) {
                Ok(caller) => caller,
                Err(refusal) => {
                    warn!(%remote, method = %request.method(), path = request.uri().path(), reason = %refusal.message, "API request refused");
                    return refusal.into_response();
                }
            };
            if !covers(caller.scope, needed) {
                let message = format!(
                    "{} has the read scope: it may only read (GET); {} {} needs an admin token \
                     or certificate",
                    caller.who,
                    request.method(),
                    request.uri().path()
                );
                warn!(%remote, caller = %caller.who, method = %request.method(), path = request.uri().path(), "API request refused: read scope");
                let mut response = ApiError::new(ErrorCode::Forbidden, message).into_response();
                response.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static(
                        "Bearer realm=\"arbor\", error=\"insufficient_scope\", scope=\"admin\"",
                    ),
                );
                return response;
            }
            if needed == Scope::Admin {
                // An audit trail of what changed, and by whom.
                info!(%remote, caller = %caller.who, method = %request.method(), path = request.uri().path(), "API request");
            }
            caller
        }
    };
    request.extensions_mut().insert(caller);
    next.run(request).await
}

/// A refused request: 401 (with the `WWW-Authenticate` challenge) or 403.
struct Refusal {
    code: ErrorCode,
    message: String,
    /// RFC 6750's `error` attribute of the challenge, if any.
    error: Option<&'static str>,
}

impl Refusal {
    fn unauthorized(message: impl Into<String>, error: Option<&'static str>) -> Self {
        Self {
            code: ErrorCode::Unauthorized,
            message: message.into(),
            error,
        }
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let challenge = match (self.code, self.error) {
            (ErrorCode::Unauthorized, Some(error)) => {
                Some(format!("Bearer realm=\"arbor\", error=\"{error}\""))
            }
            (ErrorCode::Unauthorized, None) => Some("Bearer realm=\"arbor\"".to_owned()),
            _ => None,
        };
        let mut response = ApiError::new(self.code, self.message).into_response();
        if let Some(value) = challenge.and_then(|c| HeaderValue::from_str(&c).ok()) {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, value);
        }
        response
    }
}

const HOW: &str = "send `Authorization: Bearer TOKEN` (make one with `arbor token create NAME \
                   --scope read|admin` on the daemon's host) or a client certificate listed in \
                   api_clients";

/// The caller a TCP request's credentials name: its token if it carries
/// one (a token that fails is refused, never passed over for the
/// certificate), else its certificate.
fn identify(
    auth: &Arc<Auth>,
    headers: &axum::http::HeaderMap,
    certificate: Option<&str>,
) -> Result<Caller, Refusal> {
    if let Some(value) = headers.get(header::AUTHORIZATION) {
        let token = value
            .to_str()
            .ok()
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token.trim())
            .ok_or_else(|| {
                Refusal::unauthorized(
                    "the Authorization header must be `Bearer TOKEN`",
                    Some("invalid_request"),
                )
            })?;
        let now = super::monitor::unix_now();
        let verified = auth.tokens.verify(token, now).map_err(|rejected| {
            let message = match rejected {
                Rejected::Malformed => {
                    "not an arbor token (they look like arbor_ID_SECRET)".to_owned()
                }
                Rejected::Unknown => {
                    "unknown or revoked token (`arbor token list` on the daemon's host shows \
                     the tokens)"
                        .to_owned()
                }
                Rejected::Expired(name) => format!(
                    "token {name} has expired: make a new one with `arbor token create` on the \
                     daemon's host"
                ),
            };
            Refusal::unauthorized(message, Some("invalid_token"))
        })?;
        if verified.save_due {
            let auth = Arc::clone(auth);
            // Off the async workers; a failure only loses a last-use time.
            tokio::task::spawn_blocking(move || {
                if let Err(e) = auth.tokens.save(now) {
                    warn!(error = %e, "cannot save the API tokens' last use");
                }
            });
        }
        return Ok(Caller {
            who: format!("token {}", verified.name),
            scope: verified.scope,
        });
    }
    if let Some(identity) = certificate {
        return match auth.client_scope(identity) {
            Some(scope) => Ok(Caller {
                who: format!("certificate {identity}"),
                scope,
            }),
            None => Err(Refusal {
                code: ErrorCode::Forbidden,
                message: format!(
                    "the client certificate {identity:?} is not listed in the daemon's \
                     api_clients; add it there (with a scope), or use a token"
                ),
                error: None,
            }),
        };
    }
    Err(Refusal::unauthorized(
        format!("this API needs credentials over TCP: {HOW}"),
        None,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_per_method_and_path() {
        let admin = Some(Scope::Admin);
        let read = Some(Scope::Read);
        let cases = [
            (Method::GET, "/", None),
            (Method::HEAD, "/ui", None),
            (Method::POST, "/", admin),
            (Method::GET, "/metrics", read),
            (Method::GET, "/v1/overview", read),
            (Method::HEAD, "/v1/volumes", read),
            (Method::GET, "/v1/send", read),
            (Method::POST, "/v1/volumes", admin),
            (Method::DELETE, "/v1/volumes/disk0", admin),
            (Method::PUT, "/v1/policies/disk0", admin),
            (Method::PATCH, "/v1/volumes", admin),
            (Method::OPTIONS, "/v1/volumes", admin),
            (Method::GET, "/v1/tokens", admin),
            (Method::DELETE, "/v1/tokens/ci", admin),
            (Method::GET, "/v1/tokensx", read),
            (Method::GET, "/uix", read),
        ];
        for (method, path, want) in cases {
            assert_eq!(required_scope(&method, path), want, "{method} {path}");
        }
        assert!(covers(Scope::Admin, Scope::Admin));
        assert!(covers(Scope::Admin, Scope::Read));
        assert!(covers(Scope::Read, Scope::Read));
        assert!(!covers(Scope::Read, Scope::Admin));
    }
}
