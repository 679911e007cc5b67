use std::cell::RefCell;
use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom};
use std::os::fd::AsFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError, RwLock};

use rustix::fs::{AtFlags, OFlags, StatxFlags};

use crate::uring::{self, Ring};
use crate::{check_range, check_span, BlockDevice};

/// How a [`FileDevice`] reaches its file or block device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CacheMode {
    /// `pread`/`pwrite` through the host's page cache. Writes complete
    /// once copied into the cache; `flush` (`fdatasync`) writes back every
    /// dirty page of the device, whoever dirtied it.
    Buffered,
    /// `O_DIRECT`: every read and write goes to the device, bypassing the
    /// page cache, so dirty data never piles up in the host's memory and
    /// `flush` costs the device's own cache flush. I/O that the device's
    /// direct-I/O alignment does not allow goes through an aligned bounce
    /// buffer (read-modify-write of the edge sectors for writes).
    Direct,
}

impl CacheMode {
    /// The name used by the CLI, the API and the metrics.
    pub fn name(self) -> &'static str {
        match self {
            CacheMode::Buffered => "buffered",
            CacheMode::Direct => "direct",
        }
    }
}

/// A pool stored in a regular file or on a block device.
#[derive(Debug)]
pub struct FileDevice {
    file: File,
    /// Only grows (see [`BlockDevice::refresh_size`]).
    size: AtomicU64,
    /// Set when the file was opened with `O_DIRECT`.
    direct: Option<Direct>,
    /// With direct I/O, whether batches go through each thread's io_uring
    /// ring: unless the kernel refused the opening thread one or
    /// [`Batches::Threads`] was asked for (then a batch is written by
    /// threads, and read in turn). A thread the kernel refuses a ring does
    /// the same.
    rings: bool,
    /// Opened through the page cache: a second handle of the same file
    /// with `O_DIRECT`, for [`BlockDevice::read_uncached`], opened at its
    /// first use (None inside: the file takes no direct I/O).
    uncached: std::sync::OnceLock<Option<(File, Direct)>>,
    /// Set once the kernel refused `RWF_DONTCACHE`: `write_uncached`
    /// writes through the cache from then on.
    no_dontcache: std::sync::atomic::AtomicBool,
    /// A regular file written with direct I/O whose owner asked for it
    /// ([`FileDevice::allocate_ahead`]): the granules already allocated.
    ahead: Option<Ahead>,
}

/// What [`FileDevice::allocate_ahead`] allocates at once: at most this
/// much of the file beyond what the pool has written is taken from the
/// file system around each place it writes. `fallocate` of 16 MiB took 5
/// µs to 0.7 ms here, of 64 MiB about 0.5 ms (PERFORMANCE.md § 19).
pub const AHEAD_GRANULE: u64 = 16 << 20;

/// The granules of a file given to `fallocate` so far, one bit each.
#[derive(Debug, Default)]
struct Ahead {
    /// Grows (under the write lock) when a write reaches past it, after
    /// the file grew.
    done: RwLock<Vec<AtomicU64>>,
}

impl Ahead {
    /// A granule's word in `done` and its bit in that word.
    fn slot(granule: u64) -> Option<(usize, u64)> {
        Some((usize::try_from(granule / 64).ok()?, 1 << (granule % 64)))
    }

    fn is_done(&self, granule: u64) -> bool {
        let Some((word, bit)) = Self::slot(granule) else {
            return false;
        };
        let done = self.done.read().unwrap_or_else(PoisonError::into_inner);
        done.get(word)
            .is_some_and(|w| w.load(Ordering::Acquire) & bit != 0)
    }

    fn set_done(&self, granule: u64) {
        let Some((word, bit)) = Self::slot(granule) else {
            return;
        };
        {
            let done = self.done.read().unwrap_or_else(PoisonError::into_inner);
            if let Some(w) = done.get(word) {
                w.fetch_or(bit, Ordering::AcqRel);
                return;
            }
        }
        let mut done = self.done.write().unwrap_or_else(PoisonError::into_inner);
        if done.len() <= word {
            done.resize_with(word + 1, AtomicU64::default);
        }
        done[word].fetch_or(bit, Ordering::AcqRel);
    }

    /// After the file grew from `old` bytes: a last granule that the end
    /// cut short has a part to allocate now.
    fn grown_from(&self, old: u64) {
        if old.is_multiple_of(AHEAD_GRANULE) {
            return;
        }
        let Some((word, bit)) = Self::slot(old / AHEAD_GRANULE) else {
            return;
        };
        let done = self.done.read().unwrap_or_else(PoisonError::into_inner);
        if let Some(w) = done.get(word) {
            w.fetch_and(!bit, Ordering::AcqRel);
        }
    }
}

/// `RWF_DONTCACHE` (linux/fs.h, Linux 6.14): a buffered write whose pages
/// are dropped once written back.
const RWF_DONTCACHE: u32 = 0x80;

/// The kernel refused a `pwritev2` flag before writing anything
/// (`EOPNOTSUPP`, or `EINVAL` for a flag it does not know).
struct Refused;

/// Writes all of `buf` at `offset` with `pwritev2` and `flags`, going on
/// after a short write; `Err(Refused)` if the kernel refused the flags
/// before any byte was written (the caller falls back), `Ok(result)`
/// otherwise.
fn pwrite_all_flags(
    file: &File,
    buf: &[u8],
    offset: u64,
    flags: rustix::io::ReadWriteFlags,
) -> Result<io::Result<()>, Refused> {
    let mut done = 0usize;
    while done < buf.len() {
        let rest = [io::IoSlice::new(&buf[done..])];
        // In range: the caller checked it, and done < buf.len().
        let at = offset + done as u64;
        match rustix::io::pwritev2(file, &rest, at, flags) {
            Ok(0) => return Ok(Err(io::ErrorKind::WriteZero.into())),
            Ok(n) => done += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(rustix::io::Errno::OPNOTSUPP | rustix::io::Errno::INVAL) if done == 0 => {
                return Err(Refused)
            }
            Err(e) => return Ok(Err(e.into())),
        }
    }
    Ok(Ok(()))
}

/// How [`FileDevice`] carries out a batch of independent operations with
/// direct I/O (`BlockDevice::write_batch`: a commit's metadata blocks;
/// `BlockDevice::read_batch`: the scattered pieces of one read). Through
/// the page cache a batch is done in turn, each operation a copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Batches {
    /// All of them submitted at once through the calling thread's
    /// io_uring ring, up to 64 in flight, when the kernel allows one; else
    /// as `Threads`.
    #[default]
    IoUring,
    /// Writes by up to 16 threads started for the batch, each writing in
    /// turn; reads in turn.
    Threads,
}

/// Alignment rules and edge locks of a device opened with `O_DIRECT`.
#[derive(Debug)]
struct Direct {
    /// Alignment of memory buffers (a power of two): what the kernel
    /// requires, raised to the file system's block (see
    /// [`write_mem_align`]).
    mem_align: usize,
    /// Alignment of offsets and lengths (a power of two, at least 512).
    offset_align: u64,
    /// Serialises read-modify-writes of the same edge sector: two
    /// unaligned writes to different bytes of one sector must both land.
    edges: Vec<Mutex<()>>,
}

/// Number of stripes of [`Direct::edges`].
const EDGE_STRIPES: usize = 64;

/// Most writes of one batch in flight at once with direct I/O (each waits
/// for the device; the device serves many at a time).
const BATCH_THREADS: usize = 16;

/// Writes of a batch per thread, at least: fewer are not worth a thread.
const WRITES_PER_THREAD: usize = 4;

/// Largest bounce buffer a thread keeps between calls.
const MAX_KEPT_BOUNCE: usize = 4 << 20;

/// Alignment assumed when the kernel does not report one (before Linux
/// 6.1): a page, which satisfies every logical block size in use.
const FALLBACK_ALIGN: u32 = 4096;

