//! Origins whose device shrank: what they lost, kept so that it never
//! reads as data (docs/CLI.md § Origins, FORMAT.md §6.1 "Lost range").
//!
//! An origin's bytes live on a device that other programs can change. A
//! file truncated (or a logical volume reduced) while attached loses what
//! it held past its new end, and the snapshots that read those bytes
//! through the device lose them too; a device later grown back reads zeros
//! there, which must never pass for the snapshots' data. So:
//! * a device seen smaller than it was attached at (on any request: every
//!   write and flush looks at its size first, a failed read looks after;
//!   and at each [`Pool::watch_origins`]) fails at once: it serves no I/O
//!   ([`super::origin`]);
//! * the loss is recorded in the pool ([`OriginLoss`], a property of the
//!   volume) and the device let go: the origin is unattached, and every
//!   later attach is refused until a user accepts the loss
//!   ([`Pool::attach_origin_with`]), which is recorded too;
//! * epochs up to the newest at the loss, reading the device at or past
//!   the lost offset, fail those reads ([`Pool::refuse_lost_read`]); a write
//!   that would copy lost bytes for such an epoch is refused
//!   ([`Pool::refuse_lost_copies`]); [`Pool::lost_data`] lists what each
//!   volume lost, for `check`. Copies taken into the pool before the loss
//!   stay readable.

use std::ops::Range;
use std::time::{SystemTime, UNIX_EPOCH};

use arbor_format::{Backing, OriginLoss, ORIGIN_LOSS_KEY};
use tracing::warn;

