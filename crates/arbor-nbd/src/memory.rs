//! A sparse in-memory [`Export`] and a named table of exports: the reference
//! backend for tests, and a model of the behaviour the engine adapter must
//! have (allocation tracking, `NoSpace`, `Gone`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use crate::export::{Export, ExportError, ExportListing, ExportProvider, StatusRun};

/// Allocation unit of [`MemoryExport`].
pub const MEMORY_BLOCK: u64 = 4096;

/// A sparse, thread-safe export held in memory in [`MEMORY_BLOCK`] blocks.
/// Unallocated blocks read as zeroes and are reported as holes; trimming or
/// zeroing whole blocks deallocates them.
pub struct MemoryExport {
    size: u64,
    read_only: bool,
    description: String,
    /// Most blocks that may be allocated at once; writes beyond fail with
    /// [`ExportError::NoSpace`], like a full pool.
    capacity_blocks: u64,
    blocks: RwLock<BTreeMap<u64, Box<[u8]>>>,
    gone: AtomicBool,
    /// The minimum block size it advertises (an encrypted volume's unit).
    min_block: u32,
}

impl MemoryExport {
    /// A writable, empty export of `size` bytes with room for all of it.
    pub fn new(size: u64) -> Self {
        Self {
            size,
            read_only: false,
            description: String::new(),
            capacity_blocks: size.div_ceil(MEMORY_BLOCK),
            blocks: RwLock::new(BTreeMap::new()),
            gone: AtomicBool::new(false),
            min_block: crate::proto::MIN_BLOCK_SIZE,
        }
    }

    pub fn read_only(mut self) -> Self {
        self.read_only = true;
        self
    }

    pub fn with_description(mut self, description: impl Into<String>) -> Self {
        self.description = description.into();
        self
    }

    /// Advertises `bytes` as its minimum block size (as a volume encrypted
    /// in 4 KiB units does).
    pub fn with_min_block(mut self, bytes: u32) -> Self {
        self.min_block = bytes;
        self
    }

    /// Limits allocated space to `bytes` (rounded up to whole blocks).
    pub fn with_capacity(mut self, bytes: u64) -> Self {
        self.capacity_blocks = bytes.div_ceil(MEMORY_BLOCK);
        self
    }

    /// Simulates deletion: every later operation fails with [`ExportError::Gone`].
    pub fn mark_gone(&self) {
        self.gone.store(true, Ordering::SeqCst);
    }

    /// Bytes currently allocated.
    pub fn allocated_bytes(&self) -> u64 {
        let blocks = self.blocks.read().unwrap_or_else(PoisonError::into_inner);
        blocks.len() as u64 * MEMORY_BLOCK
    }

    fn check_alive(&self) -> Result<(), ExportError> {
        if self.gone.load(Ordering::SeqCst) {
            return Err(ExportError::Gone);
        }
        Ok(())
    }

    fn check_writable(&self, offset: u64, len: u64) -> Result<(), ExportError> {
        self.check_alive()?;
        if self.read_only {
            return Err(ExportError::ReadOnly);
        }
        self.check_range(offset, len)
    }

    fn check_range(&self, offset: u64, len: u64) -> Result<(), ExportError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(ExportError::Invalid(
                "range past the end of the export".into(),
            )),
        }
    }

    /// Writes `data`, or zeroes if `None`, allocating blocks as needed.
    fn store(&self, offset: u64, len: u64, data: Option<&[u8]>) -> Result<(), ExportError> {
        let mut blocks = self.blocks.write().unwrap_or_else(PoisonError::into_inner);
        // Counted from the allocated blocks alone, so a request far larger
        // than the capacity fails at once.
        let (first, last) = (offset / MEMORY_BLOCK, (offset + len).div_ceil(MEMORY_BLOCK));
        let present = blocks.range(first..last).count() as u64;
        let missing = (last - first) - present;
        if blocks.len() as u64 + missing > self.capacity_blocks {
            return Err(ExportError::NoSpace);
        }
        for piece in pieces(offset, len) {
            let block = blocks
                .entry(piece.block)
                .or_insert_with(|| vec![0; MEMORY_BLOCK as usize].into_boxed_slice());
            let target = &mut block[piece.within_block()];
            match data {
                Some(data) => target.copy_from_slice(&data[piece.within_request()]),
                None => target.fill(0),
            }
        }
        Ok(())
    }

    /// Deallocates whole blocks and zeroes the covered part of partial ones.
    /// Visits only the allocated blocks in the range, so trimming or zeroing
    /// gigabytes of a sparse export is quick.
    fn deallocate(&self, offset: u64, len: u64) {
        let mut blocks = self.blocks.write().unwrap_or_else(PoisonError::into_inner);
        let end = offset + len;
        let allocated: Vec<u64> = blocks
            .range(offset / MEMORY_BLOCK..end.div_ceil(MEMORY_BLOCK))
            .map(|(&block, _)| block)
            .collect();
        for block in allocated {
            let block_start = block * MEMORY_BLOCK;
            let start = block_start.max(offset);
            let stop = (block_start + MEMORY_BLOCK).min(end);
            if stop - start == MEMORY_BLOCK {
                blocks.remove(&block);
            } else if let Some(data) = blocks.get_mut(&block) {
                // Within the block: both ends are less than a block apart.
                data[(start - block_start) as usize..(stop - block_start) as usize].fill(0);
            }
        }
    }
}

