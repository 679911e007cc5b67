//! The damage record (docs/FORMAT.md §6.4, "Damage record"): the data
//! blocks found not to match their checksums, kept in the pool as the
//! engine's property [`DAMAGE_KEY`] of the pool, so that `pool status`,
//! `check`, the API and the dashboard list them across restarts until
//! they are healed (the block's sum changes: rewritten, or healed from a
//! good copy) or no volume maps the chunk any more.
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 1 | layout version (1) |
//! | 1 | 3 | reserved (0) |
//! | 4 | 4 | `n`: entries that follow (≤ [`MAX_DAMAGE_ENTRIES`]) |
//! | 8 | 8 | `unlisted`: damaged blocks found while the record was full |
//! | 16 | 40 × n | entries, by (chunk, block), strictly increasing |
//!
//! An entry:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | `pchunk`: the physical data chunk |
//! | 8 | 4 | `block`: the 4 KiB block within it |
//! | 12 | 4 | `stored`: the sum the block has (what it no longer matches) |
//! | 16 | 4 | `computed`: the crc32c of what was read when it was found |
//! | 20 | 4 | reserved (0) |
//! | 24 | 8 | `found_unix`: when it was first found (seconds since 1970) |
//! | 32 | 8 | `last_unix`: when it was last recorded found (the engine records a block once per run) |
//!
//! All little-endian.

use crate::FormatError;

/// The property key (of the pool) that holds the record.
pub const DAMAGE_KEY: &str = "arbor.damage";
/// The most entries a record lists (it fits a property of 64 KiB); more
/// damaged blocks are counted in `unlisted`.
pub const MAX_DAMAGE_ENTRIES: usize = 1600;
const HEADER_LEN: usize = 16;
const ENTRY_LEN: usize = 40;
const LAYOUT_VERSION: u8 = 1;

/// One damaged data block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DamagedBlock {
    pub pchunk: u64,
    pub block: u32,
    pub stored: u32,
    pub computed: u32,
    pub found_unix: u64,
    pub last_unix: u64,
}

impl DamagedBlock {
    /// Where it is: the order of a record's entries.
    pub fn at(&self) -> (u64, u32) {
        (self.pchunk, self.block)
    }
}

/// The pool's damage record.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DamageRecord {
    entries: Vec<DamagedBlock>,
    unlisted: u64,
}

/// What [`DamageRecord::note`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Noted {
    /// A block not listed before: listed now.
    New,
    /// A block listed already: its count of reads went up.
    Again,
    /// A block not listed, and the record full: counted in `unlisted`.
    Unlisted,
}

impl DamageRecord {
    /// The listed blocks, by (chunk, block).
    pub fn entries(&self) -> &[DamagedBlock] {
        &self.entries
    }

    /// Damaged blocks found while the record was full (not listed).
    pub fn unlisted(&self) -> u64 {
        self.unlisted
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty() && self.unlisted == 0
    }

    /// Notes block `block` found damaged at `block.found_unix`: a listed
    /// block keeps when it was first found and takes the newest time and
    /// sums.
    pub fn note(&mut self, block: DamagedBlock) -> Noted {
        match self
            .entries
            .binary_search_by_key(&block.at(), DamagedBlock::at)
        {
            Ok(i) => {
                let e = &mut self.entries[i];
                e.last_unix = block.found_unix;
                e.stored = block.stored;
                e.computed = block.computed;
                Noted::Again
            }
            Err(_) if self.entries.len() >= MAX_DAMAGE_ENTRIES => {
                self.unlisted = self.unlisted.saturating_add(1);
                Noted::Unlisted
            }
            Err(i) => {
                self.entries.insert(
                    i,
                    DamagedBlock {
                        last_unix: block.found_unix,
                        ..block
                    },
                );
                Noted::New
            }
        }
    }

    /// Keeps the entries `keep` says are still damaged; whether any went.
    pub fn retain(&mut self, keep: impl FnMut(&DamagedBlock) -> bool) -> bool {
        let before = self.entries.len();
        self.entries.retain(keep);
        self.entries.len() != before
    }

    /// Forgets the count of unlisted blocks (a scrub that lists every
    /// damaged block it finds starts it again).
    pub fn clear_unlisted(&mut self) {
        self.unlisted = 0;
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![0u8; HEADER_LEN + ENTRY_LEN * self.entries.len()];
        out[0] = LAYOUT_VERSION;
        // At most MAX_DAMAGE_ENTRIES (`note` keeps it so; `decode` refuses more).
        out[4..8].copy_from_slice(&(self.entries.len() as u32).to_le_bytes());
        out[8..16].copy_from_slice(&self.unlisted.to_le_bytes());
        for (e, chunk) in self
            .entries
            .iter()
            .zip(out[HEADER_LEN..].chunks_exact_mut(ENTRY_LEN))
        {
            chunk[0..8].copy_from_slice(&e.pchunk.to_le_bytes());
            chunk[8..12].copy_from_slice(&e.block.to_le_bytes());
            chunk[12..16].copy_from_slice(&e.stored.to_le_bytes());
            chunk[16..20].copy_from_slice(&e.computed.to_le_bytes());
            chunk[24..32].copy_from_slice(&e.found_unix.to_le_bytes());
            chunk[32..40].copy_from_slice(&e.last_unix.to_le_bytes());
        }
        out
    }

