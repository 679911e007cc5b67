//! Pool volumes as NBD exports: each volume is a writable export under its
//! name, each snapshot a read-only export `volume@snapshot`.
//!
//! Exports are looked up by name on every new connection, so volumes created
//! since the daemon started appear and resized ones report their new size.
//! A connection keeps the volume's id, which is never reused: if the volume
//! is deleted (even if another takes its name) its requests fail cleanly.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use arbor_engine::{Error, MapRun, Pool, Refusal, Resource, VolumeId, VolumeInfo, VolumeLayout};
use arbor_nbd::{Export, ExportError, ExportListing, ExportProvider, StatusRun};
use tracing::warn;

use crate::metrics::{IoOp, Metrics, VolumeIo};
use arbor_api::size::ByteSize;

/// Most bytes one block-status answer covers; the server asks again for the
/// rest, so a client's whole-disk query costs bounded work per round.
const STATUS_WINDOW: u64 = 1 << 30;

/// How many NBD connections have each volume open, so that destroying a
/// volume in use can be refused.
#[derive(Debug, Default)]
pub struct OpenExports {
    counts: Mutex<HashMap<VolumeId, usize>>,
    /// Notified whenever a connection closes (see [`OpenExports::settled`]).
    closed: Condvar,
}

impl OpenExports {
    fn counts(&self) -> std::sync::MutexGuard<'_, HashMap<VolumeId, usize>> {
        // A map of counters: a panic elsewhere cannot leave it half-updated.
        self.counts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Open connections to volume `id`.
    pub fn count(&self, id: VolumeId) -> usize {
        self.counts().get(&id).copied().unwrap_or(0)
    }

