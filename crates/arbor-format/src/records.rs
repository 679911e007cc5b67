//! Fixed-size values stored in B-tree leaves.

use crate::{get_u64, put_u64, FormatError};

/// A pointer to a metadata node: its block number and the transaction that
/// wrote it. Reading checks both, so misdirected and lost (stale) writes are
/// detected rather than followed. Block 0 never holds a node, so
/// `BlockRef::NONE` means "empty tree".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct BlockRef {
    pub block: u64,
    pub txn: u64,
}

impl BlockRef {
    pub const NONE: BlockRef = BlockRef { block: 0, txn: 0 };
    pub const ENCODED_LEN: usize = 16;

    pub fn is_none(&self) -> bool {
        self.block == 0
    }

    pub fn encode(&self, out: &mut [u8]) {
        put_u64(out, 0, self.block);
        put_u64(out, 8, self.txn);
    }

    pub fn decode(bytes: &[u8]) -> Self {
        Self {
            block: get_u64(bytes, 0),
            txn: get_u64(bytes, 8),
        }
    }
}

/// A value read from a leaf of the wrong tree kind can be shorter than the
/// record expected there.
fn check_len(bytes: &[u8], want: usize, what: &str) -> Result<(), FormatError> {
    if bytes.len() < want {
        return Err(FormatError::Invalid(format!(
            "{what} of {} bytes (needs {want})",
            bytes.len()
        )));
    }
    Ok(())
}

/// The longest run of chunks one mapping entry may describe. Bounding it
/// bounds the space-map pages a single leaf operation can touch (a run spans
/// at most two pages), which bounds the size of one transaction's journal.
pub const MAX_EXTENT_CHUNKS: u32 = 256;

/// Most 4 KiB blocks a chunk holds for a partial extent's mask: one bit
/// each in a u32, so partial extents serve chunks of at most 128 KiB.
pub const MAX_PARTIAL_BLOCKS: u32 = 32;

/// Most middle layers a partial extent has (format version 8).
pub const MAX_PARTIAL_MIDS: usize = 2;

/// One middle layer of a partial extent (format version 8): data chunk
/// `chunk` gives the blocks of `mask`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layer {
    pub chunk: u64,
    pub mask: u32,
}

/// What a *partial* extent adds (format version 7): its chunk holds only
/// the 4 KiB blocks of `mask` (bit `i` is block `i` of the chunk); the rest
/// of the chunk reads from `base`, the chunk the volume mapped before.
/// From version 8 it may have up to [`MAX_PARTIAL_MIDS`] middle layers
/// between the two, newest first (`mids`: the present ones before the
/// absent ones), each giving the blocks of its mask; `base` gives the
/// blocks no mask names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Partial {
    pub mask: u32,
    pub mids: [Option<Layer>; MAX_PARTIAL_MIDS],
    pub base: u64,
}

impl Partial {
    /// A partial with no middle layer (version 7's only kind).
    pub fn over(mask: u32, base: u64) -> Self {
        Self {
            mask,
            mids: [None; MAX_PARTIAL_MIDS],
            base,
        }
    }

    /// Its middle layers, newest first.
    pub fn layers(&self) -> impl Iterator<Item = Layer> + '_ {
        self.mids.iter().map_while(|m| *m)
    }

    /// How many middle layers it has.
    pub fn mid_count(&self) -> usize {
        self.layers().count()
    }

    /// The data chunks it references besides its own: its middle layers'
    /// (newest first), then its base.
    pub fn chunks(self) -> impl Iterator<Item = u64> {
        self.mids
            .into_iter()
            .map_while(|m| m.map(|l| l.chunk))
            .chain(std::iter::once(self.base))
    }
}

/// A mapping value's fields as they lie in memory, unchecked: the one
/// place that says where each of its [`MapValue::ENCODED_LEN`] bytes goes
/// (the layout [`MapValue`] documents). [`MapValue`] checks the fields;
/// packed leaves write them out (`crate::packed`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct RawMapValue {
    pub pchunk: u64,
    pub len: u32,
    pub word: u32,
    pub gen: u64,
    /// `base + 1`; 0 for an extent that is not partial.
    pub base_plus_one: u64,
    /// Each middle layer's `chunk + 1` (0: none) and mask.
    pub mids: [(u64, u32); MAX_PARTIAL_MIDS],
}

impl RawMapValue {
    /// Where the first middle layer's `chunk + 1` lies: not 0 only in a
    /// partial extent with middle layers.
    pub const FIRST_LAYER_AT: usize = 32;

    /// The fields of `bytes`, [`MapValue::ENCODED_LEN`] of them (callers
    /// hold a leaf's values, which are).
    pub fn read(bytes: &[u8]) -> Self {
        debug_assert_eq!(bytes.len(), MapValue::ENCODED_LEN);
        let u32_at = |at: usize| {
            u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
        };
        Self {
            pchunk: get_u64(bytes, 0),
            len: u32_at(8),
            word: u32_at(12),
            gen: get_u64(bytes, 16),
            base_plus_one: get_u64(bytes, 24),
            mids: [
                (get_u64(bytes, Self::FIRST_LAYER_AT), u32_at(40)),
                (get_u64(bytes, 48), u32_at(44)),
            ],
        }
    }

