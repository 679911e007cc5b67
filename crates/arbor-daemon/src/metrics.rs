//! Prometheus metrics served at `/metrics` (names and labels in docs/API.md).
//!
//! I/O metrics are recorded as requests complete, through handles each NBD
//! connection resolves once (no allocation or map lookup per request).
//! Space and volume gauges are refreshed from the pool on every scrape, so
//! they cannot drift from what `arbor pool status` reports.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::error::Result;
use arbor_engine::{ChunkWrites, Pool, PoolStats, VolumeId, VolumeLayout};
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};

use crate::space::SpaceWatch;

#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
pub enum IoOp {
    Read,
    Write,
    Flush,
    Trim,
    WriteZeroes,
    BlockStatus,
}

impl EncodeLabelValue for IoOp {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        use std::fmt::Write;
        encoder.write_str(match self {
            IoOp::Read => "read",
            IoOp::Write => "write",
            IoOp::Flush => "flush",
            IoOp::Trim => "trim",
            IoOp::WriteZeroes => "write_zeroes",
            IoOp::BlockStatus => "block_status",
        })
    }
}

const IO_OPS: [IoOp; 6] = [
    IoOp::Read,
    IoOp::Write,
    IoOp::Flush,
    IoOp::Trim,
    IoOp::WriteZeroes,
    IoOp::BlockStatus,
];

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct IoLabels {
    volume: String,
    op: IoOp,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VolumeLabels {
    volume: String,
    kind: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NameLabels {
    volume: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LimitLabels {
    volume: String,
    /// `iops`, `read_iops`, `write_iops`, `bandwidth`, `read_bandwidth`,
    /// `write_bandwidth`.
    limit: &'static str,
}

/// A volume's rate limits and what they held back, for [`Metrics::render`]:
/// (its name, its limits, requests delayed, seconds they waited in all).
pub type QosReport = Vec<(String, Option<arbor_api::model::QosView>, u64, f64)>;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PairLabels {
    volume: String,
    target: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BackupJobLabels {
    repository: String,
    kind: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BackupVolumeLabels {
    repository: String,
    volume: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BackupRunningLabels {
    repository: String,
    kind: String,
    subject: String,
}

/// What the backup metrics show, for [`Metrics::set_backups`].
pub struct BackupReport {
    pub running: Vec<arbor_api::model::BackupJobView>,
    pub totals: Vec<(String, &'static str, crate::backup_jobs::Totals)>,
    /// (repository, volume, when its newest backup completed).
    pub last_success: Vec<(String, String, u64)>,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AlertLabels {
    kind: String,
    subject: String,
    severity: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SeverityLabels {
    severity: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SpaceLabels {
    space: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PlanLabels {
    plan: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: &'static str,
}

/// Latency buckets from 4 µs to about 4 s, doubling.
#[derive(Clone, Copy)]
struct LatencyBuckets;

impl MetricConstructor<Histogram> for LatencyBuckets {
    fn new_metric(&self) -> Histogram {
        latency_histogram()
    }
}

/// The latency buckets' count (the last is +Inf).
pub const LATENCY_BUCKETS: usize = 22;
const LATENCY_FIRST: f64 = 4e-6;

fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(
        LATENCY_FIRST,
        2.0,
        LATENCY_BUCKETS as u16 - 1,
    ))
}

/// The upper bound of latency bucket `i` in seconds (+Inf for the last).
pub fn latency_bound(i: usize) -> f64 {
    if i + 1 >= LATENCY_BUCKETS {
        f64::INFINITY
    } else {
        LATENCY_FIRST * 2f64.powi(i as i32)
    }
}

/// Pool-wide NBD I/O since the daemon started, for the dashboard's history
/// (`history.rs`): requests and bytes by direction (reads; writes, write
/// zeroes and trims), and the engine's time per request (every operation)
/// in the histogram's buckets.
#[derive(Default)]
pub struct IoTotals {
    read_requests: AtomicU64,
    write_requests: AtomicU64,
    read_bytes: AtomicU64,
    write_bytes: AtomicU64,
    latency: [AtomicU64; LATENCY_BUCKETS],
}

/// [`IoTotals`] at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IoTotalsNow {
    pub read_requests: u64,
    pub write_requests: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub latency: [u64; LATENCY_BUCKETS],
}

impl IoTotalsNow {
    fn add(&mut self, other: &IoTotalsNow) {
        self.read_requests += other.read_requests;
        self.write_requests += other.write_requests;
        self.read_bytes += other.read_bytes;
        self.write_bytes += other.write_bytes;
        for (bucket, n) in self.latency.iter_mut().zip(other.latency) {
            *bucket += n;
        }
    }
}

impl IoTotals {
    fn add(&self, op: IoOp, bytes: u64, took: Duration) {
        let (requests, moved) = match op {
            IoOp::Read => (&self.read_requests, &self.read_bytes),
            IoOp::Write | IoOp::WriteZeroes | IoOp::Trim => {
                (&self.write_requests, &self.write_bytes)
            }
            IoOp::Flush | IoOp::BlockStatus => {
                self.count_latency(took);
                return;
            }
        };
        requests.fetch_add(1, Ordering::Relaxed);
        moved.fetch_add(bytes, Ordering::Relaxed);
        self.count_latency(took);
    }

    fn count_latency(&self, took: Duration) {
        let secs = took.as_secs_f64();
        let bucket = (0..LATENCY_BUCKETS)
            .find(|&i| secs <= latency_bound(i))
            .unwrap_or(LATENCY_BUCKETS - 1);
        self.latency[bucket].fetch_add(1, Ordering::Relaxed);
    }

    /// Adds `other` (the totals of a volume forgotten) to these.
    fn absorb(&self, other: &IoTotalsNow) {
        self.read_requests
            .fetch_add(other.read_requests, Ordering::Relaxed);
        self.write_requests
            .fetch_add(other.write_requests, Ordering::Relaxed);
        self.read_bytes
            .fetch_add(other.read_bytes, Ordering::Relaxed);
        self.write_bytes
            .fetch_add(other.write_bytes, Ordering::Relaxed);
        for (bucket, n) in self.latency.iter().zip(other.latency) {
            bucket.fetch_add(n, Ordering::Relaxed);
        }
    }

    pub fn now(&self) -> IoTotalsNow {
        IoTotalsNow {
            read_requests: self.read_requests.load(Ordering::Relaxed),
            write_requests: self.write_requests.load(Ordering::Relaxed),
            read_bytes: self.read_bytes.load(Ordering::Relaxed),
            write_bytes: self.write_bytes.load(Ordering::Relaxed),
            latency: std::array::from_fn(|i| self.latency[i].load(Ordering::Relaxed)),
        }
    }
}

/// Every metric the daemon exports.
pub struct Metrics {
    registry: Registry,
    /// Each volume's I/O totals, for the history (per volume, as its
    /// counters are, so that connections to different volumes share no
    /// cache line), and those of volumes forgotten since.
    totals: Mutex<std::collections::HashMap<String, Arc<IoTotals>>>,
    retired: IoTotals,
    io_requests: Family<IoLabels, Counter>,
    io_bytes: Family<IoLabels, Counter>,
    io_errors: Family<IoLabels, Counter>,
    io_seconds: Family<IoLabels, Histogram, LatencyBuckets>,
    commit_seconds: Histogram,
    reclaimed_nodes: Counter,
    chunk_writes: Family<PlanLabels, Counter>,
    /// The pool's counts at the last render: the counters advance by
    /// the difference (the pool counts from its open, the daemon's).
    /// (With the split writes', the intent log records' and the logged
    /// snapshots'.)
    counts_seen: Mutex<(ChunkWrites, u64, u64, u64)>,
    split_writes: Counter,
    intent_log_records: Counter,
    logged_snapshots: Counter,
    space_total: Family<SpaceLabels, Gauge>,
    space_used: Family<SpaceLabels, Gauge>,
    space_warning: Gauge,
    reclaim_pending: Gauge,
    fill_pending: Gauge,
    volume_count: Family<KindLabels, Gauge>,
    volume_size: Family<VolumeLabels, Gauge>,
    volume_mapped: Family<VolumeLabels, Gauge>,
    volume_connections: Family<VolumeLabels, Gauge>,
    cow_store: Family<NameLabels, Gauge>,
    qos_limit: Family<LimitLabels, Gauge>,
    qos_delayed: Family<NameLabels, Counter>,
    qos_delay_seconds: Family<NameLabels, Counter<f64, std::sync::atomic::AtomicU64>>,
    /// What the counters above were last advanced to, by volume name.
    qos_seen: Mutex<HashMap<String, (u64, f64)>>,
    origin_attached: Family<NameLabels, Gauge>,
    origin_rollback: Family<NameLabels, Gauge>,
    origin_failed: Family<NameLabels, Gauge>,
    damaged_blocks: Gauge,
    scrub_running: Gauge,
    scrub_progress: Gauge<f64, std::sync::atomic::AtomicU64>,
    scrub_read: Gauge,
    scrub_rate: Gauge,
    scrub_damaged: Gauge,
    scrub_sums_added: Gauge,
    new_home_unsummed: Gauge,
    damage_found: Counter,
    /// The pool's count of reads that found damage at the last scrape (the
    /// counter advances by the difference).
    damage_found_seen: Mutex<u64>,
    replica_recovery_point: Family<PairLabels, Gauge>,
    replica_sent: Family<PairLabels, Gauge>,
    replica_failed: Family<PairLabels, Gauge>,
    replica_cycles_ok: Family<PairLabels, Gauge>,
    replica_cycles_failed: Family<PairLabels, Gauge>,
    alert: Family<AlertLabels, Gauge>,
    alerts: Family<SeverityLabels, Gauge>,
    backup_succeeded: Family<BackupJobLabels, Gauge>,
    backup_failed: Family<BackupJobLabels, Gauge>,
    backup_store: Family<BackupJobLabels, Gauge>,
    backup_last_success: Family<BackupVolumeLabels, Gauge>,
    backup_progress: Family<BackupRunningLabels, Gauge<f64, AtomicU64>>,
}

impl Metrics {
    pub fn new() -> Arc<Self> {
        let mut registry = Registry::with_prefix("arbor");
        let m = Metrics {
            totals: Mutex::default(),
            retired: IoTotals::default(),
            io_requests: Family::default(),
            io_bytes: Family::default(),
            io_errors: Family::default(),
            io_seconds: Family::new_with_constructor(LatencyBuckets),
            commit_seconds: latency_histogram(),
            reclaimed_nodes: Counter::default(),
            chunk_writes: Family::default(),
            counts_seen: Mutex::default(),
            split_writes: Counter::default(),
            intent_log_records: Counter::default(),
            logged_snapshots: Counter::default(),
            space_total: Family::default(),
            space_used: Family::default(),
            space_warning: Gauge::default(),
            reclaim_pending: Gauge::default(),
            fill_pending: Gauge::default(),
            volume_count: Family::default(),
            volume_size: Family::default(),
            volume_mapped: Family::default(),
            volume_connections: Family::default(),
            cow_store: Family::default(),
            qos_limit: Family::default(),
            qos_delayed: Family::default(),
            qos_delay_seconds: Family::default(),
            qos_seen: Mutex::new(HashMap::new()),
            origin_attached: Family::default(),
            origin_rollback: Family::default(),
            origin_failed: Family::default(),
            damaged_blocks: Gauge::default(),
            scrub_running: Gauge::default(),
            scrub_progress: Gauge::default(),
            scrub_read: Gauge::default(),
            scrub_rate: Gauge::default(),
            scrub_damaged: Gauge::default(),
            scrub_sums_added: Gauge::default(),
            new_home_unsummed: Gauge::default(),
            damage_found: Counter::default(),
            damage_found_seen: Mutex::default(),
            replica_recovery_point: Family::default(),
            replica_sent: Family::default(),
            replica_failed: Family::default(),
            replica_cycles_ok: Family::default(),
            replica_cycles_failed: Family::default(),
            backup_succeeded: Family::default(),
            backup_failed: Family::default(),
            backup_store: Family::default(),
            backup_last_success: Family::default(),
            backup_progress: Family::default(),
            alert: Family::default(),
            alerts: Family::default(),
            registry: Registry::default(),
        };
        let r = &mut registry;
        r.register(
            "nbd_requests",
            "NBD requests completed, by volume and operation",
            m.io_requests.clone(),
        );
        r.register_with_unit(
            "nbd",
            "Bytes moved by NBD requests, by volume and operation",
            Unit::Bytes,
            m.io_bytes.clone(),
        );
        r.register(
            "nbd_errors",
            "NBD requests that failed, by volume and operation",
            m.io_errors.clone(),
        );
        r.register_with_unit(
            "nbd_request_duration",
            "Time the engine took per NBD request",
            Unit::Seconds,
            m.io_seconds.clone(),
        );
        r.register_with_unit(
            "commit_duration",
            "Device time of each pool commit (journal and home writes, flushes)",
            Unit::Seconds,
            m.commit_seconds.clone(),
        );
        r.register(
            "reclaimed_nodes",
            "Metadata nodes of destroyed volumes processed by reclaim",
            m.reclaimed_nodes.clone(),
        );
        r.register(
            "chunk_writes",
            "Chunks written, by how: in_place, extended (a partial extent's blocks), redirected, \
             redirected_copied (the rest of the old chunk read first), partial (a new partial \
             extent), partial_copied (an older partial's blocks read first), partial_over (a new \
             partial over an older one's chunk)",
            m.chunk_writes.clone(),
        );
        r.register(
            "split_writes",
            "Writes too big for one transaction's journal, run in pieces (atomic as a whole)",
            m.split_writes.clone(),
        );
        r.register(
            "intent_log_records",
            "Records appended to the pool's intent log: regions listed for writes in place \
             without a commit (docs/FORMAT.md 6.4.1), and snapshots (6.4.2)",
            m.intent_log_records.clone(),
        );
        r.register(
            "logged_snapshots",
            "Committed snapshots made durable by a record of the intent log instead of a \
             commit (docs/FORMAT.md 6.4.2)",
            m.logged_snapshots.clone(),
        );
        r.register_with_unit(
            "pool_capacity",
            "Pool space, data or metadata",
            Unit::Bytes,
            m.space_total.clone(),
        );
        r.register_with_unit(
            "pool_used",
            "Pool space in use, data or metadata",
            Unit::Bytes,
            m.space_used.clone(),
        );
        r.register(
            "pool_space_warning_percent",
            "Highest space warning threshold crossed (0: none)",
            m.space_warning.clone(),
        );
        r.register(
            "pool_reclaim_pending",
            "1 while destroyed volumes await reclaim",
            m.reclaim_pending.clone(),
        );
        r.register(
            "pool_fill_pending",
            "1 while a sweep for partial extents to fill has not finished",
            m.fill_pending.clone(),
        );
        r.register_with_unit(
            "replica_recovery_point",
            "Age of the target's copy of a replicated volume: since when it is known current",
            Unit::Seconds,
            m.replica_recovery_point.clone(),
        );
        r.register_with_unit(
            "replica_sent",
            "Bytes a replication pair has sent since the daemon started",
            Unit::Bytes,
            m.replica_sent.clone(),
        );
        r.register(
            "replica_failed",
            "1 while a replication pair's last cycle failed",
            m.replica_failed.clone(),
        );
        r.register(
            "replica_cycles_succeeded",
            "Replication cycles that succeeded since the daemon started",
            m.replica_cycles_ok.clone(),
        );
        r.register(
            "replica_cycles_failed",
            "Replication cycles that failed since the daemon started",
            m.replica_cycles_failed.clone(),
        );
        r.register(
            "backup_jobs_succeeded",
            "Backups, restores, verifies and prunes that succeeded since the daemon started, by repository and kind",
            m.backup_succeeded.clone(),
        );
        r.register(
            "backup_jobs_failed",
            "Backups, restores, verifies and prunes that failed since the daemon started, by repository and kind",
            m.backup_failed.clone(),
        );
        r.register_with_unit(
            "backup_store",
            "Bytes the backup jobs that ended since the daemon started sent to (backup, prune) or read from (restore, verify) their repository's store",
            Unit::Bytes,
            m.backup_store.clone(),
        );
        r.register_with_unit(
            "backup_last_success_timestamp",
            "When the newest backup of a volume from this host completed (Unix time), for the volumes backed up through this daemon or scheduled",
            Unit::Seconds,
            m.backup_last_success.clone(),
        );
        r.register(
            "backup_job_progress_ratio",
            "How far a backup job under way is, 0 to 1",
            m.backup_progress.clone(),
        );
        r.register(
            "alert",
            "1 for each active alert (docs/MONITOR.md)",
            m.alert.clone(),
        );
        r.register("alerts", "Active alerts by severity", m.alerts.clone());
        r.register(
            "pool_volumes",
            "Volumes and snapshots in the pool",
            m.volume_count.clone(),
        );
        r.register_with_unit(
            "volume_size",
            "Logical size of each volume and snapshot",
            Unit::Bytes,
            m.volume_size.clone(),
        );
        r.register_with_unit(
            "volume_mapped",
            "Bytes mapped by each volume and snapshot",
            Unit::Bytes,
            m.volume_mapped.clone(),
        );
        r.register(
            "volume_nbd_connections",
            "Open NBD connections to each volume and snapshot",
            m.volume_connections.clone(),
        );
        r.register_with_unit(
            "cow_store",
            "Bytes a copy-on-write volume's snapshot store holds: old data copied for its snapshots",
            Unit::Bytes,
            m.cow_store.clone(),
        );
        r.register(
            "volume_qos_limit",
            "A volume's rate limit, per second (operations, or bytes for the bandwidth limits)",
            m.qos_limit.clone(),
        );
        r.register(
            "volume_qos_delayed",
            "NBD requests a volume's rate limits held back",
            m.qos_delayed.clone(),
        );
        r.register_with_unit(
            "volume_qos_delay",
            "Time NBD requests waited for a volume's rate limits, in all",
            Unit::Seconds,
            m.qos_delay_seconds.clone(),
        );
        r.register(
            "origin_attached",
            "1 while an origin's device is attached; 0: its I/O fails until it is attached again",
            m.origin_attached.clone(),
        );
        r.register(
            "origin_rollback_pending",
            "1 while an origin's interrupted rollback waits to be finished",
            m.origin_rollback.clone(),
        );
        r.register(
            "origin_failed",
            "1 while an origin has failed (its device shrank) and serves no I/O until attached with --accept-damage",
            m.origin_failed.clone(),
        );
        r.register(
            "data_damaged_blocks",
            "Data blocks recorded damaged (they do not match their checksums; reads of them fail) and not rewritten or freed since",
            m.damaged_blocks.clone(),
        );
        r.register(
            "scrub_running",
            "1 while a scrub runs",
            m.scrub_running.clone(),
        );
        r.register(
            "scrub_progress_ratio",
            "How far the last or running scrub is through the pool's data chunks, 0 to 1",
            m.scrub_progress.clone(),
        );
        r.register_with_unit(
            "scrub_read",
            "Live data the last or running scrub has read",
            Unit::Bytes,
            m.scrub_read.clone(),
        );
        r.register(
            "scrub_rate_bytes_per_second",
            "The running scrub's read rate (smoothed); 0 when none runs",
            m.scrub_rate.clone(),
        );
        r.register(
            "scrub_damaged_blocks",
            "Data blocks the last or running scrub found damaged",
            m.scrub_damaged.clone(),
        );
        r.register(
            "scrub_sums_added_blocks",
            "Data blocks without a checksum (written before the upgrade to format version 10) that the last or running scrub gave one",
            m.scrub_sums_added.clone(),
        );
        r.register(
            "new_home_unsummed_bytes",
            "Bytes of homes built since the daemon started (copy-on-write volumes created, grown or moved in the pool, origins copied into it) whose blocks await their checksums",
            m.new_home_unsummed.clone(),
        );
        r.register(
            "data_damage_found",
            "Reads (and writes over part of a block) that found a data block not matching its checksum",
            m.damage_found.clone(),
        );
        Arc::new(Metrics { registry, ..m })
    }

    /// The I/O metric handles of one connection to `volume`.
    pub fn volume_io(&self, volume: &str) -> VolumeIo {
        let totals = Arc::clone(
            self.totals
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .entry(volume.to_owned())
                .or_default(),
        );
        let handles = IO_OPS.map(|op| {
            let labels = IoLabels {
                volume: volume.to_owned(),
                op,
            };
            OpMetrics {
                totals: Arc::clone(&totals),
                requests: self.io_requests.get_or_create_owned(&labels),
                bytes: self.io_bytes.get_or_create_owned(&labels),
                errors: self.io_errors.get_or_create_owned(&labels),
                seconds: self.io_seconds.get_or_create_owned(&labels),
            }
        });
        VolumeIo { handles }
    }

    /// Pool-wide NBD I/O since the daemon started.
    pub fn io_totals(&self) -> IoTotalsNow {
        // Under the lock: a volume being forgotten is counted once.
        let volumes = self.totals.lock().unwrap_or_else(|p| p.into_inner());
        let mut sum = self.retired.now();
        for totals in volumes.values() {
            sum.add(&totals.now());
        }
        sum
    }

    /// Drops a destroyed volume's I/O series (its totals stay counted).
    pub fn forget_volume(&self, volume: &str) {
        let mut volumes = self.totals.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(gone) = volumes.remove(volume) {
            self.retired.absorb(&gone.now());
        }
        drop(volumes);
        for op in IO_OPS {
            let labels = IoLabels {
                volume: volume.to_owned(),
                op,
            };
            self.io_requests.remove(&labels);
            self.io_bytes.remove(&labels);
            self.io_errors.remove(&labels);
            self.io_seconds.remove(&labels);
        }
    }

    pub fn observe_commit(&self, took: Duration) {
        self.commit_seconds.observe(took.as_secs_f64());
    }

    pub fn count_reclaimed(&self, nodes: u64) {
        self.reclaimed_nodes.inc_by(nodes);
    }

    /// The text exposition, with gauges refreshed from the pool;
    /// `connections` tells the open NBD connections to a volume (the export
    /// layer sits above this one and is not named here).
    pub fn render(
        &self,
        pool: &Pool,
        connections: &dyn Fn(VolumeId) -> usize,
        space: &SpaceWatch,
        scrub: &arbor_api::model::ScrubView,
        qos: QosReport,
    ) -> Result<String> {
        self.set_qos(qos);
        self.scrub_running.set(i64::from(scrub.state == "running"));
        self.scrub_progress.set(scrub.progress);
        self.scrub_read.set(gauge_value(scrub.bytes_read));
        self.scrub_rate.set(gauge_value(scrub.rate_bytes_per_sec));
        self.scrub_damaged.set(gauge_value(scrub.damaged_blocks));
        self.scrub_sums_added.set(gauge_value(scrub.sums_added));
        self.new_home_unsummed
            .set(gauge_value(scrub.new_home_bytes_unsummed));
        let stats = pool.pool_stats()?;
        let set = |family: &Family<SpaceLabels, Gauge>, space, value: u64| {
            family
                .get_or_create(&SpaceLabels { space })
                .set(gauge_value(value));
        };
        set(&self.space_total, "data", stats.data_bytes);
        set(&self.space_used, "data", stats.data_used_bytes);
        set(&self.space_total, "metadata", stats.metadata_bytes);
        set(&self.space_used, "metadata", stats.metadata_used_bytes);
        self.space_warning
            .set(i64::from(space.level(&stats).unwrap_or(0)));
        self.reclaim_pending.set(i64::from(stats.reclaim_pending));
        self.fill_pending.set(i64::from(stats.fill_pending));
        self.advance_counts(&stats);
        for (kind, count) in [("volume", stats.volumes), ("snapshot", stats.snapshots)] {
            self.volume_count
                .get_or_create(&KindLabels { kind })
                .set(gauge_value(count));
        }
        self.refresh_volumes(pool, connections)?;
        self.damaged_blocks.set(gauge_value(pool.damage_count()?));
        {
            let found = pool.damage_found();
            let mut seen = self
                .damage_found_seen
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            self.damage_found.inc_by(found.saturating_sub(*seen));
            *seen = found;
        }
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)
            .map_err(crate::error::DaemonError::internal)?;
        Ok(text)
    }

    /// Sets the rate limits' gauges and advances their counters.
    fn set_qos(&self, report: QosReport) {
        self.qos_limit.clear();
        let mut seen = self.qos_seen.lock().unwrap_or_else(|p| p.into_inner());
        for (volume, limits, delayed, seconds) in report {
            if let Some(q) = limits {
                for (limit, value) in [
                    ("iops", q.iops),
                    ("read_iops", q.read_iops),
                    ("write_iops", q.write_iops),
                    ("bandwidth", q.bandwidth),
                    ("read_bandwidth", q.read_bandwidth),
                    ("write_bandwidth", q.write_bandwidth),
                ] {
                    if let Some(v) = value {
                        self.qos_limit
                            .get_or_create(&LimitLabels {
                                volume: volume.clone(),
                                limit,
                            })
                            .set(gauge_value(v));
                    }
                }
            }
            let labels = NameLabels {
                volume: volume.clone(),
            };
            let (count_before, seconds_before) = seen.get(&volume).copied().unwrap_or_default();
            self.qos_delayed
                .get_or_create(&labels)
                .inc_by(delayed.saturating_sub(count_before));
            self.qos_delay_seconds
                .get_or_create(&labels)
                .inc_by((seconds - seconds_before).max(0.0));
            seen.insert(volume, (delayed, seconds));
        }
    }

    /// Advances the write counters to the pool's counts.
    fn advance_counts(&self, stats: &PoolStats) {
        // Plain numbers: a panic elsewhere cannot leave them half-updated.
        let mut seen = self.counts_seen.lock().unwrap_or_else(|p| p.into_inner());
        let (writes, split, logged, snapshots) = &mut *seen;
        for ((plan, now), (_, before)) in stats.chunk_writes.named().into_iter().zip(writes.named())
        {
            self.chunk_writes
                .get_or_create(&PlanLabels { plan })
                .inc_by(now.saturating_sub(before));
        }
        self.split_writes
            .inc_by(stats.split_units.saturating_sub(*split));
        self.intent_log_records
            .inc_by(stats.intent_log_records.saturating_sub(*logged));
        self.logged_snapshots
            .inc_by(stats.logged_snapshots.saturating_sub(*snapshots));
        *seen = (
            stats.chunk_writes,
            stats.split_units,
            stats.intent_log_records,
            stats.logged_snapshots,
        );
    }

    /// Sets the alert gauges to the active alerts.
    pub fn set_alerts(&self, active: &[arbor_api::model::AlertView]) {
        use arbor_api::model::Severity;
        self.alert.clear();
        let name = |s: Severity| match s {
            Severity::Warning => "warning",
            Severity::Critical => "critical",
        };
        for severity in [Severity::Warning, Severity::Critical] {
            let count = active.iter().filter(|a| a.severity == severity).count();
            self.alerts
                .get_or_create(&SeverityLabels {
                    severity: name(severity),
                })
                .set(gauge_value(count as u64));
        }
        for a in active {
            let kind = serde_json::to_value(a.kind)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default();
            self.alert
                .get_or_create(&AlertLabels {
                    kind,
                    subject: a.subject.clone(),
                    severity: name(a.severity),
                })
                .set(1);
        }
    }

    /// Refreshes the replication pairs' gauges from their status.
    /// Sets the backup jobs' gauges.
    pub fn set_backups(&self, report: BackupReport) {
        self.backup_progress.clear();
        for j in report.running {
            let ratio = if j.total_bytes > 0 {
                j.done_bytes.min(j.total_bytes) as f64 / j.total_bytes as f64
            } else {
                0.0
            };
            self.backup_progress
                .get_or_create(&BackupRunningLabels {
                    repository: j.repository,
                    kind: j.kind,
                    subject: j.subject,
                })
                .set(ratio);
        }
        for (repository, kind, t) in report.totals {
            let labels = BackupJobLabels { repository, kind };
            self.backup_succeeded
                .get_or_create(&labels)
                .set(gauge_value(t.succeeded));
            self.backup_failed
                .get_or_create(&labels)
                .set(gauge_value(t.failed));
            self.backup_store
                .get_or_create(&labels)
                .set(gauge_value(t.store_bytes));
        }
        self.backup_last_success.clear();
        for (repository, volume, at) in report.last_success {
            self.backup_last_success
                .get_or_create(&BackupVolumeLabels { repository, volume })
                .set(gauge_value(at));
        }
    }

    pub fn set_replication(&self, pairs: &[arbor_api::model::ReplicaPairView]) {
        let families = [
            &self.replica_recovery_point,
            &self.replica_sent,
            &self.replica_failed,
            &self.replica_cycles_ok,
            &self.replica_cycles_failed,
        ];
        for f in families {
            f.clear();
        }
        for p in pairs {
            let labels = PairLabels {
                volume: p.volume.clone(),
                target: p.target.clone(),
            };
            if let Some(rpo) = p.recovery_point_secs {
                self.replica_recovery_point
                    .get_or_create(&labels)
                    .set(gauge_value(rpo));
            }
            self.replica_sent
                .get_or_create(&labels)
                .set(gauge_value(p.bytes_sent_total));
            self.replica_failed
                .get_or_create(&labels)
                .set(i64::from(p.state == arbor_api::model::ReplicaState::Failed));
            self.replica_cycles_ok
                .get_or_create(&labels)
                .set(gauge_value(p.cycles_ok));
            self.replica_cycles_failed
                .get_or_create(&labels)
                .set(gauge_value(p.cycles_failed));
        }
    }

    fn refresh_volumes(&self, pool: &Pool, connections: &dyn Fn(VolumeId) -> usize) -> Result<()> {
        let volumes = pool.list()?;
        self.volume_size.clear();
        self.volume_mapped.clear();
        self.volume_connections.clear();
        self.cow_store.clear();
        for v in &volumes {
            if let VolumeLayout::CowExternal { store_bytes, .. }
            | VolumeLayout::CowInPool { store_bytes, .. } = v.layout
            {
                self.cow_store
                    .get_or_create(&NameLabels {
                        volume: v.name.clone(),
                    })
                    .set(gauge_value(store_bytes));
            }
        }
        self.origin_attached.clear();
        self.origin_rollback.clear();
        self.origin_failed.clear();
        for o in pool.origins()? {
            let labels = NameLabels { volume: o.name };
            self.origin_attached
                .get_or_create(&labels)
                .set(i64::from(o.attached));
            self.origin_rollback
                .get_or_create(&labels)
                .set(i64::from(o.rollback_epoch != 0));
            self.origin_failed
                .get_or_create(&labels)
                .set(i64::from(o.loss.is_some_and(|l| l.accepted_unix == 0)));
        }
        for v in volumes {
            let labels = VolumeLabels {
                kind: if v.snapshot { "snapshot" } else { "volume" },
                volume: v.name,
            };
            self.volume_size
                .get_or_create(&labels)
                .set(gauge_value(v.size));
            self.volume_mapped
                .get_or_create(&labels)
                .set(gauge_value(v.mapped_bytes));
            self.volume_connections
                .get_or_create(&labels)
                .set(gauge_value(connections(v.id) as u64));
        }
        Ok(())
    }
}

/// Gauges are i64; no pool is 8 EiB, but saturate rather than wrap.
fn gauge_value(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

#[derive(Clone)]
struct OpMetrics {
    totals: Arc<IoTotals>,
    requests: Counter,
    bytes: Counter,
    errors: Counter,
    seconds: Histogram,
}

/// One connection's I/O metrics, by operation.
#[derive(Clone)]
pub struct VolumeIo {
    handles: [OpMetrics; 6],
}

impl VolumeIo {
    /// Runs one request and records it: `bytes` moved (counted on success).
    pub fn record<T, E>(
        &self,
        op: IoOp,
        bytes: u64,
        request: impl FnOnce() -> Result<T, E>,
    ) -> Result<T, E> {
        // IO_OPS lists the variants in declaration order (tested below).
        let m = &self.handles[op as usize];
        let started = Instant::now();
        let result = request();
        let took = started.elapsed();
        m.seconds.observe(took.as_secs_f64());
        m.requests.inc();
        m.totals
            .add(op, if result.is_ok() { bytes } else { 0 }, took);
        match &result {
            Ok(_) => {
                m.bytes.inc_by(bytes);
            }
            Err(_) => {
                m.errors.inc();
            }
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_buckets_double_from_4_us_and_totals_count_by_direction() {
        assert_eq!(latency_bound(0), 4e-6);
        assert_eq!(latency_bound(1), 8e-6);
        assert!(latency_bound(LATENCY_BUCKETS - 2) > 4.0);
        assert!(latency_bound(LATENCY_BUCKETS - 1).is_infinite());
        let totals = IoTotals::default();
        totals.add(IoOp::Read, 4096, Duration::from_micros(3));
        totals.add(IoOp::Write, 512, Duration::from_micros(5));
        totals.add(IoOp::WriteZeroes, 1 << 20, Duration::from_millis(1));
        totals.add(IoOp::Flush, 0, Duration::from_secs(100));
        let now = totals.now();
        assert_eq!((now.read_requests, now.read_bytes), (1, 4096));
        assert_eq!((now.write_requests, now.write_bytes), (2, 512 + (1 << 20)));
        assert_eq!(now.latency[0], 1, "3 µs: the first bucket");
        assert_eq!(now.latency[1], 1, "5 µs: up to 8 µs");
        assert_eq!(now.latency[8], 1, "1 ms: up to 1.024 ms");
        assert_eq!(now.latency[LATENCY_BUCKETS - 1], 1, "100 s: +Inf");
    }

    /// The pool-wide totals are every volume's, a forgotten (destroyed)
    /// volume's included: they never go back.
    #[test]
    fn pool_totals_keep_what_forgotten_volumes_did() {
        let metrics = Metrics::new();
        let a = metrics.volume_io("a");
        let b = metrics.volume_io("b");
        let ok = |io: &VolumeIo, op, bytes| io.record(op, bytes, || Ok::<(), ()>(())).unwrap();
        ok(&a, IoOp::Read, 4096);
        ok(&b, IoOp::Write, 512);
        ok(&b, IoOp::Write, 512);
        let before = metrics.io_totals();
        assert_eq!((before.read_requests, before.write_requests), (1, 2));
        assert_eq!(before.write_bytes, 1024);
        metrics.forget_volume("b");
        assert_eq!(metrics.io_totals(), before);
        ok(&a, IoOp::Read, 4096);
        assert_eq!(metrics.io_totals().read_bytes, 8192);
        // A failed request counts, its bytes do not.
        let _ = a.record(IoOp::Write, 512, || Err::<(), ()>(()));
        let now = metrics.io_totals();
        assert_eq!((now.write_requests, now.write_bytes), (3, 1024));
    }

    #[test]
    fn io_ops_are_listed_in_declaration_order() {
        for (index, op) in IO_OPS.iter().enumerate() {
            assert_eq!(*op as usize, index);
        }
    }
}
