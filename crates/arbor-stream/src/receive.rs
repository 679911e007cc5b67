//! Receiving: a stream decoded as it arrives and applied to a hidden
//! volume of the pool (`Pool::begin_receive`), which becomes the snapshot
//! in one commit once the trailer has verified the whole stream.
//!
//! Every record is verified (checksum, sequence, order, range) before it
//! is applied, so whatever was applied is the sender's. Progress is
//! committed with the data every [`ReceiveOptions::checkpoint_bytes`] and
//! whenever the input stops ([`Receiver::interrupted`]): a receive
//! interrupted anyhow resumes from there, with the token
//! [`resume_token`] prints. A resumed stream may start at or before that
//! point (records are applied again, which is idempotent: data records
//! against a base are decoded against the base snapshot, never against what
//! the receive has written), never after it.

use arbor_engine::{
    check_volume_name, split_snapshot_name, Pool, ReceiveStart, ReceiveStatus, ReceiveTarget,
    VolumeId,
};

use crate::format::{DataDecoder, Decoded, Decoder, Encoding, Guid, Header, Record, ResumeToken};
use crate::send::read_base;
use crate::StreamFailure;

/// How a receive runs (policy).
#[derive(Debug, Clone)]
pub struct ReceiveOptions {
    /// Commit the data applied, with the resume point, after this many
    /// bytes of the volume.
    pub checkpoint_bytes: u64,
    /// An incremental stream rolls its volume forward even if it was
    /// written since the base (those writes are lost; `zfs receive -F`).
    pub force: bool,
}

impl Default for ReceiveOptions {
    fn default() -> Self {
        Self {
            checkpoint_bytes: 256 << 20,
            force: false,
        }
    }
}

/// What a finished receive made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    /// The new snapshot (`volume@name`).
    pub snapshot: String,
    pub id: VolumeId,
    pub guid: Guid,
    /// Stream bytes read, and data bytes applied.
    pub stream_bytes: u64,
    pub data_bytes: u64,
    /// Where this stream started (0, or a resumed stream's offset).
    pub resumed_from: u64,
    /// An earlier receive into the volume that could never finish (its
    /// base is gone) was discarded: this says so.
    pub discarded: Option<String>,
}

/// Where a receive stands while it runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReceiveProgress {
    pub stream_bytes: u64,
    pub data_bytes: u64,
    /// Volume bytes applied (the end of the last record).
    pub applied_to: u64,
    pub volume_size: u64,
}

/// A caller's test of a stream's header, run before anything of the stream
/// is applied or any earlier receive is touched: an error refuses the
/// stream with that message.
type HeaderCheck<'p> = Box<dyn FnMut(&Header) -> Result<(), String> + 'p>;

/// An arbor stream's input as it arrives: whole, verified records handed
/// to a caller one at a time (the receive's and the heal's one loop over
/// the decoder).
#[derive(Default)]
pub(crate) struct Records {
    decoder: Decoder,
    /// Input not yet decoded (at most one record and one push).
    pending: Vec<u8>,
}

impl Records {
    /// Decodes whatever whole records `bytes` completes, handing each to
    /// `apply`; stops at the first error.
    pub(crate) fn push(
        &mut self,
        bytes: &[u8],
        mut apply: impl FnMut(Record<'_>) -> Result<(), StreamFailure>,
    ) -> Result<(), StreamFailure> {
        self.pending.extend_from_slice(bytes);
        let mut at = 0;
        let result = loop {
            match self.decoder.decode(&self.pending[at..]) {
                Ok(Decoded::NeedMore(_)) => break Ok(()),
                Ok(Decoded::Record { consumed, record }) => {
                    at += consumed;
                    if let Err(e) = apply(record) {
                        break Err(e);
                    }
                }
                Err(e) => break Err(StreamFailure::Stream(e)),
            }
        };
        self.pending.drain(..at);
        result
    }

    /// The input has ended: it must have ended with the stream's verified
    /// trailer, and nothing after it.
    pub(crate) fn end(&self) -> Result<(), StreamFailure> {
        // Truncated unless the trailer arrived and verified.
        self.decoder.end_of_input()?;
        if !self.pending.is_empty() {
            return Err(StreamFailure::Refused(
                "bytes after the stream's end".into(),
            ));
        }
        Ok(())
    }
}

/// A stream being received: [`Receiver::push`] its bytes as they come, then
/// [`Receiver::finish`] at the end of the input.
pub struct Receiver<'p> {
    pool: &'p Pool,
    volume: String,
    opts: ReceiveOptions,
    check: Option<HeaderCheck<'p>>,
    records: Records,
    data: DataDecoder,
    /// A raw stream's header, until its key record arrives.
    raw_header: Option<Header>,
    started: Option<Started>,
    decoded: Vec<u8>,
    base_data: Vec<u8>,
    progress: ReceiveProgress,
    /// Volume bytes applied since the last checkpoint.
    unsaved: u64,
    /// The volume offset committed last.
    saved_to: u64,
}

