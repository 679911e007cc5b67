//! Snapshots made durable by a record of the intent log instead of a
//! commit (format version 14, docs/FORMAT.md §6.4.2).
//!
//! A committed snapshot taken by committing waits for the commit's
//! flushes, which write back everything the writes since the last commit
//! dirtied (through the page cache: every dirty page of the pool file).
//! Instead, when the open transaction holds no management change that a
//! replay could not find (only writes, and snapshots logged the same way),
//! the snapshot is taken in memory as a deferred one is, and one record
//! naming it (its source, id, identity, creation time and name) is
//! written and made durable alone. After a crash the open takes it again
//! onto the durable commit the record names: it then holds its volume as
//! of that commit, which has every write a client flushed before the
//! snapshot (a flush commits); writes not flushed may be missing from it,
//! as they may be from the volume itself. Until the next commit the
//! snapshot reads as its volume stood when it was taken, and its
//! [`super::VolumeInfo::durable`] is false, so everything that carries
//! its contents elsewhere (a send, a backup, an export) commits first
//! and no copy of it can differ from what a crash leaves.

use arbor_format::{LoggedSnapshot, SnapshotLogRecord, BLOCK_SIZE_U64};
use tracing::warn;

use super::{Pool, VolumeId};
use crate::error::{Error, Resource, Result};
use crate::meta::Privilege;
use crate::volumes::Volumes;

impl Pool {
    /// Takes the snapshots `names` (`take` takes them in one step) and
    /// makes them durable by a snapshot record of the intent log, under
    /// the commit lock, the pool gate shared and the sources' volume gates
    /// exclusive, as a deferred snapshot holds them. `Ok(None)`, having
    /// changed nothing, when they must be committed instead: the pool has
    /// no log, an older version or no room left in the log for this
    /// commit; the names do not fit one record; a management change since
    /// the durable commit is in no record; a source is a copy-on-write
    /// volume or was created since that commit; a name does not resolve
    /// (the committed path reports it); or the open transaction has no
    /// journal room for the step. If the record cannot be written, the
    /// snapshots are committed instead.
    pub(super) fn log_snapshots(
        &self,
        names: &[String],
        take: impl Fn(&mut Volumes) -> Result<Vec<VolumeId>>,
    ) -> Result<Option<Vec<VolumeId>>> {
        let Some((start, blocks)) = self.store.geo.intent_log else {
            return Ok(None);
        };
        if !self.store.geo.version().has_logged_snapshots()
            || !arbor_format::snapshots_fit_a_record(names.iter().map(String::len))
        {
            return Ok(None);
        }
        self.committer.check_failed()?;
        let _commit = self.committer.lock();
        let Some(sources) = self.snapshot_sources(names)? else {
            return Ok(None);
        };
        let (ids, record) = {
            let _gate = self.gates.io();
            let _sources = self.gates.volumes_exclusive(&sources);
            let mut meta = self.write_meta()?;
            // Stable under the commit lock: no commit is in flight.
            let durable = meta.meta().durable_txn();
            let seq = meta.meta().intent_log.next();
            if seq >= blocks || meta.unlogged_change_since(durable) {
                return Ok(None);
            }
            if !super::gated_row_sources(&meta, names, &sources)? {
                return Ok(None);
            }
            // Each source must be in the commit the record names.
            for &source in &sources {
                if meta.volume(source)?.created_txn > durable {
                    return Ok(None);
                }
            }
            let step = |m: &mut Volumes| {
                let ids = take(m)?;
                m.store_table()?;
                Ok(ids)
            };
            let ids = match self.mutate(&mut meta, Privilege::Normal, step) {
                Err(Error::Exhausted(Resource::Journal)) => return Ok(None),
                other => other?,
            };
            let mut snapshots = Vec::with_capacity(ids.len());
            for (id, &source) in ids.iter().zip(&sources) {
                let rec = meta.volume(id.0)?;
                snapshots.push(LoggedSnapshot {
                    source,
                    id: id.0,
                    guid: rec.guid,
                    created_unix_secs: rec.created_unix_secs,
                    name: rec.name.clone(),
                });
            }
            // The block is this record's whether or not its write lands:
            // a later record never takes the place of a torn one.
            meta.note_intent_log(&[], seq + 1);
            let record = SnapshotLogRecord {
                uuid: self.store.geo.uuid,
                txn: durable,
                // Below `blocks`, which the superblock bounds (MAX_LOG_BLOCKS).
                seq: seq as u32,
                snapshots,
            };
            (ids, record)
        };
        let written = record
            .encode()
            .map_err(|e| Error::inconsistent(format!("a snapshot log record: {e}")))
            .and_then(|block| {
                // Inside the pool: the superblock's layout was validated.
                let at = (start + u64::from(record.seq)) * BLOCK_SIZE_U64;
                Ok(self.store.dev.write_durable_at(&block, at)?)
            });
        match written {
            Ok(()) => self.counters.snapshots_logged(ids.len() as u64),
            Err(e) => {
                warn!(error = %e, "could not log a snapshot in the intent log; committing it instead");
                let _gate = self.gates.commit();
                self.commit_held()?;
            }
        }
        Ok(Some(ids))
    }
}
