//! A bandwidth limit for uploads (a repository's `upload_rate`): each
//! upload starts no sooner than the bytes before it allow at the rate, so
//! a backup's average over any stretch of packs stays at or under it
//! whatever the number of uploads in flight, and a backup catching up
//! does not take a site's link.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Paces bytes to `rate` per second.
#[derive(Debug)]
pub struct Pace {
    rate: u64,
    /// When the next bytes may start.
    next: Mutex<Option<Instant>>,
}

impl Pace {
    /// `rate` bytes per second (at least one).
    pub fn new(rate: u64) -> Self {
        Pace {
            rate: rate.max(1),
            next: Mutex::new(None),
        }
    }

    /// Waits until `bytes` may be sent.
    pub async fn take(&self, bytes: u64) {
        let start = {
            // Every change under the lock is one assignment.
            let mut next = self.next.lock().unwrap_or_else(|p| p.into_inner());
            let now = Instant::now();
            let start = next.map_or(now, |n| n.max(now));
            let cost = Duration::from_secs_f64(bytes as f64 / self.rate as f64);
            *next = Some(start + cost);
            start
        };
        tokio::time::sleep_until(start).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Five 8 MiB packs at 8 MiB/s from several tasks at once: the last
    /// starts 4 s after the first (the clock is tokio's, paused: no real
    /// time passes and nothing depends on the machine's speed).
    #[tokio::test(start_paused = true)]
    async fn uploads_start_no_sooner_than_the_rate_allows() {
        let pace = std::sync::Arc::new(Pace::new(8 << 20));
        let began = Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..5 {
            let pace = std::sync::Arc::clone(&pace);
            tasks.push(tokio::spawn(async move {
                pace.take(8 << 20).await;
                Instant::now()
            }));
        }
        let mut starts = Vec::new();
        for t in tasks {
            starts.push(t.await.unwrap() - began);
        }
        starts.sort();
        assert_eq!(starts[0], Duration::ZERO);
        assert_eq!(starts[4], Duration::from_secs(4));
        for pair in starts.windows(2) {
            assert_eq!(pair[1] - pair[0], Duration::from_secs(1));
        }
    }
}
