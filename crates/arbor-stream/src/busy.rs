//! What running sends and receives are using, so that others keep out:
//! snapshots a send reads ([`Pins`]: destroying or pruning one waits or
//! needs force) and volumes a receive writes ([`Claims`]: one receive into
//! a volume at a time, whether from the API or from replication).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use arbor_engine::VolumeId;

/// Snapshots in use by running sends, counted.
#[derive(Debug, Default)]
pub struct Pins(Mutex<HashMap<VolumeId, usize>>);

impl Pins {
    fn map(&self) -> MutexGuard<'_, HashMap<VolumeId, usize>> {
        // A map of counters, changed in one step: a panic elsewhere cannot
        // leave it half-updated.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Pins `ids` until the guard is dropped.
    pub fn pin(self: &Arc<Self>, ids: Vec<VolumeId>) -> PinGuard {
        let mut map = self.map();
        for id in &ids {
            *map.entry(*id).or_default() += 1;
        }
        PinGuard {
            pins: Arc::clone(self),
            ids,
        }
    }

    /// How many sends use `id`.
    pub fn count(&self, id: VolumeId) -> usize {
        self.map().get(&id).copied().unwrap_or(0)
    }
}

/// Unpins on drop.
#[derive(Debug)]
pub struct PinGuard {
    pins: Arc<Pins>,
    ids: Vec<VolumeId>,
}

impl Drop for PinGuard {
    fn drop(&mut self) {
        let mut map = self.pins.map();
        for id in &self.ids {
            if let Some(n) = map.get_mut(id) {
                *n -= 1;
                if *n == 0 {
                    map.remove(id);
                }
            }
        }
    }
}

/// Volumes a receive is running into.
#[derive(Debug, Default)]
pub struct Claims(Mutex<HashSet<String>>);

impl Claims {
    fn set(&self) -> MutexGuard<'_, HashSet<String>> {
        // A set changed in one step (see Pins::map).
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Claims `volume` for one receive until the guard is dropped; None if
    /// another receive holds it.
    pub fn claim(self: &Arc<Self>, volume: &str) -> Option<Claim> {
        self.set().insert(volume.to_owned()).then(|| Claim {
            claims: Arc::clone(self),
            volume: volume.to_owned(),
        })
    }
}

/// Releases its volume on drop.
#[derive(Debug)]
pub struct Claim {
    claims: Arc<Claims>,
    volume: String,
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.claims.set().remove(&self.volume);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_count_and_claims_exclude_until_dropped() {
        let pins = Arc::new(Pins::default());
        let a = pins.pin(vec![VolumeId(1), VolumeId(2)]);
        let b = pins.pin(vec![VolumeId(1)]);
        assert_eq!(pins.count(VolumeId(1)), 2);
        drop(a);
        assert_eq!((pins.count(VolumeId(1)), pins.count(VolumeId(2))), (1, 0));
        drop(b);
        assert_eq!(pins.count(VolumeId(1)), 0);
        let claims = Arc::new(Claims::default());
        let c = claims.claim("vm1").unwrap();
        assert!(claims.claim("vm1").is_none());
        assert!(claims.claim("vm2").is_some());
        drop(c);
        assert!(claims.claim("vm1").is_some());
    }
}
