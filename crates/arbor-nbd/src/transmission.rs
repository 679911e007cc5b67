//! Transmission phase, sans I/O: request header decoding, request validation
//! into typed [`Command`]s, reply encoding, and the pure planning of
//! structured read replies and block status extents.

use crate::export::StatusRun;
use crate::proto::{
    command, command_flags, reply, state, truncate_text, ByteReader, Errno, CHUNK_HEADER_LEN,
    MAX_PAYLOAD, MIN_BLOCK_SIZE, PREFERRED_BLOCK_SIZE, REQUEST_HEADER_LEN, REQUEST_MAGIC,
    SIMPLE_REPLY_LEN, STRUCTURED_REPLY_MAGIC,
};

/// A request header exactly as received.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHeader {
    pub flags: u16,
    pub kind: u16,
    pub cookie: u64,
    pub offset: u64,
    pub length: u32,
}

/// A request header that cannot be framed: the stream is out of sync and the
/// connection must be dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("request has magic {0:#010x} instead of NBD_REQUEST_MAGIC")]
pub struct BadRequestMagic(pub u32);

impl RequestHeader {
    pub fn decode(bytes: &[u8; REQUEST_HEADER_LEN]) -> Result<Self, BadRequestMagic> {
        let mut reader = ByteReader::new(bytes);
        // The reader cannot run short of a fixed 28-byte array; zeroes stand
        // in for the impossible, and fail the magic check.
        let magic = reader.u32().unwrap_or(0);
        if magic != REQUEST_MAGIC {
            return Err(BadRequestMagic(magic));
        }
        Ok(Self {
            flags: reader.u16().unwrap_or(0),
            kind: reader.u16().unwrap_or(0),
            cookie: reader.u64().unwrap_or(0),
            offset: reader.u64().unwrap_or(0),
            length: reader.u32().unwrap_or(0),
        })
    }

    pub fn encode(&self) -> [u8; REQUEST_HEADER_LEN] {
        let mut out = [0u8; REQUEST_HEADER_LEN];
        out[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        out[4..6].copy_from_slice(&self.flags.to_be_bytes());
        out[6..8].copy_from_slice(&self.kind.to_be_bytes());
        out[8..16].copy_from_slice(&self.cookie.to_be_bytes());
        out[16..24].copy_from_slice(&self.offset.to_be_bytes());
        out[24..28].copy_from_slice(&self.length.to_be_bytes());
        out
    }

    /// What follows the header on the wire. Only `NBD_CMD_WRITE` carries a
    /// payload; one larger than [`MAX_PAYLOAD`] is read and thrown away in
    /// small pieces (so memory stays bounded) and the request then fails
    /// validation.
    /// The payload that follows: a write's data, kept when it is at most
    /// the session's `max_payload` (see [`Limits::max_payload`]).
    pub fn payload(&self, max_payload: u32) -> Payload {
        match self.length {
            _ if self.kind != command::WRITE => Payload::None,
            0 => Payload::None,
            len if len <= max_payload => Payload::Receive(len),
            len => Payload::Discard(len),
        }
    }
}

/// Payload that follows a request header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Payload {
    None,
    /// Read this many bytes as the write's data.
    Receive(u32),
    /// Read and drop this many bytes; the request will be rejected.
    Discard(u32),
}

/// What validation needs to know about the negotiated session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub size: u64,
    pub read_only: bool,
    pub structured: bool,
    /// A metadata context was selected, so block status is allowed.
    pub block_status: bool,
    /// The client never learned the block sizes: any byte offset and
    /// length is served (see `Session::byte_granular`).
    pub byte_granular: bool,
    /// Largest read or write served: [`MAX_PAYLOAD`], or more (up to
    /// `MAX_UNNEGOTIATED_PAYLOAD`, within the memory budget) for a client
    /// that never learned it.
    pub max_payload: u32,
}

