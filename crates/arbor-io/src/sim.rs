use std::io;
use std::sync::{Arc, Mutex, MutexGuard};

use rand::Rng;

use crate::record::{land, put_into};
use crate::{check_range, BlockDevice, SECTOR_SIZE};

/// An in-memory disk with a volatile write cache and a power switch.
///
/// `SimDisk` is cheap to clone: clones share the same medium, so a test keeps
/// a [`SimDiskHandle`] to cut power while the engine owns the device.
#[derive(Clone)]
pub struct SimDisk {
    inner: Arc<Mutex<SimState>>,
}

/// The test's side of a [`SimDisk`]: power control and crash images.
#[derive(Clone)]
pub struct SimDiskHandle {
    inner: Arc<Mutex<SimState>>,
}

struct SimState {
    /// What reads see: every completed write applied in order.
    visible: Vec<u8>,
    /// What survives a power cut for certain: the state at the last flush.
    durable: Vec<u8>,
    /// Writes completed since the last flush, in completion order; `true`
    /// for one made durable alone (`write_durable_at`), which a power cut
    /// keeps whole.
    unflushed: Vec<(u64, Vec<u8>, bool)>,
    /// Operations (writes and flushes) allowed before power is cut; `None` = never.
    ops_until_power_cut: Option<u64>,
    powered: bool,
    flushes: u64,
    writes: u64,
    /// Simulated time a flush takes (widens windows for concurrency tests).
    flush_delay: std::time::Duration,
}

fn power_is_off() -> io::Error {
    io::Error::other("simulated power loss: device is off")
}

impl SimDisk {
    /// A zero-filled disk of `size` bytes.
    pub fn new(size: u64) -> Self {
        // A test device: a size beyond the address space is the caller's bug.
        #[allow(clippy::expect_used)]
        let size = usize::try_from(size).expect("SimDisk size fits in memory");
        Self::from_image(vec![0; size])
    }

    /// A disk whose durable and visible contents are `image`.
    pub fn from_image(image: Vec<u8>) -> Self {
        let state = SimState {
            visible: image.clone(),
            durable: image,
            unflushed: Vec::new(),
            ops_until_power_cut: None,
            powered: true,
            flushes: 0,
            writes: 0,
            flush_delay: std::time::Duration::ZERO,
        };
        Self {
            inner: Arc::new(Mutex::new(state)),
        }
    }

