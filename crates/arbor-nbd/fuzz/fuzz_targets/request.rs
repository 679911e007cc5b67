//! Arbitrary transmission-phase bytes: request headers (compact or
//! extended) decoded, framed and validated against a session, and valid
//! commands run against an in-memory export. Must never panic.
//!
//! Byte 0 chooses the session: read-only 1, structured replies 2,
//! `base:allocation` selected 4, byte-granular (block sizes never learned)
//! 8, extended headers 16 (then the export is 8 GiB, sparse, so 64-bit
//! lengths reach it). The rest is what the client sends after the handshake.
#![no_main]

use arbor_nbd::buffers::BufferPool;
use arbor_nbd::dispatch::{execute, ReplyContext};
use arbor_nbd::memory::MemoryExport;
use arbor_nbd::transmission::{validate, Framing, Limits, Payload, RequestHeader};
use libfuzzer_sys::fuzz_target;

const SIZE: u64 = 1 << 20;
/// The export of sessions with extended headers.
const EXTENDED_SIZE: u64 = 8 << 30;
/// Most memory the export may allocate, whatever the requests.
const CAPACITY: u64 = 16 << 20;

fuzz_target!(|input: &[u8]| {
    let Some((&session_bits, mut rest)) = input.split_first() else {
        return;
    };
    let framing = Framing::new(session_bits & 2 != 0, session_bits & 16 != 0);
    let size = if framing == Framing::Extended {
        EXTENDED_SIZE
    } else {
        SIZE
    };
    let limits = Limits {
        size,
        read_only: session_bits & 1 != 0,
        framing,
        block_status: session_bits & 4 != 0 && framing.chunks(),
        byte_granular: session_bits & 8 != 0,
        // An export in 4 KiB units (a volume encrypted so), or 512.
        min_block: if session_bits & 32 != 0 { 4096 } else { 512 },
        max_payload: if session_bits & 8 != 0 {
            arbor_nbd::proto::MAX_UNNEGOTIATED_PAYLOAD
        } else {
            arbor_nbd::proto::MAX_PAYLOAD
        },
    };
    let export = MemoryExport::new(size)
        .with_capacity(CAPACITY)
        .with_min_block(limits.min_block);
    let buffers = BufferPool::new(SIZE as usize);
    let base = [arbor_nbd::proto::MetaContext {
        id: arbor_nbd::proto::BASE_ALLOCATION_ID,
        name: arbor_nbd::proto::BASE_ALLOCATION.into(),
    }];
    let header_len = framing.request_header_len();
    while rest.len() >= header_len {
        let (bytes, tail) = rest.split_at(header_len);
        rest = tail;
        let Ok(header) = RequestHeader::decode(framing, bytes) else {
            return;
        };
        // A payload too long to take ends the connection.
        let payload_len = match header.payload(&limits) {
            Ok(Payload::None) => 0,
            Ok(Payload::Receive(len)) => u64::from(len),
            Ok(Payload::Discard(len)) => len,
            Err(_) => return,
        };
        let Some(payload_len) = usize::try_from(payload_len)
            .ok()
            .filter(|&len| len <= rest.len())
        else {
            return;
        };
        let (payload, tail) = rest.split_at(payload_len);
        rest = tail;
        if let Ok(command) = validate(&header, &limits) {
            let context = ReplyContext {
                cookie: header.cookie,
                offset: header.offset,
                framing,
            };
            execute(
                &export,
                context,
                &base,
                command,
                &mut payload.to_vec(),
                &buffers,
            );
        }
    }
});
