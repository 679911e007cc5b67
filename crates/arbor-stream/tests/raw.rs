//! Raw streams (docs/STREAM.md version 2, docs/FORMAT.md §6.6): an
//! encrypted volume's snapshots sent with no key loaded anywhere, received
//! by a pool that holds no key, forwarded from there to a third, resumed
//! after an interruption, used to heal, and readable only once the key is
//! loaded at the end; what does not fit is refused before anything
//! changes.
// A test crate: unwrap, expect and panic are how a test reports failure.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use arbor_crypt::{DataUnit, Kdf, KeyRecord, UserKey, VolumeCipher};
use arbor_engine::{CreateOptions, OpenOptions, Pool, VolumeId};
use arbor_io::{BlockDevice, SimDisk};
use arbor_stream::format::{Compression, Decoded, Decoder, Record};
use arbor_stream::heal::Healer;
use arbor_stream::receive::{resume_token, ReceiveOptions, Received, Receiver};
use arbor_stream::send::{Raw, SendRequest, Sender};
use arbor_stream::StreamFailure;

const MIB: u64 = 1 << 20;
const SIZE: u64 = 4 * MIB;

fn pool_with(disk: &SimDisk, chunk: u32, version: u16) -> Pool {
    let dev: Arc<dyn BlockDevice> = Arc::new(disk.clone());
    let opts = CreateOptions {
        chunk_size: chunk,
        metadata_bytes: Some(4 * MIB),
        format_version: arbor_format::FormatVersion::new(version).unwrap(),
        ..Default::default()
    };
    let open = OpenOptions {
        cache_bytes: 256 << 10,
        dirty_node_limit: 512,
    };
    Pool::create(dev, &opts, &open).unwrap()
}

fn pool(disk: &SimDisk, chunk: u32) -> Pool {
    pool_with(disk, chunk, arbor_format::FORMAT_VERSION)
}

/// A pattern that says where it is: "ARBOR-PLAINTEXT" and the offset.
fn plaintext(offset: u64, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    let mut at = offset;
    while out.len() < len {
        out.extend_from_slice(b"ARBOR-PLAINTEXT!");
        out.extend_from_slice(&at.to_le_bytes());
        at += 24;
    }
    out.truncate(len);
    out
}

fn count(haystack: &[u8], needle: &[u8]) -> usize {
    haystack
        .windows(needle.len())
        .filter(|w| *w == needle)
        .count()
}

/// A user's key and an encrypted volume `v` made with it, loaded.
fn encrypted_volume(pool: &Pool, unit: DataUnit) -> (UserKey, VolumeId) {
    encrypted_volume_named(pool, "v", unit)
}

fn encrypted_volume_named(pool: &Pool, name: &str, unit: DataUnit) -> (UserKey, VolumeId) {
    let user = UserKey::generate_raw();
    let cheap = Kdf::Argon2id {
        memory_kib: 8 * 1024,
        passes: 1,
        lanes: 1,
    };
    let (record, data_key) = KeyRecord::create(&user, unit, cheap).unwrap();
    let cipher = VolumeCipher::new(data_key, record.key_id, unit).unwrap();
    let slot = pool.add_key_record(record).unwrap();
    pool.load_key(slot.slot(), cipher).unwrap();
    let v = pool
        .create_encrypted_volume(name, SIZE, slot.slot())
        .unwrap();
    (user, v)
}

/// Loads `name`'s key with `user`, from the pool's own key store.
fn load(pool: &Pool, name: &str, user: &UserKey) {
    let slot = pool
        .info(pool.lookup(name).unwrap())
        .unwrap()
        .key_slot
        .unwrap();
    let record = pool.key_record(slot).unwrap().unwrap();
    let key = record.unwrap_key(user).unwrap();
    pool.load_key(
        slot,
        VolumeCipher::new(key, record.key_id, record.unit).unwrap(),
    )
    .unwrap();
}

fn request(target: &str, base: Option<&str>, raw: Raw) -> SendRequest {
    SendRequest {
        target: target.to_owned(),
        base: base.map(str::to_owned),
        resume: None,
        compression: Compression::Zstd { level: 1 },
        format: Default::default(),
        raw,
    }
}

fn stream_of(pool: &Pool, req: &SendRequest) -> Result<Vec<u8>, StreamFailure> {
    let mut sender = Sender::new(pool, req)?.with_diff_window(40 << 10);
    let mut out = Vec::new();
    while sender.next(&mut out)? {}
    Ok(out)
}

