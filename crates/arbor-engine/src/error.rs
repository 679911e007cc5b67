//! Everything the engine can report, as a type whose shape says what the
//! caller must do: an error [stops the pool](Fault), [refuses one
//! operation](Refusal), or [ran out of a resource](Resource). Each carries
//! a typed reason; its message is the one callers (and the docs) know.
//! Corruption is a value, never a panic.

use std::io;

use arbor_format::{DeviceIdentity, FormatError, FormatVersion};

/// An engine error: which class it is decides what happens next.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The in-memory state can no longer be trusted: the pool stops.
    #[error(transparent)]
    Stop(#[from] Fault),
    /// This operation is refused; the pool goes on.
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// The pool ran out of something; it may clear up (a reclaim, a grow).
    #[error(transparent)]
    Exhausted(#[from] Resource),
    /// Data read from the device does not match its checksum: this request
    /// fails (a client sees EIO); the pool goes on.
    #[error(transparent)]
    Damaged(#[from] Damage),
}

/// A block of data whose checksum does not match what the device returned
/// (FORMAT.md §6.4): damaged on the device, or a lost or misdirected write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("data damaged: block {block} of data chunk {pchunk} does not match its checksum (stored {stored:#010x}, read {computed:#010x})")]
pub struct Damage {
    pub pchunk: u64,
    /// The 4 KiB block within the chunk.
    pub block: u32,
    pub stored: u32,
    pub computed: u32,
}

/// Why the pool stops (every later call fails until it is reopened).
#[derive(Debug, thiserror::Error)]
pub enum Fault {
    #[error("I/O error: {0}")]
    Io(#[from] io::Error),
    /// The reason is part of the message (not also a `source()`), so error
    /// chains print it once.
    #[error("pool is damaged at {location}: {reason}")]
    Corrupt {
        location: String,
        reason: FormatError,
    },
    /// A broken invariant or damaged structure; the text says which.
    #[error("pool is damaged: {0}")]
    Inconsistent(String),
    /// Only an open returns it.
    #[error("not an arbor pool (no valid superblock)")]
    NotAPool,
    /// An earlier error stopped the pool; the text is that error.
    #[error("the pool stopped after a failed commit and must be reopened: {0}")]
    Failed(String),
}

/// What the pool ran out of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Resource {
    #[error("pool data space is full")]
    DataSpace,
    #[error("pool metadata space is full")]
    Metadata,
    /// A step of an operation would change more space-map pages than one
    /// commit can journal. The engine commits and runs the step again in an
    /// empty transaction; it reaches a caller only if a single step needs
    /// more than the whole journal.
    #[error("one step of the operation changes more space-map pages than the journal holds")]
    Journal,
}

/// Why an operation is refused.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error("no such volume or snapshot: {0}")]
    NotFound(String),
    #[error("a volume or snapshot named {0:?} already exists")]
    AlreadyExists(String),
    #[error("invalid name {name:?}: {reason}")]
    InvalidName { name: String, reason: String },
    #[error("invalid argument: {0}")]
    Invalid(Invalid),
    #[error("{0} is a read-only snapshot")]
    ReadOnly(String),
    /// The operation conflicts with the pool's state (a receive of another
    /// stream in progress, a volume written since a stream's base); the
    /// message says what to do.
    #[error("{0}")]
    Conflict(Conflict),
    /// The pool's format version, or the volume's layout, cannot do this;
    /// the message names the upgrade if there is one.
    #[error("{0}")]
    Unsupported(Unsupported),
    /// The external device of a copy-on-write volume is not attached,
    /// vanished, shrank or failed: the request fails, the pool goes on.
    #[error("copy-on-write volume {0}")]
    Origin(OriginUnavailable),
}

/// What was invalid about an argument, with the numbers.
#[derive(Debug, thiserror::Error)]
pub enum Invalid {
    /// A reason of a crate built on the engine (a policy that does not
    /// validate, a growth the daemon refuses), in its words; the engine
    /// itself never makes one.
    #[error("{0}")]
    Request(String),

    // Creating a pool.
    #[error("chunk size {0} is not a power of two between 4 KiB and 1 MiB")]
    ChunkSize(u32),
    #[error("metadata space must be at least 1 MiB")]
    MetadataTooSmall,
    #[error("journal of {pages} pages: must hold {min} to {max}")]
    JournalPages { pages: u32, min: u32, max: u32 },
    #[error("metadata size overflows")]
    MetadataOverflow,
    #[error("device of {device_bytes} bytes is too small: metadata needs {metadata_bytes} bytes and at least 16 data chunks must remain")]
    DeviceTooSmall {
        device_bytes: u64,
        metadata_bytes: u64,
    },
    #[error("computed layout is invalid: {0}")]
    Layout(FormatError),
    #[error("format version: {0}")]
    FormatVersion(FormatError),
    #[error("space map too large")]
    SpaceMapTooLarge,

    // Growing a pool.
    #[error("the pool is format version {0}, which cannot grow; upgrade it to version 2 first (older arbor releases cannot open it then)")]
    CannotGrow(FormatVersion),
    #[error("the pool ends at byte {end}; it cannot shrink to {size} bytes")]
    PoolShrink { end: u64, size: u64 },
    #[error("cannot enlarge the pool's file to {size} bytes: {error}")]
    PoolFileNotEnlarged { size: u64, error: io::Error },
    /// The format's refusal of the growth plan (too many growths, ...).
    #[error("{0}")]
    Growth(FormatError),

    // Sizes and ranges of volumes.
    #[error("volume size {size} must be a non-zero multiple of {sector} up to {max}")]
    VolumeSize { size: u64, sector: u64, max: u64 },
    #[error("healing takes whole 4 KiB blocks: {offset}+{len} is not")]
    HealUnaligned { offset: u64, len: u64 },
    #[error(
        "{len} bytes at {offset}: an encrypted volume takes whole, aligned units of {unit} bytes"
    )]
    EncryptedUnaligned { offset: u64, len: u64, unit: u64 },
    #[error("an encrypted volume's size is a multiple of the pool's chunk size ({chunk} bytes): {size} is not")]
    EncryptedSize { size: u64, chunk: u64 },
    #[error("key slot {0}: no key is loaded in it")]
    KeyNotLoaded(u64),
    #[error("{0} is not encrypted")]
    NotEncrypted(String),
    #[error("the pool's key store: {0}")]
    KeyStore(String),
    #[error("{base} is encrypted: a stream of plaintext cannot go onto it; send the increment raw (arbor send --raw)")]
    PlainOntoEncrypted { base: String },
    #[error(
        "the stream is raw (an encrypted volume's data), but its base {base} is not encrypted"
    )]
    RawOntoPlain { base: String },
    #[error("the stream's data key is not {base}'s: a raw increment goes onto a base encrypted with the same key")]
    RawKeyMismatch { base: String },
    #[error("the key given for a clone of {snapshot} wraps another data key than its")]
    CloneKeyMismatch { snapshot: String },
    #[error("a receive in progress into {volume} holds data encrypted with another key than the stream's")]
    RawResumeKeyMismatch { volume: String },
    #[error("{offset}+{len} of {name} is not all mapped: a raw read is of data the pool stores")]
    RawUnmapped { offset: u64, len: u64, name: String },
    #[error("{offset}+{len}: raw data goes in whole chunks of {chunk} bytes")]
    RawUnaligned { offset: u64, len: u64, chunk: u64 },
    #[error("range {offset}+{len} is beyond the end of {name} ({size} bytes)")]
    RangeBeyondEnd {
        offset: u64,
        len: u64,
        name: String,
        size: u64,
    },
    #[error("write to byte {end} beyond the end of {name} ({size} bytes; resized meanwhile?)")]
    WriteBeyondEnd { end: u64, name: String, size: u64 },
    #[error("{0} was resized meanwhile")]
    ResizedMeanwhile(String),
    #[error("chunk {0} is not mapped")]
    ChunkNotMapped(u64),
    #[error("chunk {0} is partial")]
    ChunkPartial(u64),

    // Snapshots, clones, holds, names.
    #[error("a group snapshot takes 1 to {max} snapshots, not {given}")]
    GroupSize { max: usize, given: usize },
    #[error("{0} is named twice in one group snapshot")]
    NamedTwice(String),
    #[error("{0} is not a snapshot; snapshot it first")]
    CloneOfVolume(String),
    #[error("{snapshot} is not a snapshot of {volume}")]
    NotSnapshotOf { snapshot: String, volume: String },
    #[error("a snapshot keeps its volume's name")]
    SnapshotRename,
    #[error("{0} is not a snapshot: only snapshots are held")]
    HoldOfVolume(String),
    #[error("hold tag {tag:?}: {reason}")]
    HoldTag { tag: String, reason: String },

    // Properties.
    #[error("property key {key:?}: 1 to {max} of letters, digits and . _ : -, starting with a letter or digit")]
    PropertyKey { key: String, max: usize },
    /// The format's refusal of the value (too large).
    #[error("{0}")]
    PropertyValue(FormatError),

    // Receiving streams.
    #[error("a stream identity of zeros")]
    ZeroStreamIdentity,
    #[error("the stream's base {0} is not a snapshot")]
    StreamBaseNotSnapshot(String),
    #[error("the stream's base is {base}, which is not a snapshot of {volume}; receive into a new volume to make it a clone of {base}")]
    StreamBaseElsewhere { base: String, volume: String },
    #[error("{0} is not a receive in progress")]
    NotAReceive(String),
    #[error("checkpoint at {offset} of {name}")]
    Checkpoint { offset: u64, name: String },
    #[error("{name} is not a receive into {volume}")]
    ReceiveElsewhere { name: String, volume: String },

    // Copy-on-write volumes.
    #[error("a copy-on-write volume holds at most {max_chunks} chunks ({max_bytes} bytes with this pool's chunks)")]
    CowTooLarge { max_chunks: u64, max_bytes: u64 },
    #[error("{0} has its data in the pool, not on a device")]
    DataInPool(String),
    #[error("a device of {size} bytes: an origin must be a non-zero multiple of {sector} bytes up to {max}")]
    OriginDeviceSize { size: u64, sector: u64, max: u64 },
    #[error("{0} is not an origin: its home is in the pool already")]
    NotAnOrigin(String),
    #[error("{name}'s device has {size} bytes: enlarge it to {new_size} with its own tools first ({error})")]
    OriginDeviceTooSmall {
        name: String,
        size: u64,
        new_size: u64,
        error: io::Error,
    },
}

