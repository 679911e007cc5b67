#!/usr/bin/python3
"""NBD over TLS against plaintext, side by side with nbdkit, in one run.

Three servers on loopback TCP, each serving plaintext and TLS on the same
port (NBD_OPT_STARTTLS; plaintext clients are let in too):

* arbor (`nbd_tls = "on"`, rustls), a 1 GiB volume in a pool file;
* `nbdkit memory 1G` (`--tls=on`, GnuTLS): the protocol ceiling;
* `nbdkit file` on a 1 GiB file in the work directory (arbor stores its
  data in a file too).

The same client for every system and mode: fio 3.33's nbd engine (libnbd
with GnuTLS) with `nbd://localhost:PORT/EXPORT` or
`nbds://localhost:PORT/EXPORT`, and nbdcopy (libnbd) with the same URIs.
fio's nbd engine refuses `tls-certificates=` in a URI, so every client
runs with HOME set to a directory whose `.pki/libnbd/` holds the CA and a
client certificate (libnbd's default place), plaintext runs too.

Jobs: fio 4 KiB random read and write at QD32 and 1 MiB sequential read
and write at QD8 (time based: 10 s, --quick 4 s; fixed random seed; write
jobs end with one flush, random writes use fio's random map), and nbdcopy
of 1 GiB out of the export to `null:` and into it from a file (one
connection, 1 MiB requests, `--flush` on the write). Every export is
filled with random bytes first, so reads read data. Each job runs twice
(--quick: once) per system and mode, plaintext and TLS alternating which
goes first; every run is reported. CPU: the server's utime + stime from
/proc/PID/stat before and after each client process, the client's from
getrusage(RUSAGE_CHILDREN) around it (the whole process: start-up, the
connection and the final flush included); the server's busiest thread;
and what the rest of the machine used meanwhile (/proc/stat), which marks
a run busy beyond a quarter of a core, as does a compiler or linker seen
running (a shared machine: --wait-quiet holds each run until it is idle).

Usage: /usr/bin/python3 bench/tls.py [--quick] [--workdir /var/tmp] [--src-dir /dev/shm]
       [--wait-quiet SECONDS] [--json FILE]
       /usr/bin/python3 bench/tls.py --from-json FILE  (re-render only)
(ARBOR_BIN, default target/release/arbor; needs fio, nbdkit, nbdcopy,
nbdinfo.) Writes a markdown report on stdout. Servers listen on 127.0.0.1
only; each is stopped by its PID and the work directory is removed, also
on failure.
"""

import argparse
import json
import os
import platform
import resource
import shutil
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import threading
import time

# bench/ is sys.path[0]: the harness's helpers.
from arbor_adapter import wait_for_socket
from bench import BusyMonitor, Peer, fill_file, log, proc_cpu_seconds

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARBOR = os.environ.get("ARBOR_BIN", os.path.join(ROOT, "target", "release", "arbor"))
MIB = 1 << 20
GIB = 1 << 30
SIZE = GIB

SYSTEMS = ["arbor", "nbdkit memory", "nbdkit file"]
MODES = ["plain", "TLS"]
# name: (fio rw, block size, queue depth)
FIO_JOBS = {
    "4K randread QD32": ("randread", "4k", 32),
    "4K randwrite QD32": ("randwrite", "4k", 32),
    "1M seqread QD8": ("read", "1m", 8),
    "1M seqwrite QD8": ("write", "1m", 8),
}
COPY_JOBS = ["nbdcopy read 1 GiB", "nbdcopy write 1 GiB"]
JOBS = list(FIO_JOBS) + COPY_JOBS


def sh(*argv, **kw):
    return subprocess.run([str(a) for a in argv], check=True, capture_output=True, text=True, **kw)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port, proc, timeout=30.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{proc.args[0]}: nothing listening on port {port}")


# Every server started, so that an error midway (even in a constructor) still stops them all.
STARTED = []


