//! Encrypted volumes through the binary (docs/SECURITY.md "Encryption at
//! rest"): created with a key file, written and read over NBD by real
//! `nbdcopy`, the pool file holding none of what was written; locked by
//! `key unload` and by a restart (listed, not served), unlocked by `key
//! load` of any volume sharing the key; a wrong key or kind of key
//! refused with exit status 2; the user's key changed to a passphrase in
//! O(1), after which only the passphrase opens it.
// A test crate: unwrap, expect and panic are how a test reports failure.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;

/// 1 MiB that says where it is: "ARBOR-PLAINTEXT:" and the offset,
/// every 32 bytes, so a copy anywhere in the pool file would be found.
fn plaintext(seed: u8) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 << 20);
    while out.len() < 1 << 20 {
        out.extend_from_slice(b"ARBOR-PLAINTEXT:");
        out.extend_from_slice(&(out.len() as u64).to_le_bytes());
        out.extend_from_slice(&[seed; 8]);
    }
    out
}

fn set_private(path: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

fn uri(daemon: &Daemon, export: &str) -> String {
    format!("nbd+unix:///{export}?socket={}", daemon.nbd_socket())
}

fn read(daemon: &Daemon, export: &str) -> Vec<u8> {
    let file = daemon.path("out.bin");
    nbdcopy(&uri(daemon, export), p(&file));
    std::fs::read(&file).unwrap()
}

fn serves(daemon: &Daemon, export: &str) -> bool {
    tool("nbdinfo", &[&uri(daemon, export)]).status.success()
}

fn locked(daemon: &Daemon, name: &str) -> bool {
    let list = daemon.json(&["volume", "list"]);
    let v = list
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == name)
        .unwrap_or_else(|| panic!("{name} is listed"));
    v["encryption"]["locked"].as_bool().expect("encrypted")
}

#[test]
fn an_encrypted_volume_is_served_only_with_its_key_and_stores_no_plaintext() {
    let mut daemon = Daemon::start(&["--initial-volume", "none"]);
    let key = daemon.path("volume.key");
    ok(&["key", "new", p(&key)]);
    // Without a key: a usage error, nothing made.
    daemon.fails(
        &["volume", "create", "sec", "--size", "4M", "--encrypt"],
        2,
        "",
    );
    daemon.ok(&[
        "volume",
        "create",
        "sec",
        "--size",
        "4M",
        "--encrypt",
        "--key-file",
        p(&key),
    ]);
    assert!(!locked(&daemon, "sec"));

    let data = plaintext(1);
    let file = daemon.path("in.bin");
    std::fs::write(&file, &data).unwrap();
    nbdcopy(p(&file), &uri(&daemon, "sec"));
    assert!(read(&daemon, "sec")[..data.len()] == data[..]);
    daemon.ok(&["snapshot", "create", "sec@s"]);
    daemon.ok(&["clone", "sec@s", "copy"]);
    assert!(read(&daemon, "copy")[..data.len()] == data[..]);
    daemon.ok(&["pool", "flush"]);
    let pool = std::fs::read(daemon.path("pool")).unwrap();
    let found = pool
        .windows(16)
        .filter(|w| w == b"ARBOR-PLAINTEXT:")
        .count();
    assert_eq!(found, 0, "plaintext in the pool file");

    // Unloaded: the volume, its snapshot and its clone are listed, locked,
    // and not served.
    daemon.ok(&["key", "unload", "sec"]);
    for name in ["sec", "sec@s", "copy"] {
        assert!(locked(&daemon, name), "{name}");
        assert!(!serves(&daemon, name), "{name} is served while locked");
    }
    // A wrong key, a wrong kind of key.
    let other = daemon.path("other.key");
    ok(&["key", "new", p(&other)]);
    daemon.fails(
        &["key", "load", "sec", "--key-file", p(&other)],
        2,
        "wrong key",
    );
    daemon.fails(
        &["key", "load", "sec", "--passphrase-file", p(&key)],
        2,
        "wrong kind of key",
    );
    // Any volume sharing the key unlocks them all.
    daemon.ok(&["key", "load", "copy", "--key-file", p(&key)]);
    assert!(!locked(&daemon, "sec@s"));
    assert!(read(&daemon, "sec@s")[..data.len()] == data[..]);

    // A passphrase in place of the key file: O(1), the data untouched.
    let phrase = daemon.path("phrase");
    std::fs::write(&phrase, "correct horse battery staple\n").unwrap();
    // A key file others may read is refused, as a backup key's is.
    daemon.fails(
        &["key", "load", "sec", "--passphrase-file", p(&phrase)],
        1,
        "may be read by others",
    );
    set_private(&phrase);
    daemon.ok(&[
        "key",
        "change",
        "sec",
        "--key-file",
        p(&key),
        "--new-passphrase-file",
        p(&phrase),
    ]);
    // Locked after a restart, whatever was loaded.
    daemon.stop_cleanly();
    daemon.restart(&["--initial-volume", "none"]);
    assert!(locked(&daemon, "sec"));
    assert!(!serves(&daemon, "sec"));
    daemon.fails(
        &["key", "load", "sec", "--key-file", p(&key)],
        2,
        "wrong kind of key",
    );
    daemon.ok(&["key", "load", "sec", "--passphrase-file", p(&phrase)]);
    for name in ["sec", "sec@s", "copy"] {
        assert!(read(&daemon, name)[..data.len()] == data[..], "{name}");
    }
    // Checked and scrubbed clean (sums are of ciphertext).
    let report = daemon.ok(&["check"]);
    assert!(report.contains("clean"), "{report}");
    daemon.stop_cleanly();
}

