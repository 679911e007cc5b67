//! Engine benchmark: the figures of the engine issue, side by side with the
//! same I/O done by pwrite on a plain file in the same run. Prints a markdown
//! report. Not a test: nothing here passes or fails on timings.
//!
//! `cargo run --release -p arbor-bench --bin engine-bench -- --dir /var/tmp/arbor-bench`

use std::fs::{File, OpenOptions as FsOpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use arbor_engine::{CreateOptions, Durability, OpenOptions, Pool, VolumeId, DEFAULT_CHUNK_SIZE};
use arbor_io::{Batches, BlockDevice, CacheMode, FileDevice};
use clap::Parser;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const KIB: u64 = 1024;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

#[derive(Parser)]
struct Args {
    /// Directory for pool and baseline files (needs ~8 GiB free).
    #[arg(long, default_value = "/var/tmp/arbor-bench")]
    dir: PathBuf,
    /// Smaller sizes and counts, for a quick look.
    #[arg(long)]
    quick: bool,
    /// Only the direct-I/O batch experiment: a batch of scattered block
    /// writes and a pool's commit, through io_uring against threads.
    #[arg(long)]
    batches_only: bool,
    /// Only the data checksum figure: crc32c per 4 KiB block against
    /// copying the same bytes, in memory.
    #[arg(long)]
    checksums_only: bool,
    /// Only the cipher figure of encrypted volumes: AES-256-XTS of every
    /// 4 KiB (and 512-byte) data unit in memory, both directions, in
    /// GiB/s, ns per 4 KiB and cycles per byte at the CPU's nominal clock.
    #[arg(long)]
    cipher_only: bool,
    /// Only the data path in process, with data checksums (format version
    /// 10) against without (version 9), same build, same run: 4 KiB
    /// overwrites and reads on one and two threads, 1 MiB writes. Isolates
    /// the engine's cost from NBD's. DATA_PATH_VERSION=9 or 10 runs one
    /// version alone (for a profile).
    #[arg(long)]
    data_path_only: bool,
    /// Only the metadata per GiB mapped at the default chunk size
    /// (sequential 1 MiB and random 4 KiB fills of a new volume, data
    /// writes dropped), in a pool of the newest format version (with data
    /// checksums: their tree included).
    #[arg(long)]
    metadata_only: bool,
}

/// Counts writes (and bytes) reaching a device, and can drop writes at or
/// beyond `drop_from` (reads there return zeros): a "metadata-only" device
/// that lets a pool map far more data than this machine's disk holds.
/// Metadata timing stays real; only chunk contents are not stored.
struct MeteredDevice {
    inner: FileDevice,
    writes: AtomicU64,
    drop_from: AtomicU64,
}

impl MeteredDevice {
    fn new(inner: FileDevice) -> Self {
        Self {
            inner,
            writes: AtomicU64::new(0),
            drop_from: AtomicU64::new(u64::MAX),
        }
    }
}

impl BlockDevice for MeteredDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        if offset >= self.drop_from.load(Ordering::Relaxed) {
            buf.fill(0);
            return Ok(());
        }
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.writes.fetch_add(1, Ordering::Relaxed);
        if offset >= self.drop_from.load(Ordering::Relaxed) {
            return Ok(());
        }
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.inner.flush()
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
}

struct Bench {
    dir: PathBuf,
    quick: bool,
}

fn open_opts() -> OpenOptions {
    OpenOptions::default()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn p99(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[(v.len() * 99 / 100).min(v.len() - 1)]
}

fn us(d: Duration) -> String {
    format!("{:.0} µs", d.as_secs_f64() * 1e6)
}

fn mib_s(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / MIB as f64 / d.as_secs_f64()
}

fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// Random offsets, aligned to `unit`, within `[0, region)`.
fn offsets(seed: u64, n: usize, unit: u64, region: u64) -> Vec<u64> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| rng.gen_range(0..region / unit) * unit)
        .collect()
}

impl Bench {
    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn new_pool(&self, name: &str, size: u64, chunk: u32) -> Result<(Arc<MeteredDevice>, Pool)> {
        self.new_pool_with_metadata(name, size, chunk, None)
    }

    fn new_pool_with_metadata(
        &self,
        name: &str,
        size: u64,
        chunk: u32,
        metadata_bytes: Option<u64>,
    ) -> Result<(Arc<MeteredDevice>, Pool)> {
        let path = self.path(name);
        let _ = std::fs::remove_file(&path);
        let dev = Arc::new(MeteredDevice::new(FileDevice::create_file(&path, size)?));
        let pool = Pool::create(
            dev.clone(),
            &CreateOptions {
                chunk_size: chunk,
                metadata_bytes,
                ..Default::default()
            },
            &open_opts(),
        )?;
        Ok((dev, pool))
    }

