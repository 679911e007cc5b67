//! Making a backup of a snapshot (docs/BACKUP.md, "Making a backup"):
//! the blocks that changed since the newest backup of an older snapshot of
//! the same volume that this pool still has (all mapped blocks for the
//! first), read from the engine, named by their keyed hash, and only those
//! the repository lacks sealed into packs and uploaded, several at once;
//! then the index of the new packs, then the backup's manifest. A backup
//! cut off at any point leaves packs (and indexes) that the next one finds
//! and does not upload again, and no manifest: nothing refers to half a
//! backup.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use arbor_engine::{Pool, VolumeId, VolumeInfo};
use bytes::Bytes;
use futures::StreamExt;
use tokio::task::JoinSet;

use crate::crypto::BlobId;
use crate::format::checkpoint::{self, Checkpoint};
use crate::format::index::PackEntries;
use crate::format::manifest::{self, Manifest, Piece, PIECE_BLOCKS};
use crate::format::pack::{self, PackWriter, Sealed};
use crate::format::{BlobKind, ObjectId, REPO_VERSION};
use crate::lock::{LockKind, RepoLock};
use crate::repo::{BackupError, Progress, Repository, Result};
use crate::store::names;

/// Packs uploading at once.
pub const UPLOADS_IN_FLIGHT: usize = 4;
/// New packs between two index objects: what a backup cut off has
/// uploaded without an index (found again from the packs' headers).
pub const PACKS_PER_INDEX: usize = 16;
/// Bytes of blocks read from the pool in one batch.
const READ_BATCH: u64 = 8 << 20;

/// A backup made.
#[derive(Debug, Clone)]
pub struct Made {
    pub id: ObjectId,
    pub manifest: Manifest,
    /// The backup it was made from (incremental), if any.
    pub base: Option<ObjectId>,
    /// Map pieces a checkpoint of an earlier run that was cut off had
    /// done: not read again.
    pub resumed_pieces: u64,
}

/// The hold tag a repository puts on the newest snapshot of each volume
/// it has backed up (the base of the next incremental backup).
pub fn hold_tag(repo_id: &str) -> String {
    format!("backup-{}", &repo_id[..repo_id.len().min(16)])
}

/// Runs `f` on a blocking thread (engine calls block on disk I/O).
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| BackupError::Internal(format!("a pool task: {e}")))?
}

/// Packs being filled and uploaded.
struct Uploads<'r> {
    repo: &'r Repository,
    current: PackWriter,
    running: JoinSet<Result<(ObjectId, Vec<pack::Entry>, u64)>>,
    unindexed: Vec<PackEntries>,
    /// Blobs sealed by this backup, not yet in the index.
    pending: HashSet<BlobId>,
    added_blobs: u64,
    added_bytes: u64,
}

impl<'r> Uploads<'r> {
    fn new(repo: &'r Repository) -> Self {
        Uploads {
            repo,
            current: PackWriter::new(),
            running: JoinSet::new(),
            unindexed: Vec::new(),
            pending: HashSet::new(),
            added_blobs: 0,
            added_bytes: 0,
        }
    }

    /// Whether the repository or this backup already has `id`.
    fn has(&self, id: &BlobId) -> bool {
        self.pending.contains(id) || self.repo.index().blobs.contains_key(id)
    }

    async fn add(&mut self, sealed: Sealed, progress: &Progress) -> Result<()> {
        if self.has(&sealed.id) {
            return Ok(());
        }
        self.pending.insert(sealed.id);
        self.added_blobs += 1;
        self.added_bytes += sealed.bytes.len() as u64;
        self.current.add(sealed);
        if self.current.is_full() {
            self.send(progress).await?;
        }
        Ok(())
    }

    /// Finishes the current pack and starts its upload, after waiting for
    /// a slot.
    async fn send(&mut self, progress: &Progress) -> Result<()> {
        if self.current.is_empty() {
            return Ok(());
        }
        while self.running.len() >= UPLOADS_IN_FLIGHT {
            self.reap_one(progress).await?;
        }
        let full = std::mem::take(&mut self.current);
        let keys = Arc::clone(&self.repo.keys);
        let (id, bytes, entries) = blocking(move || Ok(full.finish(&keys))).await?;
        let store = self.repo.store.clone();
        let pace = self.repo.pace.clone();
        self.running.spawn(async move {
            let len = bytes.len() as u64;
            if let Some(pace) = pace {
                pace.take(len).await;
            }
            store.put(&names::pack(&id), Bytes::from(bytes)).await?;
            Ok((id, entries, len))
        });
        Ok(())
    }

