//! Damaged, truncated, reordered and malicious streams: every one is
//! refused with the right error, never a panic, and no record that was not
//! sent is ever handed out.
// A test crate: unwrap, expect and panic are how a test reports failure
// (the workspace denies them in the code it ships; clippy.toml allows
// them in #[test] functions, this in the helpers around them).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use arbor_stream::format::{
    decode_data, Compression, DataDecoder, Decoded, Decoder, Encoder, Encoding, Header, Record,
    StreamError, TrailerField, MAX_DATA, MAX_PAYLOAD, MAX_RECORD, RECORD_DATA, RECORD_DISCARD,
    RECORD_FLAG_OPTIONAL, RECORD_HEADER, RECORD_TRAILER, RECORD_ZERO,
};
use common::*;

const MIB: u64 = 1 << 20;

/// Says whether an error is the one a case expects.
type Check = fn(&StreamError) -> bool;
/// Records as `assemble` takes them.
type Parts = Vec<(u16, u16, Vec<u8>)>;

/// A small incremental stream with every kind of record: raw, zstd and
/// delta data, zero, discard.
fn small_stream() -> Vec<u8> {
    let mut out = Vec::new();
    let h = header(MIB, Some(guid(2)), 0);
    let mut enc = Encoder::new(&h, Compression::Best { level: 3 }, &mut out).unwrap();
    let base = noise(7, 1024);
    let mut edited = base.clone();
    edited[100] ^= 1;
    assert_eq!(
        enc.data(0, &noise(1, 512), None, &mut out).unwrap(),
        Encoding::Raw
    );
    assert_eq!(
        enc.data(4096, &[0xab; 2048], None, &mut out).unwrap(),
        Encoding::Zstd
    );
    assert_eq!(
        enc.data(8192, &edited, Some(&base), &mut out).unwrap(),
        Encoding::ZstdDelta
    );
    enc.zero(16384, 8192, &mut out).unwrap();
    enc.discard(65536, 65536, &mut out).unwrap();
    enc.finish(&mut out).unwrap();
    out
}

fn err(stream: &[u8]) -> StreamError {
    match decode_all(stream).result {
        Ok(()) => panic!("accepted"),
        Err(e) => e,
    }
}

/// The records of the `small_stream`.
fn reference() -> Vec<Owned> {
    let o = decode_all(&small_stream());
    o.result.unwrap();
    assert_eq!(o.records.len(), 7);
    o.records
}

#[test]
fn every_truncation_is_need_more_then_truncated() {
    let stream = small_stream();
    let full = reference();
    for cut in 0..stream.len() {
        let o = decode_all(&stream[..cut]);
        assert!(
            matches!(o.result, Err(StreamError::Truncated { .. })),
            "cut at {cut}: {:?}",
            o.result
        );
        // Only whole records before the cut, exactly as sent.
        assert_eq!(o.records[..], full[..o.records.len()], "cut at {cut}");
        assert!(!o.records.contains(&Owned::End));
    }
    assert!(decode_all(&stream).result.is_ok());
}

#[test]
fn every_bit_flip_is_refused() {
    let stream = small_stream();
    let full = reference();
    for bit in 0..stream.len() * 8 {
        let mut s = stream.clone();
        s[bit / 8] ^= 1 << (bit % 8);
        let o = decode_all(&s);
        assert!(o.result.is_err(), "bit {bit} flipped: accepted");
        assert_eq!(o.records[..], full[..o.records.len()], "bit {bit}");
        // In pieces, the same.
        let mut n = bit;
        let p = decode_pieces(&s, || {
            n = n * 7 % 97 + 1;
            n
        });
        assert_eq!(p.records, o.records, "bit {bit}, in pieces");
        assert_eq!(p.result, o.result, "bit {bit}, in pieces");
    }
}

#[test]
fn a_flipped_bit_inside_a_record_fails_its_checksum() {
    let stream = small_stream();
    let records = split(&stream);
    let at = records[0].bytes.len() + records[1].bytes.len();
    let mut s = stream.clone();
    s[at + 20] ^= 4; // record 2's payload
    assert_eq!(
        err(&s),
        StreamError::Checksum {
            record: 2,
            at: at as u64
        }
    );
    assert_eq!(
        err(&s).to_string(),
        format!("stream damaged: record 2 at byte {at} fails its checksum")
    );
}

