//! Makes one frozen pool image of `crates/arbor-engine/tests/images/`.
//!
//! Documentation, not built here: this file was copied as
//! `crates/arbor-engine/src/bin/gen_image.rs` (versions 1 to 8) or, from
//! version 9 on, as `crates/arbor-engine/examples/gen_image.rs` (crc32c is
//! a dev-dependency of the engine now, which an example may use) into a
//! temporary worktree of the last commit of a format version (README.md
//! beside the images names each commit) and built there with that
//! version's API:
//!
//! ```text
//! cargo rustc --release -p arbor-engine --bin gen_image -- --cfg since_v2 ... --cfg since_vN
//! cargo rustc --release -p arbor-engine --example gen_image -- --cfg since_v2 ... --cfg since_vN
//! target/release/gen_image POOL_FILE MANIFEST_FILE   (target/release/examples/ for an example)
//! zstd -19 POOL_FILE -o vN.pool.zst
//! ```
//!
//! Each `since_vK` cfg turns on what version K added, so one text serves
//! every version. Content is a pattern of (volume seed, offset); the
//! manifest records what the code of that version read back: each listed
//! volume's name, size, snapshot flag and crc32c of its whole content, and
//! the properties it set. The test (`tests/images.rs`) checks today's code
//! against it.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use arbor_engine::{CreateOptions, OpenOptions, Pool};
use arbor_io::{BlockDevice, FileDevice};

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;

/// The bytes of a pattern `seed` at volume offset `offset..offset + len`.
fn pattern(seed: u8, offset: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| {
            let at = offset + i;
            // The block number and the offset in it, so a block misplaced
            // by a whole block reads wrong.
            ((at / 4096) as u8).wrapping_mul(31) ^ (at as u8) ^ seed.wrapping_mul(101)
        })
        .collect()
}

/// The raw key of the image's encrypted volume (version 11).
#[cfg(since_v11)]
const IMAGE_KEY: [u8; 32] = [0x5e; 32];

