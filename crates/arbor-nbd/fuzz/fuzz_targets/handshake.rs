//! Arbitrary client bytes through the handshake state machine, fed exactly
//! as the server's driver feeds it. Must never panic.
#![no_main]

use std::sync::Arc;

use arbor_nbd::handshake::{Handshake, Step};
use arbor_nbd::memory::{ExportTable, MemoryExport};
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
            Ok(Step::Transmit { .. } | Step::Close { .. }) | Err(_) => return,
        }
    }
});