#[test]
fn swapped_dropped_or_duplicated_records_are_refused() {
    let stream = small_stream();
    let records = split(&stream);
    let join = |order: &[usize]| -> Vec<u8> {
        order
            .iter()
            .flat_map(|&i| records[i].bytes.clone())
            .collect()
    };
    // As sent (sequence numbers and checksums intact): the sequence catches it.
    for (order, found) in [
        (&[0, 2, 1, 3, 4, 5, 6][..], 2),
        (&[0, 1, 1, 2, 3, 4, 5, 6][..], 1),
        (&[0, 1, 3, 4, 5, 6][..], 3),
        (&[0, 1, 2, 3, 4, 5][..], 0), // no trailer: truncated
    ] {
        let e = err(&join(order));
        if found == 0 {
            assert!(
                matches!(e, StreamError::Truncated { records: 6, .. }),
                "{e}"
            );
        } else {
            assert!(
                matches!(e, StreamError::Sequence { found: f, .. } if f == found),
                "{order:?}: {e}"
            );
        }
    }
    // Re-framed with fresh sequence numbers and a matching trailer: the
    // ordering rules catch it.
    let mut p = parts(&stream);
    p.swap(1, 2);
    assert!(matches!(
        err(&assemble(&p)),
        StreamError::OutOfOrder {
            record: 2,
            offset: 0,
            min: 6144,
            ..
        }
    ));
    let mut p = parts(&stream);
    p.insert(2, p[1].clone());
    assert!(matches!(
        err(&assemble(&p)),
        StreamError::OutOfOrder {
            record: 2,
            offset: 0,
            min: 512,
            ..
        }
    ));
    // A record dropped and re-framed is a valid (different) stream: the
    // trailer only proves the stream is what its sender wrote.
    let mut p = parts(&stream);
    p.remove(3);
    assert!(decode_all(&assemble(&p)).result.is_ok());
}

fn with_header(records: Parts, h: &Header) -> Vec<u8> {
    let mut out = Vec::new();
    Encoder::new(h, Compression::None, &mut out).unwrap();
    let mut p = parts(&out);
    p.extend(records);
    assemble(&p)
}

#[test]
fn ranges_out_of_order_overlapping_misaligned_or_past_the_end_are_refused() {
    let h = header(MIB, None, 8192);
    let zero = |o, l| (RECORD_ZERO, 0, range_payload(o, l));
    let discard = |o, l| (RECORD_DISCARD, 0, range_payload(o, l));
    let data = |o, l: u32| (RECORD_DATA, 0, data_payload(o, l, 0, &vec![1; l as usize]));
    let ok = with_header(vec![zero(8192, 512), discard(8704, MIB - 8704)], &h);
    assert!(decode_all(&ok).result.is_ok());

    let cases: Vec<(Parts, Check)> = vec![
        (vec![zero(MIB - 512, 1024)], |e| {
            matches!(e, StreamError::OutOfRange { record: 1, offset, length: 1024, volume_size, .. }
                if *offset == MIB - 512 && *volume_size == MIB)
        }),
        (vec![data(MIB, 512)], |e| {
            matches!(e, StreamError::OutOfRange { .. })
        }),
        (vec![zero(u64::MAX - 511, 1024)], |e| {
            matches!(e, StreamError::OutOfRange { .. })
        }),
        (vec![discard(8192, u64::MAX - 511)], |e| {
            matches!(e, StreamError::OutOfRange { .. })
        }),
        (vec![zero(8192, 4096), zero(8192 + 3584, 512)], |e| {
            matches!(
                e,
                StreamError::OutOfOrder {
                    record: 2,
                    offset: 11776,
                    min: 12288,
                    ..
                }
            )
        }),
        (vec![zero(16384, 512), data(8192, 512)], |e| {
            matches!(e, StreamError::OutOfOrder { record: 2, .. })
        }),
        (vec![zero(0, 512)], |e| {
            matches!(
                e,
                StreamError::OutOfOrder {
                    record: 1,
                    offset: 0,
                    min: 8192,
                    ..
                }
            )
        }),
        (vec![zero(8193, 512)], |e| {
            matches!(e, StreamError::Misaligned { offset: 8193, .. })
        }),
        (vec![zero(8192, 100)], |e| {
            matches!(e, StreamError::Misaligned { length: 100, .. })
        }),
        (vec![discard(8192, 0)], |e| {
            matches!(e, StreamError::Misaligned { length: 0, .. })
        }),
        (vec![data(8192, 0)], |e| {
            matches!(e, StreamError::Misaligned { length: 0, .. })
        }),
        (vec![data(8192, 100)], |e| {
            matches!(e, StreamError::Misaligned { length: 100, .. })
        }),
    ];
    for (i, (records, check)) in cases.into_iter().enumerate() {
        let e = err(&with_header(records, &h));
        assert!(check(&e), "case {i}: {e:?}");
    }
}

