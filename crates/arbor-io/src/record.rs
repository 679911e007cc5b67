//! Record and replay, after Linux's dm-log-writes and CrashMonkey.
//!
//! [`RecordingDevice`] wraps any device and logs every completed write (with
//! its data) and every completed flush, in completion order. A
//! [`CrashReplayer`] consumes that log event by event and can produce, at any
//! point, the images a real disk could show if power were cut there: every
//! write before the last completed flush, plus any subset of the writes since,
//! some of them torn at sector granularity. One recorded run thus yields
//! crash images for as many cut points as a test wants, without re-running
//! the workload for each.

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard};

use rand::Rng;

use crate::{BlockDevice, SECTOR_SIZE};

/// One completed device operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IoEvent {
    Write {
        offset: u64,
        data: Vec<u8>,
    },
    /// A write made durable alone ([`BlockDevice::write_durable_at`]).
    DurableWrite {
        offset: u64,
        data: Vec<u8>,
    },
    Flush,
}

/// A device that forwards to `inner` and logs every completed write and flush.
pub struct RecordingDevice {
    inner: Arc<dyn BlockDevice>,
    log: Arc<Mutex<Vec<IoEvent>>>,
}

/// The test's side of a [`RecordingDevice`]: takes the events logged so far.
#[derive(Clone)]
pub struct Recording {
    log: Arc<Mutex<Vec<IoEvent>>>,
}

fn lock(log: &Mutex<Vec<IoEvent>>) -> MutexGuard<'_, Vec<IoEvent>> {
    // The log is a plain list; a panic elsewhere cannot leave it half-updated.
    log.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl RecordingDevice {
    pub fn new(inner: Arc<dyn BlockDevice>) -> (Self, Recording) {
        let log = Arc::new(Mutex::new(Vec::new()));
        let recording = Recording {
            log: Arc::clone(&log),
        };
        (Self { inner, log }, recording)
    }
}

impl Recording {
    /// Removes and returns every event logged since the last call.
    pub fn take(&self) -> Vec<IoEvent> {
        std::mem::take(&mut *lock(&self.log))
    }
}

impl BlockDevice for RecordingDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_at(buf, offset)
    }

    fn hole(&self, offset: u64, len: u64) -> io::Result<bool> {
        self.inner.hole(offset, len)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        // Logged under the lock together with the write, so the log order is
        // the completion order even with concurrent writers.
        let mut log = lock(&self.log);
        self.inner.write_at(buf, offset)?;
        log.push(IoEvent::Write {
            offset,
            data: buf.to_vec(),
        });
        Ok(())
    }

    fn write_durable_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let mut log = lock(&self.log);
        self.inner.write_durable_at(buf, offset)?;
        log.push(IoEvent::DurableWrite {
            offset,
            data: buf.to_vec(),
        });
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        // A flush covers the writes completed before it started; logging it
        // after it returns places it after all of them (and possibly after
        // writes that raced with it, which only makes the replay stricter).
        self.inner.flush()?;
        lock(&self.log).push(IoEvent::Flush);
        Ok(())
    }

    fn size(&self) -> u64 {
        self.inner.size()
    }
}

/// Lands one write through `put`: whole, or torn (each sector kept or not).
pub(crate) fn land(
    offset: u64,
    data: &[u8],
    tear: bool,
    rng: &mut impl Rng,
    mut put: impl FnMut(u64, &[u8]),
) {
    if !tear {
        put(offset, data);
        return;
    }
    for (s, sector) in data.chunks(SECTOR_SIZE as usize).enumerate() {
        if rng.gen_bool(0.5) {
            put(offset + s as u64 * SECTOR_SIZE, sector);
        }
    }
}

/// Copies `data` into `image` at `offset` (the caller checked the range).
pub(crate) fn put_into(image: &mut [u8]) -> impl FnMut(u64, &[u8]) + '_ {
    |offset, data| {
        let at = offset as usize;
        image[at..at + data.len()].copy_from_slice(data);
    }
}

/// A device over a shared, read-only base image (or zeros): writes go to a
/// private overlay of sectors. Many crash images of one large pool thus
/// cost only their differences, and a large sparse device only its data.
pub struct OverlayDevice {
    /// `None`: every sector not written reads as zeros.
    base: Option<Arc<Vec<u8>>>,
    size: u64,
    sectors: Mutex<HashMap<u64, Box<[u8]>>>,
}

const SECTOR: usize = SECTOR_SIZE as usize;

impl OverlayDevice {
    pub fn new(base: Arc<Vec<u8>>) -> Self {
        Self {
            size: base.len() as u64,
            base: Some(base),
            sectors: Mutex::new(HashMap::new()),
        }
    }

