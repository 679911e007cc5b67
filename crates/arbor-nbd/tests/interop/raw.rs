//! Hostile and edge-case peers on raw sockets. The wire format is written out
//! by hand here, independently of the crate's codec.

use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::process::Command;
use std::sync::mpsc::{self, TryRecvError};

use std::time::{Duration, Instant};

use arbor_nbd::memory::MemoryExport;
use arbor_nbd::{Export, ServerConfig};

use crate::common::{
    assert_success, memory, run, tool, RecordingExport, TestServer, HANG_GUARD, MIB,
};

const IHAVEOPT: &[u8; 8] = b"IHAVEOPT";
pub(crate) const REPLY_MAGIC: u64 = 0x3e889045565a9;
const OPT_EXPORT_NAME: u32 = 1;
const OPT_ABORT: u32 = 2;
const OPT_GO: u32 = 7;
const REP_ACK: u32 = 1;
const REP_ERR_POLICY: u32 = (1 << 31) | 2;
const REP_ERR_UNSUP: u32 = 0x8000_0001;
const REP_ERR_INVALID: u32 = 0x8000_0003;
const CMD_READ: u16 = 0;
const CMD_WRITE: u16 = 1;
const CMD_DISC: u16 = 2;
const CMD_FLUSH: u16 = 3;
const CMD_BLOCK_STATUS: u16 = 7;
const EINVAL: u32 = 22;

/// A server timer set far beyond [`HANG_GUARD`]: a test that shows the
/// server acts on an event (a client leaving, shutdown) gives the timers
/// that could also end a connection this value, so that only the event can
/// make it pass within the hang guard.
const NEVER: Duration = Duration::from_secs(3600);

fn request_header(kind: u16, cookie: u64, offset: u64, length: u32) -> Vec<u8> {
    let mut header = 0x2560_9513u32.to_be_bytes().to_vec();
    header.extend_from_slice(&0u16.to_be_bytes());
    header.extend_from_slice(&kind.to_be_bytes());
    header.extend_from_slice(&cookie.to_be_bytes());
    header.extend_from_slice(&offset.to_be_bytes());
    header.extend_from_slice(&length.to_be_bytes());
    header
}

pub(crate) struct Peer(pub(crate) UnixStream);

impl Peer {
    pub(crate) fn connect(server: &TestServer) -> Self {
        let stream = UnixStream::connect(&server.socket).expect("connect");
        stream.set_read_timeout(Some(HANG_GUARD)).unwrap();
        Self(stream)
    }

    pub(crate) fn read_exact<const N: usize>(&mut self) -> [u8; N] {
        let mut buf = [0u8; N];
        self.0.read_exact(&mut buf).expect("read from server");
        buf
    }

    pub(crate) fn u32(&mut self) -> u32 {
        u32::from_be_bytes(self.read_exact())
    }

    pub(crate) fn send(&mut self, bytes: &[u8]) {
        self.0.write_all(bytes).expect("write to server");
    }

    /// Reads the greeting and answers with the given client flags.
    pub(crate) fn greet(server: &TestServer, client_flags: u32) -> Self {
        let mut peer = Self::connect(server);
        let greeting: [u8; 18] = peer.read_exact();
        assert_eq!(&greeting[..8], b"NBDMAGIC");
        assert_eq!(&greeting[8..16], IHAVEOPT);
        assert_eq!(u16::from_be_bytes([greeting[16], greeting[17]]), 0b11);
        peer.send(&client_flags.to_be_bytes());
        peer
    }

    pub(crate) fn option(&mut self, code: u32, data: &[u8]) {
        let mut message = IHAVEOPT.to_vec();
        message.extend_from_slice(&code.to_be_bytes());
        message.extend_from_slice(&(data.len() as u32).to_be_bytes());
        message.extend_from_slice(data);
        self.send(&message);
    }

    /// Reads one option reply: (option, reply type, data).
    pub(crate) fn option_reply(&mut self) -> (u32, u32, Vec<u8>) {
        let magic = u64::from_be_bytes(self.read_exact());
        assert_eq!(magic, REPLY_MAGIC);
        let (code, kind, len) = (self.u32(), self.u32(), self.u32());
        let mut data = vec![0u8; len as usize];
        self.0.read_exact(&mut data).unwrap();
        (code, kind, data)
    }

