//! Origins through a real daemon (`arbor origin`): a raw image file
//! snapshotted in place, written through NBD, its snapshots and clones
//! reading their point in time, attached again at each start from the
//! recorded path, left unattached (with a clear error) when the file was
//! replaced, detached as a plain raw file; and the refusals of attach and
//! detach; with direct I/O, a sparse origin kept sparse while the pool's
//! own file is allocated ahead.
// A test crate: unwrap, expect and panic are how a test reports failure
// (the workspace denies them in the code it ships; clippy.toml allows
// them in #[test] functions, this in the helpers around them).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

const MIB: usize = 1 << 20;
/// The image: 16 MiB, bigger than the 4 MiB the test writes, so reads
/// past what was copied need the device.
const IMAGE: usize = 16 * MIB;

fn uri(daemon: &Daemon, export: &str) -> String {
    format!("nbd+unix:///{export}?socket={}", daemon.nbd_socket())
}

/// `qemu-io -f raw -c COMMAND` on an export (`-r` for a snapshot).
fn qemu_io(daemon: &Daemon, export: &str, command: &str) -> std::process::Output {
    let uri = uri(daemon, export);
    let mut args = vec!["-f", "raw"];
    if export.contains('@') {
        args.push("-r");
    }
    args.extend(["-c", command, &uri]);
    tool("qemu-io", &args)
}

fn qemu_io_ok(daemon: &Daemon, export: &str, command: &str) {
    let out = qemu_io(daemon, export, command);
    // qemu-io reports a failed command on stdout and still exits 0.
    assert!(
        out.status.success() && !stdout(&out).contains("failed"),
        "qemu-io {export} {command:?}: {}{}",
        stdout(&out),
        stderr(&out)
    );
}

/// A whole export, copied out with nbdcopy.
fn export_bytes(daemon: &Daemon, export: &str, scratch: &Path) -> Vec<u8> {
    let out = scratch.join(format!("{}.raw", export.replace('@', "_at_")));
    let _ = std::fs::remove_file(&out);
    nbdcopy(&uri(daemon, export), p(&out));
    std::fs::read(&out).unwrap()
}

fn assert_same(got: &[u8], want: &[u8], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(at) = got.iter().zip(want).position(|(a, b)| a != b) {
        panic!("{what}: first difference at byte {at}");
    }
}

fn origin_list(daemon: &Daemon) -> Vec<Value> {
    daemon.json(&["origin", "list"]).as_array().unwrap().clone()
}

fn volume<'a>(list: &'a Value, name: &str) -> &'a Value {
    list.as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == name)
        .unwrap_or_else(|| panic!("{name} not in {list}"))
}

/// `arbor origin attach NAME PATH` run from `dir`, so a relative PATH
/// must be made absolute by the CLI.
fn attach_from(daemon: &Daemon, dir: &Path, name: &str, path: &str) -> std::process::Output {
    command()
        .current_dir(dir)
        .args(daemon.args(&["origin", "attach", name, path]))
        .output()
        .unwrap()
}

/// Whether some descriptor of process `pid` open on `path` has `O_DIRECT`
/// set (`None`: no descriptor is open on it).
fn opened_direct(pid: u32, path: &Path) -> Option<bool> {
    const O_DIRECT: u32 = 0o40000;
    let mut found = None;
    for entry in std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
    {
        if std::fs::read_link(entry.path()).ok().as_deref() != Some(path) {
            continue;
        }
        let fd = entry.file_name().into_string().unwrap();
        let info = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}")).unwrap();
        let flags = info
            .lines()
            .find_map(|l| l.strip_prefix("flags:"))
            .map(|f| u32::from_str_radix(f.trim(), 8).unwrap())
            .unwrap();
        found = Some(found.unwrap_or(false) || flags & O_DIRECT != 0);
    }
    found
}

#[test]
fn a_file_is_snapshotted_in_place_and_attached_again_at_each_start() {
    snapshotted_in_place_and_attached_again("buffered");
}

/// The same with `--io direct`: the pool and the origin's file are both
/// opened with `O_DIRECT` (x86-64's value of the flag, checked in
/// /proc/PID/fdinfo).
#[cfg(target_arch = "x86_64")]
#[test]
fn a_file_is_snapshotted_in_place_with_direct_io() {
    snapshotted_in_place_and_attached_again("direct");
}