/// `arbor send --raw` of an encrypted volume's snapshots, with its key
/// unloaded, into a second daemon that has no key: the stream files and
/// the receiving pool hold none of the plaintext, the received volume is
/// listed locked and not served, and `key load` there with the source's
/// key file serves exactly what was written. A plaintext send of the
/// locked volume and a raw send of a plain one are refused.
#[test]
fn raw_sends_carry_ciphertext_to_a_daemon_without_the_key() {
    let mut a = Daemon::start(&["--initial-volume", "none"]);
    let mut b = Daemon::start(&["--initial-volume", "none"]);
    let key = a.path("volume.key");
    ok(&["key", "new", p(&key)]);
    a.ok(&[
        "volume",
        "create",
        "sec",
        "--size",
        "4M",
        "--encrypt",
        "--key-file",
        p(&key),
    ]);
    let one = plaintext(1);
    let file = a.path("in.bin");
    std::fs::write(&file, &one).unwrap();
    nbdcopy(p(&file), &uri(&a, "sec"));
    a.ok(&["snapshot", "create", "sec@one"]);
    let mut two = one.clone();
    two[..1 << 19].copy_from_slice(&plaintext(2)[..1 << 19]);
    std::fs::write(&file, &two).unwrap();
    nbdcopy(p(&file), &uri(&a, "sec"));
    a.ok(&["snapshot", "create", "sec@two"]);
    a.ok(&["key", "unload", "sec"]);
    // Locked, its diffs and space accounting still work (metadata only).
    let diff = a.json(&["diff", "sec@one", "sec@two"]);
    let ranges = diff.as_array().expect("ranges");
    assert!(
        ranges.len() == 1 && ranges[0]["offset"] == 0 && ranges[0]["len"].as_u64() >= Some(1 << 19),
        "the first half MiB's chunks differ, nothing else: {diff}"
    );
    a.fails(
        &["send", "sec@one", "-o", p(&a.path("plain.stream"))],
        5,
        "locked",
    );
    let full = a.path("full.stream");
    let incr = a.path("incr.stream");
    a.ok(&["send", "--raw", "sec@one", "-o", p(&full)]);
    a.ok(&[
        "send",
        "--raw",
        "--from",
        "sec@one",
        "sec@two",
        "-o",
        p(&incr),
    ]);
    for stream in [&full, &incr] {
        let bytes = std::fs::read(stream).unwrap();
        assert!(bytes.len() > 1 << 20, "the stream carries the data");
        assert_eq!(
            bytes
                .windows(16)
                .filter(|w| w == b"ARBOR-PLAINTEXT:")
                .count(),
            0,
            "plaintext in {}",
            stream.display()
        );
    }
    b.ok(&["receive", "copy", "-i", p(&full)]);
    b.ok(&["receive", "copy", "-i", p(&incr)]);
    b.ok(&["pool", "flush"]);
    let pool = std::fs::read(b.path("pool")).unwrap();
    assert_eq!(
        pool.windows(16)
            .filter(|w| w == b"ARBOR-PLAINTEXT:")
            .count(),
        0,
        "plaintext in the receiving pool"
    );
    for name in ["copy", "copy@one", "copy@two"] {
        assert!(locked(&b, name), "{name}");
        assert!(!serves(&b, name), "{name} is served without its key");
    }
    let report = b.ok(&["check"]);
    assert!(report.contains("clean"), "{report}");
    b.ok(&["key", "load", "copy", "--key-file", p(&key)]);
    assert!(read(&b, "copy@one")[..one.len()] == one[..]);
    assert!(read(&b, "copy@two")[..two.len()] == two[..]);
    // A raw send of a volume that is not encrypted.
    a.ok(&["volume", "create", "plain", "--size", "4M"]);
    a.ok(&["snapshot", "create", "plain@s"]);
    a.fails(
        &["send", "--raw", "plain@s", "-o", p(&a.path("x.stream"))],
        2,
        "not encrypted",
    );
    a.stop_cleanly();
    b.stop_cleanly();
}

