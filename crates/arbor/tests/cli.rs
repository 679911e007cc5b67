//! The `arbor` binary end to end: a real daemon on a temporary data
//! directory, driven only through the command line.
//!
//! Exit statuses (docs/CLI.md): 2 usage, 3 daemon not running, 4 not
//! found, 5 conflict, 6 busy, 7 no space, 8 damaged, 9 pool in use.
// A test crate: unwrap, expect and panic are how a test reports failure
// (the workspace denies them in the code it ships; clippy.toml allows
// them in #[test] functions, this in the helpers around them).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

use common::*;
use serde_json::Value;

fn names(list: &Value) -> Vec<String> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap().to_owned())
        .collect()
}

fn uri(daemon: &Daemon, export: &str) -> String {
    format!("nbd+unix:///{export}?socket={}", daemon.nbd_socket())
}

#[test]
fn every_command_through_the_daemon() {
    let daemon = Daemon::start(&["--initial-volume", "none"]);
    let created = daemon.json(&["volume", "create", "gold", "--size", "1.5M"]);
    assert_eq!(created["size"], 3 << 19);
    assert_eq!(created["kind"], "volume");
    assert!(daemon
        .ok(&["volume", "create", "other", "--size", "4K"])
        .contains("created other (4 KiB)"));

    let image = daemon.path("image.raw");
    std::fs::write(&image, vec![0x5au8; 1 << 20]).unwrap();
    nbdcopy(p(&image), &uri(&daemon, "gold"));

    assert_eq!(
        daemon.json(&["snapshot", "create", "gold@v1"])["kind"],
        "snapshot"
    );
    daemon.ok(&["snapshot", "create", "gold@v2"]);
    let clone = daemon.json(&["clone", "gold@v1", "ci-1"]);
    assert_eq!(clone["parent"], "gold@v1");
    daemon.ok(&["snapshot", "create", "ci-1@run"]);

    let tree = daemon.ok(&["volume", "list", "--tree"]);
    let expected_order = [
        "gold",
        "├─ gold@v1",
        "│  └─ ci-1",
        "│     └─ ci-1@run",
        "└─ gold@v2",
        "other",
    ];
    let rows: Vec<&str> = tree.lines().skip(1).collect();
    assert_eq!(rows.len(), expected_order.len(), "{tree}");
    for (row, name) in rows.iter().zip(expected_order) {
        assert!(row.starts_with(&format!("{name} ")), "{tree}");
    }
    assert!(tree.contains("1 MiB"), "mapped bytes with units: {tree}");
    assert_eq!(
        names(&daemon.json(&["volume", "list", "--tree"])),
        ["ci-1", "ci-1@run", "gold", "gold@v1", "gold@v2", "other"]
    );
    assert_eq!(
        names(&daemon.json(&["snapshot", "list", "gold"])),
        ["gold@v1", "gold@v2"]
    );
    assert_eq!(names(&daemon.json(&["snapshot", "list"])).len(), 3);

    let stats = daemon.json(&["volume", "stats", "gold"]);
    assert_eq!(stats["mapped_bytes"], 1 << 20);
    assert_eq!(stats["exclusive_bytes"], 0, "all shared with gold@v1");

    // Change gold, diff it against its snapshot, then roll back.
    let patch = daemon.path("patch.raw");
    std::fs::write(&patch, vec![1u8; 16384]).unwrap();
    nbdcopy(p(&patch), &uri(&daemon, "gold"));
    let diff = daemon.json(&["diff", "gold@v1", "gold"]);
    assert_eq!(diff, serde_json::json!([{"offset": 0, "len": 16384}]));
    assert!(daemon
        .ok(&["diff", "gold@v1", "gold@v2"])
        .contains("no differences"));
    daemon.ok(&["rollback", "gold@v1"]);
    assert_eq!(
        daemon.json(&["diff", "gold@v1", "gold"]),
        serde_json::json!([])
    );

    assert_eq!(
        daemon.json(&["volume", "resize", "ci-1", "2M"])["size"],
        2 << 20
    );
    daemon.ok(&["rename", "ci-1", "ci-2"]);
    assert_eq!(
        names(&daemon.json(&["snapshot", "list", "ci-2"])),
        ["ci-2@run"],
        "snapshots follow a renamed volume"
    );
    let destroyed = daemon.json(&["destroy", "ci-2@run"]);
    assert_eq!(destroyed["done"], "destroyed");
    daemon.ok(&["destroy", "ci-2"]);
    let reclaimed = daemon.json(&["pool", "reclaim"]);
    assert!(reclaimed["processed"].as_u64().unwrap() > 0);

    let status = daemon.json(&["pool", "status"]);
    assert_eq!(
        (status["volumes"].as_u64(), status["snapshots"].as_u64()),
        (Some(2), Some(2))
    );
    assert_eq!(status["warnings"], serde_json::json!([]));
    assert!(daemon
        .ok(&["pool", "status"])
        .contains("chunk size:  16 KiB"));
    assert_eq!(daemon.json(&["check"])["clean"], true);
    assert!(daemon.ok(&["check"]).contains("pool is clean"));

    let mut daemon = daemon;
    daemon.stop_cleanly();
    assert!(!daemon.path("api.sock").exists(), "sockets removed on exit");
    assert!(!daemon.path("nbd.sock").exists());
    assert!(ok(&["check", p(&daemon.path("pool"))]).contains("clean"));
}

