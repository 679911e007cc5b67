//! The API over TCP (docs/SECURITY.md): HTTPS with certificates from `arbor
//! tls init`, bearer tokens with scopes, client certificates by identity,
//! and the CLI's `--api`. Every daemon here is real; the HTTPS client is
//! rustls (through arbor-tls), so a refused handshake is seen as such.
// A test crate: unwrap, expect and panic are how a test reports failure
// (the workspace denies them in the code it ships; clippy.toml allows
// them in #[test] functions, this in the helpers around them).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Two CAs made by `arbor tls init`: ours (a server certificate for
/// localhost and 127.0.0.1, clients `ops`, `monitor`, `stranger`) and
/// another (client `intruder`).
struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let ours = dir.path().join("ours");
        let other = dir.path().join("other");
        ok(&[
            "tls",
            "init",
            p(&ours),
            "--client",
            "ops",
            "--client",
            "monitor",
            "--client",
            "stranger",
        ]);
        ok(&["tls", "init", p(&other), "--client", "intruder"]);
        Self { dir }
    }

    fn ours(&self, name: &str) -> PathBuf {
        self.dir.path().join("ours").join(name)
    }

    fn ca(&self) -> PathBuf {
        self.ours("ca.pem")
    }

    /// `client-NAME.pem` and its key, from our CA or (intruder) the other.
    fn client(&self, name: &str) -> (PathBuf, PathBuf) {
        let ca = if name == "intruder" { "other" } else { "ours" };
        let dir = self.dir.path().join(ca);
        (
            dir.join(format!("client-{name}.pem")),
            dir.join(format!("client-{name}-key.pem")),
        )
    }

    /// A config serving the API with TLS: `ops` may do anything,
    /// `monitor` read; `stranger` is from our CA but not listed.
    fn config(&self) -> PathBuf {
        let path = self.dir.path().join("arbor.toml");
        std::fs::write(
            &path,
            format!(
                "tls_ca = {:?}\ntls_cert = {:?}\ntls_key = {:?}\n\
                 api_clients = [{{ identity = \"ops\", scope = \"admin\" }}, \
                 {{ identity = \"monitor\", scope = \"read\" }}]\n",
                self.ca(),
                self.ours("server.pem"),
                self.ours("server-key.pem"),
            ),
        )
        .unwrap();
        path
    }
}

/// A daemon with the API on 127.0.0.1:PORT over HTTPS.
fn tls_daemon(pki: &Pki) -> (Daemon, u16) {
    let port = free_port();
    let config = pki.config();
    let daemon = Daemon::start(&[
        "--config",
        p(&config),
        "--api-listen",
        &format!("127.0.0.1:{port}"),
        "--initial-volume-size",
        "16M",
    ]);
    (daemon, port)
}

/// A token made through the daemon's Unix socket, written to a file of
/// mode 0600 in its data directory; returns the file and the token.
fn make_token(daemon: &Daemon, name: &str, scope: &str) -> (PathBuf, String) {
    let out = daemon.ok(&["token", "create", name, "--scope", scope]);
    let token = out.trim().to_owned();
    assert!(token.starts_with("arbor_"), "{out}");
    let path = daemon.path(&format!("{name}.token"));
    std::fs::write(&path, format!("{token}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    (path, token)
}

/// An HTTP answer: status, headers (lower-case names), body.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: String,
    body: String,
}

impl Answer {
    fn code(&self) -> String {
        serde_json::from_str::<Value>(&self.body)
            .ok()
            .and_then(|v| v["code"].as_str().map(str::to_owned))
            .unwrap_or_default()
    }
}

fn parse_answer(raw: &[u8]) -> Answer {
    let text = String::from_utf8_lossy(raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {text:?}"));
    Answer {
        status,
        headers: head.to_lowercase(),
        body: body.to_owned(),
    }
}

/// One HTTPS request to 127.0.0.1:`port` (server name `localhost`),
/// verifying the server against `ca`, presenting `client` if given, with
/// `token` as a bearer token if given. Err: the TLS connection failed or
/// ended without an answer.
fn https(
    port: u16,
    ca: &Path,
    client: Option<(PathBuf, PathBuf)>,
    token: Option<&str>,
    method: &str,
    path: &str,
    body: &str,
) -> Result<Answer, String> {
    let connector = arbor_tls::client_connector(&arbor_tls::ClientFiles {
        ca: ca.to_owned(),
        identity: client,
    })
    .unwrap();
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost:{port}\r\n{auth}Connection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let name = arbor_tls::server_name("localhost").unwrap();
        let mut tls = connector
            .connect(name, tcp)
            .await
            .map_err(|e| format!("handshake: {e}"))?;
        tls.write_all(request.as_bytes())
            .await
            .map_err(|e| format!("write: {e}"))?;
        let mut raw = Vec::new();
        let read = tls.read_to_end(&mut raw).await;
        if raw.is_empty() {
            return Err(format!("no answer: {read:?}"));
        }
        Ok(parse_answer(&raw))
    })
}