/// A validated request: offsets and lengths are aligned and in bounds, flags
/// are the ones documented for the command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Read {
        offset: u64,
        length: u32,
        /// `NBD_CMD_FLAG_DF`: reply with at most one content chunk.
        dont_fragment: bool,
    },
    Write {
        offset: u64,
        length: u32,
        fua: bool,
    },
    Flush,
    Trim {
        offset: u64,
        length: u32,
        fua: bool,
    },
    WriteZeroes {
        offset: u64,
        length: u32,
        fua: bool,
        may_trim: bool,
        fast_only: bool,
    },
    BlockStatus {
        offset: u64,
        length: u32,
        req_one: bool,
    },
    Cache {
        offset: u64,
        length: u32,
    },
    Disconnect,
}

impl Command {
    /// Reply bytes this command may hold in memory, charged to the
    /// connection's budget before it runs.
    pub fn reply_size_bound(&self) -> u64 {
        match *self {
            Command::Read { length, .. } => u64::from(length),
            Command::BlockStatus { .. } => 8 * MAX_EXTENTS as u64,
            _ => 0,
        }
    }
}

/// Why a request is refused, before it reaches the export.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub errno: Errno,
    pub message: &'static str,
}

const fn reject(errno: Errno, message: &'static str) -> Rejection {
    Rejection { errno, message }
}

/// Flags each command accepts. FUA is accepted on every command: the spec
/// notes that clients set it on non-writes and requires servers to accept it.
fn allowed_flags(kind: u16, limits: &Limits) -> u16 {
    let specific = match kind {
        command::READ if limits.structured => command_flags::DF,
        command::WRITE_ZEROES => command_flags::NO_HOLE | command_flags::FAST_ZERO,
        command::BLOCK_STATUS => command_flags::REQ_ONE,
        _ => 0,
    };
    specific | command_flags::FUA
}

/// Checks a request against the spec and the session, in this order: known
/// command, documented flags, writes to a read-only export (`EPERM`),
/// command preconditions, payload limits (`EINVAL`, or `EOVERFLOW` for
/// structured reads), alignment (`EINVAL`), bounds (`ENOSPC` for writes, else
/// `EINVAL`).
pub fn validate(header: &RequestHeader, limits: &Limits) -> Result<Command, Rejection> {
    use command::*;
    let kind = header.kind;
    if !matches!(
        kind,
        READ | WRITE | DISC | FLUSH | TRIM | CACHE | WRITE_ZEROES | BLOCK_STATUS
    ) {
        return Err(reject(Errno::Inval, "unknown command"));
    }
    if kind == DISC {
        // Nothing useful can be done with a malformed disconnect but to obey it.
        return Ok(Command::Disconnect);
    }
    if header.flags & !allowed_flags(kind, limits) != 0 {
        return Err(reject(Errno::Inval, "flag not valid for this command"));
    }
    if limits.read_only && matches!(kind, WRITE | TRIM | WRITE_ZEROES) {
        return Err(reject(Errno::Perm, "export is read-only"));
    }
    if kind == FLUSH {
        if header.offset != 0 || header.length != 0 {
            return Err(reject(Errno::Inval, "flush offset and length must be zero"));
        }
        return Ok(Command::Flush);
    }
    if kind == BLOCK_STATUS && !limits.block_status {
        return Err(reject(Errno::Inval, "no metadata context was negotiated"));
    }
    if kind == BLOCK_STATUS && header.length == 0 {
        // A reply must describe at least one byte, so an empty query has no
        // valid answer.
        return Err(reject(Errno::Inval, "block status of zero bytes"));
    }
    check_payload_length(header, limits)?;
    check_range(header, limits)?;
    Ok(typed_command(header))
}

fn check_range(header: &RequestHeader, limits: &Limits) -> Result<(), Rejection> {
    let block = u64::from(MIN_BLOCK_SIZE);
    let aligned =
        header.offset.is_multiple_of(block) && u64::from(header.length).is_multiple_of(block);
    // A trim is advisory: an unaligned one is served on its aligned part
    // (`typed_command`), as qemu sends the sub-sector rest of a discard.
    if !aligned && !limits.byte_granular && header.kind != command::TRIM {
        return Err(reject(
            Errno::Inval,
            "offset or length not a multiple of 512",
        ));
    }
    let in_bounds = header
        .offset
        .checked_add(u64::from(header.length))
        .is_some_and(|end| end <= limits.size);
    if !in_bounds {
        let errno = match header.kind {
            command::WRITE | command::WRITE_ZEROES => Errno::NoSpc,
            _ => Errno::Inval,
        };
        return Err(reject(errno, "request extends past the end of the export"));
    }
    Ok(())
}

