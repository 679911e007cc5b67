#!/usr/bin/python3
"""Where the foreground write tail comes from: 4 KiB random writes at QD1
for 8 s on a full 256 MiB volume of a fresh daemon, with no snapshots, a
committed or a deferred snapshot every second (experiment 3's rows), every
write's latency logged by fio with its time. Prints fio's percentiles, the
snapshot API latencies, how the chunk writes landed (the daemon's
`arbor_chunk_writes_total`: the `*_copied` ones read first), and the writes at or above the run's p99 counted
by time since the last snapshot call and by 100 ms slot of the run, with
the slots of the daemon's commits (snapshots that commit, and the commit
interval) to compare.

KICK_MS=N starts the writeback of the pool file's dirty pages every N ms
from outside the daemon (`sync_file_range(SYNC_FILE_RANGE_WRITE)`, as
RocksDB's bytes_per_sync or PostgreSQL's *_flush_after do), to see what
eager writeback does to the commits and to the writes (PERFORMANCE.md §
11, "Where the buffered tail comes from").

QD=N runs the writes at queue depth N instead of 1.

WARM_MIB=N first writes a volume of N MiB, deletes it and waits for its
reclaim, so that the chunks the run allocates land on blocks of the pool
file the file system has already allocated and written (as in a pool that
has been in use), not in its holes.

    /usr/bin/python3 bench/fg_tail.py BINARY none|committed|deferred [direct|buffered] [CHUNK]
"""
import ctypes
import glob
import os
import shutil
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench as B  # noqa: E402
from arbor_adapter import Arbor  # noqa: E402

SIZE = 256 * B.MIB
SECONDS = 8
SYNC_FILE_RANGE_WRITE = 2


def main():
    binary, mode = sys.argv[1], sys.argv[2]
    io = sys.argv[3] if len(sys.argv) > 3 else None
    chunk = sys.argv[4] if len(sys.argv) > 4 else "16K"
    kick_ms = int(os.environ.get("KICK_MS", "0"))
    work = os.environ.get("WORKDIR", "/var/tmp/arbor-fg-tail")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    pool_size = SIZE * 16 + B.GIB
    ab = Arbor(binary, os.path.join(work, "d"), pool_size, io=io, chunk_size=chunk).start()
    pool = os.path.join(ab.workdir, "pool")
    stop = threading.Event()
    snaps = []

    def snapper():
        i = 0
        while not stop.wait(1.0):
            i += 1
            t = time.time()
            ab.snapshot(f"v@s{i}", "deferred" if mode == "deferred" else None)
            snaps.append((t, time.time()))

    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.sync_file_range.argtypes = [ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint]

    def kicker():
        fd = os.open(pool, os.O_RDONLY)
        try:
            while not stop.wait(kick_ms / 1000):
                if libc.sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE) != 0:
                    raise OSError(ctypes.get_errno(), "sync_file_range")
        finally:
            os.close(fd)

    threads = []
    try:
        if os.environ.get("PREALLOC"):
            # the pool file's holes allocated as unwritten extents (what a
            # long-lived pool's reused chunks are not: those are written)
            subprocess.run(["fallocate", "-l", str(pool_size), pool], check=True)
        warm = int(os.environ.get("WARM_MIB", "0")) << 20
        if warm:
            # the pool file's blocks written once and freed, so that new
            # chunks land on blocks the file system has (a long-lived pool's
            # reused chunks), not in its holes
            ab.volume_create("warm", warm)
            B.fio(("nbd", ab.uri("warm")), "write", "1m", 8, warm, end_fsync=True)
            ab.destroy("warm")
            ab.wait_reclaimed()
        ab.volume_create("v", SIZE)
        B.fio(("nbd", ab.uri("v")), "write", "1m", 8, SIZE, end_fsync=True)
        filled = ab.chunk_writes()
        started = time.time()  # the fill's flush committed: the commit interval counts from about here
        if mode != "none":
            threads.append(threading.Thread(target=snapper))
        if kick_ms:
            threads.append(threading.Thread(target=kicker))
        for t in threads:
            t.start()
        job = B.fio(("nbd", ab.uri("v")), "randwrite", "4k", int(os.environ.get("QD", "1")), SIZE, runtime=SECONDS, randommap=False,
                    extra=[f"--write_lat_log={work}/lat", "--log_avg_msec=0", "--per_job_logs=0",
                           "--log_unix_epoch=1"])
        plans = {k: v - filled.get(k, 0) for k, v in ab.chunk_writes().items()}
    finally:
        stop.set()
        for t in threads:
            t.join()
        ab.stop()
    print(f"{mode} io={io or 'default'} chunk={chunk} kick={kick_ms}ms: {job['iops']:.0f} IOPS, "
          f"p50 {job['lat_p50_us']:.1f} p99 {job['lat_p99_us']:.1f} p99.9 {job['lat_p999_us']:.1f} µs")
    total = sum(plans.values()) or 1
    print("  chunk writes by plan (share of the run's):",
          {k: f"{v / total:.1%}" for k, v in plans.items() if v})
    if snaps:
        print("  snapshot API ms:", [round((b - a) * 1e3, 2) for a, b in snaps])
    # Lines: time (Unix ms), latency (ns), direction, size, offset.
    rows = []
    for line in open(glob.glob(f"{work}/lat*_lat.log")[0]):
        f = line.split(",")
        rows.append((int(f[0]) / 1000, int(f[1])))
    shutil.rmtree(work, ignore_errors=True)
    lats = sorted(lat for _, lat in rows)
    first = rows[0][0]
    per_s = {}
    for t, lat in rows:
        per_s.setdefault(int(t - first), []).append(lat)
    print("  p99 by second of the run (µs):",
          [round(sorted(v)[int(len(v) * 0.99)] / 1e3) for _, v in sorted(per_s.items())])
    p99 = lats[int(len(lats) * 0.99)]
    slow = [(t, lat) for t, lat in rows if lat >= p99]
    first = rows[0][0]
    print(f"  {len(slow)} writes at or above p99 ({p99 / 1e3:.0f} µs) of {len(rows)}")
    if snaps:
        since = {}
        for t, _ in slow:
            before = [a for a, _ in snaps if a <= t]
            key = f"{min(int((t - before[-1]) * 10), 9) / 10:.1f} s" if before else "before the first"
            since[key] = since.get(key, 0) + 1
        print("  by time since the last snapshot call:", dict(sorted(since.items())))
    slots = {}
    for t, _ in slow:
        slot = int((t - first) * 10)
        slots[slot] = slots.get(slot, 0) + 1
    top = sorted(slots.items(), key=lambda x: -x[1])[:8]
    print("  busiest 100 ms slots of the run (slot: writes):", dict(top))
    interval = [int((started + 5 * k - first) * 10) for k in range(1, 3)]
    if mode == "committed":
        print(f"  slots of the snapshots' commits {[int((a - first) * 10) for a, _ in snaps]}")
    print(f"  commit interval's commits near slots {interval}")


if __name__ == "__main__":
    main()
