//! The target's half of a session: checks the source against the
//! configuration and the volume's history, answers with the plan, then
//! receives each stream atomically (resumably, if cut), moves its hold
//! forward, and prunes by its retention at the end.

use std::sync::Arc;
use std::time::Duration;

use arbor_engine::{Healed, Pool};
use arbor_stream::busy::{Claim, Claims, Pins};
use arbor_stream::receive::{resume_token, ReceiveOptions, Receiver};
use arbor_stream::StreamFailure;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tracing::{info, warn};

use crate::heal;
use crate::local;
use crate::plan;
use crate::proto::{Hello, Message, Plan, Received, Refusal, RefusalCode, WireGuid};
use crate::session::{blocking, engine_task_failed, Reader, SessionError, Withdrawn, Writer};
use crate::state::{Role, StateError, Store};

/// The hold a target keeps on the newest snapshot it received: the base
/// of the next stream.
pub const UPSTREAM_HOLD: &str = "replica:upstream";

/// The identity of a source on a plain loopback connection (no
/// certificate): what a loopback-only allow entry names.
pub const LOOPBACK: &str = "loopback";

/// How long a session waits for an ending receive into its volume before
/// it is refused as busy (see `Target::claim`).
const CLAIM_GRACE: Duration = Duration::from_secs(5);
/// How often it looks meanwhile.
const CLAIM_POLL: Duration = Duration::from_millis(50);

/// Stream pieces in flight to the engine task (about 1 MiB each).
const IN_FLIGHT: usize = 4;

/// A source this target accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allow {
    /// The source's certificate identity.
    pub source: String,
    /// The volumes it may replicate here (`*`: any).
    pub volumes: Vec<String>,
    /// Snapshots kept of each of its volumes (the newest; held ones always).
    pub keep: Option<u32>,
}

impl Allow {
    fn covers(&self, volume: &str) -> bool {
        self.volumes.iter().any(|v| v == "*" || v == volume)
    }
}

/// The entry of `allow` that lets `peer` replicate `volume` here: the one
/// rule, for a session's start and for a reload that checks the sessions
/// running.
pub fn allowing<'a>(allow: &'a [Allow], peer: &str, volume: &str) -> Option<&'a Allow> {
    allow.iter().find(|a| a.source == peer && a.covers(volume))
}

/// How this host serves as a target.
#[derive(Debug, Clone)]
pub struct TargetConfig {
    /// This host's identity (its certificate's).
    pub identity: String,
    pub allow: Vec<Allow>,
    /// The longest silence from a source before the session is dropped.
    pub idle: Duration,
    /// Stream bytes applied between commits of the received offset: at
    /// most this is received again after a cut.
    pub checkpoint_bytes: u64,
}

/// What serving a session needs.
#[derive(Clone)]
pub struct Target {
    pub pool: Arc<Pool>,
    pub config: Arc<TargetConfig>,
    pub store: Arc<Store>,
    pub claims: Arc<Claims>,
    pub pins: Arc<Pins>,
}

/// What a session did, for the log.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Served {
    pub volume: String,
    pub received: Vec<String>,
    pub stream_bytes: u64,
    pub rolled_back: Vec<String>,
    pub pruned: Vec<String>,
    /// Damaged blocks here healed with the source's copies.
    pub healed: Healed,
    /// Blocks sent to heal the source's damage.
    pub heal_sent: u64,
}

fn refusal(code: RefusalCode, message: String) -> SessionError {
    SessionError::Refused(Refusal { code, message })
}

