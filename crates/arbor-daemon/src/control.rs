//! The management operations the API serves, on the daemon's pool: engine
//! calls plus what the daemon knows beyond the engine (open NBD
//! connections, metrics, space warnings, name suggestions).
//!
//! Engine errors pass through as `DaemonError::Engine`, so the API gives
//! them their codes by their type.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;

use crate::error::Result;
use arbor_engine::{Pool, VolumeId, VolumeInfo, VolumeLayout};
use tracing::{info, warn};

use crate::destroy::Destroyer;
use crate::error::DaemonError;
use crate::in_use::{readers_through, InUse};
use crate::metrics::Metrics;
use crate::monitor::{unix_now, Monitor};
use crate::pool_file::{self, OpenPool};
use crate::replication::Replication;
use crate::space::SpaceWatch;
use crate::views;
use arbor_api::model::{
    BlockMetadata, BlockerReason, CheckView, CreateLayout, DestroyBlocker, Durability, GrowRequest,
    GrowView, HomeView, LayoutView, MetadataPage, MetadataQuery, OverviewView, OverviewVolume,
    PoolView, QosRequest, Range, ReclaimView, StatsView, UpgradeView, VolumeKind, VolumeView,
};

/// Nodes processed per reclaim call when reclaiming to completion: each call
/// commits, so this bounds how long one commit holds up I/O.
const RECLAIM_BATCH: usize = 1024;

/// The daemon's background services a control reports on and drives.
pub struct Background {
    pub replication: Arc<Replication>,
    pub monitor: Arc<Monitor>,
    pub scrub: Arc<crate::scrub::Scrub>,
    pub qos: Arc<crate::qos::Qos>,
    pub restores: Arc<crate::restores::LiveRestores>,
}

/// The daemon's pool and what it knows about it; cheap to clone. The
/// other services get their own handles: this is the volume API's.
#[derive(Clone)]
pub struct PoolControl {
    pool: Arc<Pool>,
    path: PathBuf,
    /// How the pool's device is reached.
    cache_mode: arbor_io::CacheMode,
    in_use: InUse,
    destroyer: Destroyer,
    metrics: Arc<Metrics>,
    space: SpaceWatch,
    replication: Arc<Replication>,
    monitor: Arc<Monitor>,
    scrub: Arc<crate::scrub::Scrub>,
    qos: Arc<crate::qos::Qos>,
    /// Volumes an instant restore is filling.
    restores: Arc<crate::restores::LiveRestores>,
    /// Encrypted volumes' keys.
    keys: Arc<crate::keys::Keys>,
}

/// The page size a metadata query asks for.
fn page_size(q: &MetadataQuery) -> Result<usize> {
    match q.max_results.unwrap_or(256) {
        n @ 1..=10_000 => Ok(n as usize),
        n => Err(DaemonError::Invalid(format!(
            "max_results {n} is not 1 to 10000"
        ))),
    }
}

/// The page of the first `max` of `found` (one more than a page tells that
/// another follows).
fn page(mut found: Vec<BlockMetadata>, max: usize, size: u64) -> MetadataPage {
    let next = (found.len() > max).then(|| found[max].byte_offset);
    found.truncate(max);
    MetadataPage {
        block_metadata_type: "VARIABLE_LENGTH".to_owned(),
        volume_capacity_bytes: size,
        block_metadata: found,
        next_starting_offset: next,
    }
}

/// What the API says of `layout`; `origin`: the name of the origin a
/// volume reads through; `attached`: an origin's device is open.
fn layout_view(layout: VolumeLayout, origin: Option<String>, attached: bool) -> LayoutView {
    match layout {
        VolumeLayout::Row => LayoutView::Row,
        VolumeLayout::CowExternal { store_bytes, epoch } => LayoutView::Cow {
            store_bytes,
            epoch,
            attached,
            home: HomeView::Device,
        },
        VolumeLayout::CowInPool { store_bytes, epoch } => LayoutView::Cow {
            store_bytes,
            epoch,
            attached: true,
            home: HomeView::Pool,
        },
        VolumeLayout::ReadsThrough { epoch, .. } => LayoutView::ReadsThrough { origin, epoch },
    }
}

