//! Index objects (docs/BACKUP.md, "Indexes"): which pack holds each blob,
//! so that a backup knows what the repository has without reading packs,
//! and a restore reads a blob with one ranged read.
//!
//! ```text
//! "ARBIDX01"      8 bytes
//! sealed:         u32 pack count, then per pack: its id (32), u32 entry
//!                 count, its entries (pack::ENTRY_LEN bytes each)
//! ```
//!
//! An index only adds knowledge: losing one costs reading the headers of
//! the packs it listed again.

use crate::crypto::Keys;
use crate::format::pack::{Entry, ENTRY_LEN, MAX_ENTRIES};
use crate::format::{invalid, Cursor, FormatError, ObjectId};

pub const INDEX_MAGIC: &[u8; 8] = b"ARBIDX01";
const AAD: &[u8] = b"arbor-backup index v1";
/// The largest index object a reader accepts.
pub const MAX_INDEX_BYTES: u64 = 256 << 20;

/// One pack's entries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackEntries {
    pub pack: ObjectId,
    pub entries: Vec<Entry>,
}

pub fn encode(keys: &Keys, packs: &[PackEntries]) -> Vec<u8> {
    let mut plain = Vec::new();
    plain.extend_from_slice(&u32::try_from(packs.len()).unwrap_or(u32::MAX).to_le_bytes());
    for p in packs {
        plain.extend_from_slice(&p.pack.0);
        plain.extend_from_slice(
            &u32::try_from(p.entries.len())
                .unwrap_or(u32::MAX)
                .to_le_bytes(),
        );
        for e in &p.entries {
            e.encode(&mut plain);
        }
    }
    let mut out = INDEX_MAGIC.to_vec();
    keys.seal(AAD, &plain, &mut out);
    out
}

pub fn decode(keys: &Keys, bytes: &[u8]) -> Result<Vec<PackEntries>, FormatError> {
    const WHAT: &str = "an index";
    if bytes.len() as u64 > MAX_INDEX_BYTES {
        return Err(invalid(
            WHAT,
            format!("{} bytes (at most {MAX_INDEX_BYTES})", bytes.len()),
        ));
    }
    let sealed = bytes
        .strip_prefix(INDEX_MAGIC.as_slice())
        .ok_or_else(|| invalid(WHAT, "not an index (no ARBIDX01 at its start)"))?;
    let plain = keys.open(WHAT, AAD, sealed)?;
    decode_plain(&plain)
}

/// An index's opened contents.
pub fn decode_plain(plain: &[u8]) -> Result<Vec<PackEntries>, FormatError> {
    const WHAT: &str = "an index";
    let mut c = Cursor::new(plain, WHAT);
    let packs = c.u32()?;
    // Every pack takes at least 36 bytes: no allocation beyond the input.
    if (packs as usize).saturating_mul(36) > c.remaining() {
        return Err(invalid(
            WHAT,
            format!("{packs} packs in {} bytes", c.remaining()),
        ));
    }
    let mut out = Vec::with_capacity(packs as usize);
    for _ in 0..packs {
        let pack = ObjectId(c.id()?);
        let n = c.u32()?;
        if n > MAX_ENTRIES || (n as usize).saturating_mul(ENTRY_LEN) > c.remaining() {
            return Err(invalid(WHAT, format!("{n} entries for pack {pack}")));
        }
        let mut entries = Vec::with_capacity(n as usize);
        let mut at = 8u64;
        for _ in 0..n {
            let e = Entry::decode(&mut c, WHAT)?;
            if u64::from(e.offset) < at {
                return Err(invalid(WHAT, format!("pack {pack}'s blobs out of order")));
            }
            at = e.end();
            entries.push(e);
        }
        out.push(PackEntries { pack, entries });
    }
    c.finish()?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::{BlobId, Secret};
    use crate::format::pack::Encoding;
    use crate::format::BlobKind;

    #[test]
    fn an_index_round_trips_and_refuses_damage() {
        let keys = Keys::derive(&Secret::from_bytes([1; 32]), b"r");
        let entry = |i: u8, offset: u32| Entry {
            id: BlobId([i; 32]),
            kind: BlobKind::Data,
            encoding: Encoding::Zstd,
            offset,
            stored_len: 100,
            raw_len: 4096,
        };
        let packs = vec![
            PackEntries {
                pack: ObjectId([9; 32]),
                entries: vec![entry(1, 8), entry(2, 108)],
            },
            PackEntries {
                pack: ObjectId([10; 32]),
                entries: vec![],
            },
        ];
        let bytes = encode(&keys, &packs);
        assert_eq!(decode(&keys, &bytes).unwrap(), packs);
        let mut bad = bytes.clone();
        bad[40] ^= 1;
        assert!(decode(&keys, &bad).is_err());
        assert!(decode(&keys, &bytes[..bytes.len() - 1]).is_err());
        assert!(decode(&Keys::derive(&Secret::from_bytes([2; 32]), b"r"), &bytes).is_err());
    }
}
