//! One client connection: drives the [`Handshake`] state machine over the
//! socket, then runs the transmission phase as two halves joined in one
//! task:
//!
//! * the **reader** decodes requests one after another, reserves their
//!   memory from the connection's [`Budget`] (waiting, and so no longer
//!   reading the socket, while the budget is exhausted), and runs each valid
//!   request: small reads and writes inline, on this task, while they stay
//!   fast (see [`Dispatch`]), everything else on `spawn_blocking`, so slow
//!   requests run concurrently;
//! * the **writer** sends each completed reply whole, in completion order,
//!   so chunks of one structured reply are never interleaved with another's,
//!   and releases the reply's reservation once it is written.
//!
//! `NBD_CMD_DISC`, end of input, a framing error or server shutdown stop the
//! reader; the writer then drains the replies of requests still running and
//! the connection closes.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, BufWriter};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::access::{AccessList, Client};
use crate::buffers::{Buffer, BufferPool};
use crate::dispatch::{execute, Reply, ReplyContext};
use crate::export::ExportProvider;
use crate::handshake::{greeting, Handshake, HandshakeError, Session, Step, TlsMode};
use crate::poll::{PollWindow, Polling};
use crate::proto::{Errno, EXTENDED_REQUEST_HEADER_LEN, MAX_PAYLOAD, MAX_UNNEGOTIATED_PAYLOAD};
use crate::transmission::{
    validate, Command, FramingError, Limits, Payload, Rejection, RequestHeader,
};

