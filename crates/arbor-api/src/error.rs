//! What the client reports besides the API's answers: the kind of every
//! failure a caller may act on, so the CLI gives each its exit status
//! without reading messages.

use crate::error_code::ErrorCode;

/// A failure of a call to the daemon that is more than a broken
/// connection.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The daemon answered with an API error (`code`), `message` saying
    /// what to do about refused credentials.
    #[error("{message}")]
    Api { code: ErrorCode, message: String },
    /// No daemon answers where the client looked.
    #[error("{0}")]
    DaemonNotRunning(String),
    /// A bad `--api` URL, token or TLS file.
    #[error("{0}")]
    Invalid(String),
    /// A file the client was told to read does not exist.
    #[error("{0}")]
    NotFound(String),
}
