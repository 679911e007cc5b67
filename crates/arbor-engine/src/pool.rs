//! The public face of the engine: a pool of thin volumes.
//!
//! `Pool` composes parts that own their state, each in its own module,
//! with private fields: the operations (`impl Pool` here and in the files
//! under `pool/`) reach a part only through its methods.
//! * the transaction: `meta` (the [`Volumes`] under an RwLock) over the
//!   `store`;
//! * the committer (`pool/committer.rs`): the commit lock, group commit,
//!   the failed state, the commit observer and the page images a check
//!   needs kept;
//! * the write path's locks (`pool/gates.rs`): the pool gate, the volume
//!   gates and the stripes; its counters (`pool/counters.rs`);
//! * copy-on-write origins (`pool/origins.rs`): the devices served, their
//!   origin stripes, the lock of homes being built, their stores' sweeps
//!   and losses;
//! * the checker (`pool/checker.rs`), one check at a time;
//! * growth's lock (`grow_lock`, `pool/grow.rs`) and the fill sweep
//!   (`pool/fill_sweep.rs`, run by `pool/fill.rs`).
//!
//! Concurrency (see docs/ARCHITECTURE.md):
//! * `meta` (RwLock) guards the transaction state. Lookups take it shared,
//!   mutations exclusive; no device I/O of a commit happens while it is held.
//! * the pool gate (RwLock) separates I/O from the start of a commit: every
//!   read and write holds it shared for its whole duration; a commit holds
//!   it exclusive only to freeze the transaction (phase A). So a commit
//!   never sees a half-done write, and a chunk freed in a transaction
//!   (reusable only after that transaction's commit is durable) is never
//!   reallocated while a reader that looked it up before the freeze is
//!   still reading it.
//! * the commit lock runs one commit at a time; its writes and flushes
//!   (phase B) hold no other lock, so I/O goes on while the device syncs.
//!   Management operations hold it to commit before they return, except
//!   snapshots and clones with [`Durability::Deferred`], which take only
//!   their sources' volume gates and `meta` (`manage_deferred`).
//! * the volume gates (RwLocks, one per volume id modulo their number)
//!   separate a volume's writes from a snapshot of it that does not commit:
//!   a write unit holds its volume's gate shared (inside the pool gate,
//!   shared) from before its plan to the end of its writes in place, or
//!   only through its plan if it writes nothing in place; a deferred
//!   snapshot holds its sources' exclusive. So it waits for the plans and
//!   in-place writes of the volumes it snapshots, never for their
//!   redirected writes or for other volumes' I/O, and no I/O waits for it
//!   but the writes of those volumes.
//! * the stripes serialise writes to the same (volume, chunk), so two
//!   partial writes to one chunk never race on its copy-on-write.
//!
//! * the origin stripes serialise a copy-on-write volume's writes of a
//!   chunk with each other and with reads of that chunk through its epochs
//!   (`pool/origin.rs`).
//!
//! Lock order: (homes being built →) (a copy-on-write home's `busy` →)
//! origin stripe → commit lock → pool gate → volume gate → stripe → meta.
//! The check lock (held across a check) and the growth lock (across a
//! growth's device work) are taken with none of these held, and never
//! together. Reclaim only tries the lock of homes being built, so it may
//! run under any of them. The committer's group-commit mutex is held with
//! nothing under it but `meta` (to read what is durable). The fill sweep's
//! lock and the committer's failure mutex are leaves: taken under any of
//! them, nothing under them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use arbor_format::{
    BlockRef, CommitRecord, DataLayout, FormatVersion, Layout, Region, SmKind, SmPage, Superblock,
    VolumeKind, BLOCK_SIZE, BLOCK_SIZE_U64, MAX_CHUNK_SIZE, MIN_CHUNK_SIZE, SM_ENTRIES_PER_PAGE,
    SUPERBLOCK_SLOTS,
};
use arbor_io::BlockDevice;
use rand::RngCore;
use tracing::warn;
use zerocopy::little_endian::{U32, U64};

use crate::error::{
    Conflict, Error, Fault, Invalid, OriginUnavailable, Refusal, Resource, Result, Unsupported,
};
use crate::mapping::Mapping;
use crate::meta::{recover, CommitJob, Meta, Privilege, Recovered, Resume};
use crate::names::{
    check_existing_volume_name, check_hold_tag, check_volume_name, split_snapshot_name,
};
use crate::store::{Geometry, Store};
use crate::sums::ReadSums;
use crate::volumes::Volumes;
use crate::volumes::WriteEnd;

/// Most snapshots one [`Pool::snapshot_group`] takes.
pub const MAX_GROUP_SNAPSHOT: usize = 256;

mod checker;
mod committer;
mod counters;
mod crypt;
mod damage;
mod fill;
mod fill_sweep;
mod gates;
mod grow;
mod heal;
mod home_sums;
#[cfg(test)]
mod intent_log_tests;
#[cfg(test)]
mod intents_tests;
#[cfg(test)]
mod names_tests;
mod origin;
mod origin_loss;
mod origins;
#[cfg(test)]
mod partial_tests;
mod props;
mod receive;
mod recompute;
mod scrub;
mod snapshot_log;
#[cfg(test)]
mod snapshot_log_tests;

pub use scrub::ScrubStep;
mod write;

use checker::Checker;
use committer::Committer;
use counters::WriteCounters;
pub use crypt::NewKeySlot;
use fill_sweep::FillSweep;
use gates::Gates;
pub use grow::{GrowOptions, GrowReport};
pub use heal::Healed;
pub use origin::OriginInfo;
use origins::Origins;
pub use props::MAX_PROPERTY_KEY;
pub use receive::{hex as guid_hex, ReceiveStart, ReceiveStatus, ReceiveTarget};
use write::{Fill, Unit};

/// When a snapshot or clone is durable ([`Pool::snapshot_with`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Durability {
    /// Before the call returns: the call commits the pool (its metadata
    /// writes and two device flushes), so it waits for every change made
    /// since the last commit.
    #[default]
    Committed,
    /// At the pool's next commit: a client's flush, any management
    /// operation that commits, a full transaction, or the daemon's commit
    /// interval. The call changes memory only and waits for no device. A
    /// power cut before that commit loses the new volume whole, never part
    /// of it: after a crash it is either absent or exactly what it was when
    /// the call returned (docs/ARCHITECTURE.md). A snapshot of a
    /// copy-on-write volume, which needs its device flushed first, is
    /// taken [`Durability::Committed`] whatever is asked.
    Deferred,
}

/// The smallest unit of I/O: offsets and lengths must be multiples of it.
pub const SECTOR: u64 = 512;
/// Largest volume size (1 EiB): keeps every byte-offset computation far from overflow.
pub const MAX_VOLUME_SIZE: u64 = 1 << 60;
/// Default chunk size; see docs/FORMAT.md ("Choosing the chunk size").
pub const DEFAULT_CHUNK_SIZE: u32 = 16 * 1024;
const DEFAULT_JOURNAL_PAGES: u32 = 1024;
/// A transaction's largest single step must fit a journal with room to spare.
const MIN_JOURNAL_PAGES: u32 = 16;
const MAX_JOURNAL_PAGES: u32 = 1 << 16;

/// How to lay out a new pool.
#[derive(Debug, Clone)]
pub struct CreateOptions {
    /// Data chunk size: a power of two from 4 KiB to 1 MiB.
    pub chunk_size: u32,
    /// Bytes of metadata-node space; default 1/64 of the device (at least
    /// 128 bytes per data chunk and 64 MiB, at most 1/8 of the device, never
    /// below 8 MiB). Fixed at creation.
    pub metadata_bytes: Option<u64>,
    /// Space-map page images one transaction may journal (default 1024,
    /// at least 16): the bound on how many space-map pages a commit changes.
    /// Small values make tests of scattered layouts cheap.
    pub journal_pages: Option<u32>,
    /// On-disk format version: the newest by default; an older one only
    /// for pools that older arbor releases must still open.
    pub format_version: FormatVersion,
    /// Blocks of the intent log area, for a version that has one
    /// ([`FormatVersion::has_intent_log`]): how many listings of regions
    /// for writes in place one transaction takes without committing
    /// (default [`arbor_format::DEFAULT_LOG_BLOCKS`], at most
    /// [`arbor_format::MAX_LOG_BLOCKS`]; 0: none). Small values make tests
    /// of a full log cheap.
    pub intent_log_blocks: Option<u64>,
}

impl Default for CreateOptions {
    fn default() -> Self {
        Self {
            chunk_size: DEFAULT_CHUNK_SIZE,
            metadata_bytes: None,
            journal_pages: None,
            format_version: FormatVersion::NEWEST,
            intent_log_blocks: None,
        }
    }
}

/// How to run an opened pool.
#[derive(Debug, Clone)]
pub struct OpenOptions {
    /// Bytes of clean metadata (nodes + space-map pages) kept in memory.
    pub cache_bytes: usize,
    /// Dirty nodes after which a transaction is committed on its own.
    pub dirty_node_limit: usize,
}

impl Default for OpenOptions {
    fn default() -> Self {
        Self {
            cache_bytes: 64 << 20,
            dirty_node_limit: 8192,
        }
    }
}

/// A volume's id: stable for its lifetime, never reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VolumeId(pub u64);

/// What a listing shows about one volume or snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeInfo {
    pub id: VolumeId,
    pub name: String,
    pub snapshot: bool,
    pub size: u64,
    /// The volume a snapshot was taken of, or the snapshot a clone came from.
    pub parent: Option<VolumeId>,
    pub created_txn: u64,
    /// Whether its creation is durable: false only for a snapshot or clone
    /// taken with [`Durability::Deferred`] before the next commit (until
    /// then a power cut loses it).
    pub durable: bool,
    pub created_unix_secs: u64,
    pub mapped_bytes: u64,
    /// Identity, kept by send and receive (None in a pool whose volume
    /// table predates identities).
    pub guid: Option<arbor_format::Guid>,
    /// How it keeps its data.
    pub layout: VolumeLayout,
    /// The key slot its data is encrypted with (FORMAT.md §6.6); None: in
    /// the clear.
    pub key_slot: Option<u64>,
}

/// How a volume keeps its data (docs/ARCHITECTURE.md, "Copy-on-write
/// volumes").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VolumeLayout {
    /// Redirect-on-write in the pool (the default).
    Row,
    /// Redirect-on-write, reading through epoch `epoch` of copy-on-write
    /// volume `origin` where it maps nothing: a snapshot of that volume, a
    /// clone of one, or a snapshot of such a clone.
    ReadsThrough { origin: VolumeId, epoch: u64 },
    /// Copy-on-write: data in place on an external device, snapshots'
    /// copies in the pool (`store_bytes`); `epoch` is its newest snapshot's.
    CowExternal { store_bytes: u64, epoch: u64 },
    /// Copy-on-write with its data in a contiguous, preallocated run of
    /// the pool (`--layout cow`); otherwise as `CowExternal`.
    CowInPool { store_bytes: u64, epoch: u64 },
}

/// Space accounting of one volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VolumeStats {
    pub logical_bytes: u64,
    pub mapped_bytes: u64,
    /// Bytes only this volume references: what deleting it frees.
    pub exclusive_bytes: u64,
    /// Mapped bytes also referenced by another volume or snapshot.
    pub shared_bytes: u64,
}

impl VolumeStats {
    /// Stats of a volume whose space is unknown (destroyed meanwhile).
    pub fn unknown(logical_bytes: u64) -> Self {
        Self {
            logical_bytes,
            mapped_bytes: 0,
            exclusive_bytes: 0,
            shared_bytes: 0,
        }
    }
}

/// Space accounting of the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolStats {
    pub pool_bytes: u64,
    pub chunk_size: u64,
    pub data_bytes: u64,
    pub data_used_bytes: u64,
    pub metadata_bytes: u64,
    pub metadata_used_bytes: u64,
    pub volumes: u64,
    pub snapshots: u64,
    /// True while deleted volumes still await reclaim.
    pub reclaim_pending: bool,
    /// True while a sweep for partial extents to fill (FORMAT.md §6.3)
    /// has not finished: space that only partials hold (their bases) may
    /// still come back (`Pool::fill_partials`).
    pub fill_pending: bool,
    /// Last committed transaction.
    pub txn: u64,
    /// Writes since the pool was opened that did not fit an empty
    /// transaction's journal and ran in pieces, atomic as a whole
    /// (`pool/write.rs`).
    pub split_units: u64,
    /// Records appended to the intent log since the pool was opened:
    /// listings of regions for writes in place that took no commit
    /// (`crate::intents`; pools created at version 13).
    pub intent_log_records: u64,
    /// Snapshots taken since the pool was opened that a snapshot record
    /// of the intent log made durable instead of a commit (version 14,
    /// `Pool::snapshot`).
    pub logged_snapshots: u64,
    /// How writes landed in the chunks they touched, since the pool was
    /// opened: what snapshots cost the data path.
    pub chunk_writes: ChunkWrites,
    /// Regions of data space (16 MiB each) listed as written in place
    /// (FORMAT.md §6.4): what an unclean shutdown now would make the next
    /// open re-read to recompute their checksums. 0 after a clean close.
    pub in_place_regions: u64,
}

