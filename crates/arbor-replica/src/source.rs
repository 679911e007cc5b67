//! The source's half of a session: one replication cycle of one pair.
//!
//! 1. On the master (a volume that is no replica here), a snapshot
//!    `VOL@repl-<UTC time>` if the volume changed since its newest one.
//! 2. The hello: the volume's snapshots by identity, and the path.
//! 3. From the target's plan, the streams that bring it up to date: a
//!    receive left half done resumes first; then every snapshot after the
//!    newest shared one, in order.
//! 4. After each stream the pair's hold moves to the snapshot sent.
//! 5. At the end, the master prunes its replication snapshots by the
//!    pair's retention (held ones stay).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use arbor_engine::{Healed, Pool};
use arbor_stream::busy::Pins;
use arbor_stream::format::{Compression, Guid, ResumeToken};
use arbor_stream::send::{Raw, SendFormat, SendRequest, Sender};
use arbor_stream::StreamFailure;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tracing::info;

use crate::heal;
use crate::local;
use crate::plan::{self, Step};
use crate::proto::{Begin, Hello, Message, SnapshotEntry, Want, WireGuid, MAX_SNAPSHOTS};
use crate::session::{blocking, Reader, SessionError, Writer};
use crate::state::Pair;

/// The name prefix (after the `@`) of the snapshots a master takes for
/// replication: the ones its retention prunes.
pub const SNAPSHOT_PREFIX: &str = "repl-";
/// Longest replication snapshot name (the snapshot part), in bytes: the
/// prefix, an RFC 3339 time to the second (20) and `.N`, N a `u32` (11).
/// New volume names leave room for it (`arbor_engine::MAX_VOLUME_NAME_LEN`).
pub const MAX_SNAPSHOT_NAME_LEN: usize = SNAPSHOT_PREFIX.len() + 20 + 11;
const _: () = assert!(MAX_SNAPSHOT_NAME_LEN <= arbor_engine::MAX_GENERATED_SNAPSHOT_LEN);

/// Stream pieces in flight from the engine task (about 1 MiB each).
const IN_FLIGHT: usize = 4;

/// What a source cycle needs of this host.
#[derive(Clone)]
pub struct SourceContext {
    pub pool: Arc<Pool>,
    pub pins: Arc<Pins>,
    /// This host's identity (its certificate's).
    pub identity: String,
    /// The hosts the volume's snapshots came through to here, if it is a
    /// replica here (then no snapshot is taken: it only passes them on).
    pub upstream: Option<Vec<String>>,
    pub idle: Duration,
    pub compression: Compression,
}

/// A cycle's progress, read by status while it runs.
#[derive(Debug, Default)]
pub struct Progress {
    /// Bytes written to the connection this cycle (data frames as they
    /// go; every byte once the cycle ends).
    pub wire_bytes: AtomicU64,
    /// Stream bytes the current stream will carry at most (its estimate).
    pub stream_total: AtomicU64,
    /// Stream bytes of the current stream sent.
    pub stream_sent: AtomicU64,
    /// The snapshot being sent.
    pub snapshot: Mutex<String>,
}

impl Progress {
    fn start(&self, snapshot: &str, total: u64) {
        *self.snapshot.lock().unwrap_or_else(|p| p.into_inner()) = snapshot.to_owned();
        self.stream_total.store(total, Ordering::Relaxed);
        self.stream_sent.store(0, Ordering::Relaxed);
    }
}

/// One snapshot sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sent {
    pub snapshot: String,
    pub stream_bytes: u64,
    pub resumed_from: u64,
}

/// What a cycle did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CycleReport {
    /// The snapshot taken for it, if any.
    pub taken: Option<String>,
    pub sent: Vec<Sent>,
    /// Bytes written to the connection.
    pub wire_bytes: u64,
    /// The newest snapshot the target now has (name here, creation time):
    /// the recovery point.
    pub replicated: Option<(String, u64)>,
    /// What a forced resync discarded on the target.
    pub rolled_back: Vec<String>,
    pub pruned: Vec<String>,
    /// Damaged blocks here healed with the target's copies.
    pub healed: Healed,
    /// Blocks sent to heal the target's damage.
    pub heal_sent: u64,
}

/// A sending rate limit: a token bucket of one second's worth.
struct RateLimit {
    rate: u64,
    tokens: f64,
    last: Instant,
}

