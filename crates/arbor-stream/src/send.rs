//! Sending: a snapshot, or what differs between two snapshots, read from a
//! pool and encoded as a stream (docs/STREAM.md), piece by piece with
//! bounded memory.
//!
//! What a stream carries, as Zumastor's delta files did, comes from the
//! metadata: a full stream walks the snapshot's allocation map (unmapped
//! ranges cost nothing), an incremental one the ranges where the two
//! snapshots' trees differ (`Pool::diff`, which skips shared subtrees), so
//! the work follows the change, not the volume size.

use std::io::Write;
use std::sync::Arc;

use arbor_engine::{Pool, VolumeId, VolumeInfo};

use crate::busy::{PinGuard, Pins};
use crate::format::{
    Compression, Encoder, Encoding, Guid, Header, ResumeToken, DATA_HEADER_LEN, FRAME_CRC_LEN,
    FRAME_HEADER_LEN, HEADER_FIXED_LEN, KEY_PAYLOAD_LEN, MAX_DATA, MAX_NAME, RANGE_PAYLOAD_LEN,
    TRAILER_PAYLOAD_LEN,
};
use crate::rbd::RbdEncoder;
use crate::StreamFailure;

/// How much of the volume one allocation-map lookup covers: bounds the
/// runs held in memory whatever the volume size.
const WINDOW: u64 = 256 << 20;
/// How much of the volume one diff walk covers by default: bounds the
/// changed ranges held in memory whatever the volume size.
pub const DIFF_WINDOW: u64 = 1 << 30;

/// Record sizes, for estimates: a data record's bytes beyond its data, a
/// zero or discard record, the largest header, the trailer.
const FRAME: u64 = (FRAME_HEADER_LEN + FRAME_CRC_LEN) as u64;
const DATA_OVERHEAD: u64 = FRAME + DATA_HEADER_LEN as u64;
const RANGE_RECORD: u64 = FRAME + RANGE_PAYLOAD_LEN as u64;
const HEADER_RECORD_MAX: u64 = FRAME + (HEADER_FIXED_LEN + MAX_NAME) as u64;
const TRAILER_RECORD: u64 = FRAME + TRAILER_PAYLOAD_LEN as u64;
const KEY_RECORD: u64 = FRAME + KEY_PAYLOAD_LEN as u64;

/// What to send.
#[derive(Debug, Clone)]
pub struct SendRequest {
    /// The snapshot to send (`vol@snap`).
    pub target: String,
    /// For an incremental stream, the snapshot it is a delta against: any
    /// snapshot sharing history with the target (an ancestor, a sibling,
    /// a clone's origin).
    pub base: Option<String>,
    /// Continue an interrupted stream from where the receiver stands (its
    /// `receive --status` token): target and base are then the snapshots
    /// the token names, found by identity.
    pub resume: Option<ResumeToken>,
    pub compression: Compression,
    pub format: SendFormat,
    /// Whether the stream is raw (docs/STREAM.md, version 2): an
    /// encrypted volume's ciphertext and wrapped key, sent without its key
    /// loaded, for a receiver that cannot read it.
    pub raw: Raw,
}

/// Whether a send is raw.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Raw {
    /// Plaintext (an encrypted volume's key must be loaded).
    #[default]
    No,
    /// Raw (the target must be encrypted): `arbor send --raw`.
    Yes,
    /// Raw if the target is encrypted, else plaintext: replication, which
    /// never gives a replica what it could not have read at the source.
    IfEncrypted,
}

/// Which stream format a send writes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SendFormat {
    /// arbor's own (docs/STREAM.md): identities, checksums, resume,
    /// compression.
    #[default]
    Arbor,
    /// Ceph's `rbd diff` v1, for `rbd import-diff`: snapshot names instead
    /// of identities, raw data, no checksums, no resume.
    RbdDiff,
}

/// The encoder of the chosen format.
enum Out {
    Arbor(Encoder),
    Rbd(RbdEncoder),
}

impl Out {
    fn data(
        &mut self,
        offset: u64,
        bytes: &[u8],
        base: Option<&[u8]>,
        out: &mut Vec<u8>,
    ) -> Result<Encoding, StreamFailure> {
        match self {
            Out::Arbor(e) => Ok(e.data(offset, bytes, base, out)?),
            Out::Rbd(e) => {
                e.write(offset, bytes, out);
                Ok(Encoding::Raw)
            }
        }
    }