fn receive(pool: &Pool, volume: &str, bytes: &[u8]) -> Result<Received, StreamFailure> {
    let opts = ReceiveOptions {
        checkpoint_bytes: 128 << 10,
        force: false,
    };
    let mut r = Receiver::new(pool, volume, opts);
    for piece in bytes.chunks(100_000) {
        r.push(piece)?;
    }
    r.finish()
}

/// What `name` stores, as stored: which 4 KiB blocks are mapped, and
/// their bytes (holes as zeros).
fn raw_contents(pool: &Pool, name: &str) -> (Vec<bool>, Vec<u8>) {
    let id = pool.lookup(name).unwrap();
    let size = pool.info(id).unwrap().size;
    let mut buf = vec![0u8; size as usize];
    let mut mapped = vec![false; (size / 4096) as usize];
    for run in pool.allocation_map(id, 0, size).unwrap() {
        if run.mapped {
            let (a, b) = (run.offset as usize, (run.offset + run.len) as usize);
            pool.read_raw(id, run.offset, &mut buf[a..b]).unwrap();
            mapped[a / 4096..b / 4096].fill(true);
        }
    }
    assert!(
        pool.read_raw(id, 0, &mut buf.clone()).is_err() == mapped.contains(&false),
        "a raw read of a hole is refused"
    );
    (mapped, buf)
}

fn contents(pool: &Pool, name: &str) -> Vec<u8> {
    let id = pool.lookup(name).unwrap();
    let mut buf = vec![0u8; pool.info(id).unwrap().size as usize];
    pool.read(id, 0, &mut buf).unwrap();
    buf
}

/// Scrubs the whole pool: (blocks verified, blocks damaged).
fn scrub(pool: &Pool) -> (u64, u64) {
    let (mut verified, mut damaged) = (0, 0);
    pool.scrub(0, 1 << 20, |s| {
        verified += s.verified_blocks;
        damaged += s.damaged_blocks;
        true
    })
    .unwrap();
    (verified, damaged)
}

/// `bytes`, a raw stream, with its key record replaced by `key`.
fn with_key(bytes: &[u8], key: &KeyRecord) -> Vec<u8> {
    use arbor_stream::format::Encoder;
    let mut d = Decoder::new();
    let mut out = Vec::new();
    let mut enc = None;
    let mut at = 0;
    loop {
        let Decoded::Record { consumed, record } = d.decode(&bytes[at..]).unwrap() else {
            panic!("a whole stream");
        };
        at += consumed;
        match record {
            Record::Header(h) => enc = Some(Encoder::new_raw(&h, key, &mut out).unwrap()),
            Record::Key(_) | Record::Skipped { .. } => {}
            Record::Data {
                offset, payload, ..
            } => {
                enc.as_mut()
                    .unwrap()
                    .data(offset, payload, None, &mut out)
                    .unwrap();
            }
            Record::Zero { offset, length } => enc
                .as_mut()
                .unwrap()
                .zero(offset, length, &mut out)
                .unwrap(),
            Record::Discard { offset, length } => enc
                .as_mut()
                .unwrap()
                .discard(offset, length, &mut out)
                .unwrap(),
            Record::End => {
                enc.take().unwrap().finish(&mut out).unwrap();
                return out;
            }
        }
    }
}

fn assert_clean(pool: &Pool) {
    pool.flush().unwrap();
    let report = pool.check().unwrap();
    assert!(report.is_clean(), "{:#?}", report.problems);
}

fn is_locked(e: &arbor_engine::Error) -> bool {
    e.to_string().contains("encrypted and locked")
}

/// The records of a stream, by kind: (header raw?, key records, data,
/// zero, discard).
fn kinds(bytes: &[u8]) -> (bool, usize, usize, usize, usize) {
    let mut d = Decoder::new();
    let (mut raw, mut key, mut data, mut zero, mut discard) = (false, 0, 0, 0, 0);
    let mut at = 0;
    loop {
        match d.decode(&bytes[at..]).unwrap() {
            Decoded::NeedMore(_) => break,
            Decoded::Record { consumed, record } => {
                at += consumed;
                match record {
                    Record::Header(h) => raw = h.raw,
                    Record::Key(_) => key += 1,
                    Record::Data { .. } => data += 1,
                    Record::Zero { .. } => zero += 1,
                    Record::Discard { .. } => discard += 1,
                    Record::End => break,
                    Record::Skipped { .. } => {}
                }
            }
        }
    }
    d.end_of_input().unwrap();
    (raw, key, data, zero, discard)
}