#[test]
fn oversized_length_fields_are_refused_from_the_frame_header_alone() {
    let h = header(MIB, None, 0);
    let mut stream = Vec::new();
    Encoder::new(&h, Compression::None, &mut stream).unwrap();
    let at = stream.len();
    for len in [MAX_PAYLOAD as u32 + 1, u32::MAX] {
        let mut s = stream.clone();
        s.extend_from_slice(&RECORD_DATA.to_le_bytes());
        s.extend_from_slice(&0u16.to_le_bytes());
        s.extend_from_slice(&len.to_le_bytes());
        s.extend_from_slice(&1u64.to_le_bytes());
        let mut d = Decoder::new();
        let Decoded::Record { consumed, .. } = d.decode(&s).unwrap() else {
            panic!()
        };
        assert_eq!(consumed, at);
        assert_eq!(d.decode(&s[at..at + 15]).unwrap(), Decoded::NeedMore(16));
        assert_eq!(
            d.decode(&s[at..]),
            Err(StreamError::RecordTooLarge {
                record: 1,
                at: at as u64,
                length: u64::from(len)
            })
        );
    }
    // The largest allowed: the decoder asks for all of it, no more.
    let mut s = stream.clone();
    s.extend_from_slice(&frame(RECORD_DATA, 0, 1, &[])[..16]);
    s[at + 4..at + 8].copy_from_slice(&(MAX_PAYLOAD as u32).to_le_bytes());
    let mut d = Decoder::new();
    d.decode(&s).unwrap();
    assert_eq!(d.decode(&s[at..]).unwrap(), Decoded::NeedMore(MAX_RECORD));
}

#[test]
fn data_records_lie_about_their_encoding() {
    let full = header(MIB, None, 0);
    let incr = header(MIB, Some(guid(3)), 0);
    let zstd = zstd::bulk::compress(&[5u8; 4096], 3).unwrap();
    let rec = |payload: Vec<u8>| vec![(RECORD_DATA, 0, payload)];
    let cases: Vec<(Vec<u8>, Check)> = vec![
        // Raw with fewer or more bytes than its length.
        (
            with_header(rec(data_payload(0, 4096, 0, &[1; 4095])), &full),
            |e| matches!(e, StreamError::BadEncoding { record: 1, .. }),
        ),
        (
            with_header(rec(data_payload(0, 512, 0, &[1; 1024])), &full),
            |e| matches!(e, StreamError::BadEncoding { .. }),
        ),
        // Compressed but not smaller.
        (
            with_header(rec(data_payload(0, 512, 1, &[1; 512])), &full),
            |e| matches!(e, StreamError::BadEncoding { .. }),
        ),
        (with_header(rec(data_payload(0, 512, 1, &[])), &full), |e| {
            matches!(e, StreamError::BadEncoding { .. })
        }),
        // Unknown encoding.
        (
            with_header(rec(data_payload(0, 4096, 3, &zstd)), &full),
            |e| matches!(e, StreamError::BadEncoding { .. }),
        ),
        // Delta in a full stream.
        (
            with_header(rec(data_payload(0, 4096, 2, &zstd)), &full),
            |e| matches!(e, StreamError::DeltaNotIncremental { record: 1, .. }),
        ),
        // Reserved bytes.
        (
            with_header(
                rec({
                    let mut p = data_payload(0, 4096, 1, &zstd);
                    p[14] = 1;
                    p
                }),
                &full,
            ),
            |e| matches!(e, StreamError::BadRecord { .. }),
        ),
        // Shorter than its header.
        (with_header(rec(vec![0; 15]), &full), |e| {
            matches!(e, StreamError::BadRecord { .. })
        }),
        // More data than a record may carry.
        (
            with_header(rec(data_payload(0, 2 << 20, 1, &zstd)), &full),
            |e| matches!(e, StreamError::DataTooLarge { length, .. } if *length == 2 << 20),
        ),
    ];
    for (i, (stream, check)) in cases.into_iter().enumerate() {
        let e = err(&stream);
        assert!(check(&e), "case {i}: {e:?}");
    }
    // The same delta in an incremental stream is accepted by the decoder.
    assert!(
        decode_all(&with_header(rec(data_payload(0, 4096, 2, &zstd)), &incr))
            .result
            .is_ok()
    );
}