fn snapshotted_in_place_and_attached_again(io: &str) {
    let serve = ["--initial-volume", "none", "--io", io];
    let mut daemon = Daemon::start(&serve);
    let work = tempfile::tempdir().unwrap();
    let image = random_file(work.path(), "disk.img", IMAGE as u64, 7);
    let original = std::fs::read(&image).unwrap();

    let out = attach_from(&daemon, work.path(), "disk", "disk.img");
    assert!(out.status.success(), "attach: {}", stderr(&out));
    if cfg!(target_arch = "x86_64") {
        let direct = io == "direct";
        let pool = daemon.path("pool");
        assert_eq!(opened_direct(daemon.pid(), &pool), Some(direct), "the pool");
        assert!(
            opened_direct(daemon.pid(), &image).is_some(),
            "the origin is open"
        );
        assert_eq!(
            opened_direct(daemon.pid(), &image),
            Some(direct),
            "the origin"
        );
    }
    let origins = origin_list(&daemon);
    assert_eq!(origins.len(), 1);
    assert_eq!(origins[0]["name"], "disk");
    assert_eq!(origins[0]["path"], p(&image), "made absolute by the CLI");
    assert_eq!(origins[0]["attached"], true);
    assert_eq!(origins[0]["size"], IMAGE as u64);
    let list = daemon.json(&["volume", "list"]);
    assert_eq!(volume(&list, "disk")["layout"]["kind"], "cow");

    // Writes go to the file itself.
    qemu_io_ok(&daemon, "disk", "write -P 0x5a 1M 2M");
    let mut at_s1 = original.clone();
    at_s1[MIB..3 * MIB].fill(0x5a);
    assert_same(
        &std::fs::read(&image).unwrap(),
        &at_s1,
        "file after a write",
    );

    daemon.ok(&["snapshot", "create", "disk@s1"]);
    qemu_io_ok(&daemon, "disk", "write -P 0xa5 0 4M");
    let mut current = at_s1.clone();
    current[..4 * MIB].fill(0xa5);
    assert_same(
        &std::fs::read(&image).unwrap(),
        &current,
        "file after the snapshot",
    );
    assert_same(
        &export_bytes(&daemon, "disk@s1", work.path()),
        &at_s1,
        "the snapshot",
    );
    // What the write replaced was copied once into the pool.
    let stats = daemon.json(&["volume", "stats", "disk"]);
    assert_eq!(stats["store_bytes"], 4 * MIB as u64);
    let metrics = http(&daemon.api_socket(), "GET", "/metrics", "").1;
    for line in [
        format!("arbor_cow_store_bytes{{volume=\"disk\"}} {}", 4 * MIB),
        "arbor_origin_attached{volume=\"disk\"} 1".to_owned(),
        "arbor_origin_rollback_pending{volume=\"disk\"} 0".to_owned(),
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line} in\n{metrics}");
    }

    // What changed since the snapshot: the 4 MiB written after it, from
    // `arbor diff` and from the NBD changed-blocks context alike.
    assert_eq!(
        daemon.json(&["diff", "disk@s1", "disk"]),
        serde_json::json!([{"offset": 0, "len": 4 * MIB}])
    );
    let map = tool_ok(
        "nbdinfo",
        &["--map=x-arbor:changed:disk@s1", &uri(&daemon, "disk")],
    );
    let mut changed: Vec<(u64, u64)> = Vec::new();
    for line in map.lines() {
        let mut f = line.split_whitespace().map(|w| w.parse::<u64>().unwrap());
        let (offset, len, flags) = (f.next().unwrap(), f.next().unwrap(), f.next().unwrap());
        match changed.last_mut() {
            Some(last) if flags & 1 == 1 && last.0 + last.1 == offset => last.1 += len,
            _ if flags & 1 == 1 => changed.push((offset, len)),
            _ => {}
        }
    }
    assert_eq!(changed, [(0, 4 * MIB as u64)], "{map}");

    // A clone of the snapshot is writable, apart from the file.
    daemon.ok(&["clone", "disk@s1", "c1"]);
    qemu_io_ok(&daemon, "c1", "write -P 0x33 8M 1M");
    let mut clone = at_s1.clone();
    clone[8 * MIB..9 * MIB].fill(0x33);
    // A trim is advisory: on a volume that reads through an origin it
    // changes nothing (zeros written instead would fill the pool).
    qemu_io_ok(&daemon, "c1", "discard 0 16M");
    assert_same(
        &export_bytes(&daemon, "c1", work.path()),
        &clone,
        "the clone",
    );
    assert_same(
        &std::fs::read(&image).unwrap(),
        &current,
        "file after the clone's write",
    );
    let list = daemon.json(&["volume", "list"]);
    let layout = &volume(&list, "c1")["layout"];
    assert_eq!(layout["kind"], "reads_through");
    assert_eq!(layout["origin"], "disk");
    let table = daemon.ok(&["volume", "list"]);
    assert!(table.contains("LAYOUT"), "{table}");
    assert!(table.contains("row (reads disk)"), "{table}");

    // A restart opens the file again from the recorded path.
    daemon.stop_cleanly();
    daemon.restart(&serve);
    assert_eq!(origin_list(&daemon)[0]["attached"], true);
    assert_same(
        &export_bytes(&daemon, "disk", work.path()),
        &current,
        "after a restart",
    );
    assert_same(
        &export_bytes(&daemon, "disk@s1", work.path()),
        &at_s1,
        "its snapshot",
    );

    // Another file under the same path (the original moved away): not
    // attached, and its I/O fails, while the pool serves the rest.
    daemon.stop_cleanly();
    let moved = work.path().join("disk.img.moved");
    std::fs::rename(&image, &moved).unwrap();
    random_file(work.path(), "disk.img", IMAGE as u64, 8);
    daemon.restart(&serve);
    let origins = origin_list(&daemon);
    assert_eq!(origins[0]["attached"], false);
    assert_eq!(origins[0]["path"], p(&image), "the path stays recorded");
    let metrics = http(&daemon.api_socket(), "GET", "/metrics", "").1;
    assert!(
        metrics
            .lines()
            .any(|l| l == "arbor_origin_attached{volume=\"disk\"} 0"),
        "{metrics}"
    );
    let table = daemon.ok(&["origin", "list"]);
    assert!(table.contains("NO"), "{table}");
    // What checksums cover, in a version 10 pool: the copies, not the file.
    assert!(
        table.contains("CHECKSUMS") && table.contains("copies"),
        "{table}"
    );
    assert_eq!(origins[0]["checksums"], "copies");
    assert!(daemon
        .ok(&["volume", "list"])
        .contains("cow (not attached)"));
    let read = qemu_io(&daemon, "disk", "read 0 512");
    assert!(
        stdout(&read).contains("Input/output error"),
        "{}{}",
        stdout(&read),
        stderr(&read)
    );
    // The snapshot's copies are in the pool; the rest of it is on the file.
    qemu_io_ok(&daemon, "disk@s1", "read -P 0x5a 1M 2M");
    let read = qemu_io(&daemon, "disk@s1", "read 8M 512");
    assert!(stdout(&read).contains("Input/output error"));
    daemon.ok(&["volume", "create", "other", "--size", "1M"]);
    qemu_io_ok(&daemon, "other", "write -P 1 0 1M");
    daemon.fails(
        &["origin", "attach", "disk", p(&image)],
        5,
        "cannot be disk's device",
    );
    daemon.fails(&["rollback", "disk@s1"], 1, "cannot be rolled back now");
    let (_, _, log) = daemon.stop("TERM");
    assert!(log.contains("cannot attach origin disk"), "{log}");
    assert!(log.contains("its device is not attached"), "{log}");

    // The right file back: attached again at the next start.
    std::fs::rename(&moved, &image).unwrap();
    daemon.restart(&serve);
    assert_eq!(origin_list(&daemon)[0]["attached"], true);
    qemu_io_ok(&daemon, "disk", "read -P 0xa5 0 4M");
    // A rollback writes the snapshot's content back to the file.
    daemon.ok(&["rollback", "disk@s1"]);
    let mut current = at_s1.clone();
    assert_same(
        &std::fs::read(&image).unwrap(),
        &current,
        "the file rolled back",
    );

    // Detach waits for the snapshots and clones to go; the file then
    // holds the volume's content.
    daemon.fails(&["origin", "detach", "disk"], 5, "destroy them first");
    daemon.fails(&["destroy", "disk"], 5, "c1, disk@s1");
    daemon.ok(&["destroy", "c1"]);
    daemon.ok(&["destroy", "disk@s1"]);
    qemu_io_ok(&daemon, "disk", "write -P 0x77 15M 1M");
    current[15 * MIB..].fill(0x77);
    // An origin grows, and its file with it; it never shrinks.
    daemon.ok(&["snapshot", "create", "disk@small"]);
    daemon.ok(&["volume", "resize", "disk", "24M"]);
    assert_eq!(std::fs::metadata(&image).unwrap().len(), 24 * MIB as u64);
    let list = daemon.json(&["volume", "list"]);
    assert_eq!(volume(&list, "disk")["size"], 24 * MIB as u64);
    assert_eq!(volume(&list, "disk@small")["size"], IMAGE as u64);
    daemon.fails(&["volume", "resize", "disk", "8M"], 5, "cannot shrink");
    qemu_io_ok(&daemon, "disk", "write -P 0x78 20M 1M");
    current.resize(24 * MIB, 0);
    current[20 * MIB..21 * MIB].fill(0x78);
    qemu_io_ok(&daemon, "disk@small", "read -P 0x77 15M 1M");
    daemon.ok(&["destroy", "disk@small"]);
    daemon.ok(&["origin", "detach", "disk"]);
    assert!(origin_list(&daemon).is_empty());
    daemon.fails(&["volume", "stats", "disk"], 4, "no such volume");
    assert_same(
        &std::fs::read(&image).unwrap(),
        &current,
        "the detached file",
    );
    daemon.ok(&["pool", "reclaim"]);
    let pool = daemon.json(&["check"]);
    assert_eq!(pool["clean"], true, "{pool}");
    // The file is free again: another daemon could take it, and this one
    // can attach it anew.
    daemon.ok(&["origin", "attach", "again", p(&image)]);
    daemon.ok(&["destroy", "again"]);
    daemon.stop_cleanly();
    assert_same(
        &std::fs::read(&image).unwrap(),
        &current,
        "after the daemon",
    );
}

