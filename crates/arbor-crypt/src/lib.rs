//! arbor's encryption at rest (docs/FORMAT.md §6.6, docs/SECURITY.md).
//!
//! * **The data cipher**: AES-256-XTS (IEEE 1619) of each *data unit* of a
//!   volume (4 KiB, or 512 bytes for clients that write in sectors), the
//!   tweak the unit's number in the volume (its byte offset divided by the
//!   unit size, 128 bits little-endian, as dm-crypt's `plain64`). So a
//!   unit encrypts the same wherever the pool keeps it: snapshots and
//!   clones share the volume's data key and its chunks, a chunk copied or
//!   moved stays readable, and a raw send carries ciphertext another pool
//!   stores anywhere. [`VolumeCipher`].
//! * **Keys**: each encrypted volume has a random data key ([`DataKey`], 64
//!   bytes, named by a random [`KeyId`]), stored only wrapped by the
//!   user's key in a [`KeyRecord`]: XChaCha20-Poly1305 under a key derived
//!   from a raw key (HKDF-SHA256) or a passphrase (Argon2id). A wrong key
//!   fails the AEAD's tag: [`CryptError::WrongKey`]. Changing the user's
//!   key rewraps the data key ([`KeyRecord::rewrap`]); the data is not
//!   touched.
//! * Keys are zeroed when dropped ([`zeroize`]) and never formatted
//!   (`Debug` prints only the key id).
//!
//! Sans-I/O: the caller reads key files and runs key commands; this crate
//! takes their bytes ([`UserKey`]).

mod record;
mod store;
mod xts;

use std::sync::Mutex;

use zeroize::{Zeroize, ZeroizeOnDrop, Zeroizing};

pub use record::{Kdf, KeyRecord, KEY_RECORD_LEN};
pub use store::{KeyStore, KEY_STORE_PROPERTY, MAX_SLOTS};

/// What went wrong, by area.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CryptError {
    /// The user's key does not open this record (the AEAD's tag failed).
    #[error("wrong key: it does not open this volume's key record")]
    WrongKey,
    /// A passphrase where the record wants a raw key, or the reverse.
    #[error("wrong kind of key: this volume's key is {wanted}")]
    WrongKind { wanted: &'static str },
    /// A key record, key file or argument that is not what it must be.
    #[error("{0}")]
    Invalid(String),
    /// The cipher library failed (out of memory, or refused a key).
    #[error("cipher: {0}")]
    Cipher(&'static str),
}

/// A data unit: how many bytes one XTS tweak covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataUnit {
    /// 512 bytes: for clients that write single sectors.
    B512,
    /// 4 KiB: the default (one tweak per 4 KiB block; a client must write
    /// whole, aligned 4 KiB blocks).
    B4096,
}

impl DataUnit {
    pub fn bytes(self) -> usize {
        match self {
            DataUnit::B512 => 512,
            DataUnit::B4096 => 4096,
        }
    }

    /// log2 of [`Self::bytes`], as the key record stores it.
    pub fn shift(self) -> u8 {
        match self {
            DataUnit::B512 => 9,
            DataUnit::B4096 => 12,
        }
    }

    pub fn from_shift(shift: u8) -> Option<Self> {
        match shift {
            9 => Some(DataUnit::B512),
            12 => Some(DataUnit::B4096),
            _ => None,
        }
    }

    pub fn from_bytes(bytes: u64) -> Option<Self> {
        match bytes {
            512 => Some(DataUnit::B512),
            4096 => Some(DataUnit::B4096),
            _ => None,
        }
    }
}

/// Names a data key: random, stored beside its wrapped key, the same for
/// every volume that shares the key (a volume's snapshots and clones, and
/// their raw copies on other hosts).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyId(pub [u8; 16]);

impl KeyId {
    pub fn random() -> Self {
        let mut id = [0u8; 16];
        rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut id);
        Self(id)
    }
}

impl std::fmt::Display for KeyId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl std::fmt::Debug for KeyId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KeyId({self})")
    }
}

/// A volume's data key: the two AES-256 keys of XTS. Zeroed when dropped;
/// never printed.
#[derive(Zeroize, ZeroizeOnDrop)]
pub struct DataKey([u8; xts::XTS_KEY_LEN]);

impl DataKey {
    /// A new random key (its two halves differ, as XTS requires).
    pub fn generate() -> Self {
        let mut key = Self([0u8; xts::XTS_KEY_LEN]);
        while key.0[..32] == key.0[32..] {
            rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut key.0);
        }
        key
    }

    pub(crate) fn from_bytes(bytes: [u8; xts::XTS_KEY_LEN]) -> Self {
        Self(bytes)
    }

    pub(crate) fn bytes(&self) -> &[u8; xts::XTS_KEY_LEN] {
        &self.0
    }
}

impl std::fmt::Debug for DataKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DataKey(..)")
    }
}

/// The user's key, as read from a key file, a prompt or a key command.
/// Zeroed when dropped; never printed.
pub enum UserKey {
    /// 32 bytes: derived into the wrapping key with HKDF-SHA256.
    Raw(Zeroizing<[u8; 32]>),
    /// 8 to 512 bytes: derived into the wrapping key with Argon2id.
    Passphrase(Zeroizing<Vec<u8>>),
}

impl std::fmt::Debug for UserKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UserKey::Raw(_) => f.write_str("UserKey::Raw(..)"),
            UserKey::Passphrase(_) => f.write_str("UserKey::Passphrase(..)"),
        }
    }
}

