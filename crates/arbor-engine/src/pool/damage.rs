//! The damage record: data blocks found not to match their sums
//! (docs/FORMAT.md §6.4, "Damage record").
//!
//! * A read (or a write that reads the edges of a block, or a copy) that
//!   finds a block damaged fails with `Error::Damaged`; at the public
//!   operation's boundary, with no lock held, [`Pool::after_damage`] notes
//!   it: logged once per run, counted ([`Pool::damage_found`], for
//!   metrics), and added durably to the pool's record (the property
//!   `arbor.damage`, [`arbor_format::DamageRecord`]) the first time this
//!   run finds it. A record that cannot be written is logged, never
//!   returned: the operation fails with the damage either way.
//! * [`Pool::damage`] lists what is still damaged: a block whose chunk no
//!   volume maps any more, whose sum changed since (rewritten whole, or
//!   healed), or that matches its sum when read again (a transient fault)
//!   is left out, and goes from the record the next time it is written.
//!   Each block is listed with the volumes and snapshots that read it,
//!   and where.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use arbor_format::{DamageRecord, DamagedBlock, Noted, DAMAGE_KEY, SUM_BLOCK_U64};
use tracing::{error, warn};

use super::{lock_mutex, Pool};
use crate::check::{DamageReport, DamagedData, MAX_READERS_LISTED};
use crate::error::{Damage, Error, Result};
use crate::mapping::Mapping;
use crate::snapstore::SnapStore;
use crate::sums::ChunkSums;
use crate::volumes::Volumes;
use crate::VolumeId;

/// The damage record's state in memory.
#[derive(Default)]
pub(super) struct DamageLog {
    /// One change of the record at a time (read, changed, written).
    record: Mutex<()>,
    /// Blocks found damaged this run: logged and recorded once.
    found: Mutex<HashSet<(u64, u32)>>,
    /// Reads that found damage this run (every one).
    detections: AtomicU64,
}

fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Whether recorded block `b` is still damaged in the open state: its
/// chunk still referenced, and its sum the one it was found not to match.
fn still_damaged(meta: &Volumes, b: &DamagedBlock) -> Result<bool> {
    let m = meta.meta();
    if b.pchunk >= m.geo().data_chunks() || m.data_count(b.pchunk)? == 0 {
        return Ok(false);
    }
    Ok(ChunkSums::of(m, b.pchunk)?.get(b.block) == Some(b.stored))
}

impl Pool {
    /// Notes the damage `result` carries, if any (the caller holds no lock
    /// of the pool), and passes it on.
    pub(super) fn after_damage<T>(&self, result: Result<T>) -> Result<T> {
        if let Err(Error::Damaged(damage)) = &result {
            self.note_damage(damage);
        }
        result
    }

    /// Reads that found damage since the pool was opened.
    pub fn damage_found(&self) -> u64 {
        self.damage_log.detections.load(Ordering::Relaxed)
    }

    /// Logs, counts and records damage found (the caller holds no lock).
    pub(super) fn note_damage(&self, d: &Damage) {
        self.damage_log.detections.fetch_add(1, Ordering::Relaxed);
        if !lock_mutex(&self.damage_log.found).insert((d.pchunk, d.block)) {
            return;
        }
        let offset = self.store.geo.chunk_offset(d.pchunk) + u64::from(d.block) * SUM_BLOCK_U64;
        error!(
            chunk = d.pchunk,
            block = d.block,
            device_offset = offset,
            stored = format_args!("{:#010x}", d.stored),
            computed = format_args!("{:#010x}", d.computed),
            "data block damaged: it does not match its checksum (reads of it fail with EIO; recorded in the pool's damage record)"
        );
        if let Err(e) = self.record_damage(d) {
            warn!(error = %e, chunk = d.pchunk, block = d.block, "could not record a damaged block in the pool's damage record");
        }
    }

