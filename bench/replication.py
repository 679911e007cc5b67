#!/usr/bin/python3
"""Replication figures (docs/REPLICATION.md), measured on a shaped link
between network namespaces, side by side with a peer where there is one:

1. link utilization: a full seed of a volume holding 256 MiB of random
   data, and one incremental cycle of 64 MiB of changed random data, over a
   100 Mbit/s link with a 20 ms round trip, next to plain TCP moving the
   same bytes over the same link (a python socket pair);
2. recovery point under load: 1 MiB/s of random 64 KiB writes on a 4 GiB
   volume, `--interval 10s`, `replica status` sampled once a second;
3. catch-up: the target's link cut for a while (the load goes on), then
   restored: how long until the target is current again, against the
   backlog written during the outage, and whether the recovery point comes
   back down and stays there;
4. chain cost: A -> B -> C (B passes on what it receives), sampled with 2:
   the recovery point at C minus the one at B, per sample.

Three hosts (tests/e2e/netns.py): a (10.78.0.2, the master), b (.3) and c
(.4), one daemon each, mutual TLS. Every host's egress is shaped to
100 Mbit/s (tbf) plus 10 ms of delay (so 20 ms round trip between any two),
for all four parts. Data is random (incompressible: the streams are zstd
level 1), written with libnbd over the master's NBD socket.

Usage: /usr/bin/python3 bench/replication.py [--quick] [--workdir /var/tmp]
       [--out bench/results/replication.md] [--append] [--json FILE]
       bench/replication.py --from-json FILE [--out ...] [--append]  (re-render only)
Needs root, ip/tc (iproute2), openssl, python3-libnbd, and a release build:
ARBOR_BIN (default target/release/arbor). Runs about 25 minutes (--quick:
about 6). Writes markdown to --out (replaced, or with --append added to);
every daemon is stopped by its PID, the namespaces and the work directory
are removed, also on failure.
"""

import argparse
import json
import os
import platform
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
import netns  # noqa: E402

try:
    import nbd  # noqa: E402  (Debian python3-libnbd: /usr/bin/python3)
except ImportError:
    sys.exit("replication.py: needs libnbd's python module (python3-libnbd; run it with /usr/bin/python3)")

ARBOR = os.environ.get("ARBOR_BIN", os.path.join(ROOT, "target", "release", "arbor"))
MIB = 1 << 20
GIB = 1 << 30
SUBNET = "10.78.0"
PORT = 7400
TCP_PORT = 5201
RATE_MBIT = 100
DELAY_MS = 10  # per direction: each host delays what it sends
INTERVAL = 10  # seconds, the pairs' --interval under load
VOLUME_SIZE = 4 * GIB
WRITE_BS = 64 << 10
WRITE_RATE = 1 * MIB  # bytes per second of the load
SEED_BYTES = 256 * MIB
CHANGE_BYTES = 64 * MIB

PROFILES = {
    # seconds
    "full": {"load": 180, "warmup": 20, "outage": 600, "after": 60, "catchup_limit": 420},
    "quick": {"load": 60, "warmup": 20, "outage": 60, "after": 30, "catchup_limit": 120},
}


def sh(*argv, **kw):
    return subprocess.run([str(a) for a in argv], check=True, capture_output=True, text=True, **kw)


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def loadavg():
    return os.getloadavg()


def snapshot_time(name):
    """The Unix time in a master's replication snapshot name
    (VOL@repl-2026-01-02T03:04:05Z[.n]), or None."""
    if not name or "@repl-" not in name:
        return None
    stamp = name.split("@repl-", 1)[1].split(".", 1)[0]
    try:
        return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()
    except ValueError:
        return None


def pct(values, p):
    """Nearest-rank percentile."""
    v = sorted(x for x in values if x is not None)
    if not v:
        return None
    k = max(0, min(len(v) - 1, int(round(p / 100.0 * len(v) + 0.5)) - 1))
    return v[k]


# ---- the hosts --------------------------------------------------------------