/// Chunk writes since the pool was opened, one for each chunk a write
/// (or a discard that zeroes) touched, by how it landed (`pool/write.rs`).
/// Only the `*_copied` ones read the device before writing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChunkWrites {
    /// Overwritten where it was: mapped by the volume alone.
    pub in_place: u64,
    /// Blocks added to a partial extent the volume alone references.
    pub extended: u64,
    /// A new chunk that needs nothing of the old one: the write covers
    /// the chunk, or nothing was mapped there.
    pub redirected: u64,
    /// A new chunk with the rest of the old one copied around the write.
    pub redirected_copied: u64,
    /// A new partial extent over a chunk mapped whole: nothing copied.
    pub partial: u64,
    /// A new partial extent that read old contents first: blocks the
    /// write touches only in part, or a layer folded into its chunk (a
    /// version 7 pool, or more middle layers than a partial has).
    pub partial_copied: u64,
    /// A new partial extent in front of an older one that the volume
    /// could not change in place (a snapshot shares it), whose layers keep
    /// the blocks the write leaves: nothing copied.
    pub partial_over: u64,
}

/// The kinds of [`ChunkWrites`], in its field order: the indices of the
/// pool's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ChunkWrite {
    InPlace,
    Extended,
    Redirected,
    RedirectedCopied,
    Partial,
    PartialCopied,
    PartialOver,
}

impl std::ops::AddAssign for ChunkWrites {
    fn add_assign(&mut self, o: Self) {
        let (a, b) = (self.named(), o.named());
        *self = Self::from_counts(std::array::from_fn(|i| a[i].1 + b[i].1));
    }
}

impl ChunkWrites {
    pub(crate) const KINDS: usize = 7;

    fn from_counts(c: [u64; Self::KINDS]) -> Self {
        use ChunkWrite as K;
        Self {
            in_place: c[K::InPlace as usize],
            extended: c[K::Extended as usize],
            redirected: c[K::Redirected as usize],
            redirected_copied: c[K::RedirectedCopied as usize],
            partial: c[K::Partial as usize],
            partial_copied: c[K::PartialCopied as usize],
            partial_over: c[K::PartialOver as usize],
        }
    }

    /// Every count, with its name (for metrics and reports), in the order
    /// of [`ChunkWrite`].
    pub fn named(&self) -> [(&'static str, u64); Self::KINDS] {
        [
            ("in_place", self.in_place),
            ("extended", self.extended),
            ("redirected", self.redirected),
            ("redirected_copied", self.redirected_copied),
            ("partial", self.partial),
            ("partial_copied", self.partial_copied),
            ("partial_over", self.partial_over),
        ]
    }
}

/// A byte range and whether it is mapped (reads from a chunk) or reads as zeros.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapRun {
    pub offset: u64,
    pub len: u64,
    pub mapped: bool,
}

/// Bytes of the copies only one epoch reads, by epoch, of one copy-on-write
/// volume ([`Volumes::copies_by_sole_epoch`]).
type SoleCopies = Arc<HashMap<u64, u64>>;

pub struct Pool {
    store: Arc<Store>,
    meta: RwLock<Volumes>,
    committer: Committer,
    gates: Gates,
    counters: WriteCounters,
    origins: Origins,
    /// One growth or upgrade at a time (held across a growth's device
    /// work, which the commit lock is not).
    grow_lock: Mutex<()>,
    /// The sweep for partial extents to fill (`pool/fill.rs`).
    fill: FillSweep,
    checker: Checker,
    /// What opening repaired (damaged superblock or commit record copies,
    /// space maps rebuilt): `check` lists it as warnings.
    repaired_at_open: Vec<String>,
    /// Damaged data blocks found (`pool/damage.rs`).
    damage_log: damage::DamageLog,
    /// Home runs built since the pool opened that await their sums
    /// (`pool/home_sums.rs`).
    home_sums: home_sums::HomeSums,
    /// One set or removal of a property at a time (`pool/props.rs`): a
    /// set stages its value and installs it in two steps, and a second
    /// set of the key between them would replace the first's staged
    /// record.
    property_change: Mutex<()>,
    /// Volumes whose contents are not all there yet (a restore that serves
    /// while it fills, `Pool::set_incomplete`), with why: what would copy
    /// or move them (a snapshot, a rename, a resize) is refused.
    incomplete: Mutex<HashMap<u64, String>>,
    /// The ciphers of encrypted volumes' key slots loaded (`pool/crypt.rs`).
    keyring: crypt::Keyring,
}

/// Told the duration of every commit's device work (writing the journal and
/// home pages, and their flushes), for metrics.
pub type CommitObserver = Box<dyn Fn(Duration) + Send + Sync>;

/// What a write needs to know of its volume (`Pool::check_write`).
struct WriteTarget {
    layout: arbor_format::DataLayout,
    backing: Option<arbor_format::Backing>,
    /// An encrypted volume's cipher (its key is loaded, or the check fails).
    cipher: Option<Arc<arbor_crypt::VolumeCipher>>,
}

/// One contiguous piece of a read: `len` bytes from `source`.
#[derive(Clone, Copy)]
struct Piece {
    len: u64,
    source: Source,
}

/// Reads a copy-on-write volume's device at a byte offset.
type ReadOrigin<'a> = dyn Fn(&mut [u8], u64) -> Result<()> + 'a;

/// Where a piece of a read comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Zeros,
    /// The pool's device, at this byte offset.
    Pool(u64),
    /// A copy-on-write volume's device, at this byte offset (a read
    /// through one of its epochs).
    Origin(u64),
}

impl Source {
    /// `self` continues into `next` after `len` bytes.
    fn continues(self, len: u64, next: Source) -> bool {
        match (self, next) {
            (Source::Zeros, Source::Zeros) => true,
            (Source::Pool(a), Source::Pool(b)) | (Source::Origin(a), Source::Origin(b)) => {
                a + len == b
            }
            _ => false,
        }
    }
}

/// Pushes `piece` onto `pieces`, merged with the last one if it continues it.
fn push_piece(pieces: &mut Vec<Piece>, piece: Piece) {
    if let Some(last) = pieces.last_mut() {
        if last.source.continues(last.len, piece.source) {
            last.len += piece.len;
            return;
        }
    }
    pieces.push(piece);
}

fn lock_mutex<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Stripe and failure mutexes guard no data whose invariants a panic could break.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A lock that guards no data, shared: a poisoned one is still a valid
/// barrier.
fn read_lock(l: &RwLock<()>) -> RwLockReadGuard<'_, ()> {
    l.read().unwrap_or_else(|p| p.into_inner())
}

/// [`read_lock`], exclusive.
fn write_lock(l: &RwLock<()>) -> RwLockWriteGuard<'_, ()> {
    l.write().unwrap_or_else(|p| p.into_inner())
}

/// [`write_lock`] without waiting: `None` while another thread holds it.
fn try_write_lock(l: &RwLock<()>) -> Option<RwLockWriteGuard<'_, ()>> {
    match l.try_write() {
        Ok(guard) => Some(guard),
        Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
    }
}

/// [`read_lock`] without waiting: `None` while another thread holds it
/// exclusive.
fn try_read_lock(l: &RwLock<()>) -> Option<RwLockReadGuard<'_, ()>> {
    match l.try_read() {
        Ok(guard) => Some(guard),
        Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
    }
}

fn layout(device_bytes: u64, opts: &CreateOptions) -> Result<Superblock> {
    let chunk = opts.chunk_size;
    if !chunk.is_power_of_two() || !(MIN_CHUNK_SIZE..=MAX_CHUNK_SIZE).contains(&chunk) {
        return Err(Invalid::ChunkSize(chunk).into());
    }
    let chunk64 = u64::from(chunk);
    let chunk_guess = device_bytes / chunk64;
    let meta_blocks = match opts.metadata_bytes {
        Some(bytes) => bytes / BLOCK_SIZE_U64,
        // 1/64 of the device (and at least 128 bytes per chunk, enough for a
        // fully fragmented map) leaves room for snapshots: each snapshot whose
        // volume then diverges in scattered places pins one 4 KiB leaf per
        // place. The 64 MiB floor serves small pools with many snapshots;
        // no more than 1/8 of a small device goes to metadata.
        None => (device_bytes / BLOCK_SIZE_U64 / 64)
            .max(chunk_guess / 32)
            .max(16 * 1024)
            .min(device_bytes / BLOCK_SIZE_U64 / 8)
            .max(2048),
    };
    if meta_blocks < 256 {
        return Err(Invalid::MetadataTooSmall.into());
    }
    let per_page = SM_ENTRIES_PER_PAGE as u64;
    let journal_pages32 = opts.journal_pages.unwrap_or(DEFAULT_JOURNAL_PAGES);
    if !(MIN_JOURNAL_PAGES..=MAX_JOURNAL_PAGES).contains(&journal_pages32) {
        return Err(Invalid::JournalPages {
            pages: journal_pages32,
            min: MIN_JOURNAL_PAGES,
            max: MAX_JOURNAL_PAGES,
        }
        .into());
    }
    let journal_pages = u64::from(journal_pages32);
    let journal_a = SUPERBLOCK_SLOTS;
    let journal_b = journal_a + journal_pages + 1;
    // Pools created at version 13 get an intent log area (FORMAT.md §1).
    let log_start = journal_b + journal_pages + 1;
    let log_blocks = if opts.format_version.has_intent_log() {
        opts.intent_log_blocks
            .unwrap_or(arbor_format::DEFAULT_LOG_BLOCKS)
            .min(arbor_format::MAX_LOG_BLOCKS)
    } else {
        0
    };
    let meta_sm_start = log_start + log_blocks;
    let data_sm_start = meta_sm_start + meta_blocks.div_ceil(per_page);
    let meta_start = data_sm_start + chunk_guess.div_ceil(per_page).max(1);
    let meta_end_bytes = (meta_start + meta_blocks)
        .checked_mul(BLOCK_SIZE_U64)
        .ok_or(Invalid::MetadataOverflow)?;
    let data_start = meta_end_bytes.div_ceil(chunk64) * chunk64;
    let data_chunks = device_bytes.saturating_sub(data_start) / chunk64;
    if data_chunks < 16 {
        return Err(Invalid::DeviceTooSmall {
            device_bytes,
            metadata_bytes: data_start,
        }
        .into());
    }
    let mut uuid = [0u8; 16];
    rand::thread_rng().fill_bytes(&mut uuid);
    let mut sb = Superblock::new_zeroed_geometry();
    sb.uuid = uuid;
    sb.pool_bytes = U64::new(device_bytes);
    sb.created_unix_secs = U64::new(crate::meta::unix_now());
    sb.chunk_size = U32::new(chunk);
    sb.journal_pages = U32::new(journal_pages32);
    sb.journal_start = [U64::new(journal_a), U64::new(journal_b)];
    if log_blocks > 0 {
        sb.log_start = U64::new(log_start);
        sb.log_blocks = U64::new(log_blocks);
    }
    sb.meta_sm_start = U64::new(meta_sm_start);
    sb.data_sm_start = U64::new(data_sm_start);
    sb.meta_start = U64::new(meta_start);
    sb.meta_blocks = U64::new(meta_blocks);
    sb.data_start_bytes = U64::new(data_start);
    sb.data_chunks = U64::new(data_chunks);
    sb.validate(device_bytes).map_err(Invalid::Layout)?;
    Ok(sb)
}

/// What the pool's intent log holds for commit `txn` (FORMAT.md §6.4.1,
/// §6.4.2): the regions and snapshots of the records from the area's
/// first block on that verify, name `txn` and stand at their own index;
/// nothing without a log.
fn read_intent_log(store: &Store, txn: u64) -> Result<arbor_format::LogReplay> {
    let Some((start, blocks)) = store.geo.intent_log else {
        return Ok(Default::default());
    };
    // At most MAX_LOG_BLOCKS blocks (the superblock is validated).
    let mut area = vec![0u8; blocks as usize * BLOCK_SIZE];
    store.dev.read_at(&mut area, start * BLOCK_SIZE_U64)?;
    Ok(arbor_format::log_records_to_replay(
        area.chunks(BLOCK_SIZE),
        store.geo.uuid,
        txn,
        store.geo.version().has_logged_snapshots(),
    ))
}

