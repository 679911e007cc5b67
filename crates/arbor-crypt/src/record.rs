//! The key record: a volume's data key, wrapped by the user's key, and
//! what it takes to unwrap it (docs/FORMAT.md §6.6). 152 bytes,
//! little-endian:
//!
//! | offset | bytes | field |
//! |---|---|---|
//! | 0 | 1 | layout version (1) |
//! | 1 | 1 | cipher: 1 = AES-256-XTS |
//! | 2 | 1 | data unit: log2 of its bytes, 9 or 12 |
//! | 3 | 1 | key derivation: 1 = raw key, HKDF-SHA256; 2 = passphrase, Argon2id |
//! | 4 | 4 | Argon2id memory, KiB (0 for a raw key) |
//! | 8 | 4 | Argon2id passes (0 for a raw key) |
//! | 12 | 4 | Argon2id lanes (0 for a raw key) |
//! | 16 | 16 | key id |
//! | 32 | 16 | salt of the key derivation |
//! | 48 | 24 | XChaCha20-Poly1305 nonce |
//! | 72 | 80 | the data key (64 bytes) sealed, then the 16-byte tag |
//!
//! The wrapping key is HKDF-SHA256(salt, raw key, info "arbor key wrap
//! 1") or Argon2id(passphrase, salt, memory, passes, lanes), 32 bytes. The
//! seal's associated data is bytes 0..48, so a changed header (another
//! data unit, key id or cost) fails the tag like a wrong key. Decoding
//! checks every field before anything is derived: the Argon2id cost is
//! bounded ([`ARGON2_MEMORY_KIB`]), so a record from a stream or a damaged
//! pool cannot make an unwrap take unbounded memory or time.

use chacha20poly1305::aead::{AeadInPlace, KeyInit};
use chacha20poly1305::{Key, Tag, XChaCha20Poly1305, XNonce};
use zeroize::Zeroizing;

use crate::{CryptError, DataKey, DataUnit, KeyId, UserKey};

/// Bytes of an encoded key record.
pub const KEY_RECORD_LEN: usize = 152;

const LAYOUT: u8 = 1;
const CIPHER_AES_256_XTS: u8 = 1;
const KDF_RAW: u8 = 1;
const KDF_ARGON2ID: u8 = 2;
const HKDF_INFO: &[u8] = b"arbor key wrap 1";
/// The bytes the seal authenticates: everything before the nonce.
const HEADER_LEN: usize = 48;

/// Argon2id memory a record may ask for (KiB): 8 MiB to 1 GiB.
pub const ARGON2_MEMORY_KIB: std::ops::RangeInclusive<u32> = 8 * 1024..=1024 * 1024;
/// Argon2id passes a record may ask for.
pub const ARGON2_PASSES: std::ops::RangeInclusive<u32> = 1..=16;
/// Argon2id lanes a record may ask for.
pub const ARGON2_LANES: std::ops::RangeInclusive<u32> = 1..=16;

/// How the wrapping key comes from the user's key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kdf {
    /// A 32-byte raw key, through HKDF-SHA256.
    Raw,
    /// A passphrase, through Argon2id with this cost.
    Argon2id {
        memory_kib: u32,
        passes: u32,
        lanes: u32,
    },
}

impl Kdf {
    /// The cost new passphrase-wrapped keys get (a policy: 64 MiB, three
    /// passes, one lane; about a quarter of a second on this machine's
    /// cores).
    pub const PASSPHRASE_DEFAULT: Kdf = Kdf::Argon2id {
        memory_kib: 64 * 1024,
        passes: 3,
        lanes: 1,
    };

    /// The derivation for `user` at this cost for passphrases.
    fn for_user(user: &UserKey, passphrase_cost: Kdf) -> Kdf {
        match user {
            UserKey::Raw(_) => Kdf::Raw,
            UserKey::Passphrase(_) => passphrase_cost,
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Kdf::Raw => "a raw key (32 bytes or 64 hex digits)",
            Kdf::Argon2id { .. } => "a passphrase",
        }
    }
}

/// A volume's wrapped data key and how to unwrap it. Holds no secret: a
/// record may be stored, sent and shown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRecord {
    pub unit: DataUnit,
    pub kdf: Kdf,
    pub key_id: KeyId,
    salt: [u8; 16],
    nonce: [u8; 24],
    sealed: [u8; 80],
}

