//! The intent log (version 13, docs/FORMAT.md §6.4.1): a small area of
//! blocks, between journal area B and the metadata space map, where a
//! writer lists regions of the in-place intent set (§6.4) durably between
//! two commits, one 4 KiB record at a time, instead of committing.
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 16 | common header (§2): version 1, type 5, reserved 0 |
//! | 16 | 16 | pool uuid |
//! | 32 | 8 | `txn` of the newest durable commit record when written |
//! | 40 | 4 | `seq`: the record's index in the area |
//! | 44 | 4 | `count`: regions that follow, 1 ..= [`LOG_RECORD_MAX_REGIONS`] |
//! | 48 | 8 × count | region numbers, strictly increasing |
//!
//! The bytes after the last region are zero. All little-endian.

use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::header::{self, BlockHeader, BlockType, HEADER_SIZE};
use crate::snapshot_log::{LoggedSnapshot, SnapshotLogRecord};
use crate::{FormatError, FormatVersion, BLOCK_SIZE};

/// The fields after the common block header of every record of the log
/// area, of either type (an intent record's `count` counts regions, a
/// snapshot record's snapshots, §6.4.2).
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub(crate) struct RecordHead {
    pub(crate) uuid: [u8; 16],
    pub(crate) txn: U64,
    pub(crate) seq: U32,
    pub(crate) count: U32,
}

/// Offset of what follows a record's head (an intent record's first
/// region number, a snapshot record's first entry).
pub(crate) const RECORD_BODY_AT: usize = HEADER_SIZE + size_of::<RecordHead>();
const REGIONS_AT: usize = RECORD_BODY_AT;

/// A block of the log area whose common header verifies as `kind` with
/// version 1 and reserved field 0 (so a record has one encoding): its
/// head and the bytes after it. `invalid` words the errors of its type.
pub(crate) fn open_record(
    block: &[u8],
    kind: BlockType,
    invalid: impl Fn(&str) -> FormatError,
) -> Result<(&RecordHead, &[u8]), FormatError> {
    let version = header::verify_version(block, kind)?;
    if version != FormatVersion::UNCHANGED_LAYOUT {
        return Err(invalid(&format!("header version {version}, not 1")));
    }
    let (common, rest) = BlockHeader::ref_from_prefix(block)
        .map_err(|_| invalid("block shorter than its header"))?;
    if common.reserved.get() != 0 {
        return Err(invalid("header's reserved field is not zero"));
    }
    RecordHead::ref_from_prefix(rest).map_err(|_| invalid("block shorter than a record"))
}

/// A record's block with its head written (the body is the caller's),
/// zeros elsewhere, not sealed.
pub(crate) fn record_block(uuid: [u8; 16], txn: u64, seq: u32, count: u32) -> [u8; BLOCK_SIZE] {
    let head = RecordHead {
        uuid,
        txn: U64::new(txn),
        seq: U32::new(seq),
        count: U32::new(count),
    };
    let mut block = [0u8; BLOCK_SIZE];
    block[HEADER_SIZE..RECORD_BODY_AT].copy_from_slice(head.as_bytes());
    block
}

/// The most regions one record lists: `(4096 - 48) / 8`, the slots that
/// fill the block after its headers.
pub const LOG_RECORD_MAX_REGIONS: usize = (BLOCK_SIZE - REGIONS_AT) / size_of::<u64>();

/// One record of the intent log: regions of the in-place intent set that
/// the writer made durable after commit `txn`, before writing in place
/// into them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IntentLogRecord {
    /// The pool's uuid (a record of another pool is not taken).
    pub uuid: [u8; 16],
    /// The `txn` of the newest durable commit record when the record was
    /// written; a reader takes only records of its current commit's.
    pub txn: u64,
    /// The record's index in the log area (its block is `log_start + seq`).
    pub seq: u32,
    /// Region numbers (as keys of the intent set, §6.4), strictly
    /// increasing, 1 ..= [`LOG_RECORD_MAX_REGIONS`] of them.
    pub regions: Vec<u64>,
}

fn invalid(what: impl std::fmt::Display) -> FormatError {
    FormatError::Invalid(format!("intent log record: {what}"))
}

/// A record lists 1 ..= [`LOG_RECORD_MAX_REGIONS`] regions, strictly
/// increasing.
fn check_regions(regions: &[u64]) -> Result<(), FormatError> {
    if regions.is_empty() {
        return Err(invalid("lists no region"));
    }
    if regions.len() > LOG_RECORD_MAX_REGIONS {
        return Err(invalid(format_args!(
            "lists {} regions, at most {LOG_RECORD_MAX_REGIONS}",
            regions.len()
        )));
    }
    if regions.windows(2).any(|w| w[0] >= w[1]) {
        return Err(invalid("regions are not strictly increasing"));
    }
    Ok(())
}