impl RateLimit {
    fn new(rate: u64) -> Self {
        Self {
            rate,
            tokens: rate as f64,
            last: Instant::now(),
        }
    }

    /// Waits until `n` bytes may go.
    async fn take(&mut self, n: usize) {
        let now = Instant::now();
        let rate = self.rate as f64;
        self.tokens = (self.tokens + now.duration_since(self.last).as_secs_f64() * rate).min(rate);
        self.last = now;
        self.tokens -= n as f64;
        if self.tokens < 0.0 {
            tokio::time::sleep(Duration::from_secs_f64(-self.tokens / rate)).await;
        }
    }
}

/// A snapshot of the source, oldest first, as the hello lists it.
struct Snap {
    guid: Guid,
    name: String,
    created: u64,
}

/// The volume's snapshots (with identities), oldest first; on the master,
/// first a new one if the volume changed since its newest.
fn prepare(
    pool: &Pool,
    volume: &str,
    master: bool,
) -> Result<(Option<String>, Vec<Snap>), StreamFailure> {
    let id = pool.lookup(volume)?;
    let mut taken = None;
    if master {
        let snaps = local::snapshots_of(pool, id)?;
        let changed = match snaps.last() {
            Some(newest) => !pool.unchanged_since(id, newest.id)?,
            None => true,
        };
        if changed {
            let stamp = humantime::format_rfc3339_seconds(SystemTime::now()).to_string();
            let newest = snaps
                .iter()
                .rev()
                .filter_map(|s| s.name.split_once('@'))
                .find_map(|(_, snap)| snap.strip_prefix(SNAPSHOT_PREFIX))
                .and_then(stamp_of);
            let name = format!("{volume}@{SNAPSHOT_PREFIX}{}", next_stamp(&stamp, newest));
            pool.snapshot(&name)?;
            taken = Some(name);
        }
    }
    let snaps = local::snapshots_of(pool, id)?
        .into_iter()
        .filter_map(|s| {
            s.guid.map(|g| Snap {
                guid: Guid(g),
                name: s.name,
                created: s.created_unix_secs,
            })
        })
        .collect();
    Ok((taken, snaps))
}

/// A replication snapshot's time stamp and sequence number: `T` is
/// `(T, 1)`, `T.N` is `(T, N)`.
fn stamp_of(name: &str) -> Option<(String, u32)> {
    match name.rsplit_once('.') {
        Some((stamp, n)) => Some((stamp.to_owned(), n.parse().ok()?)),
        None => Some((name.to_owned(), 1)),
    }
}

/// The name part of the next replication snapshot: the time `now`, or,
/// when the newest one is as late (several cycles in a second, or a clock
/// set back), the newest's with its sequence number increased. Names only
/// grow, so one pruned here is never given to another snapshot (a target
/// that keeps more may still have it).
fn next_stamp(now: &str, newest: Option<(String, u32)>) -> String {
    match newest {
        Some((stamp, n)) if stamp.as_str() >= now => format!("{stamp}.{}", n.saturating_add(1)),
        _ => now.to_owned(),
    }
}

/// Runs one cycle of `pair` over `conn`, a connection to its target.
pub async fn cycle<S>(
    ctx: &SourceContext,
    pair: &Pair,
    conn: S,
    progress: &Progress,
) -> Result<CycleReport, SessionError>
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (rd, wr) = tokio::io::split(conn);
    let mut reader = Reader::new(rd, ctx.idle);
    let mut writer = Writer::new(wr, ctx.idle);
    let result = run(ctx, pair, &mut reader, &mut writer, progress).await;
    if let Err(e) = &result {
        if matches!(e, SessionError::Local(_) | SessionError::Stopped) {
            let _ = writer.send(&Message::Failed(e.refusal())).await;
        }
    }
    writer.shutdown().await;
    // Every byte written, control messages included, failed cycle or not.
    progress.wire_bytes.store(writer.bytes, Ordering::Relaxed);
    result.map(|mut report| {
        report.wire_bytes = writer.bytes;
        report
    })
}

