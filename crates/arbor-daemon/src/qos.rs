//! Per-volume rate limits (docs/CLI.md, `volume set`; docs/FORMAT.md
//! §6.5): kept in the pool as each volume's property `arbor.qos`, applied
//! to its NBD exports by an `arbor_nbd::qos::Limiter` that every
//! connection to the volume shares, and changed live (each connection's
//! next request sees the new limits).
//!
//! A change is recorded in the pool first and put in force only once it
//! is: a change that fails (the pool is full, the volume is gone) leaves
//! the limits as they were, in the pool and in force.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use arbor_api::model::{QosRequest, QosSetting, QosView};
use arbor_engine::{Pool, VolumeId};
use arbor_format::{QosRecord, MAX_BURST_MS, QOS_KEY};
use arbor_nbd::qos::{Limiter, Limits};
use tracing::{info, warn};

use crate::error::{DaemonError, Result};

/// The burst a volume gets unless it is set: one second of its rates.
pub const DEFAULT_BURST_MS: u32 = 1000;

/// One volume's limits, as recorded, and the limiter in force.
struct Entry {
    record: QosRecord,
    limiter: Arc<Limiter>,
}

/// The volumes' limits and their limiters.
pub struct Qos {
    pool: Arc<Pool>,
    /// Loaded on first use; one change at a time (held across a change's
    /// write to the pool). Entries of destroyed volumes go when the map
    /// has doubled since they were last looked for.
    entries: Mutex<Entries>,
}

struct Entries {
    by_volume: HashMap<VolumeId, Entry>,
    /// The size at which destroyed volumes' entries are looked for.
    prune_at: usize,
}

/// The fewest entries worth pruning.
const PRUNE_FLOOR: usize = 256;

fn limits_of(r: &QosRecord) -> Limits {
    let rate = |v: u64| (v > 0).then_some(v);
    Limits {
        iops: rate(r.iops),
        read_iops: rate(r.read_iops),
        write_iops: rate(r.write_iops),
        bandwidth: rate(r.bandwidth),
        read_bandwidth: rate(r.read_bandwidth),
        write_bandwidth: rate(r.write_bandwidth),
        burst: Duration::from_millis(u64::from(r.burst_ms.max(1))),
    }
}

fn view_of(r: &QosRecord) -> Option<QosView> {
    let rate = |v: u64| (v > 0).then_some(v);
    r.any().then(|| QosView {
        iops: rate(r.iops),
        read_iops: rate(r.read_iops),
        write_iops: rate(r.write_iops),
        bandwidth: rate(r.bandwidth),
        read_bandwidth: rate(r.read_bandwidth),
        write_bandwidth: rate(r.write_bandwidth),
        burst_ms: r.burst_ms,
    })
}

/// `record` with `change` applied; a limit of zero or a bad word or
/// burst is refused, naming the field.
pub fn apply(record: &QosRecord, change: &QosRequest) -> Result<QosRecord> {
    fn set(field: &mut u64, name: &str, setting: &Option<QosSetting>) -> Result<()> {
        match setting {
            None => Ok(()),
            Some(QosSetting::Limit(0)) => Err(DaemonError::Invalid(format!(
                "{name}: a limit of 0 would stop all I/O; give a positive rate, or none to \
                 remove the limit"
            ))),
            Some(QosSetting::Limit(v)) => {
                *field = *v;
                Ok(())
            }
            Some(QosSetting::Word(w)) if w.eq_ignore_ascii_case("none") => {
                *field = 0;
                Ok(())
            }
            Some(QosSetting::Word(w)) => Err(DaemonError::Invalid(format!(
                "{name}: {w:?} is not a limit: give a positive rate, or none"
            ))),
        }
    }
    let mut r = *record;
    set(&mut r.iops, "iops", &change.iops)?;
    set(&mut r.read_iops, "read_iops", &change.read_iops)?;
    set(&mut r.write_iops, "write_iops", &change.write_iops)?;
    set(&mut r.bandwidth, "bandwidth", &change.bandwidth)?;
    set(
        &mut r.read_bandwidth,
        "read_bandwidth",
        &change.read_bandwidth,
    )?;
    set(
        &mut r.write_bandwidth,
        "write_bandwidth",
        &change.write_bandwidth,
    )?;
    if let Some(ms) = change.burst_ms {
        if !(1..=MAX_BURST_MS).contains(&ms) {
            return Err(DaemonError::Invalid(format!(
                "burst: {ms} ms; give 1 to {MAX_BURST_MS} ms"
            )));
        }
        r.burst_ms = ms;
    }
    if r.burst_ms == 0 {
        r.burst_ms = DEFAULT_BURST_MS;
    }
    Ok(r)
}

impl Qos {
    pub fn new(pool: Arc<Pool>) -> Arc<Self> {
        Arc::new(Self {
            pool,
            entries: Mutex::new(Entries {
                by_volume: HashMap::new(),
                prune_at: PRUNE_FLOOR,
            }),
        })
    }

    fn entries(&self) -> MutexGuard<'_, Entries> {
        // Each change of an entry is one assignment after the pool's.
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The recorded limits of `id` (none: no record).
    fn read(&self, id: VolumeId) -> Result<QosRecord> {
        match self.pool.property(Some(id), QOS_KEY)? {
            None => Ok(QosRecord::default()),
            Some(bytes) => QosRecord::decode(&bytes).map_err(|e| {
                DaemonError::Internal(anyhow::anyhow!("the QoS record is damaged: {e}"))
            }),
        }
    }