    /// A partial extent's base chunk.
    pub fn base(&self) -> Option<u64> {
        self.base_plus_one.checked_sub(1)
    }

    /// The middle layers (chunk, mask), newest first.
    pub fn layers(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.mids
            .iter()
            .map_while(|&(chunk_plus_one, mask)| Some((chunk_plus_one.checked_sub(1)?, mask)))
    }

    /// Writes the fields into `out`, [`MapValue::ENCODED_LEN`] bytes.
    pub fn write(&self, out: &mut [u8]) {
        put_u64(out, 0, self.pchunk);
        out[8..12].copy_from_slice(&self.len.to_le_bytes());
        out[12..16].copy_from_slice(&self.word.to_le_bytes());
        put_u64(out, 16, self.gen);
        put_u64(out, 24, self.base_plus_one);
        let [(first, first_mask), (second, second_mask)] = self.mids;
        put_u64(out, Self::FIRST_LAYER_AT, first);
        out[40..44].copy_from_slice(&first_mask.to_le_bytes());
        out[44..48].copy_from_slice(&second_mask.to_le_bytes());
        put_u64(out, 48, second);
    }
}

/// A mapping-tree value: the logical chunks `[key, key + len)` live in the
/// physical chunks `[pchunk, pchunk + len)`, written in transaction `gen`.
/// A partial extent (`partial` set) is one chunk long.
///
/// In memory (a leaf's values, [`Self::ENCODED_LEN`] bytes each): `pchunk`
/// u64, `len` u32, a u32 word (a partial's mask; 0 in a volume's map, the
/// last epoch in a snapshot store's), `gen` u64, `base + 1` u64 (0 for an
/// extent that is not partial), then a partial's middle layers: the first
/// one's `chunk + 1` u64 (0: none), its mask u32, the second one's mask
/// u32 and `chunk + 1` u64. Fixed leaves on disk hold the first
/// [`Self::FIXED_LEN`] bytes; packed leaves encode the fields
/// ([`crate::packed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapValue {
    pub pchunk: u64,
    pub len: u32,
    pub gen: u64,
    pub partial: Option<Partial>,
}

impl MapValue {
    pub const ENCODED_LEN: usize = 56;
    /// Bytes of a value in a fixed (not packed) leaf on disk: no base, so
    /// a fixed leaf never holds a partial extent.
    pub const FIXED_LEN: usize = 24;

    /// An extent that is not partial.
    pub fn whole(pchunk: u64, len: u32, gen: u64) -> Self {
        Self {
            pchunk,
            len,
            gen,
            partial: None,
        }
    }

    /// The runs of data chunks the entry holds one reference on each, as
    /// (first chunk, chunks): its own run, then a partial extent's base.
    pub fn chunk_runs(&self) -> impl Iterator<Item = (u64, u64)> {
        let others = self
            .partial
            .into_iter()
            .flat_map(|p| p.chunks().map(|c| (c, 1)));
        std::iter::once((self.pchunk, u64::from(self.len))).chain(others)
    }

    pub fn encode(&self, out: &mut [u8]) {
        let raw = match self.partial {
            // `base` and the layers' chunks are data chunks, below u64::MAX
            // (decode refuses them).
            Some(p) => RawMapValue {
                word: p.mask,
                base_plus_one: p.base.wrapping_add(1),
                mids: p
                    .mids
                    .map(|m| m.map_or((0, 0), |m| (m.chunk.wrapping_add(1), m.mask))),
                ..RawMapValue::default()
            },
            None => RawMapValue::default(),
        };
        RawMapValue {
            pchunk: self.pchunk,
            len: self.len,
            gen: self.gen,
            ..raw
        }
        .write(out);
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, FormatError> {
        check_len(bytes, Self::ENCODED_LEN, "mapping entry")?;
        let raw = RawMapValue::read(bytes);
        let (len, word) = (raw.len, raw.word);
        if len == 0 || len > MAX_EXTENT_CHUNKS {
            return Err(FormatError::Invalid(format!(
                "mapping extent of {len} chunks"
            )));
        }
        let mid = |(chunk_plus_one, mask): (u64, u32)| -> Result<Option<Layer>, FormatError> {
            match (chunk_plus_one, mask) {
                (0, 0) => Ok(None),
                (chunk_plus_one, mask) if chunk_plus_one != 0 && mask != 0 => Ok(Some(Layer {
                    chunk: chunk_plus_one - 1,
                    mask,
                })),
                (chunk_plus_one, mask) => Err(FormatError::Invalid(format!(
                    "partial extent layer of chunk + 1 = {chunk_plus_one} with mask {mask:#x}"
                ))),
            }
        };
        let mids = [mid(raw.mids[0])?, mid(raw.mids[1])?];
        let partial = match raw.base_plus_one {
            0 => {
                if mids.iter().any(Option::is_some) {
                    return Err(FormatError::Invalid(
                        "middle layers in an extent that is not partial".into(),
                    ));
                }
                None
            }
            base_plus_one => {
                if len != 1 || word == 0 {
                    return Err(FormatError::Invalid(format!(
                        "partial extent of {len} chunks with mask {word:#x}"
                    )));
                }
                if mids[0].is_none() && mids[1].is_some() {
                    return Err(FormatError::Invalid(
                        "a partial extent's second layer without a first".into(),
                    ));
                }
                Some(Partial {
                    mask: word,
                    mids,
                    base: base_plus_one - 1,
                })
            }
        };
        Ok(Self {
            pchunk: raw.pchunk,
            len,
            gen: raw.gen,
            partial,
        })
    }
}

/// Longest volume name, in bytes (a snapshot's full name `vol@snap` included).
pub const MAX_NAME_LEN: usize = 184;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum VolumeKind {
    /// A writable volume (created empty or cloned from a snapshot).
    Volume = 0,
    /// A read-only point-in-time image of a volume.
    Snapshot = 1,
    /// A receive in progress (version 3): a hidden volume that a stream is
    /// being applied to; it becomes a snapshot when the stream has arrived
    /// and verified, and its progress survives a restart.
    Receiving = 2,
    /// A hold on a snapshot (version 3): `parent` is the snapshot, the name
    /// says which (`{id}%hold%{tag}`); the snapshot cannot be destroyed
    /// without force while it has one. No tree, no size.
    Hold = 3,
    /// A property (version 4): a small checksummed value that a layer above
    /// the engine keeps in the pool (the monitor's policies). `parent` is
    /// the volume it belongs to (0: the pool), the name says which
    /// (`{owner}%prop%{key}`); its tree holds the value (docs/FORMAT.md §6).
    /// Found by no name lookup, removed with its owner.
    Property = 4,
}

impl VolumeKind {
    /// Whether records of this kind are volumes or snapshots people see
    /// (not receives in progress or holds).
    pub fn is_visible(self) -> bool {
        matches!(self, VolumeKind::Volume | VolumeKind::Snapshot)
    }
}

/// A snapshot's or volume's identity (version 3): 16 random bytes given at
/// creation and kept by send and receive, so that a stream's base is found
/// by what it is, not by its name. All zeros: none (a record read from a
/// version 1 volume table, before its pool was upgraded).
pub type Guid = [u8; 16];

/// Where a receive in progress stands (a [`VolumeKind::Receiving`] record).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReceiveState {
    /// The identity the snapshot will have.
    pub target: Guid,
    /// The base snapshot's identity (zeros for a full stream).
    pub base: Guid,
    /// Bytes of the volume applied and committed: a resumed stream starts here.
    pub offset: u64,
}

