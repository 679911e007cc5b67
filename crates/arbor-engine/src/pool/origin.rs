//! Copy-on-write volumes: their data stays in one place, their *home*,
//! and is written there in place. The home is an external device (a raw
//! disk or image file snapshotted in place: `arbor origin attach`) or a
//! contiguous run of the pool's data chunks allocated when the volume is
//! created (`--layout cow`), seen through a window of the pool's
//! device: the same mechanism serves both.
//!
//! The volume's own reads and writes go straight to its device. Its
//! snapshots are records that read through an *epoch*; before a chunk is
//! overwritten for the first time while an epoch still sees its old
//! content, that content is copied once into the pool and mapped in the
//! volume's snapshot store for every such epoch at once (`snapstore`).
//!
//! Order of a write to the device, per unit of chunks (the chunks' origin
//! stripes held throughout, so no other write of those chunks, and no read
//! of them through an epoch, runs meanwhile):
//! 1. under the I/O gate: plan the copies the chunks need (one metadata
//!    step, allocating their data chunks), read the old content from the
//!    device and write it to them, and map them (a second step);
//! 2. commit: the copies are durable and mapped;
//! 3. under the I/O gate again, which no snapshot can pass while it is
//!    held: plan once more; if nothing needs a copy now (a snapshot taken
//!    meanwhile would), write the device.
//!
//! So the device is written only when every epoch that sees its old
//! content has a durable copy, and a power cut at any point leaves every
//! snapshot as it was taken. When the pool cannot take a copy (data or
//! metadata full), the write fails with no space and the device is not
//! touched: a snapshot is never invalidated.
//!
//! Errors of the device (it vanished, shrank, or failed) are
//! [`Refusal::Origin`]: they fail the request and never stop the pool.

use std::ops::Range;

use arbor_format::{
    leaf_capacity, Backing, CowState, DataLayout, DeviceIdentity, Home, OriginLoss, TreeKind,
};

use super::origins::OriginDevice;
use super::write::Fill;
use super::*;
use crate::snapstore::SnapStore;
use crate::sums::{BlockSums, ReadSums};
use crate::volumes::{CopyPlan, HomeGrowth};

/// Store entries a rollback handles per step.
const BATCH: usize = 256;
/// Store entries a sweep looks at per step (a few leaves), removing those
/// no epoch reads: bounds how long one step holds the metadata lock.
const SWEEP_ENTRIES: usize = 512;
/// Bytes of one unit of a write to a copy-on-write volume (the NBD maximum
/// payload, as for other writes).
const UNIT_BYTES: u64 = 32 << 20;
/// A new home is copied while the volume's I/O goes on, then the chunks
/// written meanwhile again, at most this many times more...
const CATCH_UP_PASSES: usize = 8;
/// ...or until at most this many chunks are left, which are copied with
/// the volume's I/O held off.
const CATCH_UP_LEFT: u64 = 256;

/// What a listing says of an external copy-on-write volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OriginInfo {
    pub id: VolumeId,
    pub name: String,
    pub size: u64,
    pub identity: DeviceIdentity,
    /// Its device is attached (after a restart, until `attach_origin`).
    pub attached: bool,
    /// A rollback to this epoch waits for the device (0: none).
    pub rollback_epoch: u64,
    /// What it lost when its device shrank, if it did: while not accepted,
    /// its device is not served (the origin has failed).
    pub loss: Option<OriginLoss>,
}

/// The error of an origin `name` whose device could not be enlarged.
fn not_enlarged(name: &str, e: std::io::Error) -> Error {
    OriginUnavailable::NotEnlarged {
        name: name.to_owned(),
        error: e,
    }
    .into()
}

/// The device error of copy-on-write volume `name`, with what the device
/// looks like now when that explains it.
fn device_error(name: &str, dev: &dyn BlockDevice, size: u64, e: std::io::Error) -> Error {
    let name = name.to_owned();
    match dev.refresh_size() {
        Ok(now) if now < size => OriginUnavailable::ShrankDuringIo {
            name,
            was: size,
            now,
            error: e,
        },
        Err(why) => OriginUnavailable::Unusable {
            name,
            why,
            error: e,
        },
        Ok(_) => OriginUnavailable::DeviceIo { name, error: e },
    }
    .into()
}

/// A copy-on-write volume and its device, as one request uses them.
struct Target<'a> {
    id: u64,
    name: &'a str,
    size: u64,
    d: &'a OriginDevice,
}

impl Target<'_> {
    fn err(&self, e: std::io::Error) -> Error {
        match self.d.check_size() {
            Some(now) => self.d.shrunk_error(self.name, now),
            None => device_error(self.name, self.d.dev(), self.size, e),
        }
    }

    /// Refuses every request once the device was seen to shrink.
    fn refuse_shrunk(&self) -> Result<()> {
        match self.d.shrunk() {
            Some(now) => Err(self.d.shrunk_error(self.name, now)),
            None => Ok(()),
        }
    }

    fn read(&self, buf: &mut [u8], at: u64) -> Result<()> {
        self.refuse_shrunk()?;
        self.d.dev().read_at(buf, at).map_err(|e| self.err(e))
    }

    /// Writes `fill` over `[from, to)` of the device: never to one that
    /// shrank (a write past a file's new end would grow it again, with
    /// zeros where the lost bytes were), so its size is looked at first.
    fn write(&self, from: u64, to: u64, fill: Fill<'_>) -> Result<()> {
        if let Some(now) = self.d.check_size() {
            return Err(self.d.shrunk_error(self.name, now));
        }
        // Marked first: a write that fails part way is copied again too.
        self.d.will_write(from, to);
        match fill {
            Fill::Data(data) => self.d.dev().write_at(data, from).map_err(|e| self.err(e)),
            Fill::Zeros => self
                .d
                .dev()
                .write_zeroes(from, to - from)
                .map_err(|e| self.err(e)),
        }
    }

    fn flush(&self) -> Result<()> {
        self.d.dev().flush().map_err(|e| self.err(e))?;
        // A flush is acknowledged only if what it made durable is there.
        if let Some(now) = self.d.check_size() {
            return Err(self.d.shrunk_error(self.name, now));
        }
        self.d.flushed();
        Ok(())
    }
}

impl Pool {
    /// Makes the external device `dev` copy-on-write volume `name`, its data
    /// left in place (`identity` says which file or disk it is; the pool
    /// records it). If `name` is already such a volume whose device is not
    /// attached (after a restart), attaches it again: `identity` and the
    /// size must be the recorded ones. Finishes a rollback a power cut
    /// interrupted. Refused for a volume whose device shrank (see
    /// [`Self::attach_origin_with`]).
    pub fn attach_origin(
        &self,
        name: &str,
        dev: Arc<dyn BlockDevice>,
        identity: DeviceIdentity,
    ) -> Result<VolumeId> {
        self.attach_origin_with(name, dev, identity, false)
    }

