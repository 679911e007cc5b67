#!/usr/bin/env python3
"""Paired A/B of two arbor builds (or two pool formats of one build) on the
data path, for changes smaller than this machine's drift between runs.

bench/ab.sh runs every job of one build, then every job of the other, with a
pool made afresh for each: on a virtual disk whose speed moves by +-30 % from
minute to minute, one round of it cannot resolve a 5 % change. This script
keeps both daemons up, each with its own pool and a filled 512 MiB volume,
and runs each job on one and then at once on the other, the order swapped
from one job and round to the next (ABBA), so a drift slower than one job
(a few seconds) falls on both alike. Each pair gives one ratio new/old; the
summary per job is the median of those ratios over the rounds, with the
lowest and highest, and how many pairs reached the goal.

    bench/ab_paired.py OLD_BINARY NEW_BINARY [--rounds N] [--runtime S]
        [--old-format V] [--new-format V] [--layout cow] [--goal 0.95]

Data checksums (format version 10) against none (9), one binary:

    bench/ab_paired.py B B --old-format 9 --new-format 10 --rounds 8

Encrypted volumes against plain ones, one binary:

    bench/ab_paired.py B B --new-encrypt 512 --rounds 8

Figures for issue 40's data-path goal in docs/PERFORMANCE.md §14, and for
encryption's (§17), come from this script. It needs fio with its nbd
engine.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

from arbor_adapter import Arbor

JOBS = [
    ("randread", "4k", 1, 1),
    ("randwrite", "4k", 1, 1),
    ("randread", "4k", 32, 1),
    ("randwrite", "4k", 32, 1),
    ("read", "1m", 8, 1),
    ("write", "1m", 8, 1),
    ("randread", "4k", 8, 4),
    ("randwrite", "4k", 8, 4),
]


class Side:
    """One build's daemon (bench/arbor_adapter.py) and its filled volume."""

    def __init__(self, label, binary, fmt, work, args):
        self.label = label
        self.log = open(os.path.join(work, label + ".log"), "w")
        self.arbor = Arbor(binary, os.path.join(work, label), args.pool, log=self.log,
                           format_version=fmt).start()
        encrypt = args.old_encrypt if label == "old" else args.new_encrypt
        self.arbor.volume_create("v", 512 << 20, layout=args.layout, encrypt_unit=encrypt)
        self.uri = self.arbor.uri("v")
        fio(self.uri, "write", "1m", 8, 1, None)

    def stop(self):
        self.arbor.stop()
        self.log.close()


def fio(uri, rw, bs, qd, conns, runtime):
    cmd = ["fio", "--name=j", "--ioengine=nbd", f"--uri={uri}", f"--rw={rw}", f"--bs={bs}",
           f"--iodepth={qd}", f"--numjobs={conns}", "--group_reporting", "--size=512M",
           "--end_fsync=1", "--output-format=json"]
    if runtime:
        cmd += ["--time_based", f"--runtime={runtime}", "--randrepeat=1"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    job = json.loads(out[out.index("{"):])["jobs"][0]
    return job["read"]["iops"] + job["write"]["iops"], (job["read"]["bw"] + job["write"]["bw"]) / 1024


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--runtime", type=int, default=4, help="seconds per job and side")
    p.add_argument("--old-format", type=int)
    p.add_argument("--new-format", type=int)
    p.add_argument("--layout", help="volume layout, e.g. cow")
    p.add_argument("--old-encrypt", type=int, choices=[512, 4096],
                   help="the old side's volume encrypted, with data units of this size")
    p.add_argument("--new-encrypt", type=int, choices=[512, 4096],
                   help="the new side's volume encrypted, with data units of this size")
    p.add_argument("--pool", default="2G")
    p.add_argument("--serve-args", default="")
    p.add_argument("--goal", type=float, default=0.95)
    p.add_argument("--jobs", help='"rw bs qd conns;..." instead of the eight default jobs')
    args = p.parse_args()
    jobs = JOBS
    if args.jobs:
        jobs = []
        for entry in args.jobs.split(";"):
            rw, bs, qd, conns = entry.split()
            jobs.append((rw, bs, int(qd), int(conns)))
    if shutil.which("fio") is None:
        sys.exit("fio is needed")
    work = tempfile.mkdtemp(prefix="arbor-ab-paired-", dir="/var/tmp")
    sides = []
    try:
        sides.append(Side("old", args.old, args.old_format, work, args))
        sides.append(Side("new", args.new, args.new_format, work, args))
        ratios = {job: [] for job in jobs}
        for rnd in range(args.rounds):
            print(f"round {rnd + 1}", flush=True)
            for n, job in enumerate(jobs):
                order = sides if (rnd + n) % 2 == 0 else sides[::-1]
                got = {}
                for side in order:
                    got[side.label] = fio(side.uri, *job, args.runtime)
                old, new = got["old"], got["new"]
                unit = 1 if job[1] == "1m" else 0
                ratio = new[unit] / old[unit] if old[unit] else float("nan")
                ratios[job].append(ratio)
                what = "MiB/s" if unit else "IOPS"
                print(f"  {job[0]:9} {job[1]:3} QD{job[2]:<3} x{job[3]}  new {new[unit]:9.0f}  "
                      f"old {old[unit]:9.0f} {what:5}  {ratio:5.2f}x  (first: {order[0].label})",
                      flush=True)
        print(f"\nsummary: new/old per job over {args.rounds} paired rounds")
        print(f"  {'job':24} {'median':>7} {'lowest':>7} {'highest':>7}  pairs >= {args.goal}")
        for job, rs in ratios.items():
            name = f"{job[0]} {job[1]} QD{job[2]} x{job[3]}"
            met = sum(1 for r in rs if r >= args.goal)
            print(f"  {name:24} {statistics.median(rs):6.2f}x {min(rs):6.2f}x {max(rs):6.2f}x  "
                  f"{met}/{len(rs)}")
    finally:
        for side in sides:
            side.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