    /// Open connections to volume `id` once those that are closing have
    /// closed, waiting at most `grace` for them. A client that disconnects
    /// and exits has closed its socket before the daemon reads the end of
    /// it: a script that runs `qemu-io` and then destroys the volume must
    /// not find it still open. Returns at once when none are open; a
    /// connection that stays open costs the caller `grace`.
    pub fn settled(&self, id: VolumeId, grace: Duration) -> usize {
        let deadline = Instant::now() + grace;
        let mut counts = self.counts();
        loop {
            let open = counts.get(&id).copied().unwrap_or(0);
            let left = deadline.saturating_duration_since(Instant::now());
            if open == 0 || left.is_zero() {
                return open;
            }
            counts = match self.closed.wait_timeout(counts, left) {
                Ok((guard, _)) => guard,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
    }

    fn open(self: &Arc<Self>, id: VolumeId) -> OpenHandle {
        *self.counts().entry(id).or_insert(0) += 1;
        OpenHandle {
            registry: Arc::clone(self),
            id,
        }
    }
}

/// Counts one connection while it lives.
struct OpenHandle {
    registry: Arc<OpenExports>,
    id: VolumeId,
}

impl Drop for OpenHandle {
    fn drop(&mut self) {
        let mut counts = self.registry.counts();
        if let Some(count) = counts.get_mut(&self.id) {
            *count -= 1;
            if *count == 0 {
                counts.remove(&self.id);
            }
        }
        drop(counts);
        self.registry.closed.notify_all();
    }
}

/// The exports of one pool.
pub struct PoolExports {
    pool: Arc<Pool>,
    open: Arc<OpenExports>,
    metrics: Arc<Metrics>,
    /// Which volumes are replicas of another host's: read-only here.
    replicas: Arc<arbor_replica::state::Store>,
    /// Each volume's rate limits.
    qos: Arc<crate::qos::Qos>,
    /// Volumes an instant restore fills: their requests go through it.
    restores: Arc<crate::restores::LiveRestores>,
    /// Small requests run on the connection's thread only while it is idle
    /// (no other request on the pool or received), not whenever they are
    /// small: with direct I/O each one waits for the device, and inline
    /// they would serialise a deep queue.
    inline_only_when_idle: bool,
}

impl PoolExports {
    pub fn new(
        pool: Arc<Pool>,
        open: Arc<OpenExports>,
        metrics: Arc<Metrics>,
        replicas: Arc<arbor_replica::state::Store>,
        qos: Arc<crate::qos::Qos>,
        cache_mode: arbor_io::CacheMode,
        restores: Arc<crate::restores::LiveRestores>,
    ) -> Self {
        Self {
            pool,
            open,
            metrics,
            replicas,
            qos,
            restores,
            inline_only_when_idle: cache_mode == arbor_io::CacheMode::Direct,
        }
    }
}

fn describe(info: &VolumeInfo) -> String {
    let kind = if info.snapshot { "snapshot" } else { "volume" };
    format!("arbor {kind}, {}", ByteSize(info.size))
}

impl ExportProvider for PoolExports {
    fn list(&self) -> Vec<ExportListing> {
        match self.pool.list() {
            Ok(all) => all
                .iter()
                .map(|info| ExportListing {
                    name: info.name.clone(),
                    description: describe(info),
                })
                .collect(),
            Err(e) => {
                warn!(error = %e, "cannot list volumes for an NBD client");
                Vec::new()
            }
        }
    }

    fn open(&self, name: &str) -> Result<Arc<dyn Export>, ExportError> {
        let id = self.pool.lookup(name).map_err(|e| match e {
            // Includes the empty "default export" name: there is none.
            Error::Refused(Refusal::NotFound(_)) | Error::Refused(Refusal::InvalidName { .. }) => {
                ExportError::NotFound
            }
            other => export_error(other),
        })?;
        let info = self.pool.info(id).map_err(export_error)?;
        if self.restores.is_making(&info.name) {
            return Err(ExportError::Io(format!(
                "{} is being made by a restore: try again",
                info.name
            )));
        }
        if info
            .key_slot
            .is_some_and(|slot| !self.pool.key_loaded(slot))
        {
            // A locked volume is listed, not served (docs/SECURITY.md).
            return Err(ExportError::Invalid(format!(
                "{} is encrypted and locked: load its key first (arbor key load {})",
                info.name, info.name
            )));
        }
        if info.snapshot && !info.durable {
            // Its contents are not durable yet (taken with deferred
            // durability, or logged: a power cut takes it again as of the
            // last commit, docs/FORMAT.md §6.4.2). A client must never
            // read what a power cut could change or lose under it, so the
            // pool commits first.
            self.pool.flush().map_err(export_error)?;
        }
        let volume = info
            .name
            .split_once('@')
            .map_or(info.name.as_str(), |(volume, _)| volume)
            .to_owned();
        // A replica reads as its newest received snapshot and moves to the
        // next one when it arrives (each read sees one or the other, whole).
        let read_only = info.snapshot || self.replicas.role(&volume).is_some();
        // An encrypted volume takes whole data units.
        let min_block = self
            .pool
            .data_unit(id)
            .map_err(export_error)?
            .unwrap_or(arbor_nbd::proto::MIN_BLOCK_SIZE);
        Ok(Arc::new(VolumeExport {
            min_block,
            pool: Arc::clone(&self.pool),
            id,
            volume,
            description: describe(&info),
            size: info.size,
            read_only,
            // A volume's layout never changes: an origin stays one, and a
            // volume reading through one reads through it until destroyed.
            in_pool: info.layout == VolumeLayout::Row,
            inline_only_when_idle: self.inline_only_when_idle,
            copies_on_write: matches!(
                info.layout,
                VolumeLayout::CowExternal { .. } | VolumeLayout::CowInPool { .. }
            ),
            origin_logged: AtomicBool::new(false),
            io: self.metrics.volume_io(&info.name),
            limiter: self.qos.limiter(id),
            restoring: self.restores.get(id),
            restore_logged: AtomicBool::new(false),
            _open: self.open.open(id),
        }))
    }
}

/// One volume or snapshot as seen by one connection.
struct VolumeExport {
    pool: Arc<Pool>,
    /// The smallest request it takes: an encrypted volume's data unit.
    min_block: u32,
    id: VolumeId,
    /// The volume this export is (or, for a snapshot, was taken of), as
    /// named when the connection opened: whose snapshots its changed-block
    /// contexts list.
    volume: String,
    description: String,
    /// The size when the connection opened (NBD cannot announce a change).
    size: u64,
    read_only: bool,
    /// Redirect-on-write in the pool (`VolumeLayout::Row`). An origin, and
    /// a volume that reads through one, cannot unmap: their trims are
    /// no-ops and their zeroing writes zeros (see `trim`).
    in_pool: bool,
    /// See [`PoolExports::inline_only_when_idle`].
    inline_only_when_idle: bool,
    /// A copy-on-write volume: while it has snapshots, a write may first
    /// copy what they read and commit (`Pool::writes_may_copy`).
    copies_on_write: bool,
    /// An origin's device error was logged for this connection: NBD
    /// carries only EIO to most clients, so the reason goes to the log,
    /// once per connection (a guest retries, and would flood it).
    origin_logged: AtomicBool,
    io: VolumeIo,
    /// The volume's rate limits, shared by its connections.
    limiter: Arc<arbor_nbd::qos::Limiter>,
    /// The instant restore filling the volume: every request goes through
    /// it (a read fetches what has not arrived) until it is complete.
    restoring: Option<Arc<crate::restores::Slot>>,
    /// A restore's failure was logged for this connection (as
    /// `origin_logged`).
    restore_logged: AtomicBool,
    _open: OpenHandle,
}

/// What a request of a volume an instant restore fills goes to.
enum Route<'a> {
    Pool,
    Restore(&'a arbor_backup::LiveRestore),
}

impl VolumeExport {
    /// What the client gets for a failed request, logging why when an
    /// origin's device is the cause.
    fn fail(&self, e: Error) -> ExportError {
        if let Error::Refused(Refusal::Origin(why)) = &e {
            if !self.origin_logged.swap(true, Ordering::Relaxed) {
                warn!(
                    volume = %self.volume,
                    "NBD I/O fails with EIO (logged once per connection): copy-on-write \
                     volume {why}"
                );
            }
        }
        export_error(e)
    }

    /// Where a request goes: the pool, or the restore filling the volume.
    /// Before a restore taken up after a restart runs, requests fail: the
    /// volume's holes are not zeros.
    fn route(&self) -> Result<Route<'_>, ExportError> {
        let Some(slot) = &self.restoring else {
            return Ok(Route::Pool);
        };
        match slot.live() {
            Some(live) if live.is_complete() => Ok(Route::Pool),
            Some(live) => Ok(Route::Restore(live)),
            None => Err(self.restore_failed(format!(
                "{} is being restored, {}",
                self.volume,
                slot.note().unwrap_or_default()
            ))),
        }
    }

    /// What the client gets for a request the restore failed.
    fn restore_error(&self, e: arbor_backup::BackupError) -> ExportError {
        match e {
            arbor_backup::BackupError::Engine(e) => self.fail(e),
            other => self.restore_failed(arbor_backup::error_chain(&other)),
        }
    }

    fn restore_failed(&self, why: String) -> ExportError {
        if !self.restore_logged.swap(true, Ordering::Relaxed) {
            warn!(volume = %self.volume, "NBD I/O fails with EIO (logged once per connection): {why}");
        }
        ExportError::Io(why)
    }
}

/// What an NBD client can make of an engine error.
fn export_error(e: Error) -> ExportError {
    match e {
        Error::Refused(Refusal::ReadOnly(_)) => ExportError::ReadOnly,
        Error::Exhausted(Resource::DataSpace | Resource::Metadata) => ExportError::NoSpace,
        Error::Refused(Refusal::Invalid(why)) => ExportError::Invalid(why.to_string()),
        // Lookups by id fail only once the volume has been deleted.
        Error::Refused(Refusal::NotFound(_)) => ExportError::Gone,
        other => ExportError::Io(other.to_string()),
    }
}

/// The metadata context namespace of changed blocks: `x-arbor:changed:SNAP`
/// reports, as bit 0 of each extent's flags, the ranges where the export
/// differs from snapshot SNAP (written or discarded since, or, for a
/// snapshot export, differing from it). It comes from the persistent
/// mapping trees (the same walk as `arbor diff`, over the request's window
/// only), so no crash loses it.
const CHANGED_PREFIX: &str = "x-arbor:changed:";
/// The flag of a changed range.
const CHANGED: u32 = 1;

fn status_run(run: &MapRun) -> StatusRun {
    StatusRun {
        length: run.len,
        hole: !run.mapped,
        zero: !run.mapped,
    }
}

impl Export for VolumeExport {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    fn admit(&self, kind: arbor_nbd::qos::IoKind, bytes: u64) -> Duration {
        self.limiter.admit(kind, bytes, Instant::now())
    }

