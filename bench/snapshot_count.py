#!/usr/bin/python3
"""Does write throughput depend on the number of snapshots held, or only on
having just taken one? (docs/PERFORMANCE.md, experiment 2, follow-up.)

    /usr/bin/python3 bench/snapshot_count.py ARBOR_BINARY COUNTS

COUNTS is a comma-separated list, e.g. 0,0,1,1,1000,1000: for each entry,
snapshots are taken (16 random 4 KiB writes and a flush before each) until
that many are held, then fio's nbd engine runs 4 KiB random writes at QD32
for 4 s on the 256 MiB volume. A count repeated is measured again without a
new snapshot, so the second figure is steady state and the first one pays
for unsharing the volume's chunks after the latest snapshot.

Each line also shows the pass's chunk writes by plan, its commits and
intent log records (the
daemon's metrics, read before and after). With PERF_AT=N, the first pass
at N snapshots runs under `perf record -g` (or PERF_ARGS) on the daemon; the profile is
left in PERF_OUT (default /var/tmp/arbor-snapcount.perf.data).

With EACH_PASS=1, every pass after the first at a count (or at a count
already held) runs right after a snapshot of its own, as bench.py's
experiment 2 does: a repeated count is then another first pass, over the
chunks the pass before it left partial.
"""

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

import nbd

VOLUME_SIZE = "256M"
CHUNKS_4K = (256 << 20) // 4096


def fio_randwrite(uri):
    out = subprocess.run(
        ["fio", "--name=j", "--ioengine=nbd", f"--uri={uri}", "--rw=randwrite", "--bs=4k",
         "--iodepth=32", f"--size={VOLUME_SIZE}", "--time_based", "--runtime=4",
         "--randrepeat=1", "--end_fsync=1", "--output-format=json"],
        capture_output=True, text=True, check=True).stdout
    return json.loads(out[out.index("{"):])["jobs"][0]["write"]["iops"]


def metrics(sock):
    """The daemon's counters this probe reads: chunk writes by plan, commits."""
    text = subprocess.run(["curl", "-s", "--unix-socket", sock, "http://arbor/metrics"],
                          capture_output=True, text=True, check=True).stdout
    out = {}
    for line in text.splitlines():
        if line.startswith("arbor_chunk_writes_total{plan="):
            out[line.split('"')[1]] = float(line.split()[-1])
        elif line.startswith("arbor_commit_duration_seconds_count"):
            out["commits"] = float(line.split()[-1])
        elif line.startswith("arbor_intent_log_records_total"):
            out["log_records"] = float(line.split()[-1])
        elif line.startswith("arbor_commit_duration_seconds_sum"):
            out["commit_ms"] = float(line.split()[-1]) * 1000
    return out


def delta(before, after):
    return " ".join(f"{k}={after[k] - before.get(k, 0):.0f}" for k in sorted(after)
                    if after[k] - before.get(k, 0))


def main():
    binary, counts = sys.argv[1], [int(c) for c in sys.argv[2].split(",")]
    work = tempfile.mkdtemp(prefix="arbor-snapcount-", dir="/var/tmp")
    data = os.path.join(work, "data")
    server = subprocess.Popen(
        [binary, "serve", "--data-dir", data, "--pool-size", "8G", "--initial-volume", "none",
         "--nbd-listen", "none", "--api-listen", "none"],
        stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, "serve.log"), "w"))
    try:
        for _ in range(200):
            if os.path.exists(f"{data}/api.sock") and os.path.exists(f"{data}/nbd.sock"):
                break
            time.sleep(0.05)

        def cli(*args):
            subprocess.run([binary, "--data-dir", data, *args], check=True,
                           stdout=subprocess.DEVNULL)

        cli("volume", "create", "v", "--size", VOLUME_SIZE)
        uri = f"nbd+unix:///v?socket={data}/nbd.sock"
        subprocess.run(["fio", "--name=fill", "--ioengine=nbd", f"--uri={uri}", "--rw=write",
                        "--bs=1M", "--iodepth=8", f"--size={VOLUME_SIZE}", "--end_fsync=1"],
                       stdout=subprocess.DEVNULL, check=True)
        handle = nbd.NBD()
        handle.connect_uri(uri)
        rng = random.Random(1)
        held = 0
        profiled = set()
        passes = {}
        for target in counts:
            while held < target:
                for _ in range(16):
                    handle.pwrite(rng.randbytes(4096), rng.randrange(CHUNKS_4K) * 4096)
                handle.flush()
                cli("snapshot", "create", f"v@s{held}")
                held += 1
            if os.environ.get("EACH_PASS") == "1" and held and passes.get(target):
                cli("snapshot", "create", f"v@s{held}")
                held += 1
            passes[target] = passes.get(target, 0) + 1
            before = metrics(f"{data}/api.sock")
            perf = None
            if os.environ.get("PERF_AT") == str(target) and str(target) not in profiled:
                profiled.add(str(target))
                perf = subprocess.Popen(
                    ["perf", "record", *os.environ.get("PERF_ARGS", "-g").split(), "-p",
                     str(server.pid), "-o",
                     os.environ.get("PERF_OUT", "/var/tmp/arbor-snapcount.perf.data"),
                     "--", "sleep", "4"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            iops = fio_randwrite(uri)
            if perf:
                perf.wait()
            after = metrics(f"{data}/api.sock")
            print(f"{held:5} snapshots held: {iops:8.0f} IOPS  {delta(before, after)}", flush=True)
        handle.shutdown()
    finally:
        server.terminate()
        server.wait()
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
