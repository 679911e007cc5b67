#!/usr/bin/python3
"""Real NBD clients against a running `arbor serve`: nbdinfo, nbdcopy,
qemu-img and qemu-io, and python3-libnbd. Volumes are exports by name,
snapshots read-only exports `vol@snap`; volumes created, resized or deleted
while the daemon runs show up, report their new size, or go away."""

import hashlib
import json
import os

from harness import Failure, run, run_test

MIB = 1 << 20


def sha(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(MIB), b""):
            h.update(block)
    return h.hexdigest()


def exports(daemon):
    out = run("nbdinfo", "--list", "--json", f"nbd+unix://?socket={daemon.nbd}").stdout
    return {e["export-name"]: e for e in json.loads(out)["exports"]}


def check(condition, what):
    if not condition:
        raise Failure(what)


def body(daemon):
    image = os.path.join(daemon.dir, "random.img")
    with open(image, "wb") as f:
        for _ in range(1024):
            f.write(os.urandom(MIB))

    # nbdcopy a random 1 GiB image in and out.
    daemon.cli("volume", "create", "disk", "--size", "1G")
    run("nbdcopy", image, daemon.uri("disk"))
    copy = os.path.join(daemon.dir, "copy.img")
    run("nbdcopy", daemon.uri("disk"), copy)
    check(sha(copy) == sha(image), "nbdcopy round trip changed the data")

    # qemu-img convert into another volume, compare, and back out.
    daemon.cli("volume", "create", "qdisk", "--size", "1G")
    run("qemu-img", "convert", "-n", "-f", "raw", "-O", "raw", image, daemon.uri("qdisk"))
    run("qemu-img", "compare", "-f", "raw", "-F", "raw", image, daemon.uri("qdisk"))
    back = os.path.join(daemon.dir, "back.img")
    run("qemu-img", "convert", "-f", "raw", "-O", "raw", daemon.uri("qdisk"), back)
    check(sha(back) == sha(image), "qemu-img round trip changed the data")
    os.remove(back)

    # A snapshot served read-only.
    daemon.cli("snapshot", "create", "disk@one")
    run("nbdcopy", daemon.uri("disk@one"), copy)
    check(sha(copy) == sha(image), "nbdcopy of the snapshot differs from what was written")
    listed = exports(daemon)
    check({"disk", "disk@one"} <= set(listed), f"nbdinfo --list shows {sorted(listed)}")
    check(run("nbdinfo", "--is", "read-only", daemon.uri("disk@one"), check=False).returncode == 0,
          "the snapshot export is not read-only")
    check(run("nbdinfo", "--is", "read-only", daemon.uri("disk"), check=False).returncode != 0,
          "the volume export is read-only")
    for flag in ("flush", "fua", "trim", "zero", "multi-conn", "cache", "fast-zero", "df"):
        check(run("nbdinfo", "--can", flag, daemon.uri("disk"), check=False).returncode == 0,
              f"volume export cannot {flag}")
    # Writing to the snapshot fails: at open (read-only export) or on the write itself.
    attempt = run("qemu-io", "-f", "raw", "-c", "write 0 4k", daemon.uri("disk@one"), check=False)
    output = attempt.stdout + attempt.stderr
    check(attempt.returncode != 0 or "failed" in output or "read-only" in output,
          f"a write to the snapshot export succeeded: {output}")

    # qemu-io: write, discard, flush; holes show in the allocation map.
    run("qemu-io", "-f", "raw", "-c", "write -P 0x5a 1M 2M", "-c", "discard 64M 64M", "-c", "flush",
        daemon.uri("disk"))
    mapping = json.loads(run("nbdinfo", "--map", "--json", daemon.uri("disk")).stdout)
    holes = [m for m in mapping if m["type"] & 1 and m["offset"] <= 64 * MIB and m["offset"] + m["length"] >= 128 * MIB]
    check(holes, f"no hole reported over the discarded 64M..128M: {mapping[:8]}")
    pattern = run("qemu-io", "-f", "raw", "-c", "read -P 0x5a 1M 2M", daemon.uri("disk"))
    check("Pattern verification failed" not in pattern.stdout, "written pattern did not read back")

    # The snapshot is unchanged by the writes to its volume.
    run("nbdcopy", daemon.uri("disk@one"), copy)
    check(sha(copy) == sha(image), "writing to the volume changed its snapshot")

    # A sparse copy of a mostly empty volume.
    daemon.cli("volume", "create", "sparse", "--size", "1G")
    run("qemu-io", "-f", "raw", "-c", "write -P 7 500M 64k", daemon.uri("sparse"))
    sparse_copy = os.path.join(daemon.dir, "sparse.img")
    run("nbdcopy", daemon.uri("sparse"), sparse_copy)
    check(os.path.getsize(sparse_copy) == 1 << 30, "sparse copy has the wrong size")
    check(os.stat(sparse_copy).st_blocks * 512 < 16 * MIB, "nbdcopy did not copy sparsely")

    # Volumes appear, are resized and vanish while the daemon runs.
    daemon.cli("volume", "create", "late", "--size", "64M")
    check("late" in exports(daemon), "a volume created while serving is not listed")
    daemon.cli("volume", "resize", "late", "128M")
    size = int(run("nbdinfo", "--size", daemon.uri("late")).stdout)
    check(size == 128 * MIB, f"resized export reports {size} bytes")
    daemon.cli("destroy", "late")
    check("late" not in exports(daemon), "a deleted volume is still listed")
    check(run("nbdinfo", daemon.uri("late"), check=False).returncode != 0, "a deleted volume can be opened")


if __name__ == "__main__":
    run_test("NBD clients end-to-end", body, tools=("nbdinfo", "nbdcopy", "qemu-img", "qemu-io"))
