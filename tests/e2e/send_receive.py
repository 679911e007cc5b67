#!/usr/bin/python3
"""`arbor send` and `arbor receive` between two real daemons, with real
NBD clients writing and reading the volumes:

* a full stream and an incremental one, through a pipe and through a file,
  arrive byte-identical (compared with `nbdcopy` out of both daemons), and
  the received snapshots keep their identities;
* a stream cut short is refused and nothing shows; `receive --status`
  prints a token and `send --resume TOKEN` finishes it, identical;
* the receiving daemon killed with SIGKILL mid-stream: after the restart
  the target is unchanged and the receive resumes from its last
  checkpoint, identical;
* garbage and damaged streams get exit status 2 and change nothing;
* `send --dry-run` reports the stream's size before sending;
* a held snapshot (`arbor hold`) is not destroyed without --force, and
  holds survive a restart;
* the NBD metadata context `x-arbor:changed:SNAP` (read by `nbdinfo
  --map`) reports exactly the ranges `arbor diff` does, discards included.
"""

import hashlib
import json
import os
import random
import subprocess
import time

from harness import ARBOR, Daemon, Failure, run, run_test, wait_until

SEED = int(os.environ.get("ARBOR_SEND_SEED", str(random.randrange(1 << 30))))


def digest(daemon, export):
    """md5 of a whole export, read by nbdcopy."""
    out = subprocess.run(
        ["nbdcopy", daemon.uri(export), "-"], check=True, stdout=subprocess.PIPE
    ).stdout
    return hashlib.md5(out).hexdigest()


def qemu_write(daemon, export, *commands):
    args = ["qemu-io", "-f", "raw"]
    for c in commands:
        args += ["-c", c]
    run(*args, daemon.uri(export))


def volumes(daemon):
    return {v["name"]: v for v in json.loads(daemon.cli("--json", "volume", "list").stdout)}


def cli(daemon, *args, check=True, **kwargs):
    return run(ARBOR, "--data-dir", daemon.dir, *args, check=check, **kwargs)


