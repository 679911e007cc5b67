#!/usr/bin/python3
"""arbor benchmark harness: arbor side by side with its peers, and the seed
papers' headline experiments. See bench/README.md.

    /usr/bin/python3 bench/bench.py --profile quick     # < 10 minutes on 2 cores
    /usr/bin/python3 bench/bench.py --profile full

Every system lives on the same filesystem (the work directory), uses the
host page cache (buffered I/O, write-back) and is driven by the same client:
fio's nbd engine (libnbd) over a Unix socket; the plain-file limit is fio's
psync engine on a file in the same directory. Durability is the same for all:
no flush during a job, one flush (fio end_fsync=1: NBD FLUSH, or fsync for the
file) at the end of every write job.

Writes results.json, report.md and PNG plots to bench/results/<profile>-<UTC time>/.
Not a test: nothing passes or fails on these numbers.
"""

import argparse
import datetime
import json
import os
import platform
import random
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from arbor_adapter import Arbor, wait_for_socket  # noqa: E402  (every arbor invocation is in there)

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30

PROFILES = {
    # harness validation only (seconds, figures meaningless)
    "smoke": dict(size1=64 * MIB, runtime=1, size2=64 * MIB, arbor_marks=[0, 1, 10], qcow_marks=[0, 1, 3],
                  writes_between=4, exp2_repeats=1, cli_n=3, lat_runtime=2, size5=128 * MIB, io5=4 * MIB, size6=64 * MIB,
                  snaps6=5, reclaim_bytes=16 * MIB, all_jobs=False,
                  size4=64 * MIB, runtime4=1, chunks4=["4K", "64K"], ratios4=[0, 50, 100], marks4=[0, 1, 3],
                  repeats4=2, clients8=[1, 4]),
    "quick": dict(size1=512 * MIB, runtime=3, size2=256 * MIB, arbor_marks=[0, 1, 10, 100, 1000],
                  qcow_marks=[0, 1, 10, 100], writes_between=16, exp2_repeats=3, cli_n=20, lat_runtime=8,
                  size5=1 * GIB, io5=32 * MIB, size6=512 * MIB, snaps6=100, reclaim_bytes=128 * MIB,
                  all_jobs=False, size4=256 * MIB, runtime4=3, chunks4=["4K", "16K", "64K"],
                  ratios4=[0, 20, 40, 60, 80, 100], marks4=[0, 1, 10, 100, 1000], repeats4=2,
                  clients8=[1, 4, 16]),
    "full": dict(size1=2 * GIB, runtime=10, size2=1 * GIB, arbor_marks=[0, 1, 10, 100, 1000],
                 qcow_marks=[0, 1, 10, 100, 1000], writes_between=16, exp2_repeats=3, cli_n=100, lat_runtime=30,
                 size5=4 * GIB, io5=128 * MIB, size6=2 * GIB, snaps6=1000, reclaim_bytes=1 * GIB,
                 all_jobs=True, size4=1 * GIB, runtime4=10, chunks4=["4K", "16K", "64K"],
                 ratios4=[0, 20, 40, 60, 80, 100], marks4=[0, 1, 10, 100, 1000], repeats4=3,
                 clients8=[1, 4, 16]),
}

FIRST_WRITES = "4K first writes QD32"
# name, fio rw, block size, queue depth
JOBS = {
    "4K randread QD1": ("randread", "4k", 1),
    "4K randread QD32": ("randread", "4k", 32),
    "4K randwrite QD1": ("randwrite", "4k", 1),
    "4K randwrite QD32": ("randwrite", "4k", 32),
    # one 4 KiB write per 64 KiB (random order, each once): every write is the first to
    # its arbor chunk (16 KiB) and to its qcow2 cluster (64 KiB); the job ends when done
    FIRST_WRITES: ("randwrite", "4k", 32),
    "64K randwrite QD32": ("randwrite", "64k", 32),
    "1M seqread QD8": ("read", "1m", 8),
    "1M seqwrite QD8": ("write", "1m", 8),
}
READS = [j for j, (rw, _, _) in JOBS.items() if "read" in rw]
FIRST_WRITES_SPACING = 64 * KIB
WRITES = [j for j, (rw, _, _) in JOBS.items() if "write" in rw]

# Which jobs run in which state (the quick profile skips the least telling cells).
STATE_JOBS_QUICK = {
    "fresh": ["4K randwrite QD32", FIRST_WRITES, "64K randwrite QD32", "1M seqwrite QD8"],
    "full": [j for j in JOBS if j != FIRST_WRITES],
    "after snapshot": ["4K randread QD32", "4K randwrite QD1", "4K randwrite QD32", FIRST_WRITES,
                       "64K randwrite QD32", "1M seqwrite QD8"],
}
STATE_JOBS_FULL = {"fresh": list(JOBS), "full": [j for j in JOBS if j != FIRST_WRITES], "after snapshot": list(JOBS)}

# Systems of experiment 1, and which states each has. For peers, "after
# snapshot" is a qcow2 overlay on a raw backing file, or a qcow2 image right
# after `qemu-img snapshot -c`; raw files and nbdkit have no snapshots.
SYSTEMS = ["file (fio psync)", "nbdkit memory", "nbdkit file", "qemu-nbd raw", "qemu-nbd qcow2",
           "qemu-nbd qcow2 overlay", "qemu-nbd qcow2 internal snap", "arbor"]
SYSTEM_STATES = {
    "file (fio psync)": ["fresh", "full"],
    "nbdkit memory": ["fresh", "full"],
    "nbdkit file": ["fresh", "full"],
    "qemu-nbd raw": ["fresh", "full"],
    "qemu-nbd qcow2": ["fresh", "full"],
    "qemu-nbd qcow2 overlay": ["after snapshot"],
    "qemu-nbd qcow2 internal snap": ["after snapshot"],
    "arbor": ["fresh", "full", "after snapshot"],
}

# Experiment 7: no host page cache (direct I/O, or nbdkit's no-cache mode),
# with arbor's buffered mode beside it for reference.
EXP7_SYSTEMS = ["file (fio psync, O_DIRECT)", "nbdkit file cache=none", "qemu-nbd raw cache=none io_uring",
                "arbor direct", "arbor buffered"]

# Experiment 8: many clients, each its own NBD connection. Queue depth per
# client: QD1 jobs are bound by each request's round trip, QD8 and the 1 MiB
# reads by throughput (16 clients keep 128, or 32 MiB, in flight).
EXP8_JOBS = {
    "4K randread QD1/client": ("randread", "4k", 1),
    "4K randwrite QD1/client": ("randwrite", "4k", 1),
    "4K randread QD8/client": ("randread", "4k", 8),
    "4K randwrite QD8/client": ("randwrite", "4k", 8),
    "1M seqread QD2/client": ("read", "1m", 2),
}
EXP8_SYSTEMS = ["nbdkit memory", "nbdkit file", "arbor", "arbor, one clone each"]

# Snapshots taken while a client writes (experiments 3 and 7): none, one a
# second committed before the API call returns (the default), and one a
# second made durable by the next commit (`"durability": "deferred"`), and
# one a second, deferred, of another volume of the pool (which the written
# volume's I/O should not feel).
OTHER_VOLUME = "deferred snapshot of another volume every 1 s"
SNAPSHOT_LOADS = [("no snapshots", None), ("snapshot every 1 s", None),
                  ("deferred snapshot every 1 s", "deferred"), (OTHER_VOLUME, "deferred")]

COMPILERS = {"rustc", "cargo", "cc1", "cc1plus", "ld", "ld.lld", "collect2", "clippy-driver", "rustdoc",
             "cc", "gcc", "clang", "rust-lld", "ld.bfd", "ld.gold", "mold"}


