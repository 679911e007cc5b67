//! Replication between two real daemons on loopback: what a target's
//! replication port does under connections that are not sources.
// A test crate: unwrap, expect and panic are how a test reports failure
// (the workspace denies them in the code it ships; clippy.toml allows
// them in #[test] functions, this in the helpers around them).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;

use common::*;
use serde_json::Value;

/// The sockets `pid` holds open.
fn sockets_of(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|target| target.to_string_lossy().starts_with("socket:"))
        .count()
}

/// The resident memory of `pid`, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/PID/status")
}

/// Whether the far end has closed `conn` (without waiting), after what
/// it sent (a refusal).
fn closed(conn: &mut TcpStream) -> bool {
    let mut buf = [0u8; 4096];
    loop {
        match conn.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return false,
            Err(_) => return true,
        }
    }
}

/// Connections to `addr` that are no source: idle ones that never send a
/// byte, garbage, a plain HTTP request, and a frame header that never
/// gets its payload. All are kept open by this side.
fn flood(addr: &str, n: usize) -> Vec<TcpStream> {
    let mut held = Vec::with_capacity(n);
    for i in 0..n {
        let mut conn = TcpStream::connect(addr).unwrap();
        // The far end may already have closed a connection: a failed
        // write is fine.
        let _ = match i % 4 {
            0 | 1 => Ok(()),
            2 => conn.write_all(&[0x5a; 300]),
            _ if i % 8 == 3 => conn.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
            _ => conn.write_all(b"ARPL\x01\x00\x01\x00\x00\x10\x00\x00"),
        };
        conn.set_nonblocking(true).unwrap();
        held.push(conn);
    }
    held
}

fn pair_status(source: &Daemon) -> Value {
    source.json(&["replica", "status"])["pairs"][0].clone()
}

/// Fills the source's disk0 (`mib` MiB) with random data from `seed`,
/// adds a pair to `addr` limited to `rate`, and waits until its first
/// cycle has streamed more than `streamed` bytes. Returns the data.
fn slow_cycle(
    source: &Daemon,
    mib: u64,
    seed: u8,
    addr: &str,
    rate: &str,
    streamed: u64,
) -> std::path::PathBuf {
    let data = random_file(source.dir.path(), "data", mib << 20, seed);
    nbdcopy(
        p(&data),
        &format!("nbd+unix:///disk0?socket={}", source.nbd_socket()),
    );
    source.ok(&[
        "replica",
        "add",
        "disk0",
        "--target",
        addr,
        "--interval",
        "1h",
        "--rate-limit",
        rate,
    ]);
    wait_for("the first cycle to stream", 60, || {
        let pair = pair_status(source);
        (pair["cycle"]["stream_sent"].as_u64()? > streamed).then_some(())
    });
    data
}

/// Issue 39, item 5: a thousand idle and garbage connections to a target's
/// replication port do not lock a real source out. A cycle streaming when
/// they come completes, a cycle started while they are held gets through,
/// the target holds a bounded number of them and stays small, and its log
/// says so in a few lines, not a line per connection.
#[test]
fn idle_and_garbage_connections_do_not_lock_sources_out() {
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let target_config = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        target_config.path(),
        format!(
            "replication_listen = \"{addr}\"\n\
             replication_identity = \"target\"\n\
             replication_allow = [{{ source = \"loopback\", volumes = [\"*\"] }}]\n"
        ),
    )
    .unwrap();
    let target = Daemon::start_logging(&[
        "--config",
        p(target_config.path()),
        "--initial-volume",
        "none",
    ]);
    let source_config = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(source_config.path(), "replication_identity = \"source\"\n").unwrap();
    let source = Daemon::start(&[
        "--config",
        p(source_config.path()),
        "--initial-volume-size",
        "24M",
    ]);
    let memory_before = rss_kib(target.pid());
    // A slow cycle (about 4 s of stream): the connections come while it
    // streams.
    slow_cycle(&source, 24, 39, &addr, "6M", 0);
    let mut held = flood(&addr, 1000);
    let pair = wait_for("the first cycle to end", 120, || {
        let pair = pair_status(&source);
        (pair["state"] != "running").then_some(pair)
    });
    assert_eq!(pair["cycles_ok"], 1, "the streaming cycle failed: {pair}");

    // With every connection this side opened still open, a new cycle gets
    // through at once (nothing changed: a hello, a plan, an end).
    source.ok(&["replica", "run", "disk0"]);
    let pair = pair_status(&source);
    assert_eq!(pair["cycles_ok"], 2, "{pair}");
    assert_eq!(pair["failures"], 0, "{pair}");

    // The target holds a bounded number of the connections (its handshake
    // slots; the rest were closed), and its memory stayed small.
    let sockets = sockets_of(target.pid());
    assert!(sockets < 100, "the target holds {sockets} sockets");
    // (Those the daemon has not accepted yet wait in the listen backlog.)
    wait_for("the target to close all but its handshakes", 60, || {
        let open = held.iter_mut().map(closed).filter(|c| !c).count();
        (open <= 64).then_some(())
    });
    let memory_after = rss_kib(target.pid());
    assert!(
        memory_after < memory_before + 64 * 1024,
        "the target grew from {memory_before} KiB to {memory_after} KiB"
    );
    drop(held);

    // A few lines of log about them, not one per connection: a count (the
    // last at shutdown).
    let mut target = target;
    target.stop_cleanly();
    let log = target.log();
    assert!(log.contains("dropped for newer ones"), "{log}");
    let lines = log.lines().filter(|l| l.contains("replication")).count();
    assert!(
        lines <= 10,
        "{lines} log lines about replication:\n{}",
        log.lines().take(20).collect::<Vec<_>>().join("\n")
    );
}

