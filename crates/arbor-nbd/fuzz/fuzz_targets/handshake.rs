//! Arbitrary client bytes through the handshake state machine, fed exactly
//! as the server's driver feeds it. Must never panic; a session it opens
//! must be consistent (extended headers imply structured replies, and
//! `NBD_FLAG_SEND_DF` is advertised exactly when replies are chunks). The
//! first byte picks the listener's TLS mode and whether the client presents
//! a certificate when STARTTLS is acknowledged (the TLS layer itself is
//! rustls's), and exports are granted per identity, so the FORCEDTLS and
//! SELECTIVETLS paths and the access checks are covered.
#![no_main]

use std::sync::Arc;

use arbor_nbd::handshake::{Handshake, Step, TlsMode};
use arbor_nbd::memory::{ExportTable, MemoryExport};
use arbor_nbd::proto::transmission_flags::SEND_DF;
use arbor_nbd::{Access, AccessList, Client, Pattern, Principal, Rule};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    let exports = ExportTable::new();
    exports.insert("vol", Arc::new(MemoryExport::new(1 << 20)));
    exports.insert("", Arc::new(MemoryExport::new(4096).read_only()));
    let Some((&mode, input)) = input.split_first() else {
        return;
    };
    let tls = match mode % 3 {
        0 => TlsMode::Off,
        1 => TlsMode::On,
        _ => TlsMode::Require,
    };
    let identity = (mode & 0x10 != 0).then(|| "client".to_owned());
    let access = AccessList::new(vec![
        Rule {
            principal: Principal::Identity("client".into()),
            exports: vec![Pattern::new("vol")],
            access: Access::Write,
        },
        Rule {
            principal: Principal::Anonymous,
            exports: vec![Pattern::new("*")],
            access: if mode & 0x20 != 0 {
                Access::Read
            } else {
                Access::List
            },
        },
    ]);
    let mut handshake = Handshake::for_client(Client::anonymous(), tls, Arc::new(access));
    let mut rest = input;
    while rest.len() >= handshake.wanted() {
        let (chunk, tail) = rest.split_at(handshake.wanted());
        rest = tail;
        match handshake.receive(chunk, &exports) {
            Ok(Step::Continue { .. }) => {}
            Ok(Step::StartTls { .. }) => handshake.tls_established(identity.clone()),
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
