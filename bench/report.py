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


# Paper 002 figs 6-8: the write ratio above which ROW answers faster than COW,
# by snap_block (chunk) size.
PAPER_CROSSOVER = {"1 KB": "20 %", "2 KB": "40 %", "4 KB": "60 %"}


def crossover(rows):
    """First write ratio at which the row volume's mean response time is below the cow volume's."""
    for pct_w in sorted({r["write_pct"] for r in rows}):
        by = {r["layout"]: r for r in rows if r["write_pct"] == pct_w}
        if "row" in by and "cow" in by and by["row"]["mean_us"] < by["cow"]["mean_us"]:
            return f"{pct_w} %"
    return "none in 0-100 %"


def section4(add, goals, e4, meta):
    fdatasync_note(add, e4, "A pool commit flushes the device twice.")
    wr = [r for r in e4 if r.get("kind") == "write_ratio"]
    if wr:
        add("### Response time against write ratio (paper 002 figs 6-8)\n")
        add(f"Per chunk size, one daemon (`--chunk-size`) with a `row` volume (thin, redirect-on-write) and a "
            f"`cow` volume (one contiguous run, written in place, copy-on-write), {wr[0]['volume'] // MIB} MiB "
            f"each, filled with 1 MiB sequential writes. At each write ratio, for each volume: the previous point's "
            f"snapshot destroyed (reclaim waited for), one new snapshot, then fio `randrw` 4 KiB QD1 "
            f"`--rwmixwrite=R` for {meta['params']['runtime4']} s (`--norandommap`, fixed seed, same offsets for "
            "both volumes), end_fsync. Mean = mean response time over all I/Os (read and write means weighted "
            "by their counts); p99 per side. The point's volume order alternates (row first at 0 %).\n")
        for chunk in dict.fromkeys(r["chunk"] for r in wr):
            rows = [r for r in wr if r["chunk"] == chunk]
            add(f"**Chunk {chunk}**\n")
            add("| writes | ROW mean | COW mean | COW / ROW | ROW read p99 | ROW write p99 | COW read p99 | "
                "COW write p99 | ROW I/Os | COW I/Os |")
            add("|---|---|---|---|---|---|---|---|---|---|")
            for pct_w in sorted({r["write_pct"] for r in rows}):
                by = {r["layout"]: r for r in rows if r["write_pct"] == pct_w}
                ro, co = by["row"], by["cow"]

                def p99(r, side):
                    return f"{r[side]['lat_p99_us']:.0f} µs" if r[side]["ios"] else "—"
                add(f"| {pct_w} % | {ro['mean_us']:.1f} µs{busy_mark(ro)} | {co['mean_us']:.1f} µs{busy_mark(co)} | "
                    f"{co['mean_us'] / ro['mean_us']:.2f} | {p99(ro, 'read')} | {p99(ro, 'write')} | "
                    f"{p99(co, 'read')} | {p99(co, 'write')} | {ro['read']['ios'] + ro['write']['ios']} | "
                    f"{co['read']['ios'] + co['write']['ios']} |")
            add("")
        add("Crossover (first write ratio at which ROW's mean is below COW's):\n")
        add("| chunk | measured | paper 002 (snap_block: crossover) |")
        add("|---|---|---|")
        paper = ", ".join(f"{k}: {v}" for k, v in PAPER_CROSSOVER.items())
        for chunk in dict.fromkeys(r["chunk"] for r in wr):
            add(f"| {chunk} | {crossover([r for r in wr if r['chunk'] == chunk])} | {paper} |")
        add("\nWhat each side pays: a COW write to a chunk not yet copied since the snapshot reads the chunk, "
            "writes the copy into the pool and commits it (device flushes, above) before writing in place; "
            "later writes to the same chunk, and every read, go straight to the volume's run. A ROW write to a "
            "shared chunk allocates a new chunk (a partial write reads the old chunk to fill it) and updates the "
            "mapping, committed later with the next commit; every ROW read looks the chunk up in the tree. "
            "Everything sits in the page cache here, so a COW first write costs its flushes, not disk seeks. "
            "At 0 % neither volume writes: a difference there is the two read paths' (a cow read skips the "
            "lookup) or run-to-run noise, and a crossover of 0 % means ROW was not slower even then.\n")
    sr = [r for r in e4 if r.get("kind") == "seqread"]
    if sr:
        cold = all(r["cold"] for r in sr)
        up = [r for r in e4 if r.get("kind") == "updates"]
        add("### Sequential reads after random updates (COW keeps the volume contiguous)\n")
        add(f"A row and a cow volume ({sr[0]['volume'] // MIB} MiB, 16 KiB chunks) in one pool, filled sequentially; "
            "1 MiB sequential read QD8 of each, then one snapshot of each and random 4 KiB writes over each "
            f"volume ({up[0]['io_size'] // MIB if up else '?'} MiB, QD32, no block twice), which relocate the row "
            "volume's written chunks in write order, then the same reads. "
            + ("Page cache dropped (`sync; echo 3 > /proc/sys/vm/drop_caches`) before every read: cold reads "
               "from the disk (the daemon's own metadata cache stays warm). " if cold else
               "**The page cache could not be dropped: warm reads.** ")
            + "Runs alternate the volume order.\n")
        add("| state | ROW MiB/s (runs) | COW MiB/s (runs) | COW / ROW |")
        add("|---|---|---|---|")
        for state in dict.fromkeys(r["state"] for r in sr):
            cells, means = [], {}
            for layout in ("row", "cow"):
                runs = [r for r in sr if r["state"] == state and r["layout"] == layout]
                means[layout] = statistics.mean(r["mib_s"] for r in runs)
                busy = busy_mark({"busy": any(r.get("busy") for r in runs)})
                cells.append(f"{means[layout]:.0f}{busy} (" + ", ".join(f"{r['mib_s']:.0f}" for r in runs) + ")")
            add(f"| {state} | {cells[0]} | {cells[1]} | {means['cow'] / means['row']:.2f} |")
        if up:
            add("\nThe random updates themselves: " + ", ".join(
                f"{r['layout']} {r['iops']:.0f} IOPS ({r['wall_s']:.1f} s with its end flush){busy_mark(r)}"
                for r in up) + ".\n")
        else:
            add("")
    osn = [r for r in e4 if r.get("kind") == "origin_snapshots"]
    if osn:
        add("### Origin: write cost against the number of snapshots (paper 001 figs 7-8)\n")
        add(f"A raw file ({meta['params']['size4'] // MIB} MiB of random data) attached as an origin "
            f"(`origin attach`); {meta['params']['writes_between']} random 4 KiB writes through NBD between "
            "snapshots; at each count, 4 KiB random writes QD32 "
            f"({meta['params']['repeats4']} runs, each right after its own new snapshot, so its writes are first "
            f"writes that copy) and one 1 MiB sequential write QD8 run (after one more snapshot), "
            f"{meta['params']['runtime4']} s each. At 0 no snapshot exists: writes go in place, no copies.\n")
        add("| snapshots held (first 4K run) | 4K randwrite QD32 IOPS, median (runs) | 1M seqwrite MiB/s | "
            "4K ratio to 1 snapshot | 4K ratio to 0 |")
        add("|---|---|---|---|---|")
        points = snapshot_points(osn)
        for pt in points:
            add(f"| {pt['held']} | {pt['iops']:.0f}{busy_mark(pt)} ({pt['runs']}) | {pt['mib_s']:.0f} | "
                f"{fmt_ratio(pt['to1'])} | {fmt_ratio(pt['to0'])} |")
        if points[-1]["to1"] is not None and points[-1]["mark"] > 1:
            add(f"\n4 KiB random writes with {points[-1]['held']} snapshots against 1: "
                f"**{fmt_ratio(points[-1]['to1'])}x** (dm-multisnap: flat).")
        od = [r for r in e4 if r.get("kind") == "origin_destroy"]
        if od:
            add(f"\nAt the end, {od[0]['snapshots']} snapshots destroyed through the API one by one in "
                f"{od[0]['destroy_s']:.1f} s; reclaim done {od[0]['reclaim_s']:.1f} s later; the origin detached.")
        add("")
    orr = [r for r in e4 if r.get("kind") == "origin_read"]
    if orr:
        add("### Origin reads against `nbdkit file` on the same raw file\n")
        add(f"The origin of the experiment above, measured before any snapshot of it was taken, and `nbdkit file` "
            f"on its file (both servers running), warm page cache (the file read once before), "
            f"{meta['params']['runtime4']} s per job, the system that goes first alternating per job. IOPS for 4K "
            "jobs, MiB/s for 1M. *server CPU*: µs per I/O.\n")
        add("| job | arbor origin (runs) | nbdkit file (runs) | arbor / nbdkit | server CPU arbor / nbdkit |")
        add("|---|---|---|---|---|")
        for job in dict.fromkeys(r["job"] for r in orr):
            key = "mib_s" if job.startswith("1M") else "iops"
            cells, means, cpu = [], {}, {}
            for system in ("arbor origin", "nbdkit file"):
                runs = [r for r in orr if r["job"] == job and r["system"] == system]
                means[system] = statistics.mean(r[key] for r in runs)
                cpu[system] = statistics.mean(r.get("server_cpu_us_per_io", 0) for r in runs)
                busy = busy_mark({"busy": any(r.get("busy") for r in runs)})
                cells.append(f"{means[system]:.0f}{busy} (" + ", ".join(f"{r[key]:.0f}" for r in runs) + ")")
            ratio = means["arbor origin"] / means["nbdkit file"]
            add(f"| {job} | {cells[0]} | {cells[1]} | {ratio:.2f} | "
                f"{cpu['arbor origin']:.1f} / {cpu['nbdkit file']:.1f} |")
            goals.append((f"origin {job} vs nbdkit file on the same file", "≥ 0.95x", ratio, ratio >= 0.95,
                          any(r.get("busy") for r in orr if r["job"] == job)))
        add("")