/// Commands carrying data either way are limited to [`MAX_PAYLOAD`]; the
/// others may cover any length.
fn check_payload_length(header: &RequestHeader, limits: &Limits) -> Result<(), Rejection> {
    if header.length <= limits.max_payload.max(MAX_PAYLOAD) {
        return Ok(());
    }
    match header.kind {
        // With structured replies, rejecting a large read up front with
        // EOVERFLOW is explicitly allowed; a simple reply cannot carry it.
        command::READ if limits.structured => Err(reject(
            Errno::Overflow,
            "read larger than the maximum payload",
        )),
        command::READ | command::WRITE => Err(reject(
            Errno::Inval,
            "request larger than the maximum payload",
        )),
        _ => Ok(()),
    }
}

/// The typed form of a header that passed validation.
fn typed_command(header: &RequestHeader) -> Command {
    let flag = |bit: u16| header.flags & bit != 0;
    let (offset, length) = (header.offset, header.length);
    let fua = flag(command_flags::FUA);
    match header.kind {
        command::READ => Command::Read {
            offset,
            length,
            dont_fragment: flag(command_flags::DF),
        },
        command::WRITE => Command::Write {
            offset,
            length,
            fua,
        },
        command::TRIM => {
            // Only whole minimum blocks are trimmed; the rest of an
            // unaligned trim is left as it is, which trim allows.
            let block = u64::from(MIN_BLOCK_SIZE);
            let start = offset.div_ceil(block) * block;
            // `validate` checked that the end does not overflow.
            let end = offset.saturating_add(u64::from(length)) / block * block;
            match u32::try_from(end.saturating_sub(start)) {
                // At most `length`: the range only shrank.
                Ok(aligned) if aligned > 0 => Command::Trim {
                    offset: start,
                    length: aligned,
                    fua,
                },
                // No whole block: nothing to trim.
                _ => Command::Trim {
                    offset,
                    length: 0,
                    fua,
                },
            }
        }
        command::WRITE_ZEROES => Command::WriteZeroes {
            offset,
            length,
            fua,
            may_trim: !flag(command_flags::NO_HOLE),
            fast_only: flag(command_flags::FAST_ZERO),
        },
        command::BLOCK_STATUS => Command::BlockStatus {
            offset,
            length,
            req_one: flag(command_flags::REQ_ONE),
        },
        command::CACHE => Command::Cache { offset, length },
        command::FLUSH => Command::Flush,
        // `validate` rejected every other kind before calling this.
        _ => Command::Disconnect,
    }
}

/// A simple reply header (followed by the data of a successful read).
pub fn simple_reply(cookie: u64, errno: Option<Errno>) -> [u8; SIMPLE_REPLY_LEN] {
    let mut out = [0u8; SIMPLE_REPLY_LEN];
    out[0..4].copy_from_slice(&crate::proto::SIMPLE_REPLY_MAGIC.to_be_bytes());
    out[4..8].copy_from_slice(&errno.map_or(0, Errno::code).to_be_bytes());
    out[8..16].copy_from_slice(&cookie.to_be_bytes());
    out
}

