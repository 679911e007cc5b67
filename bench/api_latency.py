#!/usr/bin/python3
"""Snapshot API latency under a 4 KiB QD32 direct write load, as the
bench's client makes calls (a new connection each) and over one kept-alive
connection: a deferred snapshot of the written volume `v` and of another
volume `w`, every 0.2 s, in rotated order. Prints median, p90 and max of
each. Run it alternately on two binaries to compare them (PERFORMANCE.md
§ 11, "One hand-off fewer").

    /usr/bin/python3 bench/api_latency.py BINARY [SECONDS] [WORKDIR]
"""
import json
import os
import shutil
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench as B  # noqa: E402
from arbor_adapter import Arbor, _UnixHTTPConnection  # noqa: E402


def main():
    binary = sys.argv[1]
    seconds = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    work = sys.argv[3] if len(sys.argv) > 3 else "/var/tmp/arbor-api-latency"
    shutil.rmtree(work, ignore_errors=True)
    ab = Arbor(binary, work, 9 * B.GIB, io="direct").start()
    try:
        ab.volume_create("v", 512 * B.MIB)
        ab.volume_create("w", 64 * B.MIB)
        B.fio(("nbd", ab.uri("v")), "write", "1m", 8, 512 * B.MIB, end_fsync=True)
        B.fio(("nbd", ab.uri("w")), "write", "1m", 8, 64 * B.MIB, end_fsync=True)
        conn = _UnixHTTPConnection(ab.api_sock)

        def kept_alive(name):
            body = json.dumps({"name": name, "durability": "deferred"}).encode()
            conn.request("POST", "/v1/snapshots", body=body, headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            text = response.read()
            if response.status >= 300:
                raise RuntimeError(f"snapshot {name}: {response.status} {text}")

        times = {"v, new connection": [], "v, kept alive": [], "w, new connection": [], "w, kept alive": []}
        stop = threading.Event()

        def calls():
            i = 0
            while not stop.wait(0.2):
                i += 1
                batch = [
                    ("v, new connection", lambda: ab.snapshot(f"v@n{i}", "deferred")),
                    ("v, kept alive", lambda: kept_alive(f"v@k{i}")),
                    ("w, new connection", lambda: ab.snapshot(f"w@n{i}", "deferred")),
                    ("w, kept alive", lambda: kept_alive(f"w@k{i}")),
                ]
                for key, call in batch[i % 4:] + batch[:i % 4]:
                    t = time.perf_counter()
                    call()
                    times[key].append(time.perf_counter() - t)

        caller = threading.Thread(target=calls)
        caller.start()
        try:
            B.fio(("nbd", ab.uri("v")), "randwrite", "4k", 32, 512 * B.MIB, runtime=seconds, randommap=False)
        finally:
            stop.set()
            caller.join()
        for key, values in times.items():
            values.sort()
            print(f"{key:18} n={len(values)} median {statistics.median(values) * 1e3:.2f} ms"
                  f"  p90 {values[int(len(values) * 0.9)] * 1e3:.2f}  max {values[-1] * 1e3:.2f}")
    finally:
        ab.stop()


if __name__ == "__main__":
    main()