/// What in the pool's state an operation conflicts with; each message says
/// what to do.
#[derive(Debug, thiserror::Error)]
pub enum Conflict {
    /// A reason of a crate built on the engine (the daemon's attach and
    /// policy rules), in its words; the engine itself never makes one.
    #[error("{0}")]
    Request(String),

    // Holds, properties, receives.
    #[error("{name} is held ({}); release the hold{} (arbor release) or destroy it with --force", .holds.join(", "), plural(.holds.len() == 1))]
    Held { name: String, holds: Vec<String> },
    #[error("property {0} was set again meanwhile")]
    PropertySetAgain(String),
    #[error("a receive of another stream into {volume} is in progress (snapshot {snapshot}); resume it, or abort it with `arbor receive --abort {volume}`")]
    ReceiveInProgress { volume: String, snapshot: String },
    #[error("this pool already has the stream's snapshot, as {name} (identity {identity})")]
    HaveSnapshot { name: String, identity: String },
    /// A receive discarded an earlier one (`note`), then failed.
    #[error("{note}; then: {error}")]
    AfterDiscard { note: String, error: Box<Error> },
    #[error("the stream's base snapshot (identity {0}) was deleted during the receive")]
    BaseDeleted(String),
    #[error("{volume} was written since {base}; receive with --force to discard those changes")]
    WrittenSinceBase { volume: String, base: String },

