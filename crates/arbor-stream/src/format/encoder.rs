//! The stream writer.

use std::fmt;

use zstd::zstd_safe::CCtx;

use super::data::{is_dictionary, Encoding};
use super::error::StreamError;
use super::header::Header;
use super::wire::{Ranges, Tally};
use super::{
    DATA_HEADER_LEN, MAX_DATA, MAX_NAME, MAX_VOLUME_SIZE, RANGE_PAYLOAD_LEN, RECORD_DATA,
    RECORD_DISCARD, RECORD_HEADER, RECORD_KEY, RECORD_TRAILER, RECORD_ZERO, TRAILER_PAYLOAD_LEN,
};

/// The lowest zstd level a delta is compressed at. Below it zstd's tables
/// are too small to index all of a large base (zstd loads only the last
/// `2^max(hashLog + 3, chainLog + 1)` bytes of a dictionary: 64 KiB at
/// level 1), so a delta of a 1 MiB record would find almost nothing.
const MIN_DELTA_LEVEL: i32 = 3;

/// How an [`Encoder`] encodes data records. Whatever is chosen, a record
/// whose compressed form would not be smaller than its data goes raw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// Every data record raw.
    None,
    /// zstd at `level`; against the base bytes (ZSTD_DELTA, at level 3 or
    /// above) when the caller gives them, else plain (ZSTD).
    Zstd { level: i32 },
    /// The smallest of raw, zstd and (when base bytes are given) zstd
    /// against them, at `level`: Zumastor's "best". Costs two compressions
    /// per record when a base is given.
    Best { level: i32 },
}

/// Writes a stream: sans-I/O, each call appends one record to the caller's
/// buffer. The encoder applies the decoder's rules and refuses (returns an
/// error, leaving `out` as it was) a call that would break them: ranges out
/// of order, overlapping, misaligned or past the volume, data too long, a
/// base in a stream that is not incremental.
///
/// ```
/// use arbor_stream::format::{Compression, Encoder, Guid, Header};
/// let header = Header {
///     chunk_size: 65536,
///     volume_size: 1 << 20,
///     target: Guid([7; 16]),
///     base: None,
///     resume_offset: 0,
///     creation_time: 1_700_000_000,
///     name: "vm1@monday".to_string(),
///     raw: false,
/// };
/// let mut out = Vec::new();
/// let mut enc = Encoder::new(&header, Compression::Zstd { level: 3 }, &mut out)?;
/// enc.data(0, &[1u8; 4096], None, &mut out)?;
/// enc.zero(4096, 8192, &mut out)?;
/// enc.finish(&mut out)?;
/// # Ok::<(), arbor_stream::format::StreamError>(())
/// ```
pub struct Encoder {
    tally: Tally,
    ranges: Ranges,
    incremental: bool,
    /// A raw stream: data goes uncompressed, and there are no zero records.
    raw: bool,
    compression: Compression,
    /// One zstd context for the whole stream (None without compression).
    cctx: Option<CCtx<'static>>,
    /// Scratch for a record compressed plain, and against its base.
    plain: Vec<u8>,
    delta: Vec<u8>,
}

impl fmt::Debug for Encoder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Encoder")
            .field("records", &self.tally.records)
            .field("position", &self.tally.bytes)
            .field("next_offset", &self.ranges.next_offset)
            .field("compression", &self.compression)
            .finish_non_exhaustive()
    }
}

impl Encoder {
    /// Starts a stream: checks `header` and appends the header record. A
    /// raw header starts with [`Encoder::new_raw`] instead.
    pub fn new(
        header: &Header,
        compression: Compression,
        out: &mut Vec<u8>,
    ) -> Result<Encoder, StreamError> {
        if header.raw {
            return Err(StreamError::Raw {
                reason: "it starts with its key record (Encoder::new_raw)".to_string(),
            });
        }
        Self::start(header, compression, out)
    }

    /// Starts a raw stream (version 2): `header` (raw) and the key record
    /// of its data, `key`. Its data records go uncompressed (ciphertext
    /// does not compress).
    pub fn new_raw(
        header: &Header,
        key: &arbor_crypt::KeyRecord,
        out: &mut Vec<u8>,
    ) -> Result<Encoder, StreamError> {
        if !header.raw {
            return Err(StreamError::Raw {
                reason: "its header does not say raw".to_string(),
            });
        }
        let start = out.len();
        let mut encoder = Self::start(header, Compression::None, out)?;
        if let Err(e) = encoder.tally.emit(out, RECORD_KEY, 0, &[&key.encode()]) {
            out.truncate(start);
            return Err(e);
        }
        Ok(encoder)
    }

