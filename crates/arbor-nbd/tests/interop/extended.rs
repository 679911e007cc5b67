//! Extended headers (`NBD_OPT_EXTENDED_HEADERS`): a raw-socket client
//! checked against a model of the export's bytes, the framing errors, and
//! qemu-io / qemu-img through a proxy that records the traffic, so each
//! test shows from the wire itself that extended headers were in use and
//! how large the requests that reached the server were. The wire format is
//! written out by hand here, independently of the crate's codec.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

use arbor_nbd::memory::MemoryExport;
use arbor_nbd::Export;

use crate::common::{qemu_io, run, tool, Call, RecordingExport, TestServer, HANG_GUARD, MIB};
use crate::raw::{Peer, REPLY_MAGIC};

const IHAVEOPT: u64 = 0x4948_4156_454f_5054;

const GIB: u64 = 1024 * MIB;
const BLOCK: u64 = 4096;

const OPT_GO: u32 = 7;
const OPT_STRUCTURED_REPLY: u32 = 8;
const OPT_SET_META_CONTEXT: u32 = 10;
const OPT_EXTENDED_HEADERS: u32 = 11;
const REP_ACK: u32 = 1;
const REP_META_CONTEXT: u32 = 4;
const REP_ERR_EXT_HEADER_REQD: u32 = 0x8000_000a;
const INFO_BLOCK_SIZE: u16 = 3;

const CMD_READ: u16 = 0;
const CMD_WRITE: u16 = 1;
const CMD_DISC: u16 = 2;
const CMD_FLUSH: u16 = 3;
const CMD_TRIM: u16 = 4;
const CMD_WRITE_ZEROES: u16 = 6;
const CMD_BLOCK_STATUS: u16 = 7;
const FLAG_FUA: u16 = 1;
const FLAG_NO_HOLE: u16 = 2;
const FLAG_REQ_ONE: u16 = 8;
const FLAG_PAYLOAD_LEN: u16 = 1 << 5;
const TFLAG_SEND_DF: u16 = 1 << 7;
const TFLAG_BLOCK_STATUS_PAYLOAD: u16 = 1 << 12;

const EXTENDED_REQUEST_MAGIC: u32 = 0x21e4_1c71;
const EXTENDED_REPLY_MAGIC: u32 = 0x6e8a_278c;
const TYPE_NONE: u16 = 0;
const TYPE_OFFSET_DATA: u16 = 1;
const TYPE_OFFSET_HOLE: u16 = 2;
const TYPE_BLOCK_STATUS_EXT: u16 = 6;
const TYPE_ERROR: u16 = 0x8001;
const FLAG_DONE: u16 = 1;
const STATE_HOLE_ZERO: u64 = 3;
const EINVAL: u32 = 22;
const EOVERFLOW: u32 = 75;

/// An extended request header.
fn extended_request(kind: u16, flags: u16, cookie: u64, offset: u64, length: u64) -> Vec<u8> {
    let mut out = EXTENDED_REQUEST_MAGIC.to_be_bytes().to_vec();
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(&kind.to_be_bytes());
    out.extend_from_slice(&cookie.to_be_bytes());
    out.extend_from_slice(&offset.to_be_bytes());
    out.extend_from_slice(&length.to_be_bytes());
    out
}

