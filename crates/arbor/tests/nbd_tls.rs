//! NBD over TLS (`NBD_OPT_STARTTLS`) with real clients: libnbd's nbdinfo and
//! nbdcopy, qemu-img and qemu-io with `tls-creds-x509`, against a daemon
//! whose certificates `arbor tls init` made; per-identity grants; the
//! refusals the spec asks for; and clients that abuse the TLS handshake.
//! (`tests/tls.rs` checks the same files against `nbdkit --tls=require`.)
// A test crate: unwrap, expect and panic are how a test reports failure
// (the workspace denies them in the code it ships; clippy.toml allows
// them in #[test] functions, this in the helpers around them).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;

use common::{
    free_port, p, random_file, stderr, stdout, tool as run, tool_ok as run_ok, Daemon, HANG_GUARD,
};

const MIB: u64 = 1 << 20;

const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
const OPT_EXPORT_NAME: u32 = 1;
const OPT_LIST: u32 = 3;
const OPT_STARTTLS: u32 = 5;
const REP_ACK: u32 = 1;
const REP_ERR_TLS_REQD: u32 = (1 << 31) | 5;

/// Certificates from `arbor tls init`, and one directory per client in the
/// layout GnuTLS clients read (`ca-cert.pem`, `client-cert.pem`,
/// `client-key.pem`): `alpha`, `beta`, and `anonymous` (the CA alone).
struct Certificates {
    dir: PathBuf,
    _tmp: tempfile::TempDir,
}

impl Certificates {
    fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("tls");
        common::ok(&[
            "tls",
            "init",
            p(&dir),
            "--client",
            "alpha",
            "--client",
            "beta",
        ]);
        for client in ["alpha", "beta", "anonymous"] {
            let own = tmp.path().join(client);
            std::fs::create_dir(&own).unwrap();
            std::fs::copy(dir.join("ca.pem"), own.join("ca-cert.pem")).unwrap();
            if client != "anonymous" {
                let cert = dir.join(format!("client-{client}.pem"));
                let key = dir.join(format!("client-{client}-key.pem"));
                std::fs::copy(cert, own.join("client-cert.pem")).unwrap();
                std::fs::copy(key, own.join("client-key.pem")).unwrap();
            }
        }
        Self { dir, _tmp: tmp }
    }

    /// The directory a client gives as `tls-certificates=`.
    fn client(&self, name: &str) -> PathBuf {
        self.dir.parent().unwrap().join(name)
    }

    /// Replaces the server's key by the test key `file` (made by
    /// OpenSSL or GnuTLS, crates/arbor-tls/tests/keys) and its
    /// certificate by one for that key, issued by `openssl x509` under
    /// the same CA.
    fn use_server_key(&self, file: &str) {
        let d = |name: &str| self.dir.join(name);
        let fixture = format!(
            "{}/../arbor-tls/tests/keys/{file}",
            env!("CARGO_MANIFEST_DIR")
        );
        let (key, csr, ext, cert) = (
            d("server-key.pem"),
            d("server.csr"),
            d("server.ext"),
            d("server.pem"),
        );
        std::fs::write(&key, std::fs::read(&fixture).unwrap()).unwrap();
        std::fs::write(&ext, "subjectAltName=DNS:localhost\n").unwrap();
        let subject = ["-subj", "/CN=localhost"];
        run_ok(
            "openssl",
            &[
                &["req", "-new", "-key", p(&key), "-out", p(&csr)][..],
                &subject,
            ]
            .concat(),
        );
        run_ok(
            "openssl",
            &[
                "x509",
                "-req",
                "-in",
                p(&csr),
                "-CA",
                p(&d("ca.pem")),
                "-CAkey",
                p(&d("ca-key.pem")),
                "-days",
                "2",
                "-extfile",
                p(&ext),
                "-out",
                p(&cert),
            ],
        );
    }

    fn config(&self, extra: &str) -> String {
        format!(
            "tls_ca = \"{}\"\ntls_cert = \"{}\"\ntls_key = \"{}\"\n{extra}",
            p(&self.dir.join("ca.pem")),
            p(&self.dir.join("server.pem")),
            p(&self.dir.join("server-key.pem")),
        )
    }
}

