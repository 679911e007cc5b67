#!/usr/bin/python3
"""Replication between daemons on separate "hosts" (network namespaces,
netns.py, one daemon each), over mutual TLS, with real NBD clients writing
and reading through the daemons' Unix sockets:

1. chain a -> b -> c (vm1) and tree a -> {b, c} (vm2) under a steady write
   load on a, cycles one after the other and all at once: after final
   cycles every host has the same snapshots, the newest (and oldest) one
   identical everywhere, each replica's export serves the newest, every
   pool checks clean, c's status shows the paths [a, b] and [a]; c sending
   vm1 back to a is a cycle; status and /metrics agree; the holds sit on
   the newest snapshots only; replicas refuse writes (also a raw NBD write
   request), snapshots, rename (also of a snapshot), rollback, resize and
   `arbor receive`;
2. faults: the link cut mid-stream (the run fails with "connection", runs
   while it is down take no snapshot, the next one resumes from the
   target's checkpoint and the bytes sent over all attempts are about one
   stream); the receiving daemon killed with SIGKILL mid-stream (resumes,
   identical); the sending daemon killed with SIGKILL mid-stream (its pair
   survives the restart, resumes, identical); a target whose pool is too
   small (the run fails with "no_space", status says so);
3. identity: a source with a certificate from another CA gets nothing, a
   target with one (or with another identity than expected) is sent
   nothing, a valid source (or volume) the target's replication_allow does
   not name is refused ("not_allowed"), as is a second source for a
   replica; plain TCP garbage, a silent connection, a TLS client without a
   certificate and garbage frames from a genuine one are dropped, and the
   daemon keeps serving;
4. divergence and failover: a replica written and snapshotted on its own
   is refused ("diverged", naming the snapshot) until `resync --force`
   rolls it back; a replica sharing no snapshot is refused even forced,
   and reseeded once deleted; failover to b (remove, promote, write,
   demote, add the old master as b's target) leaves a an identical,
   read-only replica of b;
5. export rollover: readers of b's replica export (two on connections
   held throughout, one reconnecting) never see a 4 MiB read mix two of
   the uniform full-volume patterns a replicates one after the other, and
   see the replica move on under them, in order;
6. seeding by hand (`arbor send` / `arbor receive`, then --seeded) under
   another volume name on the target, --seeded without a seed refused,
   retention on the master (--keep) and on targets (keep) with cycles
   back to back;
7. healing: an ext4 on a's volume, replicated to b; blocks of files
   damaged in a's pool file and others in b's: the files read EIO through
   ext4 (never wrong data), scrubs list every damaged block, the next
   cycle heals each side with the other's copies, and e2fsck and every
   file's checksum are clean after;
8. encryption: an encrypted volume replicated a -> b -> c, full and
   incremental, raw: b and c hold no key; no pool file holds any of the
   16 MiB of marked plaintext written; b and c list it locked and serve
   nothing; a block damaged in b's pool is found by b's scrub and healed
   by the next cycle from a's copy, as stored; c refuses a wrong key, and
   with the right one reads exactly a's newest snapshot; after a `key
   change` on a and one more cycle, c takes the new key, not the old.

Run as root from tests/e2e: /usr/bin/python3 replication.py (ARBOR_BIN
overrides the binary; ARBOR_REPLICATION_PARTS=1,3 runs some parts only;
ARBOR_REPLICATION_SEED fixes the random data). Every wait is bounded;
daemons are stopped by PID, namespaces and temporary directories removed,
also on failure. Prints each check; exits 1 if any failed."""

import hashlib
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import harness  # noqa: E402
from harness import ARBOR, Failure, require_tools  # noqa: E402
import netns  # noqa: E402

MIB = 1 << 20
PORT = 7400
TIMEOUT = "5s"  # replication_timeout of every daemon: a cut link is noticed soon
CHECKPOINT = 16 * MIB  # a target commits its receive progress this often
CLI_TIMEOUT = 60.0  # a management command
RUN_TIMEOUT = 180.0  # `arbor replica run` (a whole cycle)
SEED = int(os.environ.get("ARBOR_REPLICATION_SEED", str(random.randrange(1 << 30))))

checks_passed = 0
soft_failures = []  # the running part's failed checks that did not stop it


def say(text):
    print(text, flush=True)


def check(cond, what, detail="", soft=False):
    """One assertion: prints it when it holds. When not, raises Failure,
    or, if soft (nothing after it depends on it), records the failure and
    lets the part go on; the part fails either way."""
    global checks_passed
    if not cond:
        message = f"{what}" + (f"\n{detail}" if detail else "")
        if not soft:
            raise Failure(message)
        soft_failures.append(message)
        say(f"    FAILED: {message}")
        return False
    checks_passed += 1
    say(f"    ok: {what}")
    return True


def poll(predicate, what, timeout=60.0, interval=0.1):
    """Polls until predicate() returns something true; returns it. Raises
    Failure with `what` after timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        got = predicate()
        if got:
            return got
        if time.monotonic() >= deadline:
            raise Failure(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def sh(argv, timeout=CLI_TIMEOUT, check=True, **kw):
    """Runs a command in the root namespace, output captured as text."""
    argv = [str(a) for a in argv]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, **kw)
    except subprocess.TimeoutExpired:
        raise Failure(f"{' '.join(argv)} did not finish within {timeout:.0f} s") from None
    if check and proc.returncode != 0:
        raise Failure(f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}")
    return proc


# ---- a daemon on a host -------------------------------------------------------

class Host:
    """`arbor serve` in host `name`'s namespace, with its replication
    listener on the host's address and the certificate `cert` (NAME.pem and
    NAME.key in cert_dir, default: the host's own). The data directory is
    in the root namespace's file system, so the CLI and NBD clients reach
    the daemon through its Unix sockets from here."""

    def __init__(self, net, name, root, certs, allow=(), pool_size="2G", cert=None,
                 cert_dir=None, ca=None, listen=True, key=None):
        self.net, self.name = net, name
        self.addr = net.addr(name)
        self.dir = os.path.join(root, name)
        os.makedirs(self.dir, exist_ok=True)
        self.api = os.path.join(self.dir, "api.sock")
        self.nbd = os.path.join(self.dir, "nbd.sock")
        self.pool = os.path.join(self.dir, "pool")
        self.logfile = os.path.join(self.dir, "daemon.log")
        self.pool_size = pool_size
        self.proc = None
        self.children = []  # background CLI processes
        cert = cert or name
        cert_dir = cert_dir or certs
        lines = [
            f'replication_listen = "{self.addr}:{PORT}"' if listen else 'replication_listen = "none"',
            f'tls_ca = "{ca or os.path.join(certs, "ca.pem")}"',
            f'tls_cert = "{os.path.join(cert_dir, cert + ".pem")}"',
            f'tls_key = "{key or os.path.join(cert_dir, cert + ".key")}"',
            f'replication_timeout = "{TIMEOUT}"',
            "replication_allow = [" + ", ".join(
                f'{{ source = "{src}", volumes = [{", ".join(json.dumps(v) for v in vols)}], keep = {keep} }}'
                for src, vols, keep in allow) + "]",
        ]
        self.config = os.path.join(self.dir, "arbor.toml")
        with open(self.config, "w") as f:
            f.write("\n".join(lines) + "\n")

    def target(self, volume=None):
        return f"{self.addr}:{PORT}" + (f"/{volume}" if volume else "")

    def start(self):
        log = open(self.logfile, "a")
        try:
            self.proc = self.net.popen(
                self.name,
                [ARBOR, "--data-dir", self.dir, "serve", "--config", self.config,
                 "--pool-size", self.pool_size, "--initial-volume", "none",
                 "--nbd-listen", "none", "--api-listen", "none"],
                stdout=log, stderr=subprocess.STDOUT)
        finally:
            log.close()
        poll(lambda: self.listening() or self.proc.poll() is not None,
             f"{self.name}'s daemon to listen", timeout=60)
        if self.proc.poll() is not None:
            raise Failure(f"{self.name}'s daemon exited {self.proc.returncode}:\n{self.log()[-3000:]}")
        return self

    # The API answers (a socket file alone may be stale) and NBD is bound.
    listening = harness.Daemon.listening

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def log(self):
        try:
            with open(self.logfile, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def kill(self):
        """SIGKILL by PID: no chance to commit or clean up."""
        if self.alive():
            os.kill(self.proc.pid, signal.SIGKILL)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                pass
        self.proc = None

    def stop(self, grace=60.0):
        """SIGTERM by PID, SIGKILL after `grace` seconds; returns the exit
        status (None if it had to be killed, or was not running)."""
        if not self.alive():
            self.proc = None
            return None
        proc = self.proc
        self.proc = None
        try:
            os.kill(proc.pid, signal.SIGTERM)
            return proc.wait(grace)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                pass
            return None
        except ProcessLookupError:
            return proc.wait(5)

    # -- the CLI, from the root namespace, through DIR/api.sock

    def cli(self, *args, check=True, timeout=CLI_TIMEOUT):
        return sh([ARBOR, "--data-dir", self.dir, *args], check=check, timeout=timeout)

    def json(self, *args, timeout=CLI_TIMEOUT):
        out = self.cli("--json", *args, timeout=timeout).stdout
        try:
            return json.loads(out)
        except ValueError:
            raise Failure(f"arbor --json {' '.join(args)} on {self.name} printed no JSON:\n{out}") from None

    def status(self):
        return self.json("replica", "status")

    def pair(self, volume, target=None):
        for p in self.status()["pairs"]:
            if p["volume"] == volume and (target is None or p["target"] == target):
                return p
        return None

    def role(self, volume):
        for r in self.status()["replicas"]:
            if r["volume"] == volume:
                return r
        return None

    def volumes(self):
        return {v["name"]: v for v in self.json("volume", "list")}

    def snapshots(self, volume):
        """VOLUME's snapshot names, oldest first."""
        snaps = [v for n, v in self.volumes().items() if n.startswith(volume + "@")]
        snaps.sort(key=lambda v: (v["created_txn"], v["name"]))
        return [v["name"] for v in snaps]

    def run(self, volume, target=None, check=True, timeout=RUN_TIMEOUT):
        """`arbor --json replica run VOLUME`: the JSON list on success, the
        CompletedProcess when check is False and it failed."""
        args = ["--json", "replica", "run", volume] + (["--target", target] if target else [])
        proc = self.cli(*args, check=check, timeout=timeout)
        if proc.returncode != 0:
            return proc
        return json.loads(proc.stdout)

    def run_bg(self, volume, target=None):
        """`arbor --json replica run VOLUME` in the background (killed by
        the part's close() if still running)."""
        args = [ARBOR, "--data-dir", self.dir, "--json", "replica", "run", volume]
        if target:
            args += ["--target", target]
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                stdin=subprocess.DEVNULL)
        self.children.append(proc)
        return proc

    def add(self, volume, target, *extra):
        return self.cli("replica", "add", volume, "--target", target, "--interval", "1h", *extra)

    def receive_offset(self, volume):
        """The committed offset of a receive left half done into VOLUME, or
        -1 if there is none."""
        proc = self.cli("--json", "receive", "--status", volume, check=False)
        if proc.returncode != 0:
            return -1
        try:
            return json.loads(proc.stdout)["offset"]
        except (ValueError, KeyError):
            return -1

    def check_clean(self):
        got = self.json("check", timeout=300)
        return got.get("clean") is True, got

    def uri(self, export):
        return f"nbd+unix:///{export}?socket={self.nbd}"

    def metrics(self):
        """GET /metrics through DIR/api.sock: {"name{labels}": value}."""
        conn = socket.socket(socket.AF_UNIX)
        conn.settimeout(30)
        try:
            conn.connect(self.api)
            conn.sendall(b"GET /metrics HTTP/1.0\r\nHost: arbor\r\n\r\n")
            data = b""
            while True:
                piece = conn.recv(65536)
                if not piece:
                    break
                data += piece
        finally:
            conn.close()
        out = {}
        for line in data.decode(errors="replace").split("\r\n\r\n", 1)[-1].splitlines():
            if line and not line.startswith("#") and " " in line:
                key, value = line.rsplit(" ", 1)
                out[key] = value
        return out

    def digest(self, export):
        return digest(self.uri(export))