/// Keys configured in `volume_keys` load at start and at a reload: from a
/// key file, and from a command (no shell) that prints a passphrase; a
/// wrong key, a failing command and one that prints without end leave
/// their volumes locked, logged and reported, and the daemon serves the
/// rest.
#[test]
fn configured_keys_unlock_volumes_at_start_and_reload() {
    let mut daemon = Daemon::start_logging(&["--initial-volume", "none"]);
    let key = daemon.path("sec.key");
    let wrong = daemon.path("wrong.key");
    ok(&["key", "new", p(&key)]);
    ok(&["key", "new", p(&wrong)]);
    let phrase = daemon.path("phrase");
    std::fs::write(&phrase, "a passphrase from a key service\n").unwrap();
    set_private(&phrase);
    let create = |name: &str, how: &str, file: &std::path::Path| {
        daemon.ok(&[
            "volume",
            "create",
            name,
            "--size",
            "4M",
            "--encrypt",
            how,
            p(file),
        ]);
    };
    create("sec", "--key-file", &key);
    create("kms", "--passphrase-file", &phrase);
    create("other", "--key-file", &key);
    create("spew", "--key-file", &key);
    create("broken", "--key-file", &key);
    let data = plaintext(3);
    let file = daemon.path("in.bin");
    std::fs::write(&file, &data).unwrap();
    nbdcopy(p(&file), &uri(&daemon, "sec"));
    let config = daemon.path("arbor.toml");
    let entry = |volume: &str, rest: String| format!("{{ volume = \"{volume}\", {rest} }}");
    let text = format!(
        "volume_keys = [{}, {}, {}, {}, {}]\n",
        entry("sec", format!("key_file = {:?}", p(&key))),
        entry(
            "kms",
            format!(
                "key_command = [\"/bin/cat\", {:?}], key_command_prints = \"passphrase\"",
                p(&phrase)
            )
        ),
        entry("other", format!("key_file = {:?}", p(&wrong))),
        entry("spew", "key_command = [\"/usr/bin/yes\"]".to_owned()),
        entry("broken", "key_command = [\"/bin/false\"]".to_owned()),
    );
    std::fs::write(&config, text).unwrap();
    daemon.stop_cleanly();
    daemon.restart(&["--initial-volume", "none", "--config", p(&config)]);
    assert!(!locked(&daemon, "sec"));
    assert!(!locked(&daemon, "kms"));
    assert!(read(&daemon, "sec")[..data.len()] == data[..]);
    for name in ["other", "spew", "broken"] {
        assert!(locked(&daemon, name), "{name}");
        assert!(!serves(&daemon, name), "{name}");
    }
    let log = daemon.log();
    assert!(log.contains("wrong key"), "{log}");
    assert!(
        log.contains("printed more than 4096 bytes") || log.contains("failed"),
        "{log}"
    );
    // A reload loads what is locked now: sec, unloaded meanwhile.
    daemon.ok(&["key", "unload", "sec"]);
    assert!(locked(&daemon, "sec"));
    let out = daemon.ok(&["config", "reload"]);
    assert!(
        out.contains("unlocked sec with its configured key"),
        "{out}"
    );
    assert!(out.contains("other: wrong key"), "{out}");
    assert!(!locked(&daemon, "sec"));
    // A bad entry is refused at start.
    std::fs::write(
        &config,
        format!(
            "volume_keys = [{}]\n",
            entry(
                "sec",
                format!("key_file = {:?}, key_command = [\"/bin/cat\"]", p(&key))
            )
        ),
    )
    .unwrap();
    daemon.fails(&["config", "reload"], 2, "exactly one of");
    daemon.stop_cleanly();
}