impl PoolControl {
    /// Encrypted volumes' keys.
    pub fn keys(&self) -> Arc<crate::keys::Keys> {
        Arc::clone(&self.keys)
    }

    pub fn new(
        open: &OpenPool,
        in_use: InUse,
        destroyer: Destroyer,
        metrics: Arc<Metrics>,
        space: SpaceWatch,
        background: Background,
    ) -> Self {
        let Background {
            replication,
            monitor,
            scrub,
            qos,
            restores,
        } = background;
        Self {
            keys: Arc::new(crate::keys::Keys::new(Arc::clone(&open.pool))),
            pool: Arc::clone(&open.pool),
            path: open.path.clone(),
            cache_mode: open.cache_mode,
            in_use,
            destroyer,
            metrics,
            space,
            replication,
            monitor,
            scrub,
            qos,
            restores,
        }
    }

    /// Changes the rate limits of volume or snapshot `name`: recorded in
    /// the pool, then in force for every connection's next request.
    pub fn set_qos(&self, name: &str, change: &QosRequest) -> Result<VolumeView> {
        let id = self.pool.lookup(name)?;
        self.qos.set(id, name, change)?;
        self.view_by_name(name)
    }

    /// Where the scrub stands.
    pub fn scrub(&self) -> arbor_api::model::ScrubView {
        self.scrub.view()
    }

    /// Starts a scrub, or goes on with a stopped one.
    pub fn start_scrub(&self) -> Result<arbor_api::model::ScrubView> {
        Ok(self.scrub.start()?)
    }

    /// Stops the running scrub where it is.
    pub fn stop_scrub(&self) -> Result<arbor_api::model::ScrubView> {
        Ok(self.scrub.stop()?)
    }

    /// Sets the pool's scrub schedule.
    pub fn set_scrub_schedule(&self, spec: &str) -> Result<arbor_api::model::ScrubView> {
        Ok(self.scrub.set_schedule(spec)?)
    }

    /// Removes the pool's scrub schedule.
    pub fn clear_scrub_schedule(&self) -> Result<arbor_api::model::ScrubView> {
        Ok(self.scrub.clear_schedule()?)
    }

    /// The pool: what name suggestions look in.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// The metrics in OpenMetrics text, refreshed from the pool,
    /// replication and the monitor's alerts.
    pub fn metrics_text(&self) -> Result<String> {
        self.metrics.set_replication(&self.replication.view().pairs);
        self.metrics.set_alerts(&self.monitor.alerts());
        self.metrics
            .set_backups(self.monitor.backups().metrics_report());
        let qos = self
            .qos
            .report()
            .into_iter()
            .filter_map(|(id, limits, delayed, seconds)| {
                // A volume destroyed since has no name, and no metrics.
                let name = self.pool.info(id).ok()?.name;
                Some((name, limits, delayed, seconds))
            })
            .collect();
        self.metrics.render(
            &self.pool,
            &|id| self.in_use.connections(id),
            &self.space,
            &self.scrub.view(),
            qos,
        )
    }

    fn view(&self, info: VolumeInfo) -> Result<VolumeView> {
        let parent = match info.parent {
            Some(id) => self.name_of(id)?,
            None => None,
        };
        let (origin, attached) = match info.layout {
            VolumeLayout::ReadsThrough { origin, .. } => (self.name_of(origin)?, false),
            VolumeLayout::CowExternal { .. } => (
                None,
                self.pool
                    .origins()?
                    .iter()
                    .any(|o| o.id == info.id && o.attached),
            ),
            VolumeLayout::Row | VolumeLayout::CowInPool { .. } => (None, false),
        };
        let layout = layout_view(info.layout, origin, attached);
        Ok(self.to_view(info, parent, layout))
    }