class Server(Peer):
    """One NBD server on 127.0.0.1:port, plaintext and TLS; Peer's stop() ends it by its PID."""

    def __init__(self, name, argv, port, export, logf, ready=None):
        self.name, self.port, self.export = name, port, export
        self.argv = argv
        self.proc = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT)
        STARTED.append(self)
        if ready:
            ready(self.proc)
        wait_for_port(port, self.proc)

    def uri(self, mode):
        scheme = "nbds" if mode == "TLS" else "nbd"
        return f"{scheme}://localhost:{self.port}/{self.export}"


def start_arbor(work, certs, logf):
    d = os.path.join(work, "arbor")
    os.makedirs(d)
    config = os.path.join(work, "arbor.toml")
    with open(config, "w") as f:
        f.write(f'tls_ca = "{certs}/ca.pem"\ntls_cert = "{certs}/server.pem"\n'
                f'tls_key = "{certs}/server-key.pem"\nnbd_tls = "on"\n')
    port = free_port()
    argv = [ARBOR, "serve", "--config", config, "--data-dir", d, "--pool-size", "4G",
            "--initial-volume", "none", "--nbd-listen", f"127.0.0.1:{port}", "--api-listen", "none"]
    srv = Server("arbor", argv, port, "v", logf,
                 ready=lambda p: wait_for_socket(os.path.join(d, "api.sock"), p))
    sh(ARBOR, "--data-dir", d, "volume", "create", "v", "--size", str(SIZE))
    return srv


def start_nbdkit(name, certs, logf, *plugin):
    port = free_port()
    argv = ["nbdkit", "-f", "--exit-with-parent", "-i", "127.0.0.1", "-p", str(port), "--tls=on",
            f"--tls-certificates={certs}", *plugin]
    return Server(name, argv, port, "", logf)


def machine_cpu_seconds():
    """CPU seconds every core has spent busy since boot (/proc/stat: user,
    nice, system, irq, softirq, steal)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    return (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / os.sysconf("SC_CLK_TCK")


def thread_cpu_seconds(pid):
    """{thread id: utime + stime} of a process's live threads."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[tid] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except OSError:
            pass
    return out


class BusiestThread(threading.Thread):
    """The CPU seconds of a server's busiest thread during a run, sampled
    every 0.1 s (a connection's thread ends with the connection, so the last
    sample of each thread is kept)."""

    def __init__(self, pid):
        super().__init__(daemon=True)
        self.pid, self.first, self.last = pid, thread_cpu_seconds(pid), {}
        self.done = threading.Event()

    def run(self):
        while not self.done.wait(0.1):
            self.last.update(thread_cpu_seconds(self.pid))
        self.last.update(thread_cpu_seconds(self.pid))

    def stop(self):
        self.done.set()
        self.join()
        return max((v - self.first.get(t, 0.0) for t, v in self.last.items()), default=0.0)


def wait_quiet(limit):
    """Waits (up to `limit` seconds) until the machine has been idle for 3 s
    running: under 0.15 cores busy in each second. Returns the seconds waited."""
    t0 = time.time()
    quiet = 0
    while quiet < 3 and time.time() - t0 < limit:
        a = machine_cpu_seconds()
        time.sleep(1)
        quiet = quiet + 1 if machine_cpu_seconds() - a < 0.15 else 0
    return time.time() - t0


