//! Block I/O for arbor.
//!
//! Everything above this crate sees storage only through [`BlockDevice`]:
//! positional reads and writes plus a durability barrier. Two backends:
//!
//! * [`FileDevice`]: a regular file or a block device, via `pread`/`pwrite`
//!   and `fdatasync`.
//! * [`SimDisk`]: an in-memory disk that models a volatile write cache. Writes
//!   are visible to reads at once but become durable only at [`BlockDevice::flush`].
//!   A test can cut power at any moment and obtain the image a real disk
//!   could show afterwards: any subset of the unflushed writes, one of them
//!   possibly torn at sector granularity.
//! * [`RecordingDevice`] (a wrapper): logs every write and flush so that a
//!   [`CrashReplayer`] can rebuild the image of a power cut at any point of a
//!   recorded run (the dm-log-writes / CrashMonkey method).
//!
//! [`model`] holds what tests and campaigns expect of a volume after a crash.
//! [`blockdev`] asks the kernel what only it knows of a block device (a
//! loop device's backing file) and opens one exclusively.
//! [`LargeBuffer`] is memory for large direct reads that leave as few,
//! large requests (a scrub's).
//! [`small_file`] reads and atomically replaces the daemon's small state
//! files (replication pairs, API tokens).

pub mod blockdev;
mod buffer;
mod file;
pub mod model;
mod record;
mod sim;
pub mod small_file;
mod uring;

pub use buffer::LargeBuffer;
pub use file::{Batches, CacheMode, FileDevice};
pub use record::{CrashKind, CrashReplayer, IoEvent, OverlayDevice, Recording, RecordingDevice};
pub use sim::{SimDisk, SimDiskHandle};

use std::io;

/// Bytes of the file at `path` that are in the host's page cache now, as
/// util-linux `fincore` counts them: for tests that a write kept its data
/// out of the cache (`BlockDevice::write_uncached`).
pub fn cached_bytes(path: &std::path::Path) -> io::Result<u64> {
    let out = std::process::Command::new("fincore")
        .args(["--bytes", "--noheadings", "--output", "RES"])
        .arg(path)
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    match text.trim().parse() {
        Ok(bytes) if out.status.success() => Ok(bytes),
        _ => Err(io::Error::other(format!(
            "fincore {}: {} {}",
            path.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))),
    }
}

/// Size of a sector: the unit a power cut can tear writes into.
pub const SECTOR_SIZE: u64 = 512;

