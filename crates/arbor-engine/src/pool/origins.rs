//! The pool's copy-on-write origins: the devices its copy-on-write volumes
//! are served from (each with its locks, whether it is due a flush, the
//! chunks written while a new home is copied from it, and whether it
//! shrank), their origin stripes, the lock of homes being built, the
//! sweeps due of their stores, their recorded losses, and the statistics'
//! cache of their copies (`pool/origin.rs` is what the pool does with
//! them). Their locks' place in the lock order is in `pool.rs`.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

use arbor_format::OriginLoss;
use arbor_io::BlockDevice;

use super::gates::{stripe_indices, STRIPES};
use super::{lock_mutex, read_lock, try_read_lock, try_write_lock, write_lock, SoleCopies};
use crate::error::{Error, OriginUnavailable, Result};
use crate::volumes::Volumes;

/// Origin stripe guards (see [`Origins::stripes`]).
pub(super) enum OriginStripes<'a> {
    Read(#[allow(dead_code)] Vec<RwLockReadGuard<'a, ()>>),
    Write(#[allow(dead_code)] Vec<RwLockWriteGuard<'a, ()>>),
}

/// An attached external device, or a home in the pool as one (`in_pool`).
pub(crate) struct OriginDevice {
    dev: Arc<dyn BlockDevice>,
    /// Readers and writers of the volume hold it shared; a rollback holds it
    /// exclusive.
    busy: RwLock<()>,
    /// Reads of the device through an epoch (a snapshot's or clone's, which
    /// hold the pool's I/O gate, so they cannot wait for `busy`) hold it
    /// shared; a new home, once it replaces this device, waits for them
    /// with it exclusive before it returns (an origin's device is then its
    /// caller's to close, and another program's to write).
    epoch_readers: RwLock<()>,
    /// Written since its last flush.
    written: AtomicBool,
    /// While a new home is copied from it: the chunks written since.
    tracked: Mutex<Option<Written>>,
    /// The size its device was seen to have shrunk to (below the size it
    /// was attached at): from then on it serves no I/O, and the pool
    /// records the loss (`origin_loss.rs`).
    shrunk: Mutex<Option<u64>>,
    /// A home in the pool: its first data chunk (its blocks have sums in
    /// a pool with checksums, docs/FORMAT.md §6.4).
    home: Option<u64>,
}

/// The chunks of a device written while a new home is copied from it
/// (`Pool::rehome`), one bit each.
struct Written {
    chunk_size: u64,
    chunks: u64,
    bits: Vec<u64>,
}

impl Written {
    fn new(chunk_size: u64, chunks: u64) -> Self {
        // At most 2^32 chunks (MAX_COW_CHUNKS), so at most 512 MiB of bits,
        // for the largest volume (8 MiB for 1 TiB at 16 KiB chunks), held
        // only while its home is copied.
        let words = usize::try_from(chunks.div_ceil(64)).unwrap_or(usize::MAX);
        Self {
            chunk_size,
            chunks,
            bits: vec![0; words],
        }
    }

    /// Marks the chunks of bytes `[from, to)`.
    fn mark(&mut self, from: u64, to: u64) {
        // Past the tracked chunks (a growth of the device meanwhile, which
        // the copy refuses anyway): nothing to mark.
        let end = to.div_ceil(self.chunk_size).min(self.chunks);
        for chunk in from / self.chunk_size..end {
            if let Some(word) = self.bits.get_mut((chunk / 64) as usize) {
                *word |= 1 << (chunk % 64);
            }
        }
    }

    /// The marked chunks, as runs, clearing them.
    fn take(&mut self) -> Vec<Range<u64>> {
        let mut runs: Vec<Range<u64>> = Vec::new();
        for (i, word) in self.bits.iter_mut().enumerate() {
            let mut bits = std::mem::take(word);
            while bits != 0 {
                let chunk = i as u64 * 64 + u64::from(bits.trailing_zeros());
                bits &= bits - 1;
                match runs.last_mut() {
                    Some(run) if run.end == chunk => run.end += 1,
                    _ => runs.push(chunk..chunk + 1),
                }
            }
        }
        runs
    }
}

/// A copy-on-write volume's home in the pool, as a device: `size` bytes of
/// the pool's device from byte `base`.
struct Window {
    dev: Arc<dyn BlockDevice>,
    base: u64,
    size: u64,
}

impl BlockDevice for Window {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        arbor_io::check_range(offset, buf.len(), self.size)?;
        self.dev.read_at(buf, self.base + offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        arbor_io::check_range(offset, buf.len(), self.size)?;
        self.dev.write_at(buf, self.base + offset)
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> std::io::Result<()> {
        arbor_io::check_span(offset, len, self.size)?;
        self.dev.write_zeroes(self.base + offset, len)
    }

    fn flush(&self) -> std::io::Result<()> {
        self.dev.flush()
    }

    fn size(&self) -> u64 {
        self.size
    }
}

impl OriginDevice {
    pub(super) fn new(dev: Arc<dyn BlockDevice>) -> Arc<Self> {
        Self::with_home(dev, None)
    }

    fn with_home(dev: Arc<dyn BlockDevice>, home: Option<u64>) -> Arc<Self> {
        Arc::new(Self {
            dev,
            busy: RwLock::new(()),
            epoch_readers: RwLock::new(()),
            written: AtomicBool::new(false),
            tracked: Mutex::new(None),
            shrunk: Mutex::new(None),
            home,
        })
    }

    /// `size` bytes of the pool's device `dev` from byte `base`, which is
    /// where data chunk `first` starts: a home in the pool.
    pub(super) fn in_pool(
        dev: Arc<dyn BlockDevice>,
        first: u64,
        base: u64,
        size: u64,
    ) -> Arc<Self> {
        Self::with_home(Arc::new(Window { dev, base, size }), Some(first))
    }

    /// The first data chunk of a home in the pool; None for an external
    /// device.
    pub(super) fn home(&self) -> Option<u64> {
        self.home
    }

    /// The device.
    pub(super) fn dev(&self) -> &dyn BlockDevice {
        self.dev.as_ref()
    }

    /// Held shared by the volume's readers and writers.
    pub(super) fn busy(&self) -> RwLockReadGuard<'_, ()> {
        read_lock(&self.busy)
    }

    /// Held exclusive by a rollback (and whatever replaces the device).
    pub(super) fn busy_exclusive(&self) -> RwLockWriteGuard<'_, ()> {
        write_lock(&self.busy)
    }

    /// Held by a read of the device through an epoch.
    pub(super) fn reading_epoch(&self) -> RwLockReadGuard<'_, ()> {
        read_lock(&self.epoch_readers)
    }

    /// Waits for the reads through an epoch under way.
    pub(super) fn wait_epoch_readers(&self) {
        drop(write_lock(&self.epoch_readers));
    }

    /// Bytes `[from, to)` are about to be written: due a flush, and marked
    /// while tracked.
    pub(super) fn will_write(&self, from: u64, to: u64) {
        self.written.store(true, Ordering::Release);
        if let Some(written) = lock_mutex(&self.tracked).as_mut() {
            written.mark(from, to);
        }
    }

    /// A flush of the device succeeded: no longer due one.
    pub(super) fn flushed(&self) {
        self.written.store(false, Ordering::Release);
    }

    /// Flushes the device if it was written since its last flush; it
    /// stays due if that fails.
    pub(super) fn flush_if_written(&self) -> Result<()> {
        if self.written.swap(false, Ordering::AcqRel) {
            if let Err(e) = self.dev.flush() {
                self.written.store(true, Ordering::Release);
                return Err(OriginUnavailable::FlushFailed(e).into());
            }
            // A flush is acknowledged only if what it made durable is there.
            if let Some(now) = self.check_size() {
                self.written.store(true, Ordering::Release);
                return Err(self.shrunk_error("a copy-on-write volume", now));
            }
        }
        Ok(())
    }

    /// The size the device was seen to have shrunk to, if it was.
    pub(super) fn shrunk(&self) -> Option<u64> {
        *lock_mutex(&self.shrunk)
    }

    /// Looks at the device's size now (one `lseek` on a file or disk; a
    /// home in the pool cannot change): one smaller than it was attached
    /// at fails the device for good. Returns the size it shrank to.
    pub(super) fn check_size(&self) -> Option<u64> {
        if let Some(seen) = self.shrunk() {
            return Some(seen);
        }
        match self.dev.current_size() {
            Ok(now) if now < self.dev.size() => {
                let mut shrunk = lock_mutex(&self.shrunk);
                let seen = shrunk.map_or(now, |before| before.min(now));
                *shrunk = Some(seen);
                Some(seen)
            }
            _ => None,
        }
    }

    /// The error of every request to a device that shrank to `now`.
    pub(super) fn shrunk_error(&self, name: &str, now: u64) -> Error {
        OriginUnavailable::Shrunk {
            name: name.to_owned(),
            was: self.dev.size(),
            now,
        }
        .into()
    }

    /// Tracks the chunks written from now on (see [`Written`]) until the
    /// guard returned goes.
    pub(super) fn track(&self, chunk_size: u64, chunks: u64) -> Tracking<'_> {
        *lock_mutex(&self.tracked) = Some(Written::new(chunk_size, chunks));
        Tracking(self)
    }
}

