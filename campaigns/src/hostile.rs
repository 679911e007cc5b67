//! Hostile input: every fuzz target of the project, run on stable Rust.
//!
//! The targets' own files (`fuzz/fuzz_targets/*.rs`, and the NBD codec's in
//! `crates/arbor-nbd/fuzz/fuzz_targets/`) are compiled here as modules; the
//! `arbor-fuzz-shim` crate stands in for `libfuzzer-sys`, so each
//! `fuzz_target!` becomes a plain `run(&[u8])`. CI runs every target on its
//! seeds, on every saved regression input (`fuzz/regressions/<target>/`)
//! and on a bounded number of inputs mutated from the seeds. Coverage-guided
//! fuzzing for as long as wanted is `fuzz/run.sh` (libFuzzer, see
//! docs/RELIABILITY.md).

use std::path::PathBuf;
use std::sync::Arc;

use arbor_engine::Pool;
use arbor_io::model::pattern;
use arbor_io::OverlayDevice;
use arbor_nbd::handshake::{Handshake, Step};
use arbor_nbd::memory::{ExportTable, MemoryExport};
use rand::rngs::StdRng;
use rand::Rng;

use crate::{small_create_opts, small_open_opts, MIB};

#[allow(unused_attributes)]
#[path = "../../fuzz/fuzz_targets/decode_backup.rs"]
mod decode_backup;
#[allow(unused_attributes)]
#[path = "../../fuzz/fuzz_targets/decode_blocks.rs"]
mod decode_blocks;
#[allow(unused_attributes)]
#[path = "../../fuzz/fuzz_targets/decode_key_record.rs"]
mod decode_key_record;
#[allow(unused_attributes)]
#[path = "../../fuzz/fuzz_targets/decode_policy.rs"]
mod decode_policy;
#[allow(unused_attributes)]
#[path = "../../fuzz/fuzz_targets/decode_session.rs"]
mod decode_session;
#[allow(unused_attributes)]
#[path = "../../fuzz/fuzz_targets/decode_stream.rs"]
mod decode_stream;
#[allow(unused_attributes)]
#[path = "../../crates/arbor-nbd/fuzz/fuzz_targets/handshake.rs"]
mod handshake;
#[allow(unused_attributes)]
#[path = "../../fuzz/fuzz_targets/open_pool.rs"]
mod open_pool;
#[allow(unused_attributes)]
#[path = "../../crates/arbor-nbd/fuzz/fuzz_targets/request.rs"]
mod request;

/// One fuzz target: its name (as in `cargo fuzz run NAME`), its body and
/// its seed inputs.
pub struct Target {
    pub name: &'static str,
    pub run: fn(&[u8]),
    pub seeds: fn() -> Vec<Vec<u8>>,
    /// How to derive a new input from a seed.
    pub mutate: fn(&mut StdRng, &[u8]) -> Vec<u8>,
    /// Where its libFuzzer project lives, relative to the repository root.
    pub fuzz_dir: &'static str,
}

pub const TARGETS: [Target; 9] = [
    Target {
        name: "decode_blocks",
        run: decode_blocks::run,
        seeds: block_seeds,
        mutate,
        fuzz_dir: "fuzz",
    },
    Target {
        name: "open_pool",
        run: open_pool::run,
        seeds: pool_seeds,
        mutate: mutate_pool,
        fuzz_dir: "fuzz",
    },
    Target {
        name: "decode_stream",
        run: decode_stream::run,
        seeds: stream_seeds,
        mutate,
        fuzz_dir: "fuzz",
    },
    Target {
        name: "decode_session",
        run: decode_session::run,
        seeds: session_seeds,
        mutate,
        fuzz_dir: "fuzz",
    },
    Target {
        name: "decode_policy",
        run: decode_policy::run,
        seeds: policy_seeds,
        mutate,
        fuzz_dir: "fuzz",
    },
    Target {
        name: "decode_backup",
        run: decode_backup::run,
        seeds: backup_seeds,
        mutate,
        fuzz_dir: "fuzz",
    },
    Target {
        name: "decode_key_record",
        run: decode_key_record::run,
        seeds: key_record_seeds,
        mutate,
        fuzz_dir: "fuzz",
    },
    Target {
        name: "handshake",
        run: handshake::run,
        seeds: handshake_seeds,
        mutate,
        fuzz_dir: "crates/arbor-nbd/fuzz",
    },
    Target {
        name: "request",
        run: request::run,
        seeds: request_seeds,
        mutate,
        fuzz_dir: "crates/arbor-nbd/fuzz",
    },
];

/// The repository root (this crate is `campaigns/`).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Saved inputs that once crashed a target: `fuzz/regressions/<target>/*`.
pub fn regressions(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = repo_root().join("fuzz/regressions").join(target);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut inputs: Vec<(PathBuf, Vec<u8>)> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| std::fs::read(e.path()).ok().map(|data| (e.path(), data)))
        .collect();
    inputs.sort();
    inputs
}