/// Why a connection ended other than by the client's choice.
#[derive(Debug, thiserror::Error)]
pub enum ConnectionError {
    #[error("socket: {0}")]
    Io(#[from] std::io::Error),
    #[error("handshake: {0}")]
    Handshake(#[from] HandshakeError),
    #[error("transmission: {0}")]
    Framing(#[from] FramingError),
    #[error("handshake not completed in time")]
    HandshakeTimeout,
    #[error("the client stopped reading replies")]
    ReplyStalled,
    #[error("export provider panicked during the handshake")]
    ProviderPanicked,
    #[error("TLS handshake failed: {0}")]
    Tls(std::io::Error),
    #[error("client certificate: {0}")]
    Identity(arbor_tls::TlsError),
    #[error("dropped during the handshake to make room for a new connection")]
    Evicted,
    #[error("closed: {0} (the configuration was reloaded)")]
    GrantWithdrawn(String),
}

/// What a listener asks of its clients: its TLS mode, the certificates
/// TLS uses, and the grants that decide which exports each client may see,
/// read and write.
#[derive(Clone)]
pub struct Security {
    mode: TlsMode,
    tls: Option<arbor_tls::Tls>,
    access: Arc<AccessList>,
}

impl std::fmt::Debug for Security {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Security")
            .field("mode", &self.mode)
            .field("access", &self.access)
            .finish_non_exhaustive()
    }
}

/// A [`Security`] that cannot work: TLS on without certificates.
#[derive(Debug, thiserror::Error)]
#[error("TLS mode {0:?} needs certificates")]
pub struct NoCertificates(pub TlsMode);

impl Security {
    /// No TLS; every client may write every export.
    pub fn open() -> Self {
        Self {
            mode: TlsMode::Off,
            tls: None,
            access: Arc::new(AccessList::unrestricted()),
        }
    }

    /// `mode` other than `Off` needs `tls`.
    pub fn new(
        mode: TlsMode,
        tls: Option<arbor_tls::Tls>,
        access: AccessList,
    ) -> Result<Self, NoCertificates> {
        if mode != TlsMode::Off && tls.is_none() {
            return Err(NoCertificates(mode));
        }
        Ok(Self {
            mode,
            tls,
            access: Arc::new(access),
        })
    }

    pub fn mode(&self) -> TlsMode {
        self.mode
    }

    /// The certificates TLS uses, if any.
    pub fn tls(&self) -> Option<&arbor_tls::Tls> {
        self.tls.as_ref()
    }

    /// The grants.
    pub fn access(&self) -> &AccessList {
        &self.access
    }
}

/// The stream and session of a connection that reached transmission:
/// plaintext, or after STARTTLS.
pub enum Negotiated<S> {
    Plain(S, Session),
    Tls(Box<tokio_rustls::server::TlsStream<S>>, Session),
}

/// How a round of option haggling on one stream ended.
enum Haggled {
    Transmit(Session),
    Close,
    StartTls,
}

/// Limits on work in flight, which bound the memory clients can make the
/// server hold: per connection, at most `bytes` of write payloads and reply
/// data across at most `requests` requests, between reading a request and
/// writing its reply; across all connections, at most the server-wide
/// `shared` bytes. A connection waits for its own budget before the shared
/// one, so no single client can hold more than its share, and the shared
/// semaphore queues waiters in order, so a greedy client cannot starve
/// the others.
#[derive(Clone)]
pub struct Budget {
    requests: Arc<Semaphore>,
    bytes: Arc<Semaphore>,
    byte_capacity: u32,
    shared: SharedBudget,
}

/// The server-wide byte budget, shared by every connection, and the pool
/// that recycles large request buffers between requests. The pool keeps at
/// most a quarter of the budget idle, so request memory stays within 1.25
/// times the budget.
#[derive(Clone)]
pub struct SharedBudget {
    bytes: Arc<Semaphore>,
    capacity: u32,
    buffers: Arc<BufferPool>,
}

impl SharedBudget {
    pub fn new(capacity: u32) -> Self {
        Self {
            bytes: Arc::new(Semaphore::new(capacity as usize)),
            capacity,
            buffers: BufferPool::new(capacity as usize / 4),
        }
    }
}

/// Work admitted by a [`Budget`]; dropping it gives the capacity back.
pub struct Reservation {
    _request: OwnedSemaphorePermit,
    _bytes: OwnedSemaphorePermit,
    _shared: OwnedSemaphorePermit,
}

impl Budget {
    pub fn new(requests: usize, bytes: u32, shared: SharedBudget) -> Self {
        Self {
            requests: Arc::new(Semaphore::new(requests.max(1))),
            bytes: Arc::new(Semaphore::new(bytes as usize)),
            byte_capacity: bytes,
            shared,
        }
    }

    /// The largest request that fits this connection's budget and the
    /// server's.
    pub fn largest_request(&self) -> u32 {
        self.byte_capacity.min(self.shared.capacity)
    }

    /// Waits until one more request of `bytes` bytes fits. A request larger
    /// than a whole budget is admitted alone rather than never.
    async fn reserve(&self, bytes: u64) -> Reservation {
        let clamp = |capacity: u32| u32::try_from(bytes).map_or(capacity, |b| b.min(capacity));
        let request = Arc::clone(&self.requests).acquire_owned().await;
        let own = Arc::clone(&self.bytes)
            .acquire_many_owned(clamp(self.byte_capacity))
            .await;
        let shared = Arc::clone(&self.shared.bytes)
            .acquire_many_owned(clamp(self.shared.capacity))
            .await;
        match (request, own, shared) {
            (Ok(request), Ok(own), Ok(shared)) => Reservation {
                _request: request,
                _bytes: own,
                _shared: shared,
            },
            // Acquiring fails only on a closed semaphore, and these are
            // private to the budgets, which never close them.
            _ => unreachable!("budget semaphores are never closed"),
        }
    }
}

/// Runs the handshake under `security`, upgrading to TLS if the client
/// asks; `None` if the client ended it without choosing an export.
pub async fn negotiate<S>(
    mut stream: S,
    provider: &Arc<dyn ExportProvider>,
    security: &Security,
    transmitting: &(dyn Fn() + Send + Sync),
) -> Result<Option<Negotiated<S>>, ConnectionError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    stream.write_all(&greeting()).await?;
    let mut handshake = Handshake::for_client(
        Client::anonymous(),
        security.mode,
        Arc::clone(&security.access),
    );
    match haggle(&mut stream, &mut handshake, provider, transmitting).await? {
        Haggled::Transmit(session) => return Ok(Some(Negotiated::Plain(stream, session))),
        Haggled::Close => return Ok(None),
        Haggled::StartTls => {}
    }
    // The handshake answers STARTTLS with an ACK only in a mode that
    // `Security::new` gave certificates; refuse rather than trust that.
    let Some(tls) = &security.tls else {
        return Err(ConnectionError::Identity(arbor_tls::TlsError::Config(
            "STARTTLS acknowledged without certificates".into(),
        )));
    };
    let mut stream = tls
        .acceptor_client_optional()
        .accept(stream)
        .await
        .map_err(ConnectionError::Tls)?;
    let identity = match arbor_tls::peer_identity(stream.get_ref().1) {
        Ok(identity) => Some(identity),
        Err(arbor_tls::TlsError::NoPeerCertificate) => None,
        Err(error) => return Err(ConnectionError::Identity(error)),
    };
    tracing::debug!(
        identity = identity.as_deref().unwrap_or("(none)"),
        "TLS started"
    );
    handshake.tls_established(identity);
    match haggle(&mut stream, &mut handshake, provider, transmitting).await? {
        Haggled::Transmit(session) => Ok(Some(Negotiated::Tls(Box::new(stream), session))),
        // The handshake refuses a second STARTTLS, so this is a close.
        Haggled::Close | Haggled::StartTls => Ok(None),
    }
}

/// Feeds the client's options to `handshake` and sends its replies until
/// it says to transmit, close or start TLS. `transmitting` is called
/// before the reply that ends the handshake goes out: once the client has
/// it, the connection must count as a session (the server never drops a
/// session to make room, only a connection still in its handshake).
async fn haggle<S>(
    stream: &mut S,
    handshake: &mut Handshake,
    provider: &Arc<dyn ExportProvider>,
    transmitting: &(dyn Fn() + Send + Sync),
) -> Result<Haggled, ConnectionError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    loop {
        let mut input = vec![0u8; handshake.wanted()];
        stream.read_exact(&mut input).await?;
        // The provider may block (it opens volumes), so it runs off the runtime.
        let provider = Arc::clone(provider);
        let mut owned = std::mem::take(handshake);
        let (returned, step) = tokio::task::spawn_blocking(move || {
            let step = owned.receive(&input, provider.as_ref());
            (owned, step)
        })
        .await
        .map_err(|_| ConnectionError::ProviderPanicked)?;
        *handshake = returned;
        let (reply, haggled) = match step? {
            Step::Continue { reply } => (reply, None),
            Step::StartTls { reply } => (reply, Some(Haggled::StartTls)),
            Step::Transmit { reply, session } => {
                transmitting();
                (reply, Some(Haggled::Transmit(session)))
            }
            Step::Close { reply } => (reply, Some(Haggled::Close)),
        };
        stream.write_all(&reply).await?;
        if let Some(haggled) = haggled {
            // The ACK of STARTTLS must be out before the TLS handshake.
            stream.flush().await?;
            return Ok(haggled);
        }
    }
}

