//! Why a send or receive failed: the one error type of the drivers, whose
//! variants keep the layer the failure came from (the stream, the pool, the
//! output), so the binary classifies each once.

/// A send or receive failure.
#[derive(Debug, thiserror::Error)]
pub enum StreamFailure {
    /// The stream is damaged, truncated, out of order or not a stream:
    /// nothing of it became visible.
    #[error("{0}")]
    Stream(#[from] crate::format::StreamError),
    /// A Ceph `rbd diff` is damaged, truncated or not one: nothing of it
    /// became visible.
    #[error("{0}")]
    Rbd(#[from] crate::rbd::RbdError),
    /// The pool refused or failed (no such snapshot, no space, a receive
    /// of another stream in progress...).
    #[error("{0}")]
    Engine(#[from] arbor_engine::Error),
    /// The request does not make sense for these snapshots (the message
    /// says why and what to do).
    #[error("{0}")]
    Refused(String),
    /// Writing the stream out failed (a broken pipe, a full disk).
    #[error("writing the stream: {0}")]
    Output(std::io::Error),
}
