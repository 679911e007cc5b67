//! The thin tokio server: accepts connections on TCP and Unix sockets and
//! runs each on its own thread, in a single-threaded tokio runtime (see the
//! `connection` module).
//!
//! Why a thread per connection: on a multi-threaded runtime a connection's
//! task is woken on whichever worker is free, and waking a parked worker
//! costs a context switch per batch of requests. On 2 cores that made a
//! single client's 4 KiB reads about 30 % slower than with one worker (A/B
//! in docs/PERFORMANCE.md), while one worker for everybody serialized all
//! clients. A thread of its own gives each connection the single-worker
//! path and lets connections run in parallel, as nbdkit does.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, ToSocketAddrs, UnixListener};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::access::Client;
use crate::connection::{
    negotiate, transmit, Budget, ConnectionError, Negotiated, Security, SharedBudget,
};
use crate::export::ExportProvider;
use crate::handshake::Session;
use crate::live::{Granted, LiveSecurity};
use crate::poll::{PollLimits, Polling};
use crate::proto::MAX_PAYLOAD;
use arbor_tls::handshakes::Handshakes;

/// The loopback address on the IANA NBD port; serving beyond the local
/// machine is an explicit choice.
pub const DEFAULT_TCP_ADDR: &str = "127.0.0.1:10809";

/// Tunables of [`serve`]. The defaults bound the request data a connection
/// holds to 64 MiB, and all connections together to 256 MiB.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Connections served at once; further clients wait in the listen
    /// backlog. When every slot is taken and a client is waiting, the
    /// connection that has been in its handshake longest is dropped to make
    /// room, so clients that connect and stall cannot keep others out.
    pub max_connections: usize,
    /// Requests per connection read but not yet answered.
    pub max_requests_in_flight: usize,
    /// Write payload and read reply bytes per connection held at once. At
    /// least [`MAX_PAYLOAD`] so one maximal request always fits.
    pub max_bytes_in_flight: u32,
    /// Write payload and read reply bytes held at once across all
    /// connections: the bound on the server's request memory, whatever
    /// the clients do. At least [`MAX_PAYLOAD`].
    pub max_bytes_total: u32,
    /// A client must reach the transmission phase within this time.
    pub handshake_timeout: Duration,
    /// A client that accepts no reply data for this long is disconnected,
    /// so one that stops reading cannot hold the shared budget forever.
    pub reply_stall_timeout: Duration,
    /// After shutdown is requested, how long connections may take to finish
    /// the requests they have in flight before they are dropped.
    pub shutdown_grace: Duration,
    /// How connections poll for their next request before sleeping
    /// ([`crate::poll`]).
    pub poll: PollLimits,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            max_connections: 256,
            max_requests_in_flight: 64,
            max_bytes_in_flight: 2 * MAX_PAYLOAD,
            max_bytes_total: 8 * MAX_PAYLOAD,
            handshake_timeout: Duration::from_secs(30),
            reply_stall_timeout: Duration::from_secs(30),
            shutdown_grace: Duration::from_secs(30),
            poll: PollLimits::default(),
        }
    }
}

/// A bound socket to accept NBD clients on, with what it asks of them
/// (TLS mode and grants; by default no TLS and every export writable),
/// replaceable while it serves ([`LiveSecurity`]).
pub struct Listener {
    socket: Socket,
    security: Arc<LiveSecurity>,
}

enum Socket {
    Tcp(TcpListener),
    Unix(UnixListener),
}

impl Listener {
    pub async fn bind_tcp(addr: impl ToSocketAddrs) -> std::io::Result<Self> {
        Ok(Self {
            socket: Socket::Tcp(TcpListener::bind(addr).await?),
            security: LiveSecurity::new(Security::open()),
        })
    }

    /// Binds a Unix socket at `path`, which must not exist yet.
    pub fn bind_unix(path: impl AsRef<Path>) -> std::io::Result<Self> {
        Ok(Self {
            socket: Socket::Unix(UnixListener::bind(path)?),
            security: LiveSecurity::new(Security::open()),
        })
    }

    /// Serves clients of this listener under `security`.
    pub fn with_security(self, security: Security) -> Self {
        self.with_live_security(LiveSecurity::new(security))
    }

    /// Serves clients of this listener under `security`, which its owner
    /// may replace while it serves.
    pub fn with_live_security(self, security: Arc<LiveSecurity>) -> Self {
        Self { security, ..self }
    }

    /// The bound TCP address (useful after binding port 0).
    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        match &self.socket {
            Socket::Tcp(listener) => listener.local_addr().ok(),
            Socket::Unix(_) => None,
        }
    }

    /// Accepts one client.
    async fn accept(&self) -> std::io::Result<Accepted> {
        match &self.socket {
            Socket::Tcp(listener) => {
                let (stream, peer) = listener.accept().await?;
                // Replies are flushed whole; Nagle would only delay them.
                stream.set_nodelay(true)?;
                // Moved to the connection's own runtime, which registers it anew.
                Ok(Accepted::Tcp(stream.into_std()?, peer.to_string()))
            }
            Socket::Unix(listener) => {
                let (stream, _) = listener.accept().await?;
                Ok(Accepted::Unix(stream.into_std()?))
            }
        }
    }
}

