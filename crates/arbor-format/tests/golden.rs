//! Ties docs/FORMAT.md to the encoder: every byte-layout table of the
//! document is read from it (the common block header §2, the superblock §3,
//! the commit record §4 and its grown region entry §4.1, the space-map page
//! §5, the node header and the volume-table value §6, the property frame
//! §6, the origin-loss record, the copy-on-write and epoch fields and the
//! snapshot-store value of §6.1, the packed entry of §6.2, the intent
//! record of §6.4.1, the snapshot record of §6.4.2 and its entry), and
//! every row
//! must name the field the encoder puts at that offset, with its size, in
//! order. A layout change that is not documented (or a document change that
//! is not coded) fails here.
// A test crate: unwrap, expect and panic are how a test reports failure
// (the workspace denies them in the code it ships; clippy.toml allows
// them in #[test] functions, this in the helpers around them).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use arbor_format::{
    encode_property, split_store_key, store_key, Backing, BlockRef, CommitRecord, CowState,
    DataLayout, DeviceIdentity, FormatVersion, Home, IntentLogRecord, Layer, LoggedSnapshot,
    MapValue, Node, NodeBody, OriginLoss, Partial, ReceiveState, RegionRaw, SmKind, SmPage,
    SnapshotLogRecord, StoreValue, Superblock, TreeKind, VolumeKind, VolumeRecord, BLOCK_SIZE,
    LOG_RECORD_MAX_REGIONS, MAX_GROWTHS, MAX_LOG_BLOCKS, MAX_NAME_LEN, ORIGIN_LOSS_KEY,
    ORIGIN_LOSS_LEN, SM_ENTRIES_PER_PAGE, SNAPSHOT_ENTRY_FIXED,
};
use zerocopy::little_endian::{U32, U64};

/// One documented row: offset, size, description.
#[derive(Clone)]
struct Row {
    /// The field's offset; a row of two layouts gives both (`64 / 128`).
    offsets: Vec<usize>,
    /// None for a field of variable size (`…`, `length`, or a field
    /// that holds it, such as `` `name_len` ``).
    size: Option<usize>,
    field: String,
}

impl Row {
    fn offset(&self) -> usize {
        self.offsets[0]
    }
}

fn format_md() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/FORMAT.md");
    std::fs::read_to_string(path).expect("docs/FORMAT.md is readable")
}

/// The first `| offset | size | field |` (or `| value offset | ...`)
/// table after the text `anchor` (a heading, or words just before the
/// table), with no heading in between.
fn table(doc: &str, anchor: &str) -> Vec<Row> {
    let start = doc
        .find(anchor)
        .unwrap_or_else(|| panic!("FORMAT.md has no {anchor:?}"));
    let mut rows = Vec::new();
    let mut in_table = false;
    for line in doc[start..].lines().skip(1) {
        // Tables inside a list item are indented.
        let line = line.trim_start();
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if line.starts_with("| offset | size | field |")
            || line.starts_with("| value offset | size | field |")
        {
            in_table = true;
            continue;
        }
        if !in_table {
            assert!(!line.starts_with('#'), "no table after {anchor:?}");
            continue;
        }
        if line.starts_with("|---") {
            continue;
        }
        if !line.starts_with('|') {
            break;
        }
        // "48 × 64" is an array: its size is the product.
        let size = match cells[2] {
            "…" | "length" => None,
            size if size.starts_with('`') => None,
            size => Some(
                size.split('×')
                    .map(|n| n.trim().parse::<usize>().expect("a size"))
                    .product(),
            ),
        };
        rows.push(Row {
            offsets: cells[1]
                .split('/')
                .map(|o| o.trim().parse().expect("an offset"))
                .collect(),
            size,
            field: cells[3].to_lowercase(),
        });
    }
    assert!(!rows.is_empty(), "empty table after {anchor:?}");
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
            row.offset(),
            row.field
        );
        if let Some(size) = row.size {
            assert_eq!(size, bytes.len(), "{what}: size of {word}");
        }
        let at = base + row.offset();
        assert_eq!(
            &block[at..at + bytes.len()],
            &bytes[..],
            "{what}: {word} is not at offset {}",
            row.offset()
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
    let mut older = sb;
    sb.log_start = U64::new(0x0d0d);
    sb.log_blocks = U64::new(0x0e0e);
    let block = sb.encode(v(13)).unwrap();
    assert_eq!(block.len(), BLOCK_SIZE);
    assert_eq!(&block[..6], b"ARBR\x0d\x00", "magic and version at 0 and 4");
    // Before version 13 there is no log area: its fields are zero.
    assert!(sb.encode(v(12)).is_err());
    assert_eq!(&older.encode(v(2)).unwrap()[4..6], b"\x02\x00");
    assert_eq!(&older.encode(v(1)).unwrap()[4..6], b"\x01\x00");
    older.log_start = sb.log_start;
    older.log_blocks = sb.log_blocks;
    assert_eq!(older, sb);
    let doc = format_md();
    let rows = table(&doc, "## 3. Superblock");
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
            ("log_start", le(0x0d0d)),
            ("log_blocks", le(0x0e0e)),
        ],
    );
    assert!(rows[14]
        .field
        .contains(&format!("at most {MAX_LOG_BLOCKS}")));
}