#[test]
fn zstd_payloads_that_decompress_to_the_wrong_length_are_refused() {
    let mut out = vec![9; 10];
    let mut d = DataDecoder::new();
    // A bomb: 1 MiB of zeros in a few dozen bytes, claiming 4096.
    let bomb = zstd::bulk::compress(&vec![0u8; MAX_DATA], 19).unwrap();
    assert!(bomb.len() < 4096);
    assert_eq!(
        d.decode(Encoding::Zstd, &bomb, 4096, None, &mut out),
        Err(StreamError::WrongLength {
            expected: 4096,
            found: Some(MAX_DATA as u64)
        })
    );
    assert!(out.is_empty());
    // The same without a stated size: refused when the output overflows.
    let mut c = zstd::bulk::Compressor::new(19).unwrap();
    c.set_parameter(zstd::stream::raw::CParameter::ContentSizeFlag(false))
        .unwrap();
    let unsized_bomb = c.compress(&vec![0u8; MAX_DATA]).unwrap();
    assert!(matches!(
        zstd::zstd_safe::get_frame_content_size(&unsized_bomb),
        Ok(None)
    ));
    assert_eq!(
        d.decode(Encoding::Zstd, &unsized_bomb, 4096, None, &mut out),
        Err(StreamError::WrongLength {
            expected: 4096,
            found: None
        })
    );
    // Too short, with and without a stated size.
    let short = zstd::bulk::compress(&[1u8; 512], 3).unwrap();
    assert_eq!(
        d.decode(Encoding::Zstd, &short, 4096, None, &mut out),
        Err(StreamError::WrongLength {
            expected: 4096,
            found: Some(512)
        })
    );
    let unsized_short = c.compress(&[1u8; 512]).unwrap();
    assert_eq!(
        d.decode(Encoding::Zstd, &unsized_short, 4096, None, &mut out),
        Err(StreamError::WrongLength {
            expected: 4096,
            found: Some(512)
        })
    );
    // Garbage, two frames, a frame with bytes after it, a skippable frame.
    let good = zstd::bulk::compress(&[3u8; 4096], 3).unwrap();
    let two = [good.clone(), good.clone()].concat();
    let tail = [good.clone(), vec![0]].concat();
    let mut skippable = 0x184D_2A50u32.to_le_bytes().to_vec();
    skippable.extend_from_slice(&4u32.to_le_bytes());
    skippable.extend_from_slice(&[0; 4]);
    for payload in [&b"not zstd at all"[..], &two, &tail, &skippable, &good[..5]] {
        assert!(matches!(
            d.decode(Encoding::Zstd, payload, 4096, None, &mut out),
            Err(StreamError::Decompress { .. })
        ));
    }
    d.decode(Encoding::Zstd, &good, 4096, None, &mut out)
        .unwrap();
    assert_eq!(out, vec![3u8; 4096]);
}

#[test]
fn delta_payloads_need_the_right_base() {
    let base = noise(3, 4096);
    let mut data = base.clone();
    data[7] ^= 0xff;
    let mut stream = Vec::new();
    let h = header(MIB, Some(guid(4)), 0);
    let mut enc = Encoder::new(&h, Compression::Zstd { level: 3 }, &mut stream).unwrap();
    assert_eq!(
        enc.data(0, &data, Some(&base), &mut stream).unwrap(),
        Encoding::ZstdDelta
    );
    enc.finish(&mut stream).unwrap();
    let o = decode_all(&stream);
    o.result.unwrap();
    let Owned::Data {
        payload, length, ..
    } = &o.records[1]
    else {
        panic!()
    };
    let mut out = Vec::new();
    decode_data(Encoding::ZstdDelta, payload, *length, Some(&base), &mut out).unwrap();
    assert_eq!(out, data);
    assert_eq!(
        decode_data(Encoding::ZstdDelta, payload, *length, None, &mut out),
        Err(StreamError::DeltaWithoutBase)
    );
    assert_eq!(
        decode_data(
            Encoding::ZstdDelta,
            payload,
            *length,
            Some(&base[..512]),
            &mut out
        ),
        Err(StreamError::BaseLength {
            expected: 4096,
            found: 512
        })
    );
    // Another base: zstd refuses the frame or makes other bytes; never
    // these ones, never a panic.
    let other = noise(4, 4096);
    match decode_data(
        Encoding::ZstdDelta,
        payload,
        *length,
        Some(&other),
        &mut out,
    ) {
        Ok(()) => assert_ne!(out, data),
        Err(e) => assert!(matches!(e, StreamError::Decompress { .. }), "{e}"),
    }
    // A base zstd would take for a formatted dictionary: never used.
    let mut dict_like = base.clone();
    dict_like[..4].copy_from_slice(&0xEC30_A437u32.to_le_bytes());
    let mut s2 = Vec::new();
    let mut enc = Encoder::new(&h, Compression::Best { level: 3 }, &mut s2).unwrap();
    let mut near = dict_like.clone();
    near[100] ^= 1;
    assert_ne!(
        enc.data(0, &near, Some(&dict_like), &mut s2).unwrap(),
        Encoding::ZstdDelta
    );
    assert!(matches!(
        decode_data(
            Encoding::ZstdDelta,
            payload,
            *length,
            Some(&dict_like),
            &mut out
        ),
        Err(StreamError::Decompress { .. })
    ));
}

