//! Replication in the daemon (`arbor replica`): the listener that receives
//! replicas (mutual TLS beyond loopback), one task per configured pair
//! running its cycles on the pair's interval (with exponential backoff
//! after failures, or at once on `arbor replica run`), and the pairs' status.
//! The sessions themselves are `arbor-replica`'s.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use arbor_engine::Pool;
use arbor_replica::local;
use arbor_replica::plan::Local;
use arbor_replica::proto::{Hello, Refusal, RefusalCode};
use arbor_replica::session::SessionError;
use arbor_replica::source::{self, CycleReport, Progress, SourceContext};
use arbor_replica::state::{Pair, Role, Store};
use arbor_replica::target::{Served, Target, TargetConfig, UPSTREAM_HOLD};
use arbor_stream::busy::{Claims, Pins};
use arbor_stream::format::Compression;
use arbor_tls::handshakes::{Handshake, Handshakes};
use arbor_tls::{peer_chain, peer_identity, server_name, Tls};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::config::ReplicationConfig;
use crate::error::DaemonError;
use crate::incoming::{InForce, Withdrawn};
use arbor_api::model::{
    DemoteView, ReplicaCycleView, ReplicaPairView, ReplicaRoleView, ReplicaRunView, ReplicaState,
    ReplicasView,
};

/// Sessions served at once (sources past their hello); a source beyond
/// them is refused as `busy` and tries again.
const MAX_SESSIONS: usize = 32;
/// Connections in their handshake at once (TLS, then the source's hello),
/// apart from the sessions: when every one is taken, the oldest is dropped
/// for a new connection (`arbor_tls::handshakes`), so connections that
/// never become sources cannot lock sources out, and cost bounded memory.
const MAX_HANDSHAKES: usize = 64;
/// A connection must finish its TLS handshake and send its hello within
/// this time (or `replication_timeout`, if shorter). The source connects
/// first and takes its snapshot before its hello: this also bounds that.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections closed before they became sessions are logged as one line
/// per this interval, with counts, not a line each.
const DROPPED_LOG_INTERVAL: Duration = Duration::from_secs(60);
/// Stream bytes a target applies between commits of its progress: at most
/// this is sent again after a cut.
const CHECKPOINT_BYTES: u64 = 16 << 20;
/// The longest wait between attempts of a failing pair.
const MAX_BACKOFF: Duration = Duration::from_secs(300);

/// A connection, TLS or plain.
pub trait Io: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Io for T {}

/// What one cycle's caller gets back.
type RunReply = oneshot::Sender<Result<ReplicaRunView, CycleFailure>>;

/// What kind of failure a failed cycle was: a pair's `error_kind` in
/// `arbor replica status` and the API. docs/REPLICATION.md lists every one
/// (a test ties that list to [`ErrorKind::ALL`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    NotAllowed,
    Diverged,
    Cycle,
    NoSpace,
    Busy,
    Protocol,
    Failed,
    Connection,
    Local,
    Stopped,
}

impl ErrorKind {
    /// Every kind (what the docs' table must list).
    #[cfg(test)]
    pub const ALL: [ErrorKind; 10] = [
        ErrorKind::NotAllowed,
        ErrorKind::Diverged,
        ErrorKind::Cycle,
        ErrorKind::NoSpace,
        ErrorKind::Busy,
        ErrorKind::Protocol,
        ErrorKind::Failed,
        ErrorKind::Connection,
        ErrorKind::Local,
        ErrorKind::Stopped,
    ];

    /// Its name in status and the API.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::NotAllowed => "not_allowed",
            ErrorKind::Diverged => "diverged",
            ErrorKind::Cycle => "cycle",
            ErrorKind::NoSpace => "no_space",
            ErrorKind::Busy => "busy",
            ErrorKind::Protocol => "protocol",
            ErrorKind::Failed => "failed",
            ErrorKind::Connection => "connection",
            ErrorKind::Local => "local",
            ErrorKind::Stopped => "stopped",
        }
    }

    fn of(e: &SessionError) -> Self {
        match e {
            SessionError::Refused(r) => match r.code {
                RefusalCode::NotAllowed => ErrorKind::NotAllowed,
                RefusalCode::Diverged => ErrorKind::Diverged,
                RefusalCode::Cycle => ErrorKind::Cycle,
                RefusalCode::NoSpace => ErrorKind::NoSpace,
                RefusalCode::Busy => ErrorKind::Busy,
                RefusalCode::Protocol => ErrorKind::Protocol,
                RefusalCode::Failed => ErrorKind::Failed,
            },
            SessionError::Io(_) | SessionError::Idle(_) => ErrorKind::Connection,
            SessionError::Proto(_) | SessionError::Unexpected { .. } => ErrorKind::Protocol,
            SessionError::Local(_) => ErrorKind::Local,
            SessionError::Stopped => ErrorKind::Stopped,
        }
    }
}