/// §6.4.2: a snapshot record with one snapshot, with names of several
/// lengths (the longest and one not ASCII), and with as many of the
/// longest names as a block holds; and each of its entries.
#[test]
fn snapshot_log_record_offsets_match_format_md() {
    let doc = format_md();
    let rows = table(&doc, "#### 6.4.2 Snapshot records (version 14)");
    assert!(rows[3].field.contains("1 or more"));
    let entry = table(&doc, "An entry, from where the one before it ends");
    assert!(entry[4].field.contains(&format!("1 ..= {MAX_NAME_LEN}")));
    assert_eq!(entry[5].offset(), SNAPSHOT_ENTRY_FIXED, "the name's offset");
    let longest = format!("v@{}", "s".repeat(MAX_NAME_LEN - 2));
    // The most snapshots with the longest names, as §6.4.2 says.
    let most = (BLOCK_SIZE - 48) / (SNAPSHOT_ENTRY_FIXED + MAX_NAME_LEN);
    assert!(doc.contains(&format!(
        "holds {most} snapshots with names of {MAX_NAME_LEN} bytes"
    )));
    assert!(arbor_format::snapshots_fit_a_record(vec![
        MAX_NAME_LEN;
        most
    ]));
    assert!(!arbor_format::snapshots_fit_a_record(vec![
        MAX_NAME_LEN;
        most + 1
    ]));
    let snap = |i: u64, name: &str| LoggedSnapshot {
        source: 0x0100 + i,
        id: 0x0200 + i,
        guid: [0x30 + i as u8; 16],
        created_unix_secs: 0x0400_0000 + i,
        name: name.to_owned(),
    };
    for snapshots in [
        vec![snap(0, "vol@snap")],
        vec![snap(0, "a@x"), snap(1, &longest), snap(2, "ü@ß")],
        (0..most as u64).map(|i| snap(i, &longest)).collect(),
    ] {
        let record = SnapshotLogRecord {
            uuid: *b"0123456789abcdef",
            txn: 0x1515_1515_1515,
            seq: 0x1616,
            snapshots: snapshots.clone(),
        };
        let block = record.encode().unwrap();
        let fields = |s: &LoggedSnapshot| {
            vec![
                ("`source`", le(s.source)),
                ("`id`", le(s.id)),
                ("`guid`", s.guid.to_vec()),
                ("`created_unix_secs`", le(s.created_unix_secs)),
                ("`name_len`", le16(s.name.len() as u16)),
                ("full name", s.name.as_bytes().to_vec()),
            ]
        };
        let entries: Vec<u8> = snapshots
            .iter()
            .flat_map(|s| fields(s).into_iter().flat_map(|(_, bytes)| bytes))
            .collect();
        let end = 48 + entries.len();
        check(
            "snapshot record",
            &block,
            0,
            &rows,
            &[
                ("pool uuid", record.uuid.to_vec()),
                ("`txn`", le(0x1515_1515_1515)),
                ("`seq`", le32(0x1616)),
                ("`count`", le32(snapshots.len() as u32)),
                ("entries", entries),
            ],
        );
        // Each entry from where the one before it ends.
        let mut at = rows[4].offset();
        for s in &snapshots {
            check("snapshot record entry", &block, at, &entry, &fields(s));
            at += SNAPSHOT_ENTRY_FIXED + s.name.len();
        }
        assert_eq!(at, end);
        assert!(block[end..].iter().all(|&b| b == 0), "zeros after");
    }
}