thread_local! {
    /// This thread's bounce buffer for direct I/O (over-allocated by the
    /// alignment so that an aligned window of it can be used).
    static BOUNCE: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

impl FileDevice {
    /// Opens an existing file or block device read-write, through the page
    /// cache.
    pub fn open(path: &Path) -> io::Result<Self> {
        Self::open_with(path, CacheMode::Buffered)
    }

    /// Opens an existing file or block device read-write in `mode`.
    pub fn open_with(path: &Path, mode: CacheMode) -> io::Result<Self> {
        let file = Self::options(mode)
            .open(path)
            .map_err(|e| direct_open_error(e, mode))?;
        Self::from_file(file, mode)
    }

    /// Creates (or truncates) a regular file of `size` bytes, through the
    /// page cache. The file is sparse: space is allocated only as the pool
    /// writes.
    pub fn create_file(path: &Path, size: u64) -> io::Result<Self> {
        Self::create_file_with(path, size, CacheMode::Buffered)
    }

    /// Creates (or truncates) a sparse regular file of `size` bytes and
    /// opens it in `mode`.
    pub fn create_file_with(path: &Path, size: u64, mode: CacheMode) -> io::Result<Self> {
        let file = Self::options(mode)
            .create(true)
            .truncate(true)
            .open(path)
            .map_err(|e| direct_open_error(e, mode))?;
        file.set_len(size)?;
        Self::from_file(file, mode)
    }

    /// Read-write, with `O_DIRECT` in direct mode.
    fn options(mode: CacheMode) -> OpenOptions {
        let mut options = OpenOptions::new();
        options.read(true).write(true);
        if mode == CacheMode::Direct {
            // The flag's bits fit an i32 on every Linux architecture
            // (0o40000 on x86, 0o200000 on arm64).
            options.custom_flags(OFlags::DIRECT.bits() as i32);
        }
        options
    }

    fn from_file(mut file: File, mode: CacheMode) -> io::Result<Self> {
        // seek(End) also gives the size of a block device, where metadata().len() is 0.
        let size = file.seek(SeekFrom::End(0))?;
        let direct = match mode {
            CacheMode::Buffered => None,
            CacheMode::Direct => Some(Direct::of(&file, size)?),
        };
        let rings = direct.is_some() && uring::available();
        Ok(Self {
            file,
            size: AtomicU64::new(size),
            direct,
            rings,
            uncached: std::sync::OnceLock::new(),
            no_dontcache: std::sync::atomic::AtomicBool::new(false),
            ahead: None,
        })
    }

    /// The file again, read-only with `O_DIRECT`, through this process's
    /// descriptor of it (the same inode, whatever its path now); None if
    /// it takes no direct I/O.
    fn reopen_direct(&self) -> Option<(File, Direct)> {
        use std::os::fd::AsRawFd;
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(OFlags::DIRECT.bits() as i32)
            .open(format!("/proc/self/fd/{}", self.file.as_raw_fd()))
            .ok()?;
        let direct = Direct::of(&file, self.size()).ok()?;
        Some((file, direct))
    }

    /// For a regular file written with direct I/O, allocates the file's
    /// space ahead of the writes: before the first write into each
    /// [`AHEAD_GRANULE`] of the file, that granule's holes become
    /// unwritten extents (`fallocate`, keeping the size), which read as
    /// zeros as holes do. ext4 makes every direct write into a hole take
    /// the inode's exclusive lock and allocate there and then, one at a
    /// time: 16 KiB writes from 8 threads ran at 10.5-10.7K IOPS into a
    /// sparse file against 38.5-47.5K into a preallocated one, and a
    /// pool's writes after a snapshot, which all go to new chunks, at a
    /// third of its overwrites (PERFORMANCE.md § 19). Through the page
    /// cache (delayed allocation) or on a block device there is nothing to
    /// gain, and nothing is done. The price: up to a granule of the file
    /// system's space around each place written, before the pool fills it.
    /// Returns whether it is on.
    ///
    /// Only for a pool's own file: a file the pool only reads from and
    /// writes into (an origin) stays as sparse as its owner made it.
    pub fn allocate_ahead(&mut self) -> bool {
        let regular = self.file.metadata().is_ok_and(|m| m.file_type().is_file());
        if self.direct.is_some() && regular {
            self.ahead.get_or_insert_with(Ahead::default);
        }
        self.ahead.is_some()
    }

    /// Allocates the granules of `[offset, offset + len)` not allocated
    /// yet (see [`Self::allocate_ahead`]). Best effort: where `fallocate`
    /// fails (no space for a whole granule, a file system without it),
    /// the granule is written as before, its holes allocated by the
    /// writes themselves, and not tried again.
    fn allocate_ahead_of(&self, offset: u64, len: usize) {
        let Some(ahead) = &self.ahead else {
            return;
        };
        if len == 0 {
            return;
        }
        let size = self.size();
        // In range: every caller checked `offset + len <= size`.
        let last = (offset + len as u64 - 1) / AHEAD_GRANULE;
        for granule in offset / AHEAD_GRANULE..=last {
            if ahead.is_done(granule) {
                continue;
            }
            let start = granule * AHEAD_GRANULE;
            let span = AHEAD_GRANULE.min(size.saturating_sub(start));
            if span > 0 {
                let _ = rustix::fs::fallocate(
                    &self.file,
                    rustix::fs::FallocateFlags::KEEP_SIZE,
                    start,
                    span,
                );
            }
            ahead.set_done(granule);
        }
    }

    /// Chooses how a batch is written with direct I/O (no effect through
    /// the page cache, nor for `IoUring` where the kernel refused a ring).
    pub fn set_batches(&mut self, batches: Batches) {
        self.rings = batches == Batches::IoUring && self.direct.is_some() && uring::available();
    }

    /// How a batch is written now: `IoUring` only with direct I/O and a
    /// ring.
    pub fn batches(&self) -> Batches {
        if self.rings {
            Batches::IoUring
        } else {
            Batches::Threads
        }
    }

    /// How this device was opened.
    pub fn cache_mode(&self) -> CacheMode {
        match self.direct {
            Some(_) => CacheMode::Direct,
            None => CacheMode::Buffered,
        }
    }

    /// A batch through `ring`: each write checked as `write_at` checks it;
    /// one the device's alignment does not allow for offsets goes through
    /// `write_at` (a read-modify-write of its edges); the others are
    /// submitted together, those whose memory is not aligned from one
    /// aligned copy.
    fn write_batch_ring(
        &self,
        direct: &Direct,
        ring: &mut Ring,
        writes: &[(u64, &[u8])],
    ) -> io::Result<()> {
        let mut bounce = self.batch_bounce(direct, writes.iter().copied())?;
        let start = bounce
            .as_ptr()
            .align_offset(direct.mem_align)
            .min(bounce.len());
        let mut spare = &mut bounce[start..];
        let mut ready: Vec<(u64, &[u8])> = Vec::with_capacity(writes.len());
        for &(offset, buf) in writes {
            if buf.is_empty() {
                continue;
            }
            if !direct.offset_aligned(offset, buf.len()) {
                self.write_at(buf, offset)?;
            } else if direct.mem_aligned(buf) {
                ready.push((offset, buf));
            } else {
                // Each copy takes a whole number of memory alignments:
                // the next one starts aligned too.
                let (slot, rest) =
                    std::mem::take(&mut spare).split_at_mut(direct.mem_slot(buf.len()));
                let copy = &mut slot[..buf.len()];
                copy.copy_from_slice(buf);
                ready.push((offset, copy));
                spare = rest;
            }
        }
        ring.write_all(self.file.as_fd(), &ready)
    }

    /// Checks every range of a batch against the device's size, and
    /// returns a buffer with room for an aligned slot
    /// ([`Direct::mem_slot`]) for each buffer whose offset is aligned but
    /// whose memory is not, from an aligned start within it.
    fn batch_bounce<'a>(
        &self,
        direct: &Direct,
        batch: impl Iterator<Item = (u64, &'a [u8])>,
    ) -> io::Result<Vec<u8>> {
        let size = self.size();
        let mut slots = 0usize;
        for (offset, buf) in batch {
            check_range(offset, buf.len(), size)?;
            if direct.offset_aligned(offset, buf.len()) && !direct.mem_aligned(buf) {
                slots += direct.mem_slot(buf.len());
            }
        }
        Ok(vec![
            0u8;
            if slots == 0 {
                0
            } else {
                slots + direct.mem_align
            }
        ])
    }

    /// A read batch through `ring`, as `write_batch_ring` writes: a read
    /// whose offset is not aligned goes through `read_at`, the others are
    /// read together, those whose memory is not aligned into one aligned
    /// buffer and copied out.
    fn read_batch_ring(
        &self,
        direct: &Direct,
        ring: &mut Ring,
        reads: &mut [(u64, &mut [u8])],
    ) -> io::Result<()> {
        let mut bounce =
            self.batch_bounce(direct, reads.iter().map(|(at, buf)| (*at, &buf[..])))?;
        let start = bounce
            .as_ptr()
            .align_offset(direct.mem_align)
            .min(bounce.len());
        let mut spare = &mut bounce[start..];
        // Into the caller's buffers, or into a slot of `bounce` whose
        // bytes go to the caller's buffer after (by position in `ready`).
        let mut ready: Vec<(u64, &mut [u8])> = Vec::with_capacity(reads.len());
        let mut targets: Vec<(usize, &mut [u8])> = Vec::new();
        for (offset, buf) in reads.iter_mut() {
            if buf.is_empty() {
                continue;
            }
            if !direct.offset_aligned(*offset, buf.len()) {
                self.read_at(buf, *offset)?;
            } else if direct.mem_aligned(buf) {
                ready.push((*offset, &mut buf[..]));
            } else {
                let (slot, rest) =
                    std::mem::take(&mut spare).split_at_mut(direct.mem_slot(buf.len()));
                ready.push((*offset, &mut slot[..buf.len()]));
                targets.push((ready.len() - 1, &mut buf[..]));
                spare = rest;
            }
        }
        ring.read_exact(self.file.as_fd(), &mut ready)?;
        for (at, target) in targets {
            target.copy_from_slice(ready[at].1);
        }
        Ok(())
    }

    /// Whether `path` is a block device (not a regular file).
    pub fn is_block_device(path: &Path) -> io::Result<bool> {
        use std::os::unix::fs::FileTypeExt;
        Ok(std::fs::metadata(path)?.file_type().is_block_device())
    }
}

/// `EINVAL` from an `O_DIRECT` open means the filesystem refuses it.
fn direct_open_error(error: io::Error, mode: CacheMode) -> io::Error {
    if mode == CacheMode::Direct
        && error.raw_os_error() == Some(rustix::io::Errno::INVAL.raw_os_error())
    {
        no_direct_io()
    } else {
        error
    }
}

fn no_direct_io() -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        "this filesystem or device does not support direct I/O (O_DIRECT); use the buffered cache mode",
    )
}

