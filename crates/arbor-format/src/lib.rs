//! arbor's on-disk format, version [`FORMAT_VERSION`]: byte layouts, checksums
//! and validation of every block type. No I/O happens here; `docs/FORMAT.md`
//! is the prose description of exactly these structures.
//!
//! Every block is [`BLOCK_SIZE`] bytes and starts with the same 16-byte
//! [`BlockHeader`]: a magic, the format version, the block type and a crc32c of
//! the whole block (computed with the checksum field taken as zero). Decoding
//! never panics: damaged bytes give a [`FormatError`].

mod damage;
mod header;
mod intent_log;
mod journal;
mod layout;
mod node;
mod origin_loss;
mod packed;
mod property;
mod qos;
mod records;
mod scrub;
mod snapshot_log;
mod spacemap;
mod sums;
mod superblock;
mod version;

pub use damage::{DamageRecord, DamagedBlock, Noted, DAMAGE_KEY, MAX_DAMAGE_ENTRIES};
pub use header::{seal, seal_version, BlockHeader, BlockType};
pub use intent_log::{log_records_to_replay, IntentLogRecord, LogReplay, LOG_RECORD_MAX_REGIONS};
pub use journal::{
    choose_area_record, decode_journal_pages, encode_journal, journal_capacity, journal_images_len,
    record_copies, AreaRecord,
};
pub use layout::{
    chunk_run_in, meta_block_in, meta_entry_in, sm_home_in, GrowPlan, Layout, Region, RegionRaw,
    MAX_GROWTHS,
};
pub use node::{
    internal_capacity, leaf_capacity, Node, NodeBody, TreeKind, Usage, MAX_LEVEL, NODE_HEADER_SIZE,
};
pub use origin_loss::{OriginLoss, ORIGIN_LOSS_KEY, ORIGIN_LOSS_LEN};
pub use packed::{
    entry_len as packed_entry_len, weight as packed_weight, MAX_PACKED_ENTRY, MIN_PACKED_ENTRY,
    PACKED_LEAF_MAX,
};
pub use property::{decode_property, encode_property, MAX_PROPERTY_BYTES, PROPERTY_HEADER_LEN};
pub use qos::{QosRecord, MAX_BURST_MS, QOS_KEY, QOS_RECORD_LEN};
pub use records::{
    split_store_key, store_key, Backing, BlockRef, CowState, DataLayout, DeviceIdentity, Guid,
    Home, Layer, MapValue, Partial, ReceiveState, StoreValue, VolumeKind, VolumeRecord,
    MAX_COW_CHUNKS, MAX_EPOCH, MAX_EXTENT_CHUNKS, MAX_NAME_LEN, MAX_PARTIAL_BLOCKS,
    MAX_PARTIAL_MIDS,
};
pub use scrub::{ScrubPhase, ScrubRecord, SCRUB_KEY, SCRUB_RECORD_LEN};
pub use snapshot_log::{
    snapshots_fit_a_record, LoggedSnapshot, SnapshotLogRecord, SNAPSHOT_ENTRY_FIXED,
};
pub use spacemap::{SmKind, SmPage, SM_ENTRIES_PER_PAGE};
pub use sums::{
    block_sum, intent_region, intent_region_range, zero_block_sum, SumsGeometry, SumsLeaf,
    SumsSlot, INTENT_REGION_BYTES, SUMS_VALUE_LEN, SUM_BLOCK, SUM_BLOCK_U64,
};
pub use superblock::{
    choose_superblock, ChosenSuperblock, CommitRecord, Superblock, DEFAULT_LOG_BLOCKS,
    MAX_LOG_BLOCKS, SUPERBLOCK_SLOTS,
};
pub use version::{AtomicFormatVersion, FormatVersion};

/// Size of every metadata block (superblock, commit record, space-map page, node).
pub const BLOCK_SIZE: usize = 4096;
/// [`BLOCK_SIZE`] as u64, for offset arithmetic.
pub const BLOCK_SIZE_U64: u64 = BLOCK_SIZE as u64;
/// The newest on-disk format version this crate reads and writes (new
/// pools get it). What each version has: [`FormatVersion`].
pub const FORMAT_VERSION: u16 = 14;
/// The oldest format version this crate still reads and writes: version 1
/// pools open and stay version 1 until upgraded on request.
pub const OLDEST_FORMAT_VERSION: u16 = 1;
/// Smallest and largest data chunk sizes a pool may use.
pub const MIN_CHUNK_SIZE: u32 = 4096;
pub const MAX_CHUNK_SIZE: u32 = 1 << 20;

/// Why a block could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    #[error("bad magic: not an arbor block")]
    BadMagic,
    #[error("unsupported format version {0} (this build reads versions {OLDEST_FORMAT_VERSION} to {FORMAT_VERSION})")]
    UnsupportedVersion(u16),
    #[error("unexpected block type {found} (expected {expected})")]
    WrongType { expected: u16, found: u16 },
    #[error("checksum mismatch (stored {stored:#010x}, computed {computed:#010x})")]
    BadChecksum { stored: u32, computed: u32 },
    #[error("misdirected block: header says block {found}, read from block {expected}")]
    Misdirected { expected: u64, found: u64 },
    #[error("stale block: written in transaction {found}, parent expects {expected}")]
    Stale { expected: u64, found: u64 },
    #[error("invalid field: {0}")]
    Invalid(String),
}

/// Reads a little-endian u64 at `at`; `bytes` must hold 8 bytes there (callers
/// index within fixed-size blocks whose layout guarantees it).
fn get_u64(bytes: &[u8], at: usize) -> u64 {
    let mut raw = [0u8; 8];
    raw.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(raw)
}

fn put_u64(bytes: &mut [u8], at: usize, value: u64) {
    bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
}
