//! Feeds arbitrary bytes to the parsers of encryption at rest (docs/FORMAT.md
//! §6.6), which read what a pool, a stream or a peer holds: the key record,
//! the pool's key store, and key files. None may panic, and what decodes encodes back to the same
//! bytes; a record that decodes is then opened with a fixed raw key or
//! passphrase (failing with a wrong key, never panicking), where its
//! Argon2id cost is small enough for a fuzzer to pay (the decoder bounds it
//! at 1 GiB and 16 passes; the cost bound itself is tested in arbor-crypt).
//!
//! Input: byte 0 selects the parser (0 key record, 1 raw key file, 2
//! passphrase, 3 the pool's key store); the rest is the input.
#![no_main]

use arbor_crypt::{Kdf, KeyRecord, KeyStore, UserKey};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    match which % 4 {
        0 => {
            if let Ok(record) = KeyRecord::decode(rest) {
                assert_eq!(
                    &record.encode()[..],
                    rest,
                    "a record encodes back to its bytes"
                );
                let cheap = match record.kdf {
                    Kdf::Raw => true,
                    Kdf::Argon2id {
                        memory_kib, passes, ..
                    } => memory_kib <= 8 * 1024 && passes == 1,
                };
                if cheap {
                    for user in [
                        UserKey::raw_from_file(&[0x5a; 32]).expect("32 bytes are a raw key"),
                        UserKey::passphrase(b"fuzzing passphrase").expect("a passphrase"),
                    ] {
                        // Opens only with the key it was sealed with: a
                        // mutated record fails, and must fail cleanly.
                        let _ = record.unwrap_key(&user);
                    }
                }
            }
        }
        1 => {
            let _ = UserKey::raw_from_file(rest);
        }
        2 => {
            let _ = UserKey::passphrase(rest);
        }
        _ => {
            if let Ok(store) = KeyStore::decode(rest) {
                assert_eq!(store.encode(), rest, "a store encodes back to its bytes");
            }
        }
    }
});
