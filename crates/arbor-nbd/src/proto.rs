//! Wire constants of the NBD protocol (fixed newstyle handshake, simple,
//! structured and extended replies), the limits this server enforces, and a
//! bounds-checked reader for untrusted payloads.
//!
//! Names follow the NBD specification (`doc/proto.md` of the
//! NetworkBlockDevice project) without the `NBD_` prefix. Only the values
//! this server sends or recognises are listed.

/// `NBDMAGIC`: first 8 bytes the server sends.
pub const NBD_MAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`: newstyle magic, also the prefix of every client option.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Magic of every option reply.
pub const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// Magic of a transmission request (compact, 28-byte header).
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// Magic of an extended transmission request (32-byte header, 64-bit
/// length), used once `NBD_OPT_EXTENDED_HEADERS` is negotiated.
pub const EXTENDED_REQUEST_MAGIC: u32 = 0x21e4_1c71;
/// Magic of a simple reply.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// Magic of a structured reply chunk.
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;
/// Magic of an extended reply chunk (32-byte header echoing the request's
/// offset, 64-bit length): every reply once extended headers are negotiated.
pub const EXTENDED_REPLY_MAGIC: u32 = 0x6e8a_278c;

/// Handshake flags (server, 16 bits).
pub mod handshake_flags {
    pub const FIXED_NEWSTYLE: u16 = 1 << 0;
    pub const NO_ZEROES: u16 = 1 << 1;
}

/// Client flags (32 bits).
pub mod client_flags {
    pub const FIXED_NEWSTYLE: u32 = 1 << 0;
    pub const NO_ZEROES: u32 = 1 << 1;
    /// Every flag this server advertised; any other bit is a protocol violation.
    pub const KNOWN: u32 = FIXED_NEWSTYLE | NO_ZEROES;
}

/// Transmission flags (16 bits), sent with the export size.
pub mod transmission_flags {
    pub const HAS_FLAGS: u16 = 1 << 0;
    pub const READ_ONLY: u16 = 1 << 1;
    pub const SEND_FLUSH: u16 = 1 << 2;
    pub const SEND_FUA: u16 = 1 << 3;
    pub const SEND_TRIM: u16 = 1 << 5;
    pub const SEND_WRITE_ZEROES: u16 = 1 << 6;
    pub const SEND_DF: u16 = 1 << 7;
    pub const CAN_MULTI_CONN: u16 = 1 << 8;
    pub const SEND_CACHE: u16 = 1 << 10;
    pub const SEND_FAST_ZERO: u16 = 1 << 11;
}

/// Option codes sent by the client during haggling.
pub mod option {
    pub const EXPORT_NAME: u32 = 1;
    pub const ABORT: u32 = 2;
    pub const LIST: u32 = 3;
    pub const STARTTLS: u32 = 5;
    pub const INFO: u32 = 6;
    pub const GO: u32 = 7;
    pub const STRUCTURED_REPLY: u32 = 8;
    pub const LIST_META_CONTEXT: u32 = 9;
    pub const SET_META_CONTEXT: u32 = 10;
    pub const EXTENDED_HEADERS: u32 = 11;
}

/// Option reply types. Errors have bit 31 set.
pub mod option_reply {
    pub const ACK: u32 = 1;
    pub const SERVER: u32 = 2;
    pub const INFO: u32 = 3;
    pub const META_CONTEXT: u32 = 4;
    const ERROR: u32 = 1 << 31;
    pub const ERR_UNSUP: u32 = ERROR | 1;
    pub const ERR_POLICY: u32 = ERROR | 2;
    pub const ERR_INVALID: u32 = ERROR | 3;
    pub const ERR_TLS_REQD: u32 = ERROR | 5;
    pub const ERR_UNKNOWN: u32 = ERROR | 6;
    /// Extended headers are in force (the answer to `NBD_OPT_STRUCTURED_REPLY`
    /// after `NBD_OPT_EXTENDED_HEADERS`).
    pub const ERR_EXT_HEADER_REQD: u32 = ERROR | 10;
}

/// Information types of `NBD_OPT_INFO` / `NBD_OPT_GO`.
pub mod info {
    pub const EXPORT: u16 = 0;
    pub const NAME: u16 = 1;
    pub const DESCRIPTION: u16 = 2;
    pub const BLOCK_SIZE: u16 = 3;
}

/// Transmission command types.
pub mod command {
    pub const READ: u16 = 0;
    pub const WRITE: u16 = 1;
    pub const DISC: u16 = 2;
    pub const FLUSH: u16 = 3;
    pub const TRIM: u16 = 4;
    pub const CACHE: u16 = 5;
    pub const WRITE_ZEROES: u16 = 6;
    pub const BLOCK_STATUS: u16 = 7;
}

/// Command flags (16 bits).
pub mod command_flags {
    pub const FUA: u16 = 1 << 0;
    pub const NO_HOLE: u16 = 1 << 1;
    pub const DF: u16 = 1 << 2;
    pub const REQ_ONE: u16 = 1 << 3;
    pub const FAST_ZERO: u16 = 1 << 4;
    /// Extended headers only: the length field is the length of a payload
    /// that follows the header (else it is the command's effect length).
    pub const PAYLOAD_LEN: u16 = 1 << 5;
}

/// Structured reply chunk flags and types.
pub mod reply {
    pub const FLAG_DONE: u16 = 1 << 0;
    pub const TYPE_NONE: u16 = 0;
    pub const TYPE_OFFSET_DATA: u16 = 1;
    pub const TYPE_OFFSET_HOLE: u16 = 2;
    pub const TYPE_BLOCK_STATUS: u16 = 5;
    /// Block status with 64-bit lengths and flags: the only status chunk
    /// type once extended headers are negotiated.
    pub const TYPE_BLOCK_STATUS_EXT: u16 = 6;
    pub const TYPE_ERROR: u16 = (1 << 15) | 1;
}

/// Flags of the `base:allocation` metadata context.
pub mod state {
    pub const HOLE: u32 = 1 << 0;
    pub const ZERO: u32 = 1 << 1;
}

/// The metadata context every export has (exports may offer more: see
/// `Export::meta_contexts`).
pub const BASE_ALLOCATION: &str = "base:allocation";
/// Most metadata contexts one connection selects (each block status
/// request answers every one of them).
pub const MAX_META_CONTEXTS: usize = 8;

/// A metadata context selected for a connection, and the id it got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaContext {
    pub id: u32,
    pub name: String,
}
/// The namespace prefix of [`BASE_ALLOCATION`]; alone, it is a wildcard query.
pub const BASE_NAMESPACE: &str = "base:";
/// Context id handed out for `base:allocation` (ids are per connection and
/// opaque to the client); an export's own contexts get the ids after it.
pub const BASE_ALLOCATION_ID: u32 = 1;

/// Length of the server's initial greeting: `NBDMAGIC`, `IHAVEOPT`, flags.
pub const GREETING_LEN: usize = 18;
/// Length of the client flags field.
pub const CLIENT_FLAGS_LEN: usize = 4;
/// Length of an option header: magic, option code, data length.
pub const OPTION_HEADER_LEN: usize = 16;
/// Length of a compact request header.
pub const REQUEST_HEADER_LEN: usize = 28;
/// Length of an extended request header.
pub const EXTENDED_REQUEST_HEADER_LEN: usize = 32;
/// Length of a simple reply header.
pub const SIMPLE_REPLY_LEN: usize = 16;
/// Length of a structured reply chunk header.
pub const CHUNK_HEADER_LEN: usize = 20;
/// Length of an extended reply chunk header.
pub const EXTENDED_CHUNK_HEADER_LEN: usize = 32;
/// Zero padding after the `NBD_OPT_EXPORT_NAME` reply unless the client
/// negotiated `NO_ZEROES`.
pub const EXPORT_NAME_PADDING: usize = 124;

/// Longest option payload accepted. The largest legitimate option is a meta
/// context request: a 4 KiB name plus a few 4 KiB queries. Anything longer is
/// treated as a denial-of-service attempt and closes the connection.
pub const MAX_OPTION_LEN: u32 = 64 * 1024;
/// Longest string (export name, query, message) the spec permits.
pub const MAX_STRING_LEN: usize = 4096;

/// Minimum block size advertised. The arbor engine addresses 512-byte
/// sectors, so every offset and length must be a multiple of this; requests
/// that are not are answered with `EINVAL`.
pub const MIN_BLOCK_SIZE: u32 = 512;
/// Preferred block size advertised: the smallest I/O that avoids
/// read-modify-write in the engine's page-sized structures.
pub const PREFERRED_BLOCK_SIZE: u32 = 4096;
/// Maximum payload advertised and accepted (32 MiB): the size every client
/// must support, and the unit of the per-connection memory budget.
pub const MAX_PAYLOAD: u32 = 32 * 1024 * 1024;
/// Largest read or write served to a client that never learned
/// [`MAX_PAYLOAD`] (it negotiated no block sizes), within the memory
/// budget: such clients may send more than the 32 MiB every server
/// supports (the reference tester's huge-integrity trace sends 47.5 MiB).
pub const MAX_UNNEGOTIATED_PAYLOAD: u32 = 64 * 1024 * 1024;

/// `text` cut to the protocol's string limit ([`MAX_STRING_LEN`] bytes) on
/// a character boundary, for strings this server sends.
pub fn truncate_text(text: &str) -> &str {
    let mut end = text.len().min(MAX_STRING_LEN);
    // Terminates: offset 0 is always a character boundary.
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.get(..end).unwrap_or_default()
}

// The spec's constraints on advertised sizes, checked at compile time.
const _: () = {
    assert!(MIN_BLOCK_SIZE.is_power_of_two() && MIN_BLOCK_SIZE <= 65536);
    assert!(PREFERRED_BLOCK_SIZE.is_power_of_two() && PREFERRED_BLOCK_SIZE >= MIN_BLOCK_SIZE);
    assert!(PREFERRED_BLOCK_SIZE >= 512 && MAX_PAYLOAD >= PREFERRED_BLOCK_SIZE);
    assert!(MAX_PAYLOAD.is_multiple_of(MIN_BLOCK_SIZE));
    assert!(MAX_UNNEGOTIATED_PAYLOAD >= MAX_PAYLOAD);
};

/// Error values this server puts in replies (the protocol also defines
/// `ENOMEM`, which servers should avoid). Each has the Linux errno value of
/// the same name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Errno {
    Perm = 1,
    Io = 5,
    Inval = 22,
    NoSpc = 28,
    Overflow = 75,
    NotSup = 95,
    Shutdown = 108,
}

impl Errno {
    /// The value carried on the wire.
    pub fn code(self) -> u32 {
        self as u32
    }
}

/// Sequential, bounds-checked reader over an untrusted payload. Every
/// accessor returns `None` instead of reading past the end, so parsers built
/// on it cannot panic on short input.
#[derive(Debug, Clone)]
pub struct ByteReader<'a> {
    rest: &'a [u8],
}

impl<'a> ByteReader<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Self { rest: bytes }
    }

    pub fn is_empty(&self) -> bool {
        self.rest.is_empty()
    }

    /// Takes the next `len` bytes.
    pub fn bytes(&mut self, len: usize) -> Option<&'a [u8]> {
        if len > self.rest.len() {
            return None;
        }
        let (head, tail) = self.rest.split_at(len);
        self.rest = tail;
        Some(head)
    }

    /// Takes the next `N` bytes as an array.
    pub fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.bytes(N)?.try_into().ok()
    }

    pub fn u16(&mut self) -> Option<u16> {
        self.array().map(u16::from_be_bytes)
    }

    pub fn u32(&mut self) -> Option<u32> {
        self.array().map(u32::from_be_bytes)
    }

    pub fn u64(&mut self) -> Option<u64> {
        self.array().map(u64::from_be_bytes)
    }

    /// Takes a string of `len` bytes that must be valid protocol text:
    /// UTF-8, no NUL, at most [`MAX_STRING_LEN`] bytes.
    pub fn string(&mut self, len: usize) -> Option<&'a str> {
        if len > MAX_STRING_LEN {
            return None;
        }
        let text = std::str::from_utf8(self.bytes(len)?).ok()?;
        (!text.contains('\0')).then_some(text)
    }

    /// Takes a string preceded by its 32-bit length.
    pub fn prefixed_string(&mut self) -> Option<&'a str> {
        let len = usize::try_from(self.u32()?).ok()?;
        self.string(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reader_refuses_to_read_past_the_end() {
        let mut reader = ByteReader::new(&[0, 1, 2]);
        assert_eq!(reader.u16(), Some(1));
        assert_eq!(reader.u16(), None);
        assert_eq!(reader.bytes(1), Some(&[2u8][..]));
        assert!(reader.is_empty());
    }

    #[test]
    fn strings_must_be_utf8_without_nul_and_short() {
        assert_eq!(ByteReader::new(b"abc").string(3), Some("abc"));
        assert_eq!(ByteReader::new(b"a\0c").string(3), None);
        assert_eq!(ByteReader::new(&[0xff, 0xfe]).string(2), None);
        let long = vec![b'a'; MAX_STRING_LEN + 1];
        assert_eq!(ByteReader::new(&long).string(long.len()), None);
    }

    #[test]
    fn prefixed_string_with_lying_length_is_rejected() {
        let mut bytes = 10u32.to_be_bytes().to_vec();
        bytes.extend_from_slice(b"short");
        assert_eq!(ByteReader::new(&bytes).prefixed_string(), None);
    }
}