    /// NBD_OPT_GO without structured replies; returns the export size.
    /// `NBD_OPT_GO` asking for no information: the client never learns the
    /// block sizes, so the server serves it byte-granular requests.
    fn go(&mut self, name: &str) -> u64 {
        self.go_asking(name, &[])
    }

    /// `NBD_OPT_GO` asking for `NBD_INFO_BLOCK_SIZE`: the client learns the
    /// 512-byte minimum and the 32 MiB maximum and is held to them.
    fn go_with_block_sizes(&mut self, name: &str) -> u64 {
        self.go_asking(name, &[3])
    }

    fn go_asking(&mut self, name: &str, infos: &[u16]) -> u64 {
        self.go_info(name, infos).0
    }

    /// `NBD_OPT_GO` asking for `infos`; returns the export size and the
    /// transmission flags.
    pub(crate) fn go_info(&mut self, name: &str, infos: &[u16]) -> (u64, u16) {
        let mut data = (name.len() as u32).to_be_bytes().to_vec();
        data.extend_from_slice(name.as_bytes());
        data.extend_from_slice(&(infos.len() as u16).to_be_bytes());
        for info in infos {
            data.extend_from_slice(&info.to_be_bytes());
        }
        self.option(OPT_GO, &data);
        let mut size = None;
        loop {
            let (code, kind, data) = self.option_reply();
            assert_eq!(code, OPT_GO);
            match kind {
                REP_ACK => return size.expect("NBD_INFO_EXPORT before ACK"),
                3 if data[..2] == [0, 0] => {
                    size = Some((
                        u64::from_be_bytes(data[2..10].try_into().unwrap()),
                        u16::from_be_bytes([data[10], data[11]]),
                    ))
                }
                3 => {}
                other => panic!(
                    "GO failed with {other:#x}: {}",
                    String::from_utf8_lossy(&data)
                ),
            }
        }
    }

    fn request(&mut self, kind: u16, cookie: u64, offset: u64, length: u32) {
        self.send(&request_header(kind, cookie, offset, length));
    }

    /// Reads a simple reply: (error, cookie).
    fn simple_reply(&mut self) -> (u32, u64) {
        assert_eq!(self.u32(), 0x6744_6698, "simple reply magic");
        let error = self.u32();
        (error, u64::from_be_bytes(self.read_exact()))
    }

    /// Waits for the server to close the connection: true on end of file,
    /// false if data arrives instead or nothing happens within the hang guard.
    pub(crate) fn closed_by_server(&mut self) -> bool {
        let mut byte = [0u8; 1];
        match self.0.read(&mut byte) {
            Ok(0) => true,
            Err(e) if e.kind() == ErrorKind::ConnectionReset => true,
            Ok(_) => false,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => false,
            Err(e) => panic!("waiting for close: {e}"),
        }
    }

    /// Waits for the server to close the connection, without reading:
    /// reading would make a stalled client a live one. Writes to a socket
    /// whose peer closed fail; until then the probes fill the socket buffer
    /// (the server, holding its budget's worth of requests, reads no more)
    /// and the next write blocks until the close wakes it. False if the
    /// connection is still open after the hang guard.
    fn closed_without_reading(&mut self) -> bool {
        let probe = request_header(CMD_FLUSH, 0, 0, 0);
        self.0.set_write_timeout(Some(HANG_GUARD)).unwrap();
        let deadline = Instant::now() + HANG_GUARD;
        while Instant::now() < deadline {
            match self.0.write_all(&probe) {
                Ok(()) => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    return false
                }
                Err(e) if is_closed(&e) => return true,
                Err(e) => panic!("probing for close: {e}"),
            }
        }
        false
    }

    /// Whether the connection is open at this instant, without waiting and
    /// without reading: a write succeeds, or would block, only while the
    /// server holds the connection.
    fn open_without_reading(&mut self) -> bool {
        let probe = request_header(CMD_FLUSH, 0, 0, 0);
        self.0.set_nonblocking(true).unwrap();
        let written = self.0.write(&probe);
        self.0.set_nonblocking(false).unwrap();
        match written {
            Ok(_) => true,
            Err(e) if e.kind() == ErrorKind::WouldBlock => true,
            Err(e) if is_closed(&e) => false,
            Err(e) => panic!("probing for close: {e}"),
        }
    }

    /// Whether the connection is open and silent at this instant, without
    /// waiting: for a client the server owes nothing, reading finds neither
    /// data nor end of file.
    fn open_and_quiet(&mut self) -> bool {
        let mut byte = [0u8; 1];
        self.0.set_nonblocking(true).unwrap();
        let read = self.0.read(&mut byte);
        self.0.set_nonblocking(false).unwrap();
        match read {
            Err(e) if e.kind() == ErrorKind::WouldBlock => true,
            Ok(0) => false,
            Err(e) if is_closed(&e) => false,
            Ok(_) => panic!("unexpected data from the server"),
            Err(e) => panic!("probing for close: {e}"),
        }
    }
}

