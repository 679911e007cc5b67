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
