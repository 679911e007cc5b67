//! Data checksums (version 10, FORMAT.md §6.4): a crc32c of every 4 KiB
//! block of every data chunk, kept in a tree of their own keyed by physical
//! chunk, so that a chunk shared by any number of snapshots and clones has
//! one checksum. A leaf of that tree holds one entry: the sums of a fixed
//! run of consecutive chunks ([`SumsGeometry`]), each block's crc32c and a
//! bit saying whether it has one. No I/O here.

use crate::FormatError;

/// The bytes one checksum covers.
pub const SUM_BLOCK: usize = 4096;
/// [`SUM_BLOCK`] as u64.
pub const SUM_BLOCK_U64: u64 = SUM_BLOCK as u64;

/// Bytes of a sums leaf's one value: a node holds a key (8 bytes) and this
/// value after its 40-byte header, so one entry fills the block.
pub const SUMS_VALUE_LEN: usize = 4048;

/// The checksum of one block of data: crc32c (Castagnoli) of its 4096
/// bytes. The one place that says which function it is. Computed with
/// `crc-fast` (the same function as the `crc32c` crate that metadata
/// uses, faster on blocks of this size: a unit test holds them equal).
pub fn block_sum(block: &[u8]) -> u32 {
    // CRC-32/ISCSI is crc32c; its value fits 32 bits.
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, block) as u32
}

/// The checksum of a block of zeros (what a zeroed block is given without
/// reading it).
pub fn zero_block_sum() -> u32 {
    const ZEROS: [u8; SUM_BLOCK] = [0; SUM_BLOCK];
    block_sum(&ZEROS)
}

/// Bytes of data space one entry of the in-place intent set covers
/// (FORMAT.md §6.4): region `r` is the data chunks `r * R .. (r + 1) * R`
/// with `R = max(1, INTENT_REGION_BYTES / chunk_size)`.
pub const INTENT_REGION_BYTES: u64 = 16 << 20;

/// The intent region of data chunk `pchunk` in a pool of `chunk_size`
/// bytes per chunk, and the chunks it covers.
pub fn intent_region(chunk_size: u64, pchunk: u64) -> (u64, std::ops::Range<u64>) {
    let region = pchunk / intent_region_chunks(chunk_size);
    (region, intent_region_range(chunk_size, region))
}

/// Chunks per intent region.
fn intent_region_chunks(chunk_size: u64) -> u64 {
    (INTENT_REGION_BYTES / chunk_size.max(1)).max(1)
}

/// The data chunks intent region `region` covers.
pub fn intent_region_range(chunk_size: u64, region: u64) -> std::ops::Range<u64> {
    let per = intent_region_chunks(chunk_size);
    region.saturating_mul(per)..region.saturating_add(1).saturating_mul(per)
}

/// How a pool's chunk size divides into sums leaves: `blocks` 4 KiB blocks
/// per chunk, `chunks` chunks per leaf. Leaf `k` holds chunks
/// `k * chunks .. (k + 1) * chunks`; in its value, chunk `i`'s block `b`
/// has its crc32c at byte `4 * (i * blocks + b)` and its bit at bit
/// `(i * blocks + b) % 8` of byte `4 * chunks * blocks + (i * blocks + b) / 8`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SumsGeometry {
    blocks: u32,
    chunks: u32,
}

/// Where one chunk's sums are: the leaf's key and the chunk's index in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SumsSlot {
    pub leaf: u64,
    pub index: u32,
}

impl SumsGeometry {
    /// The geometry of a pool with chunks of `chunk_size` bytes (a power of
    /// two, 4 KiB ..= 1 MiB, as the superblock guarantees).
    pub fn new(chunk_size: u32) -> Result<Self, FormatError> {
        if !chunk_size.is_power_of_two()
            || !(crate::MIN_CHUNK_SIZE..=crate::MAX_CHUNK_SIZE).contains(&chunk_size)
        {
            return Err(FormatError::Invalid(format!(
                "chunk size {chunk_size} for checksums"
            )));
        }
        let blocks = chunk_size / SUM_BLOCK as u32;
        // Each block takes 33 bits: its crc and its bit.
        let chunks = (SUMS_VALUE_LEN * 8 / (33 * blocks as usize)) as u32;
        Ok(Self { blocks, chunks })
    }

    /// 4 KiB blocks per chunk.
    pub fn blocks(self) -> u32 {
        self.blocks
    }

    /// Chunks per leaf.
    pub fn chunks(self) -> u32 {
        self.chunks
    }

    /// The leaf and index of `pchunk`.
    pub fn slot(self, pchunk: u64) -> SumsSlot {
        let per = u64::from(self.chunks);
        SumsSlot {
            leaf: pchunk / per,
            // Below `chunks`, a u32.
            index: (pchunk % per) as u32,
        }
    }

