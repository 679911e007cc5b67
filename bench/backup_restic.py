#!/usr/bin/python3
"""Backups to object storage, arbor against restic (issue 42's figures),
both into the same RADOS Gateway (Ceph's S3 on the one-node cluster of
tests/e2e/ceph.py; its OSD keeps objects in RAM), in one run:

* a volume of SIZE with DATA bytes of random data written at its start,
  snapshot s1, backed up whole: by arbor (`backup create`) and by restic
  (`restic backup --stdin` of the snapshot read through NBD, as restic
  must read a block device);
* CHANGE (1 % of SIZE) rewritten in random 256 KiB pieces, snapshot s2,
  backed up again by both: time, bytes added to the bucket, objects added;
* the gateway's own rate for large objects, `rclone copyto` of a file of
  DATA random bytes up and down, against arbor's full backup and full
  restore;
* an instant restore of s1 (`backup restore --instant`): the time to its
  answer and to the first 4 KiB read, 4 KiB random reads over the data at
  queue depth 1 while it fills (p50, p99) against the same reads once it is
  whole, and the time until it is whole.

Prints each figure and the ratios the issue sets goals for:
  incremental time, restic / arbor               (goal >= 20)
  incremental bytes added / CHANGE                (goal <= 1.15)
  incremental objects <= CHANGE / pack size + 10
  full backup rate / rclone upload rate           (goal >= 0.8)
  full restore rate / rclone download rate        (goal >= 0.8)

    bench/backup_restic.py ARBOR_BINARY [--size 16G] [--data 4G]
"""

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
from ceph import CephCluster  # noqa: E402

MIB = 1 << 20
PACK = 8 * MIB


def size_arg(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def run(*argv, env=None, stdin=None, stdout=subprocess.PIPE):
    proc = subprocess.run([str(a) for a in argv], env=env, stdin=stdin, stdout=stdout,
                          stderr=subprocess.PIPE, text=stdout is subprocess.PIPE)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, argv))} exited {proc.returncode}: {proc.stderr}")
    return proc