    /// A device of `size` bytes reading zeros until written.
    pub fn zeroed(size: u64) -> Self {
        Self {
            base: None,
            size,
            sectors: Mutex::new(HashMap::new()),
        }
    }

    /// Bytes `[at, at + len)` of the base (the caller checked the range).
    fn base_bytes(&self, at: usize, out: &mut [u8]) {
        match &self.base {
            Some(base) => out.copy_from_slice(&base[at..at + out.len()]),
            None => out.fill(0),
        }
    }

    fn sectors(&self) -> MutexGuard<'_, HashMap<u64, Box<[u8]>>> {
        // Plain bytes: a panic elsewhere cannot leave them half-updated.
        self.sectors
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The whole image as it reads now.
    pub fn image(&self) -> Vec<u8> {
        let mut image = vec![0u8; self.size as usize];
        self.base_bytes(0, &mut image);
        for (s, data) in self.sectors().iter() {
            let at = *s as usize * SECTOR;
            image[at..at + SECTOR].copy_from_slice(data);
        }
        image
    }
}

impl BlockDevice for OverlayDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        crate::check_range(offset, buf.len(), self.size())?;
        let sectors = self.sectors();
        let mut done = 0;
        while done < buf.len() {
            let pos = offset as usize + done;
            let (s, within) = (pos / SECTOR, pos % SECTOR);
            let n = (SECTOR - within).min(buf.len() - done);
            let out = &mut buf[done..done + n];
            match sectors.get(&(s as u64)) {
                Some(data) => out.copy_from_slice(&data[within..within + n]),
                None => self.base_bytes(pos, out),
            }
            done += n;
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        crate::check_range(offset, buf.len(), self.size())?;
        self.put(offset, buf);
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn size(&self) -> u64 {
        self.size
    }
}

impl OverlayDevice {
    /// Writes `buf` at `offset`, which the caller checked lies inside.
    fn put(&self, offset: u64, buf: &[u8]) {
        let mut sectors = self.sectors();
        let mut done = 0;
        while done < buf.len() {
            let pos = offset as usize + done;
            let (s, within) = (pos / SECTOR, pos % SECTOR);
            let n = (SECTOR - within).min(buf.len() - done);
            let sector = sectors.entry(s as u64).or_insert_with(|| {
                let mut sector = vec![0u8; SECTOR].into_boxed_slice();
                self.base_bytes(s * SECTOR, &mut sector);
                sector
            });
            sector[within..within + n].copy_from_slice(&buf[done..done + n]);
            done += n;
        }
    }
}

/// How to build one crash image from the writes since the last flush.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashKind {
    /// Every write since the last flush landed.
    KeepAll,
    /// None did: the durable image only.
    DropAll,
    /// Each write independently kept or dropped; kept writes longer than a
    /// sector are torn (a random subset of their sectors) with probability
    /// `tear_percent` / 100.
    Random { tear_percent: u32 },
}

/// Replays a log of [`IoEvent`]s over an initial image and builds crash
/// images at the current point of the replay.
pub struct CrashReplayer {
    /// The image after every event up to the last flush replayed (shared
    /// with the crash devices handed out; copied only if one is still alive).
    durable: Arc<Vec<u8>>,
    /// Writes replayed since that flush, in order; `true` for one made
    /// durable alone, which every crash image holds whole.
    unflushed: Vec<(u64, Vec<u8>, bool)>,
    events: u64,
    flushes: u64,
    durable_writes: u64,
}

impl CrashReplayer {
    /// Starts from `image`, the durable contents before the first event.
    pub fn new(image: Vec<u8>) -> Self {
        Self {
            durable: Arc::new(image),
            unflushed: Vec::new(),
            events: 0,
            flushes: 0,
            durable_writes: 0,
        }
    }

    /// Replays one more event. Writes outside the image are an error.
    pub fn apply(&mut self, event: IoEvent) -> io::Result<()> {
        match event {
            IoEvent::Write { offset, data } => {
                crate::check_range(offset, data.len(), self.durable.len() as u64)?;
                self.unflushed.push((offset, data, false));
            }
            IoEvent::DurableWrite { offset, data } => {
                crate::check_range(offset, data.len(), self.durable.len() as u64)?;
                self.unflushed.push((offset, data, true));
                self.durable_writes += 1;
            }
            IoEvent::Flush => {
                let durable = Arc::make_mut(&mut self.durable);
                for (offset, data, _) in self.unflushed.drain(..) {
                    put_into(durable)(offset, &data);
                }
                self.flushes += 1;
            }
        }
        self.events += 1;
        Ok(())
    }