/// A random mutation of `input`: bit flips, byte overwrites with boundary
/// values, inserted, deleted or duplicated runs, truncation.
pub fn mutate(rng: &mut StdRng, input: &[u8]) -> Vec<u8> {
    let mut out = input.to_vec();
    for _ in 0..rng.gen_range(1..=8) {
        let len = out.len();
        match rng.gen_range(0..7) {
            0 | 1 if len > 0 => {
                let at = rng.gen_range(0..len);
                out[at] ^= 1 << rng.gen_range(0..8);
            }
            2 if len > 0 => {
                let at = rng.gen_range(0..len);
                let values = [0u8, 1, 0x7f, 0x80, 0xff];
                let n = rng.gen_range(1..=8).min(len - at);
                let v = values[rng.gen_range(0..values.len())];
                out[at..at + n].fill(v);
            }
            3 if len > 0 => {
                let at = rng.gen_range(0..len);
                let n = rng.gen_range(1..=64).min(len - at);
                out.drain(at..at + n);
            }
            4 if len > 0 => {
                let from = rng.gen_range(0..len);
                let n = rng.gen_range(1..=64).min(len - from);
                let piece = out[from..from + n].to_vec();
                let at = rng.gen_range(0..=len);
                out.splice(at..at, piece);
            }
            5 if len > 0 => out.truncate(rng.gen_range(0..len)),
            _ => {
                let at = rng.gen_range(0..=len);
                let random: Vec<u8> = (0..rng.gen_range(1..=16)).map(|_| rng.gen()).collect();
                out.splice(at..at, random);
            }
        }
    }
    out
}

/// A mutation of an `open_pool` input that keeps its framing: damage inside
/// one or more blocks (mostly in the headers and fields at their start,
/// where a re-sealed block's checks live), a block moved, dropped or
/// duplicated elsewhere.
pub fn mutate_pool(rng: &mut StdRng, input: &[u8]) -> Vec<u8> {
    const RECORD: usize = 4 + arbor_format::BLOCK_SIZE;
    let mut out = input.to_vec();
    let records = out.len().saturating_sub(5) / RECORD;
    if records == 0 {
        return mutate(rng, input);
    }
    for _ in 0..rng.gen_range(1..=4) {
        let r = 5 + rng.gen_range(0..records) * RECORD;
        match rng.gen_range(0..10) {
            0..=5 => {
                let within = if rng.gen_bool(0.8) {
                    rng.gen_range(0..256)
                } else {
                    rng.gen_range(0..RECORD - 4)
                };
                let at = r + 4 + within;
                match rng.gen_range(0..3) {
                    0 => out[at] ^= 1 << rng.gen_range(0..8),
                    1 => out[at] = [0, 1, 0x7f, 0x80, 0xff][rng.gen_range(0..5)],
                    _ => out[at] = out[at].wrapping_add(rng.gen_range(1..4)),
                }
            }
            6 => {
                let index: u32 = rng.gen();
                out[r..r + 4].copy_from_slice(&index.to_le_bytes());
            }
            7 => {
                let other = 5 + rng.gen_range(0..records) * RECORD;
                let index = out[other..other + 4].to_vec();
                out[r..r + 4].copy_from_slice(&index);
            }
            8 => {
                out.drain(r..r + RECORD);
                return out;
            }
            _ => {
                let record = out[r..r + RECORD].to_vec();
                out.extend_from_slice(&record);
            }
        }
    }
    out
}

/// Encodes a device image in `open_pool`'s input format: its non-zero blocks.
pub fn encode_pool_input(image: &[u8], reseal: bool) -> Vec<u8> {
    const BS: usize = arbor_format::BLOCK_SIZE;
    let mut out = vec![u8::from(reseal)];
    out.extend_from_slice(&((image.len() / BS) as u32).to_le_bytes());
    for (i, block) in image.chunks(BS).enumerate() {
        if block.iter().any(|&b| b != 0) {
            out.extend_from_slice(&(i as u32).to_le_bytes());
            out.extend_from_slice(block);
        }
    }
    out
}

