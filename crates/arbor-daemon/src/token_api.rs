//! `/v1/tokens`: API tokens, managed over the Unix socket or with admin
//! credentials (the routes are in `api.rs`, the rule in `auth.rs`).

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use tracing::info;

use super::api_error::{ApiError, ApiResult};
use super::auth::{Auth, Caller};
use super::monitor::unix_now;
use crate::error::DaemonError;
use crate::tokens::TokenError;
use arbor_api::model::{CreatedTokenView, TokenRequest, TokenView};

/// Runs a token store change off the async workers (it writes the file).
async fn blocking<T: Send + 'static>(
    auth: Arc<Auth>,
    change: impl FnOnce(&Auth) -> Result<T, TokenError> + Send + 'static,
) -> ApiResult<T> {
    tokio::task::spawn_blocking(move || change(&auth))
        .await
        .map_err(|e| ApiError::from(DaemonError::internal(e).context("token task failed")))?
        .map_err(ApiError::from)
}

/// Who made a change, for the log.
fn who(caller: Option<Extension<Caller>>) -> String {
    caller.map_or_else(|| "local".to_owned(), |Extension(c)| c.who)
}

pub async fn list(State(auth): State<Arc<Auth>>) -> Json<Vec<TokenView>> {
    Json(auth.tokens.list(unix_now()))
}

pub async fn create(
    State(auth): State<Arc<Auth>>,
    caller: Option<Extension<Caller>>,
    Json(req): Json<TokenRequest>,
) -> ApiResult<Response> {
    let now = unix_now();
    let (token, secret) = blocking(auth, move |a| {
        a.tokens
            .create(&req.name, req.scope, req.expires_in_secs, now)
    })
    .await?;
    let by = who(caller);
    info!(token = %token.name, id = %token.id, scope = token.scope.name(), by = %by, "API token created");
    let body = CreatedTokenView { token, secret };
    // The secret is in the body: no cache may keep it.
    Ok((
        StatusCode::CREATED,
        [(header::CACHE_CONTROL, "no-store")],
        Json(body),
    )
        .into_response())
}

pub async fn revoke(
    State(auth): State<Arc<Auth>>,
    caller: Option<Extension<Caller>>,
    Path(name): Path<String>,
) -> ApiResult<StatusCode> {
    let now = unix_now();
    let token = blocking(auth, move |a| a.tokens.revoke(&name, now)).await?;
    let by = who(caller);
    info!(token = %token.name, id = %token.id, by = %by, "API token revoked");
    Ok(StatusCode::NO_CONTENT)
}
