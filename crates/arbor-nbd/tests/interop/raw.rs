//! Hostile and edge-case peers on raw sockets. The wire format is written out
//! by hand here, independently of the crate's codec.

use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use arbor_nbd::{Export, ServerConfig};

use crate::common::{memory, run, tool, TestServer, MIB};

const IHAVEOPT: &[u8; 8] = b"IHAVEOPT";
const REPLY_MAGIC: u64 = 0x3e889045565a9;
const OPT_EXPORT_NAME: u32 = 1;
const OPT_ABORT: u32 = 2;
const OPT_GO: u32 = 7;
const REP_ACK: u32 = 1;
const REP_ERR_UNSUP: u32 = 0x8000_0001;
const REP_ERR_INVALID: u32 = 0x8000_0003;
const CMD_READ: u16 = 0;
const CMD_WRITE: u16 = 1;
const CMD_DISC: u16 = 2;
const CMD_FLUSH: u16 = 3;
const CMD_BLOCK_STATUS: u16 = 7;
const EINVAL: u32 = 22;

fn request_header(kind: u16, cookie: u64, offset: u64, length: u32) -> Vec<u8> {
    let mut header = 0x2560_9513u32.to_be_bytes().to_vec();
    header.extend_from_slice(&0u16.to_be_bytes());
    header.extend_from_slice(&kind.to_be_bytes());
    header.extend_from_slice(&cookie.to_be_bytes());
    header.extend_from_slice(&offset.to_be_bytes());
    header.extend_from_slice(&length.to_be_bytes());
    header
}

struct Peer(UnixStream);

impl Peer {
    fn connect(server: &TestServer) -> Self {
        let stream = UnixStream::connect(&server.socket).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        Self(stream)
    }

    fn read_exact<const N: usize>(&mut self) -> [u8; N] {
        let mut buf = [0u8; N];
        self.0.read_exact(&mut buf).expect("read from server");
        buf
    }

    fn u32(&mut self) -> u32 {
        u32::from_be_bytes(self.read_exact())
    }

    fn send(&mut self, bytes: &[u8]) {
        self.0.write_all(bytes).expect("write to server");
    }

    /// Reads the greeting and answers with the given client flags.
    fn greet(server: &TestServer, client_flags: u32) -> Self {
        let mut peer = Self::connect(server);
        let greeting: [u8; 18] = peer.read_exact();
        assert_eq!(&greeting[..8], b"NBDMAGIC");
        assert_eq!(&greeting[8..16], IHAVEOPT);
        assert_eq!(u16::from_be_bytes([greeting[16], greeting[17]]), 0b11);
        peer.send(&client_flags.to_be_bytes());
        peer
    }

    fn option(&mut self, code: u32, data: &[u8]) {
        let mut message = IHAVEOPT.to_vec();
        message.extend_from_slice(&code.to_be_bytes());
        message.extend_from_slice(&(data.len() as u32).to_be_bytes());
        message.extend_from_slice(data);
        self.send(&message);
    }

    /// Reads one option reply: (option, reply type, data).
    fn option_reply(&mut self) -> (u32, u32, Vec<u8>) {
        let magic = u64::from_be_bytes(self.read_exact());
        assert_eq!(magic, REPLY_MAGIC);
        let (code, kind, len) = (self.u32(), self.u32(), self.u32());
        let mut data = vec![0u8; len as usize];
        self.0.read_exact(&mut data).unwrap();
        (code, kind, data)
    }

