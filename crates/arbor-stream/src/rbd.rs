//! Ceph's `rbd diff` streams (the format of `rbd export-diff` and `rbd
//! import-diff`, Ceph's `doc/dev/rbd-diff.rst`), as a sans-I/O codec: the
//! way out to Ceph RBD and back.
//!
//! Version 1: the banner `rbd diff v1\n`, then records each starting with a
//! one-byte tag: `f` (from-snapshot name: le32 length, bytes), `t`
//! (to-snapshot name), `s` (le64 image size), then data records `w` (le64
//! offset, le64 length, the bytes) and `z` (le64 offset, le64 length: reads
//! as zeros), and `e` (the end). Version 2 (`rbd diff v2\n`) puts an le64
//! length of the rest after every tag but `e`, so a reader skips tags it
//! does not know. Metadata records come before data records.
//!
//! This format has no checksums and no identities: a reader checks what it
//! can (order, ranges against the size, lengths against its limits), and
//! the receive is still atomic (nothing shows before `e`), but corruption
//! inside data bytes goes unnoticed, as with `rbd import-diff`.

use crate::format::MAX_VOLUME_SIZE;

/// The banners of the two versions.
pub const BANNER_V1: &[u8] = b"rbd diff v1\n";
pub const BANNER_V2: &[u8] = b"rbd diff v2\n";
/// Longest snapshot name accepted.
pub const MAX_NAME: usize = 4096;
/// Most bytes of one `w` record handed over at once: a longer record comes
/// out in pieces, so memory stays bounded whatever the record's length.
pub const MAX_PIECE: usize = 1 << 20;
/// Longest v2 record of an unknown tag a reader skips.
pub const MAX_SKIP: u64 = 1 << 20;

/// Why an rbd diff stream was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RbdError {
    #[error("not an rbd diff stream (no `rbd diff v1` or `rbd diff v2` banner)")]
    NotRbdDiff,
    #[error("rbd diff damaged at byte {at}: {reason}")]
    Invalid { at: u64, reason: String },
    #[error("rbd diff truncated at byte {at} (no end record)")]
    Truncated { at: u64 },
    #[error("rbd diff: bytes after the end record at byte {at}")]
    TrailingBytes { at: u64 },
}

/// One piece of an rbd diff.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RbdRecord<'a> {
    /// The banner's version (1 or 2), first.
    Version(u8),
    From(String),
    To(String),
    Size(u64),
    /// `data.len()` bytes of a `w` record at `offset` (a record longer than
    /// [`MAX_PIECE`] comes as several consecutive pieces).
    Write {
        offset: u64,
        data: &'a [u8],
    },
    Zero {
        offset: u64,
        length: u64,
    },
    /// A v2 record of a tag this reader does not know, skipped.
    Skipped {
        tag: u8,
    },
    End,
}

/// What [`RbdDecoder::decode`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RbdDecoded<'a> {
    /// At least this many bytes are needed in the buffer.
    NeedMore(usize),
    Record {
        consumed: usize,
        record: RbdRecord<'a>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Banner,
    Records,
    /// Inside a `w` record: where the next byte goes, bytes left.
    Write {
        offset: u64,
        left: u64,
    },
    Done,
}

/// A push decoder of rbd diff v1 and v2 streams (see the module comment).
#[derive(Debug, Clone)]
pub struct RbdDecoder {
    state: State,
    version: u8,
    size: Option<u64>,
    data_seen: bool,
    at: u64,
}

impl Default for RbdDecoder {
    fn default() -> Self {
        Self::new()
    }
}

fn le64(b: &[u8]) -> u64 {
    let mut raw = [0u8; 8];
    raw.copy_from_slice(&b[..8]);
    u64::from_le_bytes(raw)
}

fn le32(b: &[u8]) -> u32 {
    let mut raw = [0u8; 4];
    raw.copy_from_slice(&b[..4]);
    u32::from_le_bytes(raw)
}

impl RbdDecoder {
    pub fn new() -> Self {
        Self {
            state: State::Banner,
            version: 0,
            size: None,
            data_seen: false,
            at: 0,
        }
    }

    /// Bytes consumed so far.
    pub fn position(&self) -> u64 {
        self.at
    }

    /// The image size, once its record has been read.
    pub fn size(&self) -> Option<u64> {
        self.size
    }

    fn invalid(&self, reason: impl Into<String>) -> RbdError {
        RbdError::Invalid {
            at: self.at,
            reason: reason.into(),
        }
    }

