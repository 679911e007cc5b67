"""Several "hosts" on one machine for the end-to-end tests: each host is a
Linux network namespace with one interface, eth0, joined by a veth pair to
a bridge, br0, that lives in a namespace of its own. Nothing is created in
the root namespace: the veth pairs are made inside the bridge namespace,
their host ends directly in the host namespaces. Private addresses are used
only inside these namespaces.

    with Network(["a", "b"]) as net:
        server = net.popen("b", ["arbor", "serve", ...])
        net.run("a", ["arbor", ..., net.addr("b")])
        assert net.ping("a", "b")
        net.shape("a", delay_ms=10, rate_mbit=100)   # what a sends
        net.cut("b"); ...; net.restore("b")

Namespaces are named f"{prefix}-{host}" and f"{prefix}-br"; the default
prefix is f"arb{os.getpid()}" (a second Network open at the same time in the
same process gets f"arb{pid}n{k}"). Network() first deletes namespaces left
with its prefix by an earlier run, and those of default-named Networks whose
process is gone. close() (also run by the context manager, atexit, and on
SIGTERM/SIGINT) kills the processes started with popen() and deletes every
namespace created; processes started otherwise inside a namespace keep it
alive (unnamed) until they exit, so start long-running ones with popen().

shape() uses tc netem where the kernel has it; where it does not (this
project's VMs are built without CONFIG_NET_SCH_NETEM) the rate is a tbf
qdisc and delay, jitter and loss a small forwarding process (see shape()).

make_certs() and make_rogue_cert() make TLS certificates with the openssl
CLI: an EC P-256 CA and leaf certificates for mutual TLS that rustls/webpki
accept. Stdlib only; needs root, `ip` and `tc` (Debian iproute2) and
`openssl`. Every command is bounded by a timeout."""

import atexit
import ctypes
import ipaddress
import os
import re
import secrets
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

IP_TIMEOUT = 30.0  # each `ip`/`tc`/`openssl` command
RUN_TIMEOUT = 120.0  # Network.run() unless it passes timeout=
KILL_WAIT = 10.0  # waiting for a SIGKILLed process to be reaped

_HOST_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
_PREFIX_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
_DEFAULT_PREFIX_RE = re.compile(r"^arb(\d+)(?:n\d+)?-")
_CERT_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.-]{0,62}$")


class NetnsError(subprocess.CalledProcessError):
    """A command that failed; str() shows its output as well."""

    def __str__(self):
        out = self.stdout if isinstance(self.stdout, str) else (self.stdout or b"").decode("utf-8", "replace")
        err = self.stderr if isinstance(self.stderr, str) else (self.stderr or b"").decode("utf-8", "replace")
        cmd = " ".join(map(str, self.cmd)) if isinstance(self.cmd, (list, tuple)) else str(self.cmd)
        return f"{cmd} exited {self.returncode}:\n{out}{err}".rstrip()


def _cmd(argv, check=True, timeout=IP_TIMEOUT, **kw):
    """Runs a short command, output captured as text; raises NetnsError on a
    non-zero exit when check."""
    argv = [str(a) for a in argv]
    proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=timeout, **kw)
    if check and proc.returncode != 0:
        raise NetnsError(proc.returncode, argv, proc.stdout, proc.stderr)
    return proc


def _require(*tools):
    for tool in tools:
        if shutil.which(tool) is None:
            raise RuntimeError(f"{tool} is missing (Debian: {'openssl' if tool == 'openssl' else 'iproute2'})")


def list_namespaces():
    """Names of the named network namespaces (`ip netns list`)."""
    out = _cmd(["ip", "netns", "list"]).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _delete_namespace(name):
    # `ip netns del` of a name that is already gone fails: that is fine.
    _cmd(["ip", "netns", "del", name], check=False)


_NO_QDISC_KIND = re.compile(r"qdisc kind is unknown|Unknown qdisc|unknown qdisc")
_netem = None  # None: not known yet; False: the kernel has no sch_netem


def _use_netem():
    forced = os.environ.get("ARBOR_NETNS_SHAPER")
    if forced in ("netem", "userspace"):
        return forced == "netem"
    return _netem is not False


def _netem_missing():
    global _netem
    _netem = False


