//! Send and receive between two real pools (on simulated disks): random
//! histories on pool A (writes, discards, snapshots, clones, rollbacks,
//! resizes), every snapshot sent to pool B, full or incremental against
//! any snapshot B already has (an ancestor, a sibling, a clone's origin,
//! an unrelated one); every received snapshot must read exactly as its
//! source and keep its identity, and both pools must check clean.
//! Interrupted streams resume to the same result, a power cut of the
//! receiving pool keeps the last checkpoint, and hostile streams leave
//! the target as it was.
// A test crate: unwrap, expect and panic are how a test reports failure
// (the workspace denies them in the code it ships; clippy.toml allows
// them in #[test] functions, this in the helpers around them).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::sync::Arc;

use arbor_engine::{CreateOptions, Durability, OpenOptions, Pool, VolumeId};
use arbor_io::{BlockDevice, SimDisk};
use arbor_stream::format::{Compression, Guid};
use arbor_stream::receive::{resume_token, ReceiveOptions, Receiver};
use arbor_stream::send::{SendRequest, Sender};
use arbor_stream::StreamFailure;
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const MIB: u64 = 1 << 20;
const CHUNK: u32 = 4096;

fn pool(disk: &SimDisk) -> Pool {
    let dev: Arc<dyn BlockDevice> = Arc::new(disk.clone());
    let opts = CreateOptions {
        chunk_size: CHUNK,
        metadata_bytes: Some(4 * MIB),
        ..Default::default()
    };
    Pool::create(dev, &opts, &open_opts()).expect("create")
}

fn open_opts() -> OpenOptions {
    OpenOptions {
        cache_bytes: 256 << 10,
        dirty_node_limit: 512,
    }
}

fn reopen(disk: &SimDisk) -> Pool {
    let dev: Arc<dyn BlockDevice> = Arc::new(disk.clone());
    Pool::open(dev, &open_opts()).expect("open")
}

fn contents(pool: &Pool, id: VolumeId) -> Vec<u8> {
    let size = pool.info(id).unwrap().size;
    let mut buf = vec![0u8; size as usize];
    pool.read(id, 0, &mut buf).unwrap();
    buf
}

fn stream(pool: &Pool, req: &SendRequest) -> Vec<u8> {
    let mut out = Vec::new();
    // Small diff windows, so that incremental streams span many (the
    // stream must not depend on the window).
    let mut sender = Sender::new(pool, req)
        .expect("plan")
        .with_diff_window(20 << 10);
    let mut piece = Vec::new();
    while sender.next(&mut piece).expect("send") {
        out.extend_from_slice(&piece);
        piece.clear();
    }
    out
}

fn request(target: &str, base: Option<&str>, compression: Compression) -> SendRequest {
    SendRequest {
        target: target.to_owned(),
        base: base.map(str::to_owned),
        resume: None,
        compression,
        format: Default::default(),
        raw: Default::default(),
    }
}

/// Receives `bytes` into `volume`, pushed in pieces of random sizes.
fn receive(
    pool: &Pool,
    volume: &str,
    bytes: &[u8],
    force: bool,
    rng: &mut StdRng,
) -> Result<arbor_stream::receive::Received, StreamFailure> {
    let opts = ReceiveOptions {
        checkpoint_bytes: 64 << 10,
        force,
    };
    let mut r = Receiver::new(pool, volume, opts);
    let mut at = 0;
    while at < bytes.len() {
        let n = rng.gen_range(1..=(bytes.len() - at).min(300_000));
        r.push(&bytes[at..at + n])?;
        at += n;
    }
    r.finish()
}

fn assert_clean(pool: &Pool) {
    let report = pool.check().unwrap();
    assert!(report.is_clean(), "{:#?}", report.problems);
}

#[derive(Debug, Clone)]
enum Op {
    Write {
        vol: usize,
        at: u64,
        len: u64,
        byte: u8,
    },
    Discard {
        vol: usize,
        at: u64,
        len: u64,
    },
    Snapshot {
        vol: usize,
    },
    Clone {
        snap: usize,
    },
    Rollback {
        vol: usize,
        snap: usize,
    },
    Resize {
        vol: usize,
        size: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0..8usize, 0..512u64, 1..40u64, any::<u8>()).prop_map(|(vol, at, len, byte)| Op::Write {
            vol,
            at: at * 1024,
            len: len * 1024,
            byte
        }),
        2 => (0..8usize, 0..512u64, 1..200u64).prop_map(|(vol, at, len)| Op::Discard {
            vol,
            at: at * 1024,
            len: len * 1024
        }),
        3 => (0..8usize).prop_map(|vol| Op::Snapshot { vol }),
        1 => (0..16usize).prop_map(|snap| Op::Clone { snap }),
        1 => (0..8usize, 0..16usize).prop_map(|(vol, snap)| Op::Rollback { vol, snap }),
        1 => (0..8usize, 256..700u64).prop_map(|(vol, kib)| Op::Resize { vol, size: kib * 1024 }),
    ]
}

