//! arbor's storage engine: a pool of thin volumes with O(1) snapshots and
//! clones, crash-safe copy-on-write metadata, background reclaim and diff.
//!
//! Layers, lowest first (each may call only those below it; see
//! docs/ARCHITECTURE.md):
//! * `store`: device, geometry, bounded caches of committed metadata;
//! * `spacemap`: reference counts of metadata blocks and data chunks;
//! * `meta`: the transaction (dirty nodes, allocation, shadowing, steps,
//!   the reclaim queue, commit, recovery); its node API is private to it
//!   and to
//! * `meta::btree`: copy-on-write B-trees with shared, reference-counted
//!   nodes (`Tree` reads one, `TreeMut` changes one), the only layer that
//!   changes nodes;
//! * `mapping`: a volume's chunk → extent map (`Mapping`, `MappingMut`);
//! * `snapstore`: a copy-on-write volume's snapshot store (`SnapStore`,
//!   `SnapStoreMut`);
//! * `volumes`: volume table, family tree, write planning, reclaim;
//! * `diff`, `check`: tree comparison, exclusive space, full verification;
//! * `repair`: offline rebuild of the space maps and superblock copies;
//! * `pool`: the public, thread-safe API and the data path.

pub mod check;
mod diff;
mod error;
mod intents;
mod mapping;
mod meta;
mod names;
mod pool;
mod repair;
mod snapstore;
mod spacemap;
mod store;
mod sums;
mod table;
#[cfg(test)]
mod testing;
mod undo;
mod volumes;
mod walk;

pub use arbor_format::{DeviceIdentity, Guid};
pub use check::{CheckReport, DamageReport, DamagedData, LostData, MAX_READERS_LISTED};
pub use error::{
    Capability, Class, Conflict, Damage, Error, Fault, Invalid, OriginUnavailable, Refusal,
    Resource, Result, Unsupported,
};
pub use names::{
    check_existing_volume_name, check_hold_tag, check_volume_name, is_name_char,
    split_snapshot_name, MAX_GENERATED_SNAPSHOT_LEN, MAX_HOLD_TAG_LEN, MAX_VOLUME_NAME_LEN,
};
pub use pool::{
    guid_hex, ChunkWrites, CommitObserver, CreateOptions, Durability, GrowOptions, GrowReport,
    Healed, MapRun, NewKeySlot, OpenOptions, OriginInfo, Pool, PoolStats, ReceiveStart,
    ReceiveStatus, ReceiveTarget, ScrubStep, VolumeId, VolumeInfo, VolumeLayout, VolumeStats,
    DEFAULT_CHUNK_SIZE, MAX_GROUP_SNAPSHOT, MAX_PROPERTY_KEY, MAX_VOLUME_SIZE, SECTOR,
};
pub use repair::{repair, RepairReport};
pub use volumes::new_guid;