/// A daemon serving NBD on a loopback TCP port in `mode`, with grants:
/// alpha writes `vm*`, beta reads `vm`, anonymous clients read `public`;
/// `secret` is granted to nobody. Volumes: vm, vm2, public, secret.
struct TlsDaemon {
    daemon: Daemon,
    port: u16,
    certs: Certificates,
}

impl TlsDaemon {
    fn start(mode: &str, extra: &str) -> Self {
        Self::start_with(Certificates::new(), mode, extra)
    }

    fn start_with(certs: Certificates, mode: &str, extra: &str) -> Self {
        let port = free_port();
        let config = certs.config(&format!(
            "nbd_tls = \"{mode}\"\n{extra}\nnbd_access = [\
             {{ identity = \"alpha\", volumes = [\"vm*\"], access = \"write\" }}, \
             {{ identity = \"beta\", volumes = [\"vm\"], access = \"read\" }}, \
             {{ identity = \"anonymous\", volumes = [\"public\"], access = \"read\" }}]\n"
        ));
        let file = certs.dir.parent().unwrap().join("arbor.toml");
        std::fs::write(&file, config).unwrap();
        let listen = format!("127.0.0.1:{port}");
        let daemon = Daemon::start(&["--config", p(&file), "--nbd-listen", &listen]);
        for volume in ["vm", "vm2", "public", "secret"] {
            daemon.ok(&["volume", "create", volume, "--size", "8M"]);
        }
        Self {
            daemon,
            port,
            certs,
        }
    }

    fn uri(&self, volume: &str, client: &str) -> String {
        format!(
            "nbds://localhost:{}/{volume}?tls-certificates={}",
            self.port,
            p(&self.certs.client(client))
        )
    }

    fn plain_uri(&self, volume: &str) -> String {
        format!("nbd://localhost:{}/{volume}", self.port)
    }

    fn unix_uri(&self, volume: &str) -> String {
        format!("nbd+unix:///{volume}?socket={}", self.daemon.nbd_socket())
    }

    /// qemu's `tls-creds-x509` object and image options for `volume`.
    fn qemu_args(&self, volume: &str, client: &str) -> [String; 4] {
        [
            "--object".into(),
            format!(
                "tls-creds-x509,id=tls0,endpoint=client,dir={}",
                p(&self.certs.client(client))
            ),
            "--image-opts".into(),
            format!(
                "driver=nbd,host=localhost,port={},export={volume},tls-creds=tls0,tls-hostname=localhost",
                self.port
            ),
        ]
    }

    fn listed(&self, client: &str) -> Vec<String> {
        let out = run_ok(
            "nbdinfo",
            &[
                "--list",
                "--json",
                &format!(
                    "nbds://localhost:{}/?tls-certificates={}",
                    self.port,
                    p(&self.certs.client(client))
                ),
            ],
        );
        let json: serde_json::Value = serde_json::from_str(&out).unwrap();
        let mut names: Vec<String> = json["exports"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["export-name"].as_str().unwrap().to_owned())
            .collect();
        names.sort();
        names
    }
}

/// The NBD reference suite's server key, RSA of 2432 bits (PKCS#1 from
/// `openssl genrsa -traditional`; GnuTLS and OpenSSL servers take it), was
/// refused at start ("failed to parse private key as RSA, ECDSA, or
/// EdDSA"). With it the daemon serves a GnuTLS client (nbdinfo).
#[test]
fn a_2432_bit_rsa_server_key_serves_gnutls_clients() {
    let certs = Certificates::new();
    certs.use_server_key("rsa-2432-pkcs1.pem");
    let server = TlsDaemon::start_with(certs, "require", "");
    let size = run_ok("nbdinfo", &["--size", &server.uri("public", "anonymous")]);
    assert_eq!(size.trim(), (8 * MIB).to_string());
}

