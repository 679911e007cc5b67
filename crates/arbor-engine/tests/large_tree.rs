//! A mapping tree of 80,000 extents (three levels: packed leaves hold up to
//! 448 extents, internal nodes 169 children), shared with a snapshot,
//! then mostly discarded in random order: contents stay right, `check` stays
//! clean, and underfull nodes merge so metadata shrinks with the mapping.
//! (In a version 9 pool: a version 10 pool's checksums are kept per leaf of
//! 981 physical chunks here, so a tenth of the chunks left scattered keeps
//! every such leaf; `checksums.rs` covers them.)
// A test crate: unwrap, expect and panic are how a test reports failure
// (the workspace denies them in the code it ships; clippy.toml allows
// them in #[test] functions, this in the helpers around them).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;

use arbor_engine::{CreateOptions, Pool};
use arbor_io::{BlockDevice, SimDisk};
use common::*;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;

#[test]
fn big_tree_survives_sharing_and_mass_discard() {
    let disk = SimDisk::new(448 * MIB);
    let dev: Arc<dyn BlockDevice> = Arc::new(disk.clone());
    let opts = CreateOptions {
        chunk_size: 4096,
        metadata_bytes: Some(24 * MIB),
        format_version: arbor_format::FormatVersion::new(9).unwrap(),
        ..Default::default()
    };
    let pool = Pool::create(dev, &opts, &open_opts()).unwrap();
    let v = pool.create_volume("v", 640 * MIB).unwrap();
    // Every other chunk: no two extents can merge, so each is its own entry.
    let chunks: Vec<u64> = (0..80_000u64).map(|i| i * 2).collect();
    for &c in &chunks {
        pool.write(v, c * 4096, &pattern(c, 0, 4096)).unwrap();
    }
    pool.flush().unwrap();
    let meta_full = pool.pool_stats().unwrap().metadata_used_bytes;
    assert!(
        meta_full > 170 * 4096,
        "expected a three-level tree, metadata is only {meta_full} bytes"
    );
    let snap = pool.snapshot("v@s").unwrap();

    let mut order = chunks.clone();
    order.shuffle(&mut StdRng::seed_from_u64(9));
    let (gone, kept) = order.split_at(72_000);
    for &c in gone {
        pool.discard(v, c * 4096, 4096).unwrap();
    }
    let mut buf = vec![0u8; 4096];
    for &c in gone.iter().step_by(97) {
        pool.read(v, c * 4096, &mut buf).unwrap();
        assert!(
            buf.iter().all(|&b| b == 0),
            "discarded chunk {c} still has data"
        );
        pool.read(snap, c * 4096, &mut buf).unwrap();
        assert!(buf == pattern(c, 0, 4096), "snapshot lost chunk {c}");
    }
    for &c in kept.iter().step_by(13) {
        pool.read(v, c * 4096, &mut buf).unwrap();
        assert!(buf == pattern(c, 0, 4096), "kept chunk {c} changed");
    }
    assert_eq!(pool.info(v).unwrap().mapped_bytes, 8000 * 4096);
    assert_clean(&pool);

    pool.delete("v@s").unwrap();
    while pool.reclaim(1000).unwrap() > 0 {}
    let meta_after = pool.pool_stats().unwrap().metadata_used_bytes;
    assert!(
        meta_after * 4 < meta_full,
        "10% of the mapping left but metadata only fell from {meta_full} to {meta_after} bytes"
    );
    assert_clean(&pool);
    pool.close().unwrap();
    let pool = reopen(&disk);
    let v = pool.lookup("v").unwrap();
    for &c in kept.iter().step_by(7) {
        pool.read(v, c * 4096, &mut buf).unwrap();
        assert!(
            buf == pattern(c, 0, 4096),
            "kept chunk {c} changed after reopen"
        );
    }
    assert_clean(&pool);
}
