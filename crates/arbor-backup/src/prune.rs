//! `prune` (docs/BACKUP.md, "Pruning"): forgets the backups a caller's
//! retention chooses, then deletes every object no remaining backup
//! needs, under the repository's only lock.
//!
//! Marking: every remaining backup's map pieces and the blobs they name
//! (a piece shared by many backups is read once). Each blob needed has one
//! home, the first pack (in id order) holding it; its other copies are
//! unused. A pack with no used blob is deleted; a pack at least
//! `repack_unused_percent` unused is repacked: its used blobs, each opened
//! and checked first, are copied as they are sealed into new packs, and it
//! is deleted.
//!
//! The order makes every cut-off safe: new packs are written first (a
//! prune that fails here deletes them and leaves no trace); then the
//! forgotten manifests are deleted; then one new set of index objects
//! lists every pack that stays; then the old index objects are deleted;
//! then the packs. Until the old indexes are gone no pack is deleted, so no
//! index ever lists a deleted pack; packs left behind by a cut-off are
//! read from their headers at the next open and deleted by the next prune.

use std::collections::{HashMap, HashSet};

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};

use crate::crypto::BlobId;
use crate::format::checkpoint::{self, Checkpoint};
use crate::format::index::{self, PackEntries};
use crate::format::manifest::Manifest;
use crate::format::pack::{self, PackWriter, Sealed, TARGET_PACK_BYTES};
use crate::format::ObjectId;
use crate::lock::{LockKind, OtherLock, RepoLock};
use crate::repo::{damaged, BackupError, Census, Listing, Progress, Repository, Result};
use crate::restore::READS_IN_FLIGHT;
use crate::store::names;

/// Packs listed by one index object a prune writes.
const PACKS_PER_PRUNE_INDEX: usize = 256;

/// How a prune runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PruneOptions {
    /// Say what would be done; change nothing.
    pub dry_run: bool,
    /// Repack a pack when at least this much of it (by bytes) is unused.
    pub repack_unused_percent: u8,
    /// Packs smaller than this (each backup's last one, a checkpoint's)
    /// are combined: repacked together, with any pack repacked for its
    /// unused bytes, when there are two or more to repack. 0: never.
    pub small_pack_bytes: u64,
}

/// Packs below half the size a backup writes are small
/// ([`PruneOptions::small_pack_bytes`]).
pub const SMALL_PACK_BYTES: u64 = TARGET_PACK_BYTES as u64 / 2;

impl Default for PruneOptions {
    fn default() -> Self {
        PruneOptions {
            dry_run: false,
            repack_unused_percent: 25,
            small_pack_bytes: SMALL_PACK_BYTES,
        }
    }
}

/// What a prune did, or in a dry run would do. Names are object names in
/// the store.
#[derive(Debug, Clone, Default)]
pub struct Pruned {
    pub dry_run: bool,
    /// Backups forgotten (their manifests deleted).
    pub forgotten: Vec<Listing>,
    /// Backups that stay.
    pub kept_backups: u64,
    /// Packs deleted: no backup needs a blob of theirs.
    pub deleted_packs: Vec<String>,
    /// Packs repacked: their used blobs copied into new packs, then
    /// deleted.
    pub repacked_packs: Vec<String>,
    /// Those of `repacked_packs` repacked for being small
    /// ([`PruneOptions::small_pack_bytes`]), not for their unused bytes.
    pub small_packs: Vec<String>,
    /// Index objects replaced by the new ones.
    pub replaced_indexes: Vec<String>,
    /// New packs and index objects written (in a dry run, how many).
    pub written_packs: u64,
    pub written_indexes: u64,
    /// Blobs that stay, and blobs (or extra copies) deleted.
    pub kept_blobs: u64,
    pub removed_blobs: u64,
    /// Bytes of packs before, and after.
    pub bytes_before: u64,
    pub bytes_after: u64,
    /// Stale locks found, and deleted (a dry run deletes none).
    pub stale_locks: Vec<String>,
    /// Checkpoints of unfinished backups whose blobs stay, and those
    /// deleted (older than [`CHECKPOINT_MAX_AGE`], or damaged).
    pub kept_checkpoints: u64,
    pub deleted_checkpoints: Vec<String>,
}

/// A checkpoint older than this is deleted by a prune, and what only it
/// named with it: the backup it saves was not run again for a week.
pub const CHECKPOINT_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(7 * 24 * 3600);

