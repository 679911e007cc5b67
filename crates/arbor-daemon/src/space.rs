//! Space warnings: the pool's data or metadata use crossing configured
//! percentages (default 80 and 90), as RSnap's 3PAR model does, so an
//! administrator hears about a filling pool before writes fail.

use arbor_engine::PoolStats;

/// The configured thresholds, in increasing order.
#[derive(Debug, Clone)]
pub struct SpaceWatch {
    thresholds: Vec<u8>,
}

/// Percent of `total` that `used` is, rounded down.
fn percent(used: u64, total: u64) -> u64 {
    if total == 0 {
        return 0;
    }
    u64::try_from(u128::from(used) * 100 / u128::from(total)).unwrap_or(100)
}

/// Where one space's use stands against the thresholds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Crossing {
    /// Percent used, rounded down.
    pub percent: u64,
    /// The highest threshold crossed.
    pub threshold: u8,
    /// Whether it is the highest configured one, and there are several:
    /// the last warning before a full pool.
    pub last: bool,
}

impl SpaceWatch {
    pub fn new(thresholds: Vec<u8>) -> Self {
        Self { thresholds }
    }

    /// The highest threshold `used` of `total` bytes crossed, if any: the
    /// one rule behind warnings, the metric and alerts.
    pub fn crossing(&self, used: u64, total: u64) -> Option<Crossing> {
        self.crossing_held(used, total, None, 0)
    }

    /// As [`SpaceWatch::crossing`], for an alert already raised (`held`:
    /// `Some(true)` at the last threshold, `Some(false)` below it): the
    /// thresholds it covers stay crossed until use falls `margin` points
    /// under them, so use hovering at a threshold does not raise and clear
    /// it in turn (alerts' hysteresis, docs/MONITOR.md §5).
    pub fn crossing_held(
        &self,
        used: u64,
        total: u64,
        held: Option<bool>,
        margin: u8,
    ) -> Option<Crossing> {
        let p = percent(used, total);
        let several = self.thresholds.len() >= 2;
        let top = self.thresholds.len().saturating_sub(1);
        let threshold = self
            .thresholds
            .iter()
            .enumerate()
            .rev()
            .find(|&(i, &t)| {
                let kept = match held {
                    Some(last) => last || !several || i < top,
                    None => false,
                };
                p >= u64::from(t) || (kept && p + u64::from(margin) >= u64::from(t))
            })
            .map(|(_, &t)| t)?;
        Some(Crossing {
            percent: p,
            threshold,
            last: several && self.thresholds.last() == Some(&threshold),
        })
    }

    /// The highest threshold crossed by data or metadata use, if any.
    pub fn level(&self, stats: &PoolStats) -> Option<u8> {
        [
            (stats.data_used_bytes, stats.data_bytes),
            (stats.metadata_used_bytes, stats.metadata_bytes),
        ]
        .into_iter()
        .filter_map(|(used, total)| self.crossing(used, total))
        .map(|c| c.threshold)
        .max()
    }

    /// One sentence per space (data, metadata) past a threshold.
    pub fn warnings(&self, stats: &PoolStats) -> Vec<String> {
        let spaces = [
            ("data", stats.data_used_bytes, stats.data_bytes),
            ("metadata", stats.metadata_used_bytes, stats.metadata_bytes),
        ];
        spaces
            .iter()
            .filter_map(|&(name, used, total)| {
                let c = self.crossing(used, total)?;
                Some(format!(
                    "{name} space is {}% used (warning at {}%): destroy unneeded \
                     snapshots or volumes, or move volumes to another pool",
                    c.percent, c.threshold
                ))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(data_used: u64, meta_used: u64) -> PoolStats {
        PoolStats {
            pool_bytes: 0,
            chunk_size: 0,
            data_bytes: 100,
            data_used_bytes: data_used,
            metadata_bytes: 1000,
            metadata_used_bytes: meta_used,
            volumes: 0,
            snapshots: 0,
            reclaim_pending: false,
            fill_pending: false,
            txn: 0,
            split_units: 0,
            intent_log_records: 0,
            logged_snapshots: 0,
            chunk_writes: Default::default(),
            in_place_regions: 0,
        }
    }

    #[test]
    fn the_highest_crossed_threshold_of_either_space_counts() {
        let watch = SpaceWatch::new(vec![80, 90]);
        assert_eq!(watch.level(&stats(79, 0)), None);
        assert_eq!(watch.level(&stats(80, 0)), Some(80));
        assert_eq!(watch.level(&stats(10, 950)), Some(90));
        assert!(watch.warnings(&stats(79, 0)).is_empty());
        let both = watch.warnings(&stats(85, 990));
        assert_eq!(both.len(), 2);
        assert!(both[0].starts_with("data space is 85% used (warning at 80%)"));
        assert!(both[1].starts_with("metadata space is 99% used (warning at 90%)"));
        assert_eq!(SpaceWatch::new(vec![]).level(&stats(100, 1000)), None);
    }
}
