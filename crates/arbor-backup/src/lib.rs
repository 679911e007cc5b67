//! Backups of snapshots to object storage (docs/BACKUP.md): a repository
//! in an S3 bucket or a local directory, content-addressed, compressed
//! and encrypted before anything leaves the host.
//!
//! * `crypto`: keys and sealing (RustCrypto).
//! * `format`: the repository's objects as bytes, sans-I/O, fuzzed.
//! * `store`: the object store (the `object_store` crate), objects checked
//!   against their names.
//! * `repo`: a repository opened with its key: backups made from the
//!   engine's snapshots, restores into new volumes, lists.

pub mod crypto;
pub mod format;
pub mod repo;
pub mod store;

pub mod lock;
pub mod pace;
pub mod spec;

mod backup;
mod live;
mod prune;
mod restore;
mod verify;

pub use backup::{hold_tag, Made};
pub use live::{LiveRestore, LiveStatus};
pub use prune::{PruneOptions, Pruned};
pub use repo::{BackupError, Listing, Progress, Repository};
pub use restore::Restored;
pub use verify::Verified;

/// An error's message with every cause's after a colon, each once (the
/// store's own words, an S3 error code, are among the causes).
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut message = err.to_string();
    let mut cause = err.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        cause = c.source();
    }
    message
}