fn meta_context_request(export: &str, query: &str) -> Vec<u8> {
    let mut out = (export.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(export.as_bytes());
    out.extend_from_slice(&1u32.to_be_bytes());
    out.extend_from_slice(&(query.len() as u32).to_be_bytes());
    out.extend_from_slice(query.as_bytes());
    out
}

/// One extended reply chunk.
#[derive(Debug)]
struct Chunk {
    flags: u16,
    kind: u16,
    cookie: u64,
    offset: u64,
    payload: Vec<u8>,
}

impl Chunk {
    fn error(&self) -> u32 {
        assert_eq!(self.kind, TYPE_ERROR, "{self:?}");
        u32::from_be_bytes(self.payload[..4].try_into().unwrap())
    }
}

/// A client that negotiated extended headers and `base:allocation`.
struct ExtendedPeer {
    peer: Peer,
    /// The id the server gave `base:allocation`.
    context: u32,
    next_cookie: u64,
}

impl ExtendedPeer {
    /// Negotiates as qemu does (extended headers first), checking the
    /// option replies the spec prescribes on the way.
    fn connect(server: &TestServer, export: &str) -> Self {
        let mut peer = Peer::greet(server, 0b11);
        peer.option(OPT_EXTENDED_HEADERS, &[]);
        assert_eq!(peer.option_reply(), (OPT_EXTENDED_HEADERS, REP_ACK, vec![]));
        // No way back to structured replies.
        peer.option(OPT_STRUCTURED_REPLY, &[]);
        let (code, kind, _) = peer.option_reply();
        assert_eq!(
            (code, kind),
            (OPT_STRUCTURED_REPLY, REP_ERR_EXT_HEADER_REQD)
        );
        peer.option(
            OPT_SET_META_CONTEXT,
            &meta_context_request(export, "base:allocation"),
        );
        let (code, kind, data) = peer.option_reply();
        assert_eq!((code, kind), (OPT_SET_META_CONTEXT, REP_META_CONTEXT));
        assert_eq!(&data[4..], b"base:allocation");
        let context = u32::from_be_bytes(data[..4].try_into().unwrap());
        assert_eq!(peer.option_reply(), (OPT_SET_META_CONTEXT, REP_ACK, vec![]));
        let (_, flags) = peer.go_info(export, &[INFO_BLOCK_SIZE]);
        assert_ne!(flags & TFLAG_SEND_DF, 0, "DF comes with extended headers");
        assert_eq!(flags & TFLAG_BLOCK_STATUS_PAYLOAD, 0, "not implemented");
        Self {
            peer,
            context,
            next_cookie: 1,
        }
    }

    /// Sends one request; returns its cookie.
    fn send(&mut self, kind: u16, flags: u16, offset: u64, length: u64, payload: &[u8]) -> u64 {
        let cookie = self.next_cookie;
        self.next_cookie += 1;
        let mut message = extended_request(kind, flags, cookie, offset, length);
        message.extend_from_slice(payload);
        self.peer.send(&message);
        cookie
    }

    fn chunk(&mut self) -> Chunk {
        assert_eq!(self.peer.u32(), EXTENDED_REPLY_MAGIC);
        let [f0, f1, k0, k1] = self.peer.read_exact();
        let cookie = u64::from_be_bytes(self.peer.read_exact());
        let offset = u64::from_be_bytes(self.peer.read_exact());
        let length = u64::from_be_bytes(self.peer.read_exact());
        assert!(length <= 64 * MIB, "a {length}-byte chunk");
        let mut payload = vec![0u8; length as usize];
        self.peer.0.read_exact(&mut payload).expect("chunk payload");
        Chunk {
            flags: u16::from_be_bytes([f0, f1]),
            kind: u16::from_be_bytes([k0, k1]),
            cookie,
            offset,
            payload,
        }
    }

    /// Sends a request and reads its whole reply (requests are sent one at
    /// a time here); every chunk must echo the cookie and the offset.
    fn call(
        &mut self,
        kind: u16,
        flags: u16,
        offset: u64,
        length: u64,
        payload: &[u8],
    ) -> Vec<Chunk> {
        let cookie = self.send(kind, flags, offset, length, payload);
        let mut chunks = Vec::new();
        loop {
            let chunk = self.chunk();
            assert_eq!((chunk.cookie, chunk.offset), (cookie, offset), "{chunk:?}");
            let done = chunk.flags & FLAG_DONE != 0;
            chunks.push(chunk);
            if done {
                return chunks;
            }
        }
    }

    /// A request whose reply must be a lone `NBD_REPLY_TYPE_NONE`: even a
    /// success without data has no simple reply under extended headers.
    fn ok(&mut self, kind: u16, flags: u16, offset: u64, length: u64, payload: &[u8]) {
        let chunks = self.call(kind, flags, offset, length, payload);
        assert_eq!(chunks.len(), 1, "{chunks:?}");
        assert_eq!((chunks[0].kind, chunks[0].payload.len()), (TYPE_NONE, 0));
    }

    /// A request that must fail; returns the error value.
    fn fails(&mut self, kind: u16, flags: u16, offset: u64, length: u64, payload: &[u8]) -> u32 {
        let chunks = self.call(kind, flags, offset, length, payload);
        assert_eq!(chunks.len(), 1, "{chunks:?}");
        chunks[0].error()
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        let length = data.len() as u64;
        self.ok(CMD_WRITE, FLAG_PAYLOAD_LEN, offset, length, data);
    }

    /// A read, reassembled from its content chunks, which must cover the
    /// request exactly once.
    fn read(&mut self, offset: u64, length: u64) -> Vec<u8> {
        let mut data = vec![0xEEu8; length as usize];
        let mut covered = 0;
        for chunk in self.call(CMD_READ, 0, offset, length, &[]) {
            let at = u64::from_be_bytes(chunk.payload[..8].try_into().unwrap());
            let start = (at - offset) as usize;
            let len = match chunk.kind {
                TYPE_OFFSET_DATA => {
                    let bytes = &chunk.payload[8..];
                    data[start..start + bytes.len()].copy_from_slice(bytes);
                    bytes.len()
                }
                TYPE_OFFSET_HOLE => {
                    let len = u32::from_be_bytes(chunk.payload[8..12].try_into().unwrap());
                    data[start..start + len as usize].fill(0);
                    len as usize
                }
                TYPE_NONE => 0,
                other => panic!("chunk type {other} in a read reply"),
            };
            covered += len as u64;
        }
        assert_eq!(covered, length, "content chunks cover the read");
        data
    }

    /// Block status of `base:allocation`: `(length, flags)` descriptors.
    fn block_status(&mut self, flags: u16, offset: u64, length: u64) -> Vec<(u64, u64)> {
        let chunks = self.call(CMD_BLOCK_STATUS, flags, offset, length, &[]);
        assert_eq!(chunks.len(), 1, "{chunks:?}");
        let chunk = &chunks[0];
        assert_eq!(chunk.kind, TYPE_BLOCK_STATUS_EXT, "{chunk:?}");
        let id = u32::from_be_bytes(chunk.payload[..4].try_into().unwrap());
        let count = u32::from_be_bytes(chunk.payload[4..8].try_into().unwrap()) as usize;
        assert_eq!(id, self.context);
        assert_eq!(chunk.payload.len(), 8 + 16 * count, "descriptor count");
        chunk.payload[8..]
            .chunks(16)
            .map(|d| {
                let length = u64::from_be_bytes(d[..8].try_into().unwrap());
                let flags = u64::from_be_bytes(d[8..].try_into().unwrap());
                (length, flags)
            })
            .collect()
    }
}

/// What the export should hold: [`MemoryExport`]'s 4 KiB blocks, those
/// allocated and their bytes. The test keeps to whole blocks.
struct Model {
    size: u64,
    blocks: BTreeMap<u64, Vec<u8>>,
}

impl Model {
    fn new(size: u64) -> Self {
        Self {
            size,
            blocks: BTreeMap::new(),
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        assert!(offset.is_multiple_of(BLOCK) && (data.len() as u64).is_multiple_of(BLOCK));
        for (i, block) in data.chunks(BLOCK as usize).enumerate() {
            self.blocks
                .insert(offset / BLOCK + i as u64, block.to_vec());
        }
    }

    /// Trim or zero with holes allowed: the blocks are deallocated.
    fn deallocate(&mut self, offset: u64, length: u64) {
        let range = offset / BLOCK..(offset + length) / BLOCK;
        self.blocks.retain(|block, _| !range.contains(block));
    }

    fn read(&self, offset: u64, length: u64) -> Vec<u8> {
        let mut out = Vec::with_capacity(length as usize);
        for block in offset / BLOCK..(offset + length) / BLOCK {
            match self.blocks.get(&block) {
                Some(data) => out.extend_from_slice(data),
                None => out.resize(out.len() + BLOCK as usize, 0),
            }
        }
        out
    }

    /// `base:allocation` of the whole export: allocated runs are data
    /// (flags 0), the rest holes reading as zeroes.
    fn extents(&self) -> Vec<(u64, u64)> {
        let mut extents: Vec<(u64, u64)> = Vec::new();
        let mut push = |length: u64, flags: u64| match extents.last_mut() {
            Some((last, last_flags)) if *last_flags == flags => *last += length,
            _ if length > 0 => extents.push((length, flags)),
            _ => {}
        };
        let mut at = 0;
        for &block in self.blocks.keys() {
            push(block * BLOCK - at, STATE_HOLE_ZERO);
            push(BLOCK, 0);
            at = (block + 1) * BLOCK;
        }
        push(self.size - at, STATE_HOLE_ZERO);
        extents
    }
}

/// A sparse export of `size` bytes that records the server's calls; at
/// most 256 MiB of it may be allocated, whatever a client asks.
fn recording(size: u64) -> Arc<RecordingExport> {
    RecordingExport::new(MemoryExport::new(size).with_capacity(256 * MIB))
}

/// Bytes that are not all one value at every offset: an offset's bytes
/// differ from its neighbours'.
fn pattern(seed: u8, len: u64) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 12) as u8)
        .collect()
}

