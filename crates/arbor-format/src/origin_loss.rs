//! What an origin lost when its device shrank (docs/FORMAT.md §6.1,
//! "Lost range"): kept in the pool as the engine's property
//! [`ORIGIN_LOSS_KEY`] of the origin's volume, so that no later attach,
//! start or regrown device makes the lost bytes read as data again.
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 1 | layout version (1) |
//! | 1 | 7 | reserved (0) |
//! | 8 | 8 | `from`: bytes from here to the volume's end were lost |
//! | 16 | 8 | `epoch`: the volume's newest epoch when the loss was seen |
//! | 24 | 8 | `seen_unix`: when it was seen (seconds since 1970) |
//! | 32 | 8 | `accepted_unix`: when a user accepted it (0: not yet) |
//!
//! All little-endian.

use crate::FormatError;

/// The property key (of the origin's volume) that holds the record.
pub const ORIGIN_LOSS_KEY: &str = "arbor.origin-loss";
/// Bytes of the record.
pub const ORIGIN_LOSS_LEN: usize = 40;
const LAYOUT_VERSION: u8 = 1;

/// The loss of an origin whose device was seen smaller than the volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OriginLoss {
    /// Bytes of the volume from here to its end were lost: the smallest
    /// size its device was seen at.
    pub from: u64,
    /// The volume's newest epoch when the loss was seen: every epoch up to
    /// it that read the device at or past `from` (no copy in the pool) read
    /// what was lost.
    pub epoch: u64,
    /// When it was seen, in seconds since 1970.
    pub seen_unix: u64,
    /// When a user accepted it (`origin attach --accept-damage`), in
    /// seconds since 1970; 0 until then (the device is not served).
    pub accepted_unix: u64,
}

impl OriginLoss {
    pub fn encode(&self) -> [u8; ORIGIN_LOSS_LEN] {
        let mut out = [0u8; ORIGIN_LOSS_LEN];
        out[0] = LAYOUT_VERSION;
        for (i, v) in [self.from, self.epoch, self.seen_unix, self.accepted_unix]
            .into_iter()
            .enumerate()
        {
            out[8 + 8 * i..16 + 8 * i].copy_from_slice(&v.to_le_bytes());
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, FormatError> {
        if bytes.len() != ORIGIN_LOSS_LEN {
            return Err(FormatError::Invalid(format!(
                "origin loss record of {} bytes (want {ORIGIN_LOSS_LEN})",
                bytes.len()
            )));
        }
        if bytes[0] != LAYOUT_VERSION || bytes[1..8].iter().any(|&b| b != 0) {
            return Err(FormatError::Invalid(format!(
                "origin loss record of layout version {} (want {LAYOUT_VERSION}, reserved zero)",
                bytes[0]
            )));
        }
        let word = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&bytes[8 + 8 * i..16 + 8 * i]);
            u64::from_le_bytes(w)
        };
        Ok(Self {
            from: word(0),
            epoch: word(1),
            seen_unix: word(2),
            accepted_unix: word(3),
        })
    }

    /// Whether a read of epoch `epoch` at `[at, at + len)` of the device
    /// reads lost bytes.
    pub fn covers(&self, epoch: u64, at: u64, len: u64) -> bool {
        epoch != 0 && epoch <= self.epoch && at.saturating_add(len) > self.from
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn round_trip_and_damage() {
        let loss = OriginLoss {
            from: 16 << 20,
            epoch: 3,
            seen_unix: 1_790_000_000,
            accepted_unix: 0,
        };
        let bytes = loss.encode();
        assert_eq!(OriginLoss::decode(&bytes).unwrap(), loss);
        let mut bad = bytes;
        bad[0] = 2;
        assert!(OriginLoss::decode(&bad).is_err());
        let mut bad = bytes;
        bad[5] = 1;
        assert!(OriginLoss::decode(&bad).is_err());
        assert!(OriginLoss::decode(&bytes[..39]).is_err());
        // Epochs up to the loss, bytes reaching past `from`.
        assert!(loss.covers(3, (16 << 20) - 1, 2));
        assert!(loss.covers(1, 20 << 20, 512));
        assert!(!loss.covers(4, 20 << 20, 512));
        assert!(!loss.covers(3, 0, 16 << 20));
    }

    proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = OriginLoss::decode(&bytes);
        }
    }
}