/// The same over plain TCP. The request goes out a byte per write, as a
/// slow client may send it: the HTTPS listener's refusal must read its head
/// whole before answering, or its close resets the connection under the
/// writes still to come (a broken pipe here).
fn plain(port: u16, token: Option<&str>, method: &str, path: &str) -> Answer {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream.set_nodelay(true).unwrap();
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{auth}Connection: close\r\n\r\n"
    );
    for byte in request.as_bytes() {
        stream.write_all(std::slice::from_ref(byte)).unwrap();
    }
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).unwrap();
    parse_answer(&raw)
}

fn names(daemon: &Daemon) -> Vec<String> {
    daemon
        .json(&["volume", "list"])
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn https_only_and_credentials_on_every_request_but_the_page() {
    let pki = Pki::new();
    let (daemon, port) = tls_daemon(&pki);
    let ca = pki.ca();

    // Plain HTTP to the HTTPS listener gets nothing but a pointer to https.
    let answer = plain(port, None, "GET", "/v1/volumes");
    assert_eq!(answer.status, 400, "{answer:?}");
    assert!(answer.body.contains("https://"), "{answer:?}");
    assert!(!answer.body.contains("disk0"), "{answer:?}");

    // HTTPS without credentials: 401 with the Bearer challenge.
    for path in ["/v1/volumes", "/metrics", "/v1/overview", "/v1/tokens"] {
        let answer = https(port, &ca, None, None, "GET", path, "").unwrap();
        assert_eq!(answer.status, 401, "{path}: {answer:?}");
        assert_eq!(answer.code(), "unauthorized", "{path}");
        assert!(
            answer.headers.contains("www-authenticate: bearer"),
            "{path}: {answer:?}"
        );
    }
    let answer = https(port, &ca, None, None, "DELETE", "/v1/volumes/disk0", "").unwrap();
    assert_eq!(answer.status, 401, "{answer:?}");
    // A token that is not one, and a header that is not Bearer.
    let answer = https(port, &ca, None, Some("hunter2"), "GET", "/v1/volumes", "").unwrap();
    assert_eq!(answer.status, 401, "{answer:?}");
    assert!(answer.headers.contains("invalid_token"), "{answer:?}");
    assert_eq!(names(&daemon), ["disk0"], "nothing changed");

    // The dashboard's page is static: served without credentials (its data
    // calls need them), with its content security policy.
    let answer = https(port, &ca, None, None, "GET", "/", "").unwrap();
    assert_eq!(answer.status, 200, "{answer:?}");
    assert!(
        answer.body.contains("auth-token"),
        "the page has a token form"
    );
    assert!(
        answer
            .headers
            .contains("content-security-policy: default-src 'none'"),
        "{}",
        answer.headers
    );
    let answer = https(port, &ca, None, None, "POST", "/", "").unwrap();
    assert_eq!(answer.status, 401, "{answer:?}");
}

/// The issue's test: a token without admin scope cannot destroy; an admin
/// token can; a revoked token is refused.
#[test]
fn a_read_token_cannot_destroy_and_an_admin_token_can() {
    let pki = Pki::new();
    let (daemon, port) = tls_daemon(&pki);
    let ca = pki.ca();
    let (_, read) = make_token(&daemon, "watcher", "read");
    let (_, admin) = make_token(&daemon, "root", "admin");
    let get = |token: &str, path: &str| https(port, &ca, None, Some(token), "GET", path, "");

    let answer = get(&read, "/v1/volumes").unwrap();
    assert_eq!(answer.status, 200, "{answer:?}");
    assert!(answer.body.contains("\"disk0\""), "{answer:?}");
    let answer = get(&read, "/metrics").unwrap();
    assert_eq!(answer.status, 200, "{answer:?}");
    assert!(
        answer.body.contains("arbor_pool_capacity_bytes"),
        "{answer:?}"
    );
    assert_eq!(get(&read, "/v1/overview").unwrap().status, 200);

    let answer = https(
        port,
        &ca,
        None,
        Some(&read),
        "DELETE",
        "/v1/volumes/disk0?force=true",
        "",
    )
    .unwrap();
    assert_eq!(answer.status, 403, "{answer:?}");
    assert_eq!(answer.code(), "forbidden");
    assert!(answer.body.contains("read scope"), "{answer:?}");
    assert!(answer.headers.contains("insufficient_scope"), "{answer:?}");
    let create = r#"{"name": "x", "size": "1M"}"#;
    let answer = https(port, &ca, None, Some(&read), "POST", "/v1/volumes", create).unwrap();
    assert_eq!(answer.status, 403, "{answer:?}");
    // Tokens are for admins only, even to list.
    assert_eq!(get(&read, "/v1/tokens").unwrap().status, 403);
    let make = r#"{"name": "mine", "scope": "admin"}"#;
    let answer = https(port, &ca, None, Some(&read), "POST", "/v1/tokens", make).unwrap();
    assert_eq!(answer.status, 403, "{answer:?}");
    assert_eq!(
        names(&daemon),
        ["disk0"],
        "the volume survives a read token"
    );

    // The admin token lists tokens (never a secret) and destroys.
    let answer = get(&admin, "/v1/tokens").unwrap();
    assert_eq!(answer.status, 200, "{answer:?}");
    assert!(answer.body.contains("\"watcher\""), "{answer:?}");
    assert!(!answer.body.contains(&read[20..]), "no secret is listed");
    let answer = https(
        port,
        &ca,
        None,
        Some(&admin),
        "DELETE",
        "/v1/volumes/disk0",
        "",
    )
    .unwrap();
    assert_eq!(answer.status, 204, "{answer:?}");
    assert!(names(&daemon).is_empty(), "disk0 is destroyed");

    // Revoked: refused at once.
    daemon.ok(&["token", "revoke", "watcher"]);
    let answer = get(&read, "/v1/volumes").unwrap();
    assert_eq!(answer.status, 401, "{answer:?}");
    assert_eq!(answer.code(), "unauthorized");
    // The store is a file of hashes, owner-only.
    let file = daemon.path("tokens.json");
    let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(!text.contains(&admin[23..]), "the secret is not stored");
}

#[test]
fn client_certificates_by_identity() {
    let pki = Pki::new();
    let (daemon, port) = tls_daemon(&pki);
    let ca = pki.ca();
    let create = r#"{"name": "byops", "size": "1M"}"#;

    // Listed as admin: anything.
    let ops = || Some(pki.client("ops"));
    let answer = https(port, &ca, ops(), None, "POST", "/v1/volumes", create).unwrap();
    assert_eq!(answer.status, 201, "{answer:?}");
    assert_eq!(
        https(port, &ca, ops(), None, "GET", "/v1/tokens", "")
            .unwrap()
            .status,
        200
    );
    // Listed as read: reads only.
    let monitor = || Some(pki.client("monitor"));
    let answer = https(port, &ca, monitor(), None, "GET", "/metrics", "").unwrap();
    assert_eq!(answer.status, 200, "{answer:?}");
    let answer = https(
        port,
        &ca,
        monitor(),
        None,
        "DELETE",
        "/v1/volumes/byops",
        "",
    )
    .unwrap();
    assert_eq!(answer.status, 403, "{answer:?}");
    // From the CA but not listed: 403, naming the identity.
    let answer = https(
        port,
        &ca,
        Some(pki.client("stranger")),
        None,
        "GET",
        "/v1/volumes",
        "",
    )
    .unwrap();
    assert_eq!(answer.status, 403, "{answer:?}");
    assert!(answer.body.contains("stranger"), "{answer:?}");
    // From another CA: refused in the handshake, no HTTP answer at all.
    let refused = https(
        port,
        &ca,
        Some(pki.client("intruder")),
        None,
        "GET",
        "/v1/volumes",
        "",
    );
    assert!(refused.is_err(), "{refused:?}");
    // A token decides when there is one, even with a listed certificate.
    let answer = https(port, &ca, ops(), Some("hunter2"), "GET", "/v1/volumes", "").unwrap();
    assert_eq!(answer.status, 401, "{answer:?}");
    assert_eq!(names(&daemon), ["byops", "disk0"]);
}

#[test]
fn the_cli_over_https() {
    let pki = Pki::new();
    let (daemon, port) = tls_daemon(&pki);
    let (read_file, _) = make_token(&daemon, "reader", "read");
    let (admin_file, _) = make_token(&daemon, "admin", "admin");
    let api = format!("https://localhost:{port}");
    let ca = pki.ca();
    // No --data-dir: the CLI knows only the URL.
    let remote = |token: &Path, args: &[&str]| -> Vec<String> {
        let mut all: Vec<String> = ["--api", &api, "--tls-ca", p(&ca), "--token-file", p(token)]
            .iter()
            .map(|s| s.to_string())
            .collect();
        all.extend(args.iter().map(|s| s.to_string()));
        all
    };
    let run = |args: &[String]| {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        arbor(&refs)
    };

    let out = run(&remote(&read_file, &["volume", "list"]));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("disk0"), "{}", stdout(&out));

    let out = run(&remote(&read_file, &["destroy", "disk0"]));
    assert_eq!(out.status.code(), Some(10), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("read scope"), "{err}");
    assert!(
        err.contains("arbor token create NAME --scope admin"),
        "says what to do: {err}"
    );
    assert_eq!(names(&daemon), ["disk0"]);

    // Token management over TCP needs admin.
    let out = run(&remote(&read_file, &["token", "list"]));
    assert_eq!(out.status.code(), Some(10), "{}", stderr(&out));
    let out = run(&remote(
        &admin_file,
        &[
            "token",
            "create",
            "ci",
            "--scope",
            "read",
            "--expires",
            "30d",
        ],
    ));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).trim().starts_with("arbor_"),
        "{}",
        stdout(&out)
    );
    let list = daemon.json(&["token", "list"]);
    let ci = list
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "ci")
        .unwrap_or_else(|| panic!("{list}"));
    assert_eq!(ci["scope"], "read");
    assert!(ci["expires_unix_secs"].as_u64().unwrap() > ci["created_unix_secs"].as_u64().unwrap());

    // An admin token destroys; ARBOR_TOKEN works as well as a file.
    let out = run(&remote(
        &admin_file,
        &["volume", "create", "tmp", "--size", "1M"],
    ));
    assert!(out.status.success(), "{}", stderr(&out));
    let token = std::fs::read_to_string(&admin_file).unwrap();
    let out = command()
        .args(["--api", &api, "--tls-ca", p(&ca), "destroy", "tmp"])
        .env("ARBOR_TOKEN", token.trim())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(names(&daemon), ["disk0"]);

    // A client certificate instead of a token.
    let (cert, key) = pki.client("ops");
    fails_with(
        &["--api", &api, "--tls-ca", p(&ca), "volume", "list"],
        10,
        "--token-file",
    );
    ok(&[
        "--api",
        &api,
        "--tls-ca",
        p(&ca),
        "--tls-cert",
        p(&cert),
        "--tls-key",
        p(&key),
        "volume",
        "create",
        "certified",
        "--size",
        "1M",
    ]);
    assert_eq!(names(&daemon), ["certified", "disk0"]);

    // Mistakes say what is wrong.
    fails_with(&["--api", &api, "volume", "list"], 2, "--tls-ca");
    let other_ca = pki.dir.path().join("other/ca.pem");
    fails_with(
        &["--api", &api, "--tls-ca", p(&other_ca), "volume", "list"],
        1,
        "TLS with",
    );
    let plain_url = format!("http://127.0.0.1:{port}");
    fails_with(
        &[
            "--api",
            &plain_url,
            "--token-file",
            p(&read_file),
            "volume",
            "list",
        ],
        2,
        "use https://",
    );
    fails_with(
        &["--api", "http://10.1.2.3:10810", "volume", "list"],
        2,
        "plain http only reaches a daemon on this host",
    );
}

