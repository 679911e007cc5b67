//! An unfinished backup's checkpoint (docs/BACKUP.md, "Checkpoints"): the
//! backup's manifest as far as it has gone (the map pieces done, from the
//! first), written while every blob those pieces name is uploaded and
//! indexed. A backup of the same snapshot from the same base, cut off and
//! run again, goes on after the last piece a checkpoint lists instead of
//! reading the snapshot again from its start; a prune keeps what a
//! checkpoint names, as it keeps what a backup names.
//!
//! ```text
//! checkpoint object: "ARBCKPT1" | sealed JSON (Checkpoint)
//! name: checkpoints/<hex of HMAC(id key, 0x10 | guid | parent)>
//! ```

use serde::{Deserialize, Serialize};

use crate::crypto::Keys;
use crate::format::manifest::{Manifest, MAX_SNAPSHOT_BYTES};
use crate::format::{invalid, FormatError, ObjectId, SealedJson};

pub const CHECKPOINT_MAGIC: &[u8; 8] = b"ARBCKPT1";
const AAD: &[u8] = b"arbor-backup checkpoint v1";
/// The domain byte of a checkpoint's name in the keyed hash (blob kinds
/// are 0 and 1).
const NAME_DOMAIN: u8 = 0x10;

/// A backup as far as it has gone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Checkpoint {
    /// The map pieces done, from the first: `manifest.pieces` past them
    /// are none. `manifest.blocks`, `added_blobs` and `added_bytes` count
    /// those pieces; `completed_unix_ms` is when the checkpoint was written.
    pub done: u64,
    pub manifest: Manifest,
}

impl Checkpoint {
    pub fn validate(&self) -> Result<(), FormatError> {
        const WHAT: &str = "a checkpoint";
        self.manifest.validate()?;
        let pieces = self.manifest.pieces.len() as u64;
        if self.done > pieces {
            return Err(invalid(
                WHAT,
                format!("{} pieces done of {pieces}", self.done),
            ));
        }
        if self
            .manifest
            .pieces
            .iter()
            .skip(usize::try_from(self.done).unwrap_or(usize::MAX))
            .any(Option::is_some)
        {
            return Err(invalid(WHAT, "a map piece past the pieces done"));
        }
        Ok(())
    }
}

/// The checkpoint name of backups of snapshot `guid` (hex) from `parent`
/// (a backup id, hex, or none): one per pair, replaced as it goes on.
pub fn name_of(keys: &Keys, guid: &str, parent: Option<&str>) -> ObjectId {
    let mut what = guid.as_bytes().to_vec();
    what.push(b'|');
    what.extend_from_slice(parent.unwrap_or("").as_bytes());
    ObjectId(keys.blob_id(NAME_DOMAIN, &what).0)
}

const FRAME: SealedJson = SealedJson {
    what: "a checkpoint",
    magic: CHECKPOINT_MAGIC,
    aad: AAD,
    max_bytes: MAX_SNAPSHOT_BYTES,
};

pub fn encode(keys: &Keys, checkpoint: &Checkpoint) -> Vec<u8> {
    FRAME.seal(keys, checkpoint)
}

pub fn decode(keys: &Keys, bytes: &[u8]) -> Result<Checkpoint, FormatError> {
    decode_json(&FRAME.open(keys, bytes)?)
}

/// A checkpoint's opened contents.
pub fn decode_json(json: &[u8]) -> Result<Checkpoint, FormatError> {
    let checkpoint: Checkpoint = FRAME.parse(json)?;
    checkpoint.validate()?;
    Ok(checkpoint)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::Secret;
    use crate::format::REPO_VERSION;

    fn checkpoint(done: u64) -> Checkpoint {
        let piece = Some("ab".repeat(32));
        Checkpoint {
            done,
            manifest: Manifest {
                version: REPO_VERSION,
                volume: "vm1".into(),
                snapshot: "vm1@s".into(),
                guid: "00112233445566778899aabbccddeeff".into(),
                host: "alpha".into(),
                created_unix: 1,
                completed_unix_ms: 2,
                size: 65536 * 3000,
                block_size: 65536,
                parent: None,
                pieces: vec![piece.clone(), None, None],
                blocks: 10,
                added_blobs: 11,
                added_bytes: 12,
            },
        }
    }

    #[test]
    fn round_trips_and_refuses_pieces_past_those_done() {
        let keys = Keys::derive(&Secret::from_bytes([7; 32]), b"t");
        let c = checkpoint(2);
        assert_eq!(decode(&keys, &encode(&keys, &c)).unwrap(), c);
        let mut past = checkpoint(0);
        assert!(past.validate().is_err(), "piece 0 is not done");
        past.done = 4;
        assert!(past.validate().is_err(), "4 of 3 pieces");
        let other = Keys::derive(&Secret::from_bytes([8; 32]), b"t");
        assert!(decode(&other, &encode(&keys, &c)).is_err());
        // One name per snapshot and base; no other key finds it.
        let n = name_of(&keys, &c.manifest.guid, None);
        assert_eq!(n, name_of(&keys, &c.manifest.guid, None));
        assert_ne!(n, name_of(&keys, &c.manifest.guid, Some("00")));
        assert_ne!(n, name_of(&other, &c.manifest.guid, None));
    }
}
