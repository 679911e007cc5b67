#!/usr/bin/python3
"""End to end with a disk snapshotted in place (`arbor origin attach`): an
ext4 image file made and filled before arbor ever sees it is attached as a
volume, mounted through NBD (nbdfuse, losetup, mount), written, and
snapshotted while mounted after a `sync`. Each snapshot is cloned, the
clone mounted (ext4 recovers its journal there, on the writable clone),
checked with `e2fsck -fn` and compared file by file with what the
filesystem held when the snapshot was taken. Then the origin is unmounted,
the clones and one snapshot destroyed, a plain detach refused for the
other, and the origin detached with its data copied into the pool: the
image file itself, mounted with a plain loop device, must hold the latest
files and pass `e2fsck -fn`, and the volume left in the pool, and a clone
of the snapshot left there, their own files, never writing the file. Last, a block device (a loop device) as an origin:
attached again at a start while it is the same disk, refused once its
device number belongs to another, re-identified when the same disk comes
back under another number. Then the aliases of one storage refused as a
second origin (a loop device over an attached file, a partition of an
attached disk...), and block devices in use (mounted, held open
exclusively) refused. Needs root (mount); fails loudly without it."""

import hashlib
import json
import os
import random
import struct

from filesystem import Attached, write_tree
from harness import ARBOR, Failure, metrics, run, run_test, wait_until

IMAGE_SIZE = 256 << 20


class ImageFile(Attached):
    """The image file itself on a loop device, mounted: no arbor between."""

    def __init__(self, daemon, image):
        super().__init__(daemon, "image-file", read_only=False)
        self.image = image

    def attach(self):
        self.loop = run("losetup", "-f", "--show", self.image).stdout.strip()
        self.daemon.cleanups.append(self.detach_loop)
        return self.loop


def tree_sums(root):
    """{path: sha256} of every file under root (lost+found aside)."""
    sums = {}
    for directory, subdirectories, files in os.walk(root):
        if directory == root and "lost+found" in subdirectories:
            subdirectories.remove("lost+found")
        for name in files:
            path = os.path.join(directory, name)
            with open(path, "rb") as f:
                sums[os.path.relpath(path, root)] = hashlib.sha256(f.read()).hexdigest()
    return sums


def same_tree(root, want, what):
    """The tree under root is exactly `want`: no file missing, none more,
    every content right."""
    got = tree_sums(root)
    if got != want:
        missing = sorted(set(want) - set(got))
        extra = sorted(set(got) - set(want))
        wrong = sorted(k for k in set(got) & set(want) if got[k] != want[k])
        raise Failure(f"{what}: {len(missing)} files missing {missing[:3]}, {len(extra)} unexpected "
                      f"{extra[:3]}, {len(wrong)} with the wrong contents {wrong[:3]}")


def change_files(root, state, rng):
    """Overwrites some files and deletes others; returns the new state."""
    changed = dict(state)
    for rel in sorted(state)[::5]:
        data = rng.randbytes(rng.choice([100, 8192, 300_000]))
        with open(os.path.join(root, rel), "wb") as f:
            f.write(data)
        changed[rel] = hashlib.sha256(data).hexdigest()
    for rel in sorted(state)[2::9]:
        os.remove(os.path.join(root, rel))
        del changed[rel]
    return changed


