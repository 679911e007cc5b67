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
        for target in counts:
            while held < target:
                for _ in range(16):
                    handle.pwrite(rng.randbytes(4096), rng.randrange(CHUNKS_4K) * 4096)
                handle.flush()
                cli("snapshot", "create", f"v@s{held}")
                held += 1
            print(f"{target:5} snapshots held: {fio_randwrite(uri):8.0f} IOPS", flush=True)
        handle.shutdown()
    finally:
        server.terminate()
        server.wait()
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