/// Whether every snapshot of `names` may be taken without committing,
/// under the gates of `sources` ([`Pool::snapshot_sources`]): each name
/// still resolves to the volume gated (not renamed or replaced since),
/// and none is a copy-on-write volume, whose snapshot needs its device
/// flushed first.
fn gated_row_sources(m: &Volumes, names: &[String], sources: &[u64]) -> Result<bool> {
    for (name, &gated) in names.iter().zip(sources) {
        let (volume, _) = split_snapshot_name(name)?;
        if m.volume_id(volume).ok() != Some(gated)
            || matches!(m.volume(gated)?.layout, DataLayout::Cow(_))
        {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Writes freshly formatted (all-zero) space-map pages `pages` of a map
/// whose homes lie in one region (so they are contiguous), in batches.
pub(crate) fn format_space_map(dev: &dyn BlockDevice, region: &Region, kind: SmKind) -> Result<()> {
    const BATCH: u64 = 256;
    let first = region.first_page(kind);
    let end = first + region.sm_pages(kind);
    let mut index = first;
    while index < end {
        let n = BATCH.min(end - index);
        let mut buf = Vec::with_capacity(n as usize * BLOCK_SIZE);
        for i in index..index + n {
            // Page numbers fit in u32: the layout was validated.
            buf.extend_from_slice(&SmPage::empty(kind, i as u32).encode());
        }
        let home = region.sm_home(kind, index);
        dev.write_at(&buf, home * BLOCK_SIZE_U64)?;
        index += n;
    }
    Ok(())
}

/// The pool's superblock and format version, chosen from its copies
/// ([`arbor_format::choose_superblock`]: the newest copy that verifies).
pub(crate) fn choose_superblock(dev: &dyn BlockDevice) -> Result<arbor_format::ChosenSuperblock> {
    let mut copies = Vec::new();
    for slot in 0..SUPERBLOCK_SLOTS {
        if dev.size() < (slot + 1) * BLOCK_SIZE_U64 {
            break;
        }
        let mut raw = vec![0u8; BLOCK_SIZE];
        dev.read_at(&mut raw, slot * BLOCK_SIZE_U64)?;
        copies.push(raw);
    }
    match arbor_format::choose_superblock(&copies, dev.size()) {
        Ok(chosen) => Ok(chosen),
        Err(arbor_format::FormatError::BadMagic) => Err(Error::Stop(Fault::NotAPool)),
        Err(e) => Err(Error::corrupt("superblock", e)),
    }
}

/// Rewrites each damaged or stale superblock copy from the chosen one, so
/// that a later fault in the other copy is survived too, and flushes.
/// Returns one line per copy rewritten (also logged).
pub(crate) fn rewrite_superblock_copies(
    dev: &dyn BlockDevice,
    chosen: &arbor_format::ChosenSuperblock,
) -> Result<Vec<String>> {
    let mut notes = Vec::new();
    for &slot in &chosen.damaged_copies {
        dev.write_at(&chosen.block, slot * BLOCK_SIZE_U64)?;
        let note =
            format!("superblock copy {slot} was damaged or stale; rewritten from the intact copy");
        warn!("{note}");
        notes.push(note);
    }
    if !notes.is_empty() {
        dev.flush()?;
    }
    Ok(notes)
}

impl Pool {
    /// Formats `dev` as an empty pool and opens it.
    pub fn create(
        dev: Arc<dyn BlockDevice>,
        opts: &CreateOptions,
        open: &OpenOptions,
    ) -> Result<Pool> {
        let sb = layout(dev.size(), opts)?;
        let version = opts.format_version;
        let store = Arc::new(Store::new(
            Arc::clone(&dev),
            Geometry::new(&sb, version),
            open.cache_bytes / BLOCK_SIZE,
        ));
        let geo = &store.geo;
        let region0 = Layout::from_superblock(&sb).regions()[0];
        format_space_map(dev.as_ref(), &region0, SmKind::Meta)?;
        format_space_map(dev.as_ref(), &region0, SmKind::Data)?;
        for area in geo.journal_start {
            store.write_block(area, &[0u8; BLOCK_SIZE])?;
        }
        if let Some((start, blocks)) = geo.intent_log {
            // No record of an earlier pool on the device may be read as this one's.
            dev.write_zeroes(start * BLOCK_SIZE_U64, blocks * BLOCK_SIZE_U64)?;
        }
        let sb_block = sb.encode(version).map_err(Invalid::FormatVersion)?;
        for slot in 0..SUPERBLOCK_SLOTS {
            store.write_block(slot, &sb_block)?;
        }
        store.dev.flush()?;
        let mut record = CommitRecord::new_zeroed_record();
        record.uuid = geo.uuid;
        record.next_volume_id = U64::new(1);
        record.next_queue_seq = U64::new(1);
        let meta = Meta::resume(Arc::clone(&store), Resume { record }, open.dirty_node_limit)?;
        let mut volumes = Volumes::resume(meta)?;
        volumes.commit()?;
        Ok(Self::from_parts(store, volumes))
    }

    /// Opens an existing pool, recovering to its last commit.
    /// A damaged superblock or commit record copy is rewritten from the
    /// intact one; a version 9 commit whose page images are damaged has its
    /// space maps rebuilt from its trees (`repair`) and opens at that
    /// commit. Each is logged and listed by `check` until the pool closes.
    pub fn open(dev: Arc<dyn BlockDevice>, open: &OpenOptions) -> Result<Pool> {
        let chosen = choose_superblock(dev.as_ref())?;
        let mut repaired = rewrite_superblock_copies(dev.as_ref(), &chosen)?;
        // At most twice: once more after rebuilding damaged page images.
        let mut rebuilt = false;
        // Regions the intent log lists for the commit a repair replaced.
        let mut logged_before_repair = arbor_format::LogReplay::default();
        let (store, resume) = loop {
            let geo = Geometry::new(&chosen.superblock, chosen.version);
            let store = Arc::new(Store::new(
                Arc::clone(&dev),
                geo,
                open.cache_bytes / BLOCK_SIZE,
            ));
            match recover(&store)? {
                Recovered::Intact {
                    resume,
                    repaired: copies,
                } => {
                    repaired.extend(copies);
                    break (store, resume);
                }
                Recovered::ImagesDamaged { why, resume } if !rebuilt => {
                    logged_before_repair = read_intent_log(&store, resume.record.txn.get())?;
                    let report = crate::repair::repair(Arc::clone(&dev), open).map_err(|e| {
                        Error::inconsistent(format!(
                            "{why}; rebuilding the space maps from the trees failed ({e}); the pool is not opened at an older commit: see `arbor check` and `arbor repair`"
                        ))
                    })?;
                    let note = format!(
                        "{why}; the space maps were rebuilt from the trees and committed as commit {}",
                        report.txn
                    );
                    warn!("{note}");
                    repaired.push(note);
                    repaired.extend(report.actions);
                    rebuilt = true;
                }
                Recovered::ImagesDamaged { why, .. } => return Err(Error::inconsistent(why)),
            }
        };
        // The records of the commit a repair replaced come first: the
        // repair's commit holds the same volumes.
        let mut logged = logged_before_repair;
        let current = read_intent_log(&store, resume.record.txn.get())?;
        logged.regions.extend(current.regions);
        logged.regions.sort_unstable();
        logged.regions.dedup();
        logged.snapshots.extend(current.snapshots);
        let meta = Meta::resume(Arc::clone(&store), resume, open.dirty_node_limit)?;
        let mut pool = Self::from_parts(store, Volumes::resume(meta)?);
        // What to recompute: the regions the set lists at this commit and
        // those the log adds, taken before anything commits (a commit
        // evicts the regions idle in this process, all of them at open).
        let mut recompute: Vec<u64> = crate::intents::listed(pool.read_meta()?.meta())?
            .into_iter()
            .map(|(region, _)| region)
            .chain(logged.regions.iter().copied())
            .collect();
        recompute.sort_unstable();
        recompute.dedup();
        pool.repaired_at_open = repaired;
        // Copies whose last reader was destroyed before a restart.
        for (id, _) in pool.read_meta()?.cow_volumes() {
            pool.origins.sweep_from(id, 0);
        }
        if !logged.regions.is_empty() || !logged.snapshots.is_empty() {
            // Listed in the tree and the volume table (one commit) before
            // anything else commits and the log's records, naming an older
            // commit, stop counting.
            warn!(
                regions = logged.regions.len(),
                snapshots = logged.snapshots.len(),
                "the intent log lists regions written in place and snapshots taken since the last commit"
            );
            pool.manage(Privilege::Reserve, |m| {
                m.add_intents(&logged.regions)?;
                for snapshot in &logged.snapshots {
                    m.replay_snapshot(snapshot)?;
                }
                Ok(())
            })?;
        }
        pool.open_homes()?;
        pool.recompute_intents(&recompute)?;
        // An upgrade to version 3 that a power cut interrupted: finish it.
        // Failing to (no metadata space) leaves a pool that works but
        // cannot receive until it is done.
        if let Err(e) = pool.convert_table() {
            if e.stops_pool() {
                return Err(e);
            }
            warn!(error = %e, "could not give volumes identities yet; receives are refused until `arbor pool upgrade` succeeds");
        }
        Ok(pool)
    }

    fn from_parts(store: Arc<Store>, volumes: Volumes) -> Self {
        Self {
            store,
            meta: RwLock::new(volumes),
            committer: Committer::default(),
            gates: Gates::default(),
            counters: WriteCounters::default(),
            origins: Origins::default(),
            grow_lock: Mutex::new(()),
            fill: FillSweep::default(),
            checker: Checker::default(),
            repaired_at_open: Vec::new(),
            damage_log: damage::DamageLog::default(),
            home_sums: home_sums::HomeSums::default(),
            property_change: Mutex::new(()),
            incomplete: Mutex::new(HashMap::new()),
            keyring: Default::default(),
        }
    }

    /// Installs the function told about every later commit. There is one
    /// observer per pool: returns false (and drops `observer`) if one is set.
    pub fn observe_commits(&self, observer: CommitObserver) -> bool {
        self.committer.observe(observer)
    }

    /// Commits and closes the pool: a clean shutdown, after which the
    /// in-place intent set is empty (nothing to recompute at the next open).
    pub fn close(self) -> Result<()> {
        {
            let _commit = self.committer.lock();
            let _gate = self.gates.commit();
            let mut meta = self.write_meta()?;
            self.mutate(&mut meta, Privilege::Reserve, |m| {
                m.evict_intents(std::time::Duration::ZERO)
            })?;
        }
        self.flush()
    }

    pub fn chunk_size(&self) -> u64 {
        self.store.geo.chunk_size
    }

    /// Byte offset of the data region on the device: everything below it is
    /// metadata (used by tools and benchmarks that treat the two apart).
    pub fn data_region_offset(&self) -> u64 {
        self.store.geo.first_data_bytes()
    }

    // ---- locking -----------------------------------------------------------

    fn read_meta(&self) -> Result<RwLockReadGuard<'_, Volumes>> {
        self.committer.check_failed()?;
        self.meta
            .read()
            .map_err(|_| Error::failed("a thread panicked while changing metadata"))
    }

    fn write_meta(&self) -> Result<RwLockWriteGuard<'_, Volumes>> {
        self.committer.check_failed()?;
        self.meta
            .write()
            .map_err(|_| Error::failed("a thread panicked while changing metadata"))
    }

    /// Runs a metadata mutation. Errors that mean the in-memory state can no
    /// longer be trusted (I/O, corruption, broken invariants) stop the pool;
    /// precondition errors (not found, no space...) are raised before any
    /// change and leave it running.
    fn mutate<T>(
        &self,
        meta: &mut Volumes,
        privilege: Privilege,
        f: impl FnOnce(&mut Volumes) -> Result<T>,
    ) -> Result<T> {
        let result = meta.atomic(privilege, f);
        if let Err(e) = &result {
            if e.stops_pool() {
                self.committer.fail(e);
            }
        }
        result
    }

    /// A management operation: exclusive, atomic, and durable when it
    /// returns. Operations that free space (delete, rollback, shrink) run
    /// with `Privilege::Reserve`, so they work when metadata is full; those
    /// that take space must leave the reserve alone.
    fn manage<T>(
        &self,
        privilege: Privilege,
        mut f: impl FnMut(&mut Volumes) -> Result<T>,
    ) -> Result<T> {
        let _commit = self.committer.lock();
        let mut committed = false;
        loop {
            let (value, job) = {
                let _gate = self.gates.commit();
                let mut meta = self.write_meta()?;
                // The operation's records are stored in its own step, with
                // its privilege: an operation that may not use the reserve
                // must not make the commit use it either.
                let step = |m: &mut Volumes| {
                    let value = f(m)?;
                    m.store_table()?;
                    Ok(value)
                };
                match self.mutate(&mut meta, privilege, step) {
                    // Commit what is there and run the operation alone.
                    Err(Error::Exhausted(Resource::Journal)) if !committed => {
                        committed = true;
                        (None, self.freeze(&mut meta)?)
                    }
                    Err(e) => return Err(e),
                    Ok(value) => (Some(value), self.freeze(&mut meta)?),
                }
            };
            if let Some(job) = job {
                self.complete_commit(job)?;
            }
            if let Some(value) = value {
                return Ok(value);
            }
        }
    }

    /// A management operation made durable by the next commit
    /// ([`Durability::Deferred`]): one atomic step of the open transaction,
    /// under the gates of the writable volumes it reads, `sources` (so no
    /// write of theirs is half done in it), and `meta`, without
    /// `commit_lock` or the pool gate exclusive: it waits neither for a
    /// commit in flight, nor for the device, nor for other volumes' I/O.
    /// `f` must check that each volume it reads is one of `sources` (their
    /// names were resolved before the gates were taken). `Ok(None)` when it
    /// must run as a committed operation instead: `f` said so (before
    /// changing anything), or the open transaction has no room left for it.
    fn manage_deferred<T>(
        &self,
        privilege: Privilege,
        sources: &[u64],
        f: impl FnOnce(&mut Volumes) -> Result<Option<T>>,
    ) -> Result<Option<T>> {
        let _gate = self.gates.io();
        let _sources = self.gates.volumes_exclusive(sources);
        let mut meta = self.write_meta()?;
        let step = |m: &mut Volumes| {
            let value = f(m)?;
            if value.is_some() {
                m.store_table()?;
            }
            Ok(value)
        };
        match self.mutate(&mut meta, privilege, step) {
            Err(Error::Exhausted(Resource::Journal)) => Ok(None),
            Ok(Some(value)) => {
                meta.note_unlogged_change();
                Ok(Some(value))
            }
            other => other,
        }
    }

    /// Phase A of a commit (caller holds `commit_lock`, the gate and `meta`):
    /// `None` when the transaction has no changes.
    fn freeze(&self, meta: &mut Volumes) -> Result<Option<CommitJob>> {
        // No unit is in flight (the caller holds the gate): regions idle in
        // the in-place intent set may leave it with this commit.
        // And the sums of chunks this transaction freed go (left, they
        // only take space until the chunks are allocated again).
        let tidy = meta.atomic(Privilege::Reserve, |m| {
            m.evict_intents(crate::intents::IDLE)?;
            m.forget_freed_sums()
        });
        if let Err(e) = tidy {
            if e.stops_pool() {
                self.committer.fail(&e);
                return Err(e);
            }
            warn!(error = %e, "could not tidy the in-place intent set and the sums of freed chunks before a commit");
        }
        if !meta.has_changes() {
            return Ok(None);
        }
        // Not through `mutate`: phase A is not a step of an operation (it
        // undoes itself when it cannot store the volume records).
        match meta.begin_commit() {
            Ok(job) => Ok(Some(job)),
            Err(e) => {
                if e.stops_pool() {
                    self.committer.fail(&e);
                }
                Err(e)
            }
        }
    }

    /// Phases B and C (caller holds `commit_lock`).
    fn complete_commit(&self, job: CommitJob) -> Result<()> {
        let started = self.committer.write(&self.store, &job)?;
        self.write_meta()?.finish_commit(job);
        self.committer.observed(started);
        Ok(())
    }

    /// Makes every completed write durable (commits the transaction, and
    /// flushes the devices of copy-on-write volumes written since). Costs
    /// nothing when nothing was written since the last flush.
    pub fn flush(&self) -> Result<()> {
        self.commit_open()?;
        let flushed = self.flush_origins();
        self.after_origin_error(flushed)
    }

    /// Commits the open transaction.
    fn commit_open(&self) -> Result<()> {
        self.commit_locked(u64::MAX)
    }

    /// Makes the changes of transaction `txn` durable, as a group commit:
    /// one caller at a time (the leader) commits the open transaction for
    /// every caller whose changes it holds, while the others wait for it
    /// to finish, not for the commit lock; each then returns if that
    /// commit, or any other since, covered its transaction, or leads the
    /// next one. (Queued on the commit lock instead, callers whose changes
    /// were durable already waited for each commit begun meanwhile.)
    fn commit_through(&self, txn: u64) -> Result<()> {
        self.committer.group(
            txn,
            || Ok(self.read_meta()?.meta().durable_txn()),
            || self.commit_locked(txn),
        )
    }

    /// Makes the regions a write found missing from the in-place intent
    /// set (added to it in transaction `txn`) durable enough for it to go
    /// in place: by a record of the intent log if the pool has one with
    /// room ([`Self::append_intent_log`]), else by committing through
    /// `txn`.
    fn list_through(&self, txn: u64) -> Result<()> {
        if self.append_intent_log(txn)? {
            return Ok(());
        }
        self.commit_through(txn)
    }

    /// Appends to the intent log, made durable alone, the regions added to
    /// the set since the last durable commit that no record lists yet
    /// (`crate::intents`, FORMAT.md §6.4.1), under the commit lock: no
    /// commit is in flight, so the next one to land lists them in the
    /// tree. True when the regions of transaction `txn` are durable (by
    /// this record, an earlier one or a commit meanwhile); false when the
    /// pool has no log or no room left in it for this generation (the
    /// caller commits).
    fn append_intent_log(&self, txn: u64) -> Result<bool> {
        let Some((start, blocks)) = self.store.geo.intent_log else {
            return Ok(false);
        };
        self.committer.check_failed()?;
        let _commit = self.committer.lock();
        let (durable, regions, first) = {
            let meta = self.read_meta()?;
            let meta = meta.meta();
            // Stable under the commit lock: no other commit can begin.
            let durable = meta.durable_txn();
            if durable >= txn {
                return Ok(true);
            }
            (
                durable,
                crate::intents::to_log(meta)?,
                meta.intent_log.next(),
            )
        };
        if regions.is_empty() {
            // Logged by another writer since this one asked.
            return Ok(true);
        }
        let records: Vec<&[u64]> = regions
            .chunks(arbor_format::LOG_RECORD_MAX_REGIONS)
            .collect();
        let Some(end) = first
            .checked_add(records.len() as u64)
            .filter(|&end| end <= blocks)
        else {
            return Ok(false);
        };
        for (seq, listed) in (first..end).zip(records) {
            let record = arbor_format::IntentLogRecord {
                uuid: self.store.geo.uuid,
                txn: durable,
                // Below `blocks`, which the superblock bounds (MAX_LOG_BLOCKS).
                seq: seq as u32,
                regions: listed.to_vec(),
            };
            let block = record
                .encode()
                .map_err(|e| Error::inconsistent(format!("an intent log record: {e}")))?;
            // Inside the pool: the superblock's layout was validated.
            self.store
                .dev
                .write_durable_at(&block, (start + seq) * BLOCK_SIZE_U64)?;
        }
        self.write_meta()?.note_intent_log(&regions, end);
        self.counters.intent_log_records_added(end - first);
        Ok(true)
    }

    /// Commits the open transaction, unless a commit since `txn` was open
    /// made its changes durable already.
    fn commit_locked(&self, txn: u64) -> Result<()> {
        let _commit = self.committer.lock();
        // Stable under the commit lock: no other commit can begin.
        if self.read_meta()?.meta().durable_txn() >= txn {
            return Ok(());
        }
        let job = {
            let _gate = self.gates.commit();
            let mut meta = self.write_meta()?;
            self.freeze(&mut meta)?
        };
        // Every data write changes metadata in its own transaction (a new
        // mapping, or the generation refresh that precedes an in-place
        // write), and each commit flushed the data written before it. So a
        // transaction without changes means nothing to make durable.
        match job {
            Some(job) => self.complete_commit(job),
            None => Ok(()),
        }
    }

    /// After a write found no space: reclaims deleted volumes' space if any
    /// awaits, and commits when that may help (entries freed since the last
    /// commit, or an open state that differs from the durable one). Returns
    /// whether anything was done, i.e. whether trying again may succeed.
    fn make_room(&self) -> Result<bool> {
        /// Queue entries reclaimed per attempt (bounded, like a reclaim call).
        const RECLAIM_NODES: usize = 4096;
        let (pending, helps) = {
            let meta = self.read_meta()?;
            (
                meta.reclaim_pending(),
                meta.meta().awaiting_commit() || !meta.matches_durable(),
            )
        };
        if pending && self.reclaim(RECLAIM_NODES)? > 0 {
            return Ok(true);
        }
        // Bases that partial extents alone hold (a fill commits).
        if self.fill_wanted() && self.fill_partials(RECLAIM_NODES)? > 0 {
            return Ok(true);
        }
        if helps {
            self.commit_open()?;
        }
        Ok(helps)
    }

    fn commit_if_needed(&self) -> Result<()> {
        if self.read_meta()?.meta().needs_commit() {
            self.commit_open()?;
        }
        Ok(())
    }

    // ---- volumes ---------------------------------------------------------------

    /// Creates an empty thin volume of `size` bytes (a multiple of 512).
    pub fn create_volume(&self, name: &str, size: u64) -> Result<VolumeId> {
        check_volume_name(name)?;
        check_size(size)?;
        self.manage(Privilege::Normal, |m| {
            m.ensure_name_free(name)?;
            Ok(VolumeId(m.add_volume(
                name.to_owned(),
                VolumeKind::Volume,
                size,
                BlockRef::NONE,
                0,
                0,
            )))
        })
    }

    /// Takes a read-only snapshot `volume@snap` of a volume, in O(1),
    /// durable when it returns.
    pub fn snapshot(&self, name: &str) -> Result<VolumeId> {
        self.snapshot_with(name, Durability::Committed)
    }

    /// [`Pool::snapshot`], durable as `durability` says.
    pub fn snapshot_with(&self, name: &str, durability: Durability) -> Result<VolumeId> {
        self.snapshot_group_with(&[name.to_owned()], durability)?
            .pop()
            .ok_or_else(|| Error::inconsistent("a one-snapshot group took no snapshot"))
    }

    /// Takes snapshots of several volumes in one commit (a consistency
    /// group, as `zfs snapshot -r` or `rbd group snap`): every name is
    /// `volume@snap` of a distinct writable volume, and either all the
    /// snapshots exist afterwards, at one transaction, or none does. At
    /// most [`MAX_GROUP_SNAPSHOT`] names. Returns their ids, in order.
    /// Durable when it returns.
    pub fn snapshot_group(&self, names: &[String]) -> Result<Vec<VolumeId>> {
        self.snapshot_group_with(names, Durability::Committed)
    }

    /// [`Pool::snapshot_group`], durable as `durability` says.
    pub fn snapshot_group_with(
        &self,
        names: &[String],
        durability: Durability,
    ) -> Result<Vec<VolumeId>> {
        if names.is_empty() || names.len() > MAX_GROUP_SNAPSHOT {
            return Err(Invalid::GroupSize {
                max: MAX_GROUP_SNAPSHOT,
                given: names.len(),
            }
            .into());
        }
        let mut volumes = std::collections::HashSet::new();
        for name in names {
            let (volume, _) = split_snapshot_name(name)?;
            if !volumes.insert(volume) {
                return Err(Invalid::NamedTwice(volume.to_string()).into());
            }
        }
        let take = |m: &mut Volumes| {
            let mut ids = Vec::with_capacity(names.len());
            for name in names {
                let (volume, _) = split_snapshot_name(name)?;
                m.ensure_name_free(name)?;
                let source = m.volume_id(volume)?;
                m.writable_volume(source)?;
                self.check_complete(source, volume)?;
                ids.push(VolumeId(m.share_volume(
                    source,
                    name.clone(),
                    VolumeKind::Snapshot,
                )?));
            }
            Ok(ids)
        };
        if durability == Durability::Deferred {
            // The sources, resolved before their gates are taken; a name
            // that does not resolve gets its error from the committed path.
            if let Some(sources) = self.snapshot_sources(names)? {
                let deferred = self.manage_deferred(Privilege::Normal, &sources, |m| {
                    if !gated_row_sources(m, names, &sources)? {
                        return Ok(None);
                    }
                    take(m).map(Some)
                })?;
                if let Some(ids) = deferred {
                    return Ok(ids);
                }
            }
        }
        if let Some(ids) = self.log_snapshots(names, take)? {
            return Ok(ids);
        }
        // A snapshot of a copy-on-write volume reads its device where
        // nothing was copied: what was written to it before must be
        // durable before the snapshot is.
        self.flush_origins()?;
        self.manage(Privilege::Normal, take)
    }

    /// The volumes a group of snapshots `names` reads, resolved before
    /// their gates are taken (a snapshot taken without committing holds
    /// them exclusive); `None` when a name does not resolve (the committed
    /// path reports it).
    fn snapshot_sources(&self, names: &[String]) -> Result<Option<Vec<u64>>> {
        let meta = self.read_meta()?;
        Ok(names
            .iter()
            .map(|name| split_snapshot_name(name).and_then(|(v, _)| meta.volume_id(v)))
            .collect::<Result<Vec<u64>>>()
            .ok())
    }

    /// Marks a volume as not all there yet (`Some(why)`, in words that
    /// finish "NAME is ...") or as whole again (`None`). Until it is whole
    /// its snapshots, renames and resizes are refused with
    /// `Conflict::Incomplete`: a snapshot would keep holes where its data
    /// has yet to arrive. Not persistent: whoever fills the volume marks it
    /// again after a restart, before it serves.
    pub fn set_incomplete(&self, id: VolumeId, why: Option<String>) {
        let mut incomplete = self.incomplete.lock().unwrap_or_else(|p| p.into_inner());
        match why {
            Some(why) => incomplete.insert(id.0, why),
            None => incomplete.remove(&id.0),
        };
    }

    fn check_complete(&self, id: u64, name: &str) -> Result<()> {
        let incomplete = self.incomplete.lock().unwrap_or_else(|p| p.into_inner());
        match incomplete.get(&id) {
            Some(why) => Err(Conflict::Incomplete {
                name: name.to_owned(),
                why: why.clone(),
            }
            .into()),
            None => Ok(()),
        }
    }

    /// Creates a writable volume `new_name` from a snapshot, in O(1),
    /// durable when it returns.
    pub fn clone_snapshot(&self, snapshot: &str, new_name: &str) -> Result<VolumeId> {
        self.clone_snapshot_with(snapshot, new_name, Durability::Committed)
    }

    /// [`Pool::clone_snapshot`], durable as `durability` says.
    pub fn clone_snapshot_with(
        &self,
        snapshot: &str,
        new_name: &str,
        durability: Durability,
    ) -> Result<VolumeId> {
        check_volume_name(new_name)?;
        let make = |m: &mut Volumes| {
            m.ensure_name_free(new_name)?;
            let source = m.volume_id(snapshot)?;
            if m.volume(source)?.kind != VolumeKind::Snapshot {
                return Err(Invalid::CloneOfVolume(snapshot.to_owned()).into());
            }
            m.share_volume(source, new_name.to_owned(), VolumeKind::Volume)
                .map(VolumeId)
        };
        if durability == Durability::Deferred {
            // A snapshot has no writes to wait for: no gate.
            if let Some(id) = self.manage_deferred(Privilege::Normal, &[], |m| make(m).map(Some))? {
                return Ok(id);
            }
        }
        self.manage(Privilege::Normal, make)
    }

    /// Deletes a volume or snapshot at once; its space is reclaimed in the
    /// background. Snapshots and clones of it keep their data.
    /// A held snapshot is refused ([`Refusal::Conflict`]): see
    /// [`Pool::delete_forced`].
    pub fn delete(&self, name: &str) -> Result<()> {
        self.delete_forced(name, false)
    }

    /// [`Pool::delete`]; with `force`, a held snapshot is deleted too (its
    /// holds are released).
    pub fn delete_forced(&self, name: &str, force: bool) -> Result<()> {
        let (layout, backing) = {
            let meta = self.read_meta()?;
            let rec = meta.volume(meta.volume_id(name)?)?;
            (rec.layout, rec.backing)
        };
        if let arbor_format::DataLayout::Cow(arbor_format::CowState {
            home: arbor_format::Home::External(_),
            ..
        }) = layout
        {
            // Its data is its device's: destroying it is detaching it.
            return self.detach_origin(name);
        }
        let id = self.manage(Privilege::Reserve, |m| {
            let id = m.volume_id(name)?;
            m.delete_checked(id, force).map(|()| id)
        })?;
        // A copy-on-write volume's home in the pool is served no more.
        self.origins.remove(id);
        if let Some(backing) = backing {
            // Copies only this record's epoch read can go now.
            self.origins.sweep_from(backing.origin, 0);
        }
        Ok(())
    }

    /// Holds snapshot `name` with `tag`: it cannot be destroyed without
    /// force until every hold is released. Returns false if `tag` already
    /// held it.
    pub fn hold(&self, name: &str, tag: &str) -> Result<bool> {
        check_hold_tag(tag).map_err(|e| match e {
            Error::Refused(Refusal::InvalidName { reason, .. }) => Invalid::HoldTag {
                tag: tag.to_owned(),
                reason,
            }
            .into(),
            other => other,
        })?;
        self.manage(Privilege::Normal, |m| {
            let id = m.volume_id(name)?;
            m.add_hold(id, tag)
        })
    }

    /// Releases hold `tag` on snapshot `name`. Returns false if it had none.
    pub fn release(&self, name: &str, tag: &str) -> Result<bool> {
        self.manage(Privilege::Reserve, |m| {
            let id = m.volume_id(name)?;
            m.release_hold(id, tag)
        })
    }

    /// The tags holding snapshot `id`.
    pub fn holds(&self, id: VolumeId) -> Result<Vec<String>> {
        let meta = self.read_meta()?;
        meta.visible_volume(id.0)?;
        Ok(meta.holds(id.0))
    }

    /// Makes `volume` read exactly as its snapshot `snapshot` (any of its
    /// snapshots, not only the newest); all snapshots are kept.
    pub fn rollback(&self, volume: &str, snapshot: &str) -> Result<()> {
        let cow = {
            let meta = self.read_meta()?;
            let id = meta.volume_id(volume)?;
            match meta.volume(id)?.layout {
                arbor_format::DataLayout::Cow(_) => {
                    let snap = meta.volume(meta.volume_id(snapshot)?)?;
                    match snap.backing {
                        Some(b) if snap.kind == VolumeKind::Snapshot && b.origin == id => {
                            Some((id, b.epoch))
                        }
                        _ => {
                            return Err(Invalid::NotSnapshotOf {
                                snapshot: snapshot.to_owned(),
                                volume: volume.to_owned(),
                            }
                            .into())
                        }
                    }
                }
                arbor_format::DataLayout::Row => None,
            }
        };
        if let Some((id, epoch)) = cow {
            let rolled = self.cow_rollback(id, epoch);
            return self.after_damage(rolled);
        }
        self.manage(Privilege::Reserve, |m| {
            let id = m.volume_id(volume)?;
            m.writable_volume(id)?;
            let snap = m.volume_id(snapshot)?;
            let rec = m.volume(snap)?;
            if rec.kind != VolumeKind::Snapshot
                || rec.parent != id
                || rec.backing != m.volume(id)?.backing
            {
                return Err(Invalid::NotSnapshotOf {
                    snapshot: snapshot.to_owned(),
                    volume: volume.to_owned(),
                }
                .into());
            }
            m.rollback_volume(id, snap)
        })
    }

    /// Renames a volume (its snapshots follow: `old@s` becomes `new@s`) or a
    /// snapshot (within the same volume).
    pub fn rename(&self, from: &str, to: &str) -> Result<()> {
        self.manage(Privilege::Normal, |m| {
            m.ensure_name_free(to)?;
            let id = m.volume_id(from)?;
            self.check_complete(id, from)?;
            match m.volume(id)?.kind {
                VolumeKind::Volume => {
                    check_volume_name(to)?;
                    let prefix = format!("{from}@");
                    let snapshots: Vec<(u64, String)> = m
                        .table()
                        .iter()
                        .filter(|(_, r)| {
                            r.kind == VolumeKind::Snapshot
                                && r.parent == id
                                && r.name.starts_with(&prefix)
                        })
                        .map(|(sid, r)| (sid, format!("{to}@{}", &r.name[prefix.len()..])))
                        .collect();
                    for (_, new_name) in &snapshots {
                        split_snapshot_name(new_name)?;
                        m.ensure_name_free(new_name)?;
                    }
                    m.rename_volume(id, to.to_owned())?;
                    for (sid, new_name) in snapshots {
                        m.rename_volume(sid, new_name)?;
                    }
                    Ok(())
                }
                VolumeKind::Snapshot => {
                    let (from_vol, _) = split_snapshot_name(from)?;
                    let (to_vol, _) = split_snapshot_name(to)?;
                    if from_vol != to_vol {
                        return Err(Invalid::SnapshotRename.into());
                    }
                    m.rename_volume(id, to.to_owned())
                }
                VolumeKind::Receiving | VolumeKind::Hold | VolumeKind::Property => {
                    Err(Error::not_found(from.to_owned()))
                }
            }
        })
    }

    /// Grows or shrinks a volume, atomically. Shrinking unmaps the chunks
    /// past the new end; growing again reads zeros there.
    ///
    /// Bytes past a volume's size inside its last chunk are not part of it
    /// and may hold anything (a shrink leaves them, and a snapshot keeps its
    /// volume's last chunk whole): a grow zeroes them before they become part
    /// of the volume. A shrink sets the size under the I/O gate, and every
    /// write checks its end against the size when it is planned and mapped,
    /// so once a shrink has returned no write lands past the end.
    pub fn resize(&self, name: &str, new_size: u64) -> Result<()> {
        check_size(new_size)?;
        let cs = self.chunk_size();
        let (id, old_size) = {
            let meta = self.read_meta()?;
            let id = meta.volume_id(name)?;
            let rec = meta.writable_volume(id)?;
            self.check_complete(id, name)?;
            if let arbor_format::DataLayout::Cow(cow) = rec.layout {
                let (home, old_size) = (cow.home, rec.size_bytes);
                drop(meta);
                return self.resize_cow(id, name, home, old_size, new_size);
            }
            if rec.backing.is_some() {
                return Err(Unsupported::ResizeThroughCow(name.to_owned()).into());
            }
            if rec.key_slot.is_some() {
                // Whole chunks: no tail to zero in the clear.
                self.check_encrypted_size(new_size)?;
            }
            (id, rec.size_bytes)
        };
        if new_size > old_size {
            let tail_end = (old_size.div_ceil(cs) * cs).min(new_size);
            if tail_end > old_size {
                self.zero_tail(VolumeId(id), old_size, tail_end - old_size)?;
            }
        }
        let privilege = if new_size < old_size {
            Privilege::Reserve
        } else {
            Privilege::Normal
        };
        self.manage(privilege, |m| {
            let rec = m.writable_volume(id)?;
            if rec.size_bytes != old_size {
                return Err(Invalid::ResizedMeanwhile(name.to_owned()).into());
            }
            m.set_volume_size(id, new_size)?;
            if new_size < old_size {
                let chunk = m.meta().geo().chunk_size;
                m.unmap_chunks(id, new_size.div_ceil(chunk), old_size.div_ceil(chunk))?;
            }
            Ok(())
        })
    }

    /// Zeroes `[offset, offset + len)` past the size inside the last chunk,
    /// where mapped.
    fn zero_tail(&self, id: VolumeId, offset: u64, len: u64) -> Result<()> {
        // Inside one chunk, so a discard only zeroes it, where mapped.
        self.apply_all(Unit {
            id,
            offset,
            len,
            fill: Fill::Zeros,
            unmap: true,
            past_end: true,
            uncached: false,
            cipher: None,
            stored: false,
        })
    }

    pub fn lookup(&self, name: &str) -> Result<VolumeId> {
        self.read_meta()?.volume_id(name).map(VolumeId)
    }

    pub fn info(&self, id: VolumeId) -> Result<VolumeInfo> {
        let meta = self.read_meta()?;
        let rec = meta.visible_volume(id.0)?;
        let durable_txn = meta.meta().durable_txn();
        Ok(volume_info(id.0, rec, self.chunk_size(), durable_txn))
    }

    /// Reads, writes and write-zeroes of volumes since the pool was opened:
    /// background work (a scrub) slows down while this moves.
    pub fn requests(&self) -> u64 {
        self.counters.requests()
    }

    /// Every volume and snapshot, sorted by name.
    pub fn list(&self) -> Result<Vec<VolumeInfo>> {
        let meta = self.read_meta()?;
        let chunk = self.chunk_size();
        let durable_txn = meta.meta().durable_txn();
        let mut all: Vec<VolumeInfo> = meta
            .table()
            .iter()
            .filter(|(_, r)| crate::volumes::is_visible(r))
            .map(|(id, r)| volume_info(id, r, chunk, durable_txn))
            .collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(all)
    }

    // ---- data path ---------------------------------------------------------------

    /// Checks an I/O request against the volume (hidden receives are not
    /// found).
    fn check_io(meta: &Volumes, id: VolumeId, offset: u64, len: u64, write: bool) -> Result<()> {
        let rec = meta.visible_volume(id.0)?;
        if write && rec.kind == VolumeKind::Snapshot {
            return Err(Error::read_only(rec.name.clone()));
        }
        Self::check_range(rec, offset, len)
    }

    /// Fails unless `[offset, offset + len)` is inside the volume. Any byte
    /// offset and length will do: a write that covers part of a sector is
    /// a read-modify-write of its chunk, under the same rules as any
    /// partial-chunk write (copied whole to a new chunk when shared, else
    /// written in place).
    fn check_range(rec: &arbor_format::VolumeRecord, offset: u64, len: u64) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= rec.size_bytes => Ok(()),
            _ => Err(Invalid::RangeBeyondEnd {
                offset,
                len,
                name: rec.name.clone(),
                size: rec.size_bytes,
            }
            .into()),
        }
    }

    /// Splits `[offset, offset + len)` into mapped and unmapped pieces.
    fn resolve(meta: &Volumes, id: VolumeId, offset: u64, len: u64) -> Result<Vec<Piece>> {
        let geo = meta.meta().geo();
        let cs = geo.chunk_size;
        let root = meta.volume(id.0)?.root;
        let end = offset + len;
        let mut pos = offset;
        let mut pieces: Vec<Piece> = Vec::new();
        let mut push = |piece: Piece| push_piece(&mut pieces, piece);
        Mapping::new(meta.meta(), root).extents(offset / cs, end.div_ceil(cs), &mut |e| {
            let lo = (e.start * cs).max(pos);
            let hi = (e.end() * cs).min(end);
            if lo > pos {
                push(Piece {
                    len: lo - pos,
                    source: Source::Zeros,
                });
            }
            if e.partial.is_some() {
                // One chunk, read from two by its mask.
                let at = e.start * cs;
                for (run, from) in e.at(e.start).runs(cs) {
                    let (a, b) = ((at + run.start).max(lo), (at + run.end).min(hi));
                    if a < b {
                        push(Piece {
                            len: b - a,
                            source: Source::Pool(geo.chunk_offset(from) + (a - at)),
                        });
                    }
                }
                pos = pos.max(hi);
                return Ok(pos < end);
            }
            // An extent's chunks are contiguous on the device within a
            // region only: a piece ends where the region does.
            let mut lo = lo;
            while lo < hi {
                let (device, run) = geo.chunk_run(e.pchunk + (lo / cs - e.start));
                let piece = (run * cs - lo % cs).min(hi - lo);
                push(Piece {
                    len: piece,
                    source: Source::Pool(device + lo % cs),
                });
                lo += piece;
            }
            pos = pos.max(hi);
            Ok(pos < end)
        })?;
        if pos < end {
            push(Piece {
                len: end - pos,
                source: Source::Zeros,
            });
        }
        Ok(pieces)
    }

    /// Reads the whole chunk `m` maps to into `buf` (one chunk long).
    /// Each run is verified against the sums of the chunk it comes from
    /// (the caller copies it into a new chunk with new sums: damage must
    /// not get a valid sum that way).
    pub(crate) fn read_mapped(&self, m: crate::mapping::Mapped, buf: &mut [u8]) -> Result<()> {
        let cs = self.chunk_size();
        debug_assert_eq!(buf.len() as u64, cs);
        for (run, from) in m.runs(cs) {
            let out = &mut buf[run.start as usize..run.end as usize];
            self.store
                .dev
                .read_at(out, self.store.geo.chunk_offset(from) + run.start)?;
            self.verify_chunk_part(from, run.start, out)?;
        }
        Ok(())
    }

    /// Verifies `data`, read from chunk `pchunk` at byte `at` (whole
    /// blocks), against the chunk's sums, in a pool with checksums.
    pub(crate) fn verify_chunk_part(&self, pchunk: u64, at: u64, data: &[u8]) -> Result<()> {
        if !self.store.geo.version().has_data_checksums() {
            return Ok(());
        }
        let sums = {
            let meta = self.read_meta()?;
            crate::sums::ChunkSums::of(meta.meta(), pchunk)?
        };
        debug_assert!(at.is_multiple_of(arbor_format::SUM_BLOCK_U64));
        // Below the chunk's block count (a chunk is at most 1 MiB).
        Ok(sums.verify((at / arbor_format::SUM_BLOCK_U64) as u32, data)?)
    }

    /// Reads `buf.len()` bytes at `offset`; unwritten ranges read as zeros.
    pub fn read(&self, id: VolumeId, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.read_as(id, offset, buf, false)
    }

    /// Reads the bytes encrypted volume `id` stores at `offset` as they are
    /// stored: ciphertext, verified against their checksums, whether or
    /// not its key is loaded. The range must be mapped ([`Pool::allocation_map`]):
    /// an unmapped one stores nothing (it reads as zeros undecrypted), and
    /// its zeros are no ciphertext to store elsewhere.
    pub fn read_raw(&self, id: VolumeId, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.read_as(id, offset, buf, true)
    }

    fn read_as(&self, id: VolumeId, offset: u64, buf: &mut [u8], raw: bool) -> Result<()> {
        self.counters.request();
        let len = buf.len() as u64;
        // One look at the record: a volume in the pool (the common case)
        // is resolved right there; the others go their own way.
        enum Route {
            Pool(Vec<Piece>, Option<ReadSums>),
            Home,
            Through(arbor_format::Backing),
        }
        let gate = self.gates.io();
        let (route, cipher) = {
            let meta = self.read_meta()?;
            Self::check_io(&meta, id, offset, len, false)?;
            let rec = meta.volume(id.0)?;
            let cipher = if raw {
                if rec.key_slot.is_none() {
                    return Err(Invalid::NotEncrypted(rec.name.clone()).into());
                }
                None
            } else {
                self.cipher_of(rec)?
            };
            if let Some(cipher) = &cipher {
                crypt::check_units(cipher, offset, len)?;
            }
            let route = match (rec.layout, rec.backing) {
                (arbor_format::DataLayout::Cow(_), _) => Route::Home,
                (_, Some(backing)) => Route::Through(backing),
                _ => {
                    let pieces = Self::resolve(&meta, id, offset, len)?;
                    if raw && pieces.iter().any(|p| p.source == Source::Zeros) {
                        return Err(Invalid::RawUnmapped {
                            offset,
                            len,
                            name: rec.name.clone(),
                        }
                        .into());
                    }
                    let sums = Self::read_sums(&meta, &pieces)?;
                    Route::Pool(pieces, sums)
                }
            };
            (route, cipher)
        };
        // What an encrypted volume read from the pool is decrypted, piece
        // by piece (`pool/crypt.rs`).
        let plain = |pieces: &[Piece], buf: &mut [u8]| match &cipher {
            Some(cipher) => crypt::decrypt_pieces(cipher, offset, pieces, buf),
            None => Ok(()),
        };
        // The other routes take their locks before the gate (lock order).
        match route {
            Route::Pool(pieces, None) => {
                let kept = cipher.as_ref().map(|_| pieces.clone());
                self.read_pieces(pieces, buf, None)?;
                plain(kept.as_deref().unwrap_or_default(), buf)
            }
            Route::Pool(pieces, Some(sums)) => {
                match self.read_verified(&pieces, buf, &sums, None) {
                    Ok(()) => plain(&pieces, buf),
                    // A write in place may have been between its data and its
                    // sums: read again with the volume's writers held off.
                    Err(Error::Damaged(_)) => {
                        drop(gate);
                        let read = self.read_settled(id, offset, buf);
                        let pieces = self.after_damage(read)?;
                        plain(&pieces, buf)
                    }
                    other => other,
                }
            }
            Route::Home => {
                drop(gate);
                let read = self.cow_read(id.0, offset, buf);
                self.after_origin_error(read)
            }
            Route::Through(backing) => {
                drop(gate);
                let read = self.read_through(id, backing, offset, buf);
                self.after_origin_error(read)
            }
        }
    }

    /// The sums of the pool's pieces of a read, taken under the lock that
    /// resolved them; None in a pool without checksums.
    fn read_sums(meta: &Volumes, pieces: &[Piece]) -> Result<Option<ReadSums>> {
        if !meta.meta().geo().version().has_data_checksums() {
            return Ok(None);
        }
        let mut sums = ReadSums::default();
        for piece in pieces {
            if let Source::Pool(at) = piece.source {
                sums.add_range(meta.meta(), at, piece.len)?;
            }
        }
        Ok(Some(sums))
    }

    /// A read of a volume in the pool whose data did not match its sums,
    /// again with the volume's writers of those chunks held off (a write
    /// in place changes the data and its sums under them): a mismatch now
    /// is damage. Returns the pieces it read.
    fn read_settled(&self, id: VolumeId, offset: u64, buf: &mut [u8]) -> Result<Vec<Piece>> {
        let len = buf.len() as u64;
        let cs = self.chunk_size();
        let _gate = self.gates.io();
        let _stripes = self
            .gates
            .stripes(id.0, offset / cs..(offset + len).div_ceil(cs));
        let (pieces, sums) = {
            let meta = self.read_meta()?;
            Self::check_io(&meta, id, offset, len, false)?;
            let pieces = Self::resolve(&meta, id, offset, len)?;
            let sums = Self::read_sums(&meta, &pieces)?.unwrap_or_default();
            (pieces, sums)
        };
        self.read_verified(&pieces, buf, &sums, None)?;
        Ok(pieces)
    }

    /// [`Self::read_pieces`] for a volume in the pool, each block verified
    /// against `sums`. A piece that does not start and end on a block
    /// boundary is read whole blocks into a buffer of its own, verified,
    /// and copied out.
    fn read_verified(
        &self,
        pieces: &[Piece],
        buf: &mut [u8],
        sums: &ReadSums,
        origin: Option<&ReadOrigin<'_>>,
    ) -> Result<()> {
        struct Bounce {
            at: u64,
            data: Vec<u8>,
            skip: usize,
            out: std::ops::Range<usize>,
        }
        let geo = &self.store.geo;
        let mut direct: Vec<(u64, std::ops::Range<usize>)> = Vec::new();
        let mut bounces: Vec<Bounce> = Vec::new();
        let mut pos = 0usize;
        for piece in pieces {
            let out = pos..pos + piece.len as usize;
            pos = out.end;
            match piece.source {
                Source::Pool(at) => {
                    let (first, end) = crate::sums::block_span(at, piece.len);
                    if first == at && end == at + piece.len {
                        direct.push((at, out));
                    } else {
                        bounces.push(Bounce {
                            at: first,
                            data: vec![0; (end - first) as usize],
                            skip: (at - first) as usize,
                            out,
                        });
                    }
                }
                Source::Zeros => buf[out].fill(0),
                // An origin's device: arbor did not write it, no sums.
                Source::Origin(source) => match origin {
                    Some(read) => read(&mut buf[out], source)?,
                    None => {
                        return Err(Error::inconsistent(
                            "a read through an epoch without its volume",
                        ))
                    }
                },
            }
        }
        {
            let mut batch: Vec<(u64, &mut [u8])> = Vec::with_capacity(direct.len() + bounces.len());
            let mut rest: &mut [u8] = buf;
            let mut base = 0;
            for (at, out) in &direct {
                let (_, tail) = std::mem::take(&mut rest).split_at_mut(out.start - base);
                let (mine, tail) = tail.split_at_mut(out.len());
                rest = tail;
                base = out.end;
                batch.push((*at, mine));
            }
            for b in &mut bounces {
                batch.push((b.at, &mut b.data[..]));
            }
            match batch.as_mut_slice() {
                [] => {}
                [(at, out)] => self.store.dev.read_at(out, *at)?,
                reads => self.store.dev.read_batch(reads)?,
            }
        }
        for (at, out) in &direct {
            sums.verify(geo, *at, &buf[out.clone()])?;
        }
        for b in &bounces {
            sums.verify(geo, b.at, &b.data)?;
            buf[b.out.clone()].copy_from_slice(&b.data[b.skip..b.skip + b.out.len()]);
        }
        Ok(())
    }

    /// Reads resolved pieces into `buf` (their lengths add up to its
    /// length); `origin` reads the pieces of a copy-on-write volume's device.
    fn read_pieces(
        &self,
        pieces: Vec<Piece>,
        buf: &mut [u8],
        origin: Option<&ReadOrigin<'_>>,
    ) -> Result<()> {
        // One piece of the pool's (most small reads): no batch to build.
        if let [Piece {
            source: Source::Pool(source),
            ..
        }] = pieces[..]
        {
            return Ok(self.store.dev.read_at(buf, source)?);
        }
        // The pool's pieces in one batch (with direct I/O, in flight at
        // once: PERFORMANCE.md § 10, "io_uring for batches"), the origin's
        // and the zeros in turn.
        let mut batch: Vec<(u64, &mut [u8])> = Vec::with_capacity(pieces.len());
        let mut rest = buf;
        for piece in pieces {
            let (out, tail) = std::mem::take(&mut rest).split_at_mut(piece.len as usize);
            rest = tail;
            match (piece.source, origin) {
                (Source::Pool(source), _) => batch.push((source, out)),
                (Source::Origin(source), Some(read)) => read(out, source)?,
                (Source::Origin(_), None) => {
                    return Err(Error::inconsistent(
                        "a read through an epoch without its volume",
                    ))
                }
                (Source::Zeros, _) => out.fill(0),
            }
        }
        match batch.as_mut_slice() {
            [] => {}
            [(source, out)] => self.store.dev.read_at(out, *source)?,
            reads => self.store.dev.read_batch(reads)?,
        }
        Ok(())
    }

    /// Which parts of `[offset, offset + len)` are mapped and which read as zeros.
    pub fn allocation_map(&self, id: VolumeId, offset: u64, len: u64) -> Result<Vec<MapRun>> {
        let meta = self.read_meta()?;
        Self::check_io(&meta, id, offset, len, false)?;
        let rec = meta.volume(id.0)?;
        let pieces = match (rec.layout, rec.backing) {
            // A copy-on-write volume's device holds all of it.
            (arbor_format::DataLayout::Cow(_), _) => vec![Piece {
                len,
                source: Source::Origin(offset),
            }],
            (_, Some(backing)) => {
                let pieces = Self::resolve(&meta, id, offset, len)?;
                Self::resolve_view(&meta, backing, offset, pieces)?
            }
            _ => Self::resolve(&meta, id, offset, len)?,
        };
        let mut at = offset;
        Ok(pieces
            .into_iter()
            .map(|p| {
                let run = MapRun {
                    offset: at,
                    len: p.len,
                    mapped: p.source != Source::Zeros,
                };
                at += p.len;
                run
            })
            .collect())
    }

    /// Writes `data` at `offset`. Durable after the next [`Pool::flush`].
    pub fn write(&self, id: VolumeId, offset: u64, data: &[u8]) -> Result<()> {
        self.write_unit(Unit::data(id, offset, data))
    }

    /// [`Pool::write`] of a buffer the caller gives up: an encrypted
    /// volume's data is encrypted where it is, with no copy (after the
    /// call `data` holds what was stored, whether or not the write
    /// succeeded). Any other volume's is written as `write` does.
    pub fn write_mut(&self, id: VolumeId, offset: u64, data: &mut [u8]) -> Result<()> {
        self.counters.request();
        let len = data.len() as u64;
        let target = self.check_write(id, offset, len)?;
        let Some(cipher) = target.cipher.clone() else {
            return self.write_checked(Unit::data(id, offset, data), target);
        };
        crypt::check_units(&cipher, offset, len)?;
        crypt::encrypt_in_place(&cipher, offset, data)?;
        let written = self.apply_all(Unit {
            cipher: Some(&cipher),
            ..Unit::data(id, offset, data)
        });
        self.after_damage(written)
    }

    /// A write of `unit`'s data (see `write`, `write_uncached`).
    fn write_unit(&self, unit: Unit<'_>) -> Result<()> {
        self.counters.request();
        let target = self.check_write(unit.id, unit.offset, unit.len)?;
        self.write_checked(unit, target)
    }

    /// [`Pool::write_unit`] once the request is checked.
    fn write_checked(&self, unit: Unit<'_>, target: WriteTarget) -> Result<()> {
        if let Some(cipher) = target.cipher {
            crypt::check_units(&cipher, unit.offset, unit.len)?;
            let Fill::Data(plain) = unit.fill else {
                return Err(Error::inconsistent(
                    "zeros of an encrypted volume are written by write_zeroes",
                ));
            };
            return crypt::with_encrypted(&cipher, unit.offset, plain, |data| {
                let written = self.apply_all(Unit {
                    fill: Fill::Data(data),
                    cipher: Some(&cipher),
                    ..unit
                });
                self.after_damage(written)
            });
        }
        if let arbor_format::DataLayout::Cow(_) = target.layout {
            let written = self.cow_write(unit.id.0, unit.offset, unit.len, unit.fill);
            // A write over part of a damaged block of a home in the pool
            // fails, as does one whose copy for a snapshot reads one.
            return self.after_damage(self.after_origin_error(written));
        }
        // A write over part of a damaged block fails (its edges are read).
        let written = self.apply_all(unit);
        self.after_damage(written)
    }

    /// Writes as [`Pool::write`] does, with the same atomicity and
    /// durability, for bulk data that nothing reads soon (a restore's
    /// fill): the chunks it allocates are written so that they leave the
    /// host's page cache once written back, where the device can
    /// ([`BlockDevice::write_uncached`]), so a restore of a large volume
    /// neither keeps gigabytes of dirty pages for the next flush nor
    /// evicts what the cache holds for other volumes. Chunks overwritten
    /// in place, and copy-on-write volumes, go through the cache as
    /// `write` does.
    pub fn write_uncached(&self, id: VolumeId, offset: u64, data: &[u8]) -> Result<()> {
        self.write_unit(Unit {
            uncached: true,
            ..Unit::data(id, offset, data)
        })
    }

    /// Checks a write request; returns what the write path needs of the
    /// volume.
    fn check_write(&self, id: VolumeId, offset: u64, len: u64) -> Result<WriteTarget> {
        let meta = self.read_meta()?;
        Self::check_io(&meta, id, offset, len, true)?;
        let rec = meta.volume(id.0)?;
        Ok(WriteTarget {
            layout: rec.layout,
            backing: rec.backing,
            cipher: self.cipher_of(rec)?,
        })
    }

    /// Discards a range: whole chunks are unmapped (their space freed once no
    /// snapshot needs them), partial chunks at the ends are zeroed.
    /// Atomic whatever the range (see `pool/write.rs`).
    pub fn discard(&self, id: VolumeId, offset: u64, len: u64) -> Result<()> {
        self.write_zeroes(id, offset, len, false)
    }

    /// Makes a range read as zeros. With `keep_allocation` the chunks stay
    /// allocated (zeros are written; atomic up to 32 MiB, longer ranges in
    /// atomic pieces); otherwise whole chunks are unmapped (as a discard).
    pub fn write_zeroes(
        &self,
        id: VolumeId,
        offset: u64,
        len: u64,
        keep_allocation: bool,
    ) -> Result<()> {
        self.counters.request();
        let WriteTarget {
            layout,
            backing,
            cipher,
        } = self.check_write(id, offset, len)?;
        if let Some(cipher) = cipher {
            return self.write_zeroes_encrypted(id, offset, len, keep_allocation, &cipher);
        }
        if let arbor_format::DataLayout::Cow(_) = layout {
            // The device keeps every chunk: zeros are written.
            let written = self.cow_write(id.0, offset, len, Fill::Zeros);
            // A write over part of a damaged block of a home in the pool
            // fails, as does one whose copy for a snapshot reads one.
            return self.after_damage(self.after_origin_error(written));
        }
        // A volume reading through an epoch reads that epoch where it maps
        // nothing, so it cannot unmap: zeros are written.
        let unmap = !keep_allocation && backing.is_none();
        let written = self.apply_all(Unit::zeros(id, offset, len, unmap));
        self.after_damage(written)
    }

    // ---- reclaim and statistics ------------------------------------------------

    /// Reclaims space of deleted volumes: processes up to `max_nodes` queued
    /// metadata nodes and commits. Returns how many were processed (0 when
    /// nothing is pending).
    ///
    /// Runs beside I/O: each small step holds only the metadata lock, not the
    /// I/O gate. That is safe because reclaim touches only trees no volume
    /// names any more (shared nodes merely lose a reference, under the same
    /// lock as any shadowing), and the chunks it frees are not reallocated
    /// before its commit, which quiesces I/O like any other.
    pub fn reclaim(&self, max_nodes: usize) -> Result<usize> {
        /// Nodes per step: bounds how long one step holds the metadata lock.
        const STEP: usize = 16;
        let mut total = 0;
        // A step that did not fit the journal room left runs again after a
        // commit, one node alone: a node's drop fits an empty transaction
        // (two space-map pages per extent of a leaf, `packed_leaf_entries`).
        let mut alone = false;
        while total < max_nodes {
            self.commit_if_needed()?;
            let step = if alone { 1 } else { STEP };
            let result = {
                let mut meta = self.write_meta()?;
                self.mutate(&mut meta, Privilege::Reserve, |m| {
                    m.reclaim_step(step.min(max_nodes - total))
                })
            };
            let done = match result {
                Err(Error::Exhausted(Resource::Journal)) if !alone => {
                    self.commit_open()?;
                    alone = true;
                    continue;
                }
                other => other?,
            };
            alone = false;
            // Then the copies of copy-on-write volumes no epoch reads, then
            // loose homes (a step each).
            let done = match done {
                0 => match self.sweep_stores()? {
                    0 => usize::from(self.reclaim_loose_home()? > 0),
                    n => n,
                },
                n => n,
            };
            if done == 0 {
                break;
            }
            total += done;
        }
        if total > 0 {
            self.commit_open()?;
            // References dropped: partials may be nobody else's now.
            self.want_fill();
        }
        Ok(total)
    }

    pub fn pool_stats(&self) -> Result<PoolStats> {
        let meta = self.read_meta()?;
        let geo = &self.store.geo;
        let snapshots = meta
            .table()
            .iter()
            .filter(|(_, r)| r.kind == VolumeKind::Snapshot)
            .count() as u64;
        Ok(PoolStats {
            pool_bytes: geo.pool_bytes(),
            chunk_size: geo.chunk_size,
            data_bytes: geo.data_chunks() * geo.chunk_size,
            data_used_bytes: meta.meta().used(SmKind::Data) * geo.chunk_size,
            metadata_bytes: geo.meta_blocks() * BLOCK_SIZE_U64,
            metadata_used_bytes: meta.meta().used(SmKind::Meta) * BLOCK_SIZE_U64,
            volumes: meta
                .table()
                .iter()
                .filter(|(_, r)| r.kind == VolumeKind::Volume && crate::volumes::is_visible(r))
                .count() as u64,
            snapshots,
            reclaim_pending: meta.reclaim_pending() || self.origins.sweeping(),
            fill_pending: self.fill_wanted(),
            txn: meta.meta().txn() - 1,
            split_units: self.counters.split_units(),
            intent_log_records: self.counters.intent_log_records(),
            logged_snapshots: self.counters.logged_snapshots(),
            chunk_writes: self.counters.chunk_writes(),
            in_place_regions: crate::intents::listed(meta.meta())?.len() as u64,
        })
    }

    pub fn volume_stats(&self, id: VolumeId) -> Result<VolumeStats> {
        let meta = self.read_meta()?;
        let rec = meta.visible_volume(id.0)?;
        let cs = self.chunk_size();
        if let arbor_format::DataLayout::Cow(cow) = rec.layout {
            // Its data is its home's (freed with it when in the pool); its
            // store's copies belong to its snapshots (each reports what
            // only it reads).
            let home = match cow.home {
                arbor_format::Home::Pool { .. } => rec.size_bytes.div_ceil(cs) * cs,
                arbor_format::Home::External(_) => 0,
            };
            return Ok(VolumeStats {
                logical_bytes: rec.size_bytes,
                mapped_bytes: rec.size_bytes,
                exclusive_bytes: home,
                shared_bytes: 0,
            });
        }
        let exclusive = crate::diff::exclusive_chunks(Mapping::new(meta.meta(), rec.root))?;
        // The copies only this record's epoch reads, if no other record
        // reads through that epoch: destroying it frees them.
        let copies = match rec.backing {
            Some(b) if meta.table().readers_of_epoch(b.origin, b.epoch) == 1 => self
                .origins
                .sole_copies(&meta, b.origin)?
                .get(&b.epoch)
                .copied()
                .unwrap_or(0),
            _ => 0,
        };
        if copies > 0 {
            return Ok(VolumeStats {
                logical_bytes: rec.size_bytes,
                mapped_bytes: rec.mapped_chunks.saturating_mul(cs).saturating_add(copies),
                exclusive_bytes: exclusive.saturating_mul(cs).saturating_add(copies),
                shared_bytes: rec
                    .mapped_chunks
                    .saturating_sub(exclusive)
                    .saturating_mul(cs),
            });
        }
        Ok(VolumeStats {
            logical_bytes: rec.size_bytes,
            // The record's counter is only checked by `check`: a damaged one
            // must not overflow here.
            mapped_bytes: rec.mapped_chunks.saturating_mul(cs),
            exclusive_bytes: exclusive.saturating_mul(cs),
            shared_bytes: rec
                .mapped_chunks
                .saturating_sub(exclusive)
                .saturating_mul(cs),
        })
    }

    /// Whether `a` and `b` share their whole tree and size, as a volume and
    /// the snapshot just taken of it do until either is written (O(1), no
    /// walk). False does not prove the contents differ: a write of the same
    /// bytes still gives the volume a tree of its own.
    pub fn same_tree(&self, a: VolumeId, b: VolumeId) -> Result<bool> {
        let meta = self.read_meta()?;
        let (va, vb) = (meta.visible_volume(a.0)?, meta.visible_volume(b.0)?);
        Ok(share_tree(va, vb))
    }

    /// Whether [`Pool::diff`] can compare `a` and `b` (`Refusal::Unsupported`
    /// says why not), without walking anything.
    pub fn check_diff(&self, a: VolumeId, b: VolumeId) -> Result<()> {
        let meta = self.read_meta()?;
        let (va, vb) = (meta.visible_volume(a.0)?, meta.visible_volume(b.0)?);
        DiffPlan::of((a.0, va), (b.0, vb)).map(|_| ())
    }

    /// Whether `volume` reads exactly as its snapshot `snapshot` (false does
    /// not prove they differ): [`Pool::same_tree`], or, for a copy-on-write
    /// volume and its snapshot, that the volume was not written since (no
    /// copy covers the snapshot's epoch: one walk of its store at most).
    /// What a replication or a policy asks before taking a new snapshot.
    pub fn unchanged_since(&self, volume: VolumeId, snapshot: VolumeId) -> Result<bool> {
        let meta = self.read_meta()?;
        let (v, s) = (
            meta.visible_volume(volume.0)?,
            meta.visible_volume(snapshot.0)?,
        );
        match (v.layout, s.backing) {
            (arbor_format::DataLayout::Cow(_), Some(b))
                if b.origin == volume.0 && s.root.is_none() && s.size_bytes == v.size_bytes =>
            {
                Ok(!meta.written_since_epoch(volume.0, b.epoch)?)
            }
            _ => Ok(share_tree(v, s)),
        }
    }

    /// Byte ranges where volumes `a` and `b` differ, found by walking only the
    /// parts of their trees that are not shared. Ranges are chunk-aligned.
    pub fn diff(&self, a: VolumeId, b: VolumeId) -> Result<Vec<(u64, u64)>> {
        self.diff_in(a, b, 0, u64::MAX)
    }

    /// [`Pool::diff`] of the chunks that overlap bytes `[from, to)` only
    /// (ranges are whole chunks, so the first and last may reach outside):
    /// the walk skips what lies before the window without reading it and
    /// stops after it, so paging through a large diff window by window
    /// keeps memory to one window's ranges.
    pub fn diff_in(&self, a: VolumeId, b: VolumeId, from: u64, to: u64) -> Result<Vec<(u64, u64)>> {
        let meta = self.read_meta()?;
        let (va, vb) = (meta.visible_volume(a.0)?, meta.visible_volume(b.0)?);
        let plan = DiffPlan::of((a.0, va), (b.0, vb))?;
        let cs = self.chunk_size();
        let (first, end) = (from / cs, to.div_ceil(cs));
        let mut chunks: Vec<(u64, u64)> = Vec::new();
        crate::diff::diff_trees(
            Mapping::new(meta.meta(), plan.roots.0),
            Mapping::new(meta.meta(), plan.roots.1),
            first,
            end,
            &mut |lo, hi| {
                chunks.push((lo, hi));
                Ok(())
            },
        )?;
        if let Some((origin, lo, hi)) = plan.epochs {
            let trees = chunks.len();
            meta.epoch_changes(origin, lo, hi, first..end, &mut |chunk| {
                chunks.push((chunk, chunk + 1));
                Ok(())
            })?;
            if chunks.len() > trees {
                chunks.sort_unstable();
            }
        }
        // Bytes past a volume's size in its last chunk are not part of it
        // (they read as zeros once it grows), though the chunk may still be
        // shared: when the sizes differ, that chunk differs too.
        let shorter = va.size_bytes.min(vb.size_bytes);
        if va.size_bytes != vb.size_bytes && !shorter.is_multiple_of(cs) {
            let tail = shorter / cs;
            if (first..end).contains(&tail)
                && !chunks.iter().any(|&(lo, hi)| lo <= tail && tail < hi)
            {
                chunks.push((tail, tail + 1));
                chunks.sort_unstable();
            }
        }
        let mut ranges = ByteRanges::new(cs);
        for (lo, hi) in chunks {
            ranges.push(lo, hi)?;
        }
        Ok(ranges.0)
    }

    /// Byte ranges of `id` written after transaction `since` (for example a
    /// durable snapshot's `created_txn`), walking only subtrees written
    /// since. Discarded ranges are not reported; [`Pool::diff`] reports
    /// those. A snapshot not durable yet (deferred, or logged: FORMAT.md
    /// §6.4.2) shares its transaction with the writes after it until the
    /// next commit: compare it with [`Pool::diff`] instead.
    pub fn changed_since(&self, id: VolumeId, since: u64) -> Result<Vec<(u64, u64)>> {
        let meta = self.read_meta()?;
        let rec = meta.visible_volume(id.0)?;
        // What reads through an epoch changes only in its tree: the
        // epoch's content is fixed when it is taken.
        if rec.layout != arbor_format::DataLayout::Row {
            return Err(Unsupported::ChangesOfCow(rec.name.clone()).into());
        }
        let root = rec.root;
        let mut ranges = ByteRanges::new(self.chunk_size());
        crate::diff::changed_since(Mapping::new(meta.meta(), root), since, &mut |from, to| {
            ranges.push(from, to)
        })?;
        Ok(ranges.0)
    }

    /// Metadata blocks (absolute block numbers) with a non-zero reference
    /// count in the last commit: the nodes of every tree and the reclaim
    /// queue. For tools and damage tests that must tell live blocks from free ones.
    pub fn metadata_blocks_in_use(&self) -> Result<Vec<u64>> {
        self.flush()?;
        let meta = self.read_meta()?;
        let geo = &self.store.geo;
        let mut blocks = Vec::new();
        for entry in 0..geo.meta_blocks() {
            if meta.meta().meta_count_entry(entry)? > 0 {
                blocks.extend(geo.meta_block(entry));
            }
        }
        Ok(blocks)
    }

    /// Verifies the whole pool (see [`crate::check`]); commits first so the
    /// on-disk state is the one checked.
    ///
    /// It walks the last commit while I/O goes on: it holds the metadata
    /// lock only to capture that commit's roots and page images, and holds
    /// off other commits (not reads or writes) until it is done, so no block
    /// of the state being walked is reused under it.
    pub fn check(&self) -> Result<crate::check::CheckReport> {
        let _one = self.checker.one();
        self.flush()?;
        // Capture the last commit and pin the blocks it references, with no
        // commit in flight; the journal and superblocks are read now, before
        // later commits write the journal.
        let (state, mut report) = {
            let _commit = self.committer.lock();
            let mut meta = self.write_meta()?;
            let state = crate::check::Committed::capture(
                meta.meta(),
                Some(meta.table()).filter(|_| !meta.has_changes()),
            )?;
            let report = crate::check::journal_and_superblocks(&self.store, state.txn())?;
            meta.pin_committed_meta();
            self.committer.preserve(Some(state.preserved()));
            (state, report)
        };
        // The walk holds no lock: I/O and commits go on.
        #[cfg(test)]
        if let Some(pause) = self.checker.take_pause() {
            pause(self);
        }
        let walked = crate::check::check(&state);
        {
            let _commit = self.committer.lock();
            self.committer.preserve(None);
            // A stopped pool keeps its pins: it allocates nothing any more.
            if let Ok(mut meta) = self.write_meta() {
                meta.unpin_committed_meta();
            }
        }
        let walked = walked?;
        report.problems.extend(walked.problems);
        report.warnings.extend(walked.warnings);
        report
            .warnings
            .extend(self.repaired_at_open.iter().cloned());
        report.unlisted += walked.unlisted;
        report.volumes = walked.volumes;
        report.nodes = walked.nodes;
        report.data_chunks_referenced = walked.data_chunks_referenced;
        report.partial_extents = walked.partial_extents;
        report.layered_partials = walked.layered_partials;
        report.lost = self.lost_data()?;
        report.damaged = self.damage()?;
        Ok(report)
    }
}