def section7(add, goals, recs, e7, meta):
    """Experiment 7: direct I/O (no host page cache) and snapshots under load."""
    add("## 7. Direct I/O: the data path without the host page cache, and snapshots under load\n")
    add(f"Image/volume {meta['params']['size1'] // MIB} MiB, fully written, {meta['params']['runtime']} s per job, "
        "the page cache dropped before each job. Every system bypasses or evicts the host page cache: fio psync "
        "with O_DIRECT on the raw file (one thread), `nbdkit file cache=none` (evicts pages after I/O; nbdkit has "
        "no O_DIRECT mode), `qemu-nbd --cache=none --aio=io_uring`, `arbor serve --io direct`. `arbor --io "
        "buffered` (today's default on files) beside them for reference. IOPS for 4K jobs, MiB/s for 64K and 1M.\n")
    systems = [s for s in dict.fromkeys(r["system"] for r in e7)]
    jobs = list(dict.fromkeys(r["job"] for r in e7))
    add("| job | " + " | ".join(systems) + " | arbor direct / qemu-nbd cache=none |")
    add("|---|" + "---|" * (len(systems) + 1))
    for job in jobs:
        row = {r["system"]: r for r in e7 if r["job"] == job}
        cells = [fmt_rate(row[s], job) + busy_mark(row[s]) if s in row else "-" for s in systems]
        ad, qn = row.get("arbor direct"), row.get("qemu-nbd raw cache=none io_uring")
        ratio = fmt_ratio(ad["iops"] / qn["iops"]) if ad and qn and qn["iops"] else "-"
        add(f"| {job} | " + " | ".join(cells) + f" | {ratio} |")
    add("")
    sl = [r for r in recs if r.get("exp") == 7 and r.get("kind") == "snapshots_under_load"]
    if sl:
        add(f"Snapshots under load: one client writes 4 KiB blocks at random over the full volume for "
            f"{meta['params']['lat_runtime']} s at full speed, without snapshots and with a snapshot every second "
            "(HTTP API over the Unix socket, from an already running process). Every row runs on a fresh "
            "daemon and pool, its volume fully written first (a pool that ran an earlier row was 10-30 % slower).\n")
        add("Snapshots are committed before the call returns (the default) or deferred (`\"durability\": "
            "\"deferred\"`: durable at the pool's next commit); *of another volume*: deferred snapshots of a "
            "second, idle volume of the same pool, which the written volume's I/O should not feel.\n")
        add("| I/O mode | load | snapshots | write p50 / p99, no snapshots | write p50 / p99, snapshot every 1 s | "
            "p99 ratio | snapshot API median | p99 | max | snapshots |")
        add("|---|---|---|---|---|---|---|---|---|---|")
        for mode in dict.fromkeys(r["mode"] for r in sl):
            for job in dict.fromkeys(r["job"] for r in sl if r["mode"] == mode):
                none = next((r for r in sl if r["mode"] == mode and r["job"] == job and r["snaps"] == "no snapshots"), None)
                for snap in (r for r in sl if r["mode"] == mode and r["job"] == job and r["snaps"] != "no snapshots"):
                    if not none:
                        continue
                    kind = ("deferred, of another volume" if "another volume" in snap["snaps"]
                            else "deferred" if snap["snaps"].startswith("deferred") else "committed")
                    lat = sorted(snap["snapshot_api_s"])
                    add(f"| {mode} | {job.split(' ', 1)[1]} | {kind} | {none['lat_p50_us']:.0f} / "
                        f"{none['lat_p99_us']:.0f} µs | {snap['lat_p50_us']:.0f} / {snap['lat_p99_us']:.0f} µs"
                        f"{busy_mark(snap)} | {fmt_ratio(snap['lat_p99_us'] / max(none['lat_p99_us'], 1e-9))} | "
                        + (f"{ms(pct(lat, .5))} | {ms(pct(lat, .99))} | {ms(lat[-1])} | " if lat else "- | - | - | ")
                        + f"{len(lat)} |")
                    if lat:
                        load = f"a {job.split(' ', 1)[1]} load, {mode} I/O, {kind}"
                        busy = snap["busy"]
                        goals.append((f"snapshot API under {load}, median", "< 1 ms", ms(pct(lat, .5)),
                                      pct(lat, .5) < 1e-3, busy))
                        goals.append((f"snapshot API under {load}, p99", "< 5 ms", ms(pct(lat, .99)),
                                      pct(lat, .99) < 5e-3, busy))
                        p99 = snap["lat_p99_us"] / max(none["lat_p99_us"], 1e-9)
                        goals.append((f"foreground p99 under {load} snapshots vs none", "≤ 1.10x", fmt_ratio(p99),
                                      p99 <= 1.10, busy))
        add("")
    fdatasync_note(add, [r for r in recs if r.get("exp") == 7], "")


