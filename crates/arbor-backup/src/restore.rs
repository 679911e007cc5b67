//! Reading blobs back, and restoring a backup into a new volume (docs/
//! BACKUP.md, "Restoring"): each map piece read, the blocks it maps read
//! from their packs with one ranged read per run of neighbouring blobs,
//! every blob authenticated and hashed back to its name before a byte of
//! it is written. A restore that fails removes the volume it made.

use std::collections::BTreeMap;
use std::sync::Arc;

use arbor_engine::{Pool, VolumeId};
use tokio::task::JoinSet;

use crate::crypto::BlobId;
use crate::format::manifest::{Manifest, Piece, PIECE_BLOCKS};
use crate::format::pack;
use crate::format::{BlobKind, ObjectId};
use crate::lock::LockKind;
use crate::repo::{damaged, BackupError, BlobAt, Progress, Repository, Result};
use crate::store::{names, Store};

/// Ranged reads in flight at once.
pub const READS_IN_FLIGHT: usize = 8;
/// Neighbouring blobs of one pack are read together up to this many bytes.
const MAX_RUN_BYTES: u64 = 8 << 20;
/// Neighbouring blocks are written to the pool together up to about this
/// many bytes.
const MAX_WRITE: usize = 4 << 20;

/// A restore done.
#[derive(Debug, Clone)]
pub struct Restored {
    pub volume: String,
    pub size: u64,
    pub blocks: u64,
}

impl Repository {
    /// One blob's plaintext, verified.
    pub(crate) async fn read_blob(
        &self,
        id: &BlobId,
        kind: BlobKind,
        needed_by: &str,
    ) -> Result<Vec<u8>> {
        let at = self.locate(id, needed_by)?;
        if at.entry.kind != kind {
            return Err(damaged(
                needed_by.to_owned(),
                crate::format::invalid(
                    "a backup",
                    format!("needs blob {id} as a {kind:?} blob; the repository holds it as another kind"),
                ),
            ));
        }
        let name = names::pack(&at.pack);
        let sealed = read_range(
            &self.store,
            &name,
            u64::from(at.entry.offset)..at.entry.end(),
        )
        .await?;
        pack::open_blob(&self.keys, &at.entry, &sealed).map_err(|e| damaged(name, e))
    }

    /// A map piece.
    pub(crate) async fn read_piece(&self, id: &BlobId, needed_by: &str) -> Result<Piece> {
        let bytes = self.read_blob(id, BlobKind::Map, needed_by).await?;
        Piece::decode(&bytes).map_err(|e| damaged(format!("map piece {id}"), e))
    }

    /// Restores backup `backup` into a new volume `volume` of `pool`.
    pub async fn restore(
        &self,
        backup: &ObjectId,
        pool: Arc<Pool>,
        volume: &str,
        progress: &Progress,
    ) -> Result<Restored> {
        // A prune must not delete a pack while it is read.
        let lock = self
            .lock(
                LockKind::Shared,
                &format!("restore {backup:?} into {volume}"),
            )
            .await?;
        let restored = self.restore_locked(backup, pool, volume, progress).await;
        lock.release().await;
        restored
    }

    async fn restore_locked(
        &self,
        backup: &ObjectId,
        pool: Arc<Pool>,
        volume: &str,
        progress: &Progress,
    ) -> Result<Restored> {
        let manifest = self.manifest(backup).await?;
        if manifest.block_size != self.block_size() {
            return Err(damaged(
                names::snapshot(backup),
                crate::format::invalid("a backup", "its block size is not the repository's"),
            ));
        }
        let id = {
            let (pool, name, size) = (Arc::clone(&pool), volume.to_owned(), manifest.size);
            tokio::task::spawn_blocking(move || pool.create_volume(&name, size))
                .await
                .map_err(|e| BackupError::Internal(format!("a pool task: {e}")))??
        };
        Progress::add(&progress.total_bytes, manifest.size);
        let restored = self
            .restore_into(backup, &manifest, &pool, id, progress)
            .await;
        let flushed = match restored {
            Ok(blocks) => {
                let pool = Arc::clone(&pool);
                tokio::task::spawn_blocking(move || pool.flush())
                    .await
                    .map_err(|e| BackupError::Internal(format!("a pool task: {e}")))?
                    .map(|()| blocks)
                    .map_err(BackupError::from)
            }
            Err(e) => Err(e),
        };
        match flushed {
            Ok(blocks) => Ok(Restored {
                volume: volume.to_owned(),
                size: manifest.size,
                blocks,
            }),
            Err(e) => {
                // Leaves no trace: the half-written volume goes.
                let (pool, name) = (Arc::clone(&pool), volume.to_owned());
                let _ = tokio::task::spawn_blocking(move || pool.delete(&name)).await;
                Err(e)
            }
        }
    }