#[test]
fn unknown_records_are_skipped_if_optional_else_refused() {
    let stream = small_stream();
    let mut p = parts(&stream);
    p.insert(
        2,
        (77, RECORD_FLAG_OPTIONAL, b"a newer sender's note".to_vec()),
    );
    p.insert(4, (0, RECORD_FLAG_OPTIONAL, vec![]));
    let o = decode_all(&assemble(&p));
    o.result.unwrap();
    assert_eq!(o.records[2], Owned::Skipped { kind: 77 });
    assert_eq!(o.records[4], Owned::Skipped { kind: 0 });
    assert_eq!(o.records.len(), 9);

    let mut p = parts(&stream);
    p.insert(2, (77, 0, vec![]));
    assert_eq!(
        err(&assemble(&p)),
        StreamError::UnknownRecord {
            record: 2,
            at: (split(&stream)[0].bytes.len() + split(&stream)[1].bytes.len()) as u64,
            kind: 77
        }
    );
    // Flags: unknown bits anywhere, OPTIONAL on a known type.
    for (i, flags) in [(2, 2u16), (2, 0x8001), (1, RECORD_FLAG_OPTIONAL)] {
        let mut p = parts(&stream);
        if i == 2 {
            p.insert(2, (77, flags, vec![]));
        } else {
            p[i].1 = flags;
        }
        assert!(
            matches!(err(&assemble(&p)), StreamError::BadFlags { flags: f, .. } if f == flags),
            "{flags:#x}"
        );
    }
}

#[test]
fn bytes_after_the_trailer_are_refused() {
    let stream = small_stream();
    for extra in [&[0u8][..], &b"x"[..], &stream[..]] {
        let s = [stream.clone(), extra.to_vec()].concat();
        assert_eq!(
            err(&s),
            StreamError::TrailingBytes {
                at: stream.len() as u64
            }
        );
    }
    // And the decoder says so from then on.
    let mut d = Decoder::new();
    let mut at = 0;
    loop {
        match d.decode(&stream[at..]).unwrap() {
            Decoded::Record { consumed, record } => {
                at += consumed;
                if record == Record::End {
                    break;
                }
            }
            Decoded::NeedMore(_) => panic!(),
        }
    }
    assert_eq!(d.decode(&[]), Ok(Decoded::NeedMore(0)));
    assert!(matches!(
        d.decode(&[1]),
        Err(StreamError::TrailingBytes { .. })
    ));
    d.end_of_input().unwrap();
}

#[test]
fn headers_missing_duplicated_foreign_or_invalid_are_refused() {
    let stream = small_stream();
    let p = parts(&stream);
    let header_payload = p[0].2.clone();

    // Not a stream at all; a stream of a later version.
    assert_eq!(
        err(b"hello, this is not a stream at all"),
        StreamError::NotAStream
    );
    assert_eq!(err(&[0u8; 4096]), StreamError::NotAStream);
    let mut v3 = stream.clone();
    v3[24] = 3;
    assert_eq!(err(&v3), StreamError::UnsupportedVersion { version: 3 });
    // Short input: truncated, not "not a stream".
    assert!(matches!(
        err(&stream[..20]),
        StreamError::Truncated { at: 0, records: 0 }
    ));

    // First record not a header (but starting like one).
    let s = assemble(&[(RECORD_ZERO, 0, header_payload.clone())]);
    assert_eq!(err(&s), StreamError::HeaderMissing { kind: RECORD_ZERO });
    // Two headers.
    let mut p2 = p.clone();
    p2.insert(1, p[0].clone());
    assert!(matches!(
        err(&assemble(&p2)),
        StreamError::DuplicateHeader { record: 1, .. }
    ));
    // A trailer right after the header is a valid empty stream.
    assert!(decode_all(&assemble(&p[..1])).result.is_ok());

    // Header fields: (byte offset in the payload, new bytes, expected error).
    let field = |at: usize, bytes: &[u8]| {
        let mut h = header_payload.clone();
        h[at..at + bytes.len()].copy_from_slice(bytes);
        let mut q = p.clone();
        q[0].2 = h;
        err(&assemble(&q))
    };
    let bad_header = |e: StreamError| matches!(e, StreamError::BadHeader { .. });
    assert!(bad_header(field(10, &4u16.to_le_bytes())), "unknown flag");
    assert!(
        bad_header(field(10, &0u16.to_le_bytes())),
        "base without flag"
    );
    assert!(bad_header(field(12, &3000u32.to_le_bytes())), "chunk size");
    assert!(bad_header(field(12, &2048u32.to_le_bytes())), "chunk size");
    assert!(
        bad_header(field(12, &(2u32 << 20).to_le_bytes())),
        "chunk size"
    );
    assert!(bad_header(field(16, &1000u64.to_le_bytes())), "volume size");
    assert!(
        bad_header(field(16, &((1u64 << 60) + 512).to_le_bytes())),
        "volume size"
    );
    assert!(bad_header(field(24, &[0; 16])), "zero target");
    assert!(bad_header(field(40, &[0; 16])), "incremental without base");
    assert!(
        bad_header(field(40, &header_payload[24..40])),
        "base = target"
    );
    assert!(
        bad_header(field(56, &512u64.to_le_bytes())),
        "resume without flag"
    );
    // RESUMED with an offset: accepted if in range, refused past the end.
    let resumed = |off: u64| {
        let mut h = header_payload.clone();
        h[10] |= 2;
        h[56..64].copy_from_slice(&off.to_le_bytes());
        assemble(&[(RECORD_HEADER, 0, h)])
    };
    assert!(decode_all(&resumed(MIB)).result.is_ok());
    assert!(decode_all(&resumed(0)).result.is_ok());
    assert!(bad_header(err(&resumed(MIB + 512))));
    assert!(bad_header(err(&resumed(700))));
    // Names: empty, too long for the payload, not UTF-8, control characters.
    let bad_name = |e: StreamError| matches!(e, StreamError::BadName { .. });
    assert!(bad_name(field(72, &0u16.to_le_bytes())));
    assert!(
        bad_header(field(72, &100u16.to_le_bytes())),
        "name past the payload"
    );
    assert!(bad_name(field(74, &[0xff])));
    assert!(bad_name(field(74, b"\x1b")));
    // A payload too short for its fields.
    let mut q = p.clone();
    q[0].2.truncate(40);
    assert!(bad_header(err(&assemble(&q))));
    // Bytes after the name: ignored (a later version's fields).
    let mut q = p.clone();
    q[0].2.extend_from_slice(&[0xee; 1000]);
    let o = decode_all(&assemble(&q));
    o.result.unwrap();
    assert_eq!(o.records[..], reference()[..]);
}

