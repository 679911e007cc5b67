#!/usr/bin/python3
"""Monitoring to import (docs/MONITOR.md §7): the Prometheus rules and the
Grafana dashboard in monitoring/, checked against real tools and a real
daemon.

1. `promtool check rules` and `promtool test rules` (Debian's prometheus
   package): the rules parse, and their unit tests, against series shaped
   like arbor's metrics, say when each alert fires and when it does not.
2. The dashboard is a Grafana dashboard: valid JSON, a unique id per panel,
   a Prometheus query in every panel, every panel placed on the grid.
3. Every metric the rules, their unit tests' series and the dashboard
   name is in a running daemon's /metrics. Two daemons on loopback: a source with a volume written and
   read through NBD, an origin attached (a file), a replication pair to the
   target over TLS that has completed a cycle, and an alert raised (a space
   warning at 1 %), so that every family they name has a member; a name
   that is not there (a metric renamed or dropped) fails the test.

Run from tests/e2e: /usr/bin/python3 monitoring.py (ARBOR_BIN names the
binary; default: the debug build)."""

import json
import os
import re
import shutil
import socket
import subprocess
import tempfile

import nbd
import yaml

from harness import ARBOR, Daemon, Failure, metrics, run, run_test, wait_until

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROMETHEUS = os.path.join(ROOT, "monitoring", "prometheus")
RULES = os.path.join(PROMETHEUS, "arbor-rules.yml")
RULE_TESTS = os.path.join(PROMETHEUS, "arbor-rules.test.yml")
DASHBOARD = os.path.join(ROOT, "monitoring", "grafana", "arbor-dashboard.json")
MIB = 1 << 20
# A metric name in a PromQL expression (recording rules' names have colons).
NAME = re.compile(r"\b(arbor_[a-z0-9_]+)\b")


def check(condition, what):
    if not condition:
        raise Failure(what)


def promtool():
    for args in (["check", "rules", RULES], ["test", "rules", RULE_TESTS]):
        proc = subprocess.run(["promtool", *args], cwd=PROMETHEUS, capture_output=True, text=True)
        check(proc.returncode == 0, f"promtool {' '.join(args)} failed:\n{proc.stdout}{proc.stderr}")


def rule_names():
    """Metric names the rules' expressions use, by rule."""
    with open(RULES) as f:
        rules = yaml.safe_load(f)
    names = {}
    for group in rules["groups"]:
        for rule in group["rules"]:
            label = rule.get("alert") or rule.get("record")
            names[label] = set(NAME.findall(rule["expr"]))
    return names


def dashboard_names():
    """Metric names the dashboard's queries use, by panel title (the
    dashboard's structure checked on the way)."""
    with open(DASHBOARD) as f:
        dash = json.load(f)
    check(dash.get("uid") and dash.get("title"), "the dashboard has no uid or title")
    ids = [p.get("id") for p in dash["panels"]]
    check(len(ids) == len(set(ids)) and None not in ids, f"panel ids not unique: {ids}")
    names = {}
    for panel in dash["panels"]:
        title = panel.get("title")
        grid = panel.get("gridPos", {})
        check(all(k in grid for k in ("x", "y", "w", "h")), f"panel {title!r} is not placed")
        exprs = [t.get("expr", "") for t in panel.get("targets", [])]
        check(exprs and all(exprs), f"panel {title!r} has no query")
        names[title] = set().union(*(NAME.findall(e) for e in exprs))
    for variable in dash["templating"]["list"]:
        if variable["type"] == "query":
            names[f"variable {variable['name']}"] = set(NAME.findall(variable["definition"]))
    return names


def test_series_names():
    """Metric names of the series the rules' unit tests feed them: shaped
    like arbor's, so named as a daemon names them."""
    with open(RULE_TESTS) as f:
        tests = yaml.safe_load(f)
    names = set()
    for case in tests["tests"]:
        for series in case.get("input_series", []):
            names |= set(NAME.findall(series["series"].split("{")[0]))
    return {"the rules' unit tests": names}


def exported(response):
    """The metric names of the samples in a /metrics response."""
    text = response.split("\r\n\r\n", 1)[-1]
    names = set()
    for line in text.splitlines():
        if line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_config(path, lines):
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def body(source):
    promtool()
    wanted = {**rule_names(), **dashboard_names(), **test_series_names()}
    tls = source.tls
    port = source.port
    target = Daemon(pool_size="1G", extra_args=["--config", source.target_config])
    source.cleanups.append(target.close)
    target.start()
    source.cleanups.append(target.stop)

    # NBD I/O on a volume (32 MiB: past 1 % of the pool's data, the space
    # warning's threshold), and its flush.
    source.cli("volume", "create", "v", "--size", "64M")
    # Rate limits (high enough to hold nothing back here).
    source.cli("volume", "set", "v", "--max-write-iops", "100000")
    h = nbd.NBD()
    h.connect_uri(source.uri("v"))
    for i in range(32):
        h.pwrite(bytes([i + 1]) * MIB, i * MIB)
    h.flush()
    check(h.pread(MIB, 5 * MIB) == bytes([6]) * MIB, "read back through NBD")
    h.shutdown()
    # An origin: a file attached in place.
    image = os.path.join(source.dir, "origin.img")
    with open(image, "wb") as f:
        f.truncate(16 * MIB)
    source.cli("origin", "attach", "orig", image)
    # A replication pair that has completed a cycle (a recovery point).
    source.cli("replica", "add", "v", "--target", f"127.0.0.1:{port}", "--identity", "dst",
               "--interval", "1h")
    run(ARBOR, "--data-dir", source.dir, "replica", "run", "v", timeout=180)

    needed = set().union(*wanted.values())
    have = set()

    def all_there():
        nonlocal have
        have = exported(metrics(source)) | exported(metrics(target))
        return needed <= have

    try:
        wait_until(all_there, "every metric the rules and the dashboard name", timeout=60)
    except Failure:
        missing = {where: sorted(n - have) for where, n in wanted.items() if n - have}
        raise Failure(f"metrics named but not exported by a running daemon: {missing}\n"
                      f"exported: {sorted(have)}") from None
    check('kind="data_usage"' in metrics(source), "the space warning raised no alert")


def main():
    work = tempfile.mkdtemp(prefix="arbor-monitoring-")
    tls = os.path.join(work, "tls")
    run(ARBOR, "tls", "init", tls, "--host", "src", "--host", "127.0.0.1")
    run(ARBOR, "tls", "add", tls, "--server", "dst", "--host", "127.0.0.1")
    port = free_port()
    common = [f'tls_ca = "{tls}/ca.pem"', 'replication_timeout = "5s"']
    source_config = os.path.join(work, "source.toml")
    write_config(source_config, common + [
        f'tls_cert = "{tls}/server.pem"', f'tls_key = "{tls}/server-key.pem"',
        'replication_listen = "none"', "space_warning_percent = [1]",
    ])
    target_config = os.path.join(work, "target.toml")
    write_config(target_config, common + [
        f'tls_cert = "{tls}/server-dst.pem"', f'tls_key = "{tls}/server-dst-key.pem"',
        f'replication_listen = "127.0.0.1:{port}"',
        'replication_allow = [{ source = "src", volumes = ["*"], keep = 0 }]',
    ])

    def with_target(daemon):
        daemon.tls, daemon.port, daemon.target_config = tls, port, target_config
        daemon.cleanups.append(lambda: shutil.rmtree(work, ignore_errors=True))
        body(daemon)

    run_test("monitoring", with_target, tools=("promtool",), pool_size="1G",
             extra_args=["--config", source_config])


if __name__ == "__main__":
    main()