/// Runs `ops` on pool A; returns the snapshots taken, in order.
fn history(a: &Pool, ops: &[Op]) -> Vec<String> {
    let mut vols = vec!["v0".to_owned()];
    a.create_volume("v0", 512 * 1024).unwrap();
    let mut snaps: Vec<String> = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        let pick = |n: usize, len: usize| n % len.max(1);
        match op {
            Op::Write { vol, at, len, byte } => {
                let id = a.lookup(&vols[pick(*vol, vols.len())]).unwrap();
                let size = a.info(id).unwrap().size;
                let (at, len) = ((*at).min(size - 1024) / 512 * 512, *len);
                let len = len.min(size - at);
                a.write(id, at, &vec![*byte; len as usize]).unwrap();
            }
            Op::Discard { vol, at, len } => {
                let id = a.lookup(&vols[pick(*vol, vols.len())]).unwrap();
                let size = a.info(id).unwrap().size;
                let at = (*at).min(size - 1024);
                a.discard(id, at, (*len).min(size - at)).unwrap();
            }
            Op::Snapshot { vol } => {
                let name = format!("{}@s{i}", vols[pick(*vol, vols.len())]);
                a.snapshot(&name).unwrap();
                snaps.push(name);
            }
            Op::Clone { snap } if !snaps.is_empty() => {
                let name = format!("c{i}");
                a.clone_snapshot(&snaps[pick(*snap, snaps.len())], &name)
                    .unwrap();
                vols.push(name);
            }
            Op::Rollback { vol, snap } => {
                let vol = &vols[pick(*vol, vols.len())];
                let mine: Vec<&String> = snaps
                    .iter()
                    .filter(|s| s.starts_with(&format!("{vol}@")))
                    .collect();
                if !mine.is_empty() {
                    a.rollback(vol, mine[pick(*snap, mine.len())]).unwrap();
                }
            }
            Op::Resize { vol, size } => {
                a.resize(&vols[pick(*vol, vols.len())], *size).unwrap();
            }
            Op::Clone { .. } => {}
        }
    }
    snaps
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn every_snapshot_arrives_identical_full_or_against_any_base(
        ops in proptest::collection::vec(op(), 10..60),
        seed in any::<u64>(),
    ) {
        let mut rng = StdRng::seed_from_u64(seed);
        let (da, db) = (SimDisk::new(96 * MIB), SimDisk::new(96 * MIB));
        let (a, b) = (pool(&da), pool(&db));
        let snaps = history(&a, &ops);
        // B's snapshots by identity: (name on B, volume on B).
        let mut on_b: BTreeMap<Guid, (String, String)> = BTreeMap::new();
        let mut latest: BTreeMap<String, Guid> = BTreeMap::new();
        for (n, snap) in snaps.iter().enumerate() {
            let sid = a.lookup(snap).unwrap();
            let guid = Guid(a.guid(sid).unwrap().unwrap());
            // A base among what B has, by its name on A; or a full stream.
            let bases: Vec<(Guid, String)> = on_b
                .keys()
                .filter_map(|g| {
                    let id = a.find_guid(&g.0).unwrap()?;
                    Some((*g, a.info(id).unwrap().name))
                })
                .collect();
            let base = if bases.is_empty() || rng.gen_bool(0.2) {
                None
            } else {
                Some(bases[rng.gen_range(0..bases.len())].clone())
            };
            let compression = match rng.gen_range(0..3) {
                0 => Compression::None,
                1 => Compression::Zstd { level: 1 },
                _ => Compression::Best { level: 1 },
            };
            let bytes = stream(&a, &request(snap, base.as_ref().map(|b| b.1.as_str()), compression));
            // Into the base's volume on B (rolled forward), or a new one.
            let (volume, force) = match &base {
                Some((g, _)) if rng.gen_bool(0.7) => {
                    let vol = on_b[g].1.clone();
                    let force = latest.get(&vol) != Some(g);
                    (vol, force)
                }
                _ => (format!("r{n}"), false),
            };
            let got = receive(&b, &volume, &bytes, force, &mut rng).unwrap();
            prop_assert_eq!(got.guid, guid);
            let bid = b.lookup(&got.snapshot).unwrap();
            prop_assert_eq!(b.guid(bid).unwrap(), Some(guid.0));
            prop_assert_eq!(
                b.info(bid).unwrap().created_unix_secs,
                a.info(sid).unwrap().created_unix_secs
            );
            prop_assert!(contents(&b, bid) == contents(&a, sid), "{} differs from {}", got.snapshot, snap);
            // The volume reads as the snapshot it was rolled forward to.
            let vid = b.lookup(&volume).unwrap();
            prop_assert!(contents(&b, vid) == contents(&a, sid));
            on_b.insert(guid, (got.snapshot.clone(), volume.clone()));
            latest.insert(volume, guid);
        }
        // Every received snapshot still reads as its source.
        for (guid, (name, _)) in &on_b {
            let src = a.find_guid(&guid.0).unwrap().unwrap();
            prop_assert!(contents(&b, b.lookup(name).unwrap()) == contents(&a, src));
        }
        assert_clean(&a);
        assert_clean(&b);
        while b.reclaim(4096).unwrap() > 0 {}
        assert_clean(&b);
    }
}

