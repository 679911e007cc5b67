//! Healing from a stream (`arbor receive --heal`, like `zfs receive -c`):
//! a full or incremental stream of a snapshot the pool holds (the same
//! identity) is decoded and verified as a receive does, and used only to
//! repair that snapshot's damaged blocks (`Pool::heal`): nothing is
//! received, and no block that is not damaged is written.
//!
//! A block is healed from the record that covers it whole. Which of the
//! snapshot's damaged blocks a stream can heal: a full stream carries every
//! block the snapshot has data in; an incremental one only the blocks that
//! changed since its base (the others are the base's: heal the base). What
//! stays damaged is reported.

use arbor_engine::{split_snapshot_name, Error, Healed, Pool, VolumeId};

use crate::format::{DataDecoder, Encoding, Guid, Record};
use crate::receive::Records;
use crate::send::read_base;
use crate::StreamFailure;

/// What a heal from a stream did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HealReport {
    /// The snapshot healed (`volume@name`), and its identity.
    pub snapshot: String,
    pub guid: Guid,
    /// Its damaged blocks when the stream began.
    pub damaged: u64,
    /// What the heal did with the blocks the stream carried.
    pub healed: Healed,
    /// Its damaged blocks after the stream (not in it, or refused).
    pub remaining: u64,
    pub stream_bytes: u64,
}

struct Started {
    id: VolumeId,
    base: Option<VolumeId>,
    /// Byte offsets of the damaged blocks, in order.
    damaged: Vec<u64>,
}

/// A stream being used to heal: [`Healer::push`] its bytes as they come,
/// then [`Healer::finish`].
pub struct Healer<'p> {
    pool: &'p Pool,
    /// The volume the snapshot must be of (a guard against healing another
    /// than the one meant; the identity is what decides).
    volume: String,
    records: Records,
    data: DataDecoder,
    started: Option<Started>,
    decoded: Vec<u8>,
    base_data: Vec<u8>,
    report: HealReport,
}

const BLOCK: u64 = arbor_format::SUM_BLOCK_U64;

impl<'p> Healer<'p> {
    pub fn new(pool: &'p Pool, volume: &str) -> Self {
        Self {
            pool,
            volume: volume.to_owned(),
            records: Records::default(),
            data: DataDecoder::new(),
            started: None,
            decoded: Vec::new(),
            base_data: Vec::new(),
            report: HealReport::default(),
        }
    }

    /// Decodes whatever whole records `bytes` completes and heals with them.
    pub fn push(&mut self, bytes: &[u8]) -> Result<(), StreamFailure> {
        self.report.stream_bytes += bytes.len() as u64;
        // Out of `self` while records borrowed from it are applied.
        let mut records = std::mem::take(&mut self.records);
        let result = records.push(bytes, |record| self.apply(record));
        self.records = records;
        result
    }

