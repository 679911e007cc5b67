//! The snapshot record of the intent log (version 14, docs/FORMAT.md
//! §6.4.2): one or more snapshots taken after the newest durable commit,
//! made durable alone instead of by a commit, and taken again onto that
//! commit when the pool opens after a crash.
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 16 | common header (§2): version 1, type 6, reserved 0 |
//! | 16 | 16 | pool uuid |
//! | 32 | 8 | `txn` of the newest durable commit record when written |
//! | 40 | 4 | `seq`: the record's index in the area |
//! | 44 | 4 | `count`: snapshots that follow, 1 or more |
//! | 48 | … | `count` entries, one after another (below) |
//!
//! An entry ([`LoggedSnapshot`]):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | `source`: id of the volume snapshotted |
//! | 8 | 8 | `id`: the snapshot's volume id |
//! | 16 | 16 | `guid`: the snapshot's identity |
//! | 32 | 8 | `created_unix_secs` |
//! | 40 | 2 | `name_len`: 1 ..= [`MAX_NAME_LEN`] |
//! | 42 | `name_len` | the snapshot's full name (`volume@snap`), UTF-8 |
//!
//! The bytes after the last entry are zero. All little-endian.

use zerocopy::little_endian::{U16, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::header::{self, BlockType};
use crate::intent_log::{open_record, record_block, RECORD_BODY_AT};
use crate::{FormatError, BLOCK_SIZE, MAX_NAME_LEN};

/// An entry's fixed fields, before its name.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C, packed)]
struct EntryHead {
    source: U64,
    id: U64,
    guid: [u8; 16],
    created_unix_secs: U64,
    name_len: U16,
}

/// Offset of the first entry: the common header and the record's head
/// (that of every record of the log, `crate::intent_log`).
const ENTRIES_AT: usize = RECORD_BODY_AT;

/// Bytes of an entry before its name.
pub const SNAPSHOT_ENTRY_FIXED: usize = size_of::<EntryHead>();

/// One snapshot a snapshot record lists: enough to take it again, with
/// the same identity, onto the commit the record names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoggedSnapshot {
    /// The volume snapshotted (its id in the table of that commit).
    pub source: u64,
    /// The snapshot's volume id.
    pub id: u64,
    /// The snapshot's identity (kept by send and receive).
    pub guid: [u8; 16],
    pub created_unix_secs: u64,
    /// Its full name, `volume@snap`: 1 ..= [`MAX_NAME_LEN`] bytes.
    pub name: String,
}

/// A record of snapshots taken together (one group, or one snapshot)
/// after commit `txn`, in the order they were taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotLogRecord {
    /// The pool's uuid (a record of another pool is not taken).
    pub uuid: [u8; 16],
    /// The `txn` of the newest durable commit record when the record was
    /// written; a reader takes only records of its current commit's.
    pub txn: u64,
    /// The record's index in the log area (its block is `log_start + seq`).
    pub seq: u32,
    /// At least one.
    pub snapshots: Vec<LoggedSnapshot>,
}

fn invalid(what: impl std::fmt::Display) -> FormatError {
    FormatError::Invalid(format!("snapshot log record: {what}"))
}

/// Whether snapshots whose names are `name_lens` bytes long fit one
/// record (at least one, each name 1 ..= [`MAX_NAME_LEN`] bytes).
pub fn snapshots_fit_a_record(name_lens: impl IntoIterator<Item = usize>) -> bool {
    let mut bytes = ENTRIES_AT;
    let mut count = 0usize;
    for len in name_lens {
        if len == 0 || len > MAX_NAME_LEN {
            return false;
        }
        bytes += SNAPSHOT_ENTRY_FIXED + len;
        count += 1;
        if bytes > BLOCK_SIZE {
            return false;
        }
    }
    count > 0
}

