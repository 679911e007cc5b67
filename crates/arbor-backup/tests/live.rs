//! Instant restores (docs/BACKUP.md, "Instant restore"): a volume read,
//! written, zeroed and trimmed while it fills, checked against a model;
//! one taken up again after the daemon stopped, keeping the client's
//! writes; one whose backup has a damaged pack, which fails only the
//! blocks that pack held.
// A test crate: unwrap, expect and panic are how a test reports failure.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use arbor_backup::format::config::KeySource;
use arbor_backup::format::ObjectId;
use arbor_backup::store::{names, Location};
use arbor_backup::{LiveRestore, Progress, Repository};
use arbor_engine::Pool;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

mod common;
use common::*;

const SECTOR: u64 = 4096;

/// What a restored volume must read: the backup's bytes, then the
/// client's changes. A trimmed sector may read anything the volume held.
struct Model {
    bytes: Vec<u8>,
    any: Vec<bool>,
}

impl Model {
    fn new(bytes: Vec<u8>) -> Self {
        let any = vec![false; bytes.len() / SECTOR as usize];
        Model { bytes, any }
    }

    fn check(&self, at: u64, got: &[u8], what: &str) {
        for (i, (want, got)) in self
            .bytes
            .chunks(SECTOR as usize)
            .zip(got.chunks(SECTOR as usize))
            .skip((at / SECTOR) as usize)
            .enumerate()
            .take(got.len() / SECTOR as usize)
        {
            let sector = at / SECTOR + i as u64;
            if !self.any[sector as usize] {
                assert!(want == got, "{what}: sector {sector} differs");
            }
        }
    }
}

/// A backup of a 24 MiB volume with random data and holes, in a new
/// directory repository; returns it with the source's contents.
async fn backed_up(dir: &std::path::Path) -> (Repository, ObjectId, Vec<u8>) {
    let mut rng = StdRng::seed_from_u64(7);
    let src = pool(256 * MIB);
    src.create_volume("vm1", VOL).unwrap();
    write_random(&src, "vm1", &mut rng, 120);
    src.snapshot("vm1@s").unwrap();
    let location = Location::Dir(dir.join("repo"));
    let repo = Repository::init(&location, 65536, &KeySource::KeyFile(KEY))
        .await
        .unwrap();
    let made = repo
        .backup(Arc::clone(&src), "vm1@s", "alpha", &Progress::default())
        .await
        .unwrap();
    (repo, made.id, contents(&src, "vm1@s"))
}

/// `n` random client requests against the restore, checked and recorded
/// in the model.
fn client(live: &LiveRestore, model: &mut Model, rng: &mut StdRng, n: usize) {
    let sectors = VOL / SECTOR;
    for _ in 0..n {
        let len = rng.gen_range(1..=40u64).min(sectors);
        let at = rng.gen_range(0..=sectors - len) * SECTOR;
        let bytes = (len * SECTOR) as usize;
        let range = at as usize..at as usize + bytes;
        let sectors_of = (at / SECTOR) as usize..((at / SECTOR) + len) as usize;
        match rng.gen_range(0..10) {
            0..=4 => {
                let mut buf = vec![0u8; bytes];
                live.read(at, &mut buf).unwrap();
                model.check(at, &buf, "a read while restoring");
            }
            5 | 6 => {
                let data: Vec<u8> = (0..bytes).map(|_| rng.gen()).collect();
                live.write(at, &data).unwrap();
                model.bytes[range].copy_from_slice(&data);
                model.any[sectors_of].fill(false);
            }
            7 | 8 => {
                live.write_zeroes(at, len * SECTOR, rng.gen()).unwrap();
                model.bytes[range].fill(0);
                model.any[sectors_of].fill(false);
            }
            _ => {
                live.trim(at, len * SECTOR).unwrap();
                model.any[sectors_of].fill(true);
            }
        }
    }
}

