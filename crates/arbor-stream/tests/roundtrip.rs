//! Encode then decode: every record and every byte of data comes back, with
//! any header, any mix of records, every compression mode, and the stream
//! fed to the decoder in pieces of any size.
// A test crate: unwrap, expect and panic are how a test reports failure
// (the workspace denies them in the code it ships; clippy.toml allows
// them in #[test] functions, this in the helpers around them).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use arbor_stream::format::{
    Compression, DataDecoder, Encoder, Encoding, Guid, Header, MAX_DATA, MAX_NAME,
};
use common::{decode_pieces, noise, Owned};
use proptest::prelude::*;

/// What a data record's bytes look like.
#[derive(Debug, Clone, Copy)]
enum Content {
    /// Incompressible.
    Noise,
    /// A short random pattern repeated: compresses well.
    Pattern(usize),
    Zeros,
    /// The base bytes with a few bytes changed: plain zstd gains nothing,
    /// a delta against the base almost everything.
    EditedBase,
}

#[derive(Debug, Clone)]
enum Op {
    Data {
        gap: u64,
        sectors: u64,
        content: Content,
        with_base: bool,
        seed: u64,
    },
    Zero {
        gap: u64,
        sectors: u64,
    },
    Discard {
        gap: u64,
        sectors: u64,
    },
}

fn content() -> impl Strategy<Value = Content> {
    prop_oneof![
        Just(Content::Noise),
        (1usize..64).prop_map(Content::Pattern),
        Just(Content::Zeros),
        Just(Content::EditedBase),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let gap = prop_oneof![3 => Just(0u64), 1 => 1u64..64];
    let data_sectors = prop_oneof![12 => 1u64..=32, 1 => Just((MAX_DATA / 512) as u64)];
    prop_oneof![
        4 => (gap.clone(), data_sectors, content(), any::<bool>(), any::<u64>()).prop_map(
            |(gap, sectors, content, with_base, seed)| Op::Data {
                gap,
                sectors,
                content,
                with_base,
                seed
            }
        ),
        1 => (gap.clone(), 1u64..1 << 20).prop_map(|(gap, sectors)| Op::Zero { gap, sectors }),
        1 => (gap, 1u64..1 << 20).prop_map(|(gap, sectors)| Op::Discard { gap, sectors }),
    ]
}

fn compression() -> impl Strategy<Value = Compression> {
    prop_oneof![
        Just(Compression::None),
        (-3i32..=4).prop_map(|level| Compression::Zstd { level }),
        (-3i32..=4).prop_map(|level| Compression::Best { level }),
    ]
}

fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z0-9]{1,20}@[a-z0-9._:-]{1,20}",
        "\\PC{1,60}".prop_filter("at most MAX_NAME bytes", |n| n.len() <= MAX_NAME),
    ]
}

#[derive(Debug, Clone)]
struct Case {
    chunk_shift: u32,
    resume_sectors: u64,
    spare_sectors: u64,
    incremental: bool,
    target: [u8; 16],
    creation_time: u64,
    name: String,
    ops: Vec<Op>,
    compression: Compression,
    /// 0: whole; else the largest piece handed to the decoder at once.
    max_piece: usize,
    piece_seed: u64,
}

fn case() -> impl Strategy<Value = Case> {
    (
        (
            12u32..=20,
            0u64..4096,
            0u64..64,
            any::<bool>(),
            any::<[u8; 16]>(),
        ),
        (any::<u64>(), name(), prop::collection::vec(op(), 0..12)),
        (
            compression(),
            prop_oneof![Just(0usize), Just(1), 2usize..64, 64usize..70_000],
            any::<u64>(),
        ),
    )
        .prop_map(
            |(
                (chunk_shift, resume_sectors, spare_sectors, incremental, target),
                (creation_time, name, ops),
                (compression, max_piece, piece_seed),
            )| Case {
                chunk_shift,
                resume_sectors,
                spare_sectors,
                incremental,
                target,
                creation_time,
                name,
                ops,
                compression,
                max_piece,
                piece_seed,
            },
        )
}

/// A data record as sent: its bytes and the base given with them.
struct Sent {
    offset: u64,
    bytes: Vec<u8>,
    base: Option<Vec<u8>>,
    encoding: Encoding,
}