/// A small real pool: volumes, a snapshot, a clone, a deleted volume
/// awaiting reclaim. Returns its image.
fn small_pool_image(chunk: u32) -> Vec<u8> {
    let dev = Arc::new(OverlayDevice::zeroed(14 * MIB));
    let build = || -> arbor_engine::Result<()> {
        let pool = Pool::create(dev.clone(), &small_create_opts(chunk), &small_open_opts())?;
        let v = pool.create_volume("vm1", MIB)?;
        let doomed = pool.create_volume("doomed", MIB)?;
        for i in 0..4u64 {
            pool.write(v, i * 65536, &pattern(i, i * 65536, 4096))?;
            pool.write(doomed, i * 4096, &pattern(i + 9, i * 4096, 512))?;
        }
        pool.snapshot("vm1@a")?;
        pool.clone_snapshot("vm1@a", "c1")?;
        pool.write(pool.lookup("c1")?, 0, &pattern(99, 0, 4096))?;
        pool.delete("doomed")?;
        // A copy-on-write volume with its home in the pool, a snapshot of
        // it (an epoch), copies in its store, a clone reading through it.
        let db = pool.create_cow_volume("db", 256 * 1024)?;
        pool.write(db, 0, &pattern(7, 0, 65536))?;
        pool.snapshot("db@a")?;
        pool.write(db, 4096, &pattern(8, 4096, 8192))?;
        pool.clone_snapshot("db@a", "dbc")?;
        pool.write(pool.lookup("dbc")?, 0, &pattern(9, 0, 512))?;
        pool.close()
    };
    // Building a fresh pool in memory cannot fail; if it ever does, the
    // seed is just the partial image (still a valid fuzz input).
    let _ = build();
    dev.image()
}

fn pool_seeds() -> Vec<Vec<u8>> {
    let a = small_pool_image(4096);
    let b = small_pool_image(16384);
    vec![
        encode_pool_input(&a, false),
        encode_pool_input(&a, true),
        encode_pool_input(&b, true),
    ]
}

fn block_seeds() -> Vec<Vec<u8>> {
    let image = small_pool_image(4096);
    let mut seeds = Vec::new();
    let mut kinds = std::collections::BTreeSet::new();
    for block in image.chunks(arbor_format::BLOCK_SIZE) {
        // One block of each type (byte 6 of the header), and of each tree kind.
        if block[..4] == *b"ARBR" && kinds.insert((block[6], block[32])) {
            seeds.push(block.to_vec());
        }
    }
    seeds
}

/// Real send streams, as the `decode_stream` target takes them (a flags
/// byte, then the stream): full, incremental with delta records against
/// the target's base pattern, resumed, empty; whole and in pieces, as sent
/// and re-sealed (so that mutations get past the checksums); and a resume
/// token.
/// Replication sessions as they go: a source's and a target's messages,
/// each after a flags byte (whole, in small pieces, re-sealed).
fn session_seeds() -> Vec<Vec<u8>> {
    use arbor_replica::proto::*;
    use arbor_stream::format::Guid;
    let guid = |n: u8| WireGuid(Guid([n; 16]));
    let source = [
        Message::Hello(Hello {
            volume: "vm1".into(),
            snapshots: vec![
                SnapshotEntry {
                    guid: guid(2),
                    name: "vm1@repl-2".into(),
                    created: 1_700_000_100,
                },
                SnapshotEntry {
                    guid: guid(1),
                    name: "vm1@repl-1".into(),
                    created: 1_700_000_000,
                },
            ],
            path: vec!["alpha".into(), "beta".into()],
            seeded: false,
            force: true,
            heal: true,
        }),
        Message::Begin(Begin {
            abort_partial: true,
        }),
        Message::Data(stream_seeds().into_iter().next().unwrap_or_default()),
        Message::Done,
        Message::Blocks(Blocks {
            guid: Guid([1; 16]),
            blocks: vec![(4096, vec![0x5a; HEAL_BLOCK])],
        }),
        Message::Want(Want {
            wants: vec![Wanted {
                guid: guid(2),
                offsets: vec![8192],
            }],
        }),
        Message::End,
    ];
    let target = [
        Message::Plan(Plan {
            common: Some(guid(1)),
            resume: Some(
                arbor_stream::format::ResumeToken {
                    target: Guid([2; 16]),
                    base: Some(Guid([1; 16])),
                    offset: 65536,
                    volume_size: 4 * MIB,
                }
                .encode(),
            ),
            rolled_back: vec!["vm1@local".into()],
            heal: true,
            wants: vec![Wanted {
                guid: guid(1),
                offsets: vec![0, 4096, 1 << 20],
            }],
        }),
        Message::Received(Received {
            snapshot: "vm1@repl-2".into(),
            guid: guid(2),
            stream_bytes: 4096,
            resumed_from: 65536,
        }),
        Message::Blocks(Blocks {
            guid: Guid([2; 16]),
            blocks: vec![(8192, vec![0xa5; HEAL_BLOCK]), (0, vec![0; HEAL_BLOCK])],
        }),
        Message::Done,
        Message::Refuse(Refusal {
            code: RefusalCode::Diverged,
            message: "vm1 diverged".into(),
        }),
        Message::Failed(Refusal {
            code: RefusalCode::NoSpace,
            message: "full".into(),
        }),
    ];
    let mut seeds = Vec::new();
    for side in [&source[..], &target[..]] {
        let mut wire = Vec::new();
        for m in side {
            encode(m, &mut wire);
        }
        for flags in [0u8, 0x03, 0x80 | 0x11] {
            let mut seed = vec![flags];
            seed.extend_from_slice(&wire);
            seeds.push(seed);
        }
    }
    seeds
}

