#!/usr/bin/python3
"""End to end with a real filesystem: ext4 on an arbor volume through NBD
(nbdfuse exposes the export as a file, losetup attaches it, the kernel
mounts it). Write a tree of files, snapshot, mount the snapshot read-only
through its own export and verify every file, then write to the origin and
see the snapshot unchanged. Needs root (mount); fails loudly without it."""

import hashlib
import os
import random
import subprocess

from harness import Failure, run, run_test, wait_until


class Attached:
    """An NBD export mounted as a filesystem: nbdfuse file → loop device → mount."""

    def __init__(self, daemon, export, read_only):
        self.daemon, self.export, self.read_only = daemon, export, read_only
        base = os.path.join(daemon.dir, export.replace("@", "_at_"))
        self.fuse_dir, self.mount_dir = base + ".fuse", base + ".mnt"
        # An export is attached again after being detached: reuse its directories.
        os.makedirs(self.fuse_dir, exist_ok=True)
        os.makedirs(self.mount_dir, exist_ok=True)
        self.fuse = None
        self.loop = None

    def attach(self):
        argv = ["nbdfuse"] + (["-r"] if self.read_only else []) + [self.fuse_dir, self.daemon.uri(self.export)]
        self.fuse = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.daemon.cleanups.append(self.detach_fuse)
        image = os.path.join(self.fuse_dir, "nbd")
        wait_until(lambda: os.path.exists(image) or self.fuse.poll() is not None, f"nbdfuse for {self.export}")
        if self.fuse.poll() is not None:
            raise Failure(f"nbdfuse {self.export} failed: {self.fuse.stderr.read().decode()}")
        self.loop = run("losetup", "-f", "--show", *(["-r"] if self.read_only else []), image).stdout.strip()
        self.daemon.cleanups.append(self.detach_loop)
        return self.loop

    def mount(self):
        options = "ro,noload" if self.read_only else "rw"
        proc = run("mount", "-t", "ext4", "-o", options, self.loop, self.mount_dir, check=False)
        if proc.returncode != 0:
            raise Failure(f"mount failed (this test needs root and loop devices): {proc.stderr}")
        self.daemon.cleanups.append(self.unmount)
        return self.mount_dir

    def unmount(self):
        if os.path.ismount(self.mount_dir):
            run("umount", self.mount_dir)

    def detach_loop(self):
        if self.loop:
            run("losetup", "-d", self.loop, check=False)
            self.loop = None

    def detach_fuse(self):
        """Unmounts nbdfuse's directory and waits for nbdfuse to exit. Right
        after `losetup -d` the loop device may still hold the FUSE file (the
        kernel detaches it when its last user lets go), and the unmount fails
        busy until then: it is retried. A mount left behind by an nbdfuse that
        died is unmounted lazily, so the export can be attached again."""
        if self.fuse is None:
            return
        wait_until(lambda: self.fuse.poll() is not None
                   or run("fusermount3", "-u", self.fuse_dir, check=False).returncode == 0,
                   f"unmount of {self.fuse_dir}", timeout=120)
        self.fuse.wait(timeout=120)
        if is_mounted(self.fuse_dir):
            run("umount", "-l", self.fuse_dir, check=False)
        self.fuse = None

    def close(self):
        self.unmount()
        self.detach_loop()
        self.detach_fuse()


def is_mounted(path):
    """Whether `path` is a mount point, by the mount table (a FUSE mount whose
    daemon died cannot be stat'ed, so os.path.ismount says no)."""
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == os.path.realpath(path) for line in f)


def write_tree(root, rng):
    """A tree of directories and files of varied sizes; returns {path: sha256}."""
    sums = {}
    for d in range(6):
        directory = os.path.join(root, f"dir{d}", f"sub{d % 3}")
        os.makedirs(directory, exist_ok=True)
        for f in range(12):
            size = rng.choice([0, 1, 511, 4096, 70_000, 1 << 20, 3 << 20])
            data = rng.randbytes(size)
            path = os.path.join(directory, f"file{f}.bin")
            with open(path, "wb") as out:
                out.write(data)
            sums[os.path.relpath(path, root)] = hashlib.sha256(data).hexdigest()
    return sums


def verify_tree(root, sums, what):
    for rel, digest in sums.items():
        with open(os.path.join(root, rel), "rb") as f:
            if hashlib.sha256(f.read()).hexdigest() != digest:
                raise Failure(f"{what}: {rel} has the wrong contents")


def body(daemon):
    rng = random.Random(20261123)
    daemon.cli("volume", "create", "vm1", "--size", "512M")

    origin = Attached(daemon, "vm1", read_only=False)
    run("mkfs.ext4", "-q", "-F", origin.attach())
    tree = write_tree(origin.mount(), rng)
    origin.close()

    daemon.cli("snapshot", "create", "vm1@s1")

    snap = Attached(daemon, "vm1@s1", read_only=True)
    snap.attach()
    verify_tree(snap.mount(), tree, "snapshot")
    snap.close()

    # Change the origin: overwrite, delete and add files.
    origin = Attached(daemon, "vm1", read_only=False)
    origin.attach()
    root = origin.mount()
    changed = dict(tree)
    for rel in list(tree)[::3]:
        with open(os.path.join(root, rel), "wb") as f:
            data = rng.randbytes(8192)
            f.write(data)
        changed[rel] = hashlib.sha256(data).hexdigest()
    for rel in list(tree)[1::7]:
        os.remove(os.path.join(root, rel))
        del changed[rel]
    changed.update({os.path.join("new", k): v for k, v in write_tree(os.path.join(root, "new"), rng).items()})
    verify_tree(root, changed, "origin after changes")
    origin.close()

    snap = Attached(daemon, "vm1@s1", read_only=True)
    snap.attach()
    verify_tree(snap.mount(), tree, "snapshot after the origin changed")
    snap.close()

    origin = Attached(daemon, "vm1", read_only=False)
    origin.attach()
    run("e2fsck", "-fn", origin.loop)
    verify_tree(origin.mount(), changed, "origin after remount")
    origin.close()


if __name__ == "__main__":
    TOOLS = ("nbdfuse", "losetup", "mkfs.ext4", "fusermount3")
    run_test("filesystem end-to-end", body, tools=TOOLS, needs_root=True)
    # The same through direct I/O (O_DIRECT on the pool file): the kernel's
    # ext4 writes every size and alignment it likes.
    run_test("filesystem end-to-end, direct I/O", body, tools=TOOLS, needs_root=True,
             extra_args=("--io", "direct"))
