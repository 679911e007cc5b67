//! Where the pool's scrub stands (docs/FORMAT.md §6.4, "Scrub"): kept in
//! the pool as the property [`SCRUB_KEY`] of the pool, so that a scrub
//! goes on from where it was after a restart or a crash.
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 1 | layout version (1) |
//! | 1 | 1 | state: 1 running, 2 stopped by a user, 3 finished |
//! | 2 | 6 | reserved (0) |
//! | 8 | 8 | `started_unix` |
//! | 16 | 8 | `finished_unix` (0 until finished) |
//! | 24 | 8 | `cursor`: the next physical data chunk to read |
//! | 32 | 8 | `data_chunks`: the pool's data chunks (the end) |
//! | 40 | 8 | `bytes`: live data read so far |
//! | 48 | 8 | `verified_blocks`: blocks verified against their sums |
//! | 56 | 8 | `damaged_blocks`: blocks found damaged |
//!
//! All little-endian.

use crate::FormatError;

/// The property key (of the pool) that holds the record.
pub const SCRUB_KEY: &str = "arbor.scrub";
/// Bytes of the record.
pub const SCRUB_RECORD_LEN: usize = 64;
const LAYOUT_VERSION: u8 = 1;

/// What a scrub is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScrubPhase {
    Running,
    Stopped,
    Finished,
}

/// Where the pool's scrub stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScrubRecord {
    pub phase: ScrubPhase,
    pub started_unix: u64,
    pub finished_unix: u64,
    pub cursor: u64,
    pub data_chunks: u64,
    pub bytes: u64,
    pub verified_blocks: u64,
    pub damaged_blocks: u64,
}

impl ScrubRecord {
    pub fn encode(&self) -> [u8; SCRUB_RECORD_LEN] {
        let mut out = [0u8; SCRUB_RECORD_LEN];
        out[0] = LAYOUT_VERSION;
        out[1] = match self.phase {
            ScrubPhase::Running => 1,
            ScrubPhase::Stopped => 2,
            ScrubPhase::Finished => 3,
        };
        for (i, v) in [
            self.started_unix,
            self.finished_unix,
            self.cursor,
            self.data_chunks,
            self.bytes,
            self.verified_blocks,
            self.damaged_blocks,
        ]
        .into_iter()
        .enumerate()
        {
            out[8 + 8 * i..16 + 8 * i].copy_from_slice(&v.to_le_bytes());
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, FormatError> {
        let invalid = |what: String| FormatError::Invalid(format!("scrub record: {what}"));
        if bytes.len() != SCRUB_RECORD_LEN {
            return Err(invalid(format!(
                "{} bytes (want {SCRUB_RECORD_LEN})",
                bytes.len()
            )));
        }
        if bytes[0] != LAYOUT_VERSION || bytes[2..8].iter().any(|&b| b != 0) {
            return Err(invalid(format!(
                "layout version {} (want {LAYOUT_VERSION}, reserved zero)",
                bytes[0]
            )));
        }
        let phase = match bytes[1] {
            1 => ScrubPhase::Running,
            2 => ScrubPhase::Stopped,
            3 => ScrubPhase::Finished,
            other => return Err(invalid(format!("state {other}"))),
        };
        let word = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&bytes[8 + 8 * i..16 + 8 * i]);
            u64::from_le_bytes(w)
        };
        Ok(Self {
            phase,
            started_unix: word(0),
            finished_unix: word(1),
            cursor: word(2),
            data_chunks: word(3),
            bytes: word(4),
            verified_blocks: word(5),
            damaged_blocks: word(6),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_record_round_trips_and_damaged_ones_are_refused() {
        let r = ScrubRecord {
            phase: ScrubPhase::Stopped,
            started_unix: 1,
            finished_unix: 0,
            cursor: 77,
            data_chunks: 1000,
            bytes: 5 << 20,
            verified_blocks: 1280,
            damaged_blocks: 2,
        };
        let bytes = r.encode();
        assert_eq!(ScrubRecord::decode(&bytes).unwrap(), r);
        for (at, value) in [(0, 2), (1, 0), (1, 4), (5, 1)] {
            let mut bad = bytes;
            bad[at] = value;
            assert!(ScrubRecord::decode(&bad).is_err(), "byte {at} = {value}");
        }
        assert!(ScrubRecord::decode(&bytes[..63]).is_err());
    }

    proptest! {
        #[test]
        fn any_bytes_decode_or_fail_and_a_decoded_record_encodes_back(bytes in proptest::collection::vec(any::<u8>(), 64)) {
            if let Ok(r) = ScrubRecord::decode(&bytes) {
                prop_assert_eq!(&r.encode()[..], &bytes[..]);
            }
        }
    }
}