    async fn reap_one(&mut self, progress: &Progress) -> Result<()> {
        let Some(done) = self.running.join_next().await else {
            return Ok(());
        };
        let (id, entries, len) =
            done.map_err(|e| BackupError::Internal(format!("an upload task: {e}")))??;
        Progress::add(&progress.store_bytes, len);
        Progress::add(&progress.objects, 1);
        {
            let mut index = self.repo.index();
            index.add(id, &entries);
        }
        for e in &entries {
            self.pending.remove(&e.id);
        }
        self.unindexed.push(PackEntries { pack: id, entries });
        if self.unindexed.len() >= PACKS_PER_INDEX {
            let packs = std::mem::take(&mut self.unindexed);
            self.repo.write_index(&packs).await?;
            Progress::add(&progress.objects, 1);
        }
        Ok(())
    }

    /// Uploads what is left and indexes every new pack: afterwards every
    /// blob added so far is in the store and in an index object.
    async fn barrier(&mut self, progress: &Progress) -> Result<()> {
        self.send(progress).await?;
        while !self.running.is_empty() {
            self.reap_one(progress).await?;
        }
        let packs = std::mem::take(&mut self.unindexed);
        if !packs.is_empty() {
            self.repo.write_index(&packs).await?;
            Progress::add(&progress.objects, 1);
        }
        Ok(())
    }
}

/// What a backup starts from: the newest backup of an older snapshot of
/// the same volume that this pool still holds, and that snapshot.
struct Base {
    id: ObjectId,
    manifest: Manifest,
    snapshot: VolumeId,
}

impl Repository {
    /// Backs up snapshot `snapshot` of `pool`; `host` names this host in
    /// the backup. Incremental when a base is found (see the module).
    pub async fn backup(
        &self,
        pool: Arc<Pool>,
        snapshot: &str,
        host: &str,
        progress: &Progress,
    ) -> Result<Made> {
        let lock = self
            .lock(LockKind::Shared, &format!("backup {snapshot}"))
            .await?;
        let made = self
            .backup_locked(pool, snapshot, host, progress, &lock)
            .await;
        lock.release().await;
        made
    }