    fn description(&self) -> String {
        self.description.clone()
    }

    fn min_block_size(&self) -> u32 {
        self.min_block
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), ExportError> {
        let len = buf.len() as u64;
        self.io.record(IoOp::Read, len, || match self.route()? {
            Route::Pool => self
                .pool
                .read(self.id, offset, buf)
                .map_err(|e| self.fail(e)),
            Route::Restore(live) => live.read(offset, buf).map_err(|e| self.restore_error(e)),
        })
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), ExportError> {
        self.io
            .record(IoOp::Write, data.len() as u64, || match self.route()? {
                Route::Pool => self
                    .pool
                    .write(self.id, offset, data)
                    .map_err(|e| self.fail(e)),
                Route::Restore(live) => live.write(offset, data).map_err(|e| self.restore_error(e)),
            })
    }

    fn write_in_place(&self, offset: u64, data: &mut [u8]) -> Result<(), ExportError> {
        let len = data.len() as u64;
        self.io.record(IoOp::Write, len, || match self.route()? {
            // An encrypted volume's data is encrypted in the request's
            // own buffer.
            Route::Pool => self
                .pool
                .write_mut(self.id, offset, data)
                .map_err(|e| self.fail(e)),
            Route::Restore(live) => live.write(offset, data).map_err(|e| self.restore_error(e)),
        })
    }