    /// [`Self::attach_origin`]; with `accept_loss`, also attaches again a
    /// volume whose device was seen to shrink, recording that its user
    /// accepted the loss (its snapshots still fail reads of what was lost).
    pub fn attach_origin_with(
        &self,
        name: &str,
        dev: Arc<dyn BlockDevice>,
        identity: DeviceIdentity,
        accept_loss: bool,
    ) -> Result<VolumeId> {
        // An origin attached again may have a name an older version allowed.
        check_existing_volume_name(name)?;
        self.record_shrunk_origins()?;
        let size = dev.size();
        let existing = {
            let meta = self.read_meta()?;
            match meta.volume_id(name) {
                Ok(id) => Some((id, meta.volume(id)?.clone())),
                Err(_) => None,
            }
        };
        let id = match existing {
            Some((id, rec)) => {
                let DataLayout::Cow(CowState {
                    home: Home::External(recorded),
                    ..
                }) = rec.layout
                else {
                    return Err(Error::already_exists(name.to_owned()));
                };
                if recorded != identity {
                    return Err(Conflict::OtherDevice {
                        name: name.to_owned(),
                        recorded,
                        identity,
                    }
                    .into());
                }
                // Larger is the same disk grown (by a resize a power cut
                // interrupted, or from outside): the volume keeps its
                // recorded size. Smaller would cut what it and its
                // snapshots read.
                if size < rec.size_bytes {
                    // A regular file (an inode number) is the same file,
                    // truncated: what it held past its end is lost,
                    // whatever comes back there later. A block device's
                    // number may name another, smaller disk for now: only
                    // refused.
                    if identity.ino != 0 {
                        self.note_loss(id, size)?;
                    }
                    return Err(Conflict::DeviceSmaller {
                        name: name.to_owned(),
                        was: rec.size_bytes,
                        now: size,
                    }
                    .into());
                }
                if self.origins.get(id).is_some() {
                    // Attached already: only an interrupted rollback to finish.
                    self.resume_rollback(id)?;
                    return Ok(VolumeId(id));
                }
                self.accept_or_refuse_loss(id, name, accept_loss)?;
                id
            }
            None => {
                check_volume_name(name)?;
                if size == 0 || !size.is_multiple_of(SECTOR) || size > MAX_VOLUME_SIZE {
                    return Err(Invalid::OriginDeviceSize {
                        size,
                        sector: SECTOR,
                        max: MAX_VOLUME_SIZE,
                    }
                    .into());
                }
                self.manage(Privilege::Normal, |m| {
                    m.add_cow_volume(name.to_owned(), size, Home::External(identity))
                })?
            }
        };
        self.origins.insert(id, OriginDevice::new(dev));
        self.resume_rollback(id)?;
        Ok(VolumeId(id))
    }

    /// Finishes an interrupted rollback of volume `id` on attach; one that
    /// cannot finish yet (the pool is full) stays recorded, the volume
    /// refusing I/O until it is run again (`arbor rollback`).
    fn resume_rollback(&self, id: u64) -> Result<()> {
        match self.finish_rollback(id) {
            Err(e) if !e.stops_pool() => {
                warn!(error = %e, "an interrupted rollback could not finish yet; run it again");
                Ok(())
            }
            other => other,
        }
    }

    /// Creates copy-on-write volume `name` of `size` bytes whose home is a
    /// run of the pool's data chunks, contiguous on the device, preallocated
    /// and zeroed now (so it reads as zeros, and never shows what freed
    /// chunks held). The run is found and set aside, zeroed with no lock
    /// held, then allocated with the volume in one management operation.
    pub fn create_cow_volume(&self, name: &str, size: u64) -> Result<VolumeId> {
        check_volume_name(name)?;
        check_size(size)?;
        let cs = self.chunk_size();
        let chunks = size.div_ceil(cs);
        let step = self.home_build_step();
        // A home bigger than one step is built a step at a time, one at a
        // time, while no loose home is freed (`reclaim_loose_home`).
        let _building = (chunks > step).then(|| self.origins.building_home());
        let run = {
            let mut meta = self.write_meta()?;
            meta.ensure_name_free(name)?;
            meta.check_cow_home(chunks)?;
            meta.reserve_home(chunks)?
        };
        let created = self.zero_home(&run).and_then(|()| {
            if chunks <= step {
                self.manage(Privilege::Normal, |m| {
                    m.add_pool_cow_volume(name.to_owned(), size, run.clone())
                })
            } else {
                // The loose home becomes the volume.
                self.build_in_steps(
                    run.clone(),
                    Some(&mut |m: &mut Volumes, loose| m.finish_home(loose, name.to_owned(), size)),
                )
            }
        });
        if let Ok(mut meta) = self.write_meta() {
            meta.unreserve_home(&run);
        }
        let id = created?;
        self.open_home(id, run.start, size);
        self.sum_home_later(run);
        Ok(VolumeId(id))
    }

    /// Chunks of a home one commit allocates: half the journal's
    /// space-map pages' worth.
    fn home_build_step(&self) -> u64 {
        (self.store.geo.journal_pages / 2).max(1) * SM_ENTRIES_PER_PAGE as u64
    }

    /// Allocates the data chunks of `run` (set aside and zeroed; the caller
    /// ends the reservation and holds `homes_lock`) in commits of
    /// [`Self::home_build_step`] chunks, into a loose home, then runs
    /// `finish` with it in one last commit (which must make it part of a
    /// volume; `None`: the caller does, and frees it if that fails). So the
    /// chunks join the volume whole, or not at all: a build that fails
    /// frees the loose home before it returns, and what a power cut (or a
    /// failure to free it) leaves, reclaim frees. Returns the loose home's
    /// id.
    #[allow(clippy::type_complexity)]
    fn build_in_steps(
        &self,
        run: Range<u64>,
        mut finish: Option<&mut dyn FnMut(&mut Volumes, u64) -> Result<()>>,
    ) -> Result<u64> {
        let step = self.home_build_step();
        let mut loose = None;
        let mut rest = run;
        let mut built = (|| {
            while !rest.is_empty() {
                let at = rest.start + step.min(rest.end - rest.start);
                let (part, tail) = if at < rest.end {
                    self.write_meta()?.split_reserved_home(&rest, at)
                } else {
                    (rest.clone(), at..at)
                };
                rest = tail;
                let made = self.manage(Privilege::Normal, |m| match loose {
                    None => m.begin_home(part.clone()).map(Some),
                    Some(id) => m.extend_home(id, part.clone()).map(|()| None),
                });
                if let Ok(mut meta) = self.write_meta() {
                    meta.unreserve_home(&part);
                }
                if let Some(made) = made? {
                    loose = Some(made);
                }
            }
            let id = loose.ok_or_else(|| Error::inconsistent("an empty home was built"))?;
            if let Some(finish) = finish.as_mut() {
                self.manage(Privilege::Normal, |m| finish(m, id))?;
            }
            Ok(id)
        })();
        if let Ok(mut meta) = self.write_meta() {
            meta.unreserve_home(&rest);
        }
        if let (Err(e), Some(id)) = (&built, loose) {
            // Leave no trace (reclaim frees it later if this fails too).
            if let Err(again) = self.free_loose_home(id) {
                warn!(error = %again, build = %e, "a failed build's home awaits reclaim");
                built = Err(again);
            }
        }
        built
    }