/// Tracking of a device's writes, ended when dropped.
pub(super) struct Tracking<'a>(&'a OriginDevice);

impl Tracking<'_> {
    /// The chunks written since the last call (or since tracking began).
    pub(super) fn take(&self) -> Vec<Range<u64>> {
        lock_mutex(&self.0.tracked)
            .as_mut()
            .map(Written::take)
            .unwrap_or_default()
    }
}

impl Drop for Tracking<'_> {
    fn drop(&mut self) {
        *lock_mutex(&self.0.tracked) = None;
    }
}

/// The external devices attached to the pool's copy-on-write volumes, and
/// where a sweep of each volume's store goes on.
pub(crate) struct Origins {
    devices: RwLock<HashMap<u64, Arc<OriginDevice>>>,
    /// Volumes whose stores may hold copies no epoch reads, and the key to
    /// sweep them from.
    sweeps: Mutex<HashMap<u64, u64>>,
    /// What each volume whose device shrank lost (its recorded
    /// [`OriginLoss`]), read from the pool once, when it is opened, and kept in step.
    losses: RwLock<HashMap<u64, OriginLoss>>,
    /// Per (copy-on-write volume, chunk), hashed: its writes hold them
    /// exclusive, reads through its epochs shared.
    stripes: Vec<RwLock<()>>,
    /// Held while a home is built in steps (`build_home`); loose homes are
    /// freed only while nobody holds it, so a home being built is never
    /// mistaken for one a failure left (and scrubs give sums only while
    /// nobody holds it exclusive: a home's copy is written without sums).
    homes: RwLock<()>,
    /// For statistics: bytes of the copies only one epoch reads, by
    /// copy-on-write volume and epoch, each as of one state of its store
    /// and epochs ([`VolumeTable::store_version`]), so the statistics of
    /// all of a volume's snapshots walk its store once, not once each.
    sole_copies: Mutex<HashMap<u64, (u64, SoleCopies)>>,
}

