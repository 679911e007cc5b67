//! One typed set of error codes for the API and the CLI: the `code` of
//! every API error body, its HTTP status, and the CLI's exit status all
//! come from [`ErrorCode`], and engine errors are classified into it in one
//! place ([`ErrorCode::of_engine`]). The table is in docs/API.md.

use axum::http::StatusCode;
use serde::{Deserialize, Serialize};

use crate::exit::Exit;

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
    /// NBD clients have the volume open.
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
    /// The code of an engine error: the one place that classifies them.
    pub fn of_engine(err: &arbor_engine::Error) -> Self {
        use arbor_engine::Error as E;
        match err {
            E::NotFound(_) => Self::NotFound,
            E::AlreadyExists(_) => Self::AlreadyExists,
            E::ReadOnly(_) => Self::ReadOnly,
            E::InvalidName { .. } => Self::InvalidName,
            E::InvalidArgument(_) => Self::InvalidArgument,
            E::NoSpace => Self::NoSpace,
            E::MetadataFull => Self::MetadataFull,
            E::TransactionFull => Self::TransactionFull,
            E::Corrupt { .. } | E::Inconsistent(_) | E::NotAPool => Self::Corrupt,
            E::Io(_) => Self::Io,
            E::Failed(_) => Self::PoolFailed,
            E::Conflict(_) => Self::Conflict,
            E::Unsupported(_) => Self::Unsupported,
            E::Origin(_) => Self::OriginUnavailable,
        }
    }

    /// The code of an error response the HTTP framework made (a rejected
    /// body, method or path), from its status.
    pub fn of_status(status: StatusCode) -> Self {
        match status {
            StatusCode::BAD_REQUEST => Self::BadRequest,
            StatusCode::UNAUTHORIZED => Self::Unauthorized,
            StatusCode::FORBIDDEN => Self::Forbidden,
            StatusCode::NOT_FOUND => Self::UnknownEndpoint,
            StatusCode::METHOD_NOT_ALLOWED => Self::MethodNotAllowed,
            StatusCode::PAYLOAD_TOO_LARGE => Self::PayloadTooLarge,
            StatusCode::UNSUPPORTED_MEDIA_TYPE => Self::UnsupportedMediaType,
            StatusCode::UNPROCESSABLE_ENTITY => Self::UnprocessableEntity,
            _ => Self::Internal,
        }
    }

    /// The HTTP status of an API error with this code.
    pub fn status(self) -> StatusCode {
        match self {
            Self::InvalidName | Self::InvalidArgument | Self::BadRequest | Self::BadStream => {
                StatusCode::BAD_REQUEST
            }
            Self::NotFound | Self::UnknownEndpoint => StatusCode::NOT_FOUND,
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::Forbidden => StatusCode::FORBIDDEN,
            Self::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Self::AlreadyExists
            | Self::ReadOnly
            | Self::Busy
            | Self::Conflict
            | Self::Unsupported => StatusCode::CONFLICT,
            Self::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Self::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::UnprocessableEntity => StatusCode::UNPROCESSABLE_ENTITY,
            Self::NoSpace | Self::MetadataFull | Self::TransactionFull => {
                StatusCode::INSUFFICIENT_STORAGE
            }
            Self::Corrupt | Self::Io | Self::PoolFailed | Self::Internal | Self::Unknown => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
            Self::OriginUnavailable => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The CLI's exit status for a failure with this code.
    pub fn exit(self) -> Exit {
        match self {
            Self::NotFound => Exit::NotFound,
            Self::AlreadyExists | Self::ReadOnly | Self::Conflict | Self::Unsupported => {
                Exit::Conflict
            }
            Self::Busy => Exit::Busy,
            Self::NoSpace | Self::MetadataFull => Exit::NoSpace,
            Self::Corrupt => Exit::Damaged,
            Self::InvalidName
            | Self::InvalidArgument
            | Self::BadRequest
            | Self::UnprocessableEntity
            | Self::BadStream => Exit::Usage,
            Self::Unauthorized | Self::Forbidden => Exit::NotAllowed,
            Self::UnknownEndpoint
            | Self::MethodNotAllowed
            | Self::PayloadTooLarge
            | Self::UnsupportedMediaType
            | Self::TransactionFull
            | Self::Io
            | Self::OriginUnavailable
            | Self::PoolFailed
            | Self::Internal
            | Self::Unknown => Exit::Failure,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [ErrorCode; 26] = [
        ErrorCode::InvalidName,
        ErrorCode::InvalidArgument,
        ErrorCode::BadRequest,
        ErrorCode::NotFound,
        ErrorCode::UnknownEndpoint,
        ErrorCode::MethodNotAllowed,
        ErrorCode::AlreadyExists,
        ErrorCode::ReadOnly,
        ErrorCode::Busy,
        ErrorCode::PayloadTooLarge,
        ErrorCode::UnsupportedMediaType,
        ErrorCode::UnprocessableEntity,
        ErrorCode::NoSpace,
        ErrorCode::MetadataFull,
        ErrorCode::TransactionFull,
        ErrorCode::Corrupt,
        ErrorCode::Io,
        ErrorCode::OriginUnavailable,
        ErrorCode::PoolFailed,
        ErrorCode::Conflict,
        ErrorCode::Unsupported,
        ErrorCode::BadStream,
        ErrorCode::Unauthorized,
        ErrorCode::Forbidden,
        ErrorCode::Internal,
        ErrorCode::Unknown,
    ];

    fn wire(code: ErrorCode) -> String {
        serde_json::to_value(code)
            .expect("serialize")
            .as_str()
            .expect("a string")
            .to_owned()
    }

    /// docs/API.md's error table lists every code the daemon sends, with
    /// its status and exit status, and nothing else.
    #[test]
    fn the_api_docs_table_matches_the_codes() {
        let doc = include_str!("../../../docs/API.md");
        let table = doc
            .split("## Errors")
            .nth(1)
            .and_then(|s| s.split("\n## ").next())
            .expect("docs/API.md has an Errors section");
        let mut documented = Vec::new();
        for row in table
            .lines()
            .filter(|l| l.starts_with("| ") && !l.starts_with("| status"))
        {
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            let (status, codes, exit) = (cells[1], cells[2], cells[4]);
            for code in codes.split(", ") {
                let name = code.trim_matches('`');
                documented.push((name.to_owned(), status.to_owned(), exit.to_owned()));
            }
        }
        let sent: Vec<ErrorCode> = ALL
            .into_iter()
            .filter(|c| *c != ErrorCode::Unknown)
            .collect();
        assert_eq!(documented.len(), sent.len(), "{documented:?}");
        for code in sent {
            let row = documented
                .iter()
                .find(|(name, _, _)| *name == wire(code))
                .unwrap_or_else(|| panic!("{} is not in docs/API.md", wire(code)));
            assert_eq!(row.1, code.status().as_u16().to_string(), "{}", row.0);
            assert_eq!(row.2, (code.exit() as u8).to_string(), "{}", row.0);
        }
    }

    #[test]
    fn codes_round_trip_and_unknown_codes_are_failures() {
        for code in ALL.into_iter().filter(|c| *c != ErrorCode::Unknown) {
            let back: ErrorCode = serde_json::from_value(serde_json::json!(wire(code))).unwrap();
            assert_eq!(back, code);
        }
        let newer: ErrorCode =
            serde_json::from_value(serde_json::json!("from_the_future")).unwrap();
        assert_eq!(newer, ErrorCode::Unknown);
        assert_eq!(newer.exit(), Exit::Failure);
    }

    #[test]
    fn every_engine_error_has_its_code() {
        use arbor_engine::Error as E;
        assert_eq!(ErrorCode::of_engine(&E::NoSpace).exit(), Exit::NoSpace);
        assert_eq!(ErrorCode::of_engine(&E::MetadataFull).exit(), Exit::NoSpace);
        assert_eq!(
            ErrorCode::of_engine(&E::NotFound("x".into())),
            ErrorCode::NotFound
        );
        assert_eq!(
            ErrorCode::of_engine(&E::Failed("x".into())),
            ErrorCode::PoolFailed
        );
        assert_eq!(
            ErrorCode::of_engine(&E::Inconsistent("x".into())).exit(),
            Exit::Damaged
        );
    }
}
