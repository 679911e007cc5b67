//! Known answers for the cipher and the key wrapping, round trips, and
//! refusals.

use proptest::prelude::*;
use sha2::Digest;

use super::*;
use crate::record::{ARGON2_MEMORY_KIB, KEY_RECORD_LEN};

/// IEEE 1619-2007 vector 10 (as in aws-lc's and OpenSSL's tests).
const V10_KEY: &str = "27182818284590452353602874713526624977572470936999595749669676273141592653589793238462643383279502884197169399375105820974944592";
const V10_CT: &str = "1c3b3a102f770386e4836c99e370cf9bea00803f5e482357a4ae12d414a3e63b5d31e276f8fe4a8d66b317f9ac683f44680a86ac35adfc3345befecb4bb188fd5776926c49a3095eb108fd1098baec70aaa66999a72a82f27d848b21d4a741b0c5cd4d5fff9dac89aeba122961d03a757123e9870f8acf1000020887891429ca2a3e7a7d7df7b10355165c8b9a6d0a7de8b062c4500dc4cd120c0f7418dae3d0b5781c34803fa75421c790dfe1de1834f280d7667b327f6c8cd7557e12ac3a0f93ec05c52e0493ef31a12d3d9260f79a289d6a379bc70c50841473d1a8cc81ec583e9645e07b8d9670655ba5bbcfecc6dc3966380ad8fecb17b6ba02469a020a84e18e8f84252070c13e9f1f289be54fbc481457778f616015e1327a02b140f1505eb309326d68378f8374595c849d84f4c333ec4423885143cb47bd71c5edae9be69a2ffeceb1bec9de244fbe15992b11b77c040f12bd8f6a975a44a0f90c29a9abc3d4d893927284c58754cce294529f8614dcd2aba991925fedc4ae74ffac6e333b93eb4aff0479da9a410e4450e0dd7ae4c6e2910900575da401fc07059f645e8b7e9bfdef33943054ff84011493c27b3429eaedb4ed5376441a77ed43851ad77f16f541dfd269d50d6a5f14fb0aab1cbb4c1550be97f7ab4066193c4caa773dad38014bd2092fa755c824bb5e54c4f36ffda9fcea70b9c6e693e148c151";

fn unhex<const N: usize>(s: &str) -> [u8; N] {
    let mut out = [0u8; N];
    hex::decode_to_slice(s, &mut out).unwrap();
    out
}

fn cipher(key: [u8; 64], unit: DataUnit) -> VolumeCipher {
    VolumeCipher::new(DataKey::from_bytes(key), KeyId([7; 16]), unit).unwrap()
}

/// IEEE 1619 vector 10: data unit 0xff of 512 bytes, plaintext 0..=255
/// twice. Through the binding, then through a volume at byte offset
/// 0xff * 512 (the tweak is the unit's number, little-endian).
#[test]
fn xts_matches_ieee_1619_vector_10() {
    let key: [u8; 64] = unhex(V10_KEY);
    let ct: [u8; 512] = unhex(V10_CT);
    let pt: Vec<u8> = (0..512).map(|i| i as u8).collect();
    let mut unit = pt.clone();
    let mut tweak = [0u8; 16];
    tweak[0] = 0xff;
    xts::Ctx::new(&key, true)
        .unwrap()
        .unit(&tweak, &mut unit)
        .unwrap();
    assert_eq!(unit[..], ct[..]);
    let volume = cipher(key, DataUnit::B512);
    let mut data = pt.clone();
    volume.encrypt(0xff * 512, &mut data).unwrap();
    assert_eq!(data[..], ct[..]);
    volume.decrypt(0xff * 512, &mut data).unwrap();
    assert_eq!(data, pt);
}

