//! Rate limits on an export's requests (quality of service): token
//! buckets for IOPS and bandwidth, for reads, writes and both, each with
//! a burst allowance. The mechanism only: which export gets which limits
//! is its owner's policy (arbor's volumes keep theirs in the pool).
//!
//! A request takes its tokens from every bucket that applies when it is
//! admitted (a read: the read and the total buckets, one operation and
//! its bytes each) and is held until none of them is in debt: a bucket
//! goes below zero by what it could not give, and the request waits as
//! long as the bucket takes to refill that much. Requests are admitted in
//! the order they arrive, so the rate over any span longer than the burst
//! is the limit, whatever the queue depth and however many connections
//! share the limiter; a request larger than a bucket's burst is admitted
//! alone rather than never. A full bucket holds `burst` seconds of its
//! rate, spent at once after an idle spell.
//!
//! The connection's reader waits before it reads the next request's
//! payload, so a throttled client holds no server memory and feels the
//! limit as a queue that does not drain. Writes (`NBD_CMD_WRITE`) count
//! their bytes; write-zeroes and trims count as write operations without
//! bytes; flushes, block status and cache hints are not limited.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The most seconds of rate a bucket may hold.
pub const MAX_BURST: Duration = Duration::from_secs(60);

/// What a request is, for the limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoKind {
    Read,
    Write,
}

/// An export's limits: each `None` is no limit. Rates are per second.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub iops: Option<u64>,
    pub read_iops: Option<u64>,
    pub write_iops: Option<u64>,
    pub bandwidth: Option<u64>,
    pub read_bandwidth: Option<u64>,
    pub write_bandwidth: Option<u64>,
    /// How much a full bucket holds, in seconds of its rate.
    pub burst: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            iops: None,
            read_iops: None,
            write_iops: None,
            bandwidth: None,
            read_bandwidth: None,
            write_bandwidth: None,
            burst: Duration::from_secs(1),
        }
    }
}

impl Limits {
    /// Whether any limit is set.
    pub fn any(&self) -> bool {
        [
            self.iops,
            self.read_iops,
            self.write_iops,
            self.bandwidth,
            self.read_bandwidth,
            self.write_bandwidth,
        ]
        .iter()
        .any(Option::is_some)
    }
}

/// One token bucket. Tokens are counted in millionths, so that a
/// refill of a fraction of a token per microsecond is not lost.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    /// Tokens per second.
    rate: u64,
    /// Millionths of a token it holds at most.
    capacity: i128,
    /// Millionths it holds; below zero: the debt of admitted requests.
    level: i128,
}

const MICRO: i128 = 1_000_000;

impl Bucket {
    fn new(rate: u64, burst: Duration) -> Self {
        let capacity = (i128::from(rate) * burst.as_micros() as i128).max(MICRO);
        Self {
            rate,
            capacity,
            level: capacity,
        }
    }

    fn refill(&mut self, elapsed: Duration) {
        // rate tokens per second = rate millionths per microsecond.
        let added = i128::from(self.rate).saturating_mul(elapsed.as_micros() as i128);
        self.level = self.level.saturating_add(added).min(self.capacity);
    }

    /// Takes `amount` tokens; how long until the bucket is out of debt.
    fn take(&mut self, amount: u64) -> Duration {
        self.level = self.level.saturating_sub(i128::from(amount) * MICRO);
        if self.level >= 0 || self.rate == 0 {
            return Duration::ZERO;
        }
        let micros = (-self.level) / i128::from(self.rate);
        Duration::from_micros(u64::try_from(micros).unwrap_or(u64::MAX))
    }
}

/// The buckets of one set of limits.
#[derive(Debug, Clone, Default)]
struct Buckets {
    iops: Option<Bucket>,
    read_iops: Option<Bucket>,
    write_iops: Option<Bucket>,
    bandwidth: Option<Bucket>,
    read_bandwidth: Option<Bucket>,
    write_bandwidth: Option<Bucket>,
    last: Option<Instant>,
}

