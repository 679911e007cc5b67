//! Feeds arbitrary bytes to every on-disk decoder; also re-seals them so the
//! field validation behind the checksum is reached.
#![no_main]

use arbor_format::{
    choose_area_record, choose_superblock, log_records_to_replay, seal, seal_version, BlockRef,
    BlockType, CommitRecord, DamageRecord, FormatVersion, IntentLogRecord, Layout, MapValue, Node,
    QosRecord, ScrubRecord, SmKind, SmPage, SnapshotLogRecord, StoreValue, SumsGeometry, SumsLeaf,
    Superblock, VolumeRecord, BLOCK_SIZE, LOG_RECORD_MAX_REGIONS, MAX_NAME_LEN, SUMS_VALUE_LEN,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = Superblock::decode(data, u64::MAX);
    let _ = CommitRecord::decode(data);
    let _ = SmPage::decode_any(data);
    let _ = Node::decode(data, BlockRef { block: 1, txn: 1 });
    // An intent log record: what decodes encodes back to the same bytes
    // (one encoding per record).
    if let Ok(record) = IntentLogRecord::decode(data) {
        assert_eq!(record.encode().ok().as_ref().map(|b| &b[..]), Some(data));
    }
    // A snapshot record of the intent log (version 14), likewise.
    if let Ok(record) = SnapshotLogRecord::decode(data) {
        assert_eq!(record.encode().ok().as_ref().map(|b| &b[..]), Some(data));
    }
    // The log area's prefix, the input cut into blocks, in a pool with
    // snapshot records (version 14) and in one without.
    for snapshots in [false, true] {
        let _ = log_records_to_replay(data.chunks(BLOCK_SIZE), [0; 16], 0, snapshots);
    }
    let mut block = [0u8; BLOCK_SIZE];
    let n = data.len().min(BLOCK_SIZE);
    block[..n].copy_from_slice(&data[..n]);
    // Leaf values: volume records (copy-on-write and epoch fields
    // included), mapping extents, snapshot-store entries under any key.
    let _ = VolumeRecord::decode(&block[..VolumeRecord::ENCODED_LEN]);
    let _ = MapValue::decode(&block[..MapValue::ENCODED_LEN]);
    let key = u64::from_le_bytes(block[..8].try_into().unwrap_or_default());
    let _ = StoreValue::decode(key, &block[8..8 + StoreValue::ENCODED_LEN]);
    // The damage record (a property's value): parsed, and what parses
    // encodes back to the same bytes.
    if let Ok(record) = DamageRecord::decode(data) {
        assert_eq!(record.encode(), data);
    }
    // A scrub record: what parses encodes back (layout 2 to the same
    // bytes; layout 1 to a layout-2 record that reads the same).
    if let Ok((record, failure)) = ScrubRecord::decode(data) {
        let again = record.encode(failure.as_deref());
        if data[0] == 2 {
            assert_eq!(&again[..], data);
        }
        assert_eq!(ScrubRecord::decode(&again).ok(), Some((record, failure)));
    }
    // A volume's QoS record: what parses encodes back to the same bytes.
    if let Ok(record) = QosRecord::decode(data) {
        assert_eq!(&record.encode()[..], data);
    }
    // A checksum leaf's value, for every chunk size.
    for shift in 12..=20 {
        let geo = SumsGeometry::new(1 << shift).expect("a valid chunk size");
        let _ = SumsLeaf::decode(geo, &block[..SUMS_VALUE_LEN]);
    }
    for block_type in [
        BlockType::Superblock,
        BlockType::Commit,
        BlockType::SpaceMap,
        BlockType::Node,
        BlockType::IntentLog,
        BlockType::SnapshotLog,
    ] {
        seal(&mut block, block_type);
        let _ = Superblock::decode(&block, u64::MAX);
        let _ = CommitRecord::decode(&block);
        let _ = SmPage::decode(&block, (SmKind::Meta, 0));
        let _ = Node::decode(&block, BlockRef { block: 1, txn: 1 });
        if let Ok(record) = IntentLogRecord::decode(&block) {
            assert_eq!(record.encode().ok(), Some(block));
        }
        if let Ok(record) = SnapshotLogRecord::decode(&block) {
            assert_eq!(record.encode().ok(), Some(block));
        }
    }
    // A record whose count is plausible and whose bytes after its regions
    // are zero, re-sealed, so decoding reaches the regions' order.
    let mut log = block;
    let count = u32::from_le_bytes(log[44..48].try_into().unwrap_or_default())
        % (LOG_RECORD_MAX_REGIONS as u32 + 2);
    log[44..48].copy_from_slice(&count.to_le_bytes());
    let end = (48 + 8 * count as usize).min(BLOCK_SIZE);
    log[end..].fill(0);
    seal(&mut log, BlockType::IntentLog);
    if let Ok(record) = IntentLogRecord::decode(&log) {
        assert_eq!(record.encode().ok(), Some(log));
        for snapshots in [false, true] {
            let taken =
                log_records_to_replay([&log[..]].into_iter(), record.uuid, record.txn, snapshots);
            assert_eq!(taken.regions.is_empty(), record.seq != 0);
            assert!(taken.snapshots.is_empty());
        }
    }
    // A snapshot record whose count is plausible and whose first name
    // length is near the bounds, re-sealed, so decoding reaches the
    // entries and their names; one that decodes is taken only where the
    // version has snapshot records, and only as the area's first block.
    let mut snap = block;
    let count = u32::from_le_bytes(snap[44..48].try_into().unwrap_or_default()) % 20;
    snap[44..48].copy_from_slice(&count.to_le_bytes());
    let len =
        u16::from_le_bytes(snap[88..90].try_into().unwrap_or_default()) % (MAX_NAME_LEN as u16 + 2);
    snap[88..90].copy_from_slice(&len.to_le_bytes());
    seal(&mut snap, BlockType::SnapshotLog);
    if let Ok(record) = SnapshotLogRecord::decode(&snap) {
        assert_eq!(record.encode().ok(), Some(snap));
        for snapshots in [false, true] {
            let taken =
                log_records_to_replay([&snap[..]].into_iter(), record.uuid, record.txn, snapshots);
            assert!(taken.regions.is_empty());
            let expected = if snapshots && record.seq == 0 {
                record.snapshots.clone()
            } else {
                Vec::new()
            };
            assert_eq!(taken.snapshots, expected);
        }
    }
    // The reader's choice of a commit record from an area's two copies and
    // of the superblock from its two (FORMAT.md §3, §4 "Version 9"): the
    // input's first and second blocks, as they are and sealed as version 9
    // blocks of each kind.
    let mut second = [0u8; BLOCK_SIZE];
    let rest = data.get(BLOCK_SIZE..).unwrap_or_default();
    second[..rest.len().min(BLOCK_SIZE)].copy_from_slice(&rest[..rest.len().min(BLOCK_SIZE)]);
    let nine = FormatVersion::new(9).expect("version 9 is known");
    let mut pair = [block, second];
    for sealed in [None, Some(BlockType::Commit), Some(BlockType::Superblock)] {
        if let Some(block_type) = sealed {
            for b in &mut pair {
                seal_version(b, block_type, nine);
            }
        }
        let _ = choose_area_record(&pair[0], &pair[1], 16, |_, _| true);
        let _ = choose_superblock(&[pair[0].to_vec(), pair[1].to_vec()], u64::MAX);
    }
    // A version 2 record's grown regions, against a valid region 0.
    let two = FormatVersion::new(2).expect("version 2 is known");
    seal_version(&mut block, BlockType::Commit, two);
    if let Ok(record) = CommitRecord::decode(&block) {
        let _ = Layout::from_record(&region0(), &record, u64::MAX);
    }
});

/// The superblock of a small pool (64 MiB, 4 KiB chunks).
fn region0() -> Superblock {
    use zerocopy::little_endian::{U32, U64};
    let mut sb = Superblock::new_zeroed_geometry();
    sb.pool_bytes = U64::new(64 << 20);
    sb.chunk_size = U32::new(4096);
    sb.journal_pages = U32::new(16);
    sb.journal_start = [U64::new(2), U64::new(19)];
    sb.meta_sm_start = U64::new(36);
    sb.data_sm_start = U64::new(37);
    sb.meta_start = U64::new(53);
    sb.meta_blocks = U64::new(700);
    sb.data_start_bytes = U64::new(753 * 4096);
    sb.data_chunks = U64::new((64 << 20) / 4096 - 753);
    sb
}