    // Copy-on-write volumes and origins.
    #[error("{name} has {readers} snapshot{} and clone{} reading through {epochs} of its epochs; destroy them first", plural(*.readers == 1), plural(*.readers == 1))]
    ReadThrough {
        name: String,
        readers: u64,
        epochs: usize,
    },
    #[error("{0} changed meanwhile (resized, rolled back, or not an origin)")]
    HomeChanged(String),
    #[error("{0} is being rolled back; try again when it is done")]
    RollingBack(String),
    /// A volume still being filled (`Pool::set_incomplete`).
    #[error("{name} is {why}; its snapshots, renames and resizes wait until that ends")]
    Incomplete { name: String, why: String },
    #[error("a rollback of {0} to another snapshot was interrupted; run that one again first")]
    OtherRollback(String),
    #[error("{name} was attached from another device (device {:#x}, inode {}); this one is device {:#x}, inode {}", .recorded.dev, .recorded.ino, .identity.dev, .identity.ino)]
    OtherDevice {
        name: String,
        recorded: DeviceIdentity,
        identity: DeviceIdentity,
    },
    #[error("{name}'s device was {was} bytes and is {now} now: what it held from byte {now} on is lost, and recorded so (its snapshots will fail reads of it); to serve {name} again, enlarge the device to {was} bytes and attach it with --accept-damage")]
    DeviceSmaller { name: String, was: u64, now: u64 },
    #[error("{name}'s device shrank to {to} bytes while attached (or while the daemon was stopped): what it held from there on is lost, and a device grown back reads zeros there, not {name}'s data; its snapshots taken before fail reads of that range (arbor check lists them). To serve {name} again as its device is now, attach it with --accept-damage")]
    ShrankWhileAttached { name: String, to: u64 },
    #[error("{0} is attached: its device is known")]
    Attached(String),
    #[error("{0} was resized or detached meanwhile")]
    ResizedOrDetached(String),
    #[error("{0} changed meanwhile")]
    Changed(String),
    #[error("the volume changed meanwhile; try again")]
    VolumeChanged,
    /// An encrypted volume whose key is not loaded (FORMAT.md §6.6).
    #[error("{0} is encrypted and locked: load its key first (arbor key load)")]
    Locked(String),
}

/// The plural ending, unless there is `one`.
fn plural(one: bool) -> &'static str {
    if one {
        ""
    } else {
        "s"
    }
}

/// Why the external device of a copy-on-write volume cannot serve a
/// request (each message follows "copy-on-write volume ").
#[derive(Debug, thiserror::Error)]
pub enum OriginUnavailable {
    #[error("{name}: its device is not attached (arbor origin attach {name} PATH)")]
    NotAttached { name: String },
    #[error("{name}: its device is not attached, so it cannot be rolled back now; attach it first (arbor origin attach {name} PATH)")]
    NotAttachedForRollback { name: String },
    #[error("{name}: its device shrank from {was} to {now} bytes while attached, so it serves no I/O: what it held from byte {now} on is lost (arbor origin list shows it; arbor origin attach {name} PATH --accept-damage serves it again)")]
    Shrunk { name: String, was: u64, now: u64 },
    #[error("{name}: its device shrank from {was} to {now} bytes ({error})")]
    ShrankDuringIo {
        name: String,
        was: u64,
        now: u64,
        error: io::Error,
    },
    #[error("{name}: its device is unusable: {why} ({error})")]
    Unusable {
        name: String,
        why: io::Error,
        error: io::Error,
    },
    #[error("{name}: device I/O failed: {error}")]
    DeviceIo { name: String, error: io::Error },
    #[error("{name}: its device could not be enlarged: {error}")]
    NotEnlarged { name: String, error: io::Error },
    #[error("the device of a copy-on-write volume failed to flush: {0}")]
    FlushFailed(io::Error),
    /// A rollback that a power cut interrupted must finish first.
    #[error("{name}: a rollback was interrupted; run it again (arbor rollback)")]
    RollbackInterrupted { name: String },
    /// As [`OriginUnavailable::RollbackInterrupted`], refusing a move of
    /// the home.
    #[error("{name}: a rollback was interrupted; run it again (arbor rollback) first")]
    RollbackInterruptedFirst { name: String },
    #[error("{name}: the snapshot lost what it read from byte {from} on when the device shrank; a rollback to it would put zeros there as if they were its data")]
    RollbackToLost { name: String, from: u64 },
    #[error("{name}: a snapshot taken before its device shrank read bytes from {from} on through the device, and they are lost: they read as an error, never as zeros (arbor check lists what each snapshot lost)")]
    ReadOfLost { name: String, from: u64 },
    #[error("{name}: this write would overwrite bytes past {from} that snapshots taken before its device shrank read, and lost: destroy those snapshots (arbor check lists them) to write there")]
    WriteOverLost { name: String, from: u64 },
}