    /// A plain file of `size` bytes, optionally filled (so overwrites are not first writes).
    fn baseline_file(&self, size: u64, filled: bool) -> Result<File> {
        let path = self.path("baseline.raw");
        let _ = std::fs::remove_file(&path);
        let file = FsOpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)?;
        file.set_len(size)?;
        if filled {
            let buf = vec![0x5Au8; MIB as usize];
            for i in 0..size / MIB {
                file.write_all_at(&buf, i * MIB)?;
            }
            file.sync_data()?;
        }
        Ok(file)
    }

    fn time_file_writes(file: &File, offs: &[u64], len: usize) -> Result<Duration> {
        let buf = vec![0xC3u8; len];
        let start = Instant::now();
        for &o in offs {
            file.write_all_at(&buf, o)?;
        }
        file.sync_data()?;
        Ok(start.elapsed())
    }

    fn time_pool_writes(pool: &Pool, v: VolumeId, offs: &[u64], len: usize) -> Result<Duration> {
        let buf = vec![0xC3u8; len];
        let start = Instant::now();
        for &o in offs {
            pool.write(v, o, &buf)?;
        }
        pool.flush()?;
        Ok(start.elapsed())
    }

    fn fill(pool: &Pool, v: VolumeId, bytes: u64) -> Result<()> {
        let buf = vec![0x5Au8; MIB as usize];
        for i in 0..bytes / MIB {
            pool.write(v, i * MIB, &buf)?;
        }
        pool.flush()?;
        Ok(())
    }

    /// With direct I/O, a batch of scattered 4 KiB writes (`write_batch`,
    /// as a commit writes its nodes) and a whole commit after random 4 KiB
    /// writes under a snapshot, written through io_uring and by threads,
    /// alternating round by round on the same files.
    fn batches(&self) -> Result<()> {
        let rounds = if self.quick { 10 } else { 30 };
        let size = GIB;
        let path = self.path("batch.raw");
        let _ = std::fs::remove_file(&path);
        let mut dev = FileDevice::create_file_with(&path, size, CacheMode::Direct)?;
        // Written once, so that no write allocates in the file (as on a
        // block device).
        let fill = vec![0x5Au8; MIB as usize];
        dev.write_batch(
            &(0..size / MIB)
                .map(|i| (i * MIB, &fill[..]))
                .collect::<Vec<_>>(),
        )?;
        dev.flush()?;
        println!("\n## Direct-I/O batches: io_uring against threads\n");
        println!("Batches of scattered 4 KiB writes (`write_batch`) on a written 1 GiB file, {rounds} rounds each, alternating:\n");
        println!("| writes | io_uring median | p90 | threads median | p90 | threads / io_uring |");
        println!("|---|---|---|---|---|---|");
        let block = vec![0xC3u8; 4096];
        for n in [8usize, 64, 256, 1024] {
            let mut times = [Vec::new(), Vec::new()];
            for round in 0..rounds {
                for (i, mode) in [Batches::IoUring, Batches::Threads].into_iter().enumerate() {
                    dev.set_batches(mode);
                    let writes: Vec<(u64, &[u8])> =
                        offsets(round as u64 * 31 + n as u64, n, 4096, size)
                            .into_iter()
                            .map(|o| (o, &block[..]))
                            .collect();
                    let start = Instant::now();
                    dev.write_batch(&writes)?;
                    times[i].push(start.elapsed());
                }
            }
            if dev.batches() != Batches::IoUring {
                dev.set_batches(Batches::IoUring);
            }
            let p90 = |v: &Vec<Duration>| {
                let mut v = v.clone();
                v.sort();
                v[v.len() * 9 / 10]
            };
            let (ring, threads) = (median(times[0].clone()), median(times[1].clone()));
            println!(
                "| {n} | {} | {} | {} | {} | {:.2}x |",
                us(ring),
                us(p90(&times[0])),
                us(threads),
                us(p90(&times[1])),
                threads.as_secs_f64() / ring.as_secs_f64()
            );
        }
        drop(dev);
        let _ = std::fs::remove_file(&path);
        println!("\nA pool's commit after 2,000 random 4 KiB writes into a written 256 MiB volume just snapshotted (16 KiB chunks; each first write maps a partial extent and shadows its leaf), {rounds} rounds each, alternating:\n");
        println!("| | commit median | p90 |");
        println!("|---|---|---|");
        let mut times = [Vec::new(), Vec::new()];
        let pool_path = self.path("batch.pool");
        let mut pools = Vec::new();
        for (i, mode) in [Batches::IoUring, Batches::Threads].into_iter().enumerate() {
            let p = pool_path.with_extension(format!("pool{i}"));
            let _ = std::fs::remove_file(&p);
            let mut dev = FileDevice::create_file_with(&p, 2 * GIB, CacheMode::Direct)?;
            dev.set_batches(mode);
            let pool = Pool::create(Arc::new(dev), &CreateOptions::default(), &open_opts())?;
            let v = pool.create_volume("v", 256 * MIB)?;
            Self::fill(&pool, v, 256 * MIB)?;
            pools.push((p, pool, v));
        }
        let buf = vec![0xC3u8; 4096];
        for round in 0..rounds {
            for (i, (_, pool, v)) in pools.iter().enumerate() {
                pool.snapshot_with(&format!("v@r{round}"), Durability::Deferred)?;
                for o in offsets(round as u64 * 7 + 1, 2000, 4096, 256 * MIB) {
                    pool.write(*v, o, &buf)?;
                }
                let start = Instant::now();
                pool.flush()?;
                times[i].push(start.elapsed());
            }
        }
        for (i, name) in ["io_uring", "threads"].into_iter().enumerate() {
            let mut v = times[i].clone();
            v.sort();
            println!(
                "| {name} | {} | {} |",
                us(v[v.len() / 2]),
                us(v[v.len() * 9 / 10])
            );
        }
        println!("\nThe same volumes read whole in 1 MiB reads after those writes (each read's pieces scattered over the chunks the writes redirected), {rounds} rounds each, alternating:\n");
        println!("| | 1 MiB reads, MiB/s, median | slowest round |");
        println!("|---|---|---|");
        let mut rates = [Vec::new(), Vec::new()];
        let mut buf = vec![0u8; MIB as usize];
        for _ in 0..rounds {
            for (i, (_, pool, v)) in pools.iter().enumerate() {
                let start = Instant::now();
                for at in (0..256 * MIB).step_by(MIB as usize) {
                    pool.read(*v, at, &mut buf)?;
                }
                rates[i].push(mib_s(256 * MIB, start.elapsed()));
            }
        }
        for (i, name) in ["io_uring", "threads (reads in turn)"]
            .into_iter()
            .enumerate()
        {
            let mut v = rates[i].clone();
            v.sort_by(f64::total_cmp);
            println!("| {name} | {:.0} | {:.0} |", v[v.len() / 2], v[0]);
        }
        for (p, pool, _) in pools {
            drop(pool);
            let _ = std::fs::remove_file(p);
        }
        Ok(())
    }

    /// 4 KiB and full-chunk random writes: fresh volume, right after a
    /// snapshot, and with 1,000 snapshots; each against pwrite on a file.
    fn random_writes(&self, chunk: u32) -> Result<()> {
        let region = if self.quick { 256 * MIB } else { GIB };
        let n_small = if self.quick { 4000 } else { 20_000 };
        let n_full = if self.quick { 1000 } else { 4000 };
        let snaps = if self.quick { 100 } else { 1000 };
        println!(
            "\n## Random writes, chunk size {} KiB, {} MiB region\n",
            chunk / 1024,
            region / MIB
        );
        println!("Each run ends with a flush (arbor commit / fdatasync). Ratio = arbor throughput / plain-file throughput.\n");
        println!("| scenario | write size | arbor MiB/s | file MiB/s | ratio |");
        println!("|---|---|---|---|---|");
        let chunk64 = u64::from(chunk);
        for scenario in [
            "fresh volume",
            "right after a snapshot",
            "with many snapshots",
        ] {
            for (size, n) in [(4 * KIB, n_small), (chunk64, n_full)] {
                // Snapshots of a volume under scattered writes pin a leaf per
                // write: size metadata for 1,000 of them.
                let (_dev, pool) = self.new_pool_with_metadata(
                    "rw.pool",
                    region * 3 + GIB,
                    chunk,
                    Some(512 * MIB),
                )?;
                let v = pool.create_volume("v", region)?;
                let filled = scenario != "fresh volume";
                if filled {
                    Self::fill(&pool, v, region)?;
                    if scenario == "with many snapshots" {
                        let offs = offsets(7, snaps * 16, 4 * KIB, region);
                        for s in 0..snaps {
                            pool.snapshot(&format!("v@s{s}"))?;
                            for &o in &offs[s * 16..(s + 1) * 16] {
                                pool.write(v, o, &[1u8; 4096])?;
                            }
                        }
                    }
                    pool.snapshot("v@last")?;
                }
                let offs = offsets(size, n, size, region);
                let t_pool = Self::time_pool_writes(&pool, v, &offs, size as usize)?;
                drop(pool);
                let file = self.baseline_file(region, filled)?;
                let t_file = Self::time_file_writes(&file, &offs, size as usize)?;
                let bytes = size * n as u64;
                let label = if scenario == "with many snapshots" {
                    format!("with {snaps} snapshots")
                } else {
                    scenario.to_string()
                };
                let (a, f) = (mib_s(bytes, t_pool), mib_s(bytes, t_file));
                println!(
                    "| {label} | {} KiB | {a:.1} | {f:.1} | {:.2} |",
                    size / KIB,
                    a / f
                );
            }
        }
        Ok(())
    }

    /// Snapshot and clone latency at 1, 100 and 10,000 existing snapshots,
    /// and the device writes each snapshot costs.
    fn snapshot_latency(&self, mapped: u64, metadata_only: bool) -> Result<()> {
        let size = mapped + 4 * GIB;
        // 10,000 snapshots that each diverged by a write need a few nodes apiece.
        let (dev, pool) =
            self.new_pool_with_metadata("snap.pool", size, DEFAULT_CHUNK_SIZE, Some(512 * MIB))?;
        if metadata_only {
            dev.drop_from
                .store(pool.data_region_offset(), Ordering::Relaxed);
        }
        let v = pool.create_volume("v", mapped)?;
        Self::fill(&pool, v, mapped)?;
        let marks: &[usize] = if self.quick {
            &[1, 100, 1000]
        } else {
            &[1, 100, 10_000]
        };
        let mut rng = StdRng::seed_from_u64(3);
        let mut taken = 0usize;
        let how = if metadata_only {
            " (metadata-only device: chunk data not stored)"
        } else {
            ""
        };
        println!("\n### {} GiB mapped{how}\n", mapped / GIB);
        println!(
            "| existing snapshots | snapshot median | snapshot p99 | clone median | device writes per snapshot \
             | deferred snapshot median | p99 | deferred clone median |"
        );
        println!("|---|---|---|---|---|---|---|---|");
        for &mark in marks {
            while taken < mark {
                pool.snapshot(&format!("v@bg{taken}"))?;
                // Diverge a little, as a volume under use does.
                pool.write(v, rng.gen_range(0..mapped / 4096) * 4096, &[9u8; 4096])?;
                taken += 1;
            }
            let (mut snap_t, mut clone_t, mut writes) = (Vec::new(), Vec::new(), Vec::new());
            let (mut deferred_t, mut deferred_clone_t) = (Vec::new(), Vec::new());
            for i in 0..21 {
                pool.write(v, rng.gen_range(0..mapped / 4096) * 4096, &[7u8; 4096])?;
                pool.flush()?;
                let before = dev.writes.load(Ordering::Relaxed);
                let t = Instant::now();
                pool.snapshot(&format!("v@m{mark}-{i}"))?;
                snap_t.push(t.elapsed());
                writes.push(dev.writes.load(Ordering::Relaxed) - before);
                let t = Instant::now();
                pool.clone_snapshot(&format!("v@m{mark}-{i}"), &format!("c{mark}-{i}"))?;
                clone_t.push(t.elapsed());
                pool.delete(&format!("c{mark}-{i}"))?;
                pool.delete(&format!("v@m{mark}-{i}"))?;
                pool.reclaim(usize::MAX)?;
                // The same on the idle pool, durable at the next commit.
                let t = Instant::now();
                pool.snapshot_with(&format!("v@d{mark}-{i}"), Durability::Deferred)?;
                deferred_t.push(t.elapsed());
                let t = Instant::now();
                pool.clone_snapshot_with(
                    &format!("v@d{mark}-{i}"),
                    &format!("d{mark}-{i}"),
                    Durability::Deferred,
                )?;
                deferred_clone_t.push(t.elapsed());
                pool.delete(&format!("d{mark}-{i}"))?;
                pool.delete(&format!("v@d{mark}-{i}"))?;
                pool.reclaim(usize::MAX)?;
            }
            writes.sort();
            println!(
                "| {mark} | {} | {} | {} | {} | {} | {} | {} |",
                us(median(snap_t.clone())),
                us(p99(snap_t)),
                us(median(clone_t)),
                writes[writes.len() / 2],
                us(median(deferred_t.clone())),
                us(p99(deferred_t)),
                us(median(deferred_clone_t)),
            );
        }
        let stats = pool.pool_stats()?;
        let t = Instant::now();
        let listing = pool.list()?;
        let mut exclusive = 0;
        for info in &listing {
            exclusive += pool.volume_stats(info.id)?.exclusive_bytes;
        }
        let stats_time = t.elapsed();
        println!(
            "\nAfter: {} snapshots, metadata used {:.1} MiB. Listing all {} volumes with full statistics \
             (mapped, exclusive, shared; {:.1} MiB exclusive in total): {:.1} ms.",
            stats.snapshots,
            stats.metadata_used_bytes as f64 / MIB as f64,
            listing.len(),
            exclusive as f64 / MIB as f64,
            stats_time.as_secs_f64() * 1e3
        );
        Ok(())
    }

    /// Metadata bytes per GiB mapped, sequential and random 4 KiB fill.
    fn metadata_per_gib(&self, chunk: u32) -> Result<(f64, f64)> {
        let mapped = if self.quick { 256 * MIB } else { GIB };
        let mut result = Vec::new();
        for random in [false, true] {
            let (dev, pool) = self.new_pool("meta.pool", mapped * 2 + GIB, chunk)?;
            dev.drop_from
                .store(pool.data_region_offset(), Ordering::Relaxed);
            let v = pool.create_volume("v", mapped)?;
            let base = pool.pool_stats()?.metadata_used_bytes;
            if random {
                let chunks = mapped / u64::from(chunk);
                let mut order: Vec<u64> = (0..chunks).collect();
                let mut rng = StdRng::seed_from_u64(11);
                for i in (1..order.len()).rev() {
                    order.swap(i, rng.gen_range(0..=i));
                }
                for c in order {
                    pool.write(v, c * u64::from(chunk), &[1u8; 4096])?;
                }
                pool.flush()?;
            } else {
                Self::fill(&pool, v, mapped)?;
            }
            let used = pool.pool_stats()?.metadata_used_bytes - base;
            result.push(used as f64 / (mapped as f64 / GIB as f64));
        }
        Ok((result[0], result[1]))
    }

    /// Open time with a small and a 10x larger mapping (random fill, so the
    /// larger tree really is ~10x bigger).
    fn open_time(&self) -> Result<()> {
        println!("\n## Pool open time\n");
        println!("| mapped | chunks mapped (random order) | metadata used | open median |");
        println!("|---|---|---|---|");
        let small = if self.quick { 256 * MIB } else { GIB };
        for mapped in [small, small * 10] {
            let path = self.path("open.pool");
            {
                let (dev, pool) = self.new_pool("open.pool", mapped * 2, 64 * 1024)?;
                dev.drop_from
                    .store(pool.data_region_offset(), Ordering::Relaxed);
                let v = pool.create_volume("v", mapped)?;
                let chunks = mapped / (64 * KIB);
                let mut rng = StdRng::seed_from_u64(5);
                let mut order: Vec<u64> = (0..chunks).collect();
                for i in (1..order.len()).rev() {
                    order.swap(i, rng.gen_range(0..=i));
                }
                for c in order {
                    pool.write(v, c * 64 * KIB, &[1u8; 4096])?;
                }
                pool.flush()?;
                // End on a small commit, as a pool at rest does: open then
                // replays a short journal whatever the mapping size.
                pool.create_volume("marker", MIB)?;
                pool.close()?;
            }
            let mut times = Vec::new();
            let mut meta = 0;
            for _ in 0..7 {
                let dev = Arc::new(FileDevice::open(&path)?);
                let t = Instant::now();
                let pool = Pool::open(dev, &open_opts())?;
                times.push(t.elapsed());
                meta = pool.pool_stats()?.metadata_used_bytes;
                std::mem::forget(pool); // no close-time commit in the measurement loop
            }
            println!(
                "| {} GiB | {} | {:.1} MiB | {} |",
                mapped as f64 / GIB as f64,
                mapped / (64 * KIB),
                meta as f64 / MIB as f64,
                us(median(times))
            );
        }
        Ok(())
    }

    fn chunk_sweep(&self) -> Result<()> {
        println!(
            "\n## Chunk size trade-off (basis of the default chunk size, {} KiB)\n",
            DEFAULT_CHUNK_SIZE / 1024
        );
        println!("4 KiB random writes on a fresh volume and right after a snapshot (ratio to pwrite on a file), and metadata per GiB mapped.\n");
        println!("| chunk | 4K random, fresh: ratio | 4K random, after snapshot: ratio | 1 MiB sequential, fresh: ratio | metadata/GiB, sequential | metadata/GiB, random 4 KiB |");
        println!("|---|---|---|---|---|---|");
        let region = if self.quick { 128 * MIB } else { 512 * MIB };
        let n = if self.quick { 3000 } else { 10_000 };
        for chunk in [4u32 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20] {
            let offs = offsets(42, n, 4 * KIB, region);
            let mut ratios = Vec::new();
            for filled in [false, true] {
                let (_dev, pool) = self.new_pool("sweep.pool", region * 3 + GIB, chunk)?;
                let v = pool.create_volume("v", region)?;
                if filled {
                    Self::fill(&pool, v, region)?;
                    pool.snapshot("v@s")?;
                }
                let t_pool = Self::time_pool_writes(&pool, v, &offs, 4096)?;
                drop(pool);
                let file = self.baseline_file(region, filled)?;
                let t_file = Self::time_file_writes(&file, &offs, 4096)?;
                ratios.push(t_file.as_secs_f64() / t_pool.as_secs_f64());
            }
            let sequential: Vec<u64> = (0..region / MIB).map(|i| i * MIB).collect();
            let (_dev, pool) = self.new_pool("sweep.pool", region * 3 + GIB, chunk)?;
            let v = pool.create_volume("v", region)?;
            let t_pool = Self::time_pool_writes(&pool, v, &sequential, MIB as usize)?;
            drop(pool);
            let file = self.baseline_file(region, false)?;
            let t_file = Self::time_file_writes(&file, &sequential, MIB as usize)?;
            ratios.push(t_file.as_secs_f64() / t_pool.as_secs_f64());
            let (seq, rnd) = self.metadata_per_gib(chunk)?;
            println!(
                "| {} KiB | {:.2} | {:.2} | {:.2} | {:.1} KiB | {:.1} KiB |",
                chunk / 1024,
                ratios[0],
                ratios[1],
                ratios[2],
                seq / KIB as f64,
                rnd / KIB as f64
            );
        }
        Ok(())
    }
}