#[test]
fn errors_say_what_went_wrong_with_distinct_exit_codes() {
    let daemon = Daemon::start(&[]);
    daemon.ok(&["snapshot", "create", "disk0@s"]);

    let stopped = tempfile::tempdir().unwrap();
    fails_with(
        &["--data-dir", p(stopped.path()), "volume", "list"],
        3,
        "no arbor daemon is running",
    );
    daemon.fails(&["destroy", "disk1"], 4, "did you mean \"disk0\"?");
    daemon.fails(
        &["snapshot", "create", "dsk0@t"],
        4,
        "did you mean \"disk0\"?",
    );
    daemon.fails(&["volume", "stats", "nothing-like-it"], 4, "no such volume");
    daemon.fails(
        &["volume", "create", "disk0", "--size", "1M"],
        5,
        "already exists",
    );
    daemon.fails(&["volume", "resize", "disk0@s", "2M"], 5, "read-only");
    daemon.fails(
        &["volume", "create", "v", "--size", "1000"],
        2,
        "multiple of 512",
    );
    for bad in ["10X", "1.3K", "", "-1", "99999999999E", "1.5.5G"] {
        daemon.fails(
            &["volume", "create", "v", &format!("--size={bad}")],
            2,
            "invalid",
        );
    }
    daemon.fails(
        &["volume", "create", "a/b", "--size", "1M"],
        2,
        "invalid name",
    );
    daemon.fails(&["rollback", "disk0"], 2, "volume@snapshot");
    daemon.fails(&["clone", "disk0", "c"], 2, "not a snapshot");
    daemon.fails(&["no-such-command"], 2, "unrecognized subcommand");

    // A pool held by the daemon cannot be opened by another process.
    let pool = daemon.path("pool");
    fails_with(&["check", p(&pool)], 9, "in use by another arbor process");
    fails_with(&["check", p(&daemon.path("missing"))], 4, "No such file");

    // Destroying a volume an NBD client has open is refused (6) unless forced.
    let mut client = Command::new("qemu-io")
        .args(["-f", "raw", &uri(&daemon, "disk0")])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("qemu-io is missing: apt-get install qemu-utils");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while daemon.json(&["volume", "list"])[0]["nbd_connections"] != 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "qemu-io never connected"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    daemon.fails(&["destroy", "disk0"], 6, "open by 1 NBD connection");
    daemon.ok(&["destroy", "disk0", "--force"]);
    let mut stdin = client.stdin.take().unwrap();
    writeln!(stdin, "quit").unwrap();
    drop(stdin);
    client.wait().unwrap();
}

