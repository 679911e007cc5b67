//! A model of what a byte range (a volume) may read as after a power cut, and
//! a data pattern that names where and by which write it was written. Shared
//! by the engine's crash tests and the reliability campaigns.

use crate::SECTOR_SIZE;

const SECTOR: usize = SECTOR_SIZE as usize;

/// Deterministic pattern for a write: every 8-byte word names (tag, offset),
/// so data from another write, another place or another volume never matches.
pub fn pattern(tag: u64, offset: u64, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    let mut at = offset;
    while out.len() < len {
        let word = tag.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ at;
        out.extend_from_slice(&word.to_le_bytes());
        at += 8;
    }
    out.truncate(len);
    out
}

/// What a volume may read as after a crash: per sector, the value at the last
/// durable point or any value written since.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Possible {
    pub durable: Vec<u8>,
    /// Writes since the durable point (offset, data), in order.
    pub since: Vec<(usize, Vec<u8>)>,
    /// Writes that failed part-way (out of space): any of their sectors may
    /// or may not have landed, now and after later flushes.
    pub uncertain: Vec<(usize, Vec<u8>)>,
}

impl Possible {
    pub fn new(data: Vec<u8>) -> Self {
        Self {
            durable: data,
            since: Vec::new(),
            uncertain: Vec::new(),
        }
    }

    /// The last write failed part-way: it stays possible but is never assumed.
    pub fn last_write_uncertain(&mut self) {
        if let Some(write) = self.since.pop() {
            self.uncertain.push(write);
        }
    }

    /// The contents with every write applied (what reads show before a crash).
    pub fn current(&self) -> Vec<u8> {
        let mut data = self.durable.clone();
        for (offset, bytes) in &self.since {
            data[*offset..*offset + bytes.len()].copy_from_slice(bytes);
        }
        data
    }

    /// Everything written so far is now durable.
    pub fn make_durable(&mut self) {
        self.durable = self.current();
        self.since.clear();
    }

    /// Checks that every sector of `actual` holds its durable value or a
    /// value written there since; the error names the first sector that does not.
    pub fn check(&self, actual: &[u8]) -> Result<(), String> {
        if actual.len() != self.durable.len() {
            return Err(format!(
                "{} bytes read, the volume has {}",
                actual.len(),
                self.durable.len()
            ));
        }
        for s in 0..actual.len() / SECTOR {
            let range = s * SECTOR..(s + 1) * SECTOR;
            let got = &actual[range.clone()];
            if got == &self.durable[range.clone()] {
                continue;
            }
            let written_since = self
                .since
                .iter()
                .chain(&self.uncertain)
                .any(|(offset, bytes)| {
                    let (start, end) = (*offset, offset + bytes.len());
                    start <= range.start
                        && range.end <= end
                        && &bytes[range.start - start..range.end - start] == got
                });
            if !written_since {
                return Err(format!("sector {s} holds data never written there"));
            }
        }
        Ok(())
    }

    /// [`Possible::check`], panicking with `what` in the message.
    // A test assertion, for crash tests and campaigns: the panic is the report.
    #[allow(clippy::panic)]
    pub fn assert_allowed(&self, actual: &[u8], what: &str) {
        if let Err(e) = self.check(actual) {
            panic!("{what}: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sectors_may_hold_durable_or_later_values_only() {
        let mut p = Possible::new(vec![0; 2048]);
        p.since.push((512, pattern(1, 512, 1024)));
        let mut actual = vec![0; 2048];
        actual[1024..1536].copy_from_slice(&pattern(1, 512, 1024)[512..]);
        assert!(p.check(&actual).is_ok());
        actual[0] = 1;
        assert!(p.check(&actual).is_err());
        p.make_durable();
        assert_eq!(p.durable[512..1536], pattern(1, 512, 1024)[..]);
        assert!(p.check(&p.current()).is_ok());
        assert_ne!(pattern(1, 0, 64), pattern(2, 0, 64));
        assert_ne!(pattern(1, 0, 64), pattern(1, 64, 64));
    }
}