/// Chunk ranges turned into merged (offset, length) byte ranges.
struct ByteRanges(Vec<(u64, u64)>, u64);

impl ByteRanges {
    fn new(chunk_size: u64) -> Self {
        Self(Vec::new(), chunk_size)
    }

    /// Adds chunks `[from, to)`, given in increasing order. The chunks come
    /// from mapping trees, so a range whose bytes do not fit in u64 means a
    /// damaged tree: an error, not an overflow.
    fn push(&mut self, from: u64, to: u64) -> Result<()> {
        let damaged =
            || Error::inconsistent(format!("mapped chunk range {from}..{to} is impossible"));
        let chunks = to.checked_sub(from).ok_or_else(damaged)?;
        let offset = from.checked_mul(self.1).ok_or_else(damaged)?;
        let len = chunks.checked_mul(self.1).ok_or_else(damaged)?;
        // Invariant: every stored range ends at or below u64::MAX, so the
        // sums below (a stored end, and a merged end equal to this one) fit.
        offset.checked_add(len).ok_or_else(damaged)?;
        match self.0.last_mut() {
            Some(last) if last.0 + last.1 == offset => last.1 += len,
            _ => self.0.push((offset, len)),
        }
        Ok(())
    }
}

/// [`Pool::same_tree`] of two records.
fn share_tree(a: &arbor_format::VolumeRecord, b: &arbor_format::VolumeRecord) -> bool {
    a.root == b.root
        && a.size_bytes == b.size_bytes
        && a.backing == b.backing
        && a.layout == arbor_format::DataLayout::Row
        && b.layout == arbor_format::DataLayout::Row
}

