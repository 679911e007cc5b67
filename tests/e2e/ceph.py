"""A real one-node Ceph cluster for the end-to-end tests: one monitor on
127.0.0.1 (msgr v2, a free port), one manager, one memstore OSD, no cephx,
and an `rbd` pool of size 1. Everything lives in a fresh temporary directory
(config, mon/osd/mgr data, logs, admin sockets); every command gets `-c CONF`,
so /etc/ceph and /var/lib/ceph are never read or written. The daemons run in
the foreground as children of this process and are stopped by PID.

    with CephCluster() as ceph:
        ceph.rbd("create", "--size", "64M", "img")
        ceph.ceph("-s")

With rgw=True it also runs a RADOS Gateway (S3) on 127.0.0.1 with one
user: `rgw_endpoint`, `rgw_access_key`, `rgw_secret_key`; `stop_rgw()` and
`start_rgw()` take it down and up again (a store that goes away), and
`rgw_admin(...)` runs `radosgw-admin` (quotas, bucket stats).

If the cluster cannot start, CephCluster raises CephError with the tails of
the daemons' logs (it never skips). Stdlib only; needs the Debian packages
ceph-mon, ceph-osd, ceph-mgr and ceph-common."""

import atexit
import ctypes
import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid

# Debian package for each program, for the error when one is missing.
PACKAGES = {
    "ceph-mon": "ceph-mon",
    "ceph-osd": "ceph-osd",
    "ceph-mgr": "ceph-mgr",
    "ceph": "ceph-common",
    "rbd": "ceph-common",
    "monmaptool": "ceph-base",  # a dependency of ceph-mon
}
RGW_PACKAGES = {"radosgw": "radosgw", "radosgw-admin": "ceph-common"}

POOL = "rbd"


class CephError(Exception):
    pass


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path, lines=40):
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode("utf-8", "replace")
    except OSError as e:
        return f"({e})"
    # Only timestamped lines, none of RocksDB's: its option and statistics
    # dumps in the monitor's log would push the last messages out.
    kept = [line for line in text.splitlines() if line[:4].isdigit() and " rocksdb: " not in line]
    return "\n".join(kept[-lines:])


