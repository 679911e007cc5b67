#!/usr/bin/python3
"""Self-test of netns.py (run as root): three hosts a, b, c on one bridge

* namespaces, addresses, lo up; a stale namespace of the same prefix is
  removed first;
* a pings b and c;
* a TCP transfer a -> b, unshaped, then shaped on a's egress (100 Mbit/s,
  10 ms), then with 1 % loss: throughput and connect RTT are printed, not
  asserted;
* cut(b): a no longer reaches b while b keeps its address; restore(b): it
  does again (also for a host with a delay line);
* make_certs: ca.pem verifies b.pem, with the expected extensions; a
  make_rogue_cert certificate does not verify; mutual TLS between the
  namespaces accepts a's certificate and refuses the rogue one;
* close(): processes from popen() killed, no namespace of the prefix left,
  no link added to the root namespace;
* a process holding a Network cleans up on SIGTERM, SIGINT and an uncaught
  exception (atexit); after SIGKILL the next Network removes what it left.

Exits 0 when every check passed."""

import json
import os
import select
import signal
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import netns  # noqa: E402

PY = sys.executable or "python3"
passed = 0


class Failed(Exception):
    pass


def check(cond, what, detail=""):
    global passed
    if not cond:
        raise Failed(f"FAILED: {what}" + (f"\n{detail}" if detail else ""))
    passed += 1
    print(f"  ok: {what}", flush=True)


def root_links():
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True, timeout=30).stdout
    return {line.split(":")[1].strip().split("@")[0] for line in out.splitlines()}


def root_veths():
    out = subprocess.run(["ip", "-o", "link", "show", "type", "veth"], capture_output=True, text=True,
                         check=True, timeout=30).stdout
    return {line.split(":")[1].strip().split("@")[0] for line in out.splitlines()}


def with_prefix(prefix):
    return [n for n in netns.list_namespaces() if n.startswith(prefix + "-")]


# ---- TCP throughput --------------------------------------------------------

SERVER = r"""
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1])))
s.listen(1)
s.settimeout(60)
c, _ = s.accept()
c.settimeout(60)
total = 0
while True:
    d = c.recv(1 << 20)
    if not d:
        break
    total += len(d)
c.sendall(str(total).encode())
c.close()
print(total)
"""

CLIENT = r"""
import json, socket, sys, time
addr, port, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
deadline = time.monotonic() + 10
while True:
    t0 = time.monotonic()
    try:
        c = socket.create_connection((addr, port), timeout=10)
        break
    except ConnectionRefusedError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.05)
rtt = time.monotonic() - t0
c.settimeout(60)
buf = b"\0" * (1 << 20)
t0 = time.monotonic()
sent = 0
while sent < size:
    n = min(len(buf), size - sent)
    c.sendall(buf[:n])
    sent += n
c.shutdown(socket.SHUT_WR)
got = int(c.recv(64))
dt = time.monotonic() - t0
print(json.dumps({"bytes": sent, "received": got, "seconds": dt, "connect_rtt_ms": rtt * 1000}))
"""


def transfer(net, src, dst, port, size):
    server = net.popen(dst, [PY, "-c", SERVER, str(port)])
    result = json.loads(net.run(src, [PY, "-c", CLIENT, net.addr(dst), str(port), str(size)], timeout=90).stdout)
    out, err = server.communicate(timeout=30)
    check(server.returncode == 0 and int(out) == size and result["received"] == size,
          f"{size >> 20} MiB arrived whole at {dst}", err)
    mbit = size * 8 / result["seconds"] / 1e6
    return mbit, result["connect_rtt_ms"]


# ---- TLS -------------------------------------------------------------------

TLS_SERVER = r"""
import socket, ssl, sys
cert, key, ca, port = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(cert, key)
ctx.load_verify_locations(ca)
ctx.verify_mode = ssl.CERT_REQUIRED
s = socket.create_server(("0.0.0.0", port))
s.settimeout(30)
for _ in range(2):
    c, _ = s.accept()
    c.settimeout(10)
    try:
        t = ctx.wrap_socket(c, server_side=True)
        cn = dict(x[0] for x in t.getpeercert()["subject"])["commonName"]
        t.sendall(b"hello " + cn.encode())
        t.close()
        print("accepted", cn, flush=True)
    except (ssl.SSLError, OSError) as e:
        print("refused", type(e).__name__, flush=True)
        c.close()
"""