/// Where [`Pool::diff_in`] looks for what differs between two volumes:
/// where their trees differ (`roots`), and, when both read through one
/// copy-on-write volume (or one of them is that volume), where the epochs
/// they read differ (`epochs`: the volume, the older epoch and the newer
/// one, above every epoch for the volume as it is now).
struct DiffPlan {
    roots: (BlockRef, BlockRef),
    epochs: Option<(u64, u64, u64)>,
}

impl DiffPlan {
    fn of(
        (ida, va): (u64, &arbor_format::VolumeRecord),
        (idb, vb): (u64, &arbor_format::VolumeRecord),
    ) -> Result<Self> {
        use arbor_format::DataLayout::{Cow, Row};
        let both = |epochs| {
            Ok(Self {
                roots: (va.root, vb.root),
                epochs,
            })
        };
        match (va.layout, va.backing, vb.layout, vb.backing) {
            (Row, None, Row, None) => both(None),
            (Row, Some(x), Row, Some(y)) if x.origin == y.origin => {
                both(Some((x.origin, x.epoch.min(y.epoch), x.epoch.max(y.epoch))))
            }
            // The volume itself against what reads through it: the
            // volume's root is its store's, not a map of its data.
            (Cow(_), None, Row, Some(y)) if y.origin == ida => Ok(Self {
                roots: (BlockRef::NONE, vb.root),
                epochs: Some((ida, y.epoch, u64::MAX)),
            }),
            (Row, Some(x), Cow(_), None) if x.origin == idb => Ok(Self {
                roots: (va.root, BlockRef::NONE),
                epochs: Some((idb, x.epoch, u64::MAX)),
            }),
            (Cow(_), None, Cow(_), None) if ida == idb => Ok(Self {
                roots: (BlockRef::NONE, BlockRef::NONE),
                epochs: None,
            }),
            _ => Err(Unsupported::DiffPair {
                a: va.name.clone(),
                b: vb.name.clone(),
            }
            .into()),
        }
    }
}

