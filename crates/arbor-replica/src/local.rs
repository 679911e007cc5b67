//! What replication asks of the local pool: a volume's snapshots in order,
//! its state as the plan sees it, moving a hold forward, pruning by a
//! retention count. Blocking calls (the engine's); sessions run them on
//! blocking threads.

use arbor_engine::{Error, Pool, Refusal, VolumeId, VolumeInfo};
use arbor_stream::busy::Pins;
use arbor_stream::format::Guid;

use crate::plan::{Local, LocalSnapshot};

/// The snapshots of volume `id`, oldest first (in the order they were
/// taken or received here).
pub fn snapshots_of(pool: &Pool, id: VolumeId) -> Result<Vec<VolumeInfo>, Error> {
    let mut snaps: Vec<VolumeInfo> = pool
        .list()?
        .into_iter()
        .filter(|i| i.snapshot && i.parent == Some(id))
        .collect();
    snaps.sort_by_key(|i| i.created_txn);
    Ok(snaps)
}

/// `volume` as the plan sees it.
pub fn view(pool: &Pool, volume: &str) -> Result<Local, Error> {
    let id = match pool.lookup(volume) {
        Ok(id) => id,
        Err(Error::Refused(Refusal::NotFound(_))) => return Ok(Local::Absent),
        Err(e) => return Err(e),
    };
    let snaps = snapshots_of(pool, id)?;
    let written = match snaps.last() {
        Some(newest) => !pool.unchanged_since(id, newest.id)?,
        None => true,
    };
    Ok(Local::Volume {
        snapshots: snaps
            .into_iter()
            .filter_map(|s| {
                s.guid.map(|g| LocalSnapshot {
                    guid: Guid(g),
                    name: s.name,
                })
            })
            .collect(),
        written,
    })
}

/// The snapshots of volume `id` that hold `tag` carries, oldest first.
pub fn held_by(pool: &Pool, id: VolumeId, tag: &str) -> Result<Vec<VolumeInfo>, Error> {
    let mut held = Vec::new();
    for snap in snapshots_of(pool, id)? {
        if pool.holds(snap.id)?.iter().any(|t| t == tag) {
            held.push(snap);
        }
    }
    Ok(held)
}

/// Takes hold `tag` off every snapshot of volume `id` but `except`.
pub fn release_all(
    pool: &Pool,
    id: VolumeId,
    tag: &str,
    except: Option<VolumeId>,
) -> Result<(), Error> {
    for snap in held_by(pool, id, tag)? {
        if Some(snap.id) != except {
            pool.release(&snap.name, tag)?;
        }
    }
    Ok(())
}

/// Puts hold `tag` on snapshot `keep` and takes it off every other
/// snapshot of the same volume: the hold moves forward, never leaving a
/// moment without one.
pub fn move_hold(pool: &Pool, keep: &str, tag: &str) -> Result<(), Error> {
    pool.hold(keep, tag)?;
    let id = pool.lookup(keep)?;
    match pool.info(id)?.parent {
        Some(volume) => release_all(pool, volume, tag, Some(id)),
        None => Ok(()),
    }
}

/// Deletes the oldest snapshots of `volume` whose name starts with
/// `prefix` (after the `@`), beyond the newest `keep` of them. Snapshots
/// held (by replication or by hand) or read by a running send stay.
/// Returns the names deleted.
pub fn prune(
    pool: &Pool,
    volume: &str,
    prefix: &str,
    keep: usize,
    pins: &Pins,
) -> Result<Vec<String>, Error> {
    let id = pool.lookup(volume)?;
    let snaps: Vec<VolumeInfo> = snapshots_of(pool, id)?
        .into_iter()
        .filter(|s| {
            s.name
                .split_once('@')
                .is_some_and(|(_, snap)| snap.starts_with(prefix))
        })
        .collect();
    let excess = snaps.len().saturating_sub(keep);
    let mut deleted = Vec::new();
    for snap in &snaps[..excess] {
        if pins.count(snap.id) > 0 || !pool.holds(snap.id)?.is_empty() {
            continue;
        }
        match pool.delete_forced(&snap.name, false) {
            Ok(()) => deleted.push(snap.name.clone()),
            // Held or in use since the check: it stays, as it should.
            Err(
                Error::Refused(Refusal::Conflict(_))
                | Error::Refused(Refusal::NotFound(_))
                | Error::Refused(Refusal::Invalid(_)),
            ) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(deleted)
}