    async fn restore_into(
        &self,
        backup: &ObjectId,
        manifest: &Manifest,
        pool: &Arc<Pool>,
        volume: VolumeId,
        progress: &Progress,
    ) -> Result<u64> {
        let mut reads: JoinSet<Result<u64>> = JoinSet::new();
        let restored = self
            .restore_pieces(backup, manifest, pool, volume, progress, &mut reads)
            .await;
        if restored.is_err() {
            // The writes in flight end before the caller deletes the
            // volume (a blocking write cannot be cancelled).
            while reads.join_next().await.is_some() {}
        }
        restored
    }

    async fn restore_pieces(
        &self,
        backup: &ObjectId,
        manifest: &Manifest,
        pool: &Arc<Pool>,
        volume: VolumeId,
        progress: &Progress,
        reads: &mut JoinSet<Result<u64>>,
    ) -> Result<u64> {
        let needed_by = format!("backup {backup}");
        let block_size = u64::from(manifest.block_size);
        let mut blocks = 0u64;
        for (p, piece) in manifest.piece_ids().into_iter().enumerate() {
            let piece_bytes = (PIECE_BLOCKS * block_size)
                .min(manifest.size - p as u64 * PIECE_BLOCKS * block_size);
            let Some(piece) = piece else {
                Progress::add(&progress.done_bytes, piece_bytes);
                continue;
            };
            let entries = self.read_piece(&piece, &needed_by).await?;
            let unmapped = piece_bytes.saturating_sub(entries.0.len() as u64 * block_size);
            Progress::add(&progress.done_bytes, unmapped);
            blocks += entries.0.len() as u64;
            // Group by pack, in pack order: runs of neighbouring blobs.
            let mut by_pack: BTreeMap<ObjectId, Vec<(u64, BlobAt)>> = BTreeMap::new();
            for (i, blob) in &entries.0 {
                let at = self.locate(blob, &needed_by)?;
                if at.entry.kind != BlobKind::Data {
                    return Err(damaged(
                        needed_by.clone(),
                        crate::format::invalid(
                            "a backup",
                            format!("maps block {i} to blob {blob}, which is not a data blob"),
                        ),
                    ));
                }
                let block = p as u64 * PIECE_BLOCKS + u64::from(*i);
                by_pack.entry(at.pack).or_default().push((block, at));
            }
            for (pack_id, mut list) in by_pack {
                list.sort_by_key(|(_, at)| at.entry.offset);
                for run in runs(&list) {
                    while reads.len() >= READS_IN_FLIGHT {
                        if let Some(done) = reads.join_next().await {
                            let fetched = done.map_err(|e| {
                                BackupError::Internal(format!("a restore task: {e}"))
                            })??;
                            Progress::add(&progress.store_bytes, fetched);
                        }
                    }
                    let run = run.to_vec();
                    let (store, keys, pool) =
                        (self.store.clone(), Arc::clone(&self.keys), Arc::clone(pool));
                    let size = manifest.size;
                    reads.spawn(async move {
                        let name = names::pack(&pack_id);
                        let from = u64::from(run[0].1.entry.offset);
                        let to = run.last().map_or(from, |(_, at)| at.entry.end());
                        let bytes = read_range(&store, &name, from..to).await?;
                        let fetched = bytes.len() as u64;
                        tokio::task::spawn_blocking(move || -> Result<u64> {
                            // Neighbouring blocks go to the pool in one
                            // write (one mapping step, not one per block).
                            let mut pending: Option<(u64, Vec<u8>)> = None;
                            for (block, at) in &run {
                                let start = (u64::from(at.entry.offset) - from) as usize;
                                let end = (at.entry.end() - from) as usize;
                                let sealed = bytes.get(start..end).ok_or_else(|| {
                                    damaged(
                                        name.clone(),
                                        crate::format::invalid(
                                            "a pack",
                                            "shorter than its index says",
                                        ),
                                    )
                                })?;
                                let plain = pack::open_blob(&keys, &at.entry, sealed)
                                    .map_err(|e| damaged(name.clone(), e))?;
                                let offset = block * block_size;
                                let expected = block_size.min(size - offset);
                                if plain.len() as u64 != expected {
                                    return Err(damaged(
                                        name.clone(),
                                        crate::format::invalid(
                                            "a blob",
                                            format!(
                                                "{} bytes for a block of {expected}",
                                                plain.len()
                                            ),
                                        ),
                                    ));
                                }
                                pending = match pending.take() {
                                    Some((at, mut buf))
                                        if at + buf.len() as u64 == offset
                                            && buf.len() < MAX_WRITE =>
                                    {
                                        buf.extend_from_slice(&plain);
                                        Some((at, buf))
                                    }
                                    Some((at, buf)) => {
                                        pool.write(volume, at, &buf)?;
                                        Some((offset, plain))
                                    }
                                    None => Some((offset, plain)),
                                };
                            }
                            if let Some((at, buf)) = pending {
                                pool.write(volume, at, &buf)?;
                            }
                            Ok(fetched)
                        })
                        .await
                        .map_err(|e| BackupError::Internal(format!("a pool task: {e}")))?
                    });
                }
            }
            Progress::add(&progress.done_bytes, entries.0.len() as u64 * block_size);
        }
        while let Some(done) = reads.join_next().await {
            let fetched =
                done.map_err(|e| BackupError::Internal(format!("a restore task: {e}")))??;
            Progress::add(&progress.store_bytes, fetched);
        }
        Ok(blocks)
    }
}