/// The monitor's parsers: byte 0 the parser, 8 bytes of time, the input.
/// Real repository objects (docs/BACKUP.md), made with the encoders, each
/// behind the byte that selects its parser in `decode_backup`.
fn backup_seeds() -> Vec<Vec<u8>> {
    use arbor_backup::crypto::{Keys, Secret};
    use arbor_backup::format::config::{KeySource, RepoConfig};
    use arbor_backup::format::index::{self, PackEntries};
    use arbor_backup::format::manifest::{self, Manifest, Piece};
    use arbor_backup::format::pack::{self, PackWriter};
    use arbor_backup::format::BlobKind;
    use arbor_backup::format::{checkpoint, lock};
    // The key decode_backup opens with.
    let keys = Keys::derive(&Secret::from_bytes([0x5a; 32]), b"fuzz");
    let seed = |which: u8, input: &[u8]| [&[which][..], input].concat();
    let blobs: Vec<Vec<u8>> = vec![
        vec![0; 4096],
        (0..5000u32).map(|i| i as u8).collect(),
        b"x".to_vec(),
    ];
    let mut writer = PackWriter::new();
    for b in &blobs {
        let id = keys.blob_id(BlobKind::Data.code(), b);
        writer.add(pack::seal_blob(&keys, id, BlobKind::Data, b));
    }
    let (pack_id, pack_bytes, entries) = writer.finish(&keys);
    let packs = vec![PackEntries {
        pack: pack_id,
        entries: entries.clone(),
    }];
    let index_object = index::encode(&keys, &packs);
    let piece = Piece(
        entries
            .iter()
            .enumerate()
            .map(|(i, e)| (i as u32 * 3, e.id))
            .collect(),
    );
    let m = Manifest {
        version: arbor_backup::format::REPO_VERSION,
        volume: "vm1".into(),
        snapshot: "vm1@daily".into(),
        guid: "00112233445566778899aabbccddeeff".into(),
        host: "alpha".into(),
        created_unix: 1,
        completed_unix_ms: 2,
        size: 65536 * 1500,
        block_size: 65536,
        parent: Some(pack_id.to_string()),
        pieces: vec![Some(entries[0].id.to_string()), None],
        blocks: 3,
        added_blobs: 3,
        added_bytes: pack_bytes.len() as u64,
    };
    let manifest_object = manifest::encode(&keys, &m);
    let held = lock::LockRecord {
        version: arbor_backup::format::REPO_VERSION,
        exclusive: true,
        operation: "prune".into(),
        host: "alpha".into(),
        boot_id: "8a2d33c1-5e3f-4f8e-9a51-3d1c0d1e2f3a".into(),
        pid: 4242,
        taken_unix_ms: 1_795_493_869_000,
    };
    let unfinished = checkpoint::Checkpoint {
        done: 1,
        manifest: Manifest {
            pieces: vec![Some(entries[0].id.to_string()), None],
            ..m.clone()
        },
    };
    let (config, _) = RepoConfig::new(65536, &KeySource::KeyFile(b"fuzz key")).expect("a config");
    // A pack header's and an index's contents: what their objects seal.
    let mut header = (entries.len() as u32).to_le_bytes().to_vec();
    let mut plain_index = 1u32.to_le_bytes().to_vec();
    plain_index.extend_from_slice(&pack_id.0);
    plain_index.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    for e in &entries {
        let mut one = e.id.0.to_vec();
        one.push(0);
        one.push(u8::from(e.encoding == pack::Encoding::Zstd));
        one.extend_from_slice(&e.offset.to_le_bytes());
        one.extend_from_slice(&e.stored_len.to_le_bytes());
        one.extend_from_slice(&e.raw_len.to_le_bytes());
        header.extend_from_slice(&one);
        plain_index.extend_from_slice(&one);
    }
    let header_len = (pack_bytes.len() as u32).to_le_bytes();
    let compressed = zstd::bulk::compress(&blobs[1], 1).expect("zstd compresses");
    let mut blob = vec![0u8, 1];
    blob.extend_from_slice(&(blobs[1].len() as u32).to_le_bytes());
    blob.extend_from_slice(&compressed);
    vec![
        seed(0, &config.encode()),
        seed(1, &pack_bytes),
        seed(2, &[&header_len[..], &header].concat()),
        seed(3, &index_object),
        seed(3, &plain_index),
        seed(4, &manifest_object),
        seed(4, &serde_json::to_vec(&m).expect("a manifest serializes")),
        seed(5, &piece.encode()),
        seed(6, &blob),
        seed(8, &lock::encode(&keys, &held)),
        seed(8, &serde_json::to_vec(&held).expect("a lock serializes")),
        seed(9, &checkpoint::encode(&keys, &unfinished)),
        seed(
            9,
            &serde_json::to_vec(&unfinished).expect("a checkpoint serializes"),
        ),
    ]
}

