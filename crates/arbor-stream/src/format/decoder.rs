//! The stream reader.

use super::data::Encoding;
use super::error::{StreamError, TrailerField};
use super::header::Header;
use super::wire::{Cursor, Frame, Ranges, Tally};
use super::{
    DATA_HEADER_LEN, FORMAT_VERSION, FRAME_HEADER_LEN, MAGIC, MAX_DATA, MAX_PAYLOAD,
    MAX_VOLUME_SIZE, MIN_FORMAT_VERSION, RANGE_PAYLOAD_LEN, RECORD_DATA, RECORD_DISCARD,
    RECORD_FLAG_OPTIONAL, RECORD_HEADER, RECORD_KEY, RECORD_TRAILER, RECORD_ZERO,
    TRAILER_PAYLOAD_LEN,
};

/// The bytes every version's stream starts with: the header record's frame,
/// the magic and the version. Checked before anything else, so that a file
/// that is not a stream, or a stream of another version, says so.
const PREFIX_LEN: usize = FRAME_HEADER_LEN + MAGIC.len() + 2;

/// One verified record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record<'a> {
    /// The stream header (always the first record).
    Header(Header),
    /// A raw stream's wrapped data key (always its second record): the
    /// key the data is encrypted with, sealed (docs/FORMAT.md §6.6).
    Key(Box<arbor_crypt::KeyRecord>),
    /// `length` bytes of the volume at `offset`, encoded as `encoding` in
    /// `payload` (turn them into bytes with a [`super::DataDecoder`]).
    Data {
        offset: u64,
        length: u32,
        encoding: Encoding,
        payload: &'a [u8],
    },
    /// `length` bytes at `offset` read as zeros.
    Zero { offset: u64, length: u64 },
    /// `length` bytes at `offset` are unmapped.
    Discard { offset: u64, length: u64 },
    /// An optional record of a type this reader does not know, skipped.
    Skipped { kind: u16 },
    /// The trailer: the stream is complete, and its record count, byte count
    /// and checksum verified.
    End,
}

/// What [`Decoder::decode`] made of the bytes it was given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decoded<'a> {
    /// The next record is not complete: call again with at least this many
    /// bytes (counted from the same place; never more than
    /// [`super::MAX_RECORD`]).
    NeedMore(usize),
    /// The next record, verified; it took the first `consumed` bytes.
    Record { consumed: usize, record: Record<'a> },
}

/// Reads a stream: sans-I/O and push-driven. Give [`Decoder::decode`] the
/// bytes received and not yet consumed; it returns one verified record and
/// how many bytes it took, or how many bytes it needs. Every rule of the
/// format is checked before a record is returned, so the caller never sees
/// an invalid one; at the end of the input, [`Decoder::end_of_input`] says
/// whether the stream was complete.
///
/// An error leaves the decoder as it was: the stream cannot go on past it.
///
/// ```
/// use arbor_stream::format::{Decoded, Decoder, Record};
/// # fn stream() -> Vec<u8> {
/// #     use arbor_stream::format::{Compression, Encoder, Guid, Header};
/// #     let h = Header { chunk_size: 4096, volume_size: 4096, target: Guid([1; 16]),
/// #         base: None, resume_offset: 0, creation_time: 0, name: "v@s".into(),
/// #         raw: false };
/// #     let mut out = Vec::new();
/// #     Encoder::new(&h, Compression::None, &mut out).unwrap().finish(&mut out).unwrap();
/// #     out
/// # }
/// let bytes = stream();
/// let mut decoder = Decoder::new();
/// let mut at = 0;
/// loop {
///     match decoder.decode(&bytes[at..])? {
///         Decoded::NeedMore(_) => break, // read more, or:
///         Decoded::Record { consumed, record } => {
///             at += consumed;
///             if record == Record::End {
///                 break;
///             }
///         }
///     }
/// }
/// decoder.end_of_input()?;
/// # Ok::<(), arbor_stream::format::StreamError>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct Decoder {
    header: Option<Header>,
    /// Records and bytes consumed, and their crc32c.
    tally: Tally,
    ranges: Ranges,
    finished: bool,
}

impl Decoder {
    pub fn new() -> Decoder {
        Decoder::default()
    }