/// §6.4.1: an intent log record, with one region and with the most.
#[test]
fn intent_log_record_offsets_match_format_md() {
    let doc = format_md();
    let rows = table(&doc, "#### 6.4.1 The intent log (version 13)");
    assert!(rows[3]
        .field
        .contains(&format!("1 ..= {LOG_RECORD_MAX_REGIONS}")));
    let full: Vec<u64> = (0..LOG_RECORD_MAX_REGIONS as u64)
        .map(|i| 0x0100_0000_0000 + i)
        .collect();
    for regions in [vec![0x1717], full] {
        let record = IntentLogRecord {
            uuid: *b"0123456789abcdef",
            txn: 0x1515_1515_1515,
            seq: 0x1616,
            regions: regions.clone(),
        };
        let block = record.encode().unwrap();
        let listed: Vec<u8> = regions.iter().flat_map(|r| le(*r)).collect();
        let end = 48 + listed.len();
        check(
            "intent log record",
            &block,
            0,
            &rows,
            &[
                ("pool uuid", record.uuid.to_vec()),
                ("`txn`", le(0x1515_1515_1515)),
                ("`seq`", le32(0x1616)),
                ("`count`", le32(regions.len() as u32)),
                ("region numbers", listed),
            ],
        );
        assert!(block[end..].iter().all(|&b| b == 0), "zeros after");
    }
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
    rec.sums_root.block = U64::new(0x1f);
    rec.sums_root.txn = U64::new(0x20);
    rec.intents_root.block = U64::new(0x21);
    rec.intents_root.txn = U64::new(0x22);
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
            ("data checksum tree root", root(0x1f, 0x20)),
            ("in-place intent set root", root(0x21, 0x22)),
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

fn le16(v: u16) -> Vec<u8> {
    v.to_le_bytes().to_vec()
}

/// The rows of a table that document one layout: those `keep` accepts,
/// each at its offset in layout `variant` (rows such as `64 / 128` give
/// one offset per layout).
fn rows_of(rows: &[Row], variant: usize, keep: impl Fn(&Row) -> bool) -> Vec<Row> {
    rows.iter()
        .filter(|r| keep(r))
        .map(|r| Row {
            offsets: vec![r.offsets[variant.min(r.offsets.len() - 1)]],
            ..r.clone()
        })
        .collect()
}

/// §2: the header of a superblock, a commit record, a space-map page, a
/// node, an intent record and a snapshot record; superblocks and commit
/// records carry their pool's version, the others version 1. The version
/// row names the versions this crate knows.
#[test]
fn block_header_offsets_match_format_md() {
    let doc = format_md();
    let rows = table(&doc, "## 2. Common block header");
    let version_row = &rows[1].field;
    assert!(
        version_row.contains(&format!("1 to {}", arbor_format::FORMAT_VERSION)),
        "§2 should say which versions a pool may have: {version_row:?}"
    );
    let mut page = SmPage::empty(SmKind::Meta, 0);
    page.txn = 3;
    let log = IntentLogRecord {
        uuid: [1; 16],
        txn: 2,
        seq: 0,
        regions: vec![3],
    };
    let snapshots = SnapshotLogRecord {
        uuid: [1; 16],
        txn: 2,
        seq: 1,
        snapshots: vec![LoggedSnapshot {
            source: 4,
            id: 5,
            guid: [6; 16],
            created_unix_secs: 7,
            name: "v@s".to_owned(),
        }],
    };
    let blocks: [(&str, [u8; BLOCK_SIZE], u16, u16); 7] = [
        (
            "superblock",
            Superblock::new_zeroed_geometry().encode(v(5)).unwrap(),
            5,
            1,
        ),
        (
            "commit record",
            CommitRecord::new_zeroed_record().encode(v(7)).unwrap(),
            7,
            2,
        ),
        ("space-map page", page.encode(), 1, 3),
        ("node", Node::new_leaf(TreeKind::Queue).encode(9, 9), 1, 4),
        ("intent log record", log.encode().unwrap(), 1, 5),
        ("snapshot record", snapshots.encode().unwrap(), 1, 6),
        (
            "superblock of the newest version",
            Superblock::new_zeroed_geometry()
                .encode(v(arbor_format::FORMAT_VERSION))
                .unwrap(),
            arbor_format::FORMAT_VERSION,
            1,
        ),
    ];
    for (what, block, version, block_type) in blocks {
        let mut zeroed = block;
        zeroed[8..12].fill(0);
        check(
            what,
            &block,
            0,
            &rows,
            &[
                ("magic", b"ARBR".to_vec()),
                ("format version", le16(version)),
                ("block type", le16(block_type)),
                ("crc32c", le32(crc32c::crc32c(&zeroed))),
                ("reserved", vec![0; 4]),
            ],
        );
    }
}

/// §5.
#[test]
fn space_map_page_offsets_match_format_md() {
    let mut page = SmPage::empty(SmKind::Data, 0x0102);
    page.txn = 0x0304_0506_0708;
    for (k, count) in page.counts.iter_mut().enumerate() {
        *count = 0x1000_0000 + k as u32;
    }
    assert_eq!(SM_ENTRIES_PER_PAGE, 1016);
    let counts: Vec<u8> = page.counts.iter().flat_map(|c| le32(*c)).collect();
    check(
        "space-map page",
        &page.encode(),
        0,
        &table(&format_md(), "## 5. Space-map page"),
        &[
            ("map kind", le32(1)),
            ("page index", le32(0x0102)),
            ("txn", le(0x0304_0506_0708)),
            ("counts", counts),
        ],
    );
}

/// A mapping value's bytes in memory.
fn map_value(value: MapValue) -> Vec<u8> {
    let mut bytes = vec![0; MapValue::ENCODED_LEN];
    value.encode(&mut bytes);
    bytes
}

/// §6: the node header, for a fixed leaf, a packed leaf and an internal
/// node, and the entries of the first and the last (the mapping value of
/// a fixed leaf: `pchunk`, `len`, reserved, `gen`).
#[test]
fn node_offsets_match_format_md() {
    let rows = table(&format_md(), "## 6. Nodes");
    let header = |block: u64, txn: u64, kind: u8, level: u8, count: u16, reserved: u32| {
        vec![
            ("block's number", le(block)),
            ("txn that wrote", le(txn)),
            ("tree kind", vec![kind]),
            ("level", vec![level]),
            ("entry count", le16(count)),
            ("reserved", le32(reserved)),
        ]
    };

    let mut leaf = Node::new_leaf(TreeKind::Mapping);
    leaf.keys = vec![0x11, 0x2222];
    leaf.body = NodeBody::Leaf(
        [
            map_value(MapValue::whole(0x0a0b, 3, 0x0c0d)),
            map_value(MapValue::whole(0x0e0f, 256, 0x1011)),
        ]
        .concat(),
    );
    let mut fields = header(0x4455, 0x6677, 1, 0, 2, 0);
    let entries: Vec<u8> = [
        le(0x11),
        le(0x0a0b),
        le32(3),
        le32(0),
        le(0x0c0d),
        le(0x2222),
        le(0x0e0f),
        le32(256),
        le32(0),
        le(0x1011),
    ]
    .concat();
    fields.push(("entries", entries));
    check(
        "fixed mapping leaf",
        &leaf.encode(0x4455, 0x6677),
        0,
        &rows,
        &fields,
    );

    let packed = leaf.clone().into_packed().expect("two extents fit packed");
    let block = packed.encode(0x4455, 0x6677);
    let len = u32::from_le_bytes(block[36..40].try_into().unwrap());
    let mut fields = header(0x4455, 0x6677, 5, 0, 2, len);
    fields[5].0 = "bytes its entries take";
    fields.push(("entries", block[40..40 + len as usize].to_vec()));
    check("packed mapping leaf", &block, 0, &rows, &fields);
    assert!(block[40 + len as usize..].iter().all(|&b| b == 0));

    let child = BlockRef {
        block: 0x3333,
        txn: 0x4444,
    };
    let internal = Node {
        tree: TreeKind::Mapping,
        level: 1,
        keys: vec![0],
        body: NodeBody::Internal(vec![child]),
        packed: false,
    };
    let mut fields = header(0x5555, 0x6666, 1, 1, 1, 0);
    fields.push(("entries", [le(0), le(0x3333), le(0x4444)].concat()));
    check(
        "internal node",
        &internal.encode(0x5555, 0x6666),
        0,
        &rows,
        &fields,
    );
}

fn record(kind: VolumeKind, name: &str) -> VolumeRecord {
    VolumeRecord {
        root: BlockRef {
            block: 0x0101,
            txn: 0x0202,
        },
        size_bytes: 0x0303 * 512,
        parent: 0x0404,
        created_txn: 0x0505,
        created_unix_secs: 0x0606,
        mapped_chunks: 0x0707,
        kind,
        name: name.to_owned(),
        guid: [0x11; 16],
        receive: ReceiveState::default(),
        layout: DataLayout::Row,
        backing: None,
        key_slot: None,
    }
}

fn encoded(r: &VolumeRecord) -> Vec<u8> {
    let mut out = vec![0; VolumeRecord::ENCODED_LEN];
    r.encode(&mut out);
    out
}

/// The fields every volume-table value starts with, as `r` has them.
fn common_fields(r: &VolumeRecord, flags: u32) -> Vec<(&'static str, Vec<u8>)> {
    vec![
        (
            "mapping-tree root",
            [le(r.root.block), le(r.root.txn)].concat(),
        ),
        ("size in bytes", le(r.size_bytes)),
        ("parent id", le(r.parent)),
        ("txn of creation", le(r.created_txn)),
        ("creation time", le(r.created_unix_secs)),
        ("mapped chunks", le(r.mapped_chunks)),
        ("flags", le32(flags)),
        ("name length", le16(r.name.len() as u16)),
        ("kind:", vec![r.kind as u8]),
        ("reserved", vec![0]),
    ]
}

fn name_field(r: &VolumeRecord) -> (&'static str, Vec<u8>) {
    let mut name = r.name.as_bytes().to_vec();
    name.resize(MAX_NAME_LEN, 0);
    ("name, utf-8", name)
}

/// §6, the volume-table value: a kind 4 receive (every kind 4 field), a
/// kind 4 copy-on-write volume (its fields in place of the receive's),
/// and a kind 2 value.
#[test]
fn volume_table_value_offsets_match_format_md() {
    let doc = format_md();
    let rows = table(&doc, "**Volume table**, key = volume id");
    let cow_row = |r: &Row| r.field.contains("flags set");
    let kind4_only = |r: &Row| r.field.contains("kind 4 only");
    let encrypted_row = |r: &Row| r.field.contains("encrypted (flag bit 3");

    let mut receive = record(VolumeKind::Receiving, "vol%recv");
    receive.guid = [0; 16];
    receive.receive = ReceiveState {
        target: [0x22; 16],
        base: [0x33; 16],
        offset: 0x0808,
    };
    let mut fields = common_fields(&receive, 0);
    fields.extend([
        ("identity (guid)", vec![0; 16]),
        (
            "the identity the received snapshot will have",
            vec![0x22; 16],
        ),
        ("the stream's base snapshot", vec![0x33; 16]),
        ("bytes of the volume applied", le(0x0808)),
        ("reserved (0)", vec![0; 8]),
        name_field(&receive),
    ]);
    check(
        "kind 4 receive",
        &encoded(&receive),
        0,
        &rows_of(&rows, 1, |r| !cow_row(r) && !encrypted_row(r)),
        &fields,
    );

    let mut cow = record(VolumeKind::Volume, "origin");
    cow.layout = DataLayout::Cow(CowState {
        home: Home::Pool { first: 0x0909 },
        epoch: 0x0a0a,
        rollback: 0x0b0b,
    });
    let bytes = encoded(&cow);
    let mut fields = common_fields(&cow, 1);
    fields.extend([
        ("identity (guid)", vec![0x11; 16]),
        ("reserved (0)", vec![0; 8]),
        ("copy-on-write fields", bytes[80..120].to_vec()),
        name_field(&cow),
    ]);
    let receive_only = |r: &Row| r.field.contains("receive only");
    check(
        "kind 4 copy-on-write volume",
        &bytes,
        0,
        &rows_of(&rows, 1, |r| !receive_only(r) && !encrypted_row(r)),
        &fields,
    );

    let mut sealed = record(VolumeKind::Snapshot, "vault@s");
    sealed.key_slot = Some(0x0c0c);
    let bytes = encoded(&sealed);
    let mut fields = common_fields(&sealed, 8);
    fields.extend([
        ("identity (guid)", vec![0x11; 16]),
        ("copy-on-write fields", vec![0; 40]),
        ("the key slot", le(0x0c0c)),
        name_field(&sealed),
    ]);
    let reserved_120 = |r: &Row| kind4_only(r) && r.field.contains("reserved (0)");
    check(
        "kind 4 encrypted snapshot",
        &bytes,
        0,
        &rows_of(&rows, 1, |r| !receive_only(r) && !reserved_120(r)),
        &fields,
    );

    let snapshot = record(VolumeKind::Snapshot, "vol@snap");
    let mut v1 = vec![0; VolumeRecord::ENCODED_LEN_V1];
    snapshot.encode_v1(&mut v1);
    let mut fields = common_fields(&snapshot, 0);
    fields.push(name_field(&snapshot));
    check(
        "kind 2 snapshot",
        &v1,
        0,
        &rows_of(&rows, 0, |r| {
            !cow_row(r) && !kind4_only(r) && !encrypted_row(r)
        }),
        &fields,
    );
    assert_eq!(
        VolumeRecord::ENCODED_LEN,
        128 + MAX_NAME_LEN,
        "kind 4: 312 bytes"
    );
    assert_eq!(
        VolumeRecord::ENCODED_LEN_V1,
        64 + MAX_NAME_LEN,
        "kind 2: 248 bytes"
    );
}

/// §6.1: a copy-on-write volume's fields (home external, and in the
/// pool), a record that reads through an epoch, and a snapshot-store value.
#[test]
fn copy_on_write_offsets_match_format_md() {
    let doc = format_md();
    let cow_rows = table(&doc, "Its record's fields");
    for (home, dev_or_first, ino) in [
        (
            Home::External(DeviceIdentity {
                dev: 0x0c0c,
                ino: 0x0d0d,
            }),
            0x0c0c,
            0x0d0d,
        ),
        (Home::Pool { first: 0x0e0e }, 0x0e0e, 0),
    ] {
        let mut r = record(VolumeKind::Volume, "origin");
        r.layout = DataLayout::Cow(CowState {
            home,
            epoch: 0x0a0a,
            rollback: 0x0b0b,
        });
        check(
            "copy-on-write volume",
            &encoded(&r),
            0,
            &cow_rows,
            &[
                ("snapshot store", [le(0x0101), le(0x0202)].concat()),
                ("mapped chunks", le(0x0707)),
                ("`epoch`", le(0x0a0a)),
                ("`rollback`", le(0x0b0b)),
                ("`dev`", le(dev_or_first)),
                ("`ino`", le(ino)),
                ("reserved", vec![0; 16]),
            ],
        );
    }

    let mut reader = record(VolumeKind::Snapshot, "origin@e");
    reader.backing = Some(Backing {
        origin: 0x0f0f,
        epoch: 0x1010,
    });
    let bytes = encoded(&reader);
    assert_eq!(
        VolumeRecord::flags(&bytes),
        4,
        "flag bit 2: reads through an epoch"
    );
    check(
        "reads through an epoch",
        &bytes,
        0,
        &table(&doc, "has a mapping tree of its own as any volume"),
        &[
            ("copy-on-write volume's id", le(0x0f0f)),
            ("the epoch", le(0x1010)),
            ("reserved", vec![0; 32]),
        ],
    );

    let mut value = vec![0; StoreValue::ENCODED_LEN];
    StoreValue {
        pchunk: 0x1111,
        last: 0x1212,
        gen: 0x1313,
    }
    .encode(&mut value);
    check(
        "snapshot-store value",
        &value,
        0,
        &table(&doc, "**Snapshot store.**"),
        &[
            ("`pchunk`", le(0x1111)),
            ("`len`", le32(1)),
            ("`last`", le32(0x1212)),
            ("`gen`", le(0x1313)),
        ],
    );
    assert_eq!(split_store_key(store_key(5, 7)), (5, 7));
    assert_eq!(
        store_key(5, 7),
        5 << 32 | 7,
        "keyed by `chunk << 32 | first`"
    );
}

/// §6: a property's framed value; §6.1: the origin-loss record.
#[test]
fn property_and_origin_loss_offsets_match_format_md() {
    let doc = format_md();
    let value = b"a property value".to_vec();
    let framed = encode_property(&value).unwrap();
    check(
        "property",
        &framed,
        0,
        &table(&doc, "framed as below"),
        &[
            ("magic `aprp`", b"APRP".to_vec()),
            ("layout version (1)", le16(1)),
            ("reserved", le16(0)),
            ("value length", le32(value.len() as u32)),
            ("crc32c of the value", le32(crc32c::crc32c(&value))),
            ("the value", value),
        ],
    );

    let loss = OriginLoss {
        from: 0x1414,
        epoch: 0x1515,
        seen_unix: 0x1616,
        accepted_unix: 0x1717,
    };
    assert!(doc.contains(&format!("property `{ORIGIN_LOSS_KEY}`")));
    let rows = table(&doc, ORIGIN_LOSS_KEY);
    assert_eq!(ORIGIN_LOSS_LEN, 40);
    check(
        "origin loss",
        &loss.encode(),
        0,
        &rows,
        &[
            ("layout version (1)", vec![1]),
            ("reserved", vec![0; 7]),
            ("`from`", le(0x1414)),
            ("`epoch`", le(0x1515)),
            ("seen", le(0x1616)),
            ("accepted", le(0x1717)),
        ],
    );
}

/// §6.2's entry table: its fields in order, each present when the table
/// says.
fn packed_entry_fields(doc: &str) -> Vec<(String, String)> {
    let start = doc.find("### 6.2 Packed mapping leaves").expect("§6.2");
    doc[start..]
        .lines()
        .skip_while(|l| !l.starts_with("| field | present | value |"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            (cells[1].trim_matches('`').to_owned(), cells[2].to_owned())
        })
        .collect()
}

/// Reads one unsigned LEB128 number as §6.2 defines it.
fn leb128(bytes: &[u8], at: &mut usize) -> u128 {
    let mut value = 0u128;
    for shift in (0..).step_by(7) {
        let byte = bytes[*at];
        *at += 1;
        value |= u128::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return value;
        }
    }
    unreachable!()
}