/// A finished reply on its way to the writer, with the reservation it holds.
struct Outgoing {
    reply: Reply,
    _reservation: Reservation,
}

/// Runs the transmission phase until the client disconnects, the stream
/// breaks, or `stop` is cancelled; requests in flight are always answered
/// (or their replies dropped, if the socket is gone) before this returns.
pub async fn transmit<S>(
    stream: S,
    session: Session,
    budget: Budget,
    (stall_timeout, polling): (Duration, Polling),
    stop: CancellationToken,
) -> Result<(), ConnectionError>
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (read_half, write_half) = tokio::io::split(stream);
    let (replies, outgoing) = mpsc::unbounded_channel();
    // Cancelled by the writer when the socket breaks, so the reader stops too.
    let stop = stop.child_token();
    let reader = read_requests(read_half, &session, (&budget, polling), replies, &stop);
    let writer = write_replies(write_half, outgoing, stall_timeout, &stop);
    let (read_result, write_result) = reader_then_writer(reader, writer).await;
    read_result.and(write_result)
}

/// Runs both halves to completion, polling the reader before the writer
/// every time (`tokio::join!` alternates which goes first). A request the
/// reader runs inline queues its reply and wakes this task; polled in this
/// same turn, the writer sends it at once, where after the reader it would
/// wait for the runtime's next turn, a poll of the I/O driver on the way.
async fn reader_then_writer<R, W>(reader: R, writer: W) -> (R::Output, W::Output)
where
    R: std::future::Future,
    W: std::future::Future,
{
    let mut reader = std::pin::pin!(reader);
    let mut writer = std::pin::pin!(writer);
    let mut read = None;
    let mut written = None;
    std::future::poll_fn(|cx| {
        if read.is_none() {
            if let std::task::Poll::Ready(output) = reader.as_mut().poll(cx) {
                read = Some(output);
            }
        }
        if written.is_none() {
            if let std::task::Poll::Ready(output) = writer.as_mut().poll(cx) {
                written = Some(output);
            }
        }
        match (read.take(), written.take()) {
            (Some(read), Some(written)) => std::task::Poll::Ready((read, written)),
            (r, w) => {
                read = r;
                written = w;
                std::task::Poll::Pending
            }
        }
    })
    .await
}

