//! Exit statuses: each kind of failure has its own, so scripts can tell
//! "no such volume" from "daemon not running" without parsing messages.
//! The table is in docs/CLI.md.

use std::process::ExitCode;

use crate::error_code::ErrorCode;

/// What went wrong, as far as a script needs to know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Anything not listed below.
    Failure = 1,
    /// Bad command line, config, name or size.
    Usage = 2,
    /// No daemon answers on the data directory's API socket.
    DaemonNotRunning = 3,
    /// No such volume, snapshot or pool.
    NotFound = 4,
    /// The name is taken, or the target is a read-only snapshot.
    Conflict = 5,
    /// NBD clients have the volume open.
    Busy = 6,
    /// The pool's data or metadata space is full.
    NoSpace = 7,
    /// `check` found damage, or the pool is damaged.
    Damaged = 8,
    /// Another arbor process holds the pool.
    PoolInUse = 9,
    /// The API refused the credentials: none, bad ones, or ones without
    /// the right (a read-only token changing something).
    NotAllowed = 10,
}

impl Exit {
    pub fn code(self) -> ExitCode {
        ExitCode::from(self as u8)
    }

    /// The status for an engine error met by an offline command: that of
    /// its error code.
    pub fn for_engine(err: &arbor_engine::Error) -> Self {
        ErrorCode::of_engine(err).exit()
    }

    /// The status for any error: the first cause in its chain that knows one.
    pub fn of(err: &anyhow::Error) -> Self {
        err.chain()
            .find_map(|cause| {
                if let Some(fail) = cause.downcast_ref::<Fail>() {
                    Some(fail.exit)
                } else if let Some(engine) = cause.downcast_ref::<arbor_engine::Error>() {
                    Some(Exit::for_engine(engine))
                } else {
                    cause
                        .downcast_ref::<std::io::Error>()
                        .filter(|io| io.kind() == std::io::ErrorKind::NotFound)
                        .map(|_| Exit::NotFound)
                }
            })
            .unwrap_or(Exit::Failure)
    }
}

/// An error that carries its exit status.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Fail {
    pub exit: Exit,
    pub message: String,
}

impl Fail {
    pub fn new(exit: Exit, message: impl Into<String>) -> Self {
        Self {
            exit,
            message: message.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use anyhow::Context;

    use super::*;

    #[test]
    fn the_innermost_known_cause_decides() {
        let err = anyhow::Error::new(Fail::new(Exit::Busy, "in use")).context("cannot destroy");
        assert_eq!(Exit::of(&err), Exit::Busy);
        let engine: anyhow::Result<()> = Err(arbor_engine::Error::NoSpace.into());
        assert_eq!(
            Exit::of(&engine.context("write").unwrap_err()),
            Exit::NoSpace
        );
        assert_eq!(Exit::of(&anyhow::anyhow!("odd")), Exit::Failure);
    }
}