/// A write or read error that says the server closed the connection.
fn is_closed(error: &std::io::Error) -> bool {
    matches!(
        error.kind(),
        ErrorKind::BrokenPipe | ErrorKind::ConnectionReset
    )
}

fn server() -> TestServer {
    TestServer::start(vec![("vol", memory(4 * MIB))])
}

#[test]
fn malformed_handshakes_are_dropped_without_affecting_a_concurrent_client() {
    let server = server();
    let mut good = Peer::greet(&server, 0b11);

    let mut unknown_flags = Peer::greet(&server, 0x8000_0003);
    assert!(unknown_flags.closed_by_server());

    let mut bad_magic = Peer::greet(&server, 0b11);
    bad_magic.send(b"NOTANOPT\0\0\0\x07\0\0\0\0");
    assert!(bad_magic.closed_by_server());

    let mut huge_option = Peer::greet(&server, 0b11);
    huge_option.send(IHAVEOPT);
    huge_option.send(&[0, 0, 0, 7, 0x10, 0, 0, 0]);
    assert!(huge_option.closed_by_server());

    let mut garbage = Peer::connect(&server);
    let _: [u8; 18] = garbage.read_exact();
    garbage.send(&[0xff; 64]);
    assert!(garbage.closed_by_server());

    // The good client, mid-handshake all along, is unaffected.
    assert_eq!(good.go("vol"), 4 * MIB);
    reads_512(&mut good, 1);
    run(tool("nbdinfo", "libnbd-bin").args(["--size", &server.uri("vol")]));
}

