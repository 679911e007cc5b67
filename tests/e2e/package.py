#!/usr/bin/python3
"""The Debian package and its service (docs/SERVICE.md), on this machine,
as root:

1. `scripts/build-deb.sh` builds it (from the debug binary the tests
   built: PROFILE=dev NO_BUILD=1), and it holds every file it should.
2. `dpkg -i` puts each where the package says: the binary runs, the man
   pages, completions, docs, monitoring files, the unit and the
   configuration are in place; the system user `arbor` and its data
   directory /var/lib/arbor (0750) exist; the configuration names that
   directory and no initial volume.
3. The unit passes `systemd-analyze verify`, and `systemd-analyze security`
   rates its exposure at most 2.0 ("OK"); the score is printed.
4. The daemon runs as the unit runs it (user arbor, the installed
   configuration, direct I/O): it tells a service manager READY=1
   (NOTIFY_SOCKET), the CLI run as arbor makes a volume in its pool, NBD
   writes and reads it, a snapshot, a scrub and a destroy run, and SIGTERM
   stops it cleanly (STOPPING=1). It runs under strace meanwhile: every
   system call it made is one the unit's SystemCallFilter allows (the
   groups expanded by `systemd-analyze syscall-filter`), since this
   machine cannot run the unit under systemd itself.
5. `dpkg -r` removes the binary and keeps the configuration and the pool;
   `dpkg --purge` removes the configuration and still keeps the pool (a
   pool is never deleted by a package operation).

The machine is left as it was (the package purged, the pool, the data
directory and the user removed). Refuses to run where arbor is installed
or /var/lib/arbor exists: it would not touch a real installation."""

import glob
import grp
import nbd
import os
import pwd
import re
import signal
import socket
import subprocess
import sys

from harness import ROOT, Failure, require_tools, run

DEB_GLOB = os.path.join(ROOT, "target", "debian", "arbor_*.deb")
DATA = "/var/lib/arbor"
CONFIG = "/etc/arbor/arbor.toml"
UNIT = "/usr/lib/systemd/system/arbor.service"
EXPECTED = [
    "usr/bin/arbor",
    "usr/lib/systemd/system/arbor.service",
    "etc/arbor/arbor.toml",
    "usr/share/man/man1/arbor.1.gz",
    "usr/share/man/man1/arbor-volume-create.1.gz",
    "usr/share/man/man1/arbor-serve.1.gz",
    "usr/share/bash-completion/completions/arbor",
    "usr/share/zsh/vendor-completions/_arbor",
    "usr/share/fish/vendor_completions.d/arbor.fish",
    "usr/share/doc/arbor/README.md",
    "usr/share/doc/arbor/SERVICE.md",
    "usr/share/doc/arbor/CLI.md",
    "usr/share/doc/arbor/copyright",
    "usr/share/arbor/monitoring/prometheus/arbor-rules.yml",
    "usr/share/arbor/monitoring/grafana/arbor-dashboard.json",
]
MAX_EXPOSURE = 2.0


def check(condition, what):
    if not condition:
        raise Failure(what)


def installed():
    return subprocess.run(["dpkg", "-s", "arbor"], capture_output=True).returncode == 0


def as_arbor(*argv, **kwargs):
    return run("runuser", "-u", "arbor", "--", *argv, **kwargs)


def build():
    for old in glob.glob(DEB_GLOB):
        os.remove(old)
    env = dict(os.environ, PROFILE="dev", NO_BUILD="1")
    proc = subprocess.run([os.path.join(ROOT, "scripts", "build-deb.sh")], env=env,
                          capture_output=True, text=True)
    check(proc.returncode == 0, f"build-deb.sh failed:\n{proc.stdout}{proc.stderr}")
    debs = glob.glob(DEB_GLOB)
    check(len(debs) == 1, f"one package built, found {debs}")
    contents = run("dpkg-deb", "--contents", debs[0]).stdout
    files = {line.split()[-1].lstrip("./") for line in contents.splitlines() if line}
    missing = [f for f in EXPECTED if f not in files]
    check(not missing, f"the package lacks {missing}")
    pages = [f for f in files if f.startswith("usr/share/man/man1/arbor")]
    check(len(pages) >= 50, f"{len(pages)} man pages")
    return debs[0]