/// New volume names leave room for every snapshot name arbor generates
/// (docs/CLI.md § Names and sizes): 126 bytes, not the 184 of a full name.
#[test]
fn volume_names_leave_room_for_the_snapshot_names_arbor_generates() {
    let daemon = Daemon::start(&["--initial-volume", "none"]);
    let why = "a volume name has at most 126";
    let old_max = "o".repeat(184);
    let too_long = "t".repeat(127);
    for name in [&old_max, &too_long] {
        daemon.fails(&["volume", "create", name, "--size", "1M"], 2, why);
    }
    let max = "m".repeat(126);
    daemon.ok(&["volume", "create", &max, "--size", "1M"]);
    // The longest policy snapshot name (a 32-byte prefix, `.999`) and a
    // replication one fit.
    let prefix = "p".repeat(32);
    let policy_snap = format!("{max}@{prefix}-9999-12-31T23:59:59Z.999");
    assert_eq!(policy_snap.len(), 184);
    daemon.ok(&["snapshot", "create", &policy_snap]);
    daemon.ok(&[
        "snapshot",
        "create",
        &format!("{max}@repl-2026-11-28T18:02:26Z.4294967295"),
    ]);
    daemon.ok(&[
        "policy",
        "set",
        &max,
        "--schedule",
        "hourly at :00",
        "--keep",
        "hourly=24",
        "--prefix",
        &prefix,
    ]);
    daemon.fails(&["rename", &max, &too_long], 2, why);
    daemon.fails(&["clone", &policy_snap, &too_long], 2, why);
    daemon.fails(
        &[
            "replica",
            "add",
            &max,
            "--target",
            &format!("127.0.0.1:9/{too_long}"),
        ],
        2,
        why,
    );
    let stream = daemon.path("stream.arbor");
    daemon.ok(&["send", &policy_snap, "-o", p(&stream)]);
    for name in [&old_max, &too_long] {
        daemon.fails(&["receive", name, "-i", p(&stream)], 2, why);
    }
}

/// `receive --status` printed the volume's size as if it were the
/// stream's ("received X of Y"); it labels the volume's size and the
/// position applied in it (docs/CLI.md).
#[test]
fn receive_status_says_what_its_sizes_are() {
    let daemon = Daemon::start(&["--initial-volume", "none"]);
    daemon.ok(&["volume", "create", "v", "--size", "4M"]);
    let data = random_file(std::path::Path::new(daemon.data_dir()), "data", 1 << 20, 7);
    nbdcopy(p(&data), &uri(&daemon, "v"));
    daemon.ok(&["snapshot", "create", "v@s"]);
    let full = daemon.path("full.arbor");
    daemon.ok(&["send", "v@s", "-o", p(&full)]);
    let bytes = std::fs::read(&full).unwrap();
    let cut = daemon.path("cut.arbor");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    daemon.ok(&["destroy", "v@s"]);
    daemon.fails(&["receive", "w", "-i", p(&cut)], 2, "");
    let status = daemon.ok(&["receive", "--status", "w"]);
    let row = |label: &str| -> String {
        status
            .lines()
            .find(|l| l.starts_with(label))
            .unwrap_or_else(|| panic!("no {label:?} row in:\n{status}"))
            .to_owned()
    };
    assert!(row("volume size").ends_with("4 MiB"), "{status}");
    assert!(row("applied up to").contains("into the volume"), "{status}");
    assert!(!status.contains(" of 4 MiB"), "{status}");
}