/// The chain: A (the source, key unloaded before it sends) to B (no key
/// ever) to C (no key until the end), full then incremental, at both data
/// units and with smaller chunks downstream. No stream and no pool but
/// A's own (which holds it encrypted) holds any plaintext; B and C serve
/// nothing without the key, check and scrub clean; with the key loaded
/// on C every snapshot reads exactly as A's.
#[test]
fn raw_streams_replicate_forward_and_open_only_with_the_key() {
    for (unit, chunks) in [
        (DataUnit::B512, [16384u32, 16384, 4096]),
        (DataUnit::B4096, [65536, 16384, 16384]),
    ] {
        let disks = [
            SimDisk::new(64 * MIB),
            SimDisk::new(64 * MIB),
            SimDisk::new(64 * MIB),
        ];
        let a = pool(&disks[0], chunks[0]);
        let b = pool(&disks[1], chunks[1]);
        let c = pool(&disks[2], chunks[2]);
        let (user, v) = encrypted_volume(&a, unit);
        a.write(v, 0, &plaintext(0, 256 << 10)).unwrap();
        a.write(v, MIB + 4096, &plaintext(MIB + 4096, 8192))
            .unwrap();
        a.snapshot("v@one").unwrap();
        a.write(v, 64 << 10, &plaintext(7 << 20, 64 << 10)).unwrap();
        a.discard(v, 128 << 10, 128 << 10).unwrap();
        a.write(v, 3 * MIB, &plaintext(3 * MIB, 4096)).unwrap();
        a.snapshot("v@two").unwrap();
        let plain_one = contents(&a, "v@one");
        let plain_two = contents(&a, "v@two");
        // The source needs no key to send raw.
        let slot = a.info(v).unwrap().key_slot.unwrap();
        assert!(a.unload_key(slot));
        let full = stream_of(&a, &request("v@one", None, Raw::Yes)).unwrap();
        let incr = stream_of(&a, &request("v@two", Some("v@one"), Raw::Yes)).unwrap();
        let marker = b"ARBOR-PLAINTEXT!";
        assert_eq!(count(&full, marker) + count(&incr, marker), 0);
        let (raw, keys, data, zero, discard) = kinds(&full);
        assert!(raw && keys == 1 && data > 0 && zero == 0, "{unit:?}");
        assert_eq!(discard, 0, "a full stream starts from nothing");
        let (raw, keys, _, zero, discard) = kinds(&incr);
        assert!(raw && keys == 1 && zero == 0 && discard > 0, "{unit:?}");
        // A plaintext send of a locked volume is refused.
        let err = stream_of(&a, &request("v@one", None, Raw::No)).unwrap_err();
        assert!(err.to_string().contains("locked"), "{err}");

        receive(&b, "r", &full).unwrap();
        receive(&b, "r", &incr).unwrap();
        for snap in ["r@one", "r@two", "r"] {
            let id = b.lookup(snap).unwrap();
            assert!(b.info(id).unwrap().key_slot.is_some(), "{snap}");
            let err = b.read(id, 0, &mut [0u8; 4096]).unwrap_err();
            assert!(is_locked(&err), "{snap}: {err}");
        }
        let src = |s: &str| raw_contents(&a, s);
        assert!(raw_contents(&b, "r@one") == src("v@one"));
        assert!(raw_contents(&b, "r@two") == src("v@two"));
        assert_clean(&b);
        let (verified, damaged) = scrub(&b);
        assert!(verified > 0 && damaged == 0, "{verified} {damaged}");

        // B forwards to C without a key.
        let fwd_full = stream_of(&b, &request("r@one", None, Raw::IfEncrypted)).unwrap();
        let fwd_incr = stream_of(&b, &request("r@two", Some("r@one"), Raw::IfEncrypted)).unwrap();
        assert_eq!(count(&fwd_full, marker) + count(&fwd_incr, marker), 0);
        receive(&c, "x", &fwd_full).unwrap();
        receive(&c, "x", &fwd_incr).unwrap();
        assert_clean(&c);
        for disk in &disks[1..] {
            let image = disk.handle().visible_image();
            assert_eq!(count(&image, marker), 0, "plaintext on a replica's device");
        }
        // The key opens C's copy, byte for byte A's.
        load(&c, "x@two", &user);
        assert!(contents(&c, "x@one") == plain_one, "{unit:?}");
        assert!(contents(&c, "x@two") == plain_two, "{unit:?}");
        assert!(contents(&c, "x") == plain_two);
        // ...and it is a volume like any: written, snapshotted.
        let x = c.lookup("x").unwrap();
        c.write(x, 0, &plaintext(9 << 20, 8192)).unwrap();
        c.snapshot("x@three").unwrap();
        assert_eq!(
            &contents(&c, "x@three")[..8192],
            &plaintext(9 << 20, 8192)[..]
        );
        assert_clean(&c);
        // A wrong key opens nothing.
        let slot = c.info(x).unwrap().key_slot.unwrap();
        let record = c.key_record(slot).unwrap().unwrap();
        assert!(record.unwrap_key(&UserKey::generate_raw()).is_err());
    }
}