def check_installed():
    version = run("/usr/bin/arbor", "--version").stdout
    check(version.startswith("arbor "), f"arbor --version: {version!r}")
    for f in EXPECTED:
        check(os.path.exists("/" + f), f"/{f} not installed")
    user = pwd.getpwnam("arbor")
    check(user.pw_dir == DATA and user.pw_shell == "/usr/sbin/nologin", f"user arbor: {user}")
    st = os.stat(DATA)
    check(st.st_uid == user.pw_uid and st.st_gid == grp.getgrnam("arbor").gr_gid,
          f"{DATA} not owned by arbor")
    check(st.st_mode & 0o777 == 0o750, f"{DATA} has mode {st.st_mode & 0o777:o}")
    effective = as_arbor("/usr/bin/arbor", "serve", "--config", CONFIG, "--print-config").stdout
    check(f'data_dir = "{DATA}"' in effective, f"the configuration's data_dir:\n{effective}")
    check('initial_volume = ""' in effective, "the configuration makes an initial volume")
    man = run("man", "-w", "arbor-volume-create", check=False)
    check(man.returncode == 0, f"man -w arbor-volume-create: {man.stderr}")


def check_unit():
    verify = run("systemd-analyze", "verify", UNIT, check=False)
    check(verify.returncode == 0 and not verify.stderr.strip(),
          f"systemd-analyze verify: {verify.stdout}{verify.stderr}")
    security = run("systemd-analyze", "security", "--offline=true", UNIT, check=False).stdout
    found = re.search(r"Overall exposure level for arbor\.service: ([0-9.]+) (\w+)", security)
    check(found, f"no exposure level:\n{security}")
    score = float(found.group(1))
    print(f"systemd-analyze security: exposure {score} {found.group(2)}")
    check(score <= MAX_EXPOSURE, f"exposure {score} over {MAX_EXPOSURE}:\n{security}")


def syscall_group(name, seen):
    """The system calls of `systemd-analyze syscall-filter` group `name`,
    its groups expanded."""
    out = run("systemd-analyze", "syscall-filter", name).stdout
    calls = set()
    for line in out.splitlines():
        word = line.strip()
        if not word or word.startswith("#"):
            continue
        if word.startswith("@"):
            if word != name and word not in seen:
                seen.add(word)
                calls |= syscall_group(word, seen)
        elif re.fullmatch(r"[a-z0-9_]+", word):
            calls.add(word)
    return calls


def filter_allows():
    """The system calls the installed unit's SystemCallFilter= lines allow:
    the first list's, less the `~` list's."""
    allowed, denied = set(), set()
    with open(UNIT) as f:
        for line in f:
            if not line.startswith("SystemCallFilter="):
                continue
            words = line.split("=", 1)[1].split()
            target = allowed
            if words and words[0].startswith("~"):
                target = denied
                words[0] = words[0][1:]
            for word in words:
                target |= syscall_group(word, set()) if word.startswith("@") else {word}
    check(allowed, "the unit has no SystemCallFilter")
    return allowed - denied


def traced_calls(trace):
    calls = set()
    with open(trace) as f:
        for line in f:
            found = re.match(r"^\d+\s+([a-z0-9_]+)\(", line)
            if found:
                calls.add(found.group(1))
    return calls