/// Identifies the device under an external origin (version 5): for a
/// regular file its filesystem's device number and its inode number, for
/// a block device its device number (`rdev`) and 0. Attaching checks it, so a
/// different file or disk under the same path is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct DeviceIdentity {
    pub dev: u64,
    pub ino: u64,
}

/// Where a copy-on-write volume's own data lives (version 5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Home {
    /// An external file or block device, left in place (`arbor origin attach`).
    External(DeviceIdentity),
    /// A run of data chunks of the pool, from `first`, contiguous on the
    /// device, allocated when the volume is created (`--layout cow`).
    Pool { first: u64 },
}

/// A copy-on-write volume (version 5): its data stays in its home and is
/// written in place; before a chunk is overwritten for the first time
/// since the newest snapshot, its old content is copied once into the
/// volume's snapshot store (the record's tree), shared by every snapshot
/// that still sees it (docs/FORMAT.md §6.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CowState {
    pub home: Home,
    /// The newest epoch given to a snapshot (0: none yet). Epochs count
    /// from 1 and are never reused; at most [`MAX_EPOCH`].
    pub epoch: u64,
    /// A rollback to this epoch is in progress (0: none): it is finished
    /// before the volume serves I/O again.
    pub rollback: u64,
}

/// Most snapshots one copy-on-write volume can ever take (store keys hold
/// the epoch in 32 bits).
pub const MAX_EPOCH: u64 = u32::MAX as u64 - 1;
/// Most chunks of a copy-on-write volume (store keys hold the chunk in 32 bits).
pub const MAX_COW_CHUNKS: u64 = 1 << 32;

/// How a volume keeps its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DataLayout {
    /// Redirect-on-write in the pool: the record's tree maps the volume
    /// (every volume before version 5).
    #[default]
    Row,
    /// Copy-on-write: see [`CowState`].
    Cow(CowState),
}

/// A volume whose unmapped chunks read as a copy-on-write volume read at
/// one of its snapshots' epochs (version 5): the snapshots of a
/// copy-on-write volume, their clones and the clones' snapshots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backing {
    /// The copy-on-write volume.
    pub origin: u64,
    /// The epoch read through.
    pub epoch: u64,
}

/// Record flags (version 5; offset 56 of a record).
const FLAG_COW: u32 = 1;
const FLAG_EXTERNAL: u32 = 2;
const FLAG_BACKED: u32 = 4;
/// Version 11: the volume's data is encrypted with the key in slot
/// `key_slot` of the pool's key store (bytes 120..128; FORMAT.md §6.6).
const FLAG_ENCRYPTED: u32 = 8;
const KNOWN_FLAGS: u32 = FLAG_COW | FLAG_EXTERNAL | FLAG_BACKED | FLAG_ENCRYPTED;

/// The key of a snapshot-store entry: chunk `chunk`, epochs from `first`.
pub fn store_key(chunk: u64, first: u64) -> u64 {
    debug_assert!(chunk < MAX_COW_CHUNKS && first <= MAX_EPOCH);
    (chunk << 32) | first
}