    async fn backup_locked(
        &self,
        pool: Arc<Pool>,
        snapshot: &str,
        host: &str,
        progress: &Progress,
        lock: &RepoLock,
    ) -> Result<Made> {
        let target = {
            let pool = Arc::clone(&pool);
            let name = snapshot.to_owned();
            blocking(move || {
                let info = pool.info(pool.lookup(&name)?)?;
                if !info.snapshot {
                    return Err(BackupError::Refused(format!(
                        "{name} is not a snapshot: back up snapshots, which do not change while \
                         they are read"
                    )));
                }
                if info.guid.is_none() {
                    return Err(BackupError::Refused(format!(
                        "{name} has no identity: this pool's format predates them; upgrade it \
                         (arbor pool upgrade)"
                    )));
                }
                // A snapshot taken with deferred durability exists only from
                // the next commit: a backup must not outlive it.
                if !info.durable {
                    pool.flush()?;
                }
                Ok(info)
            })
            .await?
        };
        let guid = target.guid.map(hex::encode).unwrap_or_default();
        let base = self.find_base(&pool, &target).await?;
        let block_size = u64::from(self.block_size());
        let size = target.size;
        let blocks = size.div_ceil(block_size);
        let pieces = Manifest::pieces_for(size, self.block_size());
        Progress::add(&progress.total_bytes, size);
        let mut manifest = Manifest {
            version: REPO_VERSION,
            volume: target
                .name
                .split_once('@')
                .map_or(target.name.as_str(), |(v, _)| v)
                .to_owned(),
            snapshot: target.name.clone(),
            guid,
            host: host.to_owned(),
            created_unix: target.created_unix_secs,
            completed_unix_ms: 0,
            size,
            block_size: self.block_size(),
            parent: base.as_ref().map(|b| b.id.to_string()),
            pieces: vec![None; usize::try_from(pieces).unwrap_or(0)],
            blocks: 0,
            added_blobs: 0,
            added_bytes: 0,
        };

        // Where an earlier run of this backup was cut off, if it left a
        // checkpoint: its pieces are done.
        let checkpoint_name = names::checkpoint(&checkpoint::name_of(
            &self.keys,
            &manifest.guid,
            manifest.parent.as_deref(),
        ));
        let resumed = self.resumable(&checkpoint_name, &manifest).await;
        let first_piece = resumed.as_ref().map_or(0, |c| c.done);
        if let Some(c) = resumed {
            manifest.pieces = c.manifest.pieces;
            manifest.blocks = c.manifest.blocks;
            manifest.added_blobs = c.manifest.added_blobs;
            manifest.added_bytes = c.manifest.added_bytes;
            Progress::add(
                &progress.done_bytes,
                (first_piece * PIECE_BLOCKS * block_size).min(size),
            );
        }
        let (resumed_blobs, resumed_bytes) = (manifest.added_blobs, manifest.added_bytes);

        // The base's map pieces, read ahead in order, several at once: one
        // after another, their round trips to the store were most of an
        // incremental backup's time.
        let base_pieces: Vec<Option<BlobId>> = base
            .as_ref()
            .map(|b| b.manifest.piece_ids())
            .unwrap_or_default();
        let base_what = base
            .as_ref()
            .map(|b| format!("backup {}", b.id))
            .unwrap_or_default();
        let mut base_maps = futures::stream::iter(
            base_pieces
                .into_iter()
                .skip(usize::try_from(first_piece).unwrap_or(usize::MAX)),
        )
        .map(|piece| {
            let what = &base_what;
            async move {
                match piece {
                    Some(id) => self.read_piece(&id, what).await.map(Some),
                    None => Ok(None),
                }
            }
        })
        .buffered(crate::restore::READS_IN_FLIGHT);
        let mut uploads = Uploads::new(self);
        let mut checkpointed = std::time::Instant::now();
        let mut wrote_checkpoint = false;
        for p in first_piece..pieces {
            let first = p * PIECE_BLOCKS;
            let last = (first + PIECE_BLOCKS).min(blocks);
            let (start, end) = (first * block_size, (last * block_size).min(size));
            // The base's map of this piece, and the blocks to read.
            let mut map: BTreeMap<u32, BlobId> = BTreeMap::new();
            let changed: Vec<u64> = match &base {
                Some(base) => {
                    // One per piece: the base has this backup's size.
                    if let Some(piece) = base_maps.next().await.transpose()?.flatten() {
                        map = piece.0.into_iter().collect();
                    }
                    let (pool, b, t) = (Arc::clone(&pool), base.snapshot, target.id);
                    let ranges = blocking(move || Ok(pool.diff_in(b, t, start, end)?)).await?;
                    blocks_of(ranges.into_iter(), start, end, block_size)
                }
                None => {
                    let (pool, t) = (Arc::clone(&pool), target.id);
                    let runs =
                        blocking(move || Ok(pool.allocation_map(t, start, end - start)?)).await?;
                    blocks_of(
                        runs.into_iter()
                            .filter(|r| r.mapped)
                            .map(|r| (r.offset, r.len)),
                        start,
                        end,
                        block_size,
                    )
                }
            };
            Progress::add(
                &progress.done_bytes,
                (end - start).saturating_sub(changed.len() as u64 * block_size),
            );
            for batch in
                changed.chunks(usize::try_from(READ_BATCH / block_size).unwrap_or(1).max(1))
            {
                let read = self
                    .read_blocks(&pool, target.id, size, batch.to_vec(), &uploads)
                    .await?;
                for (block, outcome) in read {
                    // Within this piece: at most PIECE_BLOCKS.
                    let at = u32::try_from(block - first).unwrap_or(u32::MAX);
                    match outcome {
                        Block::Zeros => {
                            map.remove(&at);
                        }
                        Block::Known(id) => {
                            map.insert(at, id);
                        }
                        Block::New(sealed) => {
                            map.insert(at, sealed.id);
                            uploads.add(sealed, progress).await?;
                        }
                    }
                }
                Progress::add(&progress.done_bytes, batch.len() as u64 * block_size);
            }
            manifest.blocks += map.len() as u64;
            if !map.is_empty() {
                let bytes = Piece(map.into_iter().collect()).encode();
                let id = self.keys.blob_id(BlobKind::Map.code(), &bytes);
                if !uploads.has(&id) {
                    let keys = Arc::clone(&self.keys);
                    let sealed =
                        blocking(move || Ok(pack::seal_blob(&keys, id, BlobKind::Map, &bytes)))
                            .await?;
                    uploads.add(sealed, progress).await?;
                }
                // In range: the manifest has a slot per piece.
                if let Some(slot) = manifest
                    .pieces
                    .get_mut(usize::try_from(p).unwrap_or(usize::MAX))
                {
                    *slot = Some(id.to_string());
                }
            }
            if p + 1 < pieces && checkpointed.elapsed() >= self.checkpoint_every {
                // Every blob of the pieces done is uploaded and indexed
                // before the checkpoint names them.
                uploads.barrier(progress).await?;
                let checkpoint = Checkpoint {
                    done: p + 1,
                    manifest: Manifest {
                        completed_unix_ms: now_ms(),
                        added_blobs: resumed_blobs + uploads.added_blobs,
                        added_bytes: resumed_bytes + uploads.added_bytes,
                        ..manifest.clone()
                    },
                };
                lock.check()?;
                self.store
                    .put(
                        &checkpoint_name,
                        Bytes::from(checkpoint::encode(&self.keys, &checkpoint)),
                    )
                    .await?;
                Progress::add(&progress.objects, 1);
                wrote_checkpoint = true;
                checkpointed = std::time::Instant::now();
            }
        }
        uploads.barrier(progress).await?;
        manifest.added_blobs = resumed_blobs + uploads.added_blobs;
        manifest.added_bytes = resumed_bytes + uploads.added_bytes;
        manifest.completed_unix_ms = now_ms();
        let bytes = manifest::encode(&self.keys, &manifest);
        let id = ObjectId::of(&bytes);
        // Written only under a lock surely held: a prune that took this
        // backup's lock for stale may have deleted what it refers to.
        lock.check()?;
        self.store
            .put(&names::snapshot(&id), Bytes::from(bytes))
            .await?;
        Progress::add(&progress.objects, 1);
        if wrote_checkpoint || first_piece > 0 {
            // The backup is whole: its checkpoint is no longer needed (one
            // left behind is harmless, and the next prune removes it once
            // old).
            if let Err(e) = self.store.delete(&checkpoint_name).await {
                tracing::warn!(error = %crate::error_chain(&e), "a completed backup's checkpoint stays");
            }
        }
        // The snapshot is the next backup's base: held until a newer one
        // is backed up.
        {
            let pool = Arc::clone(&pool);
            let tag = hold_tag(self.id());
            let name = target.name.clone();
            let parent = target.parent;
            blocking(move || hold_newest(&pool, &name, parent, &tag)).await?;
        }
        Ok(Made {
            id,
            manifest,
            base: base.map(|b| b.id),
            resumed_pieces: first_piece,
        })
    }

