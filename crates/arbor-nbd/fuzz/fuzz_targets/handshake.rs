//! Arbitrary client bytes through the handshake state machine, fed exactly
//! as the server's driver feeds it. Must never panic; a session it opens
//! must be consistent (extended headers imply structured replies, and
//! `NBD_FLAG_SEND_DF` is advertised exactly when replies are chunks).
#![no_main]

use std::sync::Arc;

use arbor_nbd::handshake::{Handshake, Step};
use arbor_nbd::memory::{ExportTable, MemoryExport};
use arbor_nbd::proto::transmission_flags::SEND_DF;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    let exports = ExportTable::new();
    exports.insert("vol", Arc::new(MemoryExport::new(1 << 20)));
    exports.insert("", Arc::new(MemoryExport::new(4096).read_only()));
    let mut handshake = Handshake::new();
    let mut rest = input;
    while rest.len() >= handshake.wanted() {
        let (chunk, tail) = rest.split_at(handshake.wanted());
        rest = tail;
        match handshake.receive(chunk, &exports) {
            Ok(Step::Continue { .. }) => {}
            Ok(Step::Transmit { session, .. }) => {
                assert!(!session.extended || session.structured);
                let chunks = session.framing().chunks();
                assert_eq!(session.transmission_flags & SEND_DF != 0, chunks);
                assert!(session.contexts.is_empty() || chunks);
                return;
            }
            Ok(Step::Close { .. }) | Err(_) => return,
        }
    }
});