    fn zero(&mut self, offset: u64, len: u64, out: &mut Vec<u8>) -> Result<(), StreamFailure> {
        match self {
            Out::Arbor(e) => Ok(e.zero(offset, len, out)?),
            Out::Rbd(e) => {
                e.zero(offset, len, out);
                Ok(())
            }
        }
    }

    fn discard(&mut self, offset: u64, len: u64, out: &mut Vec<u8>) -> Result<(), StreamFailure> {
        match self {
            Out::Arbor(e) => Ok(e.discard(offset, len, out)?),
            // rbd diffs have no discard: the range reads as zeros.
            Out::Rbd(e) => {
                e.zero(offset, len, out);
                Ok(())
            }
        }
    }

    fn finish(self, out: &mut Vec<u8>) -> Result<(), StreamFailure> {
        match self {
            Out::Arbor(e) => Ok(e.finish(out)?),
            Out::Rbd(e) => {
                e.end(out);
                Ok(())
            }
        }
    }
}

/// What a stream will carry (`send --dry-run`) and, after a send, carried.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SendStats {
    /// Bytes of data records before compression.
    pub data_bytes: u64,
    /// Bytes covered by zero and discard records.
    pub zero_bytes: u64,
    pub records: u64,
    /// Bytes of the stream (after a send; for an estimate, an upper bound:
    /// every data record raw).
    pub stream_bytes: u64,
    /// Data records sent compressed, and against the base.
    pub zstd_records: u64,
    pub delta_records: u64,
}

/// One range of the volume the stream covers.
#[derive(Debug, Clone, Copy)]
struct Span {
    start: u64,
    end: u64,
}

/// A stream being produced: call [`Sender::next`] until it returns false.
pub struct Sender<'p> {
    pool: &'p Pool,
    /// A raw stream's key record (its data is read as stored).
    key: Option<arbor_crypt::KeyRecord>,
    target: VolumeId,
    base: Option<VolumeId>,
    header: Header,
    encoder: Option<Out>,
    compression: Compression,
    format: SendFormat,
    /// The snapshots' names after `@`, for an rbd diff's records.
    names: (String, Option<String>),
    /// The ranges still to send, in order (the last is the one in work).
    spans: Vec<Span>,
    /// An incremental stream: where the next window of the diff starts
    /// (None once the whole volume has been diffed).
    diff_from: Option<u64>,
    diff_window: u64,
    size: u64,
    /// Mapped/unmapped runs of the current window: (offset, len, mapped).
    runs: std::collections::VecDeque<(u64, u64, bool)>,
    data: Vec<u8>,
    base_data: Vec<u8>,
    stats: SendStats,
    finished: bool,
}

fn snapshot_info(pool: &Pool, name: &str) -> Result<VolumeInfo, StreamFailure> {
    let info = pool.info(pool.lookup(name)?)?;
    if !info.snapshot {
        return Err(StreamFailure::Refused(format!(
            "{name} is not a snapshot: send snapshots, which do not change while they are sent"
        )));
    }
    Ok(info)
}

fn by_guid(pool: &Pool, guid: Guid, what: &str) -> Result<VolumeInfo, StreamFailure> {
    let id = pool.find_guid(&guid.0)?.ok_or_else(|| {
        StreamFailure::Refused(format!(
            "the resume token's {what} snapshot (identity {guid}) is not in this pool"
        ))
    })?;
    Ok(pool.info(id)?)
}

fn guid_of(info: &VolumeInfo) -> Result<Guid, StreamFailure> {
    info.guid.map(Guid).ok_or_else(|| {
        StreamFailure::Refused(format!(
            "{} has no identity: this pool's format predates send; upgrade it (arbor pool upgrade)",
            info.name
        ))
    })
}

