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
    let data = random_file(source.dir.path(), "data", 24 << 20, 39);
    nbdcopy(
        p(&data),
        &format!("nbd+unix:///disk0?socket={}", source.nbd_socket()),
    );
    let memory_before = rss_kib(target.pid());

    // A slow cycle (about 4 s of stream): the connections come while it
    // streams.
    source.ok(&[
        "replica",
        "add",
        "disk0",
        "--target",
        &addr,
        "--interval",
        "1h",
        "--rate-limit",
        "6M",
    ]);
    wait_for("the first cycle to stream", 60, || {
        let pair = pair_status(&source);
        (pair["cycle"]["stream_sent"].as_u64()? > 0).then_some(())
    });
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

/// `replication_allow` changes with `arbor config reload`: a source the
/// target does not accept for a volume is refused, accepted once a
/// reload allows it, and refused again once a reload takes it away; the
/// replica it received stays.
#[test]
fn a_reload_changes_which_sources_a_target_accepts() {
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let target_config = tempfile::NamedTempFile::new().unwrap();
    let allow = |volumes: &str| {
        std::fs::write(
            target_config.path(),
            format!(
                "replication_listen = \"{addr}\"\n\
                 replication_identity = \"target\"\n\
                 replication_allow = [{{ source = \"loopback\", volumes = [{volumes}] }}]\n"
            ),
        )
        .unwrap();
    };
    allow("\"elsewhere\"");
    let target = Daemon::start(&[
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
        "4M",
    ]);
    source.ok(&[
        "replica",
        "add",
        "disk0",
        "--target",
        &addr,
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