def _preexec():
    """preexec_fn for background processes: PR_SET_PDEATHSIG fires when the
    starting *thread* exits, so only from the main thread."""
    return _pdeathsig if threading.current_thread() is threading.main_thread() else None


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _pdeathsig():
    # The process gets SIGKILL when the thread that started it exits, so a
    # test killed with SIGKILL (which cannot clean up) leaves no process
    # behind in the namespaces; their names are removed by the next run.
    # Used only for starts from the main thread (see _preexec()).
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except Exception:
        pass


# ---- process-wide cleanup: atexit, SIGTERM, SIGINT ----------------------

_open_networks = []  # Networks not closed yet, in creation order
_prev_handlers = {}  # signal number -> handler before ours
_atexit_registered = False


def _close_all():
    for net in reversed(list(_open_networks)):
        try:
            net.close()
        except Exception as e:  # keep closing the others
            print(f"netns: closing {net.prefix}: {e}", file=sys.stderr)


def _on_signal(signum, frame):
    prev = _prev_handlers.get(signum)  # before _close_all() uninstalls us
    _close_all()
    if callable(prev):
        prev(signum, frame)  # SIGINT's default raises KeyboardInterrupt
    elif signum == signal.SIGINT:
        raise KeyboardInterrupt
    else:
        # Unwind (running finally blocks and atexit) rather than die at once.
        raise SystemExit(128 + signum)


def _install_cleanup():
    global _atexit_registered
    if not _atexit_registered:
        atexit.register(_close_all)
        _atexit_registered = True
    for signum in (signal.SIGTERM, signal.SIGINT):
        try:
            current = signal.getsignal(signum)
            if current is _on_signal or current == signal.SIG_IGN:
                continue
            signal.signal(signum, _on_signal)
            _prev_handlers[signum] = current
        except ValueError:  # not the main thread: atexit and close() only
            pass


def _uninstall_cleanup():
    if _open_networks:
        return
    for signum, prev in list(_prev_handlers.items()):
        try:
            if signal.getsignal(signum) is _on_signal:
                signal.signal(signum, prev if prev is not None else signal.SIG_DFL)
            del _prev_handlers[signum]
        except ValueError:
            pass


def _sweep_stale(prefix):
    """Deletes namespaces named f"{prefix}-..." (an earlier run with this
    prefix that could not clean up) and default-named ones whose process is
    gone."""
    for name in list_namespaces():
        if name.startswith(prefix + "-"):
            _delete_namespace(name)
            continue
        m = _DEFAULT_PREFIX_RE.match(name)
        if m and not _pid_alive(int(m.group(1))):
            _delete_namespace(name)


def _prefixes_overlap(p, q):
    return p == q or p.startswith(q + "-") or q.startswith(p + "-")