/// The chunk and first epoch of a snapshot-store key.
pub fn split_store_key(key: u64) -> (u64, u64) {
    (key >> 32, key & u64::from(u32::MAX))
}

/// A snapshot-store entry (the value of a leaf of a copy-on-write volume's
/// tree, keyed by [`store_key`]): the content chunk `chunk` had in epochs
/// `first ..= last`, copied to data chunk `pchunk` in transaction `gen`.
/// Laid out as a [`MapValue`] of one chunk whose reserved word holds
/// `last`, so the reference counting, checking and reclaim of mapping trees
/// apply unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreValue {
    pub pchunk: u64,
    pub last: u64,
    pub gen: u64,
}

impl StoreValue {
    pub const ENCODED_LEN: usize = MapValue::ENCODED_LEN;

    pub fn encode(&self, out: &mut [u8]) {
        MapValue::whole(self.pchunk, 1, self.gen).encode(out);
        // Epochs fit 32 bits (MAX_EPOCH).
        out[12..16].copy_from_slice(&(self.last.min(MAX_EPOCH) as u32).to_le_bytes());
    }

    /// Decodes the entry stored under `key`.
    pub fn decode(key: u64, bytes: &[u8]) -> Result<Self, FormatError> {
        let map = MapValue::decode(bytes)?;
        let last = u64::from(u32::from_le_bytes([
            bytes[12], bytes[13], bytes[14], bytes[15],
        ]));
        let (_, first) = split_store_key(key);
        if map.len != 1 || map.partial.is_some() || first == 0 || last < first {
            return Err(FormatError::Invalid(format!(
                "snapshot-store entry of {} chunks for epochs {first} to {last}",
                map.len
            )));
        }
        Ok(Self {
            pchunk: map.pchunk,
            last,
            gen: map.gen,
        })
    }
}

/// A volume-table value: everything the pool knows about one volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeRecord {
    /// Root of the volume's mapping tree.
    pub root: BlockRef,
    pub size_bytes: u64,
    /// For a snapshot, the volume it was taken of; for a clone, the snapshot it
    /// was cloned from; 0 for a volume created empty. The parent may since
    /// have been deleted.
    pub parent: u64,
    pub created_txn: u64,
    pub created_unix_secs: u64,
    /// Logical chunks that are mapped (kept exact on every map/unmap).
    pub mapped_chunks: u64,
    pub kind: VolumeKind,
    pub name: String,
    /// Identity (version 3 tables; zeros in version 1 tables).
    pub guid: Guid,
    /// For [`VolumeKind::Receiving`] only (zeros otherwise).
    pub receive: ReceiveState,
    /// How the volume keeps its data (version 5; [`DataLayout::Row`] before).
    pub layout: DataLayout,
    /// What its unmapped chunks read through (version 5; None before).
    pub backing: Option<Backing>,
    /// The slot of the pool's key store whose key encrypts its data
    /// (version 11, FORMAT.md §6.6; nonzero); None: stored in the clear.
    /// A snapshot or clone has its source's.
    pub key_slot: Option<u64>,
}

impl VolumeRecord {
    /// Value size in a version 3 volume table ([`crate::TreeKind::VolumeTable`]).
    pub const ENCODED_LEN: usize = 312;
    /// Value size in a version 1 volume table ([`crate::TreeKind::Volumes`]).
    pub const ENCODED_LEN_V1: usize = 248;
    const NAME_AT_V1: usize = Self::ENCODED_LEN_V1 - MAX_NAME_LEN;
    const NAME_AT: usize = Self::ENCODED_LEN - MAX_NAME_LEN;

    /// Encodes as a version 3 table value ([`Self::ENCODED_LEN`] bytes).
    pub fn encode(&self, out: &mut [u8]) {
        out[..Self::ENCODED_LEN].fill(0);
        self.encode_common(out);
        out[64..80].copy_from_slice(&self.guid);
        out[80..96].copy_from_slice(&self.receive.target);
        out[96..112].copy_from_slice(&self.receive.base);
        put_u64(out, 112, self.receive.offset);
        // 120..128 reserved. Receives are never copy-on-write or backed
        // (`decode` refuses it), so those fields share 80..120.
        let mut flags = 0;
        if let DataLayout::Cow(cow) = self.layout {
            flags |= FLAG_COW;
            put_u64(out, 80, cow.epoch);
            put_u64(out, 88, cow.rollback);
            match cow.home {
                Home::External(identity) => {
                    flags |= FLAG_EXTERNAL;
                    put_u64(out, 96, identity.dev);
                    put_u64(out, 104, identity.ino);
                }
                Home::Pool { first } => put_u64(out, 96, first),
            }
        }
        if let Some(backing) = self.backing {
            flags |= FLAG_BACKED;
            put_u64(out, 80, backing.origin);
            put_u64(out, 88, backing.epoch);
        }
        if let Some(slot) = self.key_slot {
            flags |= FLAG_ENCRYPTED;
            put_u64(out, 120, slot);
        }
        out[56..60].copy_from_slice(&flags.to_le_bytes());
        self.encode_name(out, Self::NAME_AT);
    }

    /// The record's flags word (version 5).
    pub fn flags(bytes: &[u8]) -> u32 {
        u32::from_le_bytes([bytes[56], bytes[57], bytes[58], bytes[59]])
    }