def pipe(a, send_args, b, receive_args):
    """arbor send ... | arbor receive ...; returns the receive's result."""
    sender = subprocess.Popen(
        [ARBOR, "--data-dir", a.dir, "send", *send_args], stdout=subprocess.PIPE
    )
    receiver = subprocess.run(
        [ARBOR, "--data-dir", b.dir, "--json", "receive", *receive_args],
        stdin=sender.stdout, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    sender.stdout.close()
    if sender.wait() != 0 or receiver.returncode != 0:
        raise Failure(f"send | receive failed: {receiver.stderr}")
    return json.loads(receiver.stdout)


def merged(ranges):
    """Adjacent (offset, length) ranges joined."""
    out = []
    for off, length in ranges:
        if out and out[-1][0] + out[-1][1] == off:
            out[-1] = (out[-1][0], out[-1][1] + length)
        else:
            out.append((off, length))
    return out


def changed_map(daemon, export, snapshot):
    """What `nbdinfo --map=x-arbor:changed:SNAPSHOT` says changed."""
    out = run("nbdinfo", f"--map=x-arbor:changed:{snapshot}", daemon.uri(export)).stdout
    ranges = []
    for line in out.splitlines():
        off, length, flags = line.split()[:3]
        if int(flags) & 1:
            ranges.append((int(off), int(length)))
    return merged(ranges)


def body(a):
    rng = random.Random(SEED)
    print(f"seed {SEED}")
    b = Daemon(pool_size="4G")
    a.cleanups.append(b.close)
    b.start()
    tmp = a.dir

    # History on A: 320 MiB written (more than a receive's checkpoint
    # interval), a snapshot, scattered changes and a discard, another.
    a.cli("volume", "create", "vm", "--size", "512M")
    qemu_write(a, "vm", "write -P 0x5a 0 320M", "write -P 0x11 400M 8M")
    a.cli("snapshot", "create", "vm@one")
    qemu_write(a, "vm", *[f"write -P {rng.randrange(256)} {rng.randrange(4000) * 65536} 64k"
                          for _ in range(64)])
    qemu_write(a, "vm", "discard 400M 4M")
    a.cli("snapshot", "create", "vm@two")
    qemu_write(a, "vm", "write -P 0x77 100M 1M")
    a.cli("snapshot", "create", "vm@three")
    one, two, three = digest(a, "vm@one"), digest(a, "vm@two"), digest(a, "vm@three")

    # Changed blocks over NBD, against the metadata diff (vm@two has
    # scattered writes and a discard since vm@one; vm has one more write).
    for export, snap in (("vm@two", "vm@one"), ("vm", "vm@one"), ("vm", "vm@two")):
        diff = json.loads(a.cli("--json", "diff", snap, export).stdout)
        want = merged([(r["offset"], r["len"]) for r in diff])
        got = changed_map(a, export, snap)
        if got != want or not want:
            raise Failure(f"x-arbor:changed:{snap} on {export}: {got[:5]}... != {want[:5]}...")

    # Dry run: the size before sending.
    est = json.loads(a.cli("--json", "send", "vm@two", "--from", "vm@one", "--dry-run").stdout)
    if not 0 < est["data_bytes"] <= 64 * 65536 + 4 * 65536:
        raise Failure(f"dry run of the incremental stream: {est}")

    # Full through a pipe, incremental through a file.
    got = pipe(a, ["vm@one"], b, ["copy"])
    if got["snapshot"] != "copy@one":
        raise Failure(f"received {got}")
    stream = os.path.join(tmp, "two.arbor")
    a.cli("send", "vm@two", "--from", "vm@one", "--compression", "best", "-o", stream)
    b.cli("receive", "copy", "-i", stream)
    if digest(b, "copy@one") != one or digest(b, "copy@two") != two or digest(b, "copy") != two:
        raise Failure("received snapshots differ from their sources")
    va, vb = volumes(a), volumes(b)
    for snap in ("one", "two"):
        if va[f"vm@{snap}"]["guid"] != vb[f"copy@{snap}"]["guid"]:
            raise Failure(f"identity of @{snap} not kept: {va[f'vm@{snap}']} {vb[f'copy@{snap}']}")

    # Holds: the receiving side keeps its base for the next increment.
    b.cli("hold", "copy@two", "replication")
    r = cli(b, "destroy", "copy@two", check=False)
    if r.returncode != 5 or "replication" not in r.stderr:
        raise Failure(f"destroying a held snapshot: exit {r.returncode}: {r.stderr}")
    if volumes(b)["copy@two"].get("holds") != ["replication"]:
        raise Failure(f"holds not listed: {volumes(b)['copy@two']}")
    r = cli(b, "release", "copy@two", "nobody", check=False)
    if r.returncode != 4:
        raise Failure(f"releasing a hold that is not there: exit {r.returncode}")

    # Garbage and a damaged stream: exit status 2, nothing changes.
    garbage = os.path.join(tmp, "garbage")
    with open(garbage, "wb") as f:
        f.write(os.urandom(100000))
    r = cli(b, "receive", "other", "-i", garbage, check=False)
    if r.returncode != 2 or "stream" not in r.stderr:
        raise Failure(f"garbage: exit {r.returncode}: {r.stderr}")
    # The rest sends vm@three whole, which B does not have yet.
    full = os.path.join(tmp, "full.arbor")
    a.cli("send", "vm@three", "-o", full)
    data = bytearray(open(full, "rb").read())
    data[rng.randrange(len(data))] ^= 0x40
    damaged = os.path.join(tmp, "damaged")
    open(damaged, "wb").write(data)
    r = cli(b, "receive", "third", "-i", damaged, check=False)
    if r.returncode != 2:
        raise Failure(f"damaged stream: exit {r.returncode}: {r.stderr}")
    if "third@three" in volumes(b) or "third" in volumes(b):
        raise Failure("a damaged stream became visible")
    cli(b, "receive", "--abort", "third", check=False)

    # Cut short: refused, then resumed from the token.
    cut = os.path.join(tmp, "cut")
    open(cut, "wb").write(open(full, "rb").read()[: rng.randrange(1000, os.path.getsize(full))])
    r = cli(b, "receive", "fourth", "-i", cut, check=False)
    if r.returncode == 0 or "fourth@three" in volumes(b):
        raise Failure(f"a truncated stream was accepted: {r.stdout}")
    status = json.loads(b.cli("--json", "receive", "--status", "fourth").stdout)
    pipe(a, ["--resume", status["token"]], b, ["fourth"])
    if digest(b, "fourth@three") != three:
        raise Failure("the resumed receive differs")
    cli(b, "destroy", "fourth@three")
    r = cli(b, "receive", "--status", "fourth", check=False)
    if r.returncode != 4:
        raise Failure(f"status after the receive finished: exit {r.returncode}")

    # The receiving daemon killed mid-stream (after its first checkpoint).
    feed = subprocess.Popen(
        [ARBOR, "--data-dir", b.dir, "receive", "fifth"], stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    raw = open(full, "rb").read()
    feed.stdin.write(raw[: len(raw) * 9 // 10])
    feed.stdin.flush()

    def checkpointed():
        r = cli(b, "--json", "receive", "--status", "fifth", check=False)
        return r.returncode == 0 and json.loads(r.stdout)["offset"] >= 256 << 20

    wait_until(checkpointed, "the receive's first checkpoint", timeout=120)
    before = json.loads(b.cli("--json", "receive", "--status", "fifth").stdout)
    b.kill()
    feed.kill()
    feed.wait()
    b.start()
    if any(name.startswith("fifth") for name in volumes(b)):
        raise Failure("a killed receive left something visible")
    status = json.loads(b.cli("--json", "receive", "--status", "fifth").stdout)
    if status["offset"] < 256 << 20:
        raise Failure(f"the checkpoint was lost: {status}, before the kill {before}:\n{b.log()}")
    got = pipe(a, ["--resume", status["token"]], b, ["fifth"])
    if got["resumed_from"] != status["offset"] or digest(b, "fifth@three") != three:
        raise Failure(f"resume after kill -9: {got}")
    if volumes(b)["copy@two"].get("holds") != ["replication"]:
        raise Failure("a hold did not survive the restart")
    b.cli("release", "copy@two", "replication")
    b.cli("destroy", "copy@two")
    b.stop()
    run(ARBOR, "check", b.pool)


if __name__ == "__main__":
    run_test("send_receive", body, tools=("nbdcopy", "qemu-io"))