    pub fn handle(&self) -> SimDiskHandle {
        SimDiskHandle {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl SimDisk {
    /// A write seen by every later read, kept whole by every power cut
    /// when `durable` (else a power cut may drop or tear it).
    fn complete_write(&self, buf: &[u8], offset: u64, durable: bool) -> io::Result<()> {
        let mut state = lock(&self.inner);
        check_range(offset, buf.len(), state.visible.len() as u64)?;
        if !state.spend_op() {
            return Err(power_is_off());
        }
        let start = offset as usize;
        state.visible[start..start + buf.len()].copy_from_slice(buf);
        state.unflushed.push((offset, buf.to_vec(), durable));
        state.writes += 1;
        Ok(())
    }
}

fn lock(inner: &Mutex<SimState>) -> MutexGuard<'_, SimState> {
    // A panic while holding this lock can only come from a bug in this file;
    // the state is plain bytes, so continuing with it is safe.
    inner
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl SimState {
    /// Counts one operation against the power budget; false once power is gone.
    fn spend_op(&mut self) -> bool {
        if !self.powered {
            return false;
        }
        match self.ops_until_power_cut {
            Some(0) => {
                self.powered = false;
                false
            }
            Some(ref mut n) => {
                *n -= 1;
                true
            }
            None => true,
        }
    }
}

impl BlockDevice for SimDisk {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let state = lock(&self.inner);
        check_range(offset, buf.len(), state.visible.len() as u64)?;
        if !state.powered {
            return Err(power_is_off());
        }
        let start = offset as usize;
        buf.copy_from_slice(&state.visible[start..start + buf.len()]);
        Ok(())
    }

    /// A range that reads as zeros now counts as a hole: the medium has
    /// only bytes (a scan, for tests), so the engine's partial writes into
    /// new chunks run under every test on this disk. A power cut may bring
    /// back older bytes under zeros not yet flushed, as a file system may
    /// under a hole punched since the last flush.
    fn hole(&self, offset: u64, len: u64) -> io::Result<bool> {
        let state = lock(&self.inner);
        let end = crate::check_span(offset, len, state.visible.len() as u64)?;
        if !state.powered {
            return Err(power_is_off());
        }
        Ok(state.visible[offset as usize..end as usize]
            .iter()
            .all(|&b| b == 0))
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.complete_write(buf, offset, false)
    }

    /// Durable alone: a power cut keeps this write whole, over any earlier
    /// write to the same bytes, while the other writes since the last
    /// flush stay as likely to be lost or torn as before (so a caller that
    /// relies on them being durable too is caught).
    fn write_durable_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.complete_write(buf, offset, true)
    }

    /// Last to first: a batch's order is the device's to choose, so the
    /// engine must not depend on it (and a power cut in the middle of a
    /// batch leaves its last writes done and its first ones not).
    fn write_batch(&self, writes: &[(u64, &[u8])]) -> io::Result<()> {
        writes
            .iter()
            .rev()
            .try_for_each(|&(offset, buf)| self.write_at(buf, offset))
    }

    /// Enlarging is a metadata change of the medium: it is durable at once
    /// (as a file's size after its `fdatasync`), and the new bytes are zeros.
    fn extend(&self, size: u64) -> io::Result<()> {
        let mut state = lock(&self.inner);
        if !state.powered {
            return Err(power_is_off());
        }
        // A simulated disk lives in memory: refuse what no test needs.
        const MAX_SIM_BYTES: u64 = 64 << 30;
        let size = usize::try_from(size)
            .ok()
            .filter(|_| size <= MAX_SIM_BYTES)
            .ok_or_else(|| {
                io::Error::new(io::ErrorKind::FileTooLarge, "simulated disk too large")
            })?;
        if size > state.visible.len() {
            state.visible.resize(size, 0);
            state.durable.resize(size, 0);
        }
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        // Sleep outside the lock: other I/O proceeds while a flush is slow.
        let delay = lock(&self.inner).flush_delay;
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
        let mut state = lock(&self.inner);
        if !state.spend_op() {
            return Err(power_is_off());
        }
        let SimState {
            durable, unflushed, ..
        } = &mut *state;
        for (offset, data, _) in unflushed.drain(..) {
            let start = offset as usize;
            durable[start..start + data.len()].copy_from_slice(&data);
        }
        state.flushes += 1;
        Ok(())
    }

    fn size(&self) -> u64 {
        lock(&self.inner).visible.len() as u64
    }
}

impl SimDiskHandle {
    /// Cuts power after `ops` more writes or flushes; every later operation fails.
    pub fn cut_power_after(&self, ops: u64) {
        lock(&self.inner).ops_until_power_cut = Some(ops);
    }

    /// Cuts power now.
    pub fn cut_power(&self) {
        lock(&self.inner).powered = false;
    }

    /// Makes every flush take `delay` (outside the disk's lock).
    pub fn set_flush_delay(&self, delay: std::time::Duration) {
        lock(&self.inner).flush_delay = delay;
    }

    pub fn is_powered(&self) -> bool {
        lock(&self.inner).powered
    }

    /// (writes, flushes) completed so far.
    pub fn op_counts(&self) -> (u64, u64) {
        let state = lock(&self.inner);
        (state.writes, state.flushes)
    }