def timed(fn):
    began = time.monotonic()
    result = fn()
    return time.monotonic() - began, result


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("arbor")
    ap.add_argument("--size", type=size_arg, default=16 << 30)
    ap.add_argument("--data", type=size_arg, default=4 << 30)
    args = ap.parse_args()
    size, data = args.size, args.data
    change = size // 100
    work = tempfile.mkdtemp(prefix="arbor-backup-bench-", dir="/var/tmp")
    daemon = None
    try:
        # The OSD holds every object in RAM: both tools' backups, and the
        # gateway's own test file until its garbage collection (run below).
        memstore = 3 * data + 8 * change + (2 << 30)
        with CephCluster(rgw=True, memstore_bytes=memstore, wait_for_mgr=False) as ceph:
            env = {k: v for k, v in os.environ.items() if k != "AWS_CA_BUNDLE"}
            env.update(RCLONE_CONFIG_RGW_TYPE="s3", RCLONE_CONFIG_RGW_PROVIDER="Ceph",
                       RCLONE_CONFIG_RGW_ENDPOINT=ceph.rgw_endpoint,
                       RCLONE_CONFIG_RGW_ACCESS_KEY_ID=ceph.rgw_access_key,
                       RCLONE_CONFIG_RGW_SECRET_ACCESS_KEY=ceph.rgw_secret_key,
                       AWS_ACCESS_KEY_ID=ceph.rgw_access_key,
                       AWS_SECRET_ACCESS_KEY=ceph.rgw_secret_key,
                       RESTIC_PASSWORD="bench", RESTIC_CACHE_DIR=os.path.join(work, "restic-cache"))
            for bucket in ("arbor", "restic", "raw"):
                run("rclone", "mkdir", f"rgw:{bucket}", env=env)

            def bucket(name):
                out = json.loads(run("rclone", "size", "--json", f"rgw:{name}", env=env).stdout)
                return out["bytes"], out["count"]

            # The gateway's own rate for large objects.
            blob = os.path.join(work, "blob")
            with open(blob, "wb") as f:
                rng = random.Random(1)
                left = data
                while left:
                    n = min(left, 64 * MIB)
                    f.write(rng.randbytes(n))
                    left -= n
            up, _ = timed(lambda: run("rclone", "copyto", "--s3-upload-concurrency", "8",
                                      "--s3-chunk-size", "16M", blob, "rgw:raw/blob", env=env))
            down, _ = timed(lambda: run("rclone", "copyto", "--multi-thread-streams", "8",
                                        "rgw:raw/blob", blob + ".back", env=env))
            os.unlink(blob + ".back")
            run("rclone", "purge", "rgw:raw", env=env)
            ceph.rgw_admin("gc", "process", "--include-all")

            # arbor: a daemon with the repository.
            key = os.path.join(work, "key")
            creds = os.path.join(work, "s3.toml")
            with open(os.open(creds, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
                f.write(f'access_key_id = "{ceph.rgw_access_key}"\nsecret_access_key = "{ceph.rgw_secret_key}"\n')
            run(args.arbor, "backup", "new-key", key)
            run(args.arbor, "backup", "init", "s3://arbor/repo", "--endpoint", ceph.rgw_endpoint,
                "--credentials-file", creds, "--key-file", key, env=env)
            config = os.path.join(work, "arbor.toml")
            with open(config, "w") as f:
                f.write(f'backup_repositories = [{{ name = "rgw", url = "s3://arbor/repo", endpoint = '
                        f'"{ceph.rgw_endpoint}", key_file = "{key}", credentials_file = "{creds}" }}]\n')
            data_dir = os.path.join(work, "arbor")
            daemon = subprocess.Popen([args.arbor, "serve", "--data-dir", data_dir, "--config", config,
                                       "--pool-size", str(data + 8 * change + (4 << 30)),
                                       "--initial-volume", "none", "--nbd-listen", "none",
                                       "--api-listen", "none"],
                                      stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, "log"), "w"))
            for _ in range(400):
                if os.path.exists(os.path.join(data_dir, "api.sock")) and os.path.exists(os.path.join(data_dir, "nbd.sock")):
                    break
                time.sleep(0.05)

            def arbor(*a):
                return run(args.arbor, "--data-dir", data_dir, *a, env=env)

            def uri(export):
                return f"nbd+unix:///{export}?socket={data_dir}/nbd.sock"

            arbor("volume", "create", "vol", "--size", str(size))
            run("nbdcopy", "--flush", blob, uri("vol"))
            os.unlink(blob)
            arbor("snapshot", "create", "vol@s1")

            def restic_backup(snapshot):
                nbd = subprocess.Popen(["nbdcopy", uri(snapshot), "-"], stdout=subprocess.PIPE)
                run("restic", "-r", f"s3:{ceph.rgw_endpoint}/restic", "backup", "--stdin",
                    "--stdin-filename", "vol.raw", "--quiet", env=env, stdin=nbd.stdout)
                nbd.stdout.close()
                if nbd.wait() != 0:
                    raise SystemExit("nbdcopy of the snapshot failed")

            run("restic", "-r", f"s3:{ceph.rgw_endpoint}/restic", "init", env=env)
            a_full, made = timed(lambda: json.loads(arbor("--json", "backup", "create", "rgw", "vol@s1").stdout))
            r_full, _ = timed(lambda: restic_backup("vol@s1"))
            a_restore, _ = timed(lambda: arbor("backup", "restore", "rgw", made["id"], "back"))
            instant = instant_restore(arbor, uri, made["id"], data)

            # 1 % rewritten in random 256 KiB pieces of the data, each of
            # its own random bytes.
            piece = 256 << 10
            rng = random.Random(2)
            offsets = sorted({rng.randrange(data // piece) * piece for _ in range(change // piece)})
            write_pieces(offsets, piece, uri("vol"))
            changed = len(offsets) * piece
            arbor("snapshot", "create", "vol@s2")

            a_before = bucket("arbor")
            a_incr, incr = timed(lambda: json.loads(arbor("--json", "backup", "create", "rgw", "vol@s2").stdout))
            a_after = bucket("arbor")
            r_before = bucket("restic")
            r_incr, _ = timed(lambda: restic_backup("vol@s2"))
            r_after = bucket("restic")

            a_bytes, a_objects = a_after[0] - a_before[0], a_after[1] - a_before[1]
            r_bytes, r_objects = r_after[0] - r_before[0], r_after[1] - r_before[1]
            mib = lambda b: f"{b / MIB:.1f} MiB"
            rate = lambda b, t: f"{b / MIB / t:.0f} MiB/s"
            print(f"volume {mib(size)}, data {mib(data)}, change {mib(changed)} in {len(offsets)} pieces of 256 KiB")
            print(f"gateway (rclone): up {rate(data, up)}, down {rate(data, down)}")
            print(f"full: arbor {a_full:.1f} s ({rate(data, a_full)}), restic {r_full:.1f} s ({rate(data, r_full)})")
            print(f"restore: arbor {a_restore:.1f} s ({rate(data, a_restore)})")
            print(f"incremental: arbor {a_incr:.2f} s, {mib(a_bytes)}, {a_objects} objects; "
                  f"restic {r_incr:.2f} s, {mib(r_bytes)}, {r_objects} objects")
            print(f"  incremental time, restic / arbor: {r_incr / a_incr:.1f}x (goal >= 20)")
            print(f"  incremental bytes / change: {a_bytes / changed:.3f} (goal <= 1.15); restic {r_bytes / changed:.3f}")
            print(f"  incremental objects: {a_objects} (goal <= {changed // PACK + 10})")
            print(f"  full backup / rclone up: {(data / a_full) / (data / up):.2f} (goal >= 0.8)")
            print(f"  full restore / rclone down: {(data / a_restore) / (data / down):.2f} (goal >= 0.8)")
            print(f"instant restore: answered in {instant['answer'] * 1000:.0f} ms, first 4 KiB read at "
                  f"{instant['first'] * 1000:.0f} ms, whole after {instant['whole']:.1f} s "
                  f"(a plain restore: {a_restore:.1f} s)")
            print(f"  4 KiB random reads while it fills: {instant['during_n']} reads, p50 "
                  f"{instant['during'][0] * 1000:.2f} ms, p99 {instant['during'][1] * 1000:.2f} ms; "
                  f"once whole: p50 {instant['after'][0] * 1000:.3f} ms, p99 {instant['after'][1] * 1000:.3f} ms")
            print(f"  arbor's incremental said: added {mib(incr['added_bytes'])} in {incr['added_blobs']} blobs")
    finally:
        if daemon is not None:
            daemon.terminate()
            daemon.wait()
        shutil.rmtree(work, ignore_errors=True)


def percentiles(samples):
    samples = sorted(samples)
    return (samples[len(samples) // 2], samples[min(len(samples) - 1, len(samples) * 99 // 100)])


def instant_restore(arbor, uri, backup, data):
    """An instant restore of `backup` into `inst`, read while it fills."""
    import nbd
    rng = random.Random(3)
    started = time.monotonic()
    arbor("backup", "restore", "rgw", backup, "inst", "--instant")
    answer = time.monotonic() - started
    h = nbd.NBD()
    h.connect_uri(uri("inst"))
    h.pread(4096, 0)
    first = time.monotonic() - started

    def whole():
        listed = json.loads(arbor("--json", "volume", "list").stdout)
        return all(v.get("restoring") is None for v in listed if v["name"] == "inst")

    def reads(n):
        took = []
        for _ in range(n):
            at = rng.randrange(data // 4096) * 4096
            t = time.monotonic()
            h.pread(4096, at)
            took.append(time.monotonic() - t)
        return took

    during = []
    while True:
        batch = reads(100)
        if whole():
            break
        during.extend(batch)
    done = time.monotonic() - started
    after = reads(max(len(during), 1000))
    h.shutdown()
    arbor("destroy", "inst")
    return {"answer": answer, "first": first, "whole": done, "during_n": len(during),
            "during": percentiles(during or [0.0]), "after": percentiles(after)}


def write_pieces(offsets, piece, uri):
    """Writes random bytes at each offset through NBD (python3-libnbd)."""
    import nbd
    h = nbd.NBD()
    h.connect_uri(uri)
    for off in offsets:
        h.pwrite(os.urandom(piece), off)
    h.flush()
    h.shutdown()


if __name__ == "__main__":
    main()