/// 4 KiB units (numbers 5 and 6) and 512-byte units (80..96) over the same
/// 8 KiB, against Python's `cryptography` (OpenSSL's XTS): the SHA-256 of
/// the ciphertext and its first bytes.
#[test]
fn xts_matches_openssl_for_both_units() {
    let key: [u8; 64] = std::array::from_fn(|i| i as u8);
    let unit: Vec<u8> = (0..4096u32).map(|i| ((i * 7 + 3) % 256) as u8).collect();
    let pt = [unit.clone(), unit].concat();
    let mut data = pt.clone();
    cipher(key, DataUnit::B4096)
        .encrypt(5 * 4096, &mut data)
        .unwrap();
    assert_eq!(hex::encode(&data[..16]), "f89e38302834fc8d2523b7497fed0181");
    assert_eq!(
        hex::encode(&data[4096..4112]),
        "656463752ec1d1444fae14ee33a7c293"
    );
    assert_eq!(
        hex::encode(sha2::Sha256::digest(&data)),
        "1b08b2bb58242aeb8fba97368fa238a8c73d87440a075cdc9675dcd844a33c96"
    );
    let mut data = pt.clone();
    cipher(key, DataUnit::B512)
        .encrypt(80 * 512, &mut data)
        .unwrap();
    assert_eq!(
        hex::encode(sha2::Sha256::digest(&data)),
        "d5c337c506afc12315a7dbd6346788c8d25c8401413cfb59a328e4388d0c2d61"
    );
}

/// The key wrapping, composed independently (Python: `cryptography`'s
/// HKDF-SHA256 and ChaCha20-Poly1305, and an HChaCha20 checked against
/// draft-irtf-cfrg-xchacha §2.2.1): a raw key, fixed salt, nonce, key id
/// and data key give this sealed key, and it unwraps.
#[test]
fn key_wrapping_matches_an_independent_composition() {
    let raw: [u8; 32] = std::array::from_fn(|i| (i * 3 + 1) as u8);
    let mut bytes = [0u8; KEY_RECORD_LEN];
    bytes[..4].copy_from_slice(&[1, 1, 12, 1]);
    bytes[16..32].copy_from_slice(&std::array::from_fn::<u8, 16, _>(|i| i as u8));
    bytes[32..48].copy_from_slice(&std::array::from_fn::<u8, 16, _>(|i| 100 + i as u8));
    bytes[48..72].copy_from_slice(&std::array::from_fn::<u8, 24, _>(|i| 200 + i as u8));
    let sealed: [u8; 80] = unhex(
        "1fcb2ac3c655e75cf3a8bbf0075db67b1aa201ec5de40e0c112e6dc14b5feba8d1b793a9f679df6c607cfd6e0ebf7b66\
         cce37151ae49f64b9e1282d63242387a1bcf480aaf928116dc54364a0d4574a6",
    );
    bytes[72..].copy_from_slice(&sealed);
    let record = KeyRecord::decode(&bytes).unwrap();
    assert_eq!(record.encode(), bytes);
    let key = record
        .unwrap_key(&UserKey::Raw(zeroize::Zeroizing::new(raw)))
        .unwrap();
    let want: [u8; 64] = std::array::from_fn(|i| ((i * 11 + 5) % 256) as u8);
    assert_eq!(key.bytes(), &want);
}

fn cheap() -> Kdf {
    Kdf::Argon2id {
        memory_kib: *ARGON2_MEMORY_KIB.start(),
        passes: 1,
        lanes: 1,
    }
}

#[test]
fn a_wrapped_key_opens_with_its_key_only() {
    for user in [
        UserKey::generate_raw(),
        UserKey::passphrase(b"correct horse battery\n").unwrap(),
    ] {
        let (record, key) = KeyRecord::create(&user, DataUnit::B4096, cheap()).unwrap();
        let record = KeyRecord::decode(&record.encode()).unwrap();
        assert_eq!(record.unwrap_key(&user).unwrap().bytes(), key.bytes());
        let other = match &user {
            UserKey::Raw(_) => UserKey::generate_raw(),
            UserKey::Passphrase(_) => UserKey::passphrase(b"correct horse battery!").unwrap(),
        };
        assert_eq!(record.unwrap_key(&other).unwrap_err(), CryptError::WrongKey);
        let wrong_kind = match &user {
            UserKey::Raw(_) => UserKey::passphrase(b"a passphrase").unwrap(),
            UserKey::Passphrase(_) => UserKey::generate_raw(),
        };
        assert!(matches!(
            record.unwrap_key(&wrong_kind),
            Err(CryptError::WrongKind { .. })
        ));
        // A changed header (here: the data unit) fails like a wrong key.
        let mut bytes = record.encode();
        bytes[2] = 9;
        let changed = KeyRecord::decode(&bytes).unwrap();
        assert_eq!(changed.unwrap_key(&user).unwrap_err(), CryptError::WrongKey);
        // So does a flipped bit of the sealed key.
        let mut bytes = record.encode();
        bytes[100] ^= 1;
        let flipped = KeyRecord::decode(&bytes).unwrap();
        assert_eq!(flipped.unwrap_key(&user).unwrap_err(), CryptError::WrongKey);
    }
}