/// A connection's polling for its next request (see [`crate::poll`]).
struct ConnectionPoll {
    window: PollWindow,
    polling: Polling,
}

/// Polls `future` once, in the calling task's context.
async fn poll_once<F: std::future::Future>(
    mut future: std::pin::Pin<&mut F>,
) -> std::task::Poll<F::Output> {
    std::future::poll_fn(|cx| std::task::Poll::Ready(future.as_mut().poll(cx))).await
}

/// Reads the next request header into `header`. When it has not arrived
/// yet, and the connection's window is open, the connection has no request
/// on the blocking pool and a turn is free, it looks for it again and again
/// for the window's length before sleeping: each look yields to the
/// runtime, which sends replies due and polls the sockets without waiting
/// (see [`crate::poll`] for why). Every wait teaches the window.
async fn next_header<R: AsyncRead + Unpin>(
    input: &mut BufReader<R>,
    header: &mut [u8],
    poll: &mut ConnectionPoll,
    busy: bool,
) -> std::io::Result<usize> {
    let mut read = std::pin::pin!(input.read_exact(header));
    // Under a deep queue the next header is mostly here already.
    if let std::task::Poll::Ready(read) = poll_once(read.as_mut()).await {
        return read;
    }
    let waiting = Instant::now();
    let window = poll.window.window();
    if !window.is_zero() && !busy {
        if let Some(_turn) = poll.polling.try_poll() {
            while waiting.elapsed() < window {
                tokio::task::yield_now().await;
                if let std::task::Poll::Ready(read) = poll_once(read.as_mut()).await {
                    poll.window.waited(waiting.elapsed());
                    return read;
                }
            }
        }
    }
    let read = read.await;
    poll.window.waited(waiting.elapsed());
    read
}