/// Key records sealed with the target's fixed raw key and passphrase (so
/// mutations start from records that open), a raw key file in both forms,
/// and passphrases.
fn key_record_seeds() -> Vec<Vec<u8>> {
    use arbor_crypt::{DataUnit, Kdf, KeyRecord, UserKey};
    let cheap = Kdf::Argon2id {
        memory_kib: 8 * 1024,
        passes: 1,
        lanes: 1,
    };
    let raw = UserKey::raw_from_file(&[0x5a; 32]).expect("32 bytes are a raw key");
    let phrase = UserKey::passphrase(b"fuzzing passphrase").expect("a passphrase");
    let mut seeds = Vec::new();
    for (user, unit) in [(&raw, DataUnit::B4096), (&phrase, DataUnit::B512)] {
        let (record, _) = KeyRecord::create(user, unit, cheap).expect("a key record");
        seeds.push([&[0u8][..], &record.encode()].concat());
    }
    seeds.push([&[1u8][..], &[0x5a; 32]].concat());
    seeds.push([&[1u8][..], format!("{}\n", "5a".repeat(32)).as_bytes()].concat());
    seeds.push([&[2u8][..], b"fuzzing passphrase\n"].concat());
    let mut store = arbor_crypt::KeyStore::default();
    for user in [&raw, &phrase] {
        let (record, _) = KeyRecord::create(user, DataUnit::B4096, cheap).expect("a key record");
        store.add(record).expect("a slot");
    }
    seeds.push([&[3u8][..], &store.encode()].concat());
    seeds.push(vec![2u8; 4]);
    seeds
}

fn policy_seeds() -> Vec<Vec<u8>> {
    let now = 1_795_493_869u64.to_le_bytes();
    let seed = |which: u8, input: &[u8]| [&[which][..], &now, input].concat();
    let mut policy = arbor_monitor::Policy::new(
        vec![3, 7],
        "daily at 23:59".parse().expect("a valid schedule"),
        "hourly=24,daily=7".parse().expect("a valid retention"),
    );
    policy.space_prune_percent = Some(90);
    let mut seeds = vec![seed(0, &policy.encode())];
    for s in [
        "every 15m",
        "hourly at :30",
        "daily at 23:59",
        "weekly on mon at 02:00",
        "monthly on 1 at 00:00",
    ] {
        seeds.push(seed(1, s.as_bytes()));
    }
    for r in [
        "hourly=24,daily=7,weekly=4,monthly=6",
        "frequent=3,yearly=2",
        "1x1h(keep=all) | 24x1h | 14x1d",
    ] {
        seeds.push(seed(2, r.as_bytes()));
    }
    seeds.push(seed(
        3,
        &arbor_format::encode_property(&policy.encode()).expect("a policy fits"),
    ));
    seeds
}

