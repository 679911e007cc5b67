//! Encrypted volumes (FORMAT.md §6.6): a random history of writes,
//! discards, zeroes, snapshots and clones against a model, with the
//! device holding none of the plaintext; locked volumes refuse I/O and
//! unlock after a reopen; what is refused is refused before anything
//! changes.
// A test crate: unwrap, expect and panic are how a test reports failure.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeMap;

use arbor_crypt::{DataUnit, Kdf, KeyRecord, UserKey, VolumeCipher};
use arbor_engine::{Error, Pool, VolumeId};
use common::{assert_clean, reopen, sim_pool, MIB};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const CHUNK: u32 = 16 * 1024;
const SIZE: u64 = 4 * MIB;
const SLOT: u64 = 1;

/// A pattern that says where it is, so a copy of it anywhere on the
/// device would be found: 16 bytes "ARBOR-PLAINTEXT " then the offset.
fn plaintext(offset: u64, len: usize, seed: u8) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    let mut at = offset;
    while out.len() < len {
        let mut unit = *b"ARBOR-PLAINTEXT ";
        unit[15] = seed;
        let bytes: Vec<u8> = unit.iter().chain(&at.to_le_bytes()).copied().collect();
        out.extend_from_slice(&bytes);
        at += bytes.len() as u64;
    }
    out.truncate(len);
    out
}

fn key(unit: DataUnit) -> (KeyRecord, UserKey, VolumeCipher) {
    let user = UserKey::generate_raw();
    let cheap = Kdf::Argon2id {
        memory_kib: 8 * 1024,
        passes: 1,
        lanes: 1,
    };
    let (record, data_key) = KeyRecord::create(&user, unit, cheap).unwrap();
    let cipher = VolumeCipher::new(data_key, record.key_id, unit).unwrap();
    (record, user, cipher)
}

fn reload(pool: &Pool, record: &KeyRecord, user: &UserKey) {
    let data_key = record.unwrap_key(user).unwrap();
    pool.load_key(
        SLOT,
        VolumeCipher::new(data_key, record.key_id, record.unit).unwrap(),
    )
    .unwrap();
}

fn read_all(pool: &Pool, name: &str) -> Vec<u8> {
    let id = pool.lookup(name).unwrap();
    let mut buf = vec![0u8; pool.info(id).unwrap().size as usize];
    pool.read(id, 0, &mut buf).unwrap();
    buf
}

fn count(haystack: &[u8], needle: &[u8]) -> usize {
    haystack
        .windows(needle.len())
        .filter(|w| *w == needle)
        .count()
}

fn is_locked(result: Result<(), Error>) -> bool {
    matches!(&result, Err(e) if e.to_string().contains("encrypted and locked"))
}

