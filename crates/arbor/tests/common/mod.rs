//! Helpers shared by the CLI and daemon tests: running the built binary,
//! random images, a daemon that never outlives its test, raw HTTP.

#![allow(dead_code)] // each test binary uses its own subset

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};

pub const ARBOR: &str = env!("CARGO_BIN_EXE_arbor");

pub fn arbor(args: &[&str]) -> Output {
    Command::new(ARBOR)
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run arbor")
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Runs arbor, expecting success; returns stdout.
pub fn ok(args: &[&str]) -> String {
    let out = arbor(args);
    assert!(
        out.status.success(),
        "arbor {args:?} failed: {}{}",
        stdout(&out),
        stderr(&out)
    );
    stdout(&out)
}

/// Runs arbor, expecting exit status 1 with `message` on stderr and no panic.
pub fn fails(args: &[&str], message: &str) {
    let out = arbor(args);
    let err = stderr(&out);
    assert_eq!(
        out.status.code(),
        Some(1),
        "arbor {args:?} should fail: {}{err}",
        stdout(&out)
    );
    assert!(!err.contains("panicked"), "arbor {args:?} panicked: {err}");
    assert!(
        err.contains(message),
        "arbor {args:?}: expected {message:?} in: {err}"
    );
}

pub fn json(args: &[&str]) -> serde_json::Value {
    let text = ok(args);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("arbor {args:?}: bad JSON ({e}): {text}"))
}

/// A pool file in a fresh temporary directory.
pub struct TestPool {
    pub dir: tempfile::TempDir,
    pub path: PathBuf,
}

impl TestPool {
    pub fn new(size: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pool.img");
        ok(&["pool", "create", p(&path), "--size", size]);
        Self { dir, path }
    }

    pub fn path(&self) -> &str {
        p(&self.path)
    }

    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

pub fn p(path: &Path) -> &str {
    path.to_str().expect("temp paths are UTF-8")
}

/// `len` bytes of seeded random data with some all-zero stretches (so
/// sparse import has something to skip).
pub fn random_image(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut data = vec![0u8; len];
    rng.fill(&mut data[..]);
    let mut at = 0;
    while at < len {
        let hole = rng.gen_range(0..300_000);
        let end = (at + hole).min(len);
        if rng.gen_bool(0.3) {
            data[at..end].fill(0);
        }
        at = end + rng.gen_range(1..200_000);
    }
    data
}

/// `arbor serve`, killed when dropped so a failing test never leaks a server.
pub struct Daemon {
    child: Option<Child>,
    /// What `--daemon` takes: the API's Unix socket path or IP:PORT.
    address: String,
}

impl Daemon {
    /// Serves the API on a Unix socket beside the pool.
    pub fn start(pool: &TestPool, extra: &[&str]) -> Self {
        let socket = pool.file("api.sock");
        let socket = p(&socket);
        Self::spawn(pool, &[&["--api-socket", socket], extra].concat(), socket)
    }

    /// Serves the API on a free loopback port.
    pub fn start_tcp(pool: &TestPool) -> Self {
        // Ask the kernel for a free port, then hand it over (a tiny race
        // with other processes is acceptable in a test).
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let address = format!("127.0.0.1:{port}");
        Self::spawn(pool, &["--api", &address], &address)
    }

    fn spawn(pool: &TestPool, args: &[&str], address: &str) -> Self {
        let child = Command::new(ARBOR)
            .args(["serve", pool.path()])
            .args(args)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start arbor serve");
        let mut daemon = Self {
            child: Some(child),
            address: address.to_owned(),
        };
        daemon.wait_until_ready();
        daemon
    }

    fn is_listening(&self) -> bool {
        match self.address.parse::<SocketAddr>() {
            Ok(addr) => TcpStream::connect(addr).is_ok(),
            Err(_) => UnixStream::connect(&self.address).is_ok(),
        }
    }

    fn wait_until_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.is_listening() {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("daemon exited early with {status}");
            }
            assert!(Instant::now() < deadline, "daemon did not start listening");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn address(&self) -> &str {
        &self.address
    }

    /// Sends `signal` and waits for the daemon to exit; returns its status
    /// and stderr.
    pub fn stop(mut self, signal: &str) -> (ExitStatus, String) {
        let mut child = self.child.take().unwrap();
        let killed = Command::new("kill")
            .args([&format!("-{signal}"), &child.id().to_string()])
            .status()
            .unwrap();
        assert!(killed.success());
        let deadline = Instant::now() + Duration::from_secs(20);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("daemon did not exit after SIG{signal}");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut err = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        (status, err)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// One raw HTTP/1.1 request over a Unix socket; returns the status and body.
pub fn http(socket: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut stream = UnixStream::connect(socket).unwrap();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: arbor\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {response}"));
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}