/// `origin detach --copy-to-pool`: the origin's data is copied into the
/// pool, its file detached (flushed, closed, free for anything else) and
/// left with the volume's content; the volume stays a pool volume (layout
/// cow) with its snapshot and clone, served on to an open connection,
/// written in the pool and never again in the file, across a restart.
#[test]
fn an_origin_copied_to_the_pool_keeps_its_snapshots_and_frees_its_file() {
    let serve = ["--initial-volume", "none"];
    let mut daemon = Daemon::start(&serve);
    let work = tempfile::tempdir().unwrap();
    let image = random_file(work.path(), "disk.img", IMAGE as u64, 9);
    let mut at_s1 = std::fs::read(&image).unwrap();
    daemon.ok(&["origin", "attach", "disk", p(&image)]);
    qemu_io_ok(&daemon, "disk", "write -P 0x5a 1M 2M");
    at_s1[MIB..3 * MIB].fill(0x5a);
    daemon.ok(&["snapshot", "create", "disk@s1"]);
    qemu_io_ok(&daemon, "disk", "write -P 0xa5 0 4M");
    let mut current = at_s1.clone();
    current[..4 * MIB].fill(0xa5);
    daemon.ok(&["clone", "disk@s1", "c1"]);
    qemu_io_ok(&daemon, "c1", "write -P 0x33 8M 1M");
    let mut clone = at_s1.clone();
    clone[8 * MIB..9 * MIB].fill(0x33);

    // Plain detach names the way to keep them; --force cannot go with it.
    daemon.fails(&["origin", "detach", "disk"], 5, "--copy-to-pool");
    daemon.fails(
        &["origin", "detach", "disk", "--copy-to-pool", "--force"],
        2,
        "cannot be used with",
    );
    let open = hold_open(&daemon, "disk");
    daemon.ok(&["origin", "detach", "disk", "--copy-to-pool"]);
    assert!(origin_list(&daemon).is_empty());
    let list = daemon.json(&["volume", "list"]);
    assert_eq!(volume(&list, "disk")["layout"]["kind"], "cow", "{list}");
    assert_eq!(volume(&list, "disk")["layout"]["home"], "pool", "{list}");
    assert_eq!(volume(&list, "disk")["nbd_connections"], 1, "{list}");
    drop(open);
    assert_same(
        &std::fs::read(&image).unwrap(),
        &current,
        "the detached file",
    );

    // Written in the pool only; the snapshot and clone read as before.
    qemu_io_ok(&daemon, "disk", "write -P 0x44 12M 1M");
    current[12 * MIB..13 * MIB].fill(0x44);
    let file = std::fs::read(&image).unwrap();
    assert_eq!(file[12 * MIB], at_s1[12 * MIB], "the file was written");
    let check = |daemon: &Daemon| {
        assert_same(&export_bytes(daemon, "disk", work.path()), &current, "disk");
        assert_same(
            &export_bytes(daemon, "disk@s1", work.path()),
            &at_s1,
            "disk@s1",
        );
        assert_same(&export_bytes(daemon, "c1", work.path()), &clone, "c1");
    };
    check(&daemon);
    // The file is free: it can be attached anew.
    daemon.ok(&["origin", "attach", "again", p(&image)]);
    daemon.ok(&["origin", "detach", "again"]);
    assert_same(&std::fs::read(&image).unwrap(), &file, "the file after");

    // A restart does not look for the file (moved away), and serves it all.
    daemon.stop_cleanly();
    std::fs::rename(&image, work.path().join("elsewhere.img")).unwrap();
    daemon.restart(&serve);
    check(&daemon);
    let pool = daemon.json(&["check"]);
    assert_eq!(pool["clean"], true, "{pool}");
    let (_, _, log) = daemon.stop("TERM");
    assert!(!log.contains("cannot attach origin"), "{log}");
    assert!(!log.contains("no recorded path"), "{log}");
}