def body(daemon):
    rng = random.Random(20261124)
    image = os.path.join(daemon.dir, "disk.img")
    with open(image, "wb") as f:
        f.truncate(IMAGE_SIZE)
    # Inode tables and journal written now, not by a background thread
    # while the snapshots are taken.
    run("mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", image)

    # Files on it before arbor sees it.
    plain = ImageFile(daemon, image)
    plain.attach()
    state = write_tree(plain.mount(), rng)
    plain.close()

    daemon.cli("origin", "attach", "disk", image)
    origin = Attached(daemon, "disk", read_only=False)
    origin.attach()
    root = origin.mount()
    same_tree(root, state, "the origin as attached")

    # Snapshots of the mounted filesystem, each after a sync.
    expected = {}
    for n in (1, 2):
        state = dict(state)
        state.update({os.path.join(f"gen{n}", k): v for k, v in write_tree(os.path.join(root, f"gen{n}"), rng).items()})
        if n == 2:
            state = change_files(root, state, rng)
        run("sync")
        daemon.cli("snapshot", "create", f"disk@s{n}")
        expected[f"disk@s{n}"] = state
    state = change_files(root, state, rng)
    state.update({os.path.join("gen3", k): v for k, v in write_tree(os.path.join(root, "gen3"), rng).items()})
    run("sync")
    same_tree(root, state, "the origin after the snapshots")

    # Each snapshot, through a clone: journal recovery, then fsck.
    for snapshot, want in expected.items():
        clone = "clone-" + snapshot.split("@")[1]
        daemon.cli("clone", snapshot, clone)
        attached = Attached(daemon, clone, read_only=False)
        device = attached.attach()
        same_tree(attached.mount(), want, f"{clone} (of {snapshot})")
        attached.unmount()
        run("e2fsck", "-fn", device)
        attached.close()
    same_tree(root, state, "the origin after the clones")
    origin.close()

    for snapshot in expected:
        daemon.cli("destroy", "clone-" + snapshot.split("@")[1])
    daemon.cli("destroy", "disk@s1")
    # disk@s2 stays: a plain detach is refused; one that copies the data
    # into the pool keeps the volume and its snapshot there.
    refused = run(ARBOR, "--data-dir", daemon.dir, "origin", "detach", "disk", check=False)
    if refused.returncode != 5 or "--copy-to-pool" not in refused.stderr:
        raise Failure(f"detach with a snapshot: exit {refused.returncode}, {refused.stderr}")
    daemon.cli("origin", "detach", "disk", "--copy-to-pool")
    listed = daemon.cli("origin", "list", "--json").stdout
    if listed.strip() != "[]":
        raise Failure(f"origins after the detach: {listed}")

    # The file alone holds the latest files, and a clean filesystem.
    plain = ImageFile(daemon, image)
    plain.attach()
    same_tree(plain.mount(), state, "the image file after the detach")
    plain.close()
    run("e2fsck", "-fn", image)

    # In the pool: the volume holds the latest files, its snapshot (through
    # a clone, journal recovered) its own, and neither touches the file.
    with open(image, "rb") as f:
        file_sum = hashlib.sha256(f.read()).hexdigest()
    kept = Attached(daemon, "disk", read_only=False)
    kept.attach()
    kept_root = kept.mount()
    same_tree(kept_root, state, "the volume copied into the pool")
    state = change_files(kept_root, state, rng)
    run("sync")
    same_tree(kept_root, state, "the volume in the pool, written")
    kept.close()
    daemon.cli("clone", "disk@s2", "clone-s2")
    attached = Attached(daemon, "clone-s2", read_only=False)
    device = attached.attach()
    same_tree(attached.mount(), expected["disk@s2"], "clone-s2 after the copy into the pool")
    attached.unmount()
    run("e2fsck", "-fn", device)
    attached.close()
    with open(image, "rb") as f:
        if hashlib.sha256(f.read()).hexdigest() != file_sum:
            raise Failure("the detached file changed")
    for name in ("clone-s2", "disk@s2", "disk"):
        daemon.cli("destroy", name)

    block_device(daemon)
    aliases(daemon)
    held(daemon)
    shrink(daemon)


def refused(daemon, name, path, status, says):
    """`arbor origin attach NAME PATH` fails with exit `status`, saying `says`."""
    out = run(ARBOR, "--data-dir", daemon.dir, "origin", "attach", name, path, check=False)
    if out.returncode != status or says not in out.stderr:
        raise Failure(f"origin attach {name} {path}: exit {out.returncode}, wanted {status} "
                      f"saying {says!r}: {out.stderr}")


def loop_device(daemon, image, partitions=False):
    """A loop device over `image` (with its partitions), removed at the end."""
    flags = ["-P"] if partitions else []
    dev = run("losetup", "-f", "--show", *flags, image).stdout.strip()
    daemon.cleanups.append(lambda: run("losetup", "-d", dev, check=False))
    if partitions and not os.path.exists(dev + "p1"):
        # Without udev the kernel may not have read the table yet.
        run("partx", "-a", dev, check=False)
    return dev