/// A clone of an encrypted snapshot given a key of its own: it shares the
/// snapshot's chunks (and data key) but its own slot keeps the data key
/// wrapped by the new key only, so after a restart the new key opens the
/// clone and not the origin, and the origin's key opens the origin and
/// not the clone; unloading one locks only it.
#[test]
fn a_clone_can_have_a_key_of_its_own() {
    let mut daemon = Daemon::start(&["--initial-volume", "none"]);
    let gold = daemon.path("gold.key");
    let tenant = daemon.path("tenant.key");
    ok(&["key", "new", p(&gold)]);
    ok(&["key", "new", p(&tenant)]);
    daemon.ok(&[
        "volume",
        "create",
        "gold",
        "--size",
        "4M",
        "--encrypt",
        "--key-file",
        p(&gold),
    ]);
    let data = plaintext(4);
    let file = daemon.path("in.bin");
    std::fs::write(&file, &data).unwrap();
    nbdcopy(p(&file), &uri(&daemon, "gold"));
    daemon.ok(&["snapshot", "create", "gold@v1"]);
    // The new key needs the snapshot's, and a wrong one is refused.
    daemon.fails(
        &["clone", "gold@v1", "t1", "--new-key-file", p(&tenant)],
        2,
        "snapshot's key too",
    );
    daemon.fails(
        &[
            "clone",
            "gold@v1",
            "t1",
            "--key-file",
            p(&tenant),
            "--new-key-file",
            p(&tenant),
        ],
        2,
        "wrong key",
    );
    daemon.ok(&[
        "clone",
        "gold@v1",
        "t1",
        "--key-file",
        p(&gold),
        "--new-key-file",
        p(&tenant),
    ]);
    assert!(read(&daemon, "t1")[..data.len()] == data[..]);
    daemon.ok(&["key", "unload", "gold"]);
    assert!(locked(&daemon, "gold") && locked(&daemon, "gold@v1"));
    assert!(!locked(&daemon, "t1"), "the clone has its own key");
    daemon.stop_cleanly();
    daemon.restart(&["--initial-volume", "none"]);
    daemon.fails(
        &["key", "load", "t1", "--key-file", p(&gold)],
        2,
        "wrong key",
    );
    daemon.fails(
        &["key", "load", "gold", "--key-file", p(&tenant)],
        2,
        "wrong key",
    );
    daemon.ok(&["key", "load", "t1", "--key-file", p(&tenant)]);
    assert!(locked(&daemon, "gold"));
    assert!(read(&daemon, "t1")[..data.len()] == data[..]);
    daemon.ok(&["snapshot", "create", "t1@mine"]);
    assert!(
        !locked(&daemon, "t1@mine"),
        "the clone's snapshots share its key"
    );
    daemon.ok(&["key", "load", "gold", "--key-file", p(&gold)]);
    assert!(read(&daemon, "gold@v1")[..data.len()] == data[..]);
    let report = daemon.ok(&["check"]);
    assert!(report.contains("clean"), "{report}");
    daemon.stop_cleanly();
}

