//! Replication sessions between real pools (on simulated disks), over
//! in-memory connections: seeding, increments, chains, divergence and its
//! forced resync, cut connections resumed without resending what arrived,
//! a full target pool, and the target's refusals (unknown source, cycle,
//! a second source, a writable volume).
// A test crate: unwrap, expect and panic are how a test reports failure
// (the workspace denies them in the code it ships; clippy.toml allows
// them in #[test] functions, this in the helpers around them).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use arbor_engine::{CreateOptions, OpenOptions, Pool};
use arbor_io::{BlockDevice, SimDisk};
use arbor_replica::proto::{Begin, Hello, Message, RefusalCode, SnapshotEntry, WireGuid};
use arbor_replica::session::{Reader, SessionError, Writer};
use arbor_replica::source::{self, CycleReport, Progress, SourceContext};
use arbor_replica::state::{Pair, Role, Store};
use arbor_replica::target::{Allow, Served, Target, TargetConfig, UPSTREAM_HOLD};
use arbor_stream::busy::{Claims, Pins};
use arbor_stream::format::{Compression, Guid};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncRead, AsyncWrite, DuplexStream, ReadBuf};

const MIB: u64 = 1 << 20;
const VOL: u64 = 16 * MIB;

struct Host {
    name: String,
    disk: SimDisk,
    pool: Arc<Pool>,
    store: Arc<Store>,
    pins: Arc<Pins>,
    claims: Arc<Claims>,
    allow: Vec<Allow>,
    _dir: tempfile::TempDir,
}

