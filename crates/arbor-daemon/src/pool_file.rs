//! Opening a pool file or device for exclusive use by this process.
//!
//! The engine assumes it is the only writer of its device, so every arbor
//! process (the daemon and each offline command) takes an advisory `flock`
//! on the pool before touching it and holds it until the pool is closed.

use std::fs::{File, TryLockError};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{Context, Result};
use arbor_engine::{CreateOptions, GrowOptions, OpenOptions, Pool};
use arbor_format::{FormatError, Superblock, BLOCK_SIZE, SUPERBLOCK_SLOTS};
use arbor_io::{CacheMode, FileDevice};

use crate::error::DaemonError;
use arbor_api::model::{GrowView, UpgradeView};
use arbor_api::size::ByteSize;

/// How a process reaches its pool's file or device (`io` in the daemon's
/// configuration). docs/PERFORMANCE.md § 10 has the measurements behind
/// `auto`'s choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IoMode {
    /// Direct I/O on a block device, buffered on a regular file.
    #[default]
    Auto,
    Fixed(CacheMode),
}

impl IoMode {
    /// `auto`, `direct` or `buffered`.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "auto" => Some(Self::Auto),
            "direct" => Some(Self::Fixed(CacheMode::Direct)),
            "buffered" => Some(Self::Fixed(CacheMode::Buffered)),
            _ => None,
        }
    }

    /// The cache mode `auto` picks for `path` (a pool being created is a
    /// regular file): direct I/O on block devices, where the page cache
    /// only doubles the memory a guest already caches in and makes every
    /// commit wait for writeback of unrelated data; buffered on files.
    fn choose(self, path: &Path) -> CacheMode {
        match self {
            Self::Fixed(mode) => mode,
            Self::Auto => match FileDevice::is_block_device(path) {
                Ok(true) => CacheMode::Direct,
                _ => CacheMode::Buffered,
            },
        }
    }

    /// [`Self::open`] for a pool's own file or device: with direct I/O on
    /// a regular file, its space allocated ahead of the writes
    /// ([`FileDevice::allocate_ahead`]).
    pub fn open_pool(self, path: &Path) -> Result<FileDevice> {
        let mut device = self.open(path)?;
        device.allocate_ahead();
        Ok(device)
    }

    /// Opens `path` in the mode this asks for. `auto` falls back to
    /// buffered I/O where direct I/O is not possible (a filesystem without
    /// `O_DIRECT`); an explicit `direct` fails instead.
    pub fn open(self, path: &Path) -> Result<FileDevice> {
        let mode = self.choose(path);
        let opened = FileDevice::open_with(path, mode);
        let device = match opened {
            Err(e) if self == Self::Auto && mode == CacheMode::Direct => {
                tracing::warn!(path = %path.display(), error = %e, "direct I/O is not possible here: using buffered I/O");
                FileDevice::open(path)
            }
            other => other,
        };
        device.with_context(|| format!("cannot open {} ({} I/O)", path.display(), mode.name()))
    }
}

/// An exclusive advisory lock on a pool, released when dropped.
#[derive(Debug)]
pub struct PoolLock {
    _file: File,
}

impl PoolLock {
    /// Takes the lock without waiting: a pool held by another process is an
    /// error, not something to queue behind.
    pub fn acquire(path: &Path) -> Result<Self> {
        let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
        match file.try_lock() {
            Ok(()) => Ok(Self { _file: file }),
            Err(TryLockError::WouldBlock) => Err(DaemonError::PoolInUse(format!(
                "pool {} is in use by another arbor process (a running daemon?); \
                     manage it through that daemon, or stop it first",
                path.display()
            ))),
            Err(TryLockError::Error(e)) => {
                Err(e).with_context(|| format!("cannot lock {}", path.display()))
            }
        }
    }
}

