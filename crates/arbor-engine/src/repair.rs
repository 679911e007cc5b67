//! Offline repair of what can be rebuilt from the trees.
//!
//! What it repairs:
//! * a damaged or differing superblock copy, rewritten from the one that
//!   verifies (opening does this too);
//! * a damaged or stale copy of the newest commit record (version 9),
//!   rewritten from the intact one (opening does this too);
//! * a version 9 commit whose page images are damaged: its space maps are
//!   rebuilt as below (opening runs this repair when it finds one);
//! * both space maps (every reference count of every metadata block and
//!   data chunk, and the used counters): recomputed from a full walk of the
//!   trees and rewritten wherever a home page is damaged, stale or wrong.
//!   This fixes leaks (counts too high: space never freed) and, more
//!   importantly, counts too low (space that would be handed out again
//!   while still in use);
//! * a damaged reclaim queue (or a queued tree with a damaged node): the
//!   queue is dropped, and everything only it referenced (deleted volumes'
//!   space) is free at once;
//! * a next volume id not above every volume id.
//!
//! What it cannot repair, and refuses (the pool is left as it was):
//! * no superblock copy verifies (the geometry is unknown);
//! * no commit record with intact page images in either journal area (the
//!   roots of the trees are unknown);
//! * a damaged node of the volume table or of any volume's or snapshot's
//!   mapping tree: the data it mapped cannot be found again (chunk data
//!   carries no back-references). The volumes concerned are named in the
//!   error; reading their undamaged ranges still works, and copying them
//!   out then deleting them is the way forward.
//!
//! It does not fix a volume record's mapped-chunk counter (accounting only,
//! reported by `check`), and it never touches chunk data (which carries no
//! checksum: damage there is not detectable).
//!
//! Crash safety: home pages are rewritten first, then one new commit record
//! (with no page images) makes them current. A crash before that record is
//! durable leaves a mix of repaired and old pages, which `check` reports;
//! run repair again before using the pool.

use std::sync::Arc;

use arbor_format::{SmKind, SmPage, SM_ENTRIES_PER_PAGE};
use arbor_io::BlockDevice;

use crate::check::count_references;
use crate::error::{Error, Result};
use crate::meta::{recover, write_record_copies, Meta, Recovered, VolumeRoots};
use crate::pool::{choose_superblock, rewrite_superblock_copies, OpenOptions};
use crate::store::{Geometry, Store};
use crate::volumes::Volumes;

/// What [`repair`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RepairReport {
    /// One line per change made; empty when nothing needed repair.
    pub actions: Vec<String>,
    /// The commit the pool is at afterwards.
    pub txn: u64,
}