def plain_image(daemon, name, byte, size=8 << 20):
    path = os.path.join(daemon.dir, name)
    with open(path, "wb") as f:
        f.write(bytes([byte]) * size)
    return path


def aliases(daemon):
    """Issue 39, 1: one storage under two names is refused as a second
    origin, whichever name came first: a loop device over an attached
    file, the file behind an attached loop device, another node of the
    same device, a partition of an attached disk, the disk of an attached
    partition; two partitions of one disk are two origins."""
    # The reproduction of the issue: the file attached, then a loop device
    # over it.
    image = plain_image(daemon, "alias.img", 0x31)
    daemon.cli("origin", "attach", "o1", image)
    loop = loop_device(daemon, image)
    refused(daemon, "o13", loop, 5, "is the storage of origin o1")
    refused(daemon, "o13", loop, 5, "is a loop device over")
    daemon.cli("snapshot", "create", "o1@before")
    read_back(daemon, "o1@before", 0x31)
    daemon.cli("destroy", "o1@before")
    daemon.cli("origin", "detach", "o1")

    # The loop device first, then its file; then another node of the device.
    daemon.cli("origin", "attach", "l1", loop)
    refused(daemon, "f1", image, 5, "is the storage of origin l1")
    st = os.stat(loop)
    node = os.path.join(daemon.dir, "another-name-for-the-loop")
    os.mknod(node, 0o600 | 0o060000, st.st_rdev)
    refused(daemon, "n1", node, 5, "is the device of origin l1")
    daemon.cli("origin", "detach", "l1")

    # A disk with two partitions (an MBR written here: 1 MiB at 1 MiB,
    # 2 MiB at 3 MiB).
    disk_image = plain_image(daemon, "parted.img", 0, 8 << 20)
    with open(disk_image, "r+b") as f:
        mbr = bytearray(512)
        for i, (start, count) in enumerate(((2048, 2048), (6144, 4096))):
            mbr[446 + 16 * i:462 + 16 * i] = struct.pack("<B3sB3sII", 0, b"", 0x83, b"", start, count)
        mbr[510:512] = b"\x55\xaa"
        f.write(mbr)
    disk = loop_device(daemon, disk_image, partitions=True)
    part1, part2 = disk + "p1", disk + "p2"
    if not os.path.exists(part1):
        raise Failure(f"no partition device {part1} after losetup -P and partx")
    daemon.cli("origin", "attach", "p1", part1)
    refused(daemon, "whole", disk, 5, "is a partition of")
    daemon.cli("origin", "attach", "p2", part2)
    daemon.cli("origin", "detach", "p1")
    daemon.cli("origin", "detach", "p2")
    daemon.cli("origin", "attach", "whole", disk)
    refused(daemon, "p1", part1, 5, "is the storage of origin whole")
    daemon.cli("origin", "detach", "whole")


def held(daemon):
    """Issue 39, 2: a block device that is mounted, or open exclusively by
    another program, is refused, saying which; one attached is held
    exclusively, so it cannot be mounted meanwhile."""
    image = plain_image(daemon, "held.img", 0, 16 << 20)
    run("mkfs.ext4", "-q", "-F", image)
    dev = loop_device(daemon, image)
    mnt = os.path.join(daemon.dir, "held-mnt")
    os.makedirs(mnt, exist_ok=True)
    run("mount", dev, mnt)
    try:
        refused(daemon, "h", dev, 6, f"is mounted (at {mnt})")
    finally:
        run("umount", mnt)
    fd = os.open(dev, os.O_RDWR | os.O_EXCL)
    try:
        refused(daemon, "h", dev, 6, "holds it open exclusively")
    finally:
        os.close(fd)
    daemon.cli("origin", "attach", "h", dev)
    mounted = run("mount", dev, mnt, check=False)
    if mounted.returncode == 0:
        run("umount", mnt)
        raise Failure(f"{dev} attached as an origin could be mounted meanwhile")
    daemon.cli("origin", "detach", "h")