EXP8_SYSTEMS = ("nbdkit memory", "nbdkit file", "arbor", "arbor, one clone each")


def cores8(r):
    """Cores kept busy during a many-clients run: server, clients (fio), the
    rest of the machine, and the server's busiest thread."""
    srv, cli = r["server_cores"], r["client_cores"]
    return srv, cli, max(0.0, r["machine_cores"] - srv - cli), r["busiest_thread_cores"]


def limit8(r, cpus):
    """What held one many-clients run back, as far as CPU tells."""
    srv, cli, other, thread = cores8(r)
    if srv >= 0.85 * cpus:
        return "server CPU-bound"
    if srv + cli + other >= 0.85 * cpus:
        return "cores full" if srv + cli >= 0.85 * cpus or other < 0.25 else "cores full, other work among them"
    if thread >= 0.85:
        return "a server thread full"
    if cli / r["clients"] >= 0.85:
        return "clients CPU-bound"
    return "not CPU-bound"


def span(values):
    v = sorted(values)
    return f"{v[0]:.2f}" if v[0] == v[-1] else f"{v[0]:.2f}-{v[-1]:.2f}"


def section8(add, goals, e8, meta, out):
    """Experiment 8: many clients, each its own NBD connection."""
    cpus, counts = meta["cpus"], sorted({r["clients"] for r in e8})
    top = counts[-1]
    jobs = list(dict.fromkeys(r["job"] for r in e8))
    systems = [s for s in EXP8_SYSTEMS if any(r["system"] == s for r in e8)]

    def get(job, system, n):
        return next((r for r in e8 if r["job"] == job and r["system"] == system and r["clients"] == n), None)

    def rate(r, job):
        return r["mib_s"] if job.startswith("1M") else r["iops"]

    add("## 8. Many clients\n")
    add(f"{', '.join(map(str, counts))} clients at once, each its own NBD connection (one fio nbd job each, "
        "`--group_reporting`): rates are the sum over all clients, latency percentiles are over all their I/Os. "
        f"Queue depth is per client, so N clients keep N times as many requests in flight. Export "
        f"{meta['params']['size1'] // MIB} MiB, fully written, {meta['params']['runtime']} s per run, warm page "
        "cache (buffered, as in experiment 1). Every client picks random offsets over the whole export "
        "(`--norandommap`: clients of one export may write the same block; each client has its own seed); "
        "the sequential readers each start at offset 0. Write runs end with one flush per client. Systems: "
        "`nbdkit memory` (the protocol's ceiling, no storage), `nbdkit file` on a fully written raw file, "
        "arbor with every client on one fully written volume (no snapshots: writes go in place), and arbor "
        "with each client on its own clone of one snapshot of another fully written volume (VMs or CI jobs "
        "started from one image): new clones before every run, so reads share the image's chunks and writes "
        "are mostly first writes, each copying a 16 KiB chunk. Cells: IOPS (MiB/s for 1M), and in parentheses "
        f"the system's scaling against one client. The machine has {cpus} CPUs, shared by the clients and "
        "the server.\n")
    for job in jobs:
        add(f"### {job}\n")
        add("| clients | " + " | ".join(systems) + " | arbor / nbdkit file | arbor / nbdkit memory | "
            "clones / nbdkit file |")
        add("|---|" + "---|" * (len(systems) + 3))
        for n in counts:
            cells = []
            for s in systems:
                r, one = get(job, s, n), get(job, s, counts[0])
                if not r:
                    cells.append("-")
                    continue
                scale = f" ({fmt_ratio(rate(r, job) / rate(one, job))}x)" if n != counts[0] and one else ""
                cells.append(fmt_rate(r, job) + busy_mark(r) + scale)
            ratios = []
            for a, b in (("arbor", "nbdkit file"), ("arbor", "nbdkit memory"),
                         ("arbor, one clone each", "nbdkit file")):
                ra, rb = get(job, a, n), get(job, b, n)
                ratios.append(fmt_ratio(rate(ra, job) / rate(rb, job)) if ra and rb and rate(rb, job) else "-")
            add(f"| {n} | " + " | ".join(cells + ratios) + " |")
        add("\nLatency p50 / p99 (µs); CPU per I/O, server / clients (µs):\n")
        add("| clients | " + " | ".join(systems) + " |")
        add("|---|" + "---|" * len(systems))
        for n in counts:
            cells = []
            for s in systems:
                r = get(job, s, n)
                cells.append(f"{r['lat_p50_us']:.0f} / {r['lat_p99_us']:.0f}; {r['server_cpu_us_per_io']:.1f} / "
                             f"{r['client_cpu_s'] * 1e6 / max(r['ios'], 1):.1f}" if r else "-")
            add(f"| {n} | " + " | ".join(cells) + " |")
        add("")
        if not job.endswith("QD1/client"):  # experiment 1's targets are for throughput, not round trips
            a, f = get(job, "arbor", top), get(job, "nbdkit file", top)
            need = 0.85 if job.startswith("1M") else 0.9
            if a and f:
                x = rate(a, job) / rate(f, job)
                goals.append((f"{job}, {top} clients on one volume vs nbdkit file (experiment 1's target)",
                              f"≥ {need}x", x, x >= need, a.get("busy") or f.get("busy")))

    add("### Where the CPU went, and what limits the scaling\n")
    add("Cores kept busy while the clients ran: server + clients + elsewhere (the rest of the machine: other "
        "work, kernel threads such as writeback), the server's busiest thread in parentheses, then the limit. "
        "Server, its busiest thread and the machine are sampled every 0.2 s (/proc) and the median interval "
        "is shown, so that fio's start-up and the final flushes (a few tenths of a second, a good part of a "
        "short run) do not water them down; clients: fio's own CPU figures over its I/O time. Limits: "
        f"*server CPU-bound* (the server alone used ≥ 85 % of the {cpus} cores), *cores full* (all of them "
        "together did; *other work among them* when server and clients alone did not and a quarter of a core "
        "or more went elsewhere: a figure of a busy machine), *a server thread full* (one thread ≥ 0.85 of a "
        "core), *clients CPU-bound* (each fio client ≥ 0.85 of a core), *not CPU-bound* (requests waited: on "
        "round trips between client and server, on locks, or on the device).\n")
    add("| job | clients | " + " | ".join(systems) + " |")
    add("|---|---|" + "---|" * len(systems))
    for job in jobs:
        for n in counts:
            cells = []
            for s in systems:
                r = get(job, s, n)
                if not r:
                    cells.append("-")
                    continue
                srv, cli, other, thread = cores8(r)
                cells.append(f"{srv:.2f} + {cli:.2f} + {other:.2f} ({thread:.2f}): {limit8(r, cpus)}{busy_mark(r)}")
            add(f"| {job} | {n} | " + " | ".join(cells) + " |")
    add("")
    for s in systems:
        runs = [r for r in e8 if r["system"] == s and r["clients"] == top]
        by = {}
        for r in runs:
            by.setdefault(limit8(r, cpus), []).append(r)
        parts = []
        for lim, rs in sorted(by.items(), key=lambda kv: -len(kv[1])):
            parts.append(f"{lim} in {len(rs)} of {len(runs)} jobs (server {span(cores8(r)[0] for r in rs)} cores, "
                         f"clients {span(cores8(r)[1] for r in rs)})")
        scaling = ", ".join(
            f"{job.split('/')[0]} {fmt_ratio(rate(get(job, s, top), job) / rate(get(job, s, counts[0]), job))}x"
            for job in jobs if get(job, s, top) and get(job, s, counts[0]))
        add(f"* **{s}**, {top} clients: {'; '.join(parts)}. Against {counts[0]} client: {scaling}.")
    at_top = [r for r in e8 if r["clients"] == top]
    full = [r for r in at_top if limit8(r, cpus) in ("cores full", "server CPU-bound")]
    note = f"At {top} clients, {len(full)} of {len(at_top)} runs had the machine's {cpus} cores full, other work " \
        "not among them"
    if full and len(full) * 2 >= len(at_top):
        small = [r for r in full if not r["job"].startswith("1M")]
        cost = (f" (4 KiB runs, median: server {statistics.median(r['server_cpu_us_per_io'] for r in small):.1f} "
                f"µs, clients {statistics.median(r['client_cpu_s'] * 1e6 / max(r['ios'], 1) for r in small):.1f} "
                "µs per I/O)" if small else "")
        note += ("; there clients and server compete for the same cores, so the aggregate rate is bounded by what "
                 f"the cores can do divided by the CPU one I/O costs on both sides{cost}: more connections raise it "
                 "only as far as they make each I/O cheaper (fuller batches per wake-up), and otherwise lengthen "
                 "the queue (latency). On this machine that, not the number of connections, is the limit; a "
                 "server's own ceiling would need the clients on other cores or machines.")
    else:
        note += ". The limits of the others are in the table above."
    add(f"\n{note}\n")
    plot_exp8(out, e8, jobs, systems, counts)