    fn flush(&self) -> Result<(), ExportError> {
        // A pool-wide commit (covers writes from every connection), and the
        // volume's own device if it is an origin: another origin's failing
        // device does not fail this flush.
        self.io.record(IoOp::Flush, 0, || {
            self.pool.flush_volume(self.id).map_err(|e| self.fail(e))
        })
    }

    /// Trim is advisory. An origin's device keeps every chunk, and a
    /// volume reading through an origin reads the origin's point in time
    /// where it maps nothing, so neither can unmap: the engine would write
    /// zeros instead, and a guest's `fstrim` would then fill the pool (or
    /// the device) with them. So theirs succeed doing nothing.
    fn trim(&self, offset: u64, len: u64) -> Result<(), ExportError> {
        self.io.record(IoOp::Trim, len, || {
            if !self.in_pool {
                return Ok(());
            }
            match self.route()? {
                Route::Pool => self
                    .pool
                    .discard(self.id, offset, len)
                    .map_err(|e| self.fail(e)),
                Route::Restore(live) => live.trim(offset, len).map_err(|e| self.restore_error(e)),
            }
        })
    }

    fn write_zeroes(
        &self,
        offset: u64,
        len: u64,
        may_trim: bool,
        fast_only: bool,
    ) -> Result<(), ExportError> {
        // Unmapping is fast; keeping the allocation means writing zeros,
        // which is exactly what `fast_only` asks us not to do. Outside the
        // pool's own layout zeroing always writes zeros.
        if fast_only && (!may_trim || !self.in_pool) {
            return Err(ExportError::NotSupported);
        }
        self.io
            .record(IoOp::WriteZeroes, len, || match self.route()? {
                Route::Pool => self
                    .pool
                    .write_zeroes(self.id, offset, len, !may_trim)
                    .map_err(|e| self.fail(e)),
                // While it fills, zeros are written (kept allocated).
                Route::Restore(_) if fast_only => Err(ExportError::NotSupported),
                Route::Restore(live) => live
                    .write_zeroes(offset, len, may_trim)
                    .map_err(|e| self.restore_error(e)),
            })
    }

