//! Polling for a connection's next request before sleeping.
//!
//! A client that sends one request at a time (queue depth 1) waits for each
//! reply before it sends the next request, so the connection's thread has
//! nothing to do in between and sleeps. In a virtual machine whose idle
//! vCPUs halt, waking that thread again costs tens of microseconds: on the
//! reference machine a 4 KiB read served from the page cache took 17 µs
//! round trip when client and server shared a CPU and 58 µs when the
//! server's CPU had gone idle (PERFORMANCE.md, "Polling before sleeping").
//! So after a reply, a connection that has lately seen its next request
//! arrive soon looks for it for a short while, a *window*, before it
//! sleeps, as QEMU's iothreads do (`poll-max-ns`) and Linux's busy polling.
//!
//! The window adapts per connection, in [`PollWindow`]: it grows while
//! requests arrive soon after the window ran out, holds while they arrive
//! within it, and shrinks when the connection went quiet, so a connection
//! polls only while it pays. At most [`Pollers`] connections poll at once,
//! and none on a single CPU, where polling would only keep the client off
//! it. This module decides; the connection measures and polls.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Limits of polling, server-wide (`ServerConfig::poll`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PollLimits {
    /// The largest window; zero turns polling off.
    pub max: Duration,
    /// Connections polling at once.
    pub pollers: usize,
}

impl PollLimits {
    /// A window of up to `max`, with one poller per CPU but one: a polling
    /// connection keeps its CPU busy, and the clients need the rest.
    pub fn per_cpu(max: Duration) -> Self {
        let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
        Self {
            max,
            pollers: cpus.saturating_sub(1),
        }
    }
}

impl Default for PollLimits {
    /// QEMU's iothreads poll up to 32 µs; an NBD client's turnaround
    /// after a reply, its own wakeup included, takes longer on a VM (30-50
    /// µs typical, with a long tail), so the window may grow to 128 µs,
    /// which did better than 64 in the benchmark's QD1 reads
    /// (PERFORMANCE.md, "Polling before sleeping").
    fn default() -> Self {
        Self::per_cpu(Duration::from_micros(128))
    }
}

/// Who may poll now: at most [`PollLimits::pollers`] connections at once.
#[derive(Debug)]
pub struct Pollers {
    limit: usize,
    polling: AtomicUsize,
}

impl Pollers {
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self {
            limit,
            polling: AtomicUsize::new(0),
        })
    }

    /// A turn to poll, held until dropped; `None` while `limit` connections
    /// poll already.
    pub fn try_poll(self: &Arc<Self>) -> Option<PollTurn> {
        self.polling
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.limit).then_some(n + 1)
            })
            .ok()
            .map(|_| PollTurn(Arc::clone(self)))
    }

    /// Connections polling now.
    pub fn polling(&self) -> usize {
        self.polling.load(Ordering::Acquire)
    }
}

/// One connection's turn to poll (see [`Pollers::try_poll`]).
#[derive(Debug)]
pub struct PollTurn(Arc<Pollers>);

impl Drop for PollTurn {
    fn drop(&mut self) {
        // Paired with the increment in `try_poll`: never below zero.
        let before = self.0.polling.fetch_sub(1, Ordering::AcqRel);
        debug_assert!(before > 0, "a poll turn returned twice");
    }
}

/// Polling as a server does it: the limits and the turns its connections
/// share.
#[derive(Debug, Clone)]
pub struct Polling {
    max: Duration,
    pollers: Arc<Pollers>,
}

impl Polling {
    pub fn new(limits: PollLimits) -> Self {
        Self {
            max: limits.max,
            pollers: Pollers::new(limits.pollers),
        }
    }

    /// A new connection's window.
    pub fn window(&self) -> PollWindow {
        PollWindow::new(self.max)
    }

    /// See [`Pollers::try_poll`].
    pub fn try_poll(&self) -> Option<PollTurn> {
        self.pollers.try_poll()
    }
}

/// How long one connection polls for its next request, adapted to how soon
/// its requests arrive. Sans-I/O: the connection reports each wait with
/// [`PollWindow::waited`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PollWindow {
    window: Duration,
    max: Duration,
}

impl PollWindow {
    /// The first window a growing one takes.
    pub const START: Duration = Duration::from_micros(8);