async fn read_requests<R: AsyncRead + Unpin>(
    read_half: R,
    session: &Session,
    (budget, polling): (&Budget, Polling),
    replies: mpsc::UnboundedSender<Outgoing>,
    stop: &CancellationToken,
) -> Result<(), ConnectionError> {
    let mut input = BufReader::with_capacity(64 * 1024, read_half);
    let mut dispatch = Dispatch::new(session.export.small_io_inline());
    let mut poll = ConnectionPoll {
        window: polling.window(),
        polling,
    };
    let limits = Limits {
        size: session.size,
        read_only: session.read_only,
        framing: session.framing(),
        block_status: !session.contexts.is_empty(),
        byte_granular: session.byte_granular,
        min_block: session.min_block,
        max_payload: if session.byte_granular {
            // The constants are ordered (checked at compile time in proto).
            budget
                .largest_request()
                .clamp(MAX_PAYLOAD, MAX_UNNEGOTIATED_PAYLOAD)
        } else {
            MAX_PAYLOAD
        },
    };
    // Compact or extended, as negotiated; either fits the buffer (an empty
    // slice, impossible, would fail to decode and close the connection).
    let mut buffer = [0u8; EXTENDED_REQUEST_HEADER_LEN];
    let header_bytes = buffer
        .get_mut(..limits.framing.request_header_len())
        .unwrap_or_default();
    loop {
        let read = tokio::select! {
            biased;
            () = stop.cancelled() => return Ok(()),
            read = next_header(&mut input, header_bytes, &mut poll, dispatch.busy()) => read,
        };
        match read {
            Ok(_) => {}
            // The client hung up between requests (or mid-request: nothing
            // can be answered for a request that never fully arrived).
            Err(error) if error.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(error) => return Err(error.into()),
        }
        let header = RequestHeader::decode(limits.framing, header_bytes)?;
        let request = Request {
            header,
            validated: validate(&header, &limits),
            payload: header.payload(&limits)?,
        };
        if request.validated == Ok(Command::Disconnect) {
            tracing::debug!("client sent NBD_CMD_DISC");
            return Ok(());
        }
        // The export's rate limits: held before its payload is read, so a
        // throttled client holds no memory here.
        if let Some((kind, bytes)) = request.validated.as_ref().ok().and_then(crate::qos::cost) {
            let wait = session.export.admit(kind, bytes);
            if !wait.is_zero() {
                tokio::select! {
                    biased;
                    () = stop.cancelled() => return Ok(()),
                    () = tokio::time::sleep(wait) => {}
                }
            }
        }
        let reservation = tokio::select! {
            biased;
            () = stop.cancelled() => return Ok(()),
            reservation = budget.reserve(request.memory_bound()) => reservation,
        };
        let payload = tokio::select! {
            biased;
            () = stop.cancelled() => return Ok(()),
            payload = request.receive_payload(&mut input, &budget.shared.buffers) => payload?,
        };
        // Bytes of another request already received: the client is not
        // waiting for this one alone.
        let more_waiting = !input.buffer().is_empty();
        request.dispatch(
            session,
            payload,
            reservation,
            &replies,
            (&mut dispatch, more_waiting),
            &budget.shared.buffers,
        );
    }
}

/// A decoded request and the outcome of validating it.
struct Request {
    header: RequestHeader,
    validated: Result<Command, Rejection>,
    /// What follows the header on the wire.
    payload: Payload,
}

impl Request {
    /// Bytes held for this request: its write payload, if it will be kept,
    /// plus the reply data it may produce.
    fn memory_bound(&self) -> u64 {
        match (&self.validated, self.payload) {
            (Ok(command), Payload::Receive(len)) => u64::from(len) + command.reply_size_bound(),
            (Ok(command), _) => command.reply_size_bound(),
            (Err(_), _) => 0,
        }
    }

    /// Reads the write payload, or reads and drops it when the request is
    /// rejected anyway (keeping the stream in sync with bounded memory).
    async fn receive_payload<R: AsyncRead + Unpin>(
        &self,
        input: &mut R,
        buffers: &Arc<BufferPool>,
    ) -> std::io::Result<Buffer> {
        match (self.payload, &self.validated) {
            (Payload::None, _) => Ok(buffers.take_empty(0)),
            (Payload::Receive(len), Ok(_)) => {
                // `len <= max_payload` and reserved in the budget. Read into
                // spare capacity: zeroing a buffer the socket then overwrites
                // was a tenth of the server's time on 1 MiB writes.
                let len = len as usize;
                let mut payload = buffers.take_empty(len);
                let mut rest = input.take(len as u64);
                while payload.len() < len {
                    if rest.read_buf(&mut *payload).await? == 0 {
                        return Err(std::io::ErrorKind::UnexpectedEof.into());
                    }
                }
                Ok(payload)
            }
            // A rejected write's data, or a payload no command takes: read
            // and dropped in small pieces, keeping the stream in sync.
            (Payload::Receive(len), Err(_)) => drain(input, len.into(), buffers).await,
            (Payload::Discard(len), _) => drain(input, len, buffers).await,
        }
    }