    /// Decodes the next record from `buf` (the bytes not yet consumed).
    pub fn decode<'a>(&mut self, buf: &'a [u8]) -> Result<RbdDecoded<'a>, RbdError> {
        match self.state {
            State::Done => {
                if buf.is_empty() {
                    Ok(RbdDecoded::NeedMore(0))
                } else {
                    Err(RbdError::TrailingBytes { at: self.at })
                }
            }
            State::Banner => {
                let n = BANNER_V1.len();
                let prefix = &buf[..buf.len().min(n)];
                if !BANNER_V1.starts_with(prefix) && !BANNER_V2.starts_with(prefix) {
                    return Err(RbdError::NotRbdDiff);
                }
                if buf.len() < n {
                    return Ok(RbdDecoded::NeedMore(n));
                }
                self.version = if &buf[..n] == BANNER_V1 { 1 } else { 2 };
                self.state = State::Records;
                Ok(self.consumed(n, RbdRecord::Version(self.version)))
            }
            State::Write { offset, left } => {
                if buf.is_empty() {
                    return Ok(RbdDecoded::NeedMore(1));
                }
                // Bounded by MAX_PIECE, so the cast is exact.
                let n = (left.min(MAX_PIECE as u64) as usize).min(buf.len());
                if n < left.min(MAX_PIECE as u64) as usize && n < 64 << 10 {
                    // Wait for a reasonable piece (or the rest).
                    return Ok(RbdDecoded::NeedMore(left.min(MAX_PIECE as u64) as usize));
                }
                let rest = left - n as u64;
                self.state = if rest == 0 {
                    State::Records
                } else {
                    State::Write {
                        offset: offset + n as u64,
                        left: rest,
                    }
                };
                Ok(self.consumed(
                    n,
                    RbdRecord::Write {
                        offset,
                        data: &buf[..n],
                    },
                ))
            }
            State::Records => self.record(buf),
        }
    }

    fn consumed<'a>(&mut self, n: usize, record: RbdRecord<'a>) -> RbdDecoded<'a> {
        self.at += n as u64;
        RbdDecoded::Record {
            consumed: n,
            record,
        }
    }

    /// A record starting at `buf[0]` (its tag).
    fn record<'a>(&mut self, buf: &'a [u8]) -> Result<RbdDecoded<'a>, RbdError> {
        let Some(&tag) = buf.first() else {
            return Ok(RbdDecoded::NeedMore(1));
        };
        if tag == b'e' {
            self.state = State::Done;
            return Ok(self.consumed(1, RbdRecord::End));
        }
        // v2: the length of the rest of the record.
        let head = if self.version == 2 { 9 } else { 1 };
        if buf.len() < head {
            return Ok(RbdDecoded::NeedMore(head));
        }
        let declared = (self.version == 2).then(|| le64(&buf[1..9]));
        let fixed = match tag {
            b'f' | b't' => 4,
            b's' => 8,
            b'w' | b'z' => 16,
            _ if self.version == 2 => {
                let len = declared.unwrap_or(0);
                if len > MAX_SKIP {
                    return Err(
                        self.invalid(format!("a record of unknown tag {tag:#04x} of {len} bytes"))
                    );
                }
                let total = head + len as usize;
                if buf.len() < total {
                    return Ok(RbdDecoded::NeedMore(total));
                }
                return Ok(self.consumed(total, RbdRecord::Skipped { tag }));
            }
            _ => return Err(self.invalid(format!("unknown record tag {tag:#04x}"))),
        };
        if buf.len() < head + fixed {
            return Ok(RbdDecoded::NeedMore(head + fixed));
        }
        let body = &buf[head..];
        let metadata = matches!(tag, b'f' | b't' | b's');
        if metadata && self.data_seen {
            return Err(self.invalid("a metadata record after data records"));
        }
        match tag {
            b'f' | b't' => {
                let len = le32(body) as usize;
                if len > MAX_NAME {
                    return Err(self.invalid(format!("a snapshot name of {len} bytes")));
                }
                if declared.is_some_and(|d| d != 4 + len as u64) {
                    return Err(self.invalid("a name record's length does not match"));
                }
                let total = head + 4 + len;
                if buf.len() < total {
                    return Ok(RbdDecoded::NeedMore(total));
                }
                let name = std::str::from_utf8(&body[4..4 + len])
                    .map_err(|_| self.invalid("a snapshot name that is not UTF-8"))?
                    .to_owned();
                let record = if tag == b'f' {
                    RbdRecord::From(name)
                } else {
                    RbdRecord::To(name)
                };
                Ok(self.consumed(total, record))
            }
            b's' => {
                if declared.is_some_and(|d| d != 8) {
                    return Err(self.invalid("a size record's length is not 8"));
                }
                let size = le64(body);
                if size > MAX_VOLUME_SIZE {
                    return Err(self.invalid(format!("an image size of {size} bytes")));
                }
                self.size = Some(size);
                Ok(self.consumed(head + 8, RbdRecord::Size(size)))
            }
            _ => {
                let (offset, length) = (le64(body), le64(&body[8..]));
                let size = self
                    .size
                    .ok_or_else(|| self.invalid("a data record before the size record"))?;
                if offset.checked_add(length).is_none_or(|end| end > size) {
                    return Err(self.invalid(format!(
                        "a range {offset}+{length} past the image's {size} bytes"
                    )));
                }
                let want = if tag == b'w' { 16 + length } else { 16 };
                if declared.is_some_and(|d| d != want) {
                    return Err(self.invalid("a data record's length does not match"));
                }
                self.data_seen = true;
                if tag == b'z' {
                    return Ok(self.consumed(head + 16, RbdRecord::Zero { offset, length }));
                }
                if length == 0 {
                    return Ok(self.consumed(head + 16, RbdRecord::Write { offset, data: &[] }));
                }
                self.at += (head + 16) as u64;
                self.state = State::Write {
                    offset,
                    left: length,
                };
                // The record's data follows: hand over its first piece.
                match self.decode(&buf[head + 16..])? {
                    RbdDecoded::NeedMore(_) => {
                        // Nothing of the data yet: the header alone is consumed.
                        Ok(RbdDecoded::Record {
                            consumed: head + 16,
                            record: RbdRecord::Write { offset, data: &[] },
                        })
                    }
                    RbdDecoded::Record { consumed, record } => Ok(RbdDecoded::Record {
                        consumed: head + 16 + consumed,
                        record,
                    }),
                }
            }
        }
    }

    /// The input has ended: it must have ended with the end record.
    pub fn end_of_input(&self) -> Result<(), RbdError> {
        match self.state {
            State::Done => Ok(()),
            _ => Err(RbdError::Truncated { at: self.at }),
        }
    }
}