/// The memory alignment direct writes to `file` are given: its file
/// system's block (`st_blksize`) if a power of two of at most 64 KiB, else
/// no more than the kernel requires. ext4 takes a direct write whose
/// memory is not aligned to its block (the kernel itself requires only 512
/// bytes here) as unaligned, and serialises every unaligned write into
/// unwritten extents under the inode's exclusive lock: 16 KiB writes from 8 threads into a
/// preallocated file ran at 9.1-10.8K IOPS from buffers 512 bytes off a
/// page against 38.5-47.5K aligned (PERFORMANCE.md § 19). A copy into an
/// aligned bounce buffer costs far less.
fn write_mem_align(file: &File) -> u32 {
    match rustix::fs::fstat(file) {
        Ok(stat) => u32::try_from(stat.st_blksize)
            .ok()
            .filter(|b| b.is_power_of_two() && *b <= 1 << 16)
            .unwrap_or(1),
        Err(_) => 1,
    }
}

impl Direct {
    /// The direct-I/O alignment of `file`, which must be `size` bytes.
    fn of(file: &File, size: u64) -> io::Result<Self> {
        let (mem, offset) =
            match rustix::fs::statx(file, "", AtFlags::EMPTY_PATH, StatxFlags::DIOALIGN) {
                Ok(stat)
                    if StatxFlags::from_bits_retain(stat.stx_mask)
                        .contains(StatxFlags::DIOALIGN) =>
                {
                    if stat.stx_dio_offset_align == 0 {
                        return Err(no_direct_io());
                    }
                    (stat.stx_dio_mem_align, stat.stx_dio_offset_align)
                }
                // An older kernel: assume a page.
                _ => (FALLBACK_ALIGN, FALLBACK_ALIGN),
            };
        let offset = offset.max(crate::SECTOR_SIZE as u32);
        let mem = mem.max(write_mem_align(file));
        if !mem.is_power_of_two() || !offset.is_power_of_two() || offset > 1 << 20 || mem > 1 << 20
        {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("unusable direct-I/O alignment (memory {mem}, offset {offset}); use the buffered cache mode"),
            ));
        }
        let direct = Self {
            mem_align: mem as usize,
            offset_align: u64::from(offset),
            edges: (0..EDGE_STRIPES).map(|_| Mutex::new(())).collect(),
        };
        direct.check_size(size)?;
        Ok(direct)
    }

    /// Direct I/O cannot reach a partial last block: its size must be a
    /// multiple of the offset alignment.
    fn check_size(&self, size: u64) -> io::Result<()> {
        if !size.is_multiple_of(self.offset_align) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "its size ({size} bytes) is not a multiple of its direct-I/O block ({} bytes); use the buffered cache mode",
                    self.offset_align
                ),
            ));
        }
        Ok(())
    }

    fn offset_aligned(&self, offset: u64, len: usize) -> bool {
        offset.is_multiple_of(self.offset_align) && (len as u64).is_multiple_of(self.offset_align)
    }

    /// `len` rounded up to the memory alignment.
    fn mem_slot(&self, len: usize) -> usize {
        len.div_ceil(self.mem_align) * self.mem_align
    }

    fn mem_aligned(&self, buf: &[u8]) -> bool {
        buf.as_ptr().align_offset(self.mem_align) == 0
    }

    /// Runs `f` on `buf` itself if its memory is aligned for direct I/O,
    /// else on an aligned copy of it (the bounce buffer).
    fn with_aligned<T>(&self, buf: &[u8], f: impl FnOnce(&[u8]) -> T) -> T {
        if self.mem_aligned(buf) {
            return f(buf);
        }
        self.with_bounce(buf.len(), |bounce| {
            bounce.copy_from_slice(buf);
            f(bounce)
        })
    }

    /// The smallest aligned range covering `[offset, offset + len)`.
    fn cover(&self, offset: u64, len: usize) -> (u64, u64) {
        let start = offset - offset % self.offset_align;
        let end = offset + len as u64;
        let end = end.div_ceil(self.offset_align) * self.offset_align;
        (start, end)
    }

    /// Locks the stripes of the sectors at `first` and `last` (in index
    /// order, each once).
    fn lock_edges(
        &self,
        first: u64,
        last: u64,
    ) -> (MutexGuard<'_, ()>, Option<MutexGuard<'_, ()>>) {
        let stripe = |at: u64| ((at / self.offset_align) % EDGE_STRIPES as u64) as usize;
        let (a, b) = (stripe(first), stripe(last));
        let lock = |i: usize| self.edges[i].lock().unwrap_or_else(PoisonError::into_inner);
        let low = lock(a.min(b));
        (low, (a != b).then(|| lock(a.max(b))))
    }

    /// Runs `f` on an aligned scratch buffer of `len` bytes (this thread's,
    /// reused between calls).
    fn with_bounce<T>(&self, len: usize, f: impl FnOnce(&mut [u8]) -> T) -> T {
        BOUNCE.with(|cell| {
            // A nested call (none today) would get a buffer of its own.
            let mut own = Vec::new();
            let mut borrowed = cell.try_borrow_mut();
            let vec = match borrowed.as_deref_mut() {
                Ok(vec) => vec,
                Err(_) => &mut own,
            };
            let need = len + self.mem_align;
            if vec.len() < need {
                vec.resize(need, 0);
            }
            let start = vec.as_ptr().align_offset(self.mem_align);
            let out = f(&mut vec[start..start + len]);
            if vec.len() > MAX_KEPT_BOUNCE {
                *vec = Vec::new();
            }
            out
        })
    }
}