impl Default for Origins {
    fn default() -> Self {
        Self {
            devices: RwLock::default(),
            sweeps: Mutex::default(),
            losses: RwLock::default(),
            stripes: (0..STRIPES).map(|_| RwLock::new(())).collect(),
            homes: RwLock::new(()),
            sole_copies: Mutex::default(),
        }
    }
}

impl Origins {
    /// Volume `id`'s device, if it is served.
    pub(super) fn get(&self, id: u64) -> Option<Arc<OriginDevice>> {
        self.devices
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&id)
            .cloned()
    }

    /// Serves volume `id` from `dev`.
    pub(super) fn insert(&self, id: u64, dev: Arc<OriginDevice>) {
        self.devices
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, dev);
    }

    /// Stops serving volume `id` (detached or destroyed).
    pub(super) fn remove(&self, id: u64) -> Option<Arc<OriginDevice>> {
        self.devices
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id)
    }

    /// Every attached device, with its volume's id.
    pub(super) fn entries(&self) -> Vec<(u64, Arc<OriginDevice>)> {
        self.devices
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(&id, d)| (id, Arc::clone(d)))
            .collect()
    }

    /// Stops serving volume `id` if `d` is still its device.
    pub(super) fn remove_if(&self, id: u64, d: &Arc<OriginDevice>) {
        let mut devices = self.devices.write().unwrap_or_else(|p| p.into_inner());
        if devices.get(&id).is_some_and(|now| Arc::ptr_eq(now, d)) {
            devices.remove(&id);
        }
    }

    /// What volume `id` lost with its device, if it lost anything.
    pub(super) fn loss(&self, id: u64) -> Option<OriginLoss> {
        self.losses
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&id)
            .copied()
    }

    /// Records (`Some`) or forgets what volume `id` lost with its device.
    pub(super) fn set_loss(&self, id: u64, loss: Option<OriginLoss>) {
        let mut losses = self.losses.write().unwrap_or_else(|p| p.into_inner());
        match loss {
            Some(loss) => losses.insert(id, loss),
            None => losses.remove(&id),
        };
    }

    /// Every attached device.
    pub(super) fn all(&self) -> Vec<Arc<OriginDevice>> {
        self.devices
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// Volume `id`'s store may hold copies no epoch reads, from key `from`.
    pub(super) fn sweep_from(&self, id: u64, from: u64) {
        lock_mutex(&self.sweeps)
            .entry(id)
            .and_modify(|at| *at = (*at).min(from))
            .or_insert(from);
    }

    /// Whether a sweep of some volume's store is due.
    pub(super) fn sweeping(&self) -> bool {
        !lock_mutex(&self.sweeps).is_empty()
    }

    /// A volume whose store is due a sweep, and the key to sweep it from.
    pub(super) fn next_sweep(&self) -> Option<(u64, u64)> {
        lock_mutex(&self.sweeps)
            .iter()
            .next()
            .map(|(&id, &at)| (id, at))
    }

    /// Volume `id`'s sweep went up to `next` (`None`: it is done).
    pub(super) fn sweep_done(&self, id: u64, next: Option<u64>) {
        let mut sweeps = lock_mutex(&self.sweeps);
        match next {
            Some(at) => {
                sweeps.insert(id, at);
            }
            None => {
                sweeps.remove(&id);
            }
        }
    }

    /// Locks the origin stripes of chunks `chunks` of copy-on-write volume
    /// `id`, in index order: exclusive for its writes, shared for reads
    /// through its epochs.
    pub(super) fn stripes(&self, id: u64, chunks: Range<u64>, write: bool) -> OriginStripes<'_> {
        let indices = stripe_indices(id, chunks);
        if write {
            OriginStripes::Write(
                indices
                    .into_iter()
                    .map(|i| write_lock(&self.stripes[i]))
                    .collect(),
            )
        } else {
            OriginStripes::Read(
                indices
                    .into_iter()
                    .map(|i| read_lock(&self.stripes[i]))
                    .collect(),
            )
        }
    }

    /// Held while a home is built in steps.
    pub(super) fn building_home(&self) -> RwLockWriteGuard<'_, ()> {
        write_lock(&self.homes)
    }

    /// [`Origins::building_home`] without waiting: `None` while a home is
    /// being built (reclaim only tries it, so it may run under any lock).
    pub(super) fn no_home_building(&self) -> Option<RwLockWriteGuard<'_, ()>> {
        try_write_lock(&self.homes)
    }

    /// [`Origins::no_home_building`], shared with others who only need no
    /// home built meanwhile (the scrub's readers, which give sums).
    pub(super) fn no_home_building_shared(&self) -> Option<RwLockReadGuard<'_, ()>> {
        try_read_lock(&self.homes)
    }

    /// [`Volumes::copies_by_sole_epoch`] of `origin`, walked once per state
    /// of its store and epochs.
    pub(super) fn sole_copies(&self, meta: &Volumes, origin: u64) -> Result<SoleCopies> {
        let table = meta.table();
        let version = table.store_version(origin);
        if let Some((seen, bytes)) = lock_mutex(&self.sole_copies).get(&origin) {
            if Some(*seen) == version {
                return Ok(Arc::clone(bytes));
            }
        }
        // Walked without the cache's lock (the caller's read guard keeps the
        // state): two callers may walk at once, and both get the same.
        let bytes = Arc::new(meta.copies_by_sole_epoch(origin)?);
        if let Some(version) = version {
            let mut cache = lock_mutex(&self.sole_copies);
            // Only volumes that still exist: the cache stays bounded.
            cache.retain(|&id, _| table.store_version(id).is_some());
            cache.insert(origin, (version, Arc::clone(&bytes)));
        }
        Ok(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_origin_stripe_held_for_writing_excludes_reads_of_its_chunk() {
        let o = Origins::default();
        let writing = o.stripes(4, 10..12, true);
        for i in stripe_indices(4, 10..11) {
            assert!(o.stripes[i].try_read().is_err());
        }
        drop(writing);
        let reading = o.stripes(4, 10..12, false);
        for i in stripe_indices(4, 11..12) {
            assert!(o.stripes[i].try_read().is_ok());
            assert!(o.stripes[i].try_write().is_err());
        }
        drop(reading);
    }

    #[test]
    fn loose_homes_wait_for_a_home_being_built() {
        let o = Origins::default();
        let building = o.building_home();
        assert!(o.no_home_building().is_none());
        assert!(o.no_home_building_shared().is_none());
        drop(building);
        // Scrubs share it; reclaim waits for them.
        let scrub = o.no_home_building_shared();
        assert!(scrub.is_some());
        assert!(o.no_home_building_shared().is_some());
        assert!(o.no_home_building().is_none());
        drop(scrub);
        assert!(o.no_home_building().is_some());
    }

    #[test]
    fn a_sweep_goes_on_from_its_lowest_key_until_done() {
        let o = Origins::default();
        assert!(!o.sweeping());
        o.sweep_from(7, 40);
        o.sweep_from(7, 10);
        o.sweep_from(7, 30);
        assert_eq!(o.next_sweep(), Some((7, 10)));
        o.sweep_done(7, Some(25));
        assert_eq!(o.next_sweep(), Some((7, 25)));
        o.sweep_done(7, None);
        assert!(!o.sweeping());
        assert_eq!(o.next_sweep(), None);
    }

    #[test]
    fn losses_are_kept_and_forgotten() {
        let o = Origins::default();
        assert_eq!(o.loss(3), None);
        let loss = OriginLoss {
            from: 4096,
            epoch: 2,
            seen_unix: 1,
            accepted_unix: 0,
        };
        o.set_loss(3, Some(loss));
        assert_eq!(o.loss(3), Some(loss));
        o.set_loss(3, None);
        assert_eq!(o.loss(3), None);
    }

    #[test]
    fn written_chunks_come_back_as_runs_once() {
        let mut w = Written::new(4096, 200);
        // Inside one chunk, across chunks, across a word, the last chunk,
        // and past the end (nothing).
        w.mark(100, 200);
        w.mark(4096 * 3 + 1, 4096 * 5);
        w.mark(4096 * 63, 4096 * 66);
        w.mark(4096 * 199, 4096 * 200);
        w.mark(4096 * 200, 4096 * 300);
        assert_eq!(w.take(), [0..1, 3..5, 63..66, 199..200]);
        assert_eq!(w.take(), []);
        // Adjacent marks join one run; an empty range marks nothing.
        w.mark(4096 * 10, 4096 * 11);
        w.mark(4096 * 11, 4096 * 12);
        w.mark(4096 * 20, 4096 * 20);
        assert_eq!(w.take(), [std::ops::Range { start: 10, end: 12 }]);
    }

    #[test]
    fn a_device_is_due_a_flush_from_a_write_until_one_succeeds() {
        let disk: Arc<dyn BlockDevice> = Arc::new(arbor_io::SimDisk::new(1 << 20));
        let d = OriginDevice::in_pool(disk, 1, 4096, 8192);
        assert_eq!(d.dev().size(), 8192);
        assert!(
            d.dev().write_at(&[1; 512], 8192).is_err(),
            "past its window"
        );
        d.will_write(0, 512);
        d.dev().write_at(&[1; 512], 0).unwrap();
        assert!(d.written.load(Ordering::Acquire));
        d.flush_if_written().unwrap();
        assert!(!d.written.load(Ordering::Acquire));
        assert_eq!(d.check_size(), None);
    }

    #[test]
    fn writes_are_tracked_only_while_tracking() {
        let disk: Arc<dyn BlockDevice> = Arc::new(arbor_io::SimDisk::new(1 << 20));
        let d = OriginDevice::new(disk);
        d.will_write(0, 4096);
        let tracking = d.track(4096, 16);
        d.will_write(4096 * 2, 4096 * 3 + 1);
        assert_eq!(tracking.take(), [Range { start: 2, end: 4 }]);
        drop(tracking);
        assert!(lock_mutex(&d.tracked).is_none());
    }
}
