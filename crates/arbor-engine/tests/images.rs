//! Backward compatibility against frozen pool images: `tests/images/vN.pool.zst`
//! was made once by the code of format version N (tests/images/README.md
//! names the commit; `gen/gen_image.rs` is the generator) and
//! `vN.manifest` records what that code read back. Today's code must open
//! each image, find it clean and as recorded, upgrade it to the newest
//! version, and serve it: reads, writes over shared chunks, snapshots,
//! clones, reclaim, growth, and a reopen.
// A test crate: unwrap, expect and panic are how a test reports failure
// (the workspace denies them in the code it ships; clippy.toml allows
// them in #[test] functions, this in the helpers around them).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
#[path = "images/manifest.rs"]
mod manifest;

use std::collections::BTreeMap;
use std::sync::Arc;

use arbor_engine::{GrowOptions, OpenOptions, Pool};
use arbor_format::FormatVersion;
use arbor_io::{BlockDevice, SimDisk};
use common::assert_clean;
use manifest::{image_bytes, image_dir, manifest, pattern};

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;

fn image(version: FormatVersion) -> SimDisk {
    SimDisk::from_image(image_bytes(version))
}

fn open(disk: &SimDisk) -> Pool {
    let dev: Arc<dyn BlockDevice> = Arc::new(disk.clone());
    Pool::open(dev, &OpenOptions::default()).expect("today's code opens the image")
}

/// Loads the keys of the image's encrypted volumes (version 11 on): each
/// volume's key record from the pool's key store, opened with the raw key
/// the manifest gives.
fn unlock(pool: &Pool, version: FormatVersion) {
    let m = manifest(version);
    for (volume, hex) in &m.keys {
        unlock_volume(pool, volume, hex);
    }
    // A finished raw receive of the encrypted volume's snapshot (version
    // 12 on): the same data key, in a slot of its own.
    if let (Some(hex), Ok(_)) = (m.keys.get("sealed"), pool.lookup("inbound")) {
        unlock_volume(pool, "inbound", hex);
    }
}

fn unlock_volume(pool: &Pool, volume: &str, hex: &str) {
    let slot = pool
        .info(pool.lookup(volume).unwrap())
        .unwrap()
        .key_slot
        .expect("the manifest's encrypted volume is encrypted");
    let store = pool
        .property(None, arbor_crypt::KEY_STORE_PROPERTY)
        .unwrap()
        .expect("the pool has a key store");
    let store = arbor_crypt::KeyStore::decode(&store).unwrap();
    let record = store.get(slot).expect("the slot's record");
    let user = arbor_crypt::UserKey::raw_from_file(hex.as_bytes()).unwrap();
    let data_key = record
        .unwrap_key(&user)
        .expect("the manifest's key opens it");
    let cipher = arbor_crypt::VolumeCipher::new(data_key, record.key_id, record.unit).unwrap();
    pool.load_key(slot, cipher).unwrap();
}

fn content(pool: &Pool, name: &str) -> Vec<u8> {
    let id = pool.lookup(name).expect("lookup");
    let mut buf = vec![0u8; pool.info(id).expect("info").size as usize];
    pool.read(id, 0, &mut buf).expect("read");
    buf
}

/// Every volume's content, as the model the rest of the test keeps.
type Model = BTreeMap<String, Vec<u8>>;

fn assert_as_model(pool: &Pool, model: &Model, when: &str) {
    let listed: Vec<String> = pool.list().unwrap().into_iter().map(|v| v.name).collect();
    let mut listed = listed;
    listed.sort();
    assert_eq!(listed, model.keys().cloned().collect::<Vec<_>>(), "{when}");
    for (name, want) in model {
        let got = content(pool, name);
        let first = got.iter().zip(want.iter()).position(|(a, b)| a != b);
        assert!(
            got == *want,
            "{when}: {name} reads wrong (first at {first:?})"
        );
    }
}

fn write(pool: &Pool, model: &mut Model, name: &str, seed: u8, offset: u64, len: u64) {
    let data = pattern(seed, offset, len as usize);
    pool.write(pool.lookup(name).unwrap(), offset, &data)
        .expect("write");
    model.get_mut(name).unwrap()[offset as usize..(offset + len) as usize].copy_from_slice(&data);
}