#[test]
fn real_clients_read_and_write_through_tls_as_their_identity_allows() {
    let server = TlsDaemon::start("require", "");
    let tmp = tempfile::tempdir().unwrap();

    // Each client sees only what it is granted.
    assert_eq!(server.listed("alpha"), ["vm", "vm2"]);
    assert_eq!(server.listed("beta"), ["vm"]);
    assert_eq!(server.listed("anonymous"), ["public"]);

    // nbdcopy writes through TLS; what the Unix socket then reads is
    // byte-identical, and so is what TLS reads back.
    let source = random_file(tmp.path(), "source", 8 * MIB, 7);
    run_ok(
        "nbdcopy",
        &["--flush", p(&source), &server.uri("vm2", "alpha")],
    );
    let via_unix = tmp.path().join("via-unix");
    let via_tls = tmp.path().join("via-tls");
    run_ok("nbdcopy", &[&server.unix_uri("vm2"), p(&via_unix)]);
    run_ok("nbdcopy", &[&server.uri("vm2", "alpha"), p(&via_tls)]);
    let expected = std::fs::read(&source).unwrap();
    assert!(
        std::fs::read(&via_unix).unwrap() == expected,
        "Unix copy differs"
    );
    assert!(
        std::fs::read(&via_tls).unwrap() == expected,
        "TLS copy differs"
    );

    // qemu-io with tls-creds-x509: a pattern written, read back, and seen
    // over the Unix socket.
    let alpha = server.qemu_args("vm", "alpha");
    let mut args: Vec<&str> = alpha.iter().map(String::as_str).collect();
    args.extend([
        "-c",
        "write -P 0x5a 1M 64k",
        "-c",
        "read -P 0x5a 1M 64k",
        "-c",
        "flush",
    ]);
    let out = run_ok("qemu-io", &args);
    assert!(!out.contains("Pattern verification failed"), "{out}");
    let copy = tmp.path().join("vm");
    run_ok("nbdcopy", &[&server.unix_uri("vm"), p(&copy)]);
    let vm = std::fs::read(&copy).unwrap();
    assert!(vm[MIB as usize..(MIB + 65536) as usize]
        .iter()
        .all(|&b| b == 0x5a));

    // qemu-img reports the size through TLS.
    let alpha = server.qemu_args("vm", "alpha");
    let mut args = vec!["info", "--output=json"];
    args.extend(alpha.iter().map(String::as_str));
    let info: serde_json::Value = serde_json::from_str(&run_ok("qemu-img", &args)).unwrap();
    assert_eq!(info["virtual-size"], 8 * MIB);

    // beta may read vm but not write it: the export is read-only to it.
    let beta = server.qemu_args("vm", "beta");
    let mut args: Vec<&str> = vec!["-r"];
    args.extend(beta.iter().map(String::as_str));
    args.extend(["-c", "read -P 0x5a 1M 64k"]);
    let out = run_ok("qemu-io", &args);
    assert!(!out.contains("Pattern verification failed"), "{out}");
    let mut args: Vec<&str> = beta.iter().map(String::as_str).collect();
    args.extend(["-c", "write -P 0x11 0 4k"]);
    let out = run("qemu-io", &args);
    let text = format!("{}{}", stdout(&out), stderr(&out));
    assert!(
        !out.status.success()
            || text.contains("Operation not permitted")
            || text.contains("read-only")
            || text.contains("Read-only"),
        "beta wrote to vm: {text}"
    );
    run_ok("nbdcopy", &[&server.unix_uri("vm"), p(&copy)]);
    assert!(
        std::fs::read(&copy).unwrap()[..4096]
            .iter()
            .all(|&b| b == 0),
        "beta's write landed"
    );

    // An anonymous TLS client reads what anonymous clients are granted.
    let size = run_ok("nbdinfo", &["--size", &server.uri("public", "anonymous")]);
    assert_eq!(size.trim(), (8 * MIB).to_string());
}

#[test]
fn clients_are_refused_as_the_spec_and_the_grants_say() {
    let server = TlsDaemon::start("require", "");
    // Hidden exports cannot be opened, whoever asks.
    for (volume, client) in [("vm2", "beta"), ("secret", "alpha"), ("vm", "anonymous")] {
        let out = run("nbdinfo", &["--size", &server.uri(volume, client)]);
        assert!(!out.status.success(), "{client} opened {volume}");
    }
    // A plaintext client gets nowhere in require mode.
    let out = run("nbdinfo", &["--size", &server.plain_uri("public")]);
    assert!(!out.status.success(), "plaintext client served");

    // Certificates from another CA are refused at the TLS handshake.
    let other = tempfile::tempdir().unwrap();
    let other_dir = other.path().join("tls");
    common::ok(&["tls", "init", p(&other_dir), "--client", "alpha"]);
    let out = run(
        "nbdinfo",
        &[
            "--size",
            &format!(
                "nbds://localhost:{}/vm?tls-certificates={}",
                server.port,
                p(&other_dir)
            ),
        ],
    );
    assert!(
        !out.status.success(),
        "a certificate from another CA was accepted"
    );

    // The spec's FORCEDTLS answers, on the wire.
    let mut raw = Raw::greet(server.port);
    raw.option(OPT_LIST, &[]);
    assert_eq!(raw.reply().1, REP_ERR_TLS_REQD);
    raw.option(OPT_EXPORT_NAME, b"public");
    assert!(raw.closed(), "EXPORT_NAME before TLS must end the session");
}

