//! Power cuts across two devices: a copy-on-write volume's own device and
//! the pool, each cut after its own random number of operations, each
//! keeping a random subset of its unflushed writes (one possibly torn).
//! Afterwards the pool opens and checks clean, the device is attached
//! again, every snapshot reads exactly its point-in-time content, and
//! every sector of the volume holds its durable value or one written
//! since (a flush, a snapshot and a finished rollback make it durable).
//! Writes that find the pool full fail without touching the device.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use arbor_engine::{DeviceIdentity, Error, Pool};
use arbor_io::{BlockDevice, SimDisk};
use common::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const SECTOR: usize = 512;
const ORIGIN: usize = 256 * 1024;
/// About 12 MiB of metadata regions and ~1 MiB of data: copies fill it
/// and full-pool failures happen.
const POOL_BYTES: u64 = 13 * MIB;
const ID: DeviceIdentity = DeviceIdentity { dev: 3, ino: 4 };

struct Run {
    rng: StdRng,
    origin: Possible,
    /// Snapshots whose creation returned, with their exact contents.
    snapshots: BTreeMap<String, Vec<u8>>,
    /// A snapshot whose creation was cut: it may exist (with these contents).
    in_doubt: Option<(String, Vec<u8>)>,
    deleted_in_doubt: Option<String>,
    /// A rollback that was cut: the volume may be this snapshot's contents.
    rollback_in_doubt: Option<(String, Vec<u8>)>,
    next: u32,
    full: u32,
}

impl Run {
    fn step(&mut self, pool: &Pool) -> Result<(), Error> {
        let disk = pool.lookup("disk")?;
        match self.rng.gen_range(0..100) {
            0..=59 => {
                let sectors = self.rng.gen_range(1..=64usize);
                let offset = self.rng.gen_range(0..ORIGIN / SECTOR - sectors) * SECTOR;
                let data = if self.rng.gen_range(0..8) == 0 {
                    vec![0; sectors * SECTOR]
                } else {
                    pattern(self.rng.gen(), offset as u64, sectors * SECTOR)
                };
                let zeros = data.iter().all(|&b| b == 0);
                self.origin.since.push((offset, data.clone()));
                let result = if zeros {
                    pool.write_zeroes(disk, offset as u64, data.len() as u64, false)
                } else {
                    pool.write(disk, offset as u64, &data)
                };
                if let Err(Error::NoSpace | Error::MetadataFull) = result {
                    // The device was not touched.
                    self.origin.since.pop();
                    self.full += 1;
                    return self.make_room(pool);
                }
                result
            }
            60..=69 => {
                pool.flush()?;
                self.origin.make_durable();
                Ok(())
            }
            70..=81 => {
                self.next += 1;
                let name = format!("disk@s{}", self.next);
                self.in_doubt = Some((name.clone(), self.origin.current()));
                pool.snapshot(&name)?;
                self.in_doubt = None;
                self.origin.make_durable();
                self.snapshots.insert(name, self.origin.current());
                Ok(())
            }
            82..=89 => {
                let Some(name) = self.snapshots.keys().next().cloned() else {
                    return Ok(());
                };
                self.delete(pool, &name)
            }
            90..=94 => {
                let Some((name, data)) = self
                    .snapshots
                    .iter()
                    .next_back()
                    .map(|(n, d)| (n.clone(), d.clone()))
                else {
                    return Ok(());
                };
                self.rollback_in_doubt = Some((name.clone(), data.clone()));
                // Out of room for the copies later snapshots need before
                // the rollback overwrites what they see: the rollback stays
                // recorded and is run again once other snapshots are gone.
                while let Err(e) = pool.rollback("disk", &name) {
                    let other = self.snapshots.keys().find(|n| **n != name).cloned();
                    match (e, other) {
                        (Error::NoSpace | Error::MetadataFull, Some(other)) => {
                            self.full += 1;
                            self.delete(pool, &other)?;
                            while pool.reclaim(1000)? > 0 {}
                        }
                        (e, _) => return Err(e),
                    }
                }
                self.rollback_in_doubt = None;
                self.origin = Possible::new(data);
                Ok(())
            }
            _ => pool.reclaim(self.rng.gen_range(1..64)).map(|_| ()),
        }
    }

    fn delete(&mut self, pool: &Pool, name: &str) -> Result<(), Error> {
        self.deleted_in_doubt = Some(name.to_owned());
        pool.delete(name)?;
        self.deleted_in_doubt = None;
        self.snapshots.remove(name);
        Ok(())
    }

    /// Drops the oldest snapshot and reclaims: copies only it read go.
    fn make_room(&mut self, pool: &Pool) -> Result<(), Error> {
        if let Some(name) = self.snapshots.keys().next().cloned() {
            self.delete(pool, &name)?;
        }
        while pool.reclaim(1000)? > 0 {}
        Ok(())
    }

