//! arbor's reliability campaigns (docs/RELIABILITY.md). Each campaign is a
//! library function run two ways: briefly by `cargo test -p arbor-campaigns`
//! (CI) and for as long as wanted by its binary (`src/bin/`).

pub mod powercut;

use std::sync::Arc;
use std::time::{Duration, Instant};

use arbor_engine::{CreateOptions, OpenOptions, Pool};
use arbor_io::{BlockDevice, SimDisk};

pub const MIB: u64 = 1 << 20;

/// Small pools: small chunks exercise many chunks and tree levels cheaply.
pub fn small_create_opts(chunk: u32) -> CreateOptions {
    CreateOptions {
        chunk_size: chunk,
        metadata_bytes: Some(4 * MIB),
    }
}

/// A small cache, so nodes and space-map pages are evicted and re-read often.
pub fn small_open_opts() -> OpenOptions {
    OpenOptions {
        cache_bytes: 256 << 10,
        dirty_node_limit: 512,
    }
}

/// Opens a pool on an in-memory copy of `image`.
pub fn open_image(image: Vec<u8>) -> arbor_engine::Result<Pool> {
    let dev: Arc<dyn BlockDevice> = Arc::new(SimDisk::from_image(image));
    Pool::open(dev, &small_open_opts())
}

/// Runs `f` and turns a panic into an error message (campaigns count panics
/// as failures and go on).
pub fn no_panic<T>(f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(result) => result,
        Err(payload) => {
            let message = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_else(|| "(non-string panic)".into());
            Err(format!("panic: {message}"))
        }
    }
}

/// When a by-hand run stops: after a number of runs or a duration.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    pub runs: Option<u64>,
    pub duration: Option<Duration>,
    started: Instant,
}

impl Budget {
    pub fn new(runs: Option<u64>, seconds: Option<u64>) -> Self {
        Self {
            runs,
            duration: seconds.map(Duration::from_secs),
            started: Instant::now(),
        }
    }

    /// True while run number `done` (counted from 0) may start.
    pub fn more(&self, done: u64) -> bool {
        let by_runs = self.runs.is_none_or(|n| done < n);
        let by_time = self.duration.is_none_or(|d| self.started.elapsed() < d);
        by_runs && by_time && (self.runs.is_some() || self.duration.is_some() || done == 0)
    }

    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }
}