    // The engine never makes a read or write wait for another request (a
    // write that needs a commit runs it itself), and with buffered I/O small
    // ones are served from the page cache and the metadata cache.
    fn small_io_inline(&self) -> bool {
        // A volume a restore fills may fetch from the store: never on the
        // connection's thread.
        self.restoring
            .as_ref()
            .is_none_or(|slot| slot.is_complete())
    }

    fn inline_only_when_idle(&self, write: bool) -> bool {
        // A write that copies waits for a commit: a deep queue of them must
        // overlap, so that concurrent first writes share their commits.
        self.inline_only_when_idle
            || (write && self.copies_on_write && self.pool.writes_may_copy(self.id))
    }

    fn meta_contexts(&self, query: &str) -> Vec<String> {
        // Changed blocks are the engine's diff, which compares some pairs
        // of layouts only (`Pool::check_diff`).
        let comparable = |id| self.pool.check_diff(id, self.id).is_ok();
        if let Some(snapshot) = query.strip_prefix(CHANGED_PREFIX).filter(|s| !s.is_empty()) {
            // An exact name: any snapshot sharing history can be compared.
            return match self.pool.lookup(snapshot).and_then(|id| self.pool.info(id)) {
                Ok(info) if info.snapshot && comparable(info.id) => vec![query.to_owned()],
                _ => Vec::new(),
            };
        }
        // Wildcards list the snapshots of this export's volume.
        if !matches!(query, "" | "x-arbor:" | CHANGED_PREFIX) {
            return Vec::new();
        }
        let prefix = format!("{}@", self.volume);
        match self.pool.list() {
            Ok(all) => all
                .into_iter()
                .filter(|v| v.snapshot && v.name.starts_with(&prefix) && comparable(v.id))
                .map(|v| format!("{CHANGED_PREFIX}{}", v.name))
                .collect(),
            Err(_) => Vec::new(),
        }
    }

    fn context_status(
        &self,
        context: &str,
        offset: u64,
        len: u64,
    ) -> Result<Vec<(u64, u32)>, ExportError> {
        let snapshot = context
            .strip_prefix(CHANGED_PREFIX)
            .ok_or(ExportError::NotSupported)?;
        let len = len.min(STATUS_WINDOW);
        let end = offset.saturating_add(len);
        let since = self
            .pool
            .lookup(snapshot)
            .map_err(|_| ExportError::Invalid(format!("snapshot {snapshot} no longer exists")))?;
        let ranges = self.io.record(IoOp::BlockStatus, len, || {
            // Only the window asked about is walked.
            self.pool
                .diff_in(since, self.id, offset, end)
                .map_err(export_error)
        })?;
        let mut runs = Vec::new();
        let mut at = offset;
        for (start, length) in ranges {
            let (lo, hi) = (start.max(at), start.saturating_add(length).min(end));
            if lo >= hi {
                if start >= end {
                    break;
                }
                continue;
            }
            if lo > at {
                runs.push((lo - at, 0));
            }
            runs.push((hi - lo, CHANGED));
            at = hi;
        }
        if at < end {
            runs.push((end - at, 0));
        }
        Ok(runs)
    }

    fn block_status(&self, offset: u64, len: u64) -> Result<Vec<StatusRun>, ExportError> {
        let len = len.min(STATUS_WINDOW);
        if !matches!(self.route()?, Route::Pool) {
            // Holes may be blocks not arrived yet: all of it is data.
            return Ok(vec![StatusRun {
                length: len,
                hole: false,
                zero: false,
            }]);
        }
        let runs = self.io.record(IoOp::BlockStatus, len, || {
            self.pool
                .allocation_map(self.id, offset, len)
                .map_err(export_error)
        })?;
        Ok(runs.iter().map(status_run).collect())
    }
}

#[cfg(test)]
mod tests {
    use arbor_engine::{CreateOptions, OpenOptions};
    use arbor_io::SimDisk;

    use super::*;

    const MIB: u64 = 1 << 20;

