//! Healing from a stream (`arbor receive --heal`): pool A's snapshots are
//! replicated to pool B by streams; blocks of A's device are then damaged
//! (a block only the older snapshot reads, one both snapshots and the
//! volume share, one only the newer snapshot has). Streams from B of the
//! same snapshots heal exactly what they carry: an incremental one the
//! blocks changed since its base, a full one the rest; A then reads
//! byte-identical to B, its damage record is empty and it checks clean.
//! Streams of other snapshots are refused, and change nothing.
// A test crate: unwrap, expect and panic are how a test reports failure
// (the workspace denies them in the code it ships; clippy.toml allows
// them in #[test] functions, this in the helpers around them).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use arbor_engine::{CreateOptions, Error, OpenOptions, Pool, VolumeId};
use arbor_io::{BlockDevice, SimDisk};
use arbor_stream::format::Compression;
use arbor_stream::heal::{HealReport, Healer};
use arbor_stream::receive::{ReceiveOptions, Receiver};
use arbor_stream::send::{SendRequest, Sender};
use arbor_stream::StreamFailure;

const MIB: u64 = 1 << 20;
const BLOCK: usize = 4096;
const VOLUME: u64 = MIB;

fn pool(disk: &SimDisk) -> Pool {
    let dev: Arc<dyn BlockDevice> = Arc::new(disk.clone());
    let opts = CreateOptions {
        chunk_size: 16384,
        metadata_bytes: Some(4 * MIB),
        ..Default::default()
    };
    let open = OpenOptions {
        cache_bytes: 256 << 10,
        dirty_node_limit: 512,
    };
    Pool::create(dev, &opts, &open).expect("create")
}

/// A block of bytes no other block has.
fn noise(seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..BLOCK)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn stream(pool: &Pool, target: &str, base: Option<&str>) -> Vec<u8> {
    let req = SendRequest {
        target: target.to_owned(),
        base: base.map(str::to_owned),
        resume: None,
        compression: Compression::Zstd { level: 3 },
        format: Default::default(),
        raw: Default::default(),
    };
    let mut out = Vec::new();
    Sender::new(pool, &req)
        .unwrap()
        .write_to(&mut out, &mut |_| {})
        .unwrap();
    out
}

fn receive(pool: &Pool, volume: &str, bytes: &[u8]) {
    let mut r = Receiver::new(pool, volume, ReceiveOptions::default());
    r.push(bytes).unwrap();
    r.finish().unwrap();
}

fn heal(pool: &Pool, volume: &str, bytes: &[u8]) -> Result<HealReport, StreamFailure> {
    let mut h = Healer::new(pool, volume);
    // In pieces, as a pipe delivers it.
    for piece in bytes.chunks(100_000) {
        h.push(piece)?;
    }
    h.finish()
}

fn contents(pool: &Pool, name: &str) -> Vec<u8> {
    let id = pool.lookup(name).unwrap();
    let mut buf = vec![0u8; VOLUME as usize];
    pool.read(id, 0, &mut buf).unwrap();
    buf
}

/// Reads every block of `name`: those that fail as damaged.
fn damaged_blocks(pool: &Pool, id: VolumeId) -> Vec<u64> {
    let mut out = Vec::new();
    let mut one = vec![0u8; BLOCK];
    for b in 0..VOLUME / BLOCK as u64 {
        match pool.read(id, b * BLOCK as u64, &mut one) {
            Ok(()) => {}
            Err(Error::Damaged(_)) => out.push(b),
            Err(e) => panic!("{e}"),
        }
    }
    out
}

/// Flips a bit of the device block that holds `content`.
fn damage(disk: &SimDisk, content: &[u8]) {
    let image = disk.handle().visible_image();
    let at = image
        .chunks(BLOCK)
        .position(|b| b == content)
        .expect("the block is on the device")
        * BLOCK;
    let mut bad = content.to_vec();
    bad[1000] ^= 0x10;
    disk.write_at(&bad, at as u64).unwrap();
    disk.flush().unwrap();
}

