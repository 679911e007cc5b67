//! What management commands return, in the shapes that both `--json` output
//! and the daemon's HTTP API use, plus the API's request bodies.

use serde::{Deserialize, Serialize};

use crate::error_code::ErrorCode;
use crate::size::ByteSize;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PoolView {
    pub path: String,
    /// On-disk format version (1 cannot grow until upgraded).
    pub format_version: u16,
    /// How the daemon reaches the pool's device: `direct` or `buffered`
    /// (empty from an offline command's view).
    #[serde(default)]
    pub io: String,
    pub pool_bytes: u64,
    pub chunk_size: u64,
    pub data_bytes: u64,
    pub data_used_bytes: u64,
    pub metadata_bytes: u64,
    pub metadata_used_bytes: u64,
    pub volumes: u64,
    pub snapshots: u64,
    pub reclaim_pending: bool,
    /// A sweep for partial extents to fill has not finished: space that
    /// only partials hold may still come back.
    #[serde(default)]
    pub fill_pending: bool,
    /// Last committed transaction.
    pub txn: u64,
    /// Space use past the configured warning thresholds, one sentence each.
    #[serde(default)]
    pub warnings: Vec<String>,
    /// Active alerts (docs/MONITOR.md), most severe first.
    #[serde(default)]
    pub alerts: Vec<AlertView>,
    /// Data blocks recorded damaged (`arbor pool damage` lists them).
    #[serde(default)]
    pub damaged_blocks: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VolumeKind {
    Volume,
    Snapshot,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VolumeView {
    pub name: String,
    pub id: u64,
    pub kind: VolumeKind,
    pub size: u64,
    pub mapped_bytes: u64,
    /// The volume a snapshot was taken of, or the snapshot a clone came
    /// from; `None` when there is none or it has been deleted.
    pub parent: Option<String>,
    pub created_unix_secs: u64,
    pub created_txn: u64,
    /// False only for a snapshot or clone taken with deferred durability
    /// that the pool has not committed yet (`POST /v1/flush` commits it).
    #[serde(default = "durable_by_default")]
    pub durable: bool,
    /// Open NBD connections to it.
    #[serde(default)]
    pub nbd_connections: u64,
    /// Identity (32 hex digits), kept by send and receive; absent in a pool
    /// whose format predates identities.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guid: Option<String>,
    /// Tags holding a snapshot (`arbor hold`): it cannot be destroyed
    /// without force while any is left.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub holds: Vec<String>,
    /// How it keeps its data (a daemon that predates layouts sends none:
    /// every volume was `row` then).
    #[serde(default)]
    pub layout: LayoutView,
    /// Its rate limits (`arbor volume set`); none: unlimited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos: Option<QosView>,
    /// An instant restore still filling it from a backup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restoring: Option<RestoringView>,
    /// Its data is encrypted (docs/SECURITY.md, "Encryption at rest").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<EncryptionView>,
}

/// An encrypted volume's key: which slot of the pool's key store it uses
/// (its snapshots and clones share it) and whether it is loaded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EncryptionView {
    pub key_slot: u64,
    /// Not loaded: the volume is listed but not served (`arbor key load`).
    pub locked: bool,
}

/// A user's key in a request: a raw key (64 hex digits) or a passphrase.
/// Never printed (`Debug` hides it).
#[derive(Deserialize, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum KeyMaterial {
    Raw { hex: String },
    Passphrase { passphrase: String },
}

impl std::fmt::Debug for KeyMaterial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyMaterial::Raw { .. } => f.write_str("KeyMaterial::Raw(..)"),
            KeyMaterial::Passphrase { .. } => f.write_str("KeyMaterial::Passphrase(..)"),
        }
    }
}

/// Encryption of a new volume (`volume create --encrypt`).
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EncryptionRequest {
    /// The user's key that wraps the volume's new data key.
    pub key: KeyMaterial,
    /// Bytes per data unit: 4096 (the default) or 512.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit: Option<u32>,
}

/// `POST /v1/volumes/{name}/key/load`.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct KeyLoadRequest {
    pub key: KeyMaterial,
}

/// `PUT /v1/volumes/{name}/key`: wrap the data key with `new` instead of `old`.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct KeyChangeRequest {
    pub old: KeyMaterial,
    pub new: KeyMaterial,
}

/// A volume's rate limits, per second (docs/CLI.md, `volume set`); each
/// absent is no limit.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QosView {
    /// Operations, reads and writes together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iops: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_iops: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_iops: Option<u64>,
    /// Bytes, reads and writes together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bandwidth: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_bandwidth: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_bandwidth: Option<u64>,
    /// How much a full bucket holds, in milliseconds of its rate.
    pub burst_ms: u32,
}

/// A limit to set: a positive rate, or `"none"` to remove it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum QosSetting {
    Limit(u64),
    /// Must be `none`.
    Word(String),
}

/// A change of a volume's limits (`PUT /v1/volumes/{name}/qos`): each
/// absent field keeps its limit.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QosRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iops: Option<QosSetting>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_iops: Option<QosSetting>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_iops: Option<QosSetting>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bandwidth: Option<QosSetting>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_bandwidth: Option<QosSetting>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_bandwidth: Option<QosSetting>,
    /// Milliseconds, 1 to 60,000 (default 1,000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst_ms: Option<u32>,
}

