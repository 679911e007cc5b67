//! The write path's locks: the pool gate, the volume gates and the
//! stripes (their rules are in `pool.rs`, with the lock order). None
//! guards data: a poisoned one is still a valid barrier.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::ops::Range;
use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::lock_mutex;

/// Stripes (of the write path's, and of copy-on-write volumes' origin
/// stripes): (volume, chunk) pairs that hash alike share one.
pub(super) const STRIPES: usize = 256;
/// Volume gates: volumes whose ids are equal modulo this share one, which
/// costs only a needless wait.
const VOLUME_GATES: usize = 64;

pub(super) struct Gates {
    gate: RwLock<()>,
    volumes: Vec<RwLock<()>>,
    stripes: Vec<Mutex<()>>,
}

impl Default for Gates {
    fn default() -> Self {
        Self {
            gate: RwLock::new(()),
            volumes: (0..VOLUME_GATES).map(|_| RwLock::new(())).collect(),
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
        }
    }
}

impl Gates {
    /// The pool gate, shared: held by every read and write.
    pub(super) fn io(&self) -> RwLockReadGuard<'_, ()> {
        self.gate.read().unwrap_or_else(|p| p.into_inner())
    }

    /// The pool gate, exclusive: held by a commit to freeze the transaction.
    pub(super) fn commit(&self) -> RwLockWriteGuard<'_, ()> {
        self.gate.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Volume `id`'s gate, shared: held by each of its writes, inside the
    /// pool gate.
    pub(super) fn volume(&self, id: u64) -> RwLockReadGuard<'_, ()> {
        // `VOLUME_GATES` fits a usize and the remainder is below it.
        let gate = &self.volumes[(id % VOLUME_GATES as u64) as usize];
        gate.read().unwrap_or_else(|p| p.into_inner())
    }

    /// The gates of volumes `ids`, exclusive, taken in index order (so two
    /// lockers of several never wait for each other's).
    pub(super) fn volumes_exclusive(&self, ids: &[u64]) -> Vec<RwLockWriteGuard<'_, ()>> {
        let mut indices: Vec<usize> = ids
            .iter()
            .map(|id| (id % VOLUME_GATES as u64) as usize)
            .collect();
        indices.sort_unstable();
        indices.dedup();
        indices
            .into_iter()
            .map(|i| self.volumes[i].write().unwrap_or_else(|p| p.into_inner()))
            .collect()
    }

    /// The stripes of chunks `chunks` of volume `id`, in index order.
    pub(super) fn stripes(&self, id: u64, chunks: Range<u64>) -> Vec<MutexGuard<'_, ()>> {
        stripe_indices(id, chunks)
            .into_iter()
            .map(|i| lock_mutex(&self.stripes[i]))
            .collect()
    }
}

fn stripe_index(id: u64, chunk: u64) -> usize {
    let mut h = DefaultHasher::new();
    (id, chunk).hash(&mut h);
    (h.finish() as usize) % STRIPES
}

/// The stripes of chunks `chunks` of volume `id`, in index order (so two
/// lockers of several never wait for each other's).
pub(super) fn stripe_indices(id: u64, chunks: Range<u64>) -> Vec<usize> {
    if chunks.end - chunks.start >= STRIPES as u64 {
        return (0..STRIPES).collect();
    }
    let mut v: Vec<usize> = chunks.map(|c| stripe_index(id, c)).collect();
    v.sort_unstable();
    v.dedup();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_commit_excludes_io_and_io_shares() {
        let g = Gates::default();
        let a = g.io();
        let b = g.io();
        assert!(g.gate.try_write().is_err());
        drop((a, b));
        let c = g.commit();
        assert!(g.gate.try_read().is_err());
        drop(c);
    }

    #[test]
    fn exclusive_volume_gates_exclude_their_writes_only() {
        let g = Gates::default();
        // 3 and 3 + VOLUME_GATES share a gate: taken once.
        let held = g.volumes_exclusive(&[3, 3 + VOLUME_GATES as u64, 5, 3]);
        assert_eq!(held.len(), 2);
        assert!(g.volumes[3].try_read().is_err());
        assert!(g.volumes[5].try_read().is_err());
        assert!(g.volumes[4].try_read().is_ok());
        drop(held);
        let _w = g.volume(3);
        assert!(g.volumes[3].try_write().is_err());
        assert!(g.volumes[3].try_read().is_ok());
    }

    #[test]
    fn stripes_are_exclusive_sorted_and_bounded() {
        let g = Gates::default();
        let indices = stripe_indices(7, 0..100);
        assert!(indices.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(stripe_indices(7, 0..STRIPES as u64).len(), STRIPES);
        let held = g.stripes(7, 10..12);
        for i in stripe_indices(7, 10..12) {
            assert!(g.stripes[i].try_lock().is_err());
        }
        drop(held);
        assert!(stripe_indices(7, 10..12)
            .into_iter()
            .all(|i| g.stripes[i].try_lock().is_ok()));
    }
}