#[test]
fn unknown_and_malformed_options_get_error_replies_and_haggling_continues() {
    let server = server();
    let mut peer = Peer::greet(&server, 0b11);
    peer.option(0x7777, b"whatever");
    assert_eq!(peer.option_reply().1, REP_ERR_UNSUP);
    peer.option(5, &[]); // STARTTLS: this listener has no TLS
    assert_eq!(peer.option_reply().1, REP_ERR_POLICY);
    // GO whose name length points past the end of the option.
    peer.option(OPT_GO, &[0, 0, 1, 0, b'v']);
    assert_eq!(peer.option_reply().1, REP_ERR_INVALID);
    // LIST must not carry data.
    peer.option(3, b"x");
    assert_eq!(peer.option_reply().1, REP_ERR_INVALID);
    // SET_META_CONTEXT before structured replies.
    peer.option(10, &[0, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(peer.option_reply().1, REP_ERR_INVALID);
    assert_eq!(peer.go("vol"), 4 * MIB);
}

#[test]
fn abort_is_acknowledged_then_closed() {
    let server = server();
    let mut peer = Peer::greet(&server, 0b11);
    peer.option(OPT_ABORT, &[]);
    assert_eq!(peer.option_reply(), (OPT_ABORT, REP_ACK, vec![]));
    assert!(peer.closed_by_server());
}

#[test]
fn export_name_honours_no_zeroes_and_drops_unknown_exports() {
    let server = server();
    let mut peer = Peer::greet(&server, 0b11);
    peer.option(OPT_EXPORT_NAME, b"vol");
    let reply: [u8; 10] = peer.read_exact();
    assert_eq!(u64::from_be_bytes(reply[..8].try_into().unwrap()), 4 * MIB);
    // No padding: the next bytes are the reply to our first request.
    peer.request(CMD_READ, 9, 0, 512);
    assert_eq!(peer.simple_reply(), (0, 9));

    let mut zeroes = Peer::greet(&server, 0b01);
    zeroes.option(OPT_EXPORT_NAME, b"vol");
    let _: [u8; 10] = zeroes.read_exact();
    assert_eq!(zeroes.read_exact::<124>(), [0u8; 124]);

    let mut unknown = Peer::greet(&server, 0b11);
    unknown.option(OPT_EXPORT_NAME, b"no-such-volume");
    assert!(unknown.closed_by_server());
}

#[test]
fn unknown_command_and_unnegotiated_block_status_get_einval() {
    let server = server();
    let mut peer = Peer::greet(&server, 0b11);
    peer.go("vol");
    peer.request(99, 1, 0, 512);
    assert_eq!(peer.simple_reply(), (EINVAL, 1));
    peer.request(CMD_BLOCK_STATUS, 2, 0, 512);
    assert_eq!(peer.simple_reply(), (EINVAL, 2));
    peer.request(CMD_READ, 3, 4 * MIB, 512);
    assert_eq!(peer.simple_reply(), (EINVAL, 3));
    peer.request(CMD_READ, 4, 0, 512);
    assert_eq!(peer.simple_reply(), (0, 4));
}

#[test]
fn bad_request_magic_drops_the_connection() {
    let server = server();
    let mut peer = Peer::greet(&server, 0b11);
    peer.go("vol");
    peer.send(&[0xAB; 28]);
    assert!(peer.closed_by_server());
}

#[test]
fn disconnect_completes_requests_in_flight_first() {
    let export = memory(4 * MIB);
    let server = TestServer::start(vec![("vol", export.clone())]);
    let mut peer = Peer::greet(&server, 0b11);
    peer.go("vol");
    peer.request(CMD_WRITE, 7, MIB, MIB as u32);
    peer.send(&vec![0x3c; MIB as usize]);
    peer.request(CMD_DISC, 8, 0, 0);
    assert_eq!(peer.simple_reply(), (0, 7));
    assert!(peer.closed_by_server());
    let mut data = vec![0u8; MIB as usize];
    export.read(MIB, &mut data).unwrap();
    assert!(data.iter().all(|&b| b == 0x3c));
}

#[test]
fn oversized_write_payload_is_consumed_and_refused() {
    // Over the 32 MiB a client learned, and over the 64 MiB served to one
    // that never learned it.
    let server = server();
    for (negotiates, oversized) in [(true, 32 * MIB as u32 + 512), (false, 64 * MIB as u32 + 1)] {
        let mut peer = Peer::greet(&server, 0b11);
        if negotiates {
            peer.go_with_block_sizes("vol");
        } else {
            peer.go("vol");
        }
        peer.request(CMD_WRITE, 1, 0, oversized);
        peer.send(&vec![1u8; oversized as usize]);
        assert_eq!(peer.simple_reply(), (EINVAL, 1), "{oversized} bytes");
        peer.request(CMD_READ, 2, 0, 512);
        assert_eq!(peer.simple_reply(), (0, 2));
        assert_eq!(peer.read_exact::<512>(), [0u8; 512]);
    }
}

/// A server whose timers are all [`NEVER`]: what it does within the hang
/// guard, it does because of an event.
fn server_without_timers() -> TestServer {
    let config = ServerConfig {
        handshake_timeout: NEVER,
        reply_stall_timeout: NEVER,
        shutdown_grace: NEVER,
        ..ServerConfig::default()
    };
    TestServer::start_with(vec![("vol", memory(4 * MIB))], false, config)
}

#[test]
fn client_vanishing_mid_request_leaves_the_server_healthy() {
    // No timer (stall, grace) can end the abandoned connections within the
    // hang guard: shutdown completes only if the server closed them when
    // their clients vanished.
    let server = server_without_timers();
    for _ in 0..8 {
        let mut peer = Peer::greet(&server, 0b11);
        peer.go("vol");
        // A read whose reply nobody collects, then half a write.
        peer.request(CMD_READ, 1, 0, MIB as u32);
        peer.request(CMD_WRITE, 2, 0, MIB as u32);
        peer.send(&vec![0u8; 4096]);
        drop(peer);
    }
    run(tool("nbdinfo", "libnbd-bin").args(["--size", &server.uri("vol")]));
    server
        .stop_in_background()
        .finish("shutdown waited on abandoned connections");
}

#[test]
fn shutdown_closes_idle_and_handshaking_connections() {
    // Neither the handshake timeout nor the shutdown grace can close these
    // connections within the hang guard: shutdown itself must.
    let server = server_without_timers();
    let mut idle = Peer::greet(&server, 0b11);
    idle.go("vol");
    let mut haggling = Peer::greet(&server, 0b11);
    let stopping = server.stop_in_background();
    assert!(idle.closed_by_server(), "shutdown left an idle client open");
    assert!(
        haggling.closed_by_server(),
        "shutdown left a client open mid-handshake"
    );
    stopping.finish("shutdown waited on idle or handshaking connections");
}

#[test]
fn silent_clients_time_out_in_the_handshake() {
    let timeout_after = |handshake_timeout| {
        let config = ServerConfig {
            handshake_timeout,
            ..ServerConfig::default()
        };
        TestServer::start_with(vec![("vol", memory(MIB))], false, config)
    };
    let quick = timeout_after(Duration::from_millis(200));
    // The control: the same silent client, connected first, on a server
    // whose handshake timeout outlasts the test.
    let patient = timeout_after(NEVER);
    let mut control = Peer::connect(&patient);
    let _: [u8; 18] = control.read_exact();
    let mut silent = Peer::connect(&quick);
    let _: [u8; 18] = silent.read_exact();
    assert!(
        silent.closed_by_server(),
        "a silent client was not dropped in the handshake"
    );
    // So the configured timeout, not something else, closed it.
    assert!(
        control.open_and_quiet(),
        "a silent client was dropped before its handshake timeout"
    );
}

fn resident_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| value.split_whitespace().next())
        .and_then(|kib| kib.parse().ok())
        .expect("VmRSS");
    kib * 1024
}

