#!/usr/bin/python3
"""Send and receive figures (docs/PERFORMANCE.md, "Send and receive"),
measured side by side with the peers in one run:

* time against change: `arbor send --from` of a 1%, 10% and 100% change of
  a volume, each next to `nbdcopy` of the whole snapshot (what a tool
  without changed-block tracking must read);
* throughput: a full send to /dev/null next to reading the same bytes out
  of arbor with `nbdcopy`; a receive (from a file) next to writing the
  same bytes into a volume with `nbdcopy`;
* compression: stream sizes of a filesystem image holding real files
  (/usr/share, a few hundred MiB of documentation, locales and data) for
  raw, zstd and best (zstd against the base), full and incremental;
* memory: the daemons' peak RSS (VmHWM) sending and receiving volumes of
  two sizes.

Usage: bench/send.py [--size 4G] [--workdir /var/tmp] [--json FILE]
(needs target/release/arbor; bench/send.sh builds it). Writes a markdown
report on stdout. Every server it starts listens on a Unix socket in its
work directory and is stopped by its PID.
"""

import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARBOR = os.environ.get("ARBOR_BIN", os.path.join(ROOT, "target", "release", "arbor"))
MIB = 1 << 20
GIB = 1 << 30


def sh(*argv, **kw):
    return subprocess.run([str(a) for a in argv], check=True, capture_output=True, text=True, **kw)


class Daemon:
    def __init__(self, work, name, pool_size):
        self.dir = os.path.join(work, name)
        os.makedirs(self.dir)
        self.nbd = os.path.join(self.dir, "nbd.sock")
        self.api = os.path.join(self.dir, "api.sock")
        self.proc = subprocess.Popen(
            [ARBOR, "serve", "--data-dir", self.dir, "--pool-size", pool_size,
             "--initial-volume", "none", "--nbd-listen", "none", "--api-listen", "none",
             "--reclaim-rate", "0"],
            stdout=open(os.path.join(self.dir, "log"), "w"), stderr=subprocess.STDOUT,
        )
        for _ in range(300):
            try:
                s = socket.socket(socket.AF_UNIX)
                s.connect(self.api)
                s.close()
                if os.path.exists(self.nbd):
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError("arbor serve did not start")

    def cli(self, *args):
        return sh(ARBOR, "--data-dir", self.dir, *args).stdout

    def uri(self, export):
        return f"nbd+unix:///{export}?socket={self.nbd}"

    def status(self, key):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
        return 0

    def reset_peak(self):
        """Restarts the peak RSS count from the current RSS."""
        with open(f"/proc/{self.proc.pid}/clear_refs", "w") as f:
            f.write("5")
        return self.status("VmRSS")

    def peak_rss(self):
        return self.status("VmHWM")

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=120)


def timed(argv, stdin=None, stdout=subprocess.DEVNULL):
    start = time.perf_counter()
    subprocess.run([str(a) for a in argv], check=True, stdin=stdin, stdout=stdout)
    return time.perf_counter() - start


def fill_random(daemon, export, size, rng):
    """Writes incompressible data over the whole volume (via a file)."""
    path = os.path.join(daemon.dir, "fill.raw")
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(left, 64 * MIB)
            f.write(rng.randbytes(n))
            left -= n
    sh("nbdcopy", path, daemon.uri(export))
    os.unlink(path)


