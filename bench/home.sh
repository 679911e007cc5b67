#!/usr/bin/env bash
# Time to create copy-on-write volumes (`volume create --layout cow`), whose
# home is set aside and zeroed before the volume appears, on a fresh pool
# file with the page cache dropped first. Figures quoted in
# docs/PERFORMANCE.md ("What changed") come from this script.
#
#   bench/home.sh [BINARY] [SIZE ...]     # default: target/release/arbor, 1G 4G
set -euo pipefail
bin=${1:-target/release/arbor}
shift || true
if [ $# -gt 0 ]; then sizes=("$@"); else sizes=(1G 4G); fi
work=$(mktemp -d /var/tmp/arbor-home-XXXXXX)
pid=
cleanup() {
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
"$bin" serve --data-dir "$work" --pool-size 20G --initial-volume none \
  --nbd-listen none --api-listen none >/dev/null 2>"$work.log" &
pid=$!
for _ in $(seq 200); do [ -S "$work/api.sock" ] && break; sleep 0.05; done
sync
echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || echo "(page cache not dropped: not root)"
for size in "${sizes[@]}"; do
  t0=$(date +%s.%N)
  "$bin" --data-dir "$work" volume create "c$size" --size "$size" --layout cow >/dev/null
  t1=$(date +%s.%N)
  echo "create --layout cow $size: $(echo "$t1 - $t0" | bc) s"
done
echo "pool file: $(du -h --apparent-size "$work/pool" | cut -f1) apparent, $(du -h "$work/pool" | cut -f1) allocated"