    fn start(
        header: &Header,
        compression: Compression,
        out: &mut Vec<u8>,
    ) -> Result<Encoder, StreamError> {
        let cctx = match compression {
            Compression::None => None,
            Compression::Zstd { level } | Compression::Best { level } => {
                let (min, max) = (
                    zstd::zstd_safe::min_c_level(),
                    zstd::zstd_safe::max_c_level(),
                );
                if !(min..=max).contains(&level) {
                    return Err(StreamError::CompressionLevel { level, min, max });
                }
                Some(CCtx::try_create().ok_or_else(|| StreamError::Zstd {
                    reason: "cannot allocate a compression context".to_string(),
                })?)
            }
        };
        let mut payload = Vec::with_capacity(super::HEADER_FIXED_LEN + MAX_NAME);
        header.encode_payload(&mut payload)?;
        let mut tally = Tally::default();
        tally.emit(out, RECORD_HEADER, 0, &[&payload])?;
        Ok(Encoder {
            tally,
            ranges: Ranges {
                volume_size: header.volume_size,
                next_offset: header.resume_offset,
                align: header.alignment(),
            },
            incremental: header.is_incremental(),
            raw: header.raw,
            compression,
            cctx,
            plain: Vec::new(),
            delta: Vec::new(),
        })
    }

    /// Appends a data record: `bytes` (a multiple of 512, 512 ..= [`MAX_DATA`];
    /// the caller splits larger runs) at volume byte `offset`. `base`, in an
    /// incremental stream, is the base snapshot's bytes for the same range
    /// (what the receiver has there), for delta compression. Returns the
    /// encoding chosen.
    pub fn data(
        &mut self,
        offset: u64,
        bytes: &[u8],
        base: Option<&[u8]>,
        out: &mut Vec<u8>,
    ) -> Result<Encoding, StreamError> {
        let (record, at) = (self.tally.records, self.tally.bytes);
        let too_large = || StreamError::DataTooLarge {
            record,
            at,
            length: u64::try_from(bytes.len()).unwrap_or(u64::MAX),
        };
        if bytes.len() > MAX_DATA {
            return Err(too_large());
        }
        let length = u32::try_from(bytes.len()).map_err(|_| too_large())?;
        let end = self
            .ranges
            .check(record, at, offset, u64::from(length), MAX_DATA as u64)?;
        if let Some(base) = base {
            if !self.incremental {
                return Err(StreamError::DeltaNotIncremental { record, at });
            }
            if base.len() != bytes.len() {
                return Err(StreamError::BaseLength {
                    expected: u64::from(length),
                    found: u64::try_from(base.len()).unwrap_or(u64::MAX),
                });
            }
        }
        let (encoding, n) = self.choose(bytes, base);
        // `compress` only returns lengths within its scratch buffer, so the
        // slices below are whole.
        let encoded = match encoding {
            Encoding::Raw => bytes,
            Encoding::Zstd => self.plain.get(..n).unwrap_or_default(),
            Encoding::ZstdDelta => self.delta.get(..n).unwrap_or_default(),
        };
        let mut head = [0u8; DATA_HEADER_LEN];
        head[0..8].copy_from_slice(&offset.to_le_bytes());
        head[8..12].copy_from_slice(&length.to_le_bytes());
        head[12] = encoding.code();
        self.tally.emit(out, RECORD_DATA, 0, &[&head, encoded])?;
        self.ranges.next_offset = end;
        Ok(encoding)
    }

    /// Appends a zero record: `length` bytes at `offset` read as zeros.
    /// Not in a raw stream (which sends what reads as zeros unmapped).
    pub fn zero(&mut self, offset: u64, length: u64, out: &mut Vec<u8>) -> Result<(), StreamError> {
        if self.raw {
            return Err(StreamError::Raw {
                reason: "it has no zero records".to_string(),
            });
        }
        self.range(RECORD_ZERO, offset, length, out)
    }

