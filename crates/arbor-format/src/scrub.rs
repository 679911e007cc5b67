//! Where the pool's scrub stands (docs/FORMAT.md §6.4, "Scrub"): kept in
//! the pool as the property [`SCRUB_KEY`] of the pool, so that a scrub
//! goes on from where it was after a restart or a crash, and what the last
//! one found and why it failed are known after one.
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 1 | layout version (2; 1 is read too) |
//! | 1 | 1 | state: 1 running, 2 stopped by a user, 3 finished |
//! | 2 | 6 | reserved (0) |
//! | 8 | 8 | `started_unix` |
//! | 16 | 8 | `finished_unix` (0 until finished) |
//! | 24 | 8 | `cursor`: the next physical data chunk to read |
//! | 32 | 8 | `data_chunks`: the pool's data chunks (the end) |
//! | 40 | 8 | `bytes`: live data read so far |
//! | 48 | 8 | `verified_blocks`: blocks verified against their sums |
//! | 56 | 8 | `damaged_blocks`: blocks found damaged |
//! | 64 | 8 | `sums_added`: blocks without a sum given one (layout 2) |
//! | 72 | 8 | `metadata_problems`: what the last completed metadata check found; all ones: none completed (layout 2) |
//! | 80 | 2 | length of the failure, at most [`MAX_FAILURE_LEN`] (layout 2) |
//! | 82 | that | why the scrub last failed, UTF-8; none if empty (layout 2) |
//!
//! All little-endian. A record of layout 1 is the first 64 bytes alone:
//! no sums added, no check completed, no failure.

use crate::FormatError;

/// The property key (of the pool) that holds the record.
pub const SCRUB_KEY: &str = "arbor.scrub";
/// Bytes of a record of layout 1; one of layout 2 has the fields after
/// it and its failure's text.
pub const SCRUB_RECORD_LEN: usize = 64;
/// Bytes of a record of layout 2 without its failure's text.
const LAYOUT_2_LEN: usize = 82;
/// Longest failure kept (bytes of UTF-8): a longer one is cut at a
/// character's boundary.
pub const MAX_FAILURE_LEN: usize = 512;
const LAYOUT_VERSION: u8 = 2;

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
    /// Blocks that had no sum and were given one by this scrub.
    pub sums_added: u64,
    /// Problems the last completed metadata check of a scrub found (this
    /// one's or, while it runs, the one before it); None: none completed.
    pub metadata_problems: Option<u64>,
}

