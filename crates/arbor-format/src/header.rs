use zerocopy::little_endian::{U16, U32};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::{FormatError, FormatVersion, BLOCK_SIZE};

pub const MAGIC: [u8; 4] = *b"ARBR";

/// The first 16 bytes of every block.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct BlockHeader {
    pub magic: [u8; 4],
    pub version: U16,
    pub block_type: U16,
    /// crc32c of the whole block with these four bytes taken as zero.
    pub checksum: U32,
    pub reserved: U32,
}

/// Offset of [`BlockHeader::checksum`] inside a block.
const CHECKSUM_AT: usize = 8;
pub const HEADER_SIZE: usize = 16;

/// What a block is: [`BlockHeader::block_type`] (FORMAT.md §2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum BlockType {
    /// The superblock (FORMAT.md §3).
    Superblock = 1,
    /// A commit record (FORMAT.md §4).
    Commit = 2,
    /// A space-map page (FORMAT.md §5).
    SpaceMap = 3,
    /// A B-tree node (FORMAT.md §6).
    Node = 4,
    /// A record of the intent log (version 13, FORMAT.md §6.4.1).
    IntentLog = 5,
    /// A snapshot record of the intent log (version 14, FORMAT.md §6.4.2).
    SnapshotLog = 6,
}

fn block_checksum(block: &[u8]) -> u32 {
    let crc = crc32c::crc32c(&block[..CHECKSUM_AT]);
    let crc = crc32c::crc32c_append(crc, &[0; 4]);
    crc32c::crc32c_append(crc, &block[CHECKSUM_AT + 4..])
}

/// Writes the common header (magic, version 1, type) and the checksum into a
/// fully built block whose header carries version 1 (nodes, space-map
/// pages, intent log records). Call last: any later change invalidates the
/// checksum.
pub fn seal(block: &mut [u8; BLOCK_SIZE], block_type: BlockType) {
    seal_version(block, block_type, FormatVersion::UNCHANGED_LAYOUT);
}

/// [`seal`] with an explicit format version (superblocks and commit
/// records carry their pool's version).
pub fn seal_version(block: &mut [u8; BLOCK_SIZE], block_type: BlockType, version: FormatVersion) {
    let header = BlockHeader {
        magic: MAGIC,
        version: U16::new(version.number()),
        block_type: U16::new(block_type as u16),
        checksum: U32::new(0),
        reserved: U32::new(0),
    };
    block[..HEADER_SIZE].copy_from_slice(header.as_bytes());
    let crc = block_checksum(block);
    block[CHECKSUM_AT..CHECKSUM_AT + 4].copy_from_slice(&crc.to_le_bytes());
}

/// Verifies magic, version, type and checksum of a block.
pub fn verify(block: &[u8], expected: BlockType) -> Result<(), FormatError> {
    verify_version(block, expected).map(|_| ())
}

/// [`verify`], returning the block's format version.
pub fn verify_version(block: &[u8], expected: BlockType) -> Result<FormatVersion, FormatError> {
    if block.len() != BLOCK_SIZE {
        return Err(FormatError::Invalid(format!(
            "block is {} bytes, expected {BLOCK_SIZE}",
            block.len()
        )));
    }
    let (header, _) = BlockHeader::ref_from_prefix(block)
        .map_err(|_| FormatError::Invalid("block shorter than its header".into()))?;
    if header.magic != MAGIC {
        return Err(FormatError::BadMagic);
    }
    let version = FormatVersion::new(header.version.get())?;
    let stored = header.checksum.get();
    let computed = block_checksum(block);
    if stored != computed {
        return Err(FormatError::BadChecksum { stored, computed });
    }
    if header.block_type.get() != expected as u16 {
        return Err(FormatError::WrongType {
            expected: expected as u16,
            found: header.block_type.get(),
        });
    }
    Ok(version)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_single_bit_flip_is_detected() {
        let mut block = [0u8; BLOCK_SIZE];
        block[100] = 42;
        seal(&mut block, BlockType::Node);
        verify(&block, BlockType::Node).unwrap();
        for bit in (0..BLOCK_SIZE * 8).step_by(7) {
            let mut damaged = block;
            damaged[bit / 8] ^= 1 << (bit % 8);
            assert!(verify(&damaged, BlockType::Node).is_err(), "bit {bit}");
        }
    }

    #[test]
    fn wrong_type_is_rejected() {
        let mut block = [0u8; BLOCK_SIZE];
        seal(&mut block, BlockType::Node);
        assert!(matches!(
            verify(&block, BlockType::SpaceMap),
            Err(FormatError::WrongType { .. })
        ));
    }
}
