#!/usr/bin/env bash
# Runs every end-to-end test against the debug build of arbor. Part of the
# README's test command; needs root (mount) and the Debian packages .ci/run installs.
set -euo pipefail
cd "$(dirname "$0")"
status=0
for test in nbd_clients.py filesystem.py origin_ext4.py kill9.py full_pool.py flood.py send_receive.py ceph_interop.py backup_s3.py replication.py dashboard.py monitoring.py package.py journal.py; do
  echo "== e2e: $test"
  /usr/bin/python3 "$test" || status=1
done
exit $status
