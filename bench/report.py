#!/usr/bin/python3
"""Turns a results.json written by bench.py into report.md and PNG plots.

    /usr/bin/python3 bench/report.py bench/results/quick-2026...Z
"""

import json
import os
import statistics
import sys

MIB, GIB, KIB = 1 << 20, 1 << 30, 1 << 10

# Goals of issue 6, and the issue's own peer figures (same fio nbd client,
# Unix socket, 2 GiB file) for reference.
ISSUE_FIGURES = {
    ("nbdkit file", "4K randwrite QD32"): 110_000, ("nbdkit file", "4K randread QD32"): 122_000,
    ("qemu-nbd raw", "4K randwrite QD32"): 39_000, ("qemu-nbd raw", "4K randread QD32"): 43_000,
}


def pct(values, q):
    v = sorted(values)
    return v[min(len(v) - 1, int(len(v) * q))]


def ms(x):
    return f"{x * 1e3:.2f} ms"


def busy_mark(r):
    return " *" if r.get("busy") else ""


def fmt_rate(r, job):
    return f"{r['mib_s']:.0f} MiB/s" if job.startswith(("1M", "64K")) else f"{r['iops']:.0f}"


def write(out):
    with open(os.path.join(out, "results.json")) as f:
        data = json.load(f)
    meta, recs = data["meta"], data["records"]
    md = []
    add = md.append
    add(f"# arbor benchmark report ({meta['profile']} profile)\n")
    add(f"Date {meta['date_utc']}; commit {meta['arbor_commit']}; "
        f"{meta['cpus']} CPUs ({meta['cpu']}), {meta['mem_gib']} GiB RAM, kernel {meta['kernel']}; "
        f"all files on one {meta['filesystem']} filesystem ({meta['workdir']}); {meta['fio']}, {meta['nbdkit']}, "
        f"{meta['qemu']}. Run took {meta['seconds']:.0f} s.\n")
    bo = meta.get("busy_overall", {})
    add(f"Machine load: up to {bo.get('compilers_max', 0)} compiler/linker processes of other users seen at once "
        f"(1-min load average up to {bo.get('load1_max')}); figures marked * were taken while other compilations ran.\n")
    add(f"Command: `{meta['command']}`\n")
    add("Same for every system: one client (fio nbd engine, libnbd, Unix socket; the plain-file row is fio psync on "
        "a file, one thread, queue depth not applicable), buffered I/O through the host page cache with write-back "
        "(nbdkit file default cache, qemu-nbd --cache=writeback --aio=threads, arbor's pread/pwrite), no flush "
        "during a job and one flush at the end of every write job (fio end_fsync=1).\n")

    goals = []
    e1 = [r for r in recs if r.get("exp") == 1 and "job" in r]
    if e1:
        add("## 1. Data path\n")
        add(f"Volume/image size {meta['params']['size1'] // MIB} MiB, {meta['params']['runtime']} s per job. "
            "IOPS for 4K jobs, MiB/s for 64K and 1M jobs. States: *fresh* = new thin volume / sparse raw file / "
            "new qcow2; *full* = every block written; *after snapshot* = arbor: a snapshot taken right before "
            "each write job (first writes to each chunk copy it); qcow2 overlay: a new overlay on the full raw file "
            "before each job (first writes to each 64 KiB cluster copy it from the backing file); qcow2 internal "
            "snap: a copy of the full qcow2 image with one `qemu-img snapshot -c` (first writes to each cluster "
            "copy it). Raw files and nbdkit have no snapshots. *4K first writes*: one 4 KiB write per 64 KiB, "
            "random order, each once, job ends when done: every write is the first to its arbor chunk and its "
            "qcow2 cluster (the pure copy or allocate cost); other jobs run for the set time, so later writes "
            "in them may land on chunks already copied. *server CPU* = µs of server CPU per I/O.\n")
        systems = []
        for r in e1:
            if r["system"] not in systems:
                systems.append(r["system"])
        for state in ("fresh", "full", "after snapshot"):
            rows = [r for r in e1 if r["state"] == state]
            if not rows:
                continue
            syss = [s for s in systems if any(r["system"] == s for r in rows)]
            jobs = []
            for r in rows:
                if r["job"] not in jobs:
                    jobs.append(r["job"])
            add(f"### {state}\n")
            ref = "nbdkit file" if "nbdkit file" in syss else None
            add("| job | " + " | ".join(syss) + (" | arbor / nbdkit file |" if ref and "arbor" in syss else " |"))
            add("|---" * (len(syss) + 1 + (1 if ref and "arbor" in syss else 0)) + "|")
            for job in jobs:
                cells = []
                by = {r["system"]: r for r in rows if r["job"] == job}
                for s in syss:
                    r = by.get(s)
                    cells.append(fmt_rate(r, job) + busy_mark(r) if r else "")
                line = f"| {job} | " + " | ".join(cells)
                if ref and "arbor" in syss:
                    a, n = by.get("arbor"), by.get(ref)
                    line += f" | {a['iops'] / n['iops']:.2f}" if a and n else " | "
                add(line + " |")
            add("")
            add("Server context switches per I/O (all threads; most threads seen): " + "; ".join(
                f"{s}: " + ", ".join(f"{r['job'].split()[0]} {r['job'].split()[1]} {r['job'].split()[-1]} "
                                     f"{r['server_switches_per_io']:.2f} ({r['server_threads']})"
                                     for r in rows if r["system"] == s and "server_switches_per_io" in r)
                for s in syss if s != "file (fio psync)") + "\n")
            add("Server CPU per I/O (µs): " + "; ".join(
                f"{s}: " + ", ".join(f"{r['job'].split()[0]} {r['job'].split()[1]} {r['job'].split()[-1]} "
                                     f"{r['server_cpu_us_per_io']:.1f}"
                                     for r in rows if r["system"] == s and "server_cpu_us_per_io" in r)
                for s in syss if s != "file (fio psync)") + "\n")

        def get(system, state, job):
            return next((r for r in e1 if r["system"] == system and r["state"] == state and r["job"] == job), None)
        for job, need in (("4K randwrite QD32", 0.9), ("4K randread QD32", 0.9), ("1M seqwrite QD8", 0.85),
                          ("1M seqread QD8", 0.85)):
            a, n = get("arbor", "full", job), get("nbdkit file", "full", job)
            if a and n:
                goals.append((f"{job}, full volume (mapped unshared chunks) vs nbdkit file", f"≥ {need}x",
                              a["iops"] / n["iops"], a["iops"] / n["iops"] >= need, a.get("busy") or n.get("busy")))
        for job in ("4K first writes QD32", "4K randwrite QD32"):
            a = get("arbor", "after snapshot", job)
            q = get("qemu-nbd qcow2 overlay", "after snapshot", job)
            if a and q:
                goals.append((f"{job} after snapshot vs qcow2 overlay", "≥ 3x", a["iops"] / q["iops"],
                              a["iops"] / q["iops"] >= 3, a.get("busy") or q.get("busy")))
        plot_exp1(out, e1, systems)

    e2 = [r for r in recs if r.get("exp") == 2 and "job" in r]
    if e2:
        add("## 2. Many snapshots (paper 001 figs 7-8)\n")
        add(f"Volume {meta['params']['size2'] // MIB} MiB, fully written; before each snapshot "
            f"{meta['params']['writes_between']} random 4 KiB writes spread over the volume, so every snapshot "
            "shares most data with the next and differs in a few places. Each measurement starts right after a "
            "new snapshot (so the measured writes are first writes that copy), except at 0 snapshots where "
            "writes go in place. qcow2: internal snapshots (`qemu-img snapshot -c`, image closed), writes "
            "between snapshots through qemu-io, measurement through qemu-nbd.\n")
        add("| system | snapshots held | 4K randwrite QD32 IOPS (median; runs) | 1M seqwrite MiB/s | "
            "4K ratio to 1 snapshot | 4K ratio to 0 snapshots |")
        add("|---|---|---|---|---|---|")
        for system in ("arbor", "qcow2 internal"):
            rows = [r for r in e2 if r["system"] == system]
            marks = sorted({r["mark"] for r in rows})

            def at(m, job, key):
                runs = [r for r in rows if r["mark"] == m and r["job"].startswith(job)]
                return statistics.median(r[key] for r in runs), runs
            base0 = at(0, "4K", "iops")[0] if 0 in marks else None
            base1 = at(1, "4K", "iops")[0] if 1 in marks else None
            for m in marks:
                v4, runs4 = at(m, "4K", "iops")
                v1, runs1 = at(m, "1M", "mib_s")
                held = min(r["snapshots"] for r in runs4)
                busy = busy_mark({"busy": any(r.get("busy") for r in runs4 + runs1)})
                each = ", ".join(f"{r['iops']:.0f}" for r in runs4)
                add(f"| {system} | {held} | {v4:.0f}{busy} ({each}) | "
                    f"{v1:.0f} | {v4 / base1:.2f} | {v4 / base0:.2f} |")
            if system == "arbor" and base0:
                top = max(marks)
                v4, runs4 = at(top, "4K", "iops")
                held = min(r["snapshots"] for r in runs4)
                busy = any(r.get("busy") for r in runs4)
                goals.append((f"4K randwrite QD32 with {held} snapshots vs 0 snapshots", "≥ 0.95x",
                              v4 / base0, v4 / base0 >= 0.95, busy))
                if base1:
                    goals.append(("same, vs 1 snapshot (both measure first writes that copy)", "≥ 0.95x",
                                  v4 / base1, v4 / base1 >= 0.95, busy))
        add("")
        plot_exp2(out, e2)

    e3 = [r for r in recs if r.get("exp") == 3]
    if e3:
        add("## 3. Snapshot operations\n")
        sl = [r for r in e3 if r.get("kind") == "snapshot_latency"]
        if sl:
            add("Whole CLI round trip (a new `arbor` client process per operation, as a script would run it) "
                "and the HTTP API alone (one request from an already running process), against the running "
                "daemon; a commit is part of each operation.\n")
            add("| operation | volume (mapped) | snapshots held | CLI median | CLI p99 | API median | API p99 |")
            add("|---|---|---|---|---|---|---|")
            for r in sl:
                add(f"| snapshot | {r['volume']} ({r['mapped'] // MIB} MiB) | {r['snapshots']} | {ms(statistics.median(r['cli']))}"
                    f"{busy_mark(r)} | {ms(pct(r['cli'], .99))} | {ms(statistics.median(r['api']))} | "
                    f"{ms(pct(r['api'], .99))} |")
            for kind, label in (("clone_latency", "clone"), ("destroy_clone_latency", "destroy (empty clone)")):
                for r in (x for x in e3 if x.get("kind") == kind):
                    add(f"| {label} | {r.get('volume', 'clone')} | {r['snapshots']} | {ms(statistics.median(r['cli']))}"
                        f"{busy_mark(r)} | {ms(pct(r['cli'], .99))} | | |")
            add("")
            worst = max(statistics.median(r["cli"]) for r in sl)
            goals.append(("snapshot, CLI round trip, median (worst case above)", "< 10 ms", f"{worst * 1e3:.2f} ms",
                          worst < 0.010, any(r.get("busy") for r in sl)))
            cl = [r for r in e3 if r.get("kind") == "clone_latency"]
            if cl:
                worst = max(statistics.median(r["cli"]) for r in cl)
                goals.append(("clone, CLI round trip, median (worst case above)", "< 10 ms", f"{worst * 1e3:.2f} ms",
                              worst < 0.010, any(r.get("busy") for r in cl)))
        sp = [r for r in e3 if r.get("kind") == "spawn_reference"]
        if sp:
            add(f"Reference for the CLI figures: starting `/bin/true` from the harness takes "
                f"{ms(statistics.median(sp[0]['true']))} (median) on this machine, `arbor --version` "
                f"{ms(statistics.median(sp[0]['arbor_version']))}.\n")
        fp = [r for r in e3 if r.get("kind") == "fdatasync_probe"]
        if fp:
            s = fp[0]["seconds"]
            add(f"Reference: one 4 KiB pwrite + fdatasync on this filesystem: median {ms(statistics.median(s))}, "
                f"p99 {ms(pct(s, .99))}. A snapshot commits, and a commit flushes the device twice.\n")
        qs = [r for r in e3 if r.get("kind") == "qcow2_snapshot_c"]
        if qs:
            add("For comparison, `qemu-img snapshot -c` (offline, whole process) on the qcow2 image of experiment 2: "
                + ", ".join(f"{ms(r['seconds'])} at {r['snapshots']}" for r in qs) + ".\n")
        dr = [r for r in e3 if r.get("kind") == "destroy_reclaim"]
        if dr:
            add("Destroy and background reclaim (daemon default reclaim rate), volumes with exclusive data:\n")
            add("| volume | exclusive data | destroy (CLI) | reclaim done after | data freed | rate |")
            add("|---|---|---|---|---|---|")
            for r in dr:
                add(f"| {r['volume']} | {r['exclusive_bytes'] // MIB} MiB | {ms(r['destroy_cli_s'])}{busy_mark(r)} | "
                    f"{r['reclaim_s']:.2f} s | {r['freed_bytes'] / MIB:.0f} MiB | {r['rate_mib_s']:.0f} MiB/s |")
            add("\n(`doomed` is a clone of the newest snapshot, rewritten in full; `doomed2` a fresh volume filled "
                "in full.)\n")
        fl = [r for r in e3 if r.get("kind") == "foreground_latency"]
        if len(fl) == 2:
            add("Foreground 4 KiB random write latency (QD1, fio nbd) on a full volume, without and with a "
                "snapshot every second (ioSnap fig 11: Btrfs up to 3x, ioSnap ~5%):\n")
            add("| mode | snapshots taken | IOPS | p50 | p99 | p99.9 | max | snapshot API median |")
            add("|---|---|---|---|---|---|---|---|")
            for r in fl:
                sm = ms(statistics.median(r["snapshot_api_s"])) if r["snapshot_api_s"] else ""
                add(f"| {r['mode']} | {r['snapshots_taken']} | {r['iops']:.0f}{busy_mark(r)} | {r['lat_p50_us']:.0f} µs | "
                    f"{r['lat_p99_us']:.0f} µs | {r['lat_p999_us']:.0f} µs | {r['lat_max_us']:.0f} µs | {sm} |")
            a, b = fl
            add("")
            for key, label in (("lat_p50_us", "p50"), ("lat_p99_us", "p99")):
                ratio = b[key] / a[key] if a[key] else float("nan")
                goals.append((f"foreground write {label} with a snapshot every second vs none", "≤ 1.10x",
                              ratio, ratio <= 1.10, a.get("busy") or b.get("busy")))
            plot_exp3(out, fl)
        eb = [r for r in e3 if r.get("kind") == "engine_bench"]
        if eb:
            add("Engine-level snapshot and clone latency: see engine.md in this directory (engine-bench).\n")

    add("## 4. COW vs ROW (paper 002 figs 6-8)\n")
    add("**Not measured.** arbor is redirect-on-write only: the external-origin (copy-on-write) volume kind "
        "does not exist yet (docs/ARCHITECTURE.md, \"What comes next\"). The harness keeps the slot: once a COW "
        "mode exists, the experiment is the 0-100% write-ratio sweep of figs 6-8 on both modes.\n")

    e5 = [r for r in recs if r.get("exp") == 5]
    if e5:
        add("## 5. Chunk size: space efficiency and metadata (paper 002 fig 17)\n")
        add(f"Random 4 KiB writes ({e5[0]['client_bytes'] // MIB} MiB, no block written twice, QD32) over a "
            f"{e5[0]['volume'] // MIB} MiB thin volume (*fresh*); then every block of the volume written, a snapshot, "
            "and the same random writes again (*after snapshot*: each first write to a shared chunk allocates a "
            "new one). "
            "Efficiency = bytes written by the client / data bytes the pool allocated for them (paper 002's "
            "definition). Metadata = metadata bytes used per GiB of data allocated, after the fresh pass (a "
            "sparse random mapping: the worst case for tree fill).\n")
        add("| chunk | efficiency, fresh | efficiency, after snapshot | metadata per GiB mapped | 4K IOPS fresh | "
            "4K IOPS after snapshot |")
        add("|---|---|---|---|---|---|")
        for r in e5:
            add(f"| {r['chunk']} | {r['fresh_efficiency'] * 100:.1f}% | {r['snap_efficiency'] * 100:.1f}% | "
                f"{r['metadata_per_gib_mapped'] / KIB:.0f} KiB | {r['fresh_iops']:.0f}{busy_mark(r)} | {r['snap_iops']:.0f} |")
        add("\nPaper 002 fig 17: 100% at 512 B snap blocks, dropping fast with block size, below 20% at 64 KiB "
            "(their traces).\n")
        plot_exp5(out, e5)

    e6 = [r for r in recs if r.get("exp") == 6]
    if e6:
        add("## 6. Footprint\n")
        add("| metadata cache | volume | snapshots | peak daemon RSS | metadata used | metadata per GiB mapped | "
            "4K randread QD32 | 4K randwrite QD32 |")
        add("|---|---|---|---|---|---|---|---|")
        for r in e6:
            add(f"| {r['cache']} | {r['volume'] // MIB} MiB | {r['snapshots']} | {r['peak_rss'] / MIB:.1f} MiB{busy_mark(r)} | "
                f"{r['metadata_used'] / MIB:.1f} MiB | {r['metadata_per_gib'] / KIB:.0f} KiB | {r['randread_iops']:.0f} | "
                f"{r['randwrite_iops']:.0f} |")
        other = [r for r in recs if r.get("kind") == "arbor_peak_rss"]
        if other:
            add("\nPeak RSS of the arbor daemons of experiments 1 and 2: "
                + ", ".join(f"exp {r['exp']}: {r['bytes'] / MIB:.1f} MiB" for r in other) + ".")
        add("")

    if goals:
        add("## Goals\n")
        add("| goal | target | measured | met | busy machine |")
        add("|---|---|---|---|---|")
        for label, target, val, ok, busy in goals:
            v = f"{val:.2f}x" if isinstance(val, float) else val
            add(f"| {label} | {target} | {v} | {'yes' if ok else '**no**'} | {'yes' if busy else 'no'} |")
        add("")

    perf = sorted(f for f in os.listdir(out) if f.startswith("perf-") and f.endswith(".txt"))
    if perf:
        add("## Profiles\n")
        add("`perf record -g` (cpu-clock sampling) of the server during the jobs named, flat profile by symbol "
            "(self time), entries above 1.5%: " + ", ".join(f"`{f}`" for f in perf) + ".\n")
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write("\n".join(md) + "\n")


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_exp1(out, e1, systems):
    plt = _plt()
    for state in ("fresh", "full", "after snapshot"):
        rows = [r for r in e1 if r["state"] == state]
        if not rows:
            continue
        jobs = list(dict.fromkeys(r["job"] for r in rows))
        syss = [s for s in systems if any(r["system"] == s for r in rows)]
        fig, ax = plt.subplots(figsize=(11, 4.5))
        w = 0.8 / len(syss)
        for i, s in enumerate(syss):
            ys = []
            for j in jobs:
                r = next((r for r in rows if r["system"] == s and r["job"] == j), None)
                ys.append(r["mib_s"] if r else 0)
            ax.bar([k + i * w for k in range(len(jobs))], ys, w, label=s)
        ax.set_xticks([k + 0.4 - w / 2 for k in range(len(jobs))], jobs, fontsize=8)
        ax.set_ylabel("MiB/s")
        ax.set_yscale("log")
        ax.set_title(f"Data path, {state}")
        ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        fig.savefig(os.path.join(out, f"exp1-{state.replace(' ', '-')}.png"), dpi=90)
        plt.close(fig)