    /// Events replayed so far (the position of a cut made now).
    pub fn events(&self) -> u64 {
        self.events
    }

    pub fn flushes(&self) -> u64 {
        self.flushes
    }

    /// Writes made durable alone replayed so far.
    pub fn durable_writes(&self) -> u64 {
        self.durable_writes
    }

    /// Writes since the last flush: what a power cut now may lose or tear.
    pub fn unflushed(&self) -> usize {
        self.unflushed.len()
    }

    /// The image a disk could show after a power cut at this point.
    pub fn crash_image(&self, kind: CrashKind, rng: &mut impl Rng) -> Vec<u8> {
        let mut image = (*self.durable).clone();
        self.land_unflushed(kind, rng, put_into(&mut image));
        image
    }

    /// The same as a device sharing the durable image (cheap for large images).
    pub fn crash_device(&self, kind: CrashKind, rng: &mut impl Rng) -> OverlayDevice {
        let dev = OverlayDevice::new(Arc::clone(&self.durable));
        // In range: checked when each write was replayed.
        self.land_unflushed(kind, rng, |offset, data| dev.put(offset, data));
        dev
    }

    fn land_unflushed(&self, kind: CrashKind, rng: &mut impl Rng, mut put: impl FnMut(u64, &[u8])) {
        for (offset, data, durable) in &self.unflushed {
            let tear = match kind {
                _ if *durable => false,
                CrashKind::DropAll => continue,
                CrashKind::KeepAll => false,
                CrashKind::Random { tear_percent } => {
                    if !rng.gen_bool(0.5) {
                        continue;
                    }
                    data.len() as u64 > SECTOR_SIZE && rng.gen_range(0..100) < tear_percent
                }
            };
            land(*offset, data, tear, rng, &mut put);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SimDisk;
    use rand::{rngs::StdRng, SeedableRng};

    #[test]
    fn replay_matches_the_device_and_drops_only_unflushed_writes() {
        let disk = SimDisk::new(8192);
        let (dev, recording) = RecordingDevice::new(Arc::new(disk.clone()));
        dev.write_at(&[1; 1024], 0).unwrap();
        dev.flush().unwrap();
        dev.write_at(&[2; 2048], 1024).unwrap();
        let mut replay = CrashReplayer::new(vec![0; 8192]);
        for event in recording.take() {
            replay.apply(event).unwrap();
        }
        assert_eq!(
            (replay.events(), replay.flushes(), replay.unflushed()),
            (3, 1, 1)
        );
        let mut rng = StdRng::seed_from_u64(3);
        assert_eq!(
            replay.crash_image(CrashKind::KeepAll, &mut rng),
            disk.handle().visible_image()
        );
        assert_eq!(
            replay.crash_image(CrashKind::DropAll, &mut rng),
            disk.handle().durable_image()
        );
        for kind in [CrashKind::KeepAll, CrashKind::DropAll] {
            let dev = replay.crash_device(kind, &mut rng);
            assert_eq!(dev.image(), replay.crash_image(kind, &mut rng));
            let mut buf = vec![0u8; 700];
            dev.write_at(&[9; 300], 1000).unwrap();
            dev.read_at(&mut buf, 900).unwrap();
            assert!(buf[100..400].iter().all(|&b| b == 9));
            assert!(dev.read_at(&mut buf, 7600).is_err());
        }
        let sparse = OverlayDevice::zeroed(1 << 40);
        sparse.write_at(&[3; 512], 1 << 39).unwrap();
        let mut buf = vec![1u8; 1024];
        sparse.read_at(&mut buf, (1 << 39) - 512).unwrap();
        assert!(buf[..512].iter().all(|&b| b == 0) && buf[512..].iter().all(|&b| b == 3));
        let mut torn = false;
        for _ in 0..64 {
            let image = replay.crash_image(CrashKind::Random { tear_percent: 100 }, &mut rng);
            assert_eq!(&image[..1024], &[1; 1024], "flushed data survives");
            let sectors: Vec<u8> = image[1024..3072].chunks(512).map(|s| s[0]).collect();
            for (s, &b) in sectors.iter().enumerate() {
                assert!(b == 0 || b == 2, "sector {s} holds {b}");
                assert!(image[1024 + s * 512..1024 + (s + 1) * 512]
                    .iter()
                    .all(|&x| x == b));
            }
            torn |= sectors.contains(&0) && sectors.contains(&2);
        }
        assert!(torn, "some write was torn");
        assert!(replay
            .apply(IoEvent::Write {
                offset: 8000,
                data: vec![0; 512]
            })
            .is_err());
    }
}