TLS_CLIENT = r"""
import socket, ssl, sys, time
addr, port, sni, cert, key, ca = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6]
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
ctx.load_verify_locations(ca)
ctx.load_cert_chain(cert, key)
deadline = time.monotonic() + 10
while True:
    try:
        c = socket.create_connection((addr, port), timeout=10)
        break
    except ConnectionRefusedError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.05)
t = ctx.wrap_socket(c, server_hostname=sni)
print(t.recv(100).decode())
"""


def openssl(*args, check_rc=True):
    proc = subprocess.run(["openssl", *args], capture_output=True, text=True, timeout=30)
    if check_rc and proc.returncode != 0:
        raise Failed(f"openssl {' '.join(args)}: {proc.stderr}")
    return proc


def test_certs(net, d):
    print("certificates")
    ips = {h: net.addr(h) for h in ("a", "b", "c")}
    paths = netns.make_certs(d, ["a", "b", "c"], ips=ips)
    expected = {"ca.pem", "ca.key"} | {f"{h}.{ext}" for h in "abc" for ext in ("pem", "key")}
    check(set(paths) == expected and all(os.path.isfile(p) for p in paths.values()),
          f"make_certs returned {sorted(paths)}")
    v = openssl("verify", "-CAfile", paths["ca.pem"], paths["b.pem"], check_rc=False)
    check(v.returncode == 0 and "OK" in v.stdout, "openssl verify -CAfile ca.pem b.pem", v.stdout + v.stderr)
    text = openssl("x509", "-in", paths["b.pem"], "-noout", "-text").stdout
    check("Version: 3" in text, "b.pem is X.509 v3")
    check(f"DNS:b, IP Address:{ips['b']}" in text, f"b.pem subjectAltName DNS:b, IP:{ips['b']}")
    check("Subject: CN = b" in text, "b.pem CN=b")
    check("CA:FALSE" in text, "b.pem basicConstraints CA:FALSE")
    check("TLS Web Server Authentication, TLS Web Client Authentication" in text,
          "b.pem extendedKeyUsage serverAuth, clientAuth")
    check("X509v3 Subject Key Identifier" in text and "X509v3 Authority Key Identifier" in text,
          "b.pem has SKI and AKI")
    check("ASN1 OID: prime256v1" in text, "b.pem key is EC P-256")
    serial = openssl("x509", "-in", paths["b.pem"], "-noout", "-serial").stdout.strip()
    check(serial.startswith("serial=") and not serial.startswith("serial=-") and len(serial) > 20,
          f"b.pem serial positive and random ({serial})")
    ca_text = openssl("x509", "-in", paths["ca.pem"], "-noout", "-text").stdout
    check("CA:TRUE" in ca_text and "Certificate Sign" in ca_text and "Subject: CN = arbor-test-ca" in ca_text,
          "ca.pem CA:TRUE, keyCertSign, CN=arbor-test-ca")
    with open(paths["b.key"]) as f:
        check(f.read().startswith("-----BEGIN PRIVATE KEY-----"), "b.key is PKCS#8")
    check(os.stat(paths["b.key"]).st_mode & 0o077 == 0, "b.key is private (0600)")
    a_serial = openssl("x509", "-in", paths["a.pem"], "-noout", "-serial").stdout.strip()
    check(a_serial != serial, "serials differ")

    rogue = netns.make_rogue_cert(d, "mallory")
    check(set(rogue) == {"rogue-ca.pem", "rogue-ca.key", "mallory.pem", "mallory.key"},
          f"make_rogue_cert returned {sorted(rogue)}")
    v = openssl("verify", "-CAfile", paths["ca.pem"], rogue["mallory.pem"], check_rc=False)
    check(v.returncode != 0, "rogue certificate fails openssl verify -CAfile ca.pem", v.stdout + v.stderr)
    v = openssl("verify", "-CAfile", rogue["rogue-ca.pem"], rogue["mallory.pem"], check_rc=False)
    check(v.returncode == 0, "rogue certificate verifies against rogue-ca.pem", v.stdout + v.stderr)

    # Mutual TLS between the namespaces (Python's ssl, i.e. OpenSSL): a's
    # certificate is accepted, the rogue one refused.
    port = "4433"
    server = net.popen("b", [PY, "-c", TLS_SERVER, paths["b.pem"], paths["b.key"], paths["ca.pem"], port])
    good = net.run("a", [PY, "-c", TLS_CLIENT, net.addr("b"), port, net.addr("b"),
                         paths["a.pem"], paths["a.key"], paths["ca.pem"]], check=False, timeout=30)
    check(good.returncode == 0 and good.stdout.strip() == "hello a",
          "mutual TLS a -> b (server checked by IP SAN) accepted", good.stdout + good.stderr)
    bad = net.run("a", [PY, "-c", TLS_CLIENT, net.addr("b"), port, "b",
                        rogue["mallory.pem"], rogue["mallory.key"], paths["ca.pem"]], check=False, timeout=30)
    out, err = server.communicate(timeout=30)
    check(bad.returncode != 0 and out.split("\n")[0] == "accepted a" and out.split("\n")[1].startswith("refused"),
          "mutual TLS with the rogue client certificate refused", out + err + bad.stderr[-300:])