fn snapshot(pool: &Pool, model: &mut Model, name: &str) {
    pool.snapshot(name).expect("snapshot");
    let (volume, _) = name.split_once('@').unwrap();
    let copy = model[volume].clone();
    model.insert(name.to_owned(), copy);
}

/// The image as its version left it: clean, every volume, property and
/// hold as recorded, and what the version added in use.
fn check_as_made(pool: &Pool, version: FormatVersion) -> Model {
    let m = manifest(version);
    assert_eq!(m.version, version.number(), "the manifest's version");
    assert_eq!(pool.format_version(), version, "no silent upgrade at open");
    let report = pool.check().expect("check runs");
    assert!(
        report.is_clean(),
        "version {version}: {:#?}",
        report.problems
    );
    assert_eq!(
        report.partial_extents > 0,
        version.has_partial_extents(),
        "version {version}: partial extents"
    );
    assert_eq!(
        report.layered_partials > 0,
        version.has_middle_layers(),
        "version {version}: middle layers"
    );
    assert!(
        pool.pool_stats().unwrap().reclaim_pending,
        "the deleted volume waits in the reclaim queue"
    );

    let mut model = Model::new();
    for v in pool.list().unwrap() {
        let (size, snapshot, crc) = m
            .volumes
            .get(&v.name)
            .unwrap_or_else(|| panic!("version {version}: {} is not in the manifest", v.name));
        assert_eq!(
            (v.size, v.snapshot),
            (*size, *snapshot),
            "version {version}: {}",
            v.name
        );
        let bytes = content(pool, &v.name);
        assert_eq!(
            crc32c::crc32c(&bytes),
            *crc,
            "version {version}: content of {}",
            v.name
        );
        model.insert(v.name, bytes);
    }
    assert_eq!(
        model.len(),
        m.volumes.len(),
        "version {version}: volumes listed"
    );
    // Known bytes, independent of the manifest: the first write, kept by s1.
    assert_eq!(
        model["base@s1"][..256 * KIB as usize],
        pattern(1, 0, 256 * KIB as usize)[..]
    );

    let base = pool.lookup("base").unwrap();
    for ((owner, key), value) in &m.properties {
        let owner = (owner != "-").then(|| pool.lookup(owner).unwrap());
        assert_eq!(
            pool.property(owner, key).unwrap().as_deref(),
            Some(value.as_bytes())
        );
    }
    assert_eq!(m.properties.is_empty(), !version.has_properties());
    let s1 = pool.lookup("base@s1").unwrap();
    let holds = pool.holds(s1).unwrap();
    if version.has_identities() {
        assert_eq!(holds, ["keep"]);
        assert!(pool.guid(base).unwrap().is_some());
    } else {
        assert!(holds.is_empty());
    }
    assert_eq!(model.contains_key("cow"), version.has_cow_volumes());
    assert_eq!(model.contains_key("big"), version.has_grown_regions());
    assert_eq!(model.contains_key("sealed"), version.has_encryption());
    assert_eq!(
        m.receives.contains_key("inbound"),
        version.has_encrypted_receives()
    );
    if version.has_encryption() {
        // Known bytes: the encrypted volume's first write, kept by e1.
        assert_eq!(
            model["sealed@e1"][..64 * KIB as usize],
            pattern(13, 0, 64 * KIB as usize)[..]
        );
    }
    model
}