/// What the pool's format or a volume's layout cannot do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unsupported {
    /// The pool's format version lacks a capability; an upgrade adds it.
    #[error(
        "this pool's format (version {} or older) {}; upgrade it first (arbor pool upgrade)",
        .0.newest_without(),
        .0.lacking()
    )]
    Format(Capability),
    #[error("{name} has taken {max} snapshots, the most one copy-on-write volume can")]
    TooManyEpochs { name: String, max: u64 },
    #[error("{0} reads through a copy-on-write volume: it cannot be resized")]
    ResizeThroughCow(String),
    #[error("{0} is a copy-on-write volume: it cannot shrink (its snapshots may read its home past the new end)")]
    CowShrink(String),
    #[error("{0} is an origin: it cannot shrink (its snapshots may read its device past the new end); detach it and shrink the file or device with its own tools")]
    OriginShrink(String),
    #[error("{0} is a copy-on-write volume: its writes go in place, where nothing records when; find what changed between two of its snapshots instead (arbor diff)")]
    ChangesOfCow(String),
    #[error("{a} and {b}: diffs and changed blocks are found between volumes whose data is in the pool, and between a copy-on-write volume and what reads through it (its snapshots, their clones and the clones' snapshots); not between these")]
    DiffPair { a: String, b: String },
    #[error("{0} reads through a copy-on-write volume: incremental streams onto it are not supported yet")]
    IncrementalOntoCow(String),
}

/// A capability that older format versions lack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Capability {
    Receive,
    Holds,
    Properties,
    CowVolumes,
    Encryption,
    EncryptedReceive,
}

impl Capability {
    /// The newest format version without it (the message's "or older").
    fn newest_without(self) -> u16 {
        match self {
            Capability::Receive | Capability::Holds => 2,
            Capability::Properties => 3,
            Capability::CowVolumes => 4,
            Capability::Encryption => 10,
            Capability::EncryptedReceive => 11,
        }
    }

    /// What a pool without it cannot do, as the message says it.
    fn lacking(self) -> &'static str {
        match self {
            Capability::Receive => "cannot receive streams",
            Capability::Holds => "cannot hold snapshots",
            Capability::Properties => "cannot keep properties such as policies",
            Capability::CowVolumes => "has no copy-on-write volumes",
            Capability::Encryption => "has no encrypted volumes",
            Capability::EncryptedReceive => "cannot receive into encrypted volumes",
        }
    }
}

/// The class of an [`Error`], for callers that only need to know that.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    Stop,
    Refused,
    Exhausted,
    Damaged,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Self {
        Error::Stop(Fault::Io(e))
    }
}

impl From<Conflict> for Error {
    fn from(why: Conflict) -> Self {
        Error::Refused(Refusal::Conflict(why))
    }
}

impl From<OriginUnavailable> for Error {
    fn from(why: OriginUnavailable) -> Self {
        Error::Refused(Refusal::Origin(why))
    }
}

impl From<Unsupported> for Error {
    fn from(why: Unsupported) -> Self {
        Error::Refused(Refusal::Unsupported(why))
    }
}

impl From<Invalid> for Error {
    fn from(why: Invalid) -> Self {
        Error::Refused(Refusal::Invalid(why))
    }
}

impl Error {
    pub(crate) fn corrupt(location: impl Into<String>, reason: FormatError) -> Self {
        Fault::Corrupt {
            location: location.into(),
            reason,
        }
        .into()
    }

    pub(crate) fn inconsistent(what: impl Into<String>) -> Self {
        Fault::Inconsistent(what.into()).into()
    }

    pub(crate) fn failed(why: impl Into<String>) -> Self {
        Fault::Failed(why.into()).into()
    }

    /// A caller's own reason for refusing an argument ([`Invalid::Request`]).
    pub fn invalid_request(why: impl Into<String>) -> Self {
        Invalid::Request(why.into()).into()
    }

    pub fn not_found(name: impl Into<String>) -> Self {
        Refusal::NotFound(name.into()).into()
    }

    pub fn already_exists(name: impl Into<String>) -> Self {
        Refusal::AlreadyExists(name.into()).into()
    }

