#!/usr/bin/python3
"""Campaign 5, hostile clients (docs/RELIABILITY.md): the daemon's memory
stays bounded and well-behaved clients keep being served while others

* open thousands of connections and say nothing,
* ask for gigabytes of reads and never read the replies,
* write 32 MiB requests in a loop.

The daemon runs with nbd_memory_limit = 64M, a 16 MiB metadata cache and a
2 s stall timeout. Its peak resident memory (VmHWM) must stay within the
memory limit plus a fixed allowance over its idle footprint, and a client
doing 4 KiB reads and writes must finish its work while the abuse goes on.

ARBOR_FLOOD_SECONDS (default 10) sets how long the abuse lasts."""

import os
import socket
import struct
import threading
import time

import nbd

from harness import Failure, run_test

MIB = 1 << 20
MEMORY_LIMIT = 64 * MIB
# Beyond the request-data limit: runtime, per-connection buffers and
# metadata cache growth. Exceeding it means something is unbounded.
ALLOWANCE = 96 * MIB
IDLE_CONNECTIONS = 2000
SECONDS = float(os.environ.get("ARBOR_FLOOD_SECONDS", "10"))

REQUEST_MAGIC = 0x25609513
IHAVEOPT = 0x49484156454F5054
OPT_GO = 7
REP_ACK = 1
CMD_READ = 0


def memory(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise Failure(f"no {field} for pid {pid}")


def read_exact(sock, n):
    data = b""
    while len(data) < n:
        part = sock.recv(n - len(data))
        if not part:
            raise ConnectionError("closed")
        data += part
    return data


def raw_client(path, export):
    """Newstyle-fixed handshake with NBD_OPT_GO; returns the socket in the
    transmission phase."""
    sock = socket.socket(socket.AF_UNIX)
    sock.connect(path)
    read_exact(sock, 18)                        # NBDMAGIC, IHAVEOPT, flags
    sock.sendall(struct.pack(">I", 3))          # fixed newstyle, no zeroes
    name = export.encode()
    data = struct.pack(">I", len(name)) + name + struct.pack(">H", 0)
    sock.sendall(struct.pack(">QII", IHAVEOPT, OPT_GO, len(data)) + data)
    while True:
        _magic, _opt, kind, length = struct.unpack(">QIII", read_exact(sock, 20))
        read_exact(sock, length)
        if kind == REP_ACK:
            return sock
        if kind & 0x80000000:
            raise Failure(f"NBD_OPT_GO refused: {kind:#x}")


def greedy(sock, stop):
    """Asks for 2 GiB of reads and never reads a reply (until the server
    drops the connection, or `stop`)."""
    requests = b"".join(
        struct.pack(">IHHQQI", REQUEST_MAGIC, 0, CMD_READ, cookie, (cookie % 32) * MIB, MIB)
        for cookie in range(2048))
    sock.settimeout(1.0)
    try:
        sock.sendall(requests)
    except OSError:
        pass                                    # dropped by the server
    while not stop.is_set():
        time.sleep(0.2)
    sock.close()


def big_writer(handle, stop, counts):
    payload = os.urandom(32 * MIB)
    while not stop.is_set():
        handle.pwrite(payload, 0)
        counts["big writes"] += 1


def idle_connections(path):
    """Opens connections that never speak; the server holds at most
    nbd_max_connections of them, the rest wait in (or overflow) the backlog."""
    opened = []
    for _ in range(IDLE_CONNECTIONS):
        sock = socket.socket(socket.AF_UNIX)
        sock.setblocking(False)
        try:
            sock.connect(path)
        except (BlockingIOError, ConnectionRefusedError, OSError):
            pass
        opened.append(sock)
    return opened


def body(daemon):
    daemon.cli("volume", "create", "victim", "--size", "64M")
    daemon.cli("volume", "create", "hammer", "--size", "64M")
    daemon.cli("volume", "create", "polite", "--size", "64M")
    pid = daemon.proc.pid
    polite = nbd.NBD()
    polite.connect_uri(daemon.uri("polite"))
    polite.pwrite(b"\1" * 4096, 0)
    polite.flush()
    idle = memory(pid, "VmRSS")

    stop = threading.Event()
    counts = {"big writes": 0}
    # Clients connect before the idle flood takes every free slot (see
    # docs/RELIABILITY.md: new clients then wait for the handshake timeout).
    hammers = []
    for _ in range(2):
        hammers.append(nbd.NBD())
        hammers[-1].connect_uri(daemon.uri("hammer"))
    greedy_sockets = [raw_client(daemon.nbd, "victim") for _ in range(4)]
    sockets = idle_connections(daemon.nbd)
    threads = [threading.Thread(target=greedy, args=(sock, stop)) for sock in greedy_sockets]
    threads += [threading.Thread(target=big_writer, args=(h, stop, counts)) for h in hammers]
    for t in threads:
        t.start()

    polite_ops = 0
    slowest = 0.0
    started = time.time()
    while time.time() - started < SECONDS:
        began = time.time()
        polite.pwrite(os.urandom(4096), 4096 * (1 + polite_ops % 1023))
        if polite.pread(4096, 0) != b"\1" * 4096:
            raise Failure("the polite client read wrong data")
        slowest = max(slowest, time.time() - began)
        polite_ops += 1
    stop.set()
    for t in threads:
        t.join(timeout=60)
    for h in hammers:
        h.shutdown()
    for sock in sockets:
        sock.close()
    polite.flush()
    polite.shutdown()

    peak = memory(pid, "VmHWM")
    growth = peak - idle
    print(f"flood: idle RSS {idle // MIB} MiB, peak {peak // MIB} MiB; polite client did "
          f"{polite_ops} write+read pairs in {SECONDS:.0f} s (slowest {slowest:.2f} s); "
          f"{counts['big writes']} 32 MiB writes; {IDLE_CONNECTIONS} idle connections")
    if growth > MEMORY_LIMIT + ALLOWANCE:
        raise Failure(f"daemon memory grew by {growth // MIB} MiB, over the "
                      f"{(MEMORY_LIMIT + ALLOWANCE) // MIB} MiB bound")
    if polite_ops < 10:
        raise Failure(f"the polite client was starved: {polite_ops} operations")


if __name__ == "__main__":
    run_test("hostile clients", body, pool_size="1G", extra_args=[
        "--cache-size", "16M", "--config", os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                         "flood.toml")])
