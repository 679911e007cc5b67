//! Feeds arbitrary bytes to every parser of a backup repository's objects
//! (docs/BACKUP.md), which come from a store arbor does not trust: the
//! config object, packs (whole, and their headers' contents), index
//! objects and their contents, manifests and their JSON, map pieces, lock
//! objects and their JSON, checkpoints and their JSON, and blobs sealed under a fixed key with entry
//! fields the input chooses (so mutations reach decompression and the id
//! check behind the seal). None
//! may panic or allocate beyond its limits; whatever decodes encodes back
//! to the same value.
//!
//! Input: byte 0 selects the parser; the rest is the object.
#![no_main]

use arbor_backup::crypto::{BlobId, Keys, Secret};
use arbor_backup::format::config::RepoConfig;
use arbor_backup::format::manifest::{self, Piece};
use arbor_backup::format::pack::{self, Encoding, Entry};
use arbor_backup::format::{checkpoint, index, lock, BlobKind};
use libfuzzer_sys::fuzz_target;

fn keys() -> Keys {
    Keys::derive(&Secret::from_bytes([0x5a; 32]), b"fuzz")
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let keys = keys();
    match which % 10 {
        0 => {
            if let Ok(config) = RepoConfig::decode(rest) {
                let again =
                    RepoConfig::decode(&config.encode()).expect("an encoded config decodes");
                assert_eq!(again, config);
            }
        }
        1 => {
            if let Ok(entries) = pack::decode_pack(&keys, rest) {
                for e in entries {
                    assert!(e.end() <= rest.len() as u64);
                }
            }
        }
        2 => {
            // A header's contents, for a pack of the length bytes 1..5 say
            // (as long as a real pack whose header seals them).
            if rest.len() < 4 {
                return;
            }
            let pack_len = u64::from(u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]));
            let sealed_len = rest.len() - 4 + arbor_backup::crypto::SEAL_OVERHEAD;
            if let Ok(entries) = pack::decode_header_plain(&rest[4..], sealed_len, pack_len) {
                for e in entries {
                    assert!(e.end() <= pack_len);
                }
            }
        }
        3 => {
            let _ = index::decode(&keys, rest);
            if let Ok(packs) = index::decode_plain(rest) {
                let again = index::decode(&keys, &index::encode(&keys, &packs)).expect("decodes");
                assert_eq!(again, packs);
            }
        }
        4 => {
            let _ = manifest::decode(&keys, rest);
            if let Ok(m) = manifest::decode_json(rest) {
                let again = manifest::decode(&keys, &manifest::encode(&keys, &m)).expect("decodes");
                assert_eq!(again, m);
                let _ = m.piece_ids();
            }
        }
        5 => {
            if let Ok(piece) = Piece::decode(rest) {
                assert_eq!(Piece::decode(&piece.encode()).expect("decodes"), piece);
            }
        }
        8 => {
            let _ = lock::decode(&keys, rest);
            if let Ok(record) = lock::decode_json(rest) {
                let again = lock::decode(&keys, &lock::encode(&keys, &record)).expect("decodes");
                assert_eq!(again, record);
            }
        }
        9 => {
            let _ = checkpoint::decode(&keys, rest);
            if let Ok(c) = checkpoint::decode_json(rest) {
                let again =
                    checkpoint::decode(&keys, &checkpoint::encode(&keys, &c)).expect("decodes");
                assert_eq!(again, c);
            }
        }
        _ => {
            // A blob: entry fields from bytes 1..6, the rest its payload,
            // sealed as a pack would hold it.
            if rest.len() < 6 {
                return;
            }
            let kind = if rest[0] & 1 == 0 {
                BlobKind::Data
            } else {
                BlobKind::Map
            };
            let encoding = if rest[1] & 1 == 0 {
                Encoding::Raw
            } else {
                Encoding::Zstd
            };
            let raw_len = u32::from_le_bytes([rest[2], rest[3], rest[4], rest[5]]) % (2 << 20);
            let payload = &rest[6..];
            let id = BlobId([rest[0]; 32]);
            let mut sealed = Vec::new();
            keys.seal(
                &pack::blob_aad(&id, kind, encoding, raw_len),
                payload,
                &mut sealed,
            );
            let entry = Entry {
                id,
                kind,
                encoding,
                offset: 8,
                stored_len: sealed.len() as u32,
                raw_len,
            };
            if let Ok(plain) = pack::open_blob(&keys, &entry, &sealed) {
                assert_eq!(plain.len() as u32, raw_len);
                assert_eq!(keys.blob_id(kind.code(), &plain), id);
            }
            // And the real thing: a blob of this payload round-trips.
            let real = keys.blob_id(BlobKind::Data.code(), payload);
            let s = pack::seal_blob(&keys, real, BlobKind::Data, payload);
            let e = Entry {
                id: real,
                kind: BlobKind::Data,
                encoding: s.encoding,
                offset: 8,
                stored_len: s.bytes.len() as u32,
                raw_len: s.raw_len,
            };
            assert_eq!(
                pack::open_blob(&keys, &e, &s.bytes).expect("opens"),
                payload
            );
        }
    }
});