    /// Decodes the next record from the front of `buf`.
    pub fn decode<'a>(&mut self, buf: &'a [u8]) -> Result<Decoded<'a>, StreamError> {
        let Tally {
            records: record,
            bytes: at,
            crc: stream_crc,
        } = self.tally;
        if self.finished {
            return if buf.is_empty() {
                Ok(Decoded::NeedMore(0))
            } else {
                Err(StreamError::TrailingBytes { at })
            };
        }
        if self.header.is_none() {
            let Some(prefix) = buf.first_chunk::<PREFIX_LEN>() else {
                return Ok(Decoded::NeedMore(PREFIX_LEN));
            };
            let mut c = Cursor::new(prefix);
            let _frame: Option<[u8; FRAME_HEADER_LEN]> = c.array();
            if c.array() != Some(MAGIC) {
                return Err(StreamError::NotAStream);
            }
            match c.u16() {
                Some(version) if (MIN_FORMAT_VERSION..=FORMAT_VERSION).contains(&version) => {}
                Some(version) => return Err(StreamError::UnsupportedVersion { version }),
                None => return Err(StreamError::NotAStream),
            }
        }
        let Some(frame) = buf.first_chunk::<FRAME_HEADER_LEN>() else {
            return Ok(Decoded::NeedMore(FRAME_HEADER_LEN));
        };
        let Some(frame) = Frame::parse(frame) else {
            return Ok(Decoded::NeedMore(FRAME_HEADER_LEN));
        };
        let len = match usize::try_from(frame.len) {
            Ok(len) if len <= MAX_PAYLOAD => len,
            _ => {
                return Err(StreamError::RecordTooLarge {
                    record,
                    at,
                    length: u64::from(frame.len),
                })
            }
        };
        // Bounded by MAX_RECORD: cannot overflow.
        let total = FRAME_HEADER_LEN + len + super::FRAME_CRC_LEN;
        let Some((framed, crc)) = buf.get(..total).and_then(|r| r.split_last_chunk::<4>()) else {
            return Ok(Decoded::NeedMore(total));
        };
        let record_crc = crc32c::crc32c(framed);
        if record_crc != u32::from_le_bytes(*crc) {
            return Err(StreamError::Checksum { record, at });
        }
        if frame.seq != record {
            return Err(StreamError::Sequence {
                record,
                at,
                found: frame.seq,
            });
        }
        let known = (RECORD_HEADER..=RECORD_KEY).contains(&frame.kind);
        if frame.flags & !RECORD_FLAG_OPTIONAL != 0 || (known && frame.flags != 0) {
            return Err(StreamError::BadFlags {
                record,
                at,
                flags: frame.flags,
            });
        }
        if record == 0 && frame.kind != RECORD_HEADER {
            return Err(StreamError::HeaderMissing { kind: frame.kind });
        }
        let raw = self.header.as_ref().is_some_and(|h| h.raw);
        if raw && record == 1 && frame.kind != RECORD_KEY {
            return Err(StreamError::KeyMissing {
                record,
                at,
                kind: frame.kind,
            });
        }
        let payload = framed.get(FRAME_HEADER_LEN..).unwrap_or_default();
        let too_long = StreamError::TooLong { at };
        let next = Tally {
            records: record.checked_add(1).ok_or(too_long.clone())?,
            bytes: at.checked_add(total as u64).ok_or(too_long)?,
            crc: crc32c::crc32c_append(
                crc32c::crc32c_combine(stream_crc, record_crc, framed.len()),
                crc,
            ),
        };
        // Validate; nothing changes before the record is known good.
        let (out, next_offset) = match frame.kind {
            RECORD_HEADER => {
                if record != 0 {
                    return Err(StreamError::DuplicateHeader { record, at });
                }
                let header = Header::parse(payload)?;
                let ranges = Ranges {
                    volume_size: header.volume_size,
                    next_offset: header.resume_offset,
                    align: header.alignment(),
                };
                self.ranges = ranges;
                self.header = Some(header.clone());
                (Record::Header(header), ranges.next_offset)
            }
            RECORD_KEY => {
                if !(raw && record == 1) {
                    return Err(StreamError::BadRecord {
                        record,
                        at,
                        reason: "a key record that is not the second record of a raw stream"
                            .to_string(),
                    });
                }
                let key = arbor_crypt::KeyRecord::decode(payload).map_err(|e| {
                    StreamError::BadRecord {
                        record,
                        at,
                        reason: format!("its key record: {e}"),
                    }
                })?;
                (Record::Key(Box::new(key)), self.ranges.next_offset)
            }
            RECORD_DATA => self.data(record, at, payload)?,
            RECORD_ZERO if raw => {
                return Err(StreamError::BadRecord {
                    record,
                    at,
                    reason: "a zero record in a raw stream (its ranges are data or unmapped)"
                        .to_string(),
                })
            }
            RECORD_ZERO | RECORD_DISCARD => {
                let (offset, length) = self.range(record, at, payload)?;
                let end = self
                    .ranges
                    .check(record, at, offset, length, MAX_VOLUME_SIZE)?;
                let out = if frame.kind == RECORD_ZERO {
                    Record::Zero { offset, length }
                } else {
                    Record::Discard { offset, length }
                };
                (out, end)
            }
            RECORD_TRAILER => {
                self.trailer(record, at, payload)?;
                self.finished = true;
                (Record::End, self.ranges.next_offset)
            }
            kind if frame.flags & RECORD_FLAG_OPTIONAL != 0 => {
                (Record::Skipped { kind }, self.ranges.next_offset)
            }
            kind => return Err(StreamError::UnknownRecord { record, at, kind }),
        };
        self.ranges.next_offset = next_offset;
        self.tally = next;
        Ok(Decoded::Record {
            consumed: total,
            record: out,
        })
    }

    /// Says whether the input ended at a good place: Truncated unless the
    /// trailer was read.
    pub fn end_of_input(&self) -> Result<(), StreamError> {
        if self.finished {
            Ok(())
        } else {
            Err(StreamError::Truncated {
                at: self.tally.bytes,
                records: self.tally.records,
            })
        }
    }

    /// Whether the trailer was read (the stream is complete and verified).
    pub fn finished(&self) -> bool {
        self.finished
    }

    /// The stream's header, once read.
    pub fn header(&self) -> Option<&Header> {
        self.header.as_ref()
    }

    /// Bytes consumed: where the next record starts.
    pub fn position(&self) -> u64 {
        self.tally.bytes
    }

    /// Records consumed (the next record's sequence number).
    pub fn records(&self) -> u64 {
        self.tally.records
    }

    fn data<'a>(
        &self,
        record: u64,
        at: u64,
        payload: &'a [u8],
    ) -> Result<(Record<'a>, u64), StreamError> {
        let bad = |reason: String| StreamError::BadEncoding { record, at, reason };
        let mut c = Cursor::new(payload);
        let (Some(offset), Some(length), Some(code), Some(reserved)) =
            (c.u64(), c.u32(), c.u8(), c.array::<3>())
        else {
            return Err(StreamError::BadRecord {
                record,
                at,
                reason: format!(
                    "a data record's payload of {} bytes is shorter than its \
                     {DATA_HEADER_LEN}-byte header",
                    payload.len()
                ),
            });
        };
        let encoded = c.rest();
        if reserved != [0; 3] {
            return Err(StreamError::BadRecord {
                record,
                at,
                reason: "reserved bytes of a data record are not zero".to_string(),
            });
        }
        let data_len = u64::from(length);
        if data_len > MAX_DATA as u64 {
            return Err(StreamError::DataTooLarge {
                record,
                at,
                length: data_len,
            });
        }
        let end = self
            .ranges
            .check(record, at, offset, data_len, MAX_DATA as u64)?;
        let encoding =
            Encoding::from_code(code).ok_or_else(|| bad(format!("unknown encoding {code}")))?;
        let encoded_len = u64::try_from(encoded.len()).unwrap_or(u64::MAX);
        match encoding {
            Encoding::Raw if encoded_len != data_len => {
                return Err(bad(format!(
                    "{encoded_len} raw bytes for {data_len} bytes of data"
                )))
            }
            Encoding::Zstd | Encoding::ZstdDelta if encoded_len >= data_len => {
                return Err(bad(format!(
                    "{encoded_len} compressed bytes are not fewer than its {data_len} bytes \
                     of data"
                )))
            }
            Encoding::Zstd | Encoding::ZstdDelta if encoded.is_empty() => {
                return Err(bad("an empty compressed payload".to_string()))
            }
            Encoding::ZstdDelta if self.header.as_ref().is_some_and(|h| !h.is_incremental()) => {
                return Err(StreamError::DeltaNotIncremental { record, at })
            }
            Encoding::Zstd | Encoding::ZstdDelta if self.header.as_ref().is_some_and(|h| h.raw) => {
                return Err(bad(
                    "a compressed data record in a raw stream (its data is ciphertext)".to_string(),
                ))
            }
            _ => {}
        }
        let out = Record::Data {
            offset,
            length,
            encoding,
            payload: encoded,
        };
        Ok((out, end))
    }

    fn range(&self, record: u64, at: u64, payload: &[u8]) -> Result<(u64, u64), StreamError> {
        let mut c = Cursor::new(payload);
        match (payload.len(), c.u64(), c.u64()) {
            (RANGE_PAYLOAD_LEN, Some(offset), Some(length)) => Ok((offset, length)),
            (len, ..) => Err(StreamError::BadRecord {
                record,
                at,
                reason: format!(
                    "a zero or discard record's payload is {len} bytes, not {RANGE_PAYLOAD_LEN}"
                ),
            }),
        }
    }

    fn trailer(&self, record: u64, at: u64, payload: &[u8]) -> Result<(), StreamError> {
        let mut c = Cursor::new(payload);
        let (TRAILER_PAYLOAD_LEN, Some(records), Some(bytes), Some(crc), Some(reserved)) =
            (payload.len(), c.u64(), c.u64(), c.u32(), c.u32())
        else {
            return Err(StreamError::BadRecord {
                record,
                at,
                reason: format!(
                    "the trailer's payload is {} bytes, not {TRAILER_PAYLOAD_LEN}",
                    payload.len()
                ),
            });
        };
        if reserved != 0 {
            return Err(StreamError::BadRecord {
                record,
                at,
                reason: "reserved bytes of the trailer are not zero".to_string(),
            });
        }
        let checks = [
            (TrailerField::Records, records, record),
            (TrailerField::Bytes, bytes, at),
            (
                TrailerField::Checksum,
                u64::from(crc),
                u64::from(self.tally.crc),
            ),
        ];
        for (what, trailer, actual) in checks {
            if trailer != actual {
                return Err(StreamError::TrailerMismatch {
                    record,
                    at,
                    what,
                    trailer,
                    actual,
                });
            }
        }
        Ok(())
    }
}