/// The data checksum's cost in memory (FORMAT.md §6.4): crc32c of every
/// 4 KiB block of `bytes` of data, against copying the same bytes (the
/// least any write path does with them), best of three rounds each.
fn checksum_rate(bytes: u64) {
    let data: Vec<u8> = (0..bytes)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let mut copy = vec![0u8; data.len()];
    let best = |f: &mut dyn FnMut() -> u32| {
        (0..3)
            .map(|_| {
                let start = Instant::now();
                std::hint::black_box(f());
                start.elapsed()
            })
            .min()
            .unwrap_or_default()
    };
    let sum = best(&mut || {
        data.chunks(arbor_format::SUM_BLOCK)
            .fold(0u32, |acc, b| acc ^ arbor_format::block_sum(b))
    });
    let copied = best(&mut || {
        copy.copy_from_slice(&data);
        u32::from(copy[copy.len() / 2])
    });
    let rate = |d: Duration| bytes as f64 / d.as_secs_f64() / GIB as f64;
    println!("\n## Data checksums\n");
    println!("| what | GiB/s | per 4 KiB block |\n|---|---|---|");
    for (what, d) in [("crc32c per 4 KiB block", sum), ("memcpy", copied)] {
        let per_block = d.as_secs_f64() * 1e9 / (bytes / 4096) as f64;
        println!("| {what} | {:.2} | {per_block:.0} ns |", rate(d));
    }
}