/// The random history: every read of every volume, snapshot and clone
/// matches the model, at 4 KiB and 512-byte data units; the device holds
/// no 16-byte run of any plaintext written; a scrub with the key unloaded
/// verifies everything clean; the pool checks clean and reads the same
/// after a reopen and a reload of the key.
#[test]
fn encrypted_volumes_match_the_model_and_the_device_holds_no_plaintext() {
    for (seed, unit) in [(1u64, DataUnit::B4096), (2, DataUnit::B512)] {
        let (disk, pool) = sim_pool(64 * MIB, CHUNK);
        let (record, user, cipher) = key(unit);
        let u = unit.bytes() as u64;
        pool.load_key(SLOT, cipher).unwrap();
        let v = pool.create_encrypted_volume("v", SIZE, SLOT).unwrap();
        assert_eq!(pool.info(v).unwrap().key_slot, Some(SLOT));
        let mut model: BTreeMap<String, Vec<u8>> = BTreeMap::new();
        model.insert("v".into(), vec![0u8; SIZE as usize]);
        let mut writable = vec!["v".to_string()];
        let mut rng = StdRng::seed_from_u64(seed);
        let mut snaps = 0;
        for step in 0..400 {
            let name = writable[rng.gen_range(0..writable.len())].clone();
            let id = pool.lookup(&name).unwrap();
            let units = SIZE / u;
            let first = rng.gen_range(0..units);
            let n = rng.gen_range(1..=(units - first).min(64 * 1024 / u));
            let (offset, len) = (first * u, n * u);
            let range = offset as usize..(offset + len) as usize;
            match rng.gen_range(0..10) {
                0..=5 => {
                    let data = plaintext(offset, len as usize, step as u8);
                    if rng.gen_bool(0.5) {
                        pool.write(id, offset, &data).unwrap();
                    } else {
                        // Encrypted in the caller's buffer (NBD's path).
                        let mut given = data.clone();
                        pool.write_mut(id, offset, &mut given).unwrap();
                        assert_ne!(given, data, "the buffer holds what was stored");
                    }
                    model.get_mut(&name).unwrap()[range].copy_from_slice(&data);
                }
                6 => {
                    pool.discard(id, offset, len).unwrap();
                    model.get_mut(&name).unwrap()[range].fill(0);
                }
                7 => {
                    pool.write_zeroes(id, offset, len, rng.gen_bool(0.5))
                        .unwrap();
                    model.get_mut(&name).unwrap()[range].fill(0);
                }
                8 if snaps < 12 => {
                    snaps += 1;
                    let snap = format!("{name}@s{snaps}");
                    pool.snapshot(&snap).unwrap();
                    model.insert(snap.clone(), model[&name].clone());
                    if rng.gen_bool(0.5) {
                        let clone = format!("c{snaps}");
                        pool.clone_snapshot(&snap, &clone).unwrap();
                        model.insert(clone.clone(), model[&name].clone());
                        writable.push(clone);
                    }
                }
                _ => {
                    let mut buf = vec![0u8; len as usize];
                    pool.read(id, offset, &mut buf).unwrap();
                    assert!(
                        buf == model[&name][range],
                        "step {step}: {name} at {offset}+{len}"
                    );
                }
            }
        }
        for (name, want) in &model {
            assert!(read_all(&pool, name) == *want, "{name} reads wrong");
            let id = pool.lookup(name).unwrap();
            assert_eq!(pool.info(id).unwrap().key_slot, Some(SLOT), "{name}");
        }
        pool.flush().unwrap();
        // The device holds ciphertext only (the model holds the marker
        // wherever data was written).
        let image = disk.handle().visible_image();
        assert!(count(&model["v"], b"ARBOR-PLAINTEXT") > 0);
        assert_eq!(
            count(&image, b"ARBOR-PLAINTEXT"),
            0,
            "plaintext on the device"
        );
        // Keys are not needed to verify: a scrub with the slot unloaded.
        assert!(pool.unload_key(SLOT));
        let mut damaged = 0;
        let mut verified = 0;
        pool.scrub(0, 1 << 20, |s| {
            damaged += s.damaged_blocks;
            verified += s.verified_blocks;
            true
        })
        .unwrap();
        assert_eq!(damaged, 0);
        assert!(verified > 0);
        assert_clean(&pool);
        pool.close().unwrap();
        let pool = reopen(&disk);
        let v = pool.lookup("v").unwrap();
        assert!(is_locked(pool.read(v, 0, &mut [0u8; 4096])));
        reload(&pool, &record, &user);
        for (name, want) in &model {
            assert!(
                read_all(&pool, name) == *want,
                "{name} reads wrong after a reopen"
            );
        }
        assert_clean(&pool);
    }
}