/// Rewrapping keeps the data key and its id: what the old key encrypted
/// decrypts with the key the new record gives; the old key no longer
/// opens the new record.
#[test]
fn rewrapping_changes_the_users_key_not_the_data_key() {
    let old = UserKey::generate_raw();
    let new = UserKey::passphrase(b"a new passphrase").unwrap();
    let (record, key) = KeyRecord::create(&old, DataUnit::B512, cheap()).unwrap();
    let id = record.key_id;
    let mut data = vec![0x42u8; 8192];
    VolumeCipher::new(key, id, DataUnit::B512)
        .unwrap()
        .encrypt(1 << 20, &mut data)
        .unwrap();
    let rewrapped = record.rewrap(&old, &new, cheap()).unwrap();
    assert_eq!((rewrapped.key_id, rewrapped.unit), (id, DataUnit::B512));
    assert!(matches!(rewrapped.kdf, Kdf::Argon2id { .. }));
    assert!(matches!(
        rewrapped.unwrap_key(&old),
        Err(CryptError::WrongKind { .. })
    ));
    let key = rewrapped.unwrap_key(&new).unwrap();
    VolumeCipher::new(key, id, DataUnit::B512)
        .unwrap()
        .decrypt(1 << 20, &mut data)
        .unwrap();
    assert_eq!(data, vec![0x42u8; 8192]);
    // The old record wants the raw key, not the passphrase.
    assert!(matches!(
        record.rewrap(&new, &old, cheap()),
        Err(CryptError::WrongKind { .. })
    ));
}

#[test]
fn key_files_and_passphrases_are_checked() {
    assert!(UserKey::raw_from_file(&[1u8; 32]).is_ok());
    let hexkey = format!("{}\n", "ab".repeat(32));
    assert!(UserKey::raw_from_file(hexkey.as_bytes()).is_ok());
    for bad in [
        &b""[..],
        &[1u8; 31],
        &[1u8; 33],
        "zz".repeat(32).as_bytes(),
        "ab".repeat(33).as_bytes(),
    ] {
        assert!(matches!(
            UserKey::raw_from_file(bad),
            Err(CryptError::Invalid(_))
        ));
    }
    assert!(UserKey::passphrase(b"1234567\n").is_err());
    assert!(UserKey::passphrase(b"12345678\n").is_ok());
    assert!(UserKey::passphrase(&[b'x'; 513]).is_err());
    // Never printed.
    assert_eq!(format!("{:?}", UserKey::generate_raw()), "UserKey::Raw(..)");
    assert_eq!(format!("{:?}", DataKey::generate()), "DataKey(..)");
}

#[test]
fn records_out_of_bounds_are_refused() {
    let (record, _) =
        KeyRecord::create(&UserKey::generate_raw(), DataUnit::B4096, cheap()).unwrap();
    let good = record.encode();
    let refused = |f: &dyn Fn(&mut [u8; KEY_RECORD_LEN])| {
        let mut bytes = good;
        f(&mut bytes);
        assert!(matches!(
            KeyRecord::decode(&bytes),
            Err(CryptError::Invalid(_))
        ));
    };
    refused(&|b| b[0] = 2);
    refused(&|b| b[1] = 2);
    refused(&|b| b[2] = 10);
    refused(&|b| b[3] = 3);
    refused(&|b| b[4] = 1); // a raw key with a cost
    refused(&|b| {
        b[3] = 2;
        b[4..8].copy_from_slice(&u32::MAX.to_le_bytes()); // 4 TiB of Argon2id memory
        b[8] = 1;
        b[12] = 1;
    });
    refused(&|b| {
        b[3] = 2;
        b[4..8].copy_from_slice(&(64 * 1024u32).to_le_bytes());
        b[8..12].copy_from_slice(&1000u32.to_le_bytes()); // passes
        b[12] = 1;
    });
    assert!(KeyRecord::decode(&good[..KEY_RECORD_LEN - 1]).is_err());
    assert!(KeyRecord::decode(&[good.as_slice(), &[0]].concat()).is_err());
}

