//! The protocol's messages over an async connection (TLS or, on loopback,
//! plain TCP): reading whole frames, writing them, every wait bounded by
//! the session's idle timeout, and the one error type of a session.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;

use crate::proto::{self, FrameDecoder, Message, ProtoError, Refusal, RefusalCode};

/// Bytes read from the connection at once.
const READ_BUF: usize = 64 << 10;

/// Why a session failed, by where the failure came from.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The connection failed or closed early.
    #[error("connection: {0}")]
    Io(#[from] std::io::Error),
    /// The peer sent nothing for the idle timeout (a cut link, a stopped
    /// host).
    #[error("the peer sent nothing for {0:?} (link cut or peer stopped?)")]
    Idle(Duration),
    /// The peer broke the protocol.
    #[error("protocol: {0}")]
    Proto(#[from] ProtoError),
    /// The peer sent a message out of turn.
    #[error("protocol: expected {expected}, got {got}")]
    Unexpected {
        expected: &'static str,
        got: &'static str,
    },
    /// The peer refused or failed, and said why.
    #[error("{}: {}", .0.code, .0.message)]
    Refused(Refusal),
    /// This side's pool or stream failed.
    #[error("{0}")]
    Local(#[from] arbor_stream::StreamFailure),
    /// The daemon is stopping.
    #[error("stopped: the daemon is shutting down")]
    Stopped,
}

impl SessionError {
    /// The refusal this error is, as the other side is told it.
    pub fn refusal(&self) -> Refusal {
        use arbor_engine::{Error as E, Refusal as EngineRefusal, Resource};
        use arbor_stream::StreamFailure as F;
        let code = match self {
            SessionError::Refused(r) => return r.clone(),
            SessionError::Local(F::Engine(E::Exhausted(
                Resource::DataSpace | Resource::Metadata,
            ))) => RefusalCode::NoSpace,
            SessionError::Local(F::Engine(E::Refused(EngineRefusal::Conflict(_)))) => {
                RefusalCode::Diverged
            }
            SessionError::Local(F::Stream(_) | F::Refused(_))
            | SessionError::Proto(_)
            | SessionError::Unexpected { .. } => RefusalCode::Protocol,
            _ => RefusalCode::Failed,
        };
        Refusal {
            code,
            message: proto::bounded_message(&self.to_string()),
        }
    }
}

/// An engine task that panicked or was cancelled.
pub(crate) fn engine_task_failed(e: tokio::task::JoinError) -> SessionError {
    SessionError::Io(std::io::Error::other(format!("engine task: {e}")))
}

/// Runs `f` on a blocking thread (engine calls block on disk I/O).
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, SessionError> + Send + 'static,
) -> Result<T, SessionError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(engine_task_failed)?
}

/// Ends a running session from outside, with the refusal its peer is
/// told: what a configuration reload does to a session it no longer
/// allows. The session sees it at its next wait for the peer.
#[derive(Debug, Clone)]
pub struct Withdrawal(watch::Sender<Option<Refusal>>);

/// A session's side of a [`Withdrawal`] (given to its [`Reader`]).
#[derive(Debug)]
pub struct Withdrawn(watch::Receiver<Option<Refusal>>);

/// A withdrawal and the side a session's reader watches.
pub fn withdrawal() -> (Withdrawal, Withdrawn) {
    let (tx, rx) = watch::channel(None);
    (Withdrawal(tx), Withdrawn(rx))
}

impl Withdrawal {
    /// Ends the session with `refusal` (the first withdrawal stays).
    pub fn withdraw(&self, refusal: Refusal) {
        self.0.send_if_modified(|held| {
            if held.is_some() {
                return false;
            }
            *held = Some(refusal);
            true
        });
    }
}

impl Withdrawn {
    /// The refusal, if withdrawn.
    pub fn refusal(&self) -> Option<Refusal> {
        self.0.borrow().clone()
    }

    /// Waits for the withdrawal; never returns once the withdrawal was
    /// dropped without one.
    pub async fn wait(&mut self) -> Refusal {
        loop {
            if let Some(refusal) = self.0.borrow_and_update().clone() {
                return refusal;
            }
            if self.0.changed().await.is_err() {
                return std::future::pending().await;
            }
        }
    }
}

/// Waits for `withdrawn`'s refusal; forever when there is none to wait for.
async fn withdrawn_by(withdrawn: &mut Option<Withdrawn>) -> Refusal {
    match withdrawn {
        Some(w) => w.wait().await,
        None => std::future::pending().await,
    }
}