/// `--copy-to-pool` with no free run of the origin's size in the pool:
/// exit status 7 from the CLI and 507 from the API, with what to do, and
/// nothing changes (the origin stays attached, written through).
#[test]
fn an_origin_copied_to_a_pool_without_room_stays_attached() {
    let daemon = Daemon::start(&["--initial-volume", "none", "--pool-size", "48M"]);
    let work = tempfile::tempdir().unwrap();
    let image = random_file(work.path(), "disk.img", 16 * MIB as u64, 3);
    let content = std::fs::read(&image).unwrap();
    daemon.ok(&["origin", "attach", "disk", p(&image)]);
    daemon.ok(&["snapshot", "create", "disk@s"]);
    // All but 8 MiB of the data space written: no room for 16 MiB.
    let status = daemon.json(&["pool", "status"]);
    let free = status["data_bytes"].as_u64().unwrap() - status["data_used_bytes"].as_u64().unwrap();
    let fill = (free / MIB as u64)
        .checked_sub(8)
        .expect("a pool of more than 8 MiB free");
    daemon.ok(&["volume", "create", "filler", "--size", &format!("{fill}M")]);
    qemu_io_ok(&daemon, "filler", &format!("write -P 1 0 {fill}M"));
    daemon.fails(
        &["origin", "detach", "disk", "--copy-to-pool"],
        7,
        "no free run",
    );
    let (status, body) = http(
        &daemon.api_socket(),
        "DELETE",
        "/v1/origins/disk?copy_to_pool=true",
        "",
    );
    assert_eq!(status, 507, "{body}");
    assert!(body.contains("no_space"), "{body}");
    let origins = origin_list(&daemon);
    assert_eq!(origins.len(), 1);
    assert_eq!(origins[0]["attached"], true);
    qemu_io_ok(&daemon, "disk", "write -P 0x42 0 64k");
    let mut now = content.clone();
    now[..64 * 1024].fill(0x42);
    assert_same(
        &std::fs::read(&image).unwrap(),
        &now,
        "the file, written through",
    );
    assert_same(
        &export_bytes(&daemon, "disk@s", work.path()),
        &content,
        "the snapshot",
    );
}

