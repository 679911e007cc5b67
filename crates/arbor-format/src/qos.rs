//! A volume's rate limits (docs/FORMAT.md §6.5, "QoS"): kept in the pool
//! as the daemon's property [`QOS_KEY`] of the volume (or snapshot), so
//! that they survive restarts and move with the pool. No record: no
//! limits.
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 1 | layout version (1) |
//! | 1 | 3 | reserved (0) |
//! | 4 | 4 | `burst_ms`: a full bucket holds this many milliseconds of its rate (1 to 60,000) |
//! | 8 | 8 | `iops`: operations per second, reads and writes together |
//! | 16 | 8 | `read_iops` |
//! | 24 | 8 | `write_iops` |
//! | 32 | 8 | `bandwidth`: bytes per second, reads and writes together |
//! | 40 | 8 | `read_bandwidth` |
//! | 48 | 8 | `write_bandwidth` |
//!
//! All little-endian; a rate of 0 is no limit (a limit of zero is refused
//! before it is recorded), and a record with no rate is not kept.

use crate::FormatError;

/// The property key (of the volume) that holds the record.
pub const QOS_KEY: &str = "arbor.qos";
/// Bytes of the record.
pub const QOS_RECORD_LEN: usize = 56;
/// The longest burst, in milliseconds.
pub const MAX_BURST_MS: u32 = 60_000;
const LAYOUT_VERSION: u8 = 1;

/// A volume's limits; each 0 is no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QosRecord {
    pub burst_ms: u32,
    pub iops: u64,
    pub read_iops: u64,
    pub write_iops: u64,
    pub bandwidth: u64,
    pub read_bandwidth: u64,
    pub write_bandwidth: u64,
}

impl QosRecord {
    fn rates(&self) -> [u64; 6] {
        [
            self.iops,
            self.read_iops,
            self.write_iops,
            self.bandwidth,
            self.read_bandwidth,
            self.write_bandwidth,
        ]
    }

    /// Whether it sets any limit.
    pub fn any(&self) -> bool {
        self.rates().iter().any(|&r| r > 0)
    }

    pub fn encode(&self) -> [u8; QOS_RECORD_LEN] {
        let mut out = [0u8; QOS_RECORD_LEN];
        out[0] = LAYOUT_VERSION;
        out[4..8].copy_from_slice(&self.burst_ms.to_le_bytes());
        for (i, v) in self.rates().into_iter().enumerate() {
            out[8 + 8 * i..16 + 8 * i].copy_from_slice(&v.to_le_bytes());
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, FormatError> {
        let invalid = |what: String| FormatError::Invalid(format!("QoS record: {what}"));
        if bytes.len() != QOS_RECORD_LEN {
            return Err(invalid(format!(
                "{} bytes (want {QOS_RECORD_LEN})",
                bytes.len()
            )));
        }
        if bytes[0] != LAYOUT_VERSION || bytes[1..4].iter().any(|&b| b != 0) {
            return Err(invalid(format!(
                "layout version {} (want {LAYOUT_VERSION}, reserved zero)",
                bytes[0]
            )));
        }
        let mut half = [0u8; 4];
        half.copy_from_slice(&bytes[4..8]);
        let burst_ms = u32::from_le_bytes(half);
        if !(1..=MAX_BURST_MS).contains(&burst_ms) {
            return Err(invalid(format!(
                "a burst of {burst_ms} ms (1 to {MAX_BURST_MS})"
            )));
        }
        let word = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&bytes[8 + 8 * i..16 + 8 * i]);
            u64::from_le_bytes(w)
        };
        Ok(Self {
            burst_ms,
            iops: word(0),
            read_iops: word(1),
            write_iops: word(2),
            bandwidth: word(3),
            read_bandwidth: word(4),
            write_bandwidth: word(5),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_bad_ones_are_refused() {
        let r = QosRecord {
            burst_ms: 1000,
            write_iops: 2000,
            read_bandwidth: 16 << 20,
            ..QosRecord::default()
        };
        let bytes = r.encode();
        assert_eq!(QosRecord::decode(&bytes).unwrap(), r);
        assert!(r.any() && !QosRecord::default().any());
        assert!(QosRecord::decode(&bytes[..55]).is_err());
        let mut bad = bytes;
        bad[0] = 2;
        assert!(QosRecord::decode(&bad).is_err());
        let mut bad = bytes;
        bad[2] = 1;
        assert!(QosRecord::decode(&bad).is_err());
        for burst in [0u32, MAX_BURST_MS + 1] {
            let mut bad = bytes;
            bad[4..8].copy_from_slice(&burst.to_le_bytes());
            assert!(QosRecord::decode(&bad)
                .unwrap_err()
                .to_string()
                .contains("burst"));
        }
    }
}