/// §6.2: a packed leaf decoded by the document's rules, not the crate's,
/// gives back what was encoded: a plain extent, a longer one, and a
/// partial extent with two middle layers.
#[test]
fn packed_entries_match_format_md() {
    let doc = format_md();
    let fields = packed_entry_fields(&doc);
    let names: Vec<&str> = fields.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        ["head", "len", "word", "pchunk", "gen", "base", "layers"],
        "§6.2's entry fields"
    );
    let partial = Partial {
        mask: 0b0001,
        mids: [
            Some(Layer {
                chunk: 0x7777,
                mask: 0b0100,
            }),
            Some(Layer {
                chunk: 0x8888,
                mask: 0b1000,
            }),
        ],
        base: 0x9999,
    };
    let values = [
        (5u64, MapValue::whole(0x1234, 1, 0x42)),
        (9, MapValue::whole(0x20_0000, 7, 0x43)),
        (
            300,
            MapValue {
                pchunk: 0x5555,
                len: 1,
                gen: 0x44,
                partial: Some(partial),
            },
        ),
    ];
    let mut leaf = Node::new_leaf(TreeKind::Mapping);
    leaf.keys = values.iter().map(|(k, _)| *k).collect();
    leaf.body = NodeBody::Leaf(values.iter().flat_map(|(_, v)| map_value(*v)).collect());
    let leaf = leaf.into_packed().expect("three extents fit packed");
    let block = leaf.encode(7, 7);
    assert_eq!(block[32], 5, "kind 5");
    let len = u32::from_le_bytes(block[36..40].try_into().unwrap()) as usize;
    let entries = &block[40..40 + len];

    let mut at = 0;
    let mut prev: Option<u64> = None;
    for (key, value) in values {
        let head = leb128(entries, &mut at);
        let gap = (head >> 2) as u64;
        let (word_flag, len_flag) = (head & 2 != 0, head & 1 != 0);
        assert_eq!(prev.map_or(gap, |p| p + 1 + gap), key, "gap");
        let written_len = if len_flag {
            leb128(entries, &mut at)
        } else {
            1
        };
        let word = if word_flag {
            leb128(entries, &mut at)
        } else {
            0
        };
        assert_eq!(leb128(entries, &mut at), u128::from(value.pchunk), "pchunk");
        assert_eq!(leb128(entries, &mut at), u128::from(value.gen), "gen");
        match value.partial {
            None => {
                assert_eq!(written_len, u128::from(value.len), "len");
                assert_eq!(len_flag, value.len != 1, "len_flag");
                assert_eq!(word, 0);
            }
            Some(p) => {
                assert!(
                    len_flag && word_flag && written_len == 0,
                    "a partial's marks"
                );
                let layers = p.mid_count() as u128;
                assert_eq!(
                    word,
                    u128::from(p.mask) + layers * (1 << 32),
                    "mask + layers * 2^32"
                );
                assert_eq!(leb128(entries, &mut at), u128::from(p.base), "base");
                for layer in p.layers() {
                    assert_eq!(
                        leb128(entries, &mut at),
                        u128::from(layer.chunk),
                        "layer chunk"
                    );
                    assert_eq!(
                        leb128(entries, &mut at),
                        u128::from(layer.mask),
                        "layer mask"
                    );
                }
            }
        }
        prev = Some(key);
    }
    assert_eq!(at, len, "the entries end exactly at `L`");
}