#[test]
fn a_client_that_never_reads_replies_is_throttled_and_dropped_at_shutdown() {
    // Only the shutdown grace period can end the connection within the
    // hang guard: the stall timeout is out of reach.
    let grace_of = |shutdown_grace| ServerConfig {
        shutdown_grace,
        reply_stall_timeout: NEVER,
        ..ServerConfig::default()
    };
    let config = grace_of(Duration::from_millis(300));
    // 1 MiB reads a connection's budget admits before it waits.
    let admitted = (config.max_requests_in_flight as u64)
        .min(u64::from(config.max_bytes_in_flight) / MIB)
        .min(u64::from(config.max_bytes_total) / MIB);
    // 2 GiB of reads requested in one write (57 KiB, which the socket
    // buffer holds even once the server stops reading), no reply read.
    let requests: Vec<u8> = (0..2048)
        .flat_map(|cookie| request_header(CMD_READ, cookie, (cookie % 64) * MIB, MIB as u32))
        .collect();
    let never_reading = |server: &TestServer| {
        let mut peer = Peer::greet(server, 0b11);
        peer.go("vol");
        peer.send(&requests);
        peer
    };
    let export = RecordingExport::new(MemoryExport::new(64 * MIB));
    let server = TestServer::start_with(vec![("vol", export.clone())], false, config);
    let before = resident_bytes();
    let mut greedy = never_reading(&server);
    // Once the server has run every read it admits, all their replies are
    // in its memory. Unbounded, the replies alone would take 2 GiB; the
    // budget allows 64 MiB (the margin is for other tests running in this
    // process meanwhile).
    export.wait_for_reads(admitted);
    let growth = resident_bytes().saturating_sub(before);
    assert!(
        growth < 1024 * MIB,
        "server memory grew by {} MiB",
        growth / MIB
    );
    // Other clients are unaffected.
    run(tool("nbdinfo", "libnbd-bin").args(["--size", &server.uri("vol")]));

    // The control, stopped first: the same client on a server whose grace
    // period outlasts the test.
    let control_export = RecordingExport::new(MemoryExport::new(64 * MIB));
    let patient = TestServer::start_with(
        vec![("vol", control_export.clone())],
        false,
        grace_of(NEVER),
    );
    let mut control = never_reading(&patient);
    control_export.wait_for_reads(admitted);
    let patient_stopping = patient.stop_in_background();

    server
        .stop_in_background()
        .finish("shutdown waited on a client that never reads");
    assert!(
        greedy.closed_without_reading(),
        "the client that never reads was not dropped at shutdown"
    );
    // So the configured grace period, not something else, ended it.
    assert!(
        !patient_stopping.finished() && control.open_without_reading(),
        "a client that never reads was dropped before the shutdown grace period"
    );
    // Over the connection's whole life, counted exactly: beyond what the
    // budget admits, the server ran only reads whose replies the socket
    // took, nowhere near the 2048 requested.
    let reads = export.reads();
    assert!(
        reads < 1024,
        "the server ran {reads} reads for a client that never reads replies"
    );
    // Its client gone, the control's connection ends and its server stops.
    drop(control);
    patient_stopping.finish("shutdown waited on a client that has left");
}