    fn exports() -> PoolExports {
        let disk = Arc::new(SimDisk::new(128 * MIB));
        let pool = Pool::create(disk, &CreateOptions::default(), &OpenOptions::default()).unwrap();
        // A state file that is never written (no replica roles).
        let state = std::env::temp_dir().join("arbor-nbd-export-test-no-state.json");
        let replicas = Arc::new(arbor_replica::state::Store::open(&state).unwrap());
        let pool = Arc::new(pool);
        PoolExports::new(
            Arc::clone(&pool),
            Arc::default(),
            Metrics::new(),
            replicas,
            crate::qos::Qos::new(pool),
            arbor_io::CacheMode::Buffered,
            Arc::default(),
        )
    }

    fn open(exports: &PoolExports, name: &str) -> Arc<dyn Export> {
        exports
            .open(name)
            .unwrap_or_else(|e| panic!("open {name}: {e}"))
    }

    #[test]
    fn volumes_are_writable_and_snapshots_read_only() {
        let exports = exports();
        exports.pool.create_volume("vm", 4 * MIB).unwrap();
        let vm = open(&exports, "vm");
        assert_eq!((vm.size(), vm.read_only()), (4 * MIB, false));
        vm.write(MIB, &[7u8; 4096]).unwrap();
        vm.flush().unwrap();

        exports.pool.snapshot("vm@s").unwrap();
        let snap = open(&exports, "vm@s");
        assert!(snap.read_only());
        let mut buf = vec![0u8; 4096];
        snap.read(MIB, &mut buf).unwrap();
        assert_eq!(buf, vec![7u8; 4096]);

        let names: Vec<String> = exports.list().into_iter().map(|e| e.name).collect();
        assert_eq!(names, ["vm", "vm@s"]);
        assert_eq!(exports.open("").err(), Some(ExportError::NotFound));
        assert_eq!(exports.open("ghost").err(), Some(ExportError::NotFound));
    }

    /// A snapshot whose contents are not durable yet (logged, or deferred)
    /// is committed before it is served.
    #[test]
    fn a_snapshot_not_yet_durable_is_committed_before_it_is_served() {
        let exports = exports();
        let vm = exports.pool.create_volume("vm", 4 * MIB).unwrap();
        exports.pool.write(vm, 0, &[1u8; 4096]).unwrap();
        exports.pool.flush().unwrap();
        exports.pool.write(vm, 0, &[2u8; 4096]).unwrap();
        let logged = exports.pool.snapshot("vm@logged").unwrap();
        assert_eq!(exports.pool.pool_stats().unwrap().logged_snapshots, 1);
        assert!(!exports.pool.info(logged).unwrap().durable);
        open(&exports, "vm@logged");
        assert!(exports.pool.info(logged).unwrap().durable);
        let deferred = exports
            .pool
            .snapshot_with("vm@deferred", arbor_engine::Durability::Deferred)
            .unwrap();
        open(&exports, "vm@deferred");
        assert!(exports.pool.info(deferred).unwrap().durable);
    }

    /// `x-arbor:changed:SNAP`: listed for the volume's snapshots, selected
    /// by exact name for any snapshot, and reporting written and discarded
    /// ranges as bit 0.
    #[test]
    fn the_changed_context_reports_writes_and_discards_since_a_snapshot() {
        let exports = exports();
        let v = exports.pool.create_volume("vm", 4 * MIB).unwrap();
        exports.pool.write(v, 0, &vec![7u8; MIB as usize]).unwrap();
        exports.pool.snapshot("vm@a").unwrap();
        exports.pool.create_volume("other", MIB).unwrap();
        exports.pool.snapshot("other@x").unwrap();
        let vm = open(&exports, "vm");
        let chunk = exports.pool.chunk_size();
        vm.write(2 * MIB, &vec![1u8; chunk as usize]).unwrap();
        vm.trim(0, chunk).unwrap();
        assert_eq!(vm.meta_contexts(""), ["x-arbor:changed:vm@a"]);
        assert_eq!(vm.meta_contexts("x-arbor:"), ["x-arbor:changed:vm@a"]);
        assert!(vm.meta_contexts("qemu:dirty-bitmap:").is_empty());
        assert_eq!(
            vm.meta_contexts("x-arbor:changed:other@x"),
            ["x-arbor:changed:other@x"]
        );
        assert!(vm.meta_contexts("x-arbor:changed:nope@x").is_empty());
        assert!(
            vm.meta_contexts("x-arbor:changed:other").is_empty(),
            "not a snapshot"
        );
        let runs = vm
            .context_status("x-arbor:changed:vm@a", 0, 4 * MIB)
            .unwrap();
        assert_eq!(
            runs,
            [
                (chunk, 1),
                (2 * MIB - chunk, 0),
                (chunk, 1),
                (2 * MIB - chunk, 0)
            ]
        );
        // A window inside the range.
        let runs = vm
            .context_status("x-arbor:changed:vm@a", MIB, MIB + 512)
            .unwrap();
        assert_eq!(runs, [(MIB, 0), (512, 1)]);
        exports.pool.delete("vm@a").unwrap();
        assert!(matches!(
            vm.context_status("x-arbor:changed:vm@a", 0, MIB),
            Err(ExportError::Invalid(_))
        ));
    }