def digest(uri):
    """md5 of a whole export, read by nbdcopy."""
    try:
        proc = subprocess.run(["nbdcopy", uri, "-"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              timeout=120, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise Failure(f"nbdcopy {uri} - took over 120 s") from None
    if proc.returncode != 0:
        raise Failure(f"nbdcopy {uri} - exited {proc.returncode}: {proc.stderr.decode(errors='replace')}")
    return hashlib.md5(proc.stdout).hexdigest()


def qemu_io(host, export, *commands, check=True):
    args = ["qemu-io", "-f", "raw"]
    for c in commands:
        args += ["-c", c]
    return sh(args + [host.uri(export)], check=check, timeout=120)


def finish(bg, timeout=120):
    """Waits (bounded) for a background `replica run` (Host.run_bg) and
    returns its CompletedProcess."""
    try:
        out, err = bg.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        bg.kill()
        bg.communicate(timeout=10)
        raise Failure(f"a background `replica run` did not end within {timeout} s")
    return subprocess.CompletedProcess(bg.args, bg.returncode, out, err)


def read_only(host, export):
    """Whether the export is read-only, as nbdinfo sees it."""
    out = sh(["nbdinfo", "--json", host.uri(export)]).stdout
    return json.loads(out)["exports"][0]["is_read_only"]


def failed_with(proc, kind):
    """A failed `arbor replica run` whose message has "(kind)"."""
    return not isinstance(proc, list) and proc.returncode != 0 and f"({kind})" in proc.stderr + proc.stdout


def describe(proc):
    if isinstance(proc, list):
        return f"succeeded: {json.dumps(proc)}"
    return f"exit {proc.returncode}: {(proc.stderr + proc.stdout).strip()}"


def log_resumes(host, since=0):
    """resumed_from of each "replica received" line in host's log after
    character `since`."""
    out = []
    for line in host.log()[since:].splitlines():
        if "replica received" in line:
            m = re.search(r"resumed_from=(\d+)", line)
            if m:
                out.append(int(m.group(1)))
    return out


# ---- a part: its own network, certificates and daemons -----------------------

class Part:
    """One part's world: a Network with `hosts`, certificates for each (SAN
    DNS:NAME and IP:its address), a temporary directory; everything closed
    in close(), whatever happened."""

    def __init__(self, hosts):
        self.tmp = tempfile.mkdtemp(prefix="arbor-repl-")
        self.hosts = {}
        self.net = None
        try:
            self.net = netns.Network(hosts)
            self.certs = os.path.join(self.tmp, "certs")
            netns.make_certs(self.certs, hosts, {h: self.net.addr(h) for h in hosts})
        except BaseException:
            self.close()
            raise

    def host(self, name, **kw):
        h = Host(self.net, name, self.tmp, self.certs, **kw)
        self.hosts[name] = h
        return h

    def stop_all(self):
        """Stops every daemon (SIGTERM); each must exit 0."""
        bad = []
        for h in self.hosts.values():
            if h.alive():
                code = h.stop()
                if code != 0:
                    bad.append(f"{h.name} exited {code} on SIGTERM:\n{h.log()[-2000:]}")
        check(not bad, "every daemon stops cleanly on SIGTERM", "\n".join(bad))

    def close(self):
        for h in self.hosts.values():
            for child in h.children:
                if child.poll() is None:
                    child.kill()
                    try:
                        child.wait(10)
                    except subprocess.TimeoutExpired:
                        pass
            try:
                h.stop(grace=20)
            except Exception as e:
                print(f"cleanup: stopping {h.name}: {e}", file=sys.stderr)
        if self.net is not None:
            try:
                self.net.close()
            except Exception as e:
                print(f"cleanup: closing the network: {e}", file=sys.stderr)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def logs(self):
        return "\n".join(f"--- {h.name}'s daemon log (tail):\n{h.log()[-4000:]}" for h in self.hosts.values())


# ---- NBD clients in child processes (each bounded by a timeout) --------------

_WRITER = r"""
import random, sys, nbd
uri, offset, length, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rng = random.Random(seed)
h = nbd.NBD()
h.connect_uri(uri)
at, step = offset, 8 << 20
while at < offset + length:
    n = min(step, offset + length - at)
    h.pwrite(rng.randbytes(n), at)
    at += n
h.flush()
h.shutdown()
"""

_LOAD = r"""
import os, random, sys, nbd
uris, seed, stop = sys.argv[1].split(","), int(sys.argv[2]), sys.argv[3]
rng = random.Random(seed)
handles = []
for uri in uris:
    h = nbd.NBD()
    h.connect_uri(uri)
    handles.append(h)
blocks = [h.get_size() // 65536 for h in handles]
writes = 0
while not os.path.exists(stop):
    for h, n in zip(handles, blocks):
        h.pwrite(rng.randbytes(65536), rng.randrange(n) * 65536)
        writes += 1
    if writes % 64 == 0:
        for h in handles:
            h.flush()
for h in handles:
    h.flush()
    h.shutdown()
print(writes)
"""

_RAW_WRITE = r"""
import sys, nbd
h = nbd.NBD()
h.connect_uri(sys.argv[1])
h.set_strict_mode(0)
try:
    h.pwrite(b"\x66" * 65536, 0)
    h.flush()
except nbd.Error as e:
    print(f"refused: {e}")
    sys.exit(3)
print("the write was accepted")
"""

_READER = r"""
import json, os, sys, time, nbd
uri, stop, region, mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
h = nbd.NBD()
h.connect_uri(uri)
size = h.get_size()
offsets = list(range(0, size, region))
if mode == "backwards":
    offsets.reverse()
reads = passes = 0
mixed, seen, errors = [], [], []
while not os.path.exists(stop) and len(errors) < 5:
    if mode == "reconnecting" and passes:
        h.shutdown()
        h = nbd.NBD()
        h.connect_uri(uri)
    pass_patterns = set()
    for off in offsets:
        try:
            buf = h.pread(min(region, size - off), off)
        except nbd.Error as e:
            errors.append(f"read at {off}: {e}")
            continue
        reads += 1
        first = buf[0]
        if buf.count(first) != len(buf):
            if len(mixed) < 10:
                mixed.append({"offset": off, "bytes": sorted(set(buf))[:8], "pass": passes})
            continue
        pass_patterns.add(first)
        if not seen or seen[-1] != first:
            seen.append(first)
    passes += 1
    print(json.dumps({"pass": passes, "patterns": sorted(pass_patterns)}), flush=True)
h.shutdown()
print(json.dumps({"done": True, "reads": reads, "passes": passes, "mixed": mixed, "seen": seen,
                  "errors": errors}), flush=True)
"""


def check_read_only(host, volume, want):
    """host's VOLUME is a replica: its export read-only, a write through
    it and a snapshot of it refused, its contents still `want` (md5)."""
    check(read_only(host, volume) is True, f"{host.name}'s {volume} export is read-only (nbdinfo)")
    w = qemu_io(host, volume, "write -P 0x66 0 64k", check=False)
    out = (w.stdout + w.stderr).lower()
    check(w.returncode != 0 or "failed" in out or "error" in out or "read-only" in out,
          f"a write to {host.name}'s {volume} fails ({(w.stdout + w.stderr).strip()[:120]})")
    # libnbd checks the export's flags itself; without strict mode the
    # write reaches the server, which must refuse it too.
    w = sh([sys.executable, "-c", _RAW_WRITE, host.uri(volume)], check=False, timeout=60)
    check(w.returncode == 3, f"a write request sent anyway to {host.name}'s {volume} is refused by the server "
          f"({w.stdout.strip()[:120]})", f"exit {w.returncode}: {w.stdout}{w.stderr}")
    s = host.cli("snapshot", "create", f"{volume}@mine", check=False)
    check(s.returncode != 0 and f"{volume}@mine" not in host.volumes(),
          f"`arbor snapshot create {volume}@mine` on {host.name} is refused ({(s.stderr or s.stdout).strip()[:160]})")
    check(host.digest(volume) == want, f"{host.name}'s {volume} is unchanged by the attempts")


def write_random(host, export, offset, length, seed):
    """Random data (seeded) written at offset through libnbd, flushed."""
    sh([sys.executable, "-c", _WRITER, host.uri(export), offset, length, seed], timeout=180)


# ---- part 1: chain and tree under load ---------------------------------------

def part_topologies():
    say("part 1: chain a -> b -> c (vm1) and tree a -> {b, c} (vm2) under a write load on a")
    part = Part(["a", "b", "c"])
    try:
        a = part.host("a", allow=[("c", ["*"], 0)]).start()
        b = part.host("b", allow=[("a", ["*"], 0)]).start()
        c = part.host("c", allow=[("b", ["vm1"], 0), ("a", ["vm2"], 0)]).start()
        for vol in ("vm1", "vm2"):
            a.cli("volume", "create", vol, "--size", "64M")
            write_random(a, vol, 0, 64 * MIB, SEED + int(vol[-1]))
        a.add("vm1", b.target())
        a.add("vm2", b.target())
        a.add("vm2", c.target())
        # The first cycles run at once; a run queues behind them.
        a.run("vm1")
        a.run("vm2")
        b.add("vm1", c.target())
        b.run("vm1")
        check(set(c.volumes()) >= {"vm1", "vm2"}, "c received vm1 (through b) and vm2 (from a)")

        stop = os.path.join(part.tmp, "stop-load")
        load = subprocess.Popen([sys.executable, "-c", _LOAD, f"{a.uri('vm1')},{a.uri('vm2')}",
                                 str(SEED), stop], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, stdin=subprocess.DEVNULL)
        try:
            taken = 0
            for i in range(4):
                # Besides the load, a write of known size, so every cycle has changes.
                for vol in ("vm1", "vm2"):
                    qemu_io(a, vol, f"write -P {0x40 + i} {(8 + i) * MIB} 256k")
                cycles = ((a, "vm1"), (b, "vm1"), (a, "vm2"))
                if i < 2:  # one after the other
                    results = [(host, host.run(vol, check=False)) for host, vol in cycles]
                else:  # all at once: b receives vm1 from a while it sends vm1 to c
                    bgs = [(host, host.run_bg(vol)) for host, vol in cycles]
                    results = [(host, finish(bg)) for host, bg in bgs]
                    results = [(host, json.loads(r.stdout) if r.returncode == 0 else r) for host, r in results]
                for host, got in results:
                    if not isinstance(got, list):
                        raise Failure(f"a cycle on {host.name} under load failed: {describe(got)}")
                    if host is a:
                        taken += sum(1 for r in got if r["taken"])
                    if host is b and any(r["taken"] for r in got):
                        raise Failure(f"b (a replica of vm1) took a snapshot while forwarding: {got}")
                how = "one after the other" if i < 2 else "concurrently"
                check(load.poll() is None, f"cycle round {i + 1} under load, {how}: a -> b, b -> c, a -> b and c")
        finally:
            with open(stop, "w"):
                pass
            try:
                out, err = load.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                load.kill()
                out, err = load.communicate(timeout=10)
        check(load.returncode == 0 and int(out.strip() or 0) > 0,
              f"the load wrote throughout ({out.strip()} writes of 64 KiB)", err)
        # Each round wrote both volumes first: at least one snapshot of each.
        check(taken >= 8, f"a took snapshots in the cycles under load ({taken} in 12 pair cycles)")

        # Final cycles with the load stopped.
        a.run("vm1")
        b.run("vm1")
        a.run("vm2")
        for vol, hosts in (("vm1", (a, b, c)), ("vm2", (a, b, c))):
            names = {h.name: h.snapshots(vol) for h in hosts}
            check(names["a"] and names["a"] == names["b"] == names["c"],
                  f"{vol}: a, b and c have the same {len(names['a'])} snapshots", json.dumps(names, indent=1))
            newest = names["a"][-1]
            sums = {f"{h.name}:{newest}": h.digest(newest) for h in hosts}
            sums[f"a:{vol}"] = a.digest(vol)
            for h in (b, c):
                sums[f"{h.name}:{vol} (replica export)"] = h.digest(vol)
            check(len(set(sums.values())) == 1,
                  f"{vol}: the newest snapshot is identical on a, b, c, and the replicas' exports serve it",
                  json.dumps(sums, indent=1))
            oldest = names["a"][0]
            check(a.digest(oldest) == c.digest(oldest), f"{vol}: the oldest snapshot {oldest} too")
        roles = {r["volume"]: r for r in c.status()["replicas"]}
        check(roles.get("vm1", {}).get("path") == ["a", "b"] and roles["vm1"].get("source") == "b",
              "c's status: vm1 came a -> b, from b", json.dumps(roles))
        check(roles.get("vm2", {}).get("path") == ["a"] and roles["vm2"].get("source") == "a",
              "c's status: vm2 came from a", json.dumps(roles))
        role = b.role("vm1")
        check(role and role["path"] == ["a"], "b's status: vm1 came from a", json.dumps(role))
        # c sending vm1 back to a (which allows c) would close a loop.
        c.add("vm1", a.target())
        run = c.run("vm1", check=False)
        check(failed_with(run, "cycle"), "c -> a for vm1 (path a -> b -> c) is refused: (cycle)", describe(run))
        c.cli("replica", "remove", "vm1")
        pairs = a.status()["pairs"]
        check(len(pairs) == 3 and all(p["state"] == "idle" and p["cycles_failed"] == 0 for p in pairs),
              "a's three pairs are idle with no failed cycle", json.dumps(pairs, indent=1))
        check(all(p["last_snapshot"] == a.snapshots(p["volume"])[-1] and p["bytes_sent_total"] > 0
                  and p["recovery_point_secs"] is not None for p in pairs),
              "a's status: each pair's last snapshot is the volume's newest; bytes and recovery point shown",
              json.dumps(pairs, indent=1), soft=True)
        got = a.metrics()
        for p in pairs:
            labels = f'{{volume="{p["volume"]}",target="{p["target"]}"}}'
            values = {m: got.get(f"arbor_replica_{m}{labels}") for m in
                      ("recovery_point_seconds", "sent_bytes", "failed", "cycles_succeeded", "cycles_failed")}
            check(None not in values.values() and values["failed"] == "0" and values["cycles_failed"] == "0"
                  and int(values["cycles_succeeded"]) == p["cycles_ok"],
                  f"a's /metrics for {p['volume']} -> {p['target']} agree with its status", json.dumps(values),
                  soft=True)

        # Replicas are read-only.
        newest = a.snapshots("vm1")[-1]
        want = a.digest(newest)
        for h in (b, c):
            check_read_only(h, "vm1", want)

        # Holds: each pair's on the newest snapshot its target has (here the
        # newest), each replica's on the newest it received; on no other.
        tags = [(a, "vm1", f"replica-to:{b.target()}:vm1"), (a, "vm2", f"replica-to:{b.target()}:vm2"),
                (a, "vm2", f"replica-to:{c.target()}:vm2"), (b, "vm1", f"replica-to:{c.target()}:vm1"),
                (b, "vm1", "replica:upstream"), (b, "vm2", "replica:upstream"),
                (c, "vm1", "replica:upstream"), (c, "vm2", "replica:upstream")]
        for h, vol, tag in tags:
            held = {n: v.get("holds") or [] for n, v in h.volumes().items() if n.startswith(vol + "@")}
            carrying = [n for n, t in held.items() if tag in t]
            check(carrying == [h.snapshots(vol)[-1]], f"{h.name}: {tag} holds {vol}'s newest snapshot only",
                  json.dumps(held, indent=1), soft=True)

        # Nothing but replication changes a replica (docs/REPLICATION.md,
        # "Divergence"): b's vm1 and its snapshots.
        names = b.snapshots("vm1")
        a.cli("snapshot", "create", "vm1@extra")
        stream = os.path.join(part.tmp, "extra.stream")
        a.cli("send", "vm1@extra", "--from", names[-1], "-o", stream)
        for args, what in (
                (["rename", "vm1", "vm9"], "renaming the replica"),
                (["rename", names[0], "vm1@renamed"], f"renaming its snapshot {names[0]}"),
                (["rollback", names[0]], f"rolling it back to {names[0]}"),
                (["volume", "resize", "vm1", "128M"], "resizing it"),
                (["receive", "vm1", "-i", stream], "`arbor receive` into it")):
            r = b.cli(*args, check=False)
            check(r.returncode != 0, f"b refuses {what} (`arbor {' '.join(args)}`: exit {r.returncode}, "
                  f"{(r.stderr or r.stdout).strip()[:140]})", soft=True)
        check(b.snapshots("vm1") == names and b.digest("vm1") == want,
              "b's vm1 and its snapshot names are unchanged", f"{b.snapshots('vm1')} != {names}", soft=True)
        for h in (a, b, c):
            clean, got = h.check_clean()
            check(clean, f"{h.name}: `arbor check` clean", json.dumps(got))
        part.stop_all()
    except Exception:
        say(part.logs())
        raise
    finally:
        part.close()


# ---- part 2: faults --------------------------------------------------------------

BIG = 224 * MIB  # random data per transfer in part 2
RATE = "64M"  # part 2's pair rate limit: a transfer takes a few seconds, so a fault lands mid-stream
MID = 2 * CHECKPOINT  # the target's committed offset at which a fault is injected


def stream_size(a, volume, since):
    """Bytes of the streams that carry `volume`'s snapshots after `since`,
    each from the one before (raw: an upper bound, the data is random)."""
    snaps = a.snapshots(volume)
    chain = snaps[snaps.index(since):]
    return sum(a.json("send", to, "--from", base, "--dry-run")["stream_bytes_max"]
               for base, to in zip(chain, chain[1:]))


def mid_stream(a, b, volume, bg):
    """Waits until b has committed MID bytes of the stream into `volume`
    (a checkpoint), while `bg` (the run) still runs; returns the offset."""
    def reached():
        if bg.poll() is not None:
            out, err = bg.communicate()
            raise Failure(f"the run ended before a fault could be injected mid-stream (exit "
                          f"{bg.returncode}): {out}{err}")
        off = b.receive_offset(volume)
        return off if off >= MID else None
    return poll(reached, f"b to commit {MID >> 20} MiB of the stream", timeout=120, interval=0.05)


def resumed(run_json, b, log_mark):
    """Where the stream resumed: from the run's JSON if its cycle sent it,
    else (a cycle retried by the daemon's own backoff did) from b's log."""
    offsets = [o for r in run_json for o in r["resumed_from"]]
    if offsets:
        return max(offsets), "the run's JSON"
    from_log = log_resumes(b, log_mark)
    return (max(from_log) if from_log else 0), f"b's log (a retry by the daemon sent it: {json.dumps(run_json)})"


def check_resumed(a, b, at, mark, base=None, before=None, after="the next run"):
    """The run after a fault mid-stream: it succeeds, resumes from at least
    `at` (what b had committed), sends over all attempts (since `before`
    bytes) about one stream from `base` (when given), and leaves b's vm1,
    its newest snapshot and its snapshot list identical to a's."""
    run = a.run("vm1", check=False)
    check(isinstance(run, list), f"{after} succeeds", describe(run))
    offset, source = resumed(run, b, mark)
    check(offset >= at, f"it resumed from {offset >> 20} MiB ({source}), at least the "
          f"{at >> 20} MiB b committed")
    if base is not None:
        full = stream_size(a, "vm1", base)
        total = a.pair("vm1")["bytes_sent_total"] - before
        bound = int((full + CHECKPOINT) * 1.1)
        check(total <= bound, f"bytes sent over all attempts {total / MIB:.1f} MiB <= (the streams "
              f"{full / MIB:.1f} MiB + 16 MiB) + 10%")
    newest = a.snapshots("vm1")[-1]
    want = a.digest(newest)
    check(b.digest("vm1") == want and b.digest(newest) == want,
          f"b's vm1 and {newest} are identical to a's")
    check(b.snapshots("vm1") == a.snapshots("vm1"), "b has a's snapshots of vm1")


def part_faults():
    say("part 2: faults: a cut link, kill -9 of the receiver and of the sender mid-stream, a full target")
    part = Part(["a", "b", "c"])
    try:
        a = part.host("a").start()
        b = part.host("b", allow=[("a", ["*"], 0)]).start()
        c = part.host("c", allow=[("a", ["*"], 0)], pool_size="64M").start()
        a.cli("volume", "create", "vm1", "--size", "256M")
        qemu_io(a, "vm1", "write -P 0x01 0 1M")
        a.add("vm1", b.target(), "--rate-limit", RATE)
        a.run("vm1")  # after the first cycle: b has vm1's first snapshot

        # -- the link cut mid-stream
        say("  the link cut mid-stream")
        write_random(a, "vm1", 0, BIG, SEED + 1)
        base = a.snapshots("vm1")[-1]
        before = a.pair("vm1")["bytes_sent_total"]
        mark = len(b.log())
        bg = a.run_bg("vm1")
        at = mid_stream(a, b, "vm1", bg)
        part.net.cut("b")
        try:
            got = finish(bg)
            check(failed_with(got, "connection"),
                  f"cut at {at >> 20} MiB committed: the run fails with (connection)", describe(got))
            p = poll(lambda: (lambda p: p if p["state"] == "failed" else None)(a.pair("vm1")),
                     "a's pair to show failed while the link is cut", timeout=60)
            check(p["error_kind"] == "connection", f"a's status: failed, error_kind connection ({p['error']})")
            # While the target is unreachable, a changed volume costs no snapshot.
            count = len(a.snapshots("vm1"))
            qemu_io(a, "vm1", "write -P 0x5c 250M 1M")
            got = a.run("vm1", check=False)
            check(failed_with(got, "connection"), "a run while the link is down fails with (connection)",
                  describe(got))
            check(len(a.snapshots("vm1")) == count, "and takes no snapshot (none without a connection)",
                  json.dumps(a.snapshots("vm1")), soft=True)
        finally:
            part.net.restore("b")
        check(part.net.wait_reachable("a", "b", timeout=30), "after the restore a reaches b again")
        check_resumed(a, b, at, mark, base, before)

        # -- the receiver killed mid-stream
        say("  the receiving daemon killed with SIGKILL mid-stream")
        write_random(a, "vm1", 16 * MIB, BIG, SEED + 2)
        base = a.snapshots("vm1")[-1]
        before = a.pair("vm1")["bytes_sent_total"]
        bg = a.run_bg("vm1")
        at = mid_stream(a, b, "vm1", bg)
        b.kill()
        got = finish(bg)
        check(failed_with(got, "connection"), f"b killed at {at >> 20} MiB committed: the run fails with "
              "(connection)", describe(got))
        mark = len(b.log())
        b.start()
        check_resumed(a, b, at, mark, base, before, after="after b's restart the next run")

        # -- the sender killed mid-stream
        say("  the sending daemon killed with SIGKILL mid-stream")
        write_random(a, "vm1", 32 * MIB, BIG, SEED + 3)
        mark = len(b.log())
        bg = a.run_bg("vm1")
        at = mid_stream(a, b, "vm1", bg)
        taken = a.snapshots("vm1")[-1]
        a.kill()
        got = finish(bg)
        check(got.returncode != 0, f"a killed at {at >> 20} MiB committed: its run fails", describe(got))
        a.start()
        pair = a.pair("vm1")
        check(pair is not None and pair["target"] == b.target() and pair["rate_limit"],
              "after a's restart its pair is listed, as configured", json.dumps(pair))
        check(taken in a.snapshots("vm1"), f"the snapshot being sent, {taken}, survived a's kill")
        check_resumed(a, b, at, mark, after="after a's restart the next run")

        # -- a target without the space
        say("  a target whose pool is too small")
        a.cli("volume", "create", "vm2", "--size", "256M")
        write_random(a, "vm2", 0, 256 * MIB, SEED + 4)
        a.add("vm2", c.target())
        run = a.run("vm2", check=False)
        check(failed_with(run, "no_space"), "replicating 256 MiB of random data into c's 64 MiB pool fails "
              "with (no_space)", describe(run))

        def failed_no_space():
            p = a.pair("vm2")
            return p if p["state"] == "failed" and p["error_kind"] == "no_space" else None
        p = poll(failed_no_space, "a's status of vm2 -> c to say failed, no_space", timeout=60)
        check(True, f"a's status: state failed, error_kind no_space ({p['error']})")
        a.cli("replica", "remove", "vm2")
        check(c.alive() and c.listening(), "c's daemon keeps running")
        check(not any(n == "vm2" or n.startswith("vm2@") for n in c.volumes()), "c shows no vm2")

        for h in (a, b, c):
            clean, got = h.check_clean()
            check(clean, f"{h.name}: `arbor check` clean", json.dumps(got))
        part.stop_all()
    except Exception:
        say(part.logs())
        raise
    finally:
        part.close()


# ---- part 3: identity -------------------------------------------------------------

# Runs in a host's namespace: connects to argv[1]:argv[2], sends argv[3]
# bytes of garbage (none: stays silent), then waits up to argv[4] seconds
# for the server to close. Prints the outcome; exit 0 if it closed.
_RAW_PEER = r"""
import os, socket, sys, time
host, port, garbage, wait = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
s = socket.create_connection((host, port), timeout=10)
t0 = time.monotonic()
try:
    if garbage:
        s.sendall(b"GET / HTTP/1.0\r\n\r\n" + os.urandom(garbage))
    s.settimeout(wait)
    got = 0
    while True:
        d = s.recv(65536)
        if not d:
            break
        got += len(d)
except (ConnectionResetError, BrokenPipeError) as e:
    print(f"reset after {time.monotonic() - t0:.1f} s: {e}")
    sys.exit(0)
except socket.timeout:
    print(f"still open after {wait} s")
    sys.exit(1)
print(f"closed after {time.monotonic() - t0:.1f} s ({got} bytes received)")
"""

# Runs in a host's namespace: a TLS client that trusts the CA argv[3] but
# shows no certificate of its own. Exit 0 if the server refused it.
_TLS_NO_CERT = r"""
import socket, ssl, sys
host, port, ca = sys.argv[1], int(sys.argv[2]), sys.argv[3]
ctx = ssl.create_default_context(cafile=ca)
ctx.check_hostname = False
try:
    with socket.create_connection((host, port), timeout=10) as raw:
        with ctx.wrap_socket(raw) as s:
            s.settimeout(20)
            s.sendall(b"\0" * 64)
            d = s.recv(1024)
            if d:
                print(f"the server answered {len(d)} bytes")
                sys.exit(1)
            print("closed without an answer")
except (ssl.SSLError, ConnectionResetError, BrokenPipeError) as e:
    print(f"refused: {e}")
except socket.timeout:
    print("neither answered nor closed within 20 s")
    sys.exit(1)
"""


# Runs in a host's namespace: a TLS client with a valid certificate
# (argv[4], argv[5]) that sends argv[6]-style garbage inside the session,
# then waits up to 30 s for the server to close. Exit 0 if it closed.
_TLS_PEER = r"""
import os, socket, ssl, struct, sys, time
host, port, ca, cert, key, mode = sys.argv[1:7]
ctx = ssl.create_default_context(cafile=ca)
ctx.check_hostname = False
ctx.load_cert_chain(cert, key)
raw = socket.create_connection((host, int(port)), timeout=10)
s = ctx.wrap_socket(raw)
t0 = time.monotonic()
if mode == "garbage":
    payload = os.urandom(65536)
elif mode == "huge":  # a frame header announcing a 4 GiB payload
    payload = b"ARPL" + struct.pack("<HHI", 1, 1, 0xFFFFFFFF) + os.urandom(4096)
else:  # "badcrc": a hello-sized frame with a wrong checksum
    body = b'{"volume":"vm1","snapshots":[],"path":["a"],"seeded":false,"force":false}'
    payload = b"ARPL" + struct.pack("<HHI", 1, 1, len(body)) + body + b"\0\0\0\0"
got = 0
try:
    s.sendall(payload)
    s.settimeout(30)
    while True:
        d = s.recv(65536)
        if not d:
            break
        got += len(d)
except (ssl.SSLError, ConnectionResetError, BrokenPipeError) as e:
    print(f"{mode}: reset after {time.monotonic() - t0:.1f} s ({got} bytes received): {e}")
    sys.exit(0)
except socket.timeout:
    print(f"{mode}: still open after 30 s")
    sys.exit(1)
print(f"{mode}: closed after {time.monotonic() - t0:.1f} s ({got} bytes received)")
"""


def part_identity():
    say("part 3: identity: a rogue CA, the allow list, garbage on the listener")
    part = Part(["a", "b", "c", "d", "m"])
    try:
        # m ("mallory") has a certificate that says "a" (and m's address),
        # signed by another CA.
        rogue = os.path.join(part.tmp, "rogue")
        made = netns.make_rogue_cert(rogue, "a", ip=part.net.addr("m"))
        # m trusts both CAs (a daemon checks its own certificate against
        # its bundle); the others trust only the genuine one.
        bundle = os.path.join(rogue, "bundle.pem")
        with open(bundle, "w") as out:
            for pem in (os.path.join(part.certs, "ca.pem"), made["rogue-ca.pem"]):
                with open(pem) as f:
                    out.write(f.read())
        a = part.host("a").start()
        b = part.host("b", allow=[("a", ["vm1"], 0), ("d", ["vm1"], 0)]).start()
        c = part.host("c").start()
        d = part.host("d").start()
        m = part.host("m", cert="a", cert_dir=rogue, ca=bundle, allow=[("a", ["*"], 0)]).start()
        for h in (a, c, d, m):
            h.cli("volume", "create", "vm1", "--size", "64M")
            qemu_io(h, "vm1", f"write -P 0x{ord(h.name):02x} 0 4M")
        a.cli("volume", "create", "vm2", "--size", "64M")
        a.cli("volume", "create", "vm3", "--size", "64M")

        say("  a source whose certificate another CA signed (claiming to be a)")
        m.add("vm1", b.target())
        run = m.run("vm1", check=False)
        check(not isinstance(run, list), f"m's run to b fails: {describe(run)[:200]}")
        check("vm1" not in b.volumes() and not b.status()["replicas"], "b has no vm1 and no replica")

        say("  a target whose certificate another CA signed")
        a.add("vm3", m.target())
        run = a.run("vm3", check=False)
        check(not isinstance(run, list), f"a's run to m fails: {describe(run)[:200]}")
        check("vm3" not in m.volumes() and not any(n.startswith("vm3@") for n in m.volumes()),
              "m received nothing")
        a.cli("replica", "remove", "vm3")
        # The genuine b, expected to be someone else.
        a.add("vm3", b.target(), "--identity", "c")
        run = a.run("vm3", check=False)
        check(failed_with(run, "connection") and "vm3" not in b.volumes(),
              f"a's run to b's address expecting identity c fails in TLS: {describe(run)[:200]}")
        a.cli("replica", "remove", "vm3")

        say("  a valid source, or volume, the target does not allow")
        c.add("vm1", b.target())
        run = c.run("vm1", check=False)
        check(failed_with(run, "not_allowed"), "c (not in b's replication_allow) is refused: (not_allowed)",
              describe(run))
        p = poll(lambda: (lambda p: p if p["state"] == "failed" else None)(c.pair("vm1")),
                 "c's pair to show failed", timeout=60)
        check(p["error_kind"] == "not_allowed", f"c's status: error_kind not_allowed ({p['error']})")
        a.add("vm2", b.target())
        run = a.run("vm2", check=False)
        check(failed_with(run, "not_allowed"), "a's vm2 (b allows a's vm1 only) is refused: (not_allowed)",
              describe(run))
        check(not {"vm1", "vm2"} & set(b.volumes()), "b has neither vm1 nor vm2")
        c.cli("replica", "remove", "vm1")
        a.cli("replica", "remove", "vm2")

        say("  garbage, a silent connection, a TLS client without a certificate, garbage inside TLS")
        for garbage, what in ((65536, "plain TCP garbage"), (0, "a silent connection")):
            r = part.net.run("a", [sys.executable, "-c", _RAW_PEER, b.addr, PORT, garbage, 60],
                             check=False, timeout=90)
            check(r.returncode == 0, f"{what}: b disconnects it ({r.stdout.strip()})", r.stderr)
        r = part.net.run("a", [sys.executable, "-c", _TLS_NO_CERT, b.addr, PORT,
                               os.path.join(part.certs, "ca.pem")], check=False, timeout=90)
        check(r.returncode == 0, f"a TLS client without a certificate: refused ({r.stdout.strip()[:160]})",
              r.stderr)
        for mode in ("garbage", "huge", "badcrc"):
            r = part.net.run("a", [sys.executable, "-c", _TLS_PEER, b.addr, PORT, os.path.join(part.certs, "ca.pem"),
                                   os.path.join(part.certs, "a.pem"), os.path.join(part.certs, "a.key"), mode],
                             check=False, timeout=90)
            check(r.returncode == 0, f"a's genuine certificate, then {mode} frames: b disconnects "
                  f"({r.stdout.strip()[:120]})", r.stderr)
        check(b.alive() and b.listening(), "b's daemon keeps running")
        check(not b.status()["replicas"] and "vm1" not in b.volumes(), "and nothing was created on b")

        say("  the allowed source")
        a.add("vm1", b.target())
        run = a.run("vm1", check=False)
        check(isinstance(run, list), "a's vm1 replicates to b", describe(run))
        newest = a.snapshots("vm1")[-1]
        check(b.digest("vm1") == a.digest(newest), f"b's vm1 is identical to a's {newest}")
        role = b.role("vm1")
        check(role and role["source"] == "a" and role["path"] == ["a"], "b's status: vm1 from a",
              json.dumps(role))

        say("  a second source for the same replica")
        # d is allowed vm1 on b, but b's vm1 already has its one source, a.
        d.add("vm1", b.target())
        run = d.run("vm1", check=False)
        check(failed_with(run, "not_allowed") and "replica of a" in run.stderr,
              "d's vm1 to b (a replica of a's) is refused: (not_allowed)", describe(run))
        d.cli("replica", "remove", "vm1")
        check(b.digest("vm1") == a.digest(newest) and b.role("vm1")["source"] == "a",
              "b's vm1 is still a's, unchanged")
        for h in (a, b, m):
            clean, got = h.check_clean()
            check(clean, f"{h.name}: `arbor check` clean", json.dumps(got))
        part.stop_all()
    except Exception:
        say(part.logs())
        raise
    finally:
        part.close()


# ---- part 4: divergence and failover ---------------------------------------------

def part_failover():
    say("part 4: a diverged replica, resync --force, failover to b and failback")
    part = Part(["a", "b"])
    try:
        # The certificates each direction needs, as docs/REPLICATION.md
        # makes them: one CA by `tls init` on a, b's server certificate
        # (which also authenticates b as a source, for the failback) added
        # under it by `tls add`.
        tls = os.path.join(part.tmp, "arbor-tls")
        sh([ARBOR, "tls", "init", tls, "--host", "a", "--host", part.net.addr("a")])
        sh([ARBOR, "tls", "add", tls, "--server", "b", "--host", part.net.addr("b")])
        ca = os.path.join(tls, "ca.pem")
        a = part.host("a", allow=[("b", ["*"], 0)], cert_dir=tls, cert="server",
                      key=os.path.join(tls, "server-key.pem"), ca=ca).start()
        b = part.host("b", allow=[("a", ["*"], 0)], cert_dir=tls, cert="server-b",
                      key=os.path.join(tls, "server-b-key.pem"), ca=ca).start()
        a.cli("volume", "create", "vm1", "--size", "64M")
        write_random(a, "vm1", 0, 64 * MIB, SEED + 10)
        a.add("vm1", b.target())
        a.run("vm1")
        qemu_io(a, "vm1", "write -P 0x22 1M 1M")
        a.run("vm1")
        check(b.snapshots("vm1") == a.snapshots("vm1") and len(a.snapshots("vm1")) == 2,
              "b has a's two snapshots of vm1")

        say("  divergence: b's replica promoted, written and snapshotted, demoted")
        b.cli("replica", "promote", "vm1")
        check(read_only(b, "vm1") is False, "promoted, b's vm1 export is writable")
        qemu_io(b, "vm1", "write -P 0x99 0 1M")
        b.cli("snapshot", "create", "vm1@local")
        qemu_io(b, "vm1", "write -P 0x98 4M 1M")

        say("  a source never overwrites a volume writable on its target (issue 39, 4)")
        # What the issue found: on a, the hints followed by hand (remove,
        # add --seeded, resync --force) rolled b's promoted vm1 back.
        before = b.digest("vm1")
        a.cli("replica", "remove", "vm1")
        a.add("vm1", b.target(), "--seeded")
        forced = a.cli("--json", "replica", "resync", "vm1", "--force", check=False, timeout=RUN_TIMEOUT)
        check(failed_with(forced, "not_allowed") and "writable on b" in forced.stderr + forced.stdout,
              "`resync vm1 --force` to b's promoted vm1 is refused: (not_allowed), writable on b",
              describe(forced))
        check("vm1@local" in b.volumes() and b.digest("vm1") == before,
              "b's promoted vm1 keeps its snapshot vm1@local and its writes")
        check(read_only(b, "vm1") is False and b.role("vm1") is None, "b's vm1 stays writable, no replica")
        a.cli("replica", "remove", "vm1")
        a.add("vm1", b.target())

        dry = b.json("replica", "demote", "vm1", "--dry-run")
        check(not dry["demoted"] and b.role("vm1") is None and read_only(b, "vm1") is False,
              "`demote --dry-run` changes nothing", json.dumps(dry))
        demoted = b.json("replica", "demote", "vm1")
        check(demoted["demoted"] and demoted["written_since_newest"]
              and demoted["snapshots"][-1] == "vm1@local" and len(demoted["snapshots"]) == 3,
              "`demote` lists what a forced resync may discard: vm1@local (newest of 3) and the "
              "writes since", json.dumps(demoted))
        check(read_only(b, "vm1") is True, "demoted, b's vm1 export is read-only again")
        qemu_io(a, "vm1", "write -P 0x33 2M 1M")
        run = a.run("vm1", check=False)
        check(failed_with(run, "diverged") and "vm1@local" in run.stderr + run.stdout,
              "a's run fails with (diverged), naming vm1@local", describe(run))
        check(a.pair("vm1")["error_kind"] == "diverged", "a's status: error_kind diverged")
        check("vm1@local" in b.volumes(), "the refused run left b's vm1@local alone")
        got = a.json("replica", "resync", "vm1", "--force", timeout=RUN_TIMEOUT)
        check(any("vm1@local" in x for r in got for x in r["rolled_back"]),
              "`replica resync vm1 --force` rolled vm1@local back", json.dumps(got))
        check("vm1@local" not in b.volumes(), "b's vm1@local is gone")
        names = a.snapshots("vm1")
        check(b.snapshots("vm1") == names, "b has exactly a's snapshots", f"{b.snapshots('vm1')} != {names}")
        want = a.digest(names[-1])
        check(b.digest("vm1") == want == a.digest("vm1"), f"b's vm1 is identical to a's newest, {names[-1]}")
        p = a.pair("vm1")
        check(p["state"] == "idle" and not p["resync"], "a's pair is idle again, resync done", json.dumps(p))
        qemu_io(a, "vm1", "write -P 0x34 3M 1M")
        run = a.run("vm1")
        check(run[0]["taken"] and not run[0]["rolled_back"], "the next cycle is an ordinary one")

        say("  a replica that shares no snapshot with its source")
        b.cli("volume", "create", "vm5", "--size", "64M")
        qemu_io(b, "vm5", "write -P 0x55 0 1M")
        b.cli("snapshot", "create", "vm5@own")
        b.cli("replica", "demote", "vm5")
        a.cli("volume", "create", "vm5", "--size", "64M")
        qemu_io(a, "vm5", "write -P 0x5a 0 1M")
        a.add("vm5", b.target())
        run = a.run("vm5", check=False)
        check(failed_with(run, "diverged") and "shares no snapshot" in run.stderr,
              "a's vm5 to b's unrelated vm5 is refused: (diverged), sharing no snapshot", describe(run))
        forced = a.cli("--json", "replica", "resync", "vm5", "--force", check=False, timeout=RUN_TIMEOUT)
        check(failed_with(forced, "diverged") and "vm5@own" in b.volumes(),
              "`resync vm5 --force` is refused too, and b's vm5@own stays", describe(forced))
        # Deleting it reseeds it.
        b.cli("destroy", "vm5@own")
        b.cli("destroy", "vm5")
        check(b.role("vm5") is None, "b's destroyed vm5 is no longer listed as a replica",
              json.dumps(b.status()["replicas"]), soft=True)
        run = a.run("vm5", check=False)
        check(isinstance(run, list) and run[0]["sent"], "then a's run seeds it afresh", describe(run))
        check(b.digest("vm5") == a.digest(a.snapshots("vm5")[-1]) and b.snapshots("vm5") == a.snapshots("vm5"),
              "b's vm5 is identical to a's")
        a.cli("replica", "remove", "vm5")

        say("  failover: a's pair removed, b promoted and written, a demoted, b replicates to a")
        a.cli("replica", "remove", "vm1")
        b.cli("replica", "promote", "vm1")
        qemu_io(b, "vm1", "write -P 0x44 5M 2M")
        a.cli("replica", "demote", "vm1")
        check(read_only(a, "vm1") is True, "demoted, a's vm1 export is read-only")
        b.add("vm1", a.target())
        run = b.run("vm1", check=False)
        check(isinstance(run, list), "b's run to a succeeds", describe(run))
        names = b.snapshots("vm1")
        want = b.digest(names[-1])
        check(a.snapshots("vm1") == names, "a has exactly b's snapshots", f"{a.snapshots('vm1')} != {names}")
        check(a.digest("vm1") == want and a.digest(names[-1]) == want,
              f"a's vm1 is identical to b's newest, {names[-1]}")
        check(b.digest("vm1") == want, "and to b's vm1 (not written since)")
        role = a.role("vm1")
        check(role and role["source"] == "b" and role["path"] == ["b"], "a's status: vm1 is a replica of b",
              json.dumps(role))
        check(b.role("vm1") is None, "b's status: vm1 is no replica there")
        check_read_only(a, "vm1", want)
        for h in (a, b):
            clean, got = h.check_clean()
            check(clean, f"{h.name}: `arbor check` clean", json.dumps(got))
        part.stop_all()
    except Exception:
        say(part.logs())
        raise
    finally:
        part.close()


# ---- part 5: the replica's export rolls over under a reader --------------------

PATTERNS = [0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77]


def part_rollover():
    say("part 5: readers of b's replica export while a replicates a new full-volume pattern per cycle")
    part = Part(["a", "b"])
    readers = []
    try:
        a = part.host("a").start()
        b = part.host("b", allow=[("a", ["*"], 0)]).start()
        a.cli("volume", "create", "vm1", "--size", "64M")
        qemu_io(a, "vm1", f"write -P {PATTERNS[0]} 0 64M")
        a.add("vm1", b.target())
        a.run("vm1")
        stop = os.path.join(part.tmp, "stop-readers")
        # Two readers on one connection each, held throughout: one reads
        # the volume front to back, the other back to front; a third
        # connects anew for each pass.
        for order in ("forwards", "backwards", "reconnecting"):
            proc = subprocess.Popen([sys.executable, "-c", _READER, b.uri("vm1"), stop, str(4 * MIB), order],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    stdin=subprocess.DEVNULL)
            lines = []
            pump = threading.Thread(target=lambda p=proc, l=lines: l.extend(iter(p.stdout.readline, "")),
                                    daemon=True)
            pump.start()
            readers.append((order, proc, lines, pump))

        def passes_done():
            return [sum(1 for line in lines if line.startswith('{"pass"')) for _, _, lines, _ in readers]

        def more_passes(n):
            base = passes_done()
            poll(lambda: all(d >= b0 + n for d, b0 in zip(passes_done(), base))
                 or any(p.poll() is not None for _, p, _, _ in readers),
                 f"the readers to finish {n} more passes", timeout=60)
            for order, p, lines, _ in readers:
                if p.poll() is not None:
                    raise Failure(f"the {order} reader ended early: {''.join(lines[-3:])}{p.stderr.read()}")

        more_passes(1)
        for pattern in PATTERNS[1:]:
            qemu_io(a, "vm1", f"write -P {pattern} 0 64M")
            run = a.run("vm1")
            check(run[0]["taken"] and run[0]["sent"], f"cycle with pattern 0x{pattern:02x} replicated")
            more_passes(1)
        with open(stop, "w"):
            pass
        for order, proc, lines, pump in readers:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                raise Failure(f"the {order} reader did not stop within 60 s")
            pump.join(10)
            summary = json.loads(lines[-1]) if lines and lines[-1].startswith('{"done"') else None
            check(summary is not None, f"the {order} reader finished", f"{''.join(lines[-3:])}{proc.stderr.read()}")
            seen = summary["seen"]
            say(f"    {order} reader: {summary['reads']} reads of 4 MiB in {summary['passes']} passes; "
                f"patterns in the order seen: {[hex(p) for p in seen]}")
            check(not summary["errors"], f"{order}: no read failed", json.dumps(summary["errors"]))
            check(not summary["mixed"], f"{order}: no 4 MiB read mixed two patterns", json.dumps(summary["mixed"]))
            check(set(seen) <= set(PATTERNS), f"{order}: every read was one of the patterns written",
                  json.dumps(seen))
            check(len(set(seen)) >= 2, f"{order}: the export rolled over under the reader ({len(set(seen))} patterns)")
            idx = [PATTERNS.index(p) for p in seen if p in PATTERNS]
            check(idx == sorted(idx), f"{order}: patterns were seen in the order they were replicated",
                  json.dumps(seen))
            check(seen[-1] == PATTERNS[-1], f"{order}: the reader ended on the last pattern")
        newest = a.snapshots("vm1")[-1]
        check(b.digest("vm1") == a.digest(newest), f"b's vm1 is identical to a's {newest}")
        for h in (a, b):
            clean, got = h.check_clean()
            check(clean, f"{h.name}: `arbor check` clean", json.dumps(got))
        part.stop_all()
    except Exception:
        say(part.logs())
        raise
    finally:
        for _, proc, _, _ in readers:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        part.close()


# ---- part 6: seeding by hand, another name on the target, retention ----------------

def part_seeding():
    say("part 6: a target seeded by hand (--seeded), a remote volume name, retention on both sides")
    part = Part(["a", "b", "c", "d"])
    try:
        a = part.host("a").start()
        b = part.host("b", allow=[("a", ["*"], 0)]).start()
        c = part.host("c", allow=[("a", ["*"], 0)]).start()
        d = part.host("d", allow=[("a", ["*"], 3)]).start()
        a.cli("volume", "create", "vm1", "--size", "64M")
        write_random(a, "vm1", 0, 64 * MIB, SEED + 20)
        a.cli("snapshot", "create", "vm1@seed")
        seed = os.path.join(part.tmp, "seed.stream")
        a.cli("send", "vm1@seed", "-o", seed)
        b.cli("receive", "copy", "-i", seed)
        check(b.digest("copy@seed") == a.digest("vm1@seed"), "b received the seed by hand as copy@seed")

        say("  the seeded copy, replicated as b's `copy` once demoted there")
        a.add("vm1", b.target("copy"), "--seeded")
        run = a.run("vm1", check=False)
        check(failed_with(run, "not_allowed") and "replica demote copy" in run.stderr,
              "the received copy is writable on b: refused, even --seeded, pointing at demote",
              describe(run))
        a.cli("replica", "remove", "vm1")
        qemu_io(a, "vm1", "write -P 0x61 8M 1M")
        b.cli("replica", "demote", "copy")
        a.add("vm1", b.target("copy"), "--seeded")
        run = a.run("vm1", check=False)
        check(isinstance(run, list), "with --seeded the run succeeds", describe(run))
        p = a.pair("vm1")
        check(p["remote_volume"] == "copy" and p["seeded"], "a's pair: remote volume copy, seeded", json.dumps(p))
        check(p["bytes_sent_total"] < 16 * MIB,
              f"only the increment went: {p['bytes_sent_total'] / MIB:.1f} MiB sent for a 64 MiB volume")
        newest = a.snapshots("vm1")[-1]
        want = a.digest(newest)
        check(b.digest("copy") == want, f"b's copy is identical to a's {newest}")
        va, vb = a.volumes(), b.volumes()
        check([vb[n.replace("vm1@", "copy@")]["guid"] for n in a.snapshots("vm1")]
              == [va[n]["guid"] for n in a.snapshots("vm1")],
              "b's copy@ snapshots are a's vm1@ ones (names and identities)")
        role = b.role("copy")
        check(role and role["source"] == "a", "b's status: copy is a replica of a", json.dumps(role))

        say("  --seeded, but the target has no such volume")
        a.add("vm1", c.target(), "--seeded")
        run = a.run("vm1", check=False)
        check(failed_with(run, "diverged") and "vm1" not in c.volumes(),
              "refused: (diverged), and c got nothing", describe(run))
        a.cli("replica", "remove", "vm1", "--target", c.target())

        say("  retention: a keeps 1 repl- snapshot per pair (--keep 1), c keeps all, d keeps 3")
        # Cycles run back to back, several within one second (the names'
        # precision): a name a pruned must not come back for another
        # snapshot while a target still has the old one.
        a.cli("volume", "create", "vm2", "--size", "64M")
        qemu_io(a, "vm2", "write -P 0x70 0 1M")
        a.add("vm2", c.target(), "--keep", "1")
        a.add("vm2", d.target(), "--keep", "1")
        a.run("vm2")
        # Every snapshot a took or made, in order, as (name, identity): a
        # name may come back, an identity never.
        history = []

        def record():
            for name in a.snapshots("vm2"):
                guid = a.volumes()[name]["guid"]
                if all(g != guid for _, g in history):
                    history.append((name, guid))
        record()
        pruned = set()
        cycles_ok = True
        for i in range(10):
            qemu_io(a, "vm2", f"write -P {0x71 + i} {i}M 1M")
            if i == 4:
                a.cli("snapshot", "create", "vm2@manual")
            run = a.run("vm2", check=False)
            record()
            if not check(isinstance(run, list), f"retention cycle {i + 1} succeeds", describe(run), soft=True):
                cycles_ok = False
                break
            pruned |= {n for r in run for n in r["pruned"]}
        names = [n for n, _ in history]
        say(f"    a's snapshots of vm2, in order: {names}")
        check(len(set(names)) == len(names), "a never gave two of its snapshots the same name",
              json.dumps(history), soft=True)
        if not cycles_ok:
            say("    (a cycle failed: what each side kept is not checked)")
        else:
            newest = names[-1]
            check(a.snapshots("vm2") == ["vm2@manual", newest], f"a kept vm2@manual and its newest, {newest}",
                  f"{a.snapshots('vm2')}", soft=True)
            check(pruned == set(names[:-1]) - {"vm2@manual"}, "the runs reported pruning the older repl- ones",
                  f"{sorted(pruned)}", soft=True)
            check(c.snapshots("vm2") == names, "c kept every snapshot it received",
                  f"{c.snapshots('vm2')} != {names}", soft=True)
            check(d.snapshots("vm2") == names[-3:], "d kept the newest 3 it received",
                  f"{d.snapshots('vm2')} != {names[-3:]}", soft=True)
            want = a.digest(newest)
            for h in (c, d):
                check(h.digest("vm2") == want, f"{h.name}'s vm2 is identical to a's {newest}")
        for h in (a, b, c, d):
            clean, got = h.check_clean()
            check(clean, f"{h.name}: `arbor check` clean", json.dumps(got))
        part.stop_all()
    except Exception:
        say(part.logs())
        raise
    finally:
        part.close()


# ---- part 7: healing with a real ext4 ----------------------------------------

def damage_block(pool_file, content):
    """Flips a bit of the 4 KiB block of `pool_file` that holds `content`
    (the test made it unique), durably; its offset."""
    with open(pool_file, "rb") as f:
        image = f.read()
    at = image.find(content)
    while at >= 0 and at % 4096:
        at = image.find(content, at + 1)
    if at < 0:
        raise Failure(f"the block to damage is not in {pool_file}")
    with open(pool_file, "r+b") as f:
        f.seek(at + 100)
        f.write(bytes([content[100] ^ 0x04]))
        f.flush()
        os.fsync(f.fileno())
    return at


def damage_of(host):
    """`arbor --json pool damage` (exit status 8 while anything is damaged)."""
    proc = host.cli("--json", "pool", "damage", check=False)
    check(proc.returncode in (0, 8), f"{host.name}: pool damage answers", describe(proc))
    return json.loads(proc.stdout)


def part_healing():
    say("part 7: damage under a real ext4 fails reads with EIO, and replication heals it both ways")
    from filesystem import Attached, verify_tree, write_tree
    part = Part(["a", "b"])
    mounts = []
    try:
        a = part.host("a", pool_size="512M").start()
        b = part.host("b", pool_size="512M", allow=[("a", ["*"], 0)]).start()
        for h in (a, b):
            h.cleanups = []
        a.cli("volume", "create", "vm1", "--size", "128M")
        fs = Attached(a, "vm1", read_only=False)
        mounts.append(fs)
        sh(["mkfs.ext4", "-q", "-F", "-b", "4096", fs.attach()])
        root = fs.mount()
        tree = write_tree(root, random.Random(SEED + 70))
        big = sorted(rel for rel in tree if os.path.getsize(os.path.join(root, rel)) >= 70_000)
        firsts = {}
        for rel in big:
            with open(os.path.join(root, rel), "rb") as f:
                firsts[rel] = f.read(4096)
        fs.close()
        check(len(big) >= 8, f"{len(big)} files of 70 KB or more to damage")
        a.add("vm1", b.target())
        a.run("vm1")
        snap = a.snapshots("vm1")[-1]
        want = a.digest(snap)
        check(b.digest(snap) == want, f"b holds {snap}, identical")

        # Damage: the first blocks of three files on a (blocks vm1 and the
        # snapshot share), of two others on b.
        on_a, on_b = big[:3], big[3:5]
        for rel in on_a:
            damage_block(a.pool, firsts[rel])
        for rel in on_b:
            damage_block(b.pool, firsts[rel])

        say("  ext4 on a's vm1 (mounted read-only, fresh) reads EIO from the damaged files, never wrong data")
        fs = Attached(a, "vm1", read_only=True)
        mounts.append(fs)
        fs.attach()
        root = fs.mount()
        eio, wrong = [], []
        for rel, digest in tree.items():
            try:
                with open(os.path.join(root, rel), "rb") as f:
                    data = f.read()
            except OSError as e:
                if e.errno == 5:
                    eio.append(rel)
                    continue
                raise
            if hashlib.sha256(data).hexdigest() != digest:
                wrong.append(rel)
        fs.close()
        check(not wrong, "no file read wrong data", f"{wrong}")
        check(sorted(eio) == sorted(on_a), "exactly the damaged files failed with EIO",
              f"{sorted(eio)} != {sorted(on_a)}")
        listed = damage_of(a)
        check(len(listed["blocks"]) == 3, "a's damage record lists the three blocks", json.dumps(listed))

        say("  scrubs find the rest: b's two blocks no client read")
        for h, n in ((a, 3), (b, 2)):
            proc = h.cli("scrub", "start", "--wait", check=False, timeout=300)
            check(proc.returncode == 8, f"{h.name}'s scrub finds damage (exit 8)", describe(proc))
            got = damage_of(h)
            check(len(got["blocks"]) == n, f"{h.name} lists {n} damaged blocks", json.dumps(got))

        say("  the next cycle heals both sides from each other")
        run = a.run("vm1")
        r = run[0]
        check(r["sent"] == [] and r["healed"] == 3 and r["heal_sent"] == 2,
              "the run sent no stream, healed a's 3 blocks with b's copies and sent b 2",
              json.dumps(run))
        for h in (a, b):
            got = damage_of(h)
            check(not got["blocks"], f"{h.name}: nothing damaged any more", json.dumps(got))
            proc = h.cli("scrub", "start", "--wait", check=False, timeout=300)
            check(proc.returncode == 0, f"{h.name}: a scrub after it is clean", describe(proc))
        check(a.digest(snap) == want and b.digest(snap) == want,
              f"{snap} reads whole and identical on both")
        fs = Attached(a, "vm1", read_only=True)
        mounts.append(fs)
        fs.attach()
        fsck = sh(["e2fsck", "-fn", fs.loop], check=False)
        check(fsck.returncode == 0, "e2fsck of a's vm1 is clean", fsck.stdout + fsck.stderr)
        verify_tree(fs.mount(), tree, "a's vm1 after healing")
        check(True, "every file of a's vm1 matches its checksum")
        fs.close()
        for h in (a, b):
            clean, got = h.check_clean()
            check(clean, f"{h.name}: `arbor check` clean", json.dumps(got))
        part.stop_all()
    except Exception:
        say(part.logs())
        raise
    finally:
        for fs in reversed(mounts):
            try:
                fs.close()
            except Exception as e:
                print(f"cleanup: {e}", file=sys.stderr)
        part.close()


# ---- part 8: encrypted volumes replicate raw ------------------------------------

PLAIN_MARK = b"ARBOR-RAW-REPLICA-PLAINTEXT:"


def plaintext_file(path, size, pattern_bytes):
    """A file of `size` bytes: `pattern_bytes` of recognisable text (the
    mark and its offset, every 32 bytes), then zeros."""
    with open(path, "wb") as f:
        at = 0
        while at < pattern_bytes:
            f.write(PLAIN_MARK + at.to_bytes(4, "little"))
            at += 32
        f.truncate(size)


def marks_in(path):
    with open(path, "rb") as f:
        return f.read().count(PLAIN_MARK)


def data_blocks_shared(pool_a, pool_b):
    """4 KiB blocks (offset in pool_b, content) that both pool files hold,
    once each and not all one byte: data the two pools share (metadata
    differs between pools)."""
    def blocks(path):
        with open(path, "rb") as f:
            image = f.read()
        seen = {}
        for at in range(0, len(image), 4096):
            blk = image[at:at + 4096]
            if blk.count(blk[:1]) == len(blk):
                continue
            seen.setdefault(blk, []).append(at)
        return seen
    on_a, on_b = blocks(pool_a), blocks(pool_b)
    return [(ats[0], blk) for blk, ats in on_b.items() if len(ats) == 1 and len(on_a.get(blk, [])) == 1]


def part_encryption():
    say("part 8: an encrypted volume replicates raw along a chain: keyless replicas hold no plaintext, "
        "serve nothing, scrub, heal and forward; the key opens the far end")
    part = Part(["a", "b", "c"])
    try:
        a = part.host("a", pool_size="512M").start()
        b = part.host("b", pool_size="512M", allow=[("a", ["*"], 0)]).start()
        c = part.host("c", pool_size="512M", allow=[("b", ["*"], 0)]).start()
        key = os.path.join(part.tmp, "vm.key")
        a.cli("key", "new", key)
        a.cli("volume", "create", "vm", "--size", "64M", "--encrypt", "--key-file", key)
        src = os.path.join(part.tmp, "plain.img")
        plaintext_file(src, 64 * MIB, 16 * MIB)
        sh(["nbdcopy", src, a.uri("vm")], timeout=120)
        a.add("vm", b.target())
        a.run("vm")
        b.add("vm", c.target())
        b.run("vm")
        qemu_io(a, "vm", "write -P 0x5a 40M 1M")
        a.run("vm")
        b.run("vm")
        newest = a.snapshots("vm")[-1]
        want = a.digest(newest)
        check(b.snapshots("vm") == a.snapshots("vm") == c.snapshots("vm"),
              f"b and c hold a's snapshots of vm ({len(a.snapshots('vm'))}), the increment included")
        for h in (b, c):
            enc = h.volumes()["vm"].get("encryption")
            check(enc is not None and enc["locked"], f"{h.name}'s vm is encrypted and locked", json.dumps(enc))
            info = sh(["nbdinfo", h.uri("vm")], check=False)
            check(info.returncode != 0, f"{h.name} serves nothing of vm (nbdinfo refused)",
                  (info.stdout + info.stderr)[:300])
        for h in (a, b, c):
            check(marks_in(h.pool) == 0, f"{h.name}'s pool file holds none of the plaintext "
                  f"(16 MiB of marked text written)")

        say("  a keyless replica scrubs clean, and a damaged block on it is healed from a")
        shared = data_blocks_shared(a.pool, b.pool)
        check(len(shared) > 1000, f"a and b store the same ciphertext ({len(shared)} shared data blocks)")
        at, blk = shared[len(shared) // 2]
        damage_block(b.pool, blk)
        proc = b.cli("scrub", "start", "--wait", check=False, timeout=300)
        check(proc.returncode == 8, "b's scrub, with no key, finds the damaged block (exit 8)", describe(proc))
        run = a.run("vm")
        # Listed once per snapshot of b's that shares the block.
        check(run[0]["heal_sent"] >= 1 and run[0]["sent"] == [],
              "the next cycle sends b a's copy of it, as stored", json.dumps(run))
        got = damage_of(b)
        check(not got["blocks"], "b: nothing damaged any more", json.dumps(got))
        proc = b.cli("scrub", "start", "--wait", check=False, timeout=300)
        check(proc.returncode == 0, "b: a scrub after it is clean", describe(proc))

        say("  the key opens c's copy, identical to a's; a wrong key opens nothing")
        other = os.path.join(part.tmp, "other.key")
        a.cli("key", "new", other)
        wrong = c.cli("key", "load", "vm", "--key-file", other, check=False)
        check(wrong.returncode == 2 and "wrong key" in (wrong.stderr + wrong.stdout),
              "c refuses another key (exit 2, wrong key)", describe(wrong))
        c.cli("key", "load", "vm", "--key-file", key)
        check(c.digest("vm") == want and c.digest(newest) == want,
              f"with the key loaded, c's vm and {newest} read exactly as a's {newest}")
        check(b.volumes()["vm"]["encryption"]["locked"], "b stays locked (keys are per host)")

        say("  a change of the user's key at the source reaches the replicas with the next increment")
        new_key = os.path.join(part.tmp, "new.key")
        a.cli("key", "new", new_key)
        a.cli("key", "change", "vm", "--key-file", key, "--new-key-file", new_key)
        qemu_io(a, "vm", "write -P 0x5b 48M 256k")
        a.run("vm")
        b.run("vm")
        newest = a.snapshots("vm")[-1]
        c.cli("key", "unload", "vm")
        old = c.cli("key", "load", "vm", "--key-file", key, check=False)
        check(old.returncode == 2, "c refuses the old key now", describe(old))
        c.cli("key", "load", "vm", "--key-file", new_key)
        check(c.digest(newest) == a.digest(newest), f"the new key opens c's {newest}, identical to a's")
        for h in (a, b, c):
            clean, got = h.check_clean()
            check(clean, f"{h.name}: `arbor check` clean", json.dumps(got))
        part.stop_all()
    except Exception:
        say(part.logs())
        raise
    finally:
        part.close()


# ---- main ----------------------------------------------------------------------

PARTS = [
    ("1 chain and tree under load", part_topologies),
    ("2 faults", part_faults),
    ("3 identity", part_identity),
    ("4 divergence and failover", part_failover),
    ("5 export rollover", part_rollover),
    ("6 seeding and retention", part_seeding),
    ("7 healing under ext4", part_healing),
    ("8 encrypted volumes, raw", part_encryption),
]


terminated = None  # the signal that ended the run


def _on_signal(signum, frame):
    # netns.py's own handler runs first (it kills what its Networks started
    # and deletes their namespaces), then calls this one.
    global terminated
    terminated = signum
    raise SystemExit(128 + signum)


def main():
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _on_signal)
    if os.geteuid() != 0:
        say("FAILED: replication.py must run as root (network namespaces); CI runs it as root")
        return 1
    try:
        require_tools("nbdcopy", "nbdinfo", "qemu-io", "openssl", "ip", "tc")
    except Failure as e:
        say(f"FAILED: {e}")
        return 1
    if sh([sys.executable, "-c", "import nbd"], check=False).returncode != 0:
        say("FAILED: libnbd's Python module is missing: install the Debian package python3-libnbd (CI installs it)")
        return 1
    only = os.environ.get("ARBOR_REPLICATION_PARTS")
    wanted = {p.strip() for p in only.split(",")} if only else None
    say(f"arbor: {ARBOR}; seed {SEED} (ARBOR_REPLICATION_SEED)")
    results = []  # (part, [failure headlines], seconds)
    start = time.monotonic()
    for name, body in PARTS:
        if wanted and name.split()[0] not in wanted:
            continue
        t0 = time.monotonic()
        failures = []
        soft_failures.clear()
        try:
            body()
        except Failure as e:
            # The whole message: the summary keeps only its first line, and
            # the detail (the state that failed the check) is what explains
            # a failure seen once.
            say(f"    FAILED: {e}")
            failures.append(str(e))
        except (Exception, SystemExit, KeyboardInterrupt):
            tb = traceback.format_exc()
            say(tb)
            failures.append(tb.strip().splitlines()[-1])
        failures = soft_failures + failures
        took = time.monotonic() - t0
        if terminated is not None:
            results.append((name, [f"interrupted by signal {terminated}"], took))
            say(f"part {name}: interrupted by signal {terminated}")
            break
        results.append((name, failures, took))
        if not failures:
            say(f"part {name}: ok ({took:.1f} s)")
        else:
            say(f"part {name}: FAILED ({len(failures)} failure(s), {took:.1f} s)")
    total = time.monotonic() - start
    say(f"\nsummary ({checks_passed} checks passed, {total:.0f} s):")
    for name, failures, took in results:
        say(f"  {'ok    ' if not failures else 'FAILED'} part {name} ({took:.1f} s)")
        for f in failures:
            say(f"      - {f.strip().splitlines()[0]}")
    failed = [r for r in results if r[1]]
    if terminated is not None:
        say(f"replication: interrupted by signal {terminated}")
        return 128 + terminated
    if failed:
        say(f"replication: {len(failed)} of {len(results)} parts FAILED")
        return 1
    say("replication: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