def fdatasync_note(add, recs, tail):
    """The fdatasync reference of an experiment (exp 3, exp 4), if it has one."""
    fp = [r for r in recs if r.get("kind") == "fdatasync_probe"]
    if fp:
        s = fp[0]["seconds"]
        add(f"Reference: one 4 KiB pwrite + fdatasync on this filesystem: median {ms(statistics.median(s))}, "
            f"p99 {ms(pct(s, .99))}. {tail}\n")


def fmt_ratio(x):
    return f"{x:.2f}" if x is not None else ""


def snapshot_points(rows):
    """A many-snapshots series (exp 2, exp 4), per snapshot count: the median 4 KiB
    write rate and its runs, the 1 MiB write rate, the 4 KiB ratios to 1 and to 0 snapshots."""
    marks = sorted({r["mark"] for r in rows})

    def at(m, job, key):
        runs = [r for r in rows if r["mark"] == m and r["job"].startswith(job)]
        return statistics.median(r[key] for r in runs), runs
    base0 = at(0, "4K", "iops")[0] if 0 in marks else None
    base1 = at(1, "4K", "iops")[0] if 1 in marks else None
    points = []
    for m in marks:
        v4, runs4 = at(m, "4K", "iops")
        v1, runs1 = at(m, "1M", "mib_s")
        points.append(dict(mark=m, held=min(r["snapshots"] for r in runs4), iops=v4, mib_s=v1,
                           runs=", ".join(f"{r['iops']:.0f}" for r in runs4),
                           busy=any(r.get("busy") for r in runs4 + runs1), busy4=any(r.get("busy") for r in runs4),
                           to1=v4 / base1 if base1 else None, to0=v4 / base0 if base0 else None))
    return points


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
            points = snapshot_points([r for r in e2 if r["system"] == system])
            for pt in points:
                add(f"| {system} | {pt['held']} | {pt['iops']:.0f}{busy_mark(pt)} ({pt['runs']}) | "
                    f"{pt['mib_s']:.0f} | {fmt_ratio(pt['to1'])} | {fmt_ratio(pt['to0'])} |")
            top = points[-1]
            if system == "arbor" and top["to0"] is not None:
                goals.append((f"4K randwrite QD32 with {top['held']} snapshots vs 0 snapshots", "≥ 0.95x",
                              top["to0"], top["to0"] >= 0.95, top["busy4"]))
                if top["to1"] is not None:
                    goals.append(("same, vs 1 snapshot (both measure first writes that copy)", "≥ 0.95x",
                                  top["to1"], top["to1"] >= 0.95, top["busy4"]))
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
        fdatasync_note(add, e3, "A snapshot commits, and a commit flushes the device twice.")
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
        if len(fl) >= 2:
            add("Foreground 4 KiB random write latency (QD1, fio nbd) on a full volume, without and with a "
                "snapshot every second (ioSnap fig 11: Btrfs up to 3x, ioSnap ~5%). Every row runs on a fresh "
                "daemon and pool, its volume fully written first.\n")
            add("| mode | snapshots taken | IOPS | p50 | p99 | p99.9 | max | snapshot API median |")
            add("|---|---|---|---|---|---|---|---|")
            for r in fl:
                sm = ms(statistics.median(r["snapshot_api_s"])) if r["snapshot_api_s"] else ""
                add(f"| {r['mode']} | {r['snapshots_taken']} | {r['iops']:.0f}{busy_mark(r)} | {r['lat_p50_us']:.0f} µs | "
                    f"{r['lat_p99_us']:.0f} µs | {r['lat_p999_us']:.0f} µs | {r['lat_max_us']:.0f} µs | {sm} |")
            a = fl[0]
            add("")
            for b in fl[1:]:
                for key, label in (("lat_p50_us", "p50"), ("lat_p99_us", "p99")):
                    ratio = b[key] / a[key] if a[key] else float("nan")
                    goals.append((f"foreground write {label} with a {b['mode'].removesuffix(' every 1 s')} every "
                                  "second vs none", "≤ 1.10x", ratio, ratio <= 1.10, a.get("busy") or b.get("busy")))
            plot_exp3(out, fl)
        eb = [r for r in e3 if r.get("kind") == "engine_bench"]
        if eb:
            add("Engine-level snapshot and clone latency: see engine.md in this directory (engine-bench).\n")

    e4 = [r for r in recs if r.get("exp") == 4]
    add("## 4. COW vs ROW (paper 002 figs 6-8)\n")
    if not e4:
        add("Not measured in this run.\n")
    else:
        section4(add, goals, e4, meta)
        plot_exp4(out, e4)

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

    e7 = [r for r in recs if r.get("exp") == 7 and r.get("kind") == "data_path"]
    if e7:
        section7(add, goals, recs, e7, meta)

    e8 = [r for r in recs if r.get("exp") == 8 and r.get("kind") == "clients"]
    if e8:
        section8(add, goals, e8, meta, out)

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


