//! Healing between replication peers (docs/REPLICATION.md, "Healing"):
//! each side lists its damaged blocks in snapshots both hold (by identity),
//! the other reads its own copies, verified, and sends them; the damaged
//! side rewrites only blocks that are damaged, with bytes that match its
//! checksums (`Pool::heal`). An encrypted snapshot's blocks go as stored
//! (ciphertext, which its sums are of): neither side needs its key. The engine's calls block; sessions run them
//! on blocking threads ([`send`] does).

use std::collections::HashSet;
use std::sync::Arc;

use arbor_engine::{split_snapshot_name, Error, Healed, Pool, VolumeId};
use arbor_stream::format::Guid;

use crate::local;
use arbor_stream::StreamFailure;
use tokio::io::AsyncWrite;

use crate::proto::{
    Blocks, Message, Wanted, WireGuid, HEAL_BLOCK, MAX_BLOCKS_PER_FRAME, MAX_WANTED,
};
use crate::session::{blocking, SessionError, Writer};

/// The damaged blocks of `volume`'s snapshots whose identities are in
/// `held` (those the peer has), at most [`MAX_WANTED`] in all.
pub fn wants(pool: &Pool, volume: &str, held: &HashSet<Guid>) -> Result<Vec<Wanted>, Error> {
    if pool.damage_count()? == 0 {
        return Ok(Vec::new());
    }
    let Ok(id) = pool.lookup(volume) else {
        return Ok(Vec::new());
    };
    let mut wants = Vec::new();
    let mut room = MAX_WANTED;
    for snap in local::snapshots_of(pool, id)? {
        let Some(guid) = snap.guid.map(Guid) else {
            continue;
        };
        if room == 0 || !held.contains(&guid) {
            continue;
        }
        let mut offsets = pool.damaged_in(snap.id)?;
        offsets.truncate(room);
        if !offsets.is_empty() {
            room -= offsets.len();
            wants.push(Wanted {
                guid: WireGuid(guid),
                offsets,
            });
        }
    }
    Ok(wants)
}

/// The snapshot of `volume` with identity `guid`, if this pool holds it.
fn snapshot_of(pool: &Pool, volume: &str, guid: &Guid) -> Result<Option<VolumeId>, Error> {
    let Some(id) = pool.find_guid(&guid.0)? else {
        return Ok(None);
    };
    let info = pool.info(id)?;
    let ours = info.snapshot && split_snapshot_name(&info.name).is_ok_and(|(v, _)| v == volume);
    Ok(ours.then_some(id))
}

/// This pool's copies of `offsets` of `volume`'s snapshot `guid`, as good
/// as its checksums say (a block damaged here too, or beyond the
/// snapshot's end, is left out); empty if it does not hold the snapshot.
pub fn read(pool: &Pool, volume: &str, guid: Guid, offsets: &[u64]) -> Result<Blocks, Error> {
    let mut blocks = Blocks {
        guid,
        blocks: Vec::new(),
    };
    let Some(id) = snapshot_of(pool, volume, &guid)? else {
        return Ok(blocks);
    };
    let info = pool.info(id)?;
    let size = info.size;
    for &offset in offsets {
        if offset
            .checked_add(HEAL_BLOCK as u64)
            .is_none_or(|end| end > size)
        {
            continue;
        }
        let mut data = vec![0u8; HEAL_BLOCK];
        // An encrypted snapshot's blocks as stored (its sums are of its
        // ciphertext, the same on every raw replica), with no key.
        let read = if info.key_slot.is_some() {
            pool.read_raw(id, offset, &mut data)
        } else {
            pool.read(id, offset, &mut data)
        };
        match read {
            Ok(()) => blocks.blocks.push((offset, data)),
            Err(Error::Damaged(_)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(blocks)
}

/// Heals `volume`'s snapshot `blocks.guid` with the peer's copies (each
/// checked against this pool's checksums); nothing if this pool does not
/// hold it.
pub fn apply(pool: &Pool, volume: &str, blocks: &Blocks) -> Result<Healed, Error> {
    let mut done = Healed::default();
    let Some(id) = snapshot_of(pool, volume, &blocks.guid)? else {
        return Ok(done);
    };
    let size = pool.info(id)?.size;
    for (offset, data) in &blocks.blocks {
        if offset
            .checked_add(HEAL_BLOCK as u64)
            .is_none_or(|end| end > size)
        {
            continue;
        }
        done.add(pool.heal(id, *offset, data)?);
    }
    Ok(done)
}

/// Sends this pool's good copies of the `wants` of `volume`'s snapshots
/// (those it holds, and has undamaged), in blocks messages: the blocks
/// sent.
pub(crate) async fn send<W: AsyncWrite + Unpin>(
    pool: &Arc<Pool>,
    volume: &str,
    wants: &[Wanted],
    writer: &mut Writer<W>,
) -> Result<u64, SessionError> {
    let mut sent = 0;
    for want in wants {
        for offsets in want.offsets.chunks(MAX_BLOCKS_PER_FRAME) {
            let pool = Arc::clone(pool);
            let (v, guid, offsets) = (volume.to_owned(), want.guid.0, offsets.to_vec());
            let blocks =
                blocking(move || Ok(read(&pool, &v, guid, &offsets).map_err(StreamFailure::from)?))
                    .await?;
            if !blocks.blocks.is_empty() {
                sent += blocks.blocks.len() as u64;
                writer.send(&Message::Blocks(blocks)).await?;
            }
        }
    }
    Ok(sent)
}
