#!/usr/bin/python3
"""Records real NBD client sessions as fuzz seeds.

Starts `arbor serve` on a temporary data directory with a 1 MiB volume
named `vol` (the export the `handshake` and `request` fuzz targets offer),
puts a recording proxy in front of its Unix socket, and runs real clients
through it: nbdinfo, nbdcopy, qemu-img, qemu-io and python3-libnbd. Every
connection's client-to-server bytes are saved as
`fuzz/sessions/<client>.bin`. The CI fuzz test and `fuzz/run.sh` use them
as seeds of the `handshake` target whole, and of the `request` target from
the end of the handshake on (campaigns/src/hostile.rs).

    ARBOR_BIN=target/debug/arbor /usr/bin/python3 fuzz/sessions/capture.py
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import nbd

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
ARBOR = os.environ.get("ARBOR_BIN", os.path.join(ROOT, "target", "debug", "arbor"))


class RecordingProxy:
    """Forwards connections on `listen` to `target`, keeping each
    connection's client-to-server bytes, in accept order."""

    def __init__(self, listen, target):
        self.target = target
        self.sessions = []
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(listen)
        self.server.listen(16)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            upstream.connect(self.target)
            recorded = bytearray()
            self.sessions.append(recorded)
            threading.Thread(target=self._pump, args=(client, upstream, recorded), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, None), daemon=True).start()

    @staticmethod
    def _pump(source, sink, recorded):
        try:
            while data := source.recv(65536):
                if recorded is not None:
                    recorded.extend(data)
                sink.sendall(data)
        except OSError:
            pass
        for s in (source, sink):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def take(self):
        """Waits for the connections to finish; returns and forgets them."""
        time.sleep(0.3)
        taken, self.sessions = self.sessions, []
        return [bytes(s) for s in taken]


def run(*argv):
    subprocess.run(argv, check=True, capture_output=True, timeout=60)


def main():
    work = tempfile.mkdtemp(prefix="arbor-capture-")
    daemon = subprocess.Popen(
        [ARBOR, "serve", "--data-dir", work, "--pool-size", "256M", "--initial-volume", "vol",
         "--initial-volume-size", "1M", "--nbd-listen", "none", "--api-listen", "none"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            if os.path.exists(os.path.join(work, "nbd.sock")):
                break
            time.sleep(0.05)
        proxy_sock = os.path.join(work, "proxy.sock")
        proxy = RecordingProxy(proxy_sock, os.path.join(work, "nbd.sock"))
        uri = f"nbd+unix:///vol?socket={proxy_sock}"
        image = os.path.join(work, "image.raw")
        with open(image, "wb") as f:
            f.write(bytes(range(256)) * 2048 + bytes(512 * 1024))
        clients = {
            "nbdinfo-list": lambda: run("nbdinfo", "--list", f"nbd+unix://?socket={proxy_sock}"),
            "nbdinfo-map": lambda: run("nbdinfo", "--map", uri),
            "qemu-img-convert-in": lambda: run("qemu-img", "convert", "-n", "-f", "raw", "-O", "raw",
                                               image, uri),
            "qemu-io": lambda: run("qemu-io", "-f", "raw", "-c", "write -P 7 0 64k", "-c",
                                   "write -z 64k 64k", "-c", "discard 128k 64k", "-c", "read 0 128k",
                                   "-c", "flush", uri),
            "nbdcopy-out": lambda: run("nbdcopy", uri, os.path.join(work, "out.raw")),
            "qemu-img-compare": lambda: run("qemu-img", "compare", "-f", "raw", "-F", "raw",
                                            os.path.join(work, "out.raw"), uri),
            "libnbd-all-commands": lambda: libnbd_session(uri),
        }
        for name, client in clients.items():
            client()
            for i, recorded in enumerate(proxy.take()):
                suffix = "" if i == 0 else f"-{i}"
                with open(os.path.join(HERE, f"{name}{suffix}.bin"), "wb") as f:
                    f.write(recorded)
                print(f"{name}{suffix}.bin: {len(recorded)} bytes")
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)


def libnbd_session(uri):
    h = nbd.NBD()
    h.add_meta_context("base:allocation")
    h.connect_uri(uri)
    h.pwrite(b"\x01" * 4096, 0, nbd.CMD_FLAG_FUA)
    h.pread(8192, 0)
    h.block_status(65536, 0, lambda *args: 0)
    h.trim(4096, 8192)
    h.zero(4096, 16384, nbd.CMD_FLAG_NO_HOLE)
    h.cache(4096, 0)
    h.flush()
    h.shutdown()


if __name__ == "__main__":
    sys.exit(main())