    /// `id`'s entry, loaded from the pool on first use (a record that
    /// cannot be read is logged, and the volume has no limits).
    fn entry<'a>(&self, entries: &'a mut Entries, id: VolumeId) -> &'a mut Entry {
        if entries.by_volume.len() >= entries.prune_at && !entries.by_volume.contains_key(&id) {
            entries
                .by_volume
                .retain(|&volume, _| self.pool.info(volume).is_ok());
            entries.prune_at = (2 * entries.by_volume.len()).max(PRUNE_FLOOR);
        }
        entries.by_volume.entry(id).or_insert_with(|| {
            let record = self.read(id).unwrap_or_else(|e| {
                warn!(volume = id.0, error = %e, "cannot read the volume's rate limits: it is served without them until they are set again");
                QosRecord::default()
            });
            Entry {
                limiter: Arc::new(Limiter::new(limits_of(&record))),
                record,
            }
        })
    }

    /// The limiter every NBD connection to `id` shares.
    pub fn limiter(&self, id: VolumeId) -> Arc<Limiter> {
        let mut entries = self.entries();
        Arc::clone(&self.entry(&mut entries, id).limiter)
    }

    /// `id`'s limits, if it has any.
    pub fn view(&self, id: VolumeId) -> Option<QosView> {
        let mut entries = self.entries();
        view_of(&self.entry(&mut entries, id).record)
    }

    /// Changes `id`'s limits (`name` for the log): recorded in the pool,
    /// then in force for every connection's next request. Its limits
    /// after.
    pub fn set(&self, id: VolumeId, name: &str, change: &QosRequest) -> Result<Option<QosView>> {
        let mut entries = self.entries();
        let entry = self.entry(&mut entries, id);
        let record = apply(&entry.record, change)?;
        if record.any() {
            self.pool
                .set_property(Some(id), QOS_KEY, &record.encode())?;
        } else {
            self.pool.remove_property(Some(id), QOS_KEY)?;
        }
        entry.record = record;
        entry.limiter.set(limits_of(&record));
        let view = view_of(&record);
        info!(volume = %name, limits = ?view, "rate limits set");
        Ok(view)
    }

    /// Every volume with limits or with requests held back, as
    /// (volume id, limits, requests delayed, seconds they waited).
    pub fn report(&self) -> Vec<(VolumeId, Option<QosView>, u64, f64)> {
        self.entries()
            .by_volume
            .iter()
            .filter_map(|(&id, e)| {
                let (delayed, seconds) = e.limiter.delayed();
                let view = view_of(&e.record);
                (view.is_some() || delayed > 0).then_some((id, view, delayed, seconds))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Why `change` of `r` is refused.
    fn refused(r: &QosRecord, change: QosRequest) -> String {
        apply(r, &change).unwrap_err().to_string()
    }

    /// Entries of destroyed volumes do not pile up: a daemon that serves
    /// thousands of short-lived clones keeps entries for the live ones.
    #[test]
    fn entries_of_destroyed_volumes_are_pruned() {
        use arbor_io::{BlockDevice, SimDisk};
        let disk: Arc<dyn BlockDevice> = Arc::new(SimDisk::new(64 << 20));
        let opts = arbor_engine::CreateOptions {
            chunk_size: 4096,
            metadata_bytes: Some(8 << 20),
            ..Default::default()
        };
        let pool =
            Arc::new(Pool::create(disk, &opts, &arbor_engine::OpenOptions::default()).unwrap());
        let qos = Qos::new(Arc::clone(&pool));
        let kept = pool.create_volume("kept", 1 << 20).unwrap();
        qos.limiter(kept);
        for i in 0..2000 {
            let name = format!("c{i}");
            let id = pool.create_volume(&name, 1 << 20).unwrap();
            qos.limiter(id);
            pool.delete(&name).unwrap();
        }
        let entries = qos.entries();
        assert!(
            entries.by_volume.len() <= PRUNE_FLOOR,
            "{}",
            entries.by_volume.len()
        );
        assert!(entries.by_volume.contains_key(&kept));
    }

    #[test]
    fn changes_merge_and_bad_limits_are_refused() {
        let set = QosRequest {
            write_iops: Some(QosSetting::Limit(2000)),
            read_bandwidth: Some(QosSetting::Limit(16 << 20)),
            ..QosRequest::default()
        };
        let r = apply(&QosRecord::default(), &set).unwrap();
        assert_eq!(
            (r.write_iops, r.read_bandwidth, r.burst_ms),
            (2000, 16 << 20, 1000)
        );
        let unset = QosRequest {
            write_iops: Some(QosSetting::Word("none".into())),
            burst_ms: Some(250),
            ..QosRequest::default()
        };
        let r = apply(&r, &unset).unwrap();
        assert_eq!(
            (r.write_iops, r.read_bandwidth, r.burst_ms),
            (0, 16 << 20, 250)
        );
        let zero = QosRequest {
            iops: Some(QosSetting::Limit(0)),
            ..QosRequest::default()
        };
        assert!(refused(&r, zero).contains("a limit of 0 would stop all I/O"));
        let word = QosRequest {
            iops: Some(QosSetting::Word("lots".into())),
            ..QosRequest::default()
        };
        assert!(refused(&r, word).contains("\"lots\" is not a limit"));
        for ms in [0, MAX_BURST_MS + 1] {
            let burst = QosRequest {
                burst_ms: Some(ms),
                ..QosRequest::default()
            };
            assert!(refused(&r, burst).contains("burst"));
        }
    }
}
