//! The repository's objects as bytes (docs/BACKUP.md): encoders and
//! decoders, no I/O. Every decoder takes untrusted bytes from the store and
//! returns a [`FormatError`], never panics, and allocates only what the
//! limits below allow.

pub mod checkpoint;
pub mod config;
pub mod index;
pub mod lock;
pub mod manifest;
pub mod pack;

use sha2::{Digest, Sha256};

use crate::crypto::{BlobId, CryptoError};

/// The repository format's version (docs/BACKUP.md).
pub const REPO_VERSION: u32 = 1;

/// Block sizes a repository may have: a power of two from 4 KiB to 1 MiB.
pub const MIN_BLOCK_SIZE: u32 = 4096;
pub const MAX_BLOCK_SIZE: u32 = 1 << 20;
/// A new repository's block size.
pub const DEFAULT_BLOCK_SIZE: u32 = 64 << 10;
/// The largest volume a backup describes (as a pool's, 2^60 bytes).
pub const MAX_VOLUME_SIZE: u64 = 1 << 60;

/// What a blob holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BlobKind {
    /// One block of a volume.
    Data,
    /// A piece of a backup's block map ([`manifest::Piece`]).
    Map,
}

impl BlobKind {
    pub fn code(self) -> u8 {
        match self {
            BlobKind::Data => 0,
            BlobKind::Map => 1,
        }
    }

    pub fn from_code(code: u8) -> Option<Self> {
        match code {
            0 => Some(BlobKind::Data),
            1 => Some(BlobKind::Map),
            _ => None,
        }
    }
}

/// The name of a pack, index or snapshot object: SHA-256 of its bytes, so
/// a store that returns other bytes for a name is caught without a key.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectId(pub [u8; 32]);

impl ObjectId {
    pub fn of(bytes: &[u8]) -> Self {
        ObjectId(Sha256::digest(bytes).into())
    }

    /// Parses 64 lowercase hex digits.
    pub fn parse(hex_name: &str) -> Option<Self> {
        if hex_name.len() != 64 || hex_name.bytes().any(|b| b.is_ascii_uppercase()) {
            return None;
        }
        let bytes: [u8; 32] = hex::decode(hex_name).ok()?.try_into().ok()?;
        Some(ObjectId(bytes))
    }
}

impl std::fmt::Debug for ObjectId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", hex::encode(&self.0[..8]))
    }
}

impl std::fmt::Display for ObjectId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

/// Parses a blob id written as 64 lowercase hex digits.
pub fn parse_blob_id(hex_name: &str) -> Option<BlobId> {
    ObjectId::parse(hex_name).map(|o| BlobId(o.0))
}

/// Why an object from the store was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    #[error("{what}: {reason}")]
    Invalid { what: &'static str, reason: String },
    #[error(transparent)]
    Crypto(#[from] CryptoError),
    #[error(
        "{what} is of repository format version {found}; this arbor reads version {REPO_VERSION}"
    )]
    UnsupportedVersion { what: &'static str, found: u32 },
}

pub(crate) fn invalid(what: &'static str, reason: impl Into<String>) -> FormatError {
    FormatError::Invalid {
        what,
        reason: reason.into(),
    }
}

/// The frame of an object that is sealed JSON (a manifest, a lock, a
/// checkpoint): `MAGIC | sealed JSON`, the seal bound to `aad`, at most
/// `max_bytes` as stored. The one place that frames and opens them.
pub(crate) struct SealedJson {
    /// What to call one in an error ("a backup").
    pub what: &'static str,
    pub magic: &'static [u8; 8],
    pub aad: &'static [u8],
    pub max_bytes: u64,
}

impl SealedJson {
    pub fn seal<T: serde::Serialize>(&self, keys: &crate::crypto::Keys, value: &T) -> Vec<u8> {
        // Plain data with string keys: serializing cannot fail.
        #[allow(clippy::expect_used)]
        let json = serde_json::to_vec(value).expect("plain data serializes");
        let mut out = self.magic.to_vec();
        keys.seal(self.aad, &json, &mut out);
        out
    }

    /// The JSON an object seals, authenticated.
    pub fn open(&self, keys: &crate::crypto::Keys, bytes: &[u8]) -> Result<Vec<u8>, FormatError> {
        if bytes.len() as u64 > self.max_bytes {
            return Err(invalid(self.what, format!("{} bytes", bytes.len())));
        }
        let sealed = bytes.strip_prefix(self.magic.as_slice()).ok_or_else(|| {
            invalid(
                self.what,
                format!(
                    "not {} (no {} at its start)",
                    self.what,
                    String::from_utf8_lossy(self.magic)
                ),
            )
        })?;
        Ok(keys.open(self.what, self.aad, sealed)?)
    }

    /// Opened JSON as a value (the caller validates it).
    pub fn parse<T: serde::de::DeserializeOwned>(&self, json: &[u8]) -> Result<T, FormatError> {
        serde_json::from_slice(json).map_err(|e| invalid(self.what, e.to_string()))
    }
}

/// Reads little-endian numbers from untrusted bytes, failing (never
/// panicking) past the end.
pub(crate) struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
    what: &'static str,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(bytes: &'a [u8], what: &'static str) -> Self {
        Cursor { bytes, at: 0, what }
    }

    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], FormatError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.bytes.len())
            .ok_or_else(|| invalid(self.what, format!("ends early at byte {}", self.at)))?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, FormatError> {
        Ok(self.take(1)?[0])
    }

    pub(crate) fn u32(&mut self) -> Result<u32, FormatError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub(crate) fn id(&mut self) -> Result<[u8; 32], FormatError> {
        let b = self.take(32)?;
        let mut out = [0u8; 32];
        out.copy_from_slice(b);
        Ok(out)
    }

    pub(crate) fn remaining(&self) -> usize {
        self.bytes.len() - self.at
    }

    pub(crate) fn finish(&self) -> Result<(), FormatError> {
        if self.remaining() != 0 {
            return Err(invalid(
                self.what,
                format!("{} bytes after its end", self.remaining()),
            ));
        }
        Ok(())
    }
}