    fn view_by_name(&self, name: &str) -> Result<VolumeView> {
        let info = self.pool.info(self.pool.lookup(name)?)?;
        self.view(info)
    }

    /// The name of volume `id`, or `None` once it has been deleted.
    fn name_of(&self, id: VolumeId) -> Result<Option<String>> {
        match self.pool.info(id) {
            Ok(info) => Ok(Some(info.name)),
            Err(arbor_engine::Error::Refused(arbor_engine::Refusal::NotFound(_))) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    fn to_view(&self, info: VolumeInfo, parent: Option<String>, layout: LayoutView) -> VolumeView {
        VolumeView {
            layout,
            nbd_connections: self.in_use.connections(info.id) as u64,
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
            durable: info.durable,
            holds: if info.snapshot {
                self.pool.holds(info.id).unwrap_or_default()
            } else {
                Vec::new()
            },
            guid: info.guid.as_ref().map(arbor_engine::guid_hex),
            qos: self.qos.view(info.id),
            restoring: self.restores.view(info.id),
            encryption: info
                .key_slot
                .map(|key_slot| arbor_api::model::EncryptionView {
                    key_slot,
                    locked: !self.pool.key_loaded(key_slot),
                }),
        }
    }

    pub fn pool_info(&self) -> Result<PoolView> {
        let s = self.pool.pool_stats()?;
        Ok(PoolView {
            path: self.path.display().to_string(),
            format_version: self.pool.format_version().number(),
            io: self.cache_mode.name().to_owned(),
            pool_bytes: s.pool_bytes,
            chunk_size: s.chunk_size,
            data_bytes: s.data_bytes,
            data_used_bytes: s.data_used_bytes,
            metadata_bytes: s.metadata_bytes,
            metadata_used_bytes: s.metadata_used_bytes,
            volumes: s.volumes,
            snapshots: s.snapshots,
            reclaim_pending: s.reclaim_pending,
            fill_pending: s.fill_pending,
            txn: s.txn,
            warnings: self.space.warnings(&s),
            alerts: self.monitor.alerts(),
            damaged_blocks: self.pool.damage_count()?,
        })
    }

    /// The pool's damaged data blocks, each with who reads it.
    pub fn damage(&self) -> Result<arbor_api::model::DamageView> {
        Ok(crate::views::damage_view(
            self.pool.damage()?,
            self.pool.damage_found(),
        ))
    }

    /// Everything the dashboard shows: the pool, every volume and snapshot
    /// with its space, policies, replication and alerts.
    pub fn overview(&self) -> Result<OverviewView> {
        let now = unix_now();
        let policies = self.monitor.views(None, now)?;
        // Each volume's policy, from the policies' own member lists.
        let policy_of: HashMap<&str, &arbor_api::model::PolicyView> = policies
            .iter()
            .flat_map(|p| p.volumes.iter().map(move |v| (v.as_str(), p)))
            .collect();
        let all = self.pool.list()?;
        let infos: HashMap<u64, &VolumeInfo> = all.iter().map(|v| (v.id.0, v)).collect();
        let volumes = self
            .list()?
            .into_iter()
            .map(|volume| {
                // A volume destroyed since the listing has no space.
                let s = self
                    .pool
                    .volume_stats(VolumeId(volume.id))
                    .unwrap_or(arbor_engine::VolumeStats::unknown(volume.size));
                let policy_snapshot = match (volume.kind, &volume.parent) {
                    (VolumeKind::Snapshot, Some(parent)) => policy_of
                        .get(parent.as_str())
                        .filter(|p| {
                            arbor_monitor::engine::policy_stamp(&p.prefix, &volume.name).is_some()
                        })
                        .map(|p| p.id.clone()),
                    _ => None,
                };
                OverviewVolume {
                    exclusive_bytes: s.exclusive_bytes,
                    shared_bytes: s.shared_bytes,
                    policy: policy_of.get(volume.name.as_str()).map(|p| p.id.clone()),
                    policy_snapshot,
                    destroy_blockers: infos
                        .get(&volume.id)
                        .map(|info| self.destroy_blockers(info, &volume.holds, &all))
                        .unwrap_or_default(),
                    volume,
                }
            })
            .collect();
        let pool = self.pool_info()?;
        // Listed (a walk of every mapping) only while there is damage.
        let damage = if pool.damaged_blocks > 0 {
            Some(self.damage()?)
        } else {
            None
        };
        Ok(OverviewView {
            now_unix_secs: now,
            pool,
            volumes,
            policies,
            replication: self.replication.view(),
            alerts: self.monitor.alerts(),
            scrub: self.scrub(),
            damage,
            backups: self.monitor.backups().overview(now),
            caller: None,
        })
    }

    /// What destroying `info` (held by `holds`; `all`: the pool's listing)
    /// would be refused for now, and whether force overrides each: the
    /// checks [`PoolControl::destroy`] makes (readers through a
    /// copy-on-write volume, [`InUse::refuse`], holds).
    pub fn destroy_blockers(
        &self,
        info: &VolumeInfo,
        holds: &[String],
        all: &[VolumeInfo],
    ) -> Vec<DestroyBlocker> {
        let mut out = Vec::new();
        let device = matches!(info.layout, VolumeLayout::CowExternal { .. });
        if device || matches!(info.layout, VolumeLayout::CowInPool { .. }) {
            let readers: Vec<String> = readers_through(all, info.id)
                .into_iter()
                .map(|v| v.name.clone())
                .collect();
            if !readers.is_empty() {
                out.push(DestroyBlocker {
                    reason: BlockerReason::ReadsThrough,
                    message: format!(
                        "{} snapshot(s) or clone(s) read through it: destroy them first{}; \
                         force does not override this",
                        readers.len(),
                        if device {
                            format!(
                                ", or keep them with arbor origin detach {} --copy-to-pool",
                                info.name
                            )
                        } else {
                            String::new()
                        }
                    ),
                    names: readers,
                    forced: false,
                });
            }
        }
        let busy = [
            (
                BlockerReason::Open,
                self.in_use.connections(info.id),
                "open NBD connection(s): forcing fails their I/O",
            ),
            (
                BlockerReason::Sending,
                self.in_use.sends(info.id),
                "send(s) reading it: forcing fails them",
            ),
        ];
        for (reason, count, what) in busy {
            if count > 0 {
                out.push(DestroyBlocker {
                    reason,
                    message: format!("{count} {what}"),
                    names: Vec::new(),
                    forced: true,
                });
            }
        }
        if !holds.is_empty() {
            out.push(DestroyBlocker {
                reason: BlockerReason::Held,
                message: "held: forcing releases the holds".to_owned(),
                names: holds.to_vec(),
                forced: true,
            });
        }
        out
    }

    pub fn list(&self) -> Result<Vec<VolumeView>> {
        let all = self.pool.list()?;
        // One listing is a consistent snapshot of names: resolve parents from it.
        let names: HashMap<VolumeId, String> = all.iter().map(|v| (v.id, v.name.clone())).collect();
        let attached: HashSet<VolumeId> = match all
            .iter()
            .any(|v| matches!(v.layout, VolumeLayout::CowExternal { .. }))
        {
            true => self
                .pool
                .origins()?
                .into_iter()
                .filter(|o| o.attached)
                .map(|o| o.id)
                .collect(),
            false => HashSet::new(),
        };
        Ok(all
            .into_iter()
            .map(|info| {
                let parent = info.parent.and_then(|id| names.get(&id).cloned());
                let origin = match info.layout {
                    VolumeLayout::ReadsThrough { origin, .. } => names.get(&origin).cloned(),
                    _ => None,
                };
                let layout = layout_view(info.layout, origin, attached.contains(&info.id));
                self.to_view(info, parent, layout)
            })
            .collect())
    }

    /// Creates a volume, with rate limits if `qos` sets any: limits that
    /// are refused create nothing, and a volume whose limits cannot be
    /// recorded is destroyed again (the operation leaves no trace).
    pub fn create_volume(
        &self,
        name: &str,
        size: u64,
        layout: CreateLayout,
        qos: Option<&QosRequest>,
        encryption: Option<arbor_api::model::EncryptionRequest>,
    ) -> Result<VolumeView> {
        let qos = qos.filter(|q| !q.is_empty());
        if let Some(change) = qos {
            crate::qos::apply(&arbor_format::QosRecord::default(), change)?;
        }
        let id =
            match (layout, encryption) {
                (CreateLayout::Row, None) => self.pool.create_volume(name, size)?,
                (CreateLayout::Cow, None) => self.pool.create_cow_volume(name, size)?,
                (CreateLayout::Row, Some(e)) => {
                    let user = crate::keys::user_key(e.key)?;
                    self.keys.create_volume(name, size, &user, e.unit)?
                }
                (CreateLayout::Cow, Some(_)) => return Err(DaemonError::Invalid(
                    "copy-on-write volumes are not encrypted (yet): create it with --layout row"
                        .to_owned(),
                )),
            };
        if let Some(change) = qos {
            if let Err(e) = self.qos.set(id, name, change) {
                if let Err(undo) = self.pool.delete(name) {
                    warn!(volume = %name, error = %undo, "cannot destroy the volume whose rate limits could not be recorded");
                }
                return Err(e);
            }
        }
        self.view(self.pool.info(id)?)
    }

    /// Loads `name`'s key (every volume sharing it unlocks).
    pub fn key_load(&self, name: &str, key: arbor_api::model::KeyMaterial) -> Result<VolumeView> {
        let user = crate::keys::user_key(key)?;
        self.keys.load(name, &user)?;
        self.view(self.pool.info(self.pool.lookup(name)?)?)
    }

    /// Unloads `name`'s key (every volume sharing it locks). Its NBD
    /// connections fail their next requests.
    pub fn key_unload(&self, name: &str) -> Result<VolumeView> {
        self.keys.unload(name)?;
        self.view(self.pool.info(self.pool.lookup(name)?)?)
    }

    /// Wraps `name`'s data key with another user's key.
    pub fn key_change(
        &self,
        name: &str,
        old: arbor_api::model::KeyMaterial,
        new: arbor_api::model::KeyMaterial,
    ) -> Result<VolumeView> {
        let (old, new) = (crate::keys::user_key(old)?, crate::keys::user_key(new)?);
        self.keys.change(name, &old, &new)?;
        self.view(self.pool.info(self.pool.lookup(name)?)?)
    }

    pub fn snapshot(&self, name: &str, durability: Durability) -> Result<VolumeView> {
        let id = self
            .pool
            .snapshot_with(name, views::durability(durability))?;
        self.view(self.pool.info(id)?)
    }

    /// Snapshots of several volumes in one commit (a consistency group).
    pub fn snapshot_group(
        &self,
        names: &[String],
        durability: Durability,
    ) -> Result<Vec<VolumeView>> {
        let ids = self
            .pool
            .snapshot_group_with(names, views::durability(durability))?;
        ids.into_iter()
            .map(|id| self.view(self.pool.info(id)?))
            .collect()
    }

    pub fn clone_snapshot(
        &self,
        snapshot: &str,
        name: &str,
        durability: Durability,
    ) -> Result<VolumeView> {
        let id = self
            .pool
            .clone_snapshot_with(snapshot, name, views::durability(durability))?;
        self.view(self.pool.info(id)?)
    }

    /// A clone of an encrypted snapshot unlocked by a user key of its own
    /// (committed; deferred durability does not apply).
    pub fn clone_with_key(
        &self,
        snapshot: &str,
        name: &str,
        keys: arbor_api::model::KeyChangeRequest,
    ) -> Result<VolumeView> {
        let (old, new) = (
            crate::keys::user_key(keys.old)?,
            crate::keys::user_key(keys.new)?,
        );
        let id = self.keys.clone_with_key(snapshot, name, &old, &new)?;
        self.view(self.pool.info(id)?)
    }

    /// Snapshots, of `volume` only if given (which must exist).
    pub fn snapshots(&self, volume: Option<&str>) -> Result<Vec<VolumeView>> {
        if let Some(volume) = volume {
            self.pool.lookup(volume)?;
        }
        let prefix = volume.map(|v| format!("{v}@"));
        Ok(self
            .list()?
            .into_iter()
            .filter(|v| v.kind == VolumeKind::Snapshot)
            .filter(|v| prefix.as_ref().is_none_or(|p| v.name.starts_with(p)))
            .collect())
    }

    /// Destroys a volume or snapshot ([`Destroyer::destroy`]).
    pub fn destroy(&self, name: &str, force: bool) -> Result<()> {
        self.destroyer.destroy(name, force)
    }

    /// Holds snapshot `name` with `tag`.
    pub fn hold(&self, name: &str, tag: &str) -> Result<VolumeView> {
        self.pool.hold(name, tag)?;
        self.view_by_name(name)
    }

    /// Releases hold `tag` on snapshot `name`.
    pub fn release(&self, name: &str, tag: &str) -> Result<VolumeView> {
        if !self.pool.release(name, tag)? {
            return Err(DaemonError::NotFound(format!("{name} has no hold {tag:?}")));
        }
        self.view_by_name(name)
    }

    pub fn rollback(&self, volume: &str, snapshot: &str) -> Result<VolumeView> {
        // The engine records an origin's rollback and carries it out when
        // the device is there; without it, it would answer success with
        // nothing rolled back yet. Say so instead.
        if let Some(o) = self
            .pool
            .origins()?
            .into_iter()
            .find(|o| o.name == volume && !o.attached)
        {
            return Err(arbor_engine::Error::from(
                arbor_engine::OriginUnavailable::NotAttachedForRollback { name: o.name },
            )
            .into());
        }
        self.pool.rollback(volume, snapshot)?;
        self.view_by_name(volume)
    }

    pub fn resize(&self, name: &str, size: u64) -> Result<VolumeView> {
        self.pool.resize(name, size)?;
        self.view_by_name(name)
    }

    pub fn rename(&self, from: &str, to: &str) -> Result<VolumeView> {
        self.pool.rename(from, to)?;
        self.view_by_name(to)
    }

    pub fn stats(&self, name: &str) -> Result<StatsView> {
        let id = self.pool.lookup(name)?;
        let s = self.pool.volume_stats(id)?;
        let store_bytes = match self.pool.info(id)?.layout {
            VolumeLayout::CowExternal { store_bytes, .. } => Some(store_bytes),
            _ => None,
        };
        Ok(StatsView {
            store_bytes,
            name: name.to_owned(),
            logical_bytes: s.logical_bytes,
            mapped_bytes: s.mapped_bytes,
            exclusive_bytes: s.exclusive_bytes,
            shared_bytes: s.shared_bytes,
        })
    }

    pub fn diff(&self, a: &str, b: &str) -> Result<Vec<Range>> {
        let ranges = self.pool.diff(self.pool.lookup(a)?, self.pool.lookup(b)?)?;
        Ok(ranges
            .into_iter()
            .map(|(offset, len)| Range { offset, len })
            .collect())
    }

    /// A page of what snapshot `name` maps (CSI `GetMetadataAllocated`),
    /// looked up window by window so a page costs what it returns.
    pub fn allocated(&self, name: &str, q: &MetadataQuery) -> Result<MetadataPage> {
        /// The volume range one allocation lookup covers.
        const WINDOW: u64 = 1 << 30;
        let max = page_size(q)?;
        let id = self.pool.lookup(name)?;
        let size = self.pool.info(id)?.size;
        let mut found: Vec<BlockMetadata> = Vec::new();
        let mut at = q.starting_offset.min(size) / arbor_engine::SECTOR * arbor_engine::SECTOR;
        while at < size && found.len() <= max {
            let len = (size - at).min(WINDOW);
            for run in self
                .pool
                .allocation_map(id, at, len)?
                .into_iter()
                .filter(|r| r.mapped)
            {
                match found.last_mut() {
                    Some(last) if last.byte_offset + last.size_bytes == run.offset => {
                        last.size_bytes += run.len
                    }
                    _ => found.push(BlockMetadata {
                        byte_offset: run.offset,
                        size_bytes: run.len,
                    }),
                }
            }
            at += len;
        }
        Ok(page(found, max, size))
    }

    /// A page of the ranges where snapshot `name` differs from `q.base`
    /// (CSI `GetMetadataDelta`).
    pub fn changed(&self, name: &str, q: &MetadataQuery) -> Result<MetadataPage> {
        let max = page_size(q)?;
        let base = q.base.as_deref().ok_or_else(|| {
            DaemonError::Invalid("give base=VOLUME@SNAP, the snapshot to compare with".to_owned())
        })?;
        /// The volume range one diff walk covers.
        const WINDOW: u64 = 1 << 30;
        let id = self.pool.lookup(name)?;
        let base = self.pool.lookup(base)?;
        let size = self.pool.info(id)?.size;
        let end = size.max(self.pool.info(base)?.size);
        // Window by window from the starting offset, until a page and one
        // more range are found: memory and work follow the page.
        let mut found: Vec<BlockMetadata> = Vec::new();
        let mut at = q.starting_offset;
        while at < end && found.len() <= max {
            let to = at.saturating_add(WINDOW).min(end);
            for (offset, len) in self.pool.diff_in(base, id, at, to)? {
                // Whole chunks: one overlapping the previous window is
                // already in, joined.
                match found.last_mut() {
                    Some(last) if offset < last.byte_offset + last.size_bytes => {
                        let new_end = (offset + len).max(last.byte_offset + last.size_bytes);
                        last.size_bytes = new_end - last.byte_offset;
                    }
                    Some(last) if offset == last.byte_offset + last.size_bytes => {
                        last.size_bytes += len
                    }
                    _ if offset + len > q.starting_offset => found.push(BlockMetadata {
                        byte_offset: offset,
                        size_bytes: len,
                    }),
                    _ => {}
                }
            }
            at = to;
        }
        Ok(page(found, max, size))
    }

    pub fn check(&self) -> Result<CheckView> {
        Ok(views::check_view(self.pool.check()?))
    }

    pub fn reclaim(&self) -> Result<ReclaimView> {
        let mut processed = 0u64;
        loop {
            let mut done = self.pool.reclaim(RECLAIM_BATCH)?;
            if done == 0 {
                done = self.pool.fill_partials(RECLAIM_BATCH)?;
            }
            if done == 0 {
                return Ok(ReclaimView { processed });
            }
            self.metrics.count_reclaimed(done as u64);
            processed += done as u64;
        }
    }

    /// Grows the pool while it serves. Nothing here keeps the pool's size:
    /// status, metrics and space warnings read it from the pool each time.
    pub fn grow(&self, request: &GrowRequest) -> Result<GrowView> {
        let grown = pool_file::grow(&self.pool, &self.path, &views::grow_options(request))?;
        info!(
            from = grown.old_pool_bytes,
            to = grown.new_pool_bytes,
            data_added = grown.data_bytes_added,
            metadata_added = grown.metadata_bytes_added,
            "grew the pool"
        );
        Ok(grown)
    }

    pub fn upgrade(&self) -> Result<UpgradeView> {
        let view = pool_file::upgrade(&self.pool)?;
        if view.upgraded {
            info!(version = view.format_version, "upgraded the pool's format");
        }
        Ok(view)
    }

    pub fn flush(&self) -> Result<()> {
        Ok(self.pool.flush()?)
    }
}
