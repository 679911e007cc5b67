"""Shared helpers for arbor's end-to-end tests: a temporary pool, a running
`arbor serve` daemon, and cleanup of everything started (by PID), mounted or
attached, even when a test fails."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ARBOR = os.environ.get("ARBOR_BIN", os.path.join(ROOT, "target", "debug", "arbor"))

# Debian package for each external tool, for the error when one is missing.
PACKAGES = {
    "nbdinfo": "libnbd-bin",
    "nbdcopy": "libnbd-bin",
    "nbdfuse": "libnbd-bin",
    "qemu-img": "qemu-utils",
    "qemu-io": "qemu-utils",
    "mkfs.ext4": "e2fsprogs",
    "e2fsck": "e2fsprogs",
    "losetup": "util-linux",
    "fusermount3": "fuse3",
    "promtool": "prometheus",
    "strace": "strace",
    "systemd-analyze": "systemd",
}


class Failure(Exception):
    pass


def require_tools(*tools):
    for tool in tools:
        if shutil.which(tool) is None:
            raise Failure(f"{tool} is missing: install the Debian package {PACKAGES.get(tool, tool)} (CI installs it)")


# Variables that would point the CLI at another daemon than the test's.
for _variable in ("ARBOR_DATA_DIR", "ARBOR_API", "ARBOR_TOKEN", "ARBOR_TOKEN_FILE",
                  "ARBOR_TLS_CA", "ARBOR_TLS_CERT", "ARBOR_TLS_KEY"):
    os.environ.pop(_variable, None)


def run(*argv, check=True, **kwargs):
    """Runs a command; on failure raises with its output."""
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True, **kwargs)
    if check and proc.returncode != 0:
        raise Failure(f"{' '.join(map(str, argv))} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def wait_until(predicate, what, timeout=30.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise Failure(f"timed out waiting for {what}")


class Daemon:
    """`arbor serve` on a temporary data directory (Unix sockets only, unless
    api_listen names a TCP address for the HTTP API): it creates the pool on
    first start. With a TCP API, `token` is an admin API token made through
    the Unix socket on first start (TCP requests must authenticate)."""

    def __init__(self, pool_size="2G", extra_args=(), api_listen="none"):
        self.dir = tempfile.mkdtemp(prefix="arbor-e2e-")
        self.pool = os.path.join(self.dir, "pool")
        self.api = os.path.join(self.dir, "api.sock")
        self.nbd = os.path.join(self.dir, "nbd.sock")
        self.pool_size = pool_size
        self.extra_args = list(extra_args)
        self.api_listen = api_listen
        self.token = None
        self.proc = None
        self.cleanups = []

    def start(self):
        log = open(os.path.join(self.dir, "daemon.log"), "w")
        self.proc = subprocess.Popen(
            [ARBOR, "serve", "--data-dir", self.dir, "--pool-size", self.pool_size,
             "--initial-volume", "none", "--nbd-listen", "none", "--api-listen", self.api_listen,
             *self.extra_args],
            stdout=log, stderr=subprocess.STDOUT,
        )
        wait_until(lambda: self.listening() or self.proc.poll() is not None, "arbor serve to listen")
        if self.proc.poll() is not None:
            raise Failure(f"arbor serve exited {self.proc.returncode}:\n{self.log()}")
        if self.api_listen != "none" and self.token is None:
            self.token = self.cli("token", "create", "e2e-admin", "--scope", "admin").stdout.strip()

    def log(self):
        with open(os.path.join(self.dir, "daemon.log")) as f:
            return f.read()

    def cli(self, *args):
        """A management command sent to the running daemon."""
        return run(ARBOR, "--data-dir", self.dir, *args)

    def uri(self, export):
        return f"nbd+unix:///{export}?socket={self.nbd}"

    def listening(self):
        """Whether the API answers connections (a socket file alone may be
        stale, left by a killed daemon)."""
        probe = socket.socket(socket.AF_UNIX)
        try:
            probe.connect(self.api)
            return os.path.exists(self.nbd)
        except OSError:
            return False
        finally:
            probe.close()

    def kill(self):
        """SIGKILL: the daemon gets no chance to commit or clean up."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def stop(self):
        """SIGTERM, wait for the final commit, and require a clean exit."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                code = self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise Failure("arbor serve did not stop within 60 s of SIGTERM")
            if code != 0:
                raise Failure(f"arbor serve exited {code} on SIGTERM:\n{self.log()}")
        self.proc = None

    def close(self):
        for cleanup in reversed(self.cleanups):
            try:
                cleanup()
            except Exception as e:  # keep cleaning up the rest
                print(f"cleanup: {e}")
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def run_test(name, body, tools=(), needs_root=False, pool_size="6G", extra_args=(), api_listen="none"):
    """Runs `body(daemon)` against a started daemon on a fresh pool, then
    stops the daemon (it must exit cleanly) and requires `arbor check` to
    pass. Exits 1 with the reason on failure (a missing tool or missing root
    is a failure, never a skip); always cleans up."""
    try:
        if needs_root and os.geteuid() != 0:
            raise Failure(f"{name} must run as root (it mounts a filesystem); CI runs it as root")
        require_tools(*tools)
        daemon = Daemon(pool_size=pool_size, extra_args=extra_args, api_listen=api_listen)
        try:
            daemon.start()
            body(daemon)
            daemon.stop()
            run(ARBOR, "check", daemon.pool)
        finally:
            daemon.close()
    except Failure as e:
        print(f"FAILED: {e}", file=sys.stderr)
        sys.exit(1)
    print(f"{name}: ok")


def metrics(daemon):
    """The daemon's /metrics text, over its API socket."""
    probe = socket.socket(socket.AF_UNIX)
    probe.connect(daemon.api)
    probe.sendall(b"GET /metrics HTTP/1.1\r\nHost: arbor\r\nConnection: close\r\n\r\n")
    chunks = []
    while True:
        data = probe.recv(65536)
        if not data:
            break
        chunks.append(data)
    probe.close()
    return b"".join(chunks).decode()
