//! Backups (docs/BACKUP.md, "Snapshots"): one object per backed-up
//! snapshot, naming the pieces of its block map; and the map pieces, blobs
//! of kind `Map` stored in packs like data, so a piece that did not change
//! since the last backup is stored once.
//!
//! ```text
//! snapshot object: "ARBSNAP1" | sealed JSON (Manifest)
//! map piece (blob plaintext): u32 count, then per mapped block:
//!                  u32 block index within the piece, blob id (32)
//! ```

use serde::{Deserialize, Serialize};

use crate::crypto::{BlobId, Keys};
use crate::format::{
    invalid, parse_blob_id, Cursor, FormatError, ObjectId, SealedJson, MAX_BLOCK_SIZE,
    MAX_VOLUME_SIZE, MIN_BLOCK_SIZE, REPO_VERSION,
};

pub const SNAPSHOT_MAGIC: &[u8; 8] = b"ARBSNAP1";
const AAD: &[u8] = b"arbor-backup snapshot v1";
/// Blocks a map piece covers.
pub const PIECE_BLOCKS: u64 = 1024;
/// Bytes of one piece entry.
const PIECE_ENTRY: usize = 36;
/// The largest snapshot object a reader accepts.
pub const MAX_SNAPSHOT_BYTES: u64 = 64 << 20;
/// The longest name (volume, snapshot, host) a manifest may carry.
pub const MAX_NAME: usize = 1024;

/// A backup of one snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub version: u32,
    /// The volume and snapshot names on the host that backed it up.
    pub volume: String,
    pub snapshot: String,
    /// The snapshot's identity (its guid in the pool, 32 hex digits).
    pub guid: String,
    pub host: String,
    /// When the snapshot was taken (seconds) and when the backup completed
    /// (milliseconds: what orders backups).
    pub created_unix: u64,
    pub completed_unix_ms: u64,
    /// Bytes of the volume.
    pub size: u64,
    pub block_size: u32,
    /// The backup this one was made from (its object id), if incremental.
    pub parent: Option<String>,
    /// Per piece of [`PIECE_BLOCKS`] blocks, its map blob (hex), or none
    /// where every block reads as zeros.
    pub pieces: Vec<Option<String>>,
    /// Blocks that do not read as zeros.
    pub blocks: u64,
    /// Blobs this backup added to the repository, and their stored bytes.
    pub added_blobs: u64,
    pub added_bytes: u64,
}

impl Manifest {
    /// Pieces a volume of `size` bytes has at `block_size`.
    pub fn pieces_for(size: u64, block_size: u32) -> u64 {
        size.div_ceil(u64::from(block_size)).div_ceil(PIECE_BLOCKS)
    }

    /// Checks what the format promises of a manifest.
    pub fn validate(&self) -> Result<(), FormatError> {
        const WHAT: &str = "a backup";
        if self.version != REPO_VERSION {
            return Err(FormatError::UnsupportedVersion {
                what: WHAT,
                found: self.version,
            });
        }
        if !self.block_size.is_power_of_two()
            || !(MIN_BLOCK_SIZE..=MAX_BLOCK_SIZE).contains(&self.block_size)
        {
            return Err(invalid(
                WHAT,
                format!("a block size of {}", self.block_size),
            ));
        }
        if self.size > MAX_VOLUME_SIZE {
            return Err(invalid(WHAT, format!("a volume of {} bytes", self.size)));
        }
        if self.pieces.len() as u64 != Self::pieces_for(self.size, self.block_size) {
            return Err(invalid(
                WHAT,
                format!("{} map pieces for {} bytes", self.pieces.len(), self.size),
            ));
        }
        for name in [&self.volume, &self.snapshot, &self.host] {
            if name.len() > MAX_NAME {
                return Err(invalid(WHAT, "a name too long"));
            }
        }
        if self.guid.len() != 32 || hex::decode(&self.guid).is_err() {
            return Err(invalid(WHAT, format!("the identity {:?}", self.guid)));
        }
        if let Some(p) = &self.parent {
            ObjectId::parse(p).ok_or_else(|| invalid(WHAT, format!("the parent {p:?}")))?;
        }
        for piece in self.pieces.iter().flatten() {
            parse_blob_id(piece)
                .ok_or_else(|| invalid(WHAT, format!("the map piece {piece:?}")))?;
        }
        Ok(())
    }

