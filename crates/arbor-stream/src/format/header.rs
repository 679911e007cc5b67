//! The header record's payload.

use super::error::StreamError;
use super::guid::Guid;
use super::wire::Cursor;
use super::{
    FORMAT_VERSION, HEADER_FLAG_INCREMENTAL, HEADER_FLAG_RAW, HEADER_FLAG_RESUMED, MAGIC,
    MAX_CHUNK_SIZE, MAX_NAME, MAX_VOLUME_SIZE, MIN_CHUNK_SIZE, MIN_FORMAT_VERSION, SECTOR,
};

/// What a stream holds: the first record of every stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// The sender's chunk size (a power of two, 4 KiB ..= 1 MiB):
    /// informational for receivers.
    pub chunk_size: u32,
    /// The target snapshot's size in bytes (a multiple of 512, ≤ 2^60).
    pub volume_size: u64,
    /// The target snapshot's identity (non-zero).
    pub target: Guid,
    /// For an incremental stream, the base snapshot's identity (non-zero,
    /// not the target's); None for a full stream.
    pub base: Option<Guid>,
    /// Where a resumed stream starts (a multiple of 512, ≤ `volume_size`):
    /// no record covers bytes before it. 0 for a stream from the start.
    pub resume_offset: u64,
    /// When the target snapshot was taken, Unix seconds.
    pub creation_time: u64,
    /// The target snapshot's name on the sender (1 ..= 184 bytes of UTF-8,
    /// no control characters): informational.
    pub name: String,
    /// A raw stream (version 2): its data is the target's stored bytes (an
    /// encrypted volume's ciphertext), a key record follows the header,
    /// and its sizes and ranges are whole chunks of `chunk_size`, which
    /// binds the receiver.
    pub raw: bool,
}

impl Header {
    /// Whether the stream is a delta against a base snapshot.
    pub fn is_incremental(&self) -> bool {
        self.base.is_some()
    }

    /// Whether the stream resumes an interrupted one.
    pub fn is_resumed(&self) -> bool {
        self.resume_offset > 0
    }

    /// The version a writer gives this stream: the oldest that carries it.
    pub fn version(&self) -> u16 {
        if self.raw {
            FORMAT_VERSION
        } else {
            MIN_FORMAT_VERSION
        }
    }

    /// What the stream's ranges are multiples of: the chunk size in a raw
    /// stream, else 512.
    pub fn alignment(&self) -> u64 {
        if self.raw {
            u64::from(self.chunk_size)
        } else {
            SECTOR
        }
    }

    /// Checks every rule of the header (the decoder applies the same ones).
    pub fn validate(&self) -> Result<(), StreamError> {
        let bad = |reason: String| Err(StreamError::BadHeader { reason });
        if !self.chunk_size.is_power_of_two()
            || !(MIN_CHUNK_SIZE..=MAX_CHUNK_SIZE).contains(&self.chunk_size)
        {
            return bad(format!(
                "chunk size {} is not a power of two from {MIN_CHUNK_SIZE} to {MAX_CHUNK_SIZE}",
                self.chunk_size
            ));
        }
        if !self.volume_size.is_multiple_of(SECTOR) || self.volume_size > MAX_VOLUME_SIZE {
            return bad(format!(
                "volume size {} is not a multiple of {SECTOR} up to 2^60",
                self.volume_size
            ));
        }
        if self.target.is_zero() {
            return bad("the target snapshot's identity is zero".to_string());
        }
        if let Some(base) = self.base {
            if base.is_zero() {
                return bad("the base snapshot's identity is zero".to_string());
            }
            if base == self.target {
                return bad(format!("the base snapshot is the target itself ({base})"));
            }
        }
        if !self.resume_offset.is_multiple_of(SECTOR) || self.resume_offset > self.volume_size {
            return bad(format!(
                "resume offset {} is not a multiple of {SECTOR} within the volume's {} bytes",
                self.resume_offset, self.volume_size
            ));
        }
        if self.raw {
            let chunk = u64::from(self.chunk_size);
            if !self.volume_size.is_multiple_of(chunk) || !self.resume_offset.is_multiple_of(chunk)
            {
                return bad(format!(
                    "a raw stream's volume size {} and resume offset {} must be multiples of \
                     its chunk size {chunk}",
                    self.volume_size, self.resume_offset
                ));
            }
        }
        check_name(self.name.as_bytes()).map(|_| ())
    }

