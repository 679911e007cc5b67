//! Everything that can be wrong with a stream, a data payload or a resume
//! token. Variants about a record name it by its sequence number
//! (`record`, counting the header as 0) and the byte of the stream it
//! starts at (`at`).

use std::fmt;

use super::{FORMAT_VERSION, MAX_DATA, MAX_PAYLOAD, MIN_FORMAT_VERSION};

/// Which total of the trailer disagrees with the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrailerField {
    /// The number of records before the trailer.
    Records,
    /// The number of bytes before the trailer.
    Bytes,
    /// The crc32c of every byte before the trailer.
    Checksum,
}

impl fmt::Display for TrailerField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TrailerField::Records => "record count",
            TrailerField::Bytes => "byte count",
            TrailerField::Checksum => "checksum",
        })
    }
}

fn trailer_value(what: TrailerField, value: u64) -> String {
    match what {
        TrailerField::Checksum => format!("{value:#010x}"),
        _ => value.to_string(),
    }
}

fn decompressed(found: &Option<u64>) -> String {
    match found {
        Some(n) => format!("{n} bytes"),
        None => "more bytes".to_string(),
    }
}

/// A stream, data payload, header, identity or resume token that cannot be
/// accepted, or an encoder asked to write one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StreamError {
    #[error("not an arbor stream: it does not start with an arbor stream header (magic ARBORSTR)")]
    NotAStream,

    #[error(
        "unsupported stream version {version}: this reader knows versions \
         {MIN_FORMAT_VERSION} to {FORMAT_VERSION}"
    )]
    UnsupportedVersion { version: u16 },

    #[error("stream damaged: record {record} at byte {at} fails its checksum")]
    Checksum { record: u64, at: u64 },

    #[error(
        "stream damaged: record {record} at byte {at} carries sequence number {found} \
         (records were dropped, duplicated or reordered)"
    )]
    Sequence { record: u64, at: u64, found: u64 },

    #[error(
        "record {record} at byte {at} has type {kind}, which this reader does not know and \
         may not skip (a stream from a newer arbor?)"
    )]
    UnknownRecord { record: u64, at: u64, kind: u16 },

    #[error("stream damaged: record {record} at byte {at} has invalid flags {flags:#06x}")]
    BadFlags { record: u64, at: u64, flags: u16 },

    #[error(
        "stream damaged: record {record} at byte {at} claims a payload of {length} bytes, \
         more than the limit of {MAX_PAYLOAD}"
    )]
    RecordTooLarge { record: u64, at: u64, length: u64 },

    #[error(
        "stream damaged: data record {record} at byte {at} claims {length} bytes of data, \
         more than the limit of {MAX_DATA}"
    )]
    DataTooLarge { record: u64, at: u64, length: u64 },

    #[error("stream damaged: record {record} at byte {at}: {reason}")]
    BadRecord {
        record: u64,
        at: u64,
        reason: String,
    },

    #[error("stream damaged: its first record (type {kind}) is not a stream header")]
    HeaderMissing { kind: u16 },

    #[error("stream damaged: record {record} at byte {at} is a second stream header")]
    DuplicateHeader { record: u64, at: u64 },

    #[error("bad stream header: {reason}")]
    BadHeader { reason: String },

    #[error("bad snapshot name in stream header: {reason}")]
    BadName { reason: String },

    #[error(
        "stream damaged: record {record} at byte {at} starts at volume byte {offset}, before \
         byte {min} (records out of order or overlapping)"
    )]
    OutOfOrder {
        record: u64,
        at: u64,
        offset: u64,
        min: u64,
    },

    #[error(
        "stream damaged: record {record} at byte {at} covers {length} bytes at volume byte \
         {offset}, past the volume's size of {volume_size} bytes"
    )]
    OutOfRange {
        record: u64,
        at: u64,
        offset: u64,
        length: u64,
        volume_size: u64,
    },

    #[error(
        "stream damaged: record {record} at byte {at} covers {length} bytes at volume byte \
         {offset}: offset and length must be multiples of {align} and the length non-zero"
    )]
    Misaligned {
        record: u64,
        at: u64,
        offset: u64,
        length: u64,
        align: u64,
    },

    #[error(
        "stream damaged: record {record} at byte {at} (type {kind}) is not the key record a \
         raw stream has right after its header"
    )]
    KeyMissing { record: u64, at: u64, kind: u16 },

    #[error("a raw stream: {reason}")]
    Raw { reason: String },

    #[error(
        "stream damaged: its trailer (record {record} at byte {at}) states {what} {}, the \
         stream's is {}",
        trailer_value(*.what, *.trailer),
        trailer_value(*.what, *.actual)
    )]
    TrailerMismatch {
        record: u64,
        at: u64,
        what: TrailerField,
        trailer: u64,
        actual: u64,
    },

    #[error("stream damaged: bytes follow its trailer, from byte {at}")]
    TrailingBytes { at: u64 },

    #[error(
        "stream truncated: it ends at byte {at}, after {records} records, without its trailer"
    )]
    Truncated { at: u64, records: u64 },

    #[error("stream too long: its byte or record count overflows at byte {at}")]
    TooLong { at: u64 },

    #[error("stream damaged: data record {record} at byte {at}: {reason}")]
    BadEncoding {
        record: u64,
        at: u64,
        reason: String,
    },

    #[error(
        "stream damaged: record {record} at byte {at} is a delta against a base snapshot, \
         but the stream is not incremental"
    )]
    DeltaNotIncremental { record: u64, at: u64 },

    #[error(
        "a delta-compressed data record needs the base snapshot's bytes for its range, and \
         none were given"
    )]
    DeltaWithoutBase,

    #[error("the base bytes given for a data record are {found} bytes, its data {expected}")]
    BaseLength { expected: u64, found: u64 },

    #[error("stream damaged: a data record's payload does not decompress: {reason}")]
    Decompress { reason: String },

    #[error(
        "stream damaged: a data record of {expected} bytes decodes to {}",
        decompressed(.found)
    )]
    WrongLength { expected: u64, found: Option<u64> },

    #[error("zstd compression level {level} is outside zstd's range {min}..={max}")]
    CompressionLevel { level: i32, min: i32, max: i32 },

    #[error("zstd: {reason}")]
    Zstd { reason: String },

    #[error("bad snapshot identity: {reason}")]
    BadGuid { reason: String },

    #[error("bad resume token: {reason}")]
    BadResumeToken { reason: String },
}