impl QosRequest {
    /// Whether it changes nothing.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// How a volume keeps its data: in the pool, or in place on an external
/// device (`arbor origin attach`), or in the pool over such a device's
/// point in time.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum LayoutView {
    /// Redirect-on-write in the pool: every volume but those below.
    #[default]
    Row,
    /// An origin: its data stays on its device, written in place; before
    /// a chunk is first overwritten since a snapshot, its old content is
    /// copied into the pool (`store_bytes` of such copies). `epoch`: its
    /// newest snapshot's point in time.
    Cow {
        store_bytes: u64,
        epoch: u64,
        /// Its device is open (always, for a home in the pool); when not,
        /// its I/O (and its snapshots' reads of what was never copied)
        /// fails with `origin_unavailable`.
        attached: bool,
        /// Where its data is: `device` (an origin, `arbor origin attach`)
        /// or `pool` (`volume create --layout cow`).
        #[serde(default)]
        home: HomeView,
    },
    /// A snapshot of an origin, a clone of one, or a snapshot of such a
    /// clone: its own writes go to the pool; what it never wrote reads
    /// `origin` as it was at `epoch` (copies in the pool, else its device).
    ReadsThrough {
        /// `None` only if the origin is gone, which the engine refuses.
        origin: Option<String>,
        epoch: u64,
    },
}

/// Where a copy-on-write volume's data is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HomeView {
    /// An external file or block device (an origin).
    #[default]
    Device,
    /// A contiguous run of the pool, allocated at creation.
    Pool,
}

/// `POST /v1/snapshots/{name}/holds` and `DELETE .../holds/{tag}`.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HoldRequest {
    pub tag: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StatsView {
    pub name: String,
    pub logical_bytes: u64,
    pub mapped_bytes: u64,
    /// What deleting the volume would free.
    pub exclusive_bytes: u64,
    pub shared_bytes: u64,
    /// An origin's copies in the pool, kept for its snapshots (absent for
    /// other volumes; its data itself is on its device).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_bytes: Option<u64>,
}

/// `GET /v1/origins`: one origin (a volume attached with `arbor origin
/// attach`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OriginView {
    pub name: String,
    /// Where its device is opened from, as recorded in the pool; `None`
    /// when no path was recorded (attach it again to record one).
    pub path: Option<String>,
    pub size: u64,
    /// Its device is open. After a start that could not open it (missing,
    /// replaced by another file, resized) it is not, and its I/O fails
    /// with `origin_unavailable` until it is attached again.
    pub attached: bool,
    /// Bytes of old content copied into the pool for its snapshots.
    pub store_bytes: u64,
    /// What of it data checksums cover: `copies` (a pool of format version
    /// 10: the copies in the pool are checksummed and verified; its device
    /// is not, arbor did not write all of it) or `none` (an older pool).
    #[serde(default)]
    pub checksums: String,
    /// Its snapshots.
    pub snapshots: u64,
    /// Every volume and snapshot that reads through it (its snapshots,
    /// their clones, the clones' snapshots): what must be destroyed before
    /// it can be detached.
    pub readers: Vec<String>,
    /// Which file or device it is: `st_dev` and `st_ino` of a regular
    /// file, `st_rdev` and 0 of a block device.
    pub device: DeviceView,
    /// A rollback was interrupted and resumes when it is attached (or run
    /// `arbor rollback` again).
    pub rollback_pending: bool,
    /// Why it failed, if it did: its device shrank (while attached, or
    /// while the daemon was stopped). It serves no I/O until attached again
    /// with `--accept-damage`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<String>,
    /// What it lost when its device shrank, kept while it or snapshots
    /// that read the lost bytes exist.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss: Option<LossView>,
}

/// What an origin lost when its device shrank.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LossView {
    /// Its bytes from here on were lost.
    pub from: u64,
    /// When arbor saw the device smaller.
    pub seen_unix_secs: u64,
    /// When a user accepted the loss (`origin attach --accept-damage`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accepted_unix_secs: Option<u64>,
}

/// What a snapshot or clone lost with an origin's device (`arbor check`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LostDataView {
    pub volume: String,
    pub origin: String,
    /// Bytes of it that read as errors.
    pub bytes: u64,
    /// The origin's first lost byte.
    pub from: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceView {
    pub dev: u64,
    pub ino: u64,
}

/// `POST /v1/origins`.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AttachOriginRequest {
    pub name: String,
    /// Absolute: the daemon's working directory is not the client's.
    pub path: String,
    /// Attach again an origin whose device shrank, accepting what it lost
    /// (recorded; its snapshots still fail reads of the lost bytes).
    #[serde(default)]
    pub accept_damage: bool,
}

/// A byte range where two volumes differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Range {
    pub offset: u64,
    pub len: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CheckView {
    pub clean: bool,
    pub problems: Vec<String>,
    /// Conditions a power cut also leaves behind, harmless now.
    #[serde(default)]
    pub warnings: Vec<String>,
    /// Problems found beyond those listed.
    pub unlisted: usize,
    pub volumes: usize,
    pub nodes: u64,
    pub data_chunks_referenced: u64,
    /// What `--repair` changed before the check; absent without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repaired: Option<Vec<String>>,
    /// Data known lost (the pool's structure is sound without it): what
    /// snapshots and clones read through an origin whose device shrank.
    #[serde(default)]
    pub lost: Vec<LostDataView>,
    /// Data blocks recorded damaged (they do not match their checksums;
    /// reads of them fail with EIO) and still read by a volume or
    /// snapshot.
    #[serde(default)]
    pub damaged: DamageView,
}

/// What a reload of the daemon's configuration did (`POST
/// /v1/config/reload`, `arbor config reload`, SIGHUP).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReloadView {
    /// Keys whose new values are in force now.
    pub changed: Vec<String>,
    /// Keys whose new values take effect only when the daemon restarts,
    /// each with what it changes from and to; the running values stay.
    pub restart_needed: Vec<String>,
    /// The certificate files (tls_ca, tls_cert, tls_key, tls_crl) were
    /// read again and are in force for new connections.
    pub tls_reloaded: bool,
    /// Certificates the revocation lists (tls_crl) list.
    pub revoked_certificates: usize,
    /// NBD sessions closed because the new configuration no longer
    /// grants them.
    pub closed_sessions: Vec<ClosedSessionView>,
    /// Replication sessions from sources (this host their target) ended
    /// because the new configuration no longer allows them (`identity`:
    /// the source's); each source was told why, and a receive keeps what
    /// it committed.
    #[serde(default)]
    pub withdrawn_replications: Vec<ClosedSessionView>,
    /// API tokens in the token file, read again.
    pub tokens: usize,
    /// Encrypted volumes unlocked by their configured keys
    /// (`volume_keys`), and those whose key failed (volume: why).
    #[serde(default)]
    pub keys_loaded: Vec<String>,
    #[serde(default)]
    pub keys_failed: Vec<String>,
}