def plot_exp4(out, e4):
    plt = _plt()
    wr = [r for r in e4 if r.get("kind") == "write_ratio"]
    if wr:
        chunks = list(dict.fromkeys(r["chunk"] for r in wr))
        fig, axes = plt.subplots(1, len(chunks), figsize=(4 * len(chunks), 4), squeeze=False)
        for ax, chunk in zip(axes[0], chunks):
            for layout in ("cow", "row"):
                rows = sorted((r for r in wr if r["chunk"] == chunk and r["layout"] == layout),
                              key=lambda r: r["write_pct"])
                ax.plot([r["write_pct"] for r in rows], [r["mean_us"] for r in rows], marker="o",
                        label=layout.upper())
            ax.set_yscale("log")
            ax.set_xlabel("write ratio %")
            ax.set_ylabel("mean response time, µs")
            ax.set_title(f"chunk {chunk}")
            ax.legend()
        fig.suptitle("Random 4 KiB I/O, QD1, one snapshot (cf. paper 002 figs 6-8)")
        fig.tight_layout()
        fig.savefig(os.path.join(out, "exp4-cow-row.png"), dpi=90)
        plt.close(fig)
    osn = [r for r in e4 if r.get("kind") == "origin_snapshots"]
    if osn:
        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        # log scale for 4K: without a snapshot writes go in place, with one each first write copies
        for ax, job, key, unit, scale in ((axes[0], "4K", "iops", "IOPS (4K randwrite QD32)", "log"),
                                          (axes[1], "1M", "mib_s", "MiB/s (1M seqwrite QD8)", "linear")):
            rows = sorted((r for r in osn if r["job"].startswith(job)), key=lambda r: r["snapshots"])
            ax.plot([r["snapshots"] for r in rows], [r[key] for r in rows], marker="o", label="origin (each run)")
            ax.set_xscale("symlog")
            marks = sorted({r["mark"] for r in rows})
            ax.set_xticks(marks, [str(m) for m in marks])
            ax.set_xlabel("snapshots held")
            ax.set_ylabel(unit)
            ax.set_yscale(scale)
            if scale == "linear":
                ax.set_ylim(bottom=0)
            ax.legend()
        fig.suptitle("Origin write rate vs number of snapshots (cf. paper 001 figs 7-8)")
        fig.tight_layout()
        fig.savefig(os.path.join(out, "exp4-origin-snapshots.png"), dpi=90)
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


def plot_exp8(out, e8, jobs, systems, counts):
    plt = _plt()
    fig, axes = plt.subplots(1, len(jobs), figsize=(3.6 * len(jobs), 3.8), squeeze=False)
    for ax, job in zip(axes[0], jobs):
        key, unit = ("mib_s", "MiB/s") if job.startswith("1M") else ("iops", "IOPS")
        for s in systems:
            rows = sorted((r for r in e8 if r["job"] == job and r["system"] == s), key=lambda r: r["clients"])
            ax.plot([r["clients"] for r in rows], [r[key] for r in rows], marker="o", label=s)
        ax.set_xscale("log", base=2)
        ax.set_xticks(counts, [str(n) for n in counts])
        ax.set_xlabel("clients")
        ax.set_ylabel(f"aggregate {unit}")
        ax.set_ylim(bottom=0)
        ax.set_title(job, fontsize=9)
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Many clients, each its own NBD connection")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "exp8-clients.png"), dpi=90)
    plt.close(fig)


if __name__ == "__main__":
    write(sys.argv[1])