async fn run<R, W>(
    ctx: &SourceContext,
    pair: &Pair,
    reader: &mut Reader<R>,
    writer: &mut Writer<W>,
    progress: &Progress,
) -> Result<CycleReport, SessionError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let pool = Arc::clone(&ctx.pool);
    let (volume, master) = (pair.volume.clone(), ctx.upstream.is_none());
    let (taken, snaps) = blocking(move || Ok(prepare(&pool, &volume, master)?)).await?;
    let mut path = ctx.upstream.clone().unwrap_or_default();
    path.push(ctx.identity.clone());
    let hello = Hello {
        volume: pair.remote_volume.clone(),
        snapshots: snaps
            .iter()
            .rev()
            .take(MAX_SNAPSHOTS)
            .map(|s| SnapshotEntry {
                guid: WireGuid(s.guid),
                name: s.name.clone(),
                created: s.created,
            })
            .collect(),
        path,
        seeded: pair.seeded,
        force: pair.resync,
        heal: true,
    };
    writer.send(&Message::Hello(hello)).await?;
    let plan = match reader.expect("plan").await? {
        Message::Plan(p) => p,
        other => {
            return Err(SessionError::Unexpected {
                expected: "plan",
                got: other.name(),
            })
        }
    };
    let mut report = CycleReport {
        taken,
        rolled_back: plan.rolled_back.clone(),
        ..CycleReport::default()
    };
    // The target's damage first: good copies of what it lists.
    if plan.heal && !plan.wants.is_empty() {
        report.heal_sent = heal::send(&ctx.pool, &pair.volume, &plan.wants, writer).await?;
    }
    let order: Vec<Guid> = snaps.iter().map(|s| s.guid).collect();
    let by_guid = |g: Guid| snaps.iter().find(|s| s.guid == g);
    // A receive left half done goes on, if its snapshots are still here.
    let token = match &plan.resume {
        Some(t) => Some(ResumeToken::decode(t).map_err(StreamFailure::from)?),
        None => None,
    };
    let resumable = token
        .filter(|t| by_guid(t.target).is_some() && t.base.is_none_or(|b| by_guid(b).is_some()));
    let mut common = plan.common.map(|g| g.0);
    let mut abort_partial = token.is_some() && resumable.is_none();
    if let Some(t) = resumable {
        let sent = send_one(
            ctx,
            pair,
            reader,
            writer,
            progress,
            StreamOf::Resume(t),
            false,
        )
        .await?;
        report.sent.push(sent);
        common = Some(t.target);
        moved(ctx, pair, by_guid(t.target)).await?;
    }
    if common.is_none() && pair.seeded {
        return Err(SessionError::Refused(crate::proto::Refusal {
            code: crate::proto::RefusalCode::Diverged,
            message: format!(
                "{} on the target shares no snapshot with {} here, though the pair was \
                 seeded: was it seeded from another volume?",
                pair.remote_volume, pair.volume
            ),
        }));
    }
    let steps = plan::steps(&order, common).ok_or_else(|| {
        SessionError::Local(StreamFailure::Refused(
            "the target named a common snapshot this source does not have".into(),
        ))
    })?;
    for Step { target, base } in steps {
        let snap = by_guid(target).map(|s| s.name.clone()).unwrap_or_default();
        let base = base.and_then(by_guid).map(|s| s.name.clone());
        let sent = send_one(
            ctx,
            pair,
            reader,
            writer,
            progress,
            StreamOf::Snapshot { snap, base },
            abort_partial,
        )
        .await?;
        abort_partial = false;
        report.sent.push(sent);
        common = Some(target);
        moved(ctx, pair, by_guid(target)).await?;
    }
    // Then this side's damage, from the target's copies.
    if plan.heal {
        report.healed = heal_here(ctx, pair, &snaps, reader, writer).await?;
    }
    writer.send(&Message::End).await?;
    // The target's answer to the end is closing the session.
    let _ = reader.next().await;
    if let Some(s) = common.and_then(by_guid) {
        report.replicated = Some((s.name.clone(), s.created));
        // The hold may predate this cycle (or be lost to a crash between
        // a receive and its move): make sure it is on the common one.
        moved(ctx, pair, Some(s)).await?;
    }
    if let (Some(keep), true) = (pair.keep, ctx.upstream.is_none()) {
        let pool = Arc::clone(&ctx.pool);
        let pins = Arc::clone(&ctx.pins);
        let volume = pair.volume.clone();
        report.pruned = blocking(move || {
            Ok(
                local::prune(&pool, &volume, SNAPSHOT_PREFIX, keep as usize, &pins)
                    .map_err(StreamFailure::from)?,
            )
        })
        .await?;
    }
    Ok(report)
}