/// A target on loopback whose `replication_allow` names the source
/// `loopback` for the volumes a test gives, rewritten by
/// [`Hosts::allow`] (for a reload), and a source.
struct Hosts {
    addr: String,
    target_config: tempfile::NamedTempFile,
    _source_config: tempfile::NamedTempFile,
}

impl Hosts {
    /// The target accepting `volume`, and a source whose initial volume
    /// disk0 has `size`.
    fn start(volume: &str, size: &str) -> (Hosts, Daemon, Daemon) {
        let hosts = Hosts {
            addr: format!("127.0.0.1:{}", free_port()),
            target_config: tempfile::NamedTempFile::new().unwrap(),
            _source_config: tempfile::NamedTempFile::new().unwrap(),
        };
        hosts.allow(&format!("\"{volume}\""));
        let target = Daemon::start(&[
            "--config",
            p(hosts.target_config.path()),
            "--initial-volume",
            "none",
        ]);
        let source_config = hosts._source_config.path();
        std::fs::write(source_config, "replication_identity = \"source\"\n").unwrap();
        let source = Daemon::start(&["--config", p(source_config), "--initial-volume-size", size]);
        (hosts, target, source)
    }

    /// The target's configuration names `volumes` (quoted, comma
    /// separated) for the source.
    fn allow(&self, volumes: &str) {
        std::fs::write(
            self.target_config.path(),
            format!(
                "replication_listen = \"{}\"\n\
                 replication_identity = \"target\"\n\
                 replication_allow = [{{ source = \"loopback\", volumes = [{volumes}] }}]\n",
                self.addr
            ),
        )
        .unwrap();
    }
}

/// `replication_allow` changes with `arbor config reload`: a source the
/// target does not accept for a volume is refused, accepted once a
/// reload allows it, and refused again once a reload takes it away; the
/// replica it received stays.
#[test]
fn a_reload_changes_which_sources_a_target_accepts() {
    let (hosts, target, source) = Hosts::start("elsewhere", "4M");
    let (addr, allow) = (&hosts.addr, |volumes: &str| hosts.allow(volumes));
    source.ok(&[
        "replica",
        "add",
        "disk0",
        "--target",
        addr,
        "--interval",
        "1h",
    ]);
    let run = |source: &Daemon| arbor(&source.args(&["replica", "run", "disk0"]));
    let refused = run(&source);
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains("not_allowed") || stderr(&refused).contains("not allowed"),
        "{}",
        stderr(&refused)
    );
    assert!(!target.ok(&["volume", "list"]).contains("disk0"));

    allow("\"disk0\"");
    let view = target.json(&["config", "reload"]);
    assert_eq!(
        view["changed"],
        serde_json::json!(["replication_allow"]),
        "{view}"
    );
    let accepted = run(&source);
    assert!(accepted.status.success(), "{}", stderr(&accepted));
    assert!(target.ok(&["volume", "list"]).contains("disk0"));

    allow("\"elsewhere\"");
    target.json(&["config", "reload"]);
    let refused = run(&source);
    assert!(!refused.status.success());
    assert!(
        target.ok(&["volume", "list"]).contains("disk0"),
        "the replica stays"
    );
}

/// A reload that takes a source's volume off `replication_allow` ends the
/// session streaming it at once (not at the end of its cycle): the answer
/// names it, the source is told `not_allowed` and why, and the target
/// keeps what it received, so that once allowed again the source resumes
/// where it stopped.
#[test]
fn a_reload_ends_a_replication_session_it_no_longer_allows() {
    let (hosts, target, source) = Hosts::start("disk0", "32M");
    let (addr, allow) = (&hosts.addr, |volumes: &str| hosts.allow(volumes));
    // A slow cycle (16 s of incompressible stream at 2 MiB/s): the reload
    // comes while it streams.
    let data = slow_cycle(&source, 32, 41, addr, "2M", 2 << 20);

    allow("\"elsewhere\"");
    let view = target.json(&["config", "reload"]);
    assert_eq!(
        view["withdrawn_replications"],
        serde_json::json!([{
            "identity": "loopback",
            "volume": "disk0",
            "reason": "its replication allow list no longer names that source for that volume"
        }]),
        "{view}"
    );
    let pair = wait_for("the cycle to end", 60, || {
        let pair = pair_status(&source);
        (pair["state"] != "running").then_some(pair)
    });
    assert_eq!(pair["cycles_ok"], 0, "the cycle ran to its end: {pair}");
    let error = pair["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("target no longer accepts disk0 from loopback"),
        "{pair}"
    );
    assert_eq!(pair["error_kind"], "not_allowed", "{pair}");
    let stream_sent = pair["cycle"]["stream_sent"].as_u64().unwrap_or(0);
    assert!(stream_sent < (32 << 20), "{pair}");

    // Allowed again, the next cycle resumes from what the target kept.
    allow("\"disk0\"");
    target.json(&["config", "reload"]);
    let run = source.json(&["replica", "run", "disk0"]);
    let resumed = run[0]["resumed_from"][0].as_u64().unwrap_or(0);
    assert!(resumed > 0, "the cycle began again from the start: {run}");
    let copy = target.path("copy");
    nbdcopy(
        &format!("nbd+unix:///disk0?socket={}", target.nbd_socket()),
        p(&copy),
    );
    assert!(
        std::fs::read(&copy).unwrap() == std::fs::read(&data).unwrap(),
        "the replica differs from the source"
    );
}