#[test]
fn clients_that_stop_reading_are_dropped_and_cannot_starve_others() {
    // The whole server may hold one maximal request's worth of data.
    let stalling_after = |reply_stall_timeout| {
        let config = ServerConfig {
            max_bytes_total: 32 * MIB as u32,
            reply_stall_timeout,
            ..ServerConfig::default()
        };
        TestServer::start_with(vec![("vol", memory(64 * MIB))], false, config)
    };
    let requests: Vec<u8> = (0..512)
        .flat_map(|cookie| request_header(CMD_READ, cookie, (cookie % 64) * MIB, MIB as u32))
        .collect();
    let greedy = |server: &TestServer| {
        let mut peer = Peer::greet(server, 0b11);
        peer.go("vol");
        peer.send(&requests);
        peer
    };
    // The control, started first: a client that stops reading, on a server
    // whose stall timeout outlasts the test.
    let patient = stalling_after(NEVER);
    let mut control = greedy(&patient);
    let server = stalling_after(Duration::from_millis(500));
    let stalled: Vec<Peer> = (0..3).map(|_| greedy(&server)).collect();
    // The greedy clients hold the shared budget until the server gives up
    // on them; then a well-behaved client copies the whole export. Were
    // they never dropped, the copy would wait forever: the hang guard ends
    // it (exit status 124) so the test fails instead of hanging.
    let target = tempfile::NamedTempFile::new().unwrap();
    let target = target.path().to_str().unwrap().to_owned();
    tool("nbdcopy", "libnbd-bin");
    let mut copy = Command::new("timeout");
    copy.arg(HANG_GUARD.as_secs().to_string())
        .args(["nbdcopy", &server.uri("vol"), &target]);
    let output = copy.output().expect("run nbdcopy");
    assert_ne!(
        output.status.code(),
        Some(124),
        "clients that stopped reading starved nbdcopy"
    );
    assert_success(&copy, &output);
    for mut peer in stalled {
        assert!(
            peer.closed_without_reading(),
            "a client that never reads is dropped"
        );
    }
    // So the configured stall timeout, not something else, dropped them.
    assert!(
        control.open_without_reading(),
        "a client that stopped reading was dropped before its stall timeout"
    );
}

/// A server of one 1 MiB memory export with `max_connections` slots and
/// no handshake timeout (only a client leaving, or an eviction, frees one).
fn slots_server(max_connections: usize) -> TestServer {
    let config = ServerConfig {
        max_connections,
        handshake_timeout: NEVER,
        ..ServerConfig::default()
    };
    TestServer::start_with(vec![("vol", memory(MIB))], false, config)
}

/// `peer` reads 512 bytes at 0 with `cookie` and gets them.
fn reads_512(peer: &mut Peer, cookie: u64) {
    peer.request(CMD_READ, cookie, 0, 512);
    assert_eq!(peer.simple_reply(), (0, cookie), "request {cookie}");
    let _: [u8; 512] = peer.read_exact();
}

