//! python3-libnbd scripts (`libnbd_checks.py`) exercising every command and
//! error case through libnbd.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};

use arbor_nbd::memory::MemoryExport;
use arbor_nbd::{Export, ExportError, StatusRun};

use crate::common::{assert_success, memory, python_with_libnbd, TestServer, HANG_GUARD, MIB};

fn check(name: &str, server: &TestServer) -> Command {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/interop/libnbd_checks.py");
    let mut command = python_with_libnbd();
    command.arg(script).arg(name).arg(&server.socket);
    command
}

fn run_check(name: &str, server: &TestServer) {
    let mut command = check(name, server);
    let output = command.output().expect("run python");
    assert_success(&command, &output);
}

fn standard_server() -> TestServer {
    TestServer::start(vec![
        ("vol", memory(64 * MIB)),
        ("gate", Arc::new(GateExport::new())),
    ])
}

#[test]
fn every_command() {
    run_check("commands", &standard_server());
}

#[test]
fn simple_replies_without_structured_negotiation() {
    run_check("simple_replies", &standard_server());
}

#[test]
fn invalid_requests_get_the_specified_errors() {
    run_check("error_cases", &standard_server());
    run_check("oversized_simple_read", &standard_server());
}

#[test]
fn read_only_export_refuses_writes_with_eperm() {
    let server = TestServer::start(vec![("snap", Arc::new(MemoryExport::new(MIB).read_only()))]);
    run_check("read_only", &server);
}

#[test]
fn full_pool_gives_enospc() {
    let export = MemoryExport::new(16 * MIB).with_capacity(8192);
    let server = TestServer::start(vec![("tiny-pool", Arc::new(export))]);
    run_check("pool_full", &server);
}

#[test]
fn deleted_export_gives_eshutdown() {
    let export = memory(MIB);
    let server = TestServer::start(vec![("doomed", export.clone())]);
    let mut command = check("export_gone", &server);
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn python");
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "connected");
    server.table.remove("doomed");
    export.mark_gone();
    child.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    let output = child.wait_with_output().unwrap();
    assert_success(&command, &output);
}

#[test]
fn flush_on_one_connection_covers_writes_on_another() {
    run_check("multi_conn", &standard_server());
}

#[test]
fn many_clients_on_many_exports_at_once() {
    let server = TestServer::start(
        ["vol", "vol2", "vol3", "vol4"]
            .into_iter()
            .map(|name| (name, memory(8 * MIB) as Arc<dyn Export>))
            .collect(),
    );
    run_check("many_clients", &server);
}

#[test]
fn pipelined_requests() {
    run_check("pipelined", &standard_server());
}

#[test]
fn replies_are_sent_out_of_order() {
    run_check("out_of_order", &standard_server());
}

#[test]
fn option_haggling() {
    run_check("negotiation", &standard_server());
}

/// An export whose read at offset 0 waits until some write has completed
/// (giving up after the hang guard, so a serializing server fails instead of
/// hanging).
struct GateExport {
    inner: MemoryExport,
    opened: Mutex<bool>,
    changed: Condvar,
}

impl GateExport {
    fn new() -> Self {
        Self {
            inner: MemoryExport::new(MIB),
            opened: Mutex::new(false),
            changed: Condvar::new(),
        }
    }
}

impl Export for GateExport {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_only(&self) -> bool {
        false
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), ExportError> {
        if offset == 0 {
            let opened = self.opened.lock().unwrap();
            let (opened, _) = self
                .changed
                .wait_timeout_while(opened, HANG_GUARD, |opened| !*opened)
                .unwrap();
            if !*opened {
                return Err(ExportError::Io("gate never opened".into()));
            }
        }
        self.inner.read(offset, buf)
    }
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), ExportError> {
        self.inner.write(offset, data)?;
        *self.opened.lock().unwrap() = true;
        self.changed.notify_all();
        Ok(())
    }
    fn flush(&self) -> Result<(), ExportError> {
        self.inner.flush()
    }
    fn trim(&self, offset: u64, len: u64) -> Result<(), ExportError> {
        self.inner.trim(offset, len)
    }
    fn write_zeroes(
        &self,
        offset: u64,
        len: u64,
        may_trim: bool,
        fast: bool,
    ) -> Result<(), ExportError> {
        self.inner.write_zeroes(offset, len, may_trim, fast)
    }
    fn block_status(&self, offset: u64, len: u64) -> Result<Vec<StatusRun>, ExportError> {
        self.inner.block_status(offset, len)
    }
}