/// The part of one block touched by a request.
struct Piece {
    block: u64,
    /// Offset within the block.
    start: u64,
    len: u64,
    /// Offset of this piece within the request.
    request_offset: u64,
}

impl Piece {
    // Offsets are below MEMORY_BLOCK or below a request length that was
    // allocated in memory, so the conversions to usize cannot truncate.
    fn within_block(&self) -> std::ops::Range<usize> {
        self.start as usize..(self.start + self.len) as usize
    }

    fn within_request(&self) -> std::ops::Range<usize> {
        self.request_offset as usize..(self.request_offset + self.len) as usize
    }
}

/// Splits `[offset, offset + len)` at block boundaries. The caller checked
/// that the range does not overflow.
fn pieces(offset: u64, len: u64) -> impl Iterator<Item = Piece> {
    let end = offset + len;
    let mut position = offset;
    std::iter::from_fn(move || {
        if position >= end {
            return None;
        }
        let block = position / MEMORY_BLOCK;
        let start = position % MEMORY_BLOCK;
        let piece_len = (MEMORY_BLOCK - start).min(end - position);
        let piece = Piece {
            block,
            start,
            len: piece_len,
            request_offset: position - offset,
        };
        position += piece_len;
        Some(piece)
    })
}

impl Export for MemoryExport {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    fn description(&self) -> String {
        self.description.clone()
    }

    fn min_block_size(&self) -> u32 {
        self.min_block
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), ExportError> {
        self.check_alive()?;
        self.check_range(offset, buf.len() as u64)?;
        let blocks = self.blocks.read().unwrap_or_else(PoisonError::into_inner);
        for piece in pieces(offset, buf.len() as u64) {
            let target = &mut buf[piece.within_request()];
            match blocks.get(&piece.block) {
                Some(block) => target.copy_from_slice(&block[piece.within_block()]),
                None => target.fill(0),
            }
        }
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), ExportError> {
        self.check_writable(offset, data.len() as u64)?;
        self.store(offset, data.len() as u64, Some(data))
    }

    fn flush(&self) -> Result<(), ExportError> {
        self.check_alive()
    }

    fn trim(&self, offset: u64, len: u64) -> Result<(), ExportError> {
        self.check_writable(offset, len)?;
        self.deallocate(offset, len);
        Ok(())
    }

    fn write_zeroes(
        &self,
        offset: u64,
        len: u64,
        may_trim: bool,
        fast_only: bool,
    ) -> Result<(), ExportError> {
        self.check_writable(offset, len)?;
        if may_trim {
            // Deallocating is always fast.
            self.deallocate(offset, len);
            return Ok(());
        }
        if fast_only {
            // Provisioning zeroes costs as much as writing them.
            return Err(ExportError::NotSupported);
        }
        self.store(offset, len, None)
    }

    // Plain memory: never waits, never slow.
    fn small_io_inline(&self) -> bool {
        true
    }

    fn block_status(&self, offset: u64, len: u64) -> Result<Vec<StatusRun>, ExportError> {
        self.check_alive()?;
        self.check_range(offset, len)?;
        let blocks = self.blocks.read().unwrap_or_else(PoisonError::into_inner);
        let end = offset + len;
        let mut runs = Vec::new();
        let mut position = offset;
        let first_block = offset / MEMORY_BLOCK;
        let last_block = end.div_ceil(MEMORY_BLOCK);
        for &block in blocks
            .range(first_block..last_block)
            .map(|(block, _)| block)
        {
            let block_start = (block * MEMORY_BLOCK).max(position);
            let block_end = ((block + 1) * MEMORY_BLOCK).min(end);
            push_run(&mut runs, block_start - position, true);
            push_run(&mut runs, block_end - block_start, false);
            position = block_end;
        }
        push_run(&mut runs, end - position, true);
        Ok(runs)
    }
}

/// Appends a run of `length` bytes, merging with an equal predecessor.
fn push_run(runs: &mut Vec<StatusRun>, length: u64, hole: bool) {
    if length == 0 {
        return;
    }
    match runs.last_mut() {
        Some(last) if last.hole == hole => last.length += length,
        _ => runs.push(StatusRun {
            length,
            hole,
            zero: hole,
        }),
    }
}

/// A mutable table of named exports: the simplest [`ExportProvider`].
#[derive(Default)]
pub struct ExportTable {
    exports: RwLock<BTreeMap<String, Arc<dyn Export>>>,
}

impl ExportTable {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds or replaces the export called `name`.
    pub fn insert(&self, name: impl Into<String>, export: Arc<dyn Export>) {
        let mut exports = self.exports.write().unwrap_or_else(PoisonError::into_inner);
        exports.insert(name.into(), export);
    }

