//! The management operations, behind one trait so each CLI command runs the
//! same way on a pool opened by this process ([`PoolControl`]) or through a
//! running daemon ([`crate::client::DaemonClient`]). The daemon's HTTP API is
//! itself a [`PoolControl`] behind axum, so all three agree by construction.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Result;
use arbor_engine::{Pool, VolumeId, VolumeInfo};

use crate::model::{CheckView, PoolView, Range, ReclaimView, StatsView, VolumeKind, VolumeView};

/// Nodes processed per reclaim call when reclaiming to completion: each call
/// commits, so this bounds how long one commit holds up I/O.
const RECLAIM_BATCH: usize = 1024;

pub trait Control {
    fn pool_info(&self) -> Result<PoolView>;
    fn list(&self) -> Result<Vec<VolumeView>>;
    fn create_volume(&self, name: &str, size: u64) -> Result<VolumeView>;
    fn snapshot(&self, name: &str) -> Result<VolumeView>;
    fn clone_snapshot(&self, snapshot: &str, name: &str) -> Result<VolumeView>;
    fn delete(&self, name: &str) -> Result<()>;
    fn rollback(&self, volume: &str, snapshot: &str) -> Result<VolumeView>;
    fn resize(&self, name: &str, size: u64) -> Result<VolumeView>;
    fn rename(&self, from: &str, to: &str) -> Result<VolumeView>;
    fn stats(&self, name: &str) -> Result<StatsView>;
    fn diff(&self, a: &str, b: &str) -> Result<Vec<Range>>;
    fn check(&self) -> Result<CheckView>;
    /// Reclaims all space of deleted volumes.
    fn reclaim(&self) -> Result<ReclaimView>;
    fn flush(&self) -> Result<()>;
}

/// [`Control`] on a pool in this process. Engine errors pass through
/// unwrapped, so callers can downcast them (the API maps them to statuses).
#[derive(Clone)]
pub struct PoolControl {
    pool: Arc<Pool>,
    path: PathBuf,
}

impl PoolControl {
    pub fn new(pool: Arc<Pool>, path: PathBuf) -> Self {
        Self { pool, path }
    }

    fn view(&self, info: VolumeInfo) -> Result<VolumeView> {
        let parent = match info.parent {
            Some(id) => self.name_of(id)?,
            None => None,
        };
        Ok(to_view(info, parent))
    }

    fn view_by_name(&self, name: &str) -> Result<VolumeView> {
        let info = self.pool.info(self.pool.lookup(name)?)?;
        self.view(info)
    }

    /// The name of volume `id`, or `None` once it has been deleted.
    fn name_of(&self, id: VolumeId) -> Result<Option<String>> {
        match self.pool.info(id) {
            Ok(info) => Ok(Some(info.name)),
            Err(arbor_engine::Error::NotFound(_)) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }
}

fn to_view(info: VolumeInfo, parent: Option<String>) -> VolumeView {
    VolumeView {
        name: info.name,
        id: info.id.0,
        kind: if info.snapshot {
            VolumeKind::Snapshot
        } else {
            VolumeKind::Volume
        },
        size: info.size,
        mapped_bytes: info.mapped_bytes,
        parent,
        created_unix_secs: info.created_unix_secs,
        created_txn: info.created_txn,
    }
}

impl Control for PoolControl {
    fn pool_info(&self) -> Result<PoolView> {
        let s = self.pool.pool_stats()?;
        Ok(PoolView {
            path: self.path.display().to_string(),
            pool_bytes: s.pool_bytes,
            chunk_size: s.chunk_size,
            data_bytes: s.data_bytes,
            data_used_bytes: s.data_used_bytes,
            metadata_bytes: s.metadata_bytes,
            metadata_used_bytes: s.metadata_used_bytes,
            volumes: s.volumes,
            snapshots: s.snapshots,
            reclaim_pending: s.reclaim_pending,
            txn: s.txn,
        })
    }

    fn list(&self) -> Result<Vec<VolumeView>> {
        let all = self.pool.list()?;
        // One listing is a consistent snapshot of names: resolve parents from it.
        let names: HashMap<VolumeId, String> = all.iter().map(|v| (v.id, v.name.clone())).collect();
        Ok(all
            .into_iter()
            .map(|info| {
                let parent = info.parent.and_then(|id| names.get(&id).cloned());
                to_view(info, parent)
            })
            .collect())
    }

    fn create_volume(&self, name: &str, size: u64) -> Result<VolumeView> {
        let id = self.pool.create_volume(name, size)?;
        self.view(self.pool.info(id)?)
    }

    fn snapshot(&self, name: &str) -> Result<VolumeView> {
        let id = self.pool.snapshot(name)?;
        self.view(self.pool.info(id)?)
    }

    fn clone_snapshot(&self, snapshot: &str, name: &str) -> Result<VolumeView> {
        let id = self.pool.clone_snapshot(snapshot, name)?;
        self.view(self.pool.info(id)?)
    }

    fn delete(&self, name: &str) -> Result<()> {
        Ok(self.pool.delete(name)?)
    }

    fn rollback(&self, volume: &str, snapshot: &str) -> Result<VolumeView> {
        self.pool.rollback(volume, snapshot)?;
        self.view_by_name(volume)
    }

    fn resize(&self, name: &str, size: u64) -> Result<VolumeView> {
        self.pool.resize(name, size)?;
        self.view_by_name(name)
    }

    fn rename(&self, from: &str, to: &str) -> Result<VolumeView> {
        self.pool.rename(from, to)?;
        self.view_by_name(to)
    }

    fn stats(&self, name: &str) -> Result<StatsView> {
        let s = self.pool.volume_stats(self.pool.lookup(name)?)?;
        Ok(StatsView {
            name: name.to_owned(),
            logical_bytes: s.logical_bytes,
            mapped_bytes: s.mapped_bytes,
            exclusive_bytes: s.exclusive_bytes,
            shared_bytes: s.shared_bytes,
        })
    }

    fn diff(&self, a: &str, b: &str) -> Result<Vec<Range>> {
        let ranges = self.pool.diff(self.pool.lookup(a)?, self.pool.lookup(b)?)?;
        Ok(ranges
            .into_iter()
            .map(|(offset, len)| Range { offset, len })
            .collect())
    }

    fn check(&self) -> Result<CheckView> {
        let report = self.pool.check()?;
        Ok(CheckView {
            clean: report.is_clean(),
            problems: report.problems,
            unlisted: report.unlisted,
            volumes: report.volumes,
            nodes: report.nodes,
            data_chunks_referenced: report.data_chunks_referenced,
        })
    }

    fn reclaim(&self) -> Result<ReclaimView> {
        let mut processed = 0u64;
        loop {
            let done = self.pool.reclaim(RECLAIM_BATCH)?;
            if done == 0 {
                return Ok(ReclaimView { processed });
            }
            processed += done as u64;
        }
    }

    fn flush(&self) -> Result<()> {
        Ok(self.pool.flush()?)
    }
}