impl IntentLogRecord {
    /// The record's block, sealed (type 5, header version 1). A
    /// [`FormatError`] if `regions` is empty, longer than
    /// [`LOG_RECORD_MAX_REGIONS`], or not strictly increasing.
    pub fn encode(&self) -> Result<[u8; BLOCK_SIZE], FormatError> {
        check_regions(&self.regions)?;
        let count =
            u32::try_from(self.regions.len()).map_err(|_| invalid("region count overflows"))?;
        let mut block = record_block(self.uuid, self.txn, self.seq, count);
        for (slot, region) in block[REGIONS_AT..]
            .chunks_exact_mut(size_of::<u64>())
            .zip(&self.regions)
        {
            slot.copy_from_slice(U64::new(*region).as_bytes());
        }
        header::seal(&mut block, BlockType::IntentLog);
        Ok(block)
    }

    /// Decodes a record: the common header verifies (magic, type 5, crc;
    /// its version 1 and its reserved field 0, so that a record has one
    /// encoding), the count is 1 ..= [`LOG_RECORD_MAX_REGIONS`], the
    /// regions are strictly increasing and every byte after the last is
    /// zero. Never panics on any input.
    pub fn decode(block: &[u8]) -> Result<Self, FormatError> {
        let (head, body) = open_record(block, BlockType::IntentLog, |what| invalid(what))?;
        let slots =
            <[U64]>::ref_from_bytes(body).map_err(|_| invalid("regions do not fill the block"))?;
        let count = usize::try_from(head.count.get()).map_err(|_| invalid("count overflows"))?;
        if count == 0 {
            return Err(invalid("lists no region"));
        }
        let Some((listed, tail)) = slots.split_at_checked(count) else {
            return Err(invalid(format_args!(
                "lists {count} regions, at most {LOG_RECORD_MAX_REGIONS}"
            )));
        };
        if tail.iter().any(|slot| slot.get() != 0) {
            return Err(invalid("bytes after the last region are not zero"));
        }
        let regions: Vec<u64> = listed.iter().map(|slot| slot.get()).collect();
        check_regions(&regions)?;
        Ok(Self {
            uuid: head.uuid,
            txn: head.txn.get(),
            seq: head.seq.get(),
            regions,
        })
    }
}

/// What the intent log gives an open (FORMAT.md §6.4.1, §6.4.2).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogReplay {
    /// Regions to add to the intent set, sorted and without duplicates.
    pub regions: Vec<u64>,
    /// Snapshots to take again onto the commit, in the order taken.
    pub snapshots: Vec<LoggedSnapshot>,
}

/// One record of the log area, of either type.
fn decode_record(block: &[u8], snapshots: bool) -> Option<(LogReplay, [u8; 16], u64, u32)> {
    match IntentLogRecord::decode(block) {
        Ok(r) => Some((
            LogReplay {
                regions: r.regions,
                snapshots: Vec::new(),
            },
            r.uuid,
            r.txn,
            r.seq,
        )),
        Err(FormatError::WrongType { found, .. })
            if snapshots && found == BlockType::SnapshotLog as u16 =>
        {
            let r = SnapshotLogRecord::decode(block).ok()?;
            Some((
                LogReplay {
                    regions: Vec::new(),
                    snapshots: r.snapshots,
                },
                r.uuid,
                r.txn,
                r.seq,
            ))
        }
        Err(_) => None,
    }
}