#[test]
fn trailers_that_do_not_match_are_refused() {
    let stream = small_stream();
    let records = split(&stream);
    let body: Vec<u8> = records[..6].iter().flat_map(|r| r.bytes.clone()).collect();
    let at = body.len() as u64;
    let trailer = |count: u64, bytes: u64, crc: u32, reserved: u32, len: usize| {
        let mut p = count.to_le_bytes().to_vec();
        p.extend_from_slice(&bytes.to_le_bytes());
        p.extend_from_slice(&crc.to_le_bytes());
        p.extend_from_slice(&reserved.to_le_bytes());
        p.resize(len, 0);
        [body.clone(), frame(RECORD_TRAILER, 0, 6, &p)].concat()
    };
    let crc = crc32c::crc32c(&body);
    assert!(decode_all(&trailer(6, at, crc, 0, 24)).result.is_ok());
    let mismatch = |what, t, a| StreamError::TrailerMismatch {
        record: 6,
        at,
        what,
        trailer: t,
        actual: a,
    };
    assert_eq!(
        err(&trailer(5, at, crc, 0, 24)),
        mismatch(TrailerField::Records, 5, 6)
    );
    assert_eq!(
        err(&trailer(6, at + 1, crc, 0, 24)),
        mismatch(TrailerField::Bytes, at + 1, at)
    );
    let e = err(&trailer(6, at, crc ^ 1, 0, 24));
    assert_eq!(
        e,
        mismatch(TrailerField::Checksum, u64::from(crc ^ 1), u64::from(crc))
    );
    assert!(e.to_string().contains(&format!("{crc:#010x}")), "{e}");
    assert!(matches!(
        err(&trailer(6, at, crc, 1, 24)),
        StreamError::BadRecord { record: 6, .. }
    ));
    assert!(matches!(
        err(&trailer(6, at, crc, 0, 28)),
        StreamError::BadRecord { record: 6, .. }
    ));
    // A record after a trailer that was not the last is trailing bytes.
    let s = [trailer(6, at, crc, 0, 24), records[5].bytes.clone()].concat();
    assert!(matches!(err(&s), StreamError::TrailingBytes { .. }));
}

