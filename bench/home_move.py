#!/usr/bin/python3
"""The pause a `--layout cow` volume's writes see while its home moves to
grow (`volume resize` with the chunks after its home taken): fio 4 KiB
random writes QD1 on the volume for SECONDS, with one resize in the middle
of the run, against the same run with no resize. Prints the write rate,
p99, p99.9 and max latency of each, and how long the resize took.

    /usr/bin/python3 bench/home_move.py BINARY [SIZE_MIB] [SECONDS]
"""
import os
import shutil
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench as B  # noqa: E402
from arbor_adapter import Arbor  # noqa: E402


def run(binary, size_mib, seconds, resize):
    work = "/var/tmp/arbor-home-move"
    shutil.rmtree(work, ignore_errors=True)
    ab = Arbor(binary, work, (4 * size_mib + 1024) * B.MIB).start()
    try:
        ab.volume_create("a", size_mib * B.MIB, layout="cow")
        # Its home right after a's: a grows by moving.
        ab.volume_create("b", 16 * B.MIB, layout="cow")
        took = []

        def grow():
            time.sleep(seconds / 3)
            t = time.perf_counter()
            subprocess.run([binary, "--data-dir", work, "volume", "resize", "a", f"{2 * size_mib}M"],
                           check=True, capture_output=True)
            took.append(time.perf_counter() - t)

        grower = threading.Thread(target=grow) if resize else None
        if grower:
            grower.start()
        r = B.fio(("nbd", ab.uri("a")), "randwrite", "4k", 1, size_mib * B.MIB, runtime=seconds,
                  randommap=False, end_fsync=False, extra=["--percentile_list=50:99:99.9:99.99"])
        if grower:
            grower.join()
        return r, took
    finally:
        ab.stop()


def main():
    binary = sys.argv[1]
    size_mib = int(sys.argv[2]) if len(sys.argv) > 2 else 1024
    seconds = int(sys.argv[3]) if len(sys.argv) > 3 else 15
    for resize in (False, True):
        r, took = run(binary, size_mib, seconds, resize)
        what = f"resize to {2 * size_mib} MiB in {took[0]:.2f} s" if took else "no resize"
        print(f"{what:32} {r['iops']:8.0f} IOPS  p99 {r['lat_p99_us']:7.0f} µs  "
              f"p99.9 {r['lat_p999_us']:7.0f} µs  max {r['lat_max_us'] / 1e3:8.1f} ms")


if __name__ == "__main__":
    main()
