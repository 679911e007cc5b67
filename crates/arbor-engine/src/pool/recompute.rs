//! After an unclean shutdown: the sums of the chunks in the regions the
//! in-place intent set lists are recomputed from what the device holds
//! (`crate::intents`, FORMAT.md §6.4), before the pool serves. A chunk
//! written in place when the power went may hold its old data, its new
//! data or a mix of both, as a disk without arbor would; none of that is
//! damage. Only blocks that have sums get new ones (a block without stays
//! without), and only live chunks (count above 0) are read. A block the
//! damage record lists keeps its sum: it was found damaged before, and a
//! restart must not make its damage read as data.

use super::*;
use crate::sums::{BlockSums, ChunkSums};

impl Pool {
    /// Recomputes the sums of `regions` (what the intent set listed at the
    /// commit the pool opened at, and what its log added: `Pool::open`
    /// reads them before anything commits, since a commit evicts the
    /// regions idle in this process, which at open is all of them), one
    /// region per commit, and takes each out of the set. Returns the
    /// blocks whose sums changed.
    pub(super) fn recompute_intents(&self, regions: &[u64]) -> Result<u64> {
        if regions.is_empty() {
            return Ok(0);
        }
        warn!(
            regions = regions.len(),
            "the pool was not closed cleanly: recomputing the checksums of the regions written in place"
        );
        let damaged: std::collections::HashSet<(u64, u32)> = match self.damage_record() {
            Ok(record) => record.entries().iter().map(|b| b.at()).collect(),
            Err(e) => {
                warn!(error = %e, "the damage record could not be read: blocks it lists may get sums of their damage");
                Default::default()
            }
        };
        let cs = self.chunk_size();
        let mut changed = 0;
        for &region in regions {
            let chunks = arbor_format::intent_region_range(cs, region);
            let mut sums = Vec::new();
            let data_chunks = self.read_meta()?.meta().entries(arbor_format::SmKind::Data);
            for pchunk in chunks.start..chunks.end.min(data_chunks) {
                let old = {
                    let meta = self.read_meta()?;
                    if meta.meta().data_count(pchunk)? == 0 {
                        continue;
                    }
                    ChunkSums::of(meta.meta(), pchunk)?
                };
                let blocks = (cs / arbor_format::SUM_BLOCK_U64) as u32;
                if (0..blocks).all(|b| old.get(b).is_none()) {
                    continue;
                }
                let mut data = vec![0u8; cs as usize];
                self.store
                    .dev
                    .read_at(&mut data, self.store.geo.chunk_offset(pchunk))?;
                let now = crate::sums::compute(&data);
                let new: Vec<Option<u32>> = (0..blocks)
                    .map(|b| match old.get(b) {
                        Some(kept) if damaged.contains(&(pchunk, b)) => Some(kept),
                        had => had.and(now[b as usize]),
                    })
                    .collect();
                let differ = (0..blocks)
                    .filter(|&b| new[b as usize] != old.get(b))
                    .count();
                if differ > 0 {
                    changed += differ as u64;
                    sums.push(BlockSums {
                        pchunk,
                        first: 0,
                        sums: new,
                    });
                }
            }
            self.manage(Privilege::Reserve, |m| {
                m.record_sums(&sums)?;
                m.remove_intent(region)
            })?;
        }
        warn!(
            blocks = changed,
            "checksums recomputed after an unclean shutdown"
        );
        Ok(changed)
    }
}