def change(daemon, export, size, fraction, rng):
    """Overwrites `fraction` of the volume in scattered 64 KiB pieces."""
    pieces = max(1, int(size * fraction) // (64 << 10))
    slots = rng.sample(range(size // (64 << 10)), pieces)
    cmds = []
    for slot in slots:
        cmds += ["-c", f"write -P {rng.randrange(1, 256)} {slot * (64 << 10)} 64k"]
        if len(cmds) >= 2000:
            sh("qemu-io", "-f", "raw", *cmds, daemon.uri(export))
            cmds = []
    if cmds:
        sh("qemu-io", "-f", "raw", *cmds, daemon.uri(export))


def full_raw(daemon, work):
    """The base snapshot as a raw file (what nbdcopy writes into a volume,
    as the receive writes the same bytes from its stream file)."""
    path = os.path.join(work, "raw.img")
    sh("nbdcopy", daemon.uri("vm@base"), path)
    return path


def send_time(daemon, args):
    return timed([ARBOR, "--data-dir", daemon.dir, "send", *args, "-o", "/dev/null"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="4G")
    ap.add_argument("--workdir", default="/var/tmp")
    ap.add_argument("--json")
    opts = ap.parse_args()
    size = int(opts.size.rstrip("G")) * GIB
    rng = random.Random(1)
    work = tempfile.mkdtemp(prefix="arbor-bench-send-", dir=opts.workdir)
    results = {"size": size, "commit": sh("git", "-C", ROOT, "rev-parse", "--short", "HEAD").stdout.strip(),
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               "cpu": sh("sh", "-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2").stdout.strip(),
               "loadavg_start": os.getloadavg()[0]}
    daemons = []
    try:
        a = Daemon(work, "a", f"{2 * size // GIB + 4}G")
        daemons.append(a)
        b = Daemon(work, "b", f"{2 * size // GIB + 4}G")
        daemons.append(b)
        a.cli("volume", "create", "vm", "--size", str(size))
        fill_random(a, "vm", size, rng)
        a.cli("snapshot", "create", "vm@base")

        # Time against change (caches warm: one untimed read first).
        timed(["nbdcopy", a.uri("vm@base"), "null:"])
        whole = timed(["nbdcopy", a.uri("vm@base"), "null:"])
        results["nbdcopy_whole_s"] = whole
        rows = []
        prev = "vm@base"
        for i, fraction in enumerate((0.01, 0.10, 1.0)):
            change(a, "vm", size, fraction, rng) if fraction < 1 else fill_random(a, "vm", size, rng)
            snap = f"vm@c{i}"
            a.cli("snapshot", "create", snap)
            est = json.loads(a.cli("--json", "send", snap, "--from", prev, "--dry-run"))
            send_time(a, [snap, "--from", prev, "--compression", "none"])
            t = send_time(a, [snap, "--from", prev, "--compression", "none"])
            rows.append({"change": fraction, "data_bytes": est["data_bytes"], "send_s": t,
                         "nbdcopy_whole_s": whole, "speedup": whole / t})
            prev = snap
        results["time_against_change"] = rows

        # Throughput: full send (to /dev/null) vs reading the same bytes
        # out of arbor; receive (from a file) vs writing them into a volume.
        # Peak RSS of each daemon during its part, from its RSS before.
        rss_before = a.reset_peak()
        t_send = send_time(a, ["vm@base", "--compression", "none"])
        rss_send = a.peak_rss()
        t_read = timed(["nbdcopy", a.uri("vm@base"), "null:"])
        full = os.path.join(work, "full.arbor")
        sh(ARBOR, "--data-dir", a.dir, "send", "vm@base", "--compression", "none", "-o", full)
        b.cli("volume", "create", "w", "--size", str(size))
        t_write = timed(["nbdcopy", full_raw(a, work), b.uri("w")])
        b_before = b.reset_peak()
        t_recv = timed([ARBOR, "--data-dir", b.dir, "receive", "r", "-i", full])
        rss_recv = b.peak_rss()
        results["throughput"] = {
            "bytes": size, "send_s": t_send, "read_s": t_read, "send_vs_read": t_read / t_send,
            "receive_s": t_recv, "write_s": t_write, "receive_vs_write": t_write / t_recv,
        }
        results["memory"] = {"sender_before": rss_before, "sender_peak": rss_send,
                             "receiver_before": b_before, "receiver_peak": rss_recv}
        os.unlink(full)
        os.unlink(os.path.join(work, "raw.img"))

        # Compression on a filesystem image with real files.
        img = os.path.join(work, "fs.img")
        sh("truncate", "-s", "1G", img)
        share = os.path.join(work, "share")
        shutil.copytree("/usr/share/doc", os.path.join(share, "doc"), symlinks=True)
        shutil.copytree("/usr/share/locale", os.path.join(share, "locale"), symlinks=True)
        sh("mkfs.ext4", "-q", "-F", "-d", share, img)
        a.cli("volume", "create", "fs", "--size", "1G")
        sh("nbdcopy", img, a.uri("fs"))
        a.cli("snapshot", "create", "fs@one")
        # A second version: the docs tree rewritten (a package upgrade).
        shutil.copytree("/usr/share/doc", os.path.join(share, "doc2"), symlinks=True)
        sh("mkfs.ext4", "-q", "-F", "-d", share, img)
        sh("nbdcopy", img, a.uri("fs"))
        a.cli("snapshot", "create", "fs@two")
        comp = {}
        for mode in ("none", "zstd", "best"):
            for name, args in (("full", ["fs@one"]), ("incremental", ["fs@two", "--from", "fs@one"])):
                out = os.path.join(work, "c.arbor")
                sh(ARBOR, "--data-dir", a.dir, "send", *args, "--compression", mode, "-o", out)
                comp[f"{name}-{mode}"] = os.path.getsize(out)
                os.unlink(out)
        est = json.loads(a.cli("--json", "send", "fs@one", "--dry-run"))
        comp["full-data"] = est["data_bytes"]
        est = json.loads(a.cli("--json", "send", "fs@two", "--from", "fs@one", "--dry-run"))
        comp["incremental-data"] = est["data_bytes"]
        results["compression"] = comp
        results["loadavg_end"] = os.getloadavg()[0]
    finally:
        for d in daemons:
            try:
                d.stop()
            except Exception:
                d.proc.kill()
        shutil.rmtree(work, ignore_errors=True)

    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(results, f, indent=2)
    report(results)


def report(r):
    print(f"## send and receive, {r['size'] // GIB} GiB volume, commit {r['commit']}, {r['date']}")
    print(f"\n{r['cpu']}; load average {r['loadavg_start']:.1f} at the start, {r['loadavg_end']:.1f} at the end\n")
    print("| change | data sent | arbor send --from | nbdcopy of the whole snapshot | ratio |")
    print("|---|---|---|---|---|")
    for row in r["time_against_change"]:
        print(f"| {row['change']:.0%} | {row['data_bytes'] / MIB:.0f} MiB | {row['send_s']:.2f} s "
              f"| {row['nbdcopy_whole_s']:.2f} s | {row['speedup']:.1f}x faster |")
    t = r["throughput"]
    mb = t["bytes"] / MIB
    print("\n| | arbor | peer | ratio |")
    print("|---|---|---|---|")
    print(f"| full send (raw) vs nbdcopy read | {mb / t['send_s']:.0f} MiB/s | {mb / t['read_s']:.0f} MiB/s | {t['send_vs_read']:.2f} |")
    print(f"| receive vs nbdcopy write | {mb / t['receive_s']:.0f} MiB/s | {mb / t['write_s']:.0f} MiB/s | {t['receive_vs_write']:.2f} |")
    c = r["compression"]
    print("\n| stream of an ext4 image of /usr/share/{doc,locale} | none | zstd | best |")
    print("|---|---|---|---|")
    for name in ("full", "incremental"):
        data = c[f"{name}-data"]
        cells = " | ".join(f"{c[f'{name}-{m}'] / MIB:.1f} MiB ({data / c[f'{name}-{m}']:.1f}x)"
                           for m in ("none", "zstd", "best"))
        print(f"| {name} ({data / MIB:.0f} MiB of data) | {cells} |")
    m = r["memory"]
    print(f"\nDaemon RSS, full send of {r['size'] // GIB} GiB: {m['sender_before'] / MIB:.0f} MiB "
          f"before, peak {m['sender_peak'] / MIB:.0f} MiB; receive: {m['receiver_before'] / MIB:.0f} "
          f"MiB before, peak {m['receiver_peak'] / MIB:.0f} MiB")


if __name__ == "__main__":
    sys.exit(main())
