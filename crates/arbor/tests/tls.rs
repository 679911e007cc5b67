//! `arbor tls init` end to end: the files it writes, checked by OpenSSL,
//! and used by real NBD tools (nbdkit, nbdinfo, qemu-img) through the
//! GnuTLS names. (That arbor's own replication TLS accepts them is a unit
//! test in src/tls_init.rs.) `arbor tls add`: the certificates it adds
//! under the same CA, checked by OpenSSL, what it refuses, and two daemons
//! replicating to each other with them.
// A test crate: unwrap, expect and panic are how a test reports failure
// (the workspace denies them in the code it ships; clippy.toml allows
// them in #[test] functions, this in the helpers around them).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;

fn openssl_text(cert: &Path) -> String {
    tool_ok("openssl", &["x509", "-noout", "-text", "-in", p(cert)])
}

/// Asserts that `cert` is the client certificate of `name`: its subject,
/// its one name, client authentication only.
fn assert_client_cert(cert: &Path, name: &str) {
    let client = openssl_text(cert);
    assert!(
        client.contains(&format!("Subject: CN = {name}\n")),
        "{client}"
    );
    assert!(client.contains(&format!("DNS:{name}\n")), "{client}");
    assert!(client.contains("TLS Web Client Authentication"), "{client}");
    assert!(
        !client.contains("TLS Web Server Authentication"),
        "{client}"
    );
}

/// Asserts that `dir/key` is the private key of `dir/cert`.
fn assert_key_of(dir: &Path, cert: &str, key: &str) {
    let from_cert = tool_ok(
        "openssl",
        &["x509", "-noout", "-pubkey", "-in", p(&dir.join(cert))],
    );
    let from_key = tool_ok("openssl", &["pkey", "-pubout", "-in", p(&dir.join(key))]);
    assert_eq!(from_cert, from_key, "{key} is {cert}'s key");
}