/// A pool A with `v@1` and `v@2` (scattered changes between them).
fn two_snapshots() -> (SimDisk, Pool) {
    let disk = SimDisk::new(64 * MIB);
    let a = pool(&disk);
    let v = a.create_volume("v", 4 * MIB).unwrap();
    for i in 0..200u64 {
        a.write(v, i * 16384, &[i as u8 + 1; 8192]).unwrap();
    }
    a.snapshot("v@1").unwrap();
    for i in (0..200u64).step_by(3) {
        a.write(v, i * 16384 + 4096, &[0xee; 4096]).unwrap();
    }
    a.discard(v, MIB, MIB).unwrap();
    a.snapshot("v@2").unwrap();
    (disk, a)
}

/// The full stream of `v@1` and the stream of `v@2` against it.
fn streams(a: &Pool, delta: Compression) -> (Vec<u8>, Vec<u8>) {
    (
        stream(a, &request("v@1", None, Compression::Zstd { level: 1 })),
        stream(a, &request("v@2", Some("v@1"), delta)),
    )
}

/// The stream that continues where `token` says.
fn resumed(a: &Pool, token: arbor_stream::format::ResumeToken) -> Vec<u8> {
    stream(
        a,
        &SendRequest {
            target: String::new(),
            base: None,
            resume: Some(token),
            compression: Compression::Zstd { level: 1 },
            format: Default::default(),
            raw: Default::default(),
        },
    )
}

/// A stream cut at any point resumes from the receiver's token to the
/// same snapshot, whether the cut came from the sender or the network.
#[test]
fn a_stream_cut_anywhere_resumes_to_the_same_snapshot() {
    let (_, a) = two_snapshots();
    let (full, incr) = streams(&a, Compression::Best { level: 1 });
    let mut rng = StdRng::seed_from_u64(7);
    for round in 0..12 {
        let db = SimDisk::new(64 * MIB);
        let b = pool(&db);
        for (bytes, target) in [(&full, "v@1"), (&incr, "v@2")] {
            let cut = rng.gen_range(0..bytes.len());
            let opts = ReceiveOptions {
                checkpoint_bytes: 32 << 10,
                force: false,
            };
            let mut r = Receiver::new(&b, "w", opts.clone());
            let _ = r.push(&bytes[..cut]);
            let token = r.interrupted().unwrap();
            drop(r);
            // Nothing visible yet.
            let snap = format!("w@{}", &target[2..]);
            assert!(
                b.lookup(&snap).is_err(),
                "round {round}: visible before the end"
            );
            let rest = match token {
                Some(token) => {
                    assert_eq!(resume_token(&b, "w").unwrap(), Some(token));
                    resumed(&a, token)
                }
                // Not even the header arrived: start over.
                None => bytes.clone(),
            };
            let got = receive(&b, "w", &rest, false, &mut rng).unwrap();
            assert_eq!(got.snapshot, snap);
            assert!(
                contents(&b, b.lookup(&snap).unwrap()) == contents(&a, a.lookup(target).unwrap()),
                "round {round}, {target}, cut at {cut}"
            );
            assert!(resume_token(&b, "w").unwrap().is_none());
        }
        assert_clean(&b);
    }
}