#[test]
fn the_encoder_refuses_misuse_without_writing() {
    let h = header(MIB, None, 4096);
    let mut out = Vec::new();
    let mut enc = Encoder::new(&h, Compression::Zstd { level: 3 }, &mut out).unwrap();
    let len = out.len();
    let checks: Vec<(Result<(), StreamError>, Check)> = vec![
        (enc.zero(0, 512, &mut out), |e| {
            matches!(e, StreamError::OutOfOrder { min: 4096, .. })
        }),
        (enc.zero(4096, 0, &mut out), |e| {
            matches!(e, StreamError::Misaligned { .. })
        }),
        (enc.discard(4097, 512, &mut out), |e| {
            matches!(e, StreamError::Misaligned { .. })
        }),
        (enc.zero(MIB, 512, &mut out), |e| {
            matches!(e, StreamError::OutOfRange { .. })
        }),
        (enc.zero(u64::MAX - 511, 512, &mut out), |e| {
            matches!(e, StreamError::OutOfRange { .. })
        }),
        (enc.data(4096, &[1; 100], None, &mut out).map(drop), |e| {
            matches!(e, StreamError::Misaligned { .. })
        }),
        (enc.data(4096, &[], None, &mut out).map(drop), |e| {
            matches!(e, StreamError::Misaligned { .. })
        }),
        (
            enc.data(4096, &vec![1; MAX_DATA + 512], None, &mut out)
                .map(drop),
            |e| matches!(e, StreamError::DataTooLarge { .. }),
        ),
        (
            enc.data(4096, &[1; 512], Some(&[1; 512]), &mut out)
                .map(drop),
            |e| matches!(e, StreamError::DeltaNotIncremental { .. }),
        ),
    ];
    for (i, (result, check)) in checks.into_iter().enumerate() {
        let e = result.unwrap_err();
        assert!(check(&e), "case {i}: {e:?}");
    }
    assert_eq!(out.len(), len, "nothing written");
    enc.zero(4096, 512, &mut out).unwrap();
    assert!(matches!(
        enc.zero(4096, 512, &mut out),
        Err(StreamError::OutOfOrder { .. })
    ));
    enc.finish(&mut out).unwrap();
    assert!(decode_all(&out).result.is_ok());

    // An incremental stream: the base must match the data's length.
    let mut out = Vec::new();
    let mut enc =
        Encoder::new(&header(MIB, Some(guid(5)), 0), Compression::None, &mut out).unwrap();
    assert_eq!(
        enc.data(0, &[1; 1024], Some(&[1; 512]), &mut out),
        Err(StreamError::BaseLength {
            expected: 1024,
            found: 512
        })
    );

    // Headers and compression levels.
    let bad = |h: Header| Encoder::new(&h, Compression::None, &mut Vec::new()).unwrap_err();
    let ok = header(MIB, Some(guid(5)), 0);
    let is_header = |e: StreamError| matches!(e, StreamError::BadHeader { .. });
    assert!(is_header(bad(Header {
        chunk_size: 1000,
        ..ok.clone()
    })));
    assert!(is_header(bad(Header {
        volume_size: 1000,
        ..ok.clone()
    })));
    assert!(is_header(bad(Header {
        resume_offset: 2 * MIB,
        ..ok.clone()
    })));
    assert!(is_header(bad(Header {
        target: [0u8; 16].into(),
        ..ok.clone()
    })));
    assert!(is_header(bad(Header {
        base: Some(ok.target),
        ..ok.clone()
    })));
    assert!(is_header(bad(Header {
        base: Some([0; 16].into()),
        ..ok.clone()
    })));
    let is_name = |e: StreamError| matches!(e, StreamError::BadName { .. });
    assert!(is_name(bad(Header {
        name: String::new(),
        ..ok.clone()
    })));
    assert!(is_name(bad(Header {
        name: "x".repeat(185),
        ..ok.clone()
    })));
    assert!(is_name(bad(Header {
        name: "a\nb".into(),
        ..ok.clone()
    })));
    for level in [i32::MAX, i32::MIN] {
        assert!(matches!(
            Encoder::new(&ok, Compression::Best { level }, &mut Vec::new()),
            Err(StreamError::CompressionLevel { .. })
        ));
    }
}

/// Random garbage and random splices of valid streams: never a panic,
/// never an accepted stream that was not sent.
#[test]
fn garbage_never_panics() {
    let stream = small_stream();
    for seed in 0..2000u64 {
        let mut s = stream.clone();
        let r = noise(seed, 16);
        let at = (u64::from(r[0]) * 256 + u64::from(r[1])) as usize % s.len();
        match r[2] % 4 {
            0 => s.truncate(at),
            1 => {
                let tail = noise(seed + 1, s.len() - at);
                s[at..].copy_from_slice(&tail);
            }
            2 => {
                s.splice(at..at, noise(seed + 2, r[3] as usize));
            }
            _ => {
                let n = (r[3] as usize).min(s.len() - at);
                s.drain(at..at + n);
            }
        }
        let o = decode_all(&s);
        if o.result.is_ok() {
            assert_eq!(s, stream, "seed {seed}");
        }
        for r in &o.records {
            if let Owned::Data {
                encoding,
                payload,
                length,
                ..
            } = r
            {
                let mut out = Vec::new();
                let _ = decode_data(
                    *encoding,
                    payload,
                    *length,
                    Some(&vec![0; *length as usize]),
                    &mut out,
                );
                assert!(out.len() <= *length as usize);
            }
        }
    }
}

