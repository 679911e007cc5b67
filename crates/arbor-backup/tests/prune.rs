//! `prune` and repository locks, on real pools (simulated disks) and a
//! local directory repository: forgotten backups' data deleted and the
//! rest restoring byte for byte; a dry run that changes nothing and lists
//! exactly what the prune then deletes; a prune cut off after every one of
//! its writes and deletes, leaving a repository that restores and
//! verifies clean; locks that keep a prune and a backup apart, and stale
//! locks that do not.
// A test crate: unwrap, expect and panic are how a test reports failure.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use arbor_backup::format::config::KeySource;
use arbor_backup::format::ObjectId;
use arbor_backup::lock::LockKind;
use arbor_backup::store::{names, Location};
use arbor_backup::{BackupError, Listing, Progress, PruneOptions, Pruned, Repository};
use arbor_engine::Pool;
use rand::rngs::StdRng;
use rand::SeedableRng;

mod common;
use common::*;

/// Every object in the repository, relative to its directory.
fn objects(dir: &Path) -> BTreeSet<String> {
    files_under(dir)
        .into_iter()
        .map(|p| p.strip_prefix(dir).unwrap().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with(names::LOCKS))
        .collect()
}

fn copy_dir(from: &Path, to: &Path) {
    for f in files_under(from) {
        let rel = f.strip_prefix(from).unwrap();
        let dest = to.join(rel);
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        std::fs::copy(&f, &dest).unwrap();
    }
}

async fn open(location: &Location) -> Repository {
    Repository::open(location, &KeySource::KeyFile(KEY))
        .await
        .unwrap()
}

/// A repository with four backups of one volume (each an incremental of
/// the one before) and one of a clone; returns the source pool and the
/// backups' ids by snapshot name.
async fn history(location: &Location) -> (Arc<Pool>, Vec<(String, ObjectId)>) {
    let mut rng = StdRng::seed_from_u64(7);
    let src = pool(512 * MIB);
    src.create_volume("vm1", VOL).unwrap();
    let repo = Repository::init(location, 65536, &KeySource::KeyFile(KEY))
        .await
        .unwrap();
    let mut made = Vec::new();
    for (i, writes) in [300, 60, 60, 60].into_iter().enumerate() {
        write_random(&src, "vm1", &mut rng, writes);
        made.push(snapshot_and_back_up(&repo, &src, format!("vm1@s{i}")).await);
    }
    src.clone_snapshot("vm1@s1", "clone").unwrap();
    write_random(&src, "clone", &mut rng, 20);
    src.snapshot("clone@c").unwrap();
    let m = repo
        .backup(Arc::clone(&src), "clone@c", "alpha", &Progress::default())
        .await
        .unwrap();
    made.push(("clone@c".into(), m.id));
    (src, made)
}

/// Takes snapshot `snap` of `src` and backs it up: its name and the
/// backup's id.
async fn snapshot_and_back_up(
    repo: &Repository,
    src: &Arc<Pool>,
    snap: String,
) -> (String, ObjectId) {
    src.snapshot(&snap).unwrap();
    let m = repo
        .backup(Arc::clone(src), &snap, "alpha", &Progress::default())
        .await
        .unwrap();
    (snap, m.id)
}

/// Prunes `repo`, forgetting `ids`.
async fn prune(repo: &Repository, ids: Vec<ObjectId>) -> Result<Pruned, BackupError> {
    repo.prune(forget(ids), PruneOptions::default(), &Progress::default())
        .await
}

/// What pruning `repo` of `ids` would do.
async fn dry_run(repo: &Repository, ids: Vec<ObjectId>) -> Pruned {
    let options = PruneOptions {
        dry_run: true,
        ..PruneOptions::default()
    };
    repo.prune(forget(ids), options, &Progress::default())
        .await
        .unwrap()
}