/// A power cut of the receiving pool mid-stream: the target is unchanged,
/// the receive resumes from its last checkpoint, the result is identical.
#[test]
fn a_power_cut_mid_receive_resumes_from_the_last_checkpoint() {
    let (_, a) = two_snapshots();
    let (full, incr) = streams(&a, Compression::Best { level: 1 });
    let mut rng = StdRng::seed_from_u64(11);
    for round in 0..6 {
        let db = SimDisk::new(64 * MIB);
        let b = pool(&db);
        receive(&b, "w", &full, false, &mut rng).unwrap();
        let before = contents(&b, b.lookup("w").unwrap());
        let opts = ReceiveOptions {
            checkpoint_bytes: 32 << 10,
            force: false,
        };
        let mut r = Receiver::new(&b, "w", opts);
        let cut = rng.gen_range(incr.len() / 4..incr.len() - 64);
        r.push(&incr[..cut]).unwrap();
        // The power goes: whatever was not flushed may be lost or torn.
        let handle = db.handle();
        handle.cut_power();
        let image = handle.crash_image(&mut rng);
        std::mem::forget(r);
        std::mem::forget(b);
        let db = SimDisk::from_image(image);
        let b = reopen(&db);
        assert!(b.lookup("w@2").is_err(), "round {round}");
        assert!(
            contents(&b, b.lookup("w").unwrap()) == before,
            "round {round}"
        );
        let token = resume_token(&b, "w").unwrap().expect("progress kept");
        assert!(token.offset > 0, "round {round}: no checkpoint survived");
        receive(&b, "w", &resumed(&a, token), false, &mut rng).unwrap();
        assert!(contents(&b, b.lookup("w@2").unwrap()) == contents(&a, a.lookup("v@2").unwrap()));
        assert_clean(&b);
    }
}

/// Damaged, truncated, foreign and misdirected streams are refused with a
/// clear error and leave the target as it was (no new snapshot, the volume
/// unchanged).
#[test]
fn hostile_streams_leave_the_target_as_it_was() {
    let (_, a) = two_snapshots();
    let (full, incr) = streams(&a, Compression::Zstd { level: 1 });
    let db = SimDisk::new(64 * MIB);
    let b = pool(&db);
    let mut rng = StdRng::seed_from_u64(3);
    receive(&b, "w", &full, false, &mut rng).unwrap();
    let before = contents(&b, b.lookup("w").unwrap());
    let unchanged = |b: &Pool| {
        assert!(b.lookup("w@2").is_err());
        assert!(contents(b, b.lookup("w").unwrap()) == before);
    };
    // Bit flips anywhere.
    for _ in 0..40 {
        let mut bad = incr.clone();
        let at = rng.gen_range(0..bad.len());
        bad[at] ^= 1 << rng.gen_range(0..8);
        let err = receive(&b, "w", &bad, false, &mut rng).unwrap_err();
        assert!(matches!(err, StreamFailure::Stream(_)), "{err}");
        unchanged(&b);
    }
    // Truncated.
    let err = receive(&b, "w", &incr[..incr.len() - 10], false, &mut rng).unwrap_err();
    assert!(
        err.to_string().contains("truncat") || err.to_string().contains("end"),
        "{err}"
    );
    unchanged(&b);
    // Not a stream.
    let err = receive(
        &b,
        "w",
        b"hello, this is not a stream at all",
        false,
        &mut rng,
    )
    .unwrap_err();
    assert!(matches!(err, StreamFailure::Stream(_)), "{err}");
    unchanged(&b);
    // An incremental stream whose base this pool does not have.
    let other = SimDisk::new(64 * MIB);
    let c = pool(&other);
    let err = receive(&c, "w", &incr, false, &mut rng).unwrap_err();
    assert!(err.to_string().contains("base"), "{err}");
    assert!(c.list().unwrap().is_empty());
    // The damaged attempts left a receive in progress (what verified of
    // them): another stream into the volume is refused until it is
    // resumed or aborted.
    let err = receive(&b, "w", &full, false, &mut rng).unwrap_err();
    assert!(err.to_string().contains("in progress"), "{err}");
    assert!(b.abort_receive("w").unwrap());
    unchanged(&b);
    // The stream of a snapshot the pool has already.
    let err = receive(&b, "w", &full, false, &mut rng).unwrap_err();
    assert!(err.to_string().contains("already has"), "{err}");
    // A full stream into an existing volume.
    let whole = stream(&a, &request("v@2", None, Compression::None));
    let err = receive(&b, "w", &whole, false, &mut rng).unwrap_err();
    assert!(err.to_string().contains("already exists"), "{err}");
    unchanged(&b);
    // The same snapshot twice.
    receive(&b, "w", &incr, false, &mut rng).unwrap();
    let err = receive(&b, "x", &full, false, &mut rng).unwrap_err();
    assert!(err.to_string().contains("identity"), "{err}");
    assert_clean(&b);
}

