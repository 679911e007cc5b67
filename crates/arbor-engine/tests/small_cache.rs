//! Regression: with a metadata cache far smaller than one transaction's
//! changed space-map pages, committed pages whose home copies are not yet
//! written must still be served (not the stale home copy on disk).
// A test crate: unwrap, expect and panic are how a test reports failure
// (the workspace denies them in the code it ships; clippy.toml allows
// them in #[test] functions, this in the helpers around them).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;

use arbor_engine::{CreateOptions, OpenOptions, Pool};
use arbor_io::{BlockDevice, SimDisk};
use common::*;

#[test]
fn tiny_cache_never_serves_stale_space_map_pages() {
    let disk = SimDisk::new(320 * MIB);
    let dev: Arc<dyn BlockDevice> = Arc::new(disk.clone());
    let opts = CreateOptions {
        chunk_size: 4096,
        metadata_bytes: Some(16 * MIB),
        ..Default::default()
    };
    // 64 KiB of cache: 16 nodes and 16 space-map pages.
    let open = OpenOptions {
        cache_bytes: 64 * 1024,
        dirty_node_limit: 4096,
    };
    let pool = Pool::create(dev, &opts, &open).unwrap();
    let v = pool.create_volume("v", 256 * MIB).unwrap();
    // ~60 data space-map pages change in one transaction.
    let mut at = 0;
    while at < 240 * MIB {
        pool.write(v, at, &pattern(at, 0, MIB as usize)).unwrap();
        at += MIB;
    }
    pool.flush().unwrap();
    // Touch other pages (allocation scans, reads) so the cache churns.
    let w = pool.create_volume("w", 16 * MIB).unwrap();
    pool.write(w, 0, &pattern(1, 0, 8 * MIB as usize)).unwrap();
    pool.snapshot("v@s").unwrap();
    pool.discard(v, 0, 200 * MIB).unwrap();
    pool.delete("v@s").unwrap();
    while pool.reclaim(1000).unwrap() > 0 {}
    assert_clean(&pool);
    let mut buf = vec![0u8; MIB as usize];
    pool.read(v, 220 * MIB, &mut buf).unwrap();
    assert!(buf == pattern(220 * MIB, 0, MIB as usize), "data changed");
    drop(pool);
    let pool = Pool::open(Arc::new(disk.clone()), &open).unwrap();
    assert_clean(&pool);
}