    #[test]
    fn block_status_reports_holes_and_data() {
        let exports = exports();
        exports.pool.create_volume("vm", 4 * MIB).unwrap();
        let vm = open(&exports, "vm");
        let chunk = exports.pool.chunk_size();
        vm.write(chunk, &vec![1u8; chunk as usize]).unwrap();
        let runs = vm.block_status(0, 4 * MIB).unwrap();
        let hole = |length| StatusRun {
            length,
            hole: true,
            zero: true,
        };
        let data = StatusRun {
            length: chunk,
            hole: false,
            zero: false,
        };
        assert_eq!(runs, [hole(chunk), data, hole(4 * MIB - 2 * chunk)]);
    }

    #[test]
    fn write_zeroes_is_fast_only_when_it_may_unmap() {
        let exports = exports();
        exports.pool.create_volume("vm", 4 * MIB).unwrap();
        let vm = open(&exports, "vm");
        vm.write(0, &vec![1u8; MIB as usize]).unwrap();
        assert_eq!(
            vm.write_zeroes(0, MIB, false, true),
            Err(ExportError::NotSupported)
        );
        vm.write_zeroes(0, MIB, true, true).unwrap();
        let mut buf = vec![1u8; MIB as usize];
        vm.read(0, &mut buf).unwrap();
        assert!(buf.iter().all(|&b| b == 0));
        assert_eq!(
            exports
                .pool
                .info(exports.pool.lookup("vm").unwrap())
                .unwrap()
                .mapped_bytes,
            0
        );
    }