/// A process with an NBD connection to an export open until dropped
/// (killed and reaped then, also when the test fails).
struct OpenConnection(Child);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn hold_open(daemon: &Daemon, export: &str) -> OpenConnection {
    let script = format!(
        "import nbd, sys\nh = nbd.NBD()\nh.connect_uri({:?})\nsys.stdin.read()\n",
        uri(daemon, export)
    );
    let child = Command::new("/usr/bin/python3")
        .args(["-c", &script])
        .stdin(Stdio::piped())
        .spawn()
        .expect("python3-libnbd (scripts/install-deps.sh installs it)");
    let connection = OpenConnection(child);
    // Waits for the daemon to count it (a bound on a hang, not a timing).
    let deadline = Instant::now() + HANG_GUARD;
    loop {
        let list = daemon.json(&["volume", "list"]);
        if volume(&list, export)["nbd_connections"] == 1 {
            return connection;
        }
        assert!(Instant::now() < deadline, "the NBD connection never opened");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn attach_and_detach_refuse_what_they_cannot_do() {
    let daemon = Daemon::start(&["--initial-volume", "none"]);
    let work = tempfile::tempdir().unwrap();
    let image = random_file(work.path(), "disk.img", MIB as u64, 1);
    let content = std::fs::read(&image).unwrap();
    let pool = daemon.path("pool");

    daemon.fails(
        &["origin", "attach", "p", p(&pool)],
        2,
        "is this daemon's pool",
    );
    daemon.fails(
        &["origin", "attach", "d", p(work.path())],
        2,
        "is a directory",
    );
    daemon.fails(
        &["origin", "attach", "m", p(&work.path().join("missing.img"))],
        4,
        "no such file or device",
    );
    daemon.fails(
        &["origin", "attach", "c", "/dev/null"],
        2,
        "is a character device",
    );
    let odd = random_file(work.path(), "odd.img", 1000, 2);
    daemon.fails(&["origin", "attach", "o", p(&odd)], 2, "multiple of 512");
    let empty = random_file(work.path(), "empty.img", 0, 3);
    daemon.fails(&["origin", "attach", "e", p(&empty)], 2, "multiple of 512");
    daemon.fails(
        &["origin", "attach", "bad@name", p(&image)],
        2,
        "invalid name",
    );

    // The API wants an absolute path: the daemon's directory is not ours.
    let (status, body) = http(
        &daemon.api_socket(),
        "POST",
        "/v1/origins",
        r#"{"name":"r","path":"disk.img"}"#,
    );
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("not an absolute path"), "{body}");

    // Another process holding the file's lock (as another daemon would).
    let locked = std::fs::File::open(&image).unwrap();
    locked.lock().unwrap();
    daemon.fails(
        &["origin", "attach", "disk", p(&image)],
        6,
        "in use by another process",
    );
    drop(locked);

    daemon.ok(&["origin", "attach", "disk", p(&image)]);
    daemon.fails(
        &["origin", "attach", "disk", p(&image)],
        5,
        "attached already",
    );
    daemon.fails(
        &["origin", "attach", "twin", p(&image)],
        5,
        "is the device of origin disk",
    );
    daemon.ok(&["volume", "create", "plain", "--size", "1M"]);
    let other = random_file(work.path(), "other.img", MIB as u64, 4);
    daemon.fails(
        &["origin", "attach", "plain", p(&other)],
        5,
        "already exists",
    );
    daemon.fails(&["origin", "detach", "plain"], 2, "is not an origin");
    daemon.fails(&["origin", "detach", "ghost"], 4, "no such volume");
    daemon.fails(&["volume", "resize", "disk", "512K"], 5, "cannot shrink");

    // NBD clients keep it, as any volume, unless forced.
    let client = hold_open(&daemon, "disk");
    daemon.fails(&["origin", "detach", "disk"], 6, "NBD connection");
    daemon.fails(&["destroy", "disk"], 6, "NBD connection");
    daemon.ok(&["origin", "detach", "disk", "--force"]);
    drop(client);
    assert!(origin_list(&daemon).is_empty());
    assert_same(
        &std::fs::read(&image).unwrap(),
        &content,
        "the file, never written",
    );
}

/// `volume create --layout cow`: the data in one preallocated run of the
/// pool, written in place, its snapshots taking copies; shown as `cow` with
/// its home in the pool.
#[test]
fn a_volume_created_copy_on_write_keeps_its_snapshots() {
    let daemon = Daemon::start(&[]);
    daemon.ok(&["volume", "create", "db", "--size", "8M", "--layout", "cow"]);
    let list = daemon.json(&["volume", "list"]);
    let db = volume(&list, "db");
    assert_eq!(db["layout"]["kind"], "cow", "{db}");
    assert_eq!(db["layout"]["home"], "pool", "{db}");
    assert!(daemon.ok(&["volume", "list"]).contains("cow"));
    qemu_io_ok(&daemon, "db", "write -P 0x61 0 4M");
    daemon.ok(&["snapshot", "create", "db@a"]);
    qemu_io_ok(&daemon, "db", "write -P 0x62 1M 64k");
    qemu_io_ok(&daemon, "db@a", "read -P 0x61 0 4M");
    qemu_io_ok(&daemon, "db", "read -P 0x62 1M 64k");
    daemon.fails(&["destroy", "db"], 5, "destroy them first");
    // The copies took the chunks after its home: it moves to grow, with
    // its data and its snapshot's, the new part zeros.
    daemon.ok(&["volume", "resize", "db", "16M"]);
    let list = daemon.json(&["volume", "list"]);
    assert_eq!(volume(&list, "db")["size"], 16 << 20, "{list}");
    qemu_io_ok(&daemon, "db", "read -P 0x61 0 1M");
    qemu_io_ok(&daemon, "db", "read -P 0x62 1M 64k");
    qemu_io_ok(&daemon, "db", "read -P 0x61 1088k 2976k");
    qemu_io_ok(&daemon, "db", "read -P 0 4M 12M");
    qemu_io_ok(&daemon, "db@a", "read -P 0x61 0 4M");
    qemu_io_ok(&daemon, "db", "write -P 0x65 2M 64k");
    qemu_io_ok(&daemon, "db@a", "read -P 0x61 0 4M");
    daemon.ok(&["destroy", "db@a"]);
    daemon.ok(&["destroy", "db"]);
    daemon.ok(&["pool", "reclaim"]);
    // With free chunks after it, it grows, keeping its data.
    daemon.ok(&["volume", "create", "db2", "--size", "8M", "--layout", "cow"]);
    qemu_io_ok(&daemon, "db2", "write -P 0x63 0 1M");
    daemon.ok(&["volume", "resize", "db2", "24M"]);
    let list = daemon.json(&["volume", "list"]);
    assert_eq!(volume(&list, "db2")["size"], 24 << 20, "{list}");
    qemu_io_ok(&daemon, "db2", "read -P 0x63 0 1M");
    qemu_io_ok(&daemon, "db2", "read -P 0 8M 16M");
    qemu_io_ok(&daemon, "db2", "write -P 0x64 20M 64k");
    qemu_io_ok(&daemon, "db2", "read -P 0x64 20M 64k");
}

/// Bytes of the file system's space a file takes (`st_blocks`).
fn allocated(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).unwrap().blocks() * 512
}