/// An NBD session a reload closed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClosedSessionView {
    /// Its client certificate's identity; none: an anonymous client.
    pub identity: Option<String>,
    pub volume: String,
    pub reason: String,
}

/// Where the pool's scrub stands (`GET /v1/scrub`, `arbor scrub status`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ScrubView {
    /// `none` (never run, or its record is damaged: `last_error` says
    /// so), `running`, `stopped` (by a user or an error: `arbor scrub
    /// start` goes on from where it stopped) or `finished`.
    pub state: String,
    pub started_unix_secs: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_unix_secs: Option<u64>,
    /// How far through the pool's data chunks, 0 to 1.
    pub progress: f64,
    /// Live data read so far, and the pool's live data now.
    pub bytes_read: u64,
    pub live_bytes: u64,
    /// Blocks verified against their checksums, and those found damaged.
    pub verified_blocks: u64,
    pub damaged_blocks: u64,
    /// Blocks that had no checksum (written before the pool was upgraded
    /// to version 10) and were given one, since this daemon started or
    /// went on with the scrub.
    #[serde(default)]
    pub sums_added: u64,
    /// Bytes of homes built since the daemon started (copy-on-write
    /// volumes created, grown or moved in the pool, origins copied into
    /// it) whose blocks still await their checksums: a pass gives them,
    /// at the scrub's pace, while no scrub runs.
    #[serde(default)]
    pub new_home_bytes_unsummed: u64,
    /// While running: bytes per second (smoothed) and seconds left, roughly.
    pub rate_bytes_per_sec: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eta_secs: Option<u64>,
    /// Once finished: problems the metadata check found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata_problems: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// The pool's scrub schedule (`arbor scrub schedule`), in its full
    /// form; absent when none is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<String>,
    /// When the schedule next starts a scrub (Unix seconds; now while one
    /// is due and waits for the running one to end).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_run: Option<u64>,
    /// Why the stored schedule cannot be read (then none runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule_error: Option<String>,
}

/// The daemon's recent I/O and space (`GET /v1/history`, the dashboard's
/// history): one sample every `interval_secs`, oldest first, for the last
/// 6 hours at most, since the daemon started.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HistoryView {
    pub interval_secs: u64,
    pub samples: Vec<HistorySample>,
}

/// One interval of [`HistoryView`]: NBD requests and bytes per second,
/// reads and writes (writes, write zeroes and trims), the engine's 99th
/// percentile per request (the upper bound of its latency bucket; none
/// without requests), and the pool's space in use at its end.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HistorySample {
    pub unix_secs: u64,
    pub read_iops: f64,
    pub write_iops: f64,
    pub read_bytes_per_sec: f64,
    pub write_bytes_per_sec: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p99_secs: Option<f64>,
    pub data_used_bytes: u64,
    pub metadata_used_bytes: u64,
}

/// `PUT /v1/scrub/schedule`: the pool's scrub schedule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScrubScheduleRequest {
    /// In the monitor's grammar: `every 1d`, `weekly on sun at 02:00`, ...
    pub schedule: String,
}

/// The pool's damaged data blocks (`GET /v1/pool/damage`, `arbor pool
/// damage`, `arbor check`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DamageView {
    pub blocks: Vec<DamagedBlockView>,
    /// Damaged blocks found while the pool's record was full (not listed).
    #[serde(default)]
    pub unlisted: u64,
    /// Reads that found damage since the daemon started (every one).
    #[serde(default)]
    pub found_since_start: u64,
}

/// One damaged data block: where it is, its sums, when it was found, and
/// who reads it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DamagedBlockView {
    /// The block's byte offset on the pool's device.
    pub device_offset: u64,
    /// The physical chunk and the 4 KiB block within it.
    pub chunk: u64,
    pub block: u32,
    /// The checksum it has, and the crc32c of what was read.
    pub stored_crc: u32,
    pub read_crc: u32,
    pub found_unix_secs: u64,
    pub last_found_unix_secs: u64,
    /// Volumes and snapshots that read it, at most 32 (`readers_count` says
    /// how many).
    pub readers: Vec<DamageReaderView>,
    pub readers_count: usize,
}

/// A volume or snapshot that reads a damaged block, and at which byte.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DamageReaderView {
    pub volume: String,
    pub offset: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReclaimView {
    /// Metadata nodes processed.
    pub processed: u64,
}

/// What a pool growth added.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GrowView {
    pub old_pool_bytes: u64,
    pub new_pool_bytes: u64,
    pub data_bytes_added: u64,
    pub metadata_bytes_added: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UpgradeView {
    /// False when the pool already was the newest version.
    pub upgraded: bool,
    pub format_version: u16,
}

/// The body of every API error response.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ErrorBody {
    /// Stable, machine-readable kind, such as `not_found`.
    pub code: ErrorCode,
    pub message: String,
}

// ---- API request bodies ------------------------------------------------------

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CreateVolumeRequest {
    pub name: String,
    pub size: ByteSize,
    /// `row` (the default: thin, redirect-on-write) or `cow`: the data in
    /// one contiguous, preallocated run of the pool, written in place;
    /// snapshots take copies (docs/CLI.md, "Layouts").
    #[serde(default, skip_serializing_if = "is_row")]
    pub layout: CreateLayout,
    /// Rate limits from the start (`volume create --max-iops ...`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos: Option<QosRequest>,
    /// Encrypted with a new data key (`volume create --encrypt`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<EncryptionRequest>,
}

