//! The snapshot delta stream, version [`FORMAT_VERSION`]: framing,
//! records, checksums and rules, as a sans-I/O codec. `docs/STREAM.md` is
//! the prose description of exactly this format.
//!
//! A stream is a sequence of records, each framed as
//!
//! ```text
//! 0    2  type      1 header, 2 data, 3 zero, 4 discard, 5 trailer, 6 key
//! 2    2  flags     bit 0 OPTIONAL (a reader may skip the record if it does not know the type)
//! 4    4  payload length n (≤ MAX_PAYLOAD)
//! 8    8  sequence number (0 for the header, +1 for each record)
//! 16   n  payload
//! 16+n 4  crc32c of bytes [0, 16 + n)
//! ```
//!
//! all integers little-endian. The header comes first, the trailer last; the
//! trailer carries the record count, byte count and crc32c of everything
//! before it. Data, zero and discard records cover strictly increasing,
//! non-overlapping, 512-byte-aligned ranges of the volume.
//!
//! * [`Encoder`] appends records to a `Vec<u8>` and refuses (with an error,
//!   never a panic) anything the decoder would refuse.
//! * [`Decoder`] is a push decoder: give it whatever bytes have arrived; it
//!   answers [`Decoded::NeedMore`] or one fully verified [`Record`]. It never
//!   asks for more than [`MAX_RECORD`] bytes, so a reader's memory is bounded
//!   whatever the input.
//! * [`DataDecoder`] turns a data record's payload into the volume's bytes
//!   (raw, zstd, or zstd against the receiver's base bytes).
//! * [`ResumeToken`] is the printable token a receiver hands back to a
//!   sender to resume an interrupted stream.

mod data;
mod decoder;
mod encoder;
mod error;
mod guid;
mod header;
mod token;
mod wire;

pub use data::{decode_data, DataDecoder, Encoding};
pub use decoder::{Decoded, Decoder, Record};
pub use encoder::{Compression, Encoder};
pub use error::{StreamError, TrailerField};
pub use guid::Guid;
pub use header::Header;
pub use token::ResumeToken;

/// The newest stream format version this crate reads and writes: version
/// 2 adds raw streams (a [`RECORD_KEY`] and [`HEADER_FLAG_RAW`]). A writer
/// writes version 1 unless the stream is raw, so that older readers take
/// every stream they could apply.
pub const FORMAT_VERSION: u16 = 2;
/// The oldest stream format version this crate reads.
pub const MIN_FORMAT_VERSION: u16 = 1;
/// The first 8 bytes of the header record's payload.
pub const MAGIC: [u8; 8] = *b"ARBORSTR";

/// Bytes of a record's frame before its payload.
pub const FRAME_HEADER_LEN: usize = 16;
/// Bytes of a record's frame after its payload (its crc32c).
pub const FRAME_CRC_LEN: usize = 4;
/// The largest payload a record may carry: a data record's 16-byte header
/// and [`MAX_DATA`] raw bytes, with room to spare.
pub const MAX_PAYLOAD: usize = (1 << 20) + 64;
/// The largest record, frame included: the most a [`Decoder`] ever asks for.
pub const MAX_RECORD: usize = FRAME_HEADER_LEN + MAX_PAYLOAD + FRAME_CRC_LEN;
/// The most volume bytes one data record carries.
pub const MAX_DATA: usize = 1 << 20;
/// The longest snapshot name in a header, in bytes (as in a pool's volume
/// table).
pub const MAX_NAME: usize = 184;
/// Offsets and lengths in a stream are multiples of this.
pub const SECTOR: u64 = 512;
/// The largest volume size (and zero or discard length) a stream describes.
pub const MAX_VOLUME_SIZE: u64 = 1 << 60;
/// The smallest chunk size a header may state.
pub const MIN_CHUNK_SIZE: u32 = 4096;
/// The largest chunk size a header may state.
pub const MAX_CHUNK_SIZE: u32 = 1 << 20;

/// Record type: the stream header (first record, exactly once).
pub const RECORD_HEADER: u16 = 1;
/// Record type: volume bytes.
pub const RECORD_DATA: u16 = 2;
/// Record type: a range that reads as zeros.
pub const RECORD_ZERO: u16 = 3;
/// Record type: a range that is unmapped.
pub const RECORD_DISCARD: u16 = 4;
/// Record type: the stream trailer (last record, exactly once).
pub const RECORD_TRAILER: u16 = 5;
/// Record type (version 2): a raw stream's wrapped data key, the record
/// right after the header, exactly once, in raw streams only.
pub const RECORD_KEY: u16 = 6;

/// Record flag: a reader that does not know the record's type skips it.
/// Never set on the types above.
pub const RECORD_FLAG_OPTIONAL: u16 = 1;

/// Header flag: the stream is a delta against a base snapshot.
pub const HEADER_FLAG_INCREMENTAL: u16 = 1;
/// Header flag: the stream resumes an interrupted one at `resume_offset`.
pub const HEADER_FLAG_RESUMED: u16 = 2;
/// Header flag (version 2): the stream is raw: its data records carry the
/// target's stored bytes (an encrypted volume's ciphertext), its second
/// record is the wrapped key, and its ranges are whole chunks of the
/// header's `chunk_size`.
pub const HEADER_FLAG_RAW: u16 = 4;

/// Bytes of the header payload before the name.
pub const HEADER_FIXED_LEN: usize = 74;
/// Bytes of a data record's payload before the encoded bytes.
pub const DATA_HEADER_LEN: usize = 16;
/// Payload bytes of a zero or discard record.
pub const RANGE_PAYLOAD_LEN: usize = 16;
/// Payload bytes of a key record: a key record of docs/FORMAT.md §6.6.
pub const KEY_PAYLOAD_LEN: usize = arbor_crypt::KEY_RECORD_LEN;
/// Payload bytes of the trailer.
pub const TRAILER_PAYLOAD_LEN: usize = 24;