def check_service():
    """The daemon as the unit runs it, under a fake service manager, traced."""
    notify = os.path.join(DATA, "notify.sock")
    manager = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    manager.bind(notify)
    os.chown(notify, pwd.getpwnam("arbor").pw_uid, -1)
    manager.settimeout(120)
    env = dict(os.environ, NOTIFY_SOCKET=notify)
    # As the user arbor, its own process (so that SIGTERM reaches it, not a
    # runuser in between).
    trace = os.path.join(DATA, "strace.txt")
    daemon = subprocess.Popen(
        ["strace", "-f", "-qq", "-o", trace,
         "/usr/bin/arbor", "--data-dir", DATA, "serve", "--config", CONFIG,
         "--nbd-listen", "none", "--api-listen", "none", "--pool-size", "256M", "--io", "direct"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        user="arbor", group="arbor", extra_groups=[], cwd=DATA)
    try:
        try:
            ready = manager.recv(512).decode()
        except socket.timeout:
            raise Failure("the daemon never said READY") from None
        check(ready.startswith("READY=1"), f"first message: {ready!r}")
        as_arbor("/usr/bin/arbor", "--data-dir", DATA, "volume", "create", "v", "--size", "16M")
        listed = as_arbor("/usr/bin/arbor", "--data-dir", DATA, "volume", "list").stdout
        check(" v " in f" {listed} " or "\nv " in listed or listed.startswith("v "),
              f"volume list:\n{listed}")
        # The data path: NBD writes, a flush and reads; a snapshot read
        # back, a scrub, a destroy.
        h = nbd.NBD()
        h.connect_uri(f"nbd+unix:///v?socket={DATA}/nbd.sock")
        for i in range(8):
            h.pwrite(bytes([i + 1]) * (1 << 20), i << 20)
        h.flush()
        check(h.pread(1 << 20, 3 << 20) == bytes([4]) * (1 << 20), "NBD read back")
        h.shutdown()
        as_arbor("/usr/bin/arbor", "--data-dir", DATA, "snapshot", "create", "v@s")
        h = nbd.NBD()
        h.connect_uri(f"nbd+unix:///v@s?socket={DATA}/nbd.sock")
        check(h.pread(1 << 20, 0) == bytes([1]) * (1 << 20), "the snapshot read back")
        h.shutdown()
        as_arbor("/usr/bin/arbor", "--data-dir", DATA, "scrub", "start", "--wait")
        as_arbor("/usr/bin/arbor", "--data-dir", DATA, "destroy", "v@s")
        # The daemon is strace's child: the signal goes to it.
        children = run("pgrep", "-P", str(daemon.pid)).stdout.split()
        check(len(children) == 1, f"strace's children: {children}")
        os.kill(int(children[0]), signal.SIGTERM)
        while True:
            message = manager.recv(512).decode()
            if message.startswith("STOPPING=1"):
                break
        out, _ = daemon.communicate(timeout=120)
        check(daemon.returncode == 0, f"the daemon exited {daemon.returncode}:\n{out}")
        calls = traced_calls(trace)
        check(len(calls) > 30, f"the trace holds {len(calls)} system calls")
        outside = sorted(calls - filter_allows())
        check(not outside, f"system calls the unit's filter refuses: {outside}")
        print(f"system calls of the daemon: {len(calls)}, every one allowed by the unit's filter")
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
        manager.close()
        if os.path.exists(notify):
            os.remove(notify)
    check(os.path.exists(os.path.join(DATA, "pool")), "no pool in the data directory")


def remove_and_purge(deb):
    pool = os.path.join(DATA, "pool")
    run("dpkg", "-r", "arbor")
    check(not os.path.exists("/usr/bin/arbor"), "dpkg -r left the binary")
    check(os.path.exists(CONFIG), "dpkg -r removed the configuration (a conffile)")
    check(os.path.exists(pool), "dpkg -r removed the pool")
    purged = run("dpkg", "--purge", "arbor")
    check(not os.path.exists(CONFIG), "dpkg --purge left the configuration")
    check(os.path.exists(pool), "dpkg --purge removed the pool")
    check("it holds data" in purged.stderr + purged.stdout,
          f"purge did not say why the data directory stays:\n{purged.stdout}{purged.stderr}")


def restore():
    """The machine as it was: no package, pool, data directory or user."""
    if installed():
        subprocess.run(["dpkg", "--purge", "arbor"], capture_output=True)
    subprocess.run(["rm", "-rf", DATA, "/etc/arbor"], capture_output=True)
    subprocess.run(["userdel", "arbor"], capture_output=True)
    subprocess.run(["groupdel", "arbor"], capture_output=True)


def main():
    try:
        check(os.geteuid() == 0, "package.py installs a package: run it as root (CI does)")
        check(not installed() and not os.path.exists(DATA),
              f"arbor is installed here or {DATA} exists: this test would not touch them")
        try:
            pwd.getpwnam("arbor")
            raise Failure("a user arbor exists here: this test would not touch it")
        except KeyError:
            pass
        require_tools("strace", "systemd-analyze")
        deb = build()
        try:
            run("dpkg", "-i", deb)
            check_installed()
            check_unit()
            check_service()
            remove_and_purge(deb)
        finally:
            restore()
    except Failure as e:
        print(f"FAILED: {e}", file=sys.stderr)
        sys.exit(1)
    print("package: ok")


if __name__ == "__main__":
    main()
