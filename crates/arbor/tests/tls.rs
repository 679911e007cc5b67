//! `arbor tls init` end to end: the files it writes, checked by OpenSSL,
//! and used by real NBD tools (nbdkit, nbdinfo, qemu-img) through the
//! GnuTLS names. (That arbor's own replication TLS accepts them is a unit
//! test in src/tls_init.rs.)

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;

fn openssl_text(cert: &Path) -> String {
    tool_ok("openssl", &["x509", "-noout", "-text", "-in", p(cert)])
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
        let client = openssl_text(&d(&format!("client-{name}.pem")));
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

    // Each key belongs to its certificate.
    for (cert, key) in [
        ("ca.pem", "ca-key.pem"),
        ("server.pem", "server-key.pem"),
        ("client-alpha.pem", "client-alpha-key.pem"),
        ("client-cert.pem", "client-key.pem"),
    ] {
        let from_cert = tool_ok(
            "openssl",
            &["x509", "-noout", "-pubkey", "-in", p(&d(cert))],
        );
        let from_key = tool_ok("openssl", &["pkey", "-pubout", "-in", p(&d(key))]);
        assert_eq!(from_cert, from_key, "{key} is {cert}'s key");
    }

    // Validity: --days for the leaves, ten years for the CA; random
    // serials.
    let checkend = |cert: &str, days: u64| {
        let secs = (days * 86_400).to_string();
        tool(
            "openssl",
            &["x509", "-noout", "-checkend", &secs, "-in", p(&d(cert))],
        )
        .status
        .success()
    };
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
