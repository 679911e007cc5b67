//! Exit statuses: each kind of failure has its own, so scripts can tell
//! "no such volume" from "daemon not running" without parsing messages.
//! The table is in docs/CLI.md.

use std::process::ExitCode;

use arbor_api::error::ClientError;
use arbor_api::error_code::ErrorCode;
use arbor_daemon::{code_of, code_of_engine, DaemonError};

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

    /// The CLI's exit status for a failure with API error code `code`:
    /// the one place that gives codes their statuses.
    pub fn of_code(code: ErrorCode) -> Self {
        match code {
            ErrorCode::NotFound => Exit::NotFound,
            ErrorCode::AlreadyExists
            | ErrorCode::ReadOnly
            | ErrorCode::Conflict
            | ErrorCode::Unsupported => Exit::Conflict,
            ErrorCode::Busy => Exit::Busy,
            ErrorCode::NoSpace | ErrorCode::MetadataFull => Exit::NoSpace,
            ErrorCode::Corrupt => Exit::Damaged,
            ErrorCode::InvalidName
            | ErrorCode::InvalidArgument
            | ErrorCode::BadRequest
            | ErrorCode::UnprocessableEntity
            | ErrorCode::BadStream => Exit::Usage,
            ErrorCode::Unauthorized | ErrorCode::Forbidden => Exit::NotAllowed,
            ErrorCode::UnknownEndpoint
            | ErrorCode::MethodNotAllowed
            | ErrorCode::PayloadTooLarge
            | ErrorCode::UnsupportedMediaType
            | ErrorCode::TransactionFull
            | ErrorCode::Io
            | ErrorCode::OriginUnavailable
            | ErrorCode::StoreUnavailable
            | ErrorCode::PoolFailed
            | ErrorCode::Internal
            | ErrorCode::Unknown => Exit::Failure,
        }
    }

    /// The status for an error of the daemon, or of an offline pool
    /// operation, if its kind has one (an internal error's causes may).
    fn of_daemon(err: &DaemonError) -> Option<Self> {
        match err.root() {
            // An API code of its own would be Internal: no request's fault.
            DaemonError::PoolInUse(_) => Some(Exit::PoolInUse),
            // Its own chain (a missing file's error among it) may know one.
            DaemonError::Internal(e) => Some(Exit::of(e)).filter(|&exit| exit != Exit::Failure),
            DaemonError::Replica(_) | DaemonError::Context { .. } => None,
            // The rest by their API code: the one mapping of kinds.
            kind => Some(Exit::of_code(code_of(kind))),
        }
    }

    /// The status for a client's failure.
    fn of_client(err: &ClientError) -> Self {
        match err {
            ClientError::Api { code, .. } => Exit::of_code(*code),
            ClientError::DaemonNotRunning(_) => Exit::DaemonNotRunning,
            ClientError::Invalid(_) => Exit::Usage,
            ClientError::NotFound(_) => Exit::NotFound,
        }
    }

    /// The status for any error: the first cause in its chain that knows one.
    pub fn of(err: &anyhow::Error) -> Self {
        err.chain()
            .find_map(|cause| {
                if let Some(fail) = cause.downcast_ref::<Fail>() {
                    Some(fail.exit)
                } else if let Some(client) = cause.downcast_ref::<ClientError>() {
                    Some(Exit::of_client(client))
                } else if let Some(daemon) = cause.downcast_ref::<DaemonError>() {
                    Exit::of_daemon(daemon)
                } else if let Some(engine) = cause.downcast_ref::<arbor_engine::Error>() {
                    Some(Exit::of_code(code_of_engine(engine)))
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

/// A usage error (status 2) with `message`.
pub fn usage(message: impl Into<String>) -> Fail {
    Fail::new(Exit::Usage, message)
}

/// A backup repository's failure in a command that talks to the store
/// itself (`backup init`), with the status its API code has.
pub fn backup_error(err: arbor_backup::BackupError, url: &str) -> Fail {
    let exit = Exit::of_code(arbor_daemon::backup_code_of(&err));
    Fail::new(exit, format!("backup repository {url}: {err}"))
}

#[cfg(test)]
mod tests {
    use anyhow::Context;

    use super::*;

    #[test]
    fn the_innermost_known_cause_decides() {
        let err = anyhow::Error::new(Fail::new(Exit::Busy, "in use")).context("cannot destroy");
        assert_eq!(Exit::of(&err), Exit::Busy);
        let engine: anyhow::Result<()> =
            Err(arbor_engine::Error::Exhausted(arbor_engine::Resource::DataSpace).into());
        assert_eq!(
            Exit::of(&engine.context("write").unwrap_err()),
            Exit::NoSpace
        );
        assert_eq!(Exit::of(&anyhow::anyhow!("odd")), Exit::Failure);
        let refused = anyhow::Error::new(DaemonError::PoolInUse("held".into())).context("open");
        assert_eq!(Exit::of(&refused), Exit::PoolInUse);
        // The daemon's errors decide by their kind under their contexts.
        let engine = DaemonError::from(arbor_engine::Error::Exhausted(
            arbor_engine::Resource::DataSpace,
        ))
        .context("grow");
        assert_eq!(Exit::of(&anyhow::Error::new(engine)), Exit::NoSpace);
        let missing: Result<(), DaemonError> =
            Err(std::io::Error::from(std::io::ErrorKind::NotFound).into());
        let missing = missing
            .map_err(|e| e.context("cannot open /x"))
            .unwrap_err();
        assert_eq!(Exit::of(&anyhow::Error::new(missing)), Exit::NotFound);
        let odd = DaemonError::msg("odd").context("serve");
        assert_eq!(Exit::of(&anyhow::Error::new(odd)), Exit::Failure);
        // Each refusal of the daemon: the status of its API code.
        for (refusal, code, exit) in [
            (
                DaemonError::Invalid("x".into()),
                ErrorCode::InvalidArgument,
                Exit::Usage,
            ),
            (
                DaemonError::NotFound("x".into()),
                ErrorCode::NotFound,
                Exit::NotFound,
            ),
            (DaemonError::Busy("x".into()), ErrorCode::Busy, Exit::Busy),
            (
                DaemonError::ReadOnly("x".into()),
                ErrorCode::ReadOnly,
                Exit::Conflict,
            ),
            (
                DaemonError::BadStream("x".into()),
                ErrorCode::BadStream,
                Exit::Usage,
            ),
        ] {
            assert_eq!(code_of(&refusal), code, "{refusal:?}");
            assert_eq!(Exit::of(&anyhow::Error::new(refusal)), exit, "{code:?}");
        }
        let api = anyhow::Error::new(ClientError::Api {
            code: ErrorCode::ReadOnly,
            message: "a replica".into(),
        });
        assert_eq!(Exit::of(&api), Exit::Conflict);
        let gone = anyhow::Error::new(ClientError::DaemonNotRunning("none".into()));
        assert_eq!(Exit::of(&gone), Exit::DaemonNotRunning);
    }

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
        let sent: Vec<ErrorCode> = ErrorCode::ALL
            .into_iter()
            .filter(|c| *c != ErrorCode::Unknown)
            .collect();
        assert_eq!(documented.len(), sent.len(), "{documented:?}");
        for code in sent {
            let row = documented
                .iter()
                .find(|(name, _, _)| *name == wire(code))
                .unwrap_or_else(|| panic!("{} is not in docs/API.md", wire(code)));
            assert_eq!(row.1, code.status().to_string(), "{}", row.0);
            assert_eq!(row.2, (Exit::of_code(code) as u8).to_string(), "{}", row.0);
        }
    }

    #[test]
    fn unknown_codes_are_failures() {
        assert_eq!(Exit::of_code(ErrorCode::Unknown), Exit::Failure);
    }

    #[test]
    fn every_engine_error_has_its_code() {
        use arbor_engine::{Error as E, Fault, Invalid, Refusal, Resource};
        let exit = |e: &E| Exit::of_code(code_of_engine(e));
        let no_space = E::Exhausted(Resource::DataSpace);
        assert_eq!(exit(&no_space), Exit::NoSpace);
        assert_eq!(exit(&E::Exhausted(Resource::Metadata)), Exit::NoSpace);
        assert_eq!(code_of_engine(&E::not_found("x")), ErrorCode::NotFound);
        assert_eq!(
            code_of_engine(&E::Stop(Fault::Failed("x".into()))),
            ErrorCode::PoolFailed
        );
        assert_eq!(
            exit(&E::Stop(Fault::Inconsistent("x".into()))),
            Exit::Damaged
        );
        // Every class and reason keeps the code and status it had as a
        // flat enum.
        let all: Vec<(E, ErrorCode, Exit)> = vec![
            (
                E::from(std::io::Error::other("x")),
                ErrorCode::Io,
                Exit::Failure,
            ),
            (
                E::Stop(Fault::Corrupt {
                    location: "x".into(),
                    reason: arbor_format::FormatError::BadMagic,
                }),
                ErrorCode::Corrupt,
                Exit::Damaged,
            ),
            (E::Stop(Fault::NotAPool), ErrorCode::Corrupt, Exit::Damaged),
            (
                E::Stop(Fault::Failed("x".into())),
                ErrorCode::PoolFailed,
                Exit::Failure,
            ),
            (E::not_found("x"), ErrorCode::NotFound, Exit::NotFound),
            (
                E::already_exists("x"),
                ErrorCode::AlreadyExists,
                Exit::Conflict,
            ),
            (
                E::Refused(Refusal::InvalidName {
                    name: "x".into(),
                    reason: "y".into(),
                }),
                ErrorCode::InvalidName,
                Exit::Usage,
            ),
            (
                E::from(Invalid::SnapshotRename),
                ErrorCode::InvalidArgument,
                Exit::Usage,
            ),
            (
                E::invalid_request("x"),
                ErrorCode::InvalidArgument,
                Exit::Usage,
            ),
            (E::read_only("x"), ErrorCode::ReadOnly, Exit::Conflict),
            (E::conflict("x"), ErrorCode::Conflict, Exit::Conflict),
            (
                E::from(arbor_engine::Unsupported::ChangesOfCow("x".into())),
                ErrorCode::Unsupported,
                Exit::Conflict,
            ),
            (
                E::from(arbor_engine::OriginUnavailable::NotAttached { name: "x".into() }),
                ErrorCode::OriginUnavailable,
                Exit::Failure,
            ),
            (no_space, ErrorCode::NoSpace, Exit::NoSpace),
            (
                E::Exhausted(Resource::Metadata),
                ErrorCode::MetadataFull,
                Exit::NoSpace,
            ),
            (
                E::Exhausted(Resource::Journal),
                ErrorCode::TransactionFull,
                Exit::Failure,
            ),
        ];
        for (err, code, status) in all {
            assert_eq!(code_of_engine(&err), code, "{err:?}");
            assert_eq!(exit(&err), status, "{err:?}");
        }
    }
}
