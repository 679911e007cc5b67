#!/usr/bin/python3
"""Campaign 2 (docs/RELIABILITY.md): `arbor serve` killed with SIGKILL under
load, restarted, verified, over and over.

Four libnbd writers each own a volume and write 4 KiB blocks whose contents
name (writer, block, generation), flushing every few writes; between
flushes they take snapshots (keeping three), clone and destroy. At a random
moment the daemon is killed. After the restart:

* every block of every volume reads as the value its last completed flush
  made durable, or one written after that flush (written or in flight when
  the daemon died), never anything else;
* every snapshot whose creation was acknowledged exists and reads exactly
  as its volume did when it was taken; every acknowledged destroy stuck;
* `arbor check` finds the pool clean.

ARBOR_KILL9_CYCLES (default 4) sets the number of kills; the long run is
ARBOR_KILL9_CYCLES=300. ARBOR_KILL9_IO=direct serves the pool with direct
I/O (the daemon's default on a file is buffered)."""

import json
import os
import random
import struct
import subprocess
import sys
import threading
import time

import nbd

from harness import ARBOR, Failure, run, run_test

BLOCK = 4096
WINDOW_BLOCKS = 2048            # 8 MiB of each volume is written
WRITERS = 4
WRITES_PER_FLUSH = 16
KEEP_SNAPSHOTS = 3
CYCLES = int(os.environ.get("ARBOR_KILL9_CYCLES", "4"))
SEED = int(os.environ.get("ARBOR_KILL9_SEED", str(random.randrange(1 << 30))))
IO = os.environ.get("ARBOR_KILL9_IO")