impl ScrubRecord {
    /// The record's bytes (layout 2), with why the scrub last failed, if
    /// it did (cut to [`MAX_FAILURE_LEN`] bytes).
    pub fn encode(&self, failure: Option<&str>) -> Vec<u8> {
        let failure = failure.map_or("", |f| {
            let mut end = f.len().min(MAX_FAILURE_LEN);
            while !f.is_char_boundary(end) {
                end -= 1;
            }
            &f[..end]
        });
        let mut out = vec![0u8; LAYOUT_2_LEN + failure.len()];
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
            self.sums_added,
            self.metadata_problems.unwrap_or(u64::MAX),
        ]
        .into_iter()
        .enumerate()
        {
            out[8 + 8 * i..16 + 8 * i].copy_from_slice(&v.to_le_bytes());
        }
        // At most MAX_FAILURE_LEN (512): fits a u16.
        out[80..82].copy_from_slice(&(failure.len() as u16).to_le_bytes());
        out[LAYOUT_2_LEN..].copy_from_slice(failure.as_bytes());
        out
    }

    /// A record of layout 1 or 2, and why the scrub last failed (None if
    /// it did not, or the layout has no room for it).
    pub fn decode(bytes: &[u8]) -> Result<(Self, Option<String>), FormatError> {
        let invalid = |what: String| FormatError::Invalid(format!("scrub record: {what}"));
        let layout = bytes.first().copied().unwrap_or(0);
        let fits = match layout {
            1 => bytes.len() == SCRUB_RECORD_LEN,
            2 => bytes.len() >= LAYOUT_2_LEN,
            _ => false,
        };
        if !fits || bytes[2..8].iter().any(|&b| b != 0) {
            return Err(invalid(format!(
                "{} bytes of layout version {layout} (want 64 of 1, or 82 and more of \
                 {LAYOUT_VERSION}; reserved zero)",
                bytes.len()
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
        let mut record = Self {
            phase,
            started_unix: word(0),
            finished_unix: word(1),
            cursor: word(2),
            data_chunks: word(3),
            bytes: word(4),
            verified_blocks: word(5),
            damaged_blocks: word(6),
            sums_added: 0,
            metadata_problems: None,
        };
        if layout == 1 {
            return Ok((record, None));
        }
        record.sums_added = word(7);
        record.metadata_problems = Some(word(8)).filter(|&n| n != u64::MAX);
        let len = usize::from(u16::from_le_bytes([bytes[80], bytes[81]]));
        if len > MAX_FAILURE_LEN || bytes.len() != LAYOUT_2_LEN + len {
            return Err(invalid(format!(
                "a failure of {len} bytes in a record of {} (at most {MAX_FAILURE_LEN})",
                bytes.len()
            )));
        }
        let failure = std::str::from_utf8(&bytes[LAYOUT_2_LEN..])
            .map_err(|_| invalid("a failure that is not UTF-8".to_owned()))?;
        Ok((record, (!failure.is_empty()).then(|| failure.to_owned())))
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
            sums_added: 9,
            metadata_problems: Some(3),
        };
        for failure in [None, Some("a scrub step failed: EIO")] {
            let bytes = r.encode(failure);
            let back = ScrubRecord::decode(&bytes).unwrap();
            assert_eq!((back.0, back.1.as_deref()), (r, failure));
            for (at, value) in [(0, 3), (0, 1), (1, 0), (1, 4), (5, 1), (80, 0xff)] {
                let mut bad = bytes.clone();
                bad[at] = value;
                assert!(ScrubRecord::decode(&bad).is_err(), "byte {at} = {value}");
            }
            assert!(ScrubRecord::decode(&bytes[..bytes.len() - 1]).is_err());
        }
        let none = ScrubRecord {
            metadata_problems: None,
            ..r
        };
        assert_eq!(
            ScrubRecord::decode(&none.encode(None)).unwrap(),
            (none, None)
        );
        // Not UTF-8.
        let mut bad = r.encode(Some("é"));
        let last = bad.len() - 1;
        bad[last] = 0xff;
        assert!(ScrubRecord::decode(&bad).is_err());
    }

    /// A record of layout 1 (written before stop 52) is read: no sums
    /// added, no check completed, no failure.
    #[test]
    fn a_record_of_layout_1_is_read() {
        let r = ScrubRecord {
            phase: ScrubPhase::Running,
            started_unix: 5,
            finished_unix: 0,
            cursor: 10,
            data_chunks: 20,
            bytes: 30,
            verified_blocks: 40,
            damaged_blocks: 1,
            sums_added: 0,
            metadata_problems: None,
        };
        let mut old = r.encode(Some("ignored"))[..SCRUB_RECORD_LEN].to_vec();
        old[0] = 1;
        assert_eq!(ScrubRecord::decode(&old).unwrap(), (r, None));
    }

    /// A failure longer than the record keeps is cut at a character's
    /// boundary.
    #[test]
    fn a_long_failure_is_cut_whole_characters() {
        let r = ScrubRecord {
            phase: ScrubPhase::Running,
            started_unix: 0,
            finished_unix: 0,
            cursor: 0,
            data_chunks: 0,
            bytes: 0,
            verified_blocks: 0,
            damaged_blocks: 0,
            sums_added: 0,
            metadata_problems: None,
        };
        let long = "é".repeat(MAX_FAILURE_LEN);
        let (_, failure) = ScrubRecord::decode(&r.encode(Some(&long))).unwrap();
        let failure = failure.unwrap();
        assert!(failure.len() <= MAX_FAILURE_LEN && failure.len() >= MAX_FAILURE_LEN - 1);
        assert!(long.starts_with(&failure));
    }

    proptest! {
        #[test]
        fn any_bytes_decode_or_fail_and_a_decoded_record_encodes_back(bytes in proptest::collection::vec(any::<u8>(), 64..100)) {
            if let Ok((r, failure)) = ScrubRecord::decode(&bytes) {
                let again = r.encode(failure.as_deref());
                if bytes[0] == 2 {
                    prop_assert_eq!(&again[..], &bytes[..]);
                }
                prop_assert_eq!(ScrubRecord::decode(&again).unwrap(), (r, failure));
            }
        }
    }
}