#[test]
fn raw_client_with_extended_headers_matches_a_byte_model() {
    const SIZE: u64 = 8 * GIB;
    let export = recording(SIZE);
    let server = TestServer::start(vec![("big", export.clone())]);
    let mut peer = ExtendedPeer::connect(&server, "big");
    let mut model = Model::new(SIZE);

    // Writes on both sides of 4 GiB and at the very end; one as qemu sends
    // them, without NBD_CMD_FLAG_PAYLOAD_LEN.
    let writes = [
        (0, pattern(1, MIB)),
        (GIB + 64 * BLOCK, pattern(2, 64 * BLOCK)),
        (5 * GIB, pattern(3, 16 * BLOCK)),
        (7 * GIB - BLOCK, pattern(4, 2 * BLOCK)),
        (SIZE - BLOCK, pattern(5, BLOCK)),
    ];
    for (offset, data) in &writes {
        peer.write(*offset, data);
        model.write(*offset, data);
    }
    let qemu_style = pattern(6, 2 * BLOCK);
    peer.ok(CMD_WRITE, FLAG_FUA, 6 * GIB, 2 * BLOCK, &qemu_style);
    model.write(6 * GIB, &qemu_style);
    for (offset, data) in &writes {
        assert!(
            peer.read(*offset, data.len() as u64) == *data,
            "at {offset}"
        );
    }
    // A read across data and holes, over 4 GiB.
    let (offset, length) = (5 * GIB - 256 * 1024, MIB);
    assert!(peer.read(offset, length) == model.read(offset, length));
    // Everything at once: 64-bit extents, the long holes over 4 GiB.
    assert_eq!(peer.block_status(0, 0, SIZE), model.extents());
    assert_eq!(peer.block_status(FLAG_REQ_ONE, 0, SIZE), [(MIB, 0)]);
    export.take_calls();

    // One trim of 6 GiB and one write zeroes of 5 GiB, each reaching the
    // export whole.
    peer.ok(CMD_TRIM, 0, GIB, 6 * GIB, &[]);
    model.deallocate(GIB, 6 * GIB);
    assert_eq!(
        export.take_calls(),
        [Call::Trim {
            offset: GIB,
            len: 6 * GIB
        }]
    );
    let extents = peer.block_status(0, 0, SIZE);
    assert_eq!(extents, model.extents());
    assert!(extents.contains(&(7 * GIB - MIB, STATE_HOLE_ZERO)));
    peer.write(6 * GIB, &pattern(7, BLOCK));
    model.write(6 * GIB, &pattern(7, BLOCK));
    export.take_calls();
    peer.ok(CMD_WRITE_ZEROES, FLAG_FUA, 3 * GIB, 5 * GIB, &[]);
    model.deallocate(3 * GIB, 5 * GIB);
    assert_eq!(
        export.take_calls(),
        [Call::WriteZeroes {
            offset: 3 * GIB,
            len: 5 * GIB,
            may_trim: true
        }]
    );
    assert_eq!(peer.block_status(0, 0, SIZE), model.extents());
    assert_eq!(model.extents(), [(MIB, 0), (SIZE - MIB, STATE_HOLE_ZERO)]);
    for (offset, length) in [(0, MIB), (6 * GIB, 4 * BLOCK), (SIZE - MIB, MIB)] {
        assert!(peer.read(offset, length) == model.read(offset, length));
    }
    let mut whole = vec![0u8; MIB as usize];
    export.read(0, &mut whole).unwrap();
    assert!(whole == model.read(0, MIB), "the export's own bytes");

    // Errors come as extended error chunks echoing the request.
    assert_eq!(peer.fails(CMD_READ, 0, 0, 64 * MIB, &[]), EOVERFLOW);
    assert_eq!(peer.fails(CMD_READ, 0, 0, 6 * GIB, &[]), EOVERFLOW);
    assert_eq!(peer.fails(CMD_TRIM, 0, GIB, SIZE, &[]), EINVAL);
    assert_eq!(peer.fails(CMD_TRIM, 0, 512, u64::MAX - 511, &[]), EINVAL);
    assert_eq!(
        peer.fails(CMD_WRITE_ZEROES, FLAG_NO_HOLE, SIZE, 512, &[]),
        28
    );
    // Block status has no payload form here: the payload is drained and
    // the stream stays in sync.
    let mut filter = (8 * GIB).to_be_bytes().to_vec();
    filter.extend_from_slice(&peer.context.to_be_bytes());
    let len = filter.len() as u64;
    assert_eq!(
        peer.fails(CMD_BLOCK_STATUS, FLAG_PAYLOAD_LEN, 0, len, &filter),
        EINVAL
    );
    peer.ok(CMD_FLUSH, 0, 0, 0, &[]);
    assert!(peer.read(0, MIB) == model.read(0, MIB));
    peer.send(CMD_DISC, 0, 0, 0, &[]);
    assert!(peer.peer.closed_by_server());
}

