//! A server running in-process on a temporary Unix socket (and optionally
//! TCP), and helpers to run real NBD clients against it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use arbor_nbd::memory::{ExportTable, MemoryExport};
use arbor_nbd::{serve, CancellationToken, Export, ExportError, Listener, ServerConfig, StatusRun};

pub const MIB: u64 = 1024 * 1024;

/// How long a test waits for an event before it fails instead of hanging
/// the suite. Not a performance bound: every event waited for takes a small
/// fraction of this even on a loaded machine, and tests that prove the server
/// does *not* rely on a timer configure that timer far longer than this.
pub const HANG_GUARD: Duration = Duration::from_secs(120);

pub struct TestServer {
    _dir: tempfile::TempDir,
    pub socket: PathBuf,
    pub tcp: Option<SocketAddr>,
    pub table: Arc<ExportTable>,
    shutdown: CancellationToken,
    thread: Option<JoinHandle<()>>,
}

impl TestServer {
    /// A server on a Unix socket offering `exports`.
    pub fn start(exports: Vec<(&str, Arc<dyn Export>)>) -> Self {
        Self::start_with(exports, false, ServerConfig::default())
    }

    /// Also listens on TCP 127.0.0.1, port chosen by the kernel.
    pub fn start_with_tcp(exports: Vec<(&str, Arc<dyn Export>)>) -> Self {
        Self::start_with(exports, true, ServerConfig::default())
    }

    pub fn start_with(
        exports: Vec<(&str, Arc<dyn Export>)>,
        tcp: bool,
        config: ServerConfig,
    ) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let socket = dir.path().join("nbd.sock");
        let table = Arc::new(ExportTable::new());
        for (name, export) in exports {
            table.insert(name, export);
        }
        let shutdown = CancellationToken::new();
        let (ready_tx, ready_rx) = mpsc::channel();
        let thread = {
            let (socket, table, shutdown) = (socket.clone(), Arc::clone(&table), shutdown.clone());
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .expect("runtime");
                runtime.block_on(async move {
                    let mut listeners = vec![Listener::bind_unix(&socket).expect("bind unix")];
                    if tcp {
                        listeners.push(Listener::bind_tcp("127.0.0.1:0").await.expect("bind tcp"));
                    }
                    let tcp_addr = listeners.iter().find_map(Listener::tcp_addr);
                    ready_tx.send(tcp_addr).expect("test waits");
                    serve(table, listeners, config, shutdown).await;
                });
            })
        };
        let tcp = ready_rx.recv().expect("server thread started");
        Self {
            _dir: dir,
            socket,
            tcp,
            table,
            shutdown,
            thread: Some(thread),
        }
    }

    /// libnbd/qemu URI of `export` on the Unix socket.
    pub fn uri(&self, export: &str) -> String {
        format!("nbd+unix:///{export}?socket={}", self.socket.display())
    }

    /// Starts stopping the server (as dropping it does) on another thread,
    /// so the test can watch its clients meanwhile.
    pub fn stop_in_background(self) -> Stopping {
        let (done, finished) = mpsc::channel();
        let thread = std::thread::spawn(move || {
            drop(self);
            // The test may have given up waiting already.
            let _ = done.send(());
        });
        Stopping { finished, thread }
    }
}

/// A server being stopped by [`TestServer::stop_in_background`].
pub struct Stopping {
    finished: mpsc::Receiver<()>,
    thread: JoinHandle<()>,
}

impl Stopping {
    /// Whether the server has stopped, at this instant.
    pub fn finished(&self) -> bool {
        self.thread.is_finished()
    }

    /// Waits until the server has stopped and every connection has closed;
    /// fails with `hung` if that has not happened within [`HANG_GUARD`].
    pub fn finish(self, hung: &str) {
        match self.finished.recv_timeout(HANG_GUARD) {
            // Disconnected: the stopping thread panicked; join reports it.
            Ok(()) | Err(RecvTimeoutError::Disconnected) => {
                self.thread.join().expect("stopping the server panicked")
            }
            Err(RecvTimeoutError::Timeout) => {
                panic!("server still stopping after {HANG_GUARD:?}: {hung}")
            }
        }
    }
}

impl Drop for TestServer {
    /// Stops the server and waits until every connection has closed.
    fn drop(&mut self) {
        self.shutdown.cancel();
        if let Some(thread) = self.thread.take() {
            thread.join().expect("server thread panicked");
        }
    }
}

pub fn memory(size: u64) -> Arc<MemoryExport> {
    Arc::new(MemoryExport::new(size))
}

/// Finds `program` on PATH, failing loudly (CI installs it) if it is missing.
pub fn tool(program: &str, debian_package: &str) -> Command {
    let found = program.starts_with('/') && Path::new(program).exists()
        || std::env::var_os("PATH").is_some_and(|path| {
            std::env::split_paths(&path).any(|dir| dir.join(program).is_file())
        });
    assert!(
        found,
        "\n\n*** `{program}` is not installed: `apt-get install {debian_package}` ***\n\n"
    );
    Command::new(program)
}