fn forget(ids: Vec<ObjectId>) -> impl FnOnce(&[Listing]) -> Vec<ObjectId> {
    move |_| ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prune_deletes_what_no_backup_needs_and_its_dry_run_says_exactly_what() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("repo");
    let location = Location::Dir(root.clone());
    let (src, made) = history(&location).await;
    let repo = open(&location).await;

    // Nothing forgotten: nothing to do.
    let before = objects(&root);
    let nothing = prune(&repo, vec![]).await.unwrap();
    assert!(nothing.deleted_packs.is_empty() && nothing.repacked_packs.is_empty());
    assert_eq!(objects(&root), before);

    // Forget the first two backups of vm1 (s2 and s3 were made from
    // them; the clone shares their blocks).
    let gone = vec![made[0].1, made[1].1];
    let dry = dry_run(&repo, gone.clone()).await;
    assert_eq!(objects(&root), before, "a dry run changed the repository");
    assert_eq!(dry.forgotten.len(), 2);
    assert_eq!(dry.kept_backups, 3);
    assert!(
        !dry.deleted_packs.is_empty() || !dry.repacked_packs.is_empty(),
        "{dry:?}"
    );
    assert!(dry.removed_blobs > 0, "{dry:?}");

    // A pack to repack damaged: the prune stops before deleting anything.
    assert!(!dry.repacked_packs.is_empty(), "{dry:?}");
    let victim = root.join(&dry.repacked_packs[0]);
    let pristine = std::fs::read(&victim).unwrap();
    let mut flipped = pristine.clone();
    flipped[200] ^= 4;
    std::fs::write(&victim, &flipped).unwrap();
    let e = prune(&repo, gone.clone()).await.unwrap_err();
    assert!(matches!(e, BackupError::Damaged { .. }), "{e}");
    assert!(e.to_string().contains(&dry.repacked_packs[0]), "{e}");
    assert_eq!(objects(&root), before, "a failed prune left a trace");
    assert_eq!(repo.list().await.unwrap().len(), 5, "a failed prune forgot");
    std::fs::write(&victim, &pristine).unwrap();

    let done = prune(&repo, gone.clone()).await.unwrap();
    assert_eq!(done.deleted_packs, dry.deleted_packs);
    assert_eq!(done.repacked_packs, dry.repacked_packs);
    assert_eq!(done.removed_blobs, dry.removed_blobs);
    assert_eq!(done.written_packs, dry.written_packs);
    let after = objects(&root);
    // Exactly what the dry run listed is gone, with the old indexes and
    // the forgotten manifests; what was added is new packs and indexes.
    let removed: BTreeSet<String> = before.difference(&after).cloned().collect();
    let mut expected: BTreeSet<String> = dry
        .deleted_packs
        .iter()
        .chain(&dry.repacked_packs)
        .chain(&dry.replaced_indexes)
        .cloned()
        .collect();
    expected.extend(gone.iter().map(names::snapshot));
    assert_eq!(removed, expected);
    for added in after.difference(&before) {
        assert!(
            added.starts_with(names::PACKS) || added.starts_with(names::INDEX),
            "{added}"
        );
    }
    assert!(done.bytes_after < done.bytes_before, "{done:?}");

    // What stays restores byte for byte and verifies clean; what was
    // forgotten is gone.
    let repo = open(&location).await;
    for (snap, id) in &made[2..] {
        restored_equals(&repo, &id.to_string(), &src, snap).await;
    }
    for id in &gone {
        assert!(matches!(
            repo.manifest(id).await,
            Err(BackupError::NotFound(_))
        ));
    }
    let verified = repo.verify(100, &Progress::default()).await.unwrap();
    assert!(verified.problems.is_empty(), "{verified:?}");
    // A second prune finds nothing more to do.
    let again = prune(&repo, vec![]).await.unwrap();
    assert!(
        again.deleted_packs.is_empty() && again.repacked_packs.is_empty(),
        "{again:?}"
    );
    // A backup after the prune finds its base and adds only what changed.
    src.snapshot("vm1@s4").unwrap();
    let next = repo
        .backup(Arc::clone(&src), "vm1@s4", "alpha", &Progress::default())
        .await
        .unwrap();
    assert_eq!(next.base, Some(made[3].1));
    assert_eq!(next.manifest.added_blobs, 0, "{:?}", next.manifest);
    restored_equals(&repo, &next.id.to_string(), &src, "vm1@s4").await;
}