    /// Adds `d` to the pool's record, durably, and drops what is no longer
    /// damaged.
    fn record_damage(&self, d: &Damage) -> Result<()> {
        let _one = lock_mutex(&self.damage_log.record);
        let mut record = self.damage_record()?;
        let noted = record.note(DamagedBlock {
            pchunk: d.pchunk,
            block: d.block,
            stored: d.stored,
            computed: d.computed,
            found_unix: now_unix(),
            last_unix: 0,
        });
        {
            let meta = self.read_meta()?;
            let mut failed = None;
            record.retain(|b| match still_damaged(&meta, b) {
                Ok(still) => still,
                Err(e) => {
                    failed.get_or_insert(e);
                    true
                }
            });
            if let Some(e) = failed {
                return Err(e);
            }
        }
        if noted == Noted::Unlisted {
            warn!(
                unlisted = record.unlisted(),
                "the pool's damage record is full: a damaged block is counted, not listed"
            );
        }
        self.set_property(None, DAMAGE_KEY, &record.encode())
    }

    /// The record as stored (empty if none, or in a pool without
    /// properties; a damaged record is an error).
    pub(super) fn damage_record(&self) -> Result<DamageRecord> {
        if !self.format_version().has_data_checksums() {
            return Ok(DamageRecord::default());
        }
        match self.property(None, DAMAGE_KEY)? {
            None => Ok(DamageRecord::default()),
            Some(bytes) => DamageRecord::decode(&bytes)
                .map_err(|e| Error::corrupt("the pool's damage record".to_owned(), e)),
        }
    }

    /// Damaged blocks recorded and not rewritten or freed since (and
    /// those counted unlisted): cheap, for status, metrics and alerts;
    /// [`Self::damage`] reads each again and finds who reads it.
    pub fn damage_count(&self) -> Result<u64> {
        let record = self.damage_record()?;
        if record.is_empty() {
            return Ok(0);
        }
        let meta = self.read_meta()?;
        let mut count = record.unlisted();
        for b in record.entries() {
            count += u64::from(still_damaged(&meta, b)?);
        }
        Ok(count)
    }

    /// The recorded blocks still damaged now: referenced, not rewritten
    /// since, and still not matching their sums when read again (one that
    /// matches now had a transient fault, or was put right from outside).
    fn damaged_now(&self, record: &DamageRecord) -> Result<Vec<DamagedData>> {
        let suspects: Vec<&DamagedBlock> = {
            let meta = self.read_meta()?;
            let mut suspects = Vec::new();
            for b in record.entries() {
                if still_damaged(&meta, b)? {
                    suspects.push(b);
                }
            }
            suspects
        };
        let mut bytes = vec![0u8; arbor_format::SUM_BLOCK];
        let mut blocks = Vec::new();
        for b in suspects {
            let at = self.store.geo.chunk_offset(b.pchunk) + u64::from(b.block) * SUM_BLOCK_U64;
            self.store.dev.read_at(&mut bytes, at)?;
            if arbor_format::block_sum(&bytes) == b.stored {
                continue;
            }
            blocks.push(DamagedData {
                pchunk: b.pchunk,
                block: b.block,
                device_offset: at,
                stored: b.stored,
                computed: b.computed,
                found_unix: b.found_unix,
                last_unix: b.last_unix,
                readers: Vec::new(),
                reader_count: 0,
            });
        }
        Ok(blocks)
    }

