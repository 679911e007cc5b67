#!/usr/bin/python3
"""arbor and a real Ceph cluster exchange `rbd diff` streams, both ways and
incrementally (one monitor, one manager, one in-memory OSD on this machine:
tests/e2e/ceph.py; it fails loudly if Ceph cannot start):

* `rbd export-diff` of an image's first snapshot, then of the second from
  the first, applied by `arbor receive --format rbd-diff`: `nbdcopy` out of
  arbor reads byte-identical to `rbd export`;
* `arbor send --format rbd-diff`, full then incremental, applied by `rbd
  import-diff`: `rbd export` reads byte-identical to arbor's snapshots;
* like `rbd import-diff`, arbor refuses a diff whose from-snapshot it lacks
  or whose to-snapshot it has.
"""

import hashlib
import os
import random
import subprocess

from ceph import CephCluster
from harness import ARBOR, Failure, run, run_test

MIB = 1 << 20
SIZE = 64 * MIB


def md5_file(path):
    h = hashlib.md5()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(MIB), b""):
            h.update(block)
    return h.hexdigest()


def arbor_md5(daemon, export):
    out = subprocess.run(["nbdcopy", daemon.uri(export), "-"], check=True,
                         stdout=subprocess.PIPE).stdout
    return hashlib.md5(out).hexdigest()


def rbd_md5(ceph, image, work):
    path = os.path.join(work, "export.raw")
    if os.path.exists(path):
        os.unlink(path)
    ceph.rbd("export", image, path)
    digest = md5_file(path)
    os.unlink(path)
    return digest


def scattered_file(path, rng, pieces, pattern_seed):
    """A sparse SIZE-byte file with `pieces` random 64 KiB pieces of data."""
    with open(path, "wb") as f:
        f.truncate(SIZE)
        for _ in range(pieces):
            f.seek(rng.randrange(SIZE // (64 << 10)) * (64 << 10))
            f.write(random.Random(pattern_seed + f.tell()).randbytes(64 << 10))


def body(daemon):
    rng = random.Random(int(os.environ.get("ARBOR_CEPH_SEED", "7")))
    work = daemon.dir
    with CephCluster() as ceph:
        # Ceph -> arbor.
        first = os.path.join(work, "first.raw")
        scattered_file(first, rng, 200, 1)
        ceph.rbd("import", first, "img")
        ceph.rbd("snap", "create", "img@s1")
        second = os.path.join(work, "second.raw")
        scattered_file(second, rng, 40, 2)
        # Only the data pieces of the second file go over the first image.
        ceph.rbd("import-diff", diff_of_file(second, work), "img")
        ceph.rbd("snap", "create", "img@s2")
        d1, d2 = os.path.join(work, "d1.rbd"), os.path.join(work, "d2.rbd")
        ceph.rbd("export-diff", "img@s1", d1)
        ceph.rbd("export-diff", "--from-snap", "s1", "img@s2", d2)
        # Like import-diff: the incremental first is refused.
        r = cli(daemon, "receive", "vol", "--format", "rbd-diff", "-i", d2, check=False)
        if r.returncode == 0 or "does not exist" not in r.stderr:
            raise Failure(f"a diff from a missing snapshot: exit {r.returncode}: {r.stderr}")
        daemon.cli("receive", "vol", "--format", "rbd-diff", "-i", d1)
        daemon.cli("receive", "vol", "--format", "rbd-diff", "-i", d2)
        for snap in ("s1", "s2"):
            want = rbd_md5(ceph, f"img@{snap}", work)
            got = arbor_md5(daemon, f"vol@{snap}")
            if want != got:
                raise Failure(f"img@{snap} from Ceph: rbd export {want}, arbor {got}")
        r = cli(daemon, "receive", "vol", "--format", "rbd-diff", "-i", d2, check=False)
        if r.returncode == 0 or "already exists" not in r.stderr:
            raise Failure(f"a diff to an existing snapshot: exit {r.returncode}: {r.stderr}")

        # arbor -> Ceph.
        daemon.cli("volume", "create", "mine", "--size", str(SIZE))
        cmds = []
        for i in range(100):
            cmds += ["-c", f"write -P {rng.randrange(1, 256)} {rng.randrange(1024) * 65536} 64k"]
        run("qemu-io", "-f", "raw", *cmds, daemon.uri("mine"))
        daemon.cli("snapshot", "create", "mine@a")
        run("qemu-io", "-f", "raw", "-c", "write -P 7 1M 3M", "-c", "discard 8M 2M",
            "-c", "write -P 9 40M 64k", daemon.uri("mine"))
        daemon.cli("snapshot", "create", "mine@b")
        ceph.rbd("create", "--size", "64M", "copy")
        for args in (["mine@a"], ["mine@b", "--from", "mine@a"]):
            out = os.path.join(work, "out.rbd")
            daemon.cli("send", *args, "--format", "rbd-diff", "-o", out)
            ceph.rbd("import-diff", out, "copy")
            os.unlink(out)
        for snap in ("a", "b"):
            want = arbor_md5(daemon, f"mine@{snap}")
            got = rbd_md5(ceph, f"copy@{snap}", work)
            if want != got:
                raise Failure(f"mine@{snap} into Ceph: arbor {want}, rbd export {got}")
        if rbd_md5(ceph, "copy", work) != arbor_md5(daemon, "mine@b"):
            raise Failure("the Ceph image's head differs from mine@b")
    print("ceph interop: both ways identical")


def cli(daemon, *args, check=True):
    """An arbor command sent to `daemon` (`check=False` for those expected
    to fail)."""
    return run(ARBOR, "--data-dir", daemon.dir, *args, check=check)


def diff_of_file(path, work):
    """An rbd diff v1 (no snapshots) writing the non-zero 64 KiB pieces of
    `path`: how the test puts a second version over the first image."""
    out = os.path.join(work, "pieces.rbd")
    with open(path, "rb") as src, open(out, "wb") as dst:
        dst.write(b"rbd diff v1\n")
        dst.write(b"s" + SIZE.to_bytes(8, "little"))
        offset = 0
        for block in iter(lambda: src.read(64 << 10), b""):
            if any(block):
                dst.write(b"w" + offset.to_bytes(8, "little") + len(block).to_bytes(8, "little"))
                dst.write(block)
            offset += len(block)
        dst.write(b"e")
    return out


if __name__ == "__main__":
    run_test("ceph_interop", body, tools=("nbdcopy", "qemu-io", "rbd", "ceph-mon", "ceph-osd"))