use super::{Piece, Pool, Source, VolumeId};
use crate::check::LostData;
use crate::error::{Conflict, Error, OriginUnavailable, Refusal, Result};

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Pool {
    /// The loss recorded for volume `id`, if any.
    pub(super) fn recorded_loss(&self, id: u64) -> Result<Option<OriginLoss>> {
        self.property(Some(VolumeId(id)), ORIGIN_LOSS_KEY)?
            .map(|bytes| OriginLoss::decode(&bytes).map_err(|e| Error::corrupt(ORIGIN_LOSS_KEY, e)))
            .transpose()
    }

    /// Records that volume `id`'s device was seen at `size` bytes (below
    /// its volume's or its attached size): merged with a loss recorded
    /// before (the smaller offset, the newer epoch), and not accepted.
    pub(super) fn note_loss(&self, id: u64, size: u64) -> Result<OriginLoss> {
        let epoch = self.read_meta()?.cow_state(id)?.0.epoch;
        let loss = match self.origins.loss(id) {
            Some(before) if before.from <= size && before.epoch >= epoch => before,
            Some(before) => OriginLoss {
                from: before.from.min(size),
                epoch: before.epoch.max(epoch),
                seen_unix: now_unix(),
                accepted_unix: 0,
            },
            None => OriginLoss {
                from: size,
                epoch,
                seen_unix: now_unix(),
                accepted_unix: 0,
            },
        };
        self.set_property(Some(VolumeId(id)), ORIGIN_LOSS_KEY, &loss.encode())?;
        self.origins.set_loss(id, Some(loss));
        Ok(loss)
    }

    /// Records the loss of every attached device seen to shrink and lets
    /// it go (the origin is then unattached, and failed until a user
    /// accepts the loss). Returns the names of those it failed now.
    pub(super) fn record_shrunk_origins(&self) -> Result<Vec<String>> {
        let mut failed = Vec::new();
        for (id, d) in self.origins.entries() {
            let Some(now) = d.shrunk() else {
                continue;
            };
            let name = self.read_meta()?.cow_state(id)?.1.name.clone();
            let loss = self.note_loss(id, now)?;
            self.origins.remove_if(id, &d);
            warn!(
                volume = %name,
                size = now,
                lost_from = loss.from,
                "origin {name}'s device shrank to {now} bytes while attached: it serves no I/O \
                 and what it held from byte {} on is recorded as lost",
                loss.from
            );
            failed.push(name);
        }
        Ok(failed)
    }

    /// Looks at the size of every attached origin's device: one that
    /// shrank fails (see the module documentation). The daemon calls it
    /// periodically, so a device that shrinks while idle is seen too.
    /// Returns the names of the origins it failed.
    pub fn watch_origins(&self) -> Result<Vec<String>> {
        for (_, d) in self.origins.entries() {
            d.check_size();
        }
        self.record_shrunk_origins()
    }

    /// Records the failure of any origin seen to shrink by a request that
    /// just failed with `e` (it holds no lock any more), and hands `e` on.
    pub(super) fn after_origin_error<T>(&self, result: Result<T>) -> Result<T> {
        if let Err(Error::Refused(Refusal::Origin(_))) = &result {
            if let Err(e) = self.record_shrunk_origins() {
                warn!(error = %e, "cannot record the loss of an origin whose device shrank");
            }
        }
        result
    }

    /// On attach of volume `id` again: refuses it while a loss is recorded
    /// and not accepted, unless `accept` (then records the acceptance);
    /// loads the loss for the reads and writes that check it.
    pub(super) fn accept_or_refuse_loss(&self, id: u64, name: &str, accept: bool) -> Result<()> {
        let Some(mut loss) = self.origins.loss(id) else {
            return Ok(());
        };
        if loss.accepted_unix == 0 {
            if !accept {
                return Err(Conflict::ShrankWhileAttached {
                    name: name.to_owned(),
                    to: loss.from,
                }
                .into());
            }
            loss.accepted_unix = now_unix();
            self.set_property(Some(VolumeId(id)), ORIGIN_LOSS_KEY, &loss.encode())?;
            warn!(volume = %name, lost_from = loss.from, "the loss of origin {name}'s data was accepted; it is served again");
        }
        self.origins.set_loss(id, Some(loss));
        Ok(())
    }

    /// Refuses a read through epoch `backing` whose `pieces` read the
    /// origin's device where its loss covers them.
    pub(super) fn refuse_lost_read(
        &self,
        backing: Backing,
        name: &str,
        pieces: &[Piece],
    ) -> Result<()> {
        let Some(loss) = self.origins.loss(backing.origin) else {
            return Ok(());
        };
        for piece in pieces {
            if let Source::Origin(at) = piece.source {
                if loss.covers(backing.epoch, at, piece.len) {
                    return Err(OriginUnavailable::ReadOfLost {
                        name: name.to_owned(),
                        from: loss.from,
                    }
                    .into());
                }
            }
        }
        Ok(())
    }

    /// Refuses a write of `chunks` of origin `id` that would copy lost bytes
    /// for an epoch that read them (its copy would pass them for data).
    pub(super) fn refuse_lost_copies(&self, id: u64, name: &str, chunks: Range<u64>) -> Result<()> {
        let Some(loss) = self.origins.loss(id) else {
            return Ok(());
        };
        let cs = self.chunk_size();
        let first_lost = loss.from / cs;
        if chunks.end <= first_lost {
            return Ok(());
        }
        let meta = self.read_meta()?;
        for chunk in chunks.start.max(first_lost)..chunks.end {
            if let Some((first, last)) = meta.copy_needed(id, chunk)? {
                if meta.table().live_between(id, first, last.min(loss.epoch)) {
                    return Err(OriginUnavailable::WriteOverLost {
                        name: name.to_owned(),
                        from: loss.from,
                    }
                    .into());
                }
            }
        }
        Ok(())
    }

    /// What every volume reading through an origin lost with its device:
    /// the bytes from the loss on that it reads through an epoch up to the
    /// loss's, with no copy of them in the pool and no data of its own.
    pub fn lost_data(&self) -> Result<Vec<LostData>> {
        let losses: Vec<(u64, OriginLoss)> = self
            .read_meta()?
            .cow_volumes()
            .into_iter()
            .filter_map(|(id, _)| self.origins.loss(id).map(|loss| (id, loss)))
            .collect();
        let mut out = Vec::new();
        for (origin, loss) in losses {
            let (origin_name, origin_size) = {
                let meta = self.read_meta()?;
                let rec = meta.cow_state(origin)?.1;
                (rec.name.clone(), rec.size_bytes)
            };
            if loss.from >= origin_size {
                continue;
            }
            let readers: Vec<(VolumeId, String, Backing, u64)> = {
                let all = self.list()?;
                let meta = self.read_meta()?;
                all.into_iter()
                    .filter_map(|v| {
                        let b = meta.volume(v.id.0).ok()?.backing?;
                        (b.origin == origin && b.epoch <= loss.epoch)
                            .then_some((v.id, v.name, b, v.size))
                    })
                    .collect()
            };
            for (id, volume, backing, size) in readers {
                let end = size.min(origin_size);
                if end <= loss.from {
                    continue;
                }
                let meta = self.read_meta()?;
                let pieces = Self::resolve(&meta, id, loss.from, end - loss.from)?;
                let pieces = Self::resolve_view(&meta, backing, loss.from, pieces)?;
                let bytes: u64 = pieces
                    .iter()
                    .filter(|p| matches!(p.source, Source::Origin(_)))
                    .map(|p| p.len)
                    .sum();
                if bytes > 0 {
                    out.push(LostData {
                        volume,
                        origin: origin_name.clone(),
                        bytes,
                        from: loss.from,
                    });
                }
            }
        }
        out.sort_by(|a, b| a.volume.cmp(&b.volume));
        Ok(out)
    }
}
