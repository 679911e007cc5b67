//! Reading blobs back, and restoring a backup into a new volume (docs/
//! BACKUP.md, "Restoring"): each map piece read, the blocks it maps read
//! from their packs with one ranged read per run of neighbouring blobs,
//! every blob authenticated and hashed back to its name before a byte of
//! it is written (the fill is `live.rs`'s, which also serves the volume
//! while it fills). A restore that fails removes the volume it made.

use std::sync::Arc;

use arbor_engine::Pool;

use crate::crypto::BlobId;
use crate::format::manifest::Piece;
use crate::format::pack;
use crate::format::{BlobKind, ObjectId};
use crate::live::LiveRestore;
use crate::repo::{damaged, BackupError, BlobAt, Progress, Repository, Result};
use crate::store::{names, Store};

/// Ranged reads in flight at once.
pub const READS_IN_FLIGHT: usize = 8;
/// Neighbouring blobs of one pack are read together up to this many bytes.
const MAX_RUN_BYTES: u64 = 8 << 20;
/// Neighbouring blocks are written to the pool together up to about this
/// many bytes.
pub(crate) const MAX_WRITE: usize = 4 << 20;

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

    /// Restores backup `backup` into a new volume `volume` of `pool`,
    /// which nobody reads until it is complete: the first error removes it.
    pub async fn restore(
        &self,
        backup: &ObjectId,
        pool: Arc<Pool>,
        volume: &str,
        progress: &Arc<Progress>,
    ) -> Result<Restored> {
        let live = LiveRestore::create(
            self,
            backup,
            Arc::clone(&pool),
            volume,
            false,
            Arc::clone(progress),
        )
        .await?;
        match live.fill().await {
            Ok(blocks) => Ok(Restored {
                volume: volume.to_owned(),
                size: live.size(),
                blocks,
            }),
            Err(e) => {
                // Leaves no trace: the half-written volume goes.
                let (pool, name) = (Arc::clone(&pool), volume.to_owned());
                let _ = tokio::task::spawn_blocking(move || pool.delete(&name)).await;
                live.pool_forgets();
                live.release().await;
                Err(e)
            }
        }
    }
}

/// Bytes `range` of a pack; a pack too short for them (truncated, or
/// replaced by another object) is damage, named, not a store failure.
pub(crate) async fn read_range(
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
pub(crate) fn runs(list: &[(u64, BlobAt)]) -> Vec<&[(u64, BlobAt)]> {
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