/// Whether `cert` is still valid `days` from now.
fn valid_for(cert: &Path, days: u64) -> bool {
    let secs = (days * 86_400).to_string();
    tool(
        "openssl",
        &["x509", "-noout", "-checkend", &secs, "-in", p(cert)],
    )
    .status
    .success()
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o7777
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

const GNUTLS: [(&str, &str); 4] = [
    ("ca-cert.pem", "ca.pem"),
    ("server-cert.pem", "server.pem"),
    ("client-cert.pem", "client-alpha.pem"),
    ("client-key.pem", "client-alpha-key.pem"),
];

#[test]
fn init_writes_the_layout_and_openssl_verifies_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("etc/arbor-tls");
    let d = |name: &str| dir.join(name);
    let out = ok(&[
        "tls",
        "init",
        p(&dir),
        "--host",
        "beta",
        "--host",
        "10.0.0.2",
        "--client",
        "alpha",
        "--client",
        "admin",
        "--days",
        "30",
    ]);
    let canonical = std::fs::canonicalize(&dir).unwrap();
    assert!(
        out.contains(&format!(
            "tls_cert = \"{}\"",
            canonical.join("server.pem").display()
        )),
        "{out}"
    );
    assert!(out.contains("tls_ca = "), "{out}");
    assert!(out.contains("tls-certificates="), "{out}");

    // The layout: arbor's names, then the GnuTLS ones; nothing else (no
    // temporary files left).
    assert_eq!(
        names(&dir),
        [
            "ca-cert.pem",
            "ca-key.pem",
            "ca.pem",
            "client-admin-key.pem",
            "client-admin.pem",
            "client-alpha-key.pem",
            "client-alpha.pem",
            "client-cert.pem",
            "client-key.pem",
            "server-cert.pem",
            "server-key.pem",
            "server.pem",
        ]
    );
    assert_eq!(mode(&dir), 0o700);
    for name in names(&dir) {
        let path = d(&name);
        assert!(
            std::fs::symlink_metadata(&path).unwrap().is_file(),
            "{name} must be a plain file, not a link"
        );
        let want = if name.ends_with("key.pem") {
            0o600
        } else {
            0o644
        };
        assert_eq!(mode(&path), want, "{name}");
    }
    // The GnuTLS names are copies (separate files) of the first client's
    // and the server's and CA's files.
    for (copy, original) in GNUTLS {
        assert_eq!(read(&d(copy)), read(&d(original)), "{copy}");
        assert_ne!(
            std::fs::metadata(d(copy)).unwrap().ino(),
            std::fs::metadata(d(original)).unwrap().ino(),
            "{copy} is a copy, not a hard link"
        );
    }

    // Chains and purposes.
    let ca = d("ca.pem");
    tool_ok(
        "openssl",
        &[
            "verify",
            "-CAfile",
            p(&ca),
            p(&d("server.pem")),
            p(&d("client-alpha.pem")),
            p(&d("client-admin.pem")),
        ],
    );
    tool_ok(
        "openssl",
        &[
            "verify",
            "-CAfile",
            p(&ca),
            "-purpose",
            "sslserver",
            p(&d("server.pem")),
        ],
    );
    for cert in ["client-alpha.pem", "client-admin.pem", "server.pem"] {
        tool_ok(
            "openssl",
            &[
                "verify",
                "-CAfile",
                p(&ca),
                "-purpose",
                "sslclient",
                p(&d(cert)),
            ],
        );
    }
    let wrong = tool(
        "openssl",
        &[
            "verify",
            "-CAfile",
            p(&ca),
            "-purpose",
            "sslserver",
            p(&d("client-alpha.pem")),
        ],
    );
    assert!(
        !wrong.status.success(),
        "a client certificate is no server's"
    );

    // What the certificates say.
    let ca_text = openssl_text(&ca);
    assert!(ca_text.contains("CA:TRUE"), "{ca_text}");
    assert!(ca_text.contains("Certificate Sign"), "{ca_text}");
    assert!(ca_text.contains("ecdsa-with-SHA256"), "{ca_text}");
    let server = openssl_text(&d("server.pem"));
    assert!(server.contains("Subject: CN = beta"), "{server}");
    assert!(server.contains("DNS:beta, IP Address:10.0.0.2"), "{server}");
    assert!(server.contains("TLS Web Server Authentication"), "{server}");
    assert!(server.contains("CA:FALSE"), "{server}");
    assert!(server.contains("NIST CURVE: P-256"), "{server}");
    for name in ["alpha", "admin"] {
        assert_client_cert(&d(&format!("client-{name}.pem")), name);
    }

    // Each key belongs to its certificate.
    for (cert, key) in [
        ("ca.pem", "ca-key.pem"),
        ("server.pem", "server-key.pem"),
        ("client-alpha.pem", "client-alpha-key.pem"),
        ("client-cert.pem", "client-key.pem"),
    ] {
        assert_key_of(&dir, cert, key);
    }

    // Validity: --days for the leaves, ten years for the CA; random
    // serials.
    let checkend = |cert: &str, days: u64| valid_for(&d(cert), days);
    assert!(checkend("server.pem", 29) && !checkend("server.pem", 31));
    assert!(checkend("client-admin.pem", 29) && !checkend("client-admin.pem", 31));
    assert!(checkend("ca.pem", 3649) && !checkend("ca.pem", 3651));
    let serial = |cert: &str| {
        tool_ok(
            "openssl",
            &["x509", "-noout", "-serial", "-in", p(&d(cert))],
        )
    };
    let serials: Vec<String> = [
        "ca.pem",
        "server.pem",
        "client-alpha.pem",
        "client-admin.pem",
    ]
    .iter()
    .map(|c| serial(c))
    .collect();
    for (i, s) in serials.iter().enumerate() {
        assert!(s.trim().len() >= "serial=".len() + 30, "{s}");
        assert!(!serials[..i].contains(s), "{serials:?}");
    }
}