class CephCluster:
    """One mon, one mgr, one memstore OSD and the pool `rbd`.

    start_timeout bounds the whole start (daemons up, pool usable);
    memstore_bytes is the OSD's capacity, held in the OSD's RAM;
    command_timeout bounds each rbd()/ceph() call unless it passes its own;
    wait_for_mgr=False returns before the manager is available (about 2-4 s
    sooner; rbd data commands do not need it)."""

    def __init__(self, start_timeout=120.0, memstore_bytes=1 << 30, command_timeout=120.0, wait_for_mgr=True,
                 rgw=False):
        self.wait_for_mgr = wait_for_mgr
        self.rgw = rgw
        self.rgw_port = None
        self.rgw_endpoint = None
        self.rgw_access_key = "ARBORTESTACCESSKEY01"
        self.rgw_secret_key = "arbor-test-secret-key-0123456789abcdefghij"
        self.start_timeout = start_timeout
        self.memstore_bytes = memstore_bytes
        self.command_timeout = command_timeout
        self.dir = None
        self.conf = None
        self.port = None
        self.pool = POOL
        self.procs = {}  # daemon name -> Popen
        self.start_seconds = None

    # ---- lifecycle -------------------------------------------------------

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()
        return False

    def start(self):
        needed = dict(PACKAGES, **(RGW_PACKAGES if self.rgw else {}))
        for tool in needed:
            if shutil.which(tool) is None:
                raise CephError(f"{tool} is missing: install the Debian package {needed[tool]} (CI installs it)")
        began = time.monotonic()
        deadline = began + self.start_timeout
        self.dir = tempfile.mkdtemp(prefix="arbor-ceph-")
        atexit.register(self.stop)
        try:
            for sub in ("mon", "osd", "mgr", "log", "run", "crash"):
                os.mkdir(self._path(sub))
            self.fsid = str(uuid.uuid4())
            # An empty keyring: with auth none nothing needs a key, and this
            # keeps clients from looking under /etc/ceph for one.
            open(self._path("keyring"), "w").close()
            for attempt in range(3):
                # The port is free when picked, but another process may take
                # it before the monitor binds it: then try another.
                self.port = _free_port()
                self._write_conf()
                try:
                    self._start_mon(deadline)
                    break
                except CephError:
                    mon = self.procs.get("mon.a")
                    log = _tail(self._path("log", "mon.a.out"))
                    if attempt == 2 or mon is None or mon.poll() is None or "Address already in use" not in log:
                        raise
                    del self.procs["mon.a"]
                    shutil.rmtree(self._path("mon", "ceph-a"))
            self._start_mgr()
            self._start_osd(deadline)
            self._create_pool(deadline)
            if self.wait_for_mgr:
                self._wait_mgr(deadline)
            if self.rgw:
                self._setup_rgw(deadline)
        except BaseException as e:
            report = self._logs_report()
            self.stop()
            if isinstance(e, subprocess.TimeoutExpired):
                raise CephError(f"cluster start: {' '.join(map(str, e.cmd))} timed out after {e.timeout:.0f}s\n{report}") from None
            if isinstance(e, CephError):
                raise CephError(f"cluster start: {e}\n{report}") from None
            raise
        self.start_seconds = time.monotonic() - began
        return self

    def stop(self, timeout=10.0):
        """Stops every daemon started, by PID, in reverse start order (the OSD
        first, while the monitor can still acknowledge its shutdown: with the
        monitor gone it waits 5 s for it): SIGTERM, then SIGKILL if it is
        still there after `timeout` seconds. Then removes the temporary
        directory. Idempotent."""
        for proc in reversed(list(self.procs.values())):
            if proc.poll() is None:
                try:
                    os.kill(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                try:
                    os.kill(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
        self.procs = {}
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None
        atexit.unregister(self.stop)

    # ---- commands --------------------------------------------------------

    def _run(self, argv, input=None, stdout=subprocess.PIPE, check=True, timeout=None, text=None):
        if text is None:
            text = not isinstance(input, (bytes, bytearray))
        proc = subprocess.run(
            [str(a) for a in argv],
            input=input,
            stdout=stdout,
            stderr=subprocess.PIPE,
            text=text,
            timeout=self.command_timeout if timeout is None else timeout,
        )
        if check and proc.returncode != 0:
            out = proc.stdout if isinstance(proc.stdout, str) else ""
            err = proc.stderr if isinstance(proc.stderr, str) else (proc.stderr or b"").decode("utf-8", "replace")
            raise CephError(f"{' '.join(map(str, argv))} exited {proc.returncode}:\n{out}\n{err}")
        return proc

    def rbd(self, *args, input=None, stdout=subprocess.PIPE, check=True, timeout=None, text=None):
        """`rbd -c CONF --pool rbd ARGS...`. Image names may be plain (`img`,
        `img@snap`) or pool-qualified (`rbd/img`). `input` is fed to stdin
        (bytes or str); `stdout` may be a file object; text mode unless
        `input` is bytes or `text=False`. Raises CephError on failure unless
        check=False; every call is bounded by `timeout` (default
        command_timeout)."""
        return self._run(["rbd", "-c", self.conf, "--pool", self.pool, *args],
                         input=input, stdout=stdout, check=check, timeout=timeout, text=text)

    def ceph(self, *args, input=None, stdout=subprocess.PIPE, check=True, timeout=None, text=None):
        """`ceph -c CONF ARGS...`, same conventions as rbd()."""
        return self._run(["ceph", "-c", self.conf, "--connect-timeout", "30", *args],
                         input=input, stdout=stdout, check=check, timeout=timeout, text=text)

    def ceph_json(self, *args, timeout=None):
        return json.loads(self.ceph(*args, "--format", "json", timeout=timeout).stdout)

    def env(self):
        """An environment in which Ceph clients (librbd/librados users that
        read CEPH_CONF) find this cluster."""
        env = dict(os.environ)
        env["CEPH_CONF"] = self.conf
        return env

    # ---- start steps -----------------------------------------------------

    def _path(self, *parts):
        return os.path.join(self.dir, *parts)

    def _write_conf(self):
        d = self.dir
        self.conf = self._path("ceph.conf")
        with open(self.conf, "w") as f:
            f.write(f"""[global]
fsid = {self.fsid}
mon initial members = a
mon host = [v2:127.0.0.1:{self.port}]
public addr = 127.0.0.1
auth cluster required = none
auth service required = none
auth client required = none
keyring = {d}/keyring
run dir = {d}/run
crash dir = {d}/crash
admin socket = {d}/run/$cluster-$name.asok
log file = {d}/log/$cluster-$name.log
log to stderr = false
err to stderr = true
mon cluster log file = {d}/log/$cluster.$channel.log
mon data = {d}/mon/$cluster-$id
osd data = {d}/osd/$cluster-$id
mgr data = {d}/mgr/$cluster-$id
osd objectstore = memstore
memstore device bytes = {self.memstore_bytes}
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false
mon data avail warn = 1
mon data avail crit = 0
mon osd down out interval = 0
paxos propose interval = 0.1
osd op num shards = 1
osd op num threads per shard = 2
mgr initial modules =

[mon]
# Fail at once when the port was taken meanwhile (start picks another).
ms bind retry count = 1

[client]
admin socket = {d}/run/$cluster-$name.$pid.$cctid.asok
log file =
client mount timeout = 30
rados mon op timeout = 60
rados osd op timeout = 60
""")

    def _spawn(self, name, argv):
        out = open(self._path("log", f"{name}.out"), "wb")
        try:
            self.procs[name] = subprocess.Popen(
                [str(a) for a in argv], stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True, preexec_fn=CephCluster._preexec)
        finally:
            out.close()

    @staticmethod
    def _preexec():
        # The daemons die with this process even when it is SIGKILLed and
        # cannot run stop() (PR_SET_PDEATHSIG: it fires when the *thread* that
        # started them exits, so start the cluster from a long-lived thread).
        # Linux only, best effort.
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)
        except Exception:
            pass

    def _check_alive(self):
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise CephError(f"ceph {name} exited {proc.returncode} during start")

    def _wait(self, predicate, what, deadline):
        """Polls predicate until true; a command in it that times out counts
        as false."""
        while True:
            self._check_alive()
            try:
                if predicate():
                    return
            except subprocess.TimeoutExpired:
                pass
            if time.monotonic() >= deadline:
                raise CephError(f"timed out after {self.start_timeout:.0f}s waiting for {what}")
            time.sleep(0.2)

    def _remaining(self, deadline, cap):
        return max(1.0, min(cap, deadline - time.monotonic()))

    def _start_mon(self, deadline):
        monmap = self._path("monmap")
        self._run(["monmaptool", "--create", "--clobber", "--fsid", self.fsid,
                   "--addv", "a", f"[v2:127.0.0.1:{self.port}]", monmap], timeout=30)
        self._run(["ceph-mon", "-c", self.conf, "--mkfs", "-i", "a", "--monmap", monmap,
                   "--keyring", self._path("keyring")], timeout=30)
        self._spawn("mon.a", ["ceph-mon", "-c", self.conf, "-f", "-i", "a"])

        # A short connect timeout: a `ceph` command waits that long on a
        # monitor that died, before _wait notices it is gone.
        def mon_up():
            proc = self._run(["ceph", "-c", self.conf, "--connect-timeout", "3", "mon", "stat"],
                             check=False, timeout=self._remaining(deadline, 10))
            return proc.returncode == 0

        self._wait(mon_up, "the monitor to answer", deadline)

    def _start_mgr(self):
        os.mkdir(self._path("mgr", "ceph-x"))
        self._spawn("mgr.x", ["ceph-mgr", "-c", self.conf, "-f", "-i", "x"])

    def _start_osd(self, deadline):
        osd_uuid = str(uuid.uuid4())
        osd_id = self.ceph("osd", "new", osd_uuid, timeout=self._remaining(deadline, 30)).stdout.strip()
        if osd_id != "0":
            raise CephError(f"`ceph osd new` gave id {osd_id!r}, expected 0")
        os.mkdir(self._path("osd", "ceph-0"))
        self._run(["ceph-osd", "-c", self.conf, "-i", "0", "--mkfs", "--osd-uuid", osd_uuid],
                  timeout=self._remaining(deadline, 60))
        self._spawn("osd.0", ["ceph-osd", "-c", self.conf, "-f", "-i", "0"])

        def osd_up():
            proc = self.ceph("osd", "stat", "--format", "json", check=False,
                             timeout=self._remaining(deadline, 10))
            if proc.returncode != 0:
                return False
            stat = json.loads(proc.stdout)
            stat = stat.get("osdmap", stat)  # older releases nest it
            return stat.get("num_up_osds") == 1 and stat.get("num_in_osds") == 1

        self._wait(osd_up, "the OSD to be up and in", deadline)

    def _create_pool(self, deadline):
        self.ceph("osd", "pool", "create", self.pool, "8", "8", timeout=self._remaining(deadline, 30))
        # `rbd pool init` writes to the pool, so it returns only once the PGs
        # are active; bound each try and retry until the deadline.
        def pool_ready():
            init = self.rbd("pool", "init", self.pool, check=False, timeout=self._remaining(deadline, 20))
            if init.returncode != 0:
                return False
            return self.rbd("ls", check=False, timeout=self._remaining(deadline, 10)).returncode == 0

        self._wait(pool_ready, f"pool {self.pool} to accept rbd commands", deadline)

    def _wait_mgr(self, deadline):
        # Nothing above needs the manager, but commands such as `ceph -s`,
        # `ceph df` and `rbd task`/`rbd perf` do: wait for it so that every
        # test starts from the same state.
        def mgr_available():
            proc = self.ceph("mgr", "stat", "--format", "json", check=False,
                             timeout=self._remaining(deadline, 10))
            return proc.returncode == 0 and json.loads(proc.stdout).get("available") is True

        self._wait(mgr_available, "the manager to be available", deadline)

    # ---- the RADOS Gateway ----------------------------------------------

    def _setup_rgw(self, deadline):
        self.rgw_port = _free_port()
        self.rgw_endpoint = f"http://127.0.0.1:{self.rgw_port}"
        os.mkdir(self._path("rgw"))
        # radosgw reads its keyring from its data directory; none is needed
        # without cephx, but the file must exist.
        open(self._path("rgw", "keyring"), "w").close()
        with open(self.conf, "a") as f:
            # radosgw defaults to cephx and a secure monitor connection:
            # this cluster has neither.
            f.write(f"""
[client.rgw.a]
rgw frontends = beast endpoint=127.0.0.1:{self.rgw_port}
rgw data = {self._path("rgw")}
rgw thread pool size = 32
ms mon client mode = crc
auth client required = none
""")
        self.start_rgw(deadline)
        self.rgw_admin("user", "create", "--uid=arbor", "--display-name=arbor",
                       f"--access-key={self.rgw_access_key}", f"--secret={self.rgw_secret_key}")

    def start_rgw(self, deadline=None):
        """Starts the gateway and waits until it accepts connections."""
        if deadline is None:
            deadline = time.monotonic() + self.start_timeout
        self._spawn("rgw.a", ["radosgw", "-c", self.conf, "-f", "-n", "client.rgw.a", "--no-mon-config"])

        def listening():
            try:
                with socket.create_connection(("127.0.0.1", self.rgw_port), timeout=1):
                    return True
            except OSError:
                return False

        self._wait(listening, "the RADOS Gateway to listen", deadline)

    def stop_rgw(self):
        """Kills the gateway (SIGKILL: a store that vanishes mid-request)."""
        proc = self.procs.pop("rgw.a", None)
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()

    def rgw_admin(self, *args, check=True, timeout=None):
        """`radosgw-admin -c CONF ARGS...` (JSON on stdout)."""
        return self._run(["radosgw-admin", "-c", self.conf, "-n", "client.rgw.a", "--no-mon-config", *args],
                         check=check, timeout=timeout)

    def _logs_report(self):
        if self.dir is None:
            return ""
        parts = []
        for proc_name, proc in self.procs.items():
            parts.append(f"{proc_name}: pid {proc.pid}, exit status {proc.poll()}")
        # The daemons' stderr (errors only) first, then their logs.
        paths = sorted(glob.glob(self._path("log", "*.out"))) + sorted(glob.glob(self._path("log", "*.log")))
        for path in paths:
            parts.append(f"--- {path} (last lines)\n{_tail(path)}")
        return "\n".join(parts)


if __name__ == "__main__":
    import hashlib
    import sys

    def md5(path, size=None):
        h = hashlib.md5()
        done = 0
        with open(path, "rb") as f:
            while True:
                chunk = f.read(1 << 20)
                if not chunk:
                    break
                h.update(chunk)
                done += len(chunk)
        if size is not None and size > done:
            h.update(b"\0" * (size - done))
        return h.hexdigest()

    work = tempfile.mkdtemp(prefix="arbor-ceph-selftest-")
    try:
        began = time.monotonic()
        with CephCluster() as ceph:
            print(f"cluster up in {ceph.start_seconds:.1f}s (conf {ceph.conf}, mon port {ceph.port})")
            ceph.rbd("create", "--size", "64M", "img")
            info = json.loads(ceph.rbd("info", "--format", "json", "img").stdout)
            assert info["size"] == 64 << 20, info

            src = os.path.join(work, "src.raw")
            with open(src, "wb") as f:
                f.write(os.urandom(16 << 20))
            ceph.rbd("import", src, "img2")
            ceph.rbd("snap", "create", "img2@s1")
            diff = os.path.join(work, "s1.diff")
            with open(diff, "wb") as f:
                ceph.rbd("export-diff", "img2@s1", "-", stdout=f, text=False)
            assert os.path.getsize(diff) > 16 << 20, os.path.getsize(diff)
            out = os.path.join(work, "out.raw")
            ceph.rbd("export", "img2@s1", out)
            size = os.path.getsize(out)
            assert size >= 16 << 20, size
            assert md5(out) == md5(src, size), "exported snapshot differs from the imported file"
            names = sorted(ceph.rbd("ls").stdout.split())
            assert names == ["img", "img2"], names
            started_pids = [p.pid for p in ceph.procs.values()]
            cluster_dir = ceph.dir
            print(f"image round trip ok ({size} bytes, diff {os.path.getsize(diff)} bytes)")
        left = [pid for pid in started_pids if os.path.exists(f"/proc/{pid}")]
        assert not left, f"daemons still running: {left}"
        assert not os.path.exists(cluster_dir), f"{cluster_dir} left behind"
        print(f"self-test passed in {time.monotonic() - began:.1f}s")
    except Exception as e:
        print(f"FAIL: {e}", file=sys.stderr)
        sys.exit(1)
    finally:
        shutil.rmtree(work, ignore_errors=True)