/// A locked volume (and its snapshot) refuses reads, writes, discards and
/// zeroes, and changes nothing; it can still be listed, snapshotted and
/// destroyed. Misaligned requests, sizes that are not whole chunks, an
/// unloaded slot and an older pool are refused with what to do.
#[test]
fn locked_and_misaligned_requests_are_refused_and_change_nothing() {
    let (_disk, pool) = sim_pool(64 * MIB, CHUNK);
    let (_, _, cipher) = key(DataUnit::B4096);
    assert!(pool.create_encrypted_volume("early", SIZE, SLOT).is_err());
    pool.load_key(SLOT, cipher).unwrap();
    assert!(pool
        .create_encrypted_volume("odd", SIZE + 4096, SLOT)
        .is_err());
    assert!(pool
        .create_encrypted_volume("other", SIZE, SLOT + 1)
        .is_err());
    let v = pool.create_encrypted_volume("v", SIZE, SLOT).unwrap();
    let data = plaintext(8192, 8192, 1);
    pool.write(v, 8192, &data).unwrap();
    for (offset, len) in [(512u64, 4096usize), (8192, 4095), (8192 + 512, 512)] {
        let err = pool.write(v, offset, &vec![1u8; len]).unwrap_err();
        assert!(
            err.to_string().contains("whole, aligned units of 4096"),
            "{err}"
        );
        assert!(pool.read(v, offset, &mut vec![0u8; len]).is_err());
        assert!(pool.discard(v, offset, len as u64).is_err());
    }
    assert!(pool.resize("v", SIZE + 512).is_err());
    pool.resize("v", 2 * SIZE).unwrap();
    pool.snapshot("v@s").unwrap();
    let s = pool.lookup("v@s").unwrap();
    assert!(pool.unload_key(SLOT));
    assert!(!pool.key_loaded(SLOT));
    let mut buf = vec![0u8; 8192];
    assert!(is_locked(pool.read(v, 8192, &mut buf)));
    assert!(is_locked(pool.read(s, 8192, &mut buf)));
    assert!(is_locked(pool.write(v, 8192, &buf)));
    assert!(is_locked(pool.discard(v, 8192, 8192)));
    assert!(is_locked(pool.write_zeroes(v, 0, SIZE, false)));
    pool.snapshot("v@locked").unwrap();
    assert!(pool.list().unwrap().iter().any(|i| i.name == "v@locked"));
    pool.delete("v@locked").unwrap();
    let (_, _, cipher) = key(DataUnit::B4096);
    // Another key in the slot reads garbage, never the plaintext: the
    // engine cannot tell keys apart; the daemon's key record can.
    pool.load_key(SLOT, cipher).unwrap();
    pool.read(v, 8192, &mut buf).unwrap();
    assert_ne!(buf, data);
    assert_clean(&pool);
}

/// A version 10 pool has no encrypted volumes until it is upgraded.
#[test]
fn an_older_pool_refuses_encrypted_volumes_until_upgraded() {
    use std::sync::Arc;
    let disk = arbor_io::SimDisk::new(64 * MIB);
    let dev: Arc<dyn arbor_io::BlockDevice> = Arc::new(disk.clone());
    let opts = arbor_engine::CreateOptions {
        format_version: arbor_format::FormatVersion::new(10).unwrap(),
        ..common::small_opts(CHUNK)
    };
    let pool = Pool::create(dev, &opts, &common::open_opts()).unwrap();
    let (_, _, cipher) = key(DataUnit::B4096);
    pool.load_key(SLOT, cipher).unwrap();
    let err = pool.create_encrypted_volume("v", SIZE, SLOT).unwrap_err();
    assert!(err.to_string().contains("arbor pool upgrade"), "{err}");
    assert!(pool.upgrade().unwrap());
    let v: VolumeId = pool.create_encrypted_volume("v", SIZE, SLOT).unwrap();
    pool.write(v, 0, &plaintext(0, 4096, 3)).unwrap();
    assert_clean(&pool);
}

/// Regression: the zeros a discard writes into the part of an unmapped
/// chunk it covers made a new chunk whose rest was stored as plain zeros
/// (the unit went without its cipher), so the rest read as garbage once
/// decrypted. A first write of part of a chunk leaves the rest zeros too.
#[test]
fn the_rest_of_a_chunk_a_discard_or_write_makes_reads_zeros() {
    let (_disk, pool) = sim_pool(64 * MIB, CHUNK);
    let (_, _, cipher) = key(DataUnit::B4096);
    pool.load_key(SLOT, cipher).unwrap();
    let v = pool.create_encrypted_volume("v", SIZE, SLOT).unwrap();
    let c = u64::from(CHUNK);
    pool.write(v, 0, &plaintext(0, 8192, 1)).unwrap();
    // Chunk-aligned, one chunk and a half: the half is zeros written.
    pool.discard(v, 200 * c, c + c / 2).unwrap();
    pool.write_zeroes(v, 100 * c + 4096, 4096, true).unwrap();
    let mut buf = vec![0u8; CHUNK as usize];
    pool.read(v, 0, &mut buf).unwrap();
    assert_eq!(&buf[..8192], &plaintext(0, 8192, 1)[..]);
    assert!(buf[8192..].iter().all(|&b| b == 0));
    for chunk in [200, 201, 100] {
        pool.read(v, chunk * c, &mut buf).unwrap();
        assert!(buf.iter().all(|&b| b == 0), "chunk {chunk}");
    }
    assert_clean(&pool);
}

