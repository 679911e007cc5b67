//! The superblock (pool geometry, written once at creation, two identical
//! copies) and the commit record (one per transaction, alternating between
//! two journal areas; the newest valid one is the pool's current state).

use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout};

use crate::header::{self, BlockType, HEADER_SIZE};
use crate::layout::{RegionRaw, MAX_GROWTHS};
use crate::records::BlockRef;
use crate::{
    FormatError, FormatVersion, BLOCK_SIZE, BLOCK_SIZE_U64, MAX_CHUNK_SIZE, MIN_CHUNK_SIZE,
};

/// Blocks 0 and 1 hold the two superblock copies.
pub const SUPERBLOCK_SLOTS: u64 = 2;

/// The blocks of the intent log area a pool created at version 13 gets
/// (FORMAT.md §1, §6.4.1): records appended between two commits.
pub const DEFAULT_LOG_BLOCKS: u64 = 64;

/// The most blocks an intent log area may have; a reader rejects a
/// superblock whose `log_blocks` is larger (FORMAT.md §3).
pub const MAX_LOG_BLOCKS: u64 = 1024;

/// Pool geometry. Every region is a whole number of blocks; the data region
/// starts chunk-aligned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct Superblock {
    pub uuid: [u8; 16],
    pub pool_bytes: U64,
    pub created_unix_secs: U64,
    pub chunk_size: U32,
    /// Space-map page images per journal area (the per-transaction cap).
    pub journal_pages: U32,
    /// Block numbers of the two journal areas (commit record + page images each).
    pub journal_start: [U64; 2],
    /// First block of the metadata space map's home pages.
    pub meta_sm_start: U64,
    /// First block of the data space map's home pages.
    pub data_sm_start: U64,
    /// First metadata-node block and how many there are.
    pub meta_start: U64,
    pub meta_blocks: U64,
    /// Byte offset of data chunk 0 and how many chunks there are.
    pub data_start_bytes: U64,
    pub data_chunks: U64,
    /// First block of the intent log area (version 13, FORMAT.md §6.4.1),
    /// between journal area B and the metadata space map; 0 when there is
    /// no log (`log_blocks` 0).
    pub log_start: U64,
    /// Blocks of the intent log area, at most [`MAX_LOG_BLOCKS`]; 0 = no
    /// log (every pool before version 13, and an upgraded one).
    pub log_blocks: U64,
}