/// A structured reply chunk header for a payload of `payload_len` bytes.
pub fn chunk_header(
    cookie: u64,
    chunk_type: u16,
    done: bool,
    payload_len: u32,
) -> [u8; CHUNK_HEADER_LEN] {
    let mut out = [0u8; CHUNK_HEADER_LEN];
    let flags = if done { reply::FLAG_DONE } else { 0 };
    out[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    out[4..6].copy_from_slice(&flags.to_be_bytes());
    out[6..8].copy_from_slice(&chunk_type.to_be_bytes());
    out[8..16].copy_from_slice(&cookie.to_be_bytes());
    out[16..20].copy_from_slice(&payload_len.to_be_bytes());
    out
}

/// The final `NBD_REPLY_TYPE_NONE` chunk.
pub fn none_chunk(cookie: u64) -> [u8; CHUNK_HEADER_LEN] {
    chunk_header(cookie, reply::TYPE_NONE, true, 0)
}

/// A final `NBD_REPLY_TYPE_ERROR` chunk with a human-readable message.
pub fn error_chunk(cookie: u64, errno: Errno, message: &str) -> Vec<u8> {
    let message = truncate_text(message).as_bytes();
    // Both fit: the message is at most MAX_STRING_LEN (4 KiB) long.
    let message_len = message.len() as u16;
    let payload_len = 6 + message.len() as u32;
    let mut out = Vec::with_capacity(CHUNK_HEADER_LEN + 6 + message.len());
    out.extend_from_slice(&chunk_header(cookie, reply::TYPE_ERROR, true, payload_len));
    out.extend_from_slice(&errno.code().to_be_bytes());
    out.extend_from_slice(&message_len.to_be_bytes());
    out.extend_from_slice(message);
    out
}

/// Header and offset of an `NBD_REPLY_TYPE_OFFSET_DATA` chunk; `data_len`
/// bytes of data follow. `data_len <= MAX_PAYLOAD`, so `8 + data_len` fits.
pub fn offset_data_header(cookie: u64, offset: u64, data_len: u32, done: bool) -> Vec<u8> {
    let payload_len = data_len.saturating_add(8);
    let mut out = Vec::with_capacity(CHUNK_HEADER_LEN + 8);
    out.extend_from_slice(&chunk_header(
        cookie,
        reply::TYPE_OFFSET_DATA,
        done,
        payload_len,
    ));
    out.extend_from_slice(&offset.to_be_bytes());
    out
}

/// A complete `NBD_REPLY_TYPE_OFFSET_HOLE` chunk.
pub fn offset_hole_chunk(cookie: u64, offset: u64, length: u32, done: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(CHUNK_HEADER_LEN + 12);
    out.extend_from_slice(&chunk_header(cookie, reply::TYPE_OFFSET_HOLE, done, 12));
    out.extend_from_slice(&offset.to_be_bytes());
    out.extend_from_slice(&length.to_be_bytes());
    out
}

/// One block status descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    pub length: u32,
    pub flags: u32,
}

/// Most descriptors sent in one block status chunk (512 KiB of reply). The
/// spec asks for at most 2^20; fewer keeps the per-request memory charge
/// small, and clients ask again from where the reply ended.
pub const MAX_EXTENTS: usize = 65536;

/// A final `NBD_REPLY_TYPE_BLOCK_STATUS` chunk. `extents` is non-empty and
/// at most [`MAX_EXTENTS`] long, so the length fits.
pub fn block_status_chunk(cookie: u64, context_id: u32, extents: &[Extent], done: bool) -> Vec<u8> {
    let payload_len = u32::try_from(4 + 8 * extents.len()).unwrap_or(u32::MAX);
    let mut out = Vec::with_capacity(CHUNK_HEADER_LEN + 4 + 8 * extents.len());
    out.extend_from_slice(&chunk_header(
        cookie,
        reply::TYPE_BLOCK_STATUS,
        done,
        payload_len,
    ));
    out.extend_from_slice(&context_id.to_be_bytes());
    for extent in extents {
        out.extend_from_slice(&extent.length.to_be_bytes());
        out.extend_from_slice(&extent.flags.to_be_bytes());
    }
    out
}

fn status_flags(run: &StatusRun) -> u32 {
    let mut flags = 0;
    if run.hole {
        flags |= state::HOLE;
    }
    if run.zero {
        flags |= state::ZERO;
    }
    flags
}

/// Turns an export's status runs into block status descriptors for a
/// request of `length` bytes: zero-length runs dropped, neighbours with equal
/// flags merged, nothing past the request, at most one extent with
/// `req_one`, at most [`MAX_EXTENTS`]. Empty if the runs cover nothing.
pub fn extents_from_runs(runs: &[StatusRun], length: u32, req_one: bool) -> Vec<Extent> {
    extents_from_flags(
        runs.iter().map(|run| (run.length, status_flags(run))),
        length,
        req_one,
    )
}