    /// The first chunk of leaf `leaf`, or None past the chunk numbers.
    pub fn first_chunk(self, leaf: u64) -> Option<u64> {
        leaf.checked_mul(u64::from(self.chunks))
    }

    fn slots(self) -> usize {
        self.chunks as usize * self.blocks as usize
    }

    /// The bytes of a leaf's value that [`SumsLeaf::set`] of blocks
    /// `first .. first + count` of chunk `index` changes: their crcs and
    /// the bitmap bytes that hold their bits (for a change logged byte by
    /// byte). Panics outside the leaf, as `set` does.
    pub fn set_spans(self, index: u32, first: u32, count: u32) -> [std::ops::Range<usize>; 2] {
        let end = first.checked_add(count).filter(|&e| e <= self.blocks);
        assert!(
            index < self.chunks && count > 0 && end.is_some(),
            "sums blocks {first}+{count} of chunk {index} outside the leaf"
        );
        let s = index as usize * self.blocks as usize + first as usize;
        let e = s + count as usize;
        let bitmap = self.bitmap_at();
        [4 * s..4 * e, bitmap + s / 8..bitmap + (e - 1) / 8 + 1]
    }

    fn bitmap_at(self) -> usize {
        4 * self.slots()
    }

    /// Bytes of the value that may be nonzero.
    fn used(self) -> usize {
        self.bitmap_at() + self.slots().div_ceil(8)
    }
}

/// One sums leaf's value: owned (read from a node, changed, written back,
/// or built new), or borrowed where the node holds it
/// ([`SumsLeaf::over`]: changed in place).
#[derive(Clone, PartialEq, Eq)]
pub struct SumsLeaf<B = Box<[u8]>> {
    geo: SumsGeometry,
    bytes: B,
}

impl<B: AsRef<[u8]>> std::fmt::Debug for SumsLeaf<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let valid = (0..self.geo.slots()).filter(|&s| self.has(s)).count();
        write!(f, "SumsLeaf({valid} blocks with sums)")
    }
}

/// A value's bytes, if it is a sums value's length.
fn value_len_checked(value: &[u8]) -> Result<(), FormatError> {
    if value.len() == SUMS_VALUE_LEN {
        Ok(())
    } else {
        Err(FormatError::Invalid(format!(
            "sums value of {} bytes",
            value.len()
        )))
    }
}

impl SumsLeaf {
    /// [`Self::get`] straight from a leaf's value bytes, without parsing
    /// the rest of it (a read's lookup: the node holding it verified its
    /// checksum when it was read; `check` parses every leaf whole). None
    /// for a slot outside the leaf or a value too short.
    pub fn lookup(geo: SumsGeometry, value: &[u8], index: u32, block: u32) -> Option<u32> {
        if index >= geo.chunks || block >= geo.blocks {
            return None;
        }
        let s = index as usize * geo.blocks as usize + block as usize;
        let bit = value.get(geo.bitmap_at() + s / 8)? >> (s % 8) & 1;
        let crc = value.get(4 * s..4 * s + 4)?;
        (bit == 1).then(|| u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]))
    }

    /// A leaf with no sums.
    pub fn empty(geo: SumsGeometry) -> Self {
        Self {
            geo,
            bytes: vec![0; SUMS_VALUE_LEN].into_boxed_slice(),
        }
    }

    /// Parses a leaf value: its length, and nothing set past the last
    /// chunk's bits (so each leaf has one encoding). A block without its bit
    /// has a crc of 0.
    pub fn decode(geo: SumsGeometry, value: &[u8]) -> Result<Self, FormatError> {
        let leaf = Self::from_value(geo, value)?;
        let bytes = leaf.as_bytes();
        if bytes[geo.used()..].iter().any(|&b| b != 0) {
            return Err(FormatError::Invalid(
                "sums value: bytes past its sums".into(),
            ));
        }
        let tail = geo.slots() % 8;
        if tail != 0 && bytes[geo.used() - 1] >> tail != 0 {
            return Err(FormatError::Invalid(
                "sums value: bits past its last block".into(),
            ));
        }
        for s in 0..geo.slots() {
            if !leaf.has(s) && leaf.crc_at(s) != 0 {
                return Err(FormatError::Invalid(
                    "sums value: a crc for a block without one".into(),
                ));
            }
        }
        Ok(leaf)
    }

    /// A leaf value as the tree holds it, checked for its length only: for
    /// the write path, which changes a few of its sums (the node holding it
    /// verified its checksum when read; `check` parses every leaf whole
    /// with [`Self::decode`]).
    pub fn from_value(geo: SumsGeometry, value: &[u8]) -> Result<Self, FormatError> {
        value_len_checked(value)?;
        Ok(Self {
            geo,
            bytes: value.into(),
        })
    }
}