impl Buckets {
    fn new(limits: &Limits) -> Self {
        let bucket = |rate: Option<u64>| rate.map(|r| Bucket::new(r, limits.burst));
        Self {
            iops: bucket(limits.iops),
            read_iops: bucket(limits.read_iops),
            write_iops: bucket(limits.write_iops),
            bandwidth: bucket(limits.bandwidth),
            read_bandwidth: bucket(limits.read_bandwidth),
            write_bandwidth: bucket(limits.write_bandwidth),
            last: None,
        }
    }

    fn all(&mut self) -> [&mut Option<Bucket>; 6] {
        [
            &mut self.iops,
            &mut self.read_iops,
            &mut self.write_iops,
            &mut self.bandwidth,
            &mut self.read_bandwidth,
            &mut self.write_bandwidth,
        ]
    }

    fn admit(&mut self, kind: IoKind, bytes: u64, now: Instant) -> Duration {
        let elapsed = self
            .last
            .map_or(Duration::ZERO, |last| now.saturating_duration_since(last));
        self.last = Some(now);
        for bucket in self.all().into_iter().flatten() {
            bucket.refill(elapsed);
        }
        let (ops, bandwidth) = match kind {
            IoKind::Read => (&mut self.read_iops, &mut self.read_bandwidth),
            IoKind::Write => (&mut self.write_iops, &mut self.write_bandwidth),
        };
        let mut wait = Duration::ZERO;
        for (bucket, amount) in [(ops, 1), (bandwidth, bytes)] {
            if let Some(b) = bucket {
                wait = wait.max(b.take(amount));
            }
        }
        if let Some(b) = &mut self.iops {
            wait = wait.max(b.take(1));
        }
        if let Some(b) = &mut self.bandwidth {
            wait = wait.max(b.take(bytes));
        }
        wait
    }
}

/// What `command` costs under the limits: its kind and bytes; `None`:
/// not limited.
pub fn cost(command: &crate::transmission::Command) -> Option<(IoKind, u64)> {
    use crate::transmission::Command;
    match *command {
        Command::Read { length, .. } => Some((IoKind::Read, u64::from(length))),
        Command::Write { length, .. } => Some((IoKind::Write, u64::from(length))),
        Command::Trim { .. } | Command::WriteZeroes { .. } => Some((IoKind::Write, 0)),
        _ => None,
    }
}

/// The limits of one export, shared by all its connections and changed
/// while they run; and what it held back.
#[derive(Debug)]
pub struct Limiter {
    /// Any limit set: without, admitting takes no lock.
    limited: AtomicBool,
    state: Mutex<(Limits, Buckets)>,
    /// Requests held back, and for how long in all (microseconds).
    delayed: AtomicU64,
    delayed_micros: AtomicU64,
}

impl Limiter {
    pub fn new(limits: Limits) -> Self {
        Self {
            limited: AtomicBool::new(limits.any()),
            state: Mutex::new((limits, Buckets::new(&limits))),
            delayed: AtomicU64::new(0),
            delayed_micros: AtomicU64::new(0),
        }
    }

    /// The limits in force.
    pub fn limits(&self) -> Limits {
        self.lock().0
    }