/// What one transaction committed: the roots of the pool's trees and the
/// counters, plus how many space-map page images follow it in its journal area.
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct CommitRecord {
    pub uuid: [u8; 16],
    pub txn: U64,
    pub page_count: U32,
    /// crc32c over the concatenated page images that follow this record.
    pub pages_crc: U32,
    pub volumes_root: BlockRefRaw,
    pub queue_root: BlockRefRaw,
    pub next_volume_id: U64,
    pub next_queue_seq: U64,
    pub meta_used: U64,
    pub data_used: U64,
    pub meta_cursor: U64,
    pub data_cursor: U64,
    pub commit_unix_secs: U64,
    /// Regions added by online growth, in order (version 2; see
    /// [`crate::Layout`]). A version 1 record has none.
    pub grown_count: U32,
    pub reserved: U32,
    pub grown: [RegionRaw; MAX_GROWTHS],
    /// The data checksum tree's root (version 10; zeros before).
    pub sums_root: BlockRefRaw,
    /// The root of the set of regions written in place (version 10;
    /// zeros before).
    pub intents_root: BlockRefRaw,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct BlockRefRaw {
    pub block: U64,
    pub txn: U64,
}

impl From<BlockRef> for BlockRefRaw {
    fn from(r: BlockRef) -> Self {
        Self {
            block: U64::new(r.block),
            txn: U64::new(r.txn),
        }
    }
}

impl From<BlockRefRaw> for BlockRef {
    fn from(r: BlockRefRaw) -> Self {
        BlockRef {
            block: r.block.get(),
            txn: r.txn.get(),
        }
    }
}

fn encode_body<T: IntoBytes + Immutable>(
    body: &T,
    block_type: BlockType,
    version: FormatVersion,
) -> [u8; BLOCK_SIZE] {
    let mut block = [0u8; BLOCK_SIZE];
    let bytes = body.as_bytes();
    block[HEADER_SIZE..HEADER_SIZE + bytes.len()].copy_from_slice(bytes);
    header::seal_version(&mut block, block_type, version);
    block
}

/// The body of a verified block, and the block's format version.
fn decode_body<T: FromBytes + KnownLayout + Immutable + Copy>(
    block: &[u8],
    block_type: BlockType,
) -> Result<(T, FormatVersion), FormatError> {
    let version = header::verify_version(block, block_type)?;
    T::read_from_prefix(&block[HEADER_SIZE..])
        .map(|(body, _)| (body, version))
        .map_err(|_| FormatError::Invalid("block too short for its body".into()))
}

impl Superblock {
    pub fn new_zeroed_geometry() -> Self {
        Self::new_zeroed()
    }

    /// The superblock of a pool of format `version` (the version is the
    /// pool's: a version 1 pool keeps writing version 1 superblocks). A
    /// version without an intent log has `log_start` and `log_blocks` 0.
    pub fn encode(&self, version: FormatVersion) -> Result<[u8; BLOCK_SIZE], FormatError> {
        self.check_log(version)?;
        Ok(encode_body(self, BlockType::Superblock, version))
    }

    /// Decodes and validates a superblock against the size of its device.
    pub fn decode(block: &[u8], device_bytes: u64) -> Result<Self, FormatError> {
        Self::decode_versioned(block, device_bytes).map(|(sb, _)| sb)
    }

    /// [`Self::decode`], with the pool's format version.
    pub fn decode_versioned(
        block: &[u8],
        device_bytes: u64,
    ) -> Result<(Self, FormatVersion), FormatError> {
        let (sb, version): (Self, FormatVersion) = decode_body(block, BlockType::Superblock)?;
        sb.check_log(version)?;
        sb.validate(device_bytes)?;
        Ok((sb, version))
    }

    /// The intent log area, (first block, blocks), or None when the pool
    /// has none (FORMAT.md §6.4.1).
    pub fn log_area(&self) -> Option<(u64, u64)> {
        match self.log_blocks.get() {
            0 => None,
            blocks => Some((self.log_start.get(), blocks)),
        }
    }

    /// A version without an intent log has none: its bytes at 120 ..= 135
    /// are zero (FORMAT.md §3).
    fn check_log(&self, version: FormatVersion) -> Result<(), FormatError> {
        if !version.has_intent_log() && (self.log_start.get() != 0 || self.log_blocks.get() != 0) {
            return Err(FormatError::Invalid(format!(
                "superblock: version {version} has no intent log, yet names one"
            )));
        }
        Ok(())
    }

    /// Checks that the regions are ordered, disjoint and inside the device, so
    /// that no later offset computation can overflow or escape the pool.
    /// The intent log area, if any, lies between journal area B and the
    /// metadata space map and has at most [`MAX_LOG_BLOCKS`] blocks.
    pub fn validate(&self, device_bytes: u64) -> Result<(), FormatError> {
        let invalid = |what: &str| Err(FormatError::Invalid(format!("superblock: {what}")));
        let chunk = self.chunk_size.get();
        if !chunk.is_power_of_two() || !(MIN_CHUNK_SIZE..=MAX_CHUNK_SIZE).contains(&chunk) {
            return invalid("chunk size is not a power of two between 4 KiB and 1 MiB");
        }
        if self.pool_bytes.get() > device_bytes {
            return invalid("pool is larger than its device");
        }
        if self.log_blocks.get() > MAX_LOG_BLOCKS {
            return invalid(&format!(
                "intent log area is larger than {MAX_LOG_BLOCKS} blocks"
            ));
        }
        if self.log_blocks.get() == 0 && self.log_start.get() != 0 {
            return invalid("intent log area of no blocks has a start");
        }
        let journal_blocks = u64::from(self.journal_pages.get()) + 1;
        // The log area takes its place in the order only when there is one.
        let regions = [
            Some((self.journal_start[0].get(), journal_blocks)),
            Some((self.journal_start[1].get(), journal_blocks)),
            self.log_area(),
            Some((self.meta_sm_start.get(), self.meta_sm_pages())),
            Some((self.data_sm_start.get(), self.data_sm_pages())),
            Some((self.meta_start.get(), self.meta_blocks.get())),
        ];
        let mut next_free = SUPERBLOCK_SLOTS;
        for (start, len) in regions.into_iter().flatten() {
            let Some(end) = start.checked_add(len) else {
                return invalid("region end overflows");
            };
            if start < next_free {
                return invalid("regions overlap or are out of order");
            }
            next_free = end;
        }
        let Some(metadata_end) = next_free.checked_mul(BLOCK_SIZE_U64) else {
            return invalid("metadata end overflows");
        };
        let data_start = self.data_start_bytes.get();
        if data_start < metadata_end || !data_start.is_multiple_of(u64::from(chunk)) {
            return invalid("data region overlaps metadata or is not chunk aligned");
        }
        let data_end = self
            .data_chunks
            .get()
            .checked_mul(u64::from(chunk))
            .and_then(|len| len.checked_add(data_start));
        match data_end {
            Some(end) if end <= self.pool_bytes.get() => Ok(()),
            _ => invalid("data region extends past the pool"),
        }
    }

    pub fn meta_sm_pages(&self) -> u64 {
        self.meta_blocks
            .get()
            .div_ceil(crate::SM_ENTRIES_PER_PAGE as u64)
    }

    pub fn data_sm_pages(&self) -> u64 {
        self.data_chunks
            .get()
            .div_ceil(crate::SM_ENTRIES_PER_PAGE as u64)
    }
}

impl CommitRecord {
    pub fn new_zeroed_record() -> Self {
        Self::new_zeroed()
    }

    /// The record as a pool of format `version` writes it. Version 1 has
    /// no grown regions.
    pub fn encode(&self, version: FormatVersion) -> Result<[u8; BLOCK_SIZE], FormatError> {
        self.check_regions(version)?;
        Ok(encode_body(self, BlockType::Commit, version))
    }

    pub fn decode(block: &[u8]) -> Result<Self, FormatError> {
        Self::decode_versioned(block).map(|(record, _)| record)
    }

    /// [`Self::decode`], with the record's format version. The grown
    /// regions are checked against the superblock by
    /// [`crate::Layout::from_record`].
    pub fn decode_versioned(block: &[u8]) -> Result<(Self, FormatVersion), FormatError> {
        let (record, version): (Self, FormatVersion) = decode_body(block, BlockType::Commit)?;
        record.check_regions(version)?;
        Ok((record, version))
    }

    fn check_regions(&self, version: FormatVersion) -> Result<(), FormatError> {
        let count = self.grown_count.get();
        if !version.has_grown_regions() && count != 0 {
            return Err(FormatError::Invalid(format!(
                "commit record: version {version} names {count} grown regions"
            )));
        }
        if count as usize > MAX_GROWTHS {
            return Err(FormatError::Invalid(format!(
                "commit record: {count} grown regions, at most {MAX_GROWTHS}"
            )));
        }
        Ok(())
    }
}

/// The superblock a pool opens with, chosen from its copies by
/// [`choose_superblock`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChosenSuperblock {
    pub superblock: Superblock,
    pub version: FormatVersion,
    /// The chosen copy's block as read.
    pub block: Vec<u8>,
    /// Slots whose copy does not verify or differs from the chosen one:
    /// rewrite them with `block` (docs/FORMAT.md §1).
    pub damaged_copies: Vec<u64>,
}

