#!/usr/bin/python3
"""The daemon's log under systemd (docs/SERVICE.md, "The unit"): with
JOURNAL_STREAM naming its standard error, as systemd sets it for a service
whose output goes to the journal, `arbor serve` sends each event to
journald's socket in the journal's native protocol: the message, its
priority, the identifier `arbor`, and each of the event's fields as a field
of the entry (ARBOR_POOL, ARBOR_VOLUME, ARBOR_ERROR, ...), so that
`journalctl -u arbor ARBOR_VOLUME=db` finds what concerns a volume. Its
standard error then carries no log lines. Without JOURNAL_STREAM, or with
one that names another stream, the log goes to standard error as before.

A stand-in journald (a datagram socket at /run/systemd/journal/socket,
which needs root) receives the entries. The test refuses to run where
something is at that path already (a real journald)."""

import os
import struct
import subprocess
import sys
import socket
import tempfile
import time

from harness import ARBOR, Failure, run, wait_until

JOURNAL = "/run/systemd/journal/socket"


def check(condition, what):
    if not condition:
        raise Failure(what)


def parse(datagram):
    """One entry of the native protocol: KEY=value lines, or KEY, a
    newline, a 64-bit little-endian length and that many bytes, then a
    newline."""
    fields = {}
    at = 0
    while at < len(datagram):
        end = datagram.index(b"\n", at)
        line = datagram[at:end]
        if b"=" in line:
            key, value = line.split(b"=", 1)
            at = end + 1
        else:
            key = line
            (size,) = struct.unpack_from("<Q", datagram, end + 1)
            value = datagram[end + 9:end + 9 + size]
            at = end + 9 + size + 1
        fields[key.decode()] = value.decode(errors="replace")
    return fields


def serve(data, env, stderr):
    return subprocess.Popen(
        [ARBOR, "--data-dir", data, "serve", "--initial-volume", "none",
         "--nbd-listen", "none", "--api-listen", "none", "--pool-size", "256M"],
        env=env, stdout=subprocess.DEVNULL, stderr=stderr)


def stop(proc):
    proc.terminate()
    check(proc.wait(timeout=60) == 0, f"the daemon exited {proc.returncode} on SIGTERM")


def main():
    work = tempfile.mkdtemp(prefix="arbor-journal-")
    journal = None
    try:
        check(os.geteuid() == 0, "journal.py binds journald's socket path: run it as root (CI does)")
        check(not os.path.exists(JOURNAL), f"{JOURNAL} exists (a journald runs here): this test would not touch it")
        os.makedirs(os.path.dirname(JOURNAL), exist_ok=True)
        journal = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        journal.bind(JOURNAL)
        journal.settimeout(60)

        # Under systemd: stderr is the journal's stream.
        data = os.path.join(work, "a")
        err_read, err_write = os.pipe()
        st = os.fstat(err_write)
        env = dict(os.environ, JOURNAL_STREAM=f"{st.st_dev}:{st.st_ino}", RUST_LOG="info")
        proc = serve(data, env, err_write)
        os.close(err_write)
        entries = []

        def serving():
            entries.append(parse(journal.recv(1 << 20)))
            return any("serving" in e.get("MESSAGE", "") for e in entries)

        try:
            wait_until(serving, "the daemon's `serving` entry in the journal", timeout=60)
            run(ARBOR, "--data-dir", data, "volume", "create", "db", "--size", "16M")
            run(ARBOR, "--data-dir", data, "destroy", "db")
        finally:
            stop(proc)
        while True:
            try:
                journal.settimeout(2)
                entries.append(parse(journal.recv(1 << 20)))
            except socket.timeout:
                break
        entry = next(e for e in entries if "serving" in e.get("MESSAGE", ""))
        check(entry.get("SYSLOG_IDENTIFIER") == "arbor", f"identifier: {entry}")
        # tracing-journald: error 3, warn 4, info 5 (notice), debug 6, trace 7.
        check(entry.get("PRIORITY") == "5", f"info is priority 5: {entry}")
        check(entry.get("ARBOR_POOL", "").endswith("/pool"), f"the event's pool field: {entry}")
        check(entry.get("ARBOR_IO") in ("buffered", "direct"), f"the event's io field: {entry}")
        check(any(e.get("MESSAGE", "").startswith("closing the pool") for e in entries),
              f"no `closing the pool` entry: {[e.get('MESSAGE') for e in entries]}")
        leaked = os.read(err_read, 1 << 16).decode(errors="replace")
        os.close(err_read)
        check("INFO" not in leaked and "serving" not in leaked,
              f"log lines on stderr although it is the journal's stream:\n{leaked}")

        # Not under systemd (JOURNAL_STREAM names another stream): stderr.
        data = os.path.join(work, "b")
        log = open(os.path.join(work, "b.log"), "w")
        env = dict(os.environ, JOURNAL_STREAM="1:2", RUST_LOG="info")
        proc = serve(data, env, log)
        try:
            wait_until(lambda: "serving" in open(log.name).read(), "`serving` on stderr", timeout=60)
        finally:
            stop(proc)
            log.close()
        journal.settimeout(0.5)
        try:
            stray = parse(journal.recv(1 << 20))
            raise Failure(f"an entry reached the journal from a daemon logging to stderr: {stray}")
        except socket.timeout:
            pass
    except Failure as e:
        print(f"FAILED: {e}", file=sys.stderr)
        sys.exit(1)
    finally:
        if journal is not None:
            journal.close()
            os.remove(JOURNAL)
        subprocess.run(["rm", "-rf", work])
    print("journal: ok")


if __name__ == "__main__":
    main()