#[test]
fn extended_framing_errors_close_the_connection() {
    let server = TestServer::start(vec![("vol", crate::common::memory(4 * MIB))]);
    // A payload over the maximum: the spec says to disconnect rather than
    // drain what a 64-bit length announces.
    let mut huge = ExtendedPeer::connect(&server, "vol");
    huge.send(CMD_WRITE, FLAG_PAYLOAD_LEN, 0, 1 << 40, &[0; 4096]);
    assert!(huge.peer.closed_by_server());
    // A compact request (28 bytes, and 4 more to fill the 32 the server
    // reads) where extended ones were negotiated.
    let mut compact = ExtendedPeer::connect(&server, "vol");
    let mut request = 0x2560_9513u32.to_be_bytes().to_vec();
    request.extend_from_slice(&[0; 28]);
    compact.peer.send(&request);
    assert!(compact.peer.closed_by_server());
    // Other clients are unaffected.
    let mut good = ExtendedPeer::connect(&server, "vol");
    good.write(0, &pattern(9, BLOCK));
    assert!(good.read(0, BLOCK) == pattern(9, BLOCK));
}

/// The traffic of one connection, each direction whole.
struct Connection {
    client: Vec<u8>,
    server: Vec<u8>,
}

/// A proxy in front of the server's socket that records what passes, so a
/// test can read from the wire what a real client negotiated and sent.
struct Sniffer {
    _dir: tempfile::TempDir,
    socket: PathBuf,
    stopping: Arc<AtomicBool>,
    connections: mpsc::Receiver<Vec<Connection>>,
    accept: JoinHandle<()>,
}