/// A process killed when the test ends, however it ends.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `nbdkit memory 1M` on a Unix socket, TLS required and client
/// certificates verified, with the GnuTLS files of `dir`.
/// Its messages (the refused handshakes the test provokes) go to `log`.
fn nbdkit(dir: &Path, socket: &Path, log: &Path) -> Killed {
    let child = Command::new("nbdkit")
        .args([
            "-f",
            "--exit-with-parent",
            "--tls=require",
            "--tls-verify-peer",
        ])
        .arg(format!("--tls-certificates={}", p(dir)))
        .args(["-U", p(socket), "memory", "1M"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .expect("nbdkit is missing: scripts/install-deps.sh");
    let mut server = Killed(child);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !socket.exists() {
        if let Some(status) = server.0.try_wait().unwrap() {
            let log = std::fs::read_to_string(log).unwrap_or_default();
            panic!("nbdkit exited: {status}: {log}");
        }
        assert!(Instant::now() < deadline, "nbdkit did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    server
}

fn nbdinfo_size(socket: &Path, certificates: &Path) -> Output {
    tool(
        "nbdinfo",
        &[
            "--size",
            &format!(
                "nbds+unix:///?socket={}&tls-certificates={}",
                p(socket),
                p(certificates)
            ),
        ],
    )
}

#[test]
fn nbd_tools_use_the_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("tls");
    ok(&["tls", "init", p(&dir), "--client", "alpha"]);
    let socket = tmp.path().join("nbdkit.sock");
    let _server = nbdkit(&dir, &socket, &tmp.path().join("nbdkit.log"));

    // libnbd (nbdinfo): client-cert.pem, client-key.pem, ca-cert.pem; the
    // server's certificate verified against ca-cert.pem.
    let out = nbdinfo_size(&socket, &dir);
    assert!(out.status.success(), "nbdinfo: {}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "1048576");

    // qemu's tls-creds-x509 (stricter about key usage than GnuTLS).
    let qemu = tool(
        "qemu-img",
        &[
            "info",
            "--output=json",
            "--object",
            &format!("tls-creds-x509,id=tls0,endpoint=client,dir={}", p(&dir)),
            "--image-opts",
            &format!(
                "driver=nbd,path={},tls-creds=tls0,tls-hostname=localhost",
                p(&socket)
            ),
        ],
    );
    assert!(qemu.status.success(), "qemu-img: {}", stderr(&qemu));
    assert!(stdout(&qemu).contains("1048576"), "{}", stdout(&qemu));

    // Another CA's files get nowhere, nor do no files at all.
    let other = tmp.path().join("other");
    ok(&["tls", "init", p(&other)]);
    assert!(!nbdinfo_size(&socket, &other).status.success());
    let plain = tool(
        "nbdinfo",
        &["--size", &format!("nbd+unix:///?socket={}", p(&socket))],
    );
    assert!(!plain.status.success(), "TLS is required");
}

#[test]
fn existing_files_are_kept_unless_force() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("tls");
    let d = |name: &str| dir.join(name);
    ok(&["tls", "init", p(&dir)]);
    let ca = read(&d("ca.pem"));
    let key = read(&d("server-key.pem"));

    fails_with(&["tls", "init", p(&dir)], 5, "--force");
    assert_eq!(read(&d("ca.pem")), ca);
    assert_eq!(read(&d("server-key.pem")), key);

    // One file left is enough to refuse, and then nothing is written.
    for name in names(&dir) {
        if name != "client-key.pem" {
            std::fs::remove_file(d(&name)).unwrap();
        }
    }
    fails_with(&["tls", "init", p(&dir)], 5, "client-key.pem");
    assert_eq!(names(&dir), ["client-key.pem"]);

    // --force replaces, with the right modes whatever the old files had.
    std::fs::set_permissions(d("client-key.pem"), std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::write(d("server-key.pem"), "old").unwrap();
    std::fs::set_permissions(d("server-key.pem"), std::fs::Permissions::from_mode(0o666)).unwrap();
    ok(&["tls", "init", p(&dir), "--force"]);
    assert_eq!(names(&dir).len(), 10);
    assert_ne!(read(&d("ca.pem")), ca, "a new CA");
    assert_eq!(mode(&d("client-key.pem")), 0o600);
    assert_eq!(mode(&d("server-key.pem")), 0o600);
    assert_eq!(read(&d("client-key.pem")), read(&d("client-admin-key.pem")));
    tool_ok(
        "openssl",
        &["verify", "-CAfile", p(&d("ca.pem")), p(&d("server.pem"))],
    );

    // An existing directory keeps its mode; a file in the way is an error.
    let open = tmp.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
    ok(&["tls", "init", p(&open)]);
    assert_eq!(mode(&open), 0o755);
    assert_eq!(mode(&open.join("ca-key.pem")), 0o600);
    let file = tmp.path().join("file");
    std::fs::write(&file, "").unwrap();
    fails_with(&["tls", "init", p(&file)], 5, "not a directory");
}

#[test]
fn json_says_what_was_written() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("tls");
    let report = json(&[
        "--json",
        "tls",
        "init",
        p(&dir),
        "--client",
        "alpha",
        "--client",
        "beta",
        "--host",
        "gamma",
    ]);
    let dir = std::fs::canonicalize(&dir).unwrap();
    let path = |name: &str| dir.join(name).to_str().unwrap().to_owned();
    assert_eq!(report["dir"], p(&dir));
    assert_eq!(report["config"]["tls_ca"], path("ca.pem"));
    assert_eq!(report["config"]["tls_cert"], path("server.pem"));
    assert_eq!(report["config"]["tls_key"], path("server-key.pem"));
    assert_eq!(report["server"]["identity"], "gamma");
    assert_eq!(report["server"]["names"], serde_json::json!(["gamma"]));
    assert_eq!(
        report["server"]["usages"],
        serde_json::json!(["server_auth", "client_auth"])
    );
    let clients = report["clients"].as_array().unwrap();
    assert_eq!(clients.len(), 2);
    assert_eq!(clients[0]["identity"], "alpha");
    assert_eq!(clients[0]["cert"], "client-alpha.pem");
    assert_eq!(clients[1]["key"], "client-beta-key.pem");
    assert_eq!(clients[1]["usages"], serde_json::json!(["client_auth"]));
    let files = report["files"].as_array().unwrap();
    assert_eq!(files.len(), 4 + 2 * 2 + 4);
    for f in files {
        let name = f["name"].as_str().unwrap();
        assert!(dir.join(name).is_file(), "{name}");
        let want = if name.ends_with("key.pem") {
            "0600"
        } else {
            "0644"
        };
        assert_eq!(f["mode"], want, "{name}");
    }
    assert!(report["ca"]["not_after"].as_str().unwrap().ends_with('Z'));
}

#[test]
fn bad_arguments_write_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let dir: PathBuf = tmp.path().join("tls");
    let d = p(&dir);
    fails_with(&["tls", "init", d, "--days", "0"], 2, "--days");
    fails_with(&["tls", "init", d, "--days", "soon"], 2, "--days");
    fails_with(&["tls", "init", d, "--host", "a b"], 2, "not a DNS name");
    fails_with(&["tls", "init", d, "--host", ""], 2, "not a DNS name");
    fails_with(&["tls", "init", d, "--client", "../x"], 2, "not a DNS name");
    fails_with(&["tls", "init", d, "--client", "10.0.0.1"], 2, "named");
    fails_with(&["tls", "init", d, "--client", "key"], 2, "reserved");
    fails_with(
        &["tls", "init", d, "--client", "a", "--client", "a"],
        2,
        "twice",
    );
    fails_with(&["tls", "init"], 2, "DIR");
    assert!(!dir.exists(), "nothing is written for a bad command line");
}

/// Every file of `dir`: name and bytes.
fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>)> {
    names(dir)
        .into_iter()
        .map(|name| {
            let bytes = read(&dir.join(&name));
            (name, bytes)
        })
        .collect()
}

/// Whether OpenSSL verifies `certs` against `ca` for `purpose`
/// (`sslserver`, `sslclient`).
fn verifies(ca: &Path, purpose: &str, certs: &[PathBuf]) -> bool {
    let mut args = vec!["verify", "-CAfile", p(ca), "-purpose", purpose];
    args.extend(certs.iter().map(|c| p(c)));
    tool("openssl", &args).status.success()
}

fn openssl_ext(cert: &Path, ext: &str) -> String {
    tool_ok("openssl", &["x509", "-noout", "-ext", ext, "-in", p(cert)])
}

/// `tls add` signs another host's server certificate and a client's with
/// the CA `tls init` made, writing four new files and changing none.
#[test]
fn add_signs_another_server_and_a_client_with_the_same_ca() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("tls");
    let d = |name: &str| dir.join(name);
    ok(&[
        "tls",
        "init",
        p(&dir),
        "--host",
        "beta",
        "--client",
        "admin",
    ]);
    let before = snapshot(&dir);

    let report = json(&[
        "--json",
        "tls",
        "add",
        p(&dir),
        "--server",
        "alpha",
        "--host",
        "10.0.0.1",
        "--host",
        "alpha.example",
        "--client",
        "backup",
        "--days",
        "30",
    ]);
    let added = [
        "client-backup-key.pem",
        "client-backup.pem",
        "server-alpha-key.pem",
        "server-alpha.pem",
    ];
    let mut want: Vec<String> = before.iter().map(|(n, _)| n.clone()).collect();
    want.extend(added.map(String::from));
    want.sort();
    assert_eq!(names(&dir), want);
    for (name, bytes) in &before {
        assert!(read(&d(name)) == *bytes, "{name} changed");
    }
    for name in added {
        let want = if name.ends_with("key.pem") {
            0o600
        } else {
            0o644
        };
        assert_eq!(mode(&d(name)), want, "{name}");
    }

    // What it says it made.
    let canonical = std::fs::canonicalize(&dir).unwrap();
    let path = |name: &str| canonical.join(name).to_str().unwrap().to_owned();
    assert_eq!(report["ca"]["identity"], "arbor CA (beta)");
    assert_eq!(report["server"]["identity"], "alpha");
    assert_eq!(
        report["server"]["names"],
        serde_json::json!(["alpha", "10.0.0.1", "alpha.example"])
    );
    assert_eq!(
        report["server"]["usages"],
        serde_json::json!(["server_auth", "client_auth"])
    );
    assert_eq!(report["clients"][0]["identity"], "backup");
    assert_eq!(
        report["clients"][0]["usages"],
        serde_json::json!(["client_auth"])
    );
    assert_eq!(report["config"]["tls_ca"], path("ca.pem"));
    assert_eq!(report["config"]["tls_cert"], path("server-alpha.pem"));
    assert_eq!(report["config"]["tls_key"], path("server-alpha-key.pem"));
    let files: Vec<&str> = report["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        files,
        [
            "server-alpha.pem",
            "server-alpha-key.pem",
            "client-backup.pem",
            "client-backup-key.pem"
        ]
    );

    // The same ca.pem verifies them, for what each is for.
    let ca = d("ca.pem");
    let (alpha, backup) = (d("server-alpha.pem"), d("client-backup.pem"));
    assert!(verifies(&ca, "sslserver", std::slice::from_ref(&alpha)));
    assert!(verifies(&ca, "sslclient", &[alpha.clone(), backup.clone()]));
    assert!(!verifies(&ca, "sslserver", std::slice::from_ref(&backup)));
    assert_eq!(
        openssl_ext(&alpha, "authorityKeyIdentifier"),
        openssl_ext(&d("server.pem"), "authorityKeyIdentifier"),
        "signed by the one CA key"
    );
    let server = openssl_text(&alpha);
    assert!(server.contains("Issuer: CN = arbor CA (beta)"), "{server}");
    assert!(server.contains("Subject: CN = alpha\n"), "{server}");
    assert!(
        server.contains("DNS:alpha, IP Address:10.0.0.1, DNS:alpha.example"),
        "{server}"
    );
    assert!(
        server.contains("TLS Web Server Authentication, TLS Web Client Authentication"),
        "{server}"
    );
    assert!(server.contains("CA:FALSE"), "{server}");
    assert_client_cert(&backup, "backup");
    for (cert, key) in [
        ("server-alpha.pem", "server-alpha-key.pem"),
        ("client-backup.pem", "client-backup-key.pem"),
    ] {
        assert_key_of(&dir, cert, key);
        let cert = d(cert);
        assert!(valid_for(&cert, 29) && !valid_for(&cert, 31), "--days 30");
    }

    // A client alone: its config keys, for people.
    let out = ok(&["tls", "add", p(&dir), "--client", "ops"]);
    assert!(
        out.contains(&format!("tls_cert = \"{}\"", path("client-ops.pem"))),
        "{out}"
    );
    assert!(out.contains("source = \"ops\""), "{out}");
    assert!(verifies(&ca, "sslclient", &[d("client-ops.pem")]));
}