    /// NBD_OPT_GO without structured replies; returns the export size.
    fn go(&mut self, name: &str) -> u64 {
        let mut data = (name.len() as u32).to_be_bytes().to_vec();
        data.extend_from_slice(name.as_bytes());
        data.extend_from_slice(&0u16.to_be_bytes());
        self.option(OPT_GO, &data);
        let mut size = None;
        loop {
            let (code, kind, data) = self.option_reply();
            assert_eq!(code, OPT_GO);
            match kind {
                REP_ACK => return size.expect("NBD_INFO_EXPORT before ACK"),
                3 if data[..2] == [0, 0] => {
                    size = Some(u64::from_be_bytes(data[2..10].try_into().unwrap()))
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

    /// True once the server has closed the connection.
    fn closed_by_server(&mut self) -> bool {
        let mut byte = [0u8; 1];
        match self.0.read(&mut byte) {
            Ok(0) => true,
            Err(e) if e.kind() == ErrorKind::ConnectionReset => true,
            Ok(_) => false,
            Err(e) => panic!("waiting for close: {e}"),
        }
    }

    /// Whether the server has closed the connection, waiting up to 10 s,
    /// without reading: reading would make a stalled client a live one.
    /// Writes to a socket whose peer closed fail.
    fn closed_without_reading(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        let probe = request_header(CMD_FLUSH, 0, 0, 0);
        while Instant::now() < deadline {
            if self.0.write_all(&probe).is_err() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }
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
    good.request(CMD_READ, 1, 0, 512);
    assert_eq!(good.simple_reply(), (0, 1));
    let _: [u8; 512] = good.read_exact();
    run(tool("nbdinfo", "libnbd-bin").args(["--size", &server.uri("vol")]));
}

#[test]
fn unknown_and_malformed_options_get_error_replies_and_haggling_continues() {
    let server = server();
    let mut peer = Peer::greet(&server, 0b11);
    peer.option(0x7777, b"whatever");
    assert_eq!(peer.option_reply().1, REP_ERR_UNSUP);
    peer.option(5, &[]); // STARTTLS: not supported
    assert_eq!(peer.option_reply().1, REP_ERR_UNSUP);
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
    let server = server();
    let mut peer = Peer::greet(&server, 0b11);
    peer.go("vol");
    let oversized = 32 * MIB as u32 + 512;
    peer.request(CMD_WRITE, 1, 0, oversized);
    peer.send(&vec![1u8; oversized as usize]);
    assert_eq!(peer.simple_reply(), (EINVAL, 1));
    peer.request(CMD_READ, 2, 0, 512);
    assert_eq!(peer.simple_reply(), (0, 2));
    assert_eq!(peer.read_exact::<512>(), [0u8; 512]);
}

#[test]
fn client_vanishing_mid_request_leaves_the_server_healthy() {
    let server = server();
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
    let started = Instant::now();
    drop(server);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "shutdown waited on abandoned connections"
    );
}

#[test]
fn shutdown_closes_idle_and_handshaking_connections() {
    let server = server();
    let mut idle = Peer::greet(&server, 0b11);
    idle.go("vol");
    let mut haggling = Peer::greet(&server, 0b11);
    let started = Instant::now();
    let stopper = std::thread::spawn(move || drop(server));
    assert!(idle.closed_by_server());
    assert!(haggling.closed_by_server());
    stopper.join().unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn silent_clients_time_out_in_the_handshake() {
    let config = ServerConfig {
        handshake_timeout: Duration::from_millis(200),
        ..ServerConfig::default()
    };
    let server = TestServer::start_with(vec![("vol", memory(MIB))], false, config);
    let mut silent = Peer::connect(&server);
    let _: [u8; 18] = silent.read_exact();
    let started = Instant::now();
    assert!(silent.closed_by_server());
    assert!(started.elapsed() < Duration::from_secs(5));
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
    let config = ServerConfig {
        shutdown_grace: Duration::from_millis(300),
        ..ServerConfig::default()
    };
    let server = TestServer::start_with(vec![("vol", memory(64 * MIB))], false, config);
    let before = resident_bytes();
    let mut greedy = Peer::greet(&server, 0b11);
    greedy.go("vol");
    // 2 GiB of reads requested in one write (57 KiB, which the socket
    // buffer holds even once the server stops reading), no reply read.
    let requests: Vec<u8> = (0..2048)
        .flat_map(|cookie| request_header(CMD_READ, cookie, (cookie % 64) * MIB, MIB as u32))
        .collect();
    greedy.send(&requests);
    std::thread::sleep(Duration::from_secs(1));
    // Unbounded, the replies alone would take 2 GiB; the budget allows 64 MiB
    // (the margin is for other tests running in this process meanwhile).
    let growth = resident_bytes().saturating_sub(before);
    assert!(
        growth < 1024 * MIB,
        "server memory grew by {} MiB",
        growth / MIB
    );
    // Other clients are unaffected.
    run(tool("nbdinfo", "libnbd-bin").args(["--size", &server.uri("vol")]));
    let started = Instant::now();
    drop(server);
    assert!(started.elapsed() < Duration::from_secs(5));
    drop(greedy);
}

#[test]
fn clients_that_stop_reading_are_dropped_and_cannot_starve_others() {
    // The whole server may hold one maximal request's worth of data.
    let config = ServerConfig {
        max_bytes_total: 32 * MIB as u32,
        reply_stall_timeout: Duration::from_millis(500),
        ..ServerConfig::default()
    };
    let server = TestServer::start_with(vec![("vol", memory(64 * MIB))], false, config);
    let mut greedy: Vec<Peer> = (0..3).map(|_| Peer::greet(&server, 0b11)).collect();
    let requests: Vec<u8> = (0..512)
        .flat_map(|cookie| request_header(CMD_READ, cookie, (cookie % 64) * MIB, MIB as u32))
        .collect();
    for peer in &mut greedy {
        peer.go("vol");
        peer.send(&requests);
    }
    // The greedy clients hold the shared budget until the server gives up
    // on them; then a well-behaved client copies the whole export.
    let started = Instant::now();
    let target = tempfile::NamedTempFile::new().unwrap();
    let target = target.path().to_str().unwrap().to_owned();
    tool("nbdcopy", "libnbd-bin");
    // Bounded, so a regression fails instead of hanging the suite.
    run(std::process::Command::new("timeout").args(["30", "nbdcopy", &server.uri("vol"), &target]));
    assert!(started.elapsed() < Duration::from_secs(20));
    for mut peer in greedy {
        assert!(
            peer.closed_without_reading(),
            "a client that never reads is dropped"
        );
    }
}

#[test]
fn clients_over_the_connection_limit_wait_for_a_free_slot() {
    let config = ServerConfig {
        max_connections: 2,
        ..ServerConfig::default()
    };
    let server = TestServer::start_with(vec![("vol", memory(MIB))], false, config);
    let first = Peer::greet(&server, 0b11);
    let _second = Peer::greet(&server, 0b11);
    let mut third = Peer::connect(&server);
    third
        .0
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let mut byte = [0u8; 1];
    let waiting = third.0.read(&mut byte).unwrap_err();
    assert_eq!(waiting.kind(), ErrorKind::WouldBlock, "third client served");
    drop(first);
    third
        .0
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let greeting: [u8; 18] = third.read_exact();
    assert_eq!(&greeting[..8], b"NBDMAGIC");
}