/// The cipher of encrypted volumes in memory (arbor-crypt, FORMAT.md
/// §6.6): every unit of `bytes` encrypted, then decrypted, in place, best
/// of three rounds; cycles per byte from the clock /proc/cpuinfo states
/// (a VM's nominal rate: a figure to compare, not a count).
fn cipher_rate(bytes: u64) -> Result<()> {
    use arbor_crypt::{DataUnit, KeyRecord, UserKey, VolumeCipher};
    let mut data: Vec<u8> = (0..bytes)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let mhz = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|l| l.starts_with("cpu MHz"))
                .and_then(|l| l.split(':').nth(1))
                .and_then(|v| v.trim().parse::<f64>().ok())
        });
    println!("\n## Cipher of encrypted volumes (AES-256-XTS)\n");
    println!(
        "CPU clock: {}.\n",
        mhz.map_or("unknown".to_string(), |m| format!("{m:.0} MHz"))
    );
    println!("| unit | direction | GiB/s | per 4 KiB | cycles per byte |\n|---|---|---|---|---|");
    for unit in [DataUnit::B4096, DataUnit::B512] {
        let (record, key) = KeyRecord::create(
            &UserKey::generate_raw(),
            unit,
            arbor_crypt::Kdf::PASSPHRASE_DEFAULT,
        )
        .map_err(|e| anyhow::anyhow!("{e}"))?;
        let cipher =
            VolumeCipher::new(key, record.key_id, unit).map_err(|e| anyhow::anyhow!("{e}"))?;
        for encrypt in [true, false] {
            let mut best = Duration::MAX;
            for _ in 0..3 {
                let start = Instant::now();
                for (i, piece) in data.chunks_mut(1 << 20).enumerate() {
                    let at = (i as u64) << 20;
                    let done = if encrypt {
                        cipher.encrypt(at, piece)
                    } else {
                        cipher.decrypt(at, piece)
                    };
                    done.map_err(|e| anyhow::anyhow!("{e}"))?;
                }
                best = best.min(start.elapsed());
            }
            let secs = best.as_secs_f64();
            let cycles = mhz.map_or("-".to_string(), |m| {
                format!("{:.2}", secs * m * 1e6 / bytes as f64)
            });
            println!(
                "| {} B | {} | {:.2} | {:.0} ns | {cycles} |",
                unit.bytes(),
                if encrypt { "encrypt" } else { "decrypt" },
                bytes as f64 / secs / GIB as f64,
                secs * 1e9 / (bytes / 4096) as f64,
            );
        }
    }
    std::hint::black_box(&data);
    Ok(())
}