impl Sniffer {
    fn start(server: &TestServer) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let socket = dir.path().join("sniffer.sock");
        let listener = UnixListener::bind(&socket).expect("bind the proxy");
        let stopping = Arc::new(AtomicBool::new(false));
        let (done, connections) = mpsc::channel();
        let target = server.socket.clone();
        let stop = Arc::clone(&stopping);
        let accept = std::thread::spawn(move || {
            let mut pumps = Vec::new();
            for client in listener.incoming() {
                let client = client.expect("accept");
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let upstream = UnixStream::connect(&target).expect("connect to the server");
                pumps.push((
                    pump(client.try_clone().unwrap(), upstream.try_clone().unwrap()),
                    pump(upstream, client),
                ));
            }
            let traffic = pumps
                .into_iter()
                .map(|(up, down)| Connection {
                    client: up.join().expect("pump"),
                    server: down.join().expect("pump"),
                })
                .collect();
            // The test may have given up waiting already.
            let _ = done.send(traffic);
        });
        Self {
            _dir: dir,
            socket,
            stopping,
            connections,
            accept,
        }
    }

    fn uri(&self, export: &str) -> String {
        format!("nbd+unix:///{export}?socket={}", self.socket.display())
    }

    /// Stops accepting, waits until every connection has ended (the client
    /// hung up and the server closed), and returns their traffic in the
    /// order they came.
    fn finish(self) -> Vec<Connection> {
        self.stopping.store(true, Ordering::SeqCst);
        // Wakes the accept loop, which sees `stopping` and ends.
        drop(UnixStream::connect(&self.socket).expect("wake the proxy"));
        let traffic = self
            .connections
            .recv_timeout(HANG_GUARD)
            .expect("connections through the proxy ended");
        self.accept.join().expect("proxy thread");
        traffic
    }
}

