#!/usr/bin/python3
"""arbor backs up to a real RADOS Gateway (Ceph's S3, on the one-node
cluster of tests/e2e/ceph.py) and restores from it:

* a repository made in a bucket with `arbor backup init`, configured in a
  running daemon by `arbor config reload`;
* a volume with a random history (writes, a discard): a full backup, an
  incremental one, and a clone's backup deduplicated against them (the
  bucket's bytes measured by the gateway); each restored into a new volume
  that reads byte-identical to its snapshot;
* the gateway killed in the middle of an upload and started again: the
  backup completes (the store's retries) and restores identical;
* the daemon killed (-9) in the middle of an upload: after a restart the
  backup again uploads only what the store does not have yet;
* a bucket quota reached: the backup fails clearly, and succeeds once the
  quota is lifted;
* a pack replaced in the bucket: the restore fails naming it, and leaves no
  volume.
"""

import atexit
import hashlib
import json
import os
import random
import shutil
import subprocess
import tempfile
import threading
import time

from ceph import CephCluster
from filesystem import Attached, verify_tree, write_tree
from harness import ARBOR, Failure, run, run_test, wait_until

MIB = 1 << 20
BUCKET = "arbor-backups"
CONFIG = os.path.join(tempfile.mkdtemp(prefix="arbor-backup-e2e-"), "arbor.toml")
atexit.register(shutil.rmtree, os.path.dirname(CONFIG), True)


def md5_export(daemon, export):
    out = subprocess.run(["nbdcopy", daemon.uri(export), "-"], check=True, stdout=subprocess.PIPE).stdout
    return hashlib.md5(out).hexdigest()


def cli(daemon, *args, check=True):
    return run(ARBOR, "--data-dir", daemon.dir, *args, check=check)


def cli_json(daemon, *args):
    return json.loads(cli(daemon, "--json", *args).stdout)