struct Started {
    header: Header,
    status: ReceiveStatus,
    snapshot: String,
    base: Option<VolumeId>,
    discarded: Option<String>,
}

/// The resume token of the receive in progress into `volume`, if any
/// (`arbor receive --status`).
pub fn resume_token(pool: &Pool, volume: &str) -> Result<Option<ResumeToken>, StreamFailure> {
    Ok(pool.receive_status(volume)?.map(|s| token_of(&s)))
}

fn token_of(s: &ReceiveStatus) -> ResumeToken {
    ResumeToken {
        target: Guid(s.target),
        base: s.base.map(Guid),
        offset: s.offset,
        volume_size: s.size,
    }
}

impl<'p> Receiver<'p> {
    pub fn new(pool: &'p Pool, volume: &str, opts: ReceiveOptions) -> Self {
        Self {
            pool,
            volume: volume.to_owned(),
            opts,
            check: None,
            records: Records::default(),
            data: DataDecoder::new(),
            raw_header: None,
            started: None,
            decoded: Vec::new(),
            base_data: Vec::new(),
            progress: ReceiveProgress::default(),
            unsaved: 0,
            saved_to: 0,
        }
    }

    /// Refuses a stream whose header `check` rejects (a replication
    /// target holds the stream to what its session announced), before
    /// anything of it is applied.
    pub fn check_header(mut self, check: impl FnMut(&Header) -> Result<(), String> + 'p) -> Self {
        self.check = Some(Box::new(check));
        self
    }

    /// Where the receive stands.
    pub fn progress(&self) -> ReceiveProgress {
        self.progress
    }

    /// The stream's header, once it has arrived.
    pub fn header(&self) -> Option<&Header> {
        self.started.as_ref().map(|s| &s.header)
    }

    /// Decodes and applies whatever whole records `bytes` completes.
    pub fn push(&mut self, bytes: &[u8]) -> Result<ReceiveProgress, StreamFailure> {
        self.progress.stream_bytes += bytes.len() as u64;
        // Out of `self` while records borrowed from it are applied.
        let mut records = std::mem::take(&mut self.records);
        let result = records.push(bytes, |record| self.apply(record));
        self.records = records;
        result.map(|()| self.progress)
    }

    /// Applies one verified record.
    fn apply(&mut self, record: Record<'_>) -> Result<(), StreamFailure> {
        match record {
            // A raw stream begins once its key has arrived too.
            Record::Header(header) if header.raw => {
                self.raw_header = Some(header);
                Ok(())
            }
            Record::Header(header) => self.start(header, None),
            Record::Key(key) => match self.raw_header.take() {
                Some(header) => self.start(header, Some(*key)),
                None => Err(StreamFailure::Refused(
                    "a key record in a stream that is not raw".into(),
                )),
            },
            Record::Data {
                offset, payload, ..
            } if self.started()?.header.raw => {
                // The decoder let only uncompressed data through.
                let id = self.started()?.status.id;
                self.pool.receive_write_raw(id, offset, payload)?;
                let length = payload.len() as u64;
                self.progress.data_bytes += length;
                self.applied(offset + length, length)
            }
            Record::Data {
                offset,
                length,
                encoding,
                payload,
            } => {
                let started = self.started()?;
                let (id, base) = (started.status.id, started.base);
                let n = usize::try_from(length).unwrap_or(usize::MAX);
                let base_bytes = match (encoding, base) {
                    (Encoding::ZstdDelta, Some(base)) => {
                        self.base_data.resize(n, 0);
                        read_base(self.pool, base, offset, &mut self.base_data)?;
                        Some(&self.base_data[..])
                    }
                    _ => None,
                };
                self.data
                    .decode(encoding, payload, length, base_bytes, &mut self.decoded)?;
                self.pool.receive_write(id, offset, &self.decoded)?;
                self.progress.data_bytes += u64::from(length);
                self.applied(offset + u64::from(length), u64::from(length))
            }
            Record::Zero { offset, length } | Record::Discard { offset, length } => {
                let id = self.started()?.status.id;
                self.pool.receive_discard(id, offset, length)?;
                self.applied(offset + length, length)
            }
            Record::Skipped { .. } => Ok(()),
            // The decoder verified the trailer; `finish` asks it.
            Record::End => Ok(()),
        }
    }

