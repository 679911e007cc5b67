//! Resume tokens.

use std::fmt;
use std::str::FromStr;

use super::error::StreamError;
use super::guid::Guid;
use super::wire::{hex_decode, hex_encode, Cursor};
use super::{MAX_VOLUME_SIZE, SECTOR};

/// The token version this crate writes and reads.
const TOKEN_VERSION: &str = "1";
/// Seeds the token's checksum, so that a token of another kind with a
/// valid-looking crc is not taken for one of ours.
const TOKEN_DOMAIN: &[u8; 8] = b"ARBORRSM";
/// Binary bytes of a version 1 token: target, base, offset, volume size, crc.
const TOKEN_BYTES: usize = 16 + 16 + 8 + 8 + 4;

/// Where an interrupted receive stands, as its receiver reports it and a
/// sender takes it back to resume: the stream to send (target, base), the
/// target's size, and the offset from which the receiver still needs data.
///
/// Printed as `1-` and 104 lowercase hex digits: the target identity (16
/// bytes), the base identity (16, zero for a full stream), the offset and
/// the volume size (u64 little-endian each) and a crc32c (u32
/// little-endian) of the 8 bytes `ARBORRSM` followed by the 48 bytes before
/// it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ResumeToken {
    pub target: Guid,
    pub base: Option<Guid>,
    /// Bytes of the volume received and committed: the resumed stream's
    /// `resume_offset`.
    pub offset: u64,
    pub volume_size: u64,
}

impl ResumeToken {
    /// The printable token.
    pub fn encode(&self) -> String {
        let mut bytes = Vec::with_capacity(TOKEN_BYTES);
        bytes.extend_from_slice(&self.target.0);
        bytes.extend_from_slice(&self.base.unwrap_or(Guid::ZERO).0);
        bytes.extend_from_slice(&self.offset.to_le_bytes());
        bytes.extend_from_slice(&self.volume_size.to_le_bytes());
        let crc = crc32c::crc32c_append(crc32c::crc32c(TOKEN_DOMAIN), &bytes);
        bytes.extend_from_slice(&crc.to_le_bytes());
        let mut out = String::with_capacity(2 + 2 * TOKEN_BYTES);
        out.push_str(TOKEN_VERSION);
        out.push('-');
        hex_encode(&bytes, &mut out);
        out
    }

    /// Parses a printed token (surrounding whitespace ignored), rejecting
    /// tokens that are damaged, of another version, or not arbor's.
    pub fn decode(token: &str) -> Result<ResumeToken, StreamError> {
        let bad = |reason: &str| StreamError::BadResumeToken {
            reason: reason.to_string(),
        };
        let token = token.trim();
        let Some((version, hex)) = token.split_once('-') else {
            return Err(bad("not an arbor resume token"));
        };
        if version != TOKEN_VERSION {
            return Err(
                if !version.is_empty() && version.bytes().all(|b| b.is_ascii_digit()) {
                    StreamError::BadResumeToken {
                        reason: format!(
                            "token version {version} is not supported (this arbor reads \
                             version {TOKEN_VERSION})"
                        ),
                    }
                } else {
                    bad("not an arbor resume token")
                },
            );
        }
        let mut bytes = [0u8; TOKEN_BYTES];
        if hex.len() != 2 * TOKEN_BYTES {
            return Err(bad("wrong length (truncated or damaged?)"));
        }
        hex_decode(hex.as_bytes(), &mut bytes)
            .ok_or_else(|| bad("it has characters that are not hex digits"))?;
        let (fields, crc) = bytes
            .split_last_chunk::<4>()
            .ok_or_else(|| bad("wrong length"))?;
        if crc32c::crc32c_append(crc32c::crc32c(TOKEN_DOMAIN), fields) != u32::from_le_bytes(*crc) {
            return Err(bad("checksum mismatch (mistyped or damaged?)"));
        }
        let mut c = Cursor::new(fields);
        let (Some(target), Some(base), Some(offset), Some(volume_size)) =
            (c.array(), c.array(), c.u64(), c.u64())
        else {
            return Err(bad("wrong length"));
        };
        let (target, base) = (Guid(target), Guid(base));
        let token = ResumeToken {
            target,
            base: (!base.is_zero()).then_some(base),
            offset,
            volume_size,
        };
        token.validate()?;
        Ok(token)
    }

    fn validate(&self) -> Result<(), StreamError> {
        let bad = |reason: &str| {
            Err(StreamError::BadResumeToken {
                reason: reason.to_string(),
            })
        };
        if self.target.is_zero() {
            return bad("its target identity is zero");
        }
        if self.base == Some(self.target) {
            return bad("its base is its target");
        }
        if !self.volume_size.is_multiple_of(SECTOR) || self.volume_size > MAX_VOLUME_SIZE {
            return bad("its volume size is not a multiple of 512 up to 2^60");
        }
        if !self.offset.is_multiple_of(SECTOR) || self.offset > self.volume_size {
            return bad("its offset is not a multiple of 512 within the volume");
        }
        Ok(())
    }
}

impl fmt::Display for ResumeToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.encode())
    }
}

impl FromStr for ResumeToken {
    type Err = StreamError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ResumeToken::decode(s)
    }
}