    /// The recorded damage still there, each block with the volumes and
    /// snapshots that read it. Walks every volume's mapping: as long as
    /// `check`'s walk, not a hot path.
    pub fn damage(&self) -> Result<DamageReport> {
        let record = self.damage_record()?;
        if record.is_empty() {
            return Ok(DamageReport::default());
        }
        let mut blocks = self.damaged_now(&record)?;
        // Who reads each: every record's extents, once (hidden ones, such
        // as properties, by their record's name).
        let meta = self.read_meta()?;
        // (A copy-on-write volume's root is its store: read below.)
        let mut ids: Vec<(u64, String, arbor_format::BlockRef)> = meta
            .table()
            .iter()
            .filter(|(_, r)| !is_cow(r))
            .map(|(id, r)| (id, r.name.clone(), r.root))
            .collect();
        ids.sort_by(|a, b| a.1.cmp(&b.1));
        for (_, name, root) in ids {
            let mut hits = Vec::new();
            readers_in(&meta, root, &blocks, &mut |i, at| hits.push((i, at)))?;
            for (i, at) in hits {
                let d = &mut blocks[i];
                d.reader_count += 1;
                if d.readers.len() < MAX_READERS_LISTED {
                    d.readers.push((name.clone(), at));
                }
            }
        }
        // Copies in copy-on-write volumes' stores, read by the snapshots
        // (and clones not mapping the chunk) of the epochs they serve; homes
        // in the pool, read by their volume and by its epochs' readers that
        // have no copy of the chunk.
        let mut hits = Vec::new();
        cow_readers(&meta, &blocks, &mut |i, id, at| hits.push((i, id, at)))?;
        for (i, id, at) in hits {
            let d = &mut blocks[i];
            d.reader_count += 1;
            if d.readers.len() < MAX_READERS_LISTED {
                d.readers.push((meta.volume(id)?.name.clone(), at));
            }
        }
        // A block no mapping reads (its chunk still held, as a partial
        // extent's base, for other blocks) is damage nobody sees.
        blocks.retain(|d| d.reader_count > 0);
        Ok(DamageReport {
            blocks,
            unlisted: record.unlisted(),
        })
    }

    /// The byte offsets in volume or snapshot `id` of the blocks it reads
    /// that are damaged now, in order (those [`Self::damage`] lists it
    /// for): what a heal of `id` repairs.
    pub fn damaged_in(&self, id: VolumeId) -> Result<Vec<u64>> {
        let record = self.damage_record()?;
        if record.is_empty() {
            return Ok(Vec::new());
        }
        let blocks = self.damaged_now(&record)?;
        let meta = self.read_meta()?;
        let rec = meta.volume(id.0)?;
        let mut offsets = Vec::new();
        if !is_cow(rec) {
            readers_in(&meta, rec.root, &blocks, &mut |_, at| offsets.push(at))?;
        }
        if rec.backing.is_some() || is_cow(rec) {
            let mut mine = |_, reader, at| {
                if reader == id.0 {
                    offsets.push(at);
                }
            };
            cow_readers(&meta, &blocks, &mut mine)?;
        }
        offsets.sort_unstable();
        offsets.dedup();
        Ok(offsets)
    }

    /// Forgets recorded blocks `healed` (rewritten with their good bytes):
    /// found again, they are logged and recorded again.
    pub(super) fn forget_damage(&self, healed: &[(u64, u32)]) -> Result<()> {
        {
            let mut found = lock_mutex(&self.damage_log.found);
            for b in healed {
                found.remove(b);
            }
        }
        let _one = lock_mutex(&self.damage_log.record);
        let mut record = self.damage_record()?;
        let before = record.entries().len();
        record.retain(|b| !healed.contains(&(b.pchunk, b.block)));
        if record.entries().len() == before {
            return Ok(());
        }
        self.set_property(None, DAMAGE_KEY, &record.encode())
    }
}

/// Whether `rec` is a copy-on-write volume (its root is its store).
fn is_cow(rec: &arbor_format::VolumeRecord) -> bool {
    matches!(rec.layout, arbor_format::DataLayout::Cow(_))
}