def qemu_read(daemon, export, offset, byte=None):
    """qemu-io reads 1 MiB of `export` at `offset` (checking it holds `byte`
    if given); returns whether the read succeeded (qemu-io reports a failed
    command on stdout and still exits 0)."""
    flags = ["-r"] if "@" in export else []
    pattern = ["-P", f"{byte:#x}"] if byte is not None else []
    out = run("qemu-io", "-f", "raw", *flags, "-c",
              " ".join(["read", *pattern, str(offset), "1M"]), daemon.uri(export), check=False)
    text = out.stdout + out.stderr
    if "Pattern verification failed" in text:
        raise Failure(f"{export} at {offset} does not hold {byte:#x}: {text}")
    return out.returncode == 0 and "failed" not in text and "error" not in text.lower()


def origin_state(daemon, name):
    listed = json.loads(daemon.cli("origin", "list", "--json").stdout)
    return next(o for o in listed if o["name"] == name)


def shrink(daemon):
    """Issue 39, 3: the file of an attached origin truncated from 64 MiB to
    16 MiB fails the origin within a watch interval (origin list, the
    origin_failed alert and metric), it serves no I/O, and grown back it is
    not attached again, at a restart either, until the loss is accepted.
    Then its snapshot taken before reads its copies and the bytes the file
    kept, fails (never zeros) where it read the lost ones, and check lists
    it until it is destroyed."""
    image = plain_image(daemon, "shrinks.img", 0x41, 64 << 20)
    daemon.cli("origin", "attach", "o1", image)
    daemon.cli("snapshot", "create", "o1@s1")
    run("qemu-io", "-f", "raw", "-c", "write -P 0x42 0 1M", daemon.uri("o1"))
    os.truncate(image, 16 << 20)
    wait_until(lambda: origin_state(daemon, "o1").get("failed"), "o1 to fail after its file shrank")
    state = origin_state(daemon, "o1")
    if state["attached"] or state["loss"]["from"] != 16 << 20:
        raise Failure(f"o1 after its file shrank: {state}")
    if qemu_read(daemon, "o1", 0):
        raise Failure("a failed origin served a read")
    if os.path.getsize(image) != 16 << 20:
        raise Failure("the failed origin's file was written past its new end")
    wait_until(lambda: "origin_failed" in daemon.cli("pool", "status", "--json").stdout,
               "the origin_failed alert")
    if 'arbor_origin_failed{volume="o1"} 1' not in metrics(daemon):
        raise Failure("the origin_failed metric of o1 is not 1")

    os.truncate(image, 64 << 20)
    refused(daemon, "o1", image, 5, "--accept-damage")
    daemon.stop()
    daemon.start()
    state = origin_state(daemon, "o1")
    if state["attached"] or not state.get("failed"):
        raise Failure(f"o1 grown back was attached at a start: {state}")
    daemon.cli("origin", "attach", "o1", image, "--accept-damage")
    state = origin_state(daemon, "o1")
    if not state["attached"] or state.get("failed") or not state["loss"].get("accepted_unix_secs"):
        raise Failure(f"o1 after --accept-damage: {state}")
    # Its copy, the bytes the file kept, and an error (not zeros) past 16 MiB.
    if not qemu_read(daemon, "o1@s1", 0, 0x41) or not qemu_read(daemon, "o1@s1", 8 << 20, 0x41):
        raise Failure("o1@s1 lost what it had kept")
    for at in (16 << 20, 40 << 20):
        if qemu_read(daemon, "o1@s1", at):
            raise Failure(f"o1@s1 served lost bytes at {at} as data")
    checked = run(ARBOR, "--data-dir", daemon.dir, "check", check=False)
    if checked.returncode != 8 or "lost: o1@s1" not in checked.stdout:
        raise Failure(f"check with o1@s1's loss: exit {checked.returncode}: {checked.stdout}{checked.stderr}")
    daemon.cli("destroy", "o1@s1")
    daemon.cli("check")
    daemon.cli("origin", "detach", "o1")


