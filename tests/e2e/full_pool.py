#!/usr/bin/python3
"""Campaign 4 (docs/RELIABILITY.md): a pool filled through NBD.

A 256 MiB pool gets a 512 MiB volume written until the daemon answers
ENOSPC. Then: the space warnings (80% and 90%) show in `arbor pool status`,
in /metrics and in the log; everything acknowledged reads back intact;
reads, in-place rewrites, flushes and snapshots keep working; a write that
needs new space after a snapshot fails with ENOSPC and damages nothing;
destroying the snapshot and reclaiming makes it succeed; destroying a
volume lets the fill continue. `arbor check` is clean at the end."""

import errno
import json

import nbd

from harness import Failure, metrics, run_test, wait_until

MIB = 1 << 20


def block(index, version=0):
    """1 MiB whose bytes name its index and version."""
    return bytes([(index * 7 + version * 31 + 1) % 251]) * MIB


def check(condition, what):
    if not condition:
        raise Failure(what)


def expect_enospc(action, what):
    try:
        action()
    except nbd.Error as e:
        check(e.errnum == errno.ENOSPC, f"{what}: expected ENOSPC, got {e}")
        return
    raise Failure(f"{what}: succeeded on a full pool")


def fill(handle, start, limit):
    """Writes 1 MiB blocks from `start` until ENOSPC; returns the first
    block that did not fit."""
    index = start
    while index < limit:
        try:
            handle.pwrite(block(index), index * MIB)
        except nbd.Error as e:
            check(e.errnum == errno.ENOSPC, f"write of block {index}: expected ENOSPC, got {e}")
            return index
        index += 1
    raise Failure(f"wrote {limit} MiB into a pool that cannot hold it")


def verify(handle, blocks, versions=None):
    versions = versions or {}
    for index in range(blocks):
        if handle.pread(MIB, index * MIB) != block(index, versions.get(index, 0)):
            raise Failure(f"block {index} does not read back as written")


def status(daemon):
    return json.loads(daemon.cli("pool", "status", "--json").stdout)


def body(daemon):
    daemon.cli("volume", "create", "big", "--size", "512M")
    daemon.cli("volume", "create", "spare", "--size", "64M")
    big = nbd.NBD()
    big.connect_uri(daemon.uri("big"))
    spare = nbd.NBD()
    spare.connect_uri(daemon.uri("spare"))
    for index in range(16):
        spare.pwrite(block(index), index * MIB)
    spare.flush()

    full_at = fill(big, 0, 512)
    print(f"full pool: ENOSPC after {full_at} MiB of a {status(daemon)['data_bytes'] // MIB} MiB data space")
    verify(big, full_at)
    verify(spare, 16)

    state = status(daemon)
    check(len(state["warnings"]) >= 1 and "warning at 90%" in state["warnings"][0],
          f"pool status shows no 90% warning: {state}")
    check("arbor_pool_space_warning_percent 90" in metrics(daemon), "metrics show no 90% warning")
    # The daemon looks at space use once per commit interval (5 s).
    wait_until(lambda: "data space is" in daemon.log(), "a space warning in the log", timeout=15)

    # What needs no new space keeps working on a full pool.
    big.pwrite(block(0, 1), 0)
    big.flush()
    verify(big, full_at, {0: 1})

    # After a snapshot every chunk is shared: overwriting needs new space.
    daemon.cli("snapshot", "create", "big@s")
    expect_enospc(lambda: big.pwrite(block(1, 2), MIB), "overwrite of a snapshotted chunk")
    verify(big, full_at, {0: 1})
    daemon.cli("destroy", "big@s")
    daemon.cli("pool", "reclaim")
    big.pwrite(block(1, 2), MIB)
    big.flush()
    verify(big, full_at, {0: 1, 1: 2})

    # Destroying a volume frees its space for the fill to go on.
    spare.shutdown()
    daemon.cli("destroy", "spare")
    daemon.cli("pool", "reclaim")
    more = fill(big, full_at, 512)
    check(more >= full_at + 15, f"destroying a 16 MiB volume let only {more - full_at} MiB more in")
    big.flush()
    verify(big, more, {0: 1, 1: 2})
    big.shutdown()
    print(f"full pool: ENOSPC at {full_at} MiB, then {more - full_at} MiB more after a destroy")


if __name__ == "__main__":
    run_test("full pool", body, pool_size="256M")