/// A raw stream (version 2) that breaks its rules is refused, with the
/// rule it broke: no key record after its header, a key record elsewhere
/// or twice or that does not decode, a zero record, compressed data,
/// ranges that are not whole chunks, sizes that are not; the raw flag in
/// a version 1 header; and the encoder refuses to write any of these.
#[test]
fn raw_streams_that_break_their_rules_are_refused() {
    use arbor_stream::format::RECORD_KEY;
    let cs = 16384u64;
    let h = Header {
        raw: true,
        ..header(MIB, None, 0)
    };
    let mut key_bytes = vec![0u8; arbor_crypt::KEY_RECORD_LEN];
    key_bytes[..4].copy_from_slice(&[1, 1, 9, 1]);
    key_bytes[16..].fill(0x77);
    let key = arbor_crypt::KeyRecord::decode(&key_bytes).unwrap();
    let mut good = Vec::new();
    let mut enc = Encoder::new_raw(&h, &key, &mut good).unwrap();
    enc.data(cs, &noise(3, cs as usize), None, &mut good)
        .unwrap();
    enc.discard(4 * cs, cs, &mut good).unwrap();
    enc.finish(&mut good).unwrap();
    let outcome = decode_all(&good);
    outcome.result.unwrap();
    assert!(matches!(&outcome.records[1], Owned::Key(k) if **k == key));
    let p = parts(&good);
    let key_rec = p[1].clone();
    let bad = |f: &dyn Fn(&mut Parts)| {
        let mut q = p.clone();
        f(&mut q);
        err(&assemble(&q))
    };
    // No key record: its place taken by data.
    let e = bad(&|q| {
        q.remove(1);
    });
    assert!(
        matches!(
            e,
            StreamError::KeyMissing {
                record: 1,
                kind: RECORD_DATA,
                ..
            }
        ),
        "{e}"
    );
    // A key record twice, or one that does not decode.
    let e = bad(&|q| q.insert(2, key_rec.clone()));
    assert!(matches!(e, StreamError::BadRecord { record: 2, .. }), "{e}");
    for broken in [
        key_bytes[..100].to_vec(),
        [&[2u8][..], &key_bytes[1..]].concat(),
        [&key_bytes[..2], &[10u8][..], &key_bytes[3..]].concat(),
    ] {
        let e = bad(&|q| q[1].2 = broken.clone());
        assert!(matches!(e, StreamError::BadRecord { record: 1, .. }), "{e}");
    }
    // A zero record; compressed data; a range or data of part of a chunk.
    let e = bad(&|q| q.push((RECORD_ZERO, 0, range_payload(8 * cs, cs))));
    assert!(matches!(e, StreamError::BadRecord { record: 4, .. }), "{e}");
    let small = zstd::bulk::compress(&vec![0u8; cs as usize], 3).unwrap();
    let e = bad(&|q| q.push((RECORD_DATA, 0, data_payload(8 * cs, cs as u32, 1, &small))));
    assert!(
        matches!(e, StreamError::BadEncoding { record: 4, .. }),
        "{e}"
    );
    let e = bad(&|q| q.push((RECORD_DISCARD, 0, range_payload(8 * cs, 4096))));
    assert!(
        matches!(e, StreamError::Misaligned { align: 16384, .. }),
        "{e}"
    );
    let e = bad(&|q| {
        q.push((
            RECORD_DATA,
            0,
            data_payload(8 * cs + 512, cs as u32, 0, &noise(4, cs as usize)),
        ))
    });
    assert!(
        matches!(e, StreamError::Misaligned { align: 16384, .. }),
        "{e}"
    );
    // A key record in a stream that is not raw.
    let plain = with_header(vec![key_rec.clone()], &header(MIB, None, 0));
    assert!(matches!(
        err(&plain),
        StreamError::BadRecord { record: 1, .. }
    ));
    // The raw flag in a version 1 header; a raw size that is no chunk.
    let mut q = p.clone();
    q[0].2[8] = 1;
    assert!(matches!(err(&assemble(&q)), StreamError::BadHeader { .. }));
    let mut q = p.clone();
    q[0].2[16..24].copy_from_slice(&(MIB + 512).to_le_bytes());
    assert!(matches!(err(&assemble(&q)), StreamError::BadHeader { .. }));
    // A version 1 reader's view: version 2 is a version it does not know
    // (checked here by the version bytes alone).
    assert_eq!(u16::from_le_bytes([good[24], good[25]]), 2);
    // Every type from 1 to 6 refuses OPTIONAL.
    let mut q = p.clone();
    q[1].1 = RECORD_FLAG_OPTIONAL;
    assert!(matches!(
        err(&assemble(&q)),
        StreamError::BadFlags { record: 1, .. }
    ));
    assert_eq!(RECORD_KEY, 6);

    // The encoder refuses all of it without writing.
    let mut out = Vec::new();
    assert!(Encoder::new(&h, Compression::None, &mut out).is_err());
    assert!(Encoder::new_raw(&header(MIB, None, 0), &key, &mut out).is_err());
    let odd = Header {
        volume_size: MIB + 512,
        ..h.clone()
    };
    assert!(Encoder::new_raw(&odd, &key, &mut out).is_err());
    assert!(out.is_empty());
    let mut enc = Encoder::new_raw(&h, &key, &mut out).unwrap();
    let len = out.len();
    assert!(enc.zero(0, cs, &mut out).is_err());
    assert!(enc
        .data(512, &noise(5, cs as usize), None, &mut out)
        .is_err());
    assert!(enc.discard(0, 4096, &mut out).is_err());
    assert_eq!(out.len(), len);
}