/// A pool opened by this process, with the lock that makes it ours.
pub struct OpenPool {
    pub path: PathBuf,
    pub pool: Arc<Pool>,
    /// How the pool's device is reached.
    pub cache_mode: CacheMode,
    // Declared after `pool` so it is released only once the pool is closed.
    _lock: PoolLock,
}

impl OpenPool {
    pub fn open(path: &Path, options: &OpenOptions, io: IoMode) -> Result<Self> {
        let lock = PoolLock::acquire(path)?;
        let device = io.open_pool(path)?;
        let cache_mode = device.cache_mode();
        let pool = Pool::open(Arc::new(device), options)
            .with_context(|| format!("cannot open pool {}", path.display()))?;
        Ok(Self::new(path, pool, cache_mode, lock))
    }

    /// Formats `path` as a new pool. `size` is required for a regular file
    /// (created sparse if missing) and taken from the device otherwise.
    pub fn create(
        path: &Path,
        size: Option<u64>,
        create: &CreateOptions,
        open: &OpenOptions,
        io: IoMode,
        force: bool,
    ) -> Result<Self> {
        let existed = path.exists();
        if !existed {
            File::create_new(path).with_context(|| format!("cannot create {}", path.display()))?;
        }
        let created = Self::format(path, size, create, open, io, existed && !force);
        if created.is_err() && !existed {
            // Leave nothing behind: a half-formatted file would later be
            // refused as "already contains a pool".
            let _ = std::fs::remove_file(path);
        }
        created
    }

    fn format(
        path: &Path,
        size: Option<u64>,
        create: &CreateOptions,
        open: &OpenOptions,
        io: IoMode,
        must_be_blank: bool,
    ) -> Result<Self> {
        let lock = PoolLock::acquire(path)?;
        if must_be_blank {
            refuse_to_overwrite(path)?;
        }
        size_for_format(path, size)?;
        let device = io.open_pool(path)?;
        let cache_mode = device.cache_mode();
        let pool = Pool::create(Arc::new(device), create, open)
            .with_context(|| format!("cannot create a pool on {}", path.display()))?;
        Ok(Self::new(path, pool, cache_mode, lock))
    }

    fn new(path: &Path, pool: Pool, cache_mode: CacheMode, lock: PoolLock) -> Self {
        Self {
            path: path.to_owned(),
            pool: Arc::new(pool),
            cache_mode,
            _lock: lock,
        }
    }

    /// Commits and closes the pool, reporting a failed final commit (which
    /// a plain drop could only log).
    pub fn close(self) -> Result<()> {
        let OpenPool {
            path,
            pool,
            _lock: lock,
            ..
        } = self;
        let closed = match Arc::try_unwrap(pool) {
            Ok(pool) => pool.close(),
            Err(shared) => {
                // Something still holds the pool (a task that outlived
                // shutdown): commit now, and keep the lock until the process
                // exits so no other process opens the pool under it.
                std::mem::forget(lock);
                shared.flush()
            }
        };
        closed.with_context(|| format!("cannot commit pool {}", path.display()))
    }
}

/// Repairs the pool at `path` offline (see [`arbor_engine::repair`]) under
/// the pool lock, so no daemon can have it open meanwhile; returns one line
/// per change made.
pub fn repair(path: &Path, options: &OpenOptions) -> Result<Vec<String>> {
    let _lock = PoolLock::acquire(path)?;
    let device =
        FileDevice::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let report = arbor_engine::repair(Arc::new(device), options)
        .with_context(|| format!("cannot repair pool {}", path.display()))?;
    Ok(report.actions)
}

/// Grows `pool`, whose file or device is `path` (see [`Pool::grow`]), for
/// the daemon and the offline command alike. Engine errors pass through
/// unwrapped, so callers map them to statuses as any other.
pub fn grow(pool: &Pool, path: &Path, options: &GrowOptions) -> Result<GrowView> {
    if let Some(reason) = growth_refusal(pool, path, options)? {
        return Err(arbor_engine::Error::invalid_request(reason).into());
    }
    Ok(crate::views::grow_view(pool.grow(options)?))
}