impl SnapshotLogRecord {
    /// The record's block, sealed (type 6, header version 1). A
    /// [`FormatError`] if it lists no snapshot, a name is empty or longer
    /// than [`MAX_NAME_LEN`], or the entries do not fit the block.
    pub fn encode(&self) -> Result<[u8; BLOCK_SIZE], FormatError> {
        if !snapshots_fit_a_record(self.snapshots.iter().map(|s| s.name.len())) {
            return Err(invalid(
                "lists no snapshot, a name of no byte or too many, or more than a block holds",
            ));
        }
        let count =
            u32::try_from(self.snapshots.len()).map_err(|_| invalid("snapshot count overflows"))?;
        let mut block = record_block(self.uuid, self.txn, self.seq, count);
        let mut at = ENTRIES_AT;
        for s in &self.snapshots {
            let entry = EntryHead {
                source: U64::new(s.source),
                id: U64::new(s.id),
                guid: s.guid,
                created_unix_secs: U64::new(s.created_unix_secs),
                // At most MAX_NAME_LEN (checked above).
                name_len: U16::new(s.name.len() as u16),
            };
            block[at..at + SNAPSHOT_ENTRY_FIXED].copy_from_slice(entry.as_bytes());
            at += SNAPSHOT_ENTRY_FIXED;
            block[at..at + s.name.len()].copy_from_slice(s.name.as_bytes());
            at += s.name.len();
        }
        header::seal(&mut block, BlockType::SnapshotLog);
        Ok(block)
    }