    /// Grows in-pool copy-on-write volume `id` (`name`, `old_size` bytes)
    /// to `new_size` bytes. In place when the data chunks right after its
    /// home are free and in the same region of the device: they are
    /// zeroed, then allocated with the new size in one commit, or, more
    /// than one commit allocates, into a loose home that the last commit
    /// joins to the volume. Otherwise the home moves
    /// ([`Self::move_pool_home`]). No I/O of the volume runs while its
    /// home's window changes. Its snapshots keep their size.
    fn grow_pool_home(&self, id: u64, name: &str, old_size: u64, new_size: u64) -> Result<()> {
        let cs = self.chunk_size();
        let (old_chunks, new_chunks) = (old_size.div_ceil(cs), new_size.div_ceil(cs));
        let step = self.home_build_step();
        let _building = self.origins.building_home();
        let in_place = self.write_meta()?.reserve_home_growth(id, new_chunks);
        let run = match in_place {
            Ok(run) => run,
            Err(Error::Exhausted(Resource::DataSpace)) => {
                return self.move_pool_home(id, name, old_size, new_size)
            }
            Err(e) => return Err(e),
        };
        let grown = self.zero_home(&run).and_then(|()| {
            let loose = if new_chunks - old_chunks > step {
                Some(self.build_in_steps(run.clone(), None)?)
            } else {
                None
            };
            let first = self.read_meta()?.pool_home(id)?.0;
            let d = self.origin_device(id, name)?;
            // I/O that found this device waits, then finds it replaced.
            let _busy = d.busy_exclusive();
            let grown = self.manage(Privilege::Normal, |m| {
                let added = match loose {
                    Some(l) => HomeGrowth::Loose(l),
                    None => HomeGrowth::Run(run.clone()),
                };
                m.grow_home(id, old_size, new_size, added)
            });
            if grown.is_ok() {
                self.open_home(id, first, new_size);
                self.sum_home_later(run.clone());
            } else if let Some(l) = loose {
                if let Err(e) = self.free_loose_home(l) {
                    warn!(error = %e, "a failed growth's home awaits reclaim");
                }
            }
            grown
        });
        if let Ok(mut meta) = self.write_meta() {
            meta.unreserve_home(&run);
        }
        grown
    }

    /// Grows in-pool copy-on-write volume `id` (`name`, `old_size` bytes)
    /// to `new_size` bytes by moving its home to a free run of the new
    /// length elsewhere in the pool ([`Self::rehome`]; the old home passes
    /// to a loose home, which reclaim frees).
    fn move_pool_home(&self, id: u64, name: &str, old_size: u64, new_size: u64) -> Result<()> {
        self.rehome(
            id,
            name,
            new_size,
            |_| Ok(()),
            |m, to| m.move_home(id, old_size, new_size, to),
        )
    }

    /// Copies external copy-on-write volume `name`'s data into a new home
    /// in the pool and detaches its device, in one commit: the volume
    /// stays, as a copy-on-write volume with its home in the pool, with its
    /// snapshots and clones as they were (their copies, their epochs); the
    /// device is flushed first, and left a plain raw disk with the same
    /// content. Needs a free run of the volume's size in the pool
    /// (`NoSpace` otherwise). Refused while a rollback is unfinished.
    pub fn copy_origin_to_pool(&self, name: &str) -> Result<()> {
        let id = self.lookup(name)?.0;
        let size = {
            let meta = self.read_meta()?;
            let (cow, rec) = meta.cow_state(id)?;
            if !matches!(cow.home, Home::External(_)) {
                return Err(Invalid::NotAnOrigin(name.to_owned()).into());
            }
            if cow.rollback != 0 {
                return Err(OriginUnavailable::RollbackInterruptedFirst {
                    name: name.to_owned(),
                }
                .into());
            }
            rec.size_bytes
        };
        let _building = self.origins.building_home();
        self.rehome(
            id,
            name,
            size,
            |t| t.flush(),
            |m, to| m.import_home(id, size, to),
        )
    }

