//! Helpers shared by the integration tests: owned records, decoding a whole
//! stream (at once or in pieces), and taking streams apart and putting them
//! back together (re-framed, with a correct trailer) to build hostile ones.
#![allow(dead_code)]

use arbor_stream::format::{
    Decoded, Decoder, Encoding, Guid, Header, Record, StreamError, MAX_RECORD, RECORD_TRAILER,
};

/// A [`Record`] that owns its payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owned {
    Header(Header),
    Data {
        offset: u64,
        length: u32,
        encoding: Encoding,
        payload: Vec<u8>,
    },
    Zero {
        offset: u64,
        length: u64,
    },
    Discard {
        offset: u64,
        length: u64,
    },
    Skipped {
        kind: u16,
    },
    Key(Box<arbor_crypt::KeyRecord>),
    End,
}

pub fn own(record: Record<'_>) -> Owned {
    match record {
        Record::Header(h) => Owned::Header(h),
        Record::Key(k) => Owned::Key(k),
        Record::Data {
            offset,
            length,
            encoding,
            payload,
        } => Owned::Data {
            offset,
            length,
            encoding,
            payload: payload.to_vec(),
        },
        Record::Zero { offset, length } => Owned::Zero { offset, length },
        Record::Discard { offset, length } => Owned::Discard { offset, length },
        Record::Skipped { kind } => Owned::Skipped { kind },
        Record::End => Owned::End,
    }
}

/// What decoding a whole input gave: the records, in order, and how it
/// ended (Ok after the trailer and nothing else; else the error, from
/// `decode` or from `end_of_input`).
#[derive(Debug)]
pub struct Outcome {
    pub records: Vec<Owned>,
    pub result: Result<(), StreamError>,
}

/// Decodes `stream`, delivering it to the decoder in pieces whose sizes
/// `piece` chooses (calling `decode` after each piece), as a reader of a
/// pipe would. Checks the decoder's contract on the way: NeedMore asks for
/// more than it has and at most MAX_RECORD, a record takes at most what it
/// was given, `position` follows.
pub fn decode_pieces(stream: &[u8], mut piece: impl FnMut() -> usize) -> Outcome {
    let mut decoder = Decoder::new();
    let mut records = Vec::new();
    let (mut pos, mut avail) = (0usize, 0usize);
    let result = loop {
        match decoder.decode(&stream[pos..avail]) {
            Err(e) => break Err(e),
            Ok(Decoded::NeedMore(n)) => {
                assert!(n > avail - pos, "NeedMore({n}) with {} bytes", avail - pos);
                assert!(n <= MAX_RECORD, "NeedMore({n}) over MAX_RECORD");
                if avail == stream.len() {
                    break decoder.end_of_input();
                }
                avail = (avail + piece().max(1)).min(stream.len());
            }
            Ok(Decoded::Record { consumed, record }) => {
                assert!(consumed > 0 && consumed <= avail - pos);
                pos += consumed;
                assert_eq!(decoder.position(), pos as u64);
                let end = record == Record::End;
                records.push(own(record));
                if end {
                    assert!(decoder.finished());
                    // Whatever follows must be refused.
                    break match decoder.decode(&stream[pos..]) {
                        Ok(Decoded::NeedMore(0)) if pos == stream.len() => decoder.end_of_input(),
                        Ok(other) => panic!("after the trailer: {other:?}"),
                        Err(e) => Err(e),
                    };
                }
            }
        }
    };
    Outcome { records, result }
}

/// Decodes `stream` given whole.
pub fn decode_all(stream: &[u8]) -> Outcome {
    decode_pieces(stream, || usize::MAX / 2)
}

pub fn guid(seed: u8) -> Guid {
    let mut g = [0u8; 16];
    for (i, b) in g.iter_mut().enumerate() {
        *b = seed.wrapping_mul(31).wrapping_add(i as u8) | 1;
    }
    Guid(g)
}

pub fn header(volume_size: u64, base: Option<Guid>, resume_offset: u64) -> Header {
    Header {
        chunk_size: 16384,
        volume_size,
        target: guid(1),
        base,
        resume_offset,
        creation_time: 1_700_000_000,
        name: "vm1@monday".to_string(),
        raw: false,
    }
}

/// Deterministic pseudo-random bytes.
pub fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// One record as framed in a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Raw {
    pub kind: u16,
    pub flags: u16,
    pub seq: u64,
    pub payload: Vec<u8>,
    /// The record's bytes exactly as they were in the stream.
    pub bytes: Vec<u8>,
}

/// Splits a well-framed stream into its records (trailer included).
pub fn split(stream: &[u8]) -> Vec<Raw> {
    let mut out = Vec::new();
    let mut rest = stream;
    while rest.len() >= 16 {
        let kind = u16::from_le_bytes([rest[0], rest[1]]);
        let flags = u16::from_le_bytes([rest[2], rest[3]]);
        let len = u32::from_le_bytes(rest[4..8].try_into().unwrap()) as usize;
        let seq = u64::from_le_bytes(rest[8..16].try_into().unwrap());
        let total = 16 + len + 4;
        out.push(Raw {
            kind,
            flags,
            seq,
            payload: rest[16..16 + len].to_vec(),
            bytes: rest[..total].to_vec(),
        });
        rest = &rest[total..];
    }
    assert!(rest.is_empty());
    out
}

/// Frames one record.
pub fn frame(kind: u16, flags: u16, seq: u64, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&kind.to_le_bytes());
    out.extend_from_slice(&flags.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(payload);
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// The trailer for everything in `before`.
pub fn trailer_for(before: &[u8], records: u64) -> Vec<u8> {
    let mut payload = Vec::new();
    payload.extend_from_slice(&records.to_le_bytes());
    payload.extend_from_slice(&(before.len() as u64).to_le_bytes());
    payload.extend_from_slice(&crc32c::crc32c(before).to_le_bytes());
    payload.extend_from_slice(&0u32.to_le_bytes());
    frame(RECORD_TRAILER, 0, records, &payload)
}

/// A stream of `records` (kind, flags, payload; no trailer), numbered in
/// order and ended with a trailer that matches: only the rules the records
/// break can make it invalid.
pub fn assemble(records: &[(u16, u16, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (seq, (kind, flags, payload)) in records.iter().enumerate() {
        out.extend_from_slice(&frame(*kind, *flags, seq as u64, payload));
    }
    let trailer = trailer_for(&out, records.len() as u64);
    out.extend_from_slice(&trailer);
    out
}

/// The records of an encoded stream as `assemble` takes them (trailer
/// dropped).
pub fn parts(stream: &[u8]) -> Vec<(u16, u16, Vec<u8>)> {
    split(stream)
        .into_iter()
        .filter(|r| r.kind != RECORD_TRAILER)
        .map(|r| (r.kind, r.flags, r.payload))
        .collect()
}

pub fn range_payload(offset: u64, length: u64) -> Vec<u8> {
    let mut p = offset.to_le_bytes().to_vec();
    p.extend_from_slice(&length.to_le_bytes());
    p
}

pub fn data_payload(offset: u64, length: u32, encoding: u8, encoded: &[u8]) -> Vec<u8> {
    let mut p = offset.to_le_bytes().to_vec();
    p.extend_from_slice(&length.to_le_bytes());
    p.extend_from_slice(&[encoding, 0, 0, 0]);
    p.extend_from_slice(encoded);
    p
}