/// Chooses the superblock from its copies (`copies[i]` is slot `i`), sans
/// I/O: the copy of the newest version among those that verify, the first
/// of them on a tie. Copies differ only in their version: an upgrade
/// writes them one at a time, so a power cut, a torn or a lost write
/// leaves one copy older (or damaged) while commits of the newer version
/// may follow. The last copy's error when none verifies.
pub fn choose_superblock(
    copies: &[Vec<u8>],
    device_bytes: u64,
) -> Result<ChosenSuperblock, FormatError> {
    let mut chosen: Option<(Superblock, FormatVersion, usize)> = None;
    let mut last_error = FormatError::BadMagic;
    for (slot, block) in copies.iter().enumerate() {
        match Superblock::decode_versioned(block, device_bytes) {
            Ok((sb, version)) => {
                let newer = chosen
                    .as_ref()
                    .is_none_or(|(_, best, _)| version.number() > best.number());
                if newer {
                    chosen = Some((sb, version, slot));
                }
            }
            Err(e) => last_error = e,
        }
    }
    let (superblock, version, slot) = chosen.ok_or(last_error)?;
    let block = copies[slot].clone();
    let damaged_copies = (0..copies.len())
        .filter(|&i| copies[i] != block)
        .map(|i| i as u64)
        .collect();
    Ok(ChosenSuperblock {
        superblock,
        version,
        block,
        damaged_copies,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_superblock_is_the_newest_copy_that_verifies() {
        let sb = geometry();
        let (old, new) = (
            sb.encode(v(8)).unwrap().to_vec(),
            sb.encode(v(9)).unwrap().to_vec(),
        );
        let bytes = 64 << 20;
        let chosen = choose_superblock(&[new.clone(), new.clone()], bytes).unwrap();
        assert_eq!((chosen.version, chosen.damaged_copies), (v(9), vec![]));
        // A lost write of either copy during an upgrade.
        for copies in [[old.clone(), new.clone()], [new.clone(), old.clone()]] {
            let chosen = choose_superblock(&copies, bytes).unwrap();
            assert_eq!(chosen.version, v(9));
            assert_eq!(chosen.block, new);
            let stale = copies.iter().position(|c| *c == old).unwrap() as u64;
            assert_eq!(chosen.damaged_copies, vec![stale]);
        }
        // A flipped bit or a zeroed copy.
        let mut flipped = new.clone();
        flipped[300] ^= 1;
        for bad in [flipped, vec![0u8; BLOCK_SIZE]] {
            let chosen = choose_superblock(&[bad.clone(), new.clone()], bytes).unwrap();
            assert_eq!((chosen.superblock, chosen.damaged_copies), (sb, vec![0]));
            let chosen = choose_superblock(&[new.clone(), bad], bytes).unwrap();
            assert_eq!(chosen.damaged_copies, vec![1]);
        }
        let zero = vec![0u8; BLOCK_SIZE];
        assert_eq!(
            choose_superblock(&[zero.clone(), zero], bytes),
            Err(FormatError::BadMagic)
        );
    }

    fn v(number: u16) -> FormatVersion {
        FormatVersion::new(number).unwrap()
    }

    fn geometry() -> Superblock {
        let mut sb = Superblock::new_zeroed_geometry();
        sb.uuid = [9; 16];
        sb.pool_bytes = U64::new(64 << 20);
        sb.chunk_size = U32::new(65536);
        sb.journal_pages = U32::new(8);
        sb.journal_start = [U64::new(2), U64::new(11)];
        sb.meta_sm_start = U64::new(20);
        sb.data_sm_start = U64::new(21);
        sb.meta_start = U64::new(22);
        sb.meta_blocks = U64::new(100);
        sb.data_start_bytes = U64::new(2 << 20);
        sb.data_chunks = U64::new(900);
        sb
    }

    #[test]
    fn superblock_round_trip() {
        let sb = geometry();
        for version in FormatVersion::all() {
            let block = sb.encode(version).unwrap();
            let decoded = Superblock::decode_versioned(&block, 64 << 20).unwrap();
            assert_eq!(decoded, (sb, version));
        }
        let mut newer = sb.encode(FormatVersion::NEWEST).unwrap();
        newer[4..6].copy_from_slice(&(crate::FORMAT_VERSION + 1).to_le_bytes());
        assert_eq!(
            Superblock::decode_versioned(&newer, 64 << 20),
            Err(FormatError::UnsupportedVersion(crate::FORMAT_VERSION + 1))
        );
    }

    #[test]
    fn superblock_rejects_escaping_regions() {
        let mut sb = geometry();
        sb.data_chunks = U64::new(u64::MAX / 2);
        assert!(Superblock::decode(&sb.encode(v(2)).unwrap(), 64 << 20).is_err());
        let mut sb = geometry();
        sb.meta_start = U64::new(3);
        assert!(Superblock::decode(&sb.encode(v(2)).unwrap(), 64 << 20).is_err());
        assert!(Superblock::decode(&geometry().encode(v(2)).unwrap(), 1 << 20).is_err());
    }

    /// [`geometry`] with an intent log area of 64 blocks between journal
    /// area B (11 ..= 19) and the metadata space map (moved to 84).
    fn geometry_with_log() -> Superblock {
        let mut sb = geometry();
        sb.log_start = U64::new(20);
        sb.log_blocks = U64::new(DEFAULT_LOG_BLOCKS);
        sb.meta_sm_start = U64::new(84);
        sb.data_sm_start = U64::new(85);
        sb.meta_start = U64::new(86);
        sb
    }

    #[test]
    fn the_log_area_is_placed_between_journal_b_and_the_meta_space_map() {
        let bytes = 64 << 20;
        let sb = geometry_with_log();
        let block = sb.encode(v(13)).unwrap();
        assert_eq!(
            Superblock::decode_versioned(&block, bytes).unwrap(),
            (sb, v(13))
        );
        assert_eq!(sb.log_area(), Some((20, 64)));
        // No log: a version 13 superblock of an upgraded pool.
        let none = geometry();
        assert_eq!(none.log_area(), None);
        assert!(Superblock::decode(&none.encode(v(13)).unwrap(), bytes).is_ok());

        let rejected = |sb: Superblock| {
            assert!(
                Superblock::decode(&sb.encode(v(13)).unwrap(), bytes).is_err(),
                "{sb:?}"
            );
        };
        // Overlapping journal area B, or before it.
        let mut bad = sb;
        bad.log_start = U64::new(19);
        rejected(bad);
        bad.log_start = U64::new(2);
        rejected(bad);
        // Overlapping the metadata space map.
        let mut bad = sb;
        bad.log_blocks = U64::new(65);
        rejected(bad);
        // After the metadata space map (out of order), past the device,
        // its end overflowing.
        let mut bad = sb;
        bad.log_start = U64::new(200);
        bad.log_blocks = U64::new(8);
        rejected(bad);
        bad.log_start = U64::new(bytes / BLOCK_SIZE_U64);
        rejected(bad);
        bad.log_start = U64::new(u64::MAX - 4);
        rejected(bad);
        // A start without blocks.
        let mut bad = geometry();
        bad.log_start = U64::new(20);
        rejected(bad);
        // At most MAX_LOG_BLOCKS, even with room for more.
        let mut big = sb;
        big.log_blocks = U64::new(MAX_LOG_BLOCKS);
        big.meta_sm_start = U64::new(20 + MAX_LOG_BLOCKS + 1);
        big.data_sm_start = U64::new(20 + MAX_LOG_BLOCKS + 2);
        big.meta_start = U64::new(20 + MAX_LOG_BLOCKS + 3);
        big.data_start_bytes = U64::new(8 << 20);
        big.data_chunks = U64::new(896);
        assert!(Superblock::decode(&big.encode(v(13)).unwrap(), bytes).is_ok());
        big.log_blocks = U64::new(MAX_LOG_BLOCKS + 1);
        rejected(big);
    }

    #[test]
    fn only_version_13_superblocks_name_a_log_area() {
        let sb = geometry_with_log();
        for version in FormatVersion::all() {
            assert_eq!(
                sb.encode(version).is_ok(),
                version.has_intent_log(),
                "version {version}"
            );
        }
        // A version 12 header over a superblock that names a log area.
        let mut forged = sb.encode(v(13)).unwrap();
        crate::seal_version(&mut forged, BlockType::Superblock, v(12));
        assert!(Superblock::decode(&forged, 64 << 20).is_err());
        // Either field alone.
        let mut start = geometry();
        start.log_start = U64::new(20);
        let mut blocks = geometry();
        blocks.log_blocks = U64::new(1);
        for sb in [start, blocks] {
            assert!(sb.encode(v(12)).is_err());
            let mut forged = sb.encode(v(13)).unwrap();
            crate::seal_version(&mut forged, BlockType::Superblock, v(12));
            assert!(Superblock::decode(&forged, 64 << 20).is_err());
        }
    }

    #[test]
    fn commit_round_trip() {
        let mut c = CommitRecord::new_zeroed_record();
        c.txn = U64::new(77);
        c.volumes_root = BlockRef { block: 5, txn: 76 }.into();
        let decoded = CommitRecord::decode(&c.encode(v(1)).unwrap()).unwrap();
        assert_eq!(decoded, c);
        assert_eq!(BlockRef::from(decoded.volumes_root).block, 5);
    }

    #[test]
    fn only_version_2_records_name_grown_regions() {
        let mut c = CommitRecord::new_zeroed_record();
        c.grown_count = U32::new(1);
        assert!(c.encode(v(1)).is_err());
        let block = c.encode(v(2)).unwrap();
        assert_eq!(CommitRecord::decode_versioned(&block).unwrap().1, v(2));
        // A version 1 header over a record that names regions is rejected.
        let mut forged = block;
        forged[4..6].copy_from_slice(&1u16.to_le_bytes());
        crate::seal_version(&mut forged, BlockType::Commit, v(1));
        assert!(CommitRecord::decode(&forged).is_err());
        c.grown_count = U32::new(MAX_GROWTHS as u32 + 1);
        assert!(c.encode(v(2)).is_err());
    }
}