def log(*a):
    print(f"[{time.strftime('%H:%M:%S')}]", *a, file=sys.stderr, flush=True)


def human(n):
    for unit, size in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"


def proc_cpu_seconds(pid):
    """utime + stime of a process (seconds)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return None


def proc_threads(pid):
    """{thread id: (context switches, utime + stime seconds)} of a process's live threads."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:  # a thread may end between the listing and the reads
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                switches = sum(int(ln.split()[1]) for ln in f if "ctxt_switches" in ln)
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[tid] = (switches, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"))
    return out


def machine_cpu_seconds():
    """CPU seconds every core has spent busy since boot (/proc/stat: user,
    nice, system, irq, softirq, steal)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    return (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / os.sysconf("SC_CLK_TCK")


class ThreadSampler(threading.Thread):
    """A server's threads during a job, sampled every 0.2 s: context switches
    (threads that exit, like nbdkit's per-connection ones, take their counts
    with them, so the last sample of each thread is kept), CPU seconds, and
    per interval the cores kept busy by the server, by its busiest thread and
    by the whole machine."""

    def __init__(self, pid):
        super().__init__(daemon=True)
        self.pid, self.first, self.last = pid, proc_threads(pid), {}
        self.done = threading.Event()
        self.threads = 0
        self.prev = (time.perf_counter(), proc_cpu_seconds(pid), machine_cpu_seconds(), self.first)
        self.intervals = []  # (server, busiest thread, machine): cores

    def run(self):
        while True:
            self.sample()
            if self.done.wait(0.2):
                self.sample()
                return

    def sample(self):
        now = proc_threads(self.pid)
        t, cpu, machine = time.perf_counter(), proc_cpu_seconds(self.pid), machine_cpu_seconds()
        t0, cpu0, machine0, before = self.prev
        if t - t0 >= 0.1:  # CPU time moves in 10 ms ticks: a shorter interval says little
            busiest = max((c - before.get(tid, (0, 0.0))[1] for tid, (_, c) in now.items()), default=0.0)
            self.intervals.append(((cpu - cpu0) / (t - t0), busiest / (t - t0), (machine - machine0) / (t - t0)))
            self.prev = (t, cpu, machine, now)
        self.last.update(now)
        self.threads = max(self.threads, len(now))

    def stop(self):
        """Context switches of all threads and CPU seconds of the busiest one since the
        start; and the cores busy in a typical interval (the median of each: fio's
        start-up and its final flush are a few intervals at most)."""
        self.done.set()
        self.join()
        zero = (0, 0.0)
        steady = [statistics.median(x) for x in zip(*self.intervals)] if self.intervals else [None] * 3
        return {"switches": sum(sw - self.first.get(t, zero)[0] for t, (sw, _) in self.last.items()),
                "busiest_thread_s": max((c - self.first.get(t, zero)[1] for t, (_, c) in self.last.items()),
                                        default=0.0),
                "server_cores": steady[0], "busiest_thread_cores": steady[1], "machine_cores": steady[2]}


class BusyMonitor(threading.Thread):
    """Samples, every second, the load average and how many compiler/linker
    processes run on the machine (other engineers building): a figure taken
    while any ran is marked busy."""

    def __init__(self):
        super().__init__(daemon=True)
        self.samples = []  # (time, load1, compilers)
        self.stop_flag = threading.Event()

    def run(self):
        while not self.stop_flag.is_set():
            n = 0
            for pid in os.listdir("/proc"):
                if pid.isdigit():
                    try:
                        with open(f"/proc/{pid}/comm") as f:
                            if f.read().strip() in COMPILERS:
                                n += 1
                    except OSError:
                        pass
            with open("/proc/loadavg") as f:
                load1 = float(f.read().split()[0])
            self.samples.append((time.time(), load1, n))
            self.stop_flag.wait(1.0)

    def window(self, t0, t1):
        s = [x for x in self.samples if t0 - 1 <= x[0] <= t1 + 1]
        if not s:
            return {"load1_max": None, "compilers_max": 0, "busy": False}
        comp = max(x[2] for x in s)
        return {"load1_max": max(x[1] for x in s), "compilers_max": comp, "busy": comp > 0}


# --------------------------------------------------------------------------
# fio, the one client


def fio(target, rw, bs, qd, size, runtime=None, io_size=None, randommap=None, end_fsync=None, seed=1,
        extra=()):
    """Runs fio once. target: ("file", path) or ("nbd", uri): one job; ("nbd", [uri, ...]):
    a job per URI, all at once, each its own NBD connection at queue depth `qd`,
    reported as one (rates summed, latency percentiles over every job's I/Os)."""
    kind, where = target
    is_write = "write" in rw
    if randommap is None:
        randommap = is_write and rw.startswith("rand")
    if end_fsync is None:
        end_fsync = is_write
    # Options before the first --name apply to every job; the jobs come last.
    argv = ["fio", f"--rw={rw}", f"--bs={bs}", f"--size={size}", "--output-format=json",
            f"--randseed={seed}", "--lat_percentiles=1", "--percentile_list=50:99:99.9", "--invalidate=0"]
    if kind == "file":
        argv += ["--ioengine=psync"]
        jobs = [["--name=j", f"--filename={where}"]]
    else:
        # fio seeds each job's offsets from --randseed and the job's number: clients do not repeat each other
        argv += ["--ioengine=nbd", f"--iodepth={qd}", "--group_reporting"]
        jobs = [[f"--name=j{i}", f"--uri={uri}"] for i, uri in enumerate([where] if isinstance(where, str) else where)]
    if runtime:
        argv += [f"--runtime={runtime}", "--time_based"]
    if io_size:
        argv += [f"--io_size={io_size}"]
    if not randommap:
        argv += ["--norandommap"]
    if end_fsync:
        argv += ["--end_fsync=1"]
    argv += list(extra) + [a for j in jobs for a in j]
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"fio failed: {' '.join(argv)}\n{proc.stderr[-2000:]}{proc.stdout[-2000:]}")
    out = proc.stdout
    job = json.loads(out[out.index("{"):])["jobs"][0]
    r = fio_side(job["write"] if is_write else job["read"])
    r["client_cpu_pct"] = job["usr_cpu"] + job["sys_cpu"]
    # while they ran (the group's usr_cpu and sys_cpu are per job, averaged)
    r["client_cores"] = r["client_cpu_pct"] / 100 * len(jobs)
    if rw in ("randrw", "rw", "readwrite"):  # mixed: both sides, the main one above is the reads
        r["read"], r["write"] = fio_side(job["read"]), fio_side(job["write"])
    return r


def fio_side(side):
    """One direction (read or write) of a fio json job."""
    lat = side.get("lat_ns", {})
    pct = lat.get("percentile", {})
    return {
        "iops": side["iops"], "mib_s": side["bw_bytes"] / MIB, "ios": side["total_ios"],
        "lat_p50_us": pct.get("50.000000", 0) / 1e3, "lat_p99_us": pct.get("99.000000", 0) / 1e3,
        "lat_p999_us": pct.get("99.900000", 0) / 1e3, "lat_max_us": lat.get("max", 0) / 1e3,
        "lat_mean_us": lat.get("mean", 0) / 1e3,
    }


# Every server started (Peer or Arbor), so that an error midway still stops them all.
STARTED = []


class Peer:
    """An NBD server process we start (nbdkit or qemu-nbd), stopped by its PID."""

    def __init__(self, argv, sock, export):
        self.sock, self.export = sock, export
        if os.path.exists(sock):
            os.unlink(sock)
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        STARTED.append(self)
        wait_for_socket(sock, self.proc)

    @property
    def pid(self):
        return self.proc.pid

    def uri(self):
        return f"nbd+unix:///{self.export}?socket={self.sock}"

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def nbdkit(sock, plugin, *args):
    return Peer(["nbdkit", "--foreground", "--exit-with-parent", "-U", sock, plugin, *args], sock, "")


def qemu_nbd(sock, path, fmt, cache="writeback", aio="threads"):
    return Peer(["qemu-nbd", "--persistent", "--shared=8", f"--cache={cache}", f"--aio={aio}", "-f", fmt,
                 "-x", "bench", "--socket", sock, path], sock, "bench")


class Snapper:
    """While the `with` block runs, takes a snapshot `PREFIX1`, `PREFIX2`, ...
    of an arbor daemon every second through its API (when `active`), and
    keeps each call's seconds in `latencies`. `durability`: None (committed
    before the call returns) or "deferred" (at the pool's next commit)."""

    def __init__(self, ab, prefix, active=True, durability=None):
        self.ab, self.prefix, self.active, self.durability = ab, prefix, active, durability
        self.latencies = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run)

    def run(self):
        i = 0
        while not self.stop.wait(1.0):
            i += 1
            t = time.perf_counter()
            self.ab.snapshot(f"{self.prefix}{i}", self.durability)
            self.latencies.append(time.perf_counter() - t)

    def __enter__(self):
        if self.active:
            self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join()
        return False


