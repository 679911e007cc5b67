//! Every decoder accepts arbitrary bytes without panicking: damaged blocks
//! are errors. Sealed garbage (valid checksum) must be rejected by the field
//! validation itself.
// A test crate: unwrap, expect and panic are how a test reports failure
// (the workspace denies them in the code it ships; clippy.toml allows
// them in #[test] functions, this in the helpers around them).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use arbor_format::{
    choose_area_record, choose_superblock, log_records_to_replay, seal, BlockRef, BlockType,
    CommitRecord, IntentLogRecord, LoggedSnapshot, MapValue, Node, SmKind, SmPage,
    SnapshotLogRecord, StoreValue, Superblock, VolumeRecord, BLOCK_SIZE, LOG_RECORD_MAX_REGIONS,
    MAX_NAME_LEN,
};
use proptest::prelude::*;

fn block_from(bytes: &[u8]) -> [u8; BLOCK_SIZE] {
    let mut block = [0u8; BLOCK_SIZE];
    let n = bytes.len().min(BLOCK_SIZE);
    block[..n].copy_from_slice(&bytes[..n]);
    block
}

fn decode_all(block: &[u8]) {
    let _ = Superblock::decode(block, u64::MAX);
    let _ = CommitRecord::decode(block);
    let _ = SmPage::decode(block, (SmKind::Data, 0));
    let _ = SmPage::decode_any(block);
    let _ = Node::decode(block, BlockRef { block: 1, txn: 1 });
    if let Ok(record) = IntentLogRecord::decode(block) {
        assert_eq!(&record.encode().unwrap()[..], block, "one encoding");
    }
    if let Ok(record) = SnapshotLogRecord::decode(block) {
        assert_eq!(&record.encode().unwrap()[..], block, "one encoding");
    }
    for snapshots in [false, true] {
        let _ = log_records_to_replay([block, block].into_iter(), [0; 16], 0, snapshots);
    }
    // The readers' choices from two copies (FORMAT.md §3, §4).
    let zero = [0u8; BLOCK_SIZE];
    let _ = choose_area_record(block, &zero, 16, |_, _| true);
    let _ = choose_area_record(&zero, block, 16, |_, _| true);
    let _ = choose_superblock(&[block.to_vec(), zero.to_vec()], u64::MAX);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, .. ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..BLOCK_SIZE + 16)) {
        decode_all(&bytes);
        let block = block_from(&bytes);
        let _ = MapValue::decode(&block[..MapValue::ENCODED_LEN]);
        let _ = VolumeRecord::decode(&block[..VolumeRecord::ENCODED_LEN]);
        let key = u64::from_le_bytes(block[..8].try_into().unwrap());
        let _ = StoreValue::decode(key, &block[8..8 + StoreValue::ENCODED_LEN]);
    }

    #[test]
    fn sealed_garbage_never_panics(bytes in prop::collection::vec(any::<u8>(), BLOCK_SIZE), kind in 1u16..=6) {
        let mut block = block_from(&bytes);
        let block_type = match kind {
            1 => BlockType::Superblock,
            2 => BlockType::Commit,
            3 => BlockType::SpaceMap,
            4 => BlockType::Node,
            5 => BlockType::IntentLog,
            _ => BlockType::SnapshotLog,
        };
        seal(&mut block, block_type);
        decode_all(&block);
        if block_type == BlockType::Node {
            // Make the header match the pointer so decoding reaches the entries.
            block[16..24].copy_from_slice(&1u64.to_le_bytes());
            block[24..32].copy_from_slice(&1u64.to_le_bytes());
            block[33] %= 17;
            seal(&mut block, BlockType::Node);
            let _ = Node::decode(&block, BlockRef { block: 1, txn: 1 });
            // And as a packed leaf (kind 5) with a plausible count and length.
            block[32] = 5;
            block[33] = 0;
            block[34] %= 8;
            block[35] = 0;
            let len = u32::from(block[36] % 64);
            block[36..40].copy_from_slice(&len.to_le_bytes());
            seal(&mut block, BlockType::Node);
            let _ = Node::decode(&block, BlockRef { block: 1, txn: 1 });
        }
        if block_type == BlockType::IntentLog {
            // A plausible count, so decoding reaches the regions.
            let count = u32::from_le_bytes(block[44..48].try_into().unwrap())
                % (LOG_RECORD_MAX_REGIONS as u32 + 2);
            block[44..48].copy_from_slice(&count.to_le_bytes());
            seal(&mut block, BlockType::IntentLog);
            decode_all(&block);
        }
        if block_type == BlockType::SnapshotLog {
            // A plausible count and first name length, so decoding
            // reaches the entries and their names.
            let count = u32::from_le_bytes(block[44..48].try_into().unwrap()) % 20;
            block[44..48].copy_from_slice(&count.to_le_bytes());
            let len = u16::from_le_bytes(block[88..90].try_into().unwrap()) % (MAX_NAME_LEN as u16 + 2);
            block[88..90].copy_from_slice(&len.to_le_bytes());
            seal(&mut block, BlockType::SnapshotLog);
            decode_all(&block);
        }
    }

    /// Every list of snapshots a record may hold round-trips, and is
    /// replayed from the area's first block.
    #[test]
    fn snapshot_log_records_round_trip(
        entries in prop::collection::vec((any::<u64>(), any::<u64>(), any::<[u8; 16]>(), any::<u64>(), "[a-z0-9@.-]{1,184}"), 1..18),
        txn in any::<u64>(),
        seq in any::<u32>(),
    ) {
        let snapshots: Vec<LoggedSnapshot> = entries
            .into_iter()
            .map(|(source, id, guid, created_unix_secs, name)| LoggedSnapshot { source, id, guid, created_unix_secs, name })
            .collect();
        let record = SnapshotLogRecord { uuid: [3; 16], txn, seq, snapshots };
        let fits = arbor_format::snapshots_fit_a_record(record.snapshots.iter().map(|s| s.name.len()));
        match record.encode() {
            Ok(block) => {
                prop_assert!(fits);
                prop_assert_eq!(SnapshotLogRecord::decode(&block).unwrap(), record.clone());
                let replayed = log_records_to_replay([&block[..]].into_iter(), [3; 16], txn, true);
                prop_assert_eq!(replayed.snapshots, if seq == 0 { record.snapshots } else { vec![] });
            }
            Err(_) => prop_assert!(!fits),
        }
    }

    /// Every list of regions a record may hold round-trips.
    #[test]
    fn intent_log_records_round_trip(
        mut regions in prop::collection::vec(any::<u64>(), 1..=LOG_RECORD_MAX_REGIONS),
        txn in any::<u64>(),
        seq in any::<u32>(),
    ) {
        regions.sort_unstable();
        regions.dedup();
        let record = IntentLogRecord { uuid: [3; 16], txn, seq, regions };
        let block = record.encode().unwrap();
        prop_assert_eq!(IntentLogRecord::decode(&block).unwrap(), record.clone());
        let replayed = log_records_to_replay([&block[..]].into_iter(), [3; 16], txn, false);
        prop_assert_eq!(replayed.regions, if seq == 0 { record.regions } else { vec![] });
    }
}