impl Target {
    /// Serves one session from the source whose verified identity is
    /// `peer`, on `conn`. A refusal is sent to the source as well as
    /// returned.
    pub async fn serve<S>(&self, peer: &str, conn: S) -> Result<Served, SessionError>
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        self.serve_admitted(peer, conn, self.config.idle, None, |_| Ok(()))
            .await
    }

    /// [`Target::serve`], with the source's hello due within `greeting`,
    /// and `admitted` called as soon as it has arrived, before anything of
    /// it is checked or answered: a refusal from it is sent to the source,
    /// and what it returns is held until the session ends. (The daemon's
    /// listener ends a connection's handshake there and gives it a session
    /// slot.) A session whose `withdrawn` is withdrawn ends at its next
    /// wait for the source, with that refusal sent to it (a receive keeps
    /// what it committed, as after a cut).
    pub async fn serve_admitted<S, G>(
        &self,
        peer: &str,
        conn: S,
        greeting: Duration,
        withdrawn: Option<Withdrawn>,
        admitted: impl FnOnce(&Hello) -> Result<G, Refusal>,
    ) -> Result<Served, SessionError>
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (rd, wr) = tokio::io::split(conn);
        let mut reader = Reader::new(rd, self.config.idle);
        if let Some(withdrawn) = withdrawn {
            reader = reader.withdrawn_by(withdrawn);
        }
        let mut writer = Writer::new(wr, self.config.idle);
        let result = async {
            let hello = match tokio::time::timeout(greeting, reader.expect("hello"))
                .await
                .map_err(|_| SessionError::Idle(greeting))??
            {
                Message::Hello(h) => h,
                other => {
                    return Err(SessionError::Unexpected {
                        expected: "hello",
                        got: other.name(),
                    })
                }
            };
            let _admitted = admitted(&hello).map_err(SessionError::Refused)?;
            self.session(peer, hello, &mut reader, &mut writer).await
        }
        .await;
        if let Err(e) = &result {
            // The source learns why, unless the connection is what failed.
            if !matches!(e, SessionError::Io(_) | SessionError::Idle(_)) {
                let _ = writer.send(&Message::Failed(e.refusal())).await;
            }
        }
        writer.shutdown().await;
        result
    }

    async fn session<R, W>(
        &self,
        peer: &str,
        hello: Hello,
        reader: &mut Reader<R>,
        writer: &mut Writer<W>,
    ) -> Result<Served, SessionError>
    where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin,
    {
        hello
            .check_names()
            .map_err(|m| refusal(RefusalCode::Protocol, m))?;
        let allow = self.admit(peer, &hello)?;
        let volume = hello.volume.clone();
        // A replica may be promoted here while the session runs.
        let was_replica = self.store.role(&volume).is_some();
        let _claim = self.claim(&volume).await?;
        let (decision, resume, wants) = {
            let pool = Arc::clone(&self.pool);
            let hello = hello.clone();
            blocking(move || {
                let local = local::view(&pool, &hello.volume).map_err(StreamFailure::from)?;
                let decision = plan::decide(&hello, &local).map_err(SessionError::Refused)?;
                let mut resume = resume_token(&pool, &hello.volume)?;
                // A receive of a snapshot the source no longer lists can
                // never be resumed: it goes, rather than hold space.
                let listed =
                    |g: &arbor_stream::format::Guid| hello.snapshots.iter().any(|s| s.guid.0 == *g);
                if let Some(t) = resume {
                    if !listed(&t.target) || t.base.as_ref().is_some_and(|b| !listed(b)) {
                        pool.abort_receive(&hello.volume)
                            .map_err(StreamFailure::from)?;
                        resume = None;
                    }
                }
                // Damaged blocks here the source can send good copies of.
                let wants = if hello.heal {
                    let held = hello.snapshots.iter().map(|s| s.guid.0).collect();
                    heal::wants(&pool, &hello.volume, &held).map_err(StreamFailure::from)?
                } else {
                    Vec::new()
                };
                Ok((decision, resume.map(|t| t.encode()), wants))
            })
            .await?
        };
        let mut served = Served {
            volume: volume.clone(),
            ..Served::default()
        };
        if let Some(to) = &decision.roll_back_to {
            served.rolled_back = self.roll_back(&volume, to, &decision.delete).await?;
            warn!(volume = %volume, to = %to, discarded = ?served.rolled_back, source = %peer, "resync: rolled the replica back");
        }
        writer
            .send(&Message::Plan(Plan {
                common: decision.common.map(WireGuid),
                resume,
                rolled_back: served.rolled_back.clone(),
                heal: hello.heal,
                wants,
            }))
            .await?;
        loop {
            match reader.expect("begin or end").await? {
                Message::Begin(begin) => {
                    self.still_replica(&volume, was_replica)?;
                    if begin.abort_partial {
                        let pool = Arc::clone(&self.pool);
                        let v = volume.clone();
                        blocking(move || {
                            Ok(pool.abort_receive(&v).map_err(StreamFailure::from)?)
                        })
                        .await?;
                    }
                    let got = match self.receive_one(&hello, reader).await {
                        Ok(got) => got,
                        // Promoted here meanwhile: that is why it failed
                        // (the promote abandoned the receive).
                        Err(e) => {
                            return Err(self.still_replica(&volume, was_replica).err().unwrap_or(e))
                        }
                    };
                    served.stream_bytes += got.stream_bytes;
                    served.received.push(got.snapshot.clone());
                    self.received(peer, &hello, &got.snapshot, was_replica)
                        .await?;
                    info!(snapshot = %got.snapshot, bytes = got.stream_bytes, resumed_from = got.resumed_from, source = %peer, "replica received");
                    writer.send(&Message::Received(got)).await?;
                }
                Message::Blocks(blocks) if hello.heal => {
                    let pool = Arc::clone(&self.pool);
                    let v = volume.clone();
                    let done = blocking(move || {
                        Ok(heal::apply(&pool, &v, &blocks).map_err(StreamFailure::from)?)
                    })
                    .await?;
                    if done.healed > 0 {
                        info!(volume = %volume, blocks = done.healed, source = %peer, "healed damaged blocks with the source's copies");
                    }
                    served.healed.add(done);
                }
                Message::Want(want) if hello.heal => {
                    served.heal_sent +=
                        heal::send(&self.pool, &volume, &want.wants, writer).await?;
                    writer.send(&Message::Done).await?;
                }
                Message::End => break,
                other => {
                    return Err(SessionError::Unexpected {
                        expected: "begin or end",
                        got: other.name(),
                    })
                }
            }
        }
        if let Some(keep) = allow.keep {
            let pool = Arc::clone(&self.pool);
            let pins = Arc::clone(&self.pins);
            let v = volume.clone();
            served.pruned = blocking(move || {
                Ok(local::prune(&pool, &v, "", keep as usize, &pins)
                    .map_err(StreamFailure::from)?)
            })
            .await?;
        }
        Ok(served)
    }

    /// Claims `volume` for this session's receives. A receive holding it
    /// may be ending (its source's connection broke, or the source was
    /// killed and started again, and it is committing what arrived): it is
    /// waited for up to [`CLAIM_GRACE`] before the session is refused as
    /// busy.
    async fn claim(&self, volume: &str) -> Result<Claim, SessionError> {
        let deadline = tokio::time::Instant::now() + CLAIM_GRACE;
        loop {
            if let Some(claim) = self.claims.claim(volume) {
                return Ok(claim);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(refusal(
                    RefusalCode::Busy,
                    format!("another receive into {volume} is running here"),
                ));
            }
            tokio::time::sleep(CLAIM_POLL).await;
        }
    }

    /// The configuration entry that lets `peer` replicate `hello.volume`
    /// here, after the checks of who may write it.
    fn admit(&self, peer: &str, hello: &Hello) -> Result<Allow, SessionError> {
        let volume = &hello.volume;
        let allow = allowing(&self.config.allow, peer, volume)
            .cloned()
            .ok_or_else(|| {
                refusal(
                    RefusalCode::NotAllowed,
                    format!(
                        "{} does not accept {volume} from {peer} (its replication allow list \
                         does not name that source for that volume)",
                        self.config.identity
                    ),
                )
            })?;
        if hello.path.iter().any(|h| h == &self.config.identity) {
            return Err(refusal(
                RefusalCode::Cycle,
                format!(
                    "{} -> {}: this host is already on the path its snapshots come by",
                    hello.path.join(" -> "),
                    self.config.identity
                ),
            ));
        }
        // A certificate names the source; its path must end with it.
        if peer != LOOPBACK && hello.path.last().map(String::as_str) != Some(peer) {
            return Err(refusal(
                RefusalCode::Protocol,
                format!("the source {peer} must end the path it sends"),
            ));
        }
        match self.store.role(volume) {
            Some(Role {
                source: Some(source),
                ..
            }) if source != peer => Err(refusal(
                RefusalCode::NotAllowed,
                format!(
                    "{volume} on {} is a replica of {source}; each replica has one source \
                     (`arbor replica promote {volume}` there, then `demote` here, to change it)",
                    self.config.identity
                ),
            )),
            Some(_) => Ok(allow),
            // A volume writable here (promoted, made here, or received by
            // hand) is this host's own: no source rolls it back, overwrites
            // or demotes it, whatever it asks (`--seeded`, `--force`). Only
            // `replica demote` on this host makes it a replica.
            None if self.pool.lookup(volume).is_ok() => Err(refusal(
                RefusalCode::NotAllowed,
                format!(
                    "{volume} is writable on {}, not a replica: a source never overwrites \
                     it; `arbor replica demote {volume}` on {} makes it one (and lists what \
                     a forced resync could then discard)",
                    self.config.identity, self.config.identity
                ),
            )),
            None => Ok(allow),
        }
    }

    /// A forced resync: deletes the replica's own snapshots after the
    /// common one and rolls the volume back to it.
    async fn roll_back(
        &self,
        volume: &str,
        to: &str,
        delete: &[String],
    ) -> Result<Vec<String>, SessionError> {
        let pool = Arc::clone(&self.pool);
        let (volume, to, delete) = (volume.to_owned(), to.to_owned(), delete.to_vec());
        blocking(move || {
            let mut gone = Vec::new();
            for name in &delete {
                pool.delete_forced(name, true)
                    .map_err(StreamFailure::from)?;
                gone.push(name.clone());
            }
            pool.rollback(&volume, &to).map_err(StreamFailure::from)?;
            gone.push(format!("writes to {volume} since {to}"));
            Ok(gone)
        })
        .await
    }

    /// Receives one stream (data frames up to a done) into the volume of
    /// `hello`, refused unless it is a snapshot `hello` announced.
    async fn receive_one<R: AsyncRead + Unpin>(
        &self,
        hello: &Hello,
        reader: &mut Reader<R>,
    ) -> Result<Received, SessionError> {
        enum Piece {
            Data(Vec<u8>),
            Done,
            Broken,
        }
        let (tx, mut rx) = mpsc::channel::<Piece>(IN_FLIGHT);
        let pool = Arc::clone(&self.pool);
        let opts = ReceiveOptions {
            checkpoint_bytes: self.config.checkpoint_bytes,
            force: false,
        };
        let announced = hello.clone();
        let task = tokio::task::spawn_blocking(move || -> Result<Received, SessionError> {
            let mut receiver = Receiver::new(&pool, &announced.volume, opts)
                .check_header(|header| announced.check_stream(header));
            loop {
                match rx.blocking_recv() {
                    Some(Piece::Data(bytes)) => {
                        if let Err(e) = receiver.push(&bytes) {
                            // What arrived before stays for the next attempt.
                            let _ = receiver.interrupted();
                            return Err(e.into());
                        }
                    }
                    Some(Piece::Done) => break,
                    Some(Piece::Broken) | None => {
                        receiver.interrupted()?;
                        return Err(SessionError::Io(std::io::Error::new(
                            std::io::ErrorKind::UnexpectedEof,
                            "the stream broke off",
                        )));
                    }
                }
            }
            let resumed_from = receiver.header().map_or(0, |h| h.resume_offset);
            let received = receiver.finish()?;
            Ok(Received {
                snapshot: received.snapshot,
                guid: WireGuid(received.guid),
                stream_bytes: received.stream_bytes,
                resumed_from,
            })
        });
        let fed: Result<(), SessionError> = async {
            loop {
                match reader.expect("data or done").await? {
                    Message::Data(bytes) => {
                        if tx.send(Piece::Data(bytes)).await.is_err() {
                            // The engine task failed: its error says why.
                            return Ok(());
                        }
                    }
                    Message::Done => {
                        let _ = tx.send(Piece::Done).await;
                        return Ok(());
                    }
                    other => {
                        return Err(SessionError::Unexpected {
                            expected: "data or done",
                            got: other.name(),
                        })
                    }
                }
            }
        }
        .await;
        if fed.is_err() {
            let _ = tx.send(Piece::Broken).await;
        }
        drop(tx);
        let applied = task.await.map_err(engine_task_failed)?;
        // A broken connection is the error to report, not the receiver's
        // view of it.
        fed?;
        applied
    }

    /// Fails with what the source must hear if `volume`, a replica when
    /// the session began (`was_replica`), has been promoted here since
    /// (`arbor replica promote`, which abandons a receive in progress).
    fn still_replica(&self, volume: &str, was_replica: bool) -> Result<(), SessionError> {
        if was_replica && self.store.role(volume).is_none() {
            return Err(self.promoted(volume));
        }
        Ok(())
    }

    fn promoted(&self, volume: &str) -> SessionError {
        refusal(
            RefusalCode::Diverged,
            format!(
                "{volume} was promoted on the target {} during this session: it is a writable \
                 volume there now, no longer a replica, and the receive into it was abandoned",
                self.config.identity
            ),
        )
    }

    /// After a receive: the volume is a replica of `peer` (unless it was
    /// promoted here meanwhile: a promote is never undone by a session),
    /// and the new snapshot carries the upstream hold.
    async fn received(
        &self,
        peer: &str,
        hello: &Hello,
        snapshot: &str,
        was_replica: bool,
    ) -> Result<(), SessionError> {
        let role = Role {
            source: Some(peer.to_owned()),
            path: hello.path.clone(),
        };
        let stored = if was_replica {
            self.store.update_role(&hello.volume, role)
        } else {
            self.store.set_role(&hello.volume, role)
        };
        match stored {
            Err(StateError::NotFound(_)) => return Err(self.promoted(&hello.volume)),
            other => other.map_err(|e| refusal(RefusalCode::Failed, e.to_string()))?,
        }
        let pool = Arc::clone(&self.pool);
        let snap = snapshot.to_owned();
        blocking(move || {
            Ok(local::move_hold(&pool, &snap, UPSTREAM_HOLD).map_err(StreamFailure::from)?)
        })
        .await
    }
}