/// A failed cycle, classified for the API and status.
#[derive(Debug, Clone)]
pub struct CycleFailure {
    pub kind: ErrorKind,
    pub message: String,
}

impl CycleFailure {
    fn of(e: &SessionError) -> Self {
        let kind = ErrorKind::of(e);
        let message = match e {
            SessionError::Refused(r) => format!("the target refused: {}: {}", r.code, r.message),
            other => other.to_string(),
        };
        Self { kind, message }
    }
}

#[derive(Debug, Default)]
struct Status {
    running_since: Option<Instant>,
    error: Option<CycleFailure>,
    last_snapshot: Option<String>,
    /// When the target's copy was last known current.
    current_as_of: Option<u64>,
    last_success: Option<u64>,
    bytes_sent_total: u64,
    cycles_ok: u64,
    cycles_failed: u64,
    failures: u32,
    next_run: Option<Instant>,
}

struct Runner {
    status: Arc<Mutex<Status>>,
    progress: Arc<Progress>,
    runs: mpsc::Sender<RunReply>,
    task: tokio::task::JoinHandle<()>,
}

/// Replication on this host.
pub struct Replication {
    pool: Arc<Pool>,
    pub store: Arc<Store>,
    /// The certificates (replaced by a reload, never added or taken
    /// away: that is a restart's) and the sources accepted
    /// (`replication_allow`), with the sessions running under them.
    in_force: Arc<InForce>,
    identity: String,
    listen: Mutex<Option<SocketAddr>>,
    config: ReplicationConfig,
    pins: Arc<Pins>,
    claims: Arc<Claims>,
    runners: Mutex<HashMap<String, Runner>>,
    stop: CancellationToken,
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Status fields are plain values set in single steps.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Replication {
    /// Loads the state and the certificates; starts nothing yet.
    pub fn new(
        pool: Arc<Pool>,
        data_dir: &std::path::Path,
        config: &ReplicationConfig,
        pins: Arc<Pins>,
        claims: Arc<Claims>,
        stop: CancellationToken,
    ) -> Result<Arc<Self>> {
        let store = Store::open(&data_dir.join("replication.json"))?;
        let tls = match &config.tls {
            Some(files) => Some(Tls::load(files).context("replication TLS")?),
            None => None,
        };
        let identity = tls
            .as_ref()
            .map_or_else(|| config.identity.clone(), |t| t.identity().to_owned());
        Ok(Arc::new(Self {
            pool,
            store: Arc::new(store),
            in_force: Arc::new(InForce::new(tls, config.allow.clone())),
            identity,
            listen: Mutex::new(None),
            config: config.clone(),
            pins,
            claims,
            runners: Mutex::new(HashMap::new()),
            stop,
        }))
    }

    /// The certificates in force.
    fn tls(&self) -> Option<Tls> {
        self.in_force.tls().0
    }

    /// This host's identity (its certificate's, or the configured one).
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Whether replication has certificates.
    pub fn has_tls(&self) -> bool {
        self.tls().is_some()
    }

    /// Puts a reloaded configuration's certificates and allow list in
    /// force, for the next connection and session, and withdraws the
    /// sessions running that they no longer allow (returned). `tls` must
    /// have this host's identity: the caller checks.
    pub fn reload(
        &self,
        tls: Option<Tls>,
        allow: Vec<arbor_replica::target::Allow>,
    ) -> Vec<Withdrawn> {
        let withdrawn = self.in_force.replace(&self.identity, tls, allow);
        for w in &withdrawn {
            warn!(peer = %w.peer, volume = %w.volume, reason = %w.reason, "replication session withdrawn by a reload");
        }
        withdrawn
    }

    /// Binds the listener, if configured.
    pub async fn bind(&self) -> Result<Option<TcpListener>> {
        let Some(addr) = self.config.listen else {
            return Ok(None);
        };
        let listener = TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen for replication on {addr}"))?;
        *lock(&self.listen) = listener.local_addr().ok();
        Ok(Some(listener))
    }

    fn target(&self) -> Target {
        Target {
            pool: Arc::clone(&self.pool),
            config: Arc::new(TargetConfig {
                identity: self.identity.clone(),
                allow: self.in_force.allow(),
                idle: self.config.timeout,
                checkpoint_bytes: CHECKPOINT_BYTES,
            }),
            store: Arc::clone(&self.store),
            claims: Arc::clone(&self.claims),
            pins: Arc::clone(&self.pins),
        }
    }

    /// Accepts connections until stopped, then ends the sessions running (a
    /// receive cut so keeps what it committed). A connection first takes a
    /// handshake slot (the oldest handshake dropped for it when all are
    /// taken), and a session slot once its hello has arrived.
    pub async fn serve(self: Arc<Self>, listener: TcpListener) -> Result<()> {
        let listening = Listening {
            handshakes: Handshakes::new(),
            handshake_slots: Arc::new(Semaphore::new(MAX_HANDSHAKES)),
            session_slots: Arc::new(Semaphore::new(MAX_SESSIONS)),
            dropped: Dropped::default(),
        };
        let listening = Arc::new(listening);
        let mut report = crate::clock::ticker(DROPPED_LOG_INTERVAL);
        let mut connections = JoinSet::new();
        loop {
            let (tcp, from) = tokio::select! {
                _ = self.stop.cancelled() => break,
                _ = report.tick() => {
                    listening.dropped.log();
                    continue;
                }
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(_) => {
                        // Out of file descriptors, or a connection reset
                        // before it was accepted: try again shortly.
                        listening.dropped.accept_failed.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
                Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            };
            let slot = tokio::select! {
                _ = self.stop.cancelled() => break,
                slot = listening.handshakes.slot(&listening.handshake_slots) => {
                    slot.context("the replication listener's handshake slots were closed")?
                }
            };
            let handshake = listening.handshakes.enter();
            connections.spawn(Arc::clone(&self).connection(
                tcp,
                from,
                (handshake, slot),
                Arc::clone(&listening),
            ));
        }
        connections.shutdown().await;
        listening.dropped.log();
        Ok(())
    }

    /// One connection: its handshake (TLS, then the source's hello, within
    /// [`HANDSHAKE_TIMEOUT`], unless a newer connection takes its place),
    /// then, holding a session slot, its session.
    async fn connection(
        self: Arc<Self>,
        tcp: TcpStream,
        from: SocketAddr,
        (handshake, handshake_slot): (Handshake, OwnedSemaphorePermit),
        listening: Arc<Listening>,
    ) {
        let _ = tcp.set_nodelay(true);
        let within = HANDSHAKE_TIMEOUT.min(self.config.timeout);
        let deadline = tokio::time::Instant::now() + within;
        let stage = AtomicU8::new(HANDSHAKE);
        let session = async {
            let (tls, accepted) = self.in_force.tls();
            let (peer, chain, conn): (String, _, Box<dyn Io>) = match tls {
                Some(tls) => {
                    let conn = tokio::time::timeout_at(deadline, tls.acceptor().accept(tcp))
                        .await
                        .map_err(|_| SessionError::Idle(within))??;
                    let peer = peer_identity(conn.get_ref().1)
                        .map_err(|e| SessionError::Io(std::io::Error::other(e.to_string())))?;
                    (peer, peer_chain(conn.get_ref().1), Box::new(conn))
                }
                None if from.ip().is_loopback() => (
                    arbor_replica::target::LOOPBACK.to_owned(),
                    Vec::new(),
                    Box::new(tcp),
                ),
                None => {
                    return Err(SessionError::Io(std::io::Error::other(format!(
                        "{from} is not on loopback and this listener has no TLS"
                    ))))
                }
            };
            let greeting = deadline.saturating_duration_since(tokio::time::Instant::now());
            // The hello has come: the handshake is over (off the line
            // before anything is answered, so no newcomer drops a session).
            let (withdrawal, withdrawn) = arbor_replica::session::withdrawal();
            let admit = |hello: &Hello| {
                handshake.leave();
                drop(handshake_slot);
                // Checked again under the configuration in force, which
                // withdraws it if a reload no longer allows it.
                let entered = self.in_force.enter(
                    &self.identity,
                    accepted,
                    &peer,
                    &hello.volume,
                    chain,
                    withdrawal,
                );
                let slot = Arc::clone(&listening.session_slots).try_acquire_owned();
                stage.store(
                    if slot.is_ok() {
                        SESSION
                    } else {
                        NO_SESSION_SLOT
                    },
                    Ordering::Relaxed,
                );
                let slot = slot.map_err(|_| Refusal {
                    code: RefusalCode::Busy,
                    message: format!(
                        "{} serves {MAX_SESSIONS} replication sessions at once, all running: \
                         the source tries again",
                        self.identity
                    ),
                })?;
                Ok((slot, entered?))
            };
            let served = self
                .target()
                .serve_admitted(&peer, conn, greeting, Some(withdrawn), admit)
                .await?;
            Ok(served)
        };
        let result = tokio::select! {
            () = handshake.dropped() => {
                listening.dropped.dropped_for_newer.fetch_add(1, Ordering::Relaxed);
                return;
            }
            result = session => result,
        };
        match (result, stage.load(Ordering::Relaxed)) {
            (Ok(served), _) => self.served(&served),
            (Err(e), HANDSHAKE) => listening.dropped.before_hello(&e),
            (Err(_), NO_SESSION_SLOT) => {
                listening.dropped.busy.fetch_add(1, Ordering::Relaxed);
            }
            (Err(e), _) => warn!(%from, error = %e, "replication session failed"),
        }
    }

    /// A session has ended well: logs what it changed, and passes what it
    /// received on.
    fn served(&self, served: &Served) {
        if !served.received.is_empty() || !served.rolled_back.is_empty() {
            info!(volume = %served.volume, received = ?served.received, pruned = ?served.pruned, "replica updated");
        }
        if !served.received.is_empty() {
            self.pass_on(&served.volume);
        }
    }

    /// Starts a cycle of every pair sending `volume` from here, without
    /// waiting for their interval: a replica passes what it received on
    /// at once, so each hop of a chain adds its transfer, not its interval,
    /// and a scheduled snapshot (the monitor) goes out as soon as it is
    /// taken. Never blocks.
    pub fn pass_on(&self, volume: &str) {
        let runners = lock(&self.runners);
        for (key, runner) in runners.iter() {
            if self.pair(key).is_some_and(|p| p.volume == volume) {
                // Nobody waits for this cycle's result; a cycle already
                // queued or running will see the new snapshot anyway.
                let (reply, _) = oneshot::channel();
                let _ = runner.runs.try_send(reply);
            }
        }
    }

    /// Starts the task of every configured pair.
    pub fn start_pairs(self: &Arc<Self>) {
        for pair in self.store.pairs() {
            self.start(pair);
        }
    }

    fn start(self: &Arc<Self>, pair: Pair) {
        let key = pair.key();
        let (tx, rx) = mpsc::channel(8);
        let status = Arc::new(Mutex::new(Status::default()));
        let progress = Arc::new(Progress::default());
        let task = tokio::spawn(Arc::clone(self).run_pair(
            key.clone(),
            rx,
            Arc::clone(&status),
            Arc::clone(&progress),
        ));
        let runner = Runner {
            status,
            progress,
            runs: tx,
            task,
        };
        if let Some(old) = lock(&self.runners).insert(key, runner) {
            old.task.abort();
        }
    }

    /// Stops every pair's task.
    pub async fn stop_pairs(&self) {
        let runners: Vec<Runner> = lock(&self.runners).drain().map(|(_, r)| r).collect();
        for r in runners {
            r.task.abort();
            let _ = r.task.await;
        }
    }

    async fn run_pair(
        self: Arc<Self>,
        key: String,
        mut runs: mpsc::Receiver<RunReply>,
        status: Arc<Mutex<Status>>,
        progress: Arc<Progress>,
    ) {
        if let Some(pair) = self.pair(&key) {
            let pool = Arc::clone(&self.pool);
            let last = tokio::task::spawn_blocking(move || held_snapshot(&pool, &pair))
                .await
                .ok()
                .flatten();
            if let Some((name, created)) = last {
                let mut s = lock(&status);
                s.last_snapshot = Some(name);
                s.current_as_of = Some(created);
            }
        }
        let mut next = Instant::now();
        loop {
            lock(&status).next_run = Some(next);
            let reply = tokio::select! {
                _ = self.stop.cancelled() => return,
                _ = tokio::time::sleep_until(next.into()) => None,
                r = runs.recv() => match r {
                    Some(r) => Some(r),
                    None => return,
                },
            };
            let Some(pair) = self.pair(&key) else { return };
            lock(&status).next_run = None;
            let started = now_secs();
            let result = tokio::select! {
                r = self.cycle(&pair, &progress, &status) => r,
                _ = self.stop.cancelled() => Err(SessionError::Stopped),
            };
            let interval = Duration::from_secs(pair.interval_secs.max(1));
            let outcome = {
                let mut s = lock(&status);
                s.running_since = None;
                s.bytes_sent_total += progress.wire_bytes.swap(0, Ordering::Relaxed);
                match result {
                    Ok(report) => {
                        s.error = None;
                        s.failures = 0;
                        s.cycles_ok += 1;
                        s.last_success = Some(now_secs());
                        if let Some((name, created)) = &report.replicated {
                            s.last_snapshot = Some(name.clone());
                            // Unchanged since its newest snapshot, which the
                            // target has: current as of this cycle.
                            let unchanged = report.taken.is_none()
                                && report.sent.is_empty()
                                && self.store.role(&pair.volume).is_none();
                            s.current_as_of = Some(if unchanged { started } else { *created });
                        }
                        next = Instant::now() + interval;
                        if pair.resync {
                            let _ = self
                                .store
                                .edit_pairs(&pair.volume, Some(&pair.target), |p| p.resync = false);
                        }
                        Ok(run_view(&pair, report))
                    }
                    Err(e) => {
                        let failure = CycleFailure::of(&e);
                        warn!(pair = %key, error_kind = failure.kind.as_str(), error = %failure.message, "replication cycle failed");
                        s.error = Some(failure.clone());
                        s.failures = s.failures.saturating_add(1);
                        s.cycles_failed += 1;
                        // Doubling from 1 s, but never longer than the
                        // interval: a target back after an outage is
                        // caught up within an interval, not a backoff.
                        let backoff =
                            Duration::from_secs(1u64 << s.failures.min(9).saturating_sub(1))
                                .min(MAX_BACKOFF)
                                .min(interval);
                        next = Instant::now() + backoff;
                        Err(failure)
                    }
                }
            };
            if let Some(reply) = reply {
                let _ = reply.send(outcome);
            }
        }
    }

    fn pair(&self, key: &str) -> Option<Pair> {
        self.store.pairs().into_iter().find(|p| p.key() == key)
    }

    async fn connect(&self, pair: &Pair) -> Result<Box<dyn Io>, SessionError> {
        let timed_out = |what: &str| {
            SessionError::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("{what} {} took over {:?}", pair.target, self.config.timeout),
            ))
        };
        let tcp = tokio::time::timeout(self.config.timeout, TcpStream::connect(&pair.target))
            .await
            .map_err(|_| timed_out("connecting to"))??;
        let _ = tcp.set_nodelay(true);
        match self.tls() {
            Some(tls) => {
                let expected = pair.identity.as_deref().unwrap_or(pair.host());
                let name = server_name(expected)
                    .map_err(|e| SessionError::Io(std::io::Error::other(e.to_string())))?;
                let conn = tokio::time::timeout(self.config.timeout, tls.connector().connect(name, tcp))
                    .await
                    .map_err(|_| timed_out("the TLS handshake with"))??;
                Ok(Box::new(conn))
            }
            None if tcp.peer_addr()?.ip().is_loopback() => Ok(Box::new(tcp)),
            None => Err(SessionError::Io(std::io::Error::other(format!(
                "{} is not on loopback: replication beyond loopback needs TLS (tls_ca, tls_cert, tls_key)",
                pair.target
            )))),
        }
    }

