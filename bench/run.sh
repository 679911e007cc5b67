#!/bin/sh
# The one benchmark command: installs what is missing (Debian packages, as
# root), builds arbor in release mode, runs every experiment against every
# peer, and writes bench/results/<profile>-<time>/{results.json,report.md,*.png}.
#
#   bench/run.sh            # quick profile, about 15 minutes on 2 cores
#   bench/run.sh full       # full profile (about an hour), includes engine-bench
#   bench/run.sh quick --only exp1,exp3   # extra arguments go to bench.py
set -eu
cd "$(dirname "$0")/.."
profile=${1:-quick}
[ $# -gt 0 ] && shift
missing=""
for t in fio:fio qemu-nbd:qemu-utils qemu-img:qemu-utils nbdkit:nbdkit nbdinfo:libnbd-bin; do
    command -v "${t%%:*}" >/dev/null 2>&1 || missing="$missing ${t#*:}"
done
/usr/bin/python3 -c 'import nbd' 2>/dev/null || missing="$missing python3-libnbd"
/usr/bin/python3 -c 'import matplotlib' 2>/dev/null || missing="$missing python3-matplotlib"
if [ -n "$missing" ]; then
    echo "installing:$missing" >&2
    apt-get update -qq && apt-get install -y -qq $missing >/dev/null
fi
cargo build --release --locked -p arbor -p arbor-bench
exec /usr/bin/python3 bench/bench.py --profile "$profile" "$@"