/// Writes an rbd diff v1 stream (what `rbd import-diff` of every Ceph
/// release reads).
#[derive(Debug, Default)]
pub struct RbdEncoder;

impl RbdEncoder {
    /// The banner and metadata: the from-snapshot name (an incremental
    /// diff), the to-snapshot name, the image size.
    pub fn header(from: Option<&str>, to: &str, size: u64, out: &mut Vec<u8>) -> Self {
        out.extend_from_slice(BANNER_V1);
        let mut name = |tag: u8, name: &str| {
            out.push(tag);
            out.extend_from_slice(&(name.len() as u32).to_le_bytes());
            out.extend_from_slice(name.as_bytes());
        };
        if let Some(from) = from {
            name(b'f', from);
        }
        name(b't', to);
        out.push(b's');
        out.extend_from_slice(&size.to_le_bytes());
        Self
    }

    pub fn write(&mut self, offset: u64, data: &[u8], out: &mut Vec<u8>) {
        out.push(b'w');
        out.extend_from_slice(&offset.to_le_bytes());
        out.extend_from_slice(&(data.len() as u64).to_le_bytes());
        out.extend_from_slice(data);
    }

    pub fn zero(&mut self, offset: u64, length: u64, out: &mut Vec<u8>) {
        out.push(b'z');
        out.extend_from_slice(&offset.to_le_bytes());
        out.extend_from_slice(&length.to_le_bytes());
    }