impl<'p> Sender<'p> {
    /// Plans the stream: finds the snapshots, their identities and the
    /// ranges to send (for an incremental stream, where the two trees
    /// differ). No data is read yet; the pool is committed first if the
    /// target or base is not durable yet.
    pub fn new(pool: &'p Pool, req: &SendRequest) -> Result<Self, StreamFailure> {
        let (target, base, resume_offset) = match &req.resume {
            Some(token) => {
                let target = by_guid(pool, token.target, "target")?;
                let base = match token.base {
                    Some(b) => Some(by_guid(pool, b, "base")?),
                    None => None,
                };
                if target.size != token.volume_size || token.offset > target.size {
                    return Err(StreamFailure::Refused(format!(
                        "the resume token does not fit {} ({} bytes)",
                        target.name, target.size
                    )));
                }
                (target, base, token.offset)
            }
            None => {
                let target = snapshot_info(pool, &req.target)?;
                let base = match &req.base {
                    Some(b) => Some(snapshot_info(pool, b)?),
                    None => None,
                };
                (target, base, 0)
            }
        };
        if req.format == SendFormat::RbdDiff && req.resume.is_some() {
            return Err(StreamFailure::Refused(
                "rbd diff streams cannot resume (they carry no identities)".into(),
            ));
        }
        let snap_part = |name: &str| name.split_once('@').map_or(name, |(_, s)| s).to_owned();
        let names = (
            snap_part(&target.name),
            base.as_ref().map(|b| snap_part(&b.name)),
        );
        if let Some(b) = &base {
            if b.id == target.id {
                return Err(StreamFailure::Refused(format!(
                    "{} is both the target and the base",
                    target.name
                )));
            }
            // An incremental stream sends what the engine's diff finds,
            // which not every pair of layouts has.
            if let Err(arbor_engine::Error::Refused(arbor_engine::Refusal::Unsupported(why))) =
                pool.check_diff(b.id, target.id)
            {
                return Err(StreamFailure::Refused(format!("{why}; send it whole")));
            }
        }
        let raw = match req.raw {
            Raw::No => false,
            Raw::Yes => true,
            Raw::IfEncrypted => target.key_slot.is_some(),
        };
        let key = if raw {
            Some(raw_key(pool, req, &target, base.as_ref())?)
        } else {
            // Plaintext needs the key: refused now, not part way.
            if target.key_slot.is_some_and(|s| !pool.key_loaded(s)) {
                return Err(arbor_engine::Error::from(arbor_engine::Conflict::Locked(
                    target.name.clone(),
                ))
                .into());
            }
            None
        };
        // A snapshot taken with deferred durability exists durably only from
        // the pool's next commit: a stream of it must not outlive it (a
        // receiver holding a snapshot its source lost to a power cut).
        if !target.durable || base.as_ref().is_some_and(|b| !b.durable) {
            pool.flush()?;
        }
        let header = Header {
            chunk_size: u32::try_from(pool.chunk_size()).unwrap_or(u32::MAX),
            volume_size: target.size,
            target: guid_of(&target)?,
            base: base.as_ref().map(guid_of).transpose()?,
            resume_offset,
            creation_time: target.created_unix_secs,
            name: target.name.clone(),
            raw,
        };
        // A full stream is one span; an incremental one's spans come from
        // the diff, a window of the volume at a time (`next_spans`).
        let (spans, diff_from) = match &base {
            None => (
                vec![Span {
                    start: resume_offset,
                    end: target.size,
                }],
                None,
            ),
            Some(_) => (Vec::new(), Some(resume_offset)),
        };
        Ok(Self {
            pool,
            key,
            target: target.id,
            base: base.map(|b| b.id),
            header,
            encoder: None,
            compression: if raw {
                Compression::None
            } else {
                req.compression
            },
            format: req.format,
            names,
            spans,
            diff_from,
            diff_window: DIFF_WINDOW.max(pool.chunk_size()),
            size: target.size,
            runs: Default::default(),
            data: Vec::new(),
            base_data: Vec::new(),
            stats: SendStats::default(),
            finished: false,
        })
    }

    /// The spans where the target differs from the base in the diff window
    /// starting at `from`, in order, and where the next window starts.
    fn diff_window(&self, from: u64) -> Result<(Vec<Span>, Option<u64>), StreamFailure> {
        let base = self
            .base
            .ok_or_else(|| StreamFailure::Refused("a diff window without a base".into()))?;
        let to = from.saturating_add(self.diff_window).min(self.size);
        let spans = self
            .pool
            .diff_in(base, self.target, from, to)?
            .into_iter()
            // (offset, length) pairs, whole chunks, in order: clipped to
            // the window so that neighbouring windows do not overlap.
            .map(|(offset, len)| Span {
                start: offset.max(from),
                end: offset.saturating_add(len).min(to),
            })
            .filter(|s| s.start < s.end)
            .collect();
        Ok((spans, (to < self.size).then_some(to)))
    }

    /// Walks the diff `bytes` of the volume at a time instead of
    /// [`DIFF_WINDOW`] (at least 512; the stream is the same whatever it is).
    pub fn with_diff_window(mut self, bytes: u64) -> Self {
        self.diff_window = if self.key.is_some() {
            // A raw stream's ranges are whole chunks.
            let cs = self.pool.chunk_size();
            bytes.max(cs).div_ceil(cs) * cs
        } else {
            bytes.max(512)
        };
        self
    }