    /// Encodes as a version 1 table value ([`Self::ENCODED_LEN_V1`] bytes):
    /// the identity and receive state are not stored (a pool holding
    /// receives or identities has a version 3 table).
    pub fn encode_v1(&self, out: &mut [u8]) {
        out[..Self::ENCODED_LEN_V1].fill(0);
        self.encode_common(out);
        self.encode_name(out, Self::NAME_AT_V1);
    }

    fn encode_common(&self, out: &mut [u8]) {
        self.root.encode(&mut out[0..16]);
        put_u64(out, 16, self.size_bytes);
        put_u64(out, 24, self.parent);
        put_u64(out, 32, self.created_txn);
        put_u64(out, 40, self.created_unix_secs);
        put_u64(out, 48, self.mapped_chunks);
        // 56..60 flags (none defined yet), 60..62 name length, 62 kind, 63 reserved.
        out[62] = self.kind as u8;
    }

    fn encode_name(&self, out: &mut [u8], at: usize) {
        let name = self.name.as_bytes();
        let name_len = name.len().min(MAX_NAME_LEN);
        out[60..62].copy_from_slice(&(name_len as u16).to_le_bytes());
        out[at..at + name_len].copy_from_slice(&name[..name_len]);
    }

    /// Decodes a version 3 table value.
    pub fn decode(bytes: &[u8]) -> Result<Self, FormatError> {
        check_len(bytes, Self::ENCODED_LEN, "volume record")?;
        let mut rec = Self::decode_common(bytes, Self::NAME_AT, true)?;
        rec.guid.copy_from_slice(&bytes[64..80]);
        let flags = Self::flags(bytes);
        if flags & !KNOWN_FLAGS != 0
            || (flags & FLAG_EXTERNAL != 0 && flags & FLAG_COW == 0)
            || (flags & FLAG_COW != 0 && flags & FLAG_BACKED != 0)
            || (flags & FLAG_ENCRYPTED != 0 && flags != FLAG_ENCRYPTED)
        {
            return Err(FormatError::Invalid(format!(
                "volume record {}: flags {flags:#x}",
                rec.name
            )));
        }
        if flags == FLAG_ENCRYPTED {
            // Encrypted volumes are in the pool alone (no home, no epoch):
            // the shared bytes are unused, but for a receive in progress
            // (version 12), whose receive state they are.
            let slot = get_u64(bytes, 120);
            let receiving = rec.kind == VolumeKind::Receiving;
            if !(rec.kind.is_visible() || receiving)
                || slot == 0
                || bytes[63..64] != [0]
                || (!receiving && bytes[80..120].iter().any(|&b| b != 0))
            {
                return Err(FormatError::Invalid(format!(
                    "volume record {}: encrypted ({:?}, key slot {slot}) with other state set",
                    rec.name, rec.kind
                )));
            }
            if receiving {
                Self::decode_receive_state(&mut rec, bytes)?;
            }
            rec.key_slot = Some(slot);
            return Ok(rec);
        }
        if flags != 0 {
            if flags & FLAG_COW != 0 && rec.kind != VolumeKind::Volume
                || flags & FLAG_BACKED != 0 && !rec.kind.is_visible()
            {
                return Err(FormatError::Invalid(format!(
                    "volume record {}: flags {flags:#x} on a record of kind {:?}",
                    rec.name, rec.kind
                )));
            }
            if flags & FLAG_COW != 0 {
                let home = if flags & FLAG_EXTERNAL != 0 {
                    Home::External(DeviceIdentity {
                        dev: get_u64(bytes, 96),
                        ino: get_u64(bytes, 104),
                    })
                } else if get_u64(bytes, 104) == 0 {
                    Home::Pool {
                        first: get_u64(bytes, 96),
                    }
                } else {
                    return Err(FormatError::Invalid(format!(
                        "volume record {}: reserved bytes of its home set",
                        rec.name
                    )));
                };
                let cow = CowState {
                    home,
                    epoch: get_u64(bytes, 80),
                    rollback: get_u64(bytes, 88),
                };
                if cow.epoch > MAX_EPOCH || cow.rollback > cow.epoch {
                    return Err(FormatError::Invalid(format!(
                        "volume record {}: epoch {} (rollback to {})",
                        rec.name, cow.epoch, cow.rollback
                    )));
                }
                rec.layout = DataLayout::Cow(cow);
            } else {
                let backing = Backing {
                    origin: get_u64(bytes, 80),
                    epoch: get_u64(bytes, 88),
                };
                if backing.origin == 0
                    || backing.epoch == 0
                    || backing.epoch > MAX_EPOCH
                    || bytes[96..112].iter().any(|&b| b != 0)
                {
                    return Err(FormatError::Invalid(format!(
                        "volume record {}: backed by volume {} at epoch {}",
                        rec.name, backing.origin, backing.epoch
                    )));
                }
                rec.backing = Some(backing);
            }
            if get_u64(bytes, 112) != 0 || bytes[120..128].iter().any(|&b| b != 0) {
                return Err(FormatError::Invalid(format!(
                    "volume record {}: reserved bytes set",
                    rec.name
                )));
            }
            return Ok(rec);
        }
        Self::decode_receive_state(&mut rec, bytes)?;
        if rec.kind == VolumeKind::Hold
            && (!rec.root.is_none() || rec.mapped_chunks != 0 || rec.parent == 0)
        {
            return Err(FormatError::Invalid(format!(
                "hold record {}: holds have no tree and name a snapshot",
                rec.name
            )));
        }
        Ok(rec)
    }

