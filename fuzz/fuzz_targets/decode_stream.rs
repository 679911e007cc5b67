//! Feeds arbitrary bytes to the send-stream decoder, whole and in pieces,
//! and every data record it accepts to the data decoder (delta records
//! against a fixed base); also parses the input as a resume token and an
//! identity. None of it may panic, ask for more than a record's worth of
//! bytes, decode more data than a record states, or decode differently
//! depending on how the bytes arrive. The same bytes also go to the `rbd
//! diff` decoder (Ceph's format), whole and in pieces, with the same rules.
//!
//! Input: byte 0 = flags: bits 0 to 6 the size of the pieces the stream is
//! handed to the decoder in (0: all at once), bit 7 re-seal (recompute
//! every record's checksum and the trailer's totals, so that mutations get
//! past the checksums into the record rules and the decompressor); then
//! the stream. Seeds: `cargo run -p arbor-campaigns --bin fuzz-seeds
//! decode_stream DIR` (real streams in this encoding).
#![no_main]

use std::sync::OnceLock;

use arbor_stream::format::{
    DataDecoder, Decoded, Decoder, Encoding, Guid, Header, Record, ResumeToken, StreamError,
    FRAME_HEADER_LEN, MAX_DATA, MAX_PAYLOAD, MAX_RECORD, RECORD_TRAILER, TRAILER_PAYLOAD_LEN,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(token) = text.parse::<ResumeToken>() {
            assert_eq!(token.encode().parse::<ResumeToken>(), Ok(token));
        }
        if let Ok(guid) = text.parse::<Guid>() {
            assert_eq!(guid.to_string().parse::<Guid>(), Ok(guid));
        }
    }
    let Some((&flags, stream)) = data.split_first() else {
        return;
    };
    let mut stream = stream.to_vec();
    if flags & 0x80 != 0 {
        reseal(&mut stream);
    }
    let piece = usize::from(flags & 0x7f);
    let whole = decode(&stream, usize::MAX);
    if piece != 0 {
        assert_eq!(decode(&stream, piece), whole, "pieces of {piece} bytes");
    }
    // As an rbd diff (also with the banner prepended, so the bytes reach
    // the record rules).
    let rbd_whole = decode_rbd(&stream, usize::MAX);
    if piece != 0 {
        assert_eq!(
            decode_rbd(&stream, piece),
            rbd_whole,
            "rbd pieces of {piece} bytes"
        );
    }
    let mut banner = if flags & 1 == 0 {
        arbor_stream::rbd::BANNER_V1.to_vec()
    } else {
        arbor_stream::rbd::BANNER_V2.to_vec()
    };
    banner.extend_from_slice(&stream);
    let rbd_whole = decode_rbd(&banner, usize::MAX);
    if piece != 0 {
        assert_eq!(
            decode_rbd(&banner, piece),
            rbd_whole,
            "rbd pieces of {piece} bytes"
        );
    }
});

/// Decodes `stream` as an rbd diff handed over `piece` bytes at a time;
/// returns the records (write pieces joined into (offset, total length))
/// and how it ended.
fn decode_rbd(stream: &[u8], piece: usize) -> (Vec<String>, Result<(), String>) {
    use arbor_stream::rbd::{RbdDecoded, RbdDecoder, RbdRecord, MAX_PIECE};
    let mut decoder = RbdDecoder::new();
    let mut seen: Vec<String> = Vec::new();
    let mut written: Option<(u64, u64)> = None;
    let (mut pos, mut avail) = (0usize, 0usize);
    let flush = |written: &mut Option<(u64, u64)>, seen: &mut Vec<String>| {
        if let Some((offset, len)) = written.take() {
            seen.push(format!("w {offset} {len}"));
        }
    };
    loop {
        match decoder.decode(&stream[pos..avail]) {
            Err(e) => {
                flush(&mut written, &mut seen);
                return (seen, Err(e.to_string()));
            }
            Ok(RbdDecoded::NeedMore(n)) => {
                assert!(n <= MAX_PIECE + 64, "NeedMore({n})");
                if avail == stream.len() {
                    flush(&mut written, &mut seen);
                    return (seen, decoder.end_of_input().map_err(|e| e.to_string()));
                }
                avail = avail.saturating_add(piece).min(stream.len());
            }
            Ok(RbdDecoded::Record { consumed, record }) => {
                assert!(consumed <= avail - pos);
                pos += consumed;
                match record {
                    RbdRecord::Write { offset, data } => {
                        assert!(data.len() <= MAX_PIECE);
                        match &mut written {
                            Some((o, l)) if *o + *l == offset => *l += data.len() as u64,
                            _ => {
                                flush(&mut written, &mut seen);
                                written = Some((offset, data.len() as u64));
                            }
                        }
                    }
                    other => {
                        flush(&mut written, &mut seen);
                        seen.push(format!("{other:?}"));
                    }
                }
            }
        }
    }
}

