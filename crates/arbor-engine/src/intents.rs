//! The in-place intent set (docs/FORMAT.md §6.4, version 10): the crash
//! rule of data checksums.
//!
//! A chunk overwritten in place gets its new data and its new sums at
//! different moments, so after a power cut its sums may not match what
//! the device holds, though nothing is damaged: a write acknowledged but
//! not flushed may read as its old or new content, or torn, exactly as on
//! a disk without arbor. So a chunk is overwritten in place only in a
//! region of data space that the last durable commit lists in the intent
//! set (or a chunk allocated in the open transaction, which no state a
//! crash recovers to maps; not one allocated in the transaction of a commit
//! in flight: writes run during a commit's device work, and once that
//! commit lands a crash recovers to it, with the chunk mapped under its
//! sums of then). A write to a chunk of a region not listed adds the region in
//! the open transaction, in a step of its own after the write's plan (so
//! that it stays when the write fails for space: the commit that makes
//! room then makes the region usable, and a full pool can still overwrite
//! in place), then drops its plan, commits through that transaction (a
//! group commit, shared with every writer waiting for the same) and tries
//! again, in place ([`take_await`]). Only a write that may not commit (a
//! unit that runs with the pool to itself) redirects instead. After an unclean shutdown, the open
//! recomputes the sums of the live chunks of the listed regions from the
//! device before serving, then empties the set. A region leaves the set
//! at a commit once it has not been written in place for [`IDLE`] (no
//! in-place write is in flight during a commit: units hold the I/O gate),
//! and every region at a clean close.
//!
//! The intent log (version 13, pools created at 13; FORMAT.md §6.4.1):
//! rather than commit, the waiting writer appends a record listing the
//! regions added in the open transaction to the pool's log area, made
//! durable alone (`BlockDevice::write_durable_at`: one block and a cache
//! flush, where a commit through the page cache writes back every dirty
//! page of the pool file), and goes in place. A record is appended only
//! with no commit in flight (under the commit lock), naming the last
//! durable commit; the next commit lists its regions in the tree, and
//! the log starts again ([`LogState`]). An open after an unclean shutdown
//! adds the regions of the log's records that name its commit to the set
//! before recomputing ([`Pool::open`](crate::Pool::open)).

use std::collections::HashSet;
use std::time::{Duration, Instant};

use arbor_format::{intent_region, TreeKind};

use crate::error::Result;
use crate::meta::btree::Tree;
use crate::meta::Meta;

/// How long a region stays in the set without in-place writes (a policy:
/// longer means fewer redirected first writes, more to recompute after a
/// power cut).
pub(crate) const IDLE: Duration = Duration::from_secs(10);

/// Whether chunk `pchunk` may be overwritten in place now as far as the
/// crash rule goes; if not, its region joins the set in the open
/// transaction (the caller redirects the write this time).
pub(crate) fn ready_for(meta: &mut Meta, pchunk: u64) -> Result<bool> {
    if !meta.geo().version().has_data_checksums() || meta.data_allocated_in_open_txn(pchunk) {
        return Ok(true);
    }
    let (region, _) = intent_region(meta.geo().chunk_size, pchunk);
    let durable = meta.durable_txn();
    match added(meta, region)? {
        Some(txn) if txn <= durable || meta.intent_log.logged.contains(&region) => {
            meta.intent_writes.insert(region, Instant::now());
            Ok(true)
        }
        Some(txn) => {
            meta.intents_await = meta.intents_await.max(txn);
            Ok(false)
        }
        None => {
            if !meta.intents_wanted.contains(&region) {
                meta.intents_wanted.push(region);
            }
            // Added in the open transaction (`add_wanted`).
            meta.intents_await = meta.txn();
            Ok(false)
        }
    }
}

/// The transaction whose durability lets the steps since the last call
/// overwrite in place the chunks [`ready_for`] refused them, if any; the
/// write path then commits through it and tries again rather than
/// redirect (a redirected overwrite leaves a partial extent behind and
/// costs a mapping step).
pub(crate) fn take_await(meta: &mut Meta) -> Option<u64> {
    Some(std::mem::take(&mut meta.intents_await)).filter(|&txn| txn > 0)
}