/// What does not fit is refused before anything changes: a raw stream
/// into a pool with larger chunks or of format 11, a raw increment onto a
/// base under another key or not encrypted, a plaintext increment onto a
/// raw-received base, a raw send of a plain volume or as an rbd diff.
#[test]
fn raw_streams_that_do_not_fit_are_refused() {
    let disks: Vec<SimDisk> = (0..4).map(|_| SimDisk::new(64 * MIB)).collect();
    let a = pool(&disks[0], 16384);
    let (user, v) = encrypted_volume(&a, DataUnit::B512);
    a.write(v, 0, &plaintext(0, 65536)).unwrap();
    a.snapshot("v@one").unwrap();
    a.write(v, 65536, &plaintext(65536, 4096)).unwrap();
    a.snapshot("v@two").unwrap();
    let full = stream_of(&a, &request("v@one", None, Raw::Yes)).unwrap();
    let incr = stream_of(&a, &request("v@two", Some("v@one"), Raw::Yes)).unwrap();

    // Larger chunks on the receiver.
    let big = pool(&disks[1], 65536);
    let err = receive(&big, "r", &full).unwrap_err();
    assert!(err.to_string().contains("chunks of 16384"), "{err}");
    assert!(big.receive_status("r").unwrap().is_none());
    // A version 11 pool, until upgraded.
    let old = pool_with(&disks[2], 16384, 11);
    let err = receive(&old, "r", &full).unwrap_err();
    assert!(err.to_string().contains("arbor pool upgrade"), "{err}");
    assert!(old.upgrade().unwrap());
    receive(&old, "r", &full).unwrap();
    assert!(raw_contents(&old, "r@one") == raw_contents(&a, "v@one"));
    // A plaintext increment onto the raw-received base (A has the key).
    let plain_incr = stream_of(&a, &request("v@two", Some("v@one"), Raw::No)).unwrap();
    let err = receive(&old, "r", &plain_incr).unwrap_err();
    assert!(err.to_string().contains("send the increment raw"), "{err}");
    assert!(old.receive_status("r").unwrap().is_none());
    receive(&old, "r", &incr).unwrap();
    assert_clean(&old);

    // A raw increment onto a base encrypted with another key: a second
    // pool's volume given the same snapshot identity is impossible, so
    // the stream's key record is swapped for another key's.
    let other = pool(&disks[3], 16384);
    receive(&other, "r", &full).unwrap();
    let (_, w) = encrypted_volume_named(&a, "w", DataUnit::B512);
    let w_slot = a.info(w).unwrap().key_slot.unwrap();
    let foreign = with_key(&incr, &a.key_record(w_slot).unwrap().unwrap());
    let err = receive(&other, "r", &foreign).unwrap_err();
    assert!(err.to_string().contains("data key"), "{err}");
    assert!(other.receive_status("r").unwrap().is_none());
    // A raw stream onto a plain base.
    let plain_full = stream_of(&a, &request("v@one", None, Raw::No)).unwrap();
    let p = pool(&SimDisk::new(64 * MIB), 16384);
    receive(&p, "r", &plain_full).unwrap();
    let err = receive(&p, "r", &incr).unwrap_err();
    assert!(err.to_string().contains("not encrypted"), "{err}");

    // Senders refuse a raw stream of a plain volume, or as an rbd diff.
    let q = a.create_volume("plain", MIB).unwrap();
    a.write(q, 0, &[1; 4096]).unwrap();
    a.snapshot("plain@s").unwrap();
    let err = stream_of(&a, &request("plain@s", None, Raw::Yes)).unwrap_err();
    assert!(err.to_string().contains("not encrypted"), "{err}");
    let rbd = SendRequest {
        format: arbor_stream::send::SendFormat::RbdDiff,
        ..request("v@one", None, Raw::Yes)
    };
    assert!(stream_of(&a, &rbd).is_err());
    // Replication's choice: plaintext for a plain volume.
    let s = stream_of(&a, &request("plain@s", None, Raw::IfEncrypted)).unwrap();
    assert!(!kinds(&s).0);
    let _ = user;
}