# ---- cleanup in another process -----------------------------------------

CHILD = r"""
import sys, time
sys.path.insert(0, sys.argv[1])
import netns
net = netns.Network(["x", "y"], subnet="10.78.0")
net.popen("x", ["sleep", "300"])
print(net.prefix, flush=True)
if sys.argv[2] == "raise":
    raise RuntimeError("uncaught on purpose")
time.sleep(60)
"""


def child_cleanup(how):
    child = subprocess.Popen([PY, "-c", CHILD, HERE, how], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, start_new_session=True)
    try:
        ready, _, _ = select.select([child.stdout], [], [], 30)
        prefix = child.stdout.readline().strip() if ready else ""
        if not prefix:
            child.kill()
            raise Failed(f"child did not start: {child.communicate(timeout=10)[1]}")
        left = with_prefix(prefix)
        if how == "raise":
            child.wait(30)
        else:
            check(len(left) == 3, f"[{how}] child's Network up ({prefix}: {len(left)} namespaces)")
            os.kill(child.pid, {"SIGTERM": signal.SIGTERM, "SIGINT": signal.SIGINT, "SIGKILL": signal.SIGKILL}[how])
            child.wait(30)
        return prefix, child.returncode
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
        child.stdout.close()
        child.stderr.close()


def test_child_cleanup():
    print("cleanup when the process holding a Network ends")
    for how in ("SIGTERM", "SIGINT", "raise"):
        prefix, rc = child_cleanup(how)
        check(with_prefix(prefix) == [], f"[{how}] exit status {rc}; no namespace {prefix}-* left")
    prefix, rc = child_cleanup("SIGKILL")
    left = with_prefix(prefix)
    check(len(left) == 3, f"[SIGKILL] exit status {rc}; its {len(left)} namespaces stay (no cleanup possible)")
    with netns.Network(["z"], subnet="10.79.0"):
        pass
    check(with_prefix(prefix) == [], f"[SIGKILL] the next Network removed {prefix}-* (process gone)")


# ---- main ------------------------------------------------------------------

