//! Helpers shared by the CLI and daemon tests: running the built binary, a
//! daemon that never outlives its test, raw HTTP.

#![allow(dead_code)] // each test binary uses its own subset

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

pub const ARBOR: &str = env!("CARGO_BIN_EXE_arbor");

/// The variables that point the CLI at a daemon (docs/CLI.md): a test
/// names its own, whatever the environment it runs in has.
pub const CLIENT_VARIABLES: [&str; 7] = [
    "ARBOR_DATA_DIR",
    "ARBOR_API",
    "ARBOR_TOKEN",
    "ARBOR_TOKEN_FILE",
    "ARBOR_TLS_CA",
    "ARBOR_TLS_CERT",
    "ARBOR_TLS_KEY",
];

/// `arbor` with none of [`CLIENT_VARIABLES`] set.
pub fn command() -> Command {
    let mut command = Command::new(ARBOR);
    command.env("RUST_LOG", "warn");
    for variable in CLIENT_VARIABLES {
        command.env_remove(variable);
    }
    command
}

pub fn arbor(args: &[&str]) -> Output {
    command().args(args).output().expect("run arbor")
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

/// Runs arbor, expecting exit status `code` with `message` on stderr, no
/// panic, and nothing on stdout.
pub fn fails_with(args: &[&str], code: i32, message: &str) {
    let out = arbor(args);
    let err = stderr(&out);
    assert_eq!(
        out.status.code(),
        Some(code),
        "arbor {args:?} should fail with {code}: {}{err}",
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

pub fn p(path: &Path) -> &str {
    path.to_str().expect("temp paths are UTF-8")
}

/// `arbor serve` on a fresh data directory (Unix sockets only), killed when
/// dropped so a failing test never leaks a server.
pub struct Daemon {
    child: Option<Child>,
    pub dir: tempfile::TempDir,
    /// Where its log (stderr) goes instead of a pipe, if set: a pipe
    /// nobody reads stops a daemon that logs more than it holds.
    log: Option<PathBuf>,
}

/// What every test daemon gets unless the test says otherwise: no TCP
/// (tests run in parallel), a small pool.
const TEST_SERVE_ARGS: [(&str, &str); 3] = [
    ("--nbd-listen", "none"),
    ("--api-listen", "none"),
    ("--pool-size", "256M"),
];

impl Daemon {
    pub fn start(extra: &[&str]) -> Self {
        Self::start_in(tempfile::tempdir().unwrap(), extra)
    }

    /// [`Daemon::start`] on a data directory the test has filled (a pool
    /// file it put there is opened, not formatted).
    pub fn start_in(dir: tempfile::TempDir, extra: &[&str]) -> Self {
        let mut daemon = Self {
            child: None,
            dir,
            log: None,
        };
        daemon.restart(extra);
        daemon
    }

    /// [`Daemon::start`], its log written to the file `log.txt` in its
    /// data directory ([`Daemon::log`]).
    pub fn start_logging(extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let log = Some(dir.path().join("log.txt"));
        let mut daemon = Self {
            child: None,
            dir,
            log,
        };
        daemon.restart(extra);
        daemon
    }

    /// What a daemon of [`Daemon::start_logging`] has logged so far.
    pub fn log(&self) -> String {
        let path = self.log.as_ref().expect("started with start_logging");
        std::fs::read_to_string(path).unwrap_or_default()
    }

    /// Starts `arbor serve` on this data directory again (after `stop`).
    pub fn restart(&mut self, extra: &[&str]) {
        assert!(self.child.is_none(), "already running");
        let defaults = TEST_SERVE_ARGS
            .iter()
            .filter(|(flag, _)| !extra.contains(flag))
            .flat_map(|(flag, value)| [*flag, *value]);
        let stderr = match &self.log {
            Some(path) => Stdio::from(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .unwrap(),
            ),
            None => Stdio::piped(),
        };
        let child = Command::new(ARBOR)
            .args(["serve", "--data-dir", self.data_dir()])
            .args(defaults)
            .args(extra)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("start arbor serve");
        self.child = Some(child);
        self.wait_until_ready();
    }

    /// The daemon's process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("daemon running").id()
    }

    pub fn data_dir(&self) -> &str {
        p(self.dir.path())
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn api_socket(&self) -> String {
        p(&self.path("api.sock")).to_owned()
    }

    pub fn nbd_socket(&self) -> String {
        p(&self.path("nbd.sock")).to_owned()
    }

    fn wait_until_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while UnixStream::connect(self.api_socket()).is_err() {
            let child = self.child.as_mut().unwrap();
            if let Some(status) = child.try_wait().unwrap() {
                let mut err = String::new();
                if let Some(mut stderr) = child.stderr.take() {
                    stderr.read_to_string(&mut err).unwrap();
                }
                panic!("daemon exited early with {status}: {err}");
            }
            assert!(Instant::now() < deadline, "daemon did not start listening");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The command line for a client command of this daemon.
    pub fn args<'a>(&'a self, args: &[&'a str]) -> Vec<&'a str> {
        [&["--data-dir", self.data_dir()][..], args].concat()
    }

    /// A client command that must succeed; returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        ok(&self.args(args))
    }

    /// A client command with `--json`, parsed.
    pub fn json(&self, args: &[&str]) -> serde_json::Value {
        json(&self.args(&[args, &["--json"]].concat()))
    }

    pub fn fails(&self, args: &[&str], code: i32, message: &str) {
        fails_with(&self.args(args), code, message)
    }

    /// Sends `signal` and waits for the daemon to exit; returns its status,
    /// stdout and stderr.
    pub fn stop(&mut self, signal: &str) -> (ExitStatus, String, String) {
        let mut child = self.child.take().unwrap();
        let killed = Command::new("kill")
            .args([&format!("-{signal}"), &child.id().to_string()])
            .status()
            .unwrap();
        assert!(killed.success());
        let deadline = Instant::now() + Duration::from_secs(30);
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
        let mut out = String::new();
        let mut err = String::new();
        child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut out)
            .unwrap();
        match child.stderr.take() {
            Some(mut stderr) => {
                stderr.read_to_string(&mut err).unwrap();
            }
            None => err = self.log(),
        }
        (status, out, err)
    }

    /// SIGTERM, which must end the daemon cleanly.
    pub fn stop_cleanly(&mut self) -> String {
        let (status, out, err) = self.stop("TERM");
        assert!(status.success(), "daemon failed on SIGTERM: {err}");
        out
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

/// `nbdcopy` (Debian's libnbd-bin, which CI installs), flushing the
/// destination at the end as a careful client does.
pub fn nbdcopy(from: &str, to: &str) {
    let out = Command::new("nbdcopy")
        .args(["--flush", from, to])
        .output()
        .expect("nbdcopy is missing: apt-get install libnbd-bin");
    assert!(
        out.status.success(),
        "nbdcopy {from} {to}: {}",
        stderr(&out)
    );
}

/// One raw HTTP/1.1 request over a Unix socket; returns the status and body.
pub fn http(socket: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut stream = UnixStream::connect(socket).unwrap();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: arbor\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    // The server may answer (an error, or an endpoint that takes no body)
    // and close before reading the whole request: a broken pipe here is
    // fine, the answer is still there to read.
    if let Err(e) = stream.write_all(request.as_bytes()) {
        assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe, "sending: {e}");
    }
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

/// Bounds every external tool a test runs, so a hang fails the test
/// instead of stalling it; never reached when the server behaves.
pub const HANG_GUARD: Duration = Duration::from_secs(120);

/// Runs an external `program` (an NBD client, openssl, qemu) under the
/// hang guard.
pub fn tool(program: &str, args: &[&str]) -> Output {
    Command::new("timeout")
        .arg(HANG_GUARD.as_secs().to_string())
        .arg(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e} (scripts/install-deps.sh installs it)"))
}

/// [`tool`], expecting success; returns stdout.
pub fn tool_ok(program: &str, args: &[&str]) -> String {
    let out = tool(program, args);
    assert!(
        out.status.success(),
        "{program} {args:?} failed: {}{}",
        stdout(&out),
        stderr(&out)
    );
    stdout(&out)
}

/// Polls `probe` until it returns `Some`; waiting past `secs` is a failure,
/// never a pass.
pub fn wait_for<T>(what: &str, secs: u64, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = probe() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A loopback TCP port free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Writes `len` pseudo-random bytes (xorshift from `seed`: the same bytes
/// every run) to `dir/name`.
pub fn random_file(dir: &Path, name: &str, len: u64, seed: u8) -> PathBuf {
    let path = dir.join(name);
    let mut state = u64::from(seed).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let data: Vec<u8> = (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect();
    std::fs::write(&path, data).unwrap();
    path
}
