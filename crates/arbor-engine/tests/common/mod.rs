//! Helpers shared by the engine's integration tests.
#![allow(dead_code)]

use std::sync::Arc;

use arbor_engine::{CreateOptions, OpenOptions, Pool};
use arbor_io::{BlockDevice, SimDisk};

pub const MIB: u64 = 1 << 20;

/// Small pools: 4 KiB chunks exercise many chunks and tree levels cheaply.
pub fn small_opts(chunk: u32) -> CreateOptions {
    CreateOptions {
        chunk_size: chunk,
        metadata_bytes: Some(4 * MIB),
        ..Default::default()
    }
}

pub fn open_opts() -> OpenOptions {
    OpenOptions {
        // Small enough that nodes and space-map pages are evicted constantly.
        cache_bytes: 256 << 10,
        dirty_node_limit: 512,
    }
}

pub fn sim_pool(size: u64, chunk: u32) -> (SimDisk, Pool) {
    let disk = SimDisk::new(size);
    let dev: Arc<dyn BlockDevice> = Arc::new(disk.clone());
    let pool = Pool::create(dev, &small_opts(chunk), &open_opts()).expect("create pool");
    (disk, pool)
}

pub fn reopen(disk: &SimDisk) -> Pool {
    let dev: Arc<dyn BlockDevice> = Arc::new(disk.clone());
    Pool::open(dev, &open_opts()).expect("reopen pool")
}

pub fn assert_clean(pool: &Pool) {
    let report = pool.check().expect("check runs");
    assert!(
        report.is_clean(),
        "check found problems: {:#?}",
        report.problems
    );
}

#[allow(unused_imports)]
pub use arbor_io::model::{pattern, Possible};
