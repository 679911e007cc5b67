//! Byte-level helpers shared by the encoder and the decoder: a checked
//! little-endian reader, record framing with the running stream totals,
//! the range rules, hex.

use super::error::StreamError;
use super::{FRAME_CRC_LEN, FRAME_HEADER_LEN, MAX_PAYLOAD, MAX_VOLUME_SIZE, SECTOR};

/// Reads little-endian fields off the front of a byte slice; every read is
/// checked (None past the end), so decoding never indexes out of bounds.
pub(crate) struct Cursor<'a> {
    rest: &'a [u8],
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Cursor { rest: bytes }
    }

    pub(crate) fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (head, rest) = self.rest.split_first_chunk::<N>()?;
        self.rest = rest;
        Some(*head)
    }

    pub(crate) fn u8(&mut self) -> Option<u8> {
        self.array::<1>().map(|[b]| b)
    }

    pub(crate) fn u16(&mut self) -> Option<u16> {
        self.array().map(u16::from_le_bytes)
    }

    pub(crate) fn u32(&mut self) -> Option<u32> {
        self.array().map(u32::from_le_bytes)
    }

    pub(crate) fn u64(&mut self) -> Option<u64> {
        self.array().map(u64::from_le_bytes)
    }

    pub(crate) fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, rest) = self.rest.split_at_checked(n)?;
        self.rest = rest;
        Some(head)
    }

    pub(crate) fn rest(self) -> &'a [u8] {
        self.rest
    }
}

/// A record's 16-byte frame header, as read.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Frame {
    pub kind: u16,
    pub flags: u16,
    pub len: u32,
    pub seq: u64,
}

impl Frame {
    pub(crate) fn parse(bytes: &[u8]) -> Option<Frame> {
        let mut c = Cursor::new(bytes);
        Some(Frame {
            kind: c.u16()?,
            flags: c.u16()?,
            len: c.u32()?,
            seq: c.u64()?,
        })
    }
}

/// The running totals of a stream (records, bytes, crc32c of every byte),
/// as the trailer states them.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Tally {
    pub records: u64,
    pub bytes: u64,
    pub crc: u32,
}

impl Tally {
    /// Appends one framed record (the payload given in parts) to `out` and
    /// counts it. Checks everything first: on error `out` and the tally are
    /// unchanged.
    pub(crate) fn emit(
        &mut self,
        out: &mut Vec<u8>,
        kind: u16,
        flags: u16,
        payload: &[&[u8]],
    ) -> Result<(), StreamError> {
        let (record, at) = (self.records, self.bytes);
        let len = payload
            .iter()
            .try_fold(0usize, |sum, part| sum.checked_add(part.len()));
        let len = match len {
            Some(len) if len <= MAX_PAYLOAD => len,
            _ => {
                return Err(StreamError::RecordTooLarge {
                    record,
                    at,
                    length: len.map_or(u64::MAX, |l| l as u64),
                })
            }
        };
        // MAX_PAYLOAD fits a u32, so does len (checked just above).
        let len32 = u32::try_from(len).map_err(|_| StreamError::RecordTooLarge {
            record,
            at,
            length: len as u64,
        })?;
        let total = FRAME_HEADER_LEN + len + FRAME_CRC_LEN;
        let next = Tally {
            records: record.checked_add(1).ok_or(StreamError::TooLong { at })?,
            bytes: at
                .checked_add(total as u64)
                .ok_or(StreamError::TooLong { at })?,
            crc: self.crc,
        };
        let start = out.len();
        out.reserve(total);
        out.extend_from_slice(&kind.to_le_bytes());
        out.extend_from_slice(&flags.to_le_bytes());
        out.extend_from_slice(&len32.to_le_bytes());
        out.extend_from_slice(&record.to_le_bytes());
        for part in payload {
            out.extend_from_slice(part);
        }
        let framed = out.get(start..).unwrap_or_default();
        let crc = crc32c::crc32c(framed);
        out.extend_from_slice(&crc.to_le_bytes());
        let whole = out.get(start..).unwrap_or_default();
        *self = Tally {
            crc: crc32c::crc32c_append(self.crc, whole),
            ..next
        };
        Ok(())
    }
}

/// The ordering and range rules of data, zero and discard records.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Ranges {
    pub volume_size: u64,
    /// The next record may not start before this: the resume offset, then
    /// the end of the previous record.
    pub next_offset: u64,
    /// Offsets and lengths are multiples of this (512, or a raw stream's
    /// chunk size).
    pub align: u64,
}

impl Ranges {
    /// Checks a record covering `length` bytes at `offset` (`max_len`: the
    /// longest its type allows) and returns its end.
    pub(crate) fn check(
        &self,
        record: u64,
        at: u64,
        offset: u64,
        length: u64,
        max_len: u64,
    ) -> Result<u64, StreamError> {
        let align = self.align.max(SECTOR);
        if !offset.is_multiple_of(align) || length == 0 || !length.is_multiple_of(align) {
            return Err(StreamError::Misaligned {
                record,
                at,
                offset,
                length,
                align,
            });
        }
        if offset < self.next_offset {
            return Err(StreamError::OutOfOrder {
                record,
                at,
                offset,
                min: self.next_offset,
            });
        }
        let out_of_range = StreamError::OutOfRange {
            record,
            at,
            offset,
            length,
            volume_size: self.volume_size,
        };
        if length > max_len.min(MAX_VOLUME_SIZE) {
            return Err(out_of_range);
        }
        match offset.checked_add(length) {
            Some(end) if end <= self.volume_size => Ok(end),
            _ => Err(out_of_range),
        }
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Appends the lowercase hex of `bytes` to `out`.
pub(crate) fn hex_encode(bytes: &[u8], out: &mut String) {
    for &b in bytes {
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 15)]));
    }
}

/// Decodes hex digits (either case) into `out`; None unless `hex` is
/// exactly `2 * out.len()` hex digits.
pub(crate) fn hex_decode(hex: &[u8], out: &mut [u8]) -> Option<()> {
    if hex.len() != out.len().checked_mul(2)? {
        return None;
    }
    let digit = |c: u8| {
        char::from(c)
            .to_digit(16)
            .and_then(|d| u8::try_from(d).ok())
    };
    for (pair, byte) in hex.chunks_exact(2).zip(out.iter_mut()) {
        let [hi, lo] = pair else { return None };
        *byte = (digit(*hi)? << 4) | digit(*lo)?;
    }
    Some(())
}
