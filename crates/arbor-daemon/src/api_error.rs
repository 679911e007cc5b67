//! The API's error responses and the one place that gives each failure
//! its [`ErrorCode`]: the daemon's own refusals ([`DaemonError`]) and
//! engine errors.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use tracing::error;

use arbor_api::error_code::ErrorCode;
use arbor_api::model::ErrorBody;

use crate::error::DaemonError;

/// The code of a daemon refusal.
pub fn code_of(refusal: &DaemonError) -> ErrorCode {
    match refusal {
        DaemonError::Invalid(_) => ErrorCode::InvalidArgument,
        DaemonError::NotFound(_) => ErrorCode::NotFound,
        DaemonError::Busy(_) => ErrorCode::Busy,
        // A pool held elsewhere is no request's fault.
        DaemonError::PoolInUse(_) => ErrorCode::Internal,
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

    /// Adds `hint` to the message.
    pub(super) fn with_hint(mut self, hint: String) -> Self {
        self.body.message.push_str(&hint);
        self
    }
}

/// Engine errors keep their meaning over HTTP; anything else is ours and a 500.
impl From<anyhow::Error> for ApiError {
    fn from(err: anyhow::Error) -> Self {
        let code = if let Some(refusal) = err.downcast_ref::<DaemonError>() {
            code_of(refusal)
        } else {
            err.downcast_ref::<arbor_engine::Error>()
                .map_or(ErrorCode::Internal, code_of_engine)
        };
        if StatusCode::from_u16(code.status()).is_ok_and(|s| s.is_server_error()) {
            error!(error = format!("{err:#}"), "API request failed");
        }
        Self::new(code, format!("{err:#}"))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body)).into_response()
    }
}

pub(super) type ApiResult<T> = Result<T, ApiError>;