/// Without TLS the API listens on loopback only, and still wants a token.
#[test]
fn plain_loopback_needs_a_token_too() {
    let port = free_port();
    let daemon = Daemon::start(&["--api-listen", &format!("127.0.0.1:{port}")]);
    let answer = plain(port, None, "GET", "/v1/volumes");
    assert_eq!(answer.status, 401, "{answer:?}");
    let (file, token) = make_token(&daemon, "local-read", "read");
    let answer = plain(port, Some(&token), "GET", "/v1/volumes");
    assert_eq!(answer.status, 200, "{answer:?}");
    let answer = plain(port, Some(&token), "DELETE", "/v1/volumes/disk0");
    assert_eq!(answer.status, 403, "{answer:?}");
    let url = format!("http://127.0.0.1:{port}");
    let out = ok(&["--api", &url, "--token-file", p(&file), "volume", "list"]);
    assert!(out.contains("disk0"), "{out}");
    // The Unix socket needs nothing.
    daemon.ok(&["volume", "list"]);
    // Attaching a device is for the Unix socket alone, whatever the token:
    // an admin token over TCP is refused before the request is read.
    let (admin_file, _) = make_token(&daemon, "local-admin", "admin");
    let image = daemon.path("image.raw");
    std::fs::write(&image, vec![0u8; 1 << 20]).unwrap();
    let out = command()
        .args([
            "--api",
            &url,
            "--token-file",
            p(&admin_file),
            "origin",
            "attach",
            "img",
            p(&image),
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(10), "{}", stderr(&out));
    assert!(stderr(&out).contains("Unix socket"), "{}", stderr(&out));
    assert!(!names(&daemon).contains(&"img".to_owned()));
    daemon.ok(&["origin", "attach", "img", p(&image)]);
    // Beyond loopback only with TLS.
    fails_with(
        &["serve", "--api-listen", "0.0.0.0:1"],
        2,
        "beyond loopback the API needs TLS",
    );
}

#[test]
fn the_https_daemon_serves_many_clients_and_closes_cleanly() {
    // Handshakes are per connection, each on a task of its own: a client
    // that connects and sends nothing does not stop others.
    let pki = Pki::new();
    let (mut daemon, port) = tls_daemon(&pki);
    let (_, token) = make_token(&daemon, "t", "read");
    let silent = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let ca = Arc::new(pki.ca());
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let ca = Arc::clone(&ca);
            let token = token.clone();
            std::thread::spawn(move || {
                https(port, &ca, None, Some(&token), "GET", "/v1/pool", "")
                    .unwrap()
                    .status
            })
        })
        .collect();
    for t in threads {
        assert_eq!(t.join().unwrap(), 200);
    }
    drop(silent);
    daemon.stop_cleanly();
}