/// Copies `from` to `to` until end of file, then passes the end on;
/// returns what passed.
fn pump(mut from: UnixStream, mut to: UnixStream) -> JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut seen = Vec::new();
        let mut buffer = vec![0u8; 256 * 1024];
        loop {
            match from.read(&mut buffer) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    seen.extend_from_slice(&buffer[..n]);
                    if to.write_all(&buffer[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = to.shutdown(std::net::Shutdown::Write);
        seen
    })
}

/// A request as it crossed the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct WireRequest {
    kind: u16,
    flags: u16,
    offset: u64,
    length: u64,
}

/// One connection's traffic, decoded.
#[derive(Debug)]
struct Trace {
    /// Each option the client sent and the type of its final reply.
    options: Vec<(u32, u32)>,
    /// Whether `NBD_OPT_EXTENDED_HEADERS` was acknowledged.
    extended: bool,
    requests: Vec<WireRequest>,
    /// The reply chunks: (type, flags, payload).
    replies: Vec<(u16, u16, Vec<u8>)>,
}

/// A bounds-checked cursor over recorded bytes.
struct Cursor<'a>(&'a [u8]);

impl Cursor<'_> {
    fn take(&mut self, n: usize) -> &[u8] {
        assert!(self.0.len() >= n, "trace cut short");
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        head
    }
    fn u16(&mut self) -> u16 {
        u16::from_be_bytes(self.take(2).try_into().unwrap())
    }
    fn u32(&mut self) -> u32 {
        u32::from_be_bytes(self.take(4).try_into().unwrap())
    }
    fn u64(&mut self) -> u64 {
        u64::from_be_bytes(self.take(8).try_into().unwrap())
    }
}

impl Trace {
    /// Decodes a connection that reached transmission with `NBD_OPT_GO`.
    fn decode(connection: &Connection) -> Self {
        let (mut client, mut server) = (Cursor(&connection.client), Cursor(&connection.server));
        server.take(18);
        client.take(4);
        let mut options = Vec::new();
        loop {
            assert_eq!(client.u64(), IHAVEOPT);
            let (code, len) = (client.u32(), client.u32());
            client.take(len as usize);
            let last = loop {
                assert_eq!(server.u64(), REPLY_MAGIC);
                assert_eq!(server.u32(), code);
                let (kind, len) = (server.u32(), server.u32());
                server.take(len as usize);
                if kind == REP_ACK || kind & 0x8000_0000 != 0 {
                    break kind;
                }
            };
            options.push((code, last));
            if code == OPT_GO && last == REP_ACK {
                break;
            }
        }
        let extended = options.contains(&(OPT_EXTENDED_HEADERS, REP_ACK));
        assert!(extended, "extended headers not negotiated: {options:?}");
        let mut requests = Vec::new();
        while !client.0.is_empty() {
            assert_eq!(client.u32(), EXTENDED_REQUEST_MAGIC);
            let (flags, kind) = (client.u16(), client.u16());
            let (_cookie, offset, length) = (client.u64(), client.u64(), client.u64());
            if kind == CMD_WRITE || flags & FLAG_PAYLOAD_LEN != 0 {
                client.take(length as usize);
            }
            requests.push(WireRequest {
                kind,
                flags,
                offset,
                length,
            });
        }
        let mut replies = Vec::new();
        while !server.0.is_empty() {
            assert_eq!(server.u32(), EXTENDED_REPLY_MAGIC, "only extended replies");
            let (flags, kind) = (server.u16(), server.u16());
            let (_cookie, _offset, length) = (server.u64(), server.u64(), server.u64());
            let payload = server.take(length as usize);
            // Only block status payloads are kept: data is large.
            let kept = if kind == TYPE_BLOCK_STATUS_EXT {
                payload.to_vec()
            } else {
                Vec::new()
            };
            replies.push((kind, flags, kept));
        }
        Self {
            options,
            extended,
            requests,
            replies,
        }
    }

    /// The requests of one command type.
    fn of(&self, kind: u16) -> Vec<WireRequest> {
        self.requests
            .iter()
            .filter(|r| r.kind == kind)
            .copied()
            .collect()
    }
}

