//! Transmission phase, sans I/O: request header decoding (compact or
//! extended), request validation into typed [`Command`]s, reply encoding
//! (simple, structured or extended chunks), and the pure planning of
//! structured read replies and block status extents.

use crate::export::StatusRun;
use crate::proto::{
    command, command_flags, reply, state, truncate_text, ByteReader, Errno, CHUNK_HEADER_LEN,
    EXTENDED_CHUNK_HEADER_LEN, EXTENDED_REPLY_MAGIC, EXTENDED_REQUEST_HEADER_LEN,
    EXTENDED_REQUEST_MAGIC, MAX_PAYLOAD, MIN_BLOCK_SIZE, PREFERRED_BLOCK_SIZE, REQUEST_HEADER_LEN,
    REQUEST_MAGIC, SIMPLE_REPLY_LEN, STRUCTURED_REPLY_MAGIC,
};

/// How requests and replies are framed on a connection, as the handshake
/// negotiated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// Compact request headers; simple replies only.
    Simple,
    /// Compact request headers; structured reply chunks
    /// (`NBD_OPT_STRUCTURED_REPLY`).
    Structured,
    /// Extended request and reply headers (`NBD_OPT_EXTENDED_HEADERS`):
    /// 64-bit lengths, and every reply is made of extended chunks.
    Extended,
}

impl Framing {
    /// The framing for what was negotiated; extended headers take
    /// precedence over structured replies.
    pub fn new(structured: bool, extended: bool) -> Self {
        match (structured, extended) {
            (_, true) => Self::Extended,
            (true, false) => Self::Structured,
            (false, false) => Self::Simple,
        }
    }

    /// Length of every request header.
    pub fn request_header_len(self) -> usize {
        match self {
            Self::Simple | Self::Structured => REQUEST_HEADER_LEN,
            Self::Extended => EXTENDED_REQUEST_HEADER_LEN,
        }
    }

    /// Whether replies are chunks (structured or extended), which can
    /// carry error messages, holes and block status.
    pub fn chunks(self) -> bool {
        self != Self::Simple
    }

    fn request_magic(self) -> u32 {
        match self {
            Self::Simple | Self::Structured => REQUEST_MAGIC,
            Self::Extended => EXTENDED_REQUEST_MAGIC,
        }
    }
}

/// A request header exactly as received. `length` is 32 bits on the wire
/// in compact headers, 64 in extended ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHeader {
    pub flags: u16,
    pub kind: u16,
    pub cookie: u64,
    pub offset: u64,
    pub length: u64,
}

/// A request that cannot be framed: the stream is out of sync, or the
/// client announced a payload too large to take, and the connection must
/// be dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FramingError {
    #[error("request has magic {found:#010x} instead of {expected:#010x}")]
    BadMagic { found: u32, expected: u32 },
    #[error("driver passed a {got}-byte request header where {wanted} bytes were wanted")]
    HeaderLength { wanted: usize, got: usize },
    #[error("request announces a {length}-byte payload, over the {max}-byte maximum")]
    PayloadTooLong { length: u64, max: u32 },
}

impl RequestHeader {
    /// Decodes a header of exactly `framing.request_header_len()` bytes.
    pub fn decode(framing: Framing, bytes: &[u8]) -> Result<Self, FramingError> {
        let wanted = framing.request_header_len();
        if bytes.len() != wanted {
            return Err(FramingError::HeaderLength {
                wanted,
                got: bytes.len(),
            });
        }
        let mut reader = ByteReader::new(bytes);
        // The reader cannot run short of a header of the checked length;
        // zeroes stand in for the impossible, and fail the magic check.
        let expected = framing.request_magic();
        let found = reader.u32().unwrap_or(0);
        if found != expected {
            return Err(FramingError::BadMagic { found, expected });
        }
        let (flags, kind, cookie, offset) = (
            reader.u16().unwrap_or(0),
            reader.u16().unwrap_or(0),
            reader.u64().unwrap_or(0),
            reader.u64().unwrap_or(0),
        );
        let length = match framing {
            Framing::Extended => reader.u64(),
            Framing::Simple | Framing::Structured => reader.u32().map(u64::from),
        };
        Ok(Self {
            flags,
            kind,
            cookie,
            offset,
            length: length.unwrap_or(0),
        })
    }

    /// The header as a client sends it; `None` if the length does not fit
    /// a compact header.
    pub fn encode(&self, framing: Framing) -> Option<Vec<u8>> {
        let mut out = Vec::with_capacity(framing.request_header_len());
        out.extend_from_slice(&framing.request_magic().to_be_bytes());
        out.extend_from_slice(&self.flags.to_be_bytes());
        out.extend_from_slice(&self.kind.to_be_bytes());
        out.extend_from_slice(&self.cookie.to_be_bytes());
        out.extend_from_slice(&self.offset.to_be_bytes());
        match framing {
            Framing::Extended => out.extend_from_slice(&self.length.to_be_bytes()),
            Framing::Simple | Framing::Structured => {
                out.extend_from_slice(&u32::try_from(self.length).ok()?.to_be_bytes())
            }
        }
        Some(out)
    }