/// The layout a new volume gets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "snake_case")]
pub enum CreateLayout {
    /// Thin, redirect-on-write: space is taken as it is written.
    #[default]
    Row,
    /// Copy-on-write: the whole size is allocated at once, in one
    /// contiguous run, and written in place; snapshots take copies.
    Cow,
}

fn is_row(layout: &CreateLayout) -> bool {
    *layout == CreateLayout::Row
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotRequest {
    pub name: String,
    #[serde(default, skip_serializing_if = "is_committed")]
    pub durability: Durability,
}

/// A daemon that predates deferred durability made everything durable.
fn durable_by_default() -> bool {
    true
}

/// When a new snapshot or clone is durable.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Durability {
    /// Before the call returns: the call commits the pool.
    #[default]
    Committed,
    /// At the pool's next commit (a client's flush, any management
    /// operation that commits, the commit interval): the call waits for no
    /// device, and a power cut before that commit loses the new volume
    /// whole, never part of it.
    Deferred,
}

fn is_committed(d: &Durability) -> bool {
    *d == Durability::Committed
}

/// `POST /v1/snapshots/group`: `VOLUME@SNAP` of distinct volumes, taken in
/// one commit.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct GroupSnapshotRequest {
    pub names: Vec<String>,
    #[serde(default, skip_serializing_if = "is_committed")]
    pub durability: Durability,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CloneRequest {
    pub snapshot: String,
    pub name: String,
    #[serde(default, skip_serializing_if = "is_committed")]
    pub durability: Durability,
    /// A clone of an encrypted snapshot given its own user key: the
    /// snapshot's key (`old`) opens the data key, which the clone's slot
    /// keeps wrapped by `new` (docs/SECURITY.md "Encryption at rest").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<KeyChangeRequest>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RollbackRequest {
    pub snapshot: String,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ResizeRequest {
    pub size: ByteSize,
}

/// Both optional: `{}` grows the pool onto its device's current size.
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct GrowRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<ByteSize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata_bytes: Option<ByteSize>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RenameRequest {
    pub to: String,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DestroyQuery {
    #[serde(default)]
    pub force: bool,
}

/// The query of `DELETE /v1/origins/{name}`.
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DetachQuery {
    /// Detach while NBD clients have it open (their I/O then fails).
    #[serde(default)]
    pub force: bool,
    /// Copy the volume's data into the pool first: the volume stays, with
    /// its snapshots and clones, its home in the pool.
    #[serde(default)]
    pub copy_to_pool: bool,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotsQuery {
    pub volume: Option<String>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DiffQuery {
    pub a: String,
    pub b: String,
}

/// How data records of a sent stream are encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StreamCompression {
    None,
    /// zstd per record (raw where that is not smaller).
    #[default]
    Zstd,
    /// The smallest of raw, zstd and zstd against the base's data.
    Best,
}

/// `GET /v1/send` and `GET /v1/send/estimate`.
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SendQuery {
    /// The snapshot to send, `vol@snap` (not with `resume`).
    pub snapshot: Option<String>,
    /// The base of an incremental stream.
    pub from: Option<String>,
    /// A receiver's resume token: continue that stream.
    pub resume: Option<String>,
    #[serde(default)]
    pub compression: StreamCompression,
    /// zstd level (1 ..= 19) [default: 3].
    pub level: Option<i32>,
    #[serde(default)]
    pub format: StreamFormat,
    /// A raw stream (an encrypted volume's ciphertext and wrapped key,
    /// sent without its key; docs/STREAM.md version 2).
    #[serde(default)]
    pub raw: bool,
}

/// The stream format of a send or receive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StreamFormat {
    /// arbor's own (docs/STREAM.md).
    #[default]
    Arbor,
    /// Ceph's `rbd diff` (v1 written; v1 and v2 read).
    RbdDiff,
}

/// What a stream will carry (`send --dry-run`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SendEstimateView {
    pub snapshot: String,
    pub from: Option<String>,
    /// Where the stream starts (a resumed stream's offset).
    pub resume_offset: u64,
    pub volume_size: u64,
    /// Bytes of data records, before compression.
    pub data_bytes: u64,
    /// Bytes the stream's zero and discard records cover.
    pub zero_bytes: u64,
    pub records: u64,
    /// The stream's size with every data record raw: compression only
    /// makes it smaller.
    pub stream_bytes_max: u64,
}

/// `POST /v1/receive/{volume}`.
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ReceiveQuery {
    /// Roll the volume forward even if it was written since the base, or
    /// while NBD clients have it open.
    #[serde(default)]
    pub force: bool,
    #[serde(default)]
    pub format: StreamFormat,
}

/// A finished receive.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReceivedView {
    pub snapshot: String,
    pub guid: String,
    pub stream_bytes: u64,
    pub data_bytes: u64,
    pub resumed_from: u64,
    /// An earlier receive into the volume that could never finish (its
    /// base is gone) was discarded.
    pub discarded: Option<String>,
}

/// What `POST /v1/heal/{volume}` did with a stream of a snapshot the
/// pool holds (`arbor receive --heal`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HealedView {
    /// The snapshot the stream is of, and its identity.
    pub snapshot: String,
    pub guid: String,
    /// Its damaged blocks when the stream began.
    pub damaged: u64,
    /// Damaged blocks rewritten with the stream's bytes (they matched
    /// their checksums).
    pub healed: u64,
    /// Damaged blocks the stream carried bytes for that do not match
    /// their checksums: left damaged.
    pub rejected: u64,
    /// Its blocks still damaged after the stream (not in it, or rejected).
    pub remaining: u64,
    pub stream_bytes: u64,
}

