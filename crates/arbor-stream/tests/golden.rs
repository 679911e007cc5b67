//! Ties docs/STREAM.md to the encoder: the frame table (§1), the payload
//! tables of every record (§2) and the resume token's table (§7.1) are read
//! from the document, and every row must name the field the encoder puts at
//! that offset, with its size, in order. Offsets and sizes written in terms
//! of other fields (`16 + n`, `name_len`) are evaluated. A layout change
//! that is not documented (or a document change that is not coded) fails
//! here.
// A test crate: unwrap, expect and panic are how a test reports failure
// (the workspace denies them in the code it ships; clippy.toml allows
// them in #[test] functions, this in the helpers around them).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use arbor_stream::format::{
    Compression, Encoder, Encoding, Guid, Header, ResumeToken, FORMAT_VERSION, MAX_DATA, MAX_NAME,
    MAX_PAYLOAD, MAX_RECORD,
};
use common::split;

/// One documented row: offset, size (None: "…", the rest of the payload),
/// description.
struct Row {
    offset: usize,
    size: Option<usize>,
    field: String,
}

fn stream_md() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/STREAM.md");
    std::fs::read_to_string(path).expect("docs/STREAM.md is readable")
}

/// Evaluates `16 + n`, `` `n` − 16 ``, `74` with the given variables.
fn eval(expr: &str, vars: &[(&str, usize)]) -> Option<usize> {
    let expr = expr.replace('`', "");
    let mut total = 0usize;
    let mut sign = 1i64;
    for token in expr.split_whitespace() {
        match token {
            "+" => sign = 1,
            "−" | "-" => sign = -1,
            t => {
                let v = t
                    .parse::<usize>()
                    .ok()
                    .or_else(|| vars.iter().find(|(name, _)| *name == t).map(|v| v.1))?;
                total = if sign > 0 { total + v } else { total - v };
            }
        }
    }
    Some(total)
}

/// The first offset/size/field table after the heading `heading`.
fn table(doc: &str, heading: &str, vars: &[(&str, usize)]) -> Vec<Row> {
    let start = doc
        .find(heading)
        .unwrap_or_else(|| panic!("STREAM.md has no heading {heading:?}"));
    let mut rows = Vec::new();
    let mut in_table = false;
    for line in doc[start..].lines().skip(1) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if line.starts_with("| offset") && line.contains("| size | field |") {
            in_table = true;
            continue;
        }
        if !in_table {
            assert!(!line.starts_with('#'), "no table under {heading:?}");
            continue;
        }
        if line.starts_with("|---") {
            continue;
        }
        if !line.starts_with('|') {
            break;
        }
        rows.push(Row {
            offset: eval(cells[1], vars)
                .unwrap_or_else(|| panic!("{heading}: offset {:?}", cells[1])),
            size: if cells[2] == "…" {
                None
            } else {
                Some(
                    eval(cells[2], vars)
                        .unwrap_or_else(|| panic!("{heading}: size {:?}", cells[2])),
                )
            },
            field: cells[3].to_lowercase(),
        });
    }
    assert!(!rows.is_empty(), "empty table under {heading:?}");
    rows
}

/// Checks `rows` against the encoder's fields, given in order as (a word
/// the row's description contains, the field's bytes; None for a "…" row).
fn check(what: &str, bytes: &[u8], rows: &[Row], fields: &[(&str, Option<Vec<u8>>)]) {
    assert_eq!(
        rows.len(),
        fields.len(),
        "{what}: STREAM.md documents {} fields, the encoder has {}",
        rows.len(),
        fields.len()
    );
    let mut next = 0;
    for (row, (word, value)) in rows.iter().zip(fields) {
        assert!(
            row.field.contains(word),
            "{what}: the row at offset {} ({:?}) should document {word:?}",
            row.offset,
            row.field
        );
        assert_eq!(
            row.offset, next,
            "{what}: {word} does not follow the field before"
        );
        match (row.size, value) {
            (Some(size), Some(value)) => {
                assert_eq!(size, value.len(), "{what}: size of {word}");
                assert_eq!(
                    &bytes[row.offset..row.offset + size],
                    &value[..],
                    "{what}: {word} is not at offset {}",
                    row.offset
                );
                next = row.offset + size;
            }
            (None, None) => assert_eq!(row.offset, bytes.len(), "{what}: {word}"),
            _ => panic!("{what}: {word}: a sized row for an unsized field, or back"),
        }
    }
}