    pub fn read_only(name: impl Into<String>) -> Self {
        Refusal::ReadOnly(name.into()).into()
    }

    /// A caller's own conflict ([`Conflict::Request`]).
    pub fn conflict(why: impl Into<String>) -> Self {
        Conflict::Request(why.into()).into()
    }

    /// The class of this error.
    pub fn class(&self) -> Class {
        match self {
            Error::Stop(_) => Class::Stop,
            Error::Refused(_) => Class::Refused,
            Error::Exhausted(_) => Class::Exhausted,
            Error::Damaged(_) => Class::Damaged,
        }
    }

    /// Whether this error means the in-memory state can no longer be
    /// trusted, so the pool must stop (every later call fails until it is
    /// reopened): a [`Fault`]. The one place that decides it: the daemon's
    /// background work stops the daemon on exactly these (a full pool and
    /// the like may clear up and are only logged). `NotAPool` comes only
    /// from an open, and means as much.
    pub fn stops_pool(&self) -> bool {
        self.class() == Class::Stop
    }

    /// Whether this is a refusal because `name` does not exist: the name.
    pub fn not_found_name(&self) -> Option<&str> {
        match self {
            Error::Refused(Refusal::NotFound(name)) => Some(name),
            _ => None,
        }
    }

    /// Whether this is data space running out.
    pub fn is_no_space(&self) -> bool {
        matches!(self, Error::Exhausted(Resource::DataSpace))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One error of every kind, with the class it must have.
    fn every_kind() -> Vec<(Error, Class)> {
        vec![
            (io::Error::other("disk").into(), Class::Stop),
            (
                Error::corrupt("superblock", FormatError::BadMagic),
                Class::Stop,
            ),
            (Error::inconsistent("x"), Class::Stop),
            (Fault::NotAPool.into(), Class::Stop),
            (Error::failed("x"), Class::Stop),
            (Error::not_found("v"), Class::Refused),
            (Error::already_exists("v"), Class::Refused),
            (
                Refusal::InvalidName {
                    name: "v".into(),
                    reason: "r".into(),
                }
                .into(),
                Class::Refused,
            ),
            (Invalid::SnapshotRename.into(), Class::Refused),
            (Error::invalid_request("x"), Class::Refused),
            (Error::read_only("v@s"), Class::Refused),
            (Error::conflict("x"), Class::Refused),
            (Unsupported::CowShrink("v".into()).into(), Class::Refused),
            (
                OriginUnavailable::NotAttached { name: "v".into() }.into(),
                Class::Refused,
            ),
            (Resource::DataSpace.into(), Class::Exhausted),
            (Resource::Metadata.into(), Class::Exhausted),
            (Resource::Journal.into(), Class::Exhausted),
        ]
    }

    #[test]
    fn only_faults_stop_the_pool() {
        for (err, class) in every_kind() {
            assert_eq!(err.class(), class, "{err:?}");
            assert_eq!(err.stops_pool(), class == Class::Stop, "{err:?}");
        }
    }

    /// The messages of the flat error this type replaced, word for word:
    /// the docs, the e2e tests and scripts match them.
    #[test]
    fn messages_are_unchanged() {
        let cases: Vec<(Error, &str)> =
            vec![
            (io::Error::other("disk").into(), "I/O error: disk"),
            (
                Error::corrupt("superblock", FormatError::BadMagic),
                "pool is damaged at superblock: bad magic: not an arbor block",
            ),
            (Error::inconsistent("x"), "pool is damaged: x"),
            (
                Fault::NotAPool.into(),
                "not an arbor pool (no valid superblock)",
            ),
            (
                Error::failed("why"),
                "the pool stopped after a failed commit and must be reopened: why",
            ),
            (Error::not_found("v"), "no such volume or snapshot: v"),
            (
                Error::already_exists("v"),
                "a volume or snapshot named \"v\" already exists",
            ),
            (Error::read_only("v@s"), "v@s is a read-only snapshot"),
            (Error::conflict("as is"), "as is"),
            (Conflict::VolumeChanged.into(), "the volume changed meanwhile; try again"),
            (
                OriginUnavailable::NotAttached { name: "v".into() }.into(),
                "copy-on-write volume v: its device is not attached (arbor origin attach v PATH)",
            ),
            (Resource::DataSpace.into(), "pool data space is full"),
            (Resource::Metadata.into(), "pool metadata space is full"),
            (
                Resource::Journal.into(),
                "one step of the operation changes more space-map pages than the journal holds",
            ),
            (
                Error::invalid_request("a policy"),
                "invalid argument: a policy",
            ),
        ];
        for (err, old) in cases {
            assert_eq!(err.to_string(), old);
        }
    }

    /// Typed reasons print as the `format!` each site used to build.
    #[test]
    fn typed_reasons_print_as_before() {
        let (chunk, pages, min, max) = (3000u32, 8u32, 16u32, 1u32 << 16);
        let (size, sector, max_size) = (7u64, 512u64, 1u64 << 60);
        let (name, volume, snapshot) = ("vm", "vm", "vm@s");
        let cases: Vec<(Invalid, String)> = vec![
            (
                Invalid::ChunkSize(chunk),
                format!("chunk size {chunk} is not a power of two between 4 KiB and 1 MiB"),
            ),
            (
                Invalid::JournalPages { pages, min, max },
                format!("journal of {pages} pages: must hold {min} to {max}"),
            ),
            (
                Invalid::DeviceTooSmall {
                    device_bytes: 100,
                    metadata_bytes: 200,
                },
                "device of 100 bytes is too small: metadata needs 200 bytes and at least 16 \
                 data chunks must remain"
                    .into(),
            ),
            (
                Invalid::Layout(FormatError::Invalid("x".into())),
                "computed layout is invalid: invalid field: x".into(),
            ),
            (
                Invalid::VolumeSize {
                    size,
                    sector,
                    max: max_size,
                },
                format!(
                    "volume size {size} must be a non-zero multiple of {sector} up to {max_size}"
                ),
            ),
            (
                Invalid::RangeBeyondEnd {
                    offset: 4,
                    len: 5,
                    name: name.into(),
                    size: 6,
                },
                format!("range 4+5 is beyond the end of {name} (6 bytes)"),
            ),
            (
                Invalid::WriteBeyondEnd {
                    end: 9,
                    name: name.into(),
                    size: 6,
                },
                format!("write to byte 9 beyond the end of {name} (6 bytes; resized meanwhile?)"),
            ),
            (
                Invalid::GroupSize { max: 256, given: 0 },
                "a group snapshot takes 1 to 256 snapshots, not 0".into(),
            ),
            (
                Invalid::NotSnapshotOf {
                    snapshot: snapshot.into(),
                    volume: volume.into(),
                },
                format!("{snapshot} is not a snapshot of {volume}"),
            ),
            (
                Invalid::HoldTag {
                    tag: "a b".into(),
                    reason: "r".into(),
                },
                format!("hold tag {:?}: r", "a b"),
            ),
            (
                Invalid::CannotGrow(FormatVersion::new(1).expect("version 1")),
                "the pool is format version 1, which cannot grow; upgrade it to version 2 \
                 first (older arbor releases cannot open it then)"
                    .into(),
            ),
            (
                Invalid::PoolShrink { end: 10, size: 5 },
                "the pool ends at byte 10; it cannot shrink to 5 bytes".into(),
            ),
            (
                Invalid::PropertyKey {
                    key: "-k".into(),
                    max: 64,
                },
                format!(
                    "property key {:?}: 1 to 64 of letters, digits and . _ : -, starting with \
                     a letter or digit",
                    "-k"
                ),
            ),
            (
                Invalid::StreamBaseElsewhere {
                    base: snapshot.into(),
                    volume: "w".into(),
                },
                format!(
                    "the stream's base is {snapshot}, which is not a snapshot of w; receive \
                     into a new volume to make it a clone of {snapshot}"
                ),
            ),
            (
                Invalid::CowTooLarge {
                    max_chunks: 1 << 32,
                    max_bytes: 1 << 44,
                },
                format!(
                    "a copy-on-write volume holds at most {} chunks ({} bytes with this \
                     pool's chunks)",
                    1u64 << 32,
                    1u64 << 44
                ),
            ),
            (
                Invalid::OriginDeviceSize {
                    size,
                    sector,
                    max: max_size,
                },
                format!(
                    "a device of {size} bytes: an origin must be a non-zero multiple of \
                     {sector} bytes up to {max_size}"
                ),
            ),
            (
                Invalid::OriginDeviceTooSmall {
                    name: name.into(),
                    size: 5,
                    new_size: 9,
                    error: io::Error::other("no"),
                },
                format!(
                    "{name}'s device has 5 bytes: enlarge it to 9 with its own tools first (no)"
                ),
            ),
            (
                Invalid::ResizedMeanwhile(name.into()),
                format!("{name} was resized meanwhile"),
            ),
            (
                Invalid::Checkpoint {
                    offset: 3,
                    name: name.into(),
                },
                format!("checkpoint at 3 of {name}"),
            ),
        ];
        for (why, old) in cases {
            assert_eq!(why.to_string(), old);
            assert_eq!(
                Error::from(why).to_string(),
                format!("invalid argument: {old}")
            );
        }
    }

    /// Each unsupported operation prints the text its site printed.
    #[test]
    fn unsupported_prints_as_before() {
        let name = "vm";
        let cases: Vec<(Unsupported, String)> = vec![
            (
                Unsupported::Format(Capability::CowVolumes),
                "this pool's format (version 4 or older) has no copy-on-write volumes; \
                 upgrade it first (arbor pool upgrade)"
                    .into(),
            ),
            (
                Unsupported::Format(Capability::Receive),
                "this pool's format (version 2 or older) cannot receive streams; \
                 upgrade it first (arbor pool upgrade)"
                    .into(),
            ),
            (
                Unsupported::Format(Capability::Holds),
                "this pool's format (version 2 or older) cannot hold snapshots; upgrade it \
                 first (arbor pool upgrade)"
                    .into(),
            ),
            (
                Unsupported::Format(Capability::Properties),
                "this pool's format (version 3 or older) cannot keep properties such as \
                 policies; upgrade it first (arbor pool upgrade)"
                    .into(),
            ),
            (
                Unsupported::TooManyEpochs {
                    name: name.into(),
                    max: 7,
                },
                format!("{name} has taken 7 snapshots, the most one copy-on-write volume can"),
            ),
            (
                Unsupported::ResizeThroughCow(name.into()),
                format!("{name} reads through a copy-on-write volume: it cannot be resized"),
            ),
            (
                Unsupported::CowShrink(name.into()),
                format!(
                    "{name} is a copy-on-write volume: it cannot shrink (its snapshots may read \
                     its home past the new end)"
                ),
            ),
            (
                Unsupported::OriginShrink(name.into()),
                format!(
                    "{name} is an origin: it cannot shrink (its snapshots may read its device \
                     past the new end); detach it and shrink the file or device with its own tools"
                ),
            ),
            (
                Unsupported::ChangesOfCow(name.into()),
                format!(
                    "{} is a copy-on-write volume: its writes go in place, where nothing \
                     records when; find what changed between two of its snapshots instead \
                     (arbor diff)",
                    name
                ),
            ),
            (
                Unsupported::DiffPair {
                    a: "a".into(),
                    b: "b".into(),
                },
                format!(
                    "{} and {}: diffs and changed blocks are found between volumes whose data is \
                     in the pool, and between a copy-on-write volume and what reads through it \
                     (its snapshots, their clones and the clones' snapshots); not between these",
                    "a", "b"
                ),
            ),
            (
                Unsupported::IncrementalOntoCow(name.into()),
                format!(
                    "{} reads through a copy-on-write volume: incremental streams onto it \
                     are not supported yet",
                    name
                ),
            ),
        ];
        for (why, old) in cases {
            assert_eq!(why.to_string(), old);
            assert_eq!(Error::from(why).to_string(), old);
        }
    }

    /// Each origin failure prints the text its site printed.
    #[test]
    fn origin_failures_print_as_before() {
        let name = "db";
        let e = || io::Error::other("EIO");
        let cases: Vec<(OriginUnavailable, String)> = vec![
            (
                OriginUnavailable::NotAttached { name: name.into() },
                format!("{name}: its device is not attached (arbor origin attach {name} PATH)"),
            ),
            (
                OriginUnavailable::NotAttachedForRollback { name: name.into() },
                format!(
                    "{}: its device is not attached, so it cannot be rolled back now; attach it \
                     first (arbor origin attach {} PATH)",
                    name, name
                ),
            ),
            (
                OriginUnavailable::Shrunk {
                    name: name.into(),
                    was: 9,
                    now: 5,
                },
                format!(
                    "{name}: its device shrank from {} to {now} bytes while attached, so it serves \
                     no I/O: what it held from byte {now} on is lost (arbor origin list shows it; \
                     arbor origin attach {name} PATH --accept-damage serves it again)",
                    9,
                    now = 5
                ),
            ),
            (
                OriginUnavailable::ShrankDuringIo {
                    name: name.into(),
                    was: 9,
                    now: 5,
                    error: e(),
                },
                format!("{name}: its device shrank from 9 to 5 bytes (EIO)"),
            ),
            (
                OriginUnavailable::Unusable {
                    name: name.into(),
                    why: io::Error::other("gone"),
                    error: e(),
                },
                format!("{name}: its device is unusable: gone (EIO)"),
            ),
            (
                OriginUnavailable::DeviceIo {
                    name: name.into(),
                    error: e(),
                },
                format!("{name}: device I/O failed: EIO"),
            ),
            (
                OriginUnavailable::NotEnlarged {
                    name: name.into(),
                    error: e(),
                },
                format!("{name}: its device could not be enlarged: EIO"),
            ),
            (
                OriginUnavailable::FlushFailed(e()),
                "the device of a copy-on-write volume failed to flush: EIO".into(),
            ),
            (
                OriginUnavailable::RollbackInterrupted { name: name.into() },
                format!(
                    "{}: a rollback was interrupted; run it again (arbor rollback)",
                    name
                ),
            ),
            (
                OriginUnavailable::RollbackInterruptedFirst { name: name.into() },
                format!("{name}: a rollback was interrupted; run it again (arbor rollback) first"),
            ),
            (
                OriginUnavailable::RollbackToLost {
                    name: name.into(),
                    from: 7,
                },
                format!(
                    "{name}: the snapshot lost what it read from byte {} on when the device \
                     shrank; a rollback to it would put zeros there as if they were its data",
                    7
                ),
            ),
            (
                OriginUnavailable::ReadOfLost {
                    name: name.into(),
                    from: 7,
                },
                format!(
                    "{name}: a snapshot taken before its device shrank read bytes from {} \
                     on through the device, and they are lost: they read as an error, \
                     never as zeros (arbor check lists what each snapshot lost)",
                    7
                ),
            ),
            (
                OriginUnavailable::WriteOverLost {
                    name: name.into(),
                    from: 7,
                },
                format!(
                    "{name}: this write would overwrite bytes past {} that snapshots taken \
                     before its device shrank read, and lost: destroy those snapshots \
                     (arbor check lists them) to write there",
                    7
                ),
            ),
        ];
        for (why, old) in cases {
            assert_eq!(why.to_string(), old);
            assert_eq!(
                Error::from(why).to_string(),
                format!("copy-on-write volume {old}")
            );
        }
    }

    /// Each conflict prints the text its site printed.
    #[test]
    fn conflicts_print_as_before() {
        let (name, volume) = ("db", "vm");
        let holds = |tags: &[&str]| tags.iter().map(|t| t.to_string()).collect::<Vec<_>>();
        let (readers, epochs) = (1u64, 2usize);
        let recorded = DeviceIdentity {
            dev: 0x801,
            ino: 12,
        };
        let identity = DeviceIdentity {
            dev: 0x802,
            ino: 13,
        };
        let cases: Vec<(Conflict, String)> = vec![
            (
                Conflict::Held {
                    name: name.into(),
                    holds: holds(&["backup", "repl:site-b"]),
                },
                format!(
                    "{} is held ({}); release the hold{} (arbor release) or destroy it with --force",
                    name, "backup, repl:site-b", "s"
                ),
            ),
            (
                Conflict::Held {
                    name: name.into(),
                    holds: holds(&["backup"]),
                },
                format!(
                    "{} is held ({}); release the hold{} (arbor release) or destroy it with --force",
                    name, "backup", ""
                ),
            ),
            (
                Conflict::PropertySetAgain("k".into()),
                "property k was set again meanwhile".into(),
            ),
            (
                Conflict::ReceiveInProgress {
                    volume: volume.into(),
                    snapshot: "ab".into(),
                },
                format!(
                    "a receive of another stream into {} is in progress (snapshot {}); \
                     resume it, or abort it with `arbor receive --abort {}`",
                    volume, "ab", volume
                ),
            ),
            (
                Conflict::HaveSnapshot {
                    name: name.into(),
                    identity: "ab".into(),
                },
                format!("this pool already has the stream's snapshot, as {name} (identity ab)"),
            ),
            (
                Conflict::AfterDiscard {
                    note: "note".into(),
                    error: Box::new(Error::not_found("v")),
                },
                "note; then: no such volume or snapshot: v".into(),
            ),
            (
                Conflict::BaseDeleted("ab".into()),
                "the stream's base snapshot (identity ab) was deleted during the receive".into(),
            ),
            (
                Conflict::WrittenSinceBase {
                    volume: volume.into(),
                    base: "vm@s".into(),
                },
                format!(
                    "{volume} was written since {}; receive with --force to discard \
                     those changes",
                    "vm@s"
                ),
            ),
            (
                Conflict::ReadThrough {
                    name: name.into(),
                    readers,
                    epochs,
                },
                format!(
                    "{} has {readers} snapshot{} and clone{} reading through {epochs} of its epochs; \
                     destroy them first",
                    name,
                    if readers == 1 { "" } else { "s" },
                    if readers == 1 { "" } else { "s" },
                ),
            ),
            (
                Conflict::ReadThrough {
                    name: name.into(),
                    readers: 3,
                    epochs,
                },
                format!("{name} has 3 snapshots and clones reading through {epochs} of its epochs; destroy them first"),
            ),
            (
                Conflict::HomeChanged(name.into()),
                format!("{} changed meanwhile (resized, rolled back, or not an origin)", name),
            ),
            (
                Conflict::RollingBack(name.into()),
                format!("{} is being rolled back; try again when it is done", name),
            ),
            (
                Conflict::Incomplete {
                    name: name.into(),
                    why: "being restored from a backup".into(),
                },
                format!("{name} is being restored from a backup; its snapshots, renames and resizes wait until that ends"),
            ),
            (
                Conflict::OtherRollback(name.into()),
                format!(
                    "a rollback of {} to another snapshot was interrupted; run that one again first",
                    name
                ),
            ),
            (
                Conflict::OtherDevice {
                    name: name.into(),
                    recorded,
                    identity,
                },
                format!(
                    "{name} was attached from another device (device {:#x}, inode {}); \
                     this one is device {:#x}, inode {}",
                    recorded.dev, recorded.ino, identity.dev, identity.ino
                ),
            ),
            (
                Conflict::DeviceSmaller {
                    name: name.into(),
                    was: 9,
                    now: 5,
                },
                format!(
                    "{name}'s device was {} bytes and is {size} now: what it held from \
                     byte {size} on is lost, and recorded so (its snapshots will fail \
                     reads of it); to serve {name} again, enlarge the device to {} bytes \
                     and attach it with --accept-damage",
                    9,
                    9,
                    size = 5
                ),
            ),
            (
                Conflict::ShrankWhileAttached {
                    name: name.into(),
                    to: 5,
                },
                format!(
                    "{name}'s device shrank to {} bytes while attached (or while the daemon was \
                     stopped): what it held from there on is lost, and a device grown back \
                     reads zeros there, not {name}'s data; its snapshots taken before fail \
                     reads of that range (arbor check lists them). To serve {name} again as \
                     its device is now, attach it with --accept-damage",
                    5
                ),
            ),
            (
                Conflict::Attached(name.into()),
                format!("{name} is attached: its device is known"),
            ),
            (
                Conflict::ResizedOrDetached(name.into()),
                format!("{name} was resized or detached meanwhile"),
            ),
            (
                Conflict::Changed(name.into()),
                format!("{name} changed meanwhile"),
            ),
        ];
        for (why, old) in cases {
            assert_eq!(why.to_string(), old);
            assert_eq!(Error::from(why).to_string(), old);
        }
    }
}