/// Which packs go, which are rewritten, which stay.
#[derive(Default)]
struct Plan {
    delete: Vec<ObjectId>,
    repack: Vec<ObjectId>,
    /// Those of `repack` there for being small.
    small: Vec<ObjectId>,
    keep: Vec<ObjectId>,
    /// Per blob needed, its home pack.
    homes: HashMap<BlobId, ObjectId>,
    /// Bytes of used blobs in the packs to repack.
    repack_used_bytes: u64,
    kept_blobs: u64,
    removed_blobs: u64,
}

impl Repository {
    /// Forgets the backups `choose` picks from every backup (oldest first),
    /// and deletes what no remaining backup needs. See the module.
    pub async fn prune(
        &self,
        choose: impl FnOnce(&[Listing]) -> Vec<ObjectId>,
        options: PruneOptions,
        progress: &Progress,
    ) -> Result<Pruned> {
        let (lock, census) = self.lock_with_census(LockKind::Exclusive, "prune").await?;
        let stale: Vec<String> = lock
            .stale
            .iter()
            .map(|o: &OtherLock| format!("{o}: stale, {}", o.stale.as_deref().unwrap_or("")))
            .collect();
        if !options.dry_run {
            if let Err(e) = lock.delete_stale().await {
                lock.release().await;
                return Err(e);
            }
        }
        let pruned = self
            .prune_locked(choose, options, progress, &lock, census)
            .await;
        lock.release().await;
        pruned.map(|mut p| {
            p.stale_locks = stale;
            p
        })
    }

    async fn prune_locked(
        &self,
        choose: impl FnOnce(&[Listing]) -> Vec<ObjectId>,
        options: PruneOptions,
        progress: &Progress,
        lock: &RepoLock,
        census: Census,
    ) -> Result<Pruned> {
        let mut out = Pruned {
            dry_run: options.dry_run,
            ..Pruned::default()
        };
        // Every backup must open: a prune cannot know what a damaged one
        // needs, so it deletes nothing.
        let all = self.list().await?;
        let forget: HashSet<ObjectId> = choose(&all).into_iter().collect();
        let (forgotten, kept): (Vec<Listing>, Vec<Listing>) =
            all.into_iter().partition(|l| forget.contains(&l.id));
        out.kept_backups = kept.len() as u64;
        // Unfinished backups' checkpoints keep what they name, until old.
        let (checkpoints, stale_checkpoints) = self.checkpoints(&census.checkpoints).await?;
        out.kept_checkpoints = checkpoints.len() as u64;
        out.deleted_checkpoints = stale_checkpoints;

        let roots: Vec<(String, &Manifest)> = kept
            .iter()
            .map(|l| {
                (
                    format!("backup {} ({})", l.id, l.manifest.snapshot),
                    &l.manifest,
                )
            })
            .chain(
                checkpoints
                    .iter()
                    .map(|(name, c)| (format!("checkpoint {name}"), &c.manifest)),
            )
            .collect();
        let used = self.mark(&roots).await?;
        let plan = plan(&census, &used, &options)?;
        let packs_change = !plan.delete.is_empty() || !plan.repack.is_empty();
        let size = |id: &ObjectId| census.packs.get(id).and_then(|p| p.size).unwrap_or(0);
        out.bytes_before = census.packs.keys().map(size).sum();
        out.kept_blobs = plan.kept_blobs;
        out.removed_blobs = plan.removed_blobs;
        out.deleted_packs = plan.delete.iter().map(names::pack).collect();
        out.repacked_packs = plan.repack.iter().map(names::pack).collect();
        out.small_packs = plan.small.iter().map(names::pack).collect();
        let kept_bytes: u64 = plan.keep.iter().map(size).sum();
        // What a dry run reports; a prune replaces the estimates by what it
        // wrote. Indexes are rewritten only when packs go.
        out.bytes_after = kept_bytes + plan.repack_used_bytes;
        out.written_packs = plan.repack_used_bytes.div_ceil(TARGET_PACK_BYTES as u64);
        if packs_change {
            out.replaced_indexes = census.indexes.clone();
            out.written_indexes =
                (plan.keep.len() as u64 + out.written_packs).div_ceil(PACKS_PER_PRUNE_INDEX as u64);
        }
        if options.dry_run
            || (forgotten.is_empty() && !packs_change && out.deleted_checkpoints.is_empty())
        {
            out.forgotten = forgotten;
            return Ok(out);
        }

        // 1. New packs holding the used blobs of the packs to repack. A
        // damaged pack stops the prune here, and what it wrote is deleted.
        let mut listed: Vec<PackEntries> = plan
            .keep
            .iter()
            .filter_map(|id| match &census.packs.get(id)?.entries {
                Ok(entries) => Some(PackEntries {
                    pack: *id,
                    entries: entries.clone(),
                }),
                Err(_) => None,
            })
            .collect();
        let mut written = Vec::new();
        if let Err(e) = self.repack(&plan, progress, lock, &mut written).await {
            for (p, _) in &written {
                let _ = self.store.delete(&names::pack(&p.pack)).await;
            }
            return Err(e);
        }
        // 2. The forgotten backups.
        lock.check()?;
        for l in &forgotten {
            self.store.delete(&names::snapshot(&l.id)).await?;
        }
        for name in &out.deleted_checkpoints {
            self.store.delete(name).await?;
        }
        out.forgotten = forgotten;
        if !packs_change {
            return Ok(out);
        }
        out.written_packs = written.len() as u64;
        out.bytes_after = kept_bytes + written.iter().map(|(_, size)| size).sum::<u64>();
        listed.extend(written.into_iter().map(|(p, _)| p));
        // 3. One new set of index objects for every pack that stays.
        lock.check()?;
        let mut new_indexes = HashSet::new();
        for chunk in listed.chunks(PACKS_PER_PRUNE_INDEX) {
            let bytes = index::encode(&self.keys, chunk);
            let name = names::index(&ObjectId::of(&bytes));
            self.store.put(&name, Bytes::from(bytes)).await?;
            new_indexes.insert(name);
            Progress::add(&progress.objects, 1);
        }
        out.written_indexes = new_indexes.len() as u64;
        // 4. The old index objects.
        lock.check()?;
        out.replaced_indexes.retain(|n| !new_indexes.contains(n));
        for name in &out.replaced_indexes {
            self.store.delete(name).await?;
        }
        // 5. The packs no index lists any more.
        lock.check()?;
        for id in plan.delete.iter().chain(&plan.repack) {
            self.store.delete(&names::pack(id)).await?;
        }
        Ok(out)
    }