    /// An origin and the volumes reading through it cannot unmap: a trim
    /// leaves their data (and the pool's space) as it was, a fast zero is
    /// refused, an ordinary zeroing writes zeros. Their changed-block
    /// contexts compare them with the origin's snapshots (the diff finds
    /// those in the store), and an ordinary volume's do not offer them.
    #[test]
    fn trims_of_origins_and_what_reads_through_them_change_nothing() {
        let exports = exports();
        let image: Vec<u8> = (0..4 * MIB).map(|i| (i / 4096) as u8 | 1).collect();
        let device = SimDisk::from_image(image.clone());
        let identity = arbor_engine::DeviceIdentity { dev: 1, ino: 2 };
        exports
            .pool
            .attach_origin("disk", Arc::new(device.clone()), identity)
            .unwrap();
        exports.pool.snapshot("disk@s").unwrap();
        exports.pool.clone_snapshot("disk@s", "c").unwrap();
        let chunk = exports.pool.chunk_size() as usize;
        for name in ["disk", "c"] {
            let export = open(&exports, name);
            let used = exports.pool.pool_stats().unwrap().data_used_bytes;
            export.trim(0, 2 * MIB).unwrap();
            let mut buf = vec![0u8; 2 * MIB as usize];
            export.read(0, &mut buf).unwrap();
            assert_eq!(buf, image[..2 * MIB as usize], "{name} after a trim");
            assert_eq!(exports.pool.pool_stats().unwrap().data_used_bytes, used);
            assert_eq!(
                export.write_zeroes(0, chunk as u64, true, true),
                Err(ExportError::NotSupported)
            );
            export.write_zeroes(0, chunk as u64, true, false).unwrap();
            export.read(0, &mut buf[..chunk]).unwrap();
            assert!(buf[..chunk].iter().all(|&b| b == 0), "{name} zeroed");
            let changed = "x-arbor:changed:disk@s".to_owned();
            assert_eq!(
                export.meta_contexts(&changed),
                std::slice::from_ref(&changed)
            );
            let listed = if name == "disk" {
                vec![changed.clone()]
            } else {
                vec![]
            };
            assert_eq!(export.meta_contexts(""), listed, "{name}");
            // The zeroed chunk is all that changed since the snapshot.
            assert_eq!(
                export.context_status(&changed, 0, 4 * MIB).unwrap(),
                [(chunk as u64, CHANGED), (4 * MIB - chunk as u64, 0)],
                "{name}"
            );
        }
        exports.pool.create_volume("plain", 4 * MIB).unwrap();
        let plain = open(&exports, "plain");
        assert!(plain.meta_contexts("x-arbor:changed:disk@s").is_empty());
        assert_eq!(
            &device.handle().visible_image()[..chunk],
            &vec![0u8; chunk][..]
        );
        let snap = open(&exports, "disk@s");
        let mut buf = vec![0u8; chunk];
        snap.read(0, &mut buf).unwrap();
        assert_eq!(buf, image[..chunk], "the snapshot keeps its point in time");
    }

    #[test]
    fn deleted_and_shrunk_volumes_fail_cleanly() {
        let exports = exports();
        exports.pool.create_volume("vm", 4 * MIB).unwrap();
        let vm = open(&exports, "vm");
        exports.pool.resize("vm", MIB).unwrap();
        let mut buf = vec![0u8; 4096];
        assert!(matches!(
            vm.read(2 * MIB, &mut buf),
            Err(ExportError::Invalid(_))
        ));
        assert_eq!(exports.open.count(exports.pool.lookup("vm").unwrap()), 1);
        exports.pool.delete("vm").unwrap();
        // A new volume taking the name is not the one this connection opened.
        exports.pool.create_volume("vm", 4 * MIB).unwrap();
        assert_eq!(vm.read(0, &mut buf), Err(ExportError::Gone));
        assert_eq!(vm.write(0, &buf), Err(ExportError::Gone));
    }

    #[test]
    fn open_connections_are_counted_until_dropped() {
        let exports = exports();
        let id = exports.pool.create_volume("vm", 4 * MIB).unwrap();
        let first = open(&exports, "vm");
        let second = open(&exports, "vm");
        assert_eq!(exports.open.count(id), 2);
        drop(first);
        assert_eq!(exports.open.count(id), 1);
        drop(second);
        assert_eq!(exports.open.count(id), 0);
        assert!(exports.open.counts().is_empty());
    }

    /// Regression (CI of stop 37): `qemu-io` exited and `destroy` ran
    /// before the daemon had read the end of its connection, so the volume
    /// was refused as open. `settled` waits for a connection that closes.
    #[test]
    fn a_closing_connection_is_waited_for_and_an_open_one_is_counted() {
        let exports = exports();
        let id = exports.pool.create_volume("vm", 4 * MIB).unwrap();
        assert_eq!(exports.open.settled(id, Duration::from_secs(3600)), 0);
        let closing = open(&exports, "vm");
        let held = open(&exports, "vm");
        // An open one stays counted once the grace is over.
        assert_eq!(exports.open.settled(id, Duration::ZERO), 2);
        let closer = std::thread::spawn(move || drop(closing));
        drop(held);
        // Both close: the wait ends when the last does, whichever thread
        // drops it, long before an hour.
        assert_eq!(exports.open.settled(id, Duration::from_secs(3600)), 0);
        closer.join().unwrap();
        let kept = open(&exports, "vm");
        assert_eq!(exports.open.settled(id, Duration::from_millis(1)), 1);
        drop(kept);
    }
}
