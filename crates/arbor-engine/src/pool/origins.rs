//! The pool's copy-on-write origins: the devices its copy-on-write volumes
//! are served from, their origin stripes, the lock of homes being built,
//! the sweeps due of their stores, their recorded losses, and the
//! statistics' cache of their copies (`pool/origin.rs` is what the pool
//! does with them). Their locks' place in the lock order is in `pool.rs`.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

use arbor_format::OriginLoss;

use super::gates::{stripe_indices, STRIPES};
use super::origin::OriginDevice;
use super::{lock_mutex, read_lock, try_lock, write_lock, SoleCopies};
use crate::error::Result;
use crate::volumes::Volumes;

/// Origin stripe guards (see [`Origins::stripes`]).
pub(super) enum OriginStripes<'a> {
    Read(#[allow(dead_code)] Vec<RwLockReadGuard<'a, ()>>),
    Write(#[allow(dead_code)] Vec<RwLockWriteGuard<'a, ()>>),
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
    /// mistaken for one a failure left.
    homes: Mutex<()>,
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
            homes: Mutex::new(()),
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
    pub(super) fn building_home(&self) -> MutexGuard<'_, ()> {
        lock_mutex(&self.homes)
    }

    /// [`Origins::building_home`] without waiting: `None` while a home is
    /// being built (reclaim only tries it, so it may run under any lock).
    pub(super) fn no_home_building(&self) -> Option<MutexGuard<'_, ()>> {
        try_lock(&self.homes)
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
        drop(building);
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
}