    /// Every blob the `roots` (the backups kept, the checkpoints kept, each
    /// with what to call it) need: their map pieces and the data blobs
    /// those name.
    async fn mark(&self, roots: &[(String, &Manifest)]) -> Result<HashSet<BlobId>> {
        let mut pieces: Vec<(BlobId, String)> = Vec::new();
        let mut used: HashSet<BlobId> = HashSet::new();
        for (what, manifest) in roots {
            for piece in manifest.piece_ids().into_iter().flatten() {
                if used.insert(piece) {
                    pieces.push((piece, what.clone()));
                }
            }
        }
        let mut read = futures::stream::iter(pieces)
            .map(|(piece, what)| async move { self.read_piece(&piece, &what).await })
            .buffer_unordered(READS_IN_FLIGHT);
        while let Some(piece) = read.try_next().await? {
            used.extend(piece.0.iter().map(|(_, b)| *b));
        }
        Ok(used)
    }

    /// The checkpoints to keep (by object name), and the names of those to
    /// delete: older than [`CHECKPOINT_MAX_AGE`], or damaged (a checkpoint
    /// only saves reading again; without it a backup starts over).
    async fn checkpoints(
        &self,
        listed: &[String],
    ) -> Result<(Vec<(String, Checkpoint)>, Vec<String>)> {
        let (mut keep, mut delete) = (Vec::new(), Vec::new());
        let now = crate::backup::now_ms();
        for name in listed {
            let Some(bytes) = self.store.get(name).await? else {
                continue;
            };
            match checkpoint::decode(&self.keys, &bytes) {
                Ok(c)
                    if now.saturating_sub(c.manifest.completed_unix_ms)
                        < CHECKPOINT_MAX_AGE.as_millis() as u64 =>
                {
                    keep.push((name.clone(), c))
                }
                _ => delete.push(name.clone()),
            }
        }
        Ok((keep, delete))
    }

