//! One typed set of error codes for the API: the `code` of every API
//! error body and its HTTP status come from [`ErrorCode`]. The daemon
//! classifies its errors into it (`arbor_daemon::api_error`), the CLI
//! gives each its exit status (`arbor`'s `exit`). The table is in
//! docs/API.md.

use serde::{Deserialize, Serialize};

/// Stable, machine-readable kind of a failure (the `code` of an API error).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    InvalidName,
    InvalidArgument,
    /// Malformed JSON or query.
    BadRequest,
    /// No such volume or snapshot.
    NotFound,
    /// No such API endpoint (client and daemon versions differ?).
    UnknownEndpoint,
    MethodNotAllowed,
    AlreadyExists,
    ReadOnly,
    /// NBD clients have the volume open, or another operation holds a
    /// backup repository's lock.
    Busy,
    PayloadTooLarge,
    UnsupportedMediaType,
    /// Well-formed JSON with missing, unknown or mistyped fields.
    UnprocessableEntity,
    NoSpace,
    MetadataFull,
    /// One step of an operation needs more journal room than the pool has.
    TransactionFull,
    Corrupt,
    Io,
    /// The external device of a copy-on-write volume is not attached,
    /// vanished, shrank or failed (the pool goes on).
    OriginUnavailable,
    /// The pool stopped after a failed commit.
    PoolFailed,
    /// A backup repository's store could not be reached (after retries),
    /// or refused the request (credentials, permissions, a quota).
    StoreUnavailable,
    /// The operation conflicts with the pool's state (a receive of another
    /// stream in progress, a volume written since a stream's base).
    Conflict,
    /// The pool's format version cannot do this (upgrade it).
    Unsupported,
    /// A send stream is damaged, truncated or not one.
    BadStream,
    /// No credentials, or bad ones, on the TCP API (a missing, unknown,
    /// revoked or expired token).
    Unauthorized,
    /// Credentials that may not do this (a read scope changing something,
    /// a certificate not listed in `api_clients`), or a request a browser
    /// was made to send for another site (its `Origin` or `Host` is not the
    /// API's own).
    Forbidden,
    Internal,
    /// A code this client does not know (a newer daemon).
    #[serde(other)]
    Unknown,
}

impl ErrorCode {
    /// The code of an error response the HTTP framework made (a rejected
    /// body, method or path), from its status.
    pub fn of_status(status: u16) -> Self {
        match status {
            400 => Self::BadRequest,
            401 => Self::Unauthorized,
            403 => Self::Forbidden,
            404 => Self::UnknownEndpoint,
            405 => Self::MethodNotAllowed,
            413 => Self::PayloadTooLarge,
            415 => Self::UnsupportedMediaType,
            422 => Self::UnprocessableEntity,
            _ => Self::Internal,
        }
    }

    /// The HTTP status of an API error with this code.
    pub fn status(self) -> u16 {
        match self {
            Self::InvalidName | Self::InvalidArgument | Self::BadRequest | Self::BadStream => 400,
            Self::NotFound | Self::UnknownEndpoint => 404,
            Self::Unauthorized => 401,
            Self::Forbidden => 403,
            Self::MethodNotAllowed => 405,
            Self::AlreadyExists
            | Self::ReadOnly
            | Self::Busy
            | Self::Conflict
            | Self::Unsupported => 409,
            Self::PayloadTooLarge => 413,
            Self::UnsupportedMediaType => 415,
            Self::UnprocessableEntity => 422,
            Self::NoSpace | Self::MetadataFull | Self::TransactionFull => 507,
            Self::Corrupt | Self::Io | Self::PoolFailed | Self::Internal | Self::Unknown => 500,
            Self::OriginUnavailable | Self::StoreUnavailable => 503,
        }
    }

    /// Every code, [`ErrorCode::Unknown`] last.
    pub const ALL: [ErrorCode; 27] = [
        Self::InvalidName,
        Self::InvalidArgument,
        Self::BadRequest,
        Self::NotFound,
        Self::UnknownEndpoint,
        Self::MethodNotAllowed,
        Self::AlreadyExists,
        Self::ReadOnly,
        Self::Busy,
        Self::PayloadTooLarge,
        Self::UnsupportedMediaType,
        Self::UnprocessableEntity,
        Self::NoSpace,
        Self::MetadataFull,
        Self::TransactionFull,
        Self::Corrupt,
        Self::Io,
        Self::OriginUnavailable,
        Self::PoolFailed,
        Self::StoreUnavailable,
        Self::Conflict,
        Self::Unsupported,
        Self::BadStream,
        Self::Unauthorized,
        Self::Forbidden,
        Self::Internal,
        Self::Unknown,
    ];
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_unknown_codes_are_unknown() {
        for code in ErrorCode::ALL
            .into_iter()
            .filter(|c| *c != ErrorCode::Unknown)
        {
            let wire = serde_json::to_value(code).unwrap();
            let back: ErrorCode = serde_json::from_value(wire).unwrap();
            assert_eq!(back, code);
        }
        let newer: ErrorCode =
            serde_json::from_value(serde_json::json!("from_the_future")).unwrap();
        assert_eq!(newer, ErrorCode::Unknown);
    }
}