/// A receive in progress (`receive --status`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReceiveStatusView {
    pub volume: String,
    /// Give it to `arbor send --resume` on the sending side.
    pub token: String,
    pub target: String,
    pub base: Option<String>,
    /// Bytes of the volume received and committed.
    pub offset: u64,
    pub size: u64,
    /// Its base snapshot no longer exists: it can never finish, and the
    /// next receive into the volume discards it.
    #[serde(default)]
    pub stale: bool,
}

/// `GET /v1/snapshots/{name}/allocated` and `.../changed`: a page of block
/// metadata, the shape of the CSI SnapshotMetadata service.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MetadataQuery {
    /// For `changed`: the snapshot to compare with (CSI's base snapshot).
    pub base: Option<String>,
    /// Report ranges that end after this byte offset (a range that starts
    /// before it is reported whole).
    #[serde(default)]
    pub starting_offset: u64,
    /// Most ranges in this page (1 ..= 10000) [default: 256].
    pub max_results: Option<u32>,
}

/// One page of block metadata (CSI `GetMetadataAllocated` /
/// `GetMetadataDelta` responses, with a cursor).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MetadataPage {
    /// Always `"VARIABLE_LENGTH"`: each range has its own size.
    pub block_metadata_type: String,
    pub volume_capacity_bytes: u64,
    pub block_metadata: Vec<BlockMetadata>,
    /// Where the next page starts; `null` when this is the last.
    pub next_starting_offset: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockMetadata {
    pub byte_offset: u64,
    pub size_bytes: u64,
}

/// `POST /v1/replicas`: a new replication pair (`arbor replica add`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplicaAddRequest {
    pub volume: String,
    /// `HOST:PORT` of the target's replication listener.
    pub target: String,
    /// The volume's name on the target (default: the same).
    #[serde(default)]
    pub remote_volume: Option<String>,
    /// The identity the target's certificate must carry (default: HOST).
    #[serde(default)]
    pub identity: Option<String>,
    /// Bytes per second at most.
    #[serde(default)]
    pub rate_limit: Option<u64>,
    /// Seconds between cycles.
    #[serde(default)]
    pub interval_secs: Option<u64>,
    /// Replication snapshots kept on this side.
    #[serde(default)]
    pub keep: Option<u32>,
    /// The target was seeded by hand (`arbor receive` there).
    #[serde(default)]
    pub seeded: bool,
}

/// Which pairs of a volume a replica request is about.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ReplicaQuery {
    /// One target (`HOST:PORT`); all of the volume's pairs without.
    #[serde(default)]
    pub target: Option<String>,
    #[serde(default)]
    pub force: bool,
}

/// The state of a pair.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReplicaState {
    #[default]
    Idle,
    Running,
    Failed,
}

/// The cycle running now.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReplicaCycleView {
    pub snapshot: String,
    /// Stream bytes sent of the current snapshot, and its estimate.
    pub stream_sent: u64,
    pub stream_total: u64,
    /// Bytes sent on the connection this cycle.
    pub wire_bytes: u64,
    pub elapsed_secs: f64,
    pub bytes_per_sec: f64,
}

/// One pair, as `arbor replica status` shows it.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct ReplicaPairView {
    pub volume: String,
    pub target: String,
    pub remote_volume: String,
    pub state: ReplicaState,
    /// The last failure, while the pair is failed.
    pub error: Option<String>,
    /// Its kind: not_allowed, diverged, cycle, no_space, busy, protocol,
    /// failed, connection.
    pub error_kind: Option<String>,
    /// The newest snapshot the target is known to have.
    pub last_snapshot: Option<String>,
    /// Seconds since the target's copy was last known current (the
    /// recovery point).
    pub recovery_point_secs: Option<u64>,
    /// Unix time of the last cycle that succeeded.
    pub last_success: Option<u64>,
    pub bytes_sent_total: u64,
    pub cycles_ok: u64,
    pub cycles_failed: u64,
    /// Failures in a row (the backoff grows with them).
    pub failures: u32,
    pub cycle: Option<ReplicaCycleView>,
    /// Seconds until the next cycle.
    pub next_run_secs: Option<u64>,
    pub interval_secs: u64,
    pub rate_limit: Option<u64>,
    pub keep: Option<u32>,
    pub seeded: bool,
    /// A forced resync waits for the next cycle.
    pub resync: bool,
}

/// A volume this host holds as a replica.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReplicaRoleView {
    pub volume: String,
    /// Its one source (none after `demote`, until one replicates to it).
    pub source: Option<String>,
    /// The hosts its snapshots come through, master first.
    pub path: Vec<String>,
}

/// `POST /v1/replicas/{volume}/demote`: what demoting a volume makes a
/// forced resync able to discard here.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DemoteView {
    pub volume: String,
    /// It is a replica now (false for a dry run).
    pub demoted: bool,
    /// Its snapshots, oldest first: a forced resync from its next source
    /// may discard those after the newest one the source also has.
    pub snapshots: Vec<String>,
    /// It was written since its newest snapshot (or has none): a forced
    /// resync discards those writes too.
    pub written_since_newest: bool,
}

/// `GET /v1/replicas`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReplicasView {
    /// This host's identity in replication.
    pub identity: String,
    /// The replication listener, if on.
    pub listen: Option<String>,
    pub pairs: Vec<ReplicaPairView>,
    pub replicas: Vec<ReplicaRoleView>,
}