/// Debian's python3 (python3-libnbd is importable only from it), checked to
/// have the `nbd` module.
pub fn python_with_libnbd() -> Command {
    let probe = tool("/usr/bin/python3", "python3")
        .args(["-c", "import nbd"])
        .output()
        .expect("run /usr/bin/python3");
    assert!(
        probe.status.success(),
        "\n\n*** python3 module `nbd` missing: `apt-get install python3-libnbd` ***\n{}\n",
        String::from_utf8_lossy(&probe.stderr)
    );
    Command::new("/usr/bin/python3")
}

/// Runs `command`, asserting success; returns its stdout.
pub fn run(command: &mut Command) -> String {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("spawn {command:?}: {e}"));
    assert_success(command, &output);
    String::from_utf8_lossy(&output.stdout).into_owned()
}

pub fn assert_success(command: &Command, output: &Output) {
    assert!(
        output.status.success(),
        "{command:?} failed ({}):\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Runs qemu-io on `uri` with `commands`, asserting that every one
/// succeeded (qemu-io exits 0 even when a command fails); returns its
/// output.
pub fn qemu_io(uri: &str, commands: &[&str]) -> String {
    let mut command = tool("qemu-io", "qemu-utils");
    command.args(["-f", "raw"]);
    for each in commands {
        command.args(["-c", each]);
    }
    command.arg(uri);
    let output = run(&mut command);
    assert!(
        !output.contains("failed") && !output.contains("error"),
        "{command:?}:\n{output}"
    );
    output
}

/// A call the server made to a [`RecordingExport`]: the ranges it asked
/// about or changed without data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    Trim {
        offset: u64,
        len: u64,
    },
    WriteZeroes {
        offset: u64,
        len: u64,
        may_trim: bool,
    },
    BlockStatus {
        offset: u64,
        len: u64,
    },
}

/// A memory export that counts the reads it has run, so a test can wait for
/// the server to have run the requests it admitted, and records every
/// trim, write zeroes and block status call, so a test sees how large the
/// requests that reached it were.
pub struct RecordingExport {
    pub inner: MemoryExport,
    recorded: Mutex<Recorded>,
    changed: Condvar,
}

#[derive(Default)]
struct Recorded {
    reads: u64,
    calls: Vec<Call>,
}

impl RecordingExport {
    pub fn new(inner: MemoryExport) -> Arc<Self> {
        Arc::new(Self {
            inner,
            recorded: Mutex::new(Recorded::default()),
            changed: Condvar::new(),
        })
    }

    /// Reads run so far.
    pub fn reads(&self) -> u64 {
        self.recorded.lock().unwrap().reads
    }

    /// Waits until at least `count` reads have run (failing after the hang
    /// guard); returns how many have.
    pub fn wait_for_reads(&self, count: u64) -> u64 {
        let recorded = self.recorded.lock().unwrap();
        let (recorded, _) = self
            .changed
            .wait_timeout_while(recorded, HANG_GUARD, |recorded| recorded.reads < count)
            .unwrap();
        assert!(
            recorded.reads >= count,
            "the server ran {} reads of the {count} it admits",
            recorded.reads
        );
        recorded.reads
    }

    /// The calls recorded since the last time, in order.
    pub fn take_calls(&self) -> Vec<Call> {
        std::mem::take(&mut self.recorded.lock().unwrap().calls)
    }

    fn record(&self, call: Call) {
        self.recorded.lock().unwrap().calls.push(call);
    }
}

impl Export for RecordingExport {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_only(&self) -> bool {
        false
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), ExportError> {
        self.inner.read(offset, buf)?;
        self.recorded.lock().unwrap().reads += 1;
        self.changed.notify_all();
        Ok(())
    }
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), ExportError> {
        self.inner.write(offset, data)
    }
    fn flush(&self) -> Result<(), ExportError> {
        self.inner.flush()
    }
    fn trim(&self, offset: u64, len: u64) -> Result<(), ExportError> {
        self.record(Call::Trim { offset, len });
        self.inner.trim(offset, len)
    }
    fn write_zeroes(
        &self,
        offset: u64,
        len: u64,
        may_trim: bool,
        fast: bool,
    ) -> Result<(), ExportError> {
        self.record(Call::WriteZeroes {
            offset,
            len,
            may_trim,
        });
        self.inner.write_zeroes(offset, len, may_trim, fast)
    }
    fn block_status(&self, offset: u64, len: u64) -> Result<Vec<StatusRun>, ExportError> {
        self.record(Call::BlockStatus { offset, len });
        self.inner.block_status(offset, len)
    }
}