/// A client accepted but not yet given a connection slot.
enum Accepted {
    Tcp(std::net::TcpStream, String),
    Unix(std::os::unix::net::UnixStream),
}

impl Accepted {
    /// Starts the client's connection thread, tracked by `tracker`; the
    /// connection holds `slot` until it closes.
    fn start(
        self,
        server: &Arc<Server>,
        tracker: &TaskTracker,
        slot: OwnedSemaphorePermit,
        security: Arc<LiveSecurity>,
    ) -> std::io::Result<()> {
        match self {
            Self::Tcp(stream, peer) => {
                let attach = move || tokio::net::TcpStream::from_std(stream);
                Arc::clone(server).start_connection(tracker, slot, peer, security, attach)
            }
            Self::Unix(stream) => {
                let attach = move || tokio::net::UnixStream::from_std(stream);
                Arc::clone(server).start_connection(
                    tracker,
                    slot,
                    "unix".to_owned(),
                    security,
                    attach,
                )
            }
        }
    }
}

/// Threads a connection's runtime may use for requests that do not run
/// inline (flushes, large or slow I/O); more wait in its queue. Together
/// with the connection limit this bounds the server's threads.
const BLOCKING_THREADS_PER_CONNECTION: usize = 16;

/// Serves `provider`'s exports on every listener until `shutdown` is
/// cancelled, then stops accepting, lets connections finish the requests in
/// flight (for at most [`ServerConfig::shutdown_grace`]) and returns once
/// every connection has closed.
pub async fn serve(
    provider: Arc<dyn ExportProvider>,
    listeners: Vec<Listener>,
    config: ServerConfig,
    shutdown: CancellationToken,
) {
    let grace = config.shutdown_grace;
    let server = Arc::new(Server {
        provider,
        connection_slots: Arc::new(Semaphore::new(config.max_connections.max(1))),
        shared_budget: SharedBudget::new(config.max_bytes_total.max(MAX_PAYLOAD)),
        polling: Polling::new(config.poll),
        config,
        shutdown: shutdown.clone(),
        abort: CancellationToken::new(),
        next_id: std::sync::atomic::AtomicU64::new(1),
        handshakes: Handshakes::new(),
    });
    let connections = TaskTracker::new();
    let accept_loops = TaskTracker::new();
    for listener in listeners {
        accept_loops.spawn(Arc::clone(&server).accept_loop(listener, connections.clone()));
    }
    accept_loops.close();
    shutdown.cancelled().await;
    accept_loops.wait().await;
    connections.close();
    if tokio::time::timeout(grace, connections.wait())
        .await
        .is_err()
    {
        tracing::warn!("connections still busy after the shutdown grace period; dropping them");
        server.abort.cancel();
        connections.wait().await;
    }
}

struct Server {
    provider: Arc<dyn ExportProvider>,
    config: ServerConfig,
    connection_slots: Arc<Semaphore>,
    shared_budget: SharedBudget,
    polling: Polling,
    /// Graceful stop: no new requests, finish those in flight.
    shutdown: CancellationToken,
    /// Hard stop after the grace period: drop connections at once.
    abort: CancellationToken,
    next_id: std::sync::atomic::AtomicU64,
    /// Connections still in their handshake: the oldest makes room for a
    /// new connection when every slot is taken.
    handshakes: Arc<Handshakes>,
}

impl Server {
    /// Runs a connection on a thread of its own, in a single-threaded
    /// runtime; `attach` registers the socket with that runtime. `tracker`
    /// follows the thread, so shutdown waits for the connection to close.
    fn start_connection<S, A>(
        self: Arc<Self>,
        tracker: &TaskTracker,
        slot: OwnedSemaphorePermit,
        peer: String,
        security: Arc<LiveSecurity>,
        attach: A,
    ) -> std::io::Result<()>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
        A: FnOnce() -> std::io::Result<S> + Send + 'static,
    {
        // Dropped when the thread ends, however it ends, which wakes the
        // tracked task below.
        let (ended, on_end) = tokio::sync::oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("nbd-connection".to_owned())
            .spawn(move || {
                let _ended = ended;
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .max_blocking_threads(BLOCKING_THREADS_PER_CONNECTION)
                    .build();
                let runtime = match runtime {
                    Ok(runtime) => runtime,
                    Err(error) => {
                        tracing::warn!(%error, %peer, "cannot start a connection's runtime");
                        return;
                    }
                };
                runtime.block_on(async move {
                    match attach() {
                        Ok(stream) => self.run_connection(stream, peer, security, slot).await,
                        Err(error) => tracing::warn!(%error, %peer, "cannot register a connection"),
                    }
                });
            })?;
        tracker.spawn(async move {
            // An error only says the sender is gone: the thread has ended.
            let _ = on_end.await;
        });
        Ok(())
    }