def plot_exp2(out, e2):
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, job, key, unit in ((axes[0], "4K", "iops", "IOPS (4K randwrite QD32)"),
                               (axes[1], "1M", "mib_s", "MiB/s (1M seqwrite)")):
        for system in ("arbor", "qcow2 internal"):
            rows = sorted((r for r in e2 if r["system"] == system and r["job"].startswith(job)),
                          key=lambda r: r["snapshots"])
            ax.plot([r["snapshots"] for r in rows], [r[key] for r in rows], marker="o", label=system)
        ax.set_xscale("symlog")
        ax.set_xlabel("snapshots held")
        ax.set_ylabel(unit)
        ax.set_ylim(bottom=0)
        ax.legend()
    fig.suptitle("Write rate vs number of snapshots (cf. paper 001 figs 7-8)")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "exp2-snapshots.png"), dpi=90)
    plt.close(fig)


def plot_exp3(out, fl):
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4))
    keys = [("lat_p50_us", "p50"), ("lat_p99_us", "p99"), ("lat_p999_us", "p99.9"), ("lat_max_us", "max")]
    for i, r in enumerate(fl):
        ax.bar([k + i * 0.4 for k in range(len(keys))], [r[k] for k, _ in keys], 0.4, label=r["mode"])
    ax.set_xticks([k + 0.2 for k in range(len(keys))], [label for _, label in keys])
    ax.set_yscale("log")
    ax.set_ylabel("µs")
    ax.set_title("4K random write latency, QD1 (cf. ioSnap fig 11)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out, "exp3-foreground-latency.png"), dpi=90)
    plt.close(fig)


def plot_exp5(out, e5):
    plt = _plt()
    fig, ax1 = plt.subplots(figsize=(7, 4))
    xs = [r["chunk"] for r in e5]
    ax1.plot(xs, [r["fresh_efficiency"] * 100 for r in e5], marker="o", label="efficiency, fresh")
    ax1.plot(xs, [r["snap_efficiency"] * 100 for r in e5], marker="s", label="efficiency, after snapshot")
    ax1.set_ylabel("space efficiency %")
    ax1.set_xlabel("chunk size")
    ax2 = ax1.twinx()
    ax2.plot(xs, [r["metadata_per_gib_mapped"] / KIB for r in e5], color="gray", linestyle="--", marker="^",
             label="metadata KiB per GiB mapped")
    ax2.set_yscale("log")
    ax2.set_ylabel("metadata KiB / GiB mapped")
    ax1.legend(loc="upper center", fontsize=8)
    ax2.legend(loc="upper right", fontsize=8)
    ax1.set_title("Chunk size trade-off under random 4 KiB writes (cf. paper 002 fig 17)")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "exp5-chunk-size.png"), dpi=90)
    plt.close(fig)


if __name__ == "__main__":
    write(sys.argv[1])