/// A byte-addressed storage device with an explicit durability barrier.
///
/// Contract (the engine's crash safety depends on it):
/// * a write that returned `Ok` is visible to every later read;
/// * it is durable only after a later `flush` returned `Ok`;
/// * before that flush, a power cut may drop it, keep it, or keep any subset
///   of its sectors.
pub trait BlockDevice: Send + Sync {
    /// Reads exactly `buf.len()` bytes at `offset`.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Reads as `read_at` does (every write that returned `Ok` is seen),
    /// bypassing the host's page cache where the device can: for reads of
    /// much data that nothing reads again soon (a scrub's), which should
    /// neither pay for the cache's copy and readahead nor evict what the
    /// cache holds for clients. The default is `read_at`.
    fn read_uncached(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.read_at(buf, offset)
    }
    /// Writes all of `buf` at `offset`.
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Writes as `write_at` does (seen by every later read, durable only
    /// after a later `flush`), keeping the data out of the host's page
    /// cache where the device can: for much data that nothing reads soon
    /// (a restore's fill), which should neither pile up as dirty pages for
    /// the next flush nor evict what the cache holds for clients. The
    /// default is `write_at`.
    fn write_uncached(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.write_at(buf, offset)
    }
    /// Writes each buffer at its offset, as `write_at` would, in any order
    /// and possibly several at once: a batch of independent writes (a
    /// commit's metadata blocks) that a device waiting for each write in
    /// turn would serialise. On error, any subset of the batch may have
    /// been written.
    fn write_batch(&self, writes: &[(u64, &[u8])]) -> io::Result<()> {
        writes
            .iter()
            .try_for_each(|&(offset, buf)| self.write_at(buf, offset))
    }
    /// Fills each buffer from its offset, as `read_at` would, in any order
    /// and possibly several at once: the scattered chunks of one request
    /// that a device waiting for each read in turn would serialise. On
    /// error, any buffer may hold anything.
    fn read_batch(&self, reads: &mut [(u64, &mut [u8])]) -> io::Result<()> {
        reads
            .iter_mut()
            .try_for_each(|(offset, buf)| self.read_at(buf, *offset))
    }
    /// Makes `len` bytes at `offset` read as zeros, as writing zeros there
    /// would, with the same visibility and durability (any subset may be
    /// lost to a power cut before the next `flush`). The default writes
    /// them; a device may zero without moving the bytes
    /// ([`FileDevice`] on large ranges).
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        write_zeroes_by_writing(self, offset, len)
    }
    /// Whether `[offset, offset + len)` is a hole worth keeping: every
    /// byte of it reads as zero now, known without reading it (a hole of a
    /// sparse file), and writing part of it costs less than writing it
    /// whole. True only if a `read_at` of the range would return zeros
    /// until something writes it, and durably so once the next `flush`
    /// returned (as a write's bytes are); false whenever the device cannot
    /// tell cheaply, or when writes into holes cost more than zeros (each
    /// direct write into a file's hole allocates there and then). The
    /// default is false. A caller that writes only part of a hole relies
    /// on the rest staying zero, so it must own the range (no other
    /// writer).
    fn hole(&self, offset: u64, len: u64) -> io::Result<bool> {
        let _ = (offset, len);
        Ok(false)
    }
    /// Makes every completed write durable.
    fn flush(&self) -> io::Result<()>;
    /// Writes all of `buf` at `offset` and returns once that write is
    /// durable, without waiting for other writes not yet flushed: they may
    /// or may not have become durable with it (a small record that must
    /// survive a power cut before the caller goes on, written without
    /// making the device write back everything else: `RWF_DSYNC` on a
    /// file). The default writes and flushes.
    fn write_durable_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.write_at(buf, offset)?;
        self.flush()
    }
    /// Size of the device in bytes.
    fn size(&self) -> u64;
    /// Re-reads the size of a device enlarged from outside (a block device
    /// after `lvextend`, a file after `truncate`) and returns it. The size
    /// never goes down: a device that shrank is an error.
    fn refresh_size(&self) -> io::Result<u64> {
        Ok(self.size())
    }
    /// The device's size as it is now, smaller than [`Self::size`] if it
    /// shrank from outside (a file truncated, a logical volume reduced);
    /// nothing is updated. Devices whose size cannot change return
    /// [`Self::size`].
    fn current_size(&self) -> io::Result<u64> {
        Ok(self.size())
    }
    /// Enlarges the device to `size` bytes (a regular file: sparse, and
    /// durable with the next `flush`). Devices that cannot resize
    /// themselves return [`io::ErrorKind::Unsupported`].
    fn extend(&self, size: u64) -> io::Result<()> {
        let _ = size;
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this device cannot be enlarged by arbor; enlarge it with its own tools",
        ))
    }
}

/// [`BlockDevice::write_zeroes`] by writing zeros, a MiB at a time.
pub fn write_zeroes_by_writing<D: BlockDevice + ?Sized>(
    dev: &D,
    offset: u64,
    len: u64,
) -> io::Result<()> {
    const PIECE: u64 = 1 << 20;
    let end = check_span(offset, len, dev.size())?;
    // At most a MiB: the conversion cannot truncate.
    let zeros = vec![0u8; len.min(PIECE) as usize];
    let mut at = offset;
    while at < end {
        let n = (end - at).min(PIECE) as usize;
        dev.write_at(&zeros[..n], at)?;
        at += n as u64;
    }
    Ok(())
}

/// Checks that `[offset, offset + len)` lies inside a device of `size`
/// bytes, and returns its end.
pub fn check_span(offset: u64, len: u64, size: u64) -> io::Result<u64> {
    offset
        .checked_add(len)
        .filter(|&end| end <= size)
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "I/O of {len} bytes at offset {offset} is beyond the device end ({size} bytes)"
                ),
            )
        })
}

/// [`check_span`] for a buffer's length.
pub fn check_range(offset: u64, len: usize, size: u64) -> io::Result<()> {
    // A length past u64 (no such target) is past every end.
    check_span(offset, u64::try_from(len).unwrap_or(u64::MAX), size).map(drop)
}