    /// Copies the used blobs of the packs to repack into new packs, each
    /// blob opened and checked first; adds each new pack, with its size,
    /// to `written`.
    async fn repack(
        &self,
        plan: &Plan,
        progress: &Progress,
        lock: &RepoLock,
        written: &mut Vec<(PackEntries, u64)>,
    ) -> Result<()> {
        let mut writer = PackWriter::new();
        for id in &plan.repack {
            let name = names::pack(id);
            let bytes = self.get_checked(&name, id).await?;
            Progress::add(&progress.store_bytes, bytes.len() as u64);
            let entries =
                pack::decode_pack(&self.keys, &bytes).map_err(|e| damaged(name.clone(), e))?;
            for e in entries.iter().filter(|e| plan.homes.get(&e.id) == Some(id)) {
                // In bounds: decode_pack checked every entry against the pack.
                let sealed = &bytes[e.offset as usize..e.end() as usize];
                pack::open_blob(&self.keys, e, sealed).map_err(|err| damaged(name.clone(), err))?;
                writer.add(Sealed {
                    id: e.id,
                    kind: e.kind,
                    encoding: e.encoding,
                    raw_len: e.raw_len,
                    bytes: sealed.to_vec(),
                });
                if writer.is_full() {
                    let full = std::mem::take(&mut writer);
                    written.push(self.put_pack(full, progress, lock).await?);
                }
            }
        }
        if !writer.is_empty() {
            written.push(self.put_pack(writer, progress, lock).await?);
        }
        Ok(())
    }

    async fn put_pack(
        &self,
        writer: PackWriter,
        progress: &Progress,
        lock: &RepoLock,
    ) -> Result<(PackEntries, u64)> {
        lock.check()?;
        let (id, bytes, entries) = writer.finish(&self.keys);
        let size = bytes.len() as u64;
        if let Some(pace) = &self.pace {
            pace.take(size).await;
        }
        self.store
            .put(&names::pack(&id), Bytes::from(bytes))
            .await?;
        Progress::add(&progress.objects, 1);
        Ok((PackEntries { pack: id, entries }, size))
    }
}

/// Decides each pack's fate. Every blob `used` needs must have a home in
/// a readable pack, or nothing is deleted.
fn plan(census: &Census, used: &HashSet<BlobId>, options: &PruneOptions) -> Result<Plan> {
    let mut out = Plan::default();
    // Only packs the store holds: one an index lists and the store does
    // not is no home, and nothing to delete.
    let held = || census.packs.iter().filter(|(_, p)| p.size.is_some());
    for (id, found) in held() {
        if let Ok(entries) = &found.entries {
            for e in entries.iter().filter(|e| used.contains(&e.id)) {
                out.homes.entry(e.id).or_insert(*id);
            }
        }
    }
    if let Some(missing) = used.iter().find(|b| !out.homes.contains_key(b)) {
        let damaged: Vec<&String> = held()
            .filter_map(|(_, p)| p.entries.as_ref().err())
            .collect();
        return Err(damaged_repository(missing, &damaged));
    }
    let percent = u64::from(options.repack_unused_percent.min(100));
    // Small packs that would stay: (id, used bytes, unused blobs).
    let mut small = Vec::new();
    for (id, found) in held() {
        let size = found.size.unwrap_or(0);
        let Ok(entries) = &found.entries else {
            // Its blobs are unknown, and no backup needs one: every needed
            // blob has a home elsewhere.
            out.delete.push(*id);
            continue;
        };
        let (mut used_bytes, mut used_blobs) = (0u64, 0u64);
        for e in entries {
            if out.homes.get(&e.id) == Some(id) {
                used_bytes += u64::from(e.stored_len);
                used_blobs += 1;
            }
        }
        let unused_blobs = entries.len() as u64 - used_blobs;
        out.kept_blobs += used_blobs;
        if used_blobs == 0 {
            out.delete.push(*id);
            out.removed_blobs += unused_blobs;
        } else if unused_blobs > 0 && size.saturating_sub(used_bytes) * 100 >= size * percent {
            out.repack.push(*id);
            out.repack_used_bytes += used_bytes;
            out.removed_blobs += unused_blobs;
        } else if size < options.small_pack_bytes {
            small.push((*id, used_bytes, unused_blobs));
        } else {
            out.keep.push(*id);
        }
    }
    // A small pack alone would only be copied into another as small: they
    // go when at least two packs are rewritten together.
    if small.len() + out.repack.len() >= 2 {
        for (id, used_bytes, unused_blobs) in small {
            out.repack.push(id);
            out.small.push(id);
            out.repack_used_bytes += used_bytes;
            out.removed_blobs += unused_blobs;
        }
    } else {
        out.keep.extend(small.into_iter().map(|(id, _, _)| id));
    }
    Ok(out)
}

fn damaged_repository(missing: &BlobId, damaged_packs: &[&String]) -> BackupError {
    let found = if damaged_packs.is_empty() {
        String::new()
    } else {
        format!(
            "; damaged packs: {}",
            damaged_packs
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join("; ")
        )
    };
    damaged(
        "the repository",
        crate::format::invalid(
            "a backup",
            format!(
                "needs blob {missing}, which no pack holds{found}: nothing was pruned (run \
                 verify)"
            ),
        ),
    )
}