    /// Puts `limits` in force, from the next request (full buckets).
    pub fn set(&self, limits: Limits) {
        let mut state = self.lock();
        *state = (limits, Buckets::new(&limits));
        self.limited.store(limits.any(), Ordering::Release);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (Limits, Buckets)> {
        // Each change is one assignment: a poisoned lock holds a whole value.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Admits a request of `kind` carrying `bytes` at `now`: how long to
    /// hold it first.
    pub fn admit(&self, kind: IoKind, bytes: u64, now: Instant) -> Duration {
        if !self.limited.load(Ordering::Acquire) {
            return Duration::ZERO;
        }
        let wait = self.lock().1.admit(kind, bytes, now);
        if !wait.is_zero() {
            self.delayed.fetch_add(1, Ordering::Relaxed);
            self.delayed_micros.fetch_add(
                u64::try_from(wait.as_micros()).unwrap_or(u64::MAX),
                Ordering::Relaxed,
            );
        }
        wait
    }

    /// Requests held back so far, and the seconds they waited in all.
    pub fn delayed(&self) -> (u64, f64) {
        (
            self.delayed.load(Ordering::Relaxed),
            self.delayed_micros.load(Ordering::Relaxed) as f64 / 1e6,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Admits requests back to back as a reader does (each after the
    /// previous one's wait), for `span`; how many were admitted.
    fn run(limiter: &Limiter, kind: IoKind, bytes: u64, span: Duration) -> u64 {
        let start = Instant::now();
        let mut now = start;
        let mut admitted = 0;
        while now < start + span {
            now += limiter.admit(kind, bytes, now);
            admitted += 1;
        }
        admitted
    }

    #[test]
    fn no_limits_hold_nothing_back() {
        let limiter = Limiter::new(Limits::default());
        assert_eq!(
            limiter.admit(IoKind::Write, 1 << 20, Instant::now()),
            Duration::ZERO
        );
        assert_eq!(limiter.delayed().0, 0);
    }

    #[test]
    fn iops_hold_to_the_rate_after_the_burst() {
        let limiter = Limiter::new(Limits {
            write_iops: Some(1000),
            ..Limits::default()
        });
        // One second of burst, then 1000 a second: 11 s admit 12,000.
        let n = run(&limiter, IoKind::Write, 4096, Duration::from_secs(11));
        assert!((11_999..=12_001).contains(&n), "{n}");
        // Reads are not limited by a write limit.
        for _ in 0..100_000 {
            assert_eq!(
                limiter.admit(IoKind::Read, 4096, Instant::now()),
                Duration::ZERO
            );
        }
        let (delayed, seconds) = limiter.delayed();
        assert!(delayed > 10_000 && seconds > 9.0, "{delayed} {seconds}");
    }

    #[test]
    fn bandwidth_and_the_total_limit_apply_together() {
        let limiter = Limiter::new(Limits {
            read_bandwidth: Some(10 << 20),
            iops: Some(100),
            burst: Duration::from_millis(100),
            ..Limits::default()
        });
        // 64 KiB reads: bandwidth allows 160 a second, the total 100.
        let n = run(&limiter, IoKind::Read, 65536, Duration::from_secs(10));
        assert!((1000..=1011).contains(&n), "{n}");
        // 1 MiB reads: bandwidth allows 10 a second.
        limiter.set(Limits {
            read_bandwidth: Some(10 << 20),
            iops: Some(100),
            burst: Duration::from_millis(100),
            ..Limits::default()
        });
        let n = run(&limiter, IoKind::Read, 1 << 20, Duration::from_secs(10));
        assert!((100..=102).contains(&n), "{n}");
    }

    #[test]
    fn a_request_larger_than_the_burst_is_admitted_and_paid_for() {
        let limiter = Limiter::new(Limits {
            write_bandwidth: Some(1000),
            burst: Duration::from_secs(1),
            ..Limits::default()
        });
        let now = Instant::now();
        assert_eq!(
            limiter.admit(IoKind::Write, 5000, now),
            Duration::from_secs(4)
        );
        // The next one waits for the debt and its own bytes.
        assert_eq!(
            limiter.admit(IoKind::Write, 1000, now),
            Duration::from_secs(5)
        );
    }

    #[test]
    fn a_change_applies_from_the_next_request() {
        let limiter = Limiter::new(Limits {
            read_iops: Some(10),
            ..Limits::default()
        });
        let n = run(&limiter, IoKind::Read, 512, Duration::from_secs(5));
        assert!((59..=61).contains(&n), "{n}");
        limiter.set(Limits {
            read_iops: Some(100),
            ..Limits::default()
        });
        let n = run(&limiter, IoKind::Read, 512, Duration::from_secs(5));
        assert!((599..=601).contains(&n), "{n}");
        limiter.set(Limits::default());
        assert_eq!(
            limiter.admit(IoKind::Read, 512, Instant::now()),
            Duration::ZERO
        );
    }
}
