//! The daemon's own refusals, as a type: the API layer gives each its
//! error code (`api_error`), the CLI its exit status. Engine errors keep
//! their own type and are classified in `api_error` too.

/// Why the daemon (or an offline pool operation) refuses a request.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// A bad name, size, option, path or configuration.
    #[error("{0}")]
    Invalid(String),
    /// No such thing: a hold, a device, a file.
    #[error("{0}")]
    NotFound(String),
    /// In use: NBD connections, sends, or a device held elsewhere.
    #[error("{0}")]
    Busy(String),
    /// Another process holds the pool.
    #[error("{0}")]
    PoolInUse(String),
}