    async fn cycle(
        &self,
        pair: &Pair,
        progress: &Progress,
        status: &Mutex<Status>,
    ) -> Result<CycleReport, SessionError> {
        // Connect first: an unreachable target costs no snapshot.
        let conn = self.connect(pair).await?;
        lock(status).running_since = Some(Instant::now());
        let ctx = SourceContext {
            pool: Arc::clone(&self.pool),
            pins: Arc::clone(&self.pins),
            identity: self.identity.clone(),
            upstream: self.store.role(&pair.volume).map(|r| r.path),
            idle: self.config.timeout,
            compression: Compression::Zstd { level: 1 },
        };
        source::cycle(&ctx, pair, conn, progress).await
    }

    /// Adds a pair and starts it.
    pub fn add(self: &Arc<Self>, pair: Pair) -> Result<(), arbor_replica::state::StateError> {
        self.store.add_pair(pair.clone())?;
        self.start(pair);
        Ok(())
    }

    /// Removes the pairs of `volume` (to `target`), releasing their holds.
    pub async fn remove(
        &self,
        volume: &str,
        target: Option<&str>,
    ) -> Result<Vec<Pair>, arbor_replica::state::StateError> {
        let gone = self.store.remove_pairs(volume, target)?;
        for pair in &gone {
            let runner = lock(&self.runners).remove(&pair.key());
            if let Some(r) = runner {
                r.task.abort();
                let _ = r.task.await;
            }
            let pool = Arc::clone(&self.pool);
            let p = pair.clone();
            let _ = tokio::task::spawn_blocking(move || release_holds(&pool, &p)).await;
        }
        Ok(gone)
    }