#[test]
fn stalled_handshakes_cannot_keep_an_https_client_out() {
    // Four slots, and more connections that stall before or inside their
    // TLS handshake than the handshake timeout (10 s) could clear while
    // the test waits (fewer than the listen backlog, 128, so that each
    // connects): only the listener dropping the oldest handshake for each
    // newcomer lets the polite client in.
    let pki = Pki::new();
    let config = pki.config();
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str("api_max_connections = 4\n");
    std::fs::write(&config, text).unwrap();
    let port = free_port();
    let mut daemon = Daemon::start(&[
        "--config",
        p(&config),
        "--api-listen",
        &format!("127.0.0.1:{port}"),
    ]);
    let (_, token) = make_token(&daemon, "t", "read");
    let mut stalled = Vec::new();
    for round in 0..100 {
        let mut tcp = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        if round % 2 == 1 {
            // Half a ClientHello, then silence.
            let _ = tcp.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00]);
        }
        stalled.push(tcp);
    }
    let ca = pki.ca();
    let (answered, answer) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let status = https(port, &ca, None, Some(&token), "GET", "/v1/pool", "").map(|a| a.status);
        let _ = answered.send(status);
    });
    // Waiting for the stalled connections' timeouts instead would take
    // 100 / 4 * 10 s.
    let status = answer
        .recv_timeout(Duration::from_secs(120))
        .expect("the polite client is served while the others stall");
    assert_eq!(status, Ok(200));
    drop(stalled);
    daemon.stop_cleanly();
}