class Host:
    """One arbor daemon inside a host's namespace; its sockets are Unix
    sockets in its data directory, so the CLI reaches it from anywhere."""

    def __init__(self, net, work, name, certs, allow=None, initial_volume=None, listen=True):
        self.net = net
        self.name = name
        self.dir = os.path.join(work, name)
        os.makedirs(self.dir)
        self.addr = net.addr(name)
        self.config_path = os.path.join(self.dir, "arbor.toml")
        lines = [
            f'tls_ca = "{certs["ca.pem"]}"',
            f'tls_cert = "{certs[name + ".pem"]}"',
            f'tls_key = "{certs[name + ".key"]}"',
            f'replication_listen = "{self.addr}:{PORT}"' if listen else 'replication_listen = "none"',
            'replication_timeout = "10s"',
        ]
        if allow:
            lines.append("replication_allow = [" + ", ".join(
                f'{{ source = "{s}", volumes = ["*"] }}' for s in allow) + "]")
        self.config = "\n".join(lines) + "\n"
        with open(self.config_path, "w") as f:
            f.write(self.config)
        self.argv = [ARBOR, "--data-dir", self.dir, "serve", "--config", self.config_path,
                     "--pool-size", "8G", "--initial-volume", initial_volume or "none"]
        if initial_volume:
            self.argv += ["--initial-volume-size", "4G"]
        self.argv += ["--nbd-listen", "none", "--api-listen", "none"]
        self.logf = open(os.path.join(self.dir, "log"), "w")
        self.proc = net.popen(name, self.argv, stdout=self.logf, stderr=subprocess.STDOUT)
        api, nbd_sock = os.path.join(self.dir, "api.sock"), os.path.join(self.dir, "nbd.sock")
        for _ in range(300):
            if self.proc.poll() is not None:
                raise RuntimeError(f"arbor serve on {name} exited {self.proc.returncode}: {self.log_tail()}")
            try:
                s = socket.socket(socket.AF_UNIX)
                s.connect(api)
                s.close()
                if os.path.exists(nbd_sock):
                    break
            except OSError:
                pass
            time.sleep(0.1)
        else:
            raise RuntimeError(f"arbor serve on {name} did not start: {self.log_tail()}")
        self.nbd_uri = f"nbd+unix:///{{}}?socket={nbd_sock}"

    def cli(self, *args, check=True):
        p = subprocess.run([ARBOR, "--data-dir", self.dir, *[str(a) for a in args]],
                           capture_output=True, text=True, timeout=600)
        if check and p.returncode != 0:
            raise RuntimeError(f"arbor {' '.join(map(str, args))} on {self.name} exited {p.returncode}: "
                               f"{p.stdout}{p.stderr}")
        return p

    def jcli(self, *args):
        return json.loads(self.cli("--json", *args).stdout)

    def pair(self):
        """This host's (only) pair's status, or None."""
        try:
            pairs = self.jcli("replica", "status")["pairs"]
        except Exception:
            return None
        return pairs[0] if pairs else None

    def log_tail(self, n=4000):
        try:
            with open(os.path.join(self.dir, "log"), errors="replace") as f:
                return f.read()[-n:]
        except OSError:
            return ""

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        self.logf.close()


# ---- writing data -----------------------------------------------------------

def nbd_handle(host, export):
    h = nbd.NBD()
    h.connect_uri(host.nbd_uri.format(export))
    return h


def write_random(host, export, offset, length, rng):
    """Sequential random (incompressible) data, 4 MiB per request."""
    h = nbd_handle(host, export)
    try:
        end = offset + length
        while offset < end:
            n = min(4 * MIB, end - offset)
            h.pwrite(rng.randbytes(n), offset)
            offset += n
        h.flush()
    finally:
        h.shutdown()