def fill_file(path, size):
    """Writes `size` bytes of incompressible data (a random MiB with a counter)."""
    block = bytearray(os.urandom(MIB))
    with open(path, "wb") as f:
        for i in range(size // MIB):
            block[:8] = i.to_bytes(8, "little")
            f.write(block)


def run(cmd):
    subprocess.run(cmd, check=True, capture_output=True)


# --------------------------------------------------------------------------


class Bench:
    def __init__(self, args):
        self.args = args
        self.p = PROFILES[args.profile]
        self.arbor_bin = args.arbor
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        self.out = args.out or os.path.join(HERE, "results", f"{args.profile}-{stamp}")
        os.makedirs(self.out, exist_ok=True)
        self.work = tempfile.mkdtemp(prefix="arbor-bench-", dir=args.workdir)
        self.busy = BusyMonitor()
        self.busy.start()
        self.records = []
        self.sections = {}
        self.arbor_log = open(os.path.join(self.out, "arbor-serve.log"), "ab")
        self.perf_reports = {}

    def path(self, name):
        return os.path.join(self.work, name)

    def record(self, **r):
        self.records.append(r)
        return r

    def arbor(self, name, pool_size, **kw):
        d = self.path(name)
        shutil.rmtree(d, ignore_errors=True)
        ab = Arbor(self.arbor_bin, d, pool_size, log=self.arbor_log, **kw)
        STARTED.append(ab)
        return ab.start()

    def timed_fio(self, target, job, size, server_pid=None, profile_as=None, **kw):
        """job: a JOBS name, or a (fio rw, block size, queue depth) tuple."""
        rw, bs, qd = JOBS[job] if isinstance(job, str) else job
        if job == FIRST_WRITES:
            kw = dict(kw, runtime=None, io_size=size // (FIRST_WRITES_SPACING // 4096),
                      extra=[f"--blockalign={FIRST_WRITES_SPACING}"])
        cpu0 = proc_cpu_seconds(server_pid) if server_pid else None
        sampler = ThreadSampler(server_pid) if server_pid else None
        if sampler:
            sampler.start()
        client0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.time()
        try:
            r = fio(target, rw, bs, qd, size, **kw)
        finally:
            threads = sampler.stop() if sampler else None
        t1 = time.time()
        client1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        r["wall_s"] = t1 - t0  # includes fio start-up and the end-of-job flush, which fio's rate leaves out
        # fio's CPU over the same time (its job processes are reaped by it, so counted)
        r["client_cpu_s"] = (client1.ru_utime - client0.ru_utime) + (client1.ru_stime - client0.ru_stime)
        if cpu0 is not None:
            r["server_cpu_s"] = proc_cpu_seconds(server_pid) - cpu0
            r["server_cpu_us_per_io"] = r["server_cpu_s"] * 1e6 / max(r["ios"], 1)
            r["server_switches_per_io"] = threads["switches"] / max(r["ios"], 1)
            r["server_busiest_thread_s"] = threads["busiest_thread_s"]
            r["server_threads"] = sampler.threads
            r["server_cores"], r["busiest_thread_cores"] = threads["server_cores"], threads["busiest_thread_cores"]
            r["machine_cores"] = threads["machine_cores"]
        if profile_as and server_pid and self.args.perf:
            # A second, unreported run of the same job under `perf record`
            # (sampling perturbs the figures, so it never runs during a measured one).
            data = os.path.join(self.out, f"perf-{profile_as}.data")
            perf = subprocess.Popen(["perf", "record", "-F", "499", "-g", "-p", str(server_pid), "-o", data],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                fio(target, rw, bs, qd, size, **kw)
            finally:
                perf.send_signal(signal.SIGINT)
                perf.wait()
            self.perf_reports[profile_as] = data
        r.update(self.busy.window(t0, t1))
        return r

    # ---------------------------------------------------------------- exp 1
    def exp1_data_path(self):
        p = self.p
        size, rt = p["size1"], p["runtime"]
        state_jobs = STATE_JOBS_FULL if p["all_jobs"] else STATE_JOBS_QUICK
        full_raw = self.path("full.raw")
        log(f"exp1: preparing {human(size)} images")
        fill_file(full_raw, size)
        full_qcow = self.path("full.qcow2")
        run(["qemu-img", "convert", "-f", "raw", "-O", "qcow2", full_raw, full_qcow])
        sock = self.path("peer.sock")
        counter = [0]

        def fresh_raw():
            counter[0] += 1
            f = self.path(f"fresh{counter[0]}.raw")
            with open(f, "wb") as fh:
                fh.truncate(size)
            return f

        def fresh_qcow():
            counter[0] += 1
            f = self.path(f"fresh{counter[0]}.qcow2")
            run(["qemu-img", "create", "-f", "qcow2", f, str(size)])
            return f

        ab = self.arbor("exp1", size * 16 + GIB)  # sparse file; room for every job's copies
        ab.volume_create("full", size)
        fio(("nbd", ab.uri("full")), "write", "1m", 8, size, end_fsync=True)
        nsnap = [0]

        def target(system, state, job):
            """Returns (fio target, server pid, cleanup) for one job."""
            w = job in WRITES
            if system == "file (fio psync)":
                return ("file", fresh_raw() if state == "fresh" else full_raw), None, lambda: None
            if system == "arbor":
                if state == "fresh":
                    counter[0] += 1
                    name = f"fresh{counter[0]}"
                    ab.volume_create(name, size)
                    return ("nbd", ab.uri(name)), ab.pid, lambda: None
                if state == "after snapshot" and (w or nsnap[0] == 0):
                    nsnap[0] += 1
                    ab.snapshot(f"full@s{nsnap[0]}")
                return ("nbd", ab.uri("full")), ab.pid, lambda: None
            if system == "nbdkit memory":
                srv = nbdkit(sock, "memory", str(size))
                if state == "full":
                    fio(("nbd", srv.uri()), "write", "1m", 8, size)
                return ("nbd", srv.uri()), srv.pid, srv.stop
            if system == "nbdkit file":
                srv = nbdkit(sock, "file", fresh_raw() if state == "fresh" else full_raw)
                return ("nbd", srv.uri()), srv.pid, srv.stop
            if system == "qemu-nbd raw":
                srv = qemu_nbd(sock, fresh_raw() if state == "fresh" else full_raw, "raw")
                return ("nbd", srv.uri()), srv.pid, srv.stop
            if system == "qemu-nbd qcow2":
                srv = qemu_nbd(sock, fresh_qcow() if state == "fresh" else full_qcow, "qcow2")
                return ("nbd", srv.uri()), srv.pid, srv.stop
            if system == "qemu-nbd qcow2 overlay":
                counter[0] += 1
                ov = self.path(f"overlay{counter[0]}.qcow2")
                run(["qemu-img", "create", "-f", "qcow2", "-b", full_raw, "-F", "raw", ov, str(size)])
                srv = qemu_nbd(sock, ov, "qcow2")
                return ("nbd", srv.uri()), srv.pid, srv.stop
            if system == "qemu-nbd qcow2 internal snap":
                counter[0] += 1
                img = self.path(f"int{counter[0]}.qcow2")
                shutil.copyfile(full_qcow, img)
                run(["qemu-img", "snapshot", "-c", "s1", img])
                srv = qemu_nbd(sock, img, "qcow2")

                def cleanup():
                    srv.stop()
                    os.unlink(img)
                return ("nbd", srv.uri()), srv.pid, cleanup
            raise ValueError(system)

        for state in ("fresh", "full", "after snapshot"):
            for job in state_jobs[state]:
                for system in SYSTEMS:
                    if state not in SYSTEM_STATES[system]:
                        continue
                    tgt, pid, cleanup = target(system, state, job)
                    try:
                        prof = None
                        if system == "arbor" and state == "full" and job in ("4K randwrite QD32", "4K randread QD32",
                                                                            "1M seqwrite QD8", "1M seqread QD8"):
                            prof = f"arbor-{job.replace(' ', '-')}"
                        if system == "nbdkit file" and state == "full" and job == "4K randwrite QD32":
                            prof = "nbdkit-file-4K-randwrite-QD32"
                        r = self.timed_fio(tgt, job, size, server_pid=pid, runtime=rt, profile_as=prof)
                    finally:
                        cleanup()
                    self.record(exp=1, state=state, job=job, system=system, **r)
                    log(f"exp1 {state:14} {job:20} {system:30} {r['iops']:9.0f} IOPS {r['mib_s']:8.1f} MiB/s"
                        f"{'  (busy)' if r['busy'] else ''}")
                    for f in os.listdir(self.work):
                        if f.startswith(("fresh", "overlay")):
                            os.unlink(self.path(f))
        self.record(exp=1, kind="arbor_peak_rss", bytes=ab.peak_rss_bytes())
        ab.stop()
        for f in (full_raw, full_qcow):
            os.unlink(f)
        shutil.rmtree(ab.workdir, ignore_errors=True)

    # ---------------------------------------------------------------- exp 2 (+ exp 3 CLI latency)
    def random_writes_nbd(self, h, size, n, rng):
        buf = os.urandom(4096)
        for _ in range(n):
            h.pwrite(buf, rng.randrange(size // 4096) * 4096)

    def exp2_jobs(self):
        """The measured jobs at each snapshot count; the 4 KiB one repeated (each
        run right after its own snapshot), the report takes the median."""
        return ["4K randwrite QD32"] * self.p["exp2_repeats"] + ["1M seqwrite QD8"]

    def exp2_many_snapshots(self):
        import nbd
        p = self.p
        size, rt, wb = p["size2"], p["runtime"], p["writes_between"]
        rng = random.Random(2)
        # arbor. Each measured job runs right after its own snapshot and may
        # copy the whole volume, which that snapshot then keeps: size the
        # pool for all of them, plus the volume and the small snapshots.
        measured = len(p["arbor_marks"]) * len(self.exp2_jobs())
        ab = self.arbor("exp2", size * (measured + 4) + GIB)
        ab.volume_create("ms", size)
        ab.volume_create("empty", 100 * GIB)
        fio(("nbd", ab.uri("ms")), "write", "1m", 8, size)
        h = nbd.NBD()
        h.connect_uri(ab.uri("ms"))
        held = 0
        for mark in p["arbor_marks"]:
            t0 = time.time()
            while held < mark:
                self.random_writes_nbd(h, size, wb, rng)
                held += 1
                ab.snapshot(f"ms@s{held}")
            h.flush()
            log(f"exp2 arbor: {held} snapshots held ({time.time() - t0:.1f} s to take them)")
            for job in self.exp2_jobs():
                if held:
                    held += 1
                    ab.snapshot(f"ms@s{held}")  # the measured writes are first writes after a snapshot
                r = self.timed_fio(("nbd", ab.uri("ms")), job, size, server_pid=ab.pid, runtime=rt)
                self.record(exp=2, system="arbor", snapshots=held, mark=mark, job=job, **r)
                log(f"exp2 arbor      {held:5} snaps {job:18} {r['iops']:9.0f} IOPS {r['mib_s']:8.1f} MiB/s")
            self.exp3_cli_latency(ab, held, size)
        h.shutdown()
        self.exp3_destroy_reclaim(ab, held)
        self.record(exp=2, kind="arbor_peak_rss", bytes=ab.peak_rss_bytes(), status=ab.status())
        ab.stop()
        shutil.rmtree(ab.workdir, ignore_errors=True)

        # qcow2 internal snapshots (qemu-img snapshot -c needs the image closed:
        # writes between snapshots go through qemu-io, measurement through qemu-nbd)
        raw = self.path("exp2.raw")
        fill_file(raw, size)
        img = self.path("exp2.qcow2")
        run(["qemu-img", "convert", "-f", "raw", "-O", "qcow2", raw, img])
        os.unlink(raw)
        held = 0
        sock = self.path("peer.sock")
        for mark in p["qcow_marks"]:
            t0 = time.time()
            while held < mark:
                cmds = []
                for _ in range(wb):
                    cmds += ["-c", f"write -P {held % 250 + 1} {rng.randrange(size // 4096) * 4096} 4k"]
                run(["qemu-io", "-f", "qcow2", *cmds, img])
                held += 1
                run(["qemu-img", "snapshot", "-c", f"s{held}", img])
            log(f"exp2 qcow2: {held} snapshots held ({time.time() - t0:.1f} s to take them)")
            for job in self.exp2_jobs():
                if held:
                    held += 1
                    t1 = time.perf_counter()
                    run(["qemu-img", "snapshot", "-c", f"s{held}", img])
                    self.record(exp=3, kind="qcow2_snapshot_c", snapshots=held, seconds=time.perf_counter() - t1)
                srv = qemu_nbd(sock, img, "qcow2")
                try:
                    r = self.timed_fio(("nbd", srv.uri()), job, size, server_pid=srv.pid, runtime=rt)
                finally:
                    srv.stop()
                self.record(exp=2, system="qcow2 internal", snapshots=held, mark=mark, job=job, **r)
                log(f"exp2 qcow2      {held:5} snaps {job:18} {r['iops']:9.0f} IOPS {r['mib_s']:8.1f} MiB/s")
        os.unlink(img)

    # ---------------------------------------------------------------- exp 3
    def exp3_cli_latency(self, ab, held, size):
        n = self.p["cli_n"]
        t0 = time.time()
        if held == 0:
            # what any process start costs here, and an arbor client that does nothing
            spawn = []
            for _ in range(n):
                t = time.perf_counter()
                subprocess.run(["/bin/true"], check=True)
                spawn.append(time.perf_counter() - t)
            self.record(exp=3, kind="spawn_reference", true=spawn, arbor_version=[ab.cli_noop() for _ in range(n)],
                        **self.busy.window(t0, time.time()))
        for vol, mapped in (("ms", size), ("empty", 0)):
            cli = [ab.cli_snapshot(f"{vol}@cli{held}_{i}") for i in range(n)]
            api = []
            for i in range(n):
                t = time.perf_counter()
                ab.snapshot(f"{vol}@api{held}_{i}")
                api.append(time.perf_counter() - t)
            self.record(exp=3, kind="snapshot_latency", volume=vol, mapped=mapped, snapshots=held,
                        cli=cli, api=api, **self.busy.window(t0, time.time()))
        clones = [ab.cli_clone(f"ms@cli{held}_0", f"c{held}_{i}") for i in range(n)]
        destroys = [ab.cli_destroy(f"c{held}_{i}") for i in range(n)]
        self.record(exp=3, kind="clone_latency", volume="ms", mapped=size, snapshots=held, cli=clones,
                    **self.busy.window(t0, time.time()))
        self.record(exp=3, kind="destroy_clone_latency", snapshots=held, cli=destroys,
                    **self.busy.window(t0, time.time()))
        log(f"exp3 CLI snapshot at {held} snapshots: median {statistics.median(cli) * 1e3:.2f} ms, "
            f"clone {statistics.median(clones) * 1e3:.2f} ms")

    def exp3_destroy_reclaim(self, ab, held):
        """Destroy latency of a volume with exclusive data, then the background
        reclaim rate at the daemon's default reclaim rate."""
        nbytes = self.p["reclaim_bytes"]
        ab.clone(f"ms@s{held}", "doomed")
        ab.volume_create("doomed2", nbytes)
        fio(("nbd", ab.uri("doomed")), "write", "1m", 8, nbytes)
        fio(("nbd", ab.uri("doomed2")), "write", "1m", 8, nbytes)
        ab.flush()
        for name in ("doomed", "doomed2"):
            ab.wait_reclaimed()  # let any earlier reclaim finish
            used0 = ab.status()["data_used_bytes"]
            t0 = time.time()
            lat = ab.cli_destroy(name)
            while time.time() < t0 + 300:
                st = ab.status()
                if not st["reclaim_pending"]:
                    break
                time.sleep(0.05)
            t1 = time.time()
            freed = used0 - ab.status()["data_used_bytes"]
            self.record(exp=3, kind="destroy_reclaim", volume=name, exclusive_bytes=nbytes,
                        destroy_cli_s=lat, reclaim_s=t1 - t0, freed_bytes=freed,
                        rate_mib_s=freed / MIB / max(t1 - t0, 1e-9), **self.busy.window(t0, t1))
            log(f"exp3 destroy {name}: CLI {lat * 1e3:.1f} ms, reclaim of {freed / MIB:.0f} MiB in {t1 - t0:.2f} s")

    def fdatasync_probe(self, n):
        """Seconds of each of `n` fdatasync calls after a 4 KiB pwrite, on a file beside the pools."""
        path = self.path("flush-probe")
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        lat = []
        for i in range(n):
            os.pwrite(fd, os.urandom(4096), (i % 64) * 4096)
            t = time.perf_counter()
            os.fdatasync(fd)
            lat.append(time.perf_counter() - t)
        os.close(fd)
        os.unlink(path)
        return lat

    def exp3_foreground_latency(self):
        p = self.p
        size = p["size2"]
        # Reference: what one device flush costs on this filesystem now; every
        # arbor management operation commits, and a commit flushes the device twice.
        self.record(exp=3, kind="fdatasync_probe", seconds=self.fdatasync_probe(max(20, p["cli_n"])))
        for mode, durability in SNAPSHOT_LOADS:
            r, snap_lat = self.snapshot_load_row("exp3", None, size, "4K randwrite QD1", mode, durability)
            self.record(exp=3, kind="foreground_latency", mode=mode, snapshots_taken=len(snap_lat),
                        snapshot_api_s=snap_lat, **r)
            log(f"exp3 fg latency, {mode}: p50 {r['lat_p50_us']:.0f} µs p99 {r['lat_p99_us']:.0f} µs "
                f"max {r['lat_max_us']:.0f} µs ({len(snap_lat)} snapshots)")

    def snapshot_load_row(self, name, io, size, job, mode, durability):
        """One row of a snapshots-under-load table: `job` for `lat_runtime`
        on a fully written volume of a fresh daemon (`io`: its I/O mode,
        None for the default), with snapshots as `mode` and `durability`
        say. Each row gets a new pool: one that ran an earlier row has its
        data scattered by that row's redirects, which slows the next row by
        10-30 % (measured), whatever it does. Returns fio's figures and the
        snapshot API latencies."""
        ab = self.arbor(name, size * 16 + GIB, io=io)
        ab.volume_create("v", size)
        fio(("nbd", ab.uri("v")), "write", "1m", 8, size, end_fsync=True)
        if mode == OTHER_VOLUME:
            ab.volume_create("w", 64 * MIB)
            fio(("nbd", ab.uri("w")), "write", "1m", 8, 64 * MIB, end_fsync=True)
        prefix = "w@s" if mode == OTHER_VOLUME else "v@s"
        with Snapper(ab, prefix, mode != "no snapshots", durability) as snapper:
            r = self.timed_fio(("nbd", ab.uri("v")), job, size, server_pid=ab.pid,
                               runtime=self.p["lat_runtime"], randommap=False)
        ab.stop()
        shutil.rmtree(ab.workdir, ignore_errors=True)
        return r, snapper.latencies

    # ---------------------------------------------------------------- exp 4
    def exp4_cow_row(self):
        """Copy-on-write (volumes created with layout cow, and an origin: a raw
        file attached in place) against redirect-on-write (thin) volumes."""
        self.record(exp=4, kind="fdatasync_probe", seconds=self.fdatasync_probe(50))
        self.exp4_write_ratio()
        self.exp4_reads_after_updates()
        self.exp4_origin()

    def exp4_write_ratio(self):
        """Paper 002 figs 6-8: mean response time of random 4 KiB I/O at QD1
        against the write ratio, one row and one cow volume per chunk size,
        each with exactly one snapshot, taken right before each point."""
        p = self.p
        size, rt = p["size4"], p["runtime4"]
        for chunk in p["chunks4"]:
            # room for both volumes and one snapshot's old chunks each
            ab = self.arbor(f"exp4-{chunk}", size * 4 + GIB, chunk_size=chunk)
            for layout in ("row", "cow"):
                ab.volume_create(layout, size, layout=layout)
                fio(("nbd", ab.uri(layout)), "write", "1m", 8, size)
            prev = None
            for i, ratio in enumerate(p["ratios4"]):
                for layout in (("row", "cow") if i % 2 == 0 else ("cow", "row")):
                    if prev is not None:
                        ab.destroy(f"{layout}@w{prev}")
                        ab.wait_reclaimed()
                    ab.snapshot(f"{layout}@w{ratio}")
                    r = self.timed_fio(("nbd", ab.uri(layout)), ("randrw", "4k", 1), size, server_pid=ab.pid,
                                       runtime=rt, randommap=False, end_fsync=True, seed=4,
                                       extra=[f"--rwmixwrite={ratio}"])
                    rd, wr = r["read"], r["write"]
                    n = rd["ios"] + wr["ios"]
                    mean = (rd["ios"] * rd["lat_mean_us"] + wr["ios"] * wr["lat_mean_us"]) / max(n, 1)
                    self.record(exp=4, kind="write_ratio", chunk=chunk, layout=layout, write_pct=ratio,
                                volume=size, mean_us=mean, **r)
                    log(f"exp4 chunk {chunk:3} {layout} {ratio:3}% writes: mean {mean:7.1f} µs "
                        f"(read p99 {rd['lat_p99_us']:.0f} µs, write p99 {wr['lat_p99_us']:.0f} µs, {n} I/Os)"
                        f"{'  (busy)' if r['busy'] else ''}")
                prev = ratio
            ab.stop()
            shutil.rmtree(ab.workdir, ignore_errors=True)

    def drop_caches(self):
        """Writes back dirty pages and empties the host page cache (root only)."""
        os.sync()
        try:
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3")
            return True
        except OSError as e:
            log(f"cannot drop the page cache ({e}): reads are warm")
            return False

    def exp4_reads_after_updates(self):
        """Sequential reads with a cold page cache of a row and a cow volume, before
        and after random 4 KiB writes (after a snapshot) over half the volume:
        the row volume's chunks end up scattered in the pool, the cow volume's stay
        in place (paper 002: COW keeps the origin contiguous)."""
        p = self.p
        size = p["size4"]
        ab = self.arbor("exp4-seq", size * 4 + GIB)
        layouts = ("row", "cow")
        for layout in layouts:
            ab.volume_create(layout, size, layout=layout)
            fio(("nbd", ab.uri(layout)), "write", "1m", 8, size)

        def reads(state):
            for rep in range(p["repeats4"]):
                for layout in (layouts if rep % 2 == 0 else layouts[::-1]):
                    cold = self.drop_caches()
                    r = self.timed_fio(("nbd", ab.uri(layout)), "1M seqread QD8", size, server_pid=ab.pid)
                    self.record(exp=4, kind="seqread", state=state, layout=layout, chunk="16K", volume=size,
                                cold=cold, run=rep, **r)
                    log(f"exp4 seqread {state:15} {layout}: {r['mib_s']:7.1f} MiB/s{' (cold)' if cold else ''}"
                        f"{'  (busy)' if r['busy'] else ''}")
        reads("before updates")
        for layout in layouts:
            ab.snapshot(f"{layout}@s")
            r = self.timed_fio(("nbd", ab.uri(layout)), "4K randwrite QD32", size, server_pid=ab.pid,
                               io_size=size // 2, seed=7)
            self.record(exp=4, kind="updates", layout=layout, chunk="16K", volume=size, io_size=size // 2, **r)
            log(f"exp4 updates {layout}: {r['iops']:.0f} IOPS over {human(size // 2)} ({r['wall_s']:.1f} s)")
        reads("after updates")
        ab.stop()
        shutil.rmtree(ab.workdir, ignore_errors=True)

    def exp4_origin(self):
        """A raw file attached as an origin: its reads against `nbdkit file` on the
        same file, then its write rate against the number of snapshots held."""
        p = self.p
        size = p["size4"]
        raw = self.path("origin.raw")
        fill_file(raw, size)
        # every measured job after a snapshot may copy the whole volume, which that snapshot keeps
        measured = len(p["marks4"]) * (p["repeats4"] + 1)
        ab = self.arbor("exp4-origin", size * (measured + 4) + GIB)
        ab.origin_attach("o", raw)
        self.exp4_origin_reads(ab, raw)
        held = self.exp4_origin_snapshots(ab)
        t0 = time.time()
        for i in range(1, held + 1):
            ab.destroy(f"o@s{i}")
        t1 = time.time()
        ab.wait_reclaimed(300)
        t2 = time.time()
        ab.origin_detach("o")
        self.record(exp=4, kind="origin_destroy", snapshots=held, destroy_s=t1 - t0, reclaim_s=t2 - t1,
                    **self.busy.window(t0, t2))
        log(f"exp4 origin: {held} snapshots destroyed in {t1 - t0:.1f} s, reclaimed {t2 - t1:.1f} s later; detached")
        ab.stop()
        shutil.rmtree(ab.workdir, ignore_errors=True)
        os.unlink(raw)

    def exp4_origin_reads(self, ab, raw):
        p = self.p
        size, rt = p["size4"], p["runtime4"]
        with open(raw, "rb") as f:  # warm page cache for both: the same file
            while f.read(8 * MIB):
                pass
        srv = nbdkit(self.path("peer.sock"), "file", raw)
        systems = {"arbor origin": (("nbd", ab.uri("o")), ab.pid), "nbdkit file": (("nbd", srv.uri()), srv.pid)}
        names = list(systems)
        try:
            for rep in range(p["repeats4"]):
                for j, job in enumerate(("4K randread QD1", "4K randread QD32", "1M seqread QD8")):
                    for system in (names if (rep + j) % 2 == 0 else names[::-1]):
                        tgt, pid = systems[system]
                        r = self.timed_fio(tgt, job, size, server_pid=pid, runtime=rt)
                        self.record(exp=4, kind="origin_read", system=system, job=job, run=rep, **r)
                        log(f"exp4 origin read {job:17} {system:13} {r['iops']:9.0f} IOPS {r['mib_s']:8.1f} MiB/s"
                            f"{'  (busy)' if r['busy'] else ''}")
        finally:
            srv.stop()

    def exp4_origin_snapshots(self, ab):
        """Paper 001 figs 7-8 on an origin: 4 KiB random writes (each run right
        after its own new snapshot) and 1 MiB sequential writes at each count of
        snapshots held. Returns the number of snapshots taken."""
        import nbd
        p = self.p
        size, rt = p["size4"], p["runtime4"]
        rng = random.Random(4)
        h = nbd.NBD()
        h.connect_uri(ab.uri("o"))
        held = 0
        jobs = ["4K randwrite QD32"] * p["repeats4"] + ["1M seqwrite QD8"]
        for mark in p["marks4"]:
            t0 = time.time()
            while held < mark - 1:
                self.random_writes_nbd(h, size, p["writes_between"], rng)
                held += 1
                ab.snapshot(f"o@s{held}")
            self.random_writes_nbd(h, size, p["writes_between"], rng)
            h.flush()
            log(f"exp4 origin: {held} snapshots held ({time.time() - t0:.1f} s to take them)")
            for job in jobs:
                if mark:
                    held += 1
                    ab.snapshot(f"o@s{held}")  # the measured writes are first writes after a snapshot
                r = self.timed_fio(("nbd", ab.uri("o")), job, size, server_pid=ab.pid, runtime=rt)
                self.record(exp=4, kind="origin_snapshots", snapshots=held, mark=mark, job=job, **r)
                log(f"exp4 origin {held:5} snaps {job:18} {r['iops']:9.0f} IOPS {r['mib_s']:8.1f} MiB/s"
                    f"{'  (busy)' if r['busy'] else ''}")
        h.shutdown()
        return held

    # ---------------------------------------------------------------- exp 5
    def exp5_chunk_size(self):
        p = self.p
        size, io = p["size5"], p["io5"]
        for chunk in ("4K", "16K", "64K", "256K", "1M"):
            ab = self.arbor(f"exp5-{chunk}", size * 3 + GIB, chunk_size=chunk)
            base = ab.status()
            ab.volume_create("v", size)
            t0 = time.time()
            r1 = fio(("nbd", ab.uri("v")), "randwrite", "4k", 32, size, io_size=io, seed=5)
            s1 = ab.status()
            # then every block written, a snapshot, and the same random writes: each
            # first write to a shared chunk allocates (and fills) a new chunk
            fio(("nbd", ab.uri("v")), "write", "1m", 8, size)
            s1b = ab.status()
            ab.snapshot("v@s")
            r2 = fio(("nbd", ab.uri("v")), "randwrite", "4k", 32, size, io_size=io, seed=6)
            s2 = ab.status()
            t1 = time.time()
            d1 = s1["data_used_bytes"] - base["data_used_bytes"]
            d2 = s2["data_used_bytes"] - s1b["data_used_bytes"]
            m1 = s1["metadata_used_bytes"] - base["metadata_used_bytes"]
            rec = self.record(exp=5, chunk=chunk, volume=size, client_bytes=io,
                              fresh_allocated=d1, fresh_efficiency=io / d1 if d1 else None,
                              snap_allocated=d2, snap_efficiency=io / d2 if d2 else None,
                              metadata_bytes=m1, metadata_per_gib_mapped=m1 / (d1 / GIB) if d1 else None,
                              fresh_iops=r1["iops"], snap_iops=r2["iops"], **self.busy.window(t0, t1))
            log(f"exp5 chunk {chunk:5}: efficiency fresh {rec['fresh_efficiency']:.3f} after snapshot "
                f"{rec['snap_efficiency']:.3f}, metadata {rec['metadata_per_gib_mapped'] / KIB:.0f} KiB/GiB mapped")
            ab.stop()
            shutil.rmtree(ab.workdir, ignore_errors=True)

    # ---------------------------------------------------------------- exp 6
    def exp6_footprint(self):
        import nbd
        p = self.p
        size, rt = p["size6"], p["runtime"]
        for cache in (None, "4M"):
            ab = self.arbor("exp6", size * 8 + GIB, cache_size=cache)
            t0 = time.time()
            ab.volume_create("v", size)
            fio(("nbd", ab.uri("v")), "write", "1m", 8, size)
            h = nbd.NBD()
            h.connect_uri(ab.uri("v"))
            rng = random.Random(6)
            for i in range(p["snaps6"]):
                self.random_writes_nbd(h, size, p["writes_between"], rng)
                ab.snapshot(f"v@s{i}")
            h.flush()
            h.shutdown()
            rr = fio(("nbd", ab.uri("v")), "randread", "4k", 32, size, runtime=rt)
            rw = fio(("nbd", ab.uri("v")), "randwrite", "4k", 32, size, runtime=rt)
            st = ab.status()
            mapped = st["data_used_bytes"]
            rec = self.record(exp=6, cache=cache or "default", volume=size, snapshots=p["snaps6"],
                              peak_rss=ab.peak_rss_bytes(), metadata_used=st["metadata_used_bytes"],
                              data_used=mapped, metadata_per_gib=st["metadata_used_bytes"] / (mapped / GIB),
                              randread_iops=rr["iops"], randwrite_iops=rw["iops"],
                              **self.busy.window(t0, time.time()))
            log(f"exp6 cache {cache or 'default'}: peak RSS {rec['peak_rss'] / MIB:.1f} MiB, "
                f"metadata {rec['metadata_per_gib'] / KIB:.0f} KiB/GiB, randread {rr['iops']:.0f} IOPS")
            ab.stop()
            shutil.rmtree(ab.workdir, ignore_errors=True)

    # ---------------------------------------------------------------- exp 7
    def exp7_cache_modes(self):
        """Direct I/O (no host page cache) side by side: the data path of arbor
        --io direct against peers in the same cache mode, and snapshots under a
        write load with arbor's two modes."""
        p = self.p
        size, rt = p["size1"], p["runtime"]
        self.record(exp=7, kind="fdatasync_probe", seconds=self.fdatasync_probe(50))
        full_raw = self.path("direct.raw")
        fill_file(full_raw, size)
        sock = self.path("peer.sock")
        arbors = {mode: self.arbor(f"exp7-{mode}", size * 16 + GIB, io=mode) for mode in ("direct", "buffered")}
        for ab in arbors.values():
            ab.volume_create("full", size)
            fio(("nbd", ab.uri("full")), "write", "1m", 8, size, end_fsync=True)

        def target(system):
            if system == "file (fio psync, O_DIRECT)":
                return ("file", full_raw), None, lambda: None, ["--direct=1"]
            if system == "nbdkit file cache=none":
                srv = nbdkit(sock, "file", full_raw, "cache=none")
                return ("nbd", srv.uri()), srv.pid, srv.stop, []
            if system == "qemu-nbd raw cache=none io_uring":
                srv = qemu_nbd(sock, full_raw, "raw", cache="none", aio="io_uring")
                return ("nbd", srv.uri()), srv.pid, srv.stop, []
            ab = arbors["direct" if system == "arbor direct" else "buffered"]
            return ("nbd", ab.uri("full")), ab.pid, lambda: None, []

        for job in [j for j in JOBS if j != FIRST_WRITES]:
            for system in EXP7_SYSTEMS:
                self.drop_caches()
                tgt, pid, cleanup, extra = target(system)
                try:
                    r = self.timed_fio(tgt, job, size, server_pid=pid, runtime=rt, extra=extra)
                finally:
                    cleanup()
                self.record(exp=7, kind="data_path", job=job, system=system, **r)
                log(f"exp7 {job:20} {system:34} {r['iops']:9.0f} IOPS {r['mib_s']:8.1f} MiB/s"
                    f"{'  (busy)' if r['busy'] else ''}")
        os.unlink(full_raw)
        for ab in arbors.values():
            ab.stop()
            shutil.rmtree(ab.workdir, ignore_errors=True)
        # Snapshots while one client writes at full speed, each mode.
        for mode in arbors:
            for job in ("4K randwrite QD1", "4K randwrite QD32"):
                for snaps, durability in SNAPSHOT_LOADS:
                    r, snap_lat = self.snapshot_load_row("exp7-load", mode, size, job, snaps, durability)
                    self.record(exp=7, kind="snapshots_under_load", mode=mode, job=job, snaps=snaps,
                                snapshot_api_s=snap_lat, **r)
                    med = f"{statistics.median(snap_lat) * 1e3:.1f} ms" if snap_lat else "-"
                    log(f"exp7 {mode:8} {job} {snaps:18}: write p50 {r['lat_p50_us']:.0f} µs p99 "
                        f"{r['lat_p99_us']:.0f} µs, {r['iops']:.0f} IOPS; snapshot API median {med} "
                        f"({len(snap_lat)})")

    # ---------------------------------------------------------------- exp 8
    def exp8_many_clients(self):
        """Several clients at once, each its own NBD connection: the aggregate
        rate against one client, and against nbdkit serving the same clients;
        arbor with every client on one volume, and with each client on its own
        clone of one snapshot (VMs or CI jobs started from one image)."""
        p = self.p
        size, rt, counts = p["size1"], p["runtime"], p["clients8"]
        log(f"exp8: preparing {human(size)} exports")
        raw = self.path("clients.raw")
        fill_file(raw, size)
        mem = nbdkit(self.path("memory.sock"), "memory", str(size))
        fio(("nbd", mem.uri()), "write", "1m", 8, size)
        nfile = nbdkit(self.path("file.sock"), "file", raw)
        # room for both volumes and every clone rewriting each of its chunks once
        ab = self.arbor("exp8", size * (max(counts) + 2) + GIB)
        # the shared volume is never snapshotted: its writes go in place, as nbdkit's do
        for vol in ("shared", "image"):
            ab.volume_create(vol, size)
            fio(("nbd", ab.uri(vol)), "write", "1m", 8, size, end_fsync=True)
        ab.snapshot("image@base")
        os.sync()  # no writeback of the fills during the first runs
        clones = []

        def fresh_clones(n):
            """n new clones of image@base, so that every run starts from the same
            state: reads all share the image's chunks, writes are first writes."""
            for name in clones:
                ab.destroy(name, force=True)  # fio has exited, but the daemon may not have seen every close yet
            ab.wait_reclaimed()  # no reclaim during the next run
            clones[:] = [f"c{i}" for i in range(n)]
            for name in clones:
                ab.clone("image@base", name)
            return [ab.uri(name) for name in clones]

        def target(system, n):
            """(one URI per client, server pid)"""
            if system == "nbdkit memory":
                return [mem.uri()] * n, mem.pid
            if system == "nbdkit file":
                return [nfile.uri()] * n, nfile.pid
            if system == "arbor":
                return [ab.uri("shared")] * n, ab.pid
            return fresh_clones(n), ab.pid

        for job, (rw, bs, qd) in EXP8_JOBS.items():
            for n in counts:
                for system in EXP8_SYSTEMS:
                    uris, pid = target(system, n)
                    os.sync()  # what the previous run left dirty is not written back during this one
                    # several clients write the same export at random: no map can keep them apart
                    r = self.timed_fio(("nbd", uris), (rw, bs, qd), size, server_pid=pid, runtime=rt,
                                       randommap=False)
                    self.record(exp=8, kind="clients", job=job, system=system, clients=n, **r)
                    log(f"exp8 {job:24} {n:3} clients {system:22} {r['iops']:9.0f} IOPS {r['mib_s']:8.1f} MiB/s, "
                        f"cores busy: server {r['server_cores']:.2f}, clients {r['client_cores']:.2f}, "
                        f"machine {r['machine_cores']:.2f}{'  (busy)' if r['busy'] else ''}")
        for server in (mem, nfile, ab):
            server.stop()
        shutil.rmtree(ab.workdir, ignore_errors=True)
        os.unlink(raw)

    # ---------------------------------------------------------------- engine-bench
    def engine_bench(self):
        argv = ["cargo", "run", "--release", "--locked", "-q", "-p", "arbor-bench", "--bin", "engine-bench", "--",
                "--dir", self.path("engine")]
        if self.args.profile == "quick":
            argv.append("--quick")
        t0 = time.time()
        out = subprocess.run(argv, cwd=ROOT, check=True, capture_output=True, text=True).stdout
        with open(os.path.join(self.out, "engine.md"), "w") as f:
            f.write(out)
        self.record(exp=3, kind="engine_bench", seconds=time.time() - t0, **self.busy.window(t0, time.time()))
        shutil.rmtree(self.path("engine"), ignore_errors=True)

    # ---------------------------------------------------------------- driver
    def meta(self):
        def cmd(*a):
            try:
                return subprocess.run(a, capture_output=True, text=True).stdout.strip().splitlines()[0]
            except (OSError, IndexError):
                return None
        cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
        fs = subprocess.run(["stat", "-f", "-c", "%T", self.work], capture_output=True, text=True).stdout.strip()
        return {
            "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "profile": self.args.profile, "params": self.p, "cpus": os.cpu_count(), "cpu": cpu,
            "kernel": platform.release(), "filesystem": fs, "workdir": self.work,
            "mem_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB, 1),
            "fio": cmd("fio", "--version"), "nbdkit": cmd("nbdkit", "--version"),
            "qemu": cmd("qemu-nbd", "--version"),
            "arbor_commit": cmd("git", "-C", ROOT, "rev-parse", "--short", "HEAD"),
            "command": " ".join(sys.argv),
        }

    def main(self):
        meta = self.meta()
        t_start = time.time()
        steps = [("exp1", self.exp1_data_path), ("exp2", self.exp2_many_snapshots),
                 ("exp3", self.exp3_foreground_latency), ("exp4", self.exp4_cow_row),
                 ("exp5", self.exp5_chunk_size), ("exp6", self.exp6_footprint),
                 ("exp7", self.exp7_cache_modes), ("exp8", self.exp8_many_clients)]
        if self.args.engine:
            steps.append(("engine", self.engine_bench))
        only = set(self.args.only.split(",")) if self.args.only else None
        timings = {}
        try:
            for name, fn in steps:
                if only and name not in only:
                    continue
                t0 = time.time()
                fn()
                timings[name] = {"seconds": time.time() - t0, **self.busy.window(t0, time.time())}
                log(f"{name} done in {timings[name]['seconds']:.0f} s")
        finally:
            meta["seconds"] = time.time() - t_start
            meta["steps"] = timings
            meta["busy_overall"] = self.busy.window(t_start, time.time())
            self.busy.stop_flag.set()
            for server in STARTED:
                server.stop()
            with open(os.path.join(self.out, "results.json"), "w") as f:
                json.dump({"meta": meta, "records": self.records}, f, indent=1)
            shutil.rmtree(self.work, ignore_errors=True)
        self.perf_text()
        import report
        report.write(self.out)
        log(f"results in {self.out}")

    def perf_text(self):
        for name, data in self.perf_reports.items():
            with open(os.path.join(self.out, f"perf-{name}.txt"), "w") as f:
                for title, opts in (("self time by symbol", ["--no-children", "--percent-limit", "1.5"]),
                                    ("inclusive time (with callees) by symbol", ["--children", "--percent-limit", "4"])):
                    out = subprocess.run(["perf", "report", "-i", data, "--stdio", "--sort", "symbol", "-g", "none",
                                          *opts], capture_output=True, text=True).stdout
                    lines = [ln.rstrip()[:140] for ln in out.splitlines() if ln.strip() and not ln.startswith("#")]
                    f.write(f"## {title}\n\n" + "\n".join(lines) + "\n\n")
            os.unlink(data)


def ensure_tools(install):
    need = {"fio": "fio", "qemu-nbd": "qemu-utils", "nbdkit": "nbdkit", "nbdinfo": "libnbd-bin"}
    pkgs = [pkg for tool, pkg in need.items() if not shutil.which(tool)]
    try:
        import nbd  # noqa: F401
    except ImportError:
        pkgs.append("python3-libnbd")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        pkgs.append("python3-matplotlib")
    if pkgs:
        if not install or os.geteuid() != 0:
            sys.exit(f"missing Debian packages: {' '.join(pkgs)} (run as root, or install them)")
        log(f"installing {' '.join(pkgs)}")
        subprocess.run(["apt-get", "update"], check=True, capture_output=True)
        subprocess.run(["apt-get", "install", "-y", *pkgs], check=True, capture_output=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", choices=PROFILES, default="quick")
    ap.add_argument("--arbor", default=os.path.join(ROOT, "target/release/arbor"))
    ap.add_argument("--workdir", default="/var/tmp", help="filesystem every system's files live on")
    ap.add_argument("--out", help="results directory (default bench/results/PROFILE-TIME)")
    ap.add_argument("--only", help="comma-separated steps: exp1,exp2,exp3,exp4,exp5,exp6,exp7,exp8,engine")
    ap.add_argument("--engine", action=argparse.BooleanOptionalAction, default=None,
                    help="also run engine-bench (default: full profile only)")
    ap.add_argument("--perf", action=argparse.BooleanOptionalAction, default=True,
                    help="sample arbor with perf record during some exp1 jobs (if perf works)")
    ap.add_argument("--no-install", action="store_true")
    args = ap.parse_args()
    if args.engine is None:
        args.engine = args.profile == "full"
    if args.perf:
        ok = shutil.which("perf") and subprocess.run(["perf", "record", "-o", "/dev/null", "true"],
                                                     capture_output=True).returncode == 0
        args.perf = bool(ok)
    ensure_tools(not args.no_install)
    if not os.access(args.arbor, os.X_OK):
        sys.exit(f"{args.arbor} missing: cargo build --release -p arbor")
    Bench(args).main()


if __name__ == "__main__":
    main()