#[test]
fn restart_keeps_data_and_tree() {
    let mut daemon = Daemon::start(&[]);
    let image = daemon.path("image.raw");
    let data: Vec<u8> = (0..2 << 20).map(|i: u32| (i * 7 % 251) as u8).collect();
    std::fs::write(&image, &data).unwrap();
    nbdcopy(p(&image), &uri(&daemon, "disk0"));
    daemon.ok(&["snapshot", "create", "disk0@a"]);
    daemon.ok(&["clone", "disk0@a", "copy"]);
    let before = daemon.json(&["volume", "list"]);
    daemon.stop_cleanly();
    assert!(ok(&["check", p(&daemon.path("pool"))]).contains("clean"));

    daemon.restart(&[]);
    assert_eq!(daemon.json(&["volume", "list"]), before);
    let back = daemon.path("back.raw");
    nbdcopy(&uri(&daemon, "copy"), p(&back));
    let copied = std::fs::read(&back).unwrap();
    assert!(copied[..data.len()] == data[..], "data survives a restart");
}

#[test]
fn a_second_daemon_on_the_same_pool_is_refused() {
    let daemon = Daemon::start(&[]);
    fails_with(
        &[
            "serve",
            "--data-dir",
            daemon.data_dir(),
            "--nbd-listen",
            "none",
            "--api-listen",
            "none",
        ],
        9,
        "in use by another arbor process",
    );
    daemon.ok(&["volume", "list"]);
}

#[test]
fn first_start_creates_a_pool_and_prints_working_connection_lines() {
    let mut daemon = Daemon::start(&["--initial-volume-size", "64M"]);
    let list = daemon.json(&["volume", "list"]);
    assert_eq!(names(&list), ["disk0"]);
    assert_eq!(list[0]["size"], 64 << 20);
    let out = daemon.stop_cleanly();
    daemon.restart(&[]);
    let nbdinfo = out
        .lines()
        .find(|l| l.trim_start().starts_with("nbdinfo "))
        .unwrap_or_else(|| panic!("no nbdinfo line in: {out}"));
    let run = Command::new("sh").args(["-c", nbdinfo]).output().unwrap();
    assert!(run.status.success(), "{nbdinfo}: {}", stderr(&run));
    assert!(stdout(&run).contains("67108864"), "{}", stdout(&run));
}

#[test]
fn config_file_then_flags() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("arbor.toml");
    std::fs::write(
        &config,
        "pool_size = \"128M\"\nchunk_size = \"64K\"\ninitial_volume = \"first\"\n\
         initial_volume_size = \"8M\"\nnbd_listen = \"none\"\napi_listen = \"none\"\n",
    )
    .unwrap();
    let printed = ok(&[
        "serve",
        "--config",
        p(&config),
        "--chunk-size",
        "32K",
        "--print-config",
    ]);
    let table: toml::Table = printed.parse().unwrap();
    assert_eq!(table["chunk_size"].as_integer(), Some(32 << 10));
    assert_eq!(table["pool_size"].as_integer(), Some(128 << 20));
    assert_eq!(table["initial_volume"].as_str(), Some("first"));

    std::fs::write(dir.path().join("bad.toml"), "pool_sise = \"1G\"\n").unwrap();
    fails_with(
        &["serve", "--config", p(&dir.path().join("bad.toml"))],
        2,
        "unknown key \"pool_sise\"",
    );
    fails_with(&["serve", "--api-listen", "0.0.0.0:1"], 2, "loopback");
    fails_with(
        &[
            "serve",
            "--commit-interval",
            "0s",
            "--data-dir",
            p(dir.path()),
        ],
        2,
        "greater than zero",
    );
    assert!(
        !dir.path().join("pool").exists(),
        "bad configs create nothing"
    );
    fails_with(
        &["serve", "--config", p(&dir.path().join("none.toml"))],
        4,
        "cannot read config file",
    );
}

