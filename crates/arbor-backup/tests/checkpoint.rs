//! Checkpoints (docs/BACKUP.md, "Checkpoints"): a backup cut off goes on
//! from its last checkpoint instead of reading the snapshot again, through
//! a prune in between (which keeps what the checkpoint names); a damaged
//! checkpoint is ignored, and a prune deletes it.
// A test crate: unwrap, expect and panic are how a test reports failure.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use arbor_backup::format::config::KeySource;
use arbor_backup::store::{names, Location};
use arbor_backup::{BackupError, Progress, PruneOptions, Repository};
use rand::rngs::StdRng;
use rand::SeedableRng;

mod common;
use common::*;

async fn open(location: &Location) -> Repository {
    Repository::open(location, &KeySource::KeyFile(KEY))
        .await
        .unwrap()
        .with_checkpoint_every(Duration::ZERO)
}

/// The cut-off backup's process is gone: so is its lock (which a failing
/// store kept it from deleting; a prune would find it stale only once its
/// process had exited).
fn gone(dir: &std::path::Path) {
    for lock in files_under(&dir.join("repo").join(names::LOCKS)) {
        std::fs::remove_file(lock).unwrap();
    }
}

/// A volume of random data (`writes` writes) and snapshot `vm1@s`, its
/// backup into a new repository cut off: the store goes away after a few
/// writes (a lock, then per piece a pack or so, an index and a
/// checkpoint).
async fn cut_off(
    seed: u64,
    writes: usize,
) -> (Arc<arbor_engine::Pool>, tempfile::TempDir, Location) {
    let mut rng = StdRng::seed_from_u64(seed);
    let src = pool(512 * MIB);
    src.create_volume("vm1", VOL).unwrap();
    write_random(&src, "vm1", &mut rng, writes);
    src.snapshot("vm1@s").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let location = Location::Dir(dir.path().join("repo"));
    // 4 KiB blocks: 24 MiB is 6 map pieces.
    Repository::init(&location, 4096, &KeySource::KeyFile(KEY))
        .await
        .unwrap();
    let e = open(&location)
        .await
        .with_writes_failing_after(8)
        .backup(Arc::clone(&src), "vm1@s", "alpha", &Progress::default())
        .await
        .unwrap_err();
    assert!(matches!(e, BackupError::Store(_)), "{e}");
    (src, dir, location)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_cut_off_goes_on_from_its_checkpoint_through_a_prune() {
    let (src, dir, location) = cut_off(5, 300).await;
    let checkpoints = files_under(&dir.path().join("repo").join(names::CHECKPOINTS));
    assert_eq!(checkpoints.len(), 1, "{checkpoints:?}");
    gone(dir.path());

    // A prune meanwhile: no backup exists, but the checkpoint keeps what it
    // names.
    let repo = open(&location).await;
    let pruned = repo
        .prune(
            |_| Vec::new(),
            PruneOptions::default(),
            &Progress::default(),
        )
        .await
        .unwrap();
    assert_eq!(pruned.kept_checkpoints, 1);
    assert!(pruned.deleted_checkpoints.is_empty());

    let progress = Progress::default();
    let made = repo
        .backup(Arc::clone(&src), "vm1@s", "alpha", &progress)
        .await
        .unwrap();
    assert!(
        (1..6).contains(&made.resumed_pieces),
        "resumed after {} pieces",
        made.resumed_pieces
    );
    assert_eq!(
        progress
            .done_bytes
            .load(std::sync::atomic::Ordering::Relaxed),
        VOL
    );
    restored_equals(&repo, &made.id.to_string(), &src, "vm1@s").await;
    // Done: the checkpoint is gone.
    assert!(files_under(&dir.path().join("repo").join(names::CHECKPOINTS)).is_empty());
    let found = repo.verify(100, &Progress::default()).await.unwrap();
    assert!(found.problems.is_empty(), "{:?}", found.problems);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_checkpoint_is_ignored_and_pruned() {
    let (src, dir, location) = cut_off(6, 100).await;
    let checkpoints = files_under(&dir.path().join("repo").join(names::CHECKPOINTS));
    std::fs::write(&checkpoints[0], b"ARBCKPT1 not sealed").unwrap();
    gone(dir.path());

    let repo = open(&location).await;
    let dry = repo
        .prune(
            |_| Vec::new(),
            PruneOptions {
                dry_run: true,
                ..PruneOptions::default()
            },
            &Progress::default(),
        )
        .await
        .unwrap();
    assert_eq!(dry.deleted_checkpoints.len(), 1, "{dry:?}");
    assert_eq!(
        files_under(&dir.path().join("repo").join(names::CHECKPOINTS)).len(),
        1
    );
    // Ignored by the backup, which starts over.
    let made = repo
        .backup(Arc::clone(&src), "vm1@s", "alpha", &Progress::default())
        .await
        .unwrap();
    assert_eq!(made.resumed_pieces, 0);
    restored_equals(&repo, &made.id.to_string(), &src, "vm1@s").await;
}
