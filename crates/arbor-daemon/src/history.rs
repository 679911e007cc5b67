//! The dashboard's history (docs/MONITOR.md §6): every `history_interval`
//! (10 s by default) the daemon samples its own NBD I/O (the pool-wide
//! totals `metrics::IoTotals` keeps: requests and bytes per second by
//! direction, and the engine's 99th percentile per request over the
//! interval) and the pool's space in use, and keeps the last 6 hours in
//! memory (a restart starts it again). `GET /v1/history` returns it; no
//! external service is needed to see what the pool did lately.
//!
//! The arithmetic (rates and the percentile from two totals) is
//! [`sample`], a pure function; [`History::run`] is the loop.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;
use arbor_api::model::{HistorySample, HistoryView};
use arbor_engine::Pool;
use tokio_util::sync::CancellationToken;

use crate::clock::unix_now;
use crate::metrics::{latency_bound, IoTotalsNow, Metrics, LATENCY_BUCKETS};

/// How far back the history goes.
const SPAN: Duration = Duration::from_secs(6 * 3600);
/// Most samples kept, whatever the interval (a 1 s interval keeps 2 hours).
const MAX_SAMPLES: usize = 8192;

/// The samples, newest last.
pub struct History {
    interval: Duration,
    samples: Mutex<VecDeque<HistorySample>>,
}

impl History {
    pub fn new(interval: Duration) -> Arc<Self> {
        Arc::new(Self {
            interval,
            samples: Mutex::default(),
        })
    }

    /// Samples kept: 6 hours' worth, at most [`MAX_SAMPLES`].
    fn capacity(&self) -> usize {
        let per_span = SPAN.as_secs_f64() / self.interval.as_secs_f64().max(1e-3);
        (per_span.ceil() as usize).clamp(1, MAX_SAMPLES)
    }

    pub fn view(&self) -> HistoryView {
        let samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        HistoryView {
            interval_secs: self.interval.as_secs().max(1),
            samples: samples.iter().cloned().collect(),
        }
    }

    fn push(&self, sample: HistorySample) {
        let capacity = self.capacity();
        let mut samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        while samples.len() >= capacity {
            samples.pop_front();
        }
        samples.push_back(sample);
    }

    /// Samples every interval until the daemon stops.
    pub async fn run(
        self: Arc<Self>,
        pool: Arc<Pool>,
        metrics: Arc<Metrics>,
        stop: CancellationToken,
    ) -> Result<()> {
        let mut before = (metrics.io_totals(), Instant::now());
        let mut tick = crate::clock::ticker(self.interval);
        tick.tick().await;
        loop {
            tokio::select! {
                _ = stop.cancelled() => return Ok(()),
                _ = tick.tick() => {}
            }
            let now = (metrics.io_totals(), Instant::now());
            let stats_pool = Arc::clone(&pool);
            let space = tokio::task::spawn_blocking(move || stats_pool.pool_stats())
                .await
                .ok()
                .and_then(|s| s.ok())
                .map_or((0, 0), |s| (s.data_used_bytes, s.metadata_used_bytes));
            let took = now.1.duration_since(before.1);
            self.push(sample(&before.0, &now.0, took, unix_now(), space));
            before = now;
        }
    }
}