/// An incremental receive into a volume written since the base is refused
/// unless forced; forced, the volume's writes are replaced.
#[test]
fn a_volume_written_since_the_base_needs_force() {
    let (_, a) = two_snapshots();
    let full = stream(&a, &request("v@1", None, Compression::None));
    let incr = stream(&a, &request("v@2", Some("v@1"), Compression::None));
    let db = SimDisk::new(64 * MIB);
    let b = pool(&db);
    let mut rng = StdRng::seed_from_u64(5);
    receive(&b, "w", &full, false, &mut rng).unwrap();
    let w = b.lookup("w").unwrap();
    b.write(w, 0, &[0x55; 4096]).unwrap();
    let err = receive(&b, "w", &incr, false, &mut rng).unwrap_err();
    assert!(err.to_string().contains("--force"), "{err}");
    let mut buf = [0u8; 4096];
    b.read(w, 0, &mut buf).unwrap();
    assert_eq!(buf, [0x55; 4096], "refused: the volume keeps its writes");
    assert!(b.lookup("w@2").is_err());
    // The receive was kept: the forced retry resumes it.
    receive(&b, "w", &incr, true, &mut rng).unwrap();
    assert!(contents(&b, w) == contents(&a, a.lookup("v@2").unwrap()));
    assert_clean(&b);
}

/// A receive that runs out of data space fails cleanly: nothing shows,
/// the pool checks clean, the partial receive is kept (it resumes once
/// there is room) and aborting it gives the space back.
#[test]
fn a_receive_that_runs_out_of_space_leaves_nothing_visible() {
    let (_, a) = two_snapshots();
    let v = a.lookup("v").unwrap();
    // Incompressible-ish data, more than the small pool holds.
    let mut rng = StdRng::seed_from_u64(9);
    let mut noise = vec![0u8; 4 * MIB as usize];
    rng.fill(&mut noise[..]);
    a.write(v, 0, &noise).unwrap();
    a.snapshot("v@big").unwrap();
    let big = stream(&a, &request("v@big", None, Compression::None));
    let small = SimDisk::new(12 * MIB);
    // 8 MiB of metadata and a small journal leave about 3 MiB of data.
    let dev: Arc<dyn BlockDevice> = Arc::new(small.clone());
    let opts = CreateOptions {
        chunk_size: CHUNK,
        metadata_bytes: Some(8 * MIB),
        journal_pages: Some(64),
        ..Default::default()
    };
    let b = Pool::create(dev, &opts, &open_opts()).unwrap();
    let used = b.pool_stats().unwrap().data_used_bytes;
    let err = receive(&b, "w", &big, false, &mut rng).unwrap_err();
    assert!(
        matches!(
            err,
            StreamFailure::Engine(arbor_engine::Error::Exhausted(
                arbor_engine::Resource::DataSpace
            ))
        ),
        "{err}"
    );
    assert!(b.list().unwrap().is_empty(), "nothing visible");
    assert_clean(&b);
    assert!(resume_token(&b, "w").unwrap().is_some());
    assert!(b.abort_receive("w").unwrap());
    while b.reclaim(4096).unwrap() > 0 {}
    assert_eq!(b.pool_stats().unwrap().data_used_bytes, used);
    assert_clean(&b);
}