/// Repairs the pool on `dev`, which nothing else may have open. Returns what
/// was changed, or an error naming the damage it cannot repair (see the
/// module documentation); the pool then opens as before, if at all.
pub fn repair(dev: Arc<dyn BlockDevice>, opts: &OpenOptions) -> Result<RepairReport> {
    let chosen = choose_superblock(dev.as_ref())?;
    let mut actions = rewrite_superblock_copies(dev.as_ref(), &chosen)?;
    let version = chosen.version;
    let store = Arc::new(Store::new(
        dev,
        Geometry::new(&chosen.superblock, version),
        opts.cache_bytes / arbor_format::BLOCK_SIZE,
    ));
    let geo = &store.geo;
    let resume = match recover(&store)? {
        Recovered::Intact { resume, repaired } => {
            actions.extend(repaired);
            resume
        }
        // Its space maps are rebuilt below, and a new record makes them
        // current (the damaged one is never the newest again).
        Recovered::ImagesDamaged { resume, why } => {
            actions.push(format!("{why}: rebuilding the space maps"));
            resume
        }
    };
    let mut meta = Meta::resume(Arc::clone(&store), resume, opts.dirty_node_limit)?;

    let volumes = count_references(&meta, false)?;
    if let Some(problems) = volumes.damaged {
        return Err(Error::inconsistent(format!(
            "cannot repair: volume trees are damaged ({}); copy the readable data out and delete the volumes concerned",
            problems.join("; ")
        )));
    }
    let mut refs = volumes;
    if !meta.queue_root().is_none() {
        let with_queue = count_references(&meta, true)?;
        match with_queue.damaged {
            None => refs = with_queue,
            Some(problems) => {
                meta.forget_queue();
                actions.push(format!(
                    "dropped the damaged reclaim queue ({}); the space of deleted volumes is free now",
                    problems.join("; ")
                ));
            }
        }
    }
    let txn = meta.txn();
    let meta_used = rewrite_map(&store, SmKind::Meta, &refs.meta, txn, &mut actions)?;
    let data_used = rewrite_map(&store, SmKind::Data, &refs.data, txn, &mut actions)?;
    for (kind, old, new) in [
        ("metadata blocks", meta.used(SmKind::Meta), meta_used),
        ("data chunks", meta.used(SmKind::Data), data_used),
    ] {
        if old != new {
            actions.push(format!(
                "{kind} in use: {old} counted in the commit, {new} found"
            ));
        }
    }
    let volumes = Volumes::resume(meta)?;
    let meta = volumes.meta();
    let next_id = volumes
        .table()
        .iter()
        .map(|(id, _)| id)
        .last()
        .map_or(1, |id| id + 1)
        .max(volumes.next_volume_id());
    if next_id != volumes.next_volume_id() {
        actions.push(format!(
            "next volume id raised from {} to {next_id}",
            volumes.next_volume_id()
        ));
    }
    if actions.is_empty() {
        return Ok(RepairReport {
            actions,
            txn: txn - 1,
        });
    }
    let roots = VolumeRoots {
        root: volumes.roots().root,
        next_id,
    };
    let mut record = meta.repair_record(roots, meta_used, data_used);
    let no_pages: [SmPage; 0] = [];
    let journal = arbor_format::encode_journal(&mut record, version, &no_pages)
        .map_err(|e| Error::inconsistent(format!("commit record: {e}")))?;
    // The rewritten home pages are durable before the record that makes them current.
    store.dev.flush()?;
    write_record_copies(
        &store,
        geo.journal_start[(txn % 2) as usize],
        &arbor_format::record_copies(version, geo.journal_pages),
        &journal,
    )?;
    store.dev.flush()?;
    Ok(RepairReport { actions, txn })
}

/// Rewrites every home page of one space map whose counts differ from
/// `counts` (or that does not verify); returns the entries in use.
fn rewrite_map(
    store: &Store,
    kind: SmKind,
    counts: &[u32],
    txn: u64,
    actions: &mut Vec<String>,
) -> Result<u64> {
    let mut rewritten = 0;
    let mut fixed_entries = 0;
    for (index, want) in counts.chunks(SM_ENTRIES_PER_PAGE).enumerate() {
        // Pages per map fit in u32 (checked when the space map is opened).
        let index = index as u32;
        let mut page = SmPage::empty(kind, index);
        page.txn = txn;
        page.counts[..want.len()].copy_from_slice(want);
        let home = store.geo.sm_home(kind, index)?;
        let raw = store.read_block(home)?;
        match SmPage::decode(&raw[..], (kind, index)) {
            Ok(old) if old.counts == page.counts => continue,
            Ok(old) => {
                fixed_entries += old
                    .counts
                    .iter()
                    .zip(page.counts.iter())
                    .filter(|(a, b)| a != b)
                    .count();
            }
            Err(_) => fixed_entries += want.len(),
        }
        store.write_block(home, &page.encode())?;
        rewritten += 1;
    }
    if rewritten > 0 {
        actions.push(format!(
            "{kind:?} space map: rewrote {rewritten} pages ({fixed_entries} counts corrected or restored)"
        ));
    }
    Ok(counts.iter().filter(|&&c| c != 0).count() as u64)
}
