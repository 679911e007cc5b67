//! Verifying a repository (docs/BACKUP.md, "Verifying"): every backup's
//! manifest and map pieces read and every blob they name found in the
//! index; then the packs, all or a random sample, read whole, checked
//! against their names, their headers against the index, and every blob
//! in them opened (authenticated, decompressed, hashed back to its id).
//! Problems are collected, not stopped at: the answer lists what is wrong.

use std::collections::HashSet;

use rand::Rng;

use crate::crypto::BlobId;
use crate::format::pack;
use crate::format::ObjectId;
use crate::lock::LockKind;
use crate::repo::{Progress, Repository, Result};
use crate::store::{id_of, names};

/// Problems listed at most (the count goes on).
pub const MAX_PROBLEMS: usize = 1000;

/// What a verify found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verified {
    pub backups: u64,
    pub packs_total: u64,
    pub packs_read: u64,
    pub blobs_checked: u64,
    pub bytes_read: u64,
    /// Problems found, in the order found (at most [`MAX_PROBLEMS`]).
    pub problems: Vec<String>,
    /// All problems, also those not listed.
    pub problem_count: u64,
}

impl Verified {
    fn problem(&mut self, what: String) {
        self.problem_count += 1;
        if self.problems.len() < MAX_PROBLEMS {
            self.problems.push(what);
        }
    }
}

impl Repository {
    /// Verifies the repository, reading `sample_percent` (1 to 100) of its
    /// packs, chosen at random each time.
    pub async fn verify(&self, sample_percent: u8, progress: &Progress) -> Result<Verified> {
        let lock = self.lock(LockKind::Shared, "verify").await?;
        let verified = self.verify_locked(sample_percent, progress).await;
        lock.release().await;
        verified
    }

    async fn verify_locked(&self, sample_percent: u8, progress: &Progress) -> Result<Verified> {
        let mut out = Verified::default();
        // Every backup: its manifest, its pieces, the blobs they name.
        let mut needed: HashSet<BlobId> = HashSet::new();
        for listed in self.store.list(names::SNAPSHOTS).await? {
            let Some(id) = id_of(&listed.name) else {
                continue;
            };
            out.backups += 1;
            let manifest = match self.manifest(&id).await {
                Ok(m) => m,
                Err(e) => {
                    out.problem(format!("backup {id}: {e}"));
                    continue;
                }
            };
            let what = format!("backup {id} ({})", manifest.snapshot);
            for piece in manifest.piece_ids().into_iter().flatten() {
                needed.insert(piece);
                match self.read_piece(&piece, &what).await {
                    Ok(p) => needed.extend(p.0.iter().map(|(_, b)| *b)),
                    Err(e) => out.problem(format!("{what}: {e}")),
                }
            }
        }
        for blob in &needed {
            if let Err(e) = self.locate(blob, "a backup") {
                out.problem(e.to_string());
            }
        }
        // The packs, all or a sample, read whole.
        let packs = self.store.list(names::PACKS).await?;
        out.packs_total = packs.len() as u64;
        let percent = u32::from(sample_percent.clamp(1, 100));
        let chosen: Vec<_> = {
            let mut rng = rand::thread_rng();
            packs
                .into_iter()
                .filter(|_| rng.gen_range(0..100u32) < percent)
                .collect()
        };
        Progress::add(&progress.total_bytes, chosen.iter().map(|l| l.size).sum());
        for listed in chosen {
            let Some(id) = id_of(&listed.name) else {
                out.problem(format!("{}: not a pack's name", listed.name));
                continue;
            };
            Progress::add(&progress.done_bytes, listed.size);
            if listed.size > pack::MAX_PACK_BYTES {
                out.problem(format!(
                    "{}: {} bytes, more than a pack may hold",
                    listed.name, listed.size
                ));
                continue;
            }
            let bytes = match self.store.get(&listed.name).await? {
                Some(b) => b,
                None => {
                    out.problem(format!("{}: listed but not readable", listed.name));
                    continue;
                }
            };
            out.packs_read += 1;
            out.bytes_read += bytes.len() as u64;
            Progress::add(&progress.store_bytes, bytes.len() as u64);
            self.verify_pack(&id, &listed.name, &bytes, &mut out);
        }
        Ok(out)
    }

    fn verify_pack(&self, id: &ObjectId, name: &str, bytes: &[u8], out: &mut Verified) {
        if ObjectId::of(bytes) != *id {
            out.problem(format!("{name}: its bytes are not what its name says"));
            return;
        }
        let entries = match pack::decode_pack(&self.keys, bytes) {
            Ok(e) => e,
            Err(e) => {
                out.problem(format!("{name}: {e}"));
                return;
            }
        };
        let index = self.index();
        for entry in &entries {
            out.blobs_checked += 1;
            let sealed = &bytes[entry.offset as usize..entry.end() as usize];
            if let Err(e) = pack::open_blob(&self.keys, entry, sealed) {
                out.problem(format!("{name}: blob {}: {e}", entry.id));
            }
            // Where the index puts a blob of this pack, it must be this.
            if let Some(at) = index.blobs.get(&entry.id) {
                if at.pack == *id && at.entry != *entry {
                    out.problem(format!(
                        "{name}: blob {} differs from what the index lists",
                        entry.id
                    ));
                }
            }
        }
    }
}
