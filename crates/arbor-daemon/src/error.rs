//! The daemon's errors, as a type: its own refusals, the engine's and
//! replication state's errors it passes on, and its internal failures,
//! each with the context the daemon added on the way. The API layer gives
//! each its error code (`api_error`, by matching), the CLI its exit
//! status; nothing downcasts to learn what failed.

use arbor_replica::state::StateError;

/// Why the daemon (or an offline pool operation) failed or refused a
/// request. Shown as `anyhow::Error` is: `{}` its first message, `{:#}`
/// the whole chain (each cause after a colon), which is what the API's
/// messages and the logs carry.
#[derive(Debug)]
pub enum DaemonError {
    /// A bad name, size, option, path or configuration.
    Invalid(String),
    /// No such thing: a hold, a device, a file.
    NotFound(String),
    /// In use: NBD connections, sends, or a device held elsewhere.
    Busy(String),
    /// Another process holds the pool.
    PoolInUse(String),
    /// Changes only by replication: a replica, or one of its snapshots.
    ReadOnly(String),
    /// A stream to receive broke off or is not one.
    BadStream(String),
    /// The engine's error, passed on as it is (its type says whether the
    /// pool stopped).
    Engine(arbor_engine::Error),
    /// Replication's state file refused or failed.
    Replica(StateError),
    /// Anything else: the daemon's own I/O, encoding, a task that died.
    /// Never made implicitly from an `anyhow::Error`, so an error that has
    /// a kind cannot become internal by a `?`.
    Internal(anyhow::Error),
    /// One of the above, with what the daemon was doing: its message comes
    /// first in the error's chain.
    Context {
        context: String,
        inner: Box<DaemonError>,
    },
}

impl std::fmt::Display for DaemonError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if f.alternate() {
            return f.write_str(&self.chain());
        }
        match self {
            DaemonError::Invalid(m)
            | DaemonError::NotFound(m)
            | DaemonError::Busy(m)
            | DaemonError::PoolInUse(m)
            | DaemonError::ReadOnly(m)
            | DaemonError::BadStream(m) => f.write_str(m),
            DaemonError::Engine(e) => e.fmt(f),
            DaemonError::Replica(e) => e.fmt(f),
            DaemonError::Internal(e) => e.fmt(f),
            DaemonError::Context { context, .. } => f.write_str(context),
        }
    }
}

/// The causes are those of the error it passes on (as `anyhow` and
/// `#[error(transparent)]` chain them), after its contexts.
impl std::error::Error for DaemonError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            DaemonError::Invalid(_)
            | DaemonError::NotFound(_)
            | DaemonError::Busy(_)
            | DaemonError::PoolInUse(_)
            | DaemonError::ReadOnly(_)
            | DaemonError::BadStream(_) => None,
            DaemonError::Engine(e) => e.source(),
            DaemonError::Replica(e) => e.source(),
            DaemonError::Internal(e) => e.source(),
            DaemonError::Context { inner, .. } => Some(inner.as_ref()),
        }
    }
}

impl From<arbor_engine::Error> for DaemonError {
    fn from(err: arbor_engine::Error) -> Self {
        Self::Engine(err)
    }
}

impl From<StateError> for DaemonError {
    fn from(err: StateError) -> Self {
        Self::Replica(err)
    }
}

/// The daemon's results.
pub type Result<T, E = DaemonError> = std::result::Result<T, E>;

impl DaemonError {
    /// An internal failure from any error (its own chain kept).
    pub fn internal(err: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self::Internal(anyhow::Error::new(err))
    }

    /// An internal failure that is only its message.
    pub fn msg(message: impl std::fmt::Display + std::fmt::Debug + Send + Sync + 'static) -> Self {
        Self::Internal(anyhow::Error::msg(message))
    }

    /// The error under its contexts: what decides its kind.
    pub fn root(&self) -> &DaemonError {
        match self {
            DaemonError::Context { inner, .. } => inner.root(),
            other => other,
        }
    }

    /// The engine's error, if this is one (under any context).
    pub fn engine(&self) -> Option<&arbor_engine::Error> {
        match self.root() {
            DaemonError::Engine(e) => Some(e),
            _ => None,
        }
    }

    /// Whether the pool stopped: the daemon then stops too.
    pub fn stops_pool(&self) -> bool {
        self.engine().is_some_and(arbor_engine::Error::stops_pool)
    }

    /// The same error under `context`.
    pub fn context(self, context: impl std::fmt::Display) -> Self {
        DaemonError::Context {
            context: context.to_string(),
            inner: Box::new(self),
        }
    }

    /// The message with its whole chain, as `{:#}` of an `anyhow::Error`
    /// prints it: each cause after a colon.
    pub fn chain(&self) -> String {
        let mut text = format!("{self}");
        let mut cause = std::error::Error::source(self);
        while let Some(c) = cause {
            text.push_str(": ");
            text.push_str(&c.to_string());
            cause = c.source();
        }
        text
    }
}

impl From<std::io::Error> for DaemonError {
    fn from(err: std::io::Error) -> Self {
        Self::internal(err)
    }
}

impl From<serde_json::Error> for DaemonError {
    fn from(err: serde_json::Error) -> Self {
        Self::internal(err)
    }
}

/// Context on a failed result, as `anyhow::Context` adds it, keeping the
/// error's type.
pub trait Context<T> {
    /// The error under `context`.
    fn context(self, context: impl std::fmt::Display) -> Result<T>;
    /// The error under the context `f` makes (only on failure).
    fn with_context<C: std::fmt::Display>(self, f: impl FnOnce() -> C) -> Result<T>;
}

impl<T, E: Into<DaemonError>> Context<T> for std::result::Result<T, E> {
    fn context(self, context: impl std::fmt::Display) -> Result<T> {
        self.map_err(|e| e.into().context(context))
    }

    fn with_context<C: std::fmt::Display>(self, f: impl FnOnce() -> C) -> Result<T> {
        self.map_err(|e| e.into().context(f()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The chain reads as anyhow's `{:#}` did, which the API's messages
    /// were: an error's message must not change with its type.
    #[test]
    fn the_chain_is_anyhows() {
        let engine = arbor_engine::Error::not_found("v");
        let typed = DaemonError::from(arbor_engine::Error::not_found("v"))
            .context("inner")
            .context("outer");
        let plain = anyhow::Error::new(engine).context("inner").context("outer");
        assert_eq!(typed.chain(), format!("{plain:#}"));
        assert_eq!(format!("{typed:#}"), format!("{plain:#}"));
        assert_eq!(typed.to_string(), plain.to_string());
        let io = || std::io::Error::other("disk on fire");
        let typed: Result<()> = Err(io()).context("cannot read x");
        let plain = anyhow::Error::new(io()).context("cannot read x");
        assert_eq!(typed.unwrap_err().chain(), format!("{plain:#}"));
        let internal = DaemonError::Internal(anyhow::Error::new(io()).context("a").context("b"));
        assert_eq!(
            internal.chain(),
            format!("{:#}", anyhow::Error::new(io()).context("a").context("b"))
        );
    }

    #[test]
    fn the_kind_is_the_root_s() {
        let e = DaemonError::from(arbor_engine::Error::Stop(arbor_engine::Fault::Failed(
            "x".into(),
        )))
        .context("tick");
        assert!(e.stops_pool());
        assert!(matches!(e.root(), DaemonError::Engine(_)));
        assert!(!DaemonError::Busy("b".into()).context("c").stops_pool());
        let io: Result<()> = Err(std::io::Error::other("x")).context("y");
        assert!(matches!(io.unwrap_err().root(), DaemonError::Internal(_)));
    }
}