def main():
    if os.geteuid() != 0:
        print("netns_selftest.py needs root", file=sys.stderr)
        return 1
    links_before = root_links()
    veths_before = root_veths()
    prefix = f"arb{os.getpid()}"
    print(f"network ({prefix}-*)")
    # A leftover of an earlier run with the same prefix.
    subprocess.run(["ip", "netns", "add", f"{prefix}-stale"], check=True, timeout=30)
    with netns.Network(["a", "b", "c"]) as net:
        check(net.prefix == prefix, f"default prefix {net.prefix}")
        check(f"{prefix}-stale" not in netns.list_namespaces(), "stale namespace of the same prefix deleted")
        names = sorted(with_prefix(prefix))
        check(names == sorted([f"{prefix}-{h}" for h in ("a", "b", "c", "br")]), f"namespaces {names}")
        for i, h in enumerate(("a", "b", "c")):
            check(net.ns(h) == f"{prefix}-{h}" and net.addr(h) == f"10.77.0.{i + 2}", f"{h}: {net.ns(h)} {net.addr(h)}")
            addrs = net.run(h, ["ip", "-o", "-4", "addr", "show", "dev", "eth0"]).stdout
            check(f"inet 10.77.0.{i + 2}/24" in addrs, f"{h}: eth0 has 10.77.0.{i + 2}/24")
            lo = net.run(h, ["ip", "-o", "link", "show", "lo"]).stdout
            check("UP" in lo.split("<")[1].split(">")[0], f"{h}: lo is up")
        sleeper = net.popen("c", ["sleep", "300"])

        print(f"reachability ({'ping -c1 -W2' if netns.shutil.which('ping') else 'no ping installed: ICMP echo from python3'})")
        check(net.ping("a", "b"), "a pings b")
        check(net.ping("a", "c"), "a pings c")
        check(net.ping("c", "a"), "c pings a")

        print("TCP a -> b")
        mbit, rtt = transfer(net, "a", "b", 5001, 256 << 20)
        print(f"  unshaped: {mbit:.0f} Mbit/s, connect RTT {rtt:.2f} ms")
        net.shape("a", rate_mbit=100, delay_ms=10)
        qdisc = net.run("a", ["tc", "qdisc", "show", "dev", "eth0"]).stdout
        check("netem" in qdisc or "tbf" in qdisc, f"shape(a, rate_mbit=100, delay_ms=10): {qdisc.strip()}")
        mbit, rtt = transfer(net, "a", "b", 5002, 16 << 20)
        print(f"  shaped a (100 Mbit/s, 10 ms): {mbit:.1f} Mbit/s, connect RTT {rtt:.2f} ms")
        net.shape("a", delay_ms=10, loss_pct=1.0)
        mbit, rtt = transfer(net, "a", "b", 5003, 4 << 20)
        print(f"  shaped a (10 ms, 1% loss): {mbit:.1f} Mbit/s, connect RTT {rtt:.2f} ms")
        net.shape("a", delay_ms=5, jitter_ms=2)
        mbit, rtt = transfer(net, "a", "b", 5004, 16 << 20)
        print(f"  shaped a (5 ms +- 2 ms): {mbit:.1f} Mbit/s, connect RTT {rtt:.2f} ms")

        print("cut / restore")
        net.cut("b")
        check(not net.ping("a", "b", wait=1), "cut(b): a no longer reaches b")
        b_addr = net.run("b", ["ip", "-o", "-4", "addr", "show", "dev", "eth0"]).stdout
        b_link = net.run("b", ["ip", "-o", "link", "show", "dev", "eth0"]).stdout
        check("10.77.0.3/24" in b_addr and "NO-CARRIER" in b_link, "b keeps its address; its eth0 has no carrier")
        check(net.ping("a", "c"), "a still reaches c")
        net.restore("b")
        check(net.wait_reachable("a", "b", timeout=10), "restore(b): a reaches b again")
        net.cut("a")  # a has a shape (a delay line without netem)
        check(not net.ping("a", "b", wait=1), "cut(a) with a shaped: a no longer reaches b")
        net.restore("a")
        check(net.wait_reachable("a", "b", timeout=10), "restore(a): a reaches b again")
        net.shape("a")
        qdisc = net.run("a", ["tc", "qdisc", "show", "dev", "eth0"]).stdout
        bridge_links = netns._cmd(["ip", "-n", net.bridge_ns, "-o", "link", "show"]).stdout
        check("netem" not in qdisc and "tbf" not in qdisc and "v0p" not in bridge_links,
              f"shape(a) with no arguments removes the shaping ({qdisc.strip()})")
        check(net.ping("a", "b"), "a pings b unshaped")

        with tempfile.TemporaryDirectory(prefix="arbor-netns-certs-") as d:
            test_certs(net, d)

    print("after close()")
    check(sleeper.returncode == -signal.SIGKILL, f"popen()'s sleep killed (returncode {sleeper.returncode})")
    check(with_prefix(prefix) == [], f"no namespace {prefix}-* left")
    check(root_veths() == veths_before and root_links() == links_before,
          f"root namespace links unchanged ({sorted(root_links())})")
    net.close()  # idempotent
    check(True, "close() again is harmless")

    test_child_cleanup()
    check(root_veths() == veths_before and root_links() == links_before, "root namespace links still unchanged")
    print(f"{passed} passed, 0 failed")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Failed as e:
        print(e, file=sys.stderr)
        print(f"{passed} passed, 1 failed")
        sys.exit(1)