impl Bench {
    /// Per-operation cost of the data path in process, format version 9
    /// (no data checksums) against 10, the versions alternating over
    /// rounds so that drift hits both alike.
    fn data_path(&self) -> Result<()> {
        use arbor_format::FormatVersion;
        let size = if self.quick { 128 * MIB } else { 512 * MIB };
        let ops = if self.quick { 20_000 } else { 100_000 };
        let rounds = 3;
        let jobs = [
            "first 4 KiB overwrite after a commit",
            "4 KiB overwrite",
            "4 KiB read",
            "4 KiB read, 2 threads",
            "1 MiB overwrite",
        ];
        // DATA_PATH_LAYOUT=cow: a copy-on-write volume with its home in
        // the pool (written in place, its sums recorded per write).
        let cow = std::env::var("DATA_PATH_LAYOUT").is_ok_and(|l| l == "cow");
        // [version][job] -> best ns per op over rounds
        let mut best = [[f64::MAX; 5]; 2];
        for _ in 0..rounds {
            for (vi, version) in [9u16, 10].into_iter().enumerate() {
                // One version alone, for a profile of it (`perf record`).
                if std::env::var("DATA_PATH_VERSION").is_ok_and(|v| v != version.to_string()) {
                    continue;
                }
                let path = self.path("path.pool");
                let _ = std::fs::remove_file(&path);
                let dev = Arc::new(FileDevice::create_file(&path, size * 2)?);
                let pool = Arc::new(Pool::create(
                    dev,
                    &CreateOptions {
                        format_version: FormatVersion::new(version).context("format version")?,
                        ..Default::default()
                    },
                    &open_opts(),
                )?);
                let v = if cow {
                    pool.create_cow_volume("v", size)?
                } else {
                    pool.create_volume("v", size)?
                };
                let buf = vec![0x5Au8; MIB as usize];
                for i in 0..size / MIB {
                    pool.write(v, i * MIB, &buf)?;
                }
                pool.flush()?;
                let offs = offsets(7, ops, 4 * KIB, size);
                let small = vec![0xC3u8; 4096];
                let per_op = |d: Duration, n: usize| d.as_secs_f64() * 1e9 / n as f64;
                // After the fill's commit: the first overwrite of each chunk.
                let start = Instant::now();
                for &o in &offs {
                    pool.write(v, o, &small)?;
                }
                let first = per_op(start.elapsed(), ops);
                pool.flush()?;
                let start = Instant::now();
                for &o in &offs {
                    pool.write(v, o, &small)?;
                }
                let over = per_op(start.elapsed(), ops);
                pool.flush()?;
                let mut rbuf = vec![0u8; 4096];
                let start = Instant::now();
                for &o in &offs {
                    pool.read(v, o, &mut rbuf)?;
                }
                let read = per_op(start.elapsed(), ops);
                let start = Instant::now();
                std::thread::scope(|s| -> Result<()> {
                    let handles: Vec<_> = [1u64, 2]
                        .into_iter()
                        .map(|seed| {
                            let pool = &pool;
                            s.spawn(move || -> Result<()> {
                                let mut rbuf = vec![0u8; 4096];
                                for o in offsets(seed, ops, 4 * KIB, size) {
                                    pool.read(v, o, &mut rbuf)?;
                                }
                                Ok(())
                            })
                        })
                        .collect();
                    for h in handles {
                        h.join().map_err(|_| anyhow::anyhow!("reader panicked"))??;
                    }
                    Ok(())
                })?;
                let read2 = per_op(start.elapsed(), 2 * ops);
                let start = Instant::now();
                for i in 0..size / MIB {
                    pool.write(v, i * MIB, &buf)?;
                }
                let big = per_op(start.elapsed(), (size / MIB) as usize);
                pool.flush()?;
                for (j, t) in [first, over, read, read2, big].into_iter().enumerate() {
                    best[vi][j] = best[vi][j].min(t);
                }
            }
        }
        println!(
            "\n## Data path in process: checksums (version 10) against none (version 9){}\n",
            if cow {
                ", a copy-on-write volume with its home in the pool"
            } else {
                ""
            }
        );
        println!("Best of {rounds} rounds; {ops} operations at random 4 KiB offsets of a {} MiB volume, filled first.\n", size / MIB);
        println!("| job | version 9 | version 10 | 10 against 9 (throughput) |\n|---|---|---|---|");
        for (j, job) in jobs.iter().enumerate() {
            println!(
                "| {job} | {:.0} ns | {:.0} ns | {:.2}x |",
                best[0][j],
                best[1][j],
                best[0][j] / best[1][j]
            );
        }
        Ok(())
    }
}