/// Asks the target for good copies of the damaged blocks of this
/// volume's snapshots (those it holds answer) and heals them.
async fn heal_here<R, W>(
    ctx: &SourceContext,
    pair: &Pair,
    snaps: &[Snap],
    reader: &mut Reader<R>,
    writer: &mut Writer<W>,
) -> Result<Healed, SessionError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut done = Healed::default();
    let wants = {
        let pool = Arc::clone(&ctx.pool);
        let volume = pair.volume.clone();
        let held = snaps.iter().map(|s| s.guid).collect();
        blocking(move || Ok(heal::wants(&pool, &volume, &held).map_err(StreamFailure::from)?))
            .await?
    };
    if wants.is_empty() {
        return Ok(done);
    }
    writer.send(&Message::Want(Want { wants })).await?;
    loop {
        match reader.expect("blocks or done").await? {
            Message::Blocks(blocks) => {
                let pool = Arc::clone(&ctx.pool);
                let volume = pair.volume.clone();
                done.add(
                    blocking(move || {
                        Ok(heal::apply(&pool, &volume, &blocks).map_err(StreamFailure::from)?)
                    })
                    .await?,
                );
            }
            Message::Done => break,
            other => {
                return Err(SessionError::Unexpected {
                    expected: "blocks or done",
                    got: other.name(),
                })
            }
        }
    }
    if done.healed > 0 {
        info!(volume = %pair.volume, blocks = done.healed, "healed damaged blocks with the target's copies");
    }
    Ok(done)
}

/// Moves the pair's hold to `snap`.
async fn moved(ctx: &SourceContext, pair: &Pair, snap: Option<&Snap>) -> Result<(), SessionError> {
    let Some(snap) = snap else { return Ok(()) };
    let pool = Arc::clone(&ctx.pool);
    let (name, tag) = (snap.name.clone(), pair.hold_tag());
    blocking(move || Ok(local::move_hold(&pool, &name, &tag).map_err(StreamFailure::from)?)).await
}

/// A write that failed because the target closed the connection may have
/// been preceded by the target's reason (its pool full): that is the
/// error to report, if it arrived.
async fn explained<R: AsyncRead + Unpin>(
    reader: &mut Reader<R>,
    err: SessionError,
    idle: Duration,
) -> SessionError {
    if !matches!(err, SessionError::Io(_)) {
        return err;
    }
    match tokio::time::timeout(idle, reader.next_untimed()).await {
        Ok(Ok(Some(Message::Failed(r) | Message::Refuse(r)))) => SessionError::Refused(r),
        _ => err,
    }
}

/// What the target saying anything during a stream means: it failed
/// part way (its pool full, or the session no longer allowed).
fn spoke_during_stream(message: Result<Option<Message>, SessionError>) -> SessionError {
    match message {
        Err(e) => e,
        Ok(Some(Message::Failed(r) | Message::Refuse(r))) => SessionError::Refused(r),
        Ok(Some(other)) => SessionError::Unexpected {
            expected: "nothing during a stream",
            got: other.name(),
        },
        Ok(None) => SessionError::Io(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "the target closed the connection during the stream",
        )),
    }
}

enum StreamOf {
    Resume(ResumeToken),
    Snapshot { snap: String, base: Option<String> },
}