/// Adds the regions writes found missing ([`ready_for`]) to the set, in
/// the open transaction. Returns whether there were any.
pub(crate) fn add_wanted(meta: &mut Meta) -> Result<bool> {
    let wanted = std::mem::take(&mut meta.intents_wanted);
    add(meta, &wanted)?;
    Ok(!wanted.is_empty())
}

/// Adds `regions` to the set in the open transaction (those not in it
/// yet), as written in place now.
pub(crate) fn add(meta: &mut Meta, regions: &[u64]) -> Result<()> {
    let txn = meta.txn();
    for &region in regions {
        if added(meta, region)?.is_none() {
            meta.with_own_tree(TreeKind::Intents, |tree| {
                tree.insert(region, &txn.to_le_bytes())
            })?;
        }
        meta.intent_writes.insert(region, Instant::now());
    }
    Ok(())
}

/// What the intent log holds since the last commit (in memory; the log
/// area holds the records). Emptied when a commit lands: every region a
/// record lists was added to the set in the open transaction of its
/// append, with no commit in flight, so the next commit lists it.
#[derive(Debug, Default)]
pub(crate) struct LogState {
    /// Regions a durable record of this generation lists: in place
    /// already, though the set's entry is not durable yet.
    logged: HashSet<u64>,
    /// The block of the log area the next record goes to.
    next: u64,
}

impl LogState {
    /// The block of the log area the next record goes to.
    pub(crate) fn next(&self) -> u64 {
        self.next
    }

    /// Records `regions` as durable in the log, in records up to block
    /// `next` (exclusive).
    pub(crate) fn note(&mut self, regions: &[u64], next: u64) {
        debug_assert!(next > self.next, "a log append that took no block");
        self.logged.extend(regions.iter().copied());
        self.next = next;
    }
}

/// The regions a log record must list for the writers waiting now: those
/// added to the set since the last durable commit and in no durable
/// record yet (ascending). Called with no commit in flight.
pub(crate) fn to_log(meta: &Meta) -> Result<Vec<u64>> {
    let durable = meta.durable_txn();
    Ok(listed(meta)?
        .into_iter()
        .filter(|&(region, txn)| txn > durable && !meta.intent_log.logged.contains(&region))
        .map(|(region, _)| region)
        .collect())
}

/// The transaction that added region `region` to the set, if it is in it.
fn added(meta: &Meta, region: u64) -> Result<Option<u64>> {
    Tree::new(meta, TreeKind::Intents, meta.intents_root())
        .get_with(region, |value| value.map(added_txn))
}

fn added_txn(value: &[u8]) -> u64 {
    // The tree kind's values are 8 bytes (`TreeKind::fixed_value_len`).
    u64::from_le_bytes(value.try_into().unwrap_or([0; 8]))
}

/// The regions in the set, with the transaction that added each.
pub(crate) fn listed(meta: &Meta) -> Result<Vec<(u64, u64)>> {
    let mut regions = Vec::new();
    Tree::new(meta, TreeKind::Intents, meta.intents_root()).for_each(
        0,
        u64::MAX,
        &mut |key, value| {
            regions.push((key, added_txn(value)));
            Ok(true)
        },
    )?;
    Ok(regions)
}

/// Takes region `region` out of the set.
pub(crate) fn remove(meta: &mut Meta, region: u64) -> Result<()> {
    meta.with_own_tree(TreeKind::Intents, |tree| tree.remove(region).map(drop))?;
    meta.intent_writes.remove(&region);
    Ok(())
}

/// Takes out of the set every region not written in place for `idle`
/// (all of them with zero) and added before the open transaction. Only
/// with no in-place write in flight.
pub(crate) fn evict(meta: &mut Meta, idle: Duration) -> Result<usize> {
    let txn = meta.txn();
    let now = Instant::now();
    let idle_regions: Vec<u64> = listed(meta)?
        .into_iter()
        .filter(|&(region, added)| {
            added < txn
                && meta
                    .intent_writes
                    .get(&region)
                    .is_none_or(|&at| now.duration_since(at) >= idle)
        })
        .map(|(region, _)| region)
        .collect();
    for &region in &idle_regions {
        remove(meta, region)?;
    }
    Ok(idle_regions.len())
}