/// arbor → `rbd diff` → arbor: a full diff and an incremental one arrive
/// identical; like `rbd import-diff`, a missing from-snapshot or an
/// existing to-snapshot is refused, and a cut or failed diff leaves
/// nothing (not even a receive in progress: the format cannot resume).
#[test]
fn rbd_diffs_round_trip_and_are_refused_like_import_diff() {
    use arbor_stream::receive::RbdReceiver;
    use arbor_stream::send::SendFormat;
    let (_, a) = two_snapshots();
    let rbd = |target: &str, base: Option<&str>| {
        let mut req = request(target, base, Compression::None);
        req.format = SendFormat::RbdDiff;
        stream(&a, &req)
    };
    let (full, incr) = (rbd("v@1", None), rbd("v@2", Some("v@1")));
    assert!(full.starts_with(b"rbd diff v1\n"));
    let db = SimDisk::new(64 * MIB);
    let b = pool(&db);
    let apply = |volume: &str, bytes: &[u8], step: usize| {
        let mut r = RbdReceiver::new(&b, volume, false);
        for piece in bytes.chunks(step) {
            r.push(piece)?;
        }
        r.finish()
    };
    // An incremental diff whose from-snapshot is missing.
    let err = apply("w", &incr, 4096).unwrap_err();
    assert!(err.to_string().contains("does not exist"), "{err}");
    // Cut short: nothing, not even a receive in progress.
    assert!(apply("w", &full[..full.len() / 2], 1000).is_err());
    assert!(b.list().unwrap().is_empty());
    assert!(resume_token(&b, "w").unwrap().is_none());
    apply("w", &full, 70_000).unwrap();
    apply("w", &incr, 333).unwrap();
    for (src, dst) in [("v@1", "w@1"), ("v@2", "w@2"), ("v@2", "w")] {
        assert!(contents(&b, b.lookup(dst).unwrap()) == contents(&a, a.lookup(src).unwrap()));
    }
    let err = apply("w", &incr, 4096).unwrap_err();
    assert!(err.to_string().contains("already exists"), "{err}");
    assert_clean(&b);
}

/// A receive whose base snapshot was deleted meanwhile can never finish:
/// its status says so, and the next receive into the volume discards it
/// with a clear message instead of failing forever.
#[test]
fn a_receive_whose_base_is_gone_is_discarded_with_a_message() {
    let (_, a) = two_snapshots();
    let (full, incr) = streams(&a, Compression::Zstd { level: 1 });
    let db = SimDisk::new(64 * MIB);
    let b = pool(&db);
    let mut rng = StdRng::seed_from_u64(13);
    receive(&b, "w", &full, false, &mut rng).unwrap();
    let mut r = Receiver::new(
        &b,
        "w",
        ReceiveOptions {
            checkpoint_bytes: 16 << 10,
            force: false,
        },
    );
    r.push(&incr[..incr.len() / 2]).unwrap();
    let token = r.interrupted().unwrap().expect("a token");
    drop(r);
    b.delete("w@1").unwrap();
    let status = b.receive_status("w").unwrap().unwrap();
    assert!(status.stale);
    // Resuming now: the stale receive goes, and the stream's base is
    // missing, which the error says too.
    let err = receive(&b, "w", &resumed(&a, token), false, &mut rng).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("discarded the interrupted receive"), "{text}");
    assert!(text.contains("not in this pool"), "{text}");
    assert!(
        b.receive_status("w").unwrap().is_none(),
        "discarded for good"
    );
    // A full stream of another snapshot goes in as usual.
    let other = stream(&a, &request("v@2", None, Compression::None));
    receive(&b, "x", &other, false, &mut rng).unwrap();
    while b.reclaim(4096).unwrap() > 0 {}
    assert_clean(&b);
}