/// Why a growth cannot happen, for refusals the engine makes too but in
/// its own terms (it cannot name the command that fixes them) or as an I/O
/// error (a size no file can have).
fn growth_refusal(pool: &Pool, path: &Path, options: &GrowOptions) -> Result<Option<String>> {
    let version = pool.format_version();
    if !version.has_grown_regions() {
        return Ok(Some(format!(
            "the pool is format version {version}, which cannot grow: upgrade it first with \
             `arbor pool upgrade` (POST /v1/pool/upgrade); older arbor releases cannot open \
             it then"
        )));
    }
    if let Some(size) = options.size {
        if i64::try_from(size).is_err() {
            return Ok(Some(format!(
                "size {size} is beyond the largest file or device offset ({})",
                i64::MAX
            )));
        }
    } else {
        let device_bytes = device_size(path)?;
        if device_bytes <= pool.pool_stats()?.pool_bytes {
            return Ok(Some(format!(
                "the pool already fills {} ({}): give its new size to enlarge a pool file \
                 (`arbor pool grow --size SIZE`), or enlarge the block device with its own \
                 tools (lvextend, ...) first",
                path.display(),
                ByteSize(device_bytes)
            )));
        }
    }
    Ok(None)
}

/// Converts `pool` to the newest format version (see [`Pool::upgrade`]).
pub fn upgrade(pool: &Pool) -> Result<UpgradeView> {
    let upgraded = pool.upgrade()?;
    Ok(UpgradeView {
        upgraded,
        format_version: pool.format_version().number(),
    })
}

/// The current size of the file or block device at `path`.
fn device_size(path: &Path) -> Result<u64> {
    File::open(path)
        .and_then(|mut file| file.seek(SeekFrom::End(0)))
        .with_context(|| format!("cannot read the size of {}", path.display()))
}

/// Sizes the target for a new pool: a regular file is (re)sized to `size`,
/// a block device is used whole.
fn size_for_format(path: &Path, size: Option<u64>) -> Result<()> {
    let metadata = path
        .metadata()
        .with_context(|| format!("cannot stat {}", path.display()))?;
    if metadata.is_file() {
        let Some(size) = size else {
            return Err(DaemonError::msg(
                "--size is required to create a pool in a regular file",
            ));
        };
        // Whole blocks (the pool uses nothing smaller), so that direct I/O
        // can reach the last one.
        let size = size - size % BLOCK_SIZE as u64;
        FileDevice::create_file(path, size)
            .with_context(|| format!("cannot prepare {}", path.display()))?;
    } else if size.is_some() {
        return Err(DaemonError::msg(
            "--size cannot be used with a device: the pool takes the whole device",
        ));
    }
    Ok(())
}

/// Fails if `path` holds anything: an arbor pool, or any other data.
fn refuse_to_overwrite(path: &Path) -> Result<()> {
    let mut file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let len = file.seek(SeekFrom::End(0))?;
    let mut head = Vec::new();
    file.seek(SeekFrom::Start(0))?;
    file.take(SUPERBLOCK_SLOTS * BLOCK_SIZE as u64)
        .read_to_end(&mut head)
        .with_context(|| format!("cannot read {}", path.display()))?;
    // Anything but "bad magic" is a pool, possibly a damaged one, that
    // deserves the same protection.
    let has_pool = head
        .chunks_exact(BLOCK_SIZE)
        .any(|block| Superblock::decode(block, len).err() != Some(FormatError::BadMagic));
    if has_pool {
        return Err(DaemonError::msg(format!(
            "{} already contains an arbor pool; use --force to destroy it and create a new one",
            path.display()
        )));
    }
    if head.iter().any(|&b| b != 0) {
        return Err(DaemonError::msg(format!(
            "{} already contains data; use --force to overwrite it",
            path.display()
        )));
    }
    Ok(())
}