fn run(case: &Case) -> Result<(), TestCaseError> {
    let mut target = case.target;
    target[0] |= 1;
    let base_guid = {
        let mut b = target;
        b[15] = !b[15];
        b[0] |= 1;
        Guid(b)
    };
    let resume_offset = case.resume_sectors * 512;
    let span: u64 = case
        .ops
        .iter()
        .map(|op| match *op {
            Op::Data { gap, sectors, .. }
            | Op::Zero { gap, sectors }
            | Op::Discard { gap, sectors } => gap + sectors,
        })
        .sum();
    let header = Header {
        chunk_size: 1 << case.chunk_shift,
        volume_size: resume_offset + (span + case.spare_sectors) * 512,
        target: Guid(target),
        base: case.incremental.then_some(base_guid),
        resume_offset,
        creation_time: case.creation_time,
        name: case.name.clone(),
        raw: false,
    };

    let mut stream = Vec::new();
    let mut expected = Vec::new();
    let mut sent = Vec::new();
    let mut enc = Encoder::new(&header, case.compression, &mut stream)
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    expected.push(Some(Owned::Header(header.clone())));
    let mut at = resume_offset;
    for op in &case.ops {
        match *op {
            Op::Data {
                gap,
                sectors,
                content,
                with_base,
                seed,
            } => {
                let offset = at + gap * 512;
                let len = (sectors * 512) as usize;
                let base_bytes = noise(seed ^ 0xba5e, len);
                let bytes = match content {
                    Content::Noise => noise(seed, len),
                    Content::Pattern(period) => {
                        let unit = noise(seed, period);
                        unit.iter().copied().cycle().take(len).collect()
                    }
                    Content::Zeros => vec![0; len],
                    Content::EditedBase => {
                        let mut b = base_bytes.clone();
                        for i in (0..len).step_by(1000) {
                            b[i] ^= 0x5a;
                        }
                        b
                    }
                };
                let base = (with_base && case.incremental).then_some(base_bytes);
                let encoding = enc
                    .data(offset, &bytes, base.as_deref(), &mut stream)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                match case.compression {
                    Compression::None => prop_assert_eq!(encoding, Encoding::Raw),
                    _ => prop_assert!(base.is_some() || encoding != Encoding::ZstdDelta),
                }
                if matches!(content, Content::Zeros) && case.compression != Compression::None {
                    prop_assert_ne!(encoding, Encoding::Raw);
                }
                if matches!(case.compression, Compression::Best { .. }) {
                    if let (Content::EditedBase, Some(_)) = (content, &base) {
                        prop_assert_eq!(encoding, Encoding::ZstdDelta);
                    }
                }
                expected.push(None);
                sent.push(Sent {
                    offset,
                    bytes,
                    base,
                    encoding,
                });
                at = offset + len as u64;
            }
            Op::Zero { gap, sectors } | Op::Discard { gap, sectors } => {
                let offset = at + gap * 512;
                let length = sectors * 512;
                if let Op::Zero { .. } = op {
                    enc.zero(offset, length, &mut stream)
                        .map_err(|e| TestCaseError::fail(e.to_string()))?;
                    expected.push(Some(Owned::Zero { offset, length }));
                } else {
                    enc.discard(offset, length, &mut stream)
                        .map_err(|e| TestCaseError::fail(e.to_string()))?;
                    expected.push(Some(Owned::Discard { offset, length }));
                }
                at = offset + length;
            }
        }
    }
    prop_assert_eq!(enc.position(), stream.len() as u64);
    enc.finish(&mut stream)
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    expected.push(Some(Owned::End));

    // Feed it back in pieces.
    let mut x = case.piece_seed | 1;
    let max_piece = case.max_piece;
    let outcome = decode_pieces(&stream, || {
        if max_piece == 0 {
            return usize::MAX / 2;
        }
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        1 + (x % max_piece as u64) as usize
    });
    if let Err(e) = &outcome.result {
        return Err(TestCaseError::fail(format!("decoding failed: {e}")));
    }
    prop_assert_eq!(outcome.records.len(), expected.len());
    let mut data = DataDecoder::new();
    let mut sent = sent.iter();
    let mut out = Vec::new();
    for (got, want) in outcome.records.iter().zip(&expected) {
        match (got, want) {
            (
                Owned::Data {
                    offset,
                    length,
                    encoding,
                    payload,
                },
                None,
            ) => {
                let s = sent
                    .next()
                    .ok_or_else(|| TestCaseError::fail("extra data"))?;
                prop_assert_eq!(*offset, s.offset);
                prop_assert_eq!(*length as usize, s.bytes.len());
                prop_assert_eq!(*encoding, s.encoding);
                if *encoding != Encoding::Raw {
                    prop_assert!(payload.len() < s.bytes.len());
                }
                data.decode(*encoding, payload, *length, s.base.as_deref(), &mut out)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert!(out == s.bytes, "data at {} differs", offset);
            }
            (got, Some(want)) => prop_assert_eq!(got, want),
            (got, None) => prop_assert!(false, "expected data, got {:?}", got),
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn every_record_and_byte_comes_back(case in case()) {
        run(&case)?;
    }
}

/// The same, once with the largest records, every compression mode and a
/// base, byte by byte.
#[test]
fn largest_records_byte_by_byte() {
    for compression in [
        Compression::None,
        Compression::Zstd { level: 1 },
        Compression::Best { level: 3 },
    ] {
        let case = Case {
            chunk_shift: 20,
            resume_sectors: 0,
            spare_sectors: 1,
            incremental: true,
            target: [9; 16],
            creation_time: 0,
            name: "v@s".to_string(),
            ops: vec![
                Op::Data {
                    gap: 0,
                    sectors: 2048,
                    content: Content::Noise,
                    with_base: true,
                    seed: 1,
                },
                Op::Data {
                    gap: 0,
                    sectors: 2048,
                    content: Content::EditedBase,
                    with_base: true,
                    seed: 2,
                },
                Op::Data {
                    gap: 0,
                    sectors: 2048,
                    content: Content::Pattern(13),
                    with_base: false,
                    seed: 3,
                },
            ],
            compression,
            max_piece: 1,
            piece_seed: 1,
        };
        run(&case).unwrap();
    }
}