    /// Removes `name`; open connections keep their handle.
    pub fn remove(&self, name: &str) -> Option<Arc<dyn Export>> {
        let mut exports = self.exports.write().unwrap_or_else(PoisonError::into_inner);
        exports.remove(name)
    }
}

impl ExportProvider for ExportTable {
    fn list(&self) -> Vec<ExportListing> {
        let exports = self.exports.read().unwrap_or_else(PoisonError::into_inner);
        exports
            .iter()
            .map(|(name, export)| ExportListing {
                name: name.clone(),
                description: export.description(),
            })
            .collect()
    }

    fn open(&self, name: &str) -> Result<Arc<dyn Export>, ExportError> {
        let exports = self.exports.read().unwrap_or_else(PoisonError::into_inner);
        exports.get(name).cloned().ok_or(ExportError::NotFound)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KIB: u64 = 1024;

    fn read(export: &MemoryExport, offset: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0xAA; len];
        export.read(offset, &mut buf).unwrap();
        buf
    }

    #[test]
    fn unwritten_space_reads_zero_and_is_a_hole() {
        let export = MemoryExport::new(64 * KIB);
        assert_eq!(read(&export, 512, 1024), vec![0; 1024]);
        let runs = export.block_status(0, 64 * KIB).unwrap();
        assert_eq!(
            runs,
            vec![StatusRun {
                length: 64 * KIB,
                hole: true,
                zero: true
            }]
        );
    }

    #[test]
    fn writes_read_back_across_block_boundaries() {
        let export = MemoryExport::new(64 * KIB);
        let data: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        export.write(3000, &data).unwrap();
        assert_eq!(read(&export, 3000, data.len()), data);
        assert_eq!(export.allocated_bytes(), 4 * MEMORY_BLOCK);
    }

    #[test]
    fn block_status_reports_allocated_runs_and_holes_after_trim() {
        let export = MemoryExport::new(64 * KIB);
        export.write(8 * KIB, &[1; 8 * KIB as usize]).unwrap();
        export.trim(12 * KIB, 4 * KIB).unwrap();
        let runs = export.block_status(4 * KIB, 16 * KIB).unwrap();
        let summary: Vec<(u64, bool)> = runs.iter().map(|r| (r.length, r.hole)).collect();
        assert_eq!(
            summary,
            vec![(4 * KIB, true), (4 * KIB, false), (8 * KIB, true)]
        );
        assert_eq!(read(&export, 12 * KIB, 512), vec![0; 512]);
    }

    #[test]
    fn partial_trim_zeroes_but_keeps_the_block() {
        let export = MemoryExport::new(8 * KIB);
        export.write(0, &[7; 4096]).unwrap();
        export.trim(512, 512).unwrap();
        assert_eq!(export.allocated_bytes(), MEMORY_BLOCK);
        assert_eq!(read(&export, 512, 512), vec![0; 512]);
        assert_eq!(read(&export, 0, 512), vec![7; 512]);
    }

    #[test]
    fn full_pool_refuses_new_allocations_but_not_overwrites() {
        let export = MemoryExport::new(64 * KIB).with_capacity(8 * KIB);
        export.write(0, &[1; 8192]).unwrap();
        assert_eq!(export.write(8192, &[1; 512]), Err(ExportError::NoSpace));
        export.write(0, &[2; 512]).unwrap();
        assert_eq!(
            export.write_zeroes(16 * KIB, 4 * KIB, false, false),
            Err(ExportError::NoSpace)
        );
    }

    #[test]
    fn fast_zero_without_trim_is_not_supported_and_changes_nothing() {
        let export = MemoryExport::new(8 * KIB);
        export.write(0, &[9; 4096]).unwrap();
        assert_eq!(
            export.write_zeroes(0, 4096, false, true),
            Err(ExportError::NotSupported)
        );
        assert_eq!(read(&export, 0, 4096), vec![9; 4096]);
        export.write_zeroes(0, 4096, true, true).unwrap();
        assert_eq!(export.allocated_bytes(), 0);
    }

    #[test]
    fn read_only_and_gone_exports_refuse_as_documented() {
        let export = MemoryExport::new(8 * KIB).read_only();
        assert_eq!(export.write(0, &[1; 512]), Err(ExportError::ReadOnly));
        export.mark_gone();
        assert_eq!(export.flush(), Err(ExportError::Gone));
        assert_eq!(export.read(0, &mut [0; 512]), Err(ExportError::Gone));
    }

    #[test]
    fn table_lists_and_opens_by_name() {
        let table = ExportTable::new();
        table.insert(
            "a",
            Arc::new(MemoryExport::new(512).with_description("first")),
        );
        assert_eq!(table.list()[0].description, "first");
        assert!(table.open("a").is_ok());
        assert!(matches!(table.open("b"), Err(ExportError::NotFound)));
        table.remove("a");
        assert!(table.list().is_empty());
    }
}