fn write(pool: &Pool, name: &str, seed: u8, offset: u64, len: u64) {
    let id = pool.lookup(name).expect("lookup");
    pool.write(id, offset, &pattern(seed, offset, len as usize))
        .expect("write");
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (pool_path, manifest_path) = (Path::new(&args[1]), Path::new(&args[2]));
    // A small pool (a grown one: 12 MiB, grown to 16 MiB, from version 2)
    // with 16 KiB chunks, so a 4 KiB write into a shared chunk can make a
    // partial extent (version 7).
    let first_size = if cfg!(since_v2) { 12 * MIB } else { 16 * MIB };
    let dev: Arc<dyn BlockDevice> =
        Arc::new(FileDevice::create_file(pool_path, first_size).expect("pool file"));
    let opts = CreateOptions {
        chunk_size: 16 * KIB as u32,
        metadata_bytes: Some(MIB),
        journal_pages: Some(16),
        ..Default::default()
    };
    let open = OpenOptions::default();
    let pool = Pool::create(Arc::clone(&dev), &opts, &open).expect("create");

    // base: 1 MiB, its first 256 KiB and a block near its end written.
    pool.create_volume("base", MIB).expect("base");
    write(&pool, "base", 1, 0, 256 * KIB);
    write(&pool, "base", 2, MIB - 4 * KIB, 4 * KIB);
    pool.snapshot("base@s1").expect("s1");
    // Over the snapshot: a whole chunk, and one block of a shared chunk
    // (a partial extent from version 7).
    write(&pool, "base", 3, 64 * KIB, 16 * KIB);
    write(&pool, "base", 4, 132 * KIB, 4 * KIB);
    pool.snapshot("base@s2").expect("s2");
    // Another block of that chunk over s2 (a middle layer from version 8).
    write(&pool, "base", 5, 136 * KIB, 4 * KIB);

    // clone of s1, written at its end; a never written volume.
    pool.clone_snapshot("base@s1", "clone").expect("clone");
    write(&pool, "clone", 6, 512 * KIB, 48 * KIB);
    pool.create_volume("empty", 256 * KIB).expect("empty");

    // Deleted, its space left in the reclaim queue.
    pool.create_volume("gone", 256 * KIB).expect("gone");
    write(&pool, "gone", 7, 0, 128 * KIB);
    pool.flush().expect("flush");
    pool.delete("gone").expect("delete");

    #[cfg(since_v2)]
    {
        let report = pool
            .grow(&arbor_engine::GrowOptions {
                size: Some(16 * MIB),
                metadata_bytes: Some(512 * KIB),
            })
            .expect("grow");
        assert_eq!(report.new_pool_bytes, 16 * MIB);
        // Enough data to reach into the grown region.
        pool.create_volume("big", 6 * MIB).expect("big");
        write(&pool, "big", 8, 0, 6 * MIB);
    }
    #[cfg(since_v3)]
    assert!(pool.hold("base@s1", "keep").expect("hold"));
    #[cfg(since_v4)]
    {
        pool.set_property(None, "image.pool", b"pool value")
            .expect("pool property");
        let base = pool.lookup("base").expect("base");
        pool.set_property(Some(base), "image.volume", b"volume value")
            .expect("volume property");
    }
    #[cfg(since_v5)]
    {
        // A copy-on-write volume whose home is in the pool, with a
        // snapshot and a write over it.
        pool.create_cow_volume("cow", 512 * KIB).expect("cow");
        write(&pool, "cow", 9, 0, 64 * KIB);
        pool.snapshot("cow@c1").expect("c1");
        write(&pool, "cow", 10, 16 * KIB, 8 * KIB);
    }
    #[cfg(since_v10)]
    {
        // Data checksums: new chunks, then an overwrite that redirects
        // (its region not yet listed as written in place), then the same
        // overwrite in place.
        pool.create_volume("summed", 256 * KIB).expect("summed");
        write(&pool, "summed", 11, 0, 64 * KIB);
        pool.flush().expect("flush");
        write(&pool, "summed", 12, 16 * KIB, 4 * KIB);
        pool.flush().expect("flush");
        write(&pool, "summed", 12, 16 * KIB, 4 * KIB);
    }
    #[cfg(since_v11)]
    {
        // An encrypted volume (4 KiB units) and a snapshot of it: its data
        // key in slot 1 of the pool's key store, wrapped by the raw key
        // the manifest gives (IMAGE_KEY).
        use arbor_crypt::{DataUnit, Kdf, KeyRecord, KeyStore, UserKey, VolumeCipher};
        let user = UserKey::raw_from_file(&IMAGE_KEY).expect("the image's key");
        let (record, data_key) =
            KeyRecord::create(&user, DataUnit::B4096, Kdf::PASSPHRASE_DEFAULT).expect("record");
        let mut store = KeyStore::default();
        let slot = store.add(record.clone()).expect("slot");
        pool.set_property(None, arbor_crypt::KEY_STORE_PROPERTY, &store.encode())
            .expect("key store");
        let cipher = VolumeCipher::new(data_key, record.key_id, record.unit).expect("cipher");
        pool.load_key(slot, cipher).expect("load the key");
        pool.create_encrypted_volume("sealed", 256 * KIB, slot)
            .expect("sealed");
        write(&pool, "sealed", 13, 0, 64 * KIB);
        pool.snapshot("sealed@e1").expect("e1");
        write(&pool, "sealed", 14, 32 * KIB, 8 * KIB);
    }
    #[cfg(since_v12)]
    {
        // An encrypted receive in progress: a raw stream of sealed@e1 into
        // `inbound`, its first 128 KiB applied and committed (a slot of its
        // own holding the same key record), the rest never sent.
        let e1 = pool.lookup("sealed@e1").expect("e1");
        let slot = pool.info(e1).expect("info").key_slot.expect("encrypted");
        let record = pool.key_record(slot).expect("store").expect("record");
        let target = arbor_engine::ReceiveTarget {
            volume: "inbound".into(),
            target: [0x12; 16],
            base: None,
            size: 256 * KIB,
            key: Some(record),
        };
        let id = pool.begin_receive(&target).expect("begin").status.id;
        // As a raw stream carries it: the mapped chunks, as stored.
        for run in pool.allocation_map(e1, 0, 128 * KIB).expect("map") {
            if run.mapped {
                let mut data = vec![0u8; run.len as usize];
                pool.read_raw(e1, run.offset, &mut data).expect("raw read");
                pool.receive_write_raw(id, run.offset, &data).expect("raw write");
            }
        }
        pool.receive_checkpoint(id, 128 * KIB).expect("checkpoint");
    }
    #[cfg(since_v13)]
    {
        // The intent log: the in-place write into `summed` above listed its
        // region by a record in the log area, not by a commit. The record
        // stays there, naming a commit older than the image's last: read,
        // and ignored, by every open.
        assert!(
            pool.pool_stats().expect("stats").intent_log_records >= 1,
            "no intent log record was appended"
        );
    }
    #[cfg(since_v14)]
    {
        // A logged snapshot (FORMAT.md §6.4.2): `base@s3`, taken committed
        // over a write not yet flushed, made durable by a snapshot record
        // of the log, not by a commit. The flush below commits it; the
        // record stays in the area, naming an older commit than the
        // image's last: read, and ignored, by every open.
        pool.flush().expect("flush");
        write(&pool, "base", 15, 192 * KIB, 16 * KIB);
        pool.snapshot("base@s3").expect("s3");
        assert!(
            pool.pool_stats().expect("stats").logged_snapshots >= 1,
            "the snapshot was not logged"
        );
    }
    pool.flush().expect("flush");

    let report = pool.check().expect("check");
    assert!(report.is_clean(), "{:#?}", report.problems);

    let mut manifest = std::fs::File::create(manifest_path).expect("manifest");
    writeln!(manifest, "version {}", pool.format_version_for_manifest()).expect("manifest");
    let mut volumes = pool.list().expect("list");
    volumes.sort_by(|a, b| a.name.cmp(&b.name));
    for v in volumes {
        let mut buf = vec![0u8; v.size as usize];
        pool.read(v.id, 0, &mut buf).expect("read");
        writeln!(
            manifest,
            "volume {} {} {} {:08x}",
            v.name,
            v.size,
            v.snapshot,
            crc32c::crc32c(&buf)
        )
        .expect("manifest");
    }
    #[cfg(since_v11)]
    writeln!(
        manifest,
        "key sealed {}",
        IMAGE_KEY.iter().map(|b| format!("{b:02x}")).collect::<String>()
    )
    .expect("manifest");
    #[cfg(since_v12)]
    {
        let r = pool
            .receive_status("inbound")
            .expect("status")
            .expect("a receive in progress");
        let target: String = r.target.iter().map(|b| format!("{b:02x}")).collect();
        writeln!(manifest, "receive inbound {} {} {target}", r.size, r.offset)
            .expect("manifest");
    }
    #[cfg(since_v4)]
    {
        let base = pool.lookup("base").expect("base");
        for (owner, key) in [(None, "image.pool"), (Some(base), "image.volume")] {
            let value = pool.property(owner, key).expect("property").expect("set");
            writeln!(
                manifest,
                "property {} {key} {}",
                if owner.is_some() { "base" } else { "-" },
                String::from_utf8(value).expect("utf-8")
            )
            .expect("manifest");
        }
    }
    pool.close().expect("close");
}

/// Version 1 had no `Pool::format_version`; later ones return a number
/// or, from version 8's time on, a `FormatVersion`: both print as one.
trait FormatVersion {
    fn format_version_for_manifest(&self) -> String;
}

impl FormatVersion for Pool {
    #[cfg(since_v2)]
    fn format_version_for_manifest(&self) -> String {
        self.format_version().to_string()
    }
    #[cfg(not(since_v2))]
    fn format_version_for_manifest(&self) -> String {
        "1".to_string()
    }
}