/// What `tls add` cannot sign for, or would overwrite, is refused with
/// the directory unchanged: no CA, a name it has, a CA key that is not
/// ca.pem's, a ca.pem that is no CA, validity past the CA's.
#[test]
fn add_refuses_and_leaves_the_directory_unchanged() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("tls");
    let d = |name: &str| dir.join(name);
    ok(&["tls", "init", p(&dir), "--host", "beta"]);
    let other = tmp.path().join("other");
    ok(&["tls", "init", p(&other)]);

    // No CA: no directory (none is made), an empty one.
    let missing = tmp.path().join("missing");
    fails_with(
        &["tls", "add", p(&missing), "--client", "x"],
        2,
        "ca.pem is missing",
    );
    assert!(!missing.exists());
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    fails_with(
        &["tls", "add", p(&empty), "--server", "x"],
        2,
        "ca.pem is missing",
    );
    assert!(names(&empty).is_empty());

    // A name the directory has: nothing written, not even the new ones.
    let before = snapshot(&dir);
    fails_with(
        &[
            "tls",
            "add",
            p(&dir),
            "--server",
            "alpha",
            "--client",
            "admin",
        ],
        5,
        "client-admin.pem, client-admin-key.pem",
    );
    assert!(snapshot(&dir) == before);
    // --days past the CA's own expiry.
    fails_with(
        &["tls", "add", p(&dir), "--client", "x", "--days", "3651"],
        2,
        "goes past the CA's expiry",
    );
    // Command lines that make no sense.
    fails_with(&["tls", "add", p(&dir)], 2, "--server");
    fails_with(
        &["tls", "add", p(&dir), "--client", "x", "--host", "h"],
        2,
        "--server",
    );
    fails_with(&["tls", "add", p(&dir), "--server", "10.0.0.1"], 2, "named");
    fails_with(&["tls", "add", p(&dir), "--server", "key"], 2, "reserved");
    fails_with(&["tls", "add", p(&dir), "--client", "x-key"], 2, "reserved");
    fails_with(
        &["tls", "add", p(&dir), "--client", "a", "--client", "a"],
        2,
        "twice",
    );
    assert!(snapshot(&dir) == before);

    // A CA whose key is another CA's; a ca.pem that is no CA (a server
    // certificate and its own key); a ca.pem that is not a certificate.
    let bad = |name: &str, ca: &Path, key: &Path, message: &str| {
        let bad = tmp.path().join(name);
        std::fs::create_dir(&bad).unwrap();
        std::fs::copy(ca, bad.join("ca.pem")).unwrap();
        std::fs::copy(key, bad.join("ca-key.pem")).unwrap();
        let before = snapshot(&bad);
        fails_with(&["tls", "add", p(&bad), "--client", "x"], 2, message);
        assert!(snapshot(&bad) == before, "{name}");
    };
    bad(
        "mismatched",
        &d("ca.pem"),
        &other.join("ca-key.pem"),
        "is not the key of",
    );
    bad(
        "server",
        &d("server.pem"),
        &d("server-key.pem"),
        "not a CA certificate",
    );
    bad("key", &d("ca-key.pem"), &d("ca-key.pem"), "no certificate");

    // --force replaces the named certificate's files only.
    ok(&["tls", "add", p(&dir), "--client", "admin", "--force"]);
    for (name, bytes) in &before {
        let same = read(&d(name)) == *bytes;
        assert_eq!(same, !name.starts_with("client-admin"), "{name}");
    }
    assert_eq!(mode(&d("client-admin-key.pem")), 0o600);
    assert!(verifies(
        &d("ca.pem"),
        "sslclient",
        &[d("client-admin.pem")]
    ));
}