/// The smallest range [`FileDevice`] zeroes without writing (see its
/// `write_zeroes`).
pub const ZERO_RANGE_MIN: u64 = 1 << 20;

impl BlockDevice for FileDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        check_range(offset, buf.len(), self.size())?;
        let Some(direct) = &self.direct else {
            return self.file.read_exact_at(buf, offset);
        };
        if buf.is_empty() {
            return Ok(());
        }
        if direct.offset_aligned(offset, buf.len()) && direct.mem_aligned(buf) {
            return self.file.read_exact_at(buf, offset);
        }
        let (start, end) = direct.cover(offset, buf.len());
        let skip = (offset - start) as usize;
        direct.with_bounce((end - start) as usize, |bounce| {
            self.file.read_exact_at(bounce, start)?;
            buf.copy_from_slice(&bounce[skip..skip + buf.len()]);
            Ok(())
        })
    }

    /// Opened with direct I/O: `read_at`. Through the page cache: a read
    /// whose offset, length and memory the device's direct-I/O alignment
    /// allows goes through a second handle opened with `O_DIRECT` (the
    /// kernel writes back dirty cached pages of the range before a direct
    /// read, so it sees every write); any other, or where the file takes
    /// no direct I/O, through the cache.
    fn read_uncached(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        if self.direct.is_some() || buf.is_empty() {
            return self.read_at(buf, offset);
        }
        match self.uncached.get_or_init(|| self.reopen_direct()) {
            Some((file, direct))
                if direct.offset_aligned(offset, buf.len()) && direct.mem_aligned(buf) =>
            {
                check_range(offset, buf.len(), self.size())?;
                file.read_exact_at(buf, offset)
            }
            _ => self.read_at(buf, offset),
        }
    }

    /// With direct I/O and a ring, the reads go to the device together;
    /// otherwise in turn (through the page cache a read of cached data is
    /// a copy).
    fn read_batch(&self, reads: &mut [(u64, &mut [u8])]) -> io::Result<()> {
        if let (Some(direct), true, 2..) = (&self.direct, self.rings, reads.len()) {
            if let Some(done) = uring::with_ring(|ring| self.read_batch_ring(direct, ring, reads)) {
                return done;
            }
        }
        reads
            .iter_mut()
            .try_for_each(|(offset, buf)| self.read_at(buf, *offset))
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        check_range(offset, buf.len(), self.size())?;
        let Some(direct) = &self.direct else {
            return self.file.write_all_at(buf, offset);
        };
        if buf.is_empty() {
            return Ok(());
        }
        self.allocate_ahead_of(offset, buf.len());
        if direct.offset_aligned(offset, buf.len()) {
            return direct.with_aligned(buf, |mem| self.file.write_all_at(mem, offset));
        }
        // Read-modify-write of the partial edge sectors, under their locks
        // so that a concurrent write to other bytes of the same sector is
        // not undone. (A concurrent aligned write overlapping this one is
        // unordered with it, as overlapping writes always are.)
        let (start, end) = direct.cover(offset, buf.len());
        let block = direct.offset_align as usize;
        let last = end - direct.offset_align;
        let _edges = direct.lock_edges(start, last);
        let skip = (offset - start) as usize;
        direct.with_bounce((end - start) as usize, |bounce| {
            let len = bounce.len();
            if skip != 0 {
                self.file.read_exact_at(&mut bounce[..block], start)?;
            }
            if !(skip + buf.len()).is_multiple_of(block) && (last > start || skip == 0) {
                self.file.read_exact_at(&mut bounce[len - block..], last)?;
            }
            bounce[skip..skip + buf.len()].copy_from_slice(buf);
            self.file.write_all_at(bounce, start)
        })
    }

    /// Opened with direct I/O: `write_at`. Through the page cache: a
    /// buffered write with `RWF_DONTCACHE` (Linux 6.14; ext4, XFS, block
    /// devices), whose pages the kernel writes back at once and drops once
    /// written. Not `O_DIRECT` through a second handle: a direct write
    /// beside buffered I/O of the same large folio (a neighbouring chunk a
    /// client reads and writes meanwhile) can leave stale cached pages
    /// behind it, which the kernel reports as an error at the next
    /// `fdatasync`. Where the kernel or the filesystem refuses the flag
    /// (`EOPNOTSUPP`), an ordinary `write_at`, and every later one too.
    fn write_uncached(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        use std::sync::atomic::Ordering::Relaxed;
        if self.direct.is_some() || buf.is_empty() || self.no_dontcache.load(Relaxed) {
            return self.write_at(buf, offset);
        }
        check_range(offset, buf.len(), self.size())?;
        let flags = rustix::io::ReadWriteFlags::from_bits_retain(RWF_DONTCACHE);
        match pwrite_all_flags(&self.file, buf, offset, flags) {
            Err(Refused) => {
                self.no_dontcache.store(true, Relaxed);
                self.write_at(buf, offset)
            }
            Ok(done) => done,
        }
    }

    /// `pwritev2` with `RWF_DSYNC`: the kernel writes back this range only
    /// (not the file's other dirty pages, as `fdatasync` would) and flushes
    /// the device's cache (and commits the file system's journal if the
    /// file's block map changed). With direct I/O, from aligned memory as
    /// every direct write. Where the kernel refuses the flag, `write_at`
    /// and `flush`.
    fn write_durable_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        check_range(offset, buf.len(), self.size())?;
        if buf.is_empty() {
            return Ok(());
        }
        let flags = rustix::io::ReadWriteFlags::DSYNC;
        let written = match &self.direct {
            None => pwrite_all_flags(&self.file, buf, offset, flags),
            Some(direct) if direct.offset_aligned(offset, buf.len()) => {
                self.allocate_ahead_of(offset, buf.len());
                direct.with_aligned(buf, |mem| pwrite_all_flags(&self.file, mem, offset, flags))
            }
            // Edges to read and write back: as any other write, then a flush.
            Some(_) => Err(Refused),
        };
        match written {
            Ok(done) => done,
            Err(Refused) => {
                self.write_at(buf, offset)?;
                self.flush()
            }
        }
    }

    /// With direct I/O each write waits for the device, so a batch is
    /// written by several threads at once; through the page cache a write
    /// is a copy, and the batch is written in turn.
    fn write_batch(&self, writes: &[(u64, &[u8])]) -> io::Result<()> {
        if self.ahead.is_some() {
            let size = self.size();
            for &(offset, buf) in writes {
                // Checked again where each is written.
                if check_range(offset, buf.len(), size).is_ok() {
                    self.allocate_ahead_of(offset, buf.len());
                }
            }
        }
        if let (Some(direct), true, 2..) = (&self.direct, self.rings, writes.len()) {
            if let Some(done) = uring::with_ring(|ring| self.write_batch_ring(direct, ring, writes))
            {
                return done;
            }
        }
        let threads = writes.len().div_ceil(WRITES_PER_THREAD).min(BATCH_THREADS);
        if self.direct.is_none() || threads <= 1 {
            return writes
                .iter()
                .try_for_each(|&(offset, buf)| self.write_at(buf, offset));
        }
        let next = std::sync::atomic::AtomicUsize::new(0);
        let failed = Mutex::new(None);
        let work = || loop {
            let index = next.fetch_add(1, Ordering::Relaxed);
            let Some(&(offset, buf)) = writes.get(index) else {
                return;
            };
            if let Err(e) = self.write_at(buf, offset) {
                // Stop every thread at its next write.
                next.store(writes.len(), Ordering::Relaxed);
                failed
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .get_or_insert(e);
                return;
            }
        };
        std::thread::scope(|scope| {
            // Helpers take what they can; this thread works too, so a batch
            // is written even when no thread can be started.
            for _ in 1..threads {
                if std::thread::Builder::new()
                    .spawn_scoped(scope, work)
                    .is_err()
                {
                    break;
                }
            }
            work();
        });
        match failed.into_inner().unwrap_or_else(PoisonError::into_inner) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// A range of at least [`ZERO_RANGE_MIN`] bytes, aligned to 4 KiB, is
    /// zeroed with `fallocate(FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE)`:
    /// a regular file's extents become unwritten (they read as zeros and
    /// stay where they were, so a home stays contiguous), and a block
    /// device zeroes the range itself (`blkdev_issue_zeroout`, offloaded
    /// where the device can), without the bytes crossing the page cache.
    /// Like a write, it is durable at the next `fdatasync`. Smaller ranges
    /// (where splitting a file's extents would cost more than the write),
    /// and filesystems or devices that cannot, get zeros written.
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        // Before `fallocate`, which would zero past the end silently.
        check_span(offset, len, self.size())?;
        if len >= ZERO_RANGE_MIN && offset.is_multiple_of(4096) && len.is_multiple_of(4096) {
            let mode =
                rustix::fs::FallocateFlags::ZERO_RANGE | rustix::fs::FallocateFlags::KEEP_SIZE;
            match rustix::fs::fallocate(&self.file, mode, offset, len) {
                Ok(()) => return Ok(()),
                // Not on this filesystem or device: write them.
                Err(e)
                    if e == rustix::io::Errno::OPNOTSUPP
                        || e == rustix::io::Errno::NOSYS
                        || e == rustix::io::Errno::INVAL => {}
                Err(e) => return Err(e.into()),
            }
        }
        crate::write_zeroes_by_writing(self, offset, len)
    }

    /// Through the page cache only: with direct I/O every write into a
    /// hole allocates blocks at once, one extent per piece, and 4 KiB
    /// pieces left between holes made first writes into a fresh volume 17 %
    /// slower than chunks written whole (10.6K against 12.7K IOPS;
    /// PERFORMANCE.md § 18, "First writes into holes"), where delayed
    /// allocation through the cache makes them 15-20 % faster.
    ///
    /// `lseek(SEEK_DATA)`: the range is a hole of the file if the next
    /// data at or after `offset` starts at or past its end (or there is
    /// none). A file system counts the pages written but not yet allocated
    /// (delayed allocation) and unwritten extents with cached data as data;
    /// one that cannot tell holes reports everything before the end of
    /// file as data, and a block device does, so the answer errs towards
    /// false. The engine asks only about chunks it just allocated, whose
    /// earlier contents, if any, the commit that freed them made durable
    /// (a freed chunk is handed out again only after that commit): settled
    /// extents, the simplest case of a file system's `SEEK_DATA`. A file system that still called written bytes a hole
    /// would have them read as checksum errors, and after an unclean
    /// shutdown, in a region the intent set lists (whose sums are taken
    /// again from the device), as those old bytes (docs/RELIABILITY.md
    /// § 3).
    fn hole(&self, offset: u64, len: u64) -> io::Result<bool> {
        let end = check_span(offset, len, self.size())?;
        if self.direct.is_some() {
            return Ok(false);
        }
        if len == 0 {
            return Ok(true);
        }
        match rustix::fs::seek(&self.file, rustix::fs::SeekFrom::Data(offset)) {
            Ok(data) => Ok(data >= end),
            // No data at or after `offset` (inside the file: checked above).
            Err(rustix::io::Errno::NXIO) => Ok(true),
            // Not supported here: assume data.
            Err(_) => Ok(false),
        }
    }

    fn flush(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn size(&self) -> u64 {
        self.size.load(Ordering::Acquire)
    }

    fn current_size(&self) -> io::Result<u64> {
        // seek(End) gives a block device's size too; the shared offset it
        // moves is not used (all I/O is positional).
        (&self.file).seek(SeekFrom::End(0))
    }

    fn refresh_size(&self) -> io::Result<u64> {
        let now = self.current_size()?;
        let known = self.size();
        if now < known {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("the device shrank from {known} to {now} bytes"),
            ));
        }
        if let Some(direct) = &self.direct {
            direct.check_size(now)?;
        }
        let before = self.size.fetch_max(now, Ordering::AcqRel);
        if let (Some(ahead), true) = (&self.ahead, now > before) {
            // Grown by `extend` or from outside.
            ahead.grown_from(before);
        }
        Ok(now)
    }

    fn extend(&self, size: u64) -> io::Result<()> {
        if !self.file.metadata()?.file_type().is_file() {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "not a regular file: enlarge the block device with its own tools (lvextend, ...), then grow the pool to it",
            ));
        }
        if let Some(direct) = &self.direct {
            direct.check_size(size)?;
        }
        if size > self.refresh_size()? {
            self.file.set_len(size)?;
        }
        self.refresh_size().map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_bounds() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dev");
        let dev = FileDevice::create_file(&path, 8192).unwrap();
        dev.write_at(&[7u8; 512], 4096).unwrap();
        dev.flush().unwrap();
        let reopened = FileDevice::open(&path).unwrap();
        assert_eq!(reopened.size(), 8192);
        let mut buf = [0u8; 512];
        reopened.read_at(&mut buf, 4096).unwrap();
        assert_eq!(buf, [7u8; 512]);
        assert!(reopened.read_at(&mut buf, 8000).is_err());
        assert!(reopened.write_at(&buf, u64::MAX - 10).is_err());
    }

    /// `hole` never calls a range with data in it a hole: not bytes
    /// written and still in the page cache only (a file system's delayed
    /// allocation), nor flushed ones, nor a range that only touches them;
    /// and a range it calls a hole reads as zeros. Through the page cache,
    /// on a file system that reports holes (ext4 here), the untouched
    /// parts of a new sparse file are holes; with direct I/O nothing is.
    #[test]
    fn hole_never_hides_written_bytes() {
        for mode in [CacheMode::Buffered, CacheMode::Direct] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("dev");
            let size = 64 << 20;
            let dev = FileDevice::create_file_with(&path, size, mode).unwrap();
            let hole = 32 << 20;
            let holes_reported = dev.hole(hole, 16384).unwrap();
            assert!(
                mode == CacheMode::Buffered || !holes_reported,
                "none with direct I/O"
            );
            let block = vec![5u8; 4096];
            for (at, flush) in [(1 << 20, false), (2 << 20, true), ((3 << 20) + 8192, false)] {
                dev.write_at(&block, at).unwrap();
                if flush {
                    dev.flush().unwrap();
                }
                for (start, len) in [
                    (at, 4096),
                    (at - 8192, 16384),
                    (at - 4096, 8192),
                    (at + 4095, 1),
                ] {
                    assert!(
                        !dev.hole(start, len).unwrap(),
                        "{mode:?}: [{start}, +{len}) holds the block written at {at}"
                    );
                }
                if holes_reported {
                    assert!(
                        dev.hole(at + 4096, 4096).unwrap(),
                        "{mode:?}: after the block"
                    );
                }
            }
            let mut buf = vec![1u8; 16384];
            if dev.hole(hole, 16384).unwrap() {
                dev.read_at(&mut buf, hole).unwrap();
                assert!(buf.iter().all(|&b| b == 0));
            }
            assert!(dev.hole(size - 4096, 8192).is_err(), "past the end");
        }
    }

    /// Bytes of the file system's space a file takes (`st_blocks`).
    fn allocated(path: &Path) -> u64 {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(path).unwrap().blocks() * 512
    }

    /// With direct I/O on a regular file, allocating ahead takes the whole
    /// granule around each write from the file system, by `write_at` and
    /// by a batch, after a grow and in a last granule cut short by the
    /// end, and keeps the file's size; through the page cache it is off.
    /// Either way every byte reads back as written, zeros elsewhere.
    #[test]
    fn allocating_ahead_takes_the_granule_around_each_write_and_changes_no_byte() {
        const G: u64 = AHEAD_GRANULE;
        for mode in [CacheMode::Buffered, CacheMode::Direct] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("dev");
            let size = 4 * G + G / 2;
            let mut dev = FileDevice::create_file_with(&path, size, mode).unwrap();
            assert_eq!(dev.allocate_ahead(), mode == CacheMode::Direct);
            // The file grows twice by a granule.
            let mut expected = vec![0u8; (size + 2 * G) as usize];
            let mut write = |dev: &FileDevice, at: u64, batch: bool| {
                let block: Vec<u8> = (0..4096).map(|i| (at / 4096 + i) as u8 | 1).collect();
                if batch {
                    dev.write_batch(&[(at, &block), (at + G / 2, &block)])
                        .unwrap();
                    expected[(at + G / 2) as usize..][..4096].copy_from_slice(&block);
                } else {
                    dev.write_at(&block, at).unwrap();
                }
                expected[at as usize..][..4096].copy_from_slice(&block);
            };
            write(&dev, G + 4096, false); // granule 1
            write(&dev, 2 * G, true); // granule 2, twice
            write(&dev, size - 4096, false); // granule 4, half of one
            let taken = allocated(&path);
            if mode == CacheMode::Direct {
                assert!(
                    (2 * G + G / 2..3 * G).contains(&taken),
                    "granules 1, 2 and the last half one: {taken} bytes"
                );
            } else {
                assert!(taken < G / 4, "buffered: only what was written, {taken}");
            }
            dev.extend(size + G).unwrap();
            write(&dev, size + G / 2, false); // granule 5, cut short now
            write(&dev, size + 4096, false); // granule 4's other half
            assert_eq!(dev.current_size().unwrap(), size + G, "{mode:?}: size kept");
            if mode == CacheMode::Direct {
                let taken = allocated(&path);
                assert!(
                    (3 * G + G / 2..4 * G).contains(&taken),
                    "granule 4 whole after the grow, and half of 5: {taken} bytes"
                );
            }
            // Grown from outside, then seen by `refresh_size`.
            let size = size + G;
            std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .unwrap()
                .set_len(size + G)
                .unwrap();
            assert_eq!(dev.refresh_size().unwrap(), size + G);
            write(&dev, size + 4096, false); // granule 5's other half
            if mode == CacheMode::Direct {
                let taken = allocated(&path);
                assert!(
                    (4 * G..4 * G + G / 2).contains(&taken),
                    "granule 5 whole after the file grew from outside: {taken} bytes"
                );
            }
            let mut back = vec![1u8; expected.len()];
            dev.read_at(&mut back, 0).unwrap();
            assert!(back == expected, "{mode:?}: bytes differ");
        }
    }

    /// Zeroing reads back as zeros exactly over its range, whether the
    /// range is large and aligned (`fallocate` where the filesystem has
    /// it) or not (written zeros), buffered or direct, and survives a
    /// flush and a reopen; ranges beyond the end are refused.
    #[test]
    fn zeroed_ranges_read_as_zeros_and_nothing_else_changes() {
        for mode in [CacheMode::Buffered, CacheMode::Direct] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("dev");
            let size = 8 << 20;
            let dev = FileDevice::create_file_with(&path, size, mode).unwrap();
            let pattern: Vec<u8> = (0..size).map(|i| (i % 251) as u8 + 1).collect();
            dev.write_at(&pattern, 0).unwrap();
            let mut expected = pattern.clone();
            let ranges = [
                (1 << 20, 3 << 20),         // large and aligned
                (4096, 8192),               // small
                (5 << 20, (1 << 20) + 512), // large, not a multiple of 4 KiB
                (7 << 20, 1 << 20),         // up to the end
            ];
            for (offset, len) in ranges {
                dev.write_zeroes(offset, len).unwrap();
                expected[offset as usize..(offset + len) as usize].fill(0);
            }
            assert!(dev.write_zeroes(size - 4096, 8192).is_err());
            assert!(dev.write_zeroes(u64::MAX - 10, 1 << 20).is_err());
            let mut back = vec![0u8; size as usize];
            dev.read_at(&mut back, 0).unwrap();
            assert!(back == expected, "{mode:?}: zeroed ranges differ");
            dev.flush().unwrap();
            drop(dev);
            let reopened = FileDevice::open_with(&path, mode).unwrap();
            reopened.read_at(&mut back, 0).unwrap();
            assert!(back == expected, "{mode:?}: after reopening");
        }
    }

    /// Opens a direct-I/O device of `size` bytes in a new directory.
    fn direct_device(size: u64) -> (tempfile::TempDir, std::path::PathBuf, FileDevice) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dev");
        let dev = FileDevice::create_file_with(&path, size, CacheMode::Direct).unwrap();
        (dir, path, dev)
    }

    /// Direct writes go out from buffers aligned to the file system's
    /// block, not only to what the kernel requires (see `write_mem_align`).
    #[test]
    fn direct_buffers_are_aligned_to_the_file_system_block() {
        let (_dir, _path, dev) = direct_device(1 << 16);
        let block = rustix::fs::fstat(&dev.file).unwrap().st_blksize as usize;
        let direct = dev.direct.as_ref().unwrap();
        assert!(direct.mem_align >= block && direct.mem_align.is_power_of_two());
        let misaligned = vec![3u8; 8192 + 512];
        let start = misaligned.as_ptr().align_offset(block) + 512;
        assert!(!direct.mem_aligned(&misaligned[start..start + 4096]));
        dev.write_at(&misaligned[start..start + 4096], 4096)
            .unwrap();
        let mut back = vec![0u8; 4096];
        dev.read_at(&mut back, 4096).unwrap();
        assert!(back.iter().all(|&b| b == 3));
    }

    /// `write_durable_at` writes what it is given through the page cache
    /// and with direct I/O, from aligned and unaligned memory, at aligned
    /// and unaligned offsets (the last by writing and flushing), and
    /// refuses a range past the end.
    #[test]
    fn durable_writes_land_in_every_mode() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("buffered");
        std::fs::File::create(&path)
            .unwrap()
            .set_len(1 << 16)
            .unwrap();
        let buffered = FileDevice::open(&path).unwrap();
        let (_dir, _path, direct) = direct_device(1 << 16);
        let unaligned = vec![7u8; 8192 + 512];
        let start = unaligned.as_ptr().align_offset(4096) + 512;
        for dev in [&buffered, &direct] {
            dev.write_durable_at(&[5u8; 4096], 8192).unwrap();
            dev.write_durable_at(&unaligned[start..start + 4096], 16384)
                .unwrap();
            dev.write_durable_at(&[9u8; 100], 20480 + 3).unwrap();
            let mut back = vec![0u8; 16384];
            dev.read_at(&mut back, 8192).unwrap();
            assert!(back[..4096].iter().all(|&b| b == 5));
            assert!(back[8192..12288].iter().all(|&b| b == 7));
            assert!(back[12288..12291].iter().all(|&b| b == 0));
            assert!(back[12291..12391].iter().all(|&b| b == 9));
            assert!(back[12391..].iter().all(|&b| b == 0));
            assert!(dev.write_durable_at(&[1u8; 4096], (1 << 16) - 512).is_err());
        }
    }

    #[test]
    fn direct_mode_really_opens_with_o_direct() {
        let (_dir, path, dev) = direct_device(1 << 16);
        assert_eq!(dev.cache_mode(), CacheMode::Direct);
        let flags = rustix::fs::fcntl_getfl(&dev.file).unwrap();
        assert!(flags.contains(OFlags::DIRECT));
        let reopened = FileDevice::open_with(&path, CacheMode::Direct).unwrap();
        assert!(rustix::fs::fcntl_getfl(&reopened.file)
            .unwrap()
            .contains(OFlags::DIRECT));
        let buffered = FileDevice::open(&path).unwrap();
        assert_eq!(buffered.cache_mode(), CacheMode::Buffered);
        assert!(!rustix::fs::fcntl_getfl(&buffered.file)
            .unwrap()
            .contains(OFlags::DIRECT));
    }

    /// Through the page cache, `read_uncached` reads aligned ranges with
    /// `O_DIRECT` through a second handle and still sees every write that
    /// returned, none of them flushed or written back; other ranges, and
    /// ranges out of the device, behave as `read_at`'s.
    #[test]
    fn uncached_reads_of_a_buffered_device_see_every_write() {
        use rand::{Rng, SeedableRng};
        const SIZE: usize = 4 << 20;
        let dir = tempfile::tempdir().unwrap();
        let dev = FileDevice::create_file(&dir.path().join("dev"), SIZE as u64).unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(9);
        let mut model = vec![0u8; SIZE];
        let mut big = crate::LargeBuffer::new(SIZE).unwrap();
        for round in 0..40 {
            let len = rng.gen_range(1..70_000usize);
            let at = rng.gen_range(0..SIZE - len);
            let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
            dev.write_at(&data, at as u64).unwrap();
            model[at..at + len].copy_from_slice(&data);
            // Aligned: the direct handle; a whole read of the device too.
            let (start, n) = (rng.gen_range(0..SIZE / 4096) * 4096, 64 << 10);
            let n = n.min(SIZE - start);
            dev.read_uncached(&mut big[..n], start as u64).unwrap();
            assert!(
                big[..n] == model[start..start + n],
                "round {round}: aligned"
            );
            // Unaligned offset and memory: through the cache.
            let mut odd = vec![0u8; 1000];
            dev.read_uncached(&mut odd, at as u64 + 1)
                .unwrap_or_else(|_| {
                    assert!(at + 1 + 1000 > SIZE);
                });
            if at + 1001 <= SIZE {
                assert!(
                    odd[..] == model[at + 1..at + 1001],
                    "round {round}: unaligned"
                );
            }
        }
        dev.read_uncached(&mut big[..], 0).unwrap();
        assert!(big[..] == model[..], "the whole device");
        let (file, _) = dev.uncached.get().unwrap().as_ref().unwrap();
        assert!(rustix::fs::fcntl_getfl(file)
            .unwrap()
            .contains(OFlags::DIRECT));
        assert!(dev.read_uncached(&mut big[..4096], SIZE as u64).is_err());
    }

    /// Through the page cache, `write_uncached` (`RWF_DONTCACHE`) mixed
    /// with cached writes and reads of any offset, length and memory
    /// alignment is seen by every later read: through the cache,
    /// uncached, and from a new handle after `flush`; and what it wrote
    /// leaves the cache once flushed, where `write_at`'s stays. Ranges out
    /// of the device fail.
    #[test]
    fn uncached_writes_of_a_buffered_device_are_seen_by_every_read() {
        use rand::{Rng, SeedableRng};
        const SIZE: usize = 16 << 20;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dev");
        let dev = FileDevice::create_file(&path, SIZE as u64).unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let mut model = vec![0u8; SIZE];
        let mut big = crate::LargeBuffer::new(SIZE).unwrap();
        for round in 0..60 {
            // A cached write (dirty pages), a cached read near it (clean
            // pages), then an uncached write over both.
            let len = rng.gen_range(1..70_000usize);
            let at = rng.gen_range(0..SIZE / 2 - len);
            let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
            dev.write_at(&data, at as u64).unwrap();
            model[at..at + len].copy_from_slice(&data);
            let mut seen = vec![0u8; 8192];
            dev.read_at(&mut seen, at.min(SIZE - 8192) as u64).unwrap();
            let n = rng.gen_range(1..70_000usize);
            let start = if round % 2 == 0 {
                at.saturating_sub(n / 2)
            } else {
                rng.gen_range(0..SIZE / 2 - n)
            };
            let mut data = vec![0u8; n + 1];
            rng.fill(&mut data[..]);
            let data = &data[round % 2..round % 2 + n];
            dev.write_uncached(data, start as u64).unwrap();
            model[start..start + n].copy_from_slice(data);
            let mut back = vec![0u8; n];
            dev.read_at(&mut back, start as u64).unwrap();
            assert!(
                back[..] == model[start..start + n],
                "round {round}: cached read"
            );
            let a = start / 4096 * 4096;
            let m = (n + (start - a)).next_multiple_of(4096);
            dev.read_uncached(&mut big[..m], a as u64).unwrap();
            assert!(big[..m] == model[a..a + m], "round {round}: uncached read");
        }
        dev.flush().unwrap();
        // 4 MiB each way into the untouched half.
        let before = crate::cached_bytes(&path).unwrap();
        let block = vec![0x5au8; 4 << 20];
        dev.write_uncached(&block, (SIZE / 2) as u64).unwrap();
        dev.flush().unwrap();
        let uncached = crate::cached_bytes(&path).unwrap().saturating_sub(before);
        dev.write_at(&block, (SIZE / 2 + (4 << 20)) as u64).unwrap();
        dev.flush().unwrap();
        let cached = crate::cached_bytes(&path).unwrap().saturating_sub(before);
        assert!(
            uncached < 1 << 20,
            "write_uncached left {uncached} bytes cached"
        );
        assert!(
            cached >= 4 << 20,
            "write_at left only {cached} bytes cached"
        );
        model[SIZE / 2..SIZE / 2 + (8 << 20)].fill(0x5a);
        drop(dev);
        let again = FileDevice::open(&path).unwrap();
        again.read_at(&mut big[..], 0).unwrap();
        assert!(big[..] == model[..], "the whole device, opened again");
        assert!(again.write_uncached(&[0u8; 4096], SIZE as u64).is_err());
        assert!(again
            .write_uncached(&[0u8; 8192], SIZE as u64 - 4096)
            .is_err());
        assert!(!again
            .no_dontcache
            .load(std::sync::atomic::Ordering::Relaxed));
    }

    /// Where the filesystem refuses `RWF_DONTCACHE` (tmpfs), `write_uncached`
    /// writes through the cache, now and from then on.
    #[test]
    fn uncached_writes_where_the_filesystem_refuses_them_go_through_the_cache() {
        let Ok(dir) = tempfile::tempdir_in("/dev/shm") else {
            return; // no tmpfs here
        };
        let path = dir.path().join("dev");
        let dev = FileDevice::create_file(&path, 1 << 20).unwrap();
        dev.write_uncached(&[7u8; 10_000], 100).unwrap();
        let mut back = vec![0u8; 10_002];
        dev.read_at(&mut back, 99).unwrap();
        assert!(back[0] == 0 && back[10_001] == 0 && back[1..10_001].iter().all(|&b| b == 7));
        assert!(dev.no_dontcache.load(std::sync::atomic::Ordering::Relaxed));
        dev.write_uncached(&[8u8; 4096], 0).unwrap();
        dev.read_at(&mut back[..4096], 0).unwrap();
        assert!(back[..4096].iter().all(|&b| b == 8));
    }

    /// Random reads and writes of any offset, length and memory alignment
    /// give what a byte array gives, and what a buffered reader of the same
    /// file sees.
    #[test]
    fn direct_io_of_any_alignment_matches_a_byte_array() {
        use rand::{Rng, SeedableRng};
        const SIZE: usize = 1 << 16;
        let (_dir, path, dev) = direct_device(SIZE as u64);
        let mut model = vec![0u8; SIZE];
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        // Spare room in front so that a slice can start at any address.
        let mut scratch = vec![0u8; SIZE + 64];
        for round in 0..2000 {
            let len = match rng.gen_range(0..4) {
                0 => rng.gen_range(1..16),
                1 => rng.gen_range(1..600),
                2 => 4096 * rng.gen_range(1..4),
                _ => rng.gen_range(1..3 * 4096),
            };
            let offset = match rng.gen_range(0..3) {
                0 => rng.gen_range(0..=SIZE - len) as u64,
                _ => (rng.gen_range(0..=(SIZE - len) / 512) * 512) as u64,
            };
            let shift = rng.gen_range(0..64);
            let window = &mut scratch[shift..shift + len];
            let at = offset as usize;
            if rng.gen_bool(0.5) {
                rng.fill(&mut window[..]);
                dev.write_at(window, offset).unwrap();
                model[at..at + len].copy_from_slice(window);
            } else {
                dev.read_at(window, offset).unwrap();
                assert_eq!(
                    &window[..],
                    &model[at..at + len],
                    "round {round}: {len} bytes at {offset}"
                );
            }
        }
        dev.flush().unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), model);
    }

    /// Unaligned writes to different bytes of the same sectors, from many
    /// threads at once, all land (the edge read-modify-writes are serialised).
    #[test]
    fn concurrent_unaligned_writes_to_one_sector_all_land() {
        let (_dir, path, dev) = direct_device(1 << 16);
        let dev = std::sync::Arc::new(dev);
        let threads: Vec<_> = (0..8u8)
            .map(|t| {
                let dev = std::sync::Arc::clone(&dev);
                std::thread::spawn(move || {
                    for round in 0..200u64 {
                        // Thread t owns bytes t, t+8, t+16, ... of the first
                        // two kilobytes (sectors 0..4), and of 4096.. too.
                        let byte = u64::from(t) + 8 * (round % 256);
                        let base = if round % 2 == 0 { 0 } else { 4096 };
                        dev.write_at(&[t + 1], base + byte).unwrap();
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        let data = std::fs::read(&path).unwrap();
        for base in [0usize, 4096] {
            for byte in 0..2048 {
                let t = byte % 8;
                let written = (0..200u64).any(|round| {
                    round % 2 == u64::from(base != 0) && t as u64 + 8 * (round % 256) == byte as u64
                });
                let want = if written { t as u8 + 1 } else { 0 };
                assert_eq!(data[base + byte], want, "byte {byte} of {base}");
            }
        }
    }

    #[test]
    fn a_batch_lands_whole_in_both_modes() {
        let modes = [
            (CacheMode::Buffered, Batches::Threads),
            (CacheMode::Direct, Batches::Threads),
            (CacheMode::Direct, Batches::IoUring),
        ];
        for (mode, batches) in modes {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("dev");
            let mut dev = FileDevice::create_file_with(&path, 4 << 20, mode).unwrap();
            dev.set_batches(batches);
            if mode == CacheMode::Direct {
                // The ring must really be in use where asked for: a kernel
                // that refuses one would leave this test on threads.
                assert_eq!(dev.batches(), batches, "io_uring refused here");
            }
            // More writes than the ring holds at once: every other block,
            // some of two blocks.
            let blocks: Vec<Vec<u8>> = (0..200u32)
                .map(|i| vec![(i % 251) as u8 + 1; if i % 7 == 0 { 8192 } else { 4096 }])
                .collect();
            let mut writes: Vec<(u64, &[u8])> = blocks
                .iter()
                .enumerate()
                .map(|(i, b)| (i as u64 * 16384, &b[..]))
                .collect();
            // Memory one byte off any alignment, and an unaligned offset.
            let odd = vec![0xabu8; 4097];
            writes.push((16384 * 200, &odd[1..]));
            writes.push((16384 * 201 + 3, &blocks[0][..10]));
            dev.write_batch(&writes).unwrap();
            let data = std::fs::read(&path).unwrap();
            for (i, block) in blocks.iter().enumerate() {
                let at = i * 16384;
                assert_eq!(
                    &data[at..at + block.len()],
                    &block[..],
                    "{mode:?} {batches:?} write {i}"
                );
                assert!(data[at + block.len()..at + 16384].iter().all(|&b| b == 0));
            }
            assert!(data[16384 * 200..16384 * 200 + 4096]
                .iter()
                .all(|&b| b == 0xab));
            assert_eq!(&data[16384 * 201 + 3..16384 * 201 + 13], &blocks[0][..10]);
            // A write beyond the end fails the batch.
            let beyond = [(0, &blocks[1][..]), (4u64 << 20, &blocks[0][..])];
            assert!(dev.write_batch(&beyond).is_err());
        }
    }

    #[test]
    fn a_read_batch_reads_what_read_at_reads_in_every_mode() {
        let modes = [
            (CacheMode::Buffered, Batches::Threads),
            (CacheMode::Direct, Batches::Threads),
            (CacheMode::Direct, Batches::IoUring),
        ];
        let image: Vec<u8> = (0..4u32 << 20).map(|i| (i * 7 % 251) as u8).collect();
        for (mode, batches) in modes {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("dev");
            std::fs::write(&path, &image).unwrap();
            let mut dev = FileDevice::open_with(&path, mode).unwrap();
            dev.set_batches(batches);
            // More reads than the ring holds at once, of one and two
            // blocks, scattered; then one into memory one byte off any
            // alignment, and one at an unaligned offset.
            let mut spans: Vec<(u64, usize)> = (0..150u64)
                .map(|i| ((i * 37 % 250) * 16384, if i % 5 == 0 { 8192 } else { 4096 }))
                .collect();
            spans.push((4096 * 3, 4096));
            spans.push((12345, 100));
            let mut bufs: Vec<Vec<u8>> = spans.iter().map(|&(_, len)| vec![0u8; len + 1]).collect();
            let mut reads: Vec<(u64, &mut [u8])> = bufs
                .iter_mut()
                .zip(&spans)
                .enumerate()
                .map(|(i, (b, &(at, len)))| {
                    let skip = usize::from(i == 150);
                    (at, &mut b[skip..skip + len])
                })
                .collect();
            dev.read_batch(&mut reads).unwrap();
            for (i, (at, buf)) in reads.iter().enumerate() {
                let at = *at as usize;
                assert!(
                    buf[..] == image[at..at + buf.len()],
                    "{mode:?} {batches:?} read {i}"
                );
            }
            // A read beyond the end fails the batch.
            let mut a = vec![0u8; 4096];
            let mut b = vec![0u8; 4096];
            let mut beyond = [(0, &mut a[..]), (4u64 << 20, &mut b[..])];
            assert!(dev.read_batch(&mut beyond).is_err());
        }
    }

    /// Each thread batches through a ring of its own: batches on several
    /// threads at once (NBD requests served together) all land and read
    /// back.
    #[test]
    fn batches_on_several_threads_at_once_each_land_whole() {
        let (_dir, _path, dev) = direct_device(8 << 20);
        assert_eq!(dev.batches(), Batches::IoUring, "io_uring refused here");
        std::thread::scope(|scope| {
            for t in 0..4u64 {
                let dev = &dev;
                scope.spawn(move || {
                    for round in 0..20u64 {
                        let blocks: Vec<Vec<u8>> = (0..24u64)
                            .map(|i| vec![(t * 50 + round + i) as u8; 4096])
                            .collect();
                        // Thread t's blocks: every fourth block from t.
                        let at = |i: usize| (i as u64 * 4 + t) * 4096 * 4;
                        let writes: Vec<(u64, &[u8])> = blocks
                            .iter()
                            .enumerate()
                            .map(|(i, b)| (at(i), &b[..]))
                            .collect();
                        dev.write_batch(&writes).unwrap();
                        let mut back = vec![vec![0u8; 4096]; blocks.len()];
                        let mut reads: Vec<(u64, &mut [u8])> = back
                            .iter_mut()
                            .enumerate()
                            .map(|(i, b)| (at(i), &mut b[..]))
                            .collect();
                        dev.read_batch(&mut reads).unwrap();
                        assert!(back == blocks, "thread {t} round {round}");
                    }
                });
            }
        });
    }

    #[test]
    fn direct_mode_refuses_a_size_it_cannot_reach() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dev");
        std::fs::write(&path, vec![0u8; 4096 + 100]).unwrap();
        let error = FileDevice::open_with(&path, CacheMode::Direct).unwrap_err();
        assert!(error.to_string().contains("not a multiple"), "{error}");
        let dev = FileDevice::create_file_with(&path, 8192, CacheMode::Direct).unwrap();
        assert!(dev.extend(8192 + 100).is_err());
        assert_eq!(dev.size(), 8192);
    }

    #[test]
    fn a_file_grows_and_never_shrinks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dev");
        let dev = FileDevice::create_file(&path, 8192).unwrap();
        dev.extend(16384).unwrap();
        assert_eq!(dev.size(), 16384);
        dev.write_at(&[1u8; 512], 12288).unwrap();
        // Enlarged from outside.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(20480)
            .unwrap();
        assert_eq!(dev.size(), 16384);
        assert_eq!(dev.refresh_size().unwrap(), 20480);
        dev.extend(4096).unwrap();
        assert_eq!(dev.size(), 20480, "extend never shrinks");
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(4096)
            .unwrap();
        assert!(dev.refresh_size().is_err(), "a shrunk device is an error");
    }
}