    /// A window that starts closed and grows up to `max`.
    pub fn new(max: Duration) -> Self {
        Self {
            window: Duration::ZERO,
            max,
        }
    }

    /// How long to poll before sleeping, next time.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// Learns from one wait for a request: `waited` from when the
    /// connection had nothing left to read until the request arrived.
    /// * Arrived within the window: polling worked; the window holds.
    /// * Arrived after the window but within `max`: polling longer would
    ///   have caught it; the window opens to twice that wait (at least
    ///   [`Self::START`], at most `max`) at once, as a miss costs the very
    ///   wakeup polling saves, and the next request then comes sooner (no
    ///   wakeup) with room for the client's jitter.
    /// * Arrived later than `max`: a hiccup, or the client went quiet; the
    ///   window halves, and closes below [`Self::START`]. A client that is
    ///   slower than `max` for good so stops costing polls within a few
    ///   requests.
    pub fn waited(&mut self, waited: Duration) {
        if waited <= self.window {
            return;
        }
        if waited <= self.max {
            self.window = waited.saturating_mul(2).max(Self::START).min(self.max);
        } else {
            self.window /= 2;
            if self.window < Self::START {
                self.window = Duration::ZERO;
            }
        }
        debug_assert!(self.window <= self.max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: Duration = Duration::from_micros(1);

    #[test]
    fn a_window_grows_to_catch_requests_that_come_soon() {
        let mut w = PollWindow::new(64 * US);
        assert_eq!(w.window(), Duration::ZERO);
        let mut seen = Vec::new();
        for _ in 0..4 {
            // The client answers 20 µs after each reply.
            if w.window() < 20 * US {
                w.waited(20 * US + 20 * US); // missed, then the wakeup
            } else {
                w.waited(20 * US);
            }
            seen.push(w.window().as_micros());
        }
        assert_eq!(seen, [64, 64, 64, 64]);
        // A quick client opens a smaller window.
        let mut w = PollWindow::new(64 * US);
        w.waited(2 * US);
        assert_eq!(w.window(), PollWindow::START);
        w.waited(10 * US);
        assert_eq!(w.window(), 20 * US);
    }

    #[test]
    fn a_quiet_connection_stops_polling() {
        let mut w = PollWindow::new(64 * US);
        w.waited(40 * US);
        assert_eq!(w.window(), 64 * US);
        let mut seen = Vec::new();
        for _ in 0..4 {
            w.waited(Duration::from_millis(5));
            seen.push(w.window().as_micros());
        }
        assert_eq!(seen, [32, 16, 8, 0]);
        // Quiet for good: it stays closed.
        w.waited(Duration::from_secs(1));
        assert_eq!(w.window(), Duration::ZERO);
    }

    #[test]
    fn requests_within_the_window_keep_it() {
        let mut w = PollWindow::new(64 * US);
        w.waited(9 * US);
        assert_eq!(w.window(), 18 * US);
        for _ in 0..100 {
            w.waited(10 * US);
        }
        assert_eq!(w.window(), 18 * US);
        // A hiccup halves it; the next miss within `max` opens it again.
        w.waited(100 * US);
        assert_eq!(w.window(), 9 * US);
        w.waited(30 * US);
        assert_eq!(w.window(), 60 * US);
    }

    #[test]
    fn polling_off_never_opens_a_window() {
        let mut w = PollWindow::new(Duration::ZERO);
        for waited in [Duration::ZERO, US, 50 * US, Duration::from_secs(1)] {
            w.waited(waited);
            assert_eq!(w.window(), Duration::ZERO);
        }
    }

    #[test]
    fn a_small_maximum_caps_the_first_window() {
        let mut w = PollWindow::new(5 * US);
        w.waited(4 * US);
        assert_eq!(w.window(), 5 * US);
    }

    #[test]
    fn pollers_are_limited_and_turns_come_back() {
        let pollers = Pollers::new(2);
        let a = pollers.try_poll().expect("first");
        let b = pollers.try_poll().expect("second");
        assert!(pollers.try_poll().is_none());
        assert_eq!(pollers.polling(), 2);
        drop(a);
        let c = pollers.try_poll().expect("a turn came back");
        drop((b, c));
        assert_eq!(pollers.polling(), 0);
        assert!(Pollers::new(0).try_poll().is_none());
    }
}