/// The receiver's bytes for a delta record's range: the first `length`
/// bytes of a fixed pattern (the seeds' delta records are made against it).
pub fn base() -> &'static [u8] {
    static BASE: OnceLock<Vec<u8>> = OnceLock::new();
    BASE.get_or_init(|| {
        (0..MAX_DATA)
            .map(|i| ((i * 7 + i / 4096) % 251) as u8)
            .collect()
    })
}

/// A record as seen, for comparing two runs.
#[derive(Debug, PartialEq)]
enum Seen {
    Header(Header),
    Key,
    /// Volume offset, length, encoding, where the record started in the
    /// stream, and whether its data decoded.
    Data(u64, u32, Encoding, u64, bool),
    Zero(u64, u64),
    Discard(u64, u64),
    Skipped(u16),
    End,
}

/// Decodes `stream` handed over `piece` bytes at a time.
fn decode(stream: &[u8], piece: usize) -> (Vec<Seen>, Result<(), StreamError>) {
    let mut decoder = Decoder::new();
    let mut data = DataDecoder::new();
    let mut out = Vec::new();
    let mut seen = Vec::new();
    let (mut pos, mut avail) = (0usize, 0usize);
    loop {
        let at = decoder.position();
        match decoder.decode(&stream[pos..avail]) {
            Err(e) => return (seen, Err(e)),
            Ok(Decoded::NeedMore(n)) => {
                assert!(n > avail - pos && n <= MAX_RECORD, "NeedMore({n})");
                if avail == stream.len() {
                    return (seen, decoder.end_of_input());
                }
                avail = avail.saturating_add(piece).min(stream.len());
            }
            Ok(Decoded::Record { consumed, record }) => {
                assert!(consumed > 0 && consumed <= avail - pos);
                pos += consumed;
                let record = match record {
                    Record::Header(h) => Seen::Header(h),
                    Record::Key(_) => Seen::Key,
                    Record::Data {
                        offset,
                        length,
                        encoding,
                        payload,
                    } => {
                        let len = length as usize;
                        assert!(len <= MAX_DATA && payload.len() <= MAX_PAYLOAD);
                        let ok = data
                            .decode(encoding, payload, length, base().get(..len), &mut out)
                            .is_ok();
                        assert_eq!(out.len(), if ok { len } else { 0 });
                        Seen::Data(offset, length, encoding, at, ok)
                    }
                    Record::Zero { offset, length } => Seen::Zero(offset, length),
                    Record::Discard { offset, length } => Seen::Discard(offset, length),
                    Record::Skipped { kind } => Seen::Skipped(kind),
                    Record::End => Seen::End,
                };
                let end = record == Seen::End;
                seen.push(record);
                if end {
                    assert!(decoder.finished());
                    return match decoder.decode(&stream[pos..]) {
                        Ok(Decoded::NeedMore(0)) if pos == stream.len() => (seen, Ok(())),
                        Err(e @ StreamError::TrailingBytes { .. }) => (seen, Err(e)),
                        other => panic!("after the trailer: {other:?}"),
                    };
                }
            }
        }
    }
}

/// Recomputes every whole record's checksum, and the trailer's totals,
/// from the start of `stream` until a frame that does not fit.
fn reseal(stream: &mut [u8]) {
    let (mut at, mut records, mut crc) = (0usize, 0u64, 0u32);
    while let Some(frame) = stream.get(at..at + FRAME_HEADER_LEN) {
        let kind = u16::from_le_bytes([frame[0], frame[1]]);
        let len = u32::from_le_bytes([frame[4], frame[5], frame[6], frame[7]]) as usize;
        if len > MAX_PAYLOAD || at + FRAME_HEADER_LEN + len + 4 > stream.len() {
            return;
        }
        let end = at + FRAME_HEADER_LEN + len;
        if kind == RECORD_TRAILER && len == TRAILER_PAYLOAD_LEN {
            let p = at + FRAME_HEADER_LEN;
            stream[p..p + 8].copy_from_slice(&records.to_le_bytes());
            stream[p + 8..p + 16].copy_from_slice(&(at as u64).to_le_bytes());
            stream[p + 16..p + 20].copy_from_slice(&crc.to_le_bytes());
        }
        let record_crc = crc32c::crc32c(&stream[at..end]);
        stream[end..end + 4].copy_from_slice(&record_crc.to_le_bytes());
        crc = crc32c::crc32c_append(crc, &stream[at..end + 4]);
        records += 1;
        at = end + 4;
    }
}