fn le16(v: u16) -> Option<Vec<u8>> {
    Some(v.to_le_bytes().to_vec())
}

fn le32(v: u32) -> Option<Vec<u8>> {
    Some(v.to_le_bytes().to_vec())
}

fn le64(v: u64) -> Option<Vec<u8>> {
    Some(v.to_le_bytes().to_vec())
}

fn header() -> Header {
    Header {
        chunk_size: 0x0001_0000,
        volume_size: 0x0102_0304_0000,
        target: Guid(*b"target-identity!"),
        base: Some(Guid(*b"base--identity!!")),
        resume_offset: 0x0000_0506_0000,
        creation_time: 0x0708_090a_0b0c_0d0e,
        name: "vm1@golden".to_string(),
        raw: false,
    }
}

#[test]
fn records_match_stream_md() {
    let doc = stream_md();
    let h = header();
    let mut stream = Vec::new();
    let mut enc = Encoder::new(&h, Compression::None, &mut stream).unwrap();
    let data = common::noise(1, 1024);
    let at = h.resume_offset + 0x1000;
    assert_eq!(
        enc.data(at, &data, None, &mut stream).unwrap(),
        Encoding::Raw
    );
    enc.zero(at + 0x10000, 0x2000, &mut stream).unwrap();
    enc.discard(at + 0x20000, 0x4000, &mut stream).unwrap();
    enc.finish(&mut stream).unwrap();
    let records = split(&stream);
    assert_eq!(records.len(), 5);

    // §1: the frame of every record.
    let mut before = 0usize;
    for (seq, r) in records.iter().enumerate() {
        let n = r.payload.len();
        let rows = table(&doc, "## 1. Records", &[("n", n)]);
        let crc = crc32c::crc32c(&r.bytes[..16 + n]);
        check(
            &format!("frame of record {seq}"),
            &r.bytes,
            &rows,
            &[
                ("type", le16([1, 2, 3, 4, 5][seq])),
                ("flags", le16(0)),
                ("payload length", le32(n as u32)),
                ("sequence", le64(seq as u64)),
                ("payload", Some(r.payload.clone())),
                ("crc32c", le32(crc)),
            ],
        );
        if seq < 4 {
            before += r.bytes.len();
        }
    }

    // §2.1: the header.
    let name_len = h.name.len();
    let rows = table(&doc, "### 2.1 Header", &[("name_len", name_len)]);
    check(
        "header",
        &records[0].payload,
        &rows,
        &[
            ("magic", Some(b"ARBORSTR".to_vec())),
            // A stream that is not raw is version 1 (§8).
            ("version", le16(1)),
            ("header flags", le16(1 | 2)),
            ("chunk_size", le32(h.chunk_size)),
            ("volume_size", le64(h.volume_size)),
            ("target identity", Some(h.target.0.to_vec())),
            ("base identity", Some(h.base.unwrap().0.to_vec())),
            ("resume_offset", le64(h.resume_offset)),
            ("creation time", le64(h.creation_time)),
            ("name_len", le16(name_len as u16)),
            ("name", Some(h.name.as_bytes().to_vec())),
            ("ignored", None),
        ],
    );

    // §2.2: data.
    let rows = table(&doc, "### 2.2 Data", &[("n", records[1].payload.len())]);
    check(
        "data",
        &records[1].payload,
        &rows,
        &[
            ("offset", le64(at)),
            ("length", le32(1024)),
            ("encoding", Some(vec![0])),
            ("reserved", Some(vec![0; 3])),
            ("encoded bytes", Some(data.clone())),
        ],
    );

    // §2.3: zero and discard.
    let rows = table(&doc, "### 2.3 Zero", &[]);
    check(
        "zero",
        &records[2].payload,
        &rows,
        &[("offset", le64(at + 0x10000)), ("length", le64(0x2000))],
    );
    check(
        "discard",
        &records[3].payload,
        &rows,
        &[("offset", le64(at + 0x20000)), ("length", le64(0x4000))],
    );

    // §2.4: the trailer.
    let rows = table(&doc, "### 2.4 Trailer", &[]);
    check(
        "trailer",
        &records[4].payload,
        &rows,
        &[
            ("record_count", le64(4)),
            ("byte_count", le64(before as u64)),
            ("stream_crc", le32(crc32c::crc32c(&stream[..before]))),
            ("reserved", le32(0)),
        ],
    );
}