impl<'a> SumsLeaf<&'a mut [u8]> {
    /// The leaf value `value` where its node holds it, to change in place;
    /// checked for its length only, as [`SumsLeaf::from_value`].
    pub fn over(geo: SumsGeometry, value: &'a mut [u8]) -> Result<Self, FormatError> {
        value_len_checked(value)?;
        Ok(Self { geo, bytes: value })
    }
}

impl<B: AsRef<[u8]>> SumsLeaf<B> {
    /// The value's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        self.bytes.as_ref()
    }

    fn slot(&self, index: u32, block: u32) -> usize {
        assert!(
            index < self.geo.chunks && block < self.geo.blocks,
            "sums slot ({index}, {block}) outside the leaf"
        );
        index as usize * self.geo.blocks as usize + block as usize
    }

    fn has(&self, s: usize) -> bool {
        self.as_bytes()[self.geo.bitmap_at() + s / 8] >> (s % 8) & 1 == 1
    }

    fn crc_at(&self, s: usize) -> u32 {
        let at = 4 * s;
        let b = self.as_bytes();
        u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
    }

    /// The crc of block `block` of the leaf's chunk `index`, if it has one.
    pub fn get(&self, index: u32, block: u32) -> Option<u32> {
        let s = self.slot(index, block);
        self.has(s).then(|| self.crc_at(s))
    }

    /// Whether any block of chunk `index` has a crc.
    pub fn chunk_has_any(&self, index: u32) -> bool {
        (0..self.geo.blocks).any(|b| self.get(index, b).is_some())
    }

    /// Whether no block of the leaf has a crc.
    pub fn is_empty(&self) -> bool {
        self.as_bytes()[self.geo.bitmap_at()..self.geo.used()]
            .iter()
            .all(|&b| b == 0)
    }
}

impl<B: AsRef<[u8]> + AsMut<[u8]>> SumsLeaf<B> {
    /// Sets (or, with None, clears) the crc of one block.
    pub fn set(&mut self, index: u32, block: u32, crc: Option<u32>) {
        let s = self.slot(index, block);
        let bitmap = self.geo.bitmap_at();
        let bytes = self.bytes.as_mut();
        bytes[4 * s..4 * s + 4].copy_from_slice(&crc.unwrap_or(0).to_le_bytes());
        let bit = 1u8 << (s % 8);
        let byte = &mut bytes[bitmap + s / 8];
        match crc {
            Some(_) => *byte |= bit,
            None => *byte &= !bit,
        }
    }