impl Host {
    fn new(name: &str, disk_bytes: u64) -> Host {
        let disk = SimDisk::new(disk_bytes);
        let dev: Arc<dyn BlockDevice> = Arc::new(disk.clone());
        let opts = CreateOptions {
            chunk_size: 4096,
            metadata_bytes: Some(4 * MIB),
            ..Default::default()
        };
        let pool = Pool::create(dev, &opts, &OpenOptions::default()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        Host {
            name: name.into(),
            disk,
            pool: Arc::new(pool),
            store: Arc::new(Store::open(&dir.path().join("replication.json")).unwrap()),
            pins: Arc::default(),
            claims: Arc::default(),
            allow: Vec::new(),
            _dir: dir,
        }
    }

    fn allowing(mut self, source: &str) -> Host {
        self.allow.push(Allow {
            source: source.into(),
            volumes: vec!["*".into()],
            keep: None,
        });
        self
    }

    fn target(&self) -> Target {
        Target {
            pool: Arc::clone(&self.pool),
            config: Arc::new(TargetConfig {
                identity: self.name.clone(),
                allow: self.allow.clone(),
                idle: Duration::from_secs(30),
                checkpoint_bytes: MIB,
            }),
            store: Arc::clone(&self.store),
            claims: Arc::clone(&self.claims),
            pins: Arc::clone(&self.pins),
        }
    }

    fn source(&self, volume: &str) -> SourceContext {
        SourceContext {
            pool: Arc::clone(&self.pool),
            pins: Arc::clone(&self.pins),
            identity: self.name.clone(),
            upstream: self.store.role(volume).map(|r| r.path),
            idle: Duration::from_secs(30),
            compression: Compression::Zstd { level: 1 },
        }
    }

    fn write_random(&self, volume: &str, rng: &mut StdRng, writes: usize) {
        let id = self.pool.lookup(volume).unwrap();
        for _ in 0..writes {
            let len = rng.gen_range(1..64) * 4096;
            let off = rng.gen_range(0..(VOL - len as u64) / 4096) * 4096;
            let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
            self.pool.write(id, off, &data).unwrap();
        }
    }

    fn contents(&self, name: &str) -> Vec<u8> {
        let id = self.pool.lookup(name).unwrap();
        let mut buf = vec![0u8; self.pool.info(id).unwrap().size as usize];
        self.pool.read(id, 0, &mut buf).unwrap();
        buf
    }

    fn snapshots(&self, volume: &str) -> Vec<String> {
        let id = self.pool.lookup(volume).unwrap();
        arbor_replica::local::snapshots_of(&self.pool, id)
            .unwrap()
            .into_iter()
            .map(|s| s.name)
            .collect()
    }

    fn newest(&self, volume: &str) -> String {
        self.snapshots(volume).pop().unwrap()
    }

    /// Flips a bit of the device block that holds `want` (bytes the test
    /// made unique), durably.
    fn damage(&self, want: &[u8]) {
        let image = self.disk.handle().visible_image();
        let at = image
            .chunks(4096)
            .position(|b| b == want)
            .expect("the block is on the device")
            * 4096;
        let mut bad = want.to_vec();
        bad[17] ^= 0x08;
        self.disk.write_at(&bad, at as u64).unwrap();
        self.disk.flush().unwrap();
    }

    /// Reads every block of `name`: the offsets that fail as damaged
    /// (which records them, as any read does).
    fn damaged(&self, name: &str) -> Vec<u64> {
        let id = self.pool.lookup(name).unwrap();
        let size = self.pool.info(id).unwrap().size;
        let mut one = vec![0u8; 4096];
        (0..size / 4096)
            .map(|b| b * 4096)
            .filter(|&at| match self.pool.read(id, at, &mut one) {
                Ok(()) => false,
                Err(arbor_engine::Error::Damaged(_)) => true,
                Err(e) => panic!("{e}"),
            })
            .collect()
    }
}

/// `replica demote VOLUME` on `host`: a replica waiting for a source.
fn demote(host: &Host, volume: &str) {
    host.store
        .set_role(
            volume,
            Role {
                source: None,
                path: Vec::new(),
            },
        )
        .unwrap();
}

fn pair(volume: &str, target: &str) -> Pair {
    Pair {
        volume: volume.into(),
        target: format!("{target}:7400"),
        remote_volume: volume.into(),
        identity: None,
        rate_limit: None,
        interval_secs: 10,
        keep: None,
        seeded: false,
        resync: false,
    }
}

/// A connection that breaks (as a cut link does) after `left` bytes have
/// been written through it.
struct Cutoff {
    inner: DuplexStream,
    left: usize,
}

impl AsyncRead for Cutoff {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Cutoff {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if self.left == 0 {
            return Poll::Ready(Err(std::io::ErrorKind::BrokenPipe.into()));
        }
        let n = buf.len().min(self.left);
        let polled = Pin::new(&mut self.inner).poll_write(cx, &buf[..n]);
        if let Poll::Ready(Ok(done)) = polled {
            self.left -= done;
            if self.left == 0 {
                // The far end sees the connection end here.
                let _ = Pin::new(&mut self.inner).poll_shutdown(cx);
            }
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// One cycle of `pair` from `src` to `dst`; the link breaks after `cut`
/// bytes from the source if given.
async fn cycle(
    src: &Host,
    pair: &Pair,
    dst: &Host,
    cut: Option<usize>,
) -> (
    Result<CycleReport, SessionError>,
    Result<Served, SessionError>,
) {
    let (a, b) = tokio::io::duplex(256 << 10);
    let target = dst.target();
    let peer = src.name.clone();
    let served = tokio::spawn(async move { target.serve(&peer, b).await });
    let ctx = src.source(&pair.volume);
    let progress = Progress::default();
    let report = match cut {
        Some(left) => source::cycle(&ctx, pair, Cutoff { inner: a, left }, &progress).await,
        None => source::cycle(&ctx, pair, a, &progress).await,
    };
    (report, served.await.unwrap())
}

/// alpha's vm1 replicated to beta once, then written again (300 random
/// writes of up to 252 KiB, from `seed`): the next cycle streams MiBs.
async fn replicated_then_written(seed: u64) -> (Host, Host, Pair) {
    let mut rng = StdRng::seed_from_u64(seed);
    let a = Host::new("alpha", 256 * MIB);
    let b = Host::new("beta", 256 * MIB).allowing("alpha");
    a.pool.create_volume("vm1", VOL).unwrap();
    a.write_random("vm1", &mut rng, 10);
    let ab = pair("vm1", "beta");
    cycle(&a, &ab, &b, None).await.0.unwrap();
    a.write_random("vm1", &mut rng, 300);
    (a, b, ab)
}

/// Waits until `host` has committed part of a receive into `volume`.
async fn receive_began(host: &Host, volume: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while arbor_stream::receive::resume_token(&host.pool, volume)
        .unwrap()
        .is_none_or(|t| t.offset == 0)
    {
        assert!(std::time::Instant::now() < deadline, "no receive began");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A link whose source end carries `first` bytes to the target end, then
/// stalls until the sender returned is used or dropped; the target's
/// answers always pass.
fn stalled_link(first: u64) -> (DuplexStream, DuplexStream, tokio::sync::oneshot::Sender<()>) {
    let (source_end, relay_a) = tokio::io::duplex(256 << 10);
    let (target_end, relay_b) = tokio::io::duplex(256 << 10);
    let (mut from_source, mut to_source) = tokio::io::split(relay_a);
    let (mut from_target, mut to_target) = tokio::io::split(relay_b);
    tokio::spawn(async move { tokio::io::copy(&mut from_target, &mut to_source).await });
    let (open, opened) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        use tokio::io::AsyncReadExt;
        let mut head = (&mut from_source).take(first);
        tokio::io::copy(&mut head, &mut to_target).await?;
        let _ = opened.await;
        tokio::io::copy(&mut from_source, &mut to_target).await
    });
    (source_end, target_end, open)
}

fn refusal_code(e: &SessionError) -> Option<RefusalCode> {
    match e {
        SessionError::Refused(r) => Some(r.code),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_converges_to_the_same_snapshots_and_holds_move_forward() {
    let mut rng = StdRng::seed_from_u64(1);
    let a = Host::new("alpha", 256 * MIB);
    let b = Host::new("beta", 256 * MIB).allowing("alpha");
    let c = Host::new("gamma", 256 * MIB).allowing("beta");
    a.pool.create_volume("vm1", VOL).unwrap();
    let (ab, bc) = (pair("vm1", "beta"), pair("vm1", "gamma"));
    for round in 0..4 {
        a.write_random("vm1", &mut rng, 20);
        let (report, served) = cycle(&a, &ab, &b, None).await;
        let report = report.unwrap();
        let served = served.unwrap();
        assert!(report.taken.is_some());
        assert_eq!(report.sent.len(), 1, "round {round}: {report:?}");
        assert_eq!(served.received.len(), 1);
        let (report, _) = cycle(&b, &bc, &c, None).await;
        let report = report.unwrap();
        // B passes snapshots on and takes none of its own.
        assert!(report.taken.is_none());
        assert_eq!(report.sent.len(), 1);
        let newest = a.newest("vm1");
        for host in [&b, &c] {
            assert_eq!(host.newest("vm1"), newest);
            assert_eq!(host.contents("vm1"), a.contents(&newest));
            assert_eq!(host.contents(&newest), a.contents(&newest));
            assert_eq!(
                host.pool.guid(host.pool.lookup(&newest).unwrap()).unwrap(),
                a.pool.guid(a.pool.lookup(&newest).unwrap()).unwrap()
            );
        }
        // Exactly one snapshot carries each hold: the newest.
        let held = |h: &Host, tag: &str| -> Vec<String> {
            h.snapshots("vm1")
                .into_iter()
                .filter(|s| {
                    let id = h.pool.lookup(s).unwrap();
                    h.pool.holds(id).unwrap().iter().any(|t| t == tag)
                })
                .collect()
        };
        assert_eq!(held(&a, &ab.hold_tag()), vec![newest.clone()]);
        assert_eq!(held(&b, UPSTREAM_HOLD), vec![newest.clone()]);
        assert_eq!(held(&b, &bc.hold_tag()), vec![newest.clone()]);
        assert_eq!(held(&c, UPSTREAM_HOLD), vec![newest.clone()]);
    }
    // Nothing changed: a cycle takes no snapshot and sends nothing.
    let (report, _) = cycle(&a, &ab, &b, None).await;
    let report = report.unwrap();
    assert!(report.taken.is_none() && report.sent.is_empty());
    assert_eq!(c.store.role("vm1").unwrap().path, vec!["alpha", "beta"]);
    for h in [&a, &b, &c] {
        assert!(h.pool.check().unwrap().is_clean(), "{}", h.name);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_link_resumes_without_resending_what_arrived() {
    let mut rng = StdRng::seed_from_u64(2);
    let a = Host::new("alpha", 256 * MIB);
    let b = Host::new("beta", 256 * MIB).allowing("alpha");
    a.pool.create_volume("vm1", VOL).unwrap();
    a.write_random("vm1", &mut rng, 200);
    let ab = pair("vm1", "beta");
    let mut wire = 0u64;
    let mut cuts = 0;
    // Cut every 3 MiB until it gets through.
    let report = loop {
        let (report, served) = cycle(&a, &ab, &b, Some(3 * MIB as usize)).await;
        match report {
            Ok(r) => {
                served.unwrap();
                break r;
            }
            Err(e) => {
                assert!(served.is_err());
                assert!(refusal_code(&e).is_none(), "{e}");
                cuts += 1;
                wire += 3 * MIB;
                assert!(cuts < 20);
            }
        }
    };
    wire += report.wire_bytes;
    assert!(cuts >= 2, "the stream should need several attempts");
    assert!(report.sent[0].resumed_from > 0, "{report:?}");
    assert_eq!(b.contents("vm1"), a.contents(&a.newest("vm1")));
    // A cut loses at most what came after the last checkpoint (1 MiB
    // here) plus what was in flight.
    let whole = {
        let (r, _) = cycle(
            &a,
            &pair("vm1", "other"),
            &Host::new("other", 256 * MIB).allowing("alpha"),
            None,
        )
        .await;
        r.unwrap().wire_bytes
    };
    assert!(
        wire <= whole + cuts * (MIB + (512 << 10)),
        "sent {wire} bytes in {cuts} cuts for a {whole}-byte stream"
    );
    assert!(b.pool.check().unwrap().is_clean());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn divergence_is_reported_and_a_forced_resync_rolls_back() {
    let mut rng = StdRng::seed_from_u64(3);
    let a = Host::new("alpha", 256 * MIB);
    let b = Host::new("beta", 256 * MIB).allowing("alpha");
    a.pool.create_volume("vm1", VOL).unwrap();
    a.write_random("vm1", &mut rng, 10);
    let mut ab = pair("vm1", "beta");
    cycle(&a, &ab, &b, None).await.0.unwrap();
    let common = b.newest("vm1");
    // Someone writes to the replica and snapshots it.
    b.write_random("vm1", &mut rng, 3);
    b.pool.snapshot("vm1@local").unwrap();
    b.write_random("vm1", &mut rng, 3);
    a.write_random("vm1", &mut rng, 10);
    let (report, served) = cycle(&a, &ab, &b, None).await;
    let e = report.unwrap_err();
    assert_eq!(refusal_code(&e), Some(RefusalCode::Diverged), "{e}");
    assert!(e.to_string().contains("vm1@local"), "{e}");
    assert!(served.is_err());
    // Nothing changed on the replica.
    assert!(b.pool.lookup("vm1@local").is_ok());
    ab.resync = true;
    let report = cycle(&a, &ab, &b, None).await.0.unwrap();
    assert!(report.rolled_back.iter().any(|s| s == "vm1@local"));
    assert!(b.pool.lookup("vm1@local").is_err());
    assert!(b.pool.lookup(&common).is_ok());
    assert_eq!(b.contents("vm1"), a.contents(&a.newest("vm1")));
}

/// Issue 39, 4: a replica promoted on its target, written and
/// snapshotted there, is never rolled back by its old source, whatever the
/// pair says (`--seeded`, `resync --force`); once demoted there, a forced
/// resync discards what the demote exposed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_never_overwrites_a_volume_writable_on_its_target() {
    let mut rng = StdRng::seed_from_u64(9);
    let a = Host::new("alpha", 256 * MIB);
    let b = Host::new("beta", 256 * MIB).allowing("alpha");
    a.pool.create_volume("vm1", VOL).unwrap();
    a.write_random("vm1", &mut rng, 10);
    let ab = pair("vm1", "beta");
    cycle(&a, &ab, &b, None).await.0.unwrap();
    // Promoted on beta (its role cleared), written and snapshotted there.
    b.store.clear_role("vm1").unwrap();
    b.write_random("vm1", &mut rng, 3);
    b.pool.snapshot("vm1@beta-own").unwrap();
    b.write_random("vm1", &mut rng, 3);
    let before = b.contents("vm1");
    a.write_random("vm1", &mut rng, 10);
    let forced = Pair {
        seeded: true,
        resync: true,
        ..ab.clone()
    };
    for p in [&ab, &forced] {
        let (report, served) = cycle(&a, p, &b, None).await;
        let e = report.unwrap_err();
        assert_eq!(refusal_code(&e), Some(RefusalCode::NotAllowed), "{e}");
        assert!(e.to_string().contains("writable on beta"), "{e}");
        assert!(served.is_err());
        assert!(b.pool.lookup("vm1@beta-own").is_ok());
        assert!(b.contents("vm1") == before, "beta's vm1 was changed");
        assert!(
            b.store.role("vm1").is_none(),
            "beta's vm1 was made a replica"
        );
    }
    // Demoted on beta: a replica again, and the forced resync goes through.
    demote(&b, "vm1");
    let report = cycle(&a, &forced, &b, None).await.0.unwrap();
    assert!(report.rolled_back.iter().any(|s| s == "vm1@beta-own"));
    assert_eq!(b.contents("vm1"), a.contents(&a.newest("vm1")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn targets_refuse_unknown_sources_cycles_second_sources_and_writable_volumes() {
    let a = Host::new("alpha", 64 * MIB);
    let b = Host::new("beta", 64 * MIB)
        .allowing("alpha")
        .allowing("delta");
    a.pool.create_volume("vm1", VOL).unwrap();
    let ab = pair("vm1", "beta");
    // An unknown source.
    let stranger = Host::new("mallory", 64 * MIB);
    stranger.pool.create_volume("vm1", VOL).unwrap();
    let e = cycle(&stranger, &ab, &b, None).await.0.unwrap_err();
    assert_eq!(refusal_code(&e), Some(RefusalCode::NotAllowed), "{e}");
    assert!(b.pool.lookup("vm1").is_err());
    // A writable volume of the same name.
    b.pool.create_volume("vm1", VOL).unwrap();
    let e = cycle(&a, &ab, &b, None).await.0.unwrap_err();
    assert_eq!(refusal_code(&e), Some(RefusalCode::NotAllowed), "{e}");
    b.pool.delete("vm1").unwrap();
    cycle(&a, &ab, &b, None).await.0.unwrap();
    // A second source for the same replica.
    let d = Host::new("delta", 64 * MIB);
    d.pool.create_volume("vm1", VOL).unwrap();
    let e = cycle(&d, &ab, &b, None).await.0.unwrap_err();
    assert_eq!(refusal_code(&e), Some(RefusalCode::NotAllowed), "{e}");
    // A cycle: beta sending vm1 back to alpha, which alpha allows.
    let a = a.allowing("beta");
    demote(&a, "vm1");
    let e = cycle(&b, &pair("vm1", "alpha"), &a, None)
        .await
        .0
        .unwrap_err();
    assert_eq!(refusal_code(&e), Some(RefusalCode::Cycle), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_target_pool_says_so_and_keeps_what_arrived() {
    let mut rng = StdRng::seed_from_u64(5);
    let a = Host::new("alpha", 256 * MIB);
    // Room for about half the volume.
    let b = Host::new("beta", 16 * MIB).allowing("alpha");
    a.pool.create_volume("vm1", VOL).unwrap();
    a.write_random("vm1", &mut rng, 400);
    let ab = pair("vm1", "beta");
    let (report, served) = cycle(&a, &ab, &b, None).await;
    let e = report.unwrap_err();
    assert_eq!(refusal_code(&e), Some(RefusalCode::NoSpace), "{e}");
    assert!(served.is_err());
    assert!(b.pool.lookup("vm1").is_err());
    assert!(b.pool.check().unwrap().is_clean());
    // What arrived is kept for the next attempt.
    assert!(arbor_stream::receive::resume_token(&b.pool, "vm1")
        .unwrap()
        .is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_received_snapshot_the_source_no_longer_has_is_dropped() {
    let mut rng = StdRng::seed_from_u64(6);
    let a = Host::new("alpha", 256 * MIB);
    let b = Host::new("beta", 256 * MIB).allowing("alpha");
    a.pool.create_volume("vm1", VOL).unwrap();
    a.write_random("vm1", &mut rng, 200);
    let ab = pair("vm1", "beta");
    let (report, _) = cycle(&a, &ab, &b, Some(3 * MIB as usize)).await;
    assert!(report.is_err());
    let token = arbor_stream::receive::resume_token(&b.pool, "vm1")
        .unwrap()
        .expect("a partial receive");
    // The source loses that snapshot before the next cycle.
    let gone = a.newest("vm1");
    a.pool.delete(&gone).unwrap();
    a.write_random("vm1", &mut rng, 5);
    let report = cycle(&a, &ab, &b, None).await.0.unwrap();
    assert_eq!(report.sent.len(), 1);
    assert_eq!(report.sent[0].resumed_from, 0);
    // (The new snapshot may reuse the name within the same second; its
    // identity is new.)
    assert_eq!(b.contents("vm1"), a.contents(&a.newest("vm1")));
    assert!(b.pool.find_guid(&token.target.0).unwrap().is_none());
    assert!(b.pool.check().unwrap().is_clean());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_never_hands_a_pruned_name_to_a_new_snapshot() {
    let mut rng = StdRng::seed_from_u64(7);
    let a = Host::new("alpha", 256 * MIB);
    let b = Host::new("beta", 256 * MIB).allowing("alpha");
    a.pool.create_volume("vm1", VOL).unwrap();
    let mut ab = pair("vm1", "beta");
    ab.keep = Some(1);
    // Cycles faster than the clock's seconds: the master prunes names the
    // target (keeping all) still has.
    for _ in 0..5 {
        a.write_random("vm1", &mut rng, 2);
        let report = cycle(&a, &ab, &b, None).await.0.unwrap();
        assert_eq!(report.sent.len(), 1, "{report:?}");
    }
    assert_eq!(a.snapshots("vm1").len(), 1);
    let names = b.snapshots("vm1");
    assert_eq!(names.len(), 5);
    assert_eq!(b.contents("vm1"), a.contents(&a.newest("vm1")));
}

/// An origin (a raw disk snapshotted in place) replicates like any volume:
/// its first snapshot goes whole, the next ones as increments found in its
/// snapshot store, and the target holds ordinary volumes equal to them; an
/// origin not written since its newest snapshot gets no new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_origin_replicates_whole_then_incrementally() {
    let mut rng = StdRng::seed_from_u64(7);
    let a = Host::new("alpha", 256 * MIB);
    let b = Host::new("beta", 256 * MIB).allowing("alpha");
    let image: Vec<u8> = (0..VOL).map(|_| rng.gen()).collect();
    let device = SimDisk::from_image(image);
    let identity = arbor_engine::DeviceIdentity { dev: 9, ino: 9 };
    a.pool
        .attach_origin("disk", Arc::new(device), identity)
        .unwrap();
    let ab = pair("disk", "beta");
    let mut sent_bytes = Vec::new();
    for round in 0..3 {
        if round > 0 {
            a.write_random("disk", &mut rng, 4);
        }
        let (report, served) = cycle(&a, &ab, &b, None).await;
        let report = report.unwrap_or_else(|e| panic!("round {round}: {e}"));
        served.unwrap();
        assert_eq!(report.sent.len(), 1, "round {round}: {report:?}");
        sent_bytes.push(report.wire_bytes);
        let newest = a.newest("disk");
        assert_eq!(b.newest("disk"), newest);
        assert_eq!(b.contents(&newest), a.contents(&newest), "round {round}");
        assert_eq!(b.contents("disk"), a.contents("disk"), "round {round}");
    }
    assert!(
        sent_bytes[1] * 4 < sent_bytes[0] && sent_bytes[2] * 4 < sent_bytes[0],
        "increments carry what changed: {sent_bytes:?}"
    );
    // Not written since: a cycle takes no snapshot and sends nothing.
    let (report, _) = cycle(&a, &ab, &b, None).await;
    let report = report.unwrap();
    assert!(
        report.taken.is_none() && report.sent.is_empty(),
        "{report:?}"
    );
    for h in [&a, &b] {
        assert!(h.pool.check().unwrap().is_clean(), "{}", h.name);
    }
}

/// The whole stream of `snapshot` (against `base`), as a source sends it.
fn stream_of(host: &Host, snapshot: &str, base: Option<&str>) -> Vec<u8> {
    let req = arbor_stream::send::SendRequest {
        target: snapshot.into(),
        base: base.map(str::to_owned),
        resume: None,
        compression: Compression::Zstd { level: 1 },
        format: arbor_stream::send::SendFormat::Arbor,
        raw: arbor_stream::send::Raw::IfEncrypted,
    };
    let mut sender = arbor_stream::send::Sender::new(&host.pool, &req).unwrap();
    let mut bytes = Vec::new();
    sender
        .pump(|piece| {
            bytes.extend(piece);
            true
        })
        .unwrap();
    bytes
}

/// How `host` announces `snapshot` in a hello: its identity, name and
/// creation time.
fn entry(host: &Host, snapshot: &str) -> SnapshotEntry {
    let id = host.pool.lookup(snapshot).unwrap();
    SnapshotEntry {
        guid: WireGuid(Guid(host.pool.guid(id).unwrap().unwrap())),
        name: snapshot.into(),
        created: host.pool.info(id).unwrap().created_unix_secs,
    }
}

fn hello(volume: &str, snapshots: Vec<SnapshotEntry>, source: &str) -> Hello {
    Hello {
        volume: volume.into(),
        snapshots,
        path: vec![source.into()],
        seeded: false,
        force: false,
        heal: false,
    }
}

/// A hostile source, driven by hand (the real one never lies): sends
/// `hello`, then, if the target answers with a plan, `stream` in a begin /
/// data / done. Returns the target's last message and the session's end.
async fn hostile(
    dst: &Host,
    peer: &str,
    hello: Hello,
    stream: &[u8],
) -> (Option<Message>, Result<Served, SessionError>) {
    let (a, b) = tokio::io::duplex(256 << 10);
    let target = dst.target();
    let peer = peer.to_owned();
    let served = tokio::spawn(async move { target.serve(&peer, b).await });
    let (rd, wr) = tokio::io::split(a);
    let idle = Duration::from_secs(30);
    let (mut reader, mut writer) = (Reader::new(rd, idle), Writer::new(wr, idle));
    writer.send(&Message::Hello(hello)).await.unwrap();
    let answer = reader.next().await.unwrap();
    if !matches!(answer, Some(Message::Plan(_))) {
        return (answer, served.await.unwrap());
    }
    let begin = Message::Begin(Begin {
        abort_partial: false,
    });
    // The target may give up before the whole stream is in.
    let sent = async {
        writer.send(&begin).await?;
        writer.send_data(stream).await?;
        writer.send(&Message::Done).await
    }
    .await;
    let last = match sent {
        Ok(()) => reader.next().await.ok().flatten(),
        Err(_) => reader.next_untimed().await.ok().flatten(),
    };
    if matches!(last, Some(Message::Received(_))) {
        writer.send(&Message::End).await.unwrap();
    }
    (last, served.await.unwrap())
}

fn refused_with(last: &Option<Message>, code: RefusalCode) -> String {
    match last {
        Some(Message::Failed(r) | Message::Refuse(r)) if r.code == code => r.message.clone(),
        other => panic!("expected a {code:?} refusal, got {other:?}"),
    }
}

/// Nothing of a refused stream is stored: no volume, no snapshot, no
/// half-done receive.
fn nothing_stored(host: &Host, volume: &str) {
    assert!(host.pool.lookup(volume).is_err(), "{volume} was created");
    assert!(arbor_stream::receive::resume_token(&host.pool, volume)
        .unwrap()
        .is_none());
    assert!(host.store.role(volume).is_none());
    assert!(host.pool.check().unwrap().is_clean());
}

/// Issue 39, item 6: a source announcing one snapshot and streaming
/// another is refused, and nothing of the stream is stored: a stream
/// under another name than announced (`lie1@zzz` announced, `lie1@s1`
/// sent), one of an identity never announced, one with another creation
/// time, one whose base was not announced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_differs_from_its_announcement_is_refused() {
    let mut rng = StdRng::seed_from_u64(8);
    let a = Host::new("alpha", 256 * MIB);
    let b = Host::new("beta", 256 * MIB).allowing("alpha");
    a.pool.create_volume("lie1", VOL).unwrap();
    a.write_random("lie1", &mut rng, 10);
    a.pool.snapshot("lie1@s0").unwrap();
    a.write_random("lie1", &mut rng, 10);
    a.pool.snapshot("lie1@s1").unwrap();
    let s1 = entry(&a, "lie1@s1");
    let full = stream_of(&a, "lie1@s1", None);

    // Another name for the same identity.
    let renamed = SnapshotEntry {
        name: "lie1@zzz".into(),
        ..s1.clone()
    };
    let (last, served) = hostile(&b, "alpha", hello("lie1", vec![renamed], "alpha"), &full).await;
    let message = refused_with(&last, RefusalCode::Protocol);
    assert!(
        message.contains("lie1@zzz") && message.contains("lie1@s1"),
        "{message}"
    );
    assert!(served.is_err());
    nothing_stored(&b, "lie1");

    // The announced name, another identity.
    let other = SnapshotEntry {
        guid: WireGuid(Guid([0x5a; 16])),
        ..s1.clone()
    };
    let (last, _) = hostile(&b, "alpha", hello("lie1", vec![other], "alpha"), &full).await;
    let message = refused_with(&last, RefusalCode::Protocol);
    assert!(message.contains("not announce"), "{message}");
    nothing_stored(&b, "lie1");

    // Another creation time.
    let earlier = SnapshotEntry {
        created: s1.created - 1000,
        ..s1.clone()
    };
    let (last, _) = hostile(&b, "alpha", hello("lie1", vec![earlier], "alpha"), &full).await;
    refused_with(&last, RefusalCode::Protocol);
    nothing_stored(&b, "lie1");

    // Seeded with s0, then an increment: told the truth, the target takes
    // it.
    let seed = stream_of(&a, "lie1@s0", None);
    let (last, served) = hostile(
        &b,
        "alpha",
        hello("lie1", vec![entry(&a, "lie1@s0")], "alpha"),
        &seed,
    )
    .await;
    assert!(matches!(last, Some(Message::Received(_))), "{last:?}");
    served.unwrap();
    let delta = stream_of(&a, "lie1@s1", Some("lie1@s0"));
    let both = hello("lie1", vec![s1.clone(), entry(&a, "lie1@s0")], "alpha");
    let (last, served) = hostile(&b, "alpha", both, &delta).await;
    assert!(matches!(last, Some(Message::Received(_))), "{last:?}");
    served.unwrap();
    assert_eq!(b.contents("lie1"), a.contents("lie1@s1"));
    // An increment against a base the session never announced.
    let c = Host::new("gamma", 256 * MIB).allowing("alpha");
    let (last, _) = hostile(&c, "alpha", hello("lie1", vec![s1], "alpha"), &delta).await;
    let message = refused_with(&last, RefusalCode::Protocol);
    assert!(message.contains("base"), "{message}");
    nothing_stored(&c, "lie1");
}

/// Issue 39, item 6: names are checked against the name rules when they
/// are announced, before any plan: a bad volume name, a snapshot name
/// that breaks the rules or names another volume than the others, one
/// that would be too long under the target's volume name, and two names
/// for one identity.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_announcement_with_a_bad_name_is_refused_at_once() {
    let a = Host::new("alpha", 64 * MIB);
    let b = Host::new("beta", 64 * MIB).allowing("alpha");
    a.pool.create_volume("vm1", VOL).unwrap();
    a.pool.snapshot("vm1@s1").unwrap();
    let good = entry(&a, "vm1@s1");
    let named = |name: &str| SnapshotEntry {
        name: name.into(),
        ..good.clone()
    };
    let long = "v".repeat(180);
    let cases = [
        hello("bad/volume", vec![good.clone()], "alpha"),
        hello("-x", vec![good.clone()], "alpha"),
        hello("vm1", vec![named("vm1@bad name")], "alpha"),
        hello("vm1", vec![named("no-at-sign")], "alpha"),
        hello(
            "vm1",
            vec![
                named("vm1@s1"),
                SnapshotEntry {
                    guid: WireGuid(Guid([0x11; 16])),
                    ..named("other@s0")
                },
            ],
            "alpha",
        ),
        hello(
            &long,
            vec![named(&format!("vm1@{}", "s".repeat(20)))],
            "alpha",
        ),
        hello("vm1", vec![named("vm1@s1"), named("vm1@s2")], "alpha"),
    ];
    for case in cases {
        let volume = case.volume.clone();
        let (last, served) = hostile(&b, "alpha", case, &[]).await;
        let message = refused_with(&last, RefusalCode::Protocol);
        assert!(message.contains("announced"), "{volume}: {message}");
        assert!(served.is_err());
        nothing_stored(&b, &volume);
    }
}

/// Issue 39, item 7: a replica promoted on the target in the middle of a
/// receive: the source is told so ("promoted on the target"), not the
/// engine's view of the abandoned receive ("no such volume or snapshot:
/// volume id 31"), and the promoted volume stays writable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_promoted_mid_receive_says_so_to_the_source() {
    let (a, b, ab) = replicated_then_written(9).await;

    // The link from the source stalls after 3 MiB (the target has
    // committed part of the receive by then), until `open`.
    let (source_end, target_end, open) = stalled_link(3 * MIB);
    let target = b.target();
    let served = tokio::spawn(async move { target.serve("alpha", target_end).await });
    let ctx = a.source("vm1");
    let cycled = tokio::spawn(async move {
        let progress = Progress::default();
        source::cycle(&ctx, &ab, source_end, &progress).await
    });
    receive_began(&b, "vm1").await;
    // `arbor replica promote vm1` on the target (daemon/replication.rs):
    // the role goes, the receive in progress is abandoned, the upstream
    // hold released.
    b.store.clear_role("vm1").unwrap();
    b.pool.abort_receive("vm1").unwrap();
    let id = b.pool.lookup("vm1").unwrap();
    arbor_replica::local::release_all(&b.pool, id, UPSTREAM_HOLD, None).unwrap();
    open.send(()).unwrap();

    let e = cycled.await.unwrap().unwrap_err();
    assert_eq!(refusal_code(&e), Some(RefusalCode::Diverged), "{e}");
    assert!(e.to_string().contains("promoted on the target"), "{e}");
    assert!(!e.to_string().contains("volume id"), "{e}");
    let served = served.await.unwrap().unwrap_err();
    assert!(served.to_string().contains("promoted"), "{served}");
    // The promoted volume stays writable, with nothing of the receive.
    assert!(b.store.role("vm1").is_none());
    assert!(arbor_stream::receive::resume_token(&b.pool, "vm1")
        .unwrap()
        .is_none());
    assert!(b.pool.check().unwrap().is_clean());
}

/// A session withdrawn while it receives (a reload that no longer allows
/// its source) ends at once, with no more from the source: the source is
/// told why, and the receive keeps what it committed, to resume from if
/// the source is allowed again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_withdrawn_session_ends_at_once_telling_the_source_and_keeps_what_arrived() {
    let (a, b, ab) = replicated_then_written(12).await;

    // The link from the source stalls after 3 MiB, until `open`: the
    // target waits for data when the withdrawal comes.
    let (source_end, target_end, open) = stalled_link(3 * MIB);
    let (withdrawal, withdrawn) = arbor_replica::session::withdrawal();
    let target = b.target();
    let served = tokio::spawn(async move {
        target
            .serve_admitted(
                "alpha",
                target_end,
                Duration::from_secs(30),
                Some(withdrawn),
                |_| Ok(()),
            )
            .await
    });
    let ctx = a.source("vm1");
    let cycled = tokio::spawn(async move {
        let progress = Progress::default();
        source::cycle(&ctx, &ab, source_end, &progress).await
    });
    receive_began(&b, "vm1").await;
    let refusal = arbor_replica::proto::Refusal {
        code: RefusalCode::NotAllowed,
        message: "beta no longer accepts vm1 from alpha".into(),
    };
    withdrawal.withdraw(refusal.clone());

    // Both ends are over with the link still stalled.
    let served = served.await.unwrap().unwrap_err();
    assert_eq!(served.refusal(), refusal, "{served}");
    let e = cycled.await.unwrap().unwrap_err();
    assert_eq!(refusal_code(&e), Some(RefusalCode::NotAllowed), "{e}");
    assert!(e.to_string().contains("no longer accepts"), "{e}");
    let kept = arbor_stream::receive::resume_token(&b.pool, "vm1")
        .unwrap()
        .expect("the receive keeps what it committed");
    assert!(kept.offset > 0);
    assert!(b.pool.check().unwrap().is_clean());
    drop(open);

    // Allowed again (a new session without a withdrawal), the source
    // resumes where the receive stopped and the replica converges.
    let ab = pair("vm1", "beta");
    let (report, served) = cycle(&a, &ab, &b, None).await;
    let report = report.unwrap();
    served.unwrap();
    assert_eq!(report.sent[0].resumed_from, kept.offset, "{report:?}");
    assert_eq!(b.contents("vm1"), a.contents(&a.newest("vm1")));
    assert!(b.pool.check().unwrap().is_clean());
}

/// A volume with the longest name a volume may have replicates: its
/// replication snapshots fit the name rule on both hosts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_of_the_longest_name_replicates() {
    let mut rng = StdRng::seed_from_u64(9);
    let a = Host::new("alpha", 64 * MIB);
    let b = Host::new("beta", 64 * MIB).allowing("alpha");
    let name = "v".repeat(arbor_engine::MAX_VOLUME_NAME_LEN);
    a.pool.create_volume(&name, VOL).unwrap();
    let p = pair(&name, "beta");
    for _ in 0..2 {
        a.write_random(&name, &mut rng, 4);
        let (report, served) = cycle(&a, &p, &b, None).await;
        assert!(report.unwrap().taken.is_some());
        served.unwrap();
        let newest = a.newest(&name);
        assert_eq!(b.newest(&name), newest);
        assert_eq!(b.contents(&newest), a.contents(&newest));
    }
}

/// Healing between peers (REPLICATION.md, "Healing"): a block damaged on
/// the source and another on the target, in the snapshot both hold, are
/// each healed in the next session with the other's copy, byte-identical,
/// for every reader (the source's volume shares its block); a block
/// damaged on both stays damaged on both (no copy matches); and a session
/// with a peer that does not heal sends no heal message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_blocks_are_healed_from_the_peer_that_holds_the_same_snapshot() {
    let mut rng = StdRng::seed_from_u64(40);
    let a = Host::new("alpha", 256 * MIB);
    let b = Host::new("beta", 256 * MIB).allowing("alpha");
    let v = a.pool.create_volume("vm1", VOL).unwrap();
    let data: Vec<u8> = (0..4 * MIB).map(|_| rng.gen()).collect();
    a.pool.write(v, 0, &data).unwrap();
    let ab = pair("vm1", "beta");
    let (report, served) = cycle(&a, &ab, &b, None).await;
    report.unwrap();
    served.unwrap();
    let snap = a.newest("vm1");
    let good = a.contents(&snap);
    assert_eq!(b.contents(&snap), good);
    // Damage: on the source (a block its volume shares), on the target,
    // and one block on both.
    let block = |at: usize| &good[at..at + 4096];
    a.damage(block(40960));
    b.damage(block(1 << 20));
    a.damage(block(3 << 20));
    b.damage(block(3 << 20));
    assert_eq!(a.damaged(&snap), [40960, 3 << 20]);
    assert_eq!(a.damaged("vm1"), [40960, 3 << 20]);
    assert_eq!(b.damaged(&snap), [1 << 20, 3 << 20]);

    let (report, served) = cycle(&a, &ab, &b, None).await;
    let (report, served) = (report.unwrap(), served.unwrap());
    assert!(report.sent.is_empty(), "nothing new to send");
    // Each side sent its good copy of the other's block; the block
    // damaged on both was not sent by either.
    assert_eq!(
        (report.heal_sent, report.healed.healed),
        (1, 1),
        "{report:?}"
    );
    assert_eq!(
        (served.heal_sent, served.healed.healed),
        (1, 1),
        "{served:?}"
    );
    assert_eq!(report.healed.rejected + served.healed.rejected, 0);
    assert_eq!(a.damaged(&snap), [3 << 20]);
    assert_eq!(a.damaged("vm1"), [3 << 20]);
    assert_eq!(b.damaged(&snap), [3 << 20]);
    for (h, name) in [(&a, &snap), (&b, &snap)] {
        let mut got = vec![0u8; 4096];
        let id = h.pool.lookup(name).unwrap();
        for at in [40960u64, 1 << 20] {
            h.pool.read(id, at, &mut got).unwrap();
            assert!(
                got[..] == good[at as usize..at as usize + 4096],
                "{}",
                h.name
            );
        }
        let listed: Vec<u64> = h
            .pool
            .damage()
            .unwrap()
            .blocks
            .iter()
            .map(|d| d.readers[0].1)
            .collect();
        assert_eq!(listed, [3 << 20], "{}", h.name);
    }
    // The block damaged on both: put right by hand on the source, it is
    // healed on the target in the next session.
    let id = a.pool.lookup(&snap).unwrap();
    let bytes = &good[3 << 20..(3 << 20) + 4096];
    assert_eq!(a.pool.heal(id, 3 << 20, bytes).unwrap().healed, 1);
    let (report, served) = cycle(&a, &ab, &b, None).await;
    report.unwrap();
    assert_eq!(served.unwrap().healed.healed, 1);
    for h in [&a, &b] {
        assert!(h.damaged(&snap).is_empty(), "{}", h.name);
        assert_eq!(h.contents(&snap), good, "{}", h.name);
        assert_eq!(h.pool.damage_count().unwrap(), 0, "{}", h.name);
        assert!(h.pool.check().unwrap().is_clean(), "{}", h.name);
    }
}
