//! The daemon's housekeeping: periodic commits, paced reclaim and space
//! warnings.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use arbor_engine::{Error, Pool, Refusal};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::metrics::Metrics;
use crate::space::SpaceWatch;

/// How often to look for reclaim work when there was none.
const RECLAIM_IDLE_POLL: Duration = Duration::from_secs(1);
/// Most nodes per reclaim call. Each call commits and holds up I/O while it
/// runs, so many small steps keep write latency low.
const RECLAIM_MAX_BATCH: u32 = 256;

async fn run_blocking<T: Send + 'static>(
    pool: &Arc<Pool>,
    operation: impl FnOnce(&Pool) -> arbor_engine::Result<T> + Send + 'static,
) -> Result<arbor_engine::Result<T>> {
    let pool = Arc::clone(pool);
    tokio::task::spawn_blocking(move || operation(&pool))
        .await
        .context("engine task failed")
}

/// Sleeps for `pause`; false if the daemon is stopping instead.
async fn pause_unless_stopped(pause: Duration, stop: &CancellationToken) -> bool {
    tokio::select! {
        _ = stop.cancelled() => false,
        _ = tokio::time::sleep(pause) => true,
    }
}

/// Commits every `interval`, bounding how much acknowledged-but-unflushed
/// writing a crash can lose. A failed commit stops the daemon; an origin's
/// device that fails to flush (`Refusal::Origin`, after the commit) does
/// not: its volume's I/O reports it, the rest of the pool goes on, and the
/// flush is tried again each interval (logged once until it succeeds).
pub async fn commit_periodically(
    pool: Arc<Pool>,
    interval: Duration,
    stop: CancellationToken,
) -> Result<()> {
    let mut origin_failing = false;
    while pause_unless_stopped(interval, &stop).await {
        match run_blocking(&pool, |p| p.flush()).await? {
            Ok(()) => origin_failing = false,
            Err(Error::Refused(Refusal::Origin(why))) => {
                if !origin_failing {
                    warn!(error = %why, "an origin's device did not flush; retrying each interval");
                }
                origin_failing = true;
            }
            Err(e) => return Err(e).context("periodic commit failed"),
        }
    }
    Ok(())
}

/// How often the sizes of origins' devices are looked at, so that one
/// that shrinks while idle fails (and its loss is recorded) within this
/// time, not only at its next request.
pub const ORIGIN_WATCH_INTERVAL: Duration = Duration::from_secs(1);

/// Looks at every attached origin's device every [`ORIGIN_WATCH_INTERVAL`]
/// (`Pool::watch_origins`): one that shrank fails, its loss recorded.
pub async fn watch_origins(pool: Arc<Pool>, stop: CancellationToken) -> Result<()> {
    while pause_unless_stopped(ORIGIN_WATCH_INTERVAL, &stop).await {
        match run_blocking(&pool, |p| p.watch_origins()).await? {
            Ok(_) => {}
            Err(e) if e.stops_pool() => return Err(e).context("watching origins failed"),
            Err(e) => warn!(error = %e, "cannot record the loss of an origin's device; will retry"),
        }
    }
    Ok(())
}

/// Reclaims deleted volumes' space at no more than `rate` nodes per second,
/// so reclaim never starves client I/O.
pub async fn reclaim_paced(
    pool: Arc<Pool>,
    metrics: Arc<Metrics>,
    rate: Arc<AtomicU32>,
    stop: CancellationToken,
) -> Result<()> {
    loop {
        // Read each round: a reload changes it; 0 turns reclaim off.
        let rate = rate.load(Ordering::Relaxed);
        if rate == 0 {
            if !pause_unless_stopped(RECLAIM_IDLE_POLL, &stop).await {
                return Ok(());
            }
            continue;
        }
        let batch = rate.min(RECLAIM_MAX_BATCH) as usize;
        let outcome = run_blocking(&pool, move |p| {
            // Checking first avoids a commit (and its fsync) when idle.
            if p.pool_stats()?.reclaim_pending {
                p.reclaim(batch)
            } else if p.fill_wanted() {
                // Then the bases that partial extents alone hold.
                p.fill_partials(batch)
            } else {
                Ok(0)
            }
        })
        .await?;
        let processed = match outcome {
            Ok(n) => n,
            Err(e) if e.stops_pool() => return Err(e).context("background reclaim failed"),
            Err(e) => {
                warn!(error = %e, "background reclaim failed; will retry");
                0
            }
        };
        if processed > 0 {
            debug!(processed, "reclaimed metadata nodes");
            metrics.count_reclaimed(processed as u64);
        }
        if !pause_unless_stopped(reclaim_pause(processed, rate), &stop).await {
            return Ok(());
        }
    }
}

/// Logs a warning each time space use rises past a configured threshold
/// (and a note when it falls back), checking every `interval`.
pub async fn watch_space(
    pool: Arc<Pool>,
    space: SpaceWatch,
    interval: Duration,
    stop: CancellationToken,
) -> Result<()> {
    let mut level = None;
    loop {
        let stats = run_blocking(&pool, |p| p.pool_stats()).await?;
        match stats {
            Ok(stats) => {
                let now = space.level(&stats);
                if now > level {
                    for warning in space.warnings(&stats) {
                        warn!("{warning}");
                    }
                } else if now < level {
                    info!(
                        level = now.unwrap_or(0),
                        "pool space use fell below a warning threshold"
                    );
                }
                level = now;
            }
            Err(e) if e.stops_pool() => return Err(e).context("reading pool space failed"),
            Err(e) => warn!(error = %e, "cannot read pool space"),
        }
        if !pause_unless_stopped(interval, &stop).await {
            return Ok(());
        }
    }
}

/// The pause after processing `processed` nodes that keeps the average at `rate`.
fn reclaim_pause(processed: usize, rate: u32) -> Duration {
    if processed == 0 {
        return RECLAIM_IDLE_POLL;
    }
    Duration::from_secs_f64(processed as f64 / f64::from(rate))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reclaim_is_paced_to_the_rate() {
        assert_eq!(reclaim_pause(0, 2000), RECLAIM_IDLE_POLL);
        assert_eq!(reclaim_pause(256, 2048), Duration::from_millis(125));
        assert_eq!(reclaim_pause(10, 10), Duration::from_secs(1));
    }
}