#[test]
fn selective_tls_serves_plaintext_clients_what_needs_no_certificate() {
    let server = TlsDaemon::start("on", "");
    // Anonymous plaintext: the public volume, and TLS_REQD for those only
    // certificate holders are granted.
    let size = run_ok("nbdinfo", &["--size", &server.plain_uri("public")]);
    assert_eq!(size.trim(), (8 * MIB).to_string());
    assert!(!run("nbdinfo", &["--size", &server.plain_uri("vm")])
        .status
        .success());
    // The same client upgrading with a certificate gets its grants.
    let size = run_ok("nbdinfo", &["--size", &server.uri("vm", "alpha")]);
    assert_eq!(size.trim(), (8 * MIB).to_string());
}

/// A raw NBD client on TCP for what real clients never send.
struct Raw(TcpStream);

impl Raw {
    fn greet(port: u16) -> Self {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
        stream.set_read_timeout(Some(HANG_GUARD)).unwrap();
        let mut greeting = [0u8; 18];
        stream.read_exact(&mut greeting).unwrap();
        assert_eq!(&greeting[..8], b"NBDMAGIC");
        stream.write_all(&3u32.to_be_bytes()).unwrap();
        Self(stream)
    }

    fn option(&mut self, code: u32, data: &[u8]) {
        let mut out = IHAVEOPT.to_be_bytes().to_vec();
        out.extend_from_slice(&code.to_be_bytes());
        out.extend_from_slice(&(data.len() as u32).to_be_bytes());
        out.extend_from_slice(data);
        // The server may already have closed (what some tests check).
        let _ = self.0.write_all(&out);
    }

    /// (option, reply type) of the next option reply; its data is skipped.
    fn reply(&mut self) -> (u32, u32) {
        let mut header = [0u8; 20];
        self.0.read_exact(&mut header).unwrap();
        let word = |i: usize| u32::from_be_bytes(header[i..i + 4].try_into().unwrap());
        let mut data = vec![0u8; word(16) as usize];
        self.0.read_exact(&mut data).unwrap();
        (word(8), word(12))
    }

    /// True once the server has closed the connection.
    fn closed(&mut self) -> bool {
        let mut byte = [0u8; 1];
        matches!(self.0.read(&mut byte), Ok(0) | Err(_))
    }
}

fn peak_memory(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .expect("VmHWM in /proc/PID/status");
    line.split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<u64>()
        .unwrap()
        * 1024
}

#[test]
fn hostile_tls_clients_cannot_keep_polite_ones_out_or_grow_memory() {
    // Few slots, and a handshake timeout far beyond the test: only the
    // server dropping stalled handshakes can let the polite client in.
    let server = TlsDaemon::start("require", "nbd_max_connections = 8\n");
    let pid = server.daemon.pid();
    let idle = peak_memory(pid);
    let mut held = Vec::new();
    for round in 0..200 {
        let mut raw = Raw::greet(server.port);
        raw.option(OPT_STARTTLS, &[]);
        assert_eq!(raw.reply(), (OPT_STARTTLS, REP_ACK));
        match round % 3 {
            // Garbage where the ClientHello belongs: the server hangs up.
            0 => {
                let _ = raw.0.write_all(&[0x16, 0x03, 0x01, 0xff, 0xff]);
                let _ = raw.0.write_all(&[0xab; 4096]);
                held.push(raw);
            }
            // Half a ClientHello, then silence.
            1 => {
                let _ = raw.0.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00]);
                held.push(raw);
            }
            // Nothing at all after the ACK.
            _ => held.push(raw),
        }
    }
    // Every abuser is still connected or was dropped; a polite client is
    // served now, not after the handshake timeout.
    let size = run_ok("nbdinfo", &["--size", &server.uri("vm", "alpha")]);
    assert_eq!(size.trim(), (8 * MIB).to_string());
    let tmp = tempfile::tempdir().unwrap();
    let copy = tmp.path().join("copy");
    run_ok("nbdcopy", &[&server.uri("vm", "alpha"), p(&copy)]);
    let peak = peak_memory(pid);
    assert!(
        peak < idle + 64 * MIB,
        "peak memory {} MiB over an idle {} MiB",
        peak / MIB,
        idle / MIB
    );
    drop(held);
}