fn stream_seeds() -> Vec<Vec<u8>> {
    use arbor_stream::format::{Compression, Encoder, Guid, Header, ResumeToken, StreamError};
    let header = |base: Option<Guid>, resume_offset: u64| Header {
        chunk_size: 16384,
        volume_size: 4 * MIB,
        target: Guid([0x5a; 16]),
        base,
        resume_offset,
        creation_time: 1_700_000_000,
        name: "vm1@monday".to_string(),
        raw: false,
    };
    let base = decode_stream::base();
    let build = |h: &Header, compression| -> Result<Vec<u8>, StreamError> {
        let mut out = Vec::new();
        let mut enc = Encoder::new(h, compression, &mut out)?;
        let start = h.resume_offset;
        if h.volume_size > start {
            enc.data(start, &pattern(1, start, 4096), None, &mut out)?;
            enc.data(start + 8192, &[0x61; 8192], None, &mut out)?;
            let mut edited = base[..16384].to_vec();
            edited[100] ^= 0xff;
            let delta_base = h.base.map(|_| &base[..16384]);
            enc.data(start + 65536, &edited, delta_base, &mut out)?;
            enc.zero(start + 131072, 65536, &mut out)?;
            enc.discard(start + 262144, MIB, &mut out)?;
        }
        enc.finish(&mut out)?;
        Ok(out)
    };
    let streams = [
        (header(None, 0), Compression::Zstd { level: 3 }),
        (
            header(Some(Guid([0xa5; 16])), 0),
            Compression::Best { level: 3 },
        ),
        (
            header(Some(Guid([0xa5; 16])), 2 * MIB),
            Compression::Zstd { level: 1 },
        ),
        (header(None, 4 * MIB), Compression::None),
    ];
    let mut seeds = Vec::new();
    for (h, compression) in &streams {
        // Encoding fixed, valid streams cannot fail.
        let stream =
            build(h, *compression).unwrap_or_else(|e| panic!("building a decode_stream seed: {e}"));
        for flags in [0x00u8, 0x80, 0x81, 0x07] {
            seeds.push([&[flags], &stream[..]].concat());
        }
    }
    // Raw streams (version 2): a key record after the header, whole
    // chunks of ciphertext and discards.
    let key = {
        let mut bytes = [0u8; arbor_crypt::KEY_RECORD_LEN];
        bytes[..4].copy_from_slice(&[1, 1, 9, 1]);
        bytes[16..].fill(0x44);
        arbor_crypt::KeyRecord::decode(&bytes)
            .unwrap_or_else(|e| panic!("a raw decode_stream seed's key: {e}"))
    };
    for (base, resume_offset) in [(None, 0), (Some(Guid([0xa5; 16])), 2 * MIB)] {
        let h = Header {
            raw: true,
            ..header(base, resume_offset)
        };
        let build = || -> Result<Vec<u8>, StreamError> {
            let mut out = Vec::new();
            let mut enc = Encoder::new_raw(&h, &key, &mut out)?;
            enc.data(
                resume_offset,
                &pattern(2, resume_offset, 16384),
                None,
                &mut out,
            )?;
            enc.discard(resume_offset + 65536, MIB, &mut out)?;
            enc.finish(&mut out)?;
            Ok(out)
        };
        let stream = build().unwrap_or_else(|e| panic!("building a raw decode_stream seed: {e}"));
        for flags in [0x00u8, 0x80, 0x81, 0x07] {
            seeds.push([&[flags], &stream[..]].concat());
        }
    }
    let token = ResumeToken {
        target: Guid([0x5a; 16]),
        base: Some(Guid([0xa5; 16])),
        offset: 2 * MIB,
        volume_size: 4 * MIB,
    };
    seeds.push(token.encode().into_bytes());
    seeds
}

fn option(code: u32, data: &[u8]) -> Vec<u8> {
    let mut out = 0x4948_4156_454F_5054u64.to_be_bytes().to_vec();
    out.extend_from_slice(&code.to_be_bytes());
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
    out
}