#[test]
fn clients_over_the_connection_limit_wait_for_a_free_slot() {
    // Only a client leaving frees a slot: no handshake timeout does, and
    // clients in transmission are never dropped to make room.
    let server = slots_server(2);
    let mut first = Peer::greet(&server, 0b11);
    assert_eq!(first.go("vol"), MIB);
    let mut second = Peer::greet(&server, 0b11);
    assert_eq!(second.go("vol"), MIB);
    let mut third = Peer::connect(&server);
    // Says when the server greets the third client; fails after the hang
    // guard (dropping the sender) if it never does.
    let (greeted, greeting) = mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let _ = greeted.send(third.read_exact::<18>());
    });
    // The server goes on serving the clients it holds: they are served
    // while the third one waits.
    for peer in [&mut first, &mut second] {
        reads_512(peer, 1);
    }
    assert_eq!(
        greeting.try_recv(),
        Err(TryRecvError::Empty),
        "third client served while two held the slots"
    );
    drop(first);
    let greeting = greeting
        .recv_timeout(HANG_GUARD)
        .expect("third client served once a slot was free");
    assert_eq!(&greeting[..8], b"NBDMAGIC");
    waiter.join().unwrap();
}

#[test]
fn clients_stalled_in_the_handshake_make_room_for_new_ones() {
    // Slots full of clients that connect and say nothing (a flood) must
    // not keep a new client out until their handshake times out: the
    // oldest handshake is dropped instead. A client in transmission keeps
    // its slot.
    let server = slots_server(3);
    let mut serving = Peer::greet(&server, 0b11);
    assert_eq!(serving.go("vol"), MIB);
    let mut oldest = Peer::greet(&server, 0b11);
    let mut newer = Peer::greet(&server, 0b11);
    let mut polite = Peer::greet(&server, 0b11);
    assert!(oldest.closed_by_server(), "the oldest handshake is dropped");
    assert_eq!(polite.go("vol"), MIB);
    reads_512(&mut polite, 1);
    // The next newcomer drops the next oldest handshake, never a session.
    let _another = Peer::greet(&server, 0b11);
    assert!(newer.closed_by_server());
    for peer in [&mut serving, &mut polite] {
        reads_512(peer, 2);
    }
}

/// Regression (a CI run under load): a client whose handshake had just
/// ended could be dropped by the next newcomer, because the server took
/// it off the list of handshakes only after sending the reply that ends
/// it. With one slot, each new client must wait while the session lives,
/// never drop it.
#[test]
fn a_session_is_never_dropped_for_a_newcomer_just_after_its_handshake() {
    let server = slots_server(2);
    for round in 0..300u64 {
        let mut session = Peer::greet(&server, 0b11);
        assert_eq!(session.go("vol"), MIB);
        // A newcomer at once, and another: the second makes room by
        // dropping the first (a handshake), never the session.
        let _first = Peer::greet(&server, 0b11);
        let _second = Peer::greet(&server, 0b11);
        reads_512(&mut session, round);
    }
}

/// A connection polling for its next request keeps what it has read of a
/// request that arrives in pieces: every request below comes a few bytes at
/// a time, with pauses shorter than the polling window (which its first
/// requests open), and each must be served whole, its data where it was
/// written. Polling that restarted its read would lose the pieces and
/// desynchronise the stream.
#[test]
fn requests_arriving_in_pieces_while_the_connection_polls_are_served_whole() {
    let config = ServerConfig {
        poll: arbor_nbd::PollLimits {
            max: Duration::from_millis(1),
            pollers: 4,
        },
        ..ServerConfig::default()
    };
    let server = TestServer::start_with(vec![("vol", memory(MIB))], false, config);
    let mut peer = Peer::greet(&server, 0b11);
    peer.go("vol");
    let pause = || std::thread::sleep(Duration::from_micros(200));
    let in_pieces = |peer: &mut Peer, bytes: &[u8]| {
        for piece in bytes.chunks(5) {
            peer.send(piece);
            pause();
        }
    };
    for round in 0..32u64 {
        let offset = round * 4096;
        let data: Vec<u8> = (0..4096u32).map(|i| (i as u64 * 7 + round) as u8).collect();
        in_pieces(
            &mut peer,
            &request_header(CMD_WRITE, 2 * round, offset, 4096),
        );
        in_pieces(&mut peer, &data[..20]);
        peer.send(&data[20..]);
        assert_eq!(peer.simple_reply(), (0, 2 * round), "write {round}");
        pause();
        in_pieces(
            &mut peer,
            &request_header(CMD_READ, 2 * round + 1, offset, 4096),
        );
        assert_eq!(peer.simple_reply(), (0, 2 * round + 1), "read {round}");
        assert_eq!(peer.read_exact::<4096>().to_vec(), data, "read {round}");
    }
}