/// [`extents_from_runs`] for runs already as `(length, flags)`, of any
/// metadata context.
pub fn extents_from_flags(
    runs: impl IntoIterator<Item = (u64, u32)>,
    length: u32,
    req_one: bool,
) -> Vec<Extent> {
    let limit = if req_one { 1 } else { MAX_EXTENTS };
    let mut extents: Vec<Extent> = Vec::new();
    let mut remaining = length;
    for (run_length, flags) in runs {
        if remaining == 0 {
            break;
        }
        // Clamped to the request, which fits in u32.
        let run_len = u32::try_from(run_length.min(u64::from(remaining))).unwrap_or(remaining);
        if run_len == 0 {
            continue;
        }
        remaining -= run_len;
        let full = extents.len() == limit;
        match extents.last_mut() {
            Some(last) if last.flags == flags => last.length += run_len,
            _ if full => break,
            _ => extents.push(Extent {
                length: run_len,
                flags,
            }),
        }
    }
    extents
}

/// One piece of a structured read reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadSegment {
    /// Read from the export and send as `NBD_REPLY_TYPE_OFFSET_DATA`.
    Data { offset: u64, length: u32 },
    /// Known zeroes, sent as `NBD_REPLY_TYPE_OFFSET_HOLE`.
    Hole { offset: u64, length: u32 },
}

/// Zero runs shorter than this are read as data: a hole chunk costs a
/// 32-byte chunk and a round through the client's reassembly, which is not
/// worth it for less than a preferred block.
pub const MIN_HOLE_CHUNK: u32 = PREFERRED_BLOCK_SIZE;

/// Splits a read of `[offset, offset + length)` into data and hole segments
/// from status runs that start at `offset` and may cover only a prefix (the
/// rest is read as data). Segments are in order, contiguous, non-empty, and
/// cover the request exactly; neighbours never have the same kind.
pub fn plan_read(offset: u64, length: u32, runs: &[StatusRun]) -> Vec<ReadSegment> {
    let mut segments = Vec::new();
    let mut position = 0u32;
    for run in runs {
        let remaining = length - position;
        if remaining == 0 {
            break;
        }
        // Clamped to what is left of the request, which fits in u32.
        let run_len = u32::try_from(run.length.min(u64::from(remaining))).unwrap_or(remaining);
        if run_len == 0 {
            continue;
        }
        let hole = run.zero && run_len >= MIN_HOLE_CHUNK;
        push_segment(&mut segments, offset, position, run_len, hole);
        position += run_len;
    }
    if position < length {
        push_segment(&mut segments, offset, position, length - position, false);
    }
    segments
}