/// Calls `found(i, id, offset)` for each block `blocks[i]` that a
/// copy-on-write volume's data holds, for every volume or snapshot `id`
/// that reads it there, with the byte offset where it reads it: a copy in
/// the volume's store, read through an epoch it serves by the records that
/// map nothing of their own there; the volume's home in the pool, read by
/// the volume and through its epochs by the records that map nothing of
/// their own there and whose epoch has no copy of the chunk.
fn cow_readers(
    meta: &Volumes,
    blocks: &[DamagedData],
    found: &mut dyn FnMut(usize, u64, u64),
) -> Result<()> {
    let cs = meta.meta().geo().chunk_size;
    let records: Vec<(u64, &arbor_format::VolumeRecord)> = meta.table().iter().collect();
    // The records reading through `origin`'s epochs that map nothing of
    // their own at `chunk`, and whose epoch `reads` says reads the block.
    let readers = |origin: u64,
                   chunk: u64,
                   at: u64,
                   reads: &dyn Fn(u64) -> Result<bool>,
                   found: &mut dyn FnMut(u64)|
     -> Result<()> {
        for (id, reader) in &records {
            let Some(b) = reader.backing else { continue };
            if b.origin != origin || at >= reader.size_bytes || !reads(b.epoch)? {
                continue;
            }
            if Mapping::new(meta.meta(), reader.root)
                .lookup(chunk)?
                .is_none()
            {
                found(*id);
            }
        }
        Ok(())
    };
    for (origin, rec) in &records {
        let arbor_format::DataLayout::Cow(cow) = rec.layout else {
            continue;
        };
        let mut copies = Vec::new();
        SnapStore::new(meta.meta(), rec.root).for_each(0, &mut |entry| {
            for (i, d) in blocks.iter().enumerate() {
                if entry.pchunk == d.pchunk {
                    copies.push((i, entry));
                }
            }
            Ok(true)
        })?;
        for (i, entry) in copies {
            let at = entry.chunk * cs + u64::from(blocks[i].block) * SUM_BLOCK_U64;
            let epochs = entry.first..=entry.last;
            readers(
                *origin,
                entry.chunk,
                at,
                &|e| Ok(epochs.contains(&e)),
                &mut |id| found(i, id, at),
            )?;
        }
        let arbor_format::Home::Pool { first } = cow.home else {
            continue;
        };
        if crate::volumes::is_loose_home(rec) {
            continue;
        }
        let home = first..first.saturating_add(rec.size_bytes.div_ceil(cs));
        let store = SnapStore::new(meta.meta(), rec.root);
        for (i, d) in blocks.iter().enumerate() {
            if !home.contains(&d.pchunk) {
                continue;
            }
            let chunk = d.pchunk - first;
            let at = chunk * cs + u64::from(d.block) * SUM_BLOCK_U64;
            if at < rec.size_bytes {
                found(i, *origin, at);
            }
            readers(
                *origin,
                chunk,
                at,
                &|e| Ok(store.lookup(chunk, e)?.is_none()),
                &mut |id| found(i, id, at),
            )?;
        }
    }
    Ok(())
}

/// Calls `found(i, offset)` for each block `blocks[i]` that the mapping at
/// `root` reads, with the byte offset where it reads it (the one rule of
/// which logical block a damaged physical block is).
fn readers_in(
    meta: &Volumes,
    root: arbor_format::BlockRef,
    blocks: &[DamagedData],
    found: &mut dyn FnMut(usize, u64),
) -> Result<()> {
    let cs = meta.meta().geo().chunk_size;
    Mapping::new(meta.meta(), root).extents(0, u64::MAX, &mut |extent| {
        let runs = extent.partial.map(|_| extent.at(extent.start).runs(cs));
        for (i, d) in blocks.iter().enumerate() {
            let within = u64::from(d.block) * SUM_BLOCK_U64;
            let logical = match &runs {
                // A run of chunks mapped whole.
                None => (extent.pchunk..extent.pchunk + u64::from(extent.len))
                    .contains(&d.pchunk)
                    .then(|| (extent.start + (d.pchunk - extent.pchunk)) * cs + within),
                // A partial extent (one chunk): the block from the layer
                // that gives it.
                Some(runs) => runs
                    .iter()
                    .any(|(range, from)| *from == d.pchunk && range.contains(&within))
                    .then_some(extent.start * cs + within),
            };
            if let Some(at) = logical {
                found(i, at);
            }
        }
        Ok(true)
    })
}