    /// The stream's header (identities, size, resume point).
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// What the stream will carry, from the metadata alone (no data is
    /// read): `send --dry-run`.
    pub fn estimate(&self) -> Result<SendStats, StreamFailure> {
        let mut stats = SendStats::default();
        let mut spans: Vec<Span> = self.spans.iter().rev().copied().collect();
        let mut diff_from = self.diff_from;
        while let Some(from) = diff_from {
            let (window, next) = self.diff_window(from)?;
            spans.extend(window);
            diff_from = next;
        }
        for span in &spans {
            let mut at = span.start;
            while at < span.end {
                let len = (span.end - at).min(WINDOW);
                for run in self.pool.allocation_map(self.target, at, len)? {
                    if run.mapped {
                        let records = run.len.div_ceil(MAX_DATA as u64);
                        stats.data_bytes += run.len;
                        stats.records += records;
                        stats.stream_bytes += run.len + records * DATA_OVERHEAD;
                    } else if self.base.is_some() {
                        stats.zero_bytes += run.len;
                        stats.records += 1;
                        stats.stream_bytes += RANGE_RECORD;
                    }
                }
                at += len;
            }
        }
        stats.records += 2;
        stats.stream_bytes += HEADER_RECORD_MAX + TRAILER_RECORD;
        if self.key.is_some() {
            stats.records += 1;
            stats.stream_bytes += KEY_RECORD;
        }
        Ok(stats)
    }

    /// Appends the next records to `out` (about a megabyte at most per
    /// call). Returns false once the trailer has been appended.
    pub fn next(&mut self, out: &mut Vec<u8>) -> Result<bool, StreamFailure> {
        if self.finished {
            return Ok(false);
        }
        let start = out.len();
        let mut encoder = match self.encoder.take() {
            Some(e) => e,
            None => match self.format {
                SendFormat::Arbor => Out::Arbor(match &self.key {
                    Some(key) => Encoder::new_raw(&self.header, key, out)?,
                    None => Encoder::new(&self.header, self.compression, out)?,
                }),
                SendFormat::RbdDiff => Out::Rbd(RbdEncoder::header(
                    self.names.1.as_deref(),
                    &self.names.0,
                    self.header.volume_size,
                    out,
                )),
            },
        };
        if self.fill(&mut encoder, out)? {
            encoder.finish(out)?;
            // The header and trailer, and a raw stream's key record.
            self.stats.records += if self.key.is_some() { 3 } else { 2 };
            self.finished = true;
        } else {
            self.encoder = Some(encoder);
        }
        self.stats.stream_bytes = self
            .stats
            .stream_bytes
            .saturating_add(u64::try_from(out.len() - start).unwrap_or(u64::MAX));
        Ok(true)
    }

    /// Encodes records until about [`MAX_DATA`] bytes were appended;
    /// returns true when every range has been sent.
    fn fill(&mut self, encoder: &mut Out, out: &mut Vec<u8>) -> Result<bool, StreamFailure> {
        let start = out.len();
        while out.len() - start < MAX_DATA {
            let Some((offset, len, mapped)) = self.runs.pop_front() else {
                // Refill from the next window of the current span, or the
                // next window of the diff.
                if self.spans.is_empty() {
                    if let Some(from) = self.diff_from {
                        let (mut window, next) = self.diff_window(from)?;
                        window.reverse();
                        self.spans = window;
                        self.diff_from = next;
                        continue;
                    }
                }
                let Some(span) = self.spans.last_mut() else {
                    return Ok(true);
                };
                let len = (span.end - span.start).min(WINDOW);
                for run in self.pool.allocation_map(self.target, span.start, len)? {
                    self.runs.push_back((run.offset, run.len, run.mapped));
                }
                span.start += len;
                if span.start >= span.end {
                    self.spans.pop();
                }
                continue;
            };
            if !mapped {
                // Reads as zeros: a full stream's receiver starts empty; an
                // incremental one's has the base there.
                if self.base.is_some() {
                    encoder.discard(offset, len, out)?;
                    self.stats.zero_bytes += len;
                    self.stats.records += 1;
                }
                continue;
            }
            let piece = len.min(MAX_DATA as u64);
            if piece < len {
                self.runs.push_front((offset + piece, len - piece, true));
            }
            // At most MAX_DATA, just above.
            let n = piece as usize;
            self.data.resize(n, 0);
            if self.key.is_some() {
                // Ciphertext as stored: no key, nothing to compress, and
                // never zeros to skip (a mapped chunk reads as its cipher
                // makes it).
                self.pool.read_raw(self.target, offset, &mut self.data)?;
                encoder.data(offset, &self.data, None, out)?;
                self.stats.data_bytes += piece;
                self.stats.records += 1;
                continue;
            }
            self.pool.read(self.target, offset, &mut self.data)?;
            if self.data.iter().all(|&b| b == 0) {
                if self.base.is_some() {
                    encoder.zero(offset, piece, out)?;
                    self.stats.zero_bytes += piece;
                    self.stats.records += 1;
                }
                continue;
            }
            let base = match (self.base, self.compression) {
                (Some(base), Compression::Best { .. }) if self.format == SendFormat::Arbor => {
                    self.base_data.resize(n, 0);
                    read_base(self.pool, base, offset, &mut self.base_data)?;
                    Some(&self.base_data[..])
                }
                _ => None,
            };
            match encoder.data(offset, &self.data, base, out)? {
                Encoding::Raw => {}
                Encoding::Zstd => self.stats.zstd_records += 1,
                Encoding::ZstdDelta => self.stats.delta_records += 1,
            }
            self.stats.data_bytes += piece;
            self.stats.records += 1;
        }
        Ok(false)
    }