/// A snapshot of a copy-on-write volume (its home in the pool or on an
/// external device) is sent whole, through its epoch, and arrives as an
/// ordinary volume; the next one goes incrementally (what changed between
/// the two epochs, from the store), as do snapshots of a clone of one.
/// Between an ordinary volume's snapshot and one of these, an incremental
/// stream is refused with a clear error.
#[test]
fn snapshots_of_copy_on_write_volumes_are_sent_whole_then_incrementally() {
    let mut rng = StdRng::seed_from_u64(5);
    let (da, db) = (SimDisk::new(64 * MIB), SimDisk::new(64 * MIB));
    let (a, b) = (pool(&da), pool(&db));
    let size = 512 * 1024;
    let home = SimDisk::from_image((0..size).map(|i| (i / 512) as u8).collect());
    let dev: Arc<dyn BlockDevice> = Arc::new(home.clone());
    let ext = a
        .attach_origin("ext", dev, arbor_engine::DeviceIdentity { dev: 1, ino: 1 })
        .unwrap();
    let inpool = a.create_cow_volume("db", size as u64).unwrap();
    a.write(inpool, 0, &vec![3u8; 65536]).unwrap();
    for (vol, id) in [("ext", ext), ("db", inpool)] {
        a.snapshot(&format!("{vol}@1")).unwrap();
        let at1 = contents(&a, id);
        a.write(id, 8192, &vec![9u8; 20000]).unwrap();
        a.snapshot(&format!("{vol}@2")).unwrap();
        a.write(id, 0, &vec![7u8; 4096]).unwrap();
        let full = stream(&a, &request(&format!("{vol}@1"), None, Compression::None));
        receive(&b, vol, &full, false, &mut rng).unwrap();
        let got = b.lookup(&format!("{vol}@1")).unwrap();
        assert!(contents(&b, got) == at1, "{vol}@1 arrived different");
        let at2 = contents(&a, a.lookup(&format!("{vol}@2")).unwrap());
        let incr = stream(
            &a,
            &request(
                &format!("{vol}@2"),
                Some(&format!("{vol}@1")),
                Compression::None,
            ),
        );
        assert!(
            incr.len() < full.len() / 4,
            "{vol}: the incremental stream carries what changed, not all"
        );
        receive(&b, vol, &incr, false, &mut rng).unwrap();
        let got = b.lookup(&format!("{vol}@2")).unwrap();
        assert!(contents(&b, got) == at2, "{vol}@2 arrived different");
        // A clone of a snapshot, written, and its snapshots: incremental too.
        let clone = a
            .clone_snapshot(&format!("{vol}@2"), &format!("{vol}c"))
            .unwrap();
        a.snapshot(&format!("{vol}c@1")).unwrap();
        a.write(clone, 100_000, &vec![5u8; 3000]).unwrap();
        a.snapshot(&format!("{vol}c@2")).unwrap();
        let full = stream(&a, &request(&format!("{vol}c@1"), None, Compression::None));
        receive(&b, &format!("{vol}c"), &full, false, &mut rng).unwrap();
        let incr = stream(
            &a,
            &request(
                &format!("{vol}c@2"),
                Some(&format!("{vol}c@1")),
                Compression::None,
            ),
        );
        receive(&b, &format!("{vol}c"), &incr, false, &mut rng).unwrap();
        let want = contents(&a, a.lookup(&format!("{vol}c@2")).unwrap());
        let got = b.lookup(&format!("{vol}c@2")).unwrap();
        assert!(contents(&b, got) == want, "{vol}c@2 arrived different");
    }
    // An ordinary volume's snapshot as the base of one of these: refused.
    let plain = a.create_volume("plain", size as u64).unwrap();
    a.write(plain, 0, &vec![1u8; 4096]).unwrap();
    a.snapshot("plain@1").unwrap();
    let err = Sender::new(&a, &request("ext@2", Some("plain@1"), Compression::None))
        .err()
        .expect("an incremental stream across layouts is refused");
    assert!(err.to_string().contains("send it whole"), "{err}");
    for p in [&a, &b] {
        let report = p.check().unwrap();
        assert!(report.is_clean(), "{:?}", report.problems);
    }
}

/// A snapshot taken with deferred durability is made durable before any of
/// it is sent: a power cut after the send started cannot lose a snapshot
/// that a receiver may already hold.
#[test]
fn a_send_makes_a_deferred_snapshot_durable_first() {
    let disk = SimDisk::new(64 * MIB);
    let a = pool(&disk);
    let v = a.create_volume("v", 1 << 20).unwrap();
    a.write(v, 0, &vec![5u8; 65536]).unwrap();
    a.snapshot_with("v@s", Durability::Deferred).unwrap();
    let lost = Pool::open(
        Arc::new(SimDisk::from_image(disk.handle().durable_image())),
        &open_opts(),
    )
    .unwrap();
    assert!(
        lost.lookup("v@s").is_err(),
        "the snapshot was durable already"
    );
    let sender = Sender::new(&a, &request("v@s", None, Compression::None)).unwrap();
    drop(sender);
    let crashed = Pool::open(
        Arc::new(SimDisk::from_image(disk.handle().durable_image())),
        &open_opts(),
    )
    .unwrap();
    let s = crashed
        .lookup("v@s")
        .expect("the sent snapshot survives a power cut");
    let mut head = vec![0u8; 65536];
    crashed.read(s, 0, &mut head).unwrap();
    assert!(head.iter().all(|&b| b == 5));
}