/// Bytes `range` of a pack; a pack too short for them (truncated, or
/// replaced by another object) is damage, named, not a store failure.
async fn read_range(
    store: &Store,
    name: &str,
    range: std::ops::Range<u64>,
) -> Result<bytes::Bytes> {
    match store.get_range(name, range.clone()).await {
        Ok(bytes) if bytes.len() as u64 == range.end - range.start => Ok(bytes),
        Ok(bytes) => Err(short(name, range.start + bytes.len() as u64, range.end)),
        Err(e) => match store.size(name).await {
            Ok(Some(size)) if size < range.end => Err(short(name, size, range.end)),
            Ok(None) => Err(damaged(
                name.to_owned(),
                crate::format::invalid(
                    "a pack",
                    "missing from the store, though an index lists it",
                ),
            )),
            _ => Err(e.into()),
        },
    }
}

fn short(name: &str, size: u64, needed: u64) -> BackupError {
    damaged(
        name.to_owned(),
        crate::format::invalid(
            "a pack",
            format!("{size} bytes long, where an index lists a blob ending at byte {needed}"),
        ),
    )
}

/// Splits blobs of one pack, in pack order, into runs read at once: each
/// next blob starts where the last ended, up to [`MAX_RUN_BYTES`].
fn runs(list: &[(u64, BlobAt)]) -> Vec<&[(u64, BlobAt)]> {
    let mut out = Vec::new();
    let mut start = 0;
    for i in 1..=list.len() {
        let ends = i == list.len()
            || list[i].1.entry.offset as u64 != list[i - 1].1.entry.end()
            || list[i].1.entry.end() - u64::from(list[start].1.entry.offset) > MAX_RUN_BYTES;
        if ends {
            out.push(&list[start..i]);
            start = i;
        }
    }
    out
}