    fn verify(&self, pool: &Pool, seed: u64) {
        let report = pool.check().unwrap();
        assert!(report.is_clean(), "seed {seed}: {:#?}", report.problems);
        let read = |name: &str| {
            let mut buf = vec![0u8; ORIGIN];
            pool.read(pool.lookup(name).unwrap(), 0, &mut buf)
                .unwrap_or_else(|e| panic!("seed {seed}: read {name}: {e}"));
            buf
        };
        for (name, data) in &self.snapshots {
            if pool.lookup(name).is_err() && self.deleted_in_doubt.as_deref() == Some(name) {
                continue;
            }
            assert!(read(name) == *data, "seed {seed}: snapshot {name} changed");
        }
        if let Some((name, data)) = &self.in_doubt {
            if pool.lookup(name).is_ok() {
                assert!(read(name) == *data, "seed {seed}: in-doubt {name} differs");
            }
        }
        let disk = pool.lookup("disk").unwrap();
        let mut now = vec![0u8; ORIGIN];
        match (pool.read(disk, 0, &mut now), &self.rollback_in_doubt) {
            (Ok(()), Some((_, data))) if now == *data => {}
            (Ok(()), _) => self
                .origin
                .assert_allowed(&now, &format!("seed {seed}: disk")),
            // A recorded rollback that the full pool kept from finishing
            // on attach: run again once there is room, it completes.
            (Err(Error::Origin(_)), Some((name, data))) => {
                for other in self.snapshots.keys().filter(|n| *n != name) {
                    let _ = pool.delete(other);
                }
                while pool.reclaim(1000).unwrap() > 0 {}
                pool.rollback("disk", name)
                    .unwrap_or_else(|e| panic!("seed {seed}: rollback again: {e}"));
                pool.read(disk, 0, &mut now).unwrap();
                assert!(now == *data, "seed {seed}: the rollback run again differs");
            }
            (Err(e), _) => panic!("seed {seed}: read disk: {e}"),
        }
    }
}

fn crash_once(seed: u64) -> u32 {
    let mut rng = StdRng::seed_from_u64(seed);
    let (disk, pool) = sim_pool(
        POOL_BYTES,
        if seed.is_multiple_of(2) { 4096 } else { 16384 },
    );
    let initial = pattern(seed ^ 0xabc, 0, ORIGIN);
    let device = SimDisk::from_image(initial.clone());
    let dev: Arc<dyn BlockDevice> = Arc::new(device.clone());
    pool.attach_origin("disk", dev, ID).unwrap();
    pool.flush().unwrap();
    // Each device loses power on its own schedule (sometimes never within
    // the run for one of them).
    let (pool_power, device_power) = (disk.handle(), device.handle());
    pool_power.cut_power_after(rng.gen_range(1..1500));
    device_power.cut_power_after(rng.gen_range(1..1500));
    let mut run = Run {
        rng,
        origin: Possible::new(initial),
        snapshots: BTreeMap::new(),
        in_doubt: None,
        deleted_in_doubt: None,
        rollback_in_doubt: None,
        next: 0,
        full: 0,
    };
    let mut steps = 0;
    let failure = loop {
        if let Err(e) = run.step(&pool) {
            break e;
        }
        steps += 1;
        assert!(steps < 100_000, "seed {seed}: power never failed");
    };
    assert!(
        !pool_power.is_powered() || !device_power.is_powered(),
        "seed {seed}: an operation failed while both devices had power: {failure}"
    );
    drop(pool);

    let pool_image = SimDisk::from_image(pool_power.crash_image(&mut run.rng));
    let device_image = SimDisk::from_image(device_power.crash_image(&mut run.rng));
    let pool = reopen(&pool_image);
    let dev: Arc<dyn BlockDevice> = Arc::new(device_image.clone());
    pool.attach_origin("disk", dev, ID)
        .unwrap_or_else(|e| panic!("seed {seed}: attach after the cut: {e}"));
    run.verify(&pool, seed);

    // Both keep working: a write, a snapshot, a restart (with room: the
    // old snapshots go, and every copy with them).
    for info in pool.list().unwrap() {
        if info.snapshot {
            pool.delete(&info.name).unwrap();
        }
    }
    while pool.reclaim(1000).unwrap() > 0 {}
    assert_eq!(
        pool.pool_stats().unwrap().data_used_bytes,
        0,
        "seed {seed}: copies leaked"
    );
    let d = pool.lookup("disk").unwrap();
    let before = {
        let mut buf = vec![0u8; ORIGIN];
        pool.read(d, 0, &mut buf).unwrap();
        buf
    };
    pool.snapshot("disk@after").unwrap();
    pool.write(d, 0, &pattern(seed, 0, 8192)).unwrap();
    pool.flush().unwrap();
    drop(pool);
    let pool = reopen(&pool_image);
    let dev: Arc<dyn BlockDevice> = Arc::new(device_image);
    pool.attach_origin("disk", dev, ID).unwrap();
    let mut buf = vec![0u8; ORIGIN];
    pool.read(pool.lookup("disk@after").unwrap(), 0, &mut buf)
        .unwrap();
    assert!(
        buf == before,
        "seed {seed}: a snapshot after recovery changed"
    );
    assert_clean(&pool);
    run.full
}

#[test]
fn power_cuts_on_two_devices() {
    let runs: u64 = std::env::var("ARBOR_CRASH_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100);
    let only: Option<u64> = std::env::var("ARBOR_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok());
    let mut full = 0;
    for seed in (0..runs).filter(|s| only.is_none_or(|o| o == *s)) {
        full += crash_once(seed);
    }
    // The runs must have found the pool full (the exhaustion path).
    assert!(
        only.is_some() || full > 0,
        "no write ever found the pool full"
    );
}