    /// Runs a cycle of each pair of `volume` (to `target`) now and waits
    /// for the results.
    pub async fn run_now(
        &self,
        volume: &str,
        target: Option<&str>,
    ) -> Vec<(String, Result<ReplicaRunView, CycleFailure>)> {
        let senders: Vec<(String, mpsc::Sender<RunReply>)> = lock(&self.runners)
            .iter()
            .filter_map(|(key, r)| {
                let pair = self.pair(key)?;
                (pair.volume == volume && target.is_none_or(|t| pair.target == t))
                    .then(|| (key.clone(), r.runs.clone()))
            })
            .collect();
        let mut out = Vec::new();
        for (key, runs) in senders {
            let (tx, rx) = oneshot::channel();
            let result = match runs.send(tx).await {
                Ok(()) => rx.await.unwrap_or_else(|_| {
                    Err(CycleFailure {
                        kind: ErrorKind::Stopped,
                        message: "the pair was removed or the daemon is stopping".into(),
                    })
                }),
                Err(_) => Err(CycleFailure {
                    kind: ErrorKind::Stopped,
                    message: "the pair's task has ended".into(),
                }),
            };
            out.push((key, result));
        }
        out
    }

    /// Status of every pair and replica.
    pub fn view(&self) -> ReplicasView {
        let runners = lock(&self.runners);
        let mut pairs: Vec<ReplicaPairView> = self
            .store
            .pairs()
            .into_iter()
            .map(|pair| {
                let runner = runners.get(&pair.key());
                pair_view(&pair, runner)
            })
            .collect();
        pairs.sort_by(|a, b| (&a.volume, &a.target).cmp(&(&b.volume, &b.target)));
        let replicas = self
            .store
            .replicas()
            .into_iter()
            .map(|(volume, role)| ReplicaRoleView {
                volume,
                source: role.source,
                path: role.path,
            })
            .collect();
        ReplicasView {
            identity: self.identity.clone(),
            listen: lock(&self.listen).map(|a| a.to_string()),
            pairs,
            replicas,
        }
    }