class Client:
    """Runs a client process with HOME holding libnbd's default certificates,
    measuring its CPU (rusage of waited-for children) and the server's."""

    def __init__(self, home, busy):
        self.env = dict(os.environ, HOME=home)
        self.busy = busy

    def run(self, argv, server):
        cpu0 = proc_cpu_seconds(server.pid)
        threads = BusiestThread(server.pid)
        threads.start()
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        all0 = machine_cpu_seconds()
        t0 = time.time()
        try:
            p = subprocess.run(argv, capture_output=True, text=True, env=self.env)
        finally:
            t1 = time.time()
            busiest = threads.stop()
        all1 = machine_cpu_seconds()
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu1 = proc_cpu_seconds(server.pid)
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {p.returncode}: {p.stderr[-2000:]}{p.stdout[-2000:]}")
        r = {"wall_s": t1 - t0,
             "client_cpu_s": (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime),
             "server_cpu_s": cpu1 - cpu0, "server_busiest_thread_s": busiest}
        # Everything else the machine did meanwhile: other work, and kernel
        # threads (writeback, softirq) working for client or server.
        r["other_cpu_s"] = max(0.0, (all1 - all0) - r["client_cpu_s"] - r["server_cpu_s"])
        r.update(self.busy.window(t0, t1))
        # Marked busy: a compiler or linker of other work ran, or more than a
        # quarter of a core went elsewhere.
        r["busy"] = r["busy"] or r["other_cpu_s"] / r["wall_s"] > 0.25
        return r, p.stdout

    def fio(self, job, server, mode, runtime):
        rw, bs, qd = FIO_JOBS[job]
        write = "write" in rw
        argv = ["fio", "--name=j", "--ioengine=nbd", f"--uri={server.uri(mode)}", f"--rw={rw}", f"--bs={bs}",
                f"--iodepth={qd}", f"--size={SIZE}", f"--runtime={runtime}", "--time_based", "--randseed=1",
                "--percentile_list=50:99", "--output-format=json"]
        if write:
            argv += ["--end_fsync=1"]
        if not (write and rw.startswith("rand")):
            argv += ["--norandommap"]
        r, out = self.run(argv, server)
        j = json.loads(out[out.index("{"):])["jobs"][0]
        side = j["write" if write else "read"]
        pct = side["clat_ns"].get("percentile", {})
        r.update({"bytes": side["io_bytes"], "mib_s": side["bw_bytes"] / MIB, "iops": side["iops"],
                  "p50_us": pct.get("50.000000", 0) / 1e3, "p99_us": pct.get("99.000000", 0) / 1e3,
                  "fio_runtime_s": j["job_runtime"] / 1e3,
                  "fio_client_cpu_s": (j["usr_cpu"] + j["sys_cpu"]) / 100 * j["job_runtime"] / 1e3})
        return r

    def nbdcopy(self, job, server, mode, src):
        argv = ["nbdcopy", "-C", "1", f"--request-size={MIB}"]
        if job.startswith("nbdcopy read"):
            argv += [server.uri(mode), "null:"]
        else:
            argv += ["--flush", src, server.uri(mode)]
        r, _ = self.run(argv, server)
        r.update({"bytes": SIZE, "mib_s": SIZE / MIB / r["wall_s"]})
        return r


def libnbd_tls_line(home, uri):
    """What libnbd (GnuTLS) says it negotiated ("connection is using TLS: ...")."""
    p = subprocess.run(["nbdinfo", uri], capture_output=True, text=True,
                       env=dict(os.environ, HOME=home, LIBNBD_DEBUG="1"))
    for line in p.stderr.splitlines():
        if "connection is using TLS" in line:
            return line.split("connection is using TLS:", 1)[1].strip()
    return None


def tls_probe(port, certs):
    """NBD fixed-newstyle handshake up to NBD_OPT_STARTTLS, then a TLS
    handshake with Python's ssl (OpenSSL): (version, cipher) as it sees
    them, or an error string."""
    ihaveopt = 0x49484156454F5054
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        rf = s.makefile("rb")  # read(n) waits for n bytes; the server sends nothing unasked
        hello = rf.read(18)
        if hello[:16] != b"NBDMAGICIHAVEOPT":
            raise OSError("not a newstyle NBD server")
        s.sendall(struct.pack(">I", 3))  # FIXED_NEWSTYLE | NO_ZEROES
        s.sendall(struct.pack(">QII", ihaveopt, 5, 0))  # NBD_OPT_STARTTLS
        _, _, rtype, length = struct.unpack(">QIII", rf.read(20))
        rf.read(length)
        rf.close()
        if rtype != 1:
            raise OSError(f"STARTTLS reply {rtype:#x}")
        ctx = ssl.create_default_context(cafile=os.path.join(certs, "ca.pem"))
        ctx.load_cert_chain(os.path.join(certs, "client-cert.pem"), os.path.join(certs, "client-key.pem"))
        t = ctx.wrap_socket(s, server_hostname="localhost")
        version, cipher = t.version(), t.cipher()[0]
        t.sendall(struct.pack(">QII", ihaveopt, 2, 0))  # NBD_OPT_ABORT
        t.close()
        return f"{version} {cipher}"
    except (OSError, ssl.SSLError) as e:
        return f"probe failed: {e}"


