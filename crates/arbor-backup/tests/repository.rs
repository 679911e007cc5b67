//! Backups of real pools (on simulated disks) into a local directory
//! repository: full, incremental and deduplicated across clones, each
//! restored into another pool and compared byte for byte; a repository
//! reopened, a backup cut off before its indexes, a wrong key, and a store
//! whose objects were damaged, replaced or deleted.
// A test crate: unwrap, expect and panic are how a test reports failure.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use arbor_backup::format::config::KeySource;
use arbor_backup::store::{names, Location};
use arbor_backup::{BackupError, Progress, Repository};
use rand::rngs::StdRng;
use rand::SeedableRng;

mod common;
use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_incremental_and_cloned_backups_restore_byte_for_byte() {
    let mut rng = StdRng::seed_from_u64(1);
    let src = pool(512 * MIB);
    src.create_volume("vm1", VOL).unwrap();
    write_random(&src, "vm1", &mut rng, 200);
    src.snapshot("vm1@one").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let location = Location::Dir(dir.path().join("repo"));
    let repo = Repository::init(&location, 65536, &KeySource::KeyFile(KEY))
        .await
        .unwrap();

    // Full.
    let progress = Progress::default();
    let one = repo
        .backup(Arc::clone(&src), "vm1@one", "alpha", &progress)
        .await
        .unwrap();
    assert!(one.base.is_none());
    assert!(one.manifest.added_bytes > 4 * MIB, "{:?}", one.manifest);
    assert!(src.holds(src.lookup("vm1@one").unwrap()).unwrap().len() == 1);
    restored_equals(&repo, &one.id.to_string(), &src, "vm1@one").await;

    // Incremental: a few writes, only their blocks uploaded.
    write_random(&src, "vm1", &mut rng, 5);
    src.snapshot("vm1@two").unwrap();
    let two = repo
        .backup(Arc::clone(&src), "vm1@two", "alpha", &progress)
        .await
        .unwrap();
    assert_eq!(two.base, Some(one.id));
    assert_eq!(two.manifest.parent, Some(one.id.to_string()));
    // Five writes of at most 124 KiB touch at most 3 blocks each, plus
    // the map pieces.
    assert!(two.manifest.added_blobs <= 5 * 3 + 1, "{:?}", two.manifest);
    restored_equals(&repo, &two.id.to_string()[..12], &src, "vm1@two").await;
    // The newest backed-up snapshot holds the hold; the older one is free.
    let tag = arbor_backup::hold_tag(repo.id());
    assert_eq!(
        src.holds(src.lookup("vm1@two").unwrap()).unwrap(),
        vec![tag.clone()]
    );
    assert!(src
        .holds(src.lookup("vm1@one").unwrap())
        .unwrap()
        .is_empty());

    // An older snapshot backed up after a newer one: the newer keeps its
    // hold (the next backup's base); the older gets one too.
    let again = repo
        .backup(Arc::clone(&src), "vm1@one", "alpha", &progress)
        .await
        .unwrap();
    assert_eq!(again.manifest.added_blobs, 0, "{:?}", again.manifest);
    assert_eq!(
        src.holds(src.lookup("vm1@two").unwrap()).unwrap(),
        vec![tag.clone()]
    );
    assert_eq!(
        src.holds(src.lookup("vm1@one").unwrap()).unwrap(),
        vec![tag.clone()]
    );
    src.release("vm1@one", &tag).unwrap();

    // A clone of one with a few writes: a volume of its own (a full
    // backup), whose unchanged blocks the repository already has.
    src.clone_snapshot("vm1@one", "clone").unwrap();
    write_random(&src, "clone", &mut rng, 3);
    src.snapshot("clone@x").unwrap();
    let cloned = repo
        .backup(Arc::clone(&src), "clone@x", "alpha", &progress)
        .await
        .unwrap();
    assert!(cloned.base.is_none());
    assert!(
        cloned.manifest.added_blobs <= 3 * 3 + 1,
        "a clone stored its shared blocks again: {:?}",
        cloned.manifest
    );
    restored_equals(&repo, &cloned.id.to_string(), &src, "clone@x").await;

    // A discard: blocks that read as zeros leave the map.
    let vm1 = src.lookup("vm1").unwrap();
    src.discard(vm1, 0, VOL / 2).unwrap();
    src.snapshot("vm1@three").unwrap();
    let three = repo
        .backup(Arc::clone(&src), "vm1@three", "alpha", &progress)
        .await
        .unwrap();
    assert!(three.manifest.blocks < two.manifest.blocks);
    restored_equals(&repo, &three.id.to_string(), &src, "vm1@three").await;

    // Reopened with the key: everything is listed and nothing uploads
    // again.
    let repo = Repository::open(&location, &KeySource::KeyFile(KEY))
        .await
        .unwrap();
    let listed = repo.list().await.unwrap();
    assert_eq!(listed.len(), 5);
    src.snapshot("vm1@four").unwrap();
    let four = repo
        .backup(Arc::clone(&src), "vm1@four", "alpha", &progress)
        .await
        .unwrap();
    assert_eq!(four.base, Some(three.id));
    assert_eq!(four.manifest.added_blobs, 0, "{:?}", four.manifest);

    // Nothing of the data is readable in the store.
    let needle = &contents(&src, "vm1@two")[VOL as usize - 8192..VOL as usize - 4096];
    for file in files_under(dir.path()) {
        let bytes = std::fs::read(&file).unwrap();
        if needle.iter().any(|&b| b != 0) {
            assert!(
                !bytes.windows(64).any(|w| w == &needle[..64]),
                "{} holds plaintext",
                file.display()
            );
        }
    }
    assert!(src.check().unwrap().is_clean());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_key_and_a_damaged_store_are_refused_and_never_restored() {
    let mut rng = StdRng::seed_from_u64(2);
    let src = pool(256 * MIB);
    src.create_volume("vm1", VOL).unwrap();
    write_random(&src, "vm1", &mut rng, 100);
    src.snapshot("vm1@s").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let location = Location::Dir(dir.path().join("repo"));
    let repo = Repository::init(&location, 65536, &KeySource::KeyFile(KEY))
        .await
        .unwrap();
    let made = repo
        .backup(Arc::clone(&src), "vm1@s", "alpha", &Progress::default())
        .await
        .unwrap();

    let clean = repo.verify(100, &Progress::default()).await.unwrap();
    assert!(clean.problems.is_empty(), "{clean:?}");
    assert_eq!(clean.backups, 1);
    assert_eq!(clean.packs_read, clean.packs_total);
    assert!(clean.blobs_checked > 0);

    // A second init does not replace the repository.
    let again = Repository::init(&location, 65536, &KeySource::KeyFile(KEY)).await;
    assert!(matches!(again, Err(BackupError::Refused(_))), "{again:?}");
    // The wrong key, or a passphrase where a key file was used.
    let wrong = Repository::open(&location, &KeySource::KeyFile(b"another key")).await;
    assert!(wrong.unwrap_err().to_string().contains("wrong key"));
    assert!(Repository::open(&location, &KeySource::Passphrase(KEY))
        .await
        .is_err());

    // Indexes lost (a backup cut off before writing them): the packs'
    // headers are read instead, and the restore still works.
    let repo_dir = dir.path().join("repo");
    for f in files_under(&repo_dir.join(names::INDEX)) {
        std::fs::remove_file(f).unwrap();
    }
    let repo = Repository::open(&location, &KeySource::KeyFile(KEY))
        .await
        .unwrap();
    restored_equals(&repo, &made.id.to_string(), &src, "vm1@s").await;

    // A byte of a pack flipped: the restore fails naming the pack, and no
    // volume is left behind.
    let packs = files_under(&repo_dir.join(names::PACKS));
    assert!(!packs.is_empty());
    let victim = &packs[0];
    let original = std::fs::read(victim).unwrap();
    let mut bytes = original.clone();
    bytes[100] ^= 0x10;
    std::fs::write(victim, &bytes).unwrap();
    let found = repo.verify(100, &Progress::default()).await.unwrap();
    assert!(
        found
            .problems
            .iter()
            .any(|p| p.contains("not what its name says")),
        "{found:?}"
    );
    let other = pool(256 * MIB);
    let e = repo
        .restore(
            &made.id,
            Arc::clone(&other),
            "r",
            &Arc::new(Progress::default()),
        )
        .await
        .unwrap_err();
    assert!(matches!(e, BackupError::Damaged { .. }), "{e}");
    assert!(e.to_string().contains("packs/"), "{e}");
    assert!(
        other.lookup("r").is_err(),
        "a failed restore left its volume"
    );

    // The pack deleted: the restore names the missing blob.
    std::fs::remove_file(victim).unwrap();
    let found = Repository::open(&location, &KeySource::KeyFile(KEY))
        .await
        .unwrap()
        .verify(100, &Progress::default())
        .await
        .unwrap();
    assert!(
        found.problems.iter().any(|p| p.contains("needs blob")),
        "{found:?}"
    );
    let e = repo
        .restore(
            &made.id,
            Arc::clone(&other),
            "r",
            &Arc::new(Progress::default()),
        )
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains("packs/") || e.to_string().contains("needs blob"),
        "{e}"
    );
    assert!(other.lookup("r").is_err());

    // The manifest replaced by another object's bytes: refused by name.
    std::fs::write(victim, &original).unwrap();
    let manifest = repo_dir.join(names::snapshot(&made.id));
    std::fs::write(&manifest, b"ARBSNAP1 not a backup").unwrap();
    let e = repo.manifest(&made.id).await.unwrap_err();
    assert!(matches!(e, BackupError::Damaged { .. }), "{e}");
}