/// The options qemu 10.0 sends, as seen on the wire: extended headers
/// first (so no `NBD_OPT_STRUCTURED_REPLY`), then the meta context, then GO.
const QEMU_OPTIONS: [(u32, u32); 3] = [
    (OPT_EXTENDED_HEADERS, REP_ACK),
    (OPT_SET_META_CONTEXT, REP_ACK),
    (OPT_GO, REP_ACK),
];

/// The one connection a qemu tool made through `sniffer`, decoded:
/// extended headers negotiated, every request and reply extended.
fn one_qemu_session(sniffer: Sniffer) -> Trace {
    let traffic = sniffer.finish();
    assert_eq!(traffic.len(), 1, "connections");
    let trace = Trace::decode(&traffic[0]);
    assert_eq!(trace.options, QEMU_OPTIONS);
    assert!(trace.extended);
    trace
}

#[test]
fn qemu_io_negotiates_extended_headers_and_sends_a_6_gib_zeroing_whole() {
    let export = recording(8 * GIB);
    let server = TestServer::start(vec![("big", export.clone())]);
    let sniffer = Sniffer::start(&server);
    // qemu-io itself refuses a discard, or a write of zeroes that may fall
    // back to writing, longer than 2 GiB - 512 ("length cannot exceed
    // 2147483136"); a write of zeroes that may unmap and must be fast
    // (`-u -n`) may be longer.
    qemu_io(
        &sniffer.uri("big"),
        &[
            "write -P 0x5a 0 1M",
            "read -P 0x5a 0 1M",
            "write -P 0x6b 6G 64k",
            "discard 0 2047M",
            "read -P 0 0 1M",
            "read -P 0x6b 6G 64k",
            "write -z -u -n 1G 6G",
            "read -P 0 6G 64k",
            "write -P 0x7c 7G 64k",
            "write -z -u 7G 1M",
            "read -P 0 7G 64k",
        ],
    );
    let trace = one_qemu_session(sniffer);
    const FAST_ZERO: u16 = 16;
    // Each arrived as one request, and reached the export as one call.
    assert_eq!(
        trace.of(CMD_WRITE_ZEROES),
        [
            WireRequest {
                kind: CMD_WRITE_ZEROES,
                flags: FLAG_FUA | FAST_ZERO,
                offset: GIB,
                length: 6 * GIB
            },
            WireRequest {
                kind: CMD_WRITE_ZEROES,
                flags: FLAG_FUA,
                offset: 7 * GIB,
                length: MIB
            },
        ]
    );
    assert_eq!(
        trace.of(CMD_TRIM),
        [WireRequest {
            kind: CMD_TRIM,
            flags: 0,
            offset: 0,
            length: 2047 * MIB
        }]
    );
    let calls: Vec<Call> = export
        .take_calls()
        .into_iter()
        .filter(|call| !matches!(call, Call::BlockStatus { .. }))
        .collect();
    assert_eq!(
        calls,
        [
            Call::Trim {
                offset: 0,
                len: 2047 * MIB
            },
            Call::WriteZeroes {
                offset: GIB,
                len: 6 * GIB,
                may_trim: true
            },
            Call::WriteZeroes {
                offset: 7 * GIB,
                len: MIB,
                may_trim: true
            },
        ]
    );
    // Reads and writes stayed within the maximum payload, and every reply
    // was an extended chunk (checked by `Trace::decode`).
    assert!(trace
        .requests
        .iter()
        .filter(|r| matches!(r.kind, CMD_READ | CMD_WRITE))
        .all(|r| r.length <= 32 * MIB));
    assert_eq!(trace.of(CMD_WRITE).len(), 3);
    assert!(trace.replies.iter().all(|(kind, _, _)| *kind != TYPE_ERROR));
    assert_eq!(
        export.inner.allocated_bytes(),
        0,
        "everything written was zeroed"
    );
}

/// The `(start, length, data, zero)` of each line of `qemu-img map
/// --output=json`.
fn map_entries(json: &str) -> Vec<(u64, u64, bool, bool)> {
    let field = |line: &str, key: &str| -> String {
        let at = line.find(&format!("\"{key}\": ")).expect(key) + key.len() + 4;
        line[at..]
            .chars()
            .take_while(|c| *c != ',' && *c != '}')
            .collect()
    };
    json.lines()
        .filter(|line| line.contains("\"start\""))
        .map(|line| {
            (
                field(line, "start").parse().unwrap(),
                field(line, "length").parse().unwrap(),
                field(line, "data") == "true",
                field(line, "zero") == "true",
            )
        })
        .collect()
}

