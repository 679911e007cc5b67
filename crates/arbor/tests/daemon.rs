//! `arbor serve`: the control API, the CLI's --daemon mode, background
//! work and shutdown.

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

fn via(daemon: &Daemon, args: &[&str]) -> String {
    let mut full = vec!["--daemon", daemon.address()];
    full.extend_from_slice(args);
    ok(&full)
}

fn via_json(daemon: &Daemon, args: &[&str]) -> Value {
    serde_json::from_str(&via(daemon, args)).unwrap()
}

fn error_code(body: &str) -> String {
    let error: Value = serde_json::from_str(body)
        .unwrap_or_else(|e| panic!("error body is not JSON ({e}): {body}"));
    assert!(error["message"].is_string(), "{body}");
    error["code"].as_str().unwrap().to_owned()
}

#[test]
fn cli_through_the_daemon_then_clean_shutdown() {
    let pool = TestPool::new("128M");
    ok(&["create", pool.path(), "before", "--size", "4M"]);
    let daemon = Daemon::start(&pool, &[]);

    fails(&["list", pool.path()], "in use by another arbor process");

    via(&daemon, &["create", "vm", "--size", "16M"]);
    via(&daemon, &["snapshot", "vm@one"]);
    via(&daemon, &["clone", "vm@one", "copy"]);
    via(&daemon, &["resize", "copy", "32M"]);
    via(&daemon, &["rename", "before", "after"]);
    via(&daemon, &["rollback", "vm", "vm@one"]);
    let list = via_json(&daemon, &["list", "--json"]);
    let names: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["after", "copy", "vm", "vm@one"]);
    assert_eq!(list[1]["size"], 32 << 20);
    assert_eq!(list[1]["parent"], "vm@one");

    assert_eq!(
        via_json(&daemon, &["stats", "vm", "--json"])["logical_bytes"],
        16 << 20
    );
    assert_eq!(
        via_json(&daemon, &["diff", "vm", "copy", "--json"]),
        serde_json::json!([])
    );
    assert_eq!(
        via_json(&daemon, &["pool", "info", "--json"])["snapshots"],
        1
    );
    assert!(via(&daemon, &["check"]).contains("clean"));
    via(&daemon, &["delete", "vm@one"]);
    via(&daemon, &["reclaim"]);

    let args = ["--daemon", daemon.address()];
    fails(
        &[&args[..], &["delete", "ghost"]].concat(),
        "no such volume",
    );
    fails(
        &[&args[..], &["create", "vm", "--size", "1M"]].concat(),
        "already exists",
    );
    fails(
        &[&args[..], &["create", "a/b", "--size", "1M"]].concat(),
        "invalid name",
    );
    fails(
        &[&args[..], &["export", "vm", "/dev/null"]].concat(),
        "cannot go through --daemon",
    );
    fails(
        &[&args[..], &["serve", pool.path()]].concat(),
        "cannot go through --daemon",
    );

    let (status, log) = daemon.stop("TERM");
    assert!(status.success(), "daemon failed: {log}");
    assert!(
        !pool.file("api.sock").exists(),
        "socket removed on shutdown"
    );
    assert!(ok(&["check", pool.path()]).contains("clean"));
    let names: Vec<String> = json(&["list", pool.path(), "--json"])
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names, ["after", "copy", "vm"]);
}