fn main() -> Result<()> {
    let args = Args::parse();
    std::fs::create_dir_all(&args.dir)
        .with_context(|| format!("creating {}", args.dir.display()))?;
    let bench = Bench {
        dir: args.dir.clone(),
        quick: args.quick,
    };
    println!(
        "# arbor engine benchmark{}\n",
        if args.quick { " (quick)" } else { "" }
    );
    println!(
        "Machine: {} cores; files in {}.",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        args.dir.display()
    );
    if args.checksums_only {
        checksum_rate(if args.quick { 64 * MIB } else { 512 * MIB });
        return Ok(());
    }
    if args.cipher_only {
        cipher_rate(if args.quick { 64 * MIB } else { 512 * MIB })?;
        return Ok(());
    }
    if args.data_path_only {
        bench.data_path()?;
        let _ = std::fs::remove_file(Path::new(&args.dir).join("path.pool"));
        return Ok(());
    }
    if args.metadata_only {
        let (seq, random) = bench.metadata_per_gib(DEFAULT_CHUNK_SIZE)?;
        println!(
            "\n## Metadata per GiB mapped, {} KiB chunks, format version {}\n",
            DEFAULT_CHUNK_SIZE / 1024,
            arbor_format::FormatVersion::NEWEST.number()
        );
        println!("| fill | metadata per GiB mapped |\n|---|---|");
        println!("| sequential 1 MiB writes | {:.0} KiB |", seq / KIB as f64);
        println!(
            "| random 4 KiB writes, one per chunk | {:.0} KiB |",
            random / KIB as f64
        );
        let _ = std::fs::remove_file(Path::new(&args.dir).join("meta.pool"));
        return Ok(());
    }
    if args.batches_only {
        bench.batches()?;
        for f in ["batch.raw", "batch.pool"] {
            let _ = std::fs::remove_file(Path::new(&args.dir).join(f));
        }
        return Ok(());
    }
    bench.random_writes(DEFAULT_CHUNK_SIZE)?;
    println!("\n## Snapshot and clone latency");
    bench.snapshot_latency(if args.quick { 256 * MIB } else { GIB }, false)?;
    bench.snapshot_latency(if args.quick { 10 * GIB } else { 100 * GIB }, true)?;
    bench.open_time()?;
    bench.chunk_sweep()?;
    println!("\n## Memory\n\nPeak resident memory of this benchmark process: {:.0} MiB (default metadata cache: 64 MiB).", peak_rss_mib());
    for f in [
        "rw.pool",
        "snap.pool",
        "meta.pool",
        "open.pool",
        "sweep.pool",
        "baseline.raw",
    ] {
        let _ = std::fs::remove_file(Path::new(&args.dir).join(f));
    }
    Ok(())
}
