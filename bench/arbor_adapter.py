"""Every arbor invocation the benchmark harness makes goes through this module.

The daemon: `arbor serve --data-dir DIR --pool-size ... --chunk-size ...
--initial-volume none --nbd-listen none --api-listen none` (NBD on
DIR/nbd.sock, API on DIR/api.sock); clients: `arbor --data-dir DIR
snapshot create V@S` and so on (docs/CLI.md).

Copy-on-write volumes: `volume_create(..., layout="cow")` and origins
(`origin_attach`, `origin_detach`: a raw file served in place).

Bulk management (creating 1,000 snapshots) uses the HTTP control API over
the Unix socket, in-process; the *CLI round trip* figures use the client
commands (a new process each time, as a user or script would).
"""

import http.client
import json
import os
import signal
import socket
import subprocess
import time


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout=120):
        super().__init__("arbor", timeout=timeout)
        self._path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self._path)


def wait_for_socket(path, proc, timeout=30.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode}")
        if os.path.exists(path):
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                    s.connect(path)
                    return
            except OSError:
                pass
        time.sleep(0.02)
    raise RuntimeError(f"{proc.args[0]}: nothing listening on {path}")


class Arbor:
    """One arbor daemon serving one pool in `workdir`."""

    def __init__(self, binary, workdir, pool_size, chunk_size="16K", cache_size=None, log=None, io=None,
                 format_version=None):
        self.binary = binary
        self.workdir = workdir
        self.pool_size = pool_size
        self.chunk_size = chunk_size
        self.cache_size = cache_size
        # None: the daemon's default (auto); "direct" or "buffered".
        self.io = io
        # None: ARBOR_FORMAT_VERSION if set (below), else the binary's newest.
        self.format_version = format_version
        self.proc = None
        self.log = log
        os.makedirs(workdir, exist_ok=True)
        self.nbd_sock = os.path.join(workdir, "nbd.sock")
        self.api_sock = os.path.join(workdir, "api.sock")

    # --- daemon lifecycle -------------------------------------------------

    def start(self):
        # ARBOR_FORMAT_VERSION=N: the pool is created at that format version
        # first (`pool create --format-version`), e.g. 9 for no data
        # checksums, for an A/B of a format feature with one binary.
        version = self.format_version or os.environ.get("ARBOR_FORMAT_VERSION")
        if version:
            subprocess.run([self.binary, "pool", "create", os.path.join(self.workdir, "pool"),
                            "--size", str(self.pool_size), "--chunk-size", self.chunk_size,
                            "--format-version", str(version)], check=True, stdout=subprocess.DEVNULL)
        argv = [self.binary, "serve", "--data-dir", self.workdir, "--pool-size", str(self.pool_size),
                "--chunk-size", self.chunk_size, "--initial-volume", "none",
                "--nbd-listen", "none", "--api-listen", "none"]
        if self.cache_size:
            argv += ["--cache-size", self.cache_size]
        if self.io:
            argv += ["--io", self.io]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=self.log or subprocess.DEVNULL)
        wait_for_socket(self.api_sock, self.proc)
        wait_for_socket(self.nbd_sock, self.proc)
        return self

    def stop(self):
        """SIGTERM to the daemon we started (by PID); it commits and exits."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    @property
    def pid(self):
        return self.proc.pid

    def uri(self, export):
        return f"nbd+unix:///{export}?socket={self.nbd_sock}"

    def peak_rss_bytes(self):
        """VmHWM of the daemon (peak resident set), read while it runs."""
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        return 0

    # --- control API (in-process HTTP over the Unix socket) ---------------

    def _api(self, method, path, body=None):
        conn = _UnixHTTPConnection(self.api_sock)
        try:
            headers = {}
            data = None
            if body is not None:
                data = json.dumps(body).encode()
                headers["Content-Type"] = "application/json"
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            text = resp.read().decode()
            if resp.status >= 300:
                raise RuntimeError(f"{method} {path}: {resp.status} {text}")
            return json.loads(text) if text else None
        finally:
            conn.close()

    def chunk_writes(self):
        """The daemon's `arbor_chunk_writes_total` counters (docs/API.md), by plan."""
        conn = _UnixHTTPConnection(self.api_sock)
        try:
            conn.request("GET", "/metrics")
            text = conn.getresponse().read().decode()
        finally:
            conn.close()
        out = {}
        for line in text.splitlines():
            if line.startswith('arbor_chunk_writes_total{plan="'):
                name, value = line.split(" ")
                out[name.split('"')[1]] = int(float(value))
        return out

    def volume_create(self, name, size, layout=None, encrypt_unit=None):
        """layout: None (the daemon's default, `row`: thin, redirect-on-write) or
        "cow" (the whole size in one run of the pool, written in place).
        encrypt_unit: 512 or 4096 makes it an encrypted volume with those
        data units (a fixed raw key: a benchmark's, not a secret)."""
        body = {"name": name, "size": int(size)}
        if layout:
            body["layout"] = layout
        if encrypt_unit:
            body["encryption"] = {"key": {"kind": "raw", "hex": "be" * 32}, "unit": int(encrypt_unit)}
        return self._api("POST", "/v1/volumes", body)

    def origin_attach(self, name, path):
        """An existing raw file (absolute path) becomes copy-on-write volume `name`."""
        return self._api("POST", "/v1/origins", {"name": name, "path": os.path.abspath(path)})

    def origin_detach(self, name):
        """Flushes the origin's file and removes the volume (its snapshots destroyed first)."""
        return self._api("DELETE", "/v1/origins/" + name)

    def snapshot(self, name, durability=None):
        """durability: None (the default, committed) or "deferred"."""
        body = {"name": name}
        if durability:
            body["durability"] = durability
        return self._api("POST", "/v1/snapshots", body)

    def clone(self, snapshot, name):
        return self._api("POST", "/v1/clones", {"snapshot": snapshot, "name": name})

    def destroy(self, name, force=False):
        """force: even while NBD clients have it open (their requests then fail)."""
        return self._api("DELETE", "/v1/volumes/" + name.replace("@", "%40") + ("?force=true" if force else ""))

    def flush(self):
        return self._api("POST", "/v1/flush")

    def status(self):
        """Pool object: data_used_bytes, metadata_used_bytes, reclaim_pending, ..."""
        return self._api("GET", "/v1/pool")

    def wait_reclaimed(self, timeout=120):
        """Waits (up to `timeout` s) until background reclaim has nothing pending."""
        deadline = time.time() + timeout
        while self.status()["reclaim_pending"] and time.time() < deadline:
            time.sleep(0.05)

    # --- CLI client commands (one process each: the user-visible round trip)

    def _client(self, *args):
        argv = [self.binary, "--data-dir", self.workdir, *args]
        t0 = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True)
        return time.perf_counter() - t0

    def cli_noop(self):
        """`arbor --version`: the cost of starting a client process at all."""
        t0 = time.perf_counter()
        subprocess.run([self.binary, "--version"], check=True, capture_output=True)
        return time.perf_counter() - t0

    def cli_snapshot(self, name):
        return self._client("snapshot", "create", name)

    def cli_clone(self, snapshot, name):
        return self._client("clone", snapshot, name)

    def cli_destroy(self, name):
        return self._client("destroy", name)
