//! Healing: a damaged data block rewritten in place with good bytes from
//! elsewhere (a replica's copy of the same snapshot, a stream of it), by
//! where a volume or snapshot reads it (docs/FORMAT.md §6.4, "Healing").
//!
//! The rules, each checked here whatever the caller:
//! * only a block that is damaged now is written: one that matches its sum
//!   when read, or has none, is left as it is;
//! * only bytes that match the block's stored sum are written;
//! * the block is written where it is, so every volume and snapshot that
//!   shares its chunk is healed at once, and no metadata changes (a torn
//!   heal leaves the block damaged or healed, never anything else);
//! * the bytes are flushed and read back before the block leaves the
//!   damage record.
//!
//! It runs with the pool gate held exclusive: no write is in flight, so no
//! mapping or sum changes under it.

use super::*;
use crate::sums::ChunkSums;
use arbor_format::{SUM_BLOCK, SUM_BLOCK_U64};

/// What a heal did with the blocks it was given.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Healed {
    /// Damaged blocks rewritten with bytes that match their sums.
    pub healed: u64,
    /// Damaged blocks left damaged: the bytes given do not match the sum
    /// (the copy is not of the same data, or is damaged too).
    pub rejected: u64,
    /// Blocks left as they were: not damaged (or without a sum, or not in
    /// the pool's data: unmapped, an origin's).
    pub not_damaged: u64,
}

impl Healed {
    pub fn add(&mut self, other: Healed) {
        self.healed += other.healed;
        self.rejected += other.rejected;
        self.not_damaged += other.not_damaged;
    }
}

impl Pool {
    /// Heals the damaged blocks that volume or snapshot `id` reads in
    /// `offset..offset + good.len()` with `good`, the bytes it should read
    /// there (from a copy of the same data). Whole 4 KiB blocks only.
    pub fn heal(&self, id: VolumeId, offset: u64, good: &[u8]) -> Result<Healed> {
        let len = good.len() as u64;
        if !offset.is_multiple_of(SUM_BLOCK_U64) || !len.is_multiple_of(SUM_BLOCK_U64) {
            return Err(Invalid::HealUnaligned { offset, len }.into());
        }
        let mut done = Healed::default();
        let mut written: Vec<(u64, u32, u64)> = Vec::new();
        let mut healed: Vec<(u64, u32)> = Vec::new();
        {
            let _gate = self.gates.commit();
            let meta = self.read_meta()?;
            Self::check_io(&meta, id, offset, len, false)?;
            let rec = meta.volume(id.0)?;
            let cow = matches!(rec.layout, arbor_format::DataLayout::Cow(_));
            // Where the device that the volume, or the epoch it reads
            // through, reads is a home in the pool: its first chunk.
            let home = match (cow, rec.backing) {
                (true, _) => Self::home_in_pool(&meta, id.0),
                (false, Some(b)) => Self::home_in_pool(&meta, b.origin),
                (false, None) => None,
            };
            let mut on_device = vec![0u8; SUM_BLOCK];
            for (i, bytes) in good.chunks(SUM_BLOCK).enumerate() {
                let at_logical = offset + i as u64 * SUM_BLOCK_U64;
                let pieces = if cow {
                    // Its home: an origin's device (no sums), or chunks of
                    // the pool written in place as a device is.
                    vec![Piece {
                        len: SUM_BLOCK_U64,
                        source: Source::Origin(at_logical),
                    }]
                } else {
                    let pieces = Self::resolve(&meta, id, at_logical, SUM_BLOCK_U64)?;
                    // Through an epoch: the store's copies too.
                    match rec.backing {
                        Some(b) => Self::resolve_view(&meta, b, at_logical, pieces)?,
                        None => pieces,
                    }
                };
                let at = match (pieces.as_slice(), home) {
                    (
                        [Piece {
                            source: Source::Pool(at),
                            ..
                        }],
                        _,
                    ) if at.is_multiple_of(SUM_BLOCK_U64) => *at,
                    (
                        [Piece {
                            source: Source::Origin(at),
                            ..
                        }],
                        Some(first),
                    ) if at.is_multiple_of(SUM_BLOCK_U64) => self.home_byte(first, *at),
                    _ => {
                        done.not_damaged += 1;
                        continue;
                    }
                };
                let Some((pchunk, within)) = self.store.geo.chunk_at(at) else {
                    done.not_damaged += 1;
                    continue;
                };
                // `within` is below the chunk size, which is below 4 GiB.
                let block = (within / SUM_BLOCK_U64) as u32;
                let Some(stored) = ChunkSums::of(meta.meta(), pchunk)?.get(block) else {
                    done.not_damaged += 1;
                    continue;
                };
                self.store.dev.read_at(&mut on_device, at)?;
                if arbor_format::block_sum(&on_device) == stored {
                    done.not_damaged += 1;
                } else if arbor_format::block_sum(bytes) != stored {
                    done.rejected += 1;
                } else {
                    self.store.dev.write_at(bytes, at)?;
                    written.push((pchunk, block, at));
                }
            }
            if !written.is_empty() {
                self.store.dev.flush()?;
                // Read back: a device that does not keep what it is given
                // has not been healed.
                for &(pchunk, block, at) in &written {
                    self.store.dev.read_at(&mut on_device, at)?;
                    let stored = ChunkSums::of(meta.meta(), pchunk)?.get(block);
                    if Some(arbor_format::block_sum(&on_device)) == stored {
                        done.healed += 1;
                        healed.push((pchunk, block));
                    } else {
                        done.rejected += 1;
                    }
                }
            }
        }
        if !healed.is_empty() {
            tracing::info!(
                blocks = done.healed,
                volume = id.0,
                offset,
                "healed damaged data blocks with a good copy"
            );
            self.forget_damage(&healed)?;
        }
        Ok(done)
    }
}