    fn apply(&mut self, record: Record<'_>) -> Result<(), StreamFailure> {
        match record {
            Record::Header(header) => {
                let id = self.pool.find_guid(&header.target.0)?.ok_or_else(|| {
                    StreamFailure::Refused(format!(
                        "this pool holds no snapshot with the stream's identity {} ({}): a heal \
                         repairs a snapshot the pool holds, from a stream of the same snapshot",
                        header.target, header.name
                    ))
                })?;
                let info = self.pool.info(id)?;
                let of_volume = split_snapshot_name(&info.name)
                    .map(|(v, _)| v == self.volume)
                    .unwrap_or(false);
                if !info.snapshot || !of_volume {
                    return Err(StreamFailure::Refused(format!(
                        "the stream is of {} (identity {}), which this pool holds as {}, not a \
                         snapshot of {}",
                        header.name, header.target, info.name, self.volume
                    )));
                }
                // An encrypted snapshot stores ciphertext: only a raw
                // stream's data is what its checksums are of.
                match (info.key_slot.is_some(), header.raw) {
                    (true, false) => {
                        return Err(StreamFailure::Refused(format!(
                            "{} is encrypted: heal it from a raw stream (arbor send --raw), \
                             whose data is its ciphertext",
                            info.name
                        )))
                    }
                    (false, true) => {
                        return Err(StreamFailure::Refused(format!(
                            "the stream is raw (an encrypted volume's ciphertext), but {} is not \
                             encrypted",
                            info.name
                        )))
                    }
                    _ => {}
                }
                let base = match header.base {
                    Some(b) => self.pool.find_guid(&b.0)?,
                    None => None,
                };
                let damaged = self.pool.damaged_in(id)?;
                self.report.snapshot = info.name;
                self.report.guid = header.target;
                self.report.damaged = damaged.len() as u64;
                self.started = Some(Started { id, base, damaged });
                Ok(())
            }
            Record::Data {
                offset,
                length,
                encoding,
                payload,
            } => {
                let started = self.started()?;
                let end = offset.saturating_add(u64::from(length));
                let Some(blocks) = covered(&started.damaged, offset, end) else {
                    return Ok(());
                };
                let (id, base) = (started.id, started.base);
                let n = usize::try_from(length).unwrap_or(usize::MAX);
                let base_bytes = match encoding {
                    Encoding::ZstdDelta => {
                        let base = base.ok_or_else(|| {
                            StreamFailure::Refused(
                                "the stream is a delta against a base snapshot this pool does \
                                 not hold: heal with a full stream, or one against a base the \
                                 pool holds"
                                    .into(),
                            )
                        })?;
                        self.base_data.resize(n, 0);
                        match read_base(self.pool, base, offset, &mut self.base_data) {
                            Ok(()) => Some(&self.base_data[..]),
                            // The base is damaged there too: this record
                            // cannot be decoded; what it would heal stays
                            // damaged (heal the base first).
                            Err(StreamFailure::Engine(Error::Damaged(_))) => return Ok(()),
                            Err(e) => return Err(e),
                        }
                    }
                    _ => None,
                };
                self.data
                    .decode(encoding, payload, length, base_bytes, &mut self.decoded)?;
                for at in blocks {
                    // Inside the record: `at - offset` is below its length.
                    let from = (at - offset) as usize;
                    let Some(good) = self.decoded.get(from..from + BLOCK as usize) else {
                        continue;
                    };
                    let done = self.pool.heal(id, at, good)?;
                    self.report.healed.add(done);
                }
                Ok(())
            }
            Record::Zero { offset, length } | Record::Discard { offset, length } => {
                let started = self.started()?;
                let Some(blocks) = covered(&started.damaged, offset, offset.saturating_add(length))
                else {
                    return Ok(());
                };
                let id = started.id;
                let zeros = vec![0u8; BLOCK as usize];
                for at in blocks {
                    let done = self.pool.heal(id, at, &zeros)?;
                    self.report.healed.add(done);
                }
                Ok(())
            }
            // A raw stream's data is healed with as it is stored; its key
            // is not needed.
            Record::Key(_) | Record::Skipped { .. } | Record::End => Ok(()),
        }
    }

    fn started(&self) -> Result<&Started, StreamFailure> {
        self.started
            .as_ref()
            .ok_or_else(|| StreamFailure::Refused("a record before the stream's header".into()))
    }

    /// The input has ended: the stream must have ended with its verified
    /// trailer (what it healed stays healed either way: each block was
    /// checked against its own sum).
    pub fn finish(mut self) -> Result<HealReport, StreamFailure> {
        self.records.end()?;
        let started = self
            .started
            .take()
            .ok_or_else(|| StreamFailure::Refused("a stream without a header".into()))?;
        self.report.remaining = self.pool.damaged_in(started.id)?.len() as u64;
        Ok(self.report)
    }
}

/// The damaged blocks (byte offsets, in order) lying whole in
/// `offset..end`; None if there are none.
fn covered(damaged: &[u64], offset: u64, end: u64) -> Option<Vec<u64>> {
    let first = damaged.partition_point(|&d| d < offset);
    let blocks: Vec<u64> = damaged[first..]
        .iter()
        .take_while(|&&d| d < end)
        .filter(|&&d| d.checked_add(BLOCK).is_some_and(|e| e <= end))
        .copied()
        .collect();
    (!blocks.is_empty()).then_some(blocks)
}

#[cfg(test)]
mod tests {
    use super::covered;

    #[test]
    fn only_blocks_inside_a_record_are_covered() {
        let d = [0, 4096, 8192, 16384];
        assert_eq!(covered(&d, 0, 4096), Some(vec![0]));
        assert_eq!(covered(&d, 2048, 12288), Some(vec![4096, 8192]));
        assert_eq!(covered(&d, 12288, 16384), None);
        assert_eq!(covered(&d, 16384, u64::MAX), Some(vec![16384]));
        assert_eq!(covered(&[], 0, u64::MAX), None);
    }
}