    /// Whether `volume` is a replica here (read-only).
    pub fn is_replica(&self, volume: &str) -> bool {
        self.store.role(volume).is_some()
    }

    /// Forgets that `volume` (destroyed) was a replica.
    pub fn forget(&self, volume: &str) -> crate::error::Result<()> {
        self.store.clear_role(volume)?;
        info!(volume, "a destroyed replica is forgotten");
        Ok(())
    }

    /// Makes replica `volume` the writable master.
    pub async fn promote(&self, volume: &str) -> crate::error::Result<Role> {
        let role = self.store.clear_role(volume)?;
        let pool = Arc::clone(&self.pool);
        let v = volume.to_owned();
        tokio::task::spawn_blocking(move || -> crate::error::Result<()> {
            // A receive left half done can never finish now, and the hold
            // that kept the base of the next one has no purpose.
            pool.abort_receive(&v)?;
            let id = pool.lookup(&v)?;
            local::release_all(&pool, id, UPSTREAM_HOLD, None)?;
            Ok(())
        })
        .await
        .map_err(|e| DaemonError::internal(e).context("engine task failed"))??;
        info!(volume, source = ?role.source, "promoted: the replica is now writable");
        Ok(role)
    }

    /// Makes `volume` a replica, waiting for a source (read-only from now;
    /// with `dry_run`, only says what that would expose). Returns what a
    /// forced resync could then discard: the volume cannot change from
    /// now on but by replication, so nothing else.
    pub fn demote(&self, volume: &str, dry_run: bool) -> crate::error::Result<DemoteView> {
        let id = self.pool.lookup(volume)?;
        let snapshots: Vec<String> = local::snapshots_of(&self.pool, id)?
            .into_iter()
            .map(|s| s.name)
            .collect();
        let written_since_newest = match local::view(&self.pool, volume)? {
            Local::Volume { written, .. } => written,
            Local::Absent => false,
        };
        let view = DemoteView {
            volume: volume.to_owned(),
            demoted: !dry_run,
            snapshots,
            written_since_newest,
        };
        let master = self.store.role(volume).is_none();
        if master && self.store.pairs().iter().any(|p| p.volume == volume) {
            // Its pairs would keep sending a volume that now receives (a
            // replica's pairs only pass on what it receives, and stay).
            return Err(DaemonError::Invalid(format!(
                "{volume} is replicated from here: `arbor replica remove {volume}` first"
            )));
        }
        if dry_run {
            return Ok(view);
        }
        self.store.set_role(
            volume,
            Role {
                source: None,
                path: Vec::new(),
            },
        )?;
        info!(
            volume,
            snapshots = ?view.snapshots,
            written_since_newest = view.written_since_newest,
            "demoted: the volume is a read-only replica, waiting for its source; a forced resync \
             may discard its writes since the newest snapshot its source also has"
        );
        Ok(view)
    }
}

