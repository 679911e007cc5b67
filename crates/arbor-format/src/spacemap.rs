//! Space-map pages: arrays of 32-bit reference counts, one per metadata block
//! or data chunk. Home pages live in fixed regions; each commit also writes an
//! image of every page it changed into its journal area.

use crate::header::{self, BlockType, HEADER_SIZE};
use crate::{get_u64, put_u64, FormatError, BLOCK_SIZE};

/// Bytes of page header after the common block header: kind u32, index u32, txn u64.
const PAGE_HEADER_SIZE: usize = HEADER_SIZE + 16;
/// Reference counts per space-map page.
pub const SM_ENTRIES_PER_PAGE: usize = (BLOCK_SIZE - PAGE_HEADER_SIZE) / 4;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum SmKind {
    /// Counts references to metadata-node blocks.
    Meta = 0,
    /// Counts references to data chunks.
    Data = 1,
}

impl SmKind {
    fn from_u32(raw: u32) -> Result<Self, FormatError> {
        match raw {
            0 => Ok(Self::Meta),
            1 => Ok(Self::Data),
            other => Err(FormatError::Invalid(format!("space-map kind {other}"))),
        }
    }
}

/// One decoded page of reference counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmPage {
    pub kind: SmKind,
    pub index: u32,
    /// Transaction that last changed this page (0 for a freshly formatted page).
    pub txn: u64,
    pub counts: Box<[u32; SM_ENTRIES_PER_PAGE]>,
}

impl AsRef<SmPage> for SmPage {
    fn as_ref(&self) -> &SmPage {
        self
    }
}

impl SmPage {
    pub fn empty(kind: SmKind, index: u32) -> Self {
        Self {
            kind,
            index,
            txn: 0,
            counts: Box::new([0; SM_ENTRIES_PER_PAGE]),
        }
    }

    pub fn encode(&self) -> [u8; BLOCK_SIZE] {
        let mut block = [0u8; BLOCK_SIZE];
        block[HEADER_SIZE..HEADER_SIZE + 4].copy_from_slice(&(self.kind as u32).to_le_bytes());
        block[HEADER_SIZE + 4..HEADER_SIZE + 8].copy_from_slice(&self.index.to_le_bytes());
        put_u64(&mut block, HEADER_SIZE + 8, self.txn);
        for (slot, count) in block[PAGE_HEADER_SIZE..]
            .chunks_exact_mut(4)
            .zip(self.counts.iter())
        {
            slot.copy_from_slice(&count.to_le_bytes());
        }
        header::seal(&mut block, BlockType::SpaceMap);
        block
    }

    /// Decodes a page; `expected` is the (kind, index) the caller looked for,
    /// so a page written to the wrong place is detected.
    pub fn decode(block: &[u8], expected: (SmKind, u32)) -> Result<Self, FormatError> {
        header::verify(block, BlockType::SpaceMap)?;
        let page = Self::decode_verified(block)?;
        if (page.kind, page.index) != expected {
            return Err(FormatError::Misdirected {
                expected: u64::from(expected.1),
                found: u64::from(page.index),
            });
        }
        Ok(page)
    }

    /// Decodes a journal page image, which names its own home.
    pub fn decode_any(block: &[u8]) -> Result<Self, FormatError> {
        header::verify(block, BlockType::SpaceMap)?;
        Self::decode_verified(block)
    }

    fn decode_verified(block: &[u8]) -> Result<Self, FormatError> {
        let word = |at: usize| {
            u32::from_le_bytes([block[at], block[at + 1], block[at + 2], block[at + 3]])
        };
        let kind = SmKind::from_u32(word(HEADER_SIZE))?;
        let index = word(HEADER_SIZE + 4);
        let txn = get_u64(block, HEADER_SIZE + 8);
        let mut counts = Box::new([0u32; SM_ENTRIES_PER_PAGE]);
        for (count, raw) in counts
            .iter_mut()
            .zip(block[PAGE_HEADER_SIZE..].chunks_exact(4))
        {
            *count = u32::from_le_bytes([raw[0], raw[1], raw[2], raw[3]]);
        }
        Ok(Self {
            kind,
            index,
            txn,
            counts,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_round_trip_and_misdirection() {
        let mut page = SmPage::empty(SmKind::Data, 3);
        page.counts[0] = 1;
        page.counts[SM_ENTRIES_PER_PAGE - 1] = u32::MAX;
        page.txn = 12;
        let block = page.encode();
        assert_eq!(SmPage::decode(&block, (SmKind::Data, 3)).unwrap(), page);
        assert!(SmPage::decode(&block, (SmKind::Data, 4)).is_err());
        assert!(SmPage::decode(&block, (SmKind::Meta, 3)).is_err());
        assert_eq!(SmPage::decode_any(&block).unwrap().index, 3);
    }
}