/// A client that holds one NBD connection open and runs `read` and
/// `write` on it when told (python3-libnbd): what a reload may close.
struct Held {
    child: std::process::Child,
    input: std::process::ChildStdin,
    output: std::io::BufReader<std::process::ChildStdout>,
}

const HELD_CLIENT: &str = r#"
import sys, nbd
h = nbd.NBD()
h.set_uri_allow_local_file(True)
h.connect_uri(sys.argv[1])
print("connected", "read-only" if h.is_read_only() else "writable", flush=True)
for line in sys.stdin:
    try:
        if line.strip() == "read":
            h.pread(4096, 0)
        else:
            h.pwrite(b"\x07" * 4096, 0)
            h.flush()
        print("ok", flush=True)
    except nbd.Error as e:
        print("error", e, flush=True)
"#;

impl Held {
    fn connect(uri: &str) -> (Self, String) {
        use std::io::BufRead;
        use std::process::{Command, Stdio};
        let mut child = Command::new("/usr/bin/python3")
            .args(["-c", HELD_CLIENT, uri])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let input = child.stdin.take().unwrap();
        let mut output = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut first = String::new();
        output.read_line(&mut first).unwrap();
        assert!(first.starts_with("connected"), "{uri}: {first:?}");
        (
            Self {
                child,
                input,
                output,
            },
            first.trim().to_owned(),
        )
    }