    /// Parses a record: its layout version, reserved bytes, length, and
    /// entries in strictly increasing order (so each record has one
    /// encoding).
    pub fn decode(bytes: &[u8]) -> Result<Self, FormatError> {
        let invalid = |what: String| FormatError::Invalid(format!("damage record: {what}"));
        if bytes.len() < HEADER_LEN {
            return Err(invalid(format!("{} bytes", bytes.len())));
        }
        if bytes[0] != LAYOUT_VERSION || bytes[1..4].iter().any(|&b| b != 0) {
            return Err(invalid(format!(
                "layout version {} (want {LAYOUT_VERSION}, reserved zero)",
                bytes[0]
            )));
        }
        let u32_at =
            |b: &[u8], at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        let u64_at = |b: &[u8], at: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[at..at + 8]);
            u64::from_le_bytes(w)
        };
        let n = u32_at(bytes, 4) as usize;
        if n > MAX_DAMAGE_ENTRIES || bytes.len() != HEADER_LEN + ENTRY_LEN * n {
            return Err(invalid(format!(
                "{n} entries in {} bytes (at most {MAX_DAMAGE_ENTRIES})",
                bytes.len()
            )));
        }
        let raw = bytes[HEADER_LEN..].chunks_exact(ENTRY_LEN);
        if raw.clone().any(|e| u32_at(e, 20) != 0) {
            return Err(invalid("an entry's reserved bytes are not zero".into()));
        }
        let entries: Vec<DamagedBlock> = raw
            .map(|e| DamagedBlock {
                pchunk: u64_at(e, 0),
                block: u32_at(e, 8),
                stored: u32_at(e, 12),
                computed: u32_at(e, 16),
                found_unix: u64_at(e, 24),
                last_unix: u64_at(e, 32),
            })
            .collect();
        if entries.windows(2).any(|w| w[0].at() >= w[1].at()) {
            return Err(invalid("entries out of order".into()));
        }
        Ok(Self {
            entries,
            unlisted: u64_at(bytes, 8),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn block(pchunk: u64, block: u32) -> DamagedBlock {
        DamagedBlock {
            pchunk,
            block,
            stored: 1,
            computed: 2,
            found_unix: 1_700_000_000,
            last_unix: 0,
        }
    }

    #[test]
    fn a_record_lists_each_block_once_in_order_and_counts_past_its_limit() {
        let mut r = DamageRecord::default();
        assert!(r.is_empty());
        assert_eq!(r.note(block(5, 1)), Noted::New);
        assert_eq!(r.note(block(2, 3)), Noted::New);
        assert_eq!(r.entries()[1].last_unix, 1_700_000_000);
        let again = DamagedBlock {
            computed: 9,
            found_unix: 1_800_000_000,
            ..block(5, 1)
        };
        assert_eq!(r.note(again), Noted::Again);
        assert_eq!(
            r.entries().iter().map(|e| e.at()).collect::<Vec<_>>(),
            [(2, 3), (5, 1)]
        );
        assert_eq!(r.entries()[1].found_unix, 1_700_000_000, "first found kept");
        assert_eq!(r.entries()[1].last_unix, 1_800_000_000);
        assert_eq!(r.entries()[1].computed, 9);
        for i in 0..MAX_DAMAGE_ENTRIES as u64 {
            r.note(block(100 + i, 0));
        }
        assert_eq!(r.entries().len(), MAX_DAMAGE_ENTRIES);
        assert_eq!(r.unlisted(), 2);
        assert_eq!(
            r.note(block(5, 1)),
            Noted::Again,
            "a listed block is still found"
        );
        let bytes = r.encode();
        assert!(bytes.len() <= crate::MAX_PROPERTY_BYTES);
        assert_eq!(DamageRecord::decode(&bytes).unwrap(), r);
        assert!(r.retain(|e| e.pchunk != 5));
        assert!(!r.retain(|e| e.pchunk != 5));
    }

    #[test]
    fn damaged_records_are_refused() {
        let mut r = DamageRecord::default();
        r.note(block(1, 0));
        r.note(block(2, 0));
        let good = r.encode();
        let mut bad = good.clone();
        bad[0] = 2;
        assert!(DamageRecord::decode(&bad).is_err(), "layout version");
        let mut bad = good.clone();
        bad[2] = 1;
        assert!(DamageRecord::decode(&bad).is_err(), "reserved");
        assert!(
            DamageRecord::decode(&good[..good.len() - 1]).is_err(),
            "length"
        );
        let mut bad = good.clone();
        bad[4] = 3;
        assert!(DamageRecord::decode(&bad).is_err(), "count");
        let mut bad = good.clone();
        bad[16 + 40..16 + 48].copy_from_slice(&1u64.to_le_bytes());
        assert!(DamageRecord::decode(&bad).is_err(), "order");
        let mut bad = good.clone();
        bad[16 + 20] = 1;
        assert!(
            DamageRecord::decode(&bad).is_err(),
            "an entry's reserved bytes"
        );
        assert!(DamageRecord::decode(&[]).is_err());
    }

    proptest! {
        #[test]
        fn any_bytes_decode_or_fail_and_a_decoded_record_encodes_back(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            if let Ok(r) = DamageRecord::decode(&bytes) {
                prop_assert_eq!(r.encode(), bytes);
            }
        }

        #[test]
        fn noted_blocks_round_trip(blocks in proptest::collection::vec((0u64..50, 0u32..4), 0..100)) {
            let mut r = DamageRecord::default();
            for (c, b) in blocks {
                r.note(block(c, b));
            }
            prop_assert_eq!(DamageRecord::decode(&r.encode()).unwrap(), r);
        }
    }
}