/// What one cycle did (`arbor replica run`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReplicaRunView {
    pub pair: String,
    pub taken: Option<String>,
    pub sent: Vec<String>,
    pub wire_bytes: u64,
    pub resumed_from: Vec<u64>,
    pub replicated: Option<String>,
    pub rolled_back: Vec<String>,
    pub pruned: Vec<String>,
    /// Damaged blocks of this host's snapshots healed with the target's
    /// copies.
    #[serde(default)]
    pub healed: u64,
    /// Blocks sent to heal damaged blocks of the target's snapshots.
    #[serde(default)]
    pub heal_sent: u64,
}

/// `PUT /v1/policies/{volume}`: the snapshot policy of a volume, and of the
/// volumes it names in `with` (a consistency group: snapshotted together,
/// in one commit).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyRequest {
    /// Other volumes snapshotted with it.
    #[serde(default)]
    pub with: Vec<String>,
    /// `every 15m`, `hourly`, `hourly at :30`, `daily at 23:59`,
    /// `weekly on mon at 02:00`, `monthly on 1 at 00:00` (UTC).
    pub schedule: String,
    /// `hourly=24,daily=7,weekly=4,monthly=6` or a grid
    /// `1x1h(keep=all) | 24x1h | 14x1d` (docs/MONITOR.md).
    pub retention: String,
    /// Snapshot name prefix [default: auto].
    #[serde(default)]
    pub prefix: Option<String>,
    #[serde(default)]
    pub warn_age_secs: Option<u64>,
    #[serde(default)]
    pub crit_age_secs: Option<u64>,
    /// Prune beyond retention while the pool is fuller than this (50-99).
    #[serde(default)]
    pub space_prune_percent: Option<u8>,
}

/// A policy and how it is doing (`arbor policy show`, `GET /v1/policies`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PolicyView {
    /// The policy's key in the pool.
    pub id: String,
    /// Its volumes, by name (destroyed ones are dropped).
    pub volumes: Vec<String>,
    pub schedule: String,
    pub retention: String,
    pub prefix: String,
    /// Effective snapshot age thresholds.
    pub warn_age_secs: u64,
    pub crit_age_secs: u64,
    pub space_prune_percent: Option<u8>,
    /// Unix time of the newest snapshot the policy made, if any.
    pub last_run: Option<u64>,
    /// Unix time of the next scheduled snapshot.
    pub next_run: Option<u64>,
    /// Snapshots the policy made that exist now, over all its volumes.
    pub snapshots: u64,
    /// Unix time of the last prune, and what it destroyed.
    pub last_prune: Option<u64>,
    pub last_pruned: u64,
    /// Prunes or snapshots that failed in a row.
    pub failures: u32,
    pub last_error: Option<String>,
}

/// `POST /v1/prune`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PruneRequest {
    /// One volume's policy [default: every policy].
    #[serde(default)]
    pub volume: Option<String>,
    /// List what would be destroyed, destroy nothing.
    #[serde(default)]
    pub dry_run: bool,
}

/// One snapshot in a prune.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PruneDecisionView {
    pub name: String,
    pub created_unix_secs: u64,
    /// Why: retention, space, or what keeps it (held by ..., kept by hourly, ...).
    pub reason: String,
    /// What destroying it alone frees now (its exclusive bytes).
    pub frees_bytes: u64,
}

/// A snapshot a prune could not destroy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PruneFailureView {
    pub name: String,
    pub error: String,
}

/// A prune of one volume's snapshots.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PruneVolumeView {
    pub volume: String,
    pub policy: String,
    /// Destroyed (or, in a dry run, to be), oldest first.
    pub destroy: Vec<PruneDecisionView>,
    pub keep: Vec<PruneDecisionView>,
    pub failed: Vec<PruneFailureView>,
}

/// `POST /v1/prune`: what a prune destroyed, or would.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PruneView {
    pub dry_run: bool,
    pub volumes: Vec<PruneVolumeView>,
    /// Sum of `frees_bytes` over what is destroyed.
    pub frees_bytes: u64,
}

/// How bad an alert is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    Warning,
    Critical,
}

/// What an alert is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AlertKind {
    /// A policy volume's newest snapshot is older than its warn/crit age.
    SnapshotAge,
    DataUsage,
    MetadataUsage,
    /// A policy's prune (or scheduled snapshot) failed.
    PruneFailed,
    /// A replication pair's recovery point is too old.
    ReplicationLag,
    /// Space-aware pruning destroyed snapshots beyond retention.
    SpacePruned,
    /// An origin's device shrank: the origin serves no I/O until its loss
    /// is accepted (`origin attach --accept-damage`).
    OriginFailed,
    /// Data blocks of the pool do not match their checksums (reads of them
    /// fail; `arbor pool damage` lists them).
    DataDamage,
    /// The scrub stopped on an error (a step or its metadata check failed,
    /// a scheduled one could not start, its record in the pool is
    /// damaged); clears when a scrub runs to completion.
    ScrubFailed,
    /// The pool's scrub schedule is damaged (its stored value does not
    /// parse), so no scrub is scheduled; clears when it is set or cleared.
    ScrubScheduleDamaged,
    /// The metadata check at the end of the last completed scrub found
    /// problems (`arbor check` lists them); clears when a scrub's check
    /// finds none.
    ScrubMetadataProblems,
    /// A scheduled backup (subject `REPOSITORY:VOLUME`) or a repository's
    /// scheduled prune (subject `REPOSITORY`) failed; clears when one
    /// succeeds.
    BackupFailed,
    /// A scheduled volume's newest backup is older than two schedule
    /// periods (critical at four); clears when a backup completes.
    BackupOverdue,
    /// An instant restore (subject: its volume) cannot fill its volume:
    /// the store fails, it waits to be taken up after a restart, or blocks
    /// of damaged blobs failed (critical: their reads fail). Clears when it
    /// completes or its volume is destroyed.
    RestoreIncomplete,
}