/// Sends one stream and waits for the target to have received it.
async fn send_one<R, W>(
    ctx: &SourceContext,
    pair: &Pair,
    reader: &mut Reader<R>,
    writer: &mut Writer<W>,
    progress: &Progress,
    what: StreamOf,
    abort_partial: bool,
) -> Result<Sent, SessionError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let req = match what {
        StreamOf::Resume(token) => SendRequest {
            target: String::new(),
            base: None,
            resume: Some(token),
            compression: ctx.compression,
            format: SendFormat::Arbor,
            raw: Raw::IfEncrypted,
        },
        StreamOf::Snapshot { snap, base } => SendRequest {
            target: snap,
            base,
            resume: None,
            compression: ctx.compression,
            format: SendFormat::Arbor,
            raw: Raw::IfEncrypted,
        },
    };
    let (tx, mut rx) = mpsc::channel::<Result<Vec<u8>, StreamFailure>>(IN_FLIGHT);
    let (ready_tx, ready_rx) =
        tokio::sync::oneshot::channel::<Result<(String, u64), StreamFailure>>();
    let pool = Arc::clone(&ctx.pool);
    let pins = Arc::clone(&ctx.pins);
    tokio::task::spawn_blocking(move || {
        let mut sender = match Sender::new(&pool, &req) {
            Ok(s) => s,
            Err(e) => {
                let _ = ready_tx.send(Err(e));
                return;
            }
        };
        // Pruning and destroying leave these alone while the stream runs.
        let _pinned = sender.pin(&pins);
        let estimate = match sender.estimate() {
            Ok(e) => e.stream_bytes,
            Err(e) => {
                let _ = ready_tx.send(Err(e));
                return;
            }
        };
        let _ = ready_tx.send(Ok((sender.header().name.clone(), estimate)));
        // A closed channel is the session ending: nothing to report.
        if let Err(e) = sender.pump(|piece| tx.blocking_send(Ok(piece)).is_ok()) {
            let _ = tx.blocking_send(Err(e));
        }
    });
    let (name, estimate) = ready_rx
        .await
        .map_err(|_| SessionError::Local(StreamFailure::Refused("the send task ended".into())))??;
    progress.start(&name, estimate);
    writer
        .send(&Message::Begin(Begin { abort_partial }))
        .await?;
    let mut limit = pair.rate_limit.map(RateLimit::new);
    loop {
        tokio::select! {
            // The target may fail part way (its pool full): it says so at
            // once, without waiting for the rest of the stream.
            message = reader.next_untimed() => return Err(spoke_during_stream(message)),
            piece = rx.recv() => match piece {
                Some(Ok(bytes)) => {
                    let before = writer.bytes;
                    let send = async {
                        if let Some(limit) = limit.as_mut() {
                            limit.take(bytes.len()).await;
                        }
                        writer.send_data(&bytes).await
                    };
                    // Heard while a piece waits for the rate limit or for
                    // room on the link as well (a piece half sent is
                    // dropped with the session).
                    let sent = tokio::select! {
                        message = reader.next_untimed() => return Err(spoke_during_stream(message)),
                        sent = send => sent,
                    };
                    if let Err(e) = sent {
                        return Err(explained(reader, e, ctx.idle).await);
                    }
                    progress.wire_bytes.fetch_add(writer.bytes - before, Ordering::Relaxed);
                    progress.stream_sent.fetch_add(bytes.len() as u64, Ordering::Relaxed);
                }
                Some(Err(e)) => return Err(SessionError::Local(e)),
                None => break,
            }
        }
    }
    if let Err(e) = writer.send(&Message::Done).await {
        return Err(explained(reader, e, ctx.idle).await);
    }
    match reader.expect("received").await? {
        Message::Received(r) => {
            info!(pair = %pair.key(), snapshot = %r.snapshot, bytes = r.stream_bytes, resumed_from = r.resumed_from, "replicated");
            Ok(Sent {
                snapshot: name,
                stream_bytes: r.stream_bytes,
                resumed_from: r.resumed_from,
            })
        }
        other => Err(SessionError::Unexpected {
            expected: "received",
            got: other.name(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replication_snapshot_names_only_grow() {
        let t1 = "2026-11-24T01:31:00Z";
        let t2 = "2026-11-24T01:31:01Z";
        assert_eq!(next_stamp(t1, None), t1);
        assert_eq!(next_stamp(t2, stamp_of(t1)), t2);
        assert_eq!(next_stamp(t1, stamp_of(t1)), format!("{t1}.2"));
        assert_eq!(
            next_stamp(t1, stamp_of(&format!("{t1}.9"))),
            format!("{t1}.10")
        );
        // A clock set back still gives a later name.
        assert_eq!(next_stamp(t1, stamp_of(t2)), format!("{t2}.2"));
        assert_eq!(stamp_of("x.y"), None);
    }

    #[test]
    fn the_longest_replication_snapshot_name_is_as_long_as_said() {
        let t = "2026-11-24T01:31:00Z";
        let last = next_stamp(t, stamp_of(&format!("{t}.{}", u32::MAX)));
        assert_eq!(SNAPSHOT_PREFIX.len() + last.len(), MAX_SNAPSHOT_NAME_LEN);
    }
}