    /// The payload that follows the header on the wire.
    ///
    /// Compact headers: only `NBD_CMD_WRITE` carries one, of `length`
    /// bytes; one larger than the session's `max_payload` (see
    /// [`Limits::max_payload`]) is read and thrown away in small pieces (so
    /// memory stays bounded) and the request then fails validation.
    ///
    /// Extended headers: a payload follows when the request has
    /// `NBD_CMD_FLAG_PAYLOAD_LEN`, and always for a write. The spec says a
    /// client MUST set the flag on writes, but qemu's client (10.0) sends
    /// its writes' data without it, as qemu's own server accepts; no
    /// request is read differently for it, since a write without its data
    /// has no meaning. A payload larger than `max_payload` is a
    /// [`FramingError`] (the spec says to disconnect: the length is 64 bits
    /// and no bound on it would be reasonable to drain); one on a command
    /// other than a write is drained and the request refused.
    pub fn payload(&self, limits: &Limits) -> Result<Payload, FramingError> {
        let max = limits.max_payload;
        let kept = |length: u64| match u32::try_from(length) {
            Ok(length) if length <= max => Some(length),
            _ => None,
        };
        if limits.framing == Framing::Extended {
            let announced =
                self.flags & command_flags::PAYLOAD_LEN != 0 || self.kind == command::WRITE;
            if !announced || self.length == 0 {
                return Ok(Payload::None);
            }
            let Some(length) = kept(self.length) else {
                return Err(FramingError::PayloadTooLong {
                    length: self.length,
                    max,
                });
            };
            return Ok(if self.kind == command::WRITE {
                Payload::Receive(length)
            } else {
                Payload::Discard(self.length)
            });
        }
        if self.kind != command::WRITE || self.length == 0 {
            return Ok(Payload::None);
        }
        Ok(match kept(self.length) {
            Some(length) => Payload::Receive(length),
            None => Payload::Discard(self.length),
        })
    }
}

/// Payload that follows a request header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Payload {
    None,
    /// Read this many bytes (at most the session's `max_payload`) as the
    /// write's data.
    Receive(u32),
    /// Read and drop this many bytes; the request will be rejected.
    Discard(u64),
}

/// What validation needs to know about the negotiated session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub size: u64,
    pub read_only: bool,
    pub framing: Framing,
    /// A metadata context was selected, so block status is allowed.
    pub block_status: bool,
    /// The client never learned the block sizes: any byte offset and
    /// length is served (see `Session::byte_granular`).
    pub byte_granular: bool,
    /// The smallest block requests address (the session's minimum block
    /// size, a power of two, at least [`MIN_BLOCK_SIZE`]).
    pub min_block: u32,
    /// Largest read or write served: [`MAX_PAYLOAD`], or more (up to
    /// `MAX_UNNEGOTIATED_PAYLOAD`, within the memory budget) for a client
    /// that never learned it.
    pub max_payload: u32,
}

/// A validated request: offsets and lengths are aligned and in bounds, flags
/// are the ones documented for the command. Reads and writes are bounded by
/// the session's maximum payload; the other commands may cover any length
/// an extended header can carry.
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
        length: u64,
        fua: bool,
    },
    WriteZeroes {
        offset: u64,
        length: u64,
        fua: bool,
        may_trim: bool,
        fast_only: bool,
    },
    BlockStatus {
        offset: u64,
        length: u64,
        req_one: bool,
    },
    Cache {
        offset: u64,
        length: u64,
    },
    Disconnect,
}

