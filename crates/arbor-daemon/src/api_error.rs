//! The API's error responses and the one place that gives each failure
//! its [`ErrorCode`], by matching on its type: the daemon's errors
//! ([`DaemonError`], engine errors among them), a replication cycle's
//! failure, a send's or receive's, a token store's.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use tracing::error;

use arbor_api::error_code::ErrorCode;
use arbor_api::model::ErrorBody;
use arbor_replica::state::StateError;

use arbor_stream::StreamFailure;

use crate::error::DaemonError;
use crate::replication::{CycleFailure, ErrorKind};
use crate::tokens::TokenError;

/// The code of a daemon error: its kind under its contexts.
pub fn code_of(err: &DaemonError) -> ErrorCode {
    match err.root() {
        DaemonError::Invalid(_) => ErrorCode::InvalidArgument,
        DaemonError::NotFound(_) => ErrorCode::NotFound,
        DaemonError::Busy(_) => ErrorCode::Busy,
        // A pool held elsewhere is no request's fault.
        DaemonError::PoolInUse(_) => ErrorCode::Internal,
        DaemonError::ReadOnly(_) => ErrorCode::ReadOnly,
        DaemonError::BadStream(_) => ErrorCode::BadStream,
        DaemonError::Engine(e) => code_of_engine(e),
        DaemonError::Replica(StateError::NotFound(_)) => ErrorCode::NotFound,
        DaemonError::Replica(StateError::Invalid(_)) => ErrorCode::InvalidArgument,
        DaemonError::Replica(_) | DaemonError::Internal(_) | DaemonError::Context { .. } => {
            ErrorCode::Internal
        }
    }
}

/// The code of an engine error: the one place that classifies them.
pub fn code_of_engine(err: &arbor_engine::Error) -> ErrorCode {
    use arbor_engine::{Error, Fault, Refusal, Resource};
    match err {
        Error::Stop(fault) => match fault {
            Fault::Io(_) => ErrorCode::Io,
            Fault::Corrupt { .. } | Fault::Inconsistent(_) | Fault::NotAPool => ErrorCode::Corrupt,
            Fault::Failed(_) => ErrorCode::PoolFailed,
        },
        Error::Refused(refusal) => match refusal {
            Refusal::NotFound(_) => ErrorCode::NotFound,
            Refusal::AlreadyExists(_) => ErrorCode::AlreadyExists,
            Refusal::ReadOnly(_) => ErrorCode::ReadOnly,
            Refusal::InvalidName { .. } => ErrorCode::InvalidName,
            Refusal::Invalid(_) => ErrorCode::InvalidArgument,
            Refusal::Conflict(_) => ErrorCode::Conflict,
            Refusal::Unsupported(_) => ErrorCode::Unsupported,
            Refusal::Origin(_) => ErrorCode::OriginUnavailable,
        },
        Error::Exhausted(resource) => match resource {
            Resource::DataSpace => ErrorCode::NoSpace,
            Resource::Metadata => ErrorCode::MetadataFull,
            Resource::Journal => ErrorCode::TransactionFull,
        },
        // What the device returned is not the data: an I/O error to the
        // client (EIO over NBD), and the pool goes on.
        Error::Damaged(_) => ErrorCode::Io,
    }
}

/// An error response: a status and an [`ErrorBody`].
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    body: ErrorBody,
}

impl ApiError {
    pub(super) fn new(code: ErrorCode, message: String) -> Self {
        Self {
            status: StatusCode::from_u16(code.status())
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            body: ErrorBody { code, message },
        }
    }

    /// The same error under another HTTP status.
    pub(super) fn with_status(mut self, status: StatusCode) -> Self {
        self.status = status;
        self
    }

    /// The message, as the response carries it.
    pub fn message(&self) -> String {
        self.body.message.clone()
    }

    /// Adds `hint` to the message.
    pub(super) fn with_hint(mut self, hint: String) -> Self {
        self.body.message.push_str(&hint);
        self
    }
}

/// Each error keeps its meaning over HTTP, and its message its chain of
/// contexts; an internal one is a 500, and logged.
impl From<DaemonError> for ApiError {
    fn from(err: DaemonError) -> Self {
        Self::logged(code_of(&err), err.chain())
    }
}

/// A backup's failure, by [`crate::backups::code_of`]; a server error is
/// logged as a daemon error is.
impl From<arbor_backup::BackupError> for ApiError {
    fn from(err: arbor_backup::BackupError) -> Self {
        Self::logged(
            crate::backups::code_of(&err),
            arbor_backup::error_chain(&err),
        )
    }
}

impl ApiError {
    /// An error response; a server error is logged with its code's name
    /// (as the API and the journal's ARBOR_ERROR_KIND give it).
    fn logged(code: ErrorCode, message: String) -> Self {
        if StatusCode::from_u16(code.status()).is_ok_and(|s| s.is_server_error()) {
            let kind = serde_json::to_value(code)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default();
            error!(error = message, error_kind = kind, "API request failed");
        }
        Self::new(code, message)
    }

    /// The same error with what was being done before its message.
    pub(super) fn context(mut self, context: impl std::fmt::Display) -> Self {
        self.body.message = format!("{context}: {}", self.body.message);
        self
    }
}

/// A send's or receive's failure: a bad stream is the client's.
impl From<StreamFailure> for ApiError {
    fn from(err: StreamFailure) -> Self {
        match err {
            StreamFailure::Engine(e) => ApiError::from(DaemonError::from(e)),
            StreamFailure::Stream(e) => ApiError::new(ErrorCode::BadStream, e.to_string()),
            StreamFailure::Rbd(e) => ApiError::new(ErrorCode::BadStream, e.to_string()),
            StreamFailure::Refused(m) => ApiError::new(ErrorCode::InvalidArgument, m),
            StreamFailure::Output(e) => ApiError::new(ErrorCode::Io, e.to_string()),
        }
    }
}

/// A replication cycle's failure, its kind after its message.
impl From<CycleFailure> for ApiError {
    fn from(f: CycleFailure) -> Self {
        let code = match f.kind {
            ErrorKind::Diverged | ErrorKind::Cycle | ErrorKind::NotAllowed => ErrorCode::Conflict,
            ErrorKind::NoSpace => ErrorCode::NoSpace,
            ErrorKind::Busy => ErrorCode::Busy,
            ErrorKind::Connection => ErrorCode::Io,
            ErrorKind::Protocol | ErrorKind::Failed | ErrorKind::Local | ErrorKind::Stopped => {
                ErrorCode::Internal
            }
        };
        ApiError::new(code, format!("{} ({})", f.message, f.kind.as_str()))
    }
}

/// A token store's refusal or failure.
impl From<TokenError> for ApiError {
    fn from(err: TokenError) -> Self {
        let code = match &err {
            TokenError::InvalidName(_) => ErrorCode::InvalidName,
            TokenError::InvalidArgument(_) => ErrorCode::InvalidArgument,
            TokenError::AlreadyExists(_) => ErrorCode::AlreadyExists,
            TokenError::NotFound(_) => ErrorCode::NotFound,
            TokenError::Full => ErrorCode::Conflict,
            TokenError::Io { .. } => ErrorCode::Io,
        };
        ApiError::new(code, err.to_string())
    }
}

/// A blocking task over the engine that died (it panicked, or the runtime
/// is shutting down).
pub(super) fn engine_task_failed(err: tokio::task::JoinError) -> ApiError {
    ApiError::from(DaemonError::internal(err).context("engine task failed"))
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body)).into_response()
    }
}

pub(super) type ApiResult<T> = Result<T, ApiError>;
