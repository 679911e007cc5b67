//! The frozen images and what the code of their version read back from
//! them (`vN.manifest`, README.md here): one reader, shared by the
//! engine's test (`tests/images.rs`) and the binary's
//! (`crates/arbor/tests/images.rs`), which include this file by path.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use arbor_format::FormatVersion;

/// This directory.
pub fn image_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("arbor-engine")
        .join("tests")
        .join("images")
}

/// The raw bytes of version `version`'s pool image.
pub fn image_bytes(version: FormatVersion) -> Vec<u8> {
    let path = image_dir().join(format!("v{version}.pool.zst"));
    let compressed = std::fs::read(&path).expect("the image is readable");
    zstd::decode_all(&compressed[..]).expect("the image decompresses")
}

/// What the code of a version read back from its image.
#[derive(Debug, Default)]
pub struct Manifest {
    pub version: u16,
    /// name → (size, snapshot, crc32c of the content)
    pub volumes: BTreeMap<String, (u64, bool, u32)>,
    /// (owner volume, or "-" for the pool, key) → value
    pub properties: BTreeMap<(String, String), String>,
    /// An encrypted volume → the raw user key (64 hex digits) that opens
    /// its key record (version 11 on).
    pub keys: BTreeMap<String, String>,
    /// A receive in progress into a volume → (size, bytes committed, the
    /// target identity in hex) (version 12 on: an encrypted one, of a raw
    /// stream of `sealed@e1`).
    pub receives: BTreeMap<String, (u64, u64, String)>,
}

pub fn manifest(version: FormatVersion) -> Manifest {
    let path = image_dir().join(format!("v{version}.manifest"));
    let text = std::fs::read_to_string(&path).expect("the manifest is readable");
    let mut m = Manifest::default();
    for line in text.lines() {
        let (kind, rest) = line.split_once(' ').expect("a line of words");
        let words: Vec<&str> = rest.split(' ').collect();
        match (kind, &words[..]) {
            ("version", [v]) => m.version = v.parse().unwrap(),
            ("volume", [name, size, snapshot, crc]) => {
                let fields = (
                    size.parse().unwrap(),
                    snapshot.parse().unwrap(),
                    u32::from_str_radix(crc, 16).unwrap(),
                );
                m.volumes.insert(name.to_string(), fields);
            }
            ("receive", [volume, size, offset, target]) => {
                let fields = (
                    size.parse().unwrap(),
                    offset.parse().unwrap(),
                    target.to_string(),
                );
                m.receives.insert(volume.to_string(), fields);
            }
            ("key", [volume, hex]) => {
                m.keys.insert(volume.to_string(), hex.to_string());
            }
            ("property", [owner, key, ..]) => {
                // The value is the rest of the line, spaces and all.
                let value = rest.splitn(3, ' ').nth(2).unwrap();
                m.properties
                    .insert((owner.to_string(), key.to_string()), value.to_owned());
            }
            _ => panic!("{}: unknown line {line:?}", path.display()),
        }
    }
    m
}

/// Pattern `seed` at volume offsets `offset..offset + len`, as the images'
/// README defines it (the generator's `pattern`).
pub fn pattern(seed: u8, offset: u64, len: usize) -> Vec<u8> {
    let byte = |o: u64| ((o / 4096) as u8).wrapping_mul(31) ^ o as u8 ^ seed.wrapping_mul(101);
    (offset..offset + len as u64).map(byte).collect()
}