impl Command {
    /// Reply bytes this command may hold in memory, charged to the
    /// connection's budget before it runs.
    pub fn reply_size_bound(&self) -> u64 {
        match *self {
            Command::Read { length, .. } => u64::from(length),
            // The larger, extended, descriptors: a bound for both framings.
            Command::BlockStatus { .. } => (EXTENDED_DESCRIPTOR_LEN * MAX_EXTENTS) as u64,
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
        command::READ if limits.framing.chunks() => command_flags::DF,
        command::WRITE if limits.framing == Framing::Extended => command_flags::PAYLOAD_LEN,
        command::WRITE_ZEROES => command_flags::NO_HOLE | command_flags::FAST_ZERO,
        command::BLOCK_STATUS => command_flags::REQ_ONE,
        _ => 0,
    };
    specific | command_flags::FUA
}

/// Checks a request against the spec and the session, in this order: known
/// command, payload framing (extended headers: no command but a write may
/// carry a payload), documented flags, writes to a
/// read-only export (`EPERM`), command preconditions, payload limits
/// (`EINVAL`, or `EOVERFLOW` for structured reads), alignment (`EINVAL`),
/// bounds (`ENOSPC` for writes, else `EINVAL`).
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
    if limits.framing == Framing::Extended
        && kind != WRITE
        && header.flags & command_flags::PAYLOAD_LEN != 0
    {
        // Block status has an optional payload form; this server does not
        // offer it (no NBD_FLAG_BLOCK_STATUS_PAYLOAD).
        return Err(reject(Errno::Inval, "this command takes no payload here"));
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
    typed_command(header, limits)
}

fn check_range(header: &RequestHeader, limits: &Limits) -> Result<(), Rejection> {
    let block = u64::from(limits.min_block.max(MIN_BLOCK_SIZE));
    let aligned = header.offset.is_multiple_of(block) && header.length.is_multiple_of(block);
    // A trim is advisory: an unaligned one is served on its aligned part
    // (`typed_command`), as qemu sends the sub-sector rest of a discard.
    if !aligned && !limits.byte_granular && header.kind != command::TRIM {
        return Err(reject(
            Errno::Inval,
            if block == u64::from(MIN_BLOCK_SIZE) {
                "offset or length not a multiple of 512"
            } else {
                "offset or length not a multiple of the export's minimum block size"
            },
        ));
    }
    let in_bounds = header
        .offset
        .checked_add(header.length)
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

/// Commands carrying data either way are limited to the session's maximum
/// payload; the others may cover any length.
fn check_payload_length(header: &RequestHeader, limits: &Limits) -> Result<(), Rejection> {
    if header.length <= u64::from(limits.max_payload.max(MAX_PAYLOAD)) {
        return Ok(());
    }
    match header.kind {
        // With structured replies, rejecting a large read up front with
        // EOVERFLOW is explicitly allowed; a simple reply cannot carry it.
        command::READ if limits.framing.chunks() => Err(reject(
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

/// The typed form of a header that passed the other checks.
fn typed_command(header: &RequestHeader, limits: &Limits) -> Result<Command, Rejection> {
    let flag = |bit: u16| header.flags & bit != 0;
    let (offset, length) = (header.offset, header.length);
    let fua = flag(command_flags::FUA);
    // Reads and writes passed `check_payload_length`, so this never fails.
    let data_length = || {
        u32::try_from(length)
            .map_err(|_| reject(Errno::Inval, "request larger than the maximum payload"))
    };
    Ok(match header.kind {
        command::READ => Command::Read {
            offset,
            length: data_length()?,
            dont_fragment: flag(command_flags::DF),
        },
        command::WRITE => Command::Write {
            offset,
            length: data_length()?,
            fua,
        },
        command::TRIM => {
            // Only whole minimum blocks are trimmed; the rest of an
            // unaligned trim is left as it is, which trim allows.
            let block = u64::from(limits.min_block.max(MIN_BLOCK_SIZE));
            let start = offset.div_ceil(block).checked_mul(block);
            // `check_range` checked that the end does not overflow.
            let end = offset.saturating_add(length) / block * block;
            match start.map(|start| (start, end.saturating_sub(start))) {
                // At most `length`: the range only shrank.
                Some((start, aligned)) if aligned > 0 => Command::Trim {
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
    })
}

/// A simple reply header (followed by the data of a successful read).
pub fn simple_reply(cookie: u64, errno: Option<Errno>) -> [u8; SIMPLE_REPLY_LEN] {
    let mut out = [0u8; SIMPLE_REPLY_LEN];
    out[0..4].copy_from_slice(&crate::proto::SIMPLE_REPLY_MAGIC.to_be_bytes());
    out[4..8].copy_from_slice(&errno.map_or(0, Errno::code).to_be_bytes());
    out[8..16].copy_from_slice(&cookie.to_be_bytes());
    out
}

/// How the chunks of one reply are headed: structured chunks (20-byte
/// header), or extended ones (32 bytes, echoing the request's offset, which
/// a session with extended headers uses for every reply).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkHeader {
    Structured { cookie: u64 },
    Extended { cookie: u64, offset: u64 },
}

impl ChunkHeader {
    /// The chunk header of a reply to the request with `cookie` and
    /// `offset` under `framing`; `None` for simple replies, which have no
    /// chunks.
    pub fn new(framing: Framing, cookie: u64, offset: u64) -> Option<Self> {
        match framing {
            Framing::Simple => None,
            Framing::Structured => Some(Self::Structured { cookie }),
            Framing::Extended => Some(Self::Extended { cookie, offset }),
        }
    }

    fn extended(self) -> bool {
        matches!(self, Self::Extended { .. })
    }

    /// A chunk header for a payload of `payload_len` bytes, in a buffer
    /// with room for `reserve` more bytes.
    fn encode(self, chunk_type: u16, done: bool, payload_len: u32, reserve: usize) -> Vec<u8> {
        let flags = if done { reply::FLAG_DONE } else { 0 };
        let (magic, cookie, header_len) = match self {
            Self::Structured { cookie } => (STRUCTURED_REPLY_MAGIC, cookie, CHUNK_HEADER_LEN),
            Self::Extended { cookie, .. } => {
                (EXTENDED_REPLY_MAGIC, cookie, EXTENDED_CHUNK_HEADER_LEN)
            }
        };
        let mut out = Vec::with_capacity(header_len + reserve);
        out.extend_from_slice(&magic.to_be_bytes());
        out.extend_from_slice(&flags.to_be_bytes());
        out.extend_from_slice(&chunk_type.to_be_bytes());
        out.extend_from_slice(&cookie.to_be_bytes());
        match self {
            Self::Structured { .. } => out.extend_from_slice(&payload_len.to_be_bytes()),
            Self::Extended { offset, .. } => {
                out.extend_from_slice(&offset.to_be_bytes());
                out.extend_from_slice(&u64::from(payload_len).to_be_bytes());
            }
        }
        out
    }
}

/// The final `NBD_REPLY_TYPE_NONE` chunk.
pub fn none_chunk(header: ChunkHeader) -> Vec<u8> {
    header.encode(reply::TYPE_NONE, true, 0, 0)
}

/// A final `NBD_REPLY_TYPE_ERROR` chunk with a human-readable message.
pub fn error_chunk(header: ChunkHeader, errno: Errno, message: &str) -> Vec<u8> {
    let message = truncate_text(message).as_bytes();
    // Both fit: the message is at most MAX_STRING_LEN (4 KiB) long.
    let message_len = message.len() as u16;
    let payload_len = 6 + message.len() as u32;
    let mut out = header.encode(reply::TYPE_ERROR, true, payload_len, 6 + message.len());
    out.extend_from_slice(&errno.code().to_be_bytes());
    out.extend_from_slice(&message_len.to_be_bytes());
    out.extend_from_slice(message);
    out
}

/// Header and offset of an `NBD_REPLY_TYPE_OFFSET_DATA` chunk; `data_len`
/// bytes of data follow. `data_len <= MAX_PAYLOAD`, so `8 + data_len` fits.
pub fn offset_data_header(header: ChunkHeader, offset: u64, data_len: u32, done: bool) -> Vec<u8> {
    let payload_len = data_len.saturating_add(8);
    let mut out = header.encode(reply::TYPE_OFFSET_DATA, done, payload_len, 8);
    out.extend_from_slice(&offset.to_be_bytes());
    out
}

/// A complete `NBD_REPLY_TYPE_OFFSET_HOLE` chunk.
pub fn offset_hole_chunk(header: ChunkHeader, offset: u64, length: u32, done: bool) -> Vec<u8> {
    let mut out = header.encode(reply::TYPE_OFFSET_HOLE, done, 12, 12);
    out.extend_from_slice(&offset.to_be_bytes());
    out.extend_from_slice(&length.to_be_bytes());
    out
}

/// One block status descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    pub length: u64,
    pub flags: u32,
}

/// Most descriptors sent in one block status chunk (512 KiB of reply, or
/// 1 MiB with extended headers). The spec asks for at most 2^20; fewer
/// keeps the per-request memory charge small, and clients ask again from
/// where the reply ended.
pub const MAX_EXTENTS: usize = 65536;
/// Bytes of one `NBD_REPLY_TYPE_BLOCK_STATUS` descriptor.
const DESCRIPTOR_LEN: usize = 8;
/// Bytes of one `NBD_REPLY_TYPE_BLOCK_STATUS_EXT` descriptor.
const EXTENDED_DESCRIPTOR_LEN: usize = 16;

/// A block status chunk: `NBD_REPLY_TYPE_BLOCK_STATUS_EXT` (64-bit lengths
/// and flags, and a descriptor count) under extended headers, else
/// `NBD_REPLY_TYPE_BLOCK_STATUS`. `extents` is non-empty and at most
/// [`MAX_EXTENTS`] long, so the lengths fit; under structured replies each
/// extent is shorter than 4 GiB (see `dispatch::MAX_STATUS_QUERY`).
pub fn block_status_chunk(
    header: ChunkHeader,
    context_id: u32,
    extents: &[Extent],
    done: bool,
) -> Vec<u8> {
    let extended = header.extended();
    let (chunk_type, prefix_len, descriptor_len) = if extended {
        (reply::TYPE_BLOCK_STATUS_EXT, 8, EXTENDED_DESCRIPTOR_LEN)
    } else {
        (reply::TYPE_BLOCK_STATUS, 4, DESCRIPTOR_LEN)
    };
    let body_len = prefix_len + descriptor_len * extents.len();
    let payload_len = u32::try_from(body_len).unwrap_or(u32::MAX);
    let mut out = header.encode(chunk_type, done, payload_len, body_len);
    out.extend_from_slice(&context_id.to_be_bytes());
    if extended {
        let count = u32::try_from(extents.len()).unwrap_or(u32::MAX);
        out.extend_from_slice(&count.to_be_bytes());
    }
    for extent in extents {
        if extended {
            out.extend_from_slice(&extent.length.to_be_bytes());
            out.extend_from_slice(&u64::from(extent.flags).to_be_bytes());
        } else {
            // Shorter than 4 GiB: compact sessions query at most
            // `MAX_STATUS_QUERY` bytes.
            let length = u32::try_from(extent.length).unwrap_or(u32::MAX);
            out.extend_from_slice(&length.to_be_bytes());
            out.extend_from_slice(&extent.flags.to_be_bytes());
        }
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
pub fn extents_from_runs(runs: &[StatusRun], length: u64, req_one: bool) -> Vec<Extent> {
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
    length: u64,
    req_one: bool,
) -> Vec<Extent> {
    let limit = if req_one { 1 } else { MAX_EXTENTS };
    let mut extents: Vec<Extent> = Vec::new();
    let mut remaining = length;
    for (run_length, flags) in runs {
        if remaining == 0 {
            break;
        }
        // Clamped to the request: the extents never add up to more.
        let run_len = run_length.min(remaining);
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
    const GIB: u64 = 1 << 30;
    /// The maximum payload, as a request length.
    const MAX: u64 = MAX_PAYLOAD as u64;

    fn limits() -> Limits {
        Limits {
            size: SIZE,
            read_only: false,
            framing: Framing::Structured,
            block_status: true,
            byte_granular: false,
            min_block: MIN_BLOCK_SIZE,
            max_payload: MAX_PAYLOAD,
        }
    }

    fn extended() -> Limits {
        Limits {
            framing: Framing::Extended,
            ..limits()
        }
    }

    fn header(kind: u16, flags: u16, offset: u64, length: u64) -> RequestHeader {
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

    /// A session whose export takes 4 KiB blocks (a volume encrypted in 4
    /// KiB units): reads and writes of 512-byte blocks are refused with
    /// EINVAL before they reach it, trims shrink to whole 4 KiB blocks, and
    /// a client that never learned block sizes is still served at any
    /// offset (the export answers).
    #[test]
    fn a_larger_minimum_block_is_the_unit_of_every_request() {
        let units = Limits {
            min_block: 4096,
            ..limits()
        };
        let check =
            |kind, offset, length, l: &Limits| validate(&header(kind, 0, offset, length), l);
        assert!(check(command::WRITE, 4096, 8192, &units).is_ok());
        for (offset, length) in [(512, 4096), (4096, 512), (0, 6144)] {
            for kind in [command::READ, command::WRITE, command::WRITE_ZEROES] {
                let got = check(kind, offset, length, &units).err().map(|r| r.errno);
                assert_eq!(got, Some(Errno::Inval), "{kind} {offset}+{length}");
            }
        }
        assert_eq!(
            check(command::TRIM, 512, 12288, &units),
            Ok(Command::Trim {
                offset: 4096,
                length: 8192,
                fua: false
            })
        );
        let granular = Limits {
            byte_granular: true,
            ..units
        };
        assert!(check(command::READ, 512, 4096, &granular).is_ok());
    }

    #[test]
    fn header_round_trips_and_bad_magic_is_rejected() {
        let original = header(command::WRITE, FUA, 4096, 512);
        let bytes = original.encode(Framing::Structured).unwrap();
        assert_eq!(bytes.len(), REQUEST_HEADER_LEN);
        assert_eq!(
            RequestHeader::decode(Framing::Structured, &bytes),
            Ok(original)
        );
        let mut bad = bytes.clone();
        bad[0] ^= 1;
        assert_eq!(
            RequestHeader::decode(Framing::Simple, &bad),
            Err(FramingError::BadMagic {
                found: REQUEST_MAGIC ^ (1 << 24),
                expected: REQUEST_MAGIC
            })
        );
        // A compact request where extended ones were negotiated is out of
        // sync, whatever its length.
        let mut padded = bytes.clone();
        padded.extend_from_slice(&[0; 4]);
        assert!(matches!(
            RequestHeader::decode(Framing::Extended, &padded),
            Err(FramingError::BadMagic {
                found: REQUEST_MAGIC,
                ..
            })
        ));
        assert_eq!(
            RequestHeader::decode(Framing::Extended, &bytes),
            Err(FramingError::HeaderLength {
                wanted: 32,
                got: 28
            })
        );
        // Lengths of 4 GiB and more only fit an extended header.
        assert_eq!(
            header(command::TRIM, 0, 0, 1 << 32).encode(Framing::Structured),
            None
        );
    }

    #[test]
    fn extended_headers_have_the_documented_layout() {
        let mut bytes = vec![0x21, 0xe4, 0x1c, 0x71, 0, 1, 0, 4];
        bytes.extend_from_slice(&7u64.to_be_bytes());
        bytes.extend_from_slice(&(3 * GIB).to_be_bytes());
        bytes.extend_from_slice(&(6 * GIB).to_be_bytes());
        let decoded = RequestHeader::decode(Framing::Extended, &bytes);
        assert_eq!(
            decoded,
            Ok(header_with_cookie(7, command::TRIM, FUA, 3 * GIB, 6 * GIB))
        );
        assert_eq!(
            decoded.unwrap().encode(Framing::Extended),
            Some(bytes.clone())
        );
        bytes[3] = 0x70;
        assert_eq!(
            RequestHeader::decode(Framing::Extended, &bytes),
            Err(FramingError::BadMagic {
                found: 0x21e4_1c70,
                expected: EXTENDED_REQUEST_MAGIC
            })
        );
    }

    fn header_with_cookie(
        cookie: u64,
        kind: u16,
        flags: u16,
        offset: u64,
        length: u64,
    ) -> RequestHeader {
        RequestHeader {
            cookie,
            ..header(kind, flags, offset, length)
        }
    }

    #[test]
    fn only_writes_carry_payloads_and_oversized_ones_are_discarded() {
        let payload = |header: RequestHeader, max_payload| {
            header.payload(&Limits {
                max_payload,
                ..limits()
            })
        };
        use command::{READ, WRITE};
        let cases = [
            (header(WRITE, 0, 0, 512), MAX_PAYLOAD, Payload::Receive(512)),
            (header(WRITE, 0, 0, 0), MAX_PAYLOAD, Payload::None),
            (
                header(WRITE, 0, 0, MAX + 1),
                MAX_PAYLOAD,
                Payload::Discard(MAX + 1),
            ),
            (header(READ, 0, 0, 512), MAX_PAYLOAD, Payload::None),
            (header(99, 0, 0, 512), MAX_PAYLOAD, Payload::None),
            (
                header(WRITE, 0, 0, MAX + 1),
                2 * MAX_PAYLOAD,
                Payload::Receive(MAX_PAYLOAD + 1),
            ),
        ];
        for (header, max_payload, expected) in cases {
            assert_eq!(payload(header, max_payload), Ok(expected), "{header:?}");
        }
    }

    #[test]
    fn extended_payloads_follow_the_payload_len_flag() {
        use command::*;
        let payload = |header: RequestHeader| header.payload(&extended());
        assert_eq!(
            payload(header(WRITE, PAYLOAD_LEN, 0, 4096)),
            Ok(Payload::Receive(4096))
        );
        assert_eq!(
            payload(header(WRITE, PAYLOAD_LEN, 0, MAX)),
            Ok(Payload::Receive(MAX_PAYLOAD))
        );
        // A write's data follows even without the flag, as qemu sends it.
        assert_eq!(
            payload(header(WRITE, FUA, 0, 4096)),
            Ok(Payload::Receive(4096))
        );
        // Without the flag the length is an effect length: nothing follows.
        assert_eq!(payload(header(TRIM, 0, 0, 6 * GIB)), Ok(Payload::None));
        assert_eq!(payload(header(READ, 0, 0, 4096)), Ok(Payload::None));
        // A payload on a command that takes none is drained.
        assert_eq!(
            payload(header(BLOCK_STATUS, PAYLOAD_LEN, 0, 12)),
            Ok(Payload::Discard(12))
        );
        // More than the maximum payload cannot be taken, nor sensibly
        // drained: the length is 64 bits.
        for (kind, flags, length) in [
            (WRITE, PAYLOAD_LEN, MAX + 1),
            (TRIM, PAYLOAD_LEN, u64::MAX),
            (WRITE, PAYLOAD_LEN, 1 << 32),
            (WRITE, 0, 6 * GIB),
        ] {
            assert_eq!(
                payload(header(kind, flags, 0, length)),
                Err(FramingError::PayloadTooLong {
                    length,
                    max: MAX_PAYLOAD
                })
            );
        }
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
            framing: Framing::Simple,
            block_status: false,
            ..l
        };
        let bytes = Limits {
            byte_granular: true,
            min_block: MIN_BLOCK_SIZE,
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
            (header(WRITE, 0, 1, 2 * MAX), bytes, None),
            (header(READ, 0, 1, 2 * MAX), bytes, None),
            (header(WRITE, 0, 0, 2 * MAX + 1), bytes, Some(Errno::Inval)),
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
            (header(READ, 0, 0, MAX + 512), l, Some(Errno::Overflow)),
            (header(READ, 0, 0, MAX + 512), simple, Some(Errno::Inval)),
            (header(WRITE, 0, 0, MAX + 512), l, Some(Errno::Inval)),
            (
                header(
                    WRITE_ZEROES,
                    FAST_ZERO | NO_HOLE,
                    0,
                    u64::from(u32::MAX - 511),
                ),
                l,
                None,
            ),
            (header(TRIM, 0, 0, u64::from(u32::MAX - 511)), l, None),
            // The payload flag exists only with extended headers.
            (header(WRITE, PAYLOAD_LEN, 0, 512), l, Some(Errno::Inval)),
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
    fn extended_requests_cover_64_bit_ranges_and_frame_payloads_by_flag() {
        use command::*;
        let l = extended();
        // Trim, write zeroes, cache and block status cover any length an
        // extended header carries, whole: nothing is clamped.
        assert_eq!(
            validate(&header(TRIM, 0, GIB, 6 * GIB), &l),
            Ok(Command::Trim {
                offset: GIB,
                length: 6 * GIB,
                fua: false
            })
        );
        assert_eq!(
            validate(&header(WRITE_ZEROES, NO_HOLE, 0, 6 * GIB), &l),
            Ok(Command::WriteZeroes {
                offset: 0,
                length: 6 * GIB,
                fua: false,
                may_trim: false,
                fast_only: false
            })
        );
        assert_eq!(
            validate(&header(CACHE, 0, 0, SIZE), &l),
            Ok(Command::Cache {
                offset: 0,
                length: SIZE
            })
        );
        assert_eq!(
            validate(&header(BLOCK_STATUS, REQ_ONE, 512, SIZE - 512), &l),
            Ok(Command::BlockStatus {
                offset: 512,
                length: SIZE - 512,
                req_one: true
            })
        );
        // An unaligned trim of more than 4 GiB still shrinks to its sectors.
        assert_eq!(
            validate(&header(TRIM, 0, 100, 5 * GIB), &l),
            Ok(Command::Trim {
                offset: 512,
                length: 5 * GIB - 512,
                fua: false
            })
        );
        let cases = [
            (header(WRITE, PAYLOAD_LEN | FUA, 0, 512), None),
            (header(WRITE, PAYLOAD_LEN, 0, MAX), None),
            (header(WRITE, 0, 0, 512), None),
            // Nothing but a write may carry a payload.
            (header(BLOCK_STATUS, PAYLOAD_LEN, 0, 12), Some(Errno::Inval)),
            (header(TRIM, PAYLOAD_LEN, 0, 512), Some(Errno::Inval)),
            (header(READ, PAYLOAD_LEN, 0, 512), Some(Errno::Inval)),
            // Reads and writes stay within the maximum payload.
            (header(READ, 0, 0, MAX + 512), Some(Errno::Overflow)),
            (header(READ, 0, 0, 6 * GIB), Some(Errno::Overflow)),
            (header(READ, 0, 0, u64::MAX - 511), Some(Errno::Overflow)),
            (header(WRITE, PAYLOAD_LEN, 0, MAX + 512), Some(Errno::Inval)),
            (header(READ, DF, 0, 512), None),
            // Bounds, with lengths that overflow when added to the offset.
            (header(TRIM, 0, SIZE - GIB, 2 * GIB), Some(Errno::Inval)),
            (header(TRIM, 0, 512, u64::MAX - 511), Some(Errno::Inval)),
            (header(CACHE, 0, SIZE, 512), Some(Errno::Inval)),
            (
                header(WRITE_ZEROES, 0, SIZE - GIB, 2 * GIB),
                Some(Errno::NoSpc),
            ),
            (
                header(WRITE_ZEROES, 0, u64::MAX - 511, 1024),
                Some(Errno::NoSpc),
            ),
            (
                header(BLOCK_STATUS, 0, 1024, u64::MAX - 1023),
                Some(Errno::Inval),
            ),
            (
                header(WRITE_ZEROES, 0, 0, 6 * GIB + 100),
                Some(Errno::Inval),
            ),
            (header(FLUSH, 0, 0, 1 << 32), Some(Errno::Inval)),
            (header(FLUSH, FUA, 0, 0), None),
        ];
        for (header, expected) in cases {
            assert_eq!(errno_of(header, &l), expected, "{header:?}");
        }
        let read_only = Limits {
            read_only: true,
            ..l
        };
        assert_eq!(
            errno_of(header(TRIM, 0, 0, 6 * GIB), &read_only),
            Some(Errno::Perm)
        );
    }

    /// An extended reply chunk split into (flags, type, cookie, offset,
    /// payload), checking the header's length field.
    fn extended_chunk(bytes: &[u8]) -> (u16, u16, u64, u64, Vec<u8>) {
        let mut reader = ByteReader::new(bytes);
        assert_eq!(reader.u32(), Some(0x6e8a_278c), "NBD_EXTENDED_REPLY_MAGIC");
        let (flags, kind) = (reader.u16().unwrap(), reader.u16().unwrap());
        let (cookie, offset, length) = (
            reader.u64().unwrap(),
            reader.u64().unwrap(),
            reader.u64().unwrap(),
        );
        let payload = reader.bytes(length as usize).unwrap().to_vec();
        assert!(reader.is_empty(), "bytes after the payload");
        (flags, kind, cookie, offset, payload)
    }

    #[test]
    fn extended_reply_encodings_have_the_documented_layout() {
        let header = ChunkHeader::Extended {
            cookie: 7,
            offset: 6 * GIB,
        };
        assert_eq!(
            ChunkHeader::new(Framing::Extended, 7, 6 * GIB),
            Some(header)
        );
        assert_eq!(ChunkHeader::new(Framing::Simple, 7, 6 * GIB), None);

        let none = none_chunk(header);
        assert_eq!(none.len(), 32);
        assert_eq!(extended_chunk(&none), (1, 0, 7, 6 * GIB, vec![]));

        let (flags, kind, cookie, offset, payload) =
            extended_chunk(&error_chunk(header, Errno::NoSpc, "full"));
        assert_eq!((flags, kind, cookie, offset), (1, 0x8001, 7, 6 * GIB));
        assert_eq!(payload, [0, 0, 0, 28, 0, 4, b'f', b'u', b'l', b'l']);

        // The reply header echoes the request's offset; the chunk's own
        // offset says where its data lies.
        let mut data = offset_data_header(header, 6 * GIB + 4096, 3, false);
        data.extend_from_slice(b"abc");
        let (flags, kind, _, offset, payload) = extended_chunk(&data);
        assert_eq!((flags, kind, offset), (0, 1, 6 * GIB));
        assert_eq!(payload[..8], (6 * GIB + 4096).to_be_bytes());
        assert_eq!(payload[8..], *b"abc");

        let hole = offset_hole_chunk(header, 6 * GIB, 8192, true);
        let (flags, kind, _, _, payload) = extended_chunk(&hole);
        assert_eq!((flags, kind), (1, 2));
        assert_eq!(payload[..8], (6 * GIB).to_be_bytes());
        assert_eq!(payload[8..], 8192u32.to_be_bytes());

        let extents = [
            Extent {
                length: 5 * GIB,
                flags: 3,
            },
            Extent {
                length: 512,
                flags: 0,
            },
        ];
        let status = block_status_chunk(header, 9, &extents, true);
        let (flags, kind, _, _, payload) = extended_chunk(&status);
        assert_eq!((flags, kind), (1, 6), "NBD_REPLY_TYPE_BLOCK_STATUS_EXT");
        assert_eq!(payload.len(), 8 + 2 * 16);
        let mut expected = 9u32.to_be_bytes().to_vec();
        expected.extend_from_slice(&2u32.to_be_bytes());
        for (length, flags) in [(5 * GIB, 3u64), (512, 0)] {
            expected.extend_from_slice(&length.to_be_bytes());
            expected.extend_from_slice(&flags.to_be_bytes());
        }
        assert_eq!(payload, expected);
    }

    #[test]
    fn reply_encodings_have_the_documented_layout() {
        let simple = simple_reply(7, Some(Errno::NoSpc));
        assert_eq!(simple[..8], [0x67, 0x44, 0x66, 0x98, 0, 0, 0, 28]);
        assert_eq!(simple[8..], 7u64.to_be_bytes());

        let structured = ChunkHeader::Structured { cookie: 7 };
        let error = error_chunk(structured, Errno::Inval, "bad");
        assert_eq!(
            error[4..8],
            [0, 1, 0x80, 1],
            "done flag, NBD_REPLY_TYPE_ERROR"
        );
        assert_eq!(error[16..20], 9u32.to_be_bytes());
        assert_eq!(error[20..], [0, 0, 0, 22, 0, 3, b'b', b'a', b'd']);

        let hole = offset_hole_chunk(structured, 4096, 512, false);
        assert_eq!(hole[4..8], [0, 0, 0, 2]);
        assert_eq!(hole[16..20], 12u32.to_be_bytes());
        assert_eq!(hole[20..28], 4096u64.to_be_bytes());

        let status = block_status_chunk(
            structured,
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
        let error = error_chunk(structured, Errno::Io, &long);
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

    /// What holds of any decoded header: framing its payload and
    /// validating it never panic; a payload is taken only up to the
    /// maximum; a valid command covers whole sectors within the export and
    /// within the request.
    fn check_any_header(
        header: RequestHeader,
        size: u64,
        read_only: bool,
        framing: Framing,
    ) -> Result<(), TestCaseError> {
        let limits = Limits {
            size,
            read_only,
            framing,
            block_status: framing.chunks(),
            byte_granular: false,
            min_block: MIN_BLOCK_SIZE,
            max_payload: MAX_PAYLOAD,
        };
        match header.payload(&limits) {
            Ok(Payload::Receive(len)) => prop_assert!(len <= MAX_PAYLOAD),
            Ok(Payload::Discard(len)) => {
                prop_assert!(framing != Framing::Extended || len <= MAX)
            }
            Ok(Payload::None) => {}
            Err(_) => prop_assert!(framing == Framing::Extended && header.length > MAX),
        }
        if let Ok(command) = validate(&header, &limits) {
            if !matches!(command, Command::Disconnect | Command::Flush) {
                let end = header.offset.checked_add(header.length);
                prop_assert!(end.is_some_and(|end| end <= size));
                let end = header.offset + header.length;
                // What runs is whole sectors (an unaligned trim shrinks
                // to its whole sectors).
                let (offset, length) = match command {
                    Command::Trim { offset, length, .. } => (offset, length),
                    Command::Read { length, .. } | Command::Write { length, .. } => {
                        prop_assert!(length <= MAX_PAYLOAD);
                        (header.offset, u64::from(length))
                    }
                    _ => (header.offset, header.length),
                };
                prop_assert_eq!(offset % 512, 0);
                prop_assert_eq!(length % 512, 0);
                prop_assert!(offset >= header.offset);
                prop_assert!(offset + length <= end);
            }
        }
        Ok(())
    }

    fn status_run() -> impl Strategy<Value = StatusRun> {
        let length = prop_oneof![0u64..20_000, 0u64..(1 << 34)];
        (length, any::<bool>(), any::<bool>()).prop_map(|(length, hole, zero)| StatusRun {
            length,
            hole,
            zero,
        })
    }

    proptest! {
        #[test]
        fn headers_round_trip(flags: u16, kind: u16, cookie: u64, offset: u64, length: u64) {
            let original = RequestHeader { flags, kind, cookie, offset, length };
            for framing in [Framing::Simple, Framing::Structured, Framing::Extended] {
                match original.encode(framing) {
                    Some(bytes) => {
                        prop_assert_eq!(bytes.len(), framing.request_header_len());
                        prop_assert_eq!(RequestHeader::decode(framing, &bytes), Ok(original));
                    }
                    None => prop_assert!(
                        framing != Framing::Extended && length > u64::from(u32::MAX)
                    ),
                }
            }
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
            let header = RequestHeader::decode(Framing::Structured, &bytes).unwrap();
            let framing = if structured { Framing::Structured } else { Framing::Simple };
            check_any_header(header, size, read_only, framing)?;
        }

        #[test]
        fn arbitrary_extended_headers_never_panic_and_valid_ones_are_in_bounds(
            bytes in proptest::array::uniform32(any::<u8>()),
            size in 0u64..(1 << 40),
            read_only: bool,
            small_length: bool,
        ) {
            let mut bytes = bytes;
            bytes[..4].copy_from_slice(&EXTENDED_REQUEST_MAGIC.to_be_bytes());
            if small_length {
                // Lengths within the export, or about the maximum payload.
                bytes[24..28].fill(0);
            }
            let header = RequestHeader::decode(Framing::Extended, &bytes).unwrap();
            check_any_header(header, size, read_only, Framing::Extended)?;
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
            length in 1u64..(1 << 34),
            runs in proptest::collection::vec(status_run(), 0..16),
            req_one: bool,
        ) {
            let extents = extents_from_runs(&runs, length, req_one);
            let total: u64 = extents.iter().map(|e| e.length).sum();
            prop_assert!(total <= length);
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