impl KeyRecord {
    /// A new data key for a volume, wrapped by `user`; passphrases at
    /// `passphrase_cost` (an `Argon2id` [`Kdf`]).
    pub fn create(
        user: &UserKey,
        unit: DataUnit,
        passphrase_cost: Kdf,
    ) -> Result<(KeyRecord, DataKey), CryptError> {
        let key = DataKey::generate();
        let record = Self::seal(&key, KeyId::random(), user, unit, passphrase_cost)?;
        Ok((record, key))
    }

    /// The data key, if `user` is the key this record was wrapped with.
    pub fn unwrap_key(&self, user: &UserKey) -> Result<DataKey, CryptError> {
        let kek = self.wrapping_key(user)?;
        let aead = XChaCha20Poly1305::new(Key::from_slice(&kek[..]));
        let mut key = Zeroizing::new([0u8; 64]);
        key.copy_from_slice(&self.sealed[..64]);
        let header = self.header();
        aead.decrypt_in_place_detached(
            XNonce::from_slice(&self.nonce),
            &header,
            &mut key[..],
            Tag::from_slice(&self.sealed[64..]),
        )
        .map_err(|_| CryptError::WrongKey)?;
        Ok(DataKey::from_bytes(*key))
    }

    /// The same data key (and key id) wrapped by `new` instead of `old`:
    /// the O(1) change of a user's key, or a clone given a key of its own.
    pub fn rewrap(
        &self,
        old: &UserKey,
        new: &UserKey,
        passphrase_cost: Kdf,
    ) -> Result<KeyRecord, CryptError> {
        let key = self.unwrap_key(old)?;
        Self::seal(&key, self.key_id, new, self.unit, passphrase_cost)
    }

