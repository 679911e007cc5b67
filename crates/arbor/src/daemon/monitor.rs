//! The volume monitor: policies' scheduled snapshots and prunes, and the
//! alerts (docs/MONITOR.md).

/// Now, in Unix seconds.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
