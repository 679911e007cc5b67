//! Ties docs/FORMAT.md to the encoder: the offset tables of the superblock
//! (§3), the commit record (§4) and the grown region entry (§4.1) are read
//! from the document, and every row must name the field the encoder puts
//! at that offset, with its size, in order. A layout change that is not
//! documented (or a document change that is not coded) fails here.

use arbor_format::{CommitRecord, FormatVersion, RegionRaw, Superblock, BLOCK_SIZE, MAX_GROWTHS};
use zerocopy::little_endian::{U32, U64};

/// One documented row: offset, size, description.
struct Row {
    offset: usize,
    size: usize,
    field: String,
}

fn format_md() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/FORMAT.md");
    std::fs::read_to_string(path).expect("docs/FORMAT.md is readable")
}

/// The first `| offset | size | field |` table after the heading `heading`.
fn table(doc: &str, heading: &str) -> Vec<Row> {
    let start = doc
        .find(heading)
        .unwrap_or_else(|| panic!("FORMAT.md has no heading {heading:?}"));
    let mut rows = Vec::new();
    let mut in_table = false;
    for line in doc[start..].lines().skip(1) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if line.starts_with("| offset | size | field |") {
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
        // "48 × 64" is an array: its size is the product.
        let size = cells[2]
            .split('×')
            .map(|n| n.trim().parse::<usize>().expect("a size"))
            .product();
        rows.push(Row {
            offset: cells[1].parse().expect("an offset"),
            size,
            field: cells[3].to_lowercase(),
        });
    }
    assert!(!rows.is_empty(), "empty table under {heading:?}");
    rows
}

/// Checks `rows` against the encoder's fields, given in order as (a word
/// the row's description contains, the field's little-endian bytes).
fn check(what: &str, block: &[u8], base: usize, rows: &[Row], fields: &[(&str, Vec<u8>)]) {
    assert_eq!(
        rows.len(),
        fields.len(),
        "{what}: FORMAT.md documents {} fields, the encoder has {}",
        rows.len(),
        fields.len()
    );
    for (row, (word, bytes)) in rows.iter().zip(fields) {
        assert!(
            row.field.contains(word),
            "{what}: the row at offset {} ({:?}) should document {word:?}",
            row.offset,
            row.field
        );
        assert_eq!(row.size, bytes.len(), "{what}: size of {word}");
        let at = base + row.offset;
        assert_eq!(
            &block[at..at + row.size],
            &bytes[..],
            "{what}: {word} is not at offset {}",
            row.offset
        );
    }
}

fn v(number: u16) -> FormatVersion {
    FormatVersion::new(number).expect("a known version")
}

fn le(v: u64) -> Vec<u8> {
    v.to_le_bytes().to_vec()
}

fn le32(v: u32) -> Vec<u8> {
    v.to_le_bytes().to_vec()
}

#[test]
fn superblock_offsets_match_format_md() {
    let mut sb = Superblock::new_zeroed_geometry();
    sb.uuid = *b"0123456789abcdef";
    sb.pool_bytes = U64::new(0x1000_0000_0101);
    sb.created_unix_secs = U64::new(0x1000_0000_0202);
    sb.chunk_size = U32::new(0x0001_0000);
    sb.journal_pages = U32::new(0x0304);
    sb.journal_start = [U64::new(0x0505), U64::new(0x0606)];
    sb.meta_sm_start = U64::new(0x0707);
    sb.data_sm_start = U64::new(0x0808);
    sb.meta_start = U64::new(0x0909);
    sb.meta_blocks = U64::new(0x0a0a);
    sb.data_start_bytes = U64::new(0x0b0b);
    sb.data_chunks = U64::new(0x0c0c);
    let block = sb.encode(v(2)).unwrap();
    assert_eq!(block.len(), BLOCK_SIZE);
    assert_eq!(&block[..6], b"ARBR\x02\x00", "magic and version at 0 and 4");
    assert_eq!(&sb.encode(v(1)).unwrap()[4..6], b"\x01\x00");
    let rows = table(&format_md(), "## 3. Superblock");
    check(
        "superblock",
        &block,
        0,
        &rows,
        &[
            ("uuid", sb.uuid.to_vec()),
            ("pool_bytes", le(0x1000_0000_0101)),
            ("creation time", le(0x1000_0000_0202)),
            ("chunk_size", le32(0x0001_0000)),
            ("journal_pages", le32(0x0304)),
            ("journal_start[0]", le(0x0505)),
            ("journal_start[1]", le(0x0606)),
            ("meta_sm_start", le(0x0707)),
            ("data_sm_start", le(0x0808)),
            ("meta_start", le(0x0909)),
            ("meta_blocks", le(0x0a0a)),
            ("data_start_bytes", le(0x0b0b)),
            ("data_chunks", le(0x0c0c)),
        ],
    );
}

