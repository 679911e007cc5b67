//! Feeds arbitrary bytes to the replication session's frame decoder
//! (docs/REPLICATION.md), whole and in pieces. It may not panic, hold more
//! than one frame and one piece of input, or decode differently depending
//! on how the bytes arrive; every message it accepts must encode back to
//! bytes that decode to the same message; and a decoded hello goes through
//! the target's decision against a fixed replica, which may refuse but
//! not panic.
//!
//! Input: byte 0 = flags: bits 0 to 6 the size of the pieces the bytes are
//! handed over in (0: all at once), bit 7 re-seal (recompute each frame's
//! crc, so that mutations get past it into the message rules); then the
//! frames.
#![no_main]

use arbor_replica::plan::{decide, Local, LocalSnapshot};
use arbor_replica::proto::{
    encode, FrameDecoder, Message, FRAME_CRC_LEN, FRAME_HEADER_LEN, MAX_PAYLOAD,
};
use arbor_stream::format::Guid;
use libfuzzer_sys::fuzz_target;

/// Most messages decoded from one input: the decoder must make progress.
const MAX_MESSAGES: usize = 1 << 16;

fn reseal(bytes: &mut [u8]) {
    let mut at = 0;
    while at + FRAME_HEADER_LEN <= bytes.len() {
        let len =
            u32::from_le_bytes([bytes[at + 8], bytes[at + 9], bytes[at + 10], bytes[at + 11]]);
        let Some(end) = usize::try_from(len)
            .ok()
            .filter(|&l| l <= MAX_PAYLOAD)
            .map(|l| at + FRAME_HEADER_LEN + l)
            .filter(|&e| e + FRAME_CRC_LEN <= bytes.len())
        else {
            return;
        };
        let crc = crc32c::crc32c(&bytes[at..end]);
        bytes[end..end + FRAME_CRC_LEN].copy_from_slice(&crc.to_le_bytes());
        at = end + FRAME_CRC_LEN;
    }
}

/// Every message of `bytes`, handed over `piece` bytes at a time, and
/// whether the decoder refused the rest.
fn decode_all(bytes: &[u8], piece: usize) -> (Vec<Message>, bool) {
    let mut decoder = FrameDecoder::new();
    let mut messages = Vec::new();
    for chunk in bytes.chunks(piece.max(1)) {
        decoder.push(chunk);
        assert!(
            decoder.buffered() <= FRAME_HEADER_LEN + MAX_PAYLOAD + FRAME_CRC_LEN + piece.max(1)
        );
        loop {
            match decoder.next_message() {
                Ok(Some(m)) => {
                    messages.push(m);
                    assert!(messages.len() <= MAX_MESSAGES);
                }
                Ok(None) => break,
                Err(_) => return (messages, true),
            }
        }
    }
    (messages, false)
}

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let mut bytes = rest.to_vec();
    if flags & 0x80 != 0 {
        reseal(&mut bytes);
    }
    let piece = usize::from(flags & 0x7f);
    let (whole, whole_refused) = decode_all(&bytes, bytes.len());
    if piece > 0 {
        assert_eq!(decode_all(&bytes, piece), (whole.clone(), whole_refused));
    }
    let local = Local::Volume {
        snapshots: vec![LocalSnapshot {
            guid: Guid([7; 16]),
            name: "vm1@a".into(),
        }],
        written: false,
    };
    for m in &whole {
        let mut again = Vec::new();
        encode(m, &mut again);
        let (back, refused) = decode_all(&again, again.len());
        assert!(!refused, "{m:?} does not decode after encoding");
        assert_eq!(back.as_slice(), std::slice::from_ref(m));
        if let Message::Hello(hello) = m {
            let _ = decide(hello, &local);
            let _ = decide(hello, &Local::Absent);
        }
    }
});