fn whole(pool: &Pool, name: &str) -> Vec<u8> {
    contents(pool, name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_serves_reads_and_writes_while_it_fills() {
    let dir = tempfile::tempdir().unwrap();
    let (repo, backup, source) = backed_up(dir.path()).await;
    let other = pool(256 * MIB);
    let progress = Arc::new(Progress::default());
    let live = LiveRestore::create(
        &repo,
        &backup,
        Arc::clone(&other),
        "dr",
        true,
        Arc::clone(&progress),
    )
    .await
    .unwrap();
    assert!(!live.is_complete());
    // Incomplete: no snapshot would hold its holes.
    assert!(other.snapshot("dr@early").is_err());
    let mut model = Model::new(source);

    // Before the fill, every block a request touches comes on demand.
    let (live2, mut model, mut rng) = tokio::task::spawn_blocking(move || {
        let mut rng = StdRng::seed_from_u64(11);
        client(&live, &mut model, &mut rng, 150);
        (live, model, rng)
    })
    .await
    .unwrap();
    let live = live2;
    assert!(!live.is_complete(), "150 requests restored it all");

    // Then beside it.
    let fill = {
        let live = Arc::clone(&live);
        tokio::spawn(async move { live.fill().await })
    };
    let (live, model) = tokio::task::spawn_blocking(move || {
        client(&live, &mut model, &mut rng, 300);
        (live, model)
    })
    .await
    .unwrap();
    fill.await.unwrap().unwrap();
    assert!(live.is_complete());
    let status = live.status();
    assert_eq!((status.missing, status.failed), (0, 0), "{status:?}");
    model.check(0, &whole(&other, "dr"), "the restored volume");
    assert_eq!(
        progress
            .done_bytes
            .load(std::sync::atomic::Ordering::Relaxed),
        VOL
    );
    other.snapshot("dr@after").unwrap();
    assert!(other.check().unwrap().is_clean());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_taken_up_after_a_stop_keeps_what_clients_wrote() {
    let dir = tempfile::tempdir().unwrap();
    let (repo, backup, source) = backed_up(dir.path()).await;
    let other = pool(256 * MIB);
    let mut model = Model::new(source);
    let live = LiveRestore::create(
        &repo,
        &backup,
        Arc::clone(&other),
        "dr",
        true,
        Arc::new(Progress::default()),
    )
    .await
    .unwrap();
    let (live, model2) = tokio::task::spawn_blocking(move || {
        let mut rng = StdRng::seed_from_u64(12);
        client(&live, &mut model, &mut rng, 200);
        (live, model)
    })
    .await
    .unwrap();
    model = model2;
    // The daemon stops (its fill never ran): what is flushed stays.
    other.flush().unwrap();
    live.release().await;
    drop(live);
    let id = other.lookup("dr").unwrap();
    other.set_incomplete(id, None);

    let progress = Arc::new(Progress::default());
    let live = LiveRestore::resume(
        &repo,
        &backup,
        Arc::clone(&other),
        "dr",
        Arc::clone(&progress),
    )
    .await
    .unwrap();
    assert!(other.snapshot("dr@early").is_err());
    let before = progress
        .done_bytes
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(before > 0 && before < VOL, "{before}");
    let (live, model) = tokio::task::spawn_blocking(move || {
        let mut rng = StdRng::seed_from_u64(13);
        client(&live, &mut model, &mut rng, 50);
        (live, model)
    })
    .await
    .unwrap();
    live.fill().await.unwrap();
    assert!(live.is_complete());
    model.check(0, &whole(&other, "dr"), "the resumed restore");
    assert!(other.check().unwrap().is_clean());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_pack_fails_only_its_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let (repo, backup, source) = backed_up(dir.path()).await;
    let packs = files_under(&dir.path().join("repo").join(names::PACKS));
    let victim = packs
        .iter()
        .max_by_key(|p| p.metadata().unwrap().len())
        .unwrap();
    let mut bytes = std::fs::read(victim).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x01;
    std::fs::write(victim, &bytes).unwrap();

    let other = pool(256 * MIB);
    let live = LiveRestore::create(
        &repo,
        &backup,
        Arc::clone(&other),
        "dr",
        true,
        Arc::new(Progress::default()),
    )
    .await
    .unwrap();
    let e = live.fill().await.unwrap_err();
    assert!(e.to_string().contains("could not be restored"), "{e}");
    let status = live.status();
    assert!(!live.is_complete());
    assert!(
        status.failed >= 1 && status.failed == status.missing,
        "{status:?}"
    );
    let first = status.first_failure.unwrap();
    let block: u64 = first
        .strip_prefix("block ")
        .and_then(|s| s.split(':').next())
        .unwrap()
        .parse()
        .unwrap();
    let model = Model::new(source);
    let (live, other) = tokio::task::spawn_blocking(move || {
        // Its reads fail, never returning wrong bytes; others' succeed.
        let mut buf = vec![0u8; 65536];
        let e = live.read(block * 65536, &mut buf).unwrap_err();
        assert!(e.to_string().contains("cannot be restored"), "{e}");
        let good = if block == 0 { 1 } else { block - 1 };
        if live.read(good * 65536, &mut buf).is_ok() {
            model.check(good * 65536, &buf, "a good block");
        }
        // A whole write over it mends it.
        live.write(block * 65536, &vec![7u8; 65536]).unwrap();
        live.read(block * 65536, &mut buf).unwrap();
        assert_eq!(buf, vec![7u8; 65536]);
        (live, other)
    })
    .await
    .unwrap();
    let status = live.status();
    assert_eq!(status.failed, status.missing);
    assert!(other.check().unwrap().is_clean());
}