/// Appends `[base + start, +len)` as a hole or data segment, merging it into
/// the previous segment when that has the same kind.
fn push_segment(segments: &mut Vec<ReadSegment>, base: u64, start: u32, len: u32, hole: bool) {
    // Validated requests end within the export, so this never saturates.
    let offset = base.saturating_add(u64::from(start));
    match (segments.last_mut(), hole) {
        (Some(ReadSegment::Hole { length, .. }), true)
        | (Some(ReadSegment::Data { length, .. }), false) => *length += len,
        (_, true) => segments.push(ReadSegment::Hole {
            offset,
            length: len,
        }),
        (_, false) => segments.push(ReadSegment::Data {
            offset,
            length: len,
        }),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use command_flags::*;

    const SIZE: u64 = 1 << 40;

    fn limits() -> Limits {
        Limits {
            size: SIZE,
            read_only: false,
            structured: true,
            block_status: true,
            byte_granular: false,
            max_payload: MAX_PAYLOAD,
        }
    }

    fn header(kind: u16, flags: u16, offset: u64, length: u32) -> RequestHeader {
        RequestHeader {
            flags,
            kind,
            cookie: 0xc00c1e,
            offset,
            length,
        }
    }

    fn errno_of(header: RequestHeader, limits: &Limits) -> Option<Errno> {
        validate(&header, limits)
            .err()
            .map(|rejection| rejection.errno)
    }

    #[test]
    fn unaligned_trims_shrink_to_whole_blocks() {
        let trim = |offset, length| validate(&header(command::TRIM, 0, offset, length), &limits());
        let shrunk = |offset, length| Command::Trim {
            offset,
            length,
            fua: false,
        };
        assert_eq!(trim(100, 2000), Ok(shrunk(512, 1536)));
        assert_eq!(trim(0, 1000), Ok(shrunk(0, 512)));
        assert_eq!(trim(512, 511), Ok(shrunk(512, 0)));
        assert_eq!(trim(100, 200), Ok(shrunk(100, 0)));
        assert_eq!(trim(1024, 4096), Ok(shrunk(1024, 4096)));
    }

    #[test]
    fn header_round_trips_and_bad_magic_is_rejected() {
        let original = header(command::WRITE, FUA, 4096, 512);
        assert_eq!(RequestHeader::decode(&original.encode()), Ok(original));
        let mut bytes = original.encode();
        bytes[0] ^= 1;
        assert!(RequestHeader::decode(&bytes).is_err());
    }

    #[test]
    fn only_writes_carry_payloads_and_oversized_ones_are_discarded() {
        assert_eq!(
            header(command::WRITE, 0, 0, 512).payload(MAX_PAYLOAD),
            Payload::Receive(512)
        );
        assert_eq!(
            header(command::WRITE, 0, 0, 0).payload(MAX_PAYLOAD),
            Payload::None
        );
        assert_eq!(
            header(command::WRITE, 0, 0, MAX_PAYLOAD + 1).payload(MAX_PAYLOAD),
            Payload::Discard(MAX_PAYLOAD + 1)
        );
        assert_eq!(
            header(command::READ, 0, 0, 512).payload(MAX_PAYLOAD),
            Payload::None
        );
        assert_eq!(header(99, 0, 0, 512).payload(MAX_PAYLOAD), Payload::None);
        assert_eq!(
            header(command::WRITE, 0, 0, MAX_PAYLOAD + 1).payload(2 * MAX_PAYLOAD),
            Payload::Receive(MAX_PAYLOAD + 1)
        );
    }

    #[test]
    fn errors_follow_the_spec() {
        use command::*;
        let l = limits();
        let read_only = Limits {
            read_only: true,
            ..l
        };
        let simple = Limits {
            structured: false,
            block_status: false,
            ..l
        };
        let bytes = Limits {
            byte_granular: true,
            max_payload: 2 * MAX_PAYLOAD,
            ..l
        };
        let cases = [
            (header(99, 0, 0, 512), l, Some(Errno::Inval)),
            (header(READ, NO_HOLE, 0, 512), l, Some(Errno::Inval)),
            (header(READ, DF, 0, 512), simple, Some(Errno::Inval)),
            (header(READ, DF | FUA, 0, 512), l, None),
            (header(WRITE, 0, 0, 512), read_only, Some(Errno::Perm)),
            (header(TRIM, 0, 0, 512), read_only, Some(Errno::Perm)),
            (
                header(WRITE_ZEROES, 0, 0, 512),
                read_only,
                Some(Errno::Perm),
            ),
            (header(FLUSH, 0, 0, 0), read_only, None),
            (header(FLUSH, 0, 512, 0), l, Some(Errno::Inval)),
            (header(READ, 0, 100, 512), l, Some(Errno::Inval)),
            (header(WRITE, 0, 0, 100), l, Some(Errno::Inval)),
            (header(WRITE_ZEROES, 0, 0, 100), l, Some(Errno::Inval)),
            // Clients that never learned the block sizes: any byte range.
            (header(READ, 0, 100, 512), bytes, None),
            (header(WRITE, 0, 1, 100), bytes, None),
            (header(WRITE_ZEROES, 0, 7, 3), bytes, None),
            (header(READ, 0, SIZE - 1, 2), bytes, Some(Errno::Inval)),
            (header(WRITE, 0, SIZE - 1, 2), bytes, Some(Errno::NoSpc)),
            // Clients that never learned the maximum: larger requests.
            (header(WRITE, 0, 1, 2 * MAX_PAYLOAD), bytes, None),
            (header(READ, 0, 1, 2 * MAX_PAYLOAD), bytes, None),
            (
                header(WRITE, 0, 0, 2 * MAX_PAYLOAD + 1),
                bytes,
                Some(Errno::Inval),
            ),
            // A trim is advisory: an unaligned one is served on its
            // aligned part, whoever sends it.
            (header(TRIM, 0, 100, 1000), l, None),
            (header(READ, 0, SIZE, 512), l, Some(Errno::Inval)),
            (header(TRIM, 0, SIZE - 512, 1024), l, Some(Errno::Inval)),
            (header(WRITE, 0, SIZE, 512), l, Some(Errno::NoSpc)),
            (
                header(WRITE_ZEROES, 0, SIZE - 512, 1024),
                l,
                Some(Errno::NoSpc),
            ),
            (header(WRITE, 0, u64::MAX - 511, 512), l, Some(Errno::NoSpc)),
            (
                header(READ, 0, 0, MAX_PAYLOAD + 512),
                l,
                Some(Errno::Overflow),
            ),
            (
                header(READ, 0, 0, MAX_PAYLOAD + 512),
                simple,
                Some(Errno::Inval),
            ),
            (
                header(WRITE, 0, 0, MAX_PAYLOAD + 512),
                l,
                Some(Errno::Inval),
            ),
            (
                header(WRITE_ZEROES, FAST_ZERO | NO_HOLE, 0, u32::MAX - 511),
                l,
                None,
            ),
            (header(TRIM, 0, 0, u32::MAX - 511), l, None),
            (
                header(BLOCK_STATUS, REQ_ONE, 0, 512),
                simple,
                Some(Errno::Inval),
            ),
            (header(BLOCK_STATUS, 0, 0, 0), l, Some(Errno::Inval)),
            (header(CACHE, 0, 0, 512), l, None),
        ];
        for (header, limits, expected) in cases {
            assert_eq!(errno_of(header, &limits), expected, "{header:?} {limits:?}");
        }
        assert_eq!(
            validate(&header(DISC, 0xffff, 1, 1), &l),
            Ok(Command::Disconnect)
        );
    }

    #[test]
    fn flags_become_typed_options() {
        let command = validate(
            &header(command::WRITE_ZEROES, NO_HOLE | FUA, 0, 512),
            &limits(),
        );
        assert_eq!(
            command,
            Ok(Command::WriteZeroes {
                offset: 0,
                length: 512,
                fua: true,
                may_trim: false,
                fast_only: false
            })
        );
    }

    #[test]
    fn reply_encodings_have_the_documented_layout() {
        let simple = simple_reply(7, Some(Errno::NoSpc));
        assert_eq!(simple[..8], [0x67, 0x44, 0x66, 0x98, 0, 0, 0, 28]);
        assert_eq!(simple[8..], 7u64.to_be_bytes());

        let error = error_chunk(7, Errno::Inval, "bad");
        assert_eq!(
            error[4..8],
            [0, 1, 0x80, 1],
            "done flag, NBD_REPLY_TYPE_ERROR"
        );
        assert_eq!(error[16..20], 9u32.to_be_bytes());
        assert_eq!(error[20..], [0, 0, 0, 22, 0, 3, b'b', b'a', b'd']);

        let hole = offset_hole_chunk(7, 4096, 512, false);
        assert_eq!(hole[4..8], [0, 0, 0, 2]);
        assert_eq!(hole[16..20], 12u32.to_be_bytes());
        assert_eq!(hole[20..28], 4096u64.to_be_bytes());

        let status = block_status_chunk(
            7,
            1,
            &[Extent {
                length: 512,
                flags: 3,
            }],
            true,
        );
        assert_eq!(status[4..6], 1u16.to_be_bytes(), "the DONE flag");
        assert_eq!(status[16..20], 12u32.to_be_bytes());
        assert_eq!(status[20..], [0, 0, 0, 1, 0, 0, 2, 0, 0, 0, 0, 3]);

        let long = "é".repeat(3000);
        let error = error_chunk(7, Errno::Io, &long);
        let message_len = u16::from_be_bytes([error[24], error[25]]) as usize;
        assert!(message_len <= crate::proto::MAX_STRING_LEN);
        assert!(std::str::from_utf8(&error[26..]).is_ok());
    }

    #[test]
    fn read_plan_sends_large_zero_runs_as_holes() {
        let run = |length, zero| StatusRun {
            length,
            hole: zero,
            zero,
        };
        let plan = plan_read(
            8192,
            20480,
            &[
                run(512, true),
                run(4096, false),
                run(8192, true),
                run(1024, true),
            ],
        );
        assert_eq!(
            plan,
            [
                ReadSegment::Data {
                    offset: 8192,
                    length: 4608
                },
                ReadSegment::Hole {
                    offset: 12800,
                    length: 8192
                },
                ReadSegment::Data {
                    offset: 20992,
                    length: 7680
                },
            ]
        );
    }

    fn status_run() -> impl Strategy<Value = StatusRun> {
        (0u64..20_000, any::<bool>(), any::<bool>()).prop_map(|(length, hole, zero)| StatusRun {
            length,
            hole,
            zero,
        })
    }

    proptest! {
        #[test]
        fn headers_round_trip(flags: u16, kind: u16, cookie: u64, offset: u64, length: u32) {
            let original = RequestHeader { flags, kind, cookie, offset, length };
            prop_assert_eq!(RequestHeader::decode(&original.encode()), Ok(original));
        }

        #[test]
        fn arbitrary_headers_never_panic_and_valid_ones_are_in_bounds(
            bytes in proptest::array::uniform28(any::<u8>()),
            size in 0u64..(1 << 40),
            read_only: bool,
            structured: bool,
        ) {
            let mut bytes = bytes;
            bytes[..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
            let header = RequestHeader::decode(&bytes).unwrap();
            let limits = Limits {
                size,
                read_only,
                structured,
                block_status: structured,
                byte_granular: false,
                max_payload: MAX_PAYLOAD,
            };
            let _ = header.payload(limits.max_payload);
            if let Ok(command) = validate(&header, &limits) {
                if !matches!(command, Command::Disconnect | Command::Flush) {
                    let end = header.offset + u64::from(header.length);
                    prop_assert!(end <= size);
                    // What runs is whole sectors (an unaligned trim shrinks
                    // to its whole sectors).
                    let (offset, length) = match command {
                        Command::Trim { offset, length, .. } => (offset, length),
                        _ => (header.offset, header.length),
                    };
                    prop_assert_eq!(offset % 512, 0);
                    prop_assert_eq!(length % 512, 0);
                    prop_assert!(offset >= header.offset);
                    prop_assert!(offset + u64::from(length) <= end);
                }
            }
        }

        #[test]
        fn read_plans_cover_the_request_exactly(
            offset in 0u64..(1 << 40),
            length in 0u32..(1 << 20),
            runs in proptest::collection::vec(status_run(), 0..16),
        ) {
            let plan = plan_read(offset, length, &runs);
            let mut position = offset;
            let mut previous_hole = None;
            for segment in &plan {
                let (start, len, hole) = match *segment {
                    ReadSegment::Data { offset, length } => (offset, length, false),
                    ReadSegment::Hole { offset, length } => (offset, length, true),
                };
                prop_assert_eq!(start, position);
                prop_assert!(len > 0);
                prop_assert_ne!(Some(hole), previous_hole);
                previous_hole = Some(hole);
                position += u64::from(len);
            }
            prop_assert_eq!(position, offset + u64::from(length));
        }

        #[test]
        fn extents_are_valid_descriptors(
            length in 1u32..(1 << 20),
            runs in proptest::collection::vec(status_run(), 0..16),
            req_one: bool,
        ) {
            let extents = extents_from_runs(&runs, length, req_one);
            let total: u64 = extents.iter().map(|e| u64::from(e.length)).sum();
            prop_assert!(total <= u64::from(length));
            prop_assert!(extents.iter().all(|e| e.length > 0 && e.flags & !3 == 0));
            prop_assert!(extents.windows(2).all(|pair| pair[0].flags != pair[1].flags));
            if req_one {
                prop_assert!(extents.len() <= 1);
            }
            let covered: u64 = runs.iter().map(|r| r.length).sum();
            prop_assert_eq!(extents.is_empty(), covered == 0);
        }
    }
}