#[test]
fn pool_create_protects_existing_data() {
    let dir = tempfile::tempdir().unwrap();
    let pool = dir.path().join("pool.img");
    let pool = p(&pool);
    ok(&["pool", "create", pool, "--size", "64M"]);
    fails_with(
        &["pool", "create", pool, "--size", "64M"],
        1,
        "already contains an arbor pool",
    );
    ok(&["pool", "create", pool, "--size", "32M", "--force"]);

    let data = dir.path().join("data");
    std::fs::write(&data, b"precious").unwrap();
    fails_with(
        &["pool", "create", p(&data), "--size", "64M"],
        1,
        "already contains data",
    );
    assert_eq!(std::fs::read(&data).unwrap(), b"precious");

    let missing = dir.path().join("new.img");
    fails_with(&["pool", "create", p(&missing)], 1, "--size is required");
    assert!(!missing.exists(), "a failed create leaves no file behind");
    fails_with(
        &[
            "pool",
            "create",
            p(&missing),
            "--size",
            "64M",
            "--chunk-size",
            "3K",
        ],
        2,
        "chunk size",
    );
    fails_with(
        &["pool", "create", p(&missing), "--size", "1M"],
        2,
        "too small",
    );
    assert!(!missing.exists());
    let created = json(&[
        "pool",
        "create",
        p(&missing),
        "--size",
        "64M",
        "--chunk-size",
        "4K",
        "--metadata-size",
        "8M",
        "--json",
    ]);
    assert_eq!(created["done"], "created");

    // A daemon serves a pool made elsewhere with --pool.
    let daemon = Daemon::start(&["--pool", p(&missing)]);
    let status = daemon.json(&["pool", "status"]);
    assert_eq!(status["chunk_size"], 4096);
    assert_eq!(status["metadata_bytes"], 8 << 20);
    assert_eq!(
        status["volumes"], 0,
        "an existing pool gets no initial volume"
    );
}

#[test]
fn help_version_and_completions() {
    assert!(ok(&["--help"]).contains("snapshot"));
    assert!(ok(&["--version"]).contains(env!("CARGO_PKG_VERSION")));
    assert!(ok(&["pool", "create", "--help"]).contains("--chunk-size"));
    assert!(ok(&["completions", "bash"]).contains("complete -F"));
    assert!(ok(&["completions", "zsh"]).contains("#compdef arbor"));
}

/// `arbor manpages DIR`: a page for arbor and for each command, however
/// deep (`arbor-volume-create.1`), each a roff page naming how the command
/// is typed and holding its options.
#[test]
fn man_pages_for_every_command() {
    let dir = tempfile::tempdir().unwrap();
    let man = dir.path().join("man1");
    assert!(ok(&["manpages", p(&man)]).contains("man pages"));
    let page = |name: &str| {
        std::fs::read_to_string(man.join(format!("{name}.1")))
            .unwrap_or_else(|e| panic!("{name}.1: {e}"))
    };
    let version = env!("CARGO_PKG_VERSION");
    let title = |name: &str| format!("\n.TH {name} 1  \"{name} {version}\"");
    assert!(page("arbor").contains(&title("arbor")), "{}", page("arbor"));
    let create = page("arbor-volume-create");
    assert!(create.contains(&title("arbor-volume-create")), "{create}");
    assert!(
        create.contains("arbor volume create"),
        "typed as it is: {create}"
    );
    assert!(create.contains("\\-\\-size"), "its options: {create}");
    for name in [
        "arbor-serve",
        "arbor-scrub-start",
        "arbor-replica-add",
        "arbor-origin-detach",
    ] {
        assert!(page(name).contains(".SH NAME"), "{name}");
    }
    let pages = std::fs::read_dir(&man).unwrap().count();
    assert!(pages >= 50, "{pages} pages");
}

#[test]
fn check_reports_a_damaged_pool_with_status_8() {
    let dir = tempfile::tempdir().unwrap();
    let pool = dir.path().join("pool.img");
    ok(&["pool", "create", p(&pool), "--size", "64M"]);
    let mut daemon = Daemon::start(&["--pool", p(&pool)]);
    daemon.ok(&["volume", "create", "v", "--size", "1M"]);
    daemon.ok(&["snapshot", "create", "v@s"]);
    daemon.stop_cleanly();
    // Break the checksum of every metadata node (block type 4).
    damage_blocks(&pool, 4, false);
    fails_with(&["check", p(&pool)], 8, "damaged");
}

