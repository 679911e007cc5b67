//! Lock objects (docs/BACKUP.md, "Locks"): who is using a repository and
//! how. A backup, restore or verify holds a shared lock; a prune holds the
//! only lock. Each is one object, rewritten under a new name while its
//! holder lives.
//!
//! ```text
//! lock object: "ARBLOCK1" | sealed JSON (LockRecord)
//! ```

use serde::{Deserialize, Serialize};

use crate::crypto::Keys;
use crate::format::{invalid, FormatError, REPO_VERSION};

pub const LOCK_MAGIC: &[u8; 8] = b"ARBLOCK1";
const AAD: &[u8] = b"arbor-backup lock v1";
/// The largest lock object a reader accepts.
pub const MAX_LOCK_BYTES: u64 = 64 << 10;
/// The longest name (host, operation, boot id) a lock may carry.
pub const MAX_LOCK_NAME: usize = 1024;

/// One holder of a repository lock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LockRecord {
    pub version: u32,
    /// A prune's lock, which no other lock may be beside.
    pub exclusive: bool,
    /// What the holder does (`backup vm1@daily`, `prune`), for messages.
    pub operation: String,
    /// The holder's host name, the kernel's boot id there and its process
    /// id: a lock of this host and boot whose process is gone is stale.
    pub host: String,
    pub boot_id: String,
    pub pid: u32,
    /// When the holder took the lock (its own clock; shown, not compared).
    pub taken_unix_ms: u64,
}

impl LockRecord {
    pub fn validate(&self) -> Result<(), FormatError> {
        const WHAT: &str = "a lock";
        if self.version != REPO_VERSION {
            return Err(FormatError::UnsupportedVersion {
                what: WHAT,
                found: self.version,
            });
        }
        for name in [&self.operation, &self.host, &self.boot_id] {
            if name.len() > MAX_LOCK_NAME {
                return Err(invalid(WHAT, "a name too long"));
            }
        }
        Ok(())
    }
}

pub fn encode(keys: &Keys, record: &LockRecord) -> Vec<u8> {
    // Plain data with string keys.
    #[allow(clippy::expect_used)]
    let json = serde_json::to_vec(record).expect("a lock serializes");
    let mut out = LOCK_MAGIC.to_vec();
    keys.seal(AAD, &json, &mut out);
    out
}

pub fn decode(keys: &Keys, bytes: &[u8]) -> Result<LockRecord, FormatError> {
    const WHAT: &str = "a lock";
    if bytes.len() as u64 > MAX_LOCK_BYTES {
        return Err(invalid(WHAT, format!("{} bytes", bytes.len())));
    }
    let sealed = bytes
        .strip_prefix(LOCK_MAGIC.as_slice())
        .ok_or_else(|| invalid(WHAT, "not a lock (no ARBLOCK1 at its start)"))?;
    let json = keys.open(WHAT, AAD, sealed)?;
    decode_json(&json)
}

/// A lock's opened contents.
pub fn decode_json(json: &[u8]) -> Result<LockRecord, FormatError> {
    let record: LockRecord =
        serde_json::from_slice(json).map_err(|e| invalid("a lock", e.to_string()))?;
    record.validate()?;
    Ok(record)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::Secret;

    #[test]
    fn a_lock_round_trips_and_is_checked() {
        let keys = Keys::derive(&Secret::from_bytes([1; 32]), b"r");
        let record = LockRecord {
            version: REPO_VERSION,
            exclusive: true,
            operation: "prune".into(),
            host: "alpha".into(),
            boot_id: "b".into(),
            pid: 7,
            taken_unix_ms: 9,
        };
        let bytes = encode(&keys, &record);
        assert_eq!(decode(&keys, &bytes).unwrap(), record);
        let other = Keys::derive(&Secret::from_bytes([2; 32]), b"r");
        assert!(decode(&other, &bytes).is_err());
        let mut flipped = bytes.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        assert!(decode(&keys, &flipped).is_err());
        let newer = LockRecord {
            version: 2,
            ..record
        };
        assert!(decode(&keys, &encode(&keys, &newer)).is_err());
    }
}