/// The sample of the interval from totals `before` to `now`, `took` long,
/// ending at `unix_secs` with `space` (data, metadata) in use.
pub fn sample(
    before: &IoTotalsNow,
    now: &IoTotalsNow,
    took: Duration,
    unix_secs: u64,
    space: (u64, u64),
) -> HistorySample {
    let secs = took.as_secs_f64().max(1e-3);
    let rate = |a: u64, b: u64| b.saturating_sub(a) as f64 / secs;
    let counts: [u64; LATENCY_BUCKETS] =
        std::array::from_fn(|i| now.latency[i].saturating_sub(before.latency[i]));
    let total: u64 = counts.iter().sum();
    // The first bucket at which 99 % of the interval's requests are done.
    let p99_secs = (total > 0).then(|| {
        let wanted = total - total / 100;
        let mut seen = 0;
        let bucket = counts
            .iter()
            .position(|&c| {
                seen += c;
                seen >= wanted
            })
            .unwrap_or(LATENCY_BUCKETS - 1);
        latency_bound(bucket)
    });
    HistorySample {
        unix_secs,
        read_iops: rate(before.read_requests, now.read_requests),
        write_iops: rate(before.write_requests, now.write_requests),
        read_bytes_per_sec: rate(before.read_bytes, now.read_bytes),
        write_bytes_per_sec: rate(before.write_bytes, now.write_bytes),
        // +Inf (a request past the last bound) has no JSON form: the last
        // finite bound, the histogram's "at least".
        p99_secs: p99_secs.map(|p| {
            if p.is_finite() {
                p
            } else {
                latency_bound(LATENCY_BUCKETS - 2)
            }
        }),
        data_used_bytes: space.0,
        metadata_used_bytes: space.1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn totals(reads: u64, writes: u64, latency: &[(usize, u64)]) -> IoTotalsNow {
        let mut t = IoTotalsNow {
            read_requests: reads,
            write_requests: writes,
            read_bytes: reads * 4096,
            write_bytes: writes * 65536,
            ..IoTotalsNow::default()
        };
        for &(bucket, n) in latency {
            t.latency[bucket] = n;
        }
        t
    }

    #[test]
    fn a_sample_is_the_rates_and_the_p99_of_its_interval_alone() {
        // Before: 1000 slow requests, which this interval must not count.
        let before = totals(500, 500, &[(20, 1000)]);
        // This interval: 990 requests in bucket 2 (16 µs), 10 in bucket 9.
        let now = totals(1500, 500, &[(2, 990), (9, 10), (20, 1000)]);
        let s = sample(&before, &now, Duration::from_secs(10), 77, (5, 6));
        assert_eq!(s.unix_secs, 77);
        assert_eq!((s.read_iops, s.write_iops), (100.0, 0.0));
        assert_eq!(s.read_bytes_per_sec, 100.0 * 4096.0);
        assert_eq!(s.p99_secs, Some(latency_bound(2)), "990 of 1000 by 16 µs");
        assert_eq!((s.data_used_bytes, s.metadata_used_bytes), (5, 6));
        // 11 of 1000 slow: the p99 is the slow bucket.
        let now = totals(1500, 500, &[(2, 989), (9, 11), (20, 1000)]);
        let s = sample(&before, &now, Duration::from_secs(10), 77, (0, 0));
        assert_eq!(s.p99_secs, Some(latency_bound(9)));
        // No request: no percentile.
        let s = sample(&before, &before, Duration::from_secs(10), 77, (0, 0));
        assert_eq!(s.p99_secs, None);
        // Past the last bound: the last finite one.
        let now = totals(501, 500, &[(20, 1000), (LATENCY_BUCKETS - 1, 1)]);
        let s = sample(&before, &now, Duration::from_secs(1), 77, (0, 0));
        assert_eq!(s.p99_secs, Some(latency_bound(LATENCY_BUCKETS - 2)));
    }

    #[test]
    fn six_hours_are_kept_at_most() {
        let history = History::new(Duration::from_secs(10));
        assert_eq!(history.capacity(), 2160);
        for i in 0..2200 {
            history.push(HistorySample {
                unix_secs: i,
                ..HistorySample::default()
            });
        }
        let view = history.view();
        assert_eq!(view.interval_secs, 10);
        assert_eq!(view.samples.len(), 2160);
        assert_eq!(view.samples[0].unix_secs, 40, "the oldest went first");
        assert_eq!(
            History::new(Duration::from_millis(100)).capacity(),
            MAX_SAMPLES
        );
    }
}