    /// The checkpoint at `name` if an earlier run of this backup left one
    /// that it can go on from: the same snapshot, base and geometry, every
    /// map piece it names in the index. Any other is ignored (the backup
    /// starts from its first piece, and uploads only what the store lacks).
    async fn resumable(&self, name: &str, template: &Manifest) -> Option<Checkpoint> {
        // The store's listing under the lock: most backups have none, and
        // need no read to know it.
        if !self.index().checkpoints.contains(name) {
            return None;
        }
        let bytes = match self.store.get(name).await {
            Ok(Some(bytes)) => bytes,
            Ok(None) => return None,
            Err(e) => {
                tracing::warn!(error = %crate::error_chain(&e), "a backup's checkpoint cannot be read: the backup starts from the beginning");
                return None;
            }
        };
        let c = match checkpoint::decode(&self.keys, &bytes) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "a backup's checkpoint is damaged: the backup starts from the beginning");
                return None;
            }
        };
        let m = &c.manifest;
        if m.guid != template.guid
            || m.parent != template.parent
            || m.size != template.size
            || m.block_size != template.block_size
        {
            return None;
        }
        let index = self.index();
        if m.piece_ids()
            .iter()
            .flatten()
            .any(|id| !index.blobs.contains_key(id))
        {
            tracing::warn!("a backup's checkpoint names a map piece the repository lacks: the backup starts from the beginning");
            return None;
        }
        Some(c)
    }

    async fn find_base(&self, pool: &Arc<Pool>, target: &VolumeInfo) -> Result<Option<Base>> {
        let listed = self.list().await?;
        let pool = Arc::clone(pool);
        let (parent, created, target_id) = (target.parent, target.created_txn, target.id);
        let candidates: Vec<_> = listed
            .into_iter()
            .filter(|l| l.manifest.block_size == self.block_size())
            .collect();
        blocking(move || {
            let mut best: Option<(u64, Base)> = None;
            for l in candidates {
                let Some(guid) = hex::decode(&l.manifest.guid)
                    .ok()
                    .and_then(|g| <[u8; 16]>::try_from(g).ok())
                else {
                    continue;
                };
                let Some(local) = pool.find_guid(&guid)? else {
                    continue;
                };
                let info = pool.info(local)?;
                if info.parent != parent
                    || info.created_txn >= created
                    || info.size != l.manifest.size
                    || pool.check_diff(local, target_id).is_err()
                {
                    continue;
                }
                if best.as_ref().is_none_or(|(c, _)| info.created_txn > *c) {
                    best = Some((
                        info.created_txn,
                        Base {
                            id: l.id,
                            manifest: l.manifest,
                            snapshot: local,
                        },
                    ));
                }
            }
            Ok(best.map(|(_, b)| b))
        })
        .await
    }

    /// Reads `blocks` of `volume` and names each: zeros, a blob the
    /// repository or this backup has, or a new blob sealed.
    async fn read_blocks(
        &self,
        pool: &Arc<Pool>,
        volume: VolumeId,
        size: u64,
        blocks: Vec<u64>,
        uploads: &Uploads<'_>,
    ) -> Result<Vec<(u64, Block)>> {
        let block_size = u64::from(self.block_size());
        let pool = Arc::clone(pool);
        let keys = Arc::clone(&self.keys);
        let read: Vec<(u64, Option<Named>)> = blocking(move || {
            let mut out = Vec::with_capacity(blocks.len());
            for block in blocks {
                let offset = block * block_size;
                let len = block_size.min(size - offset);
                // At most a block (1 MiB).
                let mut buf = vec![0u8; len as usize];
                pool.read(volume, offset, &mut buf)?;
                if buf.iter().all(|&b| b == 0) {
                    out.push((block, None));
                    continue;
                }
                let id = keys.blob_id(BlobKind::Data.code(), &buf);
                out.push((block, Some((id, buf))));
            }
            Ok(out)
        })
        .await?;
        // Seal only what the repository lacks (on a blocking thread: zstd
        // and the cipher are CPU work).
        let mut seen = HashSet::new();
        let (known, new): (Vec<_>, Vec<_>) = read.into_iter().partition(|(_, r)| match r {
            Some((id, _)) => uploads.has(id) || !seen.insert(*id),
            None => true,
        });
        let keys = Arc::clone(&self.keys);
        let sealed: Vec<(u64, Sealed)> = blocking(move || {
            Ok(new
                .into_iter()
                .filter_map(|(block, r)| {
                    let (id, buf) = r?;
                    Some((block, pack::seal_blob(&keys, id, BlobKind::Data, &buf)))
                })
                .collect())
        })
        .await?;
        let mut out: Vec<(u64, Block)> = known
            .into_iter()
            .map(|(block, r)| (block, r.map_or(Block::Zeros, |(id, _)| Block::Known(id))))
            .chain(sealed.into_iter().map(|(block, s)| (block, Block::New(s))))
            .collect();
        out.sort_by_key(|(block, _)| *block);
        Ok(out)
    }
}