    /// Appends a discard record: `length` bytes at `offset` are unmapped.
    pub fn discard(
        &mut self,
        offset: u64,
        length: u64,
        out: &mut Vec<u8>,
    ) -> Result<(), StreamError> {
        self.range(RECORD_DISCARD, offset, length, out)
    }

    /// Ends the stream: appends the trailer.
    pub fn finish(mut self, out: &mut Vec<u8>) -> Result<(), StreamError> {
        let Tally {
            records,
            bytes,
            crc,
        } = self.tally;
        let mut payload = [0u8; TRAILER_PAYLOAD_LEN];
        payload[0..8].copy_from_slice(&records.to_le_bytes());
        payload[8..16].copy_from_slice(&bytes.to_le_bytes());
        payload[16..20].copy_from_slice(&crc.to_le_bytes());
        self.tally.emit(out, RECORD_TRAILER, 0, &[&payload])
    }

    /// Records appended so far (the next record's sequence number).
    pub fn records(&self) -> u64 {
        self.tally.records
    }

    /// Bytes appended so far.
    pub fn position(&self) -> u64 {
        self.tally.bytes
    }

    fn range(
        &mut self,
        kind: u16,
        offset: u64,
        length: u64,
        out: &mut Vec<u8>,
    ) -> Result<(), StreamError> {
        let (record, at) = (self.tally.records, self.tally.bytes);
        let end = self
            .ranges
            .check(record, at, offset, length, MAX_VOLUME_SIZE)?;
        let mut payload = [0u8; RANGE_PAYLOAD_LEN];
        payload[0..8].copy_from_slice(&offset.to_le_bytes());
        payload[8..16].copy_from_slice(&length.to_le_bytes());
        self.tally.emit(out, kind, 0, &[&payload])?;
        self.ranges.next_offset = end;
        Ok(())
    }

    /// Picks the encoding of `bytes` (already checked: 512 ..= MAX_DATA
    /// bytes, `base` as long) and returns it with its encoded length (in
    /// `plain` or `delta`; for raw, the data's length).
    fn choose(&mut self, bytes: &[u8], base: Option<&[u8]>) -> (Encoding, usize) {
        let raw = (Encoding::Raw, bytes.len());
        let (level, best) = match self.compression {
            Compression::None => return raw,
            Compression::Zstd { level } => (level, false),
            Compression::Best { level } => (level, true),
        };
        let Some(cctx) = self.cctx.as_mut() else {
            return raw;
        };
        // A base that zstd would take for a formatted dictionary is not
        // usable as raw content (docs/STREAM.md §5): such a range goes plain.
        let base = base.filter(|b| !is_dictionary(b));
        // Compressed bytes must be fewer than the data's.
        let limit = bytes.len().saturating_sub(1);
        let plain = if best || base.is_none() {
            compress(cctx, &mut self.plain, bytes, None, level, limit)
        } else {
            None
        };
        let delta = match base {
            // In `best` mode the delta must beat plain zstd too.
            Some(base) => {
                let limit = plain.map_or(limit, |n| n.saturating_sub(1));
                let level = level.max(MIN_DELTA_LEVEL);
                compress(cctx, &mut self.delta, bytes, Some(base), level, limit)
            }
            None => None,
        };
        match (delta, plain) {
            (Some(n), _) => (Encoding::ZstdDelta, n),
            (None, Some(n)) => (Encoding::Zstd, n),
            (None, None) => raw,
        }
    }
}

/// Compresses `src` (against `dict`, raw content) into `scratch`, in at most
/// `limit` bytes. None if it does not fit, or zstd fails: the caller then
/// uses another encoding (raw is always correct).
fn compress(
    cctx: &mut CCtx<'static>,
    scratch: &mut Vec<u8>,
    src: &[u8],
    dict: Option<&[u8]>,
    level: i32,
    limit: usize,
) -> Option<usize> {
    if limit == 0 {
        return None;
    }
    if scratch.len() < limit {
        scratch.resize(limit, 0);
    }
    let dst = scratch.get_mut(..limit)?;
    let written = match dict {
        Some(dict) => cctx.compress_using_dict(dst, src, dict, level),
        None => cctx.compress(dst, src, level),
    };
    written.ok().filter(|&n| n > 0 && n <= limit)
}