#[test]
fn qemu_img_map_reads_allocation_through_extended_block_status() {
    const SIZE: u64 = 8 * GIB;
    let export = recording(SIZE);
    export.write(0, &pattern(1, MIB)).unwrap();
    export.write(5 * GIB, &pattern(2, 64 * 1024)).unwrap();
    export.write(SIZE - BLOCK, &pattern(3, BLOCK)).unwrap();
    let server = TestServer::start(vec![("big", export.clone())]);
    let sniffer = Sniffer::start(&server);
    let map = run(tool("qemu-img", "qemu-utils").args([
        "map",
        "--output=json",
        "-f",
        "raw",
        &sniffer.uri("big"),
    ]));
    assert_eq!(
        map_entries(&map),
        [
            (0, MIB, true, false),
            (MIB, 5 * GIB - MIB, false, true),
            (5 * GIB, 64 * 1024, true, false),
            (
                5 * GIB + 64 * 1024,
                3 * GIB - 64 * 1024 - BLOCK,
                false,
                true
            ),
            (SIZE - BLOCK, BLOCK, true, false),
        ],
        "{map}"
    );
    let trace = one_qemu_session(sniffer);
    // qemu asks with REQ_ONE for the whole rest of the export, over 4 GiB,
    // and each answer's one extent can be longer than 4 GiB.
    let queries = trace.of(CMD_BLOCK_STATUS);
    assert_eq!(queries.len(), 5, "{queries:?}");
    assert!(queries.iter().all(|q| q.flags == FLAG_REQ_ONE));
    assert_eq!((queries[0].offset, queries[0].length), (0, SIZE));
    let extents: Vec<(u64, u64)> = trace
        .replies
        .iter()
        .filter(|(kind, _, _)| *kind == TYPE_BLOCK_STATUS_EXT)
        .flat_map(|(_, _, payload)| {
            assert_eq!(payload[4..8], 1u32.to_be_bytes(), "one descriptor");
            let length = u64::from_be_bytes(payload[8..16].try_into().unwrap());
            let flags = u64::from_be_bytes(payload[16..24].try_into().unwrap());
            [(length, flags)]
        })
        .collect();
    assert_eq!(extents.len(), 5);
    assert_eq!(extents[1], (5 * GIB - MIB, STATE_HOLE_ZERO));
    assert!(export.take_calls().contains(&Call::BlockStatus {
        offset: 0,
        len: SIZE
    }));
}

#[test]
fn qemu_img_convert_zeroes_a_large_target_in_requests_of_2_gib() {
    const SIZE: u64 = 8 * GIB;
    let export = recording(SIZE);
    // Stale data the copy of a sparse image must zero.
    export.write(5 * GIB, &pattern(1, MIB)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("sparse.raw");
    let data = pattern(2, MIB);
    {
        let mut file = std::fs::File::create(&image).unwrap();
        file.set_len(SIZE).unwrap();
        use std::io::{Seek, SeekFrom};
        file.seek(SeekFrom::Start(3 * GIB)).unwrap();
        file.write_all(&data).unwrap();
    }
    let server = TestServer::start(vec![("big", export.clone())]);
    let sniffer = Sniffer::start(&server);
    run(tool("qemu-img", "qemu-utils").args([
        "convert",
        "-n",
        "-f",
        "raw",
        "-O",
        "raw",
        image.to_str().unwrap(),
        &sniffer.uri("big"),
    ]));
    let trace = one_qemu_session(sniffer);
    // qemu-img zeroes the target in requests of at most 2 GiB - 512 (its
    // block layer's request limit), extended headers or not.
    let zeroes = trace.of(CMD_WRITE_ZEROES);
    assert!(
        zeroes.iter().all(|z| z.length <= 2 * GIB - 512),
        "{zeroes:?}"
    );
    assert!(
        zeroes.iter().any(|z| z.length == 2 * GIB - 512),
        "{zeroes:?}"
    );
    let mut copied = vec![0u8; MIB as usize];
    export.read(3 * GIB, &mut copied).unwrap();
    assert!(copied == data);
    let mut stale = vec![1u8; MIB as usize];
    export.read(5 * GIB, &mut stale).unwrap();
    assert!(stale.iter().all(|&b| b == 0), "stale data left");
}