#[test]
fn misaligned_io_is_refused_and_nothing_changes() {
    let volume = cipher(std::array::from_fn(|i| i as u8), DataUnit::B4096);
    let mut data = vec![9u8; 8192];
    for (offset, len) in [(512u64, 4096usize), (0, 4095), (0, 512), (4096, 6144)] {
        let err = volume.encrypt(offset, &mut data[..len]).unwrap_err();
        assert!(matches!(err, CryptError::Invalid(_)), "{offset}+{len}");
        assert!(data.iter().all(|&b| b == 9));
    }
    volume.encrypt(0, &mut []).unwrap();
}

#[test]
fn the_key_store_round_trips_and_refuses_what_is_not_it() {
    let mut store = KeyStore::default();
    let mut records = Vec::new();
    for unit in [DataUnit::B4096, DataUnit::B512, DataUnit::B4096] {
        let (record, _) = KeyRecord::create(&UserKey::generate_raw(), unit, cheap()).unwrap();
        records.push(record.clone());
        assert_eq!(store.add(record).unwrap(), records.len() as u64);
    }
    store.retain(|slot| slot != 2);
    let bytes = store.encode();
    let back = KeyStore::decode(&bytes).unwrap();
    assert_eq!(back, store);
    assert_eq!(back.slots().map(|(s, _)| s).collect::<Vec<_>>(), vec![1, 3]);
    assert_eq!(back.get(3), Some(&records[2]));
    let mut again = back.clone();
    assert_eq!(again.add(records[1].clone()).unwrap(), 4);
    // A replaced record must hold the same data key.
    assert!(again.replace(4, records[0].clone()).is_err());
    assert!(again.replace(9, records[0].clone()).is_err());
    assert!(KeyStore::decode(&[]).is_err());
    assert!(KeyStore::decode(&bytes[..bytes.len() - 1]).is_err());
    let mut swapped = bytes.clone();
    swapped[8] = 3; // slot 3 before slot 3
    assert!(KeyStore::decode(&swapped).is_err());
    let mut counted = bytes.clone();
    counted[4] = 200;
    assert!(KeyStore::decode(&counted).is_err());
    assert_eq!(
        KeyStore::decode(&KeyStore::default().encode()).unwrap(),
        KeyStore::default()
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Any aligned run encrypts unit by unit: the same bytes at the same
    /// offset give the same ciphertext whether encrypted in one call or
    /// unit by unit (so a snapshot, a clone or a raw copy reads it), a
    /// unit's ciphertext depends on its offset, and decryption gives the
    /// plaintext back.
    #[test]
    fn runs_round_trip_unit_by_unit(
        unit in prop_oneof![Just(DataUnit::B512), Just(DataUnit::B4096)],
        first in 0u64..1_000_000,
        units in 1usize..9,
        seed in any::<u8>(),
    ) {
        let volume = cipher(std::array::from_fn(|i| (i as u8).wrapping_mul(13)), unit);
        let n = unit.bytes();
        let pt: Vec<u8> = (0..units * n).map(|i| (i as u8).wrapping_add(seed)).collect();
        let offset = first * n as u64;
        let mut whole = pt.clone();
        volume.encrypt(offset, &mut whole).unwrap();
        prop_assert_ne!(&whole, &pt);
        let mut pieces = pt.clone();
        for (i, piece) in pieces.chunks_mut(n).enumerate() {
            volume.encrypt(offset + (i * n) as u64, piece).unwrap();
        }
        prop_assert_eq!(&pieces, &whole);
        let mut elsewhere = pt.clone();
        volume.encrypt(offset + n as u64, &mut elsewhere).unwrap();
        prop_assert_ne!(&elsewhere[..n], &whole[..n]);
        volume.decrypt(offset, &mut whole).unwrap();
        prop_assert_eq!(whole, pt);
    }

    /// Decoding any bytes never panics; what decodes encodes back the same.
    #[test]
    fn any_bytes_decode_or_are_refused(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        if let Ok(record) = KeyRecord::decode(&bytes) {
            prop_assert_eq!(&record.encode()[..], &bytes[..]);
        }
        if let Ok(store) = KeyStore::decode(&bytes) {
            prop_assert_eq!(store.encode(), bytes);
        }
    }
}