    fn started(&self) -> Result<&Started, StreamFailure> {
        self.started
            .as_ref()
            .ok_or_else(|| StreamFailure::Refused("a record before the stream's header".into()))
    }

    /// The header (and a raw stream's key) has arrived: begin (or resume)
    /// the receive in the pool.
    fn start(
        &mut self,
        header: Header,
        key: Option<arbor_crypt::KeyRecord>,
    ) -> Result<(), StreamFailure> {
        check_volume_name(&self.volume)?;
        if let Some(check) = self.check.as_mut() {
            check(&header).map_err(StreamFailure::Refused)?;
        }
        // A raw stream's ranges are the sender's whole chunks: stored as
        // they are, they must be whole chunks here too.
        let chunk = self.pool.chunk_size();
        if header.raw && chunk > u64::from(header.chunk_size) {
            return Err(StreamFailure::Refused(format!(
                "a raw stream from a pool with chunks of {} bytes goes into pools whose chunks \
                 are at most as large; this pool's are {chunk} bytes",
                header.chunk_size
            )));
        }
        let (_, snap) = split_snapshot_name(&header.name).map_err(|_| {
            StreamFailure::Refused(format!(
                "the stream's snapshot name {:?} is not of the form volume@snapshot",
                header.name
            ))
        })?;
        let snapshot = format!("{}@{snap}", self.volume);
        split_snapshot_name(&snapshot)?;
        let ReceiveStart { status, discarded } = self.pool.begin_receive(&ReceiveTarget {
            volume: self.volume.clone(),
            target: header.target.0,
            base: header.base.map(|b| b.0),
            size: header.volume_size,
            key,
        })?;
        if header.resume_offset > status.offset {
            return Err(StreamFailure::Refused(format!(
                "the stream resumes at byte {}, but the receive into {} has committed only {} \
                 bytes: resume with the token of `arbor receive --status {}`",
                header.resume_offset, self.volume, status.offset, self.volume
            )));
        }
        let base = match header.base {
            Some(guid) => Some(self.pool.find_guid(&guid.0)?.ok_or_else(|| {
                StreamFailure::Refused(format!("the base snapshot {guid} vanished"))
            })?),
            None => None,
        };
        self.saved_to = status.offset;
        self.progress.applied_to = header.resume_offset;
        self.progress.volume_size = header.volume_size;
        self.started = Some(Started {
            header,
            status,
            snapshot,
            base,
            discarded,
        });
        Ok(())
    }

    fn applied(&mut self, end: u64, bytes: u64) -> Result<(), StreamFailure> {
        self.progress.applied_to = end;
        self.unsaved += bytes;
        if self.unsaved >= self.opts.checkpoint_bytes {
            self.checkpoint()?;
        }
        Ok(())
    }

    /// Commits what was applied, with the point a resumed stream goes on
    /// from (never backwards: a resumed stream may re-apply records).
    fn checkpoint(&mut self) -> Result<(), StreamFailure> {
        let Some(started) = &self.started else {
            return Ok(());
        };
        let to = self.progress.applied_to.max(self.saved_to);
        self.pool.receive_checkpoint(started.status.id, to)?;
        self.saved_to = to;
        self.unsaved = 0;
        Ok(())
    }

    /// The input stopped before the end (a broken pipe, a damaged record, a
    /// killed sender): commits what was applied and returns the token to
    /// resume with, if the receive had begun.
    pub fn interrupted(&mut self) -> Result<Option<ResumeToken>, StreamFailure> {
        if self.started.is_none() {
            return Ok(None);
        }
        self.checkpoint()?;
        resume_token(self.pool, &self.volume)
    }

    /// The input has ended: the stream must have ended with its verified
    /// trailer. Makes the snapshot visible, in one commit.
    pub fn finish(mut self) -> Result<Received, StreamFailure> {
        self.records.end()?;
        let started = self
            .started
            .take()
            .ok_or_else(|| StreamFailure::Refused("a stream without a header".into()))?;
        let id = self.pool.finish_receive(
            started.status.id,
            &started.snapshot,
            started.header.creation_time,
            self.opts.force,
        )?;
        Ok(Received {
            snapshot: started.snapshot,
            id,
            guid: started.header.target,
            stream_bytes: self.progress.stream_bytes,
            data_bytes: self.progress.data_bytes,
            resumed_from: started.header.resume_offset,
            discarded: started.discarded,
        })
    }
}