/// A block read that is not all zeros: its blob id and bytes.
type Named = (BlobId, Vec<u8>);

enum Block {
    Zeros,
    Known(BlobId),
    New(Sealed),
}

/// The blocks (of `block_size`) that byte ranges touch, within
/// `[start, end)`, in order and once each.
fn blocks_of(
    ranges: impl Iterator<Item = (u64, u64)>,
    start: u64,
    end: u64,
    block_size: u64,
) -> Vec<u64> {
    let mut out: Vec<u64> = Vec::new();
    for (offset, len) in ranges {
        let (from, to) = (offset.max(start), offset.saturating_add(len).min(end));
        if from >= to {
            continue;
        }
        for b in from / block_size..to.div_ceil(block_size) {
            if out.last().is_none_or(|&l| l < b) {
                out.push(b);
            }
        }
    }
    out.dedup();
    out
}

/// Holds `snapshot` with `tag` and releases the tag from the volume's
/// older snapshots (a newer one backed up before keeps it: it stays the
/// next backup's base).
fn hold_newest(pool: &Pool, snapshot: &str, volume: Option<VolumeId>, tag: &str) -> Result<()> {
    pool.hold(snapshot, tag)?;
    let Some(volume) = volume else {
        return Ok(());
    };
    let keep = pool.info(pool.lookup(snapshot)?)?;
    for info in pool.list()? {
        if info.snapshot
            && info.parent == Some(volume)
            && info.created_txn < keep.created_txn
            && pool.holds(info.id)?.iter().any(|t| t == tag)
        {
            pool.release(&info.name, tag)?;
        }
    }
    Ok(())
}

pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_of_ranges_are_in_order_once_and_clipped() {
        let b = 65536;
        assert_eq!(blocks_of([(0, 1)].into_iter(), 0, 10 * b, b), vec![0]);
        assert_eq!(
            blocks_of(
                [(b - 1, 2), (b + 5, 10), (5 * b, b)].into_iter(),
                0,
                10 * b,
                b
            ),
            vec![0, 1, 5]
        );
        assert_eq!(
            blocks_of([(0, 100 * b)].into_iter(), 2 * b, 4 * b, b),
            vec![2, 3]
        );
    }
}