/// Where a connection stands (`Replication::connection`).
const HANDSHAKE: u8 = 0;
const SESSION: u8 = 1;
const NO_SESSION_SLOT: u8 = 2;

/// The replication listener's slots and the line of its handshakes.
struct Listening {
    handshakes: Arc<Handshakes>,
    handshake_slots: Arc<Semaphore>,
    session_slots: Arc<Semaphore>,
    dropped: Dropped,
}

/// Connections closed before they became sessions, counted since the last
/// log line ([`DROPPED_LOG_INTERVAL`]): a flood of them costs a line per
/// interval, not a line each.
#[derive(Debug, Default)]
struct Dropped {
    dropped_for_newer: AtomicU64,
    silent: AtomicU64,
    broken: AtomicU64,
    busy: AtomicU64,
    accept_failed: AtomicU64,
}

impl Dropped {
    /// A connection that failed before its hello.
    fn before_hello(&self, e: &SessionError) {
        let counter = match e {
            SessionError::Idle(_) => &self.silent,
            _ => &self.broken,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Logs the counts, if any, and starts counting again.
    fn log(&self) {
        let take = |c: &AtomicU64| c.swap(0, Ordering::Relaxed);
        let (newer, silent, broken, busy, accept) = (
            take(&self.dropped_for_newer),
            take(&self.silent),
            take(&self.broken),
            take(&self.busy),
            take(&self.accept_failed),
        );
        if newer + silent + broken + busy + accept > 0 {
            warn!(
                dropped_for_newer = newer,
                silent,
                broken,
                busy,
                accept_failed = accept,
                "replication listener: connections closed before their session since the last \
                 such line (at most one per {}): {newer} dropped for newer ones (all {MAX_HANDSHAKES} handshake slots taken), \
                 {silent} without a hello in {}, {broken} not a replication source (TLS or \
                 protocol), {busy} sources refused as busy (all {MAX_SESSIONS} sessions \
                 running); {accept} accepts failed",
                humantime::format_duration(DROPPED_LOG_INTERVAL),
                humantime::format_duration(HANDSHAKE_TIMEOUT),
            );
        }
    }
}

/// The snapshot carrying `pair`'s hold, and when it was taken.
fn held_snapshot(pool: &Pool, pair: &Pair) -> Option<(String, u64)> {
    let id = pool.lookup(&pair.volume).ok()?;
    local::held_by(pool, id, &pair.hold_tag())
        .ok()?
        .pop()
        .map(|s| (s.name, s.created_unix_secs))
}

fn release_holds(pool: &Pool, pair: &Pair) {
    let released = pool
        .lookup(&pair.volume)
        .and_then(|id| local::release_all(pool, id, &pair.hold_tag(), None));
    if let Err(e) = released {
        warn!(pair = %pair.key(), error = %e, "cannot release a replication hold");
    }
}

fn run_view(pair: &Pair, report: CycleReport) -> ReplicaRunView {
    ReplicaRunView {
        pair: pair.key(),
        taken: report.taken,
        sent: report.sent.iter().map(|s| s.snapshot.clone()).collect(),
        resumed_from: report.sent.iter().map(|s| s.resumed_from).collect(),
        wire_bytes: report.wire_bytes,
        replicated: report.replicated.map(|(n, _)| n),
        rolled_back: report.rolled_back,
        pruned: report.pruned,
        healed: report.healed.healed,
        heal_sent: report.heal_sent,
    }
}

fn pair_view(pair: &Pair, runner: Option<&Runner>) -> ReplicaPairView {
    let now = Instant::now();
    let mut view = ReplicaPairView {
        volume: pair.volume.clone(),
        target: pair.target.clone(),
        remote_volume: pair.remote_volume.clone(),
        state: ReplicaState::Idle,
        error: None,
        error_kind: None,
        last_snapshot: None,
        recovery_point_secs: None,
        last_success: None,
        bytes_sent_total: 0,
        cycles_ok: 0,
        cycles_failed: 0,
        failures: 0,
        cycle: None,
        next_run_secs: None,
        interval_secs: pair.interval_secs,
        rate_limit: pair.rate_limit,
        keep: pair.keep,
        seeded: pair.seeded,
        resync: pair.resync,
    };
    let Some(runner) = runner else { return view };
    let s = lock(&runner.status);
    view.last_snapshot = s.last_snapshot.clone();
    view.recovery_point_secs = s.current_as_of.map(|t| now_secs().saturating_sub(t));
    view.last_success = s.last_success;
    view.cycles_ok = s.cycles_ok;
    view.cycles_failed = s.cycles_failed;
    view.failures = s.failures;
    view.next_run_secs = s
        .next_run
        .map(|t| t.saturating_duration_since(now).as_secs());
    let in_cycle = runner.progress.wire_bytes.load(Ordering::Relaxed);
    view.bytes_sent_total = s.bytes_sent_total + in_cycle;
    if let Some(e) = &s.error {
        view.state = ReplicaState::Failed;
        view.error = Some(e.message.clone());
        view.error_kind = Some(e.kind.as_str().to_owned());
    }
    if let Some(since) = s.running_since {
        view.state = ReplicaState::Running;
        let elapsed = now.duration_since(since).as_secs_f64();
        let p = &runner.progress;
        view.cycle = Some(ReplicaCycleView {
            snapshot: lock(&p.snapshot).clone(),
            stream_sent: p.stream_sent.load(Ordering::Relaxed),
            stream_total: p.stream_total.load(Ordering::Relaxed),
            wire_bytes: in_cycle,
            elapsed_secs: elapsed,
            bytes_per_sec: if elapsed > 0.0 {
                in_cycle as f64 / elapsed
            } else {
                0.0
            },
        });
    }
    view
}

#[cfg(test)]
mod tests {
    use super::ErrorKind;

    /// docs/REPLICATION.md's table of error kinds lists every kind status
    /// can show, and nothing else.
    #[test]
    fn the_documented_error_kinds_are_the_codes() {
        let doc = include_str!("../../../docs/REPLICATION.md");
        let table = doc
            .split("### Error kinds")
            .nth(1)
            .and_then(|s| s.split("\n#").next())
            .expect("docs/REPLICATION.md has an Error kinds section");
        let documented: Vec<&str> = table
            .lines()
            .filter_map(|l| l.strip_prefix("| `"))
            .filter_map(|l| l.split_once('`').map(|(kind, _)| kind))
            .collect();
        let code: Vec<&str> = ErrorKind::ALL.iter().map(|k| k.as_str()).collect();
        assert_eq!(documented, code);
    }
}