/// A Ceph `rbd diff` (v1 or v2) being received into a volume, the way `rbd
/// import-diff` applies one: a diff from snapshot `f` needs `VOLUME@f` and
/// rolls the volume forward; one without needs no volume there and creates
/// it; either way `VOLUME@t` must not exist and is created. Atomic like an
/// arbor stream (nothing shows before the end record); not resumable (the
/// format has no identities), so a failed receive is abandoned at once.
pub struct RbdReceiver<'p> {
    pool: &'p Pool,
    volume: String,
    force: bool,
    decoder: crate::rbd::RbdDecoder,
    pending: Vec<u8>,
    from: Option<String>,
    to: Option<String>,
    started: Option<VolumeId>,
    /// Bytes of `w` records not yet written: a sector-aligned run from
    /// `stage_at` (records may arrive in pieces split anywhere).
    stage: Vec<u8>,
    stage_at: u64,
    progress: ReceiveProgress,
}

impl<'p> RbdReceiver<'p> {
    pub fn new(pool: &'p Pool, volume: &str, force: bool) -> Self {
        Self {
            pool,
            volume: volume.to_owned(),
            force,
            decoder: crate::rbd::RbdDecoder::new(),
            pending: Vec::new(),
            from: None,
            to: None,
            started: None,
            stage: Vec::new(),
            stage_at: 0,
            progress: ReceiveProgress::default(),
        }
    }

    /// Decodes and applies what `bytes` completes; on any failure the
    /// receive is abandoned (its space reclaimed in the background).
    pub fn push(&mut self, bytes: &[u8]) -> Result<ReceiveProgress, StreamFailure> {
        let result = self.push_inner(bytes);
        if result.is_err() {
            self.abandon();
        }
        result
    }

    fn push_inner(&mut self, bytes: &[u8]) -> Result<ReceiveProgress, StreamFailure> {
        use crate::rbd::{RbdDecoded, RbdRecord};
        self.progress.stream_bytes += bytes.len() as u64;
        let mut pending = std::mem::take(&mut self.pending);
        pending.extend_from_slice(bytes);
        let mut at = 0;
        let result = loop {
            let (consumed, record) = match self.decoder.decode(&pending[at..]) {
                Ok(RbdDecoded::NeedMore(_)) => break Ok(()),
                Ok(RbdDecoded::Record { consumed, record }) => (consumed, record),
                Err(e) => break Err(StreamFailure::Rbd(e)),
            };
            at += consumed;
            let step = match record {
                RbdRecord::Version(_) | RbdRecord::Skipped { .. } | RbdRecord::Size(_) => Ok(()),
                RbdRecord::From(name) => {
                    self.from = Some(name);
                    Ok(())
                }
                RbdRecord::To(name) => {
                    self.to = Some(name);
                    Ok(())
                }
                RbdRecord::Write { offset, data } => self.write(offset, data),
                RbdRecord::Zero { offset, length } => self.zero(offset, length),
                RbdRecord::End => self.flush(),
            };
            if let Err(e) = step {
                break Err(e);
            }
        };
        pending.drain(..at);
        self.pending = pending;
        result.map(|()| self.progress)
    }

    /// The hidden volume, begun at the first data record (the metadata
    /// records all come before).
    fn start(&mut self) -> Result<VolumeId, StreamFailure> {
        if let Some(id) = self.started {
            return Ok(id);
        }
        let refuse = |m: String| Err(StreamFailure::Refused(m));
        let Some(size) = self.decoder.size() else {
            return refuse("the rbd diff has no image size record".into());
        };
        if size == 0 || !size.is_multiple_of(512) {
            return refuse(format!(
                "the rbd image size {size} is not a multiple of 512 bytes, which arbor volumes are"
            ));
        }
        let Some(to) = self.to.clone() else {
            return refuse("the rbd diff names no end snapshot (`t` record)".into());
        };
        check_volume_name(&self.volume)?;
        let snapshot = format!("{}@{to}", self.volume);
        split_snapshot_name(&snapshot)?;
        if self.pool.lookup(&snapshot).is_ok() {
            return refuse(format!(
                "{snapshot} already exists (as rbd import-diff, the end snapshot must not)"
            ));
        }
        let base = match &self.from {
            Some(from) => {
                let name = format!("{}@{from}", self.volume);
                let id = self.pool.lookup(&name).map_err(|_| {
                    StreamFailure::Refused(format!(
                        "the rbd diff starts from snapshot {from}, and {name} does not exist"
                    ))
                })?;
                Some(self.pool.guid(id)?.ok_or_else(|| {
                    StreamFailure::Refused(format!("{name} has no identity: upgrade the pool"))
                })?)
            }
            None => None,
        };
        let start = self.pool.begin_receive(&ReceiveTarget {
            volume: self.volume.clone(),
            target: arbor_engine::new_guid(),
            base,
            size,
            key: None,
        })?;
        if start.status.offset != 0 {
            return refuse("an earlier receive into this volume is in progress".into());
        }
        self.progress.volume_size = size;
        self.started = Some(start.status.id);
        Ok(start.status.id)
    }