/// `arbor config reload` changes who may use the API without a restart:
/// `api_clients` from the next request, a revoked client certificate
/// refused in the handshake, a new server certificate (and CA bundle)
/// for the next connection, the token file read again; a reload naming a
/// missing file is refused and changes nothing.
#[test]
fn a_reload_changes_api_clients_certificates_and_tokens_without_a_restart() {
    let pki = Pki::new();
    let (daemon, port) = tls_daemon(&pki);
    let ca = pki.ca();
    let get = |client: &str, ca: &Path| {
        https(
            port,
            ca,
            Some(pki.client(client)),
            None,
            "GET",
            "/v1/volumes",
            "",
        )
    };
    assert_eq!(get("ops", &ca).unwrap().status, 200);
    assert_eq!(get("stranger", &ca).unwrap().status, 403);
    let config = |clients: &str, extra: &str| {
        std::fs::write(
            pki.dir.path().join("arbor.toml"),
            format!(
                "tls_ca = {:?}\ntls_cert = {:?}\ntls_key = {:?}\n{extra}\napi_clients = [{clients}]\n",
                ca,
                pki.ours("server.pem"),
                pki.ours("server-key.pem"),
            ),
        )
        .unwrap();
    };

    // stranger in, ops out: from the next request.
    config(
        "{ identity = \"stranger\", scope = \"admin\" }, { identity = \"monitor\", scope = \"read\" }",
        "",
    );
    let view = daemon.json(&["config", "reload"]);
    assert_eq!(
        view["changed"],
        serde_json::json!(["api_clients"]),
        "{view}"
    );
    assert_eq!(get("stranger", &ca).unwrap().status, 200);
    let answer = get("ops", &ca).unwrap();
    assert_eq!(answer.status, 403, "{answer:?}");

    // monitor revoked: refused in the handshake, no HTTP answer.
    assert_eq!(get("monitor", &ca).unwrap().status, 200);
    ok(&["tls", "revoke", p(&pki.ours("")), "monitor"]);
    let crl = pki.ours("crl.pem");
    let clients =
        "{ identity = \"stranger\", scope = \"admin\" }, { identity = \"monitor\", scope = \"read\" }";
    config(clients, &format!("tls_crl = {crl:?}"));
    let view = daemon.json(&["config", "reload"]);
    assert_eq!(view["revoked_certificates"], 1, "{view}");
    let refused = get("monitor", &ca);
    assert!(refused.is_err(), "{refused:?}");
    assert_eq!(get("stranger", &ca).unwrap().status, 200);

    // A missing file: refused, nothing changed.
    std::fs::write(
        pki.dir.path().join("arbor.toml"),
        format!(
            "tls_ca = {:?}\ntls_cert = \"/nonexistent/server.pem\"\ntls_key = {:?}\napi_clients = []\n",
            ca,
            pki.ours("server-key.pem"),
        ),
    )
    .unwrap();
    daemon.fails(
        &["config", "reload"],
        2,
        "/nonexistent/server.pem: file not found",
    );
    assert_eq!(get("stranger", &ca).unwrap().status, 200);

    // A new server certificate from the other CA, both CAs trusted: a
    // client that trusts only the other CA now connects (its `intruder`
    // is unlisted: 403, past the handshake).
    let other_ca = pki.dir.path().join("other").join("ca.pem");
    assert!(get("intruder", &other_ca).is_err());
    let bundle = pki.dir.path().join("bundle.pem");
    std::fs::write(
        &bundle,
        [
            std::fs::read(&ca).unwrap(),
            std::fs::read(&other_ca).unwrap(),
        ]
        .concat(),
    )
    .unwrap();
    let other = |name: &str| pki.dir.path().join("other").join(name);
    std::fs::write(
        pki.dir.path().join("arbor.toml"),
        format!(
            "tls_ca = {bundle:?}\ntls_cert = {:?}\ntls_key = {:?}\napi_clients = [{clients}]\n",
            other("server.pem"),
            other("server-key.pem"),
        ),
    )
    .unwrap();
    let view = daemon.json(&["config", "reload"]);
    let changed = view["changed"].as_array().unwrap();
    for key in ["tls_ca", "tls_cert", "tls_key", "tls_crl"] {
        assert!(changed.iter().any(|k| k == key), "{key}: {view}");
    }
    let answer = get("intruder", &other_ca).unwrap();
    assert_eq!(answer.status, 403, "{answer:?}");
    assert!(
        get("stranger", &ca).is_err(),
        "the old server certificate is still served"
    );

    // The token file read again: a token made after the copy was taken
    // is gone once the copy is put back.
    let tokens = daemon.path("tokens.json");
    let before = std::fs::read(&tokens).unwrap_or_default();
    let (_, late) = make_token(&daemon, "late", "read");
    let with_token =
        |token: &str| https(port, &other_ca, None, Some(token), "GET", "/v1/volumes", "").unwrap();
    assert_eq!(with_token(&late).status, 200);
    if before.is_empty() {
        std::fs::remove_file(&tokens).unwrap();
    } else {
        std::fs::write(&tokens, &before).unwrap();
    }
    let view = daemon.json(&["config", "reload"]);
    assert_eq!(view["tokens"], 0, "{view}");
    assert_eq!(with_token(&late).status, 401);
}