#[test]
fn api_errors_have_statuses_and_json_bodies() {
    let pool = TestPool::new("64M");
    let daemon = Daemon::start(&pool, &[]);
    let socket = daemon.address();

    let (status, body) = http(socket, "POST", "/v1/volumes", r#"{"name":"v","size":"1M"}"#);
    assert_eq!(status, 201, "{body}");
    let created: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(created["size"], 1 << 20);

    let cases: &[(&str, &str, &str, u16, &str)] = &[
        (
            "POST",
            "/v1/volumes",
            r#"{"name":"v","size":1048576}"#,
            409,
            "already_exists",
        ),
        (
            "POST",
            "/v1/volumes",
            r#"{"name":"x","size":"1Q"}"#,
            422,
            "unprocessable_entity",
        ),
        (
            "POST",
            "/v1/volumes",
            r#"{"name":"x","size":1000}"#,
            400,
            "invalid_argument",
        ),
        (
            "POST",
            "/v1/volumes",
            r#"{"name":"@","size":512}"#,
            400,
            "invalid_name",
        ),
        ("POST", "/v1/volumes", "{not json", 400, "bad_request"),
        ("DELETE", "/v1/volumes/ghost", "", 404, "not_found"),
        ("GET", "/v1/volumes/ghost/stats", "", 404, "not_found"),
        ("GET", "/v1/diff?a=v", "", 400, "bad_request"),
        (
            "POST",
            "/v1/snapshots",
            r#"{"name":"v"}"#,
            400,
            "invalid_name",
        ),
        (
            "POST",
            "/v1/clones",
            r#"{"snapshot":"v","name":"c"}"#,
            400,
            "invalid_argument",
        ),
        (
            "POST",
            "/v1/volumes/v/rename",
            r#"{"to":"v","extra":1}"#,
            422,
            "unprocessable_entity",
        ),
        ("GET", "/v1/nothing", "", 404, "not_found"),
        ("PUT", "/v1/pool", "", 405, "method_not_allowed"),
    ];
    for &(method, path, body, expected, code) in cases {
        let (status, answer) = http(socket, method, path, body);
        assert_eq!(status, expected, "{method} {path} {body}: {answer}");
        assert_eq!(error_code(&answer), code, "{method} {path} {body}");
    }

    http(socket, "POST", "/v1/snapshots", r#"{"name":"v@s"}"#);
    let (status, body) = http(socket, "POST", "/v1/volumes/v@s/resize", r#"{"size":"2M"}"#);
    assert_eq!((status, error_code(&body).as_str()), (409, "read_only"));

    let huge = format!(r#"{{"name":"{}","size":512}}"#, "a".repeat(100_000));
    let (status, body) = http(socket, "POST", "/v1/volumes", &huge);
    assert_eq!(
        (status, error_code(&body).as_str()),
        (413, "payload_too_large")
    );

    let (status, _) = http(socket, "POST", "/v1/flush", "");
    assert_eq!(status, 204);
    let (status, body) = http(socket, "GET", "/v1/diff?a=v&b=v%40s", "");
    assert_eq!((status, body.as_str()), (200, "[]"));
    let (status, _) = http(socket, "DELETE", "/v1/volumes/v%40s", "");
    assert_eq!(status, 204);

    let (status, log) = daemon.stop("INT");
    assert!(status.success(), "daemon failed: {log}");
    assert!(ok(&["check", pool.path()]).contains("clean"));
}

#[test]
fn background_reclaim_and_commit() {
    let pool = TestPool::new("64M");
    let image = random_image(3, 4 << 20);
    let source = pool.file("image.raw");
    std::fs::write(&source, &image).unwrap();
    ok(&["import", pool.path(), "data", p(&source)]);
    let used = json(&["pool", "info", pool.path(), "--json"])["data_used_bytes"]
        .as_u64()
        .unwrap();
    assert!(used > 0);

    let daemon = Daemon::start(
        &pool,
        &["--reclaim-rate", "100", "--commit-interval", "100ms"],
    );
    via(&daemon, &["delete", "data"]);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let info = via_json(&daemon, &["pool", "info", "--json"]);
        if info["reclaim_pending"] == false && info["data_used_bytes"] == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "reclaim did not finish: {info}");
        std::thread::sleep(Duration::from_millis(50));
    }

    // A daemon killed outright loses nothing that was committed.
    via(&daemon, &["create", "survivor", "--size", "1M"]);
    drop(daemon);
    assert_eq!(
        json(&["list", pool.path(), "--json"])[0]["name"],
        "survivor"
    );
    assert!(ok(&["check", pool.path()]).contains("clean"));
}

#[test]
fn api_on_loopback_tcp() {
    let pool = TestPool::new("64M");
    let daemon = Daemon::start_tcp(&pool);
    via(&daemon, &["create", "v", "--size", "1M"]);
    assert_eq!(via_json(&daemon, &["list", "--json"])[0]["name"], "v");
    let (status, log) = daemon.stop("TERM");
    assert!(status.success(), "daemon failed: {log}");
}

#[test]
fn serve_rejects_bad_listeners() {
    let pool = TestPool::new("64M");
    fails(&["serve", pool.path()], "nothing to serve");
    fails(&["serve", pool.path(), "--api", "0.0.0.0:0"], "loopback");
    let taken = pool.file("taken");
    std::fs::write(&taken, b"file").unwrap();
    fails(
        &["serve", pool.path(), "--api-socket", p(&taken)],
        "not a socket",
    );
    fails(
        &[
            "serve",
            pool.path(),
            "--api-socket",
            "x",
            "--commit-interval",
            "0s",
        ],
        "greater than zero",
    );
    // After all those failures the pool is still free to use.
    ok(&["list", pool.path()]);
}