/// Two daemons replicate to each other over mutual TLS with one CA: alpha
/// with the server certificate `tls init` made, beta with the one `tls
/// add` made; each sees the other by its certificate's identity (what
/// failback needs: each host both a target and a source). Then beta's
/// certificate is revoked while beta streams to alpha: alpha's reload
/// ends that session at once, and beta cannot start another.
#[test]
fn added_server_certificates_carry_replication_both_ways() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("tls");
    ok(&["tls", "init", p(&dir), "--host", "alpha"]);
    ok(&[
        "tls",
        "add",
        p(&dir),
        "--server",
        "beta",
        "--host",
        "127.0.0.1",
    ]);
    let start = |host: &str, cert: &str, port: u16, peer: &str| {
        let config = tmp.path().join(format!("{host}.toml"));
        std::fs::write(
            &config,
            format!(
                "tls_ca = \"{}\"\ntls_cert = \"{}\"\ntls_key = \"{}\"\n\
                 replication_listen = \"127.0.0.1:{port}\"\n\
                 replication_allow = [{{ source = \"{peer}\", volumes = [\"*\"] }}]\n",
                p(&dir.join("ca.pem")),
                p(&dir.join(format!("{cert}.pem"))),
                p(&dir.join(format!("{cert}-key.pem"))),
            ),
        )
        .unwrap();
        Daemon::start(&["--config", p(&config), "--initial-volume", "none"])
    };
    let (alpha_port, beta_port) = (free_port(), free_port());
    let alpha = start("alpha", "server", alpha_port, "beta");
    let beta = start("beta", "server-beta", beta_port, "alpha");

    // alpha -> beta: beta is reached by an address its certificate has;
    // beta -> alpha: alpha's certificate names alpha only.
    for (source, volume, port, identity) in [
        (&alpha, "vm1", beta_port, "127.0.0.1"),
        (&beta, "vm2", alpha_port, "alpha"),
    ] {
        source.ok(&["volume", "create", volume, "--size", "4M"]);
        let target = format!("127.0.0.1:{port}");
        source.ok(&[
            "replica",
            "add",
            volume,
            "--target",
            &target,
            "--identity",
            identity,
            "--interval",
            "1h",
        ]);
        source.ok(&["replica", "run", volume]);
    }

    for (host, daemon, volume, source) in [
        ("alpha", &alpha, "vm2", "beta"),
        ("beta", &beta, "vm1", "alpha"),
    ] {
        let status = daemon.json(&["replica", "status"]);
        assert_eq!(status["identity"], host, "{status}");
        let replicas = status["replicas"].as_array().unwrap();
        assert!(
            replicas
                .iter()
                .any(|r| r["volume"] == volume && r["source"] == source),
            "{host} holds {volume} from {source}: {status}"
        );
    }

    // beta streams vm3 to alpha slowly (16 s at 2 MiB/s) ...
    beta.ok(&["volume", "create", "vm3", "--size", "32M"]);
    let data = random_file(tmp.path(), "vm3", 32 << 20, 43);
    nbdcopy(
        p(&data),
        &format!("nbd+unix:///vm3?socket={}", beta.nbd_socket()),
    );
    let alpha_target = format!("127.0.0.1:{alpha_port}");
    beta.ok(&[
        "replica",
        "add",
        "vm3",
        "--target",
        &alpha_target,
        "--identity",
        "alpha",
        "--interval",
        "1h",
        "--rate-limit",
        "2M",
    ]);
    let vm3 = |beta: &Daemon| {
        let status = beta.json(&["replica", "status"]);
        status["pairs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|pair| pair["volume"] == "vm3")
            .cloned()
            .unwrap()
    };
    wait_for("vm3 to stream", 60, || {
        (vm3(&beta)["cycle"]["stream_sent"].as_u64()? > (2 << 20)).then_some(())
    });
    // ... when its certificate is revoked and alpha reloads with the list.
    ok(&["tls", "revoke", p(&dir), "beta"]);
    let config = tmp.path().join("alpha.toml");
    let mut text = std::fs::read_to_string(&config).unwrap();
    text += &format!("tls_crl = \"{}\"\n", p(&dir.join("crl.pem")));
    std::fs::write(&config, text).unwrap();
    let view = alpha.json(&["config", "reload"]);
    let withdrawn = view["withdrawn_replications"].as_array().unwrap();
    assert_eq!(withdrawn.len(), 1, "{view}");
    assert_eq!(withdrawn[0]["identity"], "beta", "{view}");
    assert_eq!(withdrawn[0]["volume"], "vm3", "{view}");
    assert!(
        withdrawn[0]["reason"]
            .as_str()
            .unwrap()
            .contains("certificate is no longer trusted"),
        "{view}"
    );
    let pair = wait_for("the cycle to end", 60, || {
        let pair = vm3(&beta);
        (pair["state"] != "running").then_some(pair)
    });
    assert_eq!(pair["cycles_ok"], 0, "the cycle ran to its end: {pair}");
    assert_eq!(pair["error_kind"], "not_allowed", "{pair}");
    assert!(pair["cycle"]["stream_sent"].as_u64().unwrap_or(0) < (32 << 20));
    // A revoked certificate does not get through the handshake again.
    let again = arbor(&beta.args(&["replica", "run", "vm3"]));
    assert!(!again.status.success());
}