/// Breaks the checksum of blocks of `kind` (the type field of the common
/// block header) in the pool image at `pool`: all of them, or only the last
/// one (a home page: the journal areas come first).
fn damage_blocks(pool: &std::path::Path, kind: u8, only_last: bool) {
    let mut image = std::fs::read(pool).unwrap();
    let mut found: Vec<_> = image
        .chunks_exact_mut(4096)
        .filter(|b| b.starts_with(b"ARBR") && b[6..8] == [kind, 0])
        .collect();
    assert!(!found.is_empty(), "no blocks of type {kind}");
    let from = if only_last { found.len() - 1 } else { 0 };
    for block in &mut found[from..] {
        block[100] ^= 0xff;
    }
    std::fs::write(pool, &image).unwrap();
}

#[test]
fn check_repair_rebuilds_space_maps_and_refuses_damaged_trees() {
    let dir = tempfile::tempdir().unwrap();
    let pool = dir.path().join("pool.img");
    ok(&["pool", "create", p(&pool), "--size", "64M"]);
    let mut daemon = Daemon::start(&["--pool", p(&pool)]);
    daemon.ok(&["volume", "create", "v", "--size", "1M"]);
    let image = dir.path().join("image.raw");
    let contents: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8).collect();
    std::fs::write(&image, &contents).unwrap();
    nbdcopy(p(&image), &uri(&daemon, "v"));
    daemon.ok(&["snapshot", "create", "v@s"]);
    daemon.ok(&["clone", "v@s", "c"]);
    let tree = names(&daemon.json(&["volume", "list", "--tree"]));
    daemon.stop_cleanly();

    fails_with(&["check", "--repair"], 2, "PATH");
    // A space-map home page (block type 3) is rebuilt from the trees.
    damage_blocks(&pool, 3, true);
    fails_with(&["check", p(&pool)], 8, "");
    let repaired = ok(&["check", p(&pool), "--repair"]);
    assert!(repaired.contains("repaired: "), "{repaired}");
    assert!(repaired.contains("pool is clean"), "{repaired}");
    let again = json(&["check", p(&pool), "--repair", "--json"]);
    assert_eq!(again["repaired"], serde_json::json!([]), "{again}");
    assert_eq!(again["clean"], true);
    let mut daemon = Daemon::start(&["--pool", p(&pool)]);
    assert_eq!(names(&daemon.json(&["volume", "list", "--tree"])), tree);
    let copy = dir.path().join("copy.raw");
    nbdcopy(&uri(&daemon, "c"), p(&copy));
    assert!(
        std::fs::read(&copy).unwrap() == contents,
        "the clone changed"
    );
    daemon.stop_cleanly();

    // Tree nodes (block type 4) cannot be rebuilt: repair refuses and
    // changes nothing.
    damage_blocks(&pool, 4, false);
    let before = std::fs::read(&pool).unwrap();
    fails_with(&["check", p(&pool), "--repair"], 8, "cannot repair");
    assert!(
        std::fs::read(&pool).unwrap() == before,
        "repair changed a pool it refused"
    );
}

/// The number `field` of a JSON object, which must have it.
fn bytes(v: &Value, field: &str) -> u64 {
    v[field]
        .as_u64()
        .unwrap_or_else(|| panic!("no {field} in {v}"))
}

/// `len` bytes in which every 8 hold their offset plus `tag`, so data read
/// from the wrong place never matches by chance.
fn pattern(len: u64, tag: u64) -> Vec<u8> {
    (0..len / 8)
        .flat_map(|i| (i * 8 + tag).to_le_bytes())
        .collect()
}

/// Copies `data` to the start of `export`, then reads it back.
fn write_and_read_back(daemon: &Daemon, export: &str, data: &[u8]) -> Vec<u8> {
    let image = daemon.path("image.raw");
    std::fs::write(&image, data).unwrap();
    nbdcopy(p(&image), &uri(daemon, export));
    let back = daemon.path("back.raw");
    nbdcopy(&uri(daemon, export), p(&back));
    let mut read = std::fs::read(&back).unwrap();
    read.truncate(data.len());
    read
}