def first_line(*argv):
    try:
        return subprocess.run(argv, capture_output=True, text=True).stdout.strip().splitlines()[0]
    except (OSError, IndexError):
        return None


def dpkg_version(pkg):
    return first_line("dpkg-query", "-W", "-f", "${Version}", pkg)


def rustls_version():
    try:
        lock = open(os.path.join(ROOT, "Cargo.lock")).read()
        return lock.split('name = "rustls"\nversion = "', 1)[1].split('"', 1)[0]
    except (OSError, IndexError):
        return None


def meta(work, opts, runtime, reps):
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    flags = next((ln.split(":", 1)[1].split() for ln in open("/proc/cpuinfo") if ln.startswith("flags")), [])
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": first_line("git", "-C", ROOT, "rev-parse", "--short", "HEAD"),
        "arbor": ARBOR, "arbor_mtime": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(os.path.getmtime(ARBOR))),
        "arbor_older_than_commit": os.path.getmtime(ARBOR) < int(first_line("git", "-C", ROOT, "log", "-1",
                                                                              "--format=%ct") or 0),
        "command": " ".join(sys.argv), "quick": opts.quick, "runtime_s": runtime, "reps": reps,
        "cpu": cpu, "cores": os.cpu_count(), "aes": [f for f in ("aes", "vaes", "pclmulqdq") if f in flags],
        "mem_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB, 1),
        "kernel": platform.release(),
        "filesystem": (first_line("findmnt", "-n", "-o", "FSTYPE", "-T", work)
                       or sh("stat", "-f", "-c", "%T", work).stdout.strip()),
        "fio": first_line("fio", "--version"), "nbdkit": first_line("nbdkit", "--version"),
        "libnbd": first_line("nbdcopy", "--version"), "gnutls": dpkg_version("libgnutls30"),
        "rustls": rustls_version(), "loadavg_start": os.getloadavg(),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="4 s per fio job, one run of each")
    ap.add_argument("--workdir", default="/var/tmp")
    ap.add_argument("--src-dir", help="where the 1 GiB source file of nbdcopy's writes goes (default: the work "
                    "directory; /dev/shm saves disk: it is the client's input, the same for every system)")
    ap.add_argument("--wait-quiet", type=float, default=0, metavar="SECONDS",
                    help="before each run, wait up to SECONDS for 3 s without other work (a shared machine)")
    ap.add_argument("--json", help="also write every measurement to FILE")
    ap.add_argument("--from-json", metavar="FILE", help="only render the report of an earlier --json FILE")
    opts = ap.parse_args()
    if opts.from_json:
        with open(opts.from_json) as f:
            print(report(json.load(f)))
        return 0
    if not os.access(ARBOR, os.X_OK):
        sys.exit(f"{ARBOR} missing: cargo build --release -p arbor (or set ARBOR_BIN)")
    runtime, reps = (4, 1) if opts.quick else (10, 2)
    need = {}  # device: (bytes, a directory on it)
    for d, n in ((opts.workdir, 2 * SIZE + 256 * MIB), (opts.src_dir or opts.workdir, SIZE)):
        dev = os.stat(d).st_dev
        need[dev] = (need.get(dev, (0, d))[0] + n, d)
    for n, d in need.values():
        st = os.statvfs(d)
        if st.f_bavail * st.f_frsize < n:
            sys.exit(f"tls.py: needs {n / GIB:.2f} GiB free in {d} (the pool, the file export, the source file)")
    work = tempfile.mkdtemp(prefix="arbor-bench-tls-", dir=opts.workdir)
    src_dir = work
    busy = BusyMonitor()
    busy.start()
    results = meta(work, opts, runtime, reps)
    results["wait_quiet"] = opts.wait_quiet
    servers = []
    try:
        if opts.src_dir:
            src_dir = tempfile.mkdtemp(prefix="arbor-bench-tls-", dir=opts.src_dir)
        results["src_dir"] = opts.src_dir or "the work directory"
        certs = os.path.join(work, "certs")
        sh(ARBOR, "tls", "init", certs, "--client", "bench")
        home = os.path.join(work, "home")
        pki = os.path.join(home, ".pki", "libnbd")
        os.makedirs(pki)
        for f in ("ca-cert.pem", "client-cert.pem", "client-key.pem"):
            shutil.copy(os.path.join(certs, f), pki)
        src = os.path.join(src_dir, "src.raw")
        fill_file(src, SIZE)
        exported = os.path.join(work, "export.raw")
        sh("truncate", "-s", str(SIZE), exported)
        logf = open(os.path.join(work, "servers.log"), "w")
        servers.append(start_arbor(work, certs, logf))
        servers.append(start_nbdkit("nbdkit memory", certs, logf, "memory", str(SIZE)))
        servers.append(start_nbdkit("nbdkit file", certs, logf, "file", exported))
        results["argv"] = {s.name: " ".join(s.argv).replace(work, "W") for s in servers}
        client = Client(home, busy)
        for s in servers:
            log(f"filling {s.name}")
            sh("nbdcopy", src, s.uri("plain"), env=client.env)
        results["negotiated"] = {s.name: {"libnbd": libnbd_tls_line(home, s.uri("TLS")),
                                          "python_ssl": tls_probe(s.port, certs)} for s in servers}
        runs = []
        for rep in range(reps):
            modes = MODES if rep % 2 == 0 else MODES[::-1]
            for job in JOBS:
                for s in servers:
                    for mode in modes:
                        waited = wait_quiet(opts.wait_quiet) if opts.wait_quiet else 0.0
                        log(f"run {rep + 1}/{reps}: {job}, {s.name}, {mode}" +
                            (f" (waited {waited:.0f} s for a quiet machine)" if waited > 3.5 else ""))
                        if job in FIO_JOBS:
                            r = client.fio(job, s, mode, runtime)
                        else:
                            r = client.nbdcopy(job, s, mode, src)
                        r.update({"job": job, "system": s.name, "mode": mode, "rep": rep + 1,
                                  "waited_s": waited})
                        runs.append(r)
        results["runs"] = runs
        results["loadavg_end"] = os.getloadavg()
    except BaseException:
        try:
            with open(os.path.join(work, "servers.log"), errors="replace") as f:
                log("the servers' log, last lines:\n" + f.read()[-3000:])
        except OSError:
            pass
        raise
    finally:
        for s in STARTED:
            try:
                s.stop()
            except Exception as e:
                log(f"stopping {s.name}: {e}")
        busy.stop_flag.set()
        shutil.rmtree(work, ignore_errors=True)
        if src_dir != work:
            shutil.rmtree(src_dir, ignore_errors=True)

    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(results, f, indent=2)
    print(report(results))
    return 0