    /// Decodes a record: the common header verifies (magic, type 6, crc;
    /// its version 1 and its reserved field 0), the count is at least one
    /// and its entries lie inside the block, each name is 1 ..=
    /// [`MAX_NAME_LEN`] bytes of UTF-8, and every byte after the last entry
    /// is zero. Never panics on any input.
    pub fn decode(block: &[u8]) -> Result<Self, FormatError> {
        let (head, mut body) = open_record(block, BlockType::SnapshotLog, |what| invalid(what))?;
        let count = head.count.get();
        if count == 0 {
            return Err(invalid("lists no snapshot"));
        }
        let mut snapshots = Vec::new();
        for _ in 0..count {
            let (entry, tail) = EntryHead::ref_from_prefix(body)
                .map_err(|_| invalid(format_args!("{count} snapshots do not fit the block")))?;
            let len = usize::from(entry.name_len.get());
            if len == 0 || len > MAX_NAME_LEN {
                return Err(invalid(format_args!(
                    "a name of {len} bytes, not 1 ..= {MAX_NAME_LEN}"
                )));
            }
            let Some((name, tail)) = tail.split_at_checked(len) else {
                return Err(invalid(format_args!(
                    "{count} snapshots do not fit the block"
                )));
            };
            let name = std::str::from_utf8(name)
                .map_err(|_| invalid("a name is not UTF-8"))?
                .to_owned();
            snapshots.push(LoggedSnapshot {
                source: entry.source.get(),
                id: entry.id.get(),
                guid: entry.guid,
                created_unix_secs: entry.created_unix_secs.get(),
                name,
            });
            body = tail;
        }
        if body.iter().any(|&b| b != 0) {
            return Err(invalid("bytes after the last snapshot are not zero"));
        }
        Ok(Self {
            uuid: head.uuid,
            txn: head.txn.get(),
            seq: head.seq.get(),
            snapshots,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seal;

    fn snap(i: u64, name: &str) -> LoggedSnapshot {
        LoggedSnapshot {
            source: i,
            id: 100 + i,
            guid: [i as u8; 16],
            created_unix_secs: 1_700_000_000 + i,
            name: name.to_owned(),
        }
    }

    fn record(snapshots: Vec<LoggedSnapshot>) -> SnapshotLogRecord {
        SnapshotLogRecord {
            uuid: [7; 16],
            txn: 42,
            seq: 3,
            snapshots,
        }
    }

    fn invalid_err<T: std::fmt::Debug>(result: Result<T, FormatError>) {
        assert!(matches!(result, Err(FormatError::Invalid(_))), "{result:?}");
    }

    #[test]
    fn entry_layout() {
        assert_eq!(ENTRIES_AT, 48);
        assert_eq!(SNAPSHOT_ENTRY_FIXED, 42);
    }

    #[test]
    fn round_trip_and_the_most_a_block_holds() {
        let long = "v@".to_owned() + &"s".repeat(MAX_NAME_LEN - 2);
        // As many longest names as fit: (4096 - 48) / (42 + 184) = 17.
        let most = (BLOCK_SIZE - ENTRIES_AT) / (SNAPSHOT_ENTRY_FIXED + MAX_NAME_LEN);
        assert_eq!(most, 17);
        for snapshots in [
            vec![snap(1, "v@s")],
            vec![snap(1, "a@x"), snap(2, "b@x"), snap(3, "ü@ß")],
            (0..most as u64).map(|i| snap(i, &long)).collect(),
        ] {
            let r = record(snapshots);
            let block = r.encode().unwrap();
            assert_eq!(&block[6..8], &6u16.to_le_bytes(), "type 6");
            assert_eq!(SnapshotLogRecord::decode(&block).unwrap(), r);
        }
        let over: Vec<_> = (0..=most as u64).map(|i| snap(i, &long)).collect();
        assert!(!snapshots_fit_a_record(over.iter().map(|s| s.name.len())));
        invalid_err(record(over).encode());
        invalid_err(record(vec![]).encode());
        invalid_err(record(vec![snap(1, "")]).encode());
        invalid_err(record(vec![snap(1, &"x".repeat(MAX_NAME_LEN + 1))]).encode());
    }

    fn forged(block: &[u8; BLOCK_SIZE], at: usize, bytes: &[u8]) -> [u8; BLOCK_SIZE] {
        let mut b = *block;
        b[at..at + bytes.len()].copy_from_slice(bytes);
        seal(&mut b, BlockType::SnapshotLog);
        b
    }

    #[test]
    fn decode_rejects_damage_and_bad_fields() {
        let block = record(vec![snap(1, "v@a"), snap(2, "w@b")])
            .encode()
            .unwrap();
        let mut flipped = block;
        flipped[50] ^= 1;
        assert!(matches!(
            SnapshotLogRecord::decode(&flipped),
            Err(FormatError::BadChecksum { .. })
        ));
        let mut intent = block;
        seal(&mut intent, BlockType::IntentLog);
        assert!(matches!(
            SnapshotLogRecord::decode(&intent),
            Err(FormatError::WrongType { .. })
        ));
        assert_eq!(
            SnapshotLogRecord::decode(&[0; BLOCK_SIZE]),
            Err(FormatError::BadMagic)
        );
        invalid_err(SnapshotLogRecord::decode(&block[..BLOCK_SIZE - 1]));
        // Count 0, one entry more than written (zeros: a name of 0
        // bytes), far more.
        invalid_err(SnapshotLogRecord::decode(&forged(
            &block,
            44,
            &0u32.to_le_bytes(),
        )));
        invalid_err(SnapshotLogRecord::decode(&forged(
            &block,
            44,
            &3u32.to_le_bytes(),
        )));
        invalid_err(SnapshotLogRecord::decode(&forged(
            &block,
            44,
            &u32::MAX.to_le_bytes(),
        )));
        // A name length of 0, over the most, past the block's end.
        let name_len_at = ENTRIES_AT + 40;
        for len in [0u16, MAX_NAME_LEN as u16 + 1, u16::MAX] {
            invalid_err(SnapshotLogRecord::decode(&forged(
                &block,
                name_len_at,
                &len.to_le_bytes(),
            )));
        }
        // A name that is not UTF-8.
        invalid_err(SnapshotLogRecord::decode(&forged(
            &block,
            name_len_at + 2,
            &[0xff],
        )));
        // A byte after the last entry.
        let end = ENTRIES_AT + 2 * (SNAPSHOT_ENTRY_FIXED + 3);
        for at in [end, BLOCK_SIZE - 1] {
            invalid_err(SnapshotLogRecord::decode(&forged(&block, at, &[1])));
        }
        let mut newest = block;
        crate::seal_version(
            &mut newest,
            BlockType::SnapshotLog,
            crate::FormatVersion::NEWEST,
        );
        invalid_err(SnapshotLogRecord::decode(&newest));
        assert!(SnapshotLogRecord::decode(&block).is_ok());
    }
}