/// A full pool grows while the daemon serves it: the report adds up, status
/// shows the new sizes at once, what was written before still reads back,
/// and a new volume is written into the added space.
#[test]
fn a_full_pool_grows_and_serves_writes_in_the_added_space() {
    let daemon = Daemon::start(&["--pool-size", "32M", "--initial-volume-size", "64M"]);
    let before = daemon.json(&["pool", "status"]);
    assert_eq!(bytes(&before, "pool_bytes"), 32 << 20);
    let old_data = bytes(&before, "data_bytes");
    let first = pattern(old_data, 1 << 40);
    assert!(write_and_read_back(&daemon, "disk0", &first) == first);
    let full = daemon.json(&["pool", "status"]);
    assert_eq!(
        bytes(&full, "data_used_bytes"),
        old_data,
        "the pool is full"
    );

    let grown = daemon.json(&["pool", "grow", "--size", "64M"]);
    assert_eq!(bytes(&grown, "old_pool_bytes"), 32 << 20, "{grown}");
    assert_eq!(bytes(&grown, "new_pool_bytes"), 64 << 20, "{grown}");
    let data_added = bytes(&grown, "data_bytes_added");
    let metadata_added = bytes(&grown, "metadata_bytes_added");
    assert!(data_added > 24 << 20, "{grown}");
    assert!(metadata_added > 0, "{grown}");
    assert!(data_added + metadata_added <= 32 << 20, "{grown}");
    assert_eq!(
        std::fs::metadata(daemon.path("pool")).unwrap().len(),
        64 << 20,
        "the pool file was enlarged"
    );

    let after = daemon.json(&["pool", "status"]);
    assert_eq!(bytes(&after, "pool_bytes"), 64 << 20);
    assert_eq!(bytes(&after, "data_bytes"), old_data + data_added);
    assert_eq!(
        bytes(&after, "metadata_bytes"),
        bytes(&before, "metadata_bytes") + metadata_added
    );
    assert_eq!(bytes(&after, "data_used_bytes"), old_data);

    // The old space is full: this volume's data can only be in the new space.
    daemon.ok(&["volume", "create", "more", "--size", "24M"]);
    let second = pattern(24 << 20, 2 << 40);
    assert!(
        write_and_read_back(&daemon, "more", &second) == second,
        "data written into the added space reads back"
    );
    let back = daemon.path("back.raw");
    nbdcopy(&uri(&daemon, "disk0"), p(&back));
    assert!(
        std::fs::read(&back).unwrap()[..first.len()] == first[..],
        "data written before the growth reads back"
    );
    let used = bytes(&daemon.json(&["pool", "status"]), "data_used_bytes");
    assert_eq!(used, old_data + (24 << 20));

    let text = daemon.ok(&["pool", "grow", "--size", "80M"]);
    assert!(text.contains("64 MiB -> 80 MiB"), "{text}");
    assert!(text.contains("metadata added:"), "{text}");
    assert_eq!(daemon.json(&["check"])["clean"], true);
}

/// A volume whose data continues from the old end of the data space into
/// the added space reads back: its mapping extents run across two regions,
/// which are not contiguous on the device.
#[test]
fn data_across_the_old_end_of_the_data_space_reads_back() {
    let daemon = Daemon::start(&["--pool-size", "32M", "--initial-volume-size", "64M"]);
    let first = pattern(8 << 20, 1 << 40);
    assert!(write_and_read_back(&daemon, "disk0", &first) == first);
    daemon.ok(&["pool", "grow", "--size", "64M"]);
    let second = pattern(40 << 20, 2 << 40);
    let read = write_and_read_back(&daemon, "disk0", &second);
    let chunk = 16 << 10;
    let bad: Vec<usize> = (0..second.len() / chunk)
        .filter(|&c| read[c * chunk..(c + 1) * chunk] != second[c * chunk..(c + 1) * chunk])
        .collect();
    assert!(bad.is_empty(), "chunks that read back wrong: {bad:?}");
}