    /// The image a real disk could show after power is lost now: the durable
    /// contents plus a random subset of the unflushed writes, applied in
    /// completion order, one of them possibly torn at a sector boundary
    /// (writes made durable alone always land, whole).
    pub fn crash_image(&self, rng: &mut impl Rng) -> Vec<u8> {
        let state = lock(&self.inner);
        let mut image = state.durable.clone();
        let torn = if state.unflushed.is_empty() {
            None
        } else {
            Some(rng.gen_range(0..state.unflushed.len()))
        };
        for (i, (offset, data, durable)) in state.unflushed.iter().enumerate() {
            if !durable && !rng.gen_bool(0.5) {
                continue;
            }
            let tear = !durable && Some(i) == torn && data.len() as u64 > SECTOR_SIZE;
            land(*offset, data, tear, rng, put_into(&mut image));
        }
        image
    }

    /// The durable image only (every unflushed write lost, but those made
    /// durable alone).
    pub fn durable_image(&self) -> Vec<u8> {
        let state = lock(&self.inner);
        let mut image = state.durable.clone();
        for (offset, data, _) in state.unflushed.iter().filter(|w| w.2) {
            put_into(&mut image)(*offset, data);
        }
        image
    }

    /// The image as reads see it now (as if everything had been flushed).
    pub fn visible_image(&self) -> Vec<u8> {
        lock(&self.inner).visible.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{rngs::StdRng, SeedableRng};

    #[test]
    fn unflushed_writes_may_vanish_flushed_ones_stay() {
        let disk = SimDisk::new(4096);
        let handle = disk.handle();
        disk.write_at(&[1; 512], 0).unwrap();
        disk.flush().unwrap();
        disk.write_at(&[2; 512], 512).unwrap();
        let mut buf = [0; 512];
        disk.read_at(&mut buf, 512).unwrap();
        assert_eq!(buf, [2; 512], "reads see unflushed writes");
        assert_eq!(handle.durable_image()[512], 0);
        let mut rng = StdRng::seed_from_u64(1);
        let mut seen_kept = false;
        let mut seen_dropped = false;
        for _ in 0..64 {
            let image = handle.crash_image(&mut rng);
            assert_eq!(&image[..512], &[1; 512], "flushed data survives");
            match image[512] {
                2 => seen_kept = true,
                0 => seen_dropped = true,
                other => panic!("impossible byte {other}"),
            }
        }
        assert!(seen_kept && seen_dropped);
    }

    #[test]
    fn a_write_made_durable_alone_survives_every_crash_and_others_still_may_not() {
        let disk = SimDisk::new(8192);
        let handle = disk.handle();
        disk.write_at(&[1; 4096], 0).unwrap();
        disk.write_at(&[2; 1024], 4096).unwrap();
        disk.write_durable_at(&[3; 512], 0).unwrap();
        let mut rng = StdRng::seed_from_u64(7);
        let (mut lost, mut kept) = (false, false);
        for _ in 0..64 {
            let image = handle.crash_image(&mut rng);
            assert_eq!(
                &image[..512],
                &[3; 512],
                "the durable write lands, over the earlier one"
            );
            match image[4096] {
                0 => lost = true,
                2 => kept = true,
                other => panic!("impossible byte {other}"),
            }
        }
        assert!(
            lost && kept,
            "the other unflushed write may still be lost or kept"
        );
        let durable = handle.durable_image();
        assert_eq!(
            (&durable[..512], durable[512], durable[4096]),
            (&[3u8; 512][..], 0, 0)
        );
    }

    #[test]
    fn power_cut_fails_later_operations() {
        let disk = SimDisk::new(4096);
        let handle = disk.handle();
        handle.cut_power_after(1);
        disk.write_at(&[1; 512], 0).unwrap();
        assert!(disk.flush().is_err());
        assert!(disk.write_at(&[1; 512], 0).is_err());
        let mut buf = [0; 512];
        assert!(disk.read_at(&mut buf, 0).is_err());
        assert!(!handle.is_powered());
    }
}