def content(writer, block, generation):
    """The 4 KiB a write of `generation` to `block` puts there; 0 is zeros."""
    if generation == 0:
        return bytes(BLOCK)
    stamp = struct.pack("<QQQ", writer + 1, block, generation)
    return (stamp * (BLOCK // len(stamp) + 1))[:BLOCK]


def decode(data):
    """The generation a block holds, or None if it is no value ever written."""
    if data == bytes(BLOCK):
        return 0
    writer, block, generation = struct.unpack_from("<QQQ", data)
    if content(writer - 1, block, generation) != data:
        return None
    return generation


def close(handle):
    """Disconnects politely if the server is still there."""
    try:
        handle.shutdown()
    except nbd.Error:
        pass


class Writer:
    """One volume, its model, and its snapshots' expected contents."""

    def __init__(self, index, daemon, rng):
        self.index = index
        self.volume = f"w{index}"
        self.daemon = daemon
        self.rng = rng
        self.generation = 0
        self.durable = [0] * WINDOW_BLOCKS      # value made durable by a completed flush
        self.pending = [set() for _ in range(WINDOW_BLOCKS)]  # written since
        self.snapshots = {}                     # name -> expected generations (acknowledged)
        self.maybe_snapshots = {}               # creation interrupted: may or may not exist
        self.destroyed = set()                  # acknowledged destroys
        self.maybe_destroyed = set()
        self.next_snapshot = 0
        self.writes = 0
        self.flushes = 0

    def cli(self, *args):
        return subprocess.run([ARBOR, "--data-dir", self.daemon.dir, *args],
                              capture_output=True, text=True, timeout=60)

    def run(self, stop):
        """Writes until the daemon dies (or `stop` is set)."""
        handle = nbd.NBD()
        try:
            handle.connect_uri(self.daemon.uri(self.volume))
            rounds = 0
            while not stop.is_set():
                for _ in range(WRITES_PER_FLUSH):
                    block = self.rng.randrange(WINDOW_BLOCKS)
                    self.generation += 1
                    self.pending[block].add(self.generation)
                    handle.pwrite(content(self.index, block, self.generation), block * BLOCK)
                    self.writes += 1
                handle.flush()
                self.flushes += 1
                self.settle()
                rounds += 1
                if rounds % 4 == 0:
                    self.snapshot_round()
        except nbd.Error:
            pass  # the daemon was killed
        finally:
            close(handle)

    def settle(self):
        """After a completed flush: the last write to each block is durable."""
        for block, written in enumerate(self.pending):
            if written:
                self.durable[block] = max(written)
                written.clear()

    def snapshot_round(self):
        name = f"{self.volume}@s{self.next_snapshot}"
        self.next_snapshot += 1
        self.maybe_snapshots[name] = list(self.durable)
        if self.cli("snapshot", "create", name).returncode != 0:
            return
        self.snapshots[name] = self.maybe_snapshots.pop(name)
        if self.rng.random() < 0.5:
            clone = f"c{self.index}-{self.next_snapshot}"
            if self.cli("clone", name, clone).returncode == 0:
                self.cli("destroy", clone)
        while len(self.snapshots) > KEEP_SNAPSHOTS:
            oldest = min(self.snapshots, key=lambda n: int(n.split("@s")[1]))
            self.maybe_destroyed.add(oldest)
            if self.cli("destroy", oldest).returncode != 0:
                return
            self.maybe_destroyed.discard(oldest)
            self.destroyed.add(oldest)
            del self.snapshots[oldest]

    def verify(self, existing):
        """Checks the volume and its snapshots after a restart, then takes
        what the volume holds as the new durable state."""
        handle = nbd.NBD()
        handle.connect_uri(self.daemon.uri(self.volume))
        for block in range(WINDOW_BLOCKS):
            found = decode(handle.pread(BLOCK, block * BLOCK))
            allowed = {self.durable[block]} | self.pending[block]
            if found not in allowed:
                raise Failure(f"{self.volume} block {block} holds generation {found}, "
                              f"allowed {sorted(allowed)} (seed {SEED})")
            self.durable[block] = found
            self.pending[block].clear()
        close(handle)
        for name in list(self.maybe_snapshots):
            if name in existing:
                self.snapshots[name] = self.maybe_snapshots[name]
        self.maybe_snapshots.clear()
        for name, expected in self.snapshots.items():
            if name not in existing and name not in self.maybe_destroyed:
                raise Failure(f"acknowledged snapshot {name} is gone (seed {SEED})")
        for name in self.destroyed:
            if name in existing:
                raise Failure(f"destroyed snapshot {name} came back (seed {SEED})")
        for name in self.maybe_destroyed:
            if name not in existing:
                self.snapshots.pop(name, None)
        self.maybe_destroyed.clear()
        for name, expected in self.snapshots.items():
            self.verify_snapshot(name, expected)

    def verify_snapshot(self, name, expected):
        handle = nbd.NBD()
        handle.connect_uri(self.daemon.uri(name))
        for block in range(WINDOW_BLOCKS):
            found = decode(handle.pread(BLOCK, block * BLOCK))
            if found != expected[block]:
                raise Failure(f"snapshot {name} block {block}: generation {found}, "
                              f"expected {expected[block]} (seed {SEED})")
        close(handle)


def existing_names(daemon):
    listed = json.loads(daemon.cli("volume", "list", "--json").stdout)
    return {v["name"] for v in listed}


def body(daemon):
    rng = random.Random(SEED)
    print(f"kill -9 campaign: {CYCLES} cycles, seed {SEED}, {IO or 'default'} I/O")
    writers = [Writer(i, daemon, random.Random(rng.random())) for i in range(WRITERS)]
    for w in writers:
        daemon.cli("volume", "create", w.volume, "--size", "64M")
    started = time.time()
    for cycle in range(CYCLES):
        stop = threading.Event()
        threads = [threading.Thread(target=w.run, args=(stop,)) for w in writers]
        for t in threads:
            t.start()
        time.sleep(rng.uniform(0.3, 2.0))
        daemon.kill()
        stop.set()
        for t in threads:
            t.join(timeout=60)
            if t.is_alive():
                raise Failure("a writer hung after the daemon was killed")
        daemon.start()
        existing = existing_names(daemon)
        for w in writers:
            w.verify(existing)
        report = daemon.cli("check", "--json")
        if '"clean": true' not in report.stdout:
            raise Failure(f"check after kill {cycle + 1}: {report.stdout}")
    writes = sum(w.writes for w in writers)
    flushes = sum(w.flushes for w in writers)
    snaps = sum(w.next_snapshot for w in writers)
    print(f"kill -9 campaign: {CYCLES} kills, {writes} writes, {flushes} flushes, "
          f"{snaps} snapshots in {time.time() - started:.0f} s: no loss (seed {SEED})")


if __name__ == "__main__":
    run_test("kill -9 under load", body, tools=(), extra_args=("--io", IO) if IO else ())