/// `arbor pool create` of a 32 MiB pool file of format `version`.
fn create_32m<'a>(path: &'a str, version: &'a str) -> [&'a str; 7] {
    [
        "pool",
        "create",
        path,
        "--size",
        "32M",
        "--format-version",
        version,
    ]
}

/// Growth refusals are usage errors (2) that say what to do; a version 1
/// pool grows once upgraded; offline, `pool grow PATH` and `pool upgrade
/// PATH` work on a pool no daemon holds, and are refused (9) while one does.
#[test]
fn pool_grow_refusals_upgrade_and_offline_growth() {
    let dir = tempfile::tempdir().unwrap();
    let pool = dir.path().join("pool.img");
    let pool = p(&pool);
    let created = json(&[&create_32m(pool, "1")[..], &["--json"]].concat());
    assert_eq!(created["done"], "created");
    let newest = arbor_format::FORMAT_VERSION;
    let unknown = (newest + 1).to_string();
    fails_with(&create_32m(pool, &unknown), 2, "--format-version");

    let mut daemon = Daemon::start(&["--pool", pool]);
    assert_eq!(daemon.json(&["pool", "status"])["format_version"], 1);
    assert!(daemon.ok(&["pool", "status"]).contains("version 1"));
    daemon.fails(&["pool", "grow", "--size", "64M"], 2, "arbor pool upgrade");
    assert_eq!(
        daemon.json(&["pool", "upgrade"]),
        serde_json::json!({"upgraded": true, "format_version": newest})
    );
    assert!(daemon
        .ok(&["pool", "upgrade"])
        .contains(&format!("already is format version {newest}")));
    assert_eq!(daemon.json(&["pool", "status"])["format_version"], newest);

    // Nothing to grow onto: the file is as big as the pool.
    daemon.fails(&["pool", "grow"], 2, "already fills");
    daemon.fails(&["pool", "grow", "--size", "16M"], 2, "cannot shrink");
    let grown = daemon.json(&["pool", "grow", "--size", "64M"]);
    assert_eq!(grown["new_pool_bytes"], 64 << 20);
    fails_with(
        &["pool", "grow", pool, "--size", "96M"],
        9,
        "in use by another arbor process",
    );
    fails_with(
        &["pool", "upgrade", pool],
        9,
        "in use by another arbor process",
    );
    daemon.stop_cleanly();

    // Offline: a file enlarged by other means, then one enlarged by --size.
    std::fs::OpenOptions::new()
        .write(true)
        .open(pool)
        .unwrap()
        .set_len(96 << 20)
        .unwrap();
    let grown = json(&["pool", "grow", pool, "--metadata-size", "2M", "--json"]);
    assert_eq!(grown["old_pool_bytes"], 64 << 20, "{grown}");
    assert_eq!(grown["new_pool_bytes"], 96 << 20, "{grown}");
    assert_eq!(grown["metadata_bytes_added"], 2 << 20, "{grown}");
    let text = ok(&["pool", "grow", pool, "--size", "128M"]);
    assert!(text.contains("96 MiB -> 128 MiB"), "{text}");
    fails_with(&["pool", "grow", pool], 2, "already fills");
    assert!(ok(&["check", pool]).contains("pool is clean"));
    let daemon = Daemon::start(&["--pool", pool]);
    assert_eq!(daemon.json(&["pool", "status"])["pool_bytes"], 128 << 20);
    drop(daemon);

    let old = dir.path().join("old.img");
    ok(&create_32m(p(&old), "1"));
    fails_with(&["pool", "grow", p(&old), "--size", "64M"], 2, "upgrade");
    assert!(ok(&["pool", "upgrade", p(&old)])
        .contains(&format!("upgraded the pool to format version {newest}")));
    assert_eq!(
        json(&["pool", "grow", p(&old), "--size", "64M", "--json"])["new_pool_bytes"],
        64 << 20
    );
    assert!(ok(&["check", p(&old)]).contains("pool is clean"));
}