    /// Clears every block of chunk `index`; whether any had a sum.
    pub fn clear_chunk(&mut self, index: u32) -> bool {
        let mut had = false;
        for b in 0..self.geo.blocks {
            if self.get(index, b).is_some() {
                had = true;
                self.set(index, b, None);
            }
        }
        had
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_block_sum_is_crc32c() {
        // The check value of CRC-32/ISCSI, and the crc32c crate's value.
        assert_eq!(block_sum(b"123456789"), 0xE306_9283);
        let block: Vec<u8> = (0..SUM_BLOCK).map(|i| (i * 31 % 251) as u8).collect();
        assert_eq!(block_sum(&block), crc32c::crc32c(&block));
        assert_eq!(zero_block_sum(), crc32c::crc32c(&[0; SUM_BLOCK]));
    }

    proptest! {
        #[test]
        fn block_sums_match_crc32c_at_any_length(data in proptest::collection::vec(any::<u8>(), 0..9000)) {
            prop_assert_eq!(block_sum(&data), crc32c::crc32c(&data));
        }
    }

    #[test]
    fn leaves_hold_the_documented_number_of_chunks() {
        let per = |cs: u32| SumsGeometry::new(cs).unwrap().chunks();
        assert_eq!(per(4096), 981);
        assert_eq!(per(16384), 245);
        assert_eq!(per(65536), 61);
        assert_eq!(per(1 << 20), 3);
        for shift in 12..=20 {
            let geo = SumsGeometry::new(1 << shift).unwrap();
            assert!(geo.used() <= SUMS_VALUE_LEN, "chunk 2^{shift}");
            assert!(geo.chunks() >= 1);
        }
        assert!(SumsGeometry::new(8192 + 4096).is_err());
        assert!(SumsGeometry::new(2048).is_err());
        // One entry (8-byte key and the value) fills a node after its header.
        assert_eq!(
            crate::NODE_HEADER_SIZE + 8 + SUMS_VALUE_LEN,
            crate::BLOCK_SIZE
        );
    }

    #[test]
    fn slots_number_chunks_across_leaves() {
        let geo = SumsGeometry::new(16384).unwrap();
        assert_eq!(geo.slot(0), SumsSlot { leaf: 0, index: 0 });
        assert_eq!(
            geo.slot(244),
            SumsSlot {
                leaf: 0,
                index: 244
            }
        );
        assert_eq!(geo.slot(245), SumsSlot { leaf: 1, index: 0 });
        assert_eq!(geo.first_chunk(2), Some(490));
        assert_eq!(geo.first_chunk(u64::MAX), None);
    }

    #[test]
    fn intent_regions_are_16_mib_of_chunks() {
        assert_eq!(intent_region(16384, 0), (0, 0..1024));
        assert_eq!(intent_region(16384, 1024), (1, 1024..2048));
        assert_eq!(intent_region(4096, 5000), (1, 4096..8192));
        assert_eq!(intent_region(1 << 20, 33), (2, 32..48));
        assert_eq!(intent_region(16384, u64::MAX).0, u64::MAX / 1024);
    }

    #[test]
    fn set_changes_only_the_bytes_of_its_spans() {
        for chunk_size in [4096u32, 16384, 1 << 20] {
            let geo = SumsGeometry::new(chunk_size).unwrap();
            let last = geo.chunks() - 1;
            let b = geo.blocks();
            for (index, first, count) in [
                (0, 0, 1),
                (last, b - 1, 1),
                (1, 0, b),
                (last, b / 2, b - b / 2),
            ] {
                let mut value = vec![0u8; SUMS_VALUE_LEN];
                let mut leaf = SumsLeaf::over(geo, &mut value).unwrap();
                for block in first..first + count {
                    leaf.set(index, block, Some(0xffff_ffff));
                }
                let spans = geo.set_spans(index, first, count);
                for (i, byte) in value.iter().enumerate() {
                    let inside = spans.iter().any(|s| s.contains(&i));
                    assert_eq!(
                        *byte != 0,
                        inside,
                        "byte {i}, chunk size {chunk_size}, {index} {first}+{count}"
                    );
                }
            }
        }
    }

    #[test]
    fn the_zero_block_sum_is_crc32c_of_zeros() {
        assert_eq!(zero_block_sum(), crc32c::crc32c(&[0u8; 4096]));
        assert_ne!(zero_block_sum(), block_sum(&[1u8; 4096]));
    }

    #[test]
    fn damaged_values_are_refused() {
        let geo = SumsGeometry::new(16384).unwrap();
        let mut leaf = SumsLeaf::empty(geo);
        leaf.set(3, 1, Some(0xdead_beef));
        assert_eq!(SumsLeaf::decode(geo, leaf.as_bytes()).unwrap(), leaf);
        assert!(SumsLeaf::decode(geo, &leaf.as_bytes()[1..]).is_err());
        // A byte past the bitmap.
        let mut bad = leaf.as_bytes().to_vec();
        bad[SUMS_VALUE_LEN - 1] = 1;
        assert!(SumsLeaf::decode(geo, &bad).is_err());
        // A crc with no bit.
        let mut bad = leaf.as_bytes().to_vec();
        bad[0] = 7;
        assert!(SumsLeaf::decode(geo, &bad).is_err());
        // A bit past the last block: 245 * 4 = 980 slots, 4 bits of the
        // last bitmap byte unused.
        let mut bad = leaf.as_bytes().to_vec();
        bad[geo.used() - 1] |= 0x80;
        assert!(SumsLeaf::decode(geo, &bad).is_err());
    }

    proptest! {
        #[test]
        fn sets_read_back_and_round_trip(
            shift in 12u32..=20,
            ops in proptest::collection::vec((any::<u32>(), any::<u32>(), proptest::option::of(any::<u32>())), 0..64),
        ) {
            let geo = SumsGeometry::new(1 << shift).unwrap();
            let mut leaf = SumsLeaf::empty(geo);
            let mut model = std::collections::HashMap::new();
            for (i, b, crc) in ops {
                let (i, b) = (i % geo.chunks(), b % geo.blocks());
                leaf.set(i, b, crc);
                model.insert((i, b), crc);
            }
            for (&(i, b), &crc) in &model {
                prop_assert_eq!(leaf.get(i, b), crc);
                prop_assert_eq!(SumsLeaf::lookup(geo, leaf.as_bytes(), i, b), crc);
            }
            prop_assert_eq!(SumsLeaf::lookup(geo, leaf.as_bytes(), geo.chunks(), 0), None);
            prop_assert_eq!(SumsLeaf::lookup(geo, &leaf.as_bytes()[..8], 0, 0), None);
            prop_assert_eq!(leaf.is_empty(), model.values().all(Option::is_none));
            let back = SumsLeaf::decode(geo, leaf.as_bytes()).unwrap();
            prop_assert_eq!(back, leaf);
        }

        #[test]
        fn decoding_any_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..4100), shift in 12u32..=20) {
            let geo = SumsGeometry::new(1 << shift).unwrap();
            let _ = SumsLeaf::decode(geo, &bytes);
        }
    }
}