    /// Gives copy-on-write volume `id` (`name`) a new home in the pool,
    /// `new_size` bytes (at least its size) holding its content (caller
    /// holds `homes_lock`; `NoSpace` when no free run of that length is
    /// left):
    /// 1. the run is set aside, and, when more than one commit allocates
    ///    it, built into a loose home (nothing reads a loose home, so its
    ///    old content does not matter yet);
    /// 2. while the volume's I/O goes on, its content is copied to the
    ///    run's start and the rest of the run zeroed, then the chunks
    ///    written meanwhile are copied again, a few passes while many are;
    /// 3. the pool's device is flushed (the copy written back), then, with
    ///    the volume's I/O held off (its snapshots' reads of the home too):
    ///    the chunks written since are copied, then `prepare` runs on its
    ///    device;
    /// 4. one commit runs `switch` (which gives the volume the run) and
    ///    the volume's I/O goes to the new home. A commit flushes the
    ///    pool's device before its record, so the copy is durable when the
    ///    volume names it; before that commit nothing on disk does (a power
    ///    cut leaves the old home, and at most a loose home for reclaim).
    ///
    /// A failure frees what it allocated. The volume's I/O waits only for
    /// step 3 (at most [`CATCH_UP_LEFT`] chunks, unless it writes faster
    /// than the copy goes).
    fn rehome(
        &self,
        id: u64,
        name: &str,
        new_size: u64,
        prepare: impl FnOnce(&Target<'_>) -> Result<()>,
        switch: impl Fn(&mut Volumes, HomeGrowth) -> Result<()>,
    ) -> Result<()> {
        let cs = self.chunk_size();
        let chunks = new_size.div_ceil(cs);
        let run = {
            let mut meta = self.write_meta()?;
            meta.check_cow_home(chunks)?;
            meta.reserve_home(chunks)?
        };
        let done = (|| {
            let loose = if chunks > self.home_build_step() {
                Some(self.build_in_steps(run.clone(), None)?)
            } else {
                None
            };
            let done = (|| {
                let d = self.origin_device(id, name)?;
                let size = self.read_meta()?.volume(id)?.size_bytes;
                if size > new_size {
                    return Err(Invalid::ResizedMeanwhile(name.to_owned()).into());
                }
                let t = Target {
                    id,
                    name,
                    size,
                    d: &d,
                };
                let tracking = d.track(cs, size.div_ceil(cs));
                // A damaged block of a home in the pool fails the move: never
                // copied where it would have no sum.
                self.fill_run(&run, size, |buf, at| self.read_home_settled(&t, buf, at))?;
                let mut left = tracking.take();
                for _ in 0..CATCH_UP_PASSES {
                    if left.iter().map(|r| r.end - r.start).sum::<u64>() <= CATCH_UP_LEFT {
                        break;
                    }
                    self.copy_chunks_to(&t, &left, run.start)?;
                    left = tracking.take();
                }
                // The copy's write-back now, not in the commit below, which
                // the volume's I/O waits for.
                self.store.dev.flush()?;
                // I/O that found this device waits, then finds it replaced.
                let busy = d.busy_exclusive();
                if self
                    .origins
                    .get(id)
                    .is_none_or(|now| !Arc::ptr_eq(&now, &d))
                    || self.read_meta()?.volume(id)?.size_bytes != size
                {
                    return Err(Conflict::ResizedOrDetached(name.to_owned()).into());
                }
                left.extend(tracking.take());
                drop(tracking);
                self.copy_chunks_to(&t, &left, run.start)?;
                prepare(&t)?;
                self.manage(Privilege::Normal, |m| {
                    let to = match loose {
                        Some(l) => HomeGrowth::Loose(l),
                        None => HomeGrowth::Run(run.clone()),
                    };
                    switch(m, to)
                })?;
                self.open_home(id, run.start, new_size);
                self.sum_home_later(run.clone());
                drop(busy);
                // Reads through an epoch that found the old device finish
                // before this returns: an origin's device is then closed and
                // free for others to write. (An old home in the pool is safe
                // anyway: its chunks are freed, and reused, only by later
                // commits, which such reads' I/O gate holds off.)
                d.wait_epoch_readers();
                Ok(())
            })();
            if let (Err(e), Some(l)) = (&done, loose) {
                if let Err(again) = self.free_loose_home(l) {
                    warn!(error = %again, failure = %e, "a failed new home awaits reclaim");
                }
            }
            done
        })();
        if let Ok(mut meta) = self.write_meta() {
            meta.unreserve_home(&run);
        }
        done
    }

    /// Copies the chunks of `runs` (of the volume `t`, inside its size)
    /// from its device to the same chunks of the home from data chunk
    /// `first`.
    fn copy_chunks_to(&self, t: &Target<'_>, runs: &[Range<u64>], first: u64) -> Result<()> {
        let geo = &self.store.geo;
        let cs = geo.chunk_size;
        let base = geo.chunk_offset(first);
        let mut buf = Vec::new();
        for run in runs {
            let from = run.start * cs;
            let to = (run.end * cs).min(t.size);
            let mut at = from;
            while at < to {
                let n = (to - at).min(4 << 20);
                buf.resize(n as usize, 0);
                self.read_home_settled(t, &mut buf, at)?;
                self.store.dev.write_at(&buf, base + at)?;
                at += n;
            }
        }
        Ok(())
    }

    /// Writes the `len` bytes `read` gives (a volume's reads, at their
    /// offsets) to the start of the data chunks of `run` (set aside,
    /// contiguous on the device, at least `len` bytes), a piece at a time,
    /// and zeros the rest of the run.
    fn fill_run(
        &self,
        run: &Range<u64>,
        len: u64,
        read: impl Fn(&mut [u8], u64) -> Result<()>,
    ) -> Result<()> {
        const PIECE: u64 = 4 << 20;
        let geo = &self.store.geo;
        let total = (run.end - run.start) * geo.chunk_size;
        if len > total {
            return Err(Error::inconsistent(format!(
                "{len} bytes for a run of {total}"
            )));
        }
        if total == 0 {
            return Ok(());
        }
        let base = geo.chunk_offset(run.start);
        let mut buf = vec![0u8; PIECE.min(len) as usize];
        let mut done = 0;
        while done < len {
            let n = PIECE.min(len - done) as usize;
            read(&mut buf[..n], done)?;
            self.store.dev.write_at(&buf[..n], base + done)?;
            done += n as u64;
        }
        if total > len {
            self.store.dev.write_zeroes(base + len, total - len)?;
        }
        Ok(())
    }

    /// One step of freeing a loose home (see [`Volumes::shrink_loose_home`]),
    /// unless a home is being built. Returns the chunks freed (0: none to
    /// free now).
    pub(super) fn reclaim_loose_home(&self) -> Result<u64> {
        let Some(_homes) = self.origins.no_home_building() else {
            return Ok(0);
        };
        let Some(id) = self.read_meta()?.any_loose_home() else {
            return Ok(0);
        };
        self.shrink_loose_home(id)
    }

    /// Frees loose home `id` whole, a step at a time (caller holds
    /// `homes_lock`).
    fn free_loose_home(&self, id: u64) -> Result<()> {
        while self.read_meta()?.volume(id).is_ok() {
            self.shrink_loose_home(id)?;
        }
        self.commit_open()
    }

    /// One step of [`Volumes::shrink_loose_home`] (caller holds
    /// `homes_lock`). Returns the chunks freed.
    fn shrink_loose_home(&self, id: u64) -> Result<u64> {
        self.commit_if_needed()?;
        let mut committed = false;
        loop {
            let mut meta = self.write_meta()?;
            match self.mutate(&mut meta, Privilege::Reserve, |m| m.shrink_loose_home(id)) {
                // Its space-map pages did not fit the room left: once more
                // in an empty transaction, which holds them.
                Err(Error::Exhausted(Resource::Journal)) if !committed => {
                    drop(meta);
                    self.commit_open()?;
                    committed = true;
                }
                other => return other,
            }
        }
    }

    /// Writes zeros over the data chunks of `run` (free, set aside).
    fn zero_home(&self, run: &Range<u64>) -> Result<()> {
        if run.is_empty() {
            // No chunk: its start may be past the last one, which has no
            // offset on the device.
            return Ok(());
        }
        let geo = &self.store.geo;
        let len = (run.end - run.start) * geo.chunk_size;
        self.store
            .dev
            .write_zeroes(geo.chunk_offset(run.start), len)?;
        Ok(())
    }

    /// Serves the home of copy-on-write volume `id` (`size` bytes from data
    /// chunk `first`) through a window of the pool's device.
    pub(super) fn open_home(&self, id: u64, first: u64, size: u64) {
        let base = self.store.geo.chunk_offset(first);
        let home = OriginDevice::in_pool(Arc::clone(&self.store.dev), first, base, size);
        self.origins.insert(id, home);
    }

    /// Opens the homes in the pool of every copy-on-write volume (at open).
    pub(super) fn open_homes(&self) -> Result<()> {
        let (homes, cow): (Vec<(u64, u64, u64)>, Vec<u64>) = {
            let meta = self.read_meta()?;
            let mut homes = Vec::new();
            let mut cow = Vec::new();
            for (id, state) in meta.cow_volumes() {
                if let Home::Pool { first } = state.home {
                    homes.push((id, first, meta.volume(id)?.size_bytes));
                }
                cow.push(id);
            }
            (homes, cow)
        };
        for (id, first, size) in homes {
            self.open_home(id, first, size);
        }
        // Every recorded loss, read once: an origin's (attached or not, for
        // listings and check) and a volume's copied into the pool after its
        // device shrank. Only `origin_loss.rs` changes them afterwards, and
        // it keeps this in step.
        for id in cow {
            let loss = self.recorded_loss(id)?;
            self.origins.set_loss(id, loss);
        }
        Ok(())
    }

    /// Records `identity` as the device of external copy-on-write volume
    /// `name`, whose device is not attached: the same disk under a new
    /// device number (a block device after a reboot). The caller must know
    /// it is the same disk (the daemon compares the disk's own identifiers):
    /// attaching another disk in its place would show other data to every
    /// snapshot.
    pub fn reidentify_origin(&self, name: &str, identity: DeviceIdentity) -> Result<()> {
        let id = self.lookup(name)?.0;
        if self.origins.get(id).is_some() {
            return Err(Conflict::Attached(name.to_owned()).into());
        }
        self.manage(Privilege::Normal, |m| m.set_external_identity(id, identity))
    }

    /// The pool's external copy-on-write volumes.
    pub fn origins(&self) -> Result<Vec<OriginInfo>> {
        let meta = self.read_meta()?;
        let mut all = Vec::new();
        for (id, cow) in meta.cow_volumes() {
            let rec = meta.volume(id)?;
            let Home::External(identity) = cow.home else {
                continue;
            };
            all.push(OriginInfo {
                id: VolumeId(id),
                name: rec.name.clone(),
                size: rec.size_bytes,
                identity,
                attached: self.origins.get(id).is_some_and(|d| d.shrunk().is_none()),
                rollback_epoch: cow.rollback,
                loss: None,
            });
        }
        drop(meta);
        for o in &mut all {
            o.loss = self.origins.loss(o.id.0);
        }
        all.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(all)
    }

    /// Detaches external copy-on-write volume `name`: its device is left a
    /// plain raw disk with the volume's current content (flushed), and the
    /// volume is gone from the pool. Refused while snapshots or clones
    /// read through it.
    pub fn detach_origin(&self, name: &str) -> Result<()> {
        let id = self.lookup(name)?.0;
        let device = self.origins.get(id);
        if let Some(d) = &device {
            let _busy = d.busy_exclusive();
            let size = d.dev().size();
            Target { id, name, size, d }.flush()?;
        }
        self.manage(Privilege::Reserve, |m| {
            m.cow_state(id)?;
            if m.volume_id(name)? != id {
                return Err(Conflict::Changed(name.to_owned()).into());
            }
            m.delete_checked(id, false)
        })?;
        self.origins.remove(id);
        Ok(())
    }

    fn origin_device(&self, id: u64, name: &str) -> Result<Arc<OriginDevice>> {
        self.origins.get(id).ok_or_else(|| {
            OriginUnavailable::NotAttached {
                name: name.to_owned(),
            }
            .into()
        })
    }

    /// Runs `f` over copy-on-write volume `id` and its device, sharing the
    /// device with other requests (a rollback waits for them, and they for
    /// it). Refused while a rollback is unfinished.
    fn with_target<T>(&self, id: u64, f: impl FnOnce(&Target<'_>) -> Result<T>) -> Result<T> {
        let name = self.read_meta()?.cow_state(id)?.1.name.clone();
        loop {
            let d = self.origin_device(id, &name)?;
            if let Some(now) = d.shrunk() {
                return Err(d.shrunk_error(&name, now));
            }
            let _busy = d.busy();
            // A growth of a home in the pool replaces its device (a window
            // of the new size) while it holds the old one's `busy`.
            if !self
                .origins
                .get(id)
                .is_some_and(|now| Arc::ptr_eq(&now, &d))
            {
                continue;
            }
            let size = {
                let meta = self.read_meta()?;
                let (cow, rec) = meta.cow_state(id)?;
                if cow.rollback != 0 {
                    return Err(OriginUnavailable::RollbackInterrupted {
                        name: rec.name.clone(),
                    }
                    .into());
                }
                rec.size_bytes
            };
            return f(&Target {
                id,
                name: &name,
                size,
                d: &d,
            });
        }
    }

    /// Resizes copy-on-write volume `id` (`name`, of `old_size` bytes):
    /// only larger. A home in the pool grows in place
    /// ([`Self::grow_pool_home`]). An origin's device is enlarged first (a
    /// regular file; a block device must have been enlarged with its own
    /// tools) and flushed, then the new size is recorded, so a power cut
    /// between the two leaves a device larger than the record, which an
    /// attach accepts (the volume keeps its recorded size until the resize
    /// is run again). Its snapshots keep their size.
    pub(super) fn resize_cow(
        &self,
        id: u64,
        name: &str,
        home: Home,
        old_size: u64,
        new_size: u64,
    ) -> Result<()> {
        if new_size < old_size {
            return Err(match home {
                Home::Pool { .. } => Unsupported::CowShrink(name.to_owned()),
                Home::External(_) => Unsupported::OriginShrink(name.to_owned()),
            }
            .into());
        }
        if new_size == old_size {
            return Ok(());
        }
        if matches!(home, Home::Pool { .. }) {
            return self.grow_pool_home(id, name, old_size, new_size);
        }
        let d = self.origin_device(id, name)?;
        // No I/O of the volume runs while its device changes size.
        let _busy = d.busy_exclusive();
        match d.dev().extend(new_size) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Unsupported => {
                let size = d.dev().refresh_size().map_err(|e| not_enlarged(name, e))?;
                if size < new_size {
                    return Err(Invalid::OriginDeviceTooSmall {
                        name: name.to_owned(),
                        size,
                        new_size,
                        error: e,
                    }
                    .into());
                }
            }
            Err(e) => return Err(not_enlarged(name, e)),
        }
        d.dev().flush().map_err(|e| not_enlarged(name, e))?;
        self.manage(Privilege::Normal, |m| {
            if m.volume(id)?.size_bytes != old_size {
                return Err(Invalid::ResizedMeanwhile(name.to_owned()).into());
            }
            m.set_volume_size(id, new_size)
        })
    }

    /// Whether a write to volume `id` may first copy what its snapshots
    /// still read, and wait for the commit that makes the copy durable: a
    /// copy-on-write volume with a live epoch. (False when the pool has
    /// failed: its writes fail at once.)
    pub fn writes_may_copy(&self, id: VolumeId) -> bool {
        self.read_meta()
            .is_ok_and(|meta| meta.table().newest_live_epoch(id.0).is_some())
    }

    /// Reads `buf.len()` bytes at `offset` of copy-on-write volume `id`
    /// (checked by the caller) from its device, no lookup in the pool. A
    /// home in the pool is verified against its sums; a mismatch is read
    /// again with the volume's writers of those chunks held off (a write
    /// changes data and sums under them, not at one instant): a mismatch
    /// then is damage.
    pub(super) fn cow_read(&self, id: u64, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.with_target(id, |t| self.read_home_settled(t, buf, offset))
    }

    /// [`Self::read_home`] by a caller that does not hold the chunks'
    /// origin stripes: a mismatch is read again with them held (no write
    /// of those chunks in flight); a mismatch then is damage, noted.
    fn read_home_settled(&self, t: &Target<'_>, buf: &mut [u8], at: u64) -> Result<()> {
        match self.read_home(t, buf, at) {
            Err(Error::Damaged(_)) => {
                let cs = self.chunk_size();
                let chunks = at / cs..(at + buf.len() as u64).div_ceil(cs);
                let _stripes = self.origins.stripes(t.id, chunks, false);
                let read = self.read_home(t, buf, at);
                self.after_damage(read)
            }
            other => other,
        }
    }

    /// Reads `buf.len()` bytes at `at` of copy-on-write volume `t`'s
    /// device; a home in the pool of a pool with checksums verified
    /// against its sums (whole blocks read around a part of one).
    fn read_home(&self, t: &Target<'_>, buf: &mut [u8], at: u64) -> Result<()> {
        let geo = &self.store.geo;
        let Some(first) = t.d.home().filter(|_| geo.version().has_data_checksums()) else {
            return t.read(buf, at);
        };
        let len = buf.len() as u64;
        let source = self.home_byte(first, at);
        let sums = {
            let meta = self.read_meta()?;
            let mut sums = ReadSums::default();
            sums.add_range(meta.meta(), source, len)?;
            sums
        };
        let piece = Piece {
            len,
            source: Source::Pool(source),
        };
        self.read_verified(&[piece], buf, &sums, None)
    }

    /// Writes `fill` over `[offset, offset + len)` of copy-on-write volume
    /// `id` (checked by the caller), copying first what its epochs need.
    pub(super) fn cow_write(&self, id: u64, offset: u64, len: u64, fill: Fill<'_>) -> Result<()> {
        self.with_target(id, |t| self.cow_write_units(t, offset, len, fill))
    }

    fn cow_write_units(
        &self,
        target: &Target<'_>,
        offset: u64,
        len: u64,
        fill: Fill<'_>,
    ) -> Result<()> {
        let cs = self.chunk_size();
        let step = (UNIT_BYTES / cs).max(1) * cs;
        let end = offset + len;
        let mut at = offset;
        while at < end {
            let to = ((at / cs) * cs + step).min(end);
            let part = match fill {
                Fill::Data(data) => {
                    Fill::Data(&data[(at - offset) as usize..(to - offset) as usize])
                }
                Fill::Zeros => Fill::Zeros,
            };
            self.cow_write_unit(target, at, to, part)?;
            at = to;
        }
        Ok(())
    }

    /// One unit of [`Self::cow_write`]: the steps of the module
    /// documentation.
    fn cow_write_unit(&self, t: &Target<'_>, from: u64, to: u64, fill: Fill<'_>) -> Result<()> {
        let cs = self.chunk_size();
        let chunks = from / cs..to.div_ceil(cs);
        let _stripes = self.origins.stripes(t.id, chunks.clone(), true);
        self.refuse_lost_copies(t.id, t.name, chunks.clone())?;
        self.preserve(t, chunks.clone())?;
        // A home in the pool of a pool with checksums: its blocks get sums.
        let home =
            t.d.home()
                .filter(|_| self.store.geo.version().has_data_checksums());
        /// What a home in the pool's write does next, decided in one hold
        /// of the metadata lock.
        enum Next {
            Write,
            /// Commit (through this transaction, or the open one) first.
            Commit(Option<u64>),
        }
        let mut committed = false;
        loop {
            {
                let _gate = self.gates.io();
                let needs_copy = |meta: &Volumes| -> Result<bool> {
                    for chunk in chunks.clone() {
                        if meta.copy_needed(t.id, chunk)?.is_some() {
                            return Ok(true);
                        }
                    }
                    Ok(false)
                };
                // (Looked at under the shared lock: no write of these
                // chunks but this one, and no snapshot, passes the gate.)
                if needs_copy(&*self.read_meta()?)? {
                    drop(_gate);
                    // A snapshot came between the copies and the gate.
                    self.preserve(t, chunks.clone())?;
                    continue;
                }
                let Some(first) = home else {
                    return t.write(from, to, fill);
                };
                // The blocks' sums, computed before the lock (a block
                // written in part is read and verified first).
                let sums = self.home_sums(first, from, to, fill)?;
                let next = {
                    let mut meta = self.write_meta()?;
                    if meta.ready_in_place(first + chunks.start..first + chunks.end)? {
                        // The crash rule (`crate::intents`) holds: the sums
                        // first, in the same hold of the gate as the data
                        // (a scrub's second look holds the gate exclusive).
                        // A write that fails for metadata leaves no trace;
                        // one that fails on the device leaves its blocks as
                        // a failed write to a disk does.
                        match self.mutate(&mut meta, Privilege::Normal, |m| m.record_sums(&sums)) {
                            Ok(()) => Next::Write,
                            Err(Error::Exhausted(Resource::Journal)) if !committed => {
                                committed = true;
                                Next::Commit(None)
                            }
                            Err(e) => return Err(e),
                        }
                    } else {
                        // In place only in a region the last durable commit
                        // lists (or the intent log): listed now, then
                        // made durable.
                        let txn = meta.take_intents_await();
                        if meta.wants_intents() {
                            self.mutate(&mut meta, Privilege::Reserve, |m| m.add_wanted_intents())?;
                        }
                        Next::Commit(txn)
                    }
                };
                match next {
                    Next::Write => return t.write(from, to, fill),
                    Next::Commit(txn) => {
                        drop(_gate);
                        match txn {
                            Some(txn) => self.list_through(txn)?,
                            None => self.commit_open()?,
                        }
                    }
                }
            }
            // A snapshot may have come meanwhile.
            self.preserve(t, chunks.clone())?;
        }
    }

    /// The sums of the blocks of a home in the pool (from data chunk
    /// `first`) around `[from, to)` once `fill` is written there: a block
    /// the write covers only in part is read first, and verified (a block
    /// damaged already is not given a new sum over its damage).
    fn home_sums(&self, first: u64, from: u64, to: u64, fill: Fill<'_>) -> Result<Vec<BlockSums>> {
        const BLOCK: u64 = arbor_format::SUM_BLOCK_U64;
        let geo = &self.store.geo;
        let cs = geo.chunk_size;
        let (start, end) = crate::sums::block_span(from, to - from);
        let new = |range: Range<u64>| -> Vec<Option<u32>> {
            let blocks = ((range.end - range.start) / BLOCK) as usize;
            match fill {
                Fill::Data(d) => crate::sums::compute(
                    &d[(range.start - from) as usize..(range.end - from) as usize],
                ),
                Fill::Zeros => vec![Some(arbor_format::zero_block_sum()); blocks],
            }
        };
        // A block the write covers in part: its old bytes with the new
        // ones over them.
        let merged = |block: u64| -> Result<Option<u32>> {
            let pchunk = first + block / cs;
            let within = block % cs;
            let mut bytes = vec![0u8; BLOCK as usize];
            self.store
                .dev
                .read_at(&mut bytes, geo.chunk_offset(pchunk) + within)?;
            self.verify_chunk_part(pchunk, within, &bytes)?;
            let (lo, hi) = (from.max(block), to.min(block + BLOCK));
            let out = &mut bytes[(lo - block) as usize..(hi - block) as usize];
            match fill {
                Fill::Data(d) => {
                    out.copy_from_slice(&d[(lo - from) as usize..(hi - from) as usize])
                }
                Fill::Zeros => out.fill(0),
            }
            Ok(Some(arbor_format::block_sum(&bytes)))
        };
        let mut flat: Vec<Option<u32>> = Vec::with_capacity(((end - start) / BLOCK) as usize);
        let whole_from = from.next_multiple_of(BLOCK);
        let whole_to = to - to % BLOCK;
        let head = !from.is_multiple_of(BLOCK);
        if head {
            flat.push(merged(start)?);
        }
        if whole_from < whole_to {
            flat.extend(new(whole_from..whole_to));
        }
        // A tail block written in part, unless it is the head's.
        let tail = !to.is_multiple_of(BLOCK) && (!head || whole_to != start);
        if tail {
            flat.push(merged(whole_to)?);
        }
        // By chunk.
        let mut sums = Vec::new();
        let mut at = start;
        let mut rest = &flat[..];
        while at < end {
            let chunk_end = ((at / cs + 1) * cs).min(end);
            let n = ((chunk_end - at) / BLOCK) as usize;
            let (mine, tail) = rest.split_at(n);
            rest = tail;
            sums.push(BlockSums {
                pchunk: first + at / cs,
                // Below the chunk's block count (a chunk is at most 1 MiB).
                first: ((at % cs) / BLOCK) as u32,
                sums: mine.to_vec(),
            });
            at = chunk_end;
        }
        Ok(sums)
    }

    /// Copies every chunk of `chunks` that needs it and commits, so the
    /// copies are durable (caller holds the chunks' origin stripes). Makes
    /// room and tries again once when the pool is full; splits a range
    /// whose copies do not fit one transaction.
    fn preserve(&self, t: &Target<'_>, chunks: Range<u64>) -> Result<()> {
        let mut made_room = false;
        let mut committed = false;
        loop {
            self.commit_if_needed()?;
            match self.copy_chunks(t, chunks.clone()) {
                Ok(None) => return Ok(()),
                Ok(Some(txn)) => return self.commit_through(txn),
                Err(
                    e @ (Error::Exhausted(Resource::DataSpace)
                    | Error::Exhausted(Resource::Metadata)),
                ) => {
                    if made_room || !self.make_room()? {
                        return Err(e);
                    }
                    made_room = true;
                }
                Err(Error::Exhausted(Resource::Journal)) if !committed => {
                    self.commit_open()?;
                    committed = true;
                }
                Err(Error::Exhausted(Resource::Journal)) if chunks.end - chunks.start > 1 => {
                    let mid = (chunks.start + chunks.end) / 2;
                    self.preserve(t, chunks.start..mid)?;
                    return self.preserve(t, mid..chunks.end);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Step 1 of the module documentation, once: returns the transaction
    /// the copies were mapped in, None when nothing needed a copy.
    fn copy_chunks(&self, t: &Target<'_>, chunks: Range<u64>) -> Result<Option<u64>> {
        let _gate = self.gates.io();
        let plans = {
            let mut meta = self.write_meta()?;
            self.mutate(&mut meta, Privilege::Normal, |m| {
                m.plan_copies(t.id, chunks)
            })?
        };
        if plans.is_empty() {
            return Ok(None);
        }
        let mapped = self.write_copies(t, &plans).and_then(|sums| {
            let mut meta = self.write_meta()?;
            self.mutate(&mut meta, Privilege::Normal, |m| {
                m.map_copies(t.id, &plans)?;
                // The copies' sums, in the step that maps them: a copy is
                // a new chunk, durable before the commit that names it.
                m.record_sums(&sums)?;
                Ok(m.meta().txn())
            })
        });
        if let Err(e) = mapped {
            if self.committer.check_failed().is_ok() {
                let mut meta = self.write_meta()?;
                self.mutate(&mut meta, Privilege::Reserve, |m| m.release_copies(&plans))?;
            }
            return Err(e);
        }
        mapped.map(Some)
    }

    /// Copies the device's chunks of `plans` to their pool chunks (the
    /// part of the last chunk past the volume's end as zeros); the copies'
    /// sums, in a pool with checksums (FORMAT.md §6.4).
    fn write_copies(&self, t: &Target<'_>, plans: &[CopyPlan]) -> Result<Vec<BlockSums>> {
        let geo = &self.store.geo;
        let cs = geo.chunk_size;
        let checksums = geo.version().has_data_checksums();
        let mut sums = Vec::new();
        let mut buf = vec![0u8; cs as usize];
        for plan in plans {
            let start = plan.chunk * cs;
            let len = cs.min(t.size.saturating_sub(start)) as usize;
            buf[len..].fill(0);
            // A damaged block of a home in the pool fails the copy: never
            // given a new, valid sum in the store.
            self.read_home(t, &mut buf[..len], start)?;
            self.store
                .dev
                .write_at(&buf, geo.chunk_offset(plan.pchunk))?;
            if checksums {
                sums.push(BlockSums {
                    pchunk: plan.pchunk,
                    first: 0,
                    sums: crate::sums::compute(&buf),
                });
            }
        }
        Ok(sums)
    }

    /// Flushes every home written since its last flush; one that fails
    /// does not keep the others from being flushed (the first error is
    /// returned, and the failed ones stay due).
    pub(super) fn flush_origins(&self) -> Result<()> {
        let mut first = Ok(());
        for d in self.origins.all() {
            if let Err(e) = d.flush_if_written() {
                if first.is_ok() {
                    first = Err(e);
                }
            }
        }
        first
    }

    /// Makes every completed write to volume `id` durable: commits the
    /// pool, and flushes the volume's home if it is copy-on-write (and no
    /// other volume's: a failing device fails only its own volume's
    /// flushes).
    pub fn flush_volume(&self, id: VolumeId) -> Result<()> {
        self.commit_open()?;
        let flushed = match self.origins.get(id.0) {
            Some(d) => d.flush_if_written(),
            None => Ok(()),
        };
        self.after_origin_error(flushed)
    }

    /// Rolls copy-on-write volume `id` back to epoch `epoch`: every chunk
    /// the epoch reads from the store is written back to the device (the
    /// volume's later snapshots get their copies first, as for any write),
    /// and the snapshots are kept. The rollback is recorded first, so a
    /// power cut part way finishes it when the device is attached again.
    pub(super) fn cow_rollback(&self, id: u64, epoch: u64) -> Result<()> {
        // Refused, not recorded, while the home is not there to write.
        let name = self.read_meta()?.cow_state(id)?.1.name.clone();
        self.origin_device(id, &name)?;
        if let Some(loss) = self.origins.loss(id).filter(|l| epoch <= l.epoch) {
            return Err(OriginUnavailable::RollbackToLost {
                name,
                from: loss.from,
            }
            .into());
        }
        self.manage(Privilege::Normal, |m| {
            let (cow, rec) = m.cow_state(id)?;
            match cow.rollback {
                0 => m.set_cow_rollback(id, epoch),
                // An interrupted rollback to the same snapshot: go on.
                same if same == epoch => Ok(()),
                _ => Err(Conflict::OtherRollback(rec.name.clone()).into()),
            }
        })?;
        self.finish_rollback(id)
    }

    /// Finishes the rollback recorded in copy-on-write volume `id`, if any
    /// and its device is attached.
    fn finish_rollback(&self, id: u64) -> Result<()> {
        let (name, size, epoch) = {
            let meta = self.read_meta()?;
            let (cow, rec) = meta.cow_state(id)?;
            (rec.name.clone(), rec.size_bytes, cow.rollback)
        };
        if epoch == 0 {
            return Ok(());
        }
        let Some(d) = self.origins.get(id) else {
            return Ok(());
        };
        let cs = self.chunk_size();
        {
            let _busy = d.busy_exclusive();
            let target = Target {
                id,
                name: &name,
                size,
                d: &d,
            };
            let mut from = 0;
            let mut buf = vec![0u8; cs as usize];
            loop {
                let (copies, next) = {
                    let _gate = self.gates.io();
                    self.read_meta()?.copies_of_epoch(id, epoch, from, BATCH)?
                };
                for copy in copies {
                    // The copy stays while the rollback runs: the sweep
                    // keeps what the rollback's epoch reads, whoever reads it.
                    {
                        let _gate = self.gates.io();
                        self.store
                            .dev
                            .read_at(&mut buf, self.store.geo.chunk_offset(copy.pchunk))?;
                        // A damaged copy fails the rollback (it stays
                        // recorded, to go on once the copy is healed):
                        // never written back as the volume's data.
                        self.verify_chunk_part(copy.pchunk, 0, &buf)?;
                    }
                    // Written back as any write: later epochs get their
                    // copies of what it replaces first.
                    let start = copy.chunk * cs;
                    let end = (start + cs).min(size);
                    let data = &buf[..(end - start) as usize];
                    self.cow_write_unit(&target, start, end, Fill::Data(data))?;
                }
                match next {
                    Some(at) => from = at,
                    None => break,
                }
            }
            target.flush()?;
        }
        self.manage(Privilege::Reserve, |m| m.set_cow_rollback(id, 0))
    }

    /// Reads `buf.len()` bytes at `offset` of volume `id`, which reads
    /// through epoch `backing` where its own tree maps nothing.
    pub(super) fn read_through(
        &self,
        id: VolumeId,
        backing: Backing,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<()> {
        match self.read_through_once(id, backing, offset, buf, false) {
            // The volume's own chunks may be written in place, data and
            // sums not at one instant: read again with its writers of those
            // chunks held off (`Pool::read`'s rule); a mismatch now is
            // damage.
            Err(Error::Damaged(_)) => {
                let read = self.read_through_once(id, backing, offset, buf, true);
                self.after_damage(read)
            }
            other => other,
        }
    }

    /// [`Self::read_through`] once, every block of the pool's verified
    /// against its sum (the volume's own chunks and the store's copies);
    /// `settled`: with the volume's stripes held.
    fn read_through_once(
        &self,
        id: VolumeId,
        backing: Backing,
        offset: u64,
        buf: &mut [u8],
        settled: bool,
    ) -> Result<()> {
        let cs = self.chunk_size();
        let len = buf.len() as u64;
        let chunks = offset / cs..(offset + len).div_ceil(cs);
        // Lock order: the origin stripes, the gate, the volume's stripes
        // (as a write of the volume takes them, `Pool::apply`).
        let _stripes = self.origins.stripes(backing.origin, chunks.clone(), false);
        let _gate = self.gates.io();
        let _settled = settled.then(|| self.gates.stripes(id.0, chunks));
        let (pieces, sums) = {
            let meta = self.read_meta()?;
            Self::check_io(&meta, id, offset, len, false)?;
            if meta.volume(id.0)?.backing != Some(backing) {
                return Err(Conflict::VolumeChanged.into());
            }
            let pieces = Self::resolve(&meta, id, offset, len)?;
            let pieces = Self::resolve_view(&meta, backing, offset, pieces)?;
            let sums = Self::read_sums(&meta, &pieces)?;
            (pieces, sums)
        };
        self.read_view_pieces(backing, pieces, buf, sums.as_ref())
    }

    /// Reads pieces resolved through epoch `backing` into `buf`, the pool's
    /// verified against `sums` if given; the device must be attached only
    /// if a piece is on it.
    fn read_view_pieces(
        &self,
        backing: Backing,
        pieces: Vec<Piece>,
        buf: &mut [u8],
        sums: Option<&ReadSums>,
    ) -> Result<()> {
        let read = |pieces: Vec<Piece>, buf: &mut [u8], origin: Option<&ReadOrigin<'_>>| match sums
        {
            Some(sums) => self.read_verified(&pieces, buf, sums, origin),
            None => self.read_pieces(pieces, buf, origin),
        };
        if !pieces.iter().any(|p| matches!(p.source, Source::Origin(_))) {
            return read(pieces, buf, None);
        }
        let (name, size) = {
            let meta = self.read_meta()?;
            let (_, rec) = meta.cow_state(backing.origin)?;
            (rec.name.clone(), rec.size_bytes)
        };
        self.refuse_lost_read(backing, &name, &pieces)?;
        let mut d = self.origin_device(backing.origin, &name)?;
        loop {
            let reading = d.reading_epoch();
            if self
                .origins
                .get(backing.origin)
                .is_some_and(|now| Arc::ptr_eq(&now, &d))
            {
                let target = Target {
                    id: backing.origin,
                    name: &name,
                    size,
                    d: &d,
                };
                // (The caller holds the origin stripes: no write of
                // the home's chunks runs under this read.)
                let read = read(
                    pieces,
                    buf,
                    Some(&|out, at| self.read_home(&target, out, at)),
                );
                drop(reading);
                return read;
            }
            // A new home replaced this device: read the new one (the
            // pieces' offsets are the volume's, wherever its home is).
            drop(reading);
            d = self.origin_device(backing.origin, &name)?;
        }
    }

    /// Replaces the zero pieces of `pieces` (a read at `offset` of a volume
    /// that reads through `backing`) by what the epoch reads there: the
    /// store's copy, else the device (zeros past its end).
    pub(super) fn resolve_view(
        meta: &Volumes,
        backing: Backing,
        offset: u64,
        pieces: Vec<Piece>,
    ) -> Result<Vec<Piece>> {
        let geo = meta.meta().geo();
        let cs = geo.chunk_size;
        let (_, origin) = meta.cow_state(backing.origin)?;
        let (root, size) = (origin.root, origin.size_bytes);
        let mut out = Vec::with_capacity(pieces.len());
        let mut pos = offset;
        for piece in pieces {
            let end = pos + piece.len;
            if piece.source != Source::Zeros {
                push_piece(&mut out, piece);
                pos = end;
                continue;
            }
            while pos < end {
                let chunk = pos / cs;
                let chunk_end = ((chunk + 1) * cs).min(end);
                if pos >= size {
                    push_piece(
                        &mut out,
                        Piece {
                            len: end - pos,
                            source: Source::Zeros,
                        },
                    );
                    pos = end;
                    break;
                }
                match SnapStore::new(meta.meta(), root).lookup(chunk, backing.epoch)? {
                    Some(copy) => push_piece(
                        &mut out,
                        Piece {
                            len: chunk_end - pos,
                            source: Source::Pool(geo.chunk_offset(copy.pchunk) + pos % cs),
                        },
                    ),
                    None => {
                        let device_end = chunk_end.min(size);
                        push_piece(
                            &mut out,
                            Piece {
                                len: device_end - pos,
                                source: Source::Origin(pos),
                            },
                        );
                        if chunk_end > device_end {
                            push_piece(
                                &mut out,
                                Piece {
                                    len: chunk_end - device_end,
                                    source: Source::Zeros,
                                },
                            );
                        }
                    }
                }
                pos = chunk_end;
            }
        }
        Ok(out)
    }

    /// Where on the pool's device byte `at` of the home in the pool from
    /// data chunk `first` is: the home is a run of chunks contiguous on
    /// the device (inside one region).
    pub(super) fn home_byte(&self, first: u64, at: u64) -> u64 {
        self.store.geo.chunk_offset(first) + at
    }

    /// The first data chunk of copy-on-write volume `id`'s home if it is in
    /// the pool; None for any other record.
    pub(super) fn home_in_pool(meta: &Volumes, id: u64) -> Option<u64> {
        meta.pool_home(id).ok().map(|(first, _)| first)
    }

    /// Reads chunk `chunk` as epoch `backing` sees it into `buf` (one
    /// chunk; caller holds the chunk's origin stripe and the I/O gate).
    pub(super) fn read_view_chunk(
        &self,
        backing: Backing,
        chunk: u64,
        buf: &mut [u8],
    ) -> Result<()> {
        let cs = self.chunk_size();
        let (pieces, sums) = {
            let meta = self.read_meta()?;
            let zeros = vec![Piece {
                len: cs,
                source: Source::Zeros,
            }];
            let pieces = Self::resolve_view(&meta, backing, chunk * cs, zeros)?;
            // The store's copies verified: a damaged copy must fail the
            // write that copies it, never be given a new, valid sum.
            let sums = Self::read_sums(&meta, &pieces)?;
            (pieces, sums)
        };
        self.read_view_pieces(backing, pieces, buf, sums.as_ref())
    }

    /// Removes copies no epoch reads any more, looking at a bounded number
    /// of store entries per call; returns its cost in metadata nodes (the
    /// leaves those entries fill, at least 1), the unit reclaim is paced in,
    /// or 0 when there is nothing to do.
    pub(super) fn sweep_stores(&self) -> Result<usize> {
        let Some((id, from)) = self.origins.next_sweep() else {
            return Ok(0);
        };
        self.commit_if_needed()?;
        let mut committed = false;
        let (next, seen) = loop {
            let mut meta = self.write_meta()?;
            if !matches!(meta.volume(id).map(|r| r.layout), Ok(DataLayout::Cow(_))) {
                self.origins.sweep_done(id, None);
                return Ok(1);
            }
            match self.mutate(&mut meta, Privilege::Reserve, |m| {
                m.sweep_copies(id, from, SWEEP_ENTRIES)
            }) {
                // Its copies' space-map pages did not fit the journal room
                // left: once more in an empty transaction, which holds them
                // (one page per entry at most).
                Err(Error::Exhausted(Resource::Journal)) if !committed => {
                    drop(meta);
                    self.commit_open()?;
                    committed = true;
                }
                other => break other?,
            }
        };
        self.origins.sweep_done(id, next);
        Ok(seen.div_ceil(leaf_capacity(TreeKind::Mapping)).max(1))
    }
}