fn check_size(size: u64) -> Result<()> {
    if size == 0 || !size.is_multiple_of(SECTOR) || size > MAX_VOLUME_SIZE {
        return Err(Invalid::VolumeSize {
            size,
            sector: SECTOR,
            max: MAX_VOLUME_SIZE,
        }
        .into());
    }
    Ok(())
}

/// What [`Pool::info`] says of volume `id`, whose record is `rec`, in a pool
/// of `chunk`-byte chunks whose last durable commit is transaction
/// `durable_txn`.
fn volume_info(
    id: u64,
    rec: &arbor_format::VolumeRecord,
    chunk: u64,
    durable_txn: u64,
) -> VolumeInfo {
    VolumeInfo {
        id: VolumeId(id),
        name: rec.name.clone(),
        snapshot: rec.kind == VolumeKind::Snapshot,
        size: rec.size_bytes,
        parent: (rec.parent != 0).then_some(VolumeId(rec.parent)),
        created_txn: rec.created_txn,
        durable: rec.created_txn <= durable_txn,
        created_unix_secs: rec.created_unix_secs,
        // A damaged counter (reported by `check`) must not overflow here.
        mapped_bytes: match rec.layout {
            // All of it is on its device.
            arbor_format::DataLayout::Cow(_) => rec.size_bytes,
            arbor_format::DataLayout::Row => rec.mapped_chunks.saturating_mul(chunk),
        },
        guid: (rec.guid != [0; 16]).then_some(rec.guid),
        key_slot: rec.key_slot,
        layout: match (rec.layout, rec.backing) {
            (arbor_format::DataLayout::Cow(cow), _) => {
                let store_bytes = rec.mapped_chunks.saturating_mul(chunk);
                match cow.home {
                    arbor_format::Home::External(_) => VolumeLayout::CowExternal {
                        store_bytes,
                        epoch: cow.epoch,
                    },
                    arbor_format::Home::Pool { .. } => VolumeLayout::CowInPool {
                        store_bytes,
                        epoch: cow.epoch,
                    },
                }
            }
            (_, Some(b)) => VolumeLayout::ReadsThrough {
                origin: VolumeId(b.origin),
                epoch: b.epoch,
            },
            _ => VolumeLayout::Row,
        },
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        if self.committer.check_failed().is_ok() {
            if let Err(e) = self.flush() {
                warn!(error = %e, "commit on close failed; the pool will open at its previous commit");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A commit stores the volume records with the reserve; ordinary steps
    /// after it must not inherit that (they would eat the reserve that keeps
    /// delete and reclaim working on a full pool).
    #[test]
    fn steps_after_a_commit_leave_the_reserve_alone() {
        let dev: Arc<dyn BlockDevice> = Arc::new(arbor_io::SimDisk::new(32 << 20));
        let opts = CreateOptions {
            chunk_size: 4096,
            metadata_bytes: Some(2 << 20),
            ..Default::default()
        };
        let pool = Pool::create(dev, &opts, &OpenOptions::default()).unwrap();
        let v = pool.create_volume("v", 1 << 20).unwrap();
        pool.write(v, 0, &[1; 4096]).unwrap();
        pool.flush().unwrap();
        assert_eq!(
            pool.meta.read().unwrap().meta().privilege(),
            Privilege::Normal
        );
        pool.delete("v").unwrap();
        pool.reclaim(100).unwrap();
        assert_eq!(
            pool.meta.read().unwrap().meta().privilege(),
            Privilege::Normal
        );
    }

    /// A check walks the commit it captured while later commits run: they
    /// free that commit's nodes (a deleted snapshot, reclaimed), allocate
    /// over and over in a metadata region small enough to wrap around, and
    /// write space-map pages home. The check must neither wait for them nor
    /// see their changes, and the blocks it pinned are free again after it.
    #[test]
    fn check_walks_its_commit_while_later_commits_free_and_reuse_blocks() {
        let dev: Arc<dyn BlockDevice> = Arc::new(arbor_io::SimDisk::new(48 << 20));
        let opts = CreateOptions {
            chunk_size: 4096,
            metadata_bytes: Some(2 << 20),
            journal_pages: Some(16),
            ..CreateOptions::default()
        };
        let pool = Pool::create(dev, &opts, &OpenOptions::default()).unwrap();
        let v = pool.create_volume("v", 8 << 20).unwrap();
        for i in 0..1024u64 {
            pool.write(v, i * 2 * 4096, &[i as u8 | 1; 512]).unwrap();
        }
        pool.snapshot("v@s").unwrap();
        for i in 0..256u64 {
            pool.write(v, i * 8 * 4096, &[2; 512]).unwrap();
        }
        pool.flush().unwrap();
        pool.checker.pause_next(Box::new(move |pool: &Pool| {
            assert!(
                pool.committer.try_lock().is_some(),
                "check holds the commit lock"
            );
            pool.delete("v@s").unwrap();
            while pool.reclaim(1000).unwrap() > 0 {}
            // Until the allocation cursor wraps around the metadata region
            // (where, without the pin, it would reuse the blocks of the
            // snapshot's nodes), or until metadata runs out: the blocks
            // freed during the walk stay pinned, so it may.
            let cursor = || pool.meta.read().unwrap().meta().cursor(SmKind::Meta);
            let start = cursor();
            let (mut passed_end, mut commits) = (false, 0);
            // New chunks of a new volume change space-map pages the
            // captured commit did not, and later commits write them home.
            let n = pool.create_volume("n", 32 << 20).unwrap();
            'churn: for round in 0..400u64 {
                for i in 0..64u64 {
                    let at = ((i * 37 + round * 11) % 2048) * 4096;
                    let fresh = ((round * 64 + i) % 8192) * 4096;
                    match pool
                        .write(v, at, &[round as u8; 4096])
                        .and_then(|()| pool.write(n, fresh, &[1; 4096]))
                    {
                        Ok(()) => {}
                        Err(Error::Exhausted(Resource::Metadata)) => break 'churn,
                        Err(e) => panic!("{e}"),
                    }
                }
                pool.flush().unwrap();
                commits += 1;
                passed_end |= cursor() < start;
                if passed_end && cursor() > start / 2 {
                    break;
                }
            }
            assert!(commits >= 3, "only {commits} commits during the walk");
        }));
        let report = pool.check().unwrap();
        assert!(report.is_clean(), "{:?}", report.problems);
        assert!(
            pool.checker.take_pause().is_none(),
            "the walk did not pause"
        );
        // The pins are gone: with nothing pending, every unused block is
        // allocatable again.
        pool.flush().unwrap();
        let meta = pool.meta.read().unwrap();
        assert_eq!(
            meta.meta().allocatable(SmKind::Meta) + meta.meta().used(SmKind::Meta),
            meta.meta().geo().meta_blocks()
        );
        drop(meta);
        assert!(pool.check().unwrap().is_clean());
    }
}