    /// Runs `command` (`read` or `write`): "ok", or "error ...".
    fn run(&mut self, command: &str) -> String {
        use std::io::BufRead;
        writeln!(self.input, "{command}").unwrap();
        self.input.flush().unwrap();
        let mut line = String::new();
        self.output.read_line(&mut line).unwrap();
        line.trim().to_owned()
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl TlsDaemon {
    fn config_file(&self) -> PathBuf {
        self.certs.dir.parent().unwrap().join("arbor.toml")
    }

    /// Writes the config file with `mode`, `extra` keys and `grants`.
    fn rewrite(&self, mode: &str, extra: &str, grants: &str) {
        let config = self.certs.config(&format!(
            "nbd_tls = \"{mode}\"\n{extra}\nnbd_access = [{grants}]\n"
        ));
        std::fs::write(self.config_file(), config).unwrap();
    }

    fn reload(&self) -> serde_json::Value {
        self.daemon.json(&["config", "reload"])
    }
}

const GRANTS: &str = "{ identity = \"alpha\", volumes = [\"vm*\"], access = \"write\" }, \
     { identity = \"beta\", volumes = [\"vm\"], access = \"read\" }, \
     { identity = \"anonymous\", volumes = [\"public\"], access = \"read\" }";

/// `arbor config reload`: grants taken away close the sessions that used
/// them (a writer that may now only read, an identity revoked by a
/// revocation list) and keep the others; an invalid configuration changes
/// nothing and says why; a restart-only key is named, not applied;
/// SIGHUP reloads as well.
#[test]
fn a_reload_closes_the_sessions_it_no_longer_grants_and_keeps_the_rest() {
    let server = TlsDaemon::start("require", "");
    let (mut alpha, how) = Held::connect(&server.uri("vm", "alpha"));
    assert_eq!(how, "connected writable");
    let (mut beta, how) = Held::connect(&server.uri("vm", "beta"));
    assert_eq!(how, "connected read-only");
    assert_eq!(alpha.run("write"), "ok");
    assert_eq!(beta.run("read"), "ok");

    // Nothing changed: nothing closed.
    let view = server.reload();
    assert_eq!(view["changed"], serde_json::json!([]), "{view}");
    assert_eq!(view["closed_sessions"], serde_json::json!([]), "{view}");
    assert_eq!(view["tls_reloaded"], true);

    // alpha may now only read: its writable session is closed, beta's
    // stays; a new alpha session is read-only.
    server.rewrite(
        "require",
        "",
        &GRANTS.replace(
            "volumes = [\"vm*\"], access = \"write\"",
            "volumes = [\"vm*\"], access = \"read\"",
        ),
    );
    let view = server.reload();
    assert_eq!(view["changed"], serde_json::json!(["nbd_access"]), "{view}");
    let closed = view["closed_sessions"].as_array().unwrap();
    assert_eq!(closed.len(), 1, "{view}");
    assert_eq!(closed[0]["identity"], "alpha");
    assert_eq!(closed[0]["volume"], "vm");
    assert!(
        closed[0]["reason"]
            .as_str()
            .unwrap()
            .contains("may now only read vm"),
        "{view}"
    );
    assert!(alpha.run("read").starts_with("error"), "alpha still served");
    assert_eq!(beta.run("read"), "ok");
    let (mut alpha, how) = Held::connect(&server.uri("vm", "alpha"));
    assert_eq!(how, "connected read-only");
    assert_eq!(alpha.run("read"), "ok");

    // An invalid configuration: refused, nothing changed, sessions kept.
    server.rewrite(
        "require",
        "",
        &GRANTS.replace("\"read\" }", "\"readonly\" }"),
    );
    server.daemon.fails(
        &["config", "reload"],
        2,
        "the configuration was not reloaded, nothing changed",
    );
    std::fs::write(server.config_file(), "nbd_tls = [").unwrap();
    server
        .daemon
        .fails(&["config", "reload"], 2, "not valid TOML");
    assert_eq!(alpha.run("read"), "ok");
    assert_eq!(beta.run("read"), "ok");
    assert_eq!(server.listed("alpha"), ["vm", "vm2"]);

    // beta's certificate revoked: its session is closed, it cannot
    // connect again, alpha is untouched. A restart-only key is named.
    common::ok(&["tls", "revoke", p(&server.certs.dir), "beta"]);
    let crl = server.certs.dir.join("crl.pem");
    server.rewrite(
        "require",
        &format!("tls_crl = \"{}\"\nnbd_max_connections = 17", p(&crl)),
        &GRANTS.replace(
            "volumes = [\"vm*\"], access = \"write\"",
            "volumes = [\"vm*\"], access = \"read\"",
        ),
    );
    let view = server.reload();
    assert_eq!(view["changed"], serde_json::json!(["tls_crl"]), "{view}");
    assert_eq!(view["revoked_certificates"], 1, "{view}");
    let closed = view["closed_sessions"].as_array().unwrap();
    assert_eq!(closed.len(), 1, "{view}");
    assert_eq!(closed[0]["identity"], "beta");
    assert!(
        closed[0]["reason"].as_str().unwrap().contains("revoked"),
        "{view}"
    );
    let restart = view["restart_needed"].as_array().unwrap();
    assert_eq!(restart.len(), 1, "{view}");
    assert!(
        restart[0]
            .as_str()
            .unwrap()
            .starts_with("nbd_max_connections: 256 -> 17"),
        "{view}"
    );
    assert!(beta.run("read").starts_with("error"), "beta still served");
    let out = run("nbdinfo", &["--size", &server.uri("vm", "beta")]);
    assert!(!out.status.success(), "a revoked certificate connected");
    assert_eq!(alpha.run("read"), "ok");

    // SIGHUP (systemctl reload): the anonymous grant taken away.
    assert_eq!(server.listed("anonymous"), ["public"]);
    server.rewrite(
        "require",
        &format!("tls_crl = \"{}\"", p(&crl)),
        "{ identity = \"alpha\", volumes = [\"vm*\"], access = \"read\" }",
    );
    let hup = std::process::Command::new("kill")
        .args(["-HUP", &server.daemon.pid().to_string()])
        .status()
        .unwrap();
    assert!(hup.success());
    let deadline = std::time::Instant::now() + HANG_GUARD;
    while !server.listed("anonymous").is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "SIGHUP did not reload"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // The daemon runs on, and alpha with it.
    assert_eq!(alpha.run("read"), "ok");
    assert_eq!(server.listed("alpha"), ["vm", "vm2"]);
}