def block_device(daemon):
    """A block device (a loop device) as an origin: attached again at a
    start while it is the same disk; when its device number has passed to
    another disk (the loop device now backed by another file), refused;
    the same disk under a new device number, attached and recorded."""
    images = []
    for n, byte in ((0, 0x11), (1, 0x44)):
        images.append(os.path.join(daemon.dir, f"blk{n}.img"))
        with open(images[-1], "wb") as f:
            f.write(bytes([byte]) * (8 << 20))
    loop = run("losetup", "-f", "--show", images[0]).stdout.strip()
    daemon.cleanups.append(lambda: run("losetup", "-d", loop, check=False))
    daemon.cli("origin", "attach", "blk", loop)
    listed = json.loads(daemon.cli("origin", "list", "--json").stdout)
    if [(o["name"], o["attached"], o["device"]["ino"]) for o in listed] != [("blk", True, 0)]:
        raise Failure(f"a block device origin: {listed}")
    daemon.cli("snapshot", "create", "blk@s")
    run("qemu-io", "-f", "raw", "-c", "write -P 0x22 0 1M", daemon.uri("blk"))
    read_back(daemon, "blk@s", 0x11)
    daemon.stop()
    daemon.start()
    read_back(daemon, "blk", 0x22)
    read_back(daemon, "blk@s", 0x11)

    # Another disk behind the same device number.
    daemon.stop()
    run("losetup", "-d", loop)
    run("losetup", loop, images[1])
    daemon.start()
    listed = json.loads(daemon.cli("origin", "list", "--json").stdout)
    if listed[0]["attached"]:
        raise Failure(f"{loop} now backed by another file was attached as blk: {listed}")
    if "is another disk" not in daemon.log():
        raise Failure(f"the daemon's log does not say why blk stays unattached:\n{daemon.log()}")
    refused = run(ARBOR, "--data-dir", daemon.dir, "origin", "attach", "blk", loop, check=False)
    if refused.returncode != 5 or "is another disk" not in refused.stderr:
        raise Failure(f"attaching another disk as blk: exit {refused.returncode}: {refused.stderr}")

    # The right disk under another device number (as after a reboot): known
    # by its marks (the loop device's backing file), its new number is
    # recorded and it is attached, with its data and its snapshot's; the
    # next start opens it from the new path.
    moved = run("losetup", "-f", "--show", images[0]).stdout.strip()
    daemon.cleanups.append(lambda: run("losetup", "-d", moved, check=False))
    if moved == loop:
        raise Failure(f"losetup gave {images[0]} the same device {loop} again")
    daemon.cli("origin", "attach", "blk", moved)
    listed = json.loads(daemon.cli("origin", "list", "--json").stdout)
    if not listed[0]["attached"] or listed[0]["path"] != moved:
        raise Failure(f"blk on its new device number {moved} was not attached: {listed}")
    if "has a new device number" not in daemon.log():
        raise Failure(f"the daemon's log does not say blk's number changed:\n{daemon.log()}")
    read_back(daemon, "blk", 0x22)
    read_back(daemon, "blk@s", 0x11)
    daemon.stop()
    daemon.start()
    listed = json.loads(daemon.cli("origin", "list", "--json").stdout)
    if not listed[0]["attached"]:
        raise Failure(f"blk was not attached from {moved} at the next start: {listed}")
    read_back(daemon, "blk", 0x22)
    daemon.cli("destroy", "blk@s")
    daemon.cli("origin", "detach", "blk")


def read_back(daemon, export, byte):
    """The first MiB of `export` holds `byte` (qemu-io checks the pattern)."""
    flags = ["-r"] if "@" in export else []
    run("qemu-io", "-f", "raw", *flags, "-c", f"read -P {byte:#x} 0 1M", daemon.uri(export))


if __name__ == "__main__":
    run_test("origin ext4 end-to-end", body,
             tools=("nbdfuse", "losetup", "mkfs.ext4", "e2fsck", "fusermount3", "qemu-io"), needs_root=True)
