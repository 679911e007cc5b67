#!/usr/bin/python3
"""NBD benchmark: arbor against `nbdkit file` and `qemu-nbd` serving the same
raw image, in one run, with fio's nbd engine, over a Unix socket and over TCP.

Prints a markdown report with ratios (arbor / peer; above 1 = arbor faster).
Not a test: nothing passes or fails on these numbers.

    cargo build --release -p arbor
    /usr/bin/python3 bench/nbd_bench.py [--size 1G] [--runtime 8] [--quick]

Needs: fio (nbd engine), nbdkit, qemu-utils (Debian packages).
"""

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

JOBS = [
    # name, rw, block size, queue depth
    ("4K random read QD1", "randread", "4k", 1),
    ("4K random read QD32", "randread", "4k", 32),
    ("4K random write QD1", "randwrite", "4k", 1),
    ("4K random write QD32", "randwrite", "4k", 32),
    ("1M sequential read", "read", "1m", 8),
    ("1M sequential write", "write", "1m", 8),
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(path=None, port=None, timeout=20.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if path and os.path.exists(path):
                return
            if port:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"server did not come up ({path or port})")


def stop(proc):
    """Stops a server we started, by its PID."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def fio(uri, rw, bs, qd, size, runtime):
    out = subprocess.run(
        [
            "fio", "--name=bench", "--ioengine=nbd", f"--uri={uri}", f"--rw={rw}", f"--bs={bs}",
            f"--iodepth={qd}", f"--size={size}", f"--runtime={runtime}", "--time_based",
            "--ramp_time=1", "--output-format=json", "--randrepeat=1", "--norandommap",
        ],
        check=True, capture_output=True, text=True,
    ).stdout
    job = json.loads(out[out.index("{"):])["jobs"][0]
    side = job["read"] if rw in ("read", "randread") else job["write"]
    return side["iops"], side["bw_bytes"] / 2**20


def parse_size(text):
    units = {"K": 2**10, "M": 2**20, "G": 2**30}
    return int(text[:-1]) * units[text[-1].upper()] if text[-1].upper() in units else int(text)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="1G")
    ap.add_argument("--runtime", type=int, default=8)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--arbor", default=os.path.join(ROOT, "target/release/arbor"))
    args = ap.parse_args()
    if args.quick:
        args.size, args.runtime = "256M", 3
    for tool in ("fio", "nbdkit", "qemu-nbd"):
        if not shutil.which(tool):
            sys.exit(f"{tool} is missing (Debian packages: fio, nbdkit, qemu-utils)")
    size = parse_size(args.size)
    work = tempfile.mkdtemp(prefix="arbor-nbd-bench-", dir="/var/tmp")
    raw = os.path.join(work, "raw.img")
    pool = os.path.join(work, "arbor.pool")
    with open(raw, "wb") as f:
        for _ in range(size // 2**20):
            f.write(os.urandom(2**20))
    arbor = args.arbor
    subprocess.run([arbor, "pool", "create", pool, "--size", str(size * 2 + 2**30)], check=True)
    subprocess.run([arbor, "import", pool, "vol", raw], check=True)

    results = {}
    with ExitStack() as stack:
        servers = {}
        for name in ("arbor", "nbdkit", "qemu-nbd"):
            sock = os.path.join(work, f"{name}.sock")
            port = free_port()
            if name == "arbor":
                # One daemon listens on both transports.
                argvs = [[arbor, "serve", pool, "--nbd-socket", sock, "--nbd-tcp", f"127.0.0.1:{port}"]]
                export = "vol"
            elif name == "nbdkit":
                # nbdkit listens on a Unix socket or TCP, not both: two instances on the same file.
                base = ["nbdkit", "--foreground", "--exit-with-parent"]
                argvs = [base + ["-U", sock, "file", raw], base + ["-i", "127.0.0.1", "-p", str(port), "file", raw]]
                export = ""
            else:
                base = ["qemu-nbd", "--persistent", "--shared=64", "--cache=writeback", "--aio=threads", "-f", "raw", "-x", "bench"]
                argvs = [base + ["--socket", sock, raw], base + ["-b", "127.0.0.1", "-p", str(port), raw]]
                export = "bench"
            for argv in argvs:
                proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                stack.callback(stop, proc)
            wait_for(path=sock)
            wait_for(port=port)
            servers[name] = (f"nbd+unix:///{export}?socket={sock}", f"nbd://127.0.0.1:{port}/{export}")
        for label, rw, bs, qd in JOBS:
            for transport in ("unix", "tcp"):
                for name, (unix_uri, tcp_uri) in servers.items():
                    uri = unix_uri if transport == "unix" else tcp_uri
                    results[(label, transport, name)] = fio(uri, rw, bs, qd, size, args.runtime)

    print(f"# arbor NBD benchmark\n\nfio {subprocess.run(['fio', '--version'], capture_output=True, text=True).stdout.strip()}, "
          f"{args.size} image, {args.runtime}s per job, 2 cores. Same raw image for nbdkit (file plugin) and qemu-nbd "
          f"(cache=writeback, aio=threads); arbor serves a volume imported from it (16 KiB chunks, fully mapped).\n")
    print("| job | transport | arbor | nbdkit file | qemu-nbd | arbor / nbdkit | arbor / qemu-nbd |")
    print("|---|---|---|---|---|---|---|")
    for label, rw, bs, qd in JOBS:
        for transport in ("unix", "tcp"):
            a, n, q = (results[(label, transport, s)] for s in ("arbor", "nbdkit", "qemu-nbd"))
            metric = (lambda r: f"{r[0]:.0f} IOPS") if bs == "4k" else (lambda r: f"{r[1]:.0f} MiB/s")
            print(f"| {label} | {transport} | {metric(a)} | {metric(n)} | {metric(q)} | "
                  f"{a[0] / n[0]:.2f} | {a[0] / q[0]:.2f} |")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
