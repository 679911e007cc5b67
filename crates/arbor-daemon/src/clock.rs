//! The daemon's clock: Unix seconds now, and the tick at which the monitor
//! looks at its policies and the scrub at its schedule. Apart from both so
//! that neither imports the other for it (the monitor holds the scrub).

use std::time::Duration;

/// How often the monitor looks at its policies (and the scrub at its
/// schedule, while none runs): the finest schedule granularity, and the
/// delay before a changed policy takes effect.
pub(crate) const TICK: Duration = Duration::from_secs(1);

/// Now, in Unix seconds.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A ticker at `period` whose missed ticks are delayed, not bunched: a
/// tick that took long is followed by one a whole period later.
pub(crate) fn ticker(period: Duration) -> tokio::time::Interval {
    let mut ticks = tokio::time::interval(period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks
}
