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
use crate::format::{invalid, FormatError, SealedJson, REPO_VERSION};

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

const FRAME: SealedJson = SealedJson {
    what: "a lock",
    magic: LOCK_MAGIC,
    aad: AAD,
    max_bytes: MAX_LOCK_BYTES,
};

pub fn encode(keys: &Keys, record: &LockRecord) -> Vec<u8> {
    FRAME.seal(keys, record)
}

pub fn decode(keys: &Keys, bytes: &[u8]) -> Result<LockRecord, FormatError> {
    decode_json(&FRAME.open(keys, bytes)?)
}

/// A lock's opened contents.
pub fn decode_json(json: &[u8]) -> Result<LockRecord, FormatError> {
    let record: LockRecord = FRAME.parse(json)?;
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