/// An active alert (`GET /v1/alerts`, `arbor pool status`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AlertView {
    pub kind: AlertKind,
    pub severity: Severity,
    /// The volume, pair or space it is about.
    pub subject: String,
    pub message: String,
    /// Unix time it was raised (at this severity or above).
    pub since_unix_secs: u64,
}

/// A volume or snapshot with its space, as the dashboard shows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OverviewVolume {
    #[serde(flatten)]
    pub volume: VolumeView,
    /// What destroying it alone frees.
    pub exclusive_bytes: u64,
    pub shared_bytes: u64,
    /// The policy it is in, for a volume.
    pub policy: Option<String>,
    /// For a snapshot a policy made, that policy's id: its name is the
    /// policy's prefix and a time, the rule by which the monitor counts,
    /// ages and prunes the policy's snapshots. None for any other
    /// snapshot, whatever its name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_snapshot: Option<String>,
    /// What `DELETE /v1/volumes/{name}` would refuse it for now (the same
    /// checks the destroy makes); empty: it would be destroyed.
    #[serde(default)]
    pub destroy_blockers: Vec<DestroyBlocker>,
}

/// One reason a destroy would be refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DestroyBlocker {
    pub reason: BlockerReason,
    /// What it is, in a sentence.
    pub message: String,
    /// The volumes, snapshots or hold tags concerned, if any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub names: Vec<String>,
    /// Whether `force=true` overrides it.
    pub forced: bool,
}

/// Why a destroy would be refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockerReason {
    /// Snapshots or clones read through it (a copy-on-write volume or an
    /// origin): never forced; destroy them first, or (an origin) copy it
    /// into the pool.
    ReadsThrough,
    /// NBD clients have it open.
    Open,
    /// A send reads it.
    Sending,
    /// Hold tags (`arbor hold`).
    Held,
}

/// Who a request authenticated as, and what it may do: `GET /v1/whoami`
/// and the overview's `caller`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CallerView {
    /// `local` (the Unix socket), `token NAME` or `certificate IDENTITY`.
    pub who: String,
    pub scope: Scope,
}

/// `GET /v1/overview`: everything the dashboard shows, in one answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OverviewView {
    pub now_unix_secs: u64,
    pub pool: PoolView,
    pub volumes: Vec<OverviewVolume>,
    pub policies: Vec<PolicyView>,
    pub replication: ReplicasView,
    pub alerts: Vec<AlertView>,
    /// Where the scrub stands.
    #[serde(default)]
    pub scrub: ScrubView,
    /// The damaged data blocks, while the pool has any (`pool.damaged_blocks`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub damage: Option<DamageView>,
    /// Backup repositories with their schedules, and backup jobs under way.
    #[serde(default)]
    pub backups: BackupsOverview,
    /// Who asked, and with which scope: the dashboard offers only what it
    /// may do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caller: Option<CallerView>,
}

/// What an API credential (a token, a client certificate) may do: `read`
/// may only read (GET and HEAD), `admin` everything.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    Read,
    Admin,
}

impl Scope {
    pub fn name(self) -> &'static str {
        match self {
            Scope::Read => "read",
            Scope::Admin => "admin",
        }
    }
}

/// `POST /v1/tokens`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenRequest {
    pub name: String,
    pub scope: Scope,
    /// Seconds from now until the token stops working; none: never.
    #[serde(default)]
    pub expires_in_secs: Option<u64>,
}

/// One API token, as listed: never its secret (which is not kept).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TokenView {
    pub name: String,
    /// The public part of the token (`arbor_ID_...`), for telling tokens
    /// apart in logs; not a secret.
    pub id: String,
    pub scope: Scope,
    pub created_unix_secs: u64,
    pub expires_unix_secs: Option<u64>,
    pub expired: bool,
    /// The last request it authenticated (saved at most hourly).
    pub last_used_unix_secs: Option<u64>,
}

/// The answer to `POST /v1/tokens`: the one time the secret is shown.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CreatedTokenView {
    pub token: TokenView,
    pub secret: String,
}

/// A backup repository the daemon is configured with
/// (`backup_repositories`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackupRepositoryView {
    pub name: String,
    /// `s3://BUCKET/PREFIX` or a directory.
    pub url: String,
    /// Its scheduled backups, if it has a schedule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<BackupScheduleView>,
}

/// The dashboard's backup view: `GET /v1/backups` and `GET
/// /v1/backup-jobs` together.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackupsOverview {
    pub repositories: Vec<BackupRepositoryView>,
    pub jobs: Vec<BackupJobView>,
}

/// A backup, restore, verify or prune under way (`GET /v1/backup-jobs`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackupJobView {
    pub id: u64,
    /// `backup`, `restore`, `verify` or `prune`.
    pub kind: String,
    pub repository: String,
    /// The snapshot backed up, or the volume restored into.
    pub subject: String,
    pub started_unix: u64,
    /// Bytes of the volume to read (backup) or write (restore), or of
    /// packs to read (verify), and of them done.
    pub total_bytes: u64,
    pub done_bytes: u64,
    /// Bytes sent to or read from the store, and objects written.
    pub store_bytes: u64,
    pub objects: u64,
    /// Over the job so far, and the time left at that rate.
    pub rate_bytes_per_sec: u64,
    pub eta_secs: Option<u64>,
}

/// A repository's scheduled backups (`schedule`, `volumes`, `keep` in
/// `backup_repositories`) and how they go.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackupScheduleView {
    /// As a snapshot policy's (`daily at 02:00`, `every 6h`).
    pub schedule: String,
    /// The retention its scheduled prunes keep by, if any.
    pub keep: Option<String>,
    pub last_prune_unix: Option<u64>,
    /// Why its last prune (or reading its list) failed, while it fails.
    pub error: Option<String>,
    pub volumes: Vec<ScheduledVolumeView>,
}