    fn write(&mut self, offset: u64, data: &[u8]) -> Result<(), StreamFailure> {
        if self.stage.is_empty() || self.stage_at + self.stage.len() as u64 != offset {
            self.flush()?;
            if !offset.is_multiple_of(512) {
                return Err(StreamFailure::Refused(format!(
                    "an rbd diff write at byte {offset}, not on a 512-byte sector"
                )));
            }
            self.stage_at = offset;
        }
        self.stage.extend_from_slice(data);
        self.progress.data_bytes += data.len() as u64;
        if self.stage.len() >= crate::rbd::MAX_PIECE {
            let whole = self.stage.len() / 512 * 512;
            let id = self.start()?;
            self.pool
                .receive_write(id, self.stage_at, &self.stage[..whole])?;
            self.stage.drain(..whole);
            self.stage_at += whole as u64;
        }
        Ok(())
    }

    /// Writes what is staged, which must end on a sector.
    fn flush(&mut self) -> Result<(), StreamFailure> {
        if self.stage.is_empty() {
            return Ok(());
        }
        if !self.stage.len().is_multiple_of(512) {
            return Err(StreamFailure::Refused(format!(
                "an rbd diff write ending at byte {}, not on a 512-byte sector",
                self.stage_at + self.stage.len() as u64
            )));
        }
        let id = self.start()?;
        self.pool.receive_write(id, self.stage_at, &self.stage)?;
        self.progress.applied_to = self.stage_at + self.stage.len() as u64;
        self.stage.clear();
        Ok(())
    }

    fn zero(&mut self, offset: u64, length: u64) -> Result<(), StreamFailure> {
        self.flush()?;
        if !offset.is_multiple_of(512) || !length.is_multiple_of(512) {
            return Err(StreamFailure::Refused(format!(
                "an rbd diff zero range {offset}+{length}, not on 512-byte sectors"
            )));
        }
        let id = self.start()?;
        if length > 0 {
            self.pool.receive_discard(id, offset, length)?;
        }
        Ok(())
    }

    fn abandon(&mut self) {
        if self.started.take().is_some() {
            let _ = self.pool.abort_receive(&self.volume);
        }
    }

    /// The input has ended: makes `VOLUME@t` visible, in one commit.
    pub fn finish(mut self) -> Result<Received, StreamFailure> {
        let result = self.finish_inner();
        if result.is_err() {
            self.abandon();
        }
        result
    }

    fn finish_inner(&mut self) -> Result<Received, StreamFailure> {
        self.decoder.end_of_input()?;
        if !self.pending.is_empty() {
            return Err(StreamFailure::Refused(
                "bytes after the rbd diff's end".into(),
            ));
        }
        let id = self.start()?;
        let to = self.to.clone().unwrap_or_default();
        let snapshot = format!("{}@{to}", self.volume);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let snap = self.pool.finish_receive(id, &snapshot, now, self.force)?;
        self.started = None;
        let guid = self.pool.guid(snap)?.map(Guid).unwrap_or(Guid::ZERO);
        Ok(Received {
            snapshot,
            id: snap,
            guid,
            stream_bytes: self.progress.stream_bytes,
            data_bytes: self.progress.data_bytes,
            resumed_from: 0,
            discarded: None,
        })
    }
}

impl Drop for RbdReceiver<'_> {
    /// A receive dropped before it finished (the connection went away) is
    /// abandoned: an rbd diff cannot resume.
    fn drop(&mut self) {
        self.abandon();
    }
}