    pub fn end(self, out: &mut Vec<u8>) {
        out.push(b'e');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<u8> {
        let mut out = Vec::new();
        let mut enc = RbdEncoder::header(Some("s1"), "s2", 1 << 20, &mut out);
        enc.write(4096, &[7u8; 3000], &mut out);
        enc.zero(65536, 8192, &mut out);
        enc.write(1 << 19, &vec![9u8; 3 << 17], &mut out);
        enc.end(&mut out);
        out
    }

    /// Decodes `bytes` fed `step` at a time; returns the records with
    /// write pieces joined.
    fn decode_all(bytes: &[u8], step: usize) -> Result<Vec<String>, RbdError> {
        let mut dec = RbdDecoder::new();
        let mut got = Vec::new();
        let mut buf: Vec<u8> = Vec::new();
        let mut fed = 0;
        loop {
            match dec.decode(&buf)? {
                RbdDecoded::NeedMore(_) => {
                    if fed == bytes.len() {
                        dec.end_of_input()?;
                        return Ok(got);
                    }
                    let n = step.min(bytes.len() - fed);
                    buf.extend_from_slice(&bytes[fed..fed + n]);
                    fed += n;
                }
                RbdDecoded::Record { consumed, record } => {
                    let text = match record {
                        RbdRecord::Write { offset, data } => format!("w {offset} {}", data.len()),
                        other => format!("{other:?}"),
                    };
                    got.push(text);
                    buf.drain(..consumed);
                }
            }
        }
    }

    #[test]
    fn round_trip_in_pieces_of_any_size() {
        let bytes = sample();
        let whole = decode_all(&bytes, bytes.len()).unwrap();
        assert_eq!(
            whole[..4],
            ["Version(1)", "From(\"s1\")", "To(\"s2\")", "Size(1048576)"]
        );
        assert_eq!(*whole.last().unwrap(), "End");
        let written = |records: &[String]| -> u64 {
            records
                .iter()
                .filter_map(|r| r.strip_prefix("w "))
                .map(|r| r.split(' ').nth(1).unwrap().parse::<u64>().unwrap())
                .sum()
        };
        assert_eq!(written(&whole), 3000 + (3 << 17));
        for step in [1, 7, 4096, 65536 + 3] {
            assert_eq!(
                written(&decode_all(&bytes, step).unwrap()),
                3000 + (3 << 17)
            );
        }
    }

    #[test]
    fn version_2_skips_unknown_tags_and_checks_lengths() {
        let mut v2 = BANNER_V2.to_vec();
        let rec = |out: &mut Vec<u8>, tag: u8, body: &[u8]| {
            out.push(tag);
            out.extend_from_slice(&(body.len() as u64).to_le_bytes());
            out.extend_from_slice(body);
        };
        let mut name = 2u32.to_le_bytes().to_vec();
        name.extend_from_slice(b"s9");
        rec(&mut v2, b't', &name);
        rec(&mut v2, b's', &(1u64 << 20).to_le_bytes());
        rec(&mut v2, b'x', b"future");
        let mut w = 0u64.to_le_bytes().to_vec();
        w.extend_from_slice(&4u64.to_le_bytes());
        w.extend_from_slice(b"abcd");
        rec(&mut v2, b'w', &w);
        v2.push(b'e');
        let got = decode_all(&v2, 3).unwrap();
        assert!(got.contains(&"Skipped { tag: 120 }".to_owned()), "{got:?}");
        assert!(got.contains(&"w 0 4".to_owned()), "{got:?}");
        // A lying length.
        let mut bad = v2.clone();
        let at = BANNER_V2.len() + 1;
        bad[at] = 9;
        assert!(decode_all(&bad, 5).is_err());
    }

    #[test]
    fn hostile_streams_are_refused() {
        let good = sample();
        assert_eq!(decode_all(b"hello world!!", 4), Err(RbdError::NotRbdDiff));
        // Every truncation is refused.
        for cut in 0..good.len() {
            assert!(decode_all(&good[..cut], 64).is_err(), "cut at {cut}");
        }
        // Trailing bytes.
        let mut more = good.clone();
        more.push(0);
        assert!(matches!(
            decode_all(&more, 9),
            Err(RbdError::TrailingBytes { .. })
        ));
        // A range past the size, a metadata record after data, a huge name.
        let mut out = Vec::new();
        let mut enc = RbdEncoder::header(None, "s", 4096, &mut out);
        enc.zero(4000, 200, &mut out);
        enc.end(&mut out);
        assert!(decode_all(&out, 100).is_err());
        let mut out = Vec::new();
        let mut enc = RbdEncoder::header(None, "s", 4096, &mut out);
        enc.zero(0, 512, &mut out);
        out.push(b's');
        out.extend_from_slice(&8192u64.to_le_bytes());
        out.push(b'e');
        assert!(decode_all(&out, 100).is_err());
        let mut out = BANNER_V1.to_vec();
        out.push(b't');
        out.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode_all(&out, 100).is_err());
        // No size before data.
        let mut out = BANNER_V1.to_vec();
        out.push(b'z');
        out.extend_from_slice(&[0u8; 16]);
        assert!(decode_all(&out, 100).is_err());
    }
}
