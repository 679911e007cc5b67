//! What the repository tests share: pools on simulated disks, random
//! writes, a volume's contents, a directory's files.
// A test crate: unwrap, expect and panic are how a test reports failure.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arbor_backup::{Progress, Repository};
use arbor_engine::{CreateOptions, OpenOptions, Pool};
use arbor_io::{BlockDevice, SimDisk};
use rand::rngs::StdRng;
use rand::Rng;

pub const MIB: u64 = 1 << 20;
pub const VOL: u64 = 24 * MIB;
pub const KEY: &[u8] = b"0123456789abcdef0123456789abcdef";

pub fn pool(bytes: u64) -> Arc<Pool> {
    let disk = SimDisk::new(bytes);
    let dev: Arc<dyn BlockDevice> = Arc::new(disk);
    let opts = CreateOptions {
        chunk_size: 16384,
        metadata_bytes: Some(8 * MIB),
        ..Default::default()
    };
    Arc::new(Pool::create(dev, &opts, &OpenOptions::default()).unwrap())
}

pub fn write_random(pool: &Pool, volume: &str, rng: &mut StdRng, writes: usize) {
    let id = pool.lookup(volume).unwrap();
    let size = pool.info(id).unwrap().size;
    for _ in 0..writes {
        let len = rng.gen_range(1..32) * 4096;
        let off = rng.gen_range(0..(size - len as u64) / 4096) * 4096;
        let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
        pool.write(id, off, &data).unwrap();
    }
}

pub fn contents(pool: &Pool, name: &str) -> Vec<u8> {
    let id = pool.lookup(name).unwrap();
    let mut buf = vec![0u8; pool.info(id).unwrap().size as usize];
    pool.read(id, 0, &mut buf).unwrap();
    buf
}

pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// Restores `backup` into a new pool and compares it with `snapshot`.
pub async fn restored_equals(repo: &Repository, backup: &str, source: &Pool, snapshot: &str) {
    let other = pool(256 * MIB);
    let found = repo.find(backup).await.unwrap();
    let progress = Arc::new(Progress::default());
    repo.restore(&found.id, Arc::clone(&other), "restored", &progress)
        .await
        .unwrap();
    assert!(
        contents(&other, "restored") == contents(source, snapshot),
        "the restore of {snapshot} differs"
    );
    assert!(other.check().unwrap().is_clean());
}