/// §2.1 and §2.5: a raw stream is version 2, its header says `RAW`, and
/// its second record (type 6) is the key record, byte for byte.
#[test]
fn raw_streams_match_stream_md() {
    let doc = stream_md();
    let h = Header {
        raw: true,
        base: None,
        resume_offset: 0,
        ..header()
    };
    let mut bytes = [0u8; arbor_crypt::KEY_RECORD_LEN];
    bytes[..4].copy_from_slice(&[1, 1, 12, 1]);
    bytes[16..].fill(0x5c);
    let key = arbor_crypt::KeyRecord::decode(&bytes).unwrap();
    let mut stream = Vec::new();
    let mut enc = Encoder::new_raw(&h, &key, &mut stream).unwrap();
    let cs = u64::from(h.chunk_size);
    let data = common::noise(2, h.chunk_size as usize);
    enc.data(cs, &data, None, &mut stream).unwrap();
    enc.discard(4 * cs, 2 * cs, &mut stream).unwrap();
    enc.finish(&mut stream).unwrap();
    let records = split(&stream);
    assert_eq!(records.len(), 5);
    for (seq, r) in records.iter().enumerate() {
        let n = r.payload.len();
        let rows = table(&doc, "## 1. Records", &[("n", n)]);
        let crc = crc32c::crc32c(&r.bytes[..16 + n]);
        check(
            &format!("frame of raw record {seq}"),
            &r.bytes,
            &rows,
            &[
                ("type", le16([1, 6, 2, 4, 5][seq])),
                ("flags", le16(0)),
                ("payload length", le32(n as u32)),
                ("sequence", le64(seq as u64)),
                ("payload", Some(r.payload.clone())),
                ("crc32c", le32(crc)),
            ],
        );
    }
    let name_len = h.name.len();
    let rows = table(&doc, "### 2.1 Header", &[("name_len", name_len)]);
    check(
        "raw header",
        &records[0].payload,
        &rows,
        &[
            ("magic", Some(b"ARBORSTR".to_vec())),
            ("version", le16(FORMAT_VERSION)),
            ("header flags", le16(4)),
            ("chunk_size", le32(h.chunk_size)),
            ("volume_size", le64(h.volume_size)),
            ("target identity", Some(h.target.0.to_vec())),
            ("base identity", Some(vec![0; 16])),
            ("resume_offset", le64(0)),
            ("creation time", le64(h.creation_time)),
            ("name_len", le16(name_len as u16)),
            ("name", Some(h.name.as_bytes().to_vec())),
            ("ignored", None),
        ],
    );
    let rows = table(&doc, "### 2.5 Key", &[]);
    check(
        "key",
        &records[1].payload,
        &rows,
        &[("key record", Some(bytes.to_vec()))],
    );
}

#[test]
fn resume_token_matches_stream_md() {
    let token = ResumeToken {
        target: Guid(*b"target-identity!"),
        base: Some(Guid(*b"base--identity!!")),
        offset: 0x0506_0000,
        volume_size: 0x0102_0304_0000,
    };
    let text = token.encode();
    let hex = text.strip_prefix("1-").expect("version 1, a hyphen");
    assert_eq!(hex.len(), 104);
    let bytes: Vec<u8> = (0..52)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
        .collect();
    let mut seeded = b"ARBORRSM".to_vec();
    seeded.extend_from_slice(&bytes[..48]);
    let rows = table(&stream_md(), "### 7.1 Resume token", &[]);
    check(
        "resume token",
        &bytes,
        &rows,
        &[
            ("target identity", Some(token.target.0.to_vec())),
            ("base identity", Some(token.base.unwrap().0.to_vec())),
            ("offset", le64(token.offset)),
            ("volume_size", le64(token.volume_size)),
            ("crc32c", le32(crc32c::crc32c(&seeded))),
        ],
    );
}

#[test]
fn limits_match_stream_md() {
    let doc = stream_md();
    assert!(doc.contains(&format!("`MAX_PAYLOAD` ({}", group(MAX_PAYLOAD))));
    assert!(doc.contains(&format!("`MAX_DATA` ({})", group(MAX_DATA))));
    assert!(doc.contains(&format!("= {} bytes of a record", group(MAX_RECORD))));
    assert!(doc.contains(&format!("`name_len`: 1 ..= {MAX_NAME}")));
    assert!(doc.contains(&format!("# arbor send stream, version {FORMAT_VERSION}")));
}

/// 1048576 as "1,048,576".
fn group(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}