/// One scheduled volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduledVolumeView {
    pub volume: String,
    /// When its newest backup from this host completed, and its id.
    pub last_success_unix: Option<u64>,
    pub last_backup: Option<String>,
    /// Failed runs in a row, and the last one's error.
    pub failures: u32,
    pub last_error: Option<String>,
    /// When it runs next (a failed run is retried after a backoff).
    pub next_run_unix: u64,
}

/// `POST /v1/backups/{repository}`: back up a snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackupRequest {
    /// `volume@snapshot`.
    pub snapshot: String,
}

/// One backup in a repository (docs/BACKUP.md).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackupView {
    /// 64 hex digits; any unique prefix of 8 or more names it.
    pub id: String,
    pub volume: String,
    pub snapshot: String,
    pub host: String,
    pub created_unix: u64,
    pub completed_unix: u64,
    pub size: u64,
    /// Bytes of blocks that do not read as zeros.
    pub mapped_bytes: u64,
    /// The backup it was made from (incremental), if any.
    pub parent: Option<String>,
    /// Blobs it added to the repository and their stored bytes
    /// (compressed, sealed): what it cost in the store.
    pub added_blobs: u64,
    pub added_bytes: u64,
}

/// `GET /v1/backups/{repository}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackupListView {
    pub repository: String,
    pub url: String,
    /// The repository's id (32 hex digits) and block size.
    pub id: String,
    pub block_size: u32,
    /// Oldest first.
    pub backups: Vec<BackupView>,
}

/// `POST /v1/backups/{repository}/restore`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RestoreRequest {
    /// The backup's id or a unique prefix of 8 or more of its digits.
    pub backup: String,
    /// The new volume (must not exist).
    pub volume: String,
    /// Serve the volume at once, fetching on first read what has not
    /// arrived yet, and answer as soon as it exists (docs/BACKUP.md,
    /// "Instant restore"); the restore goes on in the background.
    #[serde(default)]
    pub instant: bool,
}

/// A restore done.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestoreView {
    pub backup: String,
    pub volume: String,
    pub size: u64,
    /// Bytes written (blocks that do not read as zeros); for an instant
    /// restore, none yet: it goes on (`restoring` in the volume's view).
    pub restored_bytes: u64,
    #[serde(default)]
    pub instant: bool,
}

/// A volume being restored while it serves (`VolumeView::restoring`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestoringView {
    pub repository: String,
    pub backup: String,
    /// `filling`; `waiting` (the store fails: retried); `resuming` (after a
    /// restart, until the repository answers); `failed` (blocks whose blobs
    /// are damaged or missing: reads of them fail; a restart retries).
    pub state: String,
    /// Bytes of the volume in place (restored, or written by clients).
    pub done_bytes: u64,
    pub size: u64,
    #[serde(default)]
    pub failed_blocks: u64,
    /// What it waits for, or why blocks failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// `POST /v1/backups/{repository}/verify`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VerifyRequest {
    /// Percent of the packs to read whole, chosen at random (1 to 100;
    /// default 100). Every backup's map is checked whatever it is.
    #[serde(default)]
    pub sample_percent: Option<u8>,
}

/// `POST /v1/backups/{repository}/prune`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackupPruneRequest {
    /// Which backups to keep, as a snapshot policy's retention
    /// (`daily=7,weekly=4,monthly=12`, or a grid `24x1h | 30x1d`), applied
    /// to each volume's backups from each host; the newest backup of each
    /// is always kept. None: forget no backup, only delete what no backup
    /// needs.
    #[serde(default)]
    pub keep: Option<String>,
    /// Say what would be deleted; change nothing.
    #[serde(default)]
    pub dry_run: bool,
    /// Repack a pack when at least this percent of it is unused (default
    /// 25; 100 repacks only packs wholly unused, which are deleted).
    #[serde(default)]
    pub repack_unused_percent: Option<u8>,
}

/// A backup a prune forgot or kept, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrunedBackupView {
    pub backup: BackupView,
    /// `not kept by retention`, `kept by daily`, `newest policy snapshot`,
    /// `no retention given`, ...
    pub reason: String,
}

/// What a prune did (or, in a dry run, would do). Object names are the
/// store's.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackupPruneView {
    pub repository: String,
    pub dry_run: bool,
    /// Backups forgotten, and kept, oldest first.
    pub forgotten: Vec<PrunedBackupView>,
    pub kept: Vec<PrunedBackupView>,
    /// Packs deleted (no backup needs a blob of theirs).
    pub deleted_packs: Vec<String>,
    /// Packs rewritten (their used blobs copied to new packs), then deleted.
    pub repacked_packs: Vec<String>,
    /// Those of `repacked_packs` rewritten for being small (under 4 MiB:
    /// each backup's last pack), combined with others, not for their
    /// unused bytes.
    #[serde(default)]
    pub small_packs: Vec<String>,
    /// Index objects replaced by new ones.
    pub replaced_indexes: Vec<String>,
    pub written_packs: u64,
    pub written_indexes: u64,
    pub kept_blobs: u64,
    pub removed_blobs: u64,
    /// Bytes of packs before and after.
    pub bytes_before: u64,
    pub bytes_after: u64,
    /// Locks found stale, and deleted (a dry run deletes none).
    pub stale_locks: Vec<String>,
    /// Checkpoints of unfinished backups whose blobs stay, and those
    /// deleted (a week old, or damaged).
    #[serde(default)]
    pub kept_checkpoints: u64,
    #[serde(default)]
    pub deleted_checkpoints: Vec<String>,
}

/// What a verify of a repository found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerifyView {
    pub repository: String,
    pub backups: u64,
    pub packs_total: u64,
    pub packs_read: u64,
    pub blobs_checked: u64,
    pub bytes_read: u64,
    /// What is wrong (the first 1000), each naming the object.
    pub problems: Vec<String>,
    pub problem_count: u64,
}