    async fn accept_loop(self: Arc<Self>, listener: Listener, connections: TaskTracker) {
        loop {
            let accepted = tokio::select! {
                biased;
                () = self.shutdown.cancelled() => return,
                accepted = listener.accept() => accepted,
            };
            let accepted = match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Typically EMFILE: back off instead of spinning.
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            // At the limit, this client waits here, and further ones in the
            // listen backlog, costing no memory; the oldest handshake is
            // dropped to make room (see `ServerConfig::max_connections`).
            let slot = tokio::select! {
                biased;
                () = self.shutdown.cancelled() => return,
                slot = self.handshakes.slot(&self.connection_slots) => match slot {
                    Ok(slot) => slot,
                    // Never closed; treat as shutdown all the same.
                    Err(_) => return,
                },
            };
            let security = Arc::clone(&listener.security);
            if let Err(error) = accepted.start(&self, &connections, slot, security) {
                tracing::warn!(%error, "cannot start a connection");
            }
        }
    }

    async fn run_connection<S>(
        self: Arc<Self>,
        stream: S,
        peer: String,
        security: Arc<LiveSecurity>,
        _slot: OwnedSemaphorePermit,
    ) where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let id = self
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let span = tracing::info_span!("nbd", connection = id, %peer);
        let abort = self.abort.clone();
        tokio::select! {
            () = abort.cancelled() => {}
            result = self.connection(stream, &security).instrument(span.clone()) => match result {
                Ok(()) => tracing::debug!(parent: &span, "connection closed"),
                // A flood would log a line per eviction: keep those quiet.
                Err(error @ ConnectionError::Evicted) => {
                    tracing::debug!(parent: &span, %error, "connection dropped")
                }
                Err(error) => tracing::info!(parent: &span, %error, "connection dropped"),
            },
        }
    }

    async fn connection<S>(
        &self,
        stream: S,
        live: &Arc<LiveSecurity>,
    ) -> Result<(), ConnectionError>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let registered = self.handshakes.enter();
        // Off the line before the client learns its handshake is over, so a
        // newcomer never drops a session.
        let transmitting = || registered.leave();
        let (security, generation) = live.negotiating();
        let handshake = negotiate(stream, &self.provider, &security, &transmitting);
        let negotiated = tokio::select! {
            () = self.shutdown.cancelled() => return Ok(()),
            () = registered.dropped() => return Err(ConnectionError::Evicted),
            negotiated = tokio::time::timeout(self.config.handshake_timeout, handshake) => {
                negotiated.map_err(|_| ConnectionError::HandshakeTimeout)??
            }
        };
        drop(registered);
        let (client, chain) = match &negotiated {
            None => return Ok(()),
            Some(Negotiated::Plain(..)) => (Client::anonymous(), Vec::new()),
            Some(Negotiated::Tls(stream, _)) => {
                let state = stream.get_ref().1;
                let identity = arbor_tls::peer_identity(state).ok();
                let chain = arbor_tls::peer_chain(state);
                (
                    Client {
                        tls: true,
                        identity,
                    },
                    chain,
                )
            }
        };
        let close = self.shutdown.child_token();
        let admit = |session: &Session| {
            live.admit(Granted {
                client,
                chain,
                export: session.export_name.clone(),
                writable: !session.read_only,
                generation,
                close: close.clone(),
            })
            .map_err(ConnectionError::GrantWithdrawn)
        };
        match negotiated {
            None => Ok(()),
            Some(Negotiated::Plain(stream, session)) => {
                let _admitted = admit(&session)?;
                self.transmission(stream, session, close).await
            }
            Some(Negotiated::Tls(stream, session)) => {
                let _admitted = admit(&session)?;
                self.transmission(stream, session, close).await
            }
        }
    }

    /// Serves a session until the client leaves, the server stops or
    /// `close` is cancelled (a reload withdrew its grant).
    async fn transmission<S>(
        &self,
        stream: S,
        session: Session,
        close: CancellationToken,
    ) -> Result<(), ConnectionError>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        tracing::info!(
            export = %session.export_name,
            size = session.size,
            structured = session.structured,
            extended = session.extended,
            "transmission started"
        );
        let budget = Budget::new(
            self.config.max_requests_in_flight,
            self.config.max_bytes_in_flight.max(MAX_PAYLOAD),
            self.shared_budget.clone(),
        );
        transmit(
            stream,
            session,
            budget,
            (self.config.reply_stall_timeout, self.polling.clone()),
            close,
        )
        .await
    }
}