def change_random(host, export, region, length, rng):
    """`length` bytes of random data in scattered 64 KiB pieces within the
    first `region` bytes, no piece twice."""
    h = nbd_handle(host, export)
    try:
        slots = rng.sample(range(region // WRITE_BS), length // WRITE_BS)
        for slot in slots:
            h.pwrite(rng.randbytes(WRITE_BS), slot * WRITE_BS)
        h.flush()
    finally:
        h.shutdown()


class Load(threading.Thread):
    """WRITE_RATE bytes a second of random 64 KiB writes at 64 KiB-aligned
    offsets, uniform over the volume, each of fresh random data, paced to
    a schedule (16 writes a second); `written` counts acknowledged bytes."""

    def __init__(self, host, export, size):
        super().__init__(daemon=True)
        self.h = nbd_handle(host, export)
        self.slots = size // WRITE_BS
        self.stop_event = threading.Event()
        self.written = 0
        self.behind = 0.0  # the most it fell behind its schedule, seconds
        self.error = None
        self.started = None
        self.ended = None

    def run(self):
        rng = random.Random(2)
        per_sec = WRITE_RATE / WRITE_BS
        self.started = time.monotonic()
        i = 0
        try:
            while not self.stop_event.is_set():
                due = self.started + i / per_sec
                now = time.monotonic()
                if due > now:
                    self.stop_event.wait(due - now)
                    continue
                self.behind = max(self.behind, now - due)
                self.h.pwrite(os.urandom(WRITE_BS), rng.randrange(self.slots) * WRITE_BS)
                self.written += WRITE_BS
                i += 1
        except Exception as e:  # reported by stop()
            self.error = e
        self.ended = time.monotonic()

    def stop(self):
        self.stop_event.set()
        self.join(timeout=30)
        try:
            self.h.flush()
            self.h.shutdown()
        except Exception:
            pass
        if self.error:
            raise RuntimeError(f"the load failed: {self.error}")
        return self.written / (self.ended - self.started)


class Sampler(threading.Thread):
    """`replica status` of the given hosts' pairs once a second."""

    def __init__(self, hosts):
        super().__init__(daemon=True)
        self.hosts = hosts
        self.samples = []
        self.stop_event = threading.Event()

    def run(self):
        start = time.monotonic()
        i = 0
        while not self.stop_event.is_set():
            due = start + i
            now = time.monotonic()
            if due > now:
                self.stop_event.wait(due - now)
                continue
            i = int(now - start) + 1  # a slow sample skips, never bunches
            s = {"t": time.time()}
            for h in self.hosts:
                s[h.name] = h.pair()
            self.samples.append(s)

    def latest(self):
        return self.samples[-1] if self.samples else None

    def stop(self):
        self.stop_event.set()
        self.join(timeout=30)

    def window(self, t0, t1):
        return [s for s in self.samples if t0 <= s["t"] < t1]


def rp(sample, host):
    p = sample.get(host) if sample else None
    return p.get("recovery_point_secs") if p else None


def caught_up(samples, h, t_restore):
    """When `h`'s pair, after the restore, first sent bytes, first had a
    snapshot taken after the restore on its target ("current"), and then
    first showed a recovery point under 2 x interval ("below"), with the
    bytes it had sent by then (since the restore)."""
    out = {"first_bytes": None, "current": None, "below": None, "sent": None}
    base = None
    for s in samples:
        p = s.get(h)
        if s["t"] < t_restore or not p:
            continue
        if base is None:
            base = p["bytes_sent_total"]
        if out["first_bytes"] is None and (p.get("cycle") or {}).get("wire_bytes"):
            out["first_bytes"] = s["t"]
        st = snapshot_time(p.get("last_snapshot"))
        if out["current"] is None and st is not None and st >= int(t_restore):
            out["current"] = s["t"]
        rpv = p.get("recovery_point_secs")
        if out["current"] is not None and rpv is not None and rpv < 2 * INTERVAL:
            out["below"] = s["t"]
            out["sent"] = p["bytes_sent_total"] - base
            break
    return out


# ---- plain TCP, the peer ------------------------------------------------------

# argv: address port bytes. Accepts connections; one carrying `bytes` bytes
# (until EOF) gets b"ok" back, and the receiver ends.
TCP_RECEIVER = r"""
import socket, sys
addr, port, want = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind((addr, port)); ls.listen(16)
print("ready", flush=True)
buf = bytearray(1 << 20)
while True:
    c, _ = ls.accept()
    got = 0
    while True:
        n = c.recv_into(buf)
        if not n:
            break
        got += n
    if got >= want:
        c.sendall(b"ok"); c.close(); break
    c.close()
"""

# argv: address port bytes. Five connects (the round trip: connect() returns
# with the SYN-ACK), then the bytes on one connection, then waits for "ok".
TCP_SENDER = r"""
import json, os, socket, statistics, sys, time
addr, port, total = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rtts = []
for _ in range(5):
    s = socket.socket(); t = time.perf_counter(); s.connect((addr, port))
    rtts.append(time.perf_counter() - t); s.close(); time.sleep(0.05)
chunk = os.urandom(1 << 20)
s = socket.socket(); s.connect((addr, port))
t0 = time.perf_counter(); left = total
while left:
    n = min(left, len(chunk)); s.sendall(chunk[:n]); left -= n
s.shutdown(socket.SHUT_WR)
ack = s.recv(2)
t1 = time.perf_counter()
print(json.dumps({"bytes": total, "secs": t1 - t0, "rtt_ms": statistics.median(rtts) * 1000,
                  "rtts_ms": [r * 1000 for r in rtts], "ack": ack.decode()}))
"""


def tcp_throughput(net, src, dst, nbytes):
    recv = net.popen(dst, [sys.executable, "-c", TCP_RECEIVER, net.addr(dst), TCP_PORT, nbytes])
    try:
        if recv.stdout.readline().strip() != "ready":
            raise RuntimeError(f"TCP receiver did not start: {recv.stderr.read()}")
        out = net.run(src, [sys.executable, "-c", TCP_SENDER, net.addr(dst), TCP_PORT, nbytes], timeout=600)
        r = json.loads(out.stdout)
        if r["ack"] != "ok":
            raise RuntimeError("TCP receiver did not acknowledge")
        recv.wait(timeout=30)
        return r
    finally:
        if recv.poll() is None:
            recv.kill()
            recv.wait()


# ---- the parts ----------------------------------------------------------------

def wait_pair(host, cycles_ok, timeout, poll=0.1):
    """Polls `host`'s pair until cycles_ok reaches `cycles_ok`; returns
    (the last status seen while running, the final status, when seen)."""
    deadline = time.monotonic() + timeout
    running = None
    while time.monotonic() < deadline:
        p = host.pair()
        if p:
            if p.get("cycle"):
                running = p
            if p["cycles_ok"] >= cycles_ok:
                return running, p, time.monotonic()
            if p["state"] == "failed":
                log(f"{host.name}: pair failed: {p.get('error')}")
        time.sleep(poll)
    raise RuntimeError(f"{host.name}: the pair did not complete a cycle in {timeout} s: {host.pair()}")


def link_utilization(net, a, b, results):
    rng = random.Random(1)
    log(f"writing {SEED_BYTES // MIB} MiB of random data to vm1 on a")
    write_random(a, "vm1", 0, SEED_BYTES, rng)

    log("plain TCP a -> b")
    tcp = tcp_throughput(net, "a", "b", SEED_BYTES)
    log(f"  {tcp['bytes'] / MIB / tcp['secs']:.2f} MiB/s, rtt {tcp['rtt_ms']:.1f} ms")

    log("full seed a -> b")
    target = f"{b.addr}:{PORT}"
    add_argv = ["replica", "add", "vm1", "--target", target, "--interval", "1h"]
    t0 = time.monotonic()
    a.cli(*add_argv)
    running, done, t1 = wait_pair(a, 1, 600)
    seed = {"secs": t1 - t0, "wire_bytes": done["bytes_sent_total"],
            "stream_total": running["cycle"]["stream_total"] if running else None,
            "cycle_bytes_per_sec": running["cycle"]["bytes_per_sec"] if running else None,
            "cycle_elapsed": running["cycle"]["elapsed_secs"] if running else None,
            "snapshot": done["last_snapshot"]}
    log(f"  {seed['wire_bytes'] / MIB:.1f} MiB in {seed['secs']:.2f} s")

    log(f"incremental: {CHANGE_BYTES // MIB} MiB changed")
    change_random(a, "vm1", SEED_BYTES, CHANGE_BYTES, rng)
    t0 = time.monotonic()
    run = a.jcli("replica", "run", "vm1")
    t1 = time.monotonic()
    r = run[0]
    if isinstance(r, dict) and "result" in r:
        r = r["result"]
    incr = {"secs": t1 - t0, "run": run,
            "wire_bytes": r.get("wire_bytes") if isinstance(r, dict) else None}
    log(f"  {incr['wire_bytes'] / MIB:.1f} MiB in {incr['secs']:.2f} s")
    results["link"] = {"tcp": tcp, "seed": seed, "incremental": incr,
                       "commands": {"seed": " ".join(add_argv), "incremental": "replica run vm1"}}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--workdir", default="/var/tmp")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "replication.md"))
    ap.add_argument("--append", action="store_true", help="add to --out instead of replacing it")
    ap.add_argument("--json", help="also write every measurement (and the samples) here")
    ap.add_argument("--from-json", help="render the report of an earlier --json file; runs nothing")
    opts = ap.parse_args()
    if opts.from_json:
        with open(opts.from_json) as f:
            write_report(json.load(f), opts)
        return 0
    profile = "quick" if opts.quick else "full"
    prof = PROFILES[profile]
    if os.geteuid() != 0:
        sys.exit("replication.py: needs root (network namespaces)")
    if not os.access(ARBOR, os.X_OK):
        sys.exit(f"replication.py: no arbor binary at {ARBOR} (set ARBOR_BIN)")

    wall0 = time.monotonic()
    results = {
        "profile": profile, "params": prof,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "arbor": sh(ARBOR, "--version").stdout.strip(),
        "arbor_bin": ARBOR,
        "arbor_mtime": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(os.path.getmtime(ARBOR))),
        "cpu": sh("sh", "-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2").stdout.strip(),
        "cores": os.cpu_count(),
        "mem_gib": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB,
        "kernel": platform.release(),
        "loadavg_start": loadavg(),
        "command": "/usr/bin/python3 bench/replication.py" + (" --quick" if opts.quick else ""),
    }
    work = tempfile.mkdtemp(prefix="arbor-bench-repl-", dir=opts.workdir)
    hosts, threads = [], []
    net = None
    try:
        net = netns.Network(["a", "b", "c"], subnet=SUBNET)
        certs = netns.make_certs(os.path.join(work, "certs"), ["a", "b", "c"],
                                 ips={h: net.addr(h) for h in ("a", "b", "c")})
        for h in ("a", "b", "c"):
            net.shape(h, delay_ms=DELAY_MS, rate_mbit=RATE_MBIT)
        a = Host(net, work, "a", certs, initial_volume="vm1", listen=False)
        b = Host(net, work, "b", certs, allow=["a"])
        c = Host(net, work, "c", certs, allow=["b"])
        hosts += [a, b, c]
        results["config_b"] = b.config
        results["config_c"] = c.config
        results["config_a"] = a.config
        results["serve_argv_a"] = " ".join(os.path.basename(x) if x == ARBOR else x for x in a.argv)
        results["serve_argv_b"] = " ".join(os.path.basename(x) if x == ARBOR else x for x in b.argv)

        # 1. Link utilization.
        link_utilization(net, a, b, results)
        results["loadavg_after_link"] = loadavg()

        # The pair from now on: every INTERVAL seconds.
        a.cli("replica", "remove", "vm1")
        a_add = ["replica", "add", "vm1", "--target", f"{b.addr}:{PORT}", "--interval", f"{INTERVAL}s"]
        a.cli(*a_add)
        wait_pair(a, 1, 120)
        # B passes on to C: C's seed first.
        log("seeding c from b")
        b_add = ["replica", "add", "vm1", "--target", f"{c.addr}:{PORT}", "--interval", f"{INTERVAL}s"]
        t0 = time.monotonic()
        b.cli(*b_add)
        _, done, t1 = wait_pair(b, 1, 600)
        results["chain_seed"] = {"secs": t1 - t0, "wire_bytes": done["bytes_sent_total"]}
        results["commands"] = {"a": " ".join(a_add), "b": " ".join(b_add)}

        # 2 and 4. Recovery point under load, both hops.
        load = Load(a, "vm1", VOLUME_SIZE)
        sampler = Sampler([a, b])
        threads += [load, sampler]
        load.start()
        sampler.start()
        t_load = time.time()
        log(f"load on; warm-up {prof['warmup']} s, then {prof['load']} s of samples")
        time.sleep(prof["warmup"] + prof["load"])
        t_steady_end = time.time()
        results["steady"] = {"t0": t_load + prof["warmup"], "t1": t_steady_end}
        results["loadavg_after_steady"] = loadavg()

        # 3. Catch-up after an outage of b (both hops lose their link).
        log(f"cutting b for {prof['outage']} s")
        a_before = a.pair()
        b_before = b.pair()
        w0 = load.written
        t_cut = time.time()
        net.cut("b")
        time.sleep(prof["outage"])
        w1 = load.written
        a_at_restore = a.pair()
        b_at_restore = b.pair()
        net.restore("b")
        t_restore = time.time()
        log("restored; waiting for the target to be current")
        deadline = time.monotonic() + prof["catchup_limit"]
        while time.monotonic() < deadline:
            time.sleep(0.5)
            done = [caught_up(sampler.samples, h, t_restore) for h in ("a", "b")]
            if all(d["below"] is not None for d in done):
                break
        log("caught up: " + ", ".join(
            f"{h} {'-' if d['below'] is None else round(d['below'] - t_restore, 1)} s"
            for h, d in zip(("a->b", "b->c"), done)) + f"; observing {prof['after']} s")
        time.sleep(prof["after"])
        t_end = time.time()
        rate = load.stop()
        sampler.stop()
        results["load_rate"] = rate
        results["load_behind"] = load.behind
        results["catchup"] = {
            "t_cut": t_cut, "t_restore": t_restore, "t_end": t_end,
            "written_during_outage": w1 - w0,
            "a_before": a_before, "b_before": b_before,
            "a_at_restore": a_at_restore, "b_at_restore": b_at_restore,
            "a_end": a.pair(), "b_end": b.pair(),
        }
        results["samples"] = sampler.samples
        results["loadavg_end"] = loadavg()
        results["runtime_secs"] = time.monotonic() - wall0
        results["log_warnings"] = {h.name: [l for l in h.log_tail(1 << 20).splitlines()
                                            if "WARN" in l or "ERROR" in l][-30:] for h in hosts}
    except BaseException:
        for h in hosts:
            print(f"---- {h.name} log ----\n{h.log_tail()}", file=sys.stderr)
        raise
    finally:
        for t in threads:
            try:
                t.stop()
            except Exception:
                pass
        for h in hosts:
            try:
                h.stop()
            except Exception as e:
                print(f"stopping {h.name}: {e}", file=sys.stderr)
        if net is not None:
            net.close()
        shutil.rmtree(work, ignore_errors=True)

    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(results, f, indent=2)
    write_report(results, opts)
    return 0


def write_report(results, opts):
    text = report(results)
    mode = "a" if opts.append and os.path.exists(opts.out) else "w"
    with open(opts.out, mode) as f:
        if mode == "w":
            f.write(HEADER)
        f.write(text)
    print(text)


HEADER = """# Replication figures

`/usr/bin/python3 bench/replication.py [--quick]` (as root; a release build,
`ARBOR_BIN` or `target/release/arbor`). Three hosts are network namespaces
on one bridge (tests/e2e/netns.py): a, the master (10.78.0.2), b (.3) and
c (.4), one `arbor serve` each, mutual TLS. Every host's egress is shaped
to 100 Mbit/s (a tbf qdisc) and delayed 10 ms (netns.py's delay line: the
kernel has no netem), so any two hosts have a 20 ms round trip, for all four
parts. Data is random (incompressible; the streams are zstd level 1). The
load is a libnbd writer in the benchmark on the master's NBD socket: 16
writes a second of 64 KiB of fresh random data at 64 KiB-aligned offsets
uniform over the 4 GiB volume (1 MiB/s). Recovery points are `arbor --json
replica status`'s `recovery_point_secs`, sampled once a second (on a: how
stale b's copy is; on b, whose pair sends to c: how stale c's copy is, from
the snapshots' creation time on a, i.e. end to end).
"""


def mean(values):
    v = [x for x in values if x is not None]
    return sum(v) / len(v) if v else None


def mean_s(values):
    m = mean(values)
    return "-" if m is None else f"{m:.1f} s"


def fmt_s(x, digits=1):
    return "-" if x is None else f"{x:.{digits}f} s"


def report(r):
    out = []
    w = out.append
    prof = r["params"]
    la0, la1 = r["loadavg_start"], r["loadavg_end"]
    w(f"\n## replication, {r['profile']} profile, {r['arbor']}, {r['date']}\n")
    w(f"`{r['command']}`: {r['runtime_secs'] / 60:.1f} minutes. {r['cpu']}, {r['cores']} cores, "
      f"{r['mem_gib']:.1f} GiB, Linux {r['kernel']}; binary built {r['arbor_mtime']}. "
      f"Load average (1/5/15 min) {la0[0]:.2f}/{la0[1]:.2f}/{la0[2]:.2f} at the start, "
      f"{r['loadavg_after_link'][0]:.2f} after part 1, {r['loadavg_after_steady'][0]:.2f} after parts 2 and 4, "
      f"{la1[0]:.2f}/{la1[1]:.2f}/{la1[2]:.2f} at the end (other work was running on the machine).\n")
    w("Daemons (in their namespaces):\n")
    w("```")
    w(r["serve_argv_a"].replace(r["serve_argv_a"].split(" --data-dir ")[1].split()[0], "A"))
    w(r["serve_argv_b"].replace(r["serve_argv_b"].split(" --data-dir ")[1].split()[0], "B")
      + "   # c: the same")
    w("```\n")
    w("b's config (c's: its own address and certificate, `source = \"b\"`; a's: the TLS keys, "
      "`replication_listen = \"none\"`):\n")
    w("```toml")
    cfg = "\n".join(l if not l.startswith("tls_") else l.split(" = ")[0] + ' = "…/' +
                    os.path.basename(l.split('"')[1]) + '"' for l in r["config_b"].splitlines())
    w(cfg)
    w("```\n")

    # 1.
    L = r["link"]
    tcp, seed, incr = L["tcp"], L["seed"], L["incremental"]
    tcp_bps = tcp["bytes"] / tcp["secs"]
    seed_bps = seed["wire_bytes"] / seed["secs"]
    incr_bps = incr["wire_bytes"] / incr["secs"]
    w("### 1. Link utilization (100 Mbit/s, 20 ms round trip)\n")
    w(f"Round trip a → b, measured (TCP connect, median of 5): {tcp['rtt_ms']:.1f} ms "
      f"({', '.join(f'{x:.1f}' for x in tcp['rtts_ms'])}).\n")
    w("| a → b | bytes on the connection | time | throughput | plain TCP, same link | ratio |")
    w("|---|---|---|---|---|---|")
    mbit = lambda bps: bps * 8 / 1e6  # noqa: E731
    w(f"| full seed ({SEED_BYTES // MIB} MiB of random data), `arbor {L['commands']['seed']}` until "
      f"cycles_ok = 1 | {seed['wire_bytes'] / MIB:.1f} MiB | {seed['secs']:.2f} s "
      f"| {seed_bps / MIB:.2f} MiB/s ({mbit(seed_bps):.1f} Mbit/s) "
      f"| {tcp_bps / MIB:.2f} MiB/s ({mbit(tcp_bps):.1f} Mbit/s) | {seed_bps / tcp_bps:.2f} |")
    w(f"| incremental ({CHANGE_BYTES // MIB} MiB changed in 64 KiB pieces), `arbor {L['commands']['incremental']}` "
      f"| {incr['wire_bytes'] / MIB:.1f} MiB | {incr['secs']:.2f} s "
      f"| {incr_bps / MIB:.2f} MiB/s ({mbit(incr_bps):.1f} Mbit/s) "
      f"| {tcp_bps / MIB:.2f} MiB/s ({mbit(tcp_bps):.1f} Mbit/s) | {incr_bps / tcp_bps:.2f} |")
    if seed.get("cycle_bytes_per_sec"):
        w(f"\nThe seed's own figure (`replica status` → cycle.bytes_per_sec, last sample while running, "
          f"{seed['cycle_elapsed']:.1f} s into it): {seed['cycle_bytes_per_sec'] / MIB:.2f} MiB/s; stream estimate "
          f"{seed['stream_total'] / MIB:.1f} MiB.")
    w(f"\nPeer: {tcp['bytes'] // MIB} MiB from a python socket in a to one in b (default socket buffers, "
      "as arbor's), timed from the first byte to the receiver's acknowledgement of the last. "
      "Replication times are wall clock: the seed from `replica add` to the status showing the "
      "cycle done (polled every 0.1 s), the incremental `arbor --json replica run vm1` (connect, TLS, "
      "snapshot, hello/plan, the stream, the target's commit). Goal: ratio ≥ 0.90: "
      f"{'met' if min(seed_bps, incr_bps) / tcp_bps >= 0.9 else 'NOT met'}.\n")

    # 2 and 4.
    st = r["steady"]
    samples = r["samples"]
    steady = [s for s in samples if st["t0"] <= s["t"] < st["t1"]]
    ab = [rp(s, "a") for s in steady]
    ac = [rp(s, "b") for s in steady]
    extra = [rp(s, "b") - rp(s, "a") for s in steady if rp(s, "a") is not None and rp(s, "b") is not None]
    fails_a = (steady[-1]["a"]["cycles_failed"] - steady[0]["a"]["cycles_failed"]) if steady and steady[0]["a"] and steady[-1]["a"] else None
    fails_b = (steady[-1]["b"]["cycles_failed"] - steady[0]["b"]["cycles_failed"]) if steady and steady[0]["b"] and steady[-1]["b"] else None
    ok_a = (steady[-1]["a"]["cycles_ok"] - steady[0]["a"]["cycles_ok"]) if steady and steady[0]["a"] and steady[-1]["a"] else None
    ok_b = (steady[-1]["b"]["cycles_ok"] - steady[0]["b"]["cycles_ok"]) if steady and steady[0]["b"] and steady[-1]["b"] else None
    secs = lambda x: "-" if x is None else f"{x} s"  # noqa: E731
    w(f"### 2. Recovery point under load ({prof['load']} s, interval {INTERVAL} s)\n")
    w(f"Load: {r['load_rate'] / MIB:.2f} MiB/s achieved over the whole run (at most {r['load_behind'] * 1000:.0f} ms "
      f"behind its schedule). Samples from {prof['warmup']} s after the load started, "
      f"{len(steady)} of them. Commands: `arbor --data-dir A {r['commands']['a']}`, "
      f"`arbor --data-dir B {r['commands']['b']}` (c seeded first: "
      f"{r['chain_seed']['wire_bytes'] / MIB:.0f} MiB in {r['chain_seed']['secs']:.1f} s).\n")
    w("| recovery point | mean | p50 | p99 | max | cycles ok / failed in the window | goal p99 < 30 s |")
    w("|---|---|---|---|---|---|---|")
    w(f"| b (A → B) | {mean_s(ab)} | {secs(pct(ab, 50))} | {secs(pct(ab, 99))} | {secs(pct(ab, 100))} "
      f"| {ok_a} / {fails_a} | {'met' if pct(ab, 99) is not None and pct(ab, 99) < 30 else 'NOT met'} |")
    w(f"| c (A → B → C, end to end) | {mean_s(ac)} | {secs(pct(ac, 50))} | {secs(pct(ac, 99))} | {secs(pct(ac, 100))} "
      f"| {ok_b} / {fails_b} | {'met' if pct(ac, 99) is not None and pct(ac, 99) < 30 else 'NOT met'} |")
    w("")
    w("### 4. Chain cost (same samples)\n")
    w("| | mean | p50 | p99 | max | min |")
    w("|---|---|---|---|---|---|")
    w(f"| extra recovery point of the second hop (c's minus b's, per sample) | {mean_s(extra)} | {secs(pct(extra, 50))} "
      f"| {secs(pct(extra, 99))} | {secs(pct(extra, 100))} | {secs(pct(extra, 0))} |")
    w(f"| ratio c / b of the means: {mean(ac) / mean(ab):.2f}; of the p50s: {pct(ac, 50) / pct(ab, 50):.2f} | | | | | |"
      if pct(ab, 50) and mean(ab) else "| ratio | - | | | | |")
    w("\nb's pair takes no snapshot: it sends what it received, in order, every interval; "
      "c is therefore behind b by up to one interval of b plus its own transfer.\n")

    # 3.
    cu = r["catchup"]
    t_cut, t_res, t_end = cu["t_cut"], cu["t_restore"], cu["t_end"]
    outage = t_res - t_cut
    w(f"### 3. Catch-up after b's link is cut for {outage:.0f} s (load going on)\n")
    backlog = cu["written_during_outage"]

    steady_p99 = {"a": pct(ab, 99), "b": pct(ac, 99)}
    steady_p50 = {"a": pct(ab, 50), "b": pct(ac, 50)}

    def hop(h, label):
        at = cu[f"{h}_at_restore"] or {}
        before = cu[f"{h}_before"] or {}
        cu_h = caught_up(samples, h, t_res)
        below = cu_h["below"]
        after = [rp(s, h) for s in samples if below and below <= s["t"] < t_end]
        during = [rp(s, h) for s in samples if t_cut <= s["t"] < t_res]
        rel = lambda t: None if t is None else t - t_res  # noqa: E731
        # The catch-up transfer: the cycle that made the target current, as
        # its last sample while running shows it (wire bytes so far, and
        # arbor's own bytes_per_sec: wire bytes / time since the cycle began).
        xfer = None
        if cu_h["current"] is not None:
            last = None
            for s in samples:
                if s["t"] >= cu_h["current"]:
                    break
                if s["t"] >= t_res and s.get(h) and s[h].get("cycle"):
                    last = s[h]["cycle"]
            if last:
                xfer = (last["wire_bytes"], last["elapsed_secs"], last["bytes_per_sec"])
        third = max(1, len(after) // 3)
        growing = (len(after) >= 6 and max(x for x in after[-third:] if x is not None) >
                   max(x for x in after[:third] if x is not None) + 2)
        return {
            "xfer": xfer, "growing": growing,
            "h": h, "label": label,
            "rp_restore": at.get("recovery_point_secs"),
            "grew": (during[-1] - during[0]) if len(during) > 1 and None not in (during[0], during[-1]) else None,
            "failed_outage": (at.get("cycles_failed", 0) - before.get("cycles_failed", 0)) if at and before else None,
            "state_restore": at.get("state"),
            "next_run_restore": at.get("next_run_secs"),
            "first": rel(cu_h["first_bytes"]), "current": rel(cu_h["current"]), "below": rel(below),
            "sent": cu_h["sent"],
            "after_max": max([x for x in after if x is not None], default=None),
            "after_p50": pct(after, 50),
            "after_n": len(after),
            "errors": sorted({str(s[h].get("error")) for s in samples
                              if t_cut <= s["t"] < t_end and s.get(h) and s[h].get("error")}),
        }

    hops = [hop("a", "b (A → B)"), hop("b", "c (A → B → C)")]
    w(f"Backlog: {backlog / MIB:.0f} MiB written to a during the outage ({backlog / MIB / outage:.2f} MiB/s). "
      f"Commands: `ip -n BRIDGE_NS link set v1b down` / `up` (netns.py `cut(\"b\")`/`restore(\"b\")`), "
      "which cuts both hops (a → b and b → c). Times are from the restore; \"current\": the target has "
      "a snapshot taken after the restore; \"caught up\": current, and the recovery point under "
      f"2 × interval ({2 * INTERVAL} s).\n")
    w("| target | recovery point at restore | failed cycles during the outage | pair at restore "
      "| first bytes sent | current | the cycle that made it current (last sample: bytes, time, rate) | caught up | sent until caught up "
      "| recovery point after catching up: p50 / max | steady state (part 2): p50 / p99 |")
    w("|---|---|---|---|---|---|---|---|---|---|---|")
    for x in hops:
        sent_txt = "-" if x["sent"] is None else f"{x['sent'] / MIB:.0f} MiB"
        xfer_txt = "-" if x["xfer"] is None else (
            f"≥ {x['xfer'][0] / MIB:.0f} MiB, {x['xfer'][1]:.0f} s, {x['xfer'][2] / MIB:.1f} MiB/s")
        state = x["state_restore"] or "-"
        if x["next_run_restore"] is not None:
            state += f", next attempt in {x['next_run_restore']} s"
        w(f"| {x['label']} | {secs(x['rp_restore'])} | {x['failed_outage']} | {state} "
          f"| +{fmt_s(x['first'])} | +{fmt_s(x['current'])} | {xfer_txt} | +{fmt_s(x['below'])} | {sent_txt} "
          f"| {secs(x['after_p50'])} / {secs(x['after_max'])} ({x['after_n']} samples) "
          f"| {secs(steady_p50[x['h']])} / {secs(steady_p99[x['h']])} |")
    for x in hops:
        if x["errors"]:
            w(f"\n{x['label']}: errors shown during the outage: " + "; ".join(f"`{e}`" for e in x["errors"][:4]))
    w("")
    span = t_end - t_res
    step = 5 if span <= 150 else 10
    w(f"Recovery point around the restore, every {step} s:\n")
    w("| s from the restore | b | c |")
    w("|---|---|---|")
    shown = set()
    for s in samples:
        dt = s["t"] - t_res
        k = int(dt // step) if dt >= 0 else -1
        if -step <= dt < span and k not in shown:
            shown.add(k)
            w(f"| {dt:+.0f} | {secs(rp(s, 'a'))} | {secs(rp(s, 'b'))} |")
    w("")
    for x in hops:
        if x["below"] is None:
            verdict = "did NOT catch up within the limit"
        else:
            verdict = f"caught up {x['below']:.0f} s after the restore"
            if x["first"] is not None and x["first"] > 2:
                verdict += (f", of which the first {x['first']:.0f} s the link was back but the pair waited "
                            "for its next attempt (backoff)")
            verdict += (f"; after that p50 {x['after_p50']} s, max {x['after_max']} s over {x['after_n']} s "
                        f"(part 2: p50 {steady_p50[x['h']]} s, p99 {steady_p99[x['h']]} s), "
                        + ("still GROWING at the end (lag feeding on itself)" if x["growing"]
                           else "not growing (no lag feeding on itself)"))
        w(f"* {x['label']}: the recovery point grew by {x['grew']} s during the {outage:.0f} s outage; {verdict}.")
    below_c = hops[1]["below"]
    if below_c is not None:
        t0 = t_res + below_c
        post = [rp(s, "b") - rp(s, "a") for s in samples
                if t0 <= s["t"] < t_end and rp(s, "a") is not None and rp(s, "b") is not None]
        if post:
            w(f"* Second hop after catching up (c's minus b's per sample): mean {mean(post):.1f} s, "
              f"p50 {pct(post, 50)} s, max {pct(post, 100)} s (part 4: mean {mean(extra):.1f} s, "
              f"p50 {pct(extra, 50)} s).")
    w("")
    warns = r.get("log_warnings", {})
    if any(warns.values()):
        w("Daemon log warnings (last lines of each):\n")
        w("```")
        for h, lines in warns.items():
            for l in lines[-8:]:
                w(f"{h}: {l[:300]}")
        w("```\n")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(main())