/// What the intent log adds on open (FORMAT.md §6.4.1): the regions its
/// intent records list, sorted and without duplicates, and, where
/// `snapshots` (a version 14 pool, [`FormatVersion::has_logged_snapshots`]),
/// the snapshots its snapshot records list (§6.4.2), in order. `blocks`
/// are the log area's blocks in order from block 0; `uuid` is the pool's,
/// `txn` that of the commit record the pool opens at. The records taken
/// are the longest prefix of blocks that each decode, name `uuid` and
/// `txn`, and have as `seq` their index: the first block that does not (a
/// torn append, a record of an older commit, zeros, a snapshot record in
/// a pool older than 14) ends the log, whatever follows it.
pub fn log_records_to_replay<'a>(
    blocks: impl Iterator<Item = &'a [u8]>,
    uuid: [u8; 16],
    txn: u64,
    snapshots: bool,
) -> LogReplay {
    let mut replay = LogReplay::default();
    for (index, block) in blocks.enumerate() {
        let Some((record, r_uuid, r_txn, seq)) = decode_record(block, snapshots) else {
            break;
        };
        let in_place = u32::try_from(index).is_ok_and(|index| index == seq);
        if r_uuid != uuid || r_txn != txn || !in_place {
            break;
        }
        replay.regions.extend(record.regions);
        replay.snapshots.extend(record.snapshots);
    }
    replay.regions.sort_unstable();
    replay.regions.dedup();
    replay
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seal;

    const UUID: [u8; 16] = [7; 16];

    fn record(txn: u64, seq: u32, regions: &[u64]) -> IntentLogRecord {
        IntentLogRecord {
            uuid: UUID,
            txn,
            seq,
            regions: regions.to_vec(),
        }
    }

    fn invalid_err<T: std::fmt::Debug>(result: Result<T, FormatError>) {
        assert!(matches!(result, Err(FormatError::Invalid(_))), "{result:?}");
    }

    #[test]
    fn max_regions_fill_the_block() {
        assert_eq!(REGIONS_AT, 48);
        assert_eq!(LOG_RECORD_MAX_REGIONS, 506);
        assert_eq!(REGIONS_AT + 8 * LOG_RECORD_MAX_REGIONS, BLOCK_SIZE);
    }

    #[test]
    fn round_trip() {
        let full: Vec<u64> = (0..LOG_RECORD_MAX_REGIONS as u64).map(|r| r * 3).collect();
        for r in [
            record(1, 0, &[0]),
            record(0x0102_0304_0506, 7, &[3, 9, u64::MAX]),
            record(u64::MAX, u32::MAX, &full),
        ] {
            let block = r.encode().unwrap();
            assert_eq!(&block[..4], b"ARBR");
            assert_eq!(&block[4..6], &1u16.to_le_bytes(), "header version 1");
            assert_eq!(&block[6..8], &5u16.to_le_bytes(), "type 5");
            assert_eq!(IntentLogRecord::decode(&block).unwrap(), r);
        }
    }

    #[test]
    fn encode_rejects_bad_region_lists() {
        invalid_err(record(1, 0, &[]).encode());
        let over: Vec<u64> = (0..=LOG_RECORD_MAX_REGIONS as u64).collect();
        invalid_err(record(1, 0, &over).encode());
        invalid_err(record(1, 0, &[4, 3]).encode());
        invalid_err(record(1, 0, &[4, 4]).encode());
    }

    /// `block` with its bytes at `at` replaced, sealed again.
    fn forged(block: &[u8; BLOCK_SIZE], at: usize, bytes: &[u8]) -> [u8; BLOCK_SIZE] {
        let mut b = *block;
        b[at..at + bytes.len()].copy_from_slice(bytes);
        seal(&mut b, BlockType::IntentLog);
        b
    }

    #[test]
    fn decode_rejects_damage_and_bad_fields() {
        let block = record(5, 2, &[10, 20, 30]).encode().unwrap();
        // Bad crc.
        let mut flipped = block;
        flipped[60] ^= 1;
        assert!(matches!(
            IntentLogRecord::decode(&flipped),
            Err(FormatError::BadChecksum { .. })
        ));
        // Wrong type: a node's header over a record's body.
        let mut node = block;
        seal(&mut node, BlockType::Node);
        assert_eq!(
            IntentLogRecord::decode(&node),
            Err(FormatError::WrongType {
                expected: 5,
                found: 4
            })
        );
        // Zeros, a short and a long block.
        assert_eq!(
            IntentLogRecord::decode(&[0; BLOCK_SIZE]),
            Err(FormatError::BadMagic)
        );
        invalid_err(IntentLogRecord::decode(&block[..BLOCK_SIZE - 1]));
        invalid_err(IntentLogRecord::decode(&[block.as_slice(), &[0]].concat()));
        // Count 0, count over the max (and far over), count past the
        // regions listed (a zero region after 30).
        invalid_err(IntentLogRecord::decode(&forged(
            &block,
            44,
            &0u32.to_le_bytes(),
        )));
        let over = LOG_RECORD_MAX_REGIONS as u32 + 1;
        invalid_err(IntentLogRecord::decode(&forged(
            &block,
            44,
            &over.to_le_bytes(),
        )));
        invalid_err(IntentLogRecord::decode(&forged(
            &block,
            44,
            &u32::MAX.to_le_bytes(),
        )));
        invalid_err(IntentLogRecord::decode(&forged(
            &block,
            44,
            &4u32.to_le_bytes(),
        )));
        // Unsorted, duplicate regions.
        invalid_err(IntentLogRecord::decode(&forged(
            &block,
            56,
            &5u64.to_le_bytes(),
        )));
        invalid_err(IntentLogRecord::decode(&forged(
            &block,
            56,
            &10u64.to_le_bytes(),
        )));
        // A non-zero byte after the last region, anywhere up to the end.
        for at in [72, 100, BLOCK_SIZE - 1] {
            invalid_err(IntentLogRecord::decode(&forged(&block, at, &[1])));
        }
        // The header's reserved field (seal writes it zero: the crc by
        // hand), and a version other than 1.
        let mut reserved = block;
        reserved[12] = 1;
        reserved[8..12].fill(0);
        let crc = crc32c::crc32c(&reserved);
        reserved[8..12].copy_from_slice(&crc.to_le_bytes());
        invalid_err(IntentLogRecord::decode(&reserved));
        let mut v13 = block;
        crate::seal_version(&mut v13, BlockType::IntentLog, FormatVersion::NEWEST);
        invalid_err(IntentLogRecord::decode(&v13));
        // Untouched, it decodes.
        assert!(IntentLogRecord::decode(&block).is_ok());
    }

    fn replay(blocks: &[[u8; BLOCK_SIZE]], txn: u64) -> Vec<u64> {
        let replay = log_records_to_replay(blocks.iter().map(|b| b.as_slice()), UUID, txn, true);
        assert!(replay.snapshots.is_empty());
        replay.regions
    }

    #[test]
    fn replay_takes_snapshot_records_in_order_where_the_version_has_them() {
        let snap = |id: u64, name: &str| LoggedSnapshot {
            source: 1,
            id,
            guid: [id as u8; 16],
            created_unix_secs: 5,
            name: name.to_owned(),
        };
        let snaps = |seq, txn, list: Vec<LoggedSnapshot>| {
            SnapshotLogRecord {
                uuid: UUID,
                txn,
                seq,
                snapshots: list,
            }
            .encode()
            .unwrap()
        };
        let rec = |seq, regions: &[u64]| record(9, seq, regions).encode().unwrap();
        let log = [
            rec(0, &[4]),
            snaps(1, 9, vec![snap(3, "v@a")]),
            rec(2, &[2]),
            snaps(3, 9, vec![snap(4, "v@b"), snap(5, "w@b")]),
        ];
        let blocks = || log.iter().map(|b| b.as_slice());
        let got = log_records_to_replay(blocks(), UUID, 9, true);
        assert_eq!(got.regions, vec![2, 4]);
        assert_eq!(
            got.snapshots,
            vec![snap(3, "v@a"), snap(4, "v@b"), snap(5, "w@b")]
        );
        // Before version 14 a snapshot record ends the log.
        let got = log_records_to_replay(blocks(), UUID, 9, false);
        assert_eq!(got.regions, vec![4]);
        assert!(got.snapshots.is_empty());
        // A snapshot record of an older commit ends it too.
        let stale = [
            rec(0, &[4]),
            snaps(1, 8, vec![snap(3, "v@a")]),
            rec(2, &[2]),
        ];
        let got = log_records_to_replay(stale.iter().map(|b| b.as_slice()), UUID, 9, true);
        assert_eq!(
            got,
            LogReplay {
                regions: vec![4],
                snapshots: vec![]
            }
        );
    }

    #[test]
    fn replay_takes_the_valid_prefix() {
        let rec = |txn, seq, regions: &[u64]| record(txn, seq, regions).encode().unwrap();
        let zeros = [0u8; BLOCK_SIZE];
        // Sorted and deduplicated across records.
        let log = [rec(9, 0, &[5, 8]), rec(9, 1, &[1, 5]), rec(9, 2, &[100])];
        assert_eq!(replay(&log, 9), vec![1, 5, 8, 100]);
        // No record of this commit: nothing.
        assert_eq!(replay(&log, 10), Vec::<u64>::new());
        assert_eq!(replay(&[zeros, log[1]], 9), Vec::<u64>::new());
        assert_eq!(replay(&[], 9), Vec::<u64>::new());
        // Stops at zeros, ignoring a valid record after them.
        assert_eq!(replay(&[log[0], zeros, rec(9, 2, &[7])], 9), vec![5, 8]);
        // Stops at a torn block (a flipped bit).
        let mut torn = log[1];
        torn[2000] ^= 0x40;
        assert_eq!(replay(&[log[0], torn, log[2]], 9), vec![5, 8]);
        // Stops at a record of an older commit left from before.
        let old = rec(8, 1, &[2]);
        assert_eq!(replay(&[log[0], old, rec(8, 2, &[3])], 9), vec![5, 8]);
        // Stops at a seq gap or a seq out of place.
        assert_eq!(replay(&[log[0], log[2], log[1]], 9), vec![5, 8]);
        assert_eq!(replay(&[log[1], log[0]], 9), Vec::<u64>::new());
        // Stops at another pool's record.
        let mut other = record(9, 1, &[3]);
        other.uuid = [8; 16];
        assert_eq!(
            replay(&[log[0], other.encode().unwrap(), log[2]], 9),
            vec![5, 8]
        );
        // A full area: every record taken.
        let full: Vec<[u8; BLOCK_SIZE]> = (0..64u32)
            .map(|i| rec(9, i, &[u64::from(i) * 2, u64::from(i) * 2 + 1]))
            .collect();
        assert_eq!(replay(&full, 9), (0..128).collect::<Vec<u64>>());
    }
}