/// Packs in the repository at `root`, with their sizes.
fn packs(root: &Path) -> Vec<(String, u64)> {
    objects(root)
        .into_iter()
        .filter(|n| n.starts_with(names::PACKS))
        .map(|n| {
            let size = std::fs::metadata(root.join(&n)).unwrap().len();
            (n, size)
        })
        .collect()
}

/// Backups that each change a little leave a small pack each; a prune
/// combines them (when two or more are small) into one, lists exactly
/// those it combined, and every backup still restores byte for byte and
/// verifies clean. A second prune leaves the combined pack alone, and a
/// prune told not to combine (`small_pack_bytes: 0`) combines nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prune_combines_small_packs_into_one() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("repo");
    let location = Location::Dir(root.clone());
    let mut rng = StdRng::seed_from_u64(12);
    let src = pool(256 * MIB);
    src.create_volume("db", VOL).unwrap();
    let repo = Repository::init(&location, 65536, &KeySource::KeyFile(KEY))
        .await
        .unwrap();
    let mut made = Vec::new();
    for i in 0..6 {
        write_random(&src, "db", &mut rng, 4);
        made.push(snapshot_and_back_up(&repo, &src, format!("db@s{i}")).await);
    }
    let before = packs(&root);
    assert_eq!(before.len(), 6, "{before:?}");
    assert!(before.iter().all(|(_, size)| *size < 4 * MIB), "{before:?}");

    let never = PruneOptions {
        dry_run: true,
        small_pack_bytes: 0,
        ..PruneOptions::default()
    };
    let kept = repo
        .prune(forget(vec![]), never, &Progress::default())
        .await
        .unwrap();
    assert!(kept.repacked_packs.is_empty() && kept.small_packs.is_empty());

    let dry = dry_run(&repo, vec![]).await;
    assert_eq!(packs(&root), before, "a dry run changed the repository");
    let names: Vec<String> = before.iter().map(|(n, _)| n.clone()).collect();
    assert_eq!(dry.small_packs, names);
    assert_eq!(dry.repacked_packs, names);
    assert!(dry.deleted_packs.is_empty());
    assert_eq!(dry.written_packs, 1);

    let done = prune(&repo, vec![]).await.unwrap();
    assert_eq!(done.small_packs, dry.small_packs);
    assert_eq!(done.written_packs, 1);
    assert_eq!(done.removed_blobs, 0);
    let after = packs(&root);
    assert_eq!(after.len(), 1, "{after:?}");
    assert!(!names.contains(&after[0].0));

    let repo = open(&location).await;
    for (snap, id) in &made {
        restored_equals(&repo, &id.to_string(), &src, snap).await;
    }
    let verified = repo.verify(100, &Progress::default()).await.unwrap();
    assert!(verified.problems.is_empty(), "{verified:?}");
    let again = prune(&repo, vec![]).await.unwrap();
    assert!(again.repacked_packs.is_empty(), "{again:?}");
    assert_eq!(packs(&root), after);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prune_cut_off_after_any_write_leaves_a_repository_that_restores_and_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let original = dir.path().join("original");
    let (src, made) = history(&Location::Dir(original.clone())).await;
    let gone = vec![made[0].1, made[1].1, made[4].1];
    let kept = [&made[2], &made[3]];
    let mut cut = 0u64;
    loop {
        let root = dir.path().join(format!("cut{cut}"));
        copy_dir(&original, &root);
        let location = Location::Dir(root.clone());
        // The lock takes one write; the cut falls on each later write or
        // delete in turn.
        let repo = open(&location).await.with_writes_failing_after(cut + 1);
        let result = prune(&repo, gone.clone()).await;
        // A lock the cut-off prune could not delete goes stale; here it
        // is simply removed.
        let _ = std::fs::remove_dir_all(root.join(names::LOCKS));
        let repo = open(&location).await;
        let verified = repo.verify(100, &Progress::default()).await.unwrap();
        assert!(verified.problems.is_empty(), "cut {cut}: {verified:?}");
        for (snap, id) in kept {
            restored_equals(&repo, &id.to_string(), &src, snap).await;
        }
        // The next prune finishes the work.
        prune(&repo, gone.clone()).await.unwrap();
        let verified = repo.verify(100, &Progress::default()).await.unwrap();
        assert!(
            verified.problems.is_empty(),
            "cut {cut}, pruned again: {verified:?}"
        );
        assert_eq!(verified.backups, 2);
        for (snap, id) in kept {
            restored_equals(&repo, &id.to_string(), &src, snap).await;
        }
        std::fs::remove_dir_all(&root).unwrap();
        match result {
            Ok(_) => break,
            Err(e) => assert!(matches!(e, BackupError::Store(_)), "cut {cut}: {e}"),
        }
        cut += 1;
        assert!(cut < 200, "a prune of five backups wrote 200 times");
    }
    assert!(cut >= 5, "the prune ran to its end after {cut} writes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prune_and_a_backup_keep_apart_and_stale_locks_do_not_stop_either() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("repo");
    let location = Location::Dir(root.clone());
    let (src, made) = history(&location).await;
    let a = open(&location).await;
    let b = open(&location).await;

    // A backup (shared lock) holds the repository: a prune waits, a
    // restore does not.
    let shared = a.lock(LockKind::Shared, "backup vm1@x").await.unwrap();
    let e = prune(&b, vec![made[0].1]).await.unwrap_err();
    assert!(matches!(e, BackupError::Locked(_)), "{e}");
    assert!(e.to_string().contains("backup vm1@x"), "{e}");
    restored_equals(&b, &made[3].1.to_string(), &src, "vm1@s3").await;
    assert_eq!(b.list().await.unwrap().len(), 5, "a refused prune forgot");
    shared.release().await;

    // A prune (exclusive) holds it: a backup and a restore are refused.
    let exclusive = a.lock(LockKind::Exclusive, "prune").await.unwrap();
    src.snapshot("vm1@late").unwrap();
    let e = b
        .backup(Arc::clone(&src), "vm1@late", "alpha", &Progress::default())
        .await
        .unwrap_err();
    assert!(matches!(e, BackupError::Locked(_)), "{e}");
    let other = pool(256 * MIB);
    let e = b
        .restore(
            &made[3].1,
            Arc::clone(&other),
            "r",
            &Arc::new(Progress::default()),
        )
        .await
        .unwrap_err();
    assert!(matches!(e, BackupError::Locked(_)), "{e}");
    assert!(other.lookup("r").is_err());

    // The prune's holder stopped rewriting its lock 31 minutes ago (by
    // the store's clock): it is stale, and the backup goes on.
    let file = root.join(exclusive.name());
    let old = SystemTime::now() - Duration::from_secs(31 * 60);
    std::fs::File::options()
        .write(true)
        .open(&file)
        .unwrap()
        .set_modified(old)
        .unwrap();
    let late = b
        .backup(Arc::clone(&src), "vm1@late", "alpha", &Progress::default())
        .await
        .unwrap();
    // A stale shared lock does not stop a prune either, which deletes it.
    let stale = a.lock(LockKind::Shared, "backup vm1@y").await.unwrap();
    std::fs::File::options()
        .write(true)
        .open(root.join(stale.name()))
        .unwrap()
        .set_modified(old)
        .unwrap();
    let dry = dry_run(&b, vec![made[0].1]).await;
    assert_eq!(dry.stale_locks.len(), 2, "{dry:?}");
    assert!(file.exists(), "a dry run deleted a stale lock");
    let pruned = prune(&b, vec![made[0].1]).await.unwrap();
    assert_eq!(pruned.stale_locks.len(), 2, "{pruned:?}");
    assert!(
        pruned
            .stale_locks
            .iter()
            .all(|l| l.contains("not rewritten for")),
        "{pruned:?}"
    );
    assert!(!file.exists());
    restored_equals(&b, &late.id.to_string(), &src, "vm1@late").await;
    drop(exclusive);
    drop(stale);
}