    /// Answers a rejected request at once; runs a valid one inline or on the
    /// blocking pool (as `dispatch` decides), sending the reply when done.
    fn dispatch(
        self,
        session: &Session,
        payload: Buffer,
        reservation: Reservation,
        replies: &mpsc::UnboundedSender<Outgoing>,
        (dispatch, more_waiting): (&mut Dispatch, bool),
        buffers: &Arc<BufferPool>,
    ) {
        let context = ReplyContext {
            cookie: self.header.cookie,
            offset: self.header.offset,
            framing: session.framing(),
        };
        let command = match self.validated {
            Ok(command) => command,
            Err(rejection) => {
                tracing::debug!(?self.header, ?rejection, "request rejected");
                let reply = context.error(rejection.errno, rejection.message);
                // A send fails only once the writer is gone, when no reply
                // can be delivered anyway.
                let _ = replies.send(Outgoing {
                    reply,
                    _reservation: reservation,
                });
                return;
            }
        };
        tracing::trace!(?command, cookie = context.cookie, "request");
        let export = Arc::clone(&session.export);
        let contexts = Arc::clone(&session.contexts);
        let replies = replies.clone();
        let buffers = Arc::clone(buffers);
        let mut payload = payload;
        let run = move || {
            // A panicking export must still answer, or the client waits forever.
            let reply = catch_unwind(AssertUnwindSafe(|| {
                execute(
                    export.as_ref(),
                    context,
                    &contexts,
                    command,
                    &mut payload,
                    &buffers,
                )
            }))
            .unwrap_or_else(|_| {
                tracing::error!(?command, "export panicked");
                context.error(Errno::Io, "internal server error")
            });
            let _ = replies.send(Outgoing {
                reply,
                _reservation: reservation,
            });
        };
        dispatch.when_idle = session
            .export
            .inline_only_when_idle(matches!(command, Command::Write { .. }));
        if dispatch.inline(&command, Instant::now(), more_waiting) {
            let started = Instant::now();
            run();
            dispatch.ran_inline(started, Instant::now());
        } else {
            let on_pool = dispatch.on_pool();
            tokio::task::spawn_blocking(move || {
                run();
                drop(on_pool);
            });
        }
    }
}

