//! Arbitrary transmission-phase bytes: request headers decoded, framed and
//! validated against a session, and valid commands run against an in-memory
//! export. Must never panic.
#![no_main]

use arbor_nbd::buffers::BufferPool;
use arbor_nbd::dispatch::{execute, ReplyContext};
use arbor_nbd::memory::MemoryExport;
use arbor_nbd::proto::REQUEST_HEADER_LEN;
use arbor_nbd::transmission::{validate, Limits, Payload, RequestHeader};
use libfuzzer_sys::fuzz_target;

const SIZE: u64 = 1 << 20;

fuzz_target!(|input: &[u8]| {
    let Some((&session_bits, mut rest)) = input.split_first() else {
        return;
    };
    let limits = Limits {
        size: SIZE,
        read_only: session_bits & 1 != 0,
        structured: session_bits & 2 != 0,
        block_status: session_bits & 6 == 6,
        byte_granular: session_bits & 8 != 0,
        max_payload: if session_bits & 8 != 0 {
            arbor_nbd::proto::MAX_UNNEGOTIATED_PAYLOAD
        } else {
            arbor_nbd::proto::MAX_PAYLOAD
        },
    };
    let export = MemoryExport::new(SIZE);
    let buffers = BufferPool::new(SIZE as usize);
    while let Some((bytes, tail)) = rest.split_first_chunk::<REQUEST_HEADER_LEN>() {
        rest = tail;
        let Ok(header) = RequestHeader::decode(bytes) else {
            return;
        };
        let payload_len = match header.payload(limits.max_payload) {
            Payload::None => 0,
            Payload::Receive(len) | Payload::Discard(len) => len as usize,
        };
        if payload_len > rest.len() {
            return;
        }
        let (payload, tail) = rest.split_at(payload_len);
        rest = tail;
        if let Ok(command) = validate(&header, &limits) {
            let context = ReplyContext {
                cookie: header.cookie,
                structured: limits.structured,
            };
            let base = [arbor_nbd::proto::MetaContext {
                id: arbor_nbd::proto::BASE_ALLOCATION_ID,
                name: arbor_nbd::proto::BASE_ALLOCATION.into(),
            }];
            execute(&export, context, &base, command, payload, &buffers);
        }
    }
});