fn name_and_infos(name: &str, infos: &[u16]) -> Vec<u8> {
    let mut out = (name.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(&(infos.len() as u16).to_be_bytes());
    for info in infos {
        out.extend_from_slice(&info.to_be_bytes());
    }
    out
}

fn meta_context(name: &str, queries: &[&str]) -> Vec<u8> {
    let mut out = (name.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for q in queries {
        out.extend_from_slice(&(q.len() as u32).to_be_bytes());
        out.extend_from_slice(q.as_bytes());
    }
    out
}

/// Real client sessions (client-to-server bytes of nbdinfo, nbdcopy,
/// qemu-img, qemu-io and python3-libnbd connections to `arbor serve`),
/// recorded by `fuzz/sessions/capture.py`, in file-name order.
fn recorded_sessions() -> Vec<Vec<u8>> {
    let dir = repo_root().join("fuzz/sessions");
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|entries| entries.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    paths.retain(|p| p.extension().is_some_and(|e| e == "bin"));
    paths.sort();
    paths
        .iter()
        .map(|p| std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
        .collect()
}

/// A recorded session as the `request` target takes it: the session bits
/// (read-only 1, structured 2, base:allocation 4, extended headers 16) the
/// handshake negotiated, then the bytes after the handshake. None if it
/// never left the handshake.
fn transmission_part(stream: &[u8]) -> Option<Vec<u8>> {
    let exports = ExportTable::new();
    exports.insert("vol", Arc::new(MemoryExport::new(MIB)));
    let mut handshake = Handshake::new();
    let mut rest = stream;
    while rest.len() >= handshake.wanted() {
        let (chunk, tail) = rest.split_at(handshake.wanted());
        rest = tail;
        match handshake.receive(chunk, &exports).ok()? {
            Step::Continue { .. } => {}
            Step::Transmit { session, .. } => {
                let bits = u8::from(session.read_only)
                    | u8::from(session.structured) << 1
                    | u8::from(session.base_allocation()) << 2
                    | u8::from(session.extended) << 4;
                return Some([&[bits], rest].concat());
            }
            // Recorded sessions are plaintext.
            Step::Close { .. } | Step::StartTls { .. } => return None,
        }
    }
    None
}

/// Client sides of handshakes: built as libnbd (nbdinfo, nbdcopy) and qemu
/// send them, and recorded from the real clients.
/// Seeds of the `handshake` target: its first byte picks the TLS mode (0
/// off, 1 on, 2 require; 0x10 the client presents the certificate "client",
/// 0x20 anonymous clients may read), the rest is what the client sends.
fn handshake_seeds() -> Vec<Vec<u8>> {
    let tls = |mode: u8, flags: u32, options: &[Vec<u8>]| {
        let mut out = vec![mode];
        out.extend_from_slice(&flags.to_be_bytes());
        for o in options {
            out.extend_from_slice(o);
        }
        out
    };
    let session = |flags: u32, options: &[Vec<u8>]| tls(0x20, flags, options);
    let starttls = [
        tls(
            0x12,
            3,
            &[
                option(3, &[]),
                option(5, &[]),
                option(8, &[]),
                option(5, &[]),
                option(7, &name_and_infos("vol", &[3])),
            ],
        ),
        tls(0x02, 3, &[option(1, b"vol")]),
        tls(
            0x21,
            3,
            &[
                option(6, &name_and_infos("vol", &[])),
                option(5, &[]),
                option(7, &name_and_infos("", &[])),
            ],
        ),
    ];
    vec![
        session(
            3,
            &[
                option(8, &[]),
                option(3, &[]),
                option(9, &meta_context("vol", &["base:"])),
                option(10, &meta_context("vol", &["base:allocation"])),
                option(7, &name_and_infos("vol", &[3])),
            ],
        ),
        session(1, &[option(1, b"vol")]),
        session(
            3,
            &[
                option(6, &name_and_infos("", &[0, 1, 2, 3])),
                option(2, &[]),
            ],
        ),
        session(
            3,
            &[
                option(7, &name_and_infos("nope", &[])),
                option(7, &name_and_infos("", &[])),
            ],
        ),
        // Extended headers, as qemu asks for them: first, then meta
        // contexts and GO; and after structured replies, which it refuses.
        session(
            3,
            &[
                option(11, &[]),
                option(10, &meta_context("vol", &["base:allocation"])),
                option(7, &name_and_infos("vol", &[3])),
            ],
        ),
        session(
            3,
            &[
                option(8, &[]),
                option(11, &[]),
                option(8, &[]),
                option(1, b"vol"),
            ],
        ),
    ]
    .into_iter()
    .chain(
        recorded_sessions()
            .into_iter()
            .map(|recorded| [&[0x20], &recorded[..]].concat()),
    )
    .chain(starttls)
    .collect()
}

fn request(flags: u16, kind: u16, offset: u64, len: u32) -> Vec<u8> {
    request_header(0x2560_9513, flags, kind, offset, &len.to_be_bytes())
}

/// An extended request header (`NBD_OPT_EXTENDED_HEADERS`): 64-bit length.
fn extended_request(flags: u16, kind: u16, offset: u64, len: u64) -> Vec<u8> {
    request_header(0x21e4_1c71, flags, kind, offset, &len.to_be_bytes())
}

fn request_header(magic: u32, flags: u16, kind: u16, offset: u64, len: &[u8]) -> Vec<u8> {
    let mut out = magic.to_be_bytes().to_vec();
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(&kind.to_be_bytes());
    out.extend_from_slice(&7u64.to_be_bytes());
    out.extend_from_slice(&offset.to_be_bytes());
    out.extend_from_slice(len);
    out
}

/// A session with extended headers (and `base:allocation`) sending every
/// command, with lengths over 4 GiB where the command allows them, then a
/// block status request with a payload (which must be drained).
fn extended_session() -> Vec<u8> {
    const GIB: u64 = 1 << 30;
    const PAYLOAD_LEN: u16 = 1 << 5;
    let mut out = vec![2 | 4 | 16];
    out.extend(extended_request(PAYLOAD_LEN | 1, 1, 5 * GIB, 4096));
    out.extend_from_slice(&pattern(1, 0, 4096));
    // A write without the payload flag, as qemu sends them.
    out.extend(extended_request(0, 1, 0, 512));
    out.extend_from_slice(&pattern(2, 0, 512));
    for (flags, kind, offset, len) in [
        (0, 0, 5 * GIB, 8192),
        (4, 0, 5 * GIB, 8192),
        (0, 3, 0, 0),
        (1, 4, GIB, 6 * GIB),
        (2, 6, 0, 512),
        (16, 6, 0, 6 * GIB),
        (0, 6, 2 * GIB, 5 * GIB),
        (8, 7, 0, 8 * GIB),
        (0, 7, 0, 8 * GIB),
        (0, 5, 0, 8 * GIB),
    ] {
        out.extend(extended_request(flags, kind, offset, len));
    }
    out.extend(extended_request(PAYLOAD_LEN, 7, 0, 12));
    out.extend_from_slice(&(8 * GIB).to_be_bytes());
    out.extend_from_slice(&1u32.to_be_bytes());
    out.extend(extended_request(0, 2, 0, 0));
    out
}

/// Transmission-phase sessions: every command, with and without structured
/// replies, and the transmission phases of the recorded real sessions.
fn request_seeds() -> Vec<Vec<u8>> {
    let mut writes = request(1, 1, 0, 4096);
    writes.extend_from_slice(&pattern(1, 0, 4096));
    let commands = [
        writes,
        request(0, 0, 0, 4096),
        request(4, 0, 0, 8192),
        request(0, 3, 0, 0),
        request(1, 4, 4096, 4096),
        request(2, 6, 8192, 4096),
        request(16, 6, 8192, 4096),
        request(8, 7, 0, 65536),
        request(0, 5, 0, 4096),
        request(0, 2, 0, 0),
    ];
    [0u8, 1, 2, 6]
        .iter()
        .map(|&session| {
            let mut out = vec![session];
            for c in &commands {
                out.extend_from_slice(c);
            }
            out
        })
        .chain(std::iter::once(extended_session()))
        .chain(
            recorded_sessions()
                .iter()
                .filter_map(|s| transmission_part(s)),
        )
        .collect()
}

/// Runs `target` on its seeds, its saved regressions and `mutations` inputs
/// mutated from the seeds (deterministic for a given `seed`). Returns how
/// many inputs ran. A crash panics with the input's description; the input
/// is saved to `fuzz/artifacts/<target>/` for a regression test.
pub fn exercise(target: &Target, mutations: u64, seed: u64) -> u64 {
    use rand::SeedableRng;
    let seeds = (target.seeds)();
    let mut runs = 0;
    let mut one = |what: &str, input: &[u8]| {
        runs += 1;
        let outcome = std::panic::catch_unwind(|| (target.run)(input));
        if outcome.is_err() {
            let dir = repo_root().join("fuzz/artifacts").join(target.name);
            let path = dir.join(format!("crash-{seed}-{runs}"));
            let saved = std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&path, input));
            panic!(
                "{}: {what} crashed the target (input saved: {saved:?} at {})",
                target.name,
                path.display()
            );
        }
    };
    for (i, input) in seeds.iter().enumerate() {
        one(&format!("seed {i}"), input);
    }
    for (path, input) in regressions(target.name) {
        one(&format!("regression {}", path.display()), &input);
    }
    let mut rng = StdRng::seed_from_u64(seed);
    for i in 0..mutations {
        if seeds.is_empty() {
            break;
        }
        let from = rng.gen_range(0..seeds.len());
        let input = (target.mutate)(&mut rng, &seeds[from]);
        one(&format!("mutation {i} (rng seed {seed})"), &input);
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recorded_sessions_reach_the_transmission_phase_with_requests() {
        let sessions = recorded_sessions();
        assert!(
            sessions.len() >= 8,
            "only {} recorded sessions",
            sessions.len()
        );
        let parts: Vec<Vec<u8>> = sessions
            .iter()
            .filter_map(|s| transmission_part(s))
            .collect();
        // `nbdinfo --list` ends in the handshake; every other client transmits.
        assert_eq!(parts.len(), sessions.len() - 1);
        let header = arbor_nbd::proto::REQUEST_HEADER_LEN;
        assert!(
            parts.iter().all(|p| p.len() > header),
            "a session without requests"
        );
        assert!(
            parts.iter().any(|p| p[0] & 6 == 6),
            "no session negotiated structured replies with base:allocation"
        );
        // qemu (10.0) negotiates extended headers.
        assert!(
            parts.iter().any(|p| p[0] & 16 == 16),
            "no session negotiated extended headers"
        );
    }
}

#[cfg(test)]
mod backup_seed_tests {
    use arbor_backup::crypto::{Keys, Secret, SEAL_OVERHEAD};
    use arbor_backup::format::config::RepoConfig;
    use arbor_backup::format::manifest::{self, Piece};
    use arbor_backup::format::{index, lock, pack};

    /// Each seed gets past its parser (a seed that fails early only fuzzes
    /// the first check).
    #[test]
    fn every_backup_seed_decodes() {
        let keys = Keys::derive(&Secret::from_bytes([0x5a; 32]), b"fuzz");
        for seed in super::backup_seeds() {
            let (which, rest) = seed.split_first().unwrap();
            let ok = match which {
                0 => RepoConfig::decode(rest).is_ok(),
                1 => pack::decode_pack(&keys, rest).is_ok(),
                2 => {
                    let len = u64::from(u32::from_le_bytes(rest[..4].try_into().unwrap()));
                    pack::decode_header_plain(&rest[4..], rest.len() - 4 + SEAL_OVERHEAD, len)
                        .is_ok()
                }
                3 => index::decode(&keys, rest).is_ok() || index::decode_plain(rest).is_ok(),
                4 => manifest::decode(&keys, rest).is_ok() || manifest::decode_json(rest).is_ok(),
                5 => Piece::decode(rest).is_ok(),
                8 => lock::decode(&keys, rest).is_ok() || lock::decode_json(rest).is_ok(),
                _ => true,
            };
            assert!(ok, "seed {which} does not decode");
        }
    }
}