    /// The receive state (bytes 80..120): set on a receive in progress
    /// only, and never past its size.
    fn decode_receive_state(rec: &mut VolumeRecord, bytes: &[u8]) -> Result<(), FormatError> {
        rec.receive.target.copy_from_slice(&bytes[80..96]);
        rec.receive.base.copy_from_slice(&bytes[96..112]);
        rec.receive.offset = get_u64(bytes, 112);
        let receiving = rec.kind == VolumeKind::Receiving;
        if !receiving && rec.receive != ReceiveState::default() {
            return Err(FormatError::Invalid(format!(
                "volume record {}: receive state on a volume that is not receiving",
                rec.name
            )));
        }
        if receiving && rec.receive.offset > rec.size_bytes {
            return Err(FormatError::Invalid(format!(
                "volume record {}: received up to {} of {} bytes",
                rec.name, rec.receive.offset, rec.size_bytes
            )));
        }
        Ok(())
    }

    /// Decodes a version 1 table value (no identity, no receives).
    pub fn decode_v1(bytes: &[u8]) -> Result<Self, FormatError> {
        check_len(bytes, Self::ENCODED_LEN_V1, "volume record")?;
        Self::decode_common(bytes, Self::NAME_AT_V1, false)
    }

    fn decode_common(bytes: &[u8], name_at: usize, v3: bool) -> Result<Self, FormatError> {
        let name_len = usize::from(u16::from_le_bytes([bytes[60], bytes[61]]));
        if name_len == 0 || name_len > MAX_NAME_LEN {
            return Err(FormatError::Invalid(format!(
                "volume name of {name_len} bytes"
            )));
        }
        let kind = match bytes[62] {
            0 => VolumeKind::Volume,
            1 => VolumeKind::Snapshot,
            2 if v3 => VolumeKind::Receiving,
            3 if v3 => VolumeKind::Hold,
            4 if v3 => VolumeKind::Property,
            other => return Err(FormatError::Invalid(format!("volume kind {other}"))),
        };
        let name = std::str::from_utf8(&bytes[name_at..name_at + name_len])
            .map_err(|_| FormatError::Invalid("volume name is not UTF-8".into()))?
            .to_owned();
        Ok(Self {
            root: BlockRef::decode(&bytes[0..16]),
            size_bytes: get_u64(bytes, 16),
            parent: get_u64(bytes, 24),
            created_txn: get_u64(bytes, 32),
            created_unix_secs: get_u64(bytes, 40),
            mapped_chunks: get_u64(bytes, 48),
            kind,
            name,
            guid: [0; 16],
            receive: ReceiveState::default(),
            layout: DataLayout::Row,
            backing: None,
            key_slot: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression (found by the open_pool fuzz target): a volume-table root
    /// that names a reclaim-queue node hands 16-byte values to the volume
    /// record decoder, which indexed past them.
    /// An encrypted volume or snapshot keeps its key slot; the slot goes
    /// with no other layout or state, on visible kinds only, and is never 0.
    #[test]
    fn encrypted_records_keep_their_key_slot_and_nothing_else() {
        let mut rec = VolumeRecord {
            root: BlockRef::NONE,
            size_bytes: 1 << 30,
            parent: 3,
            created_txn: 9,
            created_unix_secs: 1_700_000_000,
            mapped_chunks: 0,
            kind: VolumeKind::Snapshot,
            name: "vm@golden".into(),
            guid: [7; 16],
            receive: ReceiveState::default(),
            layout: DataLayout::Row,
            backing: None,
            key_slot: Some(42),
        };
        let mut bytes = vec![0u8; VolumeRecord::ENCODED_LEN];
        rec.encode(&mut bytes);
        assert_eq!(VolumeRecord::decode(&bytes).unwrap(), rec);
        let refused = |f: &dyn Fn(&mut Vec<u8>)| {
            let mut b = bytes.clone();
            f(&mut b);
            assert!(VolumeRecord::decode(&b).is_err());
        };
        refused(&|b| b[120..128].fill(0)); // slot 0
        refused(&|b| b[56] |= 1); // and copy-on-write
        refused(&|b| b[56] |= 4); // and backed
        refused(&|b| b[88] = 1); // state in the shared bytes
        refused(&|b| b[62] = 4); // a property
                                 // Version 12: a receive in progress may be encrypted, its receive
                                 // state beside the slot; still never past its size.
        let mut recv = VolumeRecord {
            kind: VolumeKind::Receiving,
            name: "vm%recv".into(),
            guid: [0; 16],
            receive: ReceiveState {
                target: [5; 16],
                base: [6; 16],
                offset: 1 << 20,
            },
            ..rec.clone()
        };
        let mut b = vec![0u8; VolumeRecord::ENCODED_LEN];
        recv.encode(&mut b);
        assert_eq!(VolumeRecord::decode(&b).unwrap(), recv);
        recv.receive.offset = (1 << 30) + 512;
        recv.encode(&mut b);
        assert!(VolumeRecord::decode(&b).is_err(), "received past its size");
        rec.kind = VolumeKind::Volume;
        rec.key_slot = None;
        rec.encode(&mut bytes);
        assert_eq!(VolumeRecord::decode(&bytes).unwrap().key_slot, None);
        assert_eq!(VolumeRecord::flags(&bytes), 0);
    }

    #[test]
    fn values_too_short_are_errors() {
        for len in [0, 16, 24, 247] {
            assert!(VolumeRecord::decode(&vec![1u8; len]).is_err(), "{len}");
        }
        for len in [0, 16, 23] {
            assert!(MapValue::decode(&vec![1u8; len]).is_err(), "{len}");
        }
    }

    #[test]
    fn volume_record_round_trip() {
        let rec = VolumeRecord {
            root: BlockRef { block: 9, txn: 3 },
            size_bytes: 1 << 40,
            parent: 4,
            created_txn: 2,
            created_unix_secs: 1_700_000_000,
            mapped_chunks: 77,
            kind: VolumeKind::Snapshot,
            name: "vm1@monday".into(),
            guid: [7; 16],
            receive: ReceiveState::default(),
            layout: Default::default(),
            backing: None,
            key_slot: None,
        };
        let mut buf = [0u8; VolumeRecord::ENCODED_LEN];
        rec.encode(&mut buf);
        assert_eq!(VolumeRecord::decode(&buf).unwrap(), rec);
        let receiving = VolumeRecord {
            kind: VolumeKind::Receiving,
            name: "vm1%recv".into(),
            receive: ReceiveState {
                target: [1; 16],
                base: [2; 16],
                offset: 1 << 20,
            },
            ..rec.clone()
        };
        receiving.encode(&mut buf);
        assert_eq!(VolumeRecord::decode(&buf).unwrap(), receiving);
        // A version 1 value keeps everything but the identity.
        let mut v1 = [0u8; VolumeRecord::ENCODED_LEN_V1];
        rec.encode_v1(&mut v1);
        let back = VolumeRecord::decode_v1(&v1).unwrap();
        assert_eq!(
            back,
            VolumeRecord {
                guid: [0; 16],
                ..rec
            }
        );
        // Receives exist only in version 3 tables.
        receiving.encode_v1(&mut v1);
        assert!(VolumeRecord::decode_v1(&v1).is_err());
    }

    #[test]
    fn copy_on_write_and_backed_records_round_trip() {
        let base = VolumeRecord {
            root: BlockRef { block: 9, txn: 3 },
            size_bytes: 1 << 30,
            parent: 0,
            created_txn: 2,
            created_unix_secs: 1_700_000_000,
            mapped_chunks: 12,
            kind: VolumeKind::Volume,
            name: "disk".into(),
            guid: [7; 16],
            receive: ReceiveState::default(),
            layout: DataLayout::Row,
            backing: None,
            key_slot: None,
        };
        let homes = [
            Home::External(DeviceIdentity {
                dev: 0x803,
                ino: 77,
            }),
            Home::Pool { first: 4096 },
        ];
        let mut buf = [0u8; VolumeRecord::ENCODED_LEN];
        for home in homes {
            let rec = VolumeRecord {
                layout: DataLayout::Cow(CowState {
                    home,
                    epoch: 5,
                    rollback: 3,
                }),
                ..base.clone()
            };
            rec.encode(&mut buf);
            assert_eq!(VolumeRecord::decode(&buf).unwrap(), rec);
        }
        let snap = VolumeRecord {
            kind: VolumeKind::Snapshot,
            name: "disk@a".into(),
            parent: 4,
            backing: Some(Backing {
                origin: 4,
                epoch: 5,
            }),
            ..base.clone()
        };
        snap.encode(&mut buf);
        assert_eq!(VolumeRecord::decode(&buf).unwrap(), snap);
        // Unknown flags, a snapshot that is copy-on-write, a rollback past
        // the newest epoch, a backing of epoch 0: all refused.
        let mut bad = buf;
        bad[56] |= 0x80;
        assert!(VolumeRecord::decode(&bad).is_err());
        let cow_snapshot = VolumeRecord {
            layout: DataLayout::Cow(CowState {
                home: Home::Pool { first: 1 },
                epoch: 1,
                rollback: 0,
            }),
            backing: None,
            ..snap.clone()
        };
        cow_snapshot.encode(&mut buf);
        assert!(VolumeRecord::decode(&buf).is_err());
        let ahead = VolumeRecord {
            layout: DataLayout::Cow(CowState {
                home: Home::Pool { first: 1 },
                epoch: 1,
                rollback: 2,
            }),
            ..base.clone()
        };
        ahead.encode(&mut buf);
        assert!(VolumeRecord::decode(&buf).is_err());
        let zero = VolumeRecord {
            backing: Some(Backing {
                origin: 4,
                epoch: 0,
            }),
            ..snap
        };
        zero.encode(&mut buf);
        assert!(VolumeRecord::decode(&buf).is_err());
    }

    #[test]
    fn store_keys_and_values_round_trip() {
        let key = store_key(7, 3);
        assert_eq!(split_store_key(key), (7, 3));
        assert_eq!(
            split_store_key(store_key(MAX_COW_CHUNKS - 1, MAX_EPOCH)).1,
            MAX_EPOCH
        );
        let v = StoreValue {
            pchunk: 99,
            last: 9,
            gen: 4,
        };
        let mut buf = [0u8; StoreValue::ENCODED_LEN];
        v.encode(&mut buf);
        assert_eq!(StoreValue::decode(key, &buf).unwrap(), v);
        // A range that ends before it starts, or starts at epoch 0.
        assert!(StoreValue::decode(store_key(7, 10), &buf).is_err());
        assert!(StoreValue::decode(store_key(7, 0), &buf).is_err());
    }

    #[test]
    fn receive_state_only_on_receiving_records() {
        let rec = VolumeRecord {
            root: BlockRef::NONE,
            size_bytes: 4096,
            parent: 0,
            created_txn: 1,
            created_unix_secs: 0,
            mapped_chunks: 0,
            kind: VolumeKind::Volume,
            name: "v".into(),
            guid: [1; 16],
            receive: ReceiveState {
                target: [0; 16],
                base: [0; 16],
                offset: 512,
            },
            layout: Default::default(),
            backing: None,
            key_slot: None,
        };
        let mut buf = [0u8; VolumeRecord::ENCODED_LEN];
        rec.encode(&mut buf);
        assert!(VolumeRecord::decode(&buf).is_err());
        let past_end = VolumeRecord {
            kind: VolumeKind::Receiving,
            receive: ReceiveState {
                offset: 8192,
                ..rec.receive
            },
            ..rec
        };
        past_end.encode(&mut buf);
        assert!(VolumeRecord::decode(&buf).is_err());
    }

    #[test]
    fn map_value_rejects_bad_lengths() {
        let mut buf = [0u8; MapValue::ENCODED_LEN];
        MapValue::whole(1, 0, 1).encode(&mut buf);
        assert!(MapValue::decode(&buf).is_err());
        MapValue::whole(1, MAX_EXTENT_CHUNKS + 1, 1).encode(&mut buf);
        assert!(MapValue::decode(&buf).is_err());
        let ok = MapValue::whole(7, 3, 5);
        ok.encode(&mut buf);
        assert_eq!(MapValue::decode(&buf).unwrap(), ok);
    }

    #[test]
    fn partial_extents_round_trip_and_are_one_chunk_with_a_mask() {
        let mut buf = [0u8; MapValue::ENCODED_LEN];
        let partial = MapValue {
            partial: Some(Partial::over(0b0100, 0)),
            ..MapValue::whole(9, 1, 4)
        };
        partial.encode(&mut buf);
        assert_eq!(MapValue::decode(&buf).unwrap(), partial);
        let far = MapValue {
            partial: Some(Partial::over(u32::MAX, u64::MAX - 1)),
            ..partial
        };
        far.encode(&mut buf);
        assert_eq!(MapValue::decode(&buf).unwrap(), far);
        // Longer than one chunk, or no block of its own.
        MapValue { len: 2, ..partial }.encode(&mut buf);
        assert!(MapValue::decode(&buf).is_err());
        MapValue {
            partial: Some(Partial::over(0, 3)),
            ..partial
        }
        .encode(&mut buf);
        assert!(MapValue::decode(&buf).is_err());
    }

    #[test]
    fn partial_extents_with_middle_layers_round_trip_and_refuse_holes() {
        let mut buf = [0u8; MapValue::ENCODED_LEN];
        let layer = |chunk, mask| Some(Layer { chunk, mask });
        let two = MapValue {
            partial: Some(Partial {
                mask: 0b0001,
                mids: [layer(5, 0b0010), layer(u64::MAX - 1, 0b0100)],
                base: 7,
            }),
            ..MapValue::whole(9, 1, 4)
        };
        two.encode(&mut buf);
        assert_eq!(MapValue::decode(&buf).unwrap(), two);
        assert_eq!(
            two.chunk_runs().collect::<Vec<_>>(),
            [(9, 1), (5, 1), (u64::MAX - 1, 1), (7, 1)]
        );
        let one = MapValue {
            partial: Some(Partial {
                mids: [layer(5, 0b0010), None],
                ..two.partial.unwrap()
            }),
            ..two
        };
        one.encode(&mut buf);
        assert_eq!(MapValue::decode(&buf).unwrap(), one);
        assert_eq!(one.partial.unwrap().mid_count(), 1);
        // A second layer without a first.
        let hole = MapValue {
            partial: Some(Partial {
                mids: [None, layer(5, 0b0010)],
                ..two.partial.unwrap()
            }),
            ..two
        };
        hole.encode(&mut buf);
        assert!(MapValue::decode(&buf).is_err());
        // A layer with no blocks, or blocks and no chunk.
        one.encode(&mut buf);
        buf[40..44].copy_from_slice(&0u32.to_le_bytes());
        assert!(MapValue::decode(&buf).is_err());
        one.encode(&mut buf);
        buf[32..40].copy_from_slice(&0u64.to_le_bytes());
        assert!(MapValue::decode(&buf).is_err());
        // Layers on an extent that is not partial.
        MapValue::whole(9, 1, 4).encode(&mut buf);
        buf[32..40].copy_from_slice(&6u64.to_le_bytes());
        buf[40..44].copy_from_slice(&1u32.to_le_bytes());
        assert!(MapValue::decode(&buf).is_err());
    }
}