/// A raw receive interrupted part way resumes from its token (the resumed
/// stream raw again, its key checked against the receive's), and a raw
/// stream heals a keyless replica's damaged block; a plaintext stream
/// cannot heal an encrypted snapshot.
#[test]
fn raw_receives_resume_and_raw_streams_heal() {
    let (disk_a, disk_b) = (SimDisk::new(64 * MIB), SimDisk::new(64 * MIB));
    let (a, b) = (pool(&disk_a, 16384), pool(&disk_b, 16384));
    let (_, v) = encrypted_volume(&a, DataUnit::B4096);
    for i in 0..48u64 {
        a.write(v, i * 65536, &plaintext(i * 65536, 16384)).unwrap();
    }
    a.snapshot("v@one").unwrap();
    let full = stream_of(&a, &request("v@one", None, Raw::Yes)).unwrap();
    let opts = ReceiveOptions {
        checkpoint_bytes: 64 << 10,
        force: false,
    };
    let mut r = Receiver::new(&b, "r", opts);
    r.push(&full[..full.len() / 2]).unwrap();
    let token = r.interrupted().unwrap().expect("a token");
    drop(r);
    assert!(token.offset > 0 && token.offset.is_multiple_of(16384));
    assert_eq!(resume_token(&b, "r").unwrap(), Some(token));
    // A plaintext stream cannot resume an encrypted receive.
    let plain = SendRequest {
        resume: Some(token),
        ..request("", None, Raw::No)
    };
    let err = receive(&b, "r", &stream_of(&a, &plain).unwrap()).unwrap_err();
    assert!(err.to_string().contains("send the increment raw"), "{err}");
    // Nor a raw stream of another key (the resumed stream is rebuilt with
    // a foreign key record).
    let (_, w) = encrypted_volume_named(&a, "w", DataUnit::B4096);
    let foreign_key = a
        .key_record(a.info(w).unwrap().key_slot.unwrap())
        .unwrap()
        .unwrap();
    let resumed = stream_of(
        &a,
        &SendRequest {
            resume: Some(token),
            ..request("", None, Raw::IfEncrypted)
        },
    )
    .unwrap();
    let err = receive(&b, "r", &with_key(&resumed, &foreign_key)).unwrap_err();
    assert!(err.to_string().contains("another key"), "{err}");
    assert!(b.lookup("r@one").is_err());
    let done = receive(&b, "r", &resumed).unwrap();
    assert_eq!(done.resumed_from, token.offset);
    assert!(raw_contents(&b, "r@one") == raw_contents(&a, "v@one"));
    assert_clean(&b);

    // A flipped bit in a block of the keyless replica: found by a scrub,
    // healed by a raw stream of the same snapshot.
    let block: Vec<u8> = raw_contents(&b, "r@one").1[20 * 65536..20 * 65536 + 4096].to_vec();
    let image = disk_b.handle().visible_image();
    let at = image
        .chunks(4096)
        .position(|blk| blk == &block[..])
        .expect("the block on the device")
        * 4096;
    let mut bad = block.clone();
    bad[100] ^= 0x04;
    disk_b.write_at(&bad, at as u64).unwrap();
    disk_b.flush().unwrap();
    let (_, damaged) = scrub(&b);
    assert_eq!(damaged, 1);
    let id = b.lookup("r@one").unwrap();
    assert!(b.read_raw(id, 20 * 65536, &mut [0u8; 4096]).is_err());
    // Plaintext cannot heal it (its sums are of ciphertext).
    let plain_full = stream_of(&a, &request("v@one", None, Raw::No)).unwrap();
    let mut h = Healer::new(&b, "r");
    let err = h.push(&plain_full).unwrap_err();
    assert!(err.to_string().contains("raw stream"), "{err}");
    let mut h = Healer::new(&b, "r");
    h.push(&full).unwrap();
    let report = h.finish().unwrap();
    assert_eq!((report.damaged, report.remaining), (1, 0), "{report:?}");
    assert!(raw_contents(&b, "r@one") == raw_contents(&a, "v@one"));
    assert_clean(&b);
}