/// Reads `len` bytes of payload and drops them; an empty buffer stands for
/// the payload.
async fn drain<R: AsyncRead + Unpin>(
    input: &mut R,
    len: u64,
    buffers: &Arc<BufferPool>,
) -> std::io::Result<Buffer> {
    let discarded = tokio::io::copy(&mut input.take(len), &mut tokio::io::sink()).await?;
    if discarded < len {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    Ok(buffers.take_empty(0))
}

/// Where a connection runs its requests. A thread hand-off per request
/// (`spawn_blocking`, then waking the writer) costs more than a 4 KiB read or
/// write served from the page cache, and it dominated small-I/O profiles;
/// run inline, such a request costs no context switch at all, as the reply
/// is written by the same task. But an inline request blocks this runtime
/// worker and serializes the connection's requests, which is right only
/// while they are fast. So small reads and writes run inline until one is
/// slow (a cache miss on a slow disk, a wait for a commit); then the
/// connection sends everything to the blocking pool, where slow requests
/// overlap, for a while before trying inline again.
#[derive(Debug)]
struct Dispatch {
    /// The export allows it ([`Export::small_io_inline`]).
    enabled: bool,
    /// Only while the connection is idle ([`Export::inline_only_when_idle`],
    /// for the request at hand).
    when_idle: bool,
    /// Inline execution is paused until then, after a slow inline request.
    paused_until: Option<Instant>,
    /// Requests of this connection running on the blocking pool.
    on_pool: Arc<AtomicUsize>,
    /// With `when_idle`: the client queued requests behind each other
    /// lately, so none runs inline until then.
    queued_until: Option<Instant>,
}

/// A request on the blocking pool, counted until dropped.
struct OnPool(Arc<AtomicUsize>);

impl Drop for OnPool {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Dispatch {
    /// Largest read or write run inline: copying it costs microseconds.
    const INLINE_MAX_LEN: u32 = 64 * 1024;
    /// An inline request slower than this was not served from memory.
    const SLOW: Duration = Duration::from_millis(1);
    /// How long a slow inline request sends requests to the blocking pool.
    const PAUSE: Duration = Duration::from_millis(250);

    fn new(enabled: bool) -> Self {
        Self {
            enabled,
            when_idle: false,
            paused_until: None,
            on_pool: Arc::default(),
            queued_until: None,
        }
    }

    /// Requests of this connection are running on the blocking pool.
    fn busy(&self) -> bool {
        self.on_pool.load(Ordering::Acquire) > 0
    }

    /// Counts a request sent to the blocking pool until the guard drops.
    fn on_pool(&self) -> OnPool {
        self.on_pool.fetch_add(1, Ordering::AcqRel);
        OnPool(Arc::clone(&self.on_pool))
    }

    /// How long a client seen queueing requests keeps them off the
    /// connection's thread (with `when_idle`): a deep queue drains now and
    /// then, and its next request must not stall the reader meanwhile.
    const QUEUED: Duration = Duration::from_millis(50);

    /// Whether `command` runs inline; `more_waiting`: another request has
    /// been received already.
    fn inline(&mut self, command: &Command, now: Instant, more_waiting: bool) -> bool {
        if self.when_idle {
            if more_waiting || self.on_pool.load(Ordering::Acquire) > 0 {
                self.queued_until = Some(now + Self::QUEUED);
                return false;
            }
            if self.queued_until.is_some_and(|until| now < until) {
                return false;
            }
        }
        let small = match *command {
            // FUA makes a write wait for the disk: never inline.
            Command::Read { length, .. }
            | Command::Write {
                length, fua: false, ..
            } => length <= Self::INLINE_MAX_LEN,
            _ => false,
        };
        self.enabled && small && self.paused_until.is_none_or(|until| now >= until)
    }

    /// After a request ran inline: a slow one pauses inline execution,
    /// unless it ran only because the connection was idle (`when_idle`).
    /// Then a client that queued more requests behind it is seen at the
    /// next request (which goes to the pool, and keeps the next ones there
    /// for [`Self::QUEUED`]), and a client at queue depth 1, which queues
    /// nothing, loses nothing by the wait: pausing it would only add a
    /// hand-off to each of its requests for the next [`Self::PAUSE`] (a
    /// write waiting for a snapshot did so for a quarter of a second
    /// after each snapshot; PERFORMANCE.md § 11).
    fn ran_inline(&mut self, started: Instant, finished: Instant) {
        if !self.when_idle && finished.saturating_duration_since(started) > Self::SLOW {
            self.paused_until = Some(finished + Self::PAUSE);
        }
    }
}

async fn write_replies<W: AsyncWrite + Unpin>(
    write_half: W,
    mut outgoing: mpsc::UnboundedReceiver<Outgoing>,
    stall_timeout: Duration,
    stop: &CancellationToken,
) -> Result<(), ConnectionError> {
    let mut output = BufWriter::with_capacity(256 * 1024, write_half);
    let result = async {
        // Ends when the reader and every running request have dropped their
        // senders, i.e. when every admitted request has been answered.
        while let Some(message) = outgoing.recv().await {
            for part in &message.reply.parts {
                for piece in part.chunks(STALL_CHECK_BYTES) {
                    within(stall_timeout, output.write_all(piece)).await?;
                }
            }
            // Flush only when no other reply is ready, to batch small replies.
            if outgoing.is_empty() {
                within(stall_timeout, output.flush()).await?;
            }
        }
        within(stall_timeout, output.shutdown()).await
    }
    .await;
    if result.is_err() {
        stop.cancel();
    }
    result
}

/// Replies are written in pieces of this size, each of which must be
/// accepted by the client within the stall timeout: a slow reader keeps its
/// connection, one that stops reading loses it and the budget it holds.
const STALL_CHECK_BYTES: usize = 1 << 20;

async fn within(
    limit: Duration,
    write: impl std::future::Future<Output = std::io::Result<()>>,
) -> Result<(), ConnectionError> {
    match tokio::time::timeout(limit, write).await {
        Ok(written) => Ok(written?),
        Err(_) => Err(ConnectionError::ReplyStalled),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(length: u32) -> Command {
        Command::Read {
            offset: 0,
            length,
            dont_fragment: false,
        }
    }

    fn write(length: u32, fua: bool) -> Command {
        Command::Write {
            offset: 0,
            length,
            fua,
        }
    }

    #[test]
    fn only_small_reads_and_plain_writes_run_inline() {
        let now = Instant::now();
        let mut dispatch = Dispatch::new(true);
        assert!(!Dispatch::new(false).inline(&read(4096), now, false));
        assert!(dispatch.inline(&read(4096), now, false));
        assert!(dispatch.inline(&read(Dispatch::INLINE_MAX_LEN), now, false));
        assert!(dispatch.inline(&write(Dispatch::INLINE_MAX_LEN, false), now, false));
        assert!(!dispatch.inline(&read(Dispatch::INLINE_MAX_LEN + 512), now, false));
        assert!(!dispatch.inline(&write(Dispatch::INLINE_MAX_LEN + 512, false), now, false));
        assert!(!dispatch.inline(&write(4096, true), now, false));
        assert!(!dispatch.inline(&Command::Flush, now, false));
        let trim = Command::Trim {
            offset: 0,
            length: 4096,
            fua: false,
        };
        assert!(!dispatch.inline(&trim, now, false));
    }

    #[test]
    fn when_idle_only_a_lone_request_runs_inline() {
        let now = Instant::now();
        let mut dispatch = Dispatch::new(true);
        dispatch.when_idle = true;
        assert!(dispatch.inline(&read(4096), now, false));
        assert!(dispatch.inline(&read(4096), now, false), "a client at QD1");
        assert!(
            !dispatch.inline(&read(4096), now, true),
            "another request waits"
        );
        let first = dispatch.on_pool();
        let second = dispatch.on_pool();
        let later = now + Dispatch::QUEUED;
        assert!(
            !dispatch.inline(&read(4096), later, false),
            "two on the pool"
        );
        drop(first);
        assert!(
            !dispatch.inline(&read(4096), later, false),
            "one on the pool"
        );
        drop(second);
        // Idle, but the client queued requests a moment ago.
        assert!(!dispatch.inline(&read(4096), later, false));
        let quiet = later + Dispatch::QUEUED;
        assert!(
            dispatch.inline(&read(4096), quiet, false),
            "idle for a while"
        );
        assert!(
            !dispatch.inline(&write(4096, true), quiet, false),
            "FUA never"
        );
        // Without the flag, the queue does not matter.
        let mut busy = Dispatch::new(true);
        let _held = busy.on_pool();
        assert!(busy.inline(&read(4096), now, true));
    }

    #[test]
    fn a_slow_inline_request_sends_requests_to_the_pool_for_a_while() {
        let start = Instant::now();
        let mut dispatch = Dispatch::new(true);
        dispatch.ran_inline(start, start + Dispatch::SLOW);
        assert!(dispatch.inline(&read(4096), start + Dispatch::SLOW, false));

        let finished = start + Dispatch::SLOW * 2;
        dispatch.ran_inline(start, finished);
        assert!(!dispatch.inline(&read(4096), finished, false));
        assert!(!dispatch.inline(&read(4096), finished + Dispatch::PAUSE / 2, false));
        assert!(dispatch.inline(&read(4096), finished + Dispatch::PAUSE, false));
    }

    #[test]
    fn a_slow_request_run_because_the_connection_was_idle_pauses_nothing() {
        let start = Instant::now();
        let mut dispatch = Dispatch::new(true);
        dispatch.when_idle = true;
        let finished = start + Dispatch::SLOW * 2;
        assert!(dispatch.inline(&write(4096, false), start, false));
        dispatch.ran_inline(start, finished);
        assert!(
            dispatch.inline(&write(4096, false), finished, false),
            "a client at QD1 stays inline"
        );
        // A client that queued behind it goes to the pool, and stays there.
        assert!(!dispatch.inline(&write(4096, false), finished, true));
        assert!(!dispatch.inline(&write(4096, false), finished, false));
    }
}