/// With direct I/O the daemon allocates its pool file's space ahead of
/// the writes, a 16 MiB granule at a time (`FileDevice::allocate_ahead`;
/// docs/PERFORMANCE.md § 19), but never an origin's: a sparse image
/// written through its volume takes only what is written.
#[test]
fn a_sparse_origin_stays_sparse_while_the_pool_is_allocated_ahead() {
    let daemon = Daemon::start(&["--initial-volume", "none", "--io", "direct"]);
    let work = tempfile::tempdir().unwrap();
    let image = work.path().join("sparse.img");
    std::fs::File::create(&image)
        .unwrap()
        .set_len(4 * IMAGE as u64)
        .unwrap();
    let out = attach_from(&daemon, work.path(), "sparse", "sparse.img");
    assert!(out.status.success(), "attach: {}", stderr(&out));
    let before = allocated(&image);
    qemu_io_ok(&daemon, "sparse", "write -P 0x5a 32M 4k");
    let grown = allocated(&image) - before;
    assert!(
        grown <= 64 << 10,
        "the origin took {grown} bytes for a 4 KiB write"
    );
    let mut want = vec![0u8; 4 * IMAGE];
    want[32 * MIB..32 * MIB + 4096].fill(0x5a);
    assert_same(&std::fs::read(&image).unwrap(), &want, "the origin");

    // The pool's file: well under 1 MiB written so far (its metadata and
    // one chunk), a granule or more taken.
    daemon.ok(&["volume", "create", "v", "--size", "64M"]);
    qemu_io_ok(&daemon, "v", "write -P 0x11 40M 4k");
    let taken = allocated(&daemon.path("pool"));
    assert!(
        taken >= 16 * MIB as u64,
        "the pool's file takes only {taken} bytes"
    );
    let read = qemu_io(&daemon, "v", "read -P 0x11 40M 4k");
    assert!(
        stdout(&read).contains("read 4096/4096"),
        "{}",
        stdout(&read)
    );
}