    /// Appends the header payload (after [`Header::validate`]).
    pub(crate) fn encode_payload(&self, out: &mut Vec<u8>) -> Result<(), StreamError> {
        self.validate()?;
        let mut flags = 0;
        if self.base.is_some() {
            flags |= HEADER_FLAG_INCREMENTAL;
        }
        if self.resume_offset > 0 {
            flags |= HEADER_FLAG_RESUMED;
        }
        if self.raw {
            flags |= HEADER_FLAG_RAW;
        }
        // validate() bounded the name to MAX_NAME bytes, which fits a u16.
        let name_len = u16::try_from(self.name.len()).map_err(|_| StreamError::BadName {
            reason: "longer than 184 bytes".to_string(),
        })?;
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&self.version().to_le_bytes());
        out.extend_from_slice(&flags.to_le_bytes());
        out.extend_from_slice(&self.chunk_size.to_le_bytes());
        out.extend_from_slice(&self.volume_size.to_le_bytes());
        out.extend_from_slice(&self.target.0);
        out.extend_from_slice(&self.base.unwrap_or(Guid::ZERO).0);
        out.extend_from_slice(&self.resume_offset.to_le_bytes());
        out.extend_from_slice(&self.creation_time.to_le_bytes());
        out.extend_from_slice(&name_len.to_le_bytes());
        out.extend_from_slice(self.name.as_bytes());
        Ok(())
    }

    /// Parses and checks a header payload. Bytes after the name are ignored
    /// (room for later versions to add fields).
    pub(crate) fn parse(payload: &[u8]) -> Result<Header, StreamError> {
        let short = || StreamError::BadHeader {
            reason: format!(
                "its payload of {} bytes is too short for its fields",
                payload.len()
            ),
        };
        let mut c = Cursor::new(payload);
        let magic: [u8; 8] = c.array().ok_or_else(short)?;
        if magic != MAGIC {
            return Err(StreamError::NotAStream);
        }
        let version = c.u16().ok_or_else(short)?;
        if !(MIN_FORMAT_VERSION..=FORMAT_VERSION).contains(&version) {
            return Err(StreamError::UnsupportedVersion { version });
        }
        let flags = c.u16().ok_or_else(short)?;
        let chunk_size = c.u32().ok_or_else(short)?;
        let volume_size = c.u64().ok_or_else(short)?;
        let target = Guid(c.array().ok_or_else(short)?);
        let base = Guid(c.array().ok_or_else(short)?);
        let resume_offset = c.u64().ok_or_else(short)?;
        let creation_time = c.u64().ok_or_else(short)?;
        let name_len = c.u16().ok_or_else(short)?;
        let name = c.bytes(usize::from(name_len)).ok_or_else(short)?;
        let bad = |reason: String| Err(StreamError::BadHeader { reason });
        let known = match version {
            1 => HEADER_FLAG_INCREMENTAL | HEADER_FLAG_RESUMED,
            _ => HEADER_FLAG_INCREMENTAL | HEADER_FLAG_RESUMED | HEADER_FLAG_RAW,
        };
        if flags & !known != 0 {
            return bad(format!(
                "unknown header flags {:#06x} for a version {version} stream",
                flags & !known
            ));
        }
        let incremental = flags & HEADER_FLAG_INCREMENTAL != 0;
        if incremental == base.is_zero() {
            return bad(if incremental {
                "the stream is incremental but names no base snapshot".to_string()
            } else {
                "the stream is not incremental but names a base snapshot".to_string()
            });
        }
        if flags & HEADER_FLAG_RESUMED == 0 && resume_offset != 0 {
            return bad(format!(
                "resume offset {resume_offset} in a stream that is not resumed"
            ));
        }
        let header = Header {
            chunk_size,
            volume_size,
            target,
            base: incremental.then_some(base),
            resume_offset,
            creation_time,
            name: check_name(name)?.to_string(),
            raw: flags & HEADER_FLAG_RAW != 0,
        };
        header.validate()?;
        Ok(header)
    }
}

fn check_name(name: &[u8]) -> Result<&str, StreamError> {
    let bad = |reason: String| Err(StreamError::BadName { reason });
    if name.is_empty() {
        return bad("empty".to_string());
    }
    if name.len() > MAX_NAME {
        return bad(format!("{} bytes, more than {MAX_NAME}", name.len()));
    }
    let Ok(name) = std::str::from_utf8(name) else {
        return bad("not UTF-8".to_string());
    };
    if name.chars().any(char::is_control) {
        return bad(format!("{name:?} contains control characters"));
    }
    Ok(name)
}