    /// The map blob of each piece.
    pub fn piece_ids(&self) -> Vec<Option<BlobId>> {
        self.pieces
            .iter()
            .map(|p| p.as_deref().and_then(parse_blob_id))
            .collect()
    }
}

const FRAME: SealedJson = SealedJson {
    what: "a backup",
    magic: SNAPSHOT_MAGIC,
    aad: AAD,
    max_bytes: MAX_SNAPSHOT_BYTES,
};

pub fn encode(keys: &Keys, manifest: &Manifest) -> Vec<u8> {
    FRAME.seal(keys, manifest)
}

pub fn decode(keys: &Keys, bytes: &[u8]) -> Result<Manifest, FormatError> {
    decode_json(&FRAME.open(keys, bytes)?)
}

/// A manifest's opened contents.
pub fn decode_json(json: &[u8]) -> Result<Manifest, FormatError> {
    let manifest: Manifest = FRAME.parse(json)?;
    manifest.validate()?;
    Ok(manifest)
}

/// A map piece: its mapped blocks (index within the piece, blob), in
/// order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Piece(pub Vec<(u32, BlobId)>);

impl Piece {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(4 + self.0.len() * PIECE_ENTRY);
        out.extend_from_slice(
            &u32::try_from(self.0.len())
                .unwrap_or(u32::MAX)
                .to_le_bytes(),
        );
        for (i, id) in &self.0 {
            out.extend_from_slice(&i.to_le_bytes());
            out.extend_from_slice(&id.0);
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Piece, FormatError> {
        const WHAT: &str = "a map piece";
        let mut c = Cursor::new(bytes, WHAT);
        let n = c.u32()?;
        if u64::from(n) > PIECE_BLOCKS || (n as usize) * PIECE_ENTRY != c.remaining() {
            return Err(invalid(
                WHAT,
                format!("{n} entries in {} bytes", c.remaining()),
            ));
        }
        let mut out = Vec::with_capacity(n as usize);
        let mut next = 0u64;
        for _ in 0..n {
            let i = c.u32()?;
            if u64::from(i) < next || u64::from(i) >= PIECE_BLOCKS {
                return Err(invalid(WHAT, format!("block {i} out of order or range")));
            }
            next = u64::from(i) + 1;
            out.push((i, BlobId(c.id()?)));
        }
        Ok(Piece(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::Secret;

    fn manifest() -> Manifest {
        Manifest {
            version: REPO_VERSION,
            volume: "vm1".into(),
            snapshot: "vm1@daily".into(),
            guid: "00112233445566778899aabbccddeeff".into(),
            host: "alpha".into(),
            created_unix: 1,
            completed_unix_ms: 2,
            size: 3 * PIECE_BLOCKS * 65536 - 1,
            block_size: 65536,
            parent: None,
            pieces: vec![None, Some(BlobId([3; 32]).to_string()), None],
            blocks: 5,
            added_blobs: 6,
            added_bytes: 7,
        }
    }

    #[test]
    fn a_manifest_round_trips_and_is_checked() {
        let keys = Keys::derive(&Secret::from_bytes([1; 32]), b"r");
        let m = manifest();
        assert_eq!(decode(&keys, &encode(&keys, &m)).unwrap(), m);
        for broken in [
            Manifest {
                pieces: vec![None],
                ..manifest()
            },
            Manifest {
                block_size: 1000,
                ..manifest()
            },
            Manifest {
                version: 2,
                ..manifest()
            },
            Manifest {
                guid: "zz".into(),
                ..manifest()
            },
            Manifest {
                parent: Some("nope".into()),
                ..manifest()
            },
        ] {
            assert!(
                decode(&keys, &encode(&keys, &broken)).is_err(),
                "{broken:?}"
            );
        }
    }

    #[test]
    fn a_piece_round_trips_and_refuses_disorder() {
        let p = Piece(vec![(0, BlobId([1; 32])), (1023, BlobId([2; 32]))]);
        assert_eq!(Piece::decode(&p.encode()).unwrap(), p);
        let disordered = Piece(vec![(5, BlobId([1; 32])), (5, BlobId([2; 32]))]);
        assert!(Piece::decode(&disordered.encode()).is_err());
        let out_of_range = Piece(vec![(1024, BlobId([1; 32]))]);
        assert!(Piece::decode(&out_of_range.encode()).is_err());
        assert!(Piece::decode(&[1, 0, 0]).is_err());
    }
}