    fn seal(
        key: &DataKey,
        key_id: KeyId,
        user: &UserKey,
        unit: DataUnit,
        passphrase_cost: Kdf,
    ) -> Result<KeyRecord, CryptError> {
        if passphrase_cost == Kdf::Raw {
            return Err(CryptError::Invalid(
                "a passphrase's cost must be an Argon2id cost".to_string(),
            ));
        }
        let mut record = KeyRecord {
            unit,
            kdf: Kdf::for_user(user, passphrase_cost),
            key_id,
            salt: [0u8; 16],
            nonce: [0u8; 24],
            sealed: [0u8; 80],
        };
        record.check_kdf()?;
        rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut record.salt);
        rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut record.nonce);
        let kek = record.wrapping_key(user)?;
        let aead = XChaCha20Poly1305::new(Key::from_slice(&kek[..]));
        let mut sealed = Zeroizing::new([0u8; 64]);
        sealed.copy_from_slice(key.bytes());
        let header = record.header();
        let tag = aead
            .encrypt_in_place_detached(XNonce::from_slice(&record.nonce), &header, &mut sealed[..])
            .map_err(|_| CryptError::Cipher("XChaCha20-Poly1305 failed to seal"))?;
        record.sealed[..64].copy_from_slice(&sealed[..]);
        record.sealed[64..].copy_from_slice(&tag);
        Ok(record)
    }

    fn wrapping_key(&self, user: &UserKey) -> Result<Zeroizing<[u8; 32]>, CryptError> {
        let mut kek = Zeroizing::new([0u8; 32]);
        match (self.kdf, user) {
            (Kdf::Raw, UserKey::Raw(raw)) => {
                hkdf::Hkdf::<sha2::Sha256>::new(Some(&self.salt), &raw[..])
                    .expand(HKDF_INFO, &mut kek[..])
                    .map_err(|_| CryptError::Cipher("HKDF expand"))?;
            }
            (
                Kdf::Argon2id {
                    memory_kib,
                    passes,
                    lanes,
                },
                UserKey::Passphrase(phrase),
            ) => {
                let params = argon2::Params::new(memory_kib, passes, lanes, Some(32))
                    .map_err(|e| CryptError::Invalid(format!("Argon2id cost: {e}")))?;
                argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params)
                    .hash_password_into(phrase, &self.salt, &mut kek[..])
                    .map_err(|e| CryptError::Invalid(format!("Argon2id: {e}")))?;
            }
            (kdf, _) => {
                return Err(CryptError::WrongKind {
                    wanted: kdf.describe(),
                })
            }
        }
        Ok(kek)
    }

    fn check_kdf(&self) -> Result<(), CryptError> {
        match self.kdf {
            Kdf::Raw => Ok(()),
            Kdf::Argon2id {
                memory_kib,
                passes,
                lanes,
            } => {
                let ok = ARGON2_MEMORY_KIB.contains(&memory_kib)
                    && ARGON2_PASSES.contains(&passes)
                    && ARGON2_LANES.contains(&lanes)
                    && memory_kib >= 8 * lanes;
                if ok {
                    Ok(())
                } else {
                    Err(CryptError::Invalid(format!(
                        "Argon2id cost {memory_kib} KiB, {passes} passes, {lanes} lanes: \
                         memory {}-{} KiB, passes {}-{}, lanes {}-{}",
                        ARGON2_MEMORY_KIB.start(),
                        ARGON2_MEMORY_KIB.end(),
                        ARGON2_PASSES.start(),
                        ARGON2_PASSES.end(),
                        ARGON2_LANES.start(),
                        ARGON2_LANES.end()
                    )))
                }
            }
        }
    }

    fn header(&self) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[0] = LAYOUT;
        h[1] = CIPHER_AES_256_XTS;
        h[2] = self.unit.shift();
        let (kdf, m, t, p) = match self.kdf {
            Kdf::Raw => (KDF_RAW, 0, 0, 0),
            Kdf::Argon2id {
                memory_kib,
                passes,
                lanes,
            } => (KDF_ARGON2ID, memory_kib, passes, lanes),
        };
        h[3] = kdf;
        h[4..8].copy_from_slice(&m.to_le_bytes());
        h[8..12].copy_from_slice(&t.to_le_bytes());
        h[12..16].copy_from_slice(&p.to_le_bytes());
        h[16..32].copy_from_slice(&self.key_id.0);
        h[32..48].copy_from_slice(&self.salt);
        h
    }

    pub fn encode(&self) -> [u8; KEY_RECORD_LEN] {
        let mut out = [0u8; KEY_RECORD_LEN];
        out[..HEADER_LEN].copy_from_slice(&self.header());
        out[48..72].copy_from_slice(&self.nonce);
        out[72..].copy_from_slice(&self.sealed);
        out
    }

    /// Parses a record, every field checked (untrusted bytes: a pool, a
    /// stream, a peer).
    pub fn decode(bytes: &[u8]) -> Result<KeyRecord, CryptError> {
        let invalid = |what: String| Err(CryptError::Invalid(format!("key record: {what}")));
        if bytes.len() != KEY_RECORD_LEN {
            return invalid(format!("{} bytes, not {KEY_RECORD_LEN}", bytes.len()));
        }
        if bytes[0] != LAYOUT {
            return invalid(format!("layout {} (this build reads {LAYOUT})", bytes[0]));
        }
        if bytes[1] != CIPHER_AES_256_XTS {
            return invalid(format!("cipher {}", bytes[1]));
        }
        let Some(unit) = DataUnit::from_shift(bytes[2]) else {
            return invalid(format!("data unit 2^{}", bytes[2]));
        };
        let word = |at: usize| {
            u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
        };
        let (m, t, p) = (word(4), word(8), word(12));
        let kdf = match bytes[3] {
            KDF_RAW if (m, t, p) == (0, 0, 0) => Kdf::Raw,
            KDF_RAW => return invalid("a raw key with an Argon2id cost".to_string()),
            KDF_ARGON2ID => Kdf::Argon2id {
                memory_kib: m,
                passes: t,
                lanes: p,
            },
            other => return invalid(format!("key derivation {other}")),
        };
        let mut record = KeyRecord {
            unit,
            kdf,
            key_id: KeyId([0u8; 16]),
            salt: [0u8; 16],
            nonce: [0u8; 24],
            sealed: [0u8; 80],
        };
        record.key_id.0.copy_from_slice(&bytes[16..32]);
        record.salt.copy_from_slice(&bytes[32..48]);
        record.nonce.copy_from_slice(&bytes[48..72]);
        record.sealed.copy_from_slice(&bytes[72..]);
        record
            .check_kdf()
            .map_err(|e| CryptError::Invalid(format!("key record: {e}")))?;
        Ok(record)
    }
}
