use std::io;

use arbor_format::FormatError;

/// Everything the engine can report. Corruption is a value, never a panic.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("I/O error: {0}")]
    Io(#[from] io::Error),
    /// The reason is part of the message (not also a `source()`), so error
    /// chains print it once.
    #[error("pool is damaged at {location}: {reason}")]
    Corrupt {
        location: String,
        reason: FormatError,
    },
    #[error("pool is damaged: {0}")]
    Inconsistent(String),
    #[error("not an arbor pool (no valid superblock)")]
    NotAPool,
    #[error("no such volume or snapshot: {0}")]
    NotFound(String),
    #[error("a volume or snapshot named {0:?} already exists")]
    AlreadyExists(String),
    #[error("invalid name {name:?}: {reason}")]
    InvalidName { name: String, reason: String },
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("{0} is a read-only snapshot")]
    ReadOnly(String),
    #[error("pool data space is full")]
    NoSpace,
    #[error("pool metadata space is full")]
    MetadataFull,
    #[error("the pool stopped after a failed commit and must be reopened: {0}")]
    Failed(String),
    /// A step of an operation would change more space-map pages than one
    /// commit can journal. The engine commits and runs the step again in an
    /// empty transaction; it reaches a caller only if a single step needs
    /// more than the whole journal.
    #[error("one step of the operation changes more space-map pages than the journal holds")]
    TransactionFull,
    /// The operation conflicts with the pool's state (a receive of another
    /// stream in progress, a volume written since a stream's base); the
    /// message says what to do.
    #[error("{0}")]
    Conflict(String),
    /// The pool's format version cannot do this yet; the message names the
    /// upgrade.
    #[error("{0}")]
    Unsupported(String),
    /// The external device of a copy-on-write volume is not attached,
    /// vanished, shrank or failed: the request fails, the pool goes on.
    #[error("copy-on-write volume {0}")]
    Origin(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn corrupt(location: impl Into<String>, reason: FormatError) -> Self {
        Error::Corrupt {
            location: location.into(),
            reason,
        }
    }

    pub(crate) fn inconsistent(what: impl Into<String>) -> Self {
        Error::Inconsistent(what.into())
    }

    /// Whether this error means the in-memory state can no longer be
    /// trusted, so the pool must stop (every later call fails until it is
    /// reopened). The one place that decides it: the daemon's background
    /// work stops the daemon on exactly these (a full pool and the like may
    /// clear up and are only logged). `NotAPool` comes only from an open,
    /// and means as much.
    pub fn stops_pool(&self) -> bool {
        matches!(
            self,
            Error::Io(_)
                | Error::Corrupt { .. }
                | Error::Inconsistent(_)
                | Error::NotAPool
                | Error::Failed(_)
        )
    }
}