#[test]
fn streams_of_the_same_snapshots_heal_exactly_the_damaged_blocks_they_carry() {
    let (disk_a, disk_b) = (SimDisk::new(64 * MIB), SimDisk::new(64 * MIB));
    let (a, b) = (pool(&disk_a), pool(&disk_b));
    let v = a.create_volume("v", VOLUME).unwrap();
    let all: Vec<u8> = (0..VOLUME / BLOCK as u64).flat_map(noise).collect();
    a.write(v, 0, &all).unwrap();
    a.snapshot("v@s1").unwrap();
    // Blocks 10 and 40 change after s1.
    a.write(v, 10 * BLOCK as u64, &noise(1000)).unwrap();
    a.write(v, 40 * BLOCK as u64, &noise(1001)).unwrap();
    a.snapshot("v@s2").unwrap();
    a.flush().unwrap();
    let full_s1 = stream(&a, "v@s1", None);
    let delta_s2 = stream(&a, "v@s2", Some("v@s1"));
    receive(&b, "v", &full_s1);
    receive(&b, "v", &delta_s2);
    // The snapshots' good copies now live on B; A's device is damaged:
    // block 10 as s1 had it (only s1 reads it), block 20 (s1, s2 and v
    // share it), block 40 as s2 has it (s2 and v).
    damage(&disk_a, &noise(10));
    damage(&disk_a, &noise(20));
    damage(&disk_a, &noise(1001));
    let (s1, s2) = (a.lookup("v@s1").unwrap(), a.lookup("v@s2").unwrap());
    assert_eq!(damaged_blocks(&a, s1), [10, 20]);
    assert_eq!(damaged_blocks(&a, s2), [20, 40]);
    assert_eq!(damaged_blocks(&a, v), [20, 40]);
    let b_s1 = contents(&b, "v@s1");
    let b_s2 = contents(&b, "v@s2");

    // Streams of other snapshots are refused, changing nothing: one the
    // pool does not hold (another pool's), and one of another volume.
    let c = pool(&SimDisk::new(64 * MIB));
    let w = c.create_volume("v", VOLUME).unwrap();
    c.write(w, 0, &all).unwrap();
    c.snapshot("v@s1").unwrap();
    let foreign = stream(&c, "v@s1", None);
    let r = heal(&a, "v", &foreign);
    assert!(
        matches!(&r, Err(StreamFailure::Refused(m)) if m.contains("holds no snapshot")),
        "{r:?}"
    );
    let r = heal(&a, "other", &stream(&b, "v@s1", None));
    assert!(matches!(r, Err(StreamFailure::Refused(_))), "{r:?}");
    assert_eq!(a.damage_count().unwrap(), 3);

    // An incremental stream of s2 carries block 40 (changed since s1),
    // not block 20 (s1's, unchanged).
    let got = heal(&a, "v", &stream(&b, "v@s2", Some("v@s1"))).unwrap();
    assert_eq!(got.snapshot, "v@s2");
    assert_eq!(
        (
            got.damaged,
            got.healed.healed,
            got.healed.rejected,
            got.remaining
        ),
        (2, 1, 0, 1)
    );
    assert_eq!(damaged_blocks(&a, s2), [20]);
    // A full stream of s1 heals its two; block 20 is healed for s2 and v
    // too (one chunk, shared).
    let got = heal(&a, "v", &stream(&b, "v@s1", None)).unwrap();
    assert_eq!(
        (got.damaged, got.healed.healed, got.remaining),
        (2, 2, 0),
        "{got:?}"
    );
    for id in [s1, s2, v] {
        assert!(damaged_blocks(&a, id).is_empty());
    }
    assert_eq!(contents(&a, "v@s1"), b_s1);
    assert_eq!(contents(&a, "v@s2"), b_s2);
    assert_eq!(contents(&a, "v"), b_s2);
    assert!(a.damage().unwrap().is_empty());
    assert_eq!(a.damage_count().unwrap(), 0);
    // Nothing left to heal: a stream is still read and verified whole.
    let got = heal(&a, "v", &stream(&b, "v@s2", None)).unwrap();
    assert_eq!((got.damaged, got.healed.healed, got.remaining), (0, 0, 0));
    let mut cut = stream(&b, "v@s2", None);
    cut.truncate(cut.len() - 10);
    assert!(heal(&a, "v", &cut).is_err(), "a truncated stream fails");
    let report = a.check().unwrap();
    assert!(report.is_clean(), "{:#?}", report.problems);
}
