//! Helpers shared by the engine's integration tests.
#![allow(dead_code)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};

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

/// A pool on `disk` whose commits journal 16 pages, so that steps which
/// touch many space-map pages run over several commits.
pub fn small_journal_pool(disk: &SimDisk, chunk: u32) -> Pool {
    let dev: Arc<dyn BlockDevice> = Arc::new(disk.clone());
    let opts = CreateOptions {
        journal_pages: Some(16),
        ..small_opts(chunk)
    };
    Pool::create(dev, &opts, &open_opts()).expect("create pool")
}

pub fn data_used(pool: &Pool) -> u64 {
    pool.pool_stats().expect("pool stats").data_used_bytes
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

/// A device whose flushes wait while the gate is closed.
pub struct FlushGate {
    pub disk: SimDisk,
    closed: Mutex<bool>,
    changed: Condvar,
    pub blocked: AtomicBool,
}

impl FlushGate {
    pub fn new(disk: SimDisk) -> Self {
        Self {
            disk,
            closed: Mutex::new(false),
            changed: Condvar::new(),
            blocked: AtomicBool::new(false),
        }
    }

    pub fn close(&self) {
        *self.closed.lock().unwrap() = true;
    }

    pub fn open(&self) {
        *self.closed.lock().unwrap() = false;
        self.changed.notify_all();
    }

    pub fn wait_for_blocked_flush(&self) {
        let mut closed = self.closed.lock().unwrap();
        while !self.blocked.load(Ordering::SeqCst) {
            closed = self.changed.wait(closed).unwrap();
        }
        drop(closed);
    }
}

impl BlockDevice for FlushGate {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.disk.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.disk.write_at(buf, offset)
    }
    fn flush(&self) -> std::io::Result<()> {
        let mut closed = self.closed.lock().unwrap();
        if *closed {
            self.blocked.store(true, Ordering::SeqCst);
            self.changed.notify_all();
            while *closed {
                closed = self.changed.wait(closed).unwrap();
            }
            self.blocked.store(false, Ordering::SeqCst);
        }
        drop(closed);
        self.disk.flush()
    }
    fn size(&self) -> u64 {
        self.disk.size()
    }
}