# ---- the report -------------------------------------------------------------

def mean(xs):
    xs = list(xs)
    return sum(xs) / len(xs) if xs else None


def pick(runs, **kw):
    return [r for r in runs if all(r[k] == v for k, v in kw.items())]


def per_gib(r, key):
    return r[key] / (r["bytes"] / GIB)


def ratio(a, b):
    return "-" if not a or not b else f"{a / b:.2f}"


def report(r):
    out = []
    w = out.append
    runs = r["runs"]
    la0, la1 = r["loadavg_start"], r["loadavg_end"]
    busy = [x for x in runs if x["busy"]]
    w(f"## NBD over TLS against plaintext, {'quick' if r['quick'] else 'full'} profile, "
      f"commit {r['commit']}, {r['date']}\n")
    w(f"`{r['command']}`. {r['cpu']}, {r['cores']} cores (CPU flags: {', '.join(r['aes']) or 'no AES'}), "
      f"{r['mem_gib']} GiB, Linux {r['kernel']}, {r['filesystem']} work directory; arbor binary built "
      f"{r['arbor_mtime']}"
      f"{' (BEFORE that commit: it may not be built from it)' if r.get('arbor_older_than_commit') else ''}, "
      f"rustls {r['rustls']} (ring); {r['fio']}, {r['nbdkit']}, {r['libnbd']}, "
      f"GnuTLS {r['gnutls']}. Load average {la0[0]:.2f} at the start, {la1[0]:.2f} at the end; "
      f"{len(busy)} of {len(runs)} runs marked busy (* below): a compiler or linker of other work ran, or "
      "more than a quarter of a core went elsewhere (to other processes, or to kernel threads) during the run.\n")
    w(f"fio jobs: {r['runtime_s']} s each, time based, over a 1 GiB export filled with random bytes; "
      f"{r['reps']} run(s) of every job per system and mode, plaintext and TLS alternating which goes first. "
      "Client and server share the machine's cores." +
      (f" Before each run the script waited (up to {r['wait_quiet']:.0f} s) for 3 s in which the machine was "
       f"idle: {sum(1 for x in runs if x['waited_s'] > 3.5)} runs waited longer than that, "
       f"{max(x['waited_s'] for x in runs):.0f} s at most." if r.get("wait_quiet") else "") + " Servers:\n")
    w("```")
    for name, argv in r["argv"].items():
        w(argv)
    w("```")
    w("(W: the work directory; arbor's config sets `tls_ca`, `tls_cert`, `tls_key` from `arbor tls init` "
      "and `nbd_tls = \"on\"`; the volume is `arbor volume create v --size 1G`.) Clients: "
      "`fio --ioengine=nbd --uri=nbd[s]://localhost:PORT/EXPORT ...`, `nbdcopy -C 1 --request-size=1048576 "
      "URI null:` and `nbdcopy -C 1 --request-size=1048576 --flush SRC.raw URI` (SRC.raw: 1 GiB of random "
      f"bytes in {r['src_dir']}, also the source of every fill), all with HOME holding "
      "`.pki/libnbd/{ca-cert,client-cert,client-key}.pem`.\n")
    w("Negotiated (libnbd's debug line, then a TLS handshake from Python's ssl after NBD_OPT_STARTTLS):\n")
    for name, n in r["negotiated"].items():
        w(f"* {name}: libnbd: `{n['libnbd']}`; Python ssl: `{n['python_ssl']}`")
    w("")

    def mib(x):
        return f"{x['mib_s']:.0f}"

    def cell(xs, fmt):
        return ", ".join(fmt(x) + ("*" if x["busy"] else "") for x in xs)

    w("### Throughput, TLS against plaintext (MiB/s, every run; ratio of the means)\n")
    for job in JOBS:
        w(f"**{job}**\n")
        w("| system | plain | TLS | TLS / plain |")
        w("|---|---|---|---|")
        for s in r["argv"]:
            p, t = pick(runs, job=job, system=s, mode="plain"), pick(runs, job=job, system=s, mode="TLS")
            w(f"| {s} | {cell(p, mib)} | {cell(t, mib)} "
              f"| {ratio(mean(x['mib_s'] for x in t), mean(x['mib_s'] for x in p))} |")
        w("")

    w("### arbor against nbdkit, TLS (ratio of the mean MiB/s)\n")
    w("| job | arbor TLS | nbdkit memory TLS | nbdkit file TLS | arbor / nbdkit memory | arbor / nbdkit file "
      "| same ratios in plaintext (memory, file) |")
    w("|---|---|---|---|---|---|---|")
    for job in JOBS:
        m = {(s, mode): mean(x["mib_s"] for x in pick(runs, job=job, system=s, mode=mode))
             for s in SYSTEMS for mode in MODES}
        w(f"| {job} | {m['arbor', 'TLS']:.0f} | {m['nbdkit memory', 'TLS']:.0f} | {m['nbdkit file', 'TLS']:.0f} "
          f"| {ratio(m['arbor', 'TLS'], m['nbdkit memory', 'TLS'])} "
          f"| {ratio(m['arbor', 'TLS'], m['nbdkit file', 'TLS'])} "
          f"| {ratio(m['arbor', 'plain'], m['nbdkit memory', 'plain'])}, "
          f"{ratio(m['arbor', 'plain'], m['nbdkit file', 'plain'])} |")
    w("")

    w("### Every run\n")
    w("Latency: fio's completion latency (clat). CPU: seconds per GiB moved, client (fio or nbdcopy, "
      "the whole process) and server (the daemon's utime + stime over the same time); cores busy: "
      "(client + server CPU seconds) / wall seconds of the client process (which include fio's start-up, "
      "about 0.4 s); busiest server thread: the CPU seconds of the server's busiest thread / the same wall "
      "seconds; elsewhere: the machine's busy CPU seconds (/proc/stat) minus client and server, per wall second.\n")
    w("| job | system | mode | run | MiB/s | IOPS | p50 µs | p99 µs | client CPU s/GiB | server CPU s/GiB "
      "| cores busy (client + server) | busiest server thread | elsewhere (cores) |")
    w("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for job in JOBS:
        for s in r["argv"]:
            for mode in MODES:
                for x in pick(runs, job=job, system=s, mode=mode):
                    lat = (f"{x['iops']:.0f} | {x['p50_us']:.0f} | {x['p99_us']:.0f}" if "iops" in x
                           else "- | - | -")
                    w(f"| {job} | {s} | {mode} | {x['rep']}{'*' if x['busy'] else ''} | {x['mib_s']:.0f} | {lat} "
                      f"| {per_gib(x, 'client_cpu_s'):.2f} | {per_gib(x, 'server_cpu_s'):.2f} "
                      f"| {x['client_cpu_s'] / x['wall_s']:.2f} + {x['server_cpu_s'] / x['wall_s']:.2f} "
                      f"| {x['server_busiest_thread_s'] / x['wall_s']:.2f} | {x['other_cpu_s'] / x['wall_s']:.2f} |")
    w("")

    w("### CPU per GiB, means (client + server = total; what TLS adds)\n")
    cores = r["cores"]
    w("| job | system | plain: client + server | TLS: client + server | TLS adds (client, server) "
      f"| TLS cores busy: client + server (busiest server thread) + elsewhere | {cores} cores / TLS total, as MiB/s "
      "| TLS measured |")
    w("|---|---|---|---|---|---|---|---|")
    summary = {}
    for job in JOBS:
        for s in r["argv"]:
            row = {}
            for mode in MODES:
                xs = pick(runs, job=job, system=s, mode=mode)
                row[mode] = {k: mean(per_gib(x, k) for x in xs) for k in ("client_cpu_s", "server_cpu_s")}
                row[mode]["mib_s"] = mean(x["mib_s"] for x in xs)
                row[mode]["cc"] = mean(x["client_cpu_s"] / x["wall_s"] for x in xs)
                row[mode]["sc"] = mean(x["server_cpu_s"] / x["wall_s"] for x in xs)
                row[mode]["st"] = mean(x["server_busiest_thread_s"] / x["wall_s"] for x in xs)
                row[mode]["oc"] = mean(x["other_cpu_s"] / x["wall_s"] for x in xs)
                row[mode]["busy"] = sum(1 for x in xs if x["busy"])
                row[mode]["n"] = len(xs)
            summary[job, s] = row
            p, t = row["plain"], row["TLS"]
            tot_t = t["client_cpu_s"] + t["server_cpu_s"]
            w(f"| {job} | {s} | {p['client_cpu_s']:.2f} + {p['server_cpu_s']:.2f} = "
              f"{p['client_cpu_s'] + p['server_cpu_s']:.2f} | {t['client_cpu_s']:.2f} + {t['server_cpu_s']:.2f} = "
              f"{tot_t:.2f} | {t['client_cpu_s'] - p['client_cpu_s']:+.2f}, "
              f"{t['server_cpu_s'] - p['server_cpu_s']:+.2f} "
              f"| {t['cc']:.2f} + {t['sc']:.2f} ({t['st']:.2f}) + {t['oc']:.2f} | {cores / tot_t * 1024:.0f} "
              f"| {t['mib_s']:.0f} |")
    w("")
    w(limits_paragraph(summary, cores))
    return "\n".join(out) + "\n"


def limits_paragraph(summary, cores):
    """What limits TLS throughput, from the CPU figures of the 1 MiB jobs."""
    lines = ["### What limits TLS throughput here\n"]
    for job in ("1M seqwrite QD8", "1M seqread QD8", "nbdcopy read 1 GiB", "nbdcopy write 1 GiB"):
        a = summary[job, "arbor"]
        p, t = a["plain"], a["TLS"]
        got = t["mib_s"] / p["mib_s"]
        goal = f"; goal 0.8x {'met' if got >= 0.8 else 'not met'}" if job.startswith("1M seq") else ""
        peers = ", ".join(f"{s} {summary[job, s]['TLS']['mib_s'] / summary[job, s]['plain']['mib_s']:.2f}x"
                          for s in SYSTEMS[1:])
        total = t["client_cpu_s"] + t["server_cpu_s"]
        used = t["cc"] + t["sc"] + t["oc"]
        limits = []
        if t["cc"] >= 0.85:
            limits.append(f"the client's thread was close to a whole core ({t['cc']:.2f})")
        if t["st"] >= 0.85:
            limits.append(f"arbor's busiest thread was close to a whole core ({t['st']:.2f})")
        if used >= 0.85 * cores:
            limits.append(f"the machine's {cores} cores were nearly full ({used:.2f} busy, {t['oc']:.2f} of "
                          f"it elsewhere), so CPU per GiB sets the rate: {cores} cores / {total:.2f} s per GiB = "
                          f"{cores / total * 1024:.0f} MiB/s at most")
        if not limits:
            limits.append(f"neither a thread nor the machine was full ({used:.2f} of {cores} cores busy, "
                          f"{t['oc']:.2f} elsewhere): each side spent part of the time waiting on the other")
        marked = t["busy"] + p["busy"]
        marked = f" ({marked} of {t['n'] + p['n']} runs marked busy)" if marked else ""
        lines.append(
            f"* {job}: arbor TLS {t['mib_s']:.0f} MiB/s against {p['mib_s']:.0f} plaintext "
            f"({got:.2f}x{goal}; the peers: {peers}). Per GiB, TLS took {t['client_cpu_s']:.2f} s of client "
            f"CPU and {t['server_cpu_s']:.2f} s of server CPU, against {p['client_cpu_s']:.2f} and "
            f"{p['server_cpu_s']:.2f} in plaintext; during the TLS runs the client kept {t['cc']:.2f} cores "
            f"busy and the server {t['sc']:.2f}: {'; '.join(limits)}{marked}.")
    lines.append(
        "\nEach side of the connection encrypts or decrypts every byte once (AES-256-GCM), so TLS adds CPU "
        "on both sides for every GiB moved. The client does it on one thread (fio's nbd engine and nbdcopy "
        "-C 1 drive one libnbd handle); arbor does a connection's TLS on the connection's thread, both "
        "directions. Client and server share the machine's cores here, so the client's added CPU comes out "
        f"of the server's share and the other way round: \"{cores} cores / TLS total\" is the most any "
        "server could move with this client on this machine at the CPU per GiB measured. A client on "
        "another machine (the real case for NBD over TLS) leaves the server's cores to the server.")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