/// A volume encrypted in 4 KiB units (the default) advertises 4 KiB as its
/// minimum block size over NBD (one in 512-byte units, 512), so clients that honour it (qemu, libnbd, the kernel)
/// write 512-byte sectors into it by read-modify-write of whole units:
/// qemu-io's 512-byte writes land, and the rest of their unit is kept.
#[test]
fn a_volume_in_4k_units_advertises_4k_blocks_and_takes_sector_writes_from_qemu() {
    let mut daemon = Daemon::start(&["--initial-volume", "none"]);
    let key = daemon.path("volume.key");
    ok(&["key", "new", p(&key)]);
    daemon.ok(&[
        "volume",
        "create",
        "u4k",
        "--size",
        "4M",
        "--encrypt",
        "--key-file",
        p(&key),
    ]);
    daemon.ok(&[
        "volume",
        "create",
        "u512",
        "--size",
        "4M",
        "--encrypt",
        "--key-file",
        p(&key),
        "--encryption-unit",
        "512",
    ]);
    let info = |name: &str| -> serde_json::Value {
        let out = tool_ok("nbdinfo", &["--json", &uri(&daemon, name)]);
        serde_json::from_str::<serde_json::Value>(&out).unwrap()["exports"][0].clone()
    };
    assert_eq!(info("u4k")["block_size_minimum"], 4096);
    assert_eq!(info("u512")["block_size_minimum"], 512);
    let qemu = |args: &[&str]| {
        let mut all = vec!["-f", "raw"];
        for a in args {
            all.extend(["-c", a]);
        }
        let target = uri(&daemon, "u4k");
        all.push(&target);
        tool_ok("qemu-io", &all)
    };
    qemu(&[
        "write -P 0x61 0 8k",
        "write -P 0x62 512 512",
        "write -P 0x63 5120 1536",
    ]);
    let got = read(&daemon, "u4k");
    let mut want = vec![0x61u8; 8192];
    want[512..1024].fill(0x62);
    want[5120..6656].fill(0x63);
    assert!(
        got[..8192] == want[..],
        "sector writes merged into their units"
    );
    assert!(got[8192..].iter().all(|&b| b == 0));
    daemon.stop_cleanly();
}

/// A key piped in on standard input (`--key-file -`, as a key service's
/// tool prints it) creates and loads a volume as a key file does; more
/// than 4096 bytes of it is refused.
#[test]
fn a_key_on_standard_input_creates_and_loads() {
    use std::io::Write;
    use std::process::Stdio;
    let mut daemon = Daemon::start(&["--initial-volume", "none"]);
    let key = daemon.path("volume.key");
    ok(&["key", "new", p(&key)]);
    let text = std::fs::read(&key).unwrap();
    let piped = |args: &[&str], input: &[u8]| {
        let mut child = command()
            .args(daemon.args(args))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(input).unwrap();
        child.wait_with_output().unwrap()
    };
    let made = piped(
        &[
            "volume",
            "create",
            "kms",
            "--size",
            "4M",
            "--encrypt",
            "--key-file",
            "-",
        ],
        &text,
    );
    assert!(made.status.success(), "{}", stderr(&made));
    daemon.ok(&["key", "unload", "kms"]);
    assert!(locked(&daemon, "kms"));
    let loaded = piped(&["key", "load", "kms", "--key-file", "-"], &text);
    assert!(loaded.status.success(), "{}", stderr(&loaded));
    assert!(!locked(&daemon, "kms"));
    // The same key from its file opens it too.
    daemon.ok(&["key", "unload", "kms"]);
    daemon.ok(&["key", "load", "kms", "--key-file", p(&key)]);
    let long = piped(
        &["key", "load", "kms", "--key-file", "-"],
        &vec![b'a'; 5000],
    );
    assert!(!long.status.success());
    assert!(
        stderr(&long).contains("longer than 4096 bytes"),
        "{}",
        stderr(&long)
    );
    daemon.stop_cleanly();
}