/// Regression: an incremental receive whose base is an encrypted snapshot
/// made its hidden receiving record encrypted (it shares the base's tree
/// and key), and a version 11 record could not be both: the pool then
/// failed to open ("encrypted with other state set"). A plaintext stream
/// can never go into an encrypted volume (it would be stored unencrypted
/// and read back as garbage); the receive is refused before anything is
/// made, and the pool reopens.
#[test]
fn a_plain_receive_onto_an_encrypted_base_is_refused_and_the_pool_reopens() {
    let (disk, pool) = sim_pool(64 * MIB, CHUNK);
    let (_, _, cipher) = key(DataUnit::B4096);
    pool.load_key(SLOT, cipher).unwrap();
    let v = pool.create_encrypted_volume("v", SIZE, SLOT).unwrap();
    pool.write(v, 0, &plaintext(0, 8192, 1)).unwrap();
    let base = pool.snapshot("v@a").unwrap();
    let target = arbor_engine::ReceiveTarget {
        volume: "w".into(),
        target: [7; 16],
        base: Some(pool.guid(base).unwrap().unwrap()),
        size: SIZE,
        key: None,
    };
    let err = pool.begin_receive(&target).unwrap_err();
    assert!(err.to_string().contains("raw"), "{err}");
    assert!(pool.receive_status("w").unwrap().is_none());
    pool.flush().unwrap();
    drop(pool);
    let pool = reopen(&disk);
    assert!(pool.lookup("v@a").is_ok());
    assert_clean(&pool);
}

/// Regression: the daemon dropped key-store slots no volume named at every
/// change of the store, so a create whose slot was recorded but whose
/// volume was not made yet lost its slot to a create running beside it,
/// and its volume named a slot with no key record (its data unreadable
/// after a restart). A slot being made is kept while its guard lives, and
/// dropped at a later change once it is gone with no volume naming it.
#[test]
fn a_key_slot_being_made_survives_other_changes_of_the_store() {
    let (disk, pool) = sim_pool(64 * MIB, CHUNK);
    let (first, _, cipher) = key(DataUnit::B4096);
    let (second, _, _) = key(DataUnit::B4096);
    let (third, _, _) = key(DataUnit::B4096);
    let a = pool.add_key_record(first.clone()).unwrap();
    let b = pool.add_key_record(second.clone()).unwrap();
    assert_eq!(
        pool.key_record(a.slot()).unwrap(),
        Some(first.clone()),
        "kept while made"
    );
    assert_ne!(a.slot(), b.slot());
    pool.load_key(a.slot(), cipher).unwrap();
    let v = pool.create_encrypted_volume("v", SIZE, a.slot()).unwrap();
    let a_slot = a.slot();
    let b_slot = b.slot();
    drop(a);
    drop(b);
    let c = pool.add_key_record(third.clone()).unwrap();
    assert_eq!(pool.key_record(a_slot).unwrap(), Some(first.clone()));
    // A slot no volume names, its create over, is dropped (and its number
    // may be given again: nothing names it).
    let slots: Vec<_> = pool
        .key_store()
        .unwrap()
        .slots()
        .map(|(s, r)| (s, r.clone()))
        .collect();
    assert_eq!(slots, [(a_slot, first.clone()), (c.slot(), third)]);
    assert!(b_slot > a_slot);
    drop(c);
    pool.write(v, 0, &plaintext(0, 4096, 9)).unwrap();
    pool.close().unwrap();
    let pool = reopen(&disk);
    let v = pool.lookup("v").unwrap();
    let record = pool
        .key_record(pool.info(v).unwrap().key_slot.unwrap())
        .unwrap();
    assert_eq!(record, Some(first));
    assert_clean(&pool);
}