fn region(i: u64) -> RegionRaw {
    RegionRaw {
        meta_sm_start: U64::new(0x100 + i),
        data_sm_start: U64::new(0x200 + i),
        meta_start: U64::new(0x300 + i),
        meta_blocks: U64::new(0x400 + i),
        data_start_bytes: U64::new(0x500 + i),
        data_chunks: U64::new(0x600 + i),
    }
}

#[test]
fn commit_record_and_region_offsets_match_format_md() {
    let mut rec = CommitRecord::new_zeroed_record();
    rec.uuid = *b"fedcba9876543210";
    rec.txn = U64::new(0x11);
    rec.page_count = U32::new(0x12);
    rec.pages_crc = U32::new(0x1313_1313);
    rec.volumes_root.block = U64::new(0x14);
    rec.volumes_root.txn = U64::new(0x15);
    rec.queue_root.block = U64::new(0x16);
    rec.queue_root.txn = U64::new(0x17);
    rec.next_volume_id = U64::new(0x18);
    rec.next_queue_seq = U64::new(0x19);
    rec.meta_used = U64::new(0x1a);
    rec.data_used = U64::new(0x1b);
    rec.meta_cursor = U64::new(0x1c);
    rec.data_cursor = U64::new(0x1d);
    rec.commit_unix_secs = U64::new(0x1e);
    rec.grown_count = U32::new(MAX_GROWTHS as u32);
    for (i, slot) in rec.grown.iter_mut().enumerate() {
        *slot = region(i as u64);
    }
    let block = rec.encode(v(2)).unwrap();
    assert_eq!(&block[4..6], b"\x02\x00");
    let root = |b: u64, t: u64| [le(b), le(t)].concat();
    let regions: Vec<u8> = (0..MAX_GROWTHS as u64)
        .flat_map(|i| {
            let r = region(i);
            [
                r.meta_sm_start,
                r.data_sm_start,
                r.meta_start,
                r.meta_blocks,
                r.data_start_bytes,
                r.data_chunks,
            ]
            .into_iter()
            .flat_map(|v| le(v.get()))
        })
        .collect();
    let doc = format_md();
    check(
        "commit record",
        &block,
        0,
        &table(&doc, "## 4. Commit record"),
        &[
            ("uuid", rec.uuid.to_vec()),
            ("txn", le(0x11)),
            ("page_count", le32(0x12)),
            ("pages_crc", le32(0x1313_1313)),
            ("volume table root", root(0x14, 0x15)),
            ("reclaim queue root", root(0x16, 0x17)),
            ("next volume id", le(0x18)),
            ("next reclaim-queue sequence", le(0x19)),
            ("metadata blocks in use", le(0x1a)),
            ("data chunks in use", le(0x1b)),
            ("metadata allocation cursor", le(0x1c)),
            ("data allocation cursor", le(0x1d)),
            ("commit time", le(0x1e)),
            ("grown_count", le32(MAX_GROWTHS as u32)),
            ("reserved", vec![0; 4]),
            ("grown regions", regions),
        ],
    );
    let entry = table(&doc, "### 4.1 Grown region entry");
    for i in [0usize, 1, MAX_GROWTHS - 1] {
        let r = region(i as u64);
        check(
            "grown region entry",
            &block,
            144 + 48 * i,
            &entry,
            &[
                ("meta_sm_start", le(r.meta_sm_start.get())),
                ("data_sm_start", le(r.data_sm_start.get())),
                ("meta_start", le(r.meta_start.get())),
                ("meta_blocks", le(r.meta_blocks.get())),
                ("data_start_bytes", le(r.data_start_bytes.get())),
                ("data_chunks", le(r.data_chunks.get())),
            ],
        );
    }
}
