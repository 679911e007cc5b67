//! Data record encodings, and turning a data payload back into bytes.

use std::fmt;

use zstd::zstd_safe::{self, DCtx};

use super::error::StreamError;
use super::MAX_DATA;

/// How a data record's bytes are encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Encoding {
    /// 0: the bytes as they are.
    Raw,
    /// 1: one zstd frame.
    Zstd,
    /// 2: one zstd frame compressed with the receiver's base bytes for the
    /// same range as a raw-content dictionary (incremental streams only).
    ZstdDelta,
}

impl Encoding {
    /// The encoding's number on the wire.
    pub fn code(self) -> u8 {
        match self {
            Encoding::Raw => 0,
            Encoding::Zstd => 1,
            Encoding::ZstdDelta => 2,
        }
    }

    /// The encoding numbered `code`, if it is one.
    pub fn from_code(code: u8) -> Option<Encoding> {
        match code {
            0 => Some(Encoding::Raw),
            1 => Some(Encoding::Zstd),
            2 => Some(Encoding::ZstdDelta),
            _ => None,
        }
    }
}

impl fmt::Display for Encoding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Encoding::Raw => "raw",
            Encoding::Zstd => "zstd",
            Encoding::ZstdDelta => "zstd-delta",
        })
    }
}

/// The first bytes of a zstd frame (RFC 8878 §3.1.1, magic 0xFD2FB528).
const ZSTD_FRAME_MAGIC: [u8; 4] = 0xFD2F_B528u32.to_le_bytes();
/// The first bytes of a formatted zstd dictionary (magic 0xEC30A437).
const ZSTD_DICT_MAGIC: [u8; 4] = 0xEC30_A437u32.to_le_bytes();
/// zstd's error code "destination buffer is too small" (ZSTD_error_dstSize_tooSmall
/// = 70, returned as -70 in a size_t; zstd's error codes are stable).
const ZSTD_DST_TOO_SMALL: usize = 0usize.wrapping_sub(70);

/// Whether zstd would load `base` as a formatted dictionary rather than as
/// raw content: such bytes cannot be the base of a ZSTD_DELTA record.
pub(crate) fn is_dictionary(base: &[u8]) -> bool {
    base.starts_with(&ZSTD_DICT_MAGIC)
}

/// Decodes data payloads, keeping one zstd decompression context across
/// records. Output is bounded: never more than the record's `length`
/// (≤ [`MAX_DATA`]) is written, whatever the payload claims.
#[derive(Default)]
pub struct DataDecoder {
    dctx: Option<DCtx<'static>>,
}

impl fmt::Debug for DataDecoder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DataDecoder").finish_non_exhaustive()
    }
}

impl DataDecoder {
    pub fn new() -> DataDecoder {
        DataDecoder::default()
    }

    /// Decodes the payload of a data record (`encoding`, `payload`, `length`
    /// as [`super::Record::Data`] gives them) into `out`, replacing its
    /// contents with exactly `length` bytes. `base` is the receiver's bytes
    /// for the record's range (`length` bytes), needed for
    /// [`Encoding::ZstdDelta`] only. On error `out` is left empty.
    pub fn decode(
        &mut self,
        encoding: Encoding,
        payload: &[u8],
        length: u32,
        base: Option<&[u8]>,
        out: &mut Vec<u8>,
    ) -> Result<(), StreamError> {
        out.clear();
        let expected = u64::from(length);
        let decompress_error = |reason: String| Err(StreamError::Decompress { reason });
        let length = match usize::try_from(length) {
            Ok(n) if n <= MAX_DATA => n,
            _ => {
                return decompress_error(format!(
                    "its length of {length} bytes is over the limit of {MAX_DATA}"
                ))
            }
        };
        if encoding == Encoding::Raw {
            if payload.len() != length {
                return Err(StreamError::WrongLength {
                    expected,
                    found: u64::try_from(payload.len()).ok(),
                });
            }
            out.extend_from_slice(payload);
            return Ok(());
        }
        let base = match (encoding, base) {
            (Encoding::ZstdDelta, None) => return Err(StreamError::DeltaWithoutBase),
            (Encoding::ZstdDelta, Some(base)) => {
                if base.len() != length {
                    return Err(StreamError::BaseLength {
                        expected,
                        found: u64::try_from(base.len()).unwrap_or(u64::MAX),
                    });
                }
                if is_dictionary(base) {
                    return decompress_error(
                        "its base bytes start with the zstd dictionary magic, which a \
                         delta may not use"
                            .to_string(),
                    );
                }
                Some(base)
            }
            _ => None,
        };
        // Exactly one standard zstd frame: no legacy or skippable frames,
        // nothing after it.
        if !payload.starts_with(&ZSTD_FRAME_MAGIC)
            || zstd_safe::find_frame_compressed_size(payload) != Ok(payload.len())
        {
            return decompress_error("it is not exactly one zstd frame".to_string());
        }
        // A frame that states its size must state the record's.
        if let Ok(Some(size)) = zstd_safe::get_frame_content_size(payload) {
            if size != expected {
                return Err(StreamError::WrongLength {
                    expected,
                    found: Some(size),
                });
            }
        }
        let dctx = match &mut self.dctx {
            Some(dctx) => dctx,
            slot => slot.insert(DCtx::try_create().ok_or_else(|| StreamError::Zstd {
                reason: "cannot allocate a decompression context".to_string(),
            })?),
        };
        out.resize(length, 0);
        let dst = out.as_mut_slice();
        let result = match base {
            Some(base) => dctx.decompress_using_dict(dst, payload, base),
            None => dctx.decompress(dst, payload),
        };
        let error = match result {
            Ok(n) if n == length => return Ok(()),
            Ok(n) => StreamError::WrongLength {
                expected,
                found: u64::try_from(n).ok(),
            },
            Err(ZSTD_DST_TOO_SMALL) => StreamError::WrongLength {
                expected,
                found: None,
            },
            Err(code) => StreamError::Decompress {
                reason: format!("zstd: {}", zstd_safe::get_error_name(code)),
            },
        };
        out.clear();
        Err(error)
    }
}

/// [`DataDecoder::decode`] with a decompression context of its own (for a
/// single record; a receiver keeps a [`DataDecoder`]).
pub fn decode_data(
    encoding: Encoding,
    payload: &[u8],
    length: u32,
    base: Option<&[u8]>,
    out: &mut Vec<u8>,
) -> Result<(), StreamError> {
    DataDecoder::new().decode(encoding, payload, length, base, out)
}