/// Upgrades, then uses what every version can do now.
fn upgrade_and_serve(disk: &SimDisk, pool: Pool, version: FormatVersion, mut model: Model) {
    assert_eq!(pool.upgrade().expect("upgrade"), !version.is_newest());
    assert_eq!(pool.format_version(), FormatVersion::NEWEST);
    assert_clean(&pool);
    assert_as_model(&pool, &model, "after the upgrade");

    // Writes over chunks snapshots share: whole, and blocks of a chunk
    // a partial (with a middle layer) may already cover.
    write(&pool, &mut model, "base", 20, 64 * KIB, 16 * KIB);
    write(&pool, &mut model, "base", 21, 140 * KIB, 4 * KIB);
    write(&pool, &mut model, "base", 22, 300 * KIB, 40 * KIB);
    snapshot(&pool, &mut model, "base@after");
    write(&pool, &mut model, "base", 23, 132 * KIB, 8 * KIB);
    pool.clone_snapshot("base@after", "clone2").expect("clone");
    model.insert("clone2".into(), model["base@after"].clone());
    write(&pool, &mut model, "clone2", 24, 0, 64 * KIB);
    if model.contains_key("cow") {
        write(&pool, &mut model, "cow", 25, 0, 32 * KIB);
    }
    if model.contains_key("sealed") {
        // Over the chunk its snapshot shares: encrypted, the snapshot kept.
        write(&pool, &mut model, "sealed", 27, 36 * KIB, 8 * KIB);
    }
    if let Some((size, offset, target)) = manifest(version).receives.get("inbound") {
        // The encrypted receive the image left half done: it resumes where
        // it was committed, with the rest of sealed@e1 as stored, and the
        // key opens what it made.
        let status = pool.receive_status("inbound").unwrap().expect("a receive");
        let hex: String = status.target.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!((status.size, status.offset, &hex), (*size, *offset, target));
        let e1 = pool.lookup("sealed@e1").unwrap();
        for run in pool.allocation_map(e1, *offset, size - offset).unwrap() {
            if run.mapped {
                let mut data = vec![0u8; run.len as usize];
                pool.read_raw(e1, run.offset, &mut data).unwrap();
                pool.receive_write_raw(status.id, run.offset, &data)
                    .unwrap();
            }
        }
        pool.receive_checkpoint(status.id, *size).unwrap();
        pool.finish_receive(status.id, "inbound@e1", 1, false)
            .unwrap();
        unlock_volume(&pool, "inbound", &manifest(version).keys["sealed"]);
        let e1_bytes = model["sealed@e1"].clone();
        model.insert("inbound".into(), e1_bytes.clone());
        model.insert("inbound@e1".into(), e1_bytes);
        write(&pool, &mut model, "inbound", 28, 0, 16 * KIB);
    }
    // What the upgrade gave older pools: identities, properties, growth.
    let base = pool.lookup("base").unwrap();
    assert!(pool.guid(base).unwrap().is_some());
    pool.set_property(Some(base), "image.after", b"after")
        .expect("set a property");
    let size = disk.size();
    pool.grow(&GrowOptions {
        size: Some(size + 4 * MIB),
        metadata_bytes: Some(512 * KIB),
    })
    .expect("grow");
    pool.create_volume("new", 4 * MIB).expect("create");
    model.insert("new".into(), vec![0; 4 * MIB as usize]);
    write(&pool, &mut model, "new", 26, 0, 4 * MIB);
    // The queue the image left, and what the writes freed.
    while pool.reclaim(1024).expect("reclaim") > 0 {}
    pool.flush().expect("flush");
    assert_clean(&pool);
    assert_as_model(&pool, &model, "after the writes");
    pool.close().expect("close");

    let pool = open(disk);
    unlock(&pool, version);
    assert_eq!(pool.format_version(), FormatVersion::NEWEST);
    assert_clean(&pool);
    assert_as_model(&pool, &model, "reopened");
    assert_eq!(
        pool.property(Some(pool.lookup("base").unwrap()), "image.after")
            .unwrap()
            .as_deref(),
        Some(&b"after"[..])
    );
}

#[test]
fn every_format_version_has_an_image() {
    for version in FormatVersion::all() {
        let dir = image_dir();
        assert!(
            dir.join(format!("v{version}.pool.zst")).is_file(),
            "no image of version {version}"
        );
        assert!(
            dir.join(format!("v{version}.manifest")).is_file(),
            "no manifest of version {version}"
        );
    }
}

#[test]
fn images_of_every_version_open_check_upgrade_and_serve() {
    for version in FormatVersion::all() {
        let disk = image(version);
        let pool = open(&disk);
        unlock(&pool, version);
        let model = check_as_made(&pool, version);
        upgrade_and_serve(&disk, pool, version, model);
    }
}