class Network:
    """Hosts (network namespaces) on one bridge. Host i (0-based) has the
    address f"{subnet}.{i+2}/24" on eth0; lo is up. Use as a context
    manager, or call close()."""

    def __init__(self, hosts, subnet="10.77.0", prefix=None):
        _require("ip", "tc")
        hosts = list(hosts)
        if not hosts:
            raise ValueError("Network needs at least one host")
        if len(hosts) > 253:
            raise ValueError("at most 253 hosts (addresses .2 to .254)")
        if len(set(hosts)) != len(hosts):
            raise ValueError(f"duplicate host names in {hosts}")
        for h in hosts:
            if not isinstance(h, str) or not _HOST_RE.match(h) or h == "br":
                raise ValueError(f"bad host name {h!r}: letters, digits, '_', '.', '-', and not 'br'")
        try:
            parts = subnet.split(".")
            if len(parts) != 3:
                raise ValueError
            net = ipaddress.ip_network(f"{subnet}.0/24")
        except ValueError:
            raise ValueError(f"subnet must be three octets such as '10.77.0', not {subnet!r}") from None
        if not net.is_private:
            raise ValueError(f"subnet {subnet} is not a private range")

        if prefix is None:
            prefix = f"arb{os.getpid()}"
            k = 0
            while any(_prefixes_overlap(prefix, n.prefix) for n in _open_networks):
                k += 1
                prefix = f"arb{os.getpid()}n{k}"
        elif not _PREFIX_RE.match(prefix):
            raise ValueError(f"bad prefix {prefix!r}")
        for other in _open_networks:
            if _prefixes_overlap(prefix, other.prefix):
                raise ValueError(f"prefix {prefix!r} overlaps open Network {other.prefix!r}")

        self.hosts = hosts
        self.subnet = subnet
        self.prefix = prefix
        self.bridge_ns = f"{prefix}-br"
        self._index = {h: i for i, h in enumerate(hosts)}
        self._created = []  # namespaces created, in order
        self._procs = []  # Popen objects from popen() and delay lines
        self._line = {}  # host -> its delay line's Popen (see shape())
        self._gso_default = {}  # host -> eth0's gso_max_segs before shape()
        self._closed = False

        _open_networks.append(self)
        _install_cleanup()
        try:
            _sweep_stale(prefix)
            self._build()
        except BaseException:
            self.close()
            raise

    # ---- building ----------------------------------------------------------

    def _ip(self, *args):
        if self._closed:
            raise RuntimeError(f"Network {self.prefix} was closed")
        return _cmd(["ip", *args])

    def _add_namespace(self, name):
        self._ip("netns", "add", name)
        self._created.append(name)

    def _build(self):
        br = self.bridge_ns
        self._add_namespace(br)
        self._ip("-n", br, "link", "set", "lo", "up")
        # The bridge's ports carry the hosts' frames and send none of their
        # own (no IPv6 link-local addresses, router or neighbour
        # solicitations); this also keeps shape()'s delay line quiet.
        _cmd(["ip", "netns", "exec", br, sys.executable or "python3", "-c", _PY_NO_IPV6])
        # No STP: ports forward as soon as they are up (also after restore()).
        self._ip("-n", br, "link", "add", "br0", "type", "bridge", "stp_state", "0", "forward_delay", "0")
        self._ip("-n", br, "link", "set", "br0", "up")
        for h in self.hosts:
            ns = self.ns(h)
            self._add_namespace(ns)
            self._ip("-n", ns, "link", "set", "lo", "up")
            # The pair is made inside the bridge namespace with its host end
            # created directly in the host's namespace, already named eth0.
            self._ip("-n", br, "link", "add", self._bridge_veth(h), "type", "veth",
                     "peer", "name", "eth0", "netns", ns)
            self._ip("-n", ns, "addr", "add", f"{self.addr(h)}/24", "dev", "eth0")
            self._ip("-n", ns, "link", "set", "eth0", "up")
            self._ip("-n", br, "link", "set", self._bridge_veth(h), "master", "br0")
            self._ip("-n", br, "link", "set", self._bridge_veth(h), "up")

    def _bridge_veth(self, host):
        return f"v{self._index_of(host)}b"

    def _index_of(self, host):
        try:
            return self._index[host]
        except KeyError:
            raise KeyError(f"no host {host!r} in Network {self.prefix} (hosts: {self.hosts})") from None

    # ---- queries -----------------------------------------------------------

    def ns(self, host):
        """The host's namespace name."""
        self._index_of(host)
        return f"{self.prefix}-{host}"

    def addr(self, host):
        """The host's IPv4 address, without prefix length."""
        return f"{self.subnet}.{self._index_of(host) + 2}"

    def __repr__(self):
        state = "closed" if self._closed else "open"
        return f"<Network {self.prefix} {state} hosts={self.hosts}>"

    # ---- commands in a host ------------------------------------------------

    def _argv(self, host, argv):
        if self._closed:
            raise RuntimeError(f"Network {self.prefix} was closed")
        if isinstance(argv, (str, bytes)):
            raise TypeError("argv must be a list of arguments, not a string")
        return ["ip", "netns", "exec", self.ns(host), *[os.fspath(a) if isinstance(a, os.PathLike) else str(a) for a in argv]]

    def run(self, host, argv, **kw):
        """Runs argv in the host's namespace (`ip netns exec NS argv...`) and
        returns the CompletedProcess. Defaults: check=True (raises NetnsError,
        a CalledProcessError whose str() shows the output), capture_output
        and text, stdin from /dev/null, timeout RUN_TIMEOUT seconds; any of
        these may be overridden (timeout=None for none)."""
        check = kw.pop("check", True)
        kw.setdefault("timeout", RUN_TIMEOUT)
        kw.setdefault("text", True)
        if "stdout" not in kw and "stderr" not in kw:
            kw.setdefault("capture_output", True)
        if "input" not in kw:
            kw.setdefault("stdin", subprocess.DEVNULL)
        full = self._argv(host, argv)
        proc = subprocess.run(full, **kw)
        if check and proc.returncode != 0:
            raise NetnsError(proc.returncode, full, proc.stdout, proc.stderr)
        return proc

    def popen(self, host, argv, **kw):
        """Starts argv in the host's namespace in the background and returns
        the Popen. Defaults: stdout and stderr piped, text, stdin from
        /dev/null, a new session (its own process group), and, when started
        from the main thread, SIGKILL when this process dies (even by
        SIGKILL); pass stdout=/stderr= (a file, DEVNULL) for a chatty
        process, whose pipe would otherwise fill. close() kills
        it (its process group, SIGKILL) and waits, if it is still running."""
        kw.setdefault("stdout", subprocess.PIPE)
        kw.setdefault("stderr", subprocess.PIPE)
        kw.setdefault("stdin", subprocess.DEVNULL)
        kw.setdefault("text", True)
        kw.setdefault("start_new_session", True)
        kw.setdefault("preexec_fn", _preexec())
        proc = subprocess.Popen(self._argv(host, argv), **kw)
        proc._netns_own_group = bool(kw["start_new_session"])
        self._procs.append(proc)
        return proc

    # ---- link conditions ---------------------------------------------------

    def shape(self, host, delay_ms=0, jitter_ms=0, loss_pct=0.0, rate_mbit=None):
        """Shapes what the host sends (its eth0 egress): a delay of delay_ms
        plus or minus up to jitter_ms (uniform), loss_pct percent of packets
        dropped at random, and a rate limit of rate_mbit. Replaces any
        earlier setting; all zero with rate_mbit None removes it.

        With sch_netem in the kernel this is one netem qdisc (with `rate`
        if given; jitter may then reorder packets). Without it (kernels
        built without CONFIG_NET_SCH_NETEM, such as this project's VMs) the
        rate is a tbf qdisc on eth0, and delay, jitter and loss a delay
        line: a python3 process in the bridge namespace that forwards the
        host's frames to the bridge after holding them (in order: jitter
        never reorders); frames towards the host stay in the kernel. With
        loss the host's GSO is turned off so that loss is per packet.
        `ARBOR_NETNS_SHAPER=netem` or `=userspace` forces one way. Changing
        a delay line's setting drops the frames it holds."""
        ns = self.ns(host)
        if delay_ms < 0 or jitter_ms < 0 or not 0 <= loss_pct <= 100 or (rate_mbit is not None and rate_mbit <= 0):
            raise ValueError("shape: negative delay/jitter, loss outside 0..100 or rate <= 0")
        if self._closed:
            raise RuntimeError(f"Network {self.prefix} was closed")
        line = bool(delay_ms or jitter_ms or loss_pct)
        self._del_root_qdisc(ns)
        self._set_gso_segs(host, None)
        if not line and rate_mbit is None:
            self._stop_line(host, keep_topology=False)
            return
        if _use_netem():
            self._stop_line(host, keep_topology=False)
            args = ["tc", "-n", ns, "qdisc", "replace", "dev", "eth0", "root", "netem",
                    # Room for a bandwidth-delay product's worth of packets.
                    "limit", "100000", "delay", f"{delay_ms}ms"]
            if jitter_ms:
                args.append(f"{jitter_ms}ms")
            if loss_pct:
                args += ["loss", f"{loss_pct}%"]
            if rate_mbit is not None:
                args += ["rate", f"{rate_mbit}mbit"]
            proc = _cmd(args, check=False)
            if proc.returncode == 0:
                return
            if not _NO_QDISC_KIND.search(proc.stderr) or os.environ.get("ARBOR_NETNS_SHAPER") == "netem":
                raise NetnsError(proc.returncode, proc.args, proc.stdout, proc.stderr)
            _netem_missing()
        if rate_mbit is not None:
            rate_bps = rate_mbit * 1e6
            # A burst of 2 ms at the rate (at least two full frames); a queue
            # of up to 200 ms.
            burst = max(2 * 1514, int(rate_bps / 8 * 0.002))
            _cmd(["tc", "-n", ns, "qdisc", "replace", "dev", "eth0", "root", "tbf",
                  "rate", f"{int(rate_bps)}bit", "burst", str(burst), "latency", "200ms"])
        if line:
            if loss_pct:
                self._set_gso_segs(host, 1)
            self._start_line(host, delay_ms, jitter_ms, loss_pct)
        else:
            self._stop_line(host, keep_topology=False)

    def _del_root_qdisc(self, ns):
        proc = _cmd(["tc", "-n", ns, "qdisc", "del", "dev", "eth0", "root"], check=False)
        if proc.returncode != 0 and not re.search(r"No such file|handle of zero|[Nn]o qdisc", proc.stderr):
            raise NetnsError(proc.returncode, proc.args, proc.stdout, proc.stderr)

    def _set_gso_segs(self, host, segs):
        """segs None: back to the value eth0 had at creation."""
        ns = self.ns(host)
        if segs is None:
            if host not in self._gso_default:
                return
            segs = self._gso_default.pop(host)
        elif host not in self._gso_default:
            out = _cmd(["ip", "-d", "-n", ns, "link", "show", "dev", "eth0"]).stdout
            m = re.search(r"gso_max_segs (\d+)", out)
            self._gso_default[host] = int(m.group(1)) if m else 65535
        _cmd(["ip", "-n", ns, "link", "set", "dev", "eth0", "gso_max_segs", str(segs)])

    def _start_line(self, host, delay_ms, jitter_ms, loss_pct):
        """Runs the delay line for host: frames host -> bridge go eth0 ->
        vNb -> (delay line) -> vNq -> vNp (on br0); frames bridge -> host go
        vNp -> vNq -> (tc mirred, in the kernel) -> vNb -> eth0."""
        br = self.bridge_ns
        i = self._index_of(host)
        vb, vp, vq = f"v{i}b", f"v{i}p", f"v{i}q"
        old = self._line.pop(host, None)
        if old is not None:
            self._forget_and_kill(old)
            topology = True
        else:
            topology = False
            self._ip("-n", br, "link", "add", vp, "type", "veth", "peer", "name", vq)
            self._ip("-n", br, "link", "set", vq, "up")
            self._ip("-n", br, "link", "set", vp, "up")
            _cmd(["tc", "-n", br, "qdisc", "add", "dev", vq, "ingress"])
            _cmd(["tc", "-n", br, "filter", "add", "dev", vq, "parent", "ffff:", "protocol", "all",
                  "u32", "match", "u32", "0", "0", "action", "mirred", "egress", "redirect", "dev", vb])
        seed = secrets.randbits(32)
        proc = subprocess.Popen(
            ["ip", "netns", "exec", br, sys.executable or "python3", os.path.abspath(__file__),
             "--delay-line", vb, vq, str(delay_ms), str(jitter_ms), str(loss_pct), str(seed)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True, preexec_fn=_preexec())
        proc._netns_own_group = True
        self._procs.append(proc)
        self._line[host] = proc
        # Wait for "ready" (both sockets open) before switching the path.
        ready, _, _ = select.select([proc.stdout], [], [], IP_TIMEOUT)
        first = proc.stdout.readline() if ready else ""
        if first.strip() != "ready":
            self._line.pop(host, None)
            self._forget_and_kill(proc)
            err = proc.stderr.read() if proc.stderr else ""
            raise RuntimeError(f"delay line for {host} did not start: {first!r} {err}")
        if not topology:
            # Now through the delay line: the host's port leaves the bridge,
            # the delay line's joins it.
            self._ip("-n", br, "link", "set", vb, "nomaster")
            self._ip("-n", br, "link", "set", vp, "master", "br0")

    def _stop_line(self, host, keep_topology):
        proc = self._line.pop(host, None)
        if proc is None:
            return
        self._forget_and_kill(proc)
        if not keep_topology:
            br = self.bridge_ns
            i = self._index_of(host)
            # Deleting one end deletes the pair (and vNq's ingress filter).
            self._ip("-n", br, "link", "del", f"v{i}p")
            self._ip("-n", br, "link", "set", f"v{i}b", "master", "br0")

    def _forget_and_kill(self, proc):
        if proc in self._procs:
            self._procs.remove(proc)
        self._kill(proc)
        for f in (proc.stdout, proc.stdin):
            try:
                if f is not None:
                    f.close()
            except Exception:
                pass

    def cut(self, host):
        """The host loses its link: its port on the bridge goes down (its own
        eth0 keeps its address, and shows NO-CARRIER)."""
        _cmd(["ip", "-n", self.bridge_ns, "link", "set", self._bridge_veth(host), "down"])

    def restore(self, host):
        """Brings the host's link back after cut()."""
        _cmd(["ip", "-n", self.bridge_ns, "link", "set", self._bridge_veth(host), "up"])

    # ---- teardown ----------------------------------------------------------

    def _kill(self, proc):
        if proc.poll() is not None:
            return
        try:
            if getattr(proc, "_netns_own_group", False):
                os.killpg(proc.pid, signal.SIGKILL)  # its group: pgid == pid
            else:
                os.kill(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            proc.wait(KILL_WAIT)
        except subprocess.TimeoutExpired:
            print(f"netns: pid {proc.pid} did not exit after SIGKILL", file=sys.stderr)

    def close(self):
        """Kills the processes started with popen() that still run (SIGKILL,
        then wait), deletes every namespace this Network created. Idempotent;
        safe to call again from a signal handler while a close runs."""
        self._closed = True
        while self._procs:
            proc = self._procs.pop()
            self._kill(proc)
            for f in (proc.stdout, proc.stderr, proc.stdin):
                try:
                    if f is not None:
                        f.close()
                except Exception:
                    pass
        # Host namespaces first, the bridge last: deleting the bridge's
        # namespace (no process runs in it) removes the veth pairs with it.
        while self._created:
            name = self._created.pop()
            for attempt in range(3):
                try:
                    _delete_namespace(name)
                    break
                except subprocess.TimeoutExpired:
                    if attempt == 2:
                        print(f"netns: `ip netns del {name}` timed out", file=sys.stderr)
        if self in _open_networks:
            _open_networks.remove(self)
        _uninstall_cleanup()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def wait_reachable(self, host, target, timeout=10.0):
        """Polls until host reaches target (a host name or an address) with
        one ICMP echo, within timeout seconds; returns False if it never
        did. Uses `ping` when installed, else a raw ICMP socket in python3."""
        deadline = time.monotonic() + timeout
        while True:
            if self.ping(host, target, wait=1.0):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)

    def ping(self, host, target, wait=2.0):
        """One ICMP echo from host to target (a host name or an address):
        True if answered within `wait` seconds. `ping -c1 -W` when installed
        (Debian iputils-ping), else the same with a raw socket in python3."""
        addr = self.addr(target) if target in self._index else target
        if shutil.which("ping"):
            argv = ["ping", "-n", "-c1", f"-W{max(1, int(round(wait)))}", addr]
        else:
            argv = [sys.executable or "python3", "-c", _PY_PING, addr, str(wait)]
        return self.run(host, argv, check=False, timeout=wait + 10).returncode == 0


_PY_NO_IPV6 = r"""
import os
for conf in ("all", "default"):
    path = f"/proc/sys/net/ipv6/conf/{conf}/disable_ipv6"
    if os.path.exists(path):
        with open(path, "w") as f:
            f.write("1")
"""


# One ICMP echo through a raw socket (root), for machines without `ping`:
# argv[1] = address, argv[2] = seconds to wait; exit 0 if answered.
_PY_PING = r"""
import os, select, socket, struct, sys, time
addr, wait = sys.argv[1], float(sys.argv[2])
def csum(b):
    if len(b) % 2: b += b"\0"
    s = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    s = (s >> 16) + (s & 0xffff); s += s >> 16
    return ~s & 0xffff
ident, payload = os.getpid() & 0xffff, b"arbor-netns-ping"
hdr = struct.pack("!BBHHH", 8, 0, 0, ident, 1)
pkt = struct.pack("!BBHHH", 8, 0, csum(hdr + payload), ident, 1) + payload
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
try:
    s.sendto(pkt, (addr, 0))
except OSError as e:
    print(f"ping {addr}: {e}", file=sys.stderr); sys.exit(2)
deadline = time.monotonic() + wait
while True:
    left = deadline - time.monotonic()
    if left <= 0 or not select.select([s], [], [], left)[0]:
        print(f"ping {addr}: no answer in {wait}s", file=sys.stderr); sys.exit(1)
    data, src = s.recvfrom(2048)
    ihl = (data[0] & 0x0f) * 4
    typ, code, _, rid, seq = struct.unpack("!BBHHH", data[ihl:ihl + 8])
    if src[0] == addr and typ == 0 and rid == ident and seq == 1:
        sys.exit(0)
"""


# ---- certificates -----------------------------------------------------------

def _serial():
    # Positive, random, at most 20 octets in DER (RFC 5280): 127 random bits
    # with the top one set, so it never starts with a zero octet.
    return "0x%x" % (secrets.randbits(127) | (1 << 126))


def _check_cert_name(name, reserved=()):
    if not isinstance(name, str) or not _CERT_NAME_RE.match(name) or name in reserved or ".." in name:
        raise ValueError(f"bad certificate name {name!r}: a DNS-like name (letters, digits, '.', '-')")


def _genkey(path):
    # genpkey writes PKCS#8 ("BEGIN PRIVATE KEY").
    _cmd(["openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
          "-pkeyopt", "ec_param_enc:named_curve", "-out", path])
    os.chmod(path, 0o600)


def _make_ca(dir, stem, cn):
    """A self-signed EC P-256 CA: dir/stem.pem and dir/stem.key."""
    key = os.path.join(dir, f"{stem}.key")
    pem = os.path.join(dir, f"{stem}.pem")
    cnf = os.path.join(dir, f".{stem}.cnf")
    with open(cnf, "w") as f:
        f.write(
            "[req]\n"
            "distinguished_name = dn\n"
            "prompt = no\n"
            "x509_extensions = v3_ca\n"
            "[dn]\n"
            f"CN = {cn}\n"
            "[v3_ca]\n"
            "basicConstraints = critical, CA:TRUE\n"
            "keyUsage = critical, keyCertSign, cRLSign, digitalSignature\n"
            "subjectKeyIdentifier = hash\n"
            "authorityKeyIdentifier = keyid:always\n"
        )
    try:
        _genkey(key)
        _cmd(["openssl", "req", "-new", "-x509", "-config", cnf, "-key", key, "-sha256",
              "-days", "2", "-set_serial", _serial(), "-out", pem])
    finally:
        os.unlink(cnf)
    return pem, key


def _make_leaf(dir, name, ca_pem, ca_key, ip=None):
    """dir/name.pem and dir/name.key, signed by the CA, for both TLS server
    and client use."""
    key = os.path.join(dir, f"{name}.key")
    pem = os.path.join(dir, f"{name}.pem")
    csr = os.path.join(dir, f".{name}.csr")
    ext = os.path.join(dir, f".{name}.ext")
    san = f"DNS:{name}"
    if ip is not None:
        san += f",IP:{ipaddress.ip_address(str(ip))}"
    with open(ext, "w") as f:
        f.write(
            "[v3_leaf]\n"
            "basicConstraints = critical, CA:FALSE\n"
            "keyUsage = critical, digitalSignature\n"
            "extendedKeyUsage = serverAuth, clientAuth\n"
            f"subjectAltName = {san}\n"
            "subjectKeyIdentifier = hash\n"
            "authorityKeyIdentifier = keyid:always\n"
        )
    try:
        _genkey(key)
        _cmd(["openssl", "req", "-new", "-key", key, "-subj", f"/CN={name}", "-out", csr])
        _cmd(["openssl", "x509", "-req", "-in", csr, "-CA", ca_pem, "-CAkey", ca_key,
              "-set_serial", _serial(), "-days", "2", "-sha256",
              "-extfile", ext, "-extensions", "v3_leaf", "-out", pem])
    finally:
        for p in (csr, ext):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass
    return pem, key


def make_certs(dir, names, ips=None, ca_name="arbor-test-ca"):
    """Creates in dir (made if missing) a CA, ca.pem and ca.key (EC P-256,
    self-signed, CA:TRUE, keyCertSign), and for each name name.pem and
    name.key (EC P-256, PKCS#8) signed by it: CN=name, subjectAltName
    DNS:name plus IP:ips[name] when given, extendedKeyUsage serverAuth and
    clientAuth, CA:FALSE, valid 2 days, random positive serials, SKI/AKI.
    Returns {"ca.pem": path, "ca.key": path, "NAME.pem": path, "NAME.key":
    path, ...}."""
    _require("openssl")
    names = list(names)
    ips = dict(ips or {})
    for n in names:
        _check_cert_name(n, reserved=("ca",))
    unknown = set(ips) - set(names)
    if unknown:
        raise ValueError(f"ips for unknown names {sorted(unknown)}")
    os.makedirs(dir, exist_ok=True)
    ca_pem, ca_key = _make_ca(dir, "ca", ca_name)
    paths = {"ca.pem": ca_pem, "ca.key": ca_key}
    for n in names:
        pem, key = _make_leaf(dir, n, ca_pem, ca_key, ips.get(n))
        paths[f"{n}.pem"] = pem
        paths[f"{n}.key"] = key
    return paths


def make_rogue_cert(dir, name, ip=None):
    """Creates in dir a certificate name.pem/name.key made like make_certs()'
    but signed by a different CA, rogue-ca.pem/rogue-ca.key ("arbor-rogue-ca"):
    for a peer without a valid certificate. Use a name (or dir) that does
    not overwrite a genuine one. Returns {"rogue-ca.pem": path,
    "rogue-ca.key": path, "NAME.pem": path, "NAME.key": path}."""
    _require("openssl")
    _check_cert_name(name, reserved=("ca", "rogue-ca"))
    os.makedirs(dir, exist_ok=True)
    ca_pem, ca_key = _make_ca(dir, "rogue-ca", "arbor-rogue-ca")
    pem, key = _make_leaf(dir, name, ca_pem, ca_key, ip)
    return {"rogue-ca.pem": ca_pem, "rogue-ca.key": ca_key, f"{name}.pem": pem, f"{name}.key": key}


# ---- the delay line (run by shape() as `python3 netns.py --delay-line ...`) --

SOL_PACKET = 263
PACKET_VNET_HDR = 15
PACKET_IGNORE_OUTGOING = 23
PACKET_OUTGOING = 4
ETH_P_ALL = 0x0003
VNET_HDR_LEN = 10  # struct virtio_net_hdr
LINE_LIMIT = 64 << 20  # bytes a delay line holds at most


def _delay_line(in_if, out_if, delay_ms, jitter_ms, loss_pct, seed):
    """Forwards every frame received on in_if out of out_if, delay_ms (plus
    or minus up to jitter_ms, uniform, never reordering) later, dropping
    loss_pct percent of them at random. Frames keep their offload state
    (GSO, partial checksums) through virtio-net headers."""
    import collections
    import errno
    import random

    rng = random.Random(seed)
    delay, jitter, loss = delay_ms / 1000.0, jitter_ms / 1000.0, loss_pct / 100.0

    rx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    rx.setsockopt(SOL_PACKET, PACKET_VNET_HDR, 1)
    try:
        rx.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
    except OSError:
        pass  # before Linux 4.20: the pkttype check below does it
    try:
        rx.setsockopt(socket.SOL_SOCKET, 33, 16 << 20)  # SO_RCVBUFFORCE
    except OSError:
        rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 20)
    rx.bind((in_if, ETH_P_ALL))
    rx.setblocking(False)
    tx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)  # sends only
    tx.setsockopt(SOL_PACKET, PACKET_VNET_HDR, 1)
    tx.bind((out_if, 0))

    queue = collections.deque()  # (release time, frame with its vnet header)
    queued = 0  # bytes in queue
    last = 0.0
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    while True:
        now = time.monotonic()
        while queue and queue[0][0] <= now:
            frame = queue.popleft()[1]
            queued -= len(frame)
            try:
                ethertype = int.from_bytes(frame[VNET_HDR_LEN + 12:VNET_HDR_LEN + 14], "big")
                tx.sendto(frame, (out_if, ethertype))
            except OSError as e:
                # The link is down (cut()), or a full queue: the frame is lost.
                if e.errno not in (errno.ENETDOWN, errno.ENXIO, errno.ENOBUFS, errno.EAGAIN, errno.EMSGSIZE):
                    raise
        timeout = max(0.0, queue[0][0] - time.monotonic()) if queue else None
        try:
            select.select([rx], [], [], timeout)
        except InterruptedError:
            continue
        for _ in range(1024):
            try:
                frame, addr = rx.recvfrom(1 << 18)
            except BlockingIOError:
                break
            except OSError as e:
                if e.errno in (errno.ENETDOWN, errno.ENXIO):
                    break  # reported once when the link goes down
                raise
            if addr[2] == PACKET_OUTGOING:
                continue
            if loss and rng.random() < loss:
                continue
            if queued + len(frame) > LINE_LIMIT:
                continue  # a full queue drops, like a qdisc's limit
            queued += len(frame)
            release = time.monotonic() + delay
            if jitter:
                release += rng.uniform(-jitter, jitter)
            last = max(last, release)
            queue.append((last, frame))


if __name__ == "__main__":
    if len(sys.argv) == 8 and sys.argv[1] == "--delay-line":
        try:
            _delay_line(sys.argv[2], sys.argv[3], float(sys.argv[4]), float(sys.argv[5]),
                        float(sys.argv[6]), int(sys.argv[7]))
        except KeyboardInterrupt:
            pass
    else:
        print("netns.py is a module for the end-to-end tests (see netns_selftest.py)", file=sys.stderr)
        sys.exit(2)
