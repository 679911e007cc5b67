#!/usr/bin/env bash
# Several clients at once: four NBD connections (fio --numjobs=4) at QD8
# each, 4 KiB random reads then writes, 5 s each, on a 512 MiB filled
# volume. Complements bench/ab.sh (one connection) when a change touches
# how connections share the daemon's threads (docs/PERFORMANCE.md, "What
# changed").
#
#   bench/connections.sh ARBOR_BINARY [LABEL]
set -euo pipefail
bin=${1:?arbor binary}
label=${2:-arbor}
work=$(mktemp -d /var/tmp/arbor-conns-XXXXXX)
dir="$work/data"
pid=
cleanup() {
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
"$bin" serve --data-dir "$dir" --pool-size 2G --initial-volume none \
  --nbd-listen none --api-listen none >/dev/null 2>"$work/serve.log" &
pid=$!
for _ in $(seq 200); do [ -S "$dir/api.sock" ] && [ -S "$dir/nbd.sock" ] && break; sleep 0.05; done
"$bin" --data-dir "$dir" volume create v --size 512M >/dev/null
uri="nbd+unix:///v?socket=$dir/nbd.sock"
fio --name=fill --ioengine=nbd --uri="$uri" --rw=write --bs=1M --iodepth=8 \
  --size=512M --end_fsync=1 >/dev/null 2>&1
for rw in randread randwrite; do
  fio --name=j --ioengine=nbd --uri="$uri" --rw="$rw" --bs=4k --iodepth=8 --numjobs=4 \
    --group_reporting --size=512M --time_based --runtime=5 --randrepeat=1 \
    --output-format=json 2>/dev/null | sed -n '/^{/,$p' |
    /usr/bin/python3 -c '
import json, sys
j = json.load(sys.stdin)["jobs"][0]
iops = j["read"]["iops"] + j["write"]["iops"]
print(f"{sys.argv[1]:8} {sys.argv[2]:10} 4 connections x QD8 {iops:10.0f} IOPS")
' "$label" "$rw"
done