/// The reading half of a session.
pub struct Reader<R> {
    inner: R,
    decoder: FrameDecoder,
    buf: Vec<u8>,
    idle: Duration,
    /// Ends every wait for the peer with a refusal once withdrawn.
    withdrawn: Option<Withdrawn>,
    /// Bytes read from the connection.
    pub bytes: u64,
}

impl<R: AsyncRead + Unpin> Reader<R> {
    pub fn new(inner: R, idle: Duration) -> Self {
        Self {
            inner,
            decoder: FrameDecoder::new(),
            buf: vec![0; READ_BUF],
            idle,
            withdrawn: None,
            bytes: 0,
        }
    }

    /// This reader, failing every read with the refusal of `withdrawn`
    /// once it is withdrawn (messages already buffered included).
    pub fn withdrawn_by(mut self, withdrawn: Withdrawn) -> Self {
        self.withdrawn = Some(withdrawn);
        self
    }

    /// The next message; None when the peer closed between messages.
    pub async fn next(&mut self) -> Result<Option<Message>, SessionError> {
        self.next_within(Some(self.idle)).await
    }

    /// [`Reader::next`] without the idle timeout: for watching a peer that
    /// has nothing to say unless something fails, while sending to it
    /// (cancel-safe: a message half read stays buffered).
    pub async fn next_untimed(&mut self) -> Result<Option<Message>, SessionError> {
        self.next_within(None).await
    }

    async fn next_within(
        &mut self,
        idle: Option<Duration>,
    ) -> Result<Option<Message>, SessionError> {
        loop {
            if let Some(refusal) = self.withdrawn.as_ref().and_then(Withdrawn::refusal) {
                return Err(SessionError::Refused(refusal));
            }
            if let Some(m) = self.decoder.next_message()? {
                return Ok(Some(m));
            }
            let read = async {
                let read = self.inner.read(&mut self.buf);
                match idle {
                    Some(idle) => tokio::time::timeout(idle, read)
                        .await
                        .map_err(|_| SessionError::Idle(idle))?
                        .map_err(SessionError::from),
                    None => read.await.map_err(SessionError::from),
                }
            };
            // A read is cancel-safe: nothing is lost by ending it.
            let n = tokio::select! {
                biased;
                refusal = withdrawn_by(&mut self.withdrawn) => {
                    return Err(SessionError::Refused(refusal));
                }
                n = read => n?,
            };
            if n == 0 {
                if self.decoder.buffered() > 0 {
                    return Err(SessionError::Io(std::io::ErrorKind::UnexpectedEof.into()));
                }
                return Ok(None);
            }
            self.bytes += n as u64;
            self.decoder.push(&self.buf[..n]);
        }
    }

    /// The next message, which must be there.
    pub async fn expect(&mut self, expected: &'static str) -> Result<Message, SessionError> {
        match self.next().await? {
            Some(Message::Refuse(r)) | Some(Message::Failed(r)) => Err(SessionError::Refused(r)),
            Some(m) => Ok(m),
            None => Err(SessionError::Io(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("the peer closed the connection before its {expected}"),
            ))),
        }
    }
}

/// The writing half of a session.
pub struct Writer<W> {
    inner: W,
    idle: Duration,
    out: Vec<u8>,
    /// Bytes written to the connection.
    pub bytes: u64,
}

impl<W: AsyncWrite + Unpin> Writer<W> {
    pub fn new(inner: W, idle: Duration) -> Self {
        Self {
            inner,
            idle,
            out: Vec::new(),
            bytes: 0,
        }
    }

    /// Sends one message.
    pub async fn send(&mut self, message: &Message) -> Result<(), SessionError> {
        self.out.clear();
        proto::encode(message, &mut self.out);
        self.flush_out().await
    }

    /// Sends `bytes` of a stream as data frames.
    pub async fn send_data(&mut self, bytes: &[u8]) -> Result<(), SessionError> {
        self.out.clear();
        proto::encode_data(bytes, &mut self.out);
        self.flush_out().await
    }

    async fn flush_out(&mut self) -> Result<(), SessionError> {
        let write = async {
            self.inner.write_all(&self.out).await?;
            self.inner.flush().await
        };
        tokio::time::timeout(self.idle, write)
            .await
            .map_err(|_| SessionError::Idle(self.idle))??;
        self.bytes += self.out.len() as u64;
        Ok(())
    }

    /// Closes the writing direction (TLS close_notify, TCP FIN).
    pub async fn shutdown(&mut self) {
        // The session's outcome is already decided; a failing close changes
        // nothing the peer can act on.
        let _ = tokio::time::timeout(self.idle, self.inner.shutdown()).await;
    }
}