/// Shortest and longest passphrase taken (bytes).
pub const PASSPHRASE_LEN: std::ops::RangeInclusive<usize> = 8..=512;

impl UserKey {
    /// A raw key from a key file's bytes: exactly 32 bytes, or 64 hex
    /// digits (a trailing newline allowed).
    pub fn raw_from_file(bytes: &[u8]) -> Result<Self, CryptError> {
        let mut key = Zeroizing::new([0u8; 32]);
        if bytes.len() == 32 {
            key.copy_from_slice(bytes);
            return Ok(UserKey::Raw(key));
        }
        let text = bytes.strip_suffix(b"\n").unwrap_or(bytes);
        let text = text.strip_suffix(b"\r").unwrap_or(text);
        if text.len() == 64 && hex::decode_to_slice(text, &mut key[..]).is_ok() {
            return Ok(UserKey::Raw(key));
        }
        Err(CryptError::Invalid(format!(
            "a raw key is 32 bytes or 64 hex digits; this one is {} bytes",
            bytes.len()
        )))
    }

    /// A passphrase (its trailing newline dropped).
    pub fn passphrase(bytes: &[u8]) -> Result<Self, CryptError> {
        let text = bytes.strip_suffix(b"\n").unwrap_or(bytes);
        let text = text.strip_suffix(b"\r").unwrap_or(text);
        if !PASSPHRASE_LEN.contains(&text.len()) {
            return Err(CryptError::Invalid(format!(
                "a passphrase is {} to {} bytes; this one is {}",
                PASSPHRASE_LEN.start(),
                PASSPHRASE_LEN.end(),
                text.len()
            )));
        }
        Ok(UserKey::Passphrase(Zeroizing::new(text.to_vec())))
    }

    /// A new random raw key (for `arbor key new`-style tools and tests).
    pub fn generate_raw() -> Self {
        let mut key = Zeroizing::new([0u8; 32]);
        rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut key[..]);
        UserKey::Raw(key)
    }
}

/// Contexts kept per direction for reuse (a policy: more than the threads
/// that encrypt at once is waste).
const KEPT_CONTEXTS: usize = 16;

/// Encrypts and decrypts a volume's data units with its data key. Shared
/// by every thread serving the volume (and its snapshots and clones).
pub struct VolumeCipher {
    key_id: KeyId,
    unit: DataUnit,
    key: DataKey,
    encrypters: Mutex<Vec<xts::Ctx>>,
    decrypters: Mutex<Vec<xts::Ctx>>,
}

impl std::fmt::Debug for VolumeCipher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VolumeCipher")
            .field("key_id", &self.key_id)
            .field("unit", &self.unit)
            .finish_non_exhaustive()
    }
}

impl VolumeCipher {
    pub fn new(key: DataKey, key_id: KeyId, unit: DataUnit) -> Result<Self, CryptError> {
        // Made once, so a key the library refuses fails here, not on I/O.
        let encrypter = xts::Ctx::new(key.bytes(), true)?;
        let decrypter = xts::Ctx::new(key.bytes(), false)?;
        Ok(Self {
            key_id,
            unit,
            key,
            encrypters: Mutex::new(vec![encrypter]),
            decrypters: Mutex::new(vec![decrypter]),
        })
    }

    pub fn key_id(&self) -> KeyId {
        self.key_id
    }

    pub fn unit(&self) -> DataUnit {
        self.unit
    }

    /// Encrypts `data`, the volume's bytes at `offset`, in place. Both are
    /// multiples of the data unit.
    pub fn encrypt(&self, offset: u64, data: &mut [u8]) -> Result<(), CryptError> {
        self.run(true, offset, data)
    }

    /// Decrypts `data`, read from the volume's bytes at `offset`, in place.
    pub fn decrypt(&self, offset: u64, data: &mut [u8]) -> Result<(), CryptError> {
        self.run(false, offset, data)
    }

    fn run(&self, encrypt: bool, offset: u64, data: &mut [u8]) -> Result<(), CryptError> {
        let unit = self.unit.bytes();
        if !offset.is_multiple_of(unit as u64) || !data.len().is_multiple_of(unit) {
            return Err(CryptError::Invalid(format!(
                "{} bytes at {offset}: encrypted volumes take whole, aligned units of {unit} bytes",
                data.len()
            )));
        }
        if data.is_empty() {
            return Ok(());
        }
        let pool = if encrypt {
            &self.encrypters
        } else {
            &self.decrypters
        };
        let taken = lock(pool).pop();
        let mut ctx = match taken {
            Some(ctx) => ctx,
            None => xts::Ctx::new(self.key.bytes(), encrypt)?,
        };
        let first = offset >> self.unit.shift();
        let mut result = Ok(());
        for (n, chunk) in (first..).zip(data.chunks_exact_mut(unit)) {
            result = ctx.unit(&tweak(n), chunk);
            if result.is_err() {
                break;
            }
        }
        let mut kept = lock(pool);
        if kept.len() < KEPT_CONTEXTS {
            kept.push(ctx);
        }
        result
    }
}

/// The XTS tweak of data unit `n`: `n` as 128 bits, little-endian.
fn tweak(n: u64) -> [u8; 16] {
    let mut t = [0u8; 16];
    t[..8].copy_from_slice(&n.to_le_bytes());
    t
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // The pools hold only idle contexts; a panic elsewhere cannot leave one
    // half-changed, so a poisoned lock is usable.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests;