    /// Pins the snapshots this stream reads (destroying or pruning them
    /// waits for force) while the guard lives.
    pub fn pin(&self, pins: &Arc<Pins>) -> PinGuard {
        pins.pin(std::iter::once(self.target).chain(self.base).collect())
    }

    /// Hands the rest of the stream to `emit`, a piece (about a megabyte)
    /// at a time, until it ends (true) or `emit` declines a piece because
    /// its reader went away (false).
    pub fn pump(&mut self, mut emit: impl FnMut(Vec<u8>) -> bool) -> Result<bool, StreamFailure> {
        loop {
            let mut out = Vec::with_capacity(1 << 20);
            if !self.next(&mut out)? {
                return Ok(true);
            }
            if !emit(out) {
                return Ok(false);
            }
        }
    }

    /// Writes the whole stream to `w`, calling `progress` with the stream
    /// bytes written so far after each piece.
    pub fn write_to(
        mut self,
        w: &mut dyn Write,
        progress: &mut dyn FnMut(&SendStats),
    ) -> Result<SendStats, StreamFailure> {
        let mut out = Vec::with_capacity(2 * MAX_DATA);
        while self.next(&mut out)? {
            w.write_all(&out).map_err(StreamFailure::Output)?;
            out.clear();
            progress(&self.stats);
        }
        w.flush().map_err(StreamFailure::Output)?;
        Ok(self.stats)
    }

    /// What was sent so far.
    pub fn stats(&self) -> SendStats {
        self.stats
    }
}

/// A raw stream's key: the target is encrypted, the base (if any) shares
/// its data key, and the format is arbor's own.
fn raw_key(
    pool: &Pool,
    req: &SendRequest,
    target: &VolumeInfo,
    base: Option<&VolumeInfo>,
) -> Result<arbor_crypt::KeyRecord, StreamFailure> {
    let refuse = |why: String| Err(StreamFailure::Refused(why));
    if req.format != SendFormat::Arbor {
        return refuse("a raw stream is an arbor stream: rbd diffs carry plaintext".into());
    }
    let Some(slot) = target.key_slot else {
        return refuse(format!(
            "{} is not encrypted: a raw stream carries an encrypted volume's ciphertext; send it \
             without --raw",
            target.name
        ));
    };
    if let Some(base) = base {
        if base.key_slot != Some(slot) {
            return refuse(format!(
                "{} is not encrypted with {}'s data key: a raw increment is between snapshots \
                 that share it",
                base.name, target.name
            ));
        }
    }
    match pool.key_record(slot)? {
        Some(key) => Ok(key),
        None => refuse(format!(
            "the pool's key store has no key for {} (slot {slot}): the store is damaged",
            target.name
        )),
    }
}

/// Reads the base snapshot where it has bytes (a smaller base reads zeros
/// past its end).
pub(crate) fn read_base(
    pool: &Pool,
    base: VolumeId,
    offset: u64,
    buf: &mut [u8],
) -> Result<(), StreamFailure> {
    let size = pool.info(base)?.size;
    buf.fill(0);
    if offset < size {
        let n = usize::try_from((size - offset).min(buf.len() as u64)).unwrap_or(buf.len());
        pool.read(base, offset, &mut buf[..n])?;
    }
    Ok(())
}