def random_writes(daemon, export, rng, count, size):
    cmds = []
    for _ in range(count):
        length = rng.randrange(1, 64) * 4096
        offset = rng.randrange((size - length) // 4096) * 4096
        cmds += ["-c", f"write -P {rng.randrange(1, 256)} {offset} {length}"]
    run("qemu-io", "-f", "raw", *cmds, daemon.uri(export))


def fill_random(daemon, export, size, seed, work):
    path = os.path.join(work, f"fill-{seed}.raw")
    with open(path, "wb") as f:
        f.write(random.Random(seed).randbytes(size))
    run("nbdcopy", "--flush", path, daemon.uri(export))
    os.unlink(path)


def bucket_bytes(env):
    """Bytes of every object in the bucket, from a listing (the gateway's
    own statistics lag behind)."""
    return json.loads(run("rclone", "size", "--json", f"rgw:{BUCKET}", env=env).stdout)["bytes"]


def bucket_stats(ceph):
    stats = json.loads(ceph.rgw_admin("bucket", "stats", f"--bucket={BUCKET}").stdout)
    main = stats.get("usage", {}).get("rgw.main", {})
    return main.get("size_actual", 0), main.get("num_objects", 0)


def backup(daemon, snapshot, check=True):
    proc = cli(daemon, "--json", "backup", "create", "rgw", snapshot, check=check)
    return json.loads(proc.stdout) if proc.returncode == 0 else proc


def restore_matches(daemon, backup_id, snapshot, volume):
    cli(daemon, "backup", "restore", "rgw", backup_id, volume)
    want, got = md5_export(daemon, snapshot), md5_export(daemon, volume)
    if want != got:
        raise Failure(f"backup {backup_id[:12]} restored into {volume}: {got}, {snapshot} holds {want}")


def in_background(daemon, *args):
    """Starts an arbor command; returns its Popen."""
    return subprocess.Popen([ARBOR, "--data-dir", daemon.dir, *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


class SlowGateway:
    """The gateway's replies (what a restore downloads) shaped to `rate` on
    the loopback device: an HTB class that only packets from its port go
    through (other traffic is not classified, so not shaped)."""

    def __init__(self, port, rate):
        self.port, self.rate = port, rate

    def __enter__(self):
        run("tc", "qdisc", "add", "dev", "lo", "root", "handle", "1:", "htb")
        try:
            run("tc", "class", "add", "dev", "lo", "parent", "1:", "classid", "1:20", "htb",
                "rate", self.rate, "ceil", self.rate)
            run("tc", "filter", "add", "dev", "lo", "parent", "1:", "protocol", "ip", "prio", "1",
                "u32", "match", "ip", "sport", str(self.port), "0xffff", "flowid", "1:20")
        except Failure:
            self.__exit__()
            raise
        return self

    def __exit__(self, *_):
        run("tc", "qdisc", "del", "dev", "lo", "root", check=False)


def restoring(daemon, volume):
    """The volume's `restoring` view, or None once its restore is whole."""
    for v in cli_json(daemon, "volume", "list"):
        if v["name"] == volume:
            return v.get("restoring")
    raise Failure(f"no volume {volume}")


def instant_ext4(daemon, ceph, rng):
    """A real ext4 on a volume still being restored, the gateway slowed: it
    is e2fsck-clean, every file reads right, new files are written, and when
    the restore completes all of it is there."""
    cli(daemon, "volume", "create", "fs", "--size", "256M")
    origin = Attached(daemon, "fs", read_only=False)
    run("mkfs.ext4", "-q", "-F", origin.attach())
    tree = write_tree(origin.mount(), rng)
    origin.close()
    cli(daemon, "snapshot", "create", "fs@a")
    made = backup(daemon, "fs@a")
    # 12 Mbit/s: the backup's 40-odd MiB take half a minute to come back.
    with SlowGateway(ceph.rgw_port, "12mbit"):
        started = time.monotonic()
        out = cli_json(daemon, "backup", "restore", "rgw", made["id"], "fsr", "--instant")
        if not out.get("instant"):
            raise Failure(f"an instant restore answered as a plain one: {out}")
        answered = time.monotonic() - started
        run("qemu-io", "-f", "raw", "-c", "read 0 4k", daemon.uri("fsr"))
        first_byte = time.monotonic() - started
        state = restoring(daemon, "fsr")
        if state is None or state["state"] != "filling":
            raise Failure(f"the restore is not under way after its answer: {state}")
        dr = Attached(daemon, "fsr", read_only=False)
        loop = dr.attach()
        fsck = run("e2fsck", "-fn", loop, check=False)
        if fsck.returncode != 0:
            raise Failure(f"e2fsck of the volume being restored: exit {fsck.returncode}\n{fsck.stdout}{fsck.stderr}")
        root = dr.mount()
        during = restoring(daemon, "fsr")
        if during is None:
            raise Failure("the restore completed before the filesystem was mounted: nothing was tested")
        verify_tree(root, tree, "ext4 on a volume being restored")
        added = {os.path.join("new", k): v for k, v in write_tree(os.path.join(root, "new"), rng).items()}
        verify_tree(root, added, "files written while restoring")
        dr.close()
        print(f"instant restore: answered in {answered:.2f} s, first 4 KiB read at {first_byte:.2f} s; "
              f"mounted and checked at {during['done_bytes'] * 100 // during['size']}% restored")
        wait_until(lambda: restoring(daemon, "fsr") is None, "the instant restore to complete", timeout=600)
    dr = Attached(daemon, "fsr", read_only=False)
    fsck = run("e2fsck", "-fn", dr.attach(), check=False)
    if fsck.returncode != 0:
        raise Failure(f"e2fsck after the instant restore: exit {fsck.returncode}\n{fsck.stdout}{fsck.stderr}")
    root = dr.mount()
    verify_tree(root, tree, "ext4 after the instant restore")
    verify_tree(root, added, "files written while restoring, after it")
    dr.close()
    cli(daemon, "snapshot", "create", "fsr@done")


def body(daemon):
    rng = random.Random(int(os.environ.get("ARBOR_BACKUP_SEED", "11")))
    work = daemon.dir
    with CephCluster(rgw=True, memstore_bytes=3 << 30) as ceph:
        # rclone's S3 client refuses an AWS_CA_BUNDLE it cannot use with
        # its own transport (and the gateway is plain HTTP).
        env = {k: v for k, v in os.environ.items() if k != "AWS_CA_BUNDLE"}
        env.update(RCLONE_CONFIG_RGW_TYPE="s3", RCLONE_CONFIG_RGW_PROVIDER="Ceph",
                   RCLONE_CONFIG_RGW_ENDPOINT=ceph.rgw_endpoint,
                   RCLONE_CONFIG_RGW_ACCESS_KEY_ID=ceph.rgw_access_key,
                   RCLONE_CONFIG_RGW_SECRET_ACCESS_KEY=ceph.rgw_secret_key)
        run("rclone", "mkdir", f"rgw:{BUCKET}", env=env)
        key = os.path.join(work, "backup.key")
        creds = os.path.join(work, "s3.toml")
        with open(os.open(creds, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
            f.write(f'access_key_id = "{ceph.rgw_access_key}"\nsecret_access_key = "{ceph.rgw_secret_key}"\n')
        cli(daemon, "backup", "new-key", key)
        url = f"s3://{BUCKET}/arbor"
        made = json.loads(run(ARBOR, "--json", "backup", "init", url, "--endpoint", ceph.rgw_endpoint,
                              "--credentials-file", creds, "--key-file", key).stdout)
        with open(CONFIG, "w") as f:
            f.write(f'backup_repositories = [{{ name = "rgw", url = "{url}", endpoint = "{ceph.rgw_endpoint}", '
                    f'key_file = "{key}", credentials_file = "{creds}" }}]\n')
        reloaded = cli_json(daemon, "config", "reload")
        if "backup_repositories" not in reloaded["changed"]:
            raise Failure(f"the reload did not take the repository: {reloaded}")

        # A random history: full, incremental, a clone's.
        size = 64 * MIB
        cli(daemon, "volume", "create", "vol", "--size", str(size))
        fill_random(daemon, "vol", size, 2, work)
        random_writes(daemon, "vol", rng, 300, size)
        cli(daemon, "snapshot", "create", "vol@s1")
        full = backup(daemon, "vol@s1")
        if full["parent"] is not None:
            raise Failure(f"the first backup has a parent: {full}")
        stored_full = bucket_bytes(env)
        random_writes(daemon, "vol", rng, 20, size)
        run("qemu-io", "-f", "raw", "-c", "discard 8M 4M", daemon.uri("vol"))
        cli(daemon, "snapshot", "create", "vol@s2")
        incr = backup(daemon, "vol@s2")
        if incr["parent"] != full["id"]:
            raise Failure(f"the second backup is not incremental from the first: {incr}")
        if incr["added_bytes"] > 20 * 256 * 1024 * 2:
            raise Failure(f"20 writes of at most 252 KiB added {incr['added_bytes']} bytes")
        cli(daemon, "clone", "vol@s1", "c1")
        random_writes(daemon, "c1", rng, 5, size)
        cli(daemon, "snapshot", "create", "c1@x")
        before = bucket_bytes(env)
        cloned = backup(daemon, "c1@x")
        after = bucket_bytes(env)
        if after - before > min(4 * MIB, stored_full // 8):
            raise Failure(f"a clone with 5 writes grew the bucket by {after - before} bytes "
                          f"(its first backup stored {stored_full})")
        print(f"bucket bytes: full {stored_full}, clone's backup +{after - before} "
              f"(added {cloned['added_bytes']})")
        for b, snap, vol in ((full, "vol@s1", "r1"), (incr, "vol@s2", "r2"), (cloned, "c1@x", "r3")):
            restore_matches(daemon, b["id"], snap, vol)
        instant_ext4(daemon, ceph, rng)

        # The gateway killed mid-upload, then started again.
        cli(daemon, "volume", "create", "big", "--size", str(128 * MIB))
        fill_random(daemon, "big", 128 * MIB, 3, work)
        cli(daemon, "snapshot", "create", "big@a")
        _, objects = bucket_stats(ceph)
        proc = in_background(daemon, "--json", "backup", "create", "rgw", "big@a")
        # Its first pack (the lock object is not one).
        wait_until(lambda: bucket_stats(ceph)[1] > objects + 1 or proc.poll() is not None,
                   "the backup's first pack", timeout=120)
        if proc.poll() is not None:
            raise Failure(f"the backup ended before the gateway was stopped: {proc.communicate()}")
        ceph.stop_rgw()
        # The backup waits for the gateway, and says how far it is.
        jobs = cli_json(daemon, "backup", "jobs")
        mine = [j for j in jobs if j["kind"] == "backup" and j["subject"] == "big@a"]
        if not mine or mine[0]["total_bytes"] != 128 * MIB or mine[0]["done_bytes"] >= 128 * MIB:
            raise Failure(f"the stalled backup is not listed as under way: {jobs}")
        print(f"under way while the gateway is down: {mine[0]['done_bytes']} of {mine[0]['total_bytes']} bytes")
        time.sleep(3)
        ceph.start_rgw()
        out, err = proc.communicate(timeout=600)
        if proc.returncode != 0:
            raise Failure(f"the backup across a gateway restart failed: {err}")
        restore_matches(daemon, json.loads(out)["id"], "big@a", "r4")

        # The daemon killed mid-upload: the next backup uploads what is
        # missing only.
        cli(daemon, "volume", "create", "big2", "--size", str(128 * MIB))
        fill_random(daemon, "big2", 128 * MIB, 4, work)
        cli(daemon, "snapshot", "create", "big2@a")
        _, objects = bucket_stats(ceph)
        proc = in_background(daemon, "backup", "create", "rgw", "big2@a")
        wait_until(lambda: bucket_stats(ceph)[1] >= objects + 4 or proc.poll() is not None,
                   "four packs of the backup", timeout=120)
        if proc.poll() is not None:
            raise Failure(f"the backup ended before the daemon was killed: {proc.communicate()}")
        daemon.kill()
        proc.communicate(timeout=60)
        daemon.start()
        again = backup(daemon, "big2@a")
        if again["added_bytes"] > 128 * MIB - 16 * MIB:
            raise Failure(f"after a kill the backup uploaded {again['added_bytes']} bytes again")
        restore_matches(daemon, again["id"], "big2@a", "r5")

        # A bucket quota reached, then lifted.
        used, _ = bucket_stats(ceph)
        ceph.rgw_admin("quota", "set", "--quota-scope=bucket", f"--bucket={BUCKET}",
                       f"--max-size={used + 8 * MIB}")
        ceph.rgw_admin("quota", "enable", "--quota-scope=bucket", f"--bucket={BUCKET}")
        cli(daemon, "volume", "create", "big3", "--size", str(64 * MIB))
        fill_random(daemon, "big3", 64 * MIB, 5, work)
        cli(daemon, "snapshot", "create", "big3@a")
        refused = backup(daemon, "big3@a", check=False)
        if isinstance(refused, dict) or refused.returncode != 1 or "QuotaExceeded" not in refused.stderr:
            raise Failure(f"a backup over the bucket's quota: {refused if isinstance(refused, dict) else refused.stderr}")
        print(f"over quota: {refused.stderr.strip()[:600]}")
        ceph.rgw_admin("quota", "disable", "--quota-scope=bucket", f"--bucket={BUCKET}")
        lifted = backup(daemon, "big3@a")
        restore_matches(daemon, lifted["id"], "big3@a", "r6")

        verified = cli_json(daemon, "backup", "verify", "rgw")
        if verified["problem_count"] != 0 or verified["packs_read"] != verified["packs_total"]:
            raise Failure(f"the repository does not verify after the faults: {verified}")

        # Pruned to each volume's newest backup: the dry run lists what
        # the prune then does; the lock the killed daemon left (its
        # process gone) is stale and deleted; what stays restores and
        # verifies.
        locks = run("rclone", "lsl", f"rgw:{BUCKET}/arbor/locks", env=env, check=False).stdout
        print(f"locks before the prune: {locks.strip() or 'none'}")
        dry = cli_json(daemon, "backup", "prune", "rgw", "--keep", "frequent=1", "--dry-run")
        gone = [b["backup"]["id"] for b in dry["forgotten"]]
        if gone != [full["id"]]:
            raise Failure(f"the dry run forgets {gone}, not the first backup of vol: {dry}")
        if not dry["stale_locks"]:
            raise Failure(f"the dry run found no stale lock: {dry}")
        pruned = cli_json(daemon, "backup", "prune", "rgw", "--keep", "frequent=1")
        if len(pruned["stale_locks"]) != len(dry["stale_locks"]):
            raise Failure(f"the dry run found {dry['stale_locks']} stale, the prune {pruned['stale_locks']}")
        for k in ("forgotten", "deleted_packs", "repacked_packs", "small_packs"):
            if pruned[k] != dry[k]:
                raise Failure(f"the prune's {k} differs from its dry run's: {pruned[k]} / {dry[k]}")
        if not any("is gone" in lock for lock in pruned["stale_locks"]):
            raise Failure(f"the killed daemon's lock was not found stale: {pruned['stale_locks']}")
        if pruned["bytes_after"] > pruned["bytes_before"]:
            raise Failure(f"the prune grew the repository: {pruned}")
        print(f"pruned: {len(pruned['deleted_packs'])} packs deleted, {len(pruned['repacked_packs'])} repacked, "
              f"{pruned['bytes_before']} -> {pruned['bytes_after']} bytes, stale locks {pruned['stale_locks']}")
        for b, snap, vol in ((incr, "vol@s2", "r8"), (cloned, "c1@x", "r9")):
            restore_matches(daemon, b["id"], snap, vol)
        verified = cli_json(daemon, "backup", "verify", "rgw")
        if verified["problem_count"] != 0 or verified["backups"] != len(dry["kept"]):
            raise Failure(f"the repository does not verify after the prune: {verified}")

        # big3 rewritten whole and backed up again: pruned to its newest
        # backup, the packs only the first one needed go from the bucket.
        fill_random(daemon, "big3", 64 * MIB, 6, work)
        cli(daemon, "snapshot", "create", "big3@b")
        rewritten = backup(daemon, "big3@b")
        if rewritten["parent"] != lifted["id"]:
            raise Failure(f"big3@b is not incremental from big3@a: {rewritten}")
        _, objects_before = bucket_stats(ceph)
        pruned = cli_json(daemon, "backup", "prune", "rgw", "--keep", "frequent=1")
        gone = [b["backup"]["id"] for b in pruned["forgotten"]]
        if gone != [lifted["id"]] or len(pruned["deleted_packs"]) < 6:
            raise Failure(f"the prune of big3's first backup: {pruned}")
        _, objects_after = bucket_stats(ceph)
        if objects_after >= objects_before or pruned["bytes_after"] > pruned["bytes_before"] - 48 * MIB:
            raise Failure(f"the bucket did not shrink: {objects_before} -> {objects_after} objects; {pruned}")
        print(f"pruned on the gateway: {len(pruned['deleted_packs'])} packs deleted, {len(pruned['repacked_packs'])} "
              f"repacked, {pruned['bytes_before']} -> {pruned['bytes_after']} bytes, "
              f"{objects_before} -> {objects_after} objects")
        restore_matches(daemon, rewritten["id"], "big3@b", "r10")
        verified = cli_json(daemon, "backup", "verify", "rgw")
        if verified["problem_count"] != 0:
            raise Failure(f"the repository does not verify after the second prune: {verified}")

        # A pack replaced in the bucket: the restore fails naming it and
        # leaves no volume.
        packs = run("rclone", "lsf", "-R", "--files-only", f"rgw:{BUCKET}/arbor/packs", env=env).stdout.split()
        victim = f"rgw:{BUCKET}/arbor/packs/{packs[0]}"
        junk = os.path.join(work, "junk")
        with open(junk, "wb") as f:
            f.write(os.urandom(4096))
        run("rclone", "copyto", junk, victim, env=env)
        # The replaced pack holds blobs of one backup or more: restore each
        # until one fails.
        failed = None
        for b in cli_json(daemon, "backup", "list", "rgw")["backups"]:
            failed = cli(daemon, "backup", "restore", "rgw", b["id"], "r7", check=False)
            if failed.returncode != 0:
                break
            cli(daemon, "destroy", "r7")
        if failed.returncode == 0:
            raise Failure("no restore noticed a replaced pack")
        if failed.returncode != 8 or "packs/" not in failed.stderr:
            raise Failure(f"a restore from a replaced pack: exit {failed.returncode}: {failed.stderr}")
        bad = cli(daemon, "backup", "verify", "rgw", check=False)
        if bad.returncode != 8 or victim.split("/")[-1] not in bad.stdout:
            raise Failure(f"verify of a replaced pack: exit {bad.returncode}: {bad.stdout} {bad.stderr}")
        names = [v["name"] for v in cli_json(daemon, "volume", "list")]
        if "r7" in names:
            raise Failure("a failed restore left its volume")
        print(f"replaced pack: exit {failed.returncode}: {failed.stderr.strip()[:200]}")
    print("backups to the RADOS Gateway: restored identical, faults survived")


if __name__ == "__main__":
    with open(CONFIG, "w") as f:
        f.write("backup_repositories = []\n")
    run_test("backup_s3", body, tools=("nbdcopy", "qemu-io", "rclone", "radosgw", "ceph-mon", "tc",
                                          "nbdfuse", "losetup", "mkfs.ext4", "e2fsck"),
             needs_root=True,
             extra_args=("--config", CONFIG))
