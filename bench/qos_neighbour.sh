#!/usr/bin/env bash
# A noisy neighbour and its victim (issue 44's figures): two volumes of one
# pool, through NBD (fio's libnbd engine, the daemon's Unix socket). The
# victim reads 4 KiB at random at queue depth 1 (a database's point
# reads) for SECONDS in each phase:
#
#   alone        nothing else runs
#   noisy        the neighbour writes 4 KiB at random at queue depth 32
#   capped       the same, the neighbour capped (`volume set noisy
#                --max-write-iops CAP`, default 2000)
#   reclaim      nothing else but a large reclaim (a filled volume of
#                RECLAIM_SIZE destroyed just before; reclaim_rate as
#                configured)
#   reclaim+cap  the reclaim and the capped neighbour together
#
# Prints each phase's victim p50/p99/p99.9 (microseconds) and IOPS, the
# neighbour's IOPS, and each p99 against the alone phase's.
#
#   bench/qos_neighbour.sh ARBOR_BINARY [SECONDS (20)] [CAP (2000)]
#   SERVE_ARGS="--io direct" ...; POOL_SIZE (default 8G), RECLAIM_SIZE (3G)
set -euo pipefail
bin=${1:?arbor binary}
secs=${2:-20}
cap=${3:-2000}
work=$(mktemp -d /var/tmp/arbor-qos-XXXXXX)
pid=
noisy_pid=
cleanup() {
  if [ -n "$noisy_pid" ]; then kill "$noisy_pid" 2>/dev/null || true; wait "$noisy_pid" 2>/dev/null || true; fi
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
"$bin" serve ${SERVE_ARGS:-} --data-dir "$work" --pool-size "${POOL_SIZE:-8G}" --initial-volume none \
  --nbd-listen none --api-listen none >/dev/null 2>"$work/log" &
pid=$!
for _ in $(seq 200); do [ -S "$work/api.sock" ] && [ -S "$work/nbd.sock" ] && break; sleep 0.05; done
arbor() { "$bin" --data-dir "$work" "$@"; }
uri() { echo "nbd+unix:///$1?socket=$work/nbd.sock"; }
fill() {
  fio --name=fill --ioengine=nbd --uri="$(uri "$1")" --rw=write --bs=1M --iodepth=8 --size="$2" \
    --refill_buffers --end_fsync=1 >/dev/null 2>&1
}
arbor volume create victim --size 1G >/dev/null
arbor volume create noisy --size 2G >/dev/null
fill victim 1G
fill noisy 2G
arbor pool flush >/dev/null

# The neighbour, in the background for the phase (its IOPS in a file).
noisy_start() {
  fio --name=noisy --ioengine=nbd --uri="$(uri noisy)" --rw=randwrite --bs=4k --iodepth=32 \
    --time_based --runtime="$((secs + 4))" --size=2G --randrepeat=0 --output-format=json \
    >"$work/noisy.json" 2>/dev/null &
  noisy_pid=$!
  sleep 2
}
noisy_done() {
  wait "$noisy_pid" || true
  noisy_pid=
}
noisy_iops() {
  sed -n '/^{/,$p' "$work/noisy.json" | /usr/bin/python3 -c '
import json, sys
print(round(json.load(sys.stdin)["jobs"][0]["write"]["iops"]))'
}
# The victim: "p50 p99 p999 iops".
victim() {
  fio --name=victim --ioengine=nbd --uri="$(uri victim)" --rw=randread --bs=4k --iodepth=1 \
    --time_based --runtime="$secs" --size=1G --randrepeat=0 \
    --percentile_list=50:99:99.9 --output-format=json 2>/dev/null | sed -n '/^{/,$p' |
    /usr/bin/python3 -c '
import json, sys
r = json.load(sys.stdin)["jobs"][0]["read"]
p = r["clat_ns"]["percentile"]
print(*(f"{p[k] / 1000:.1f}" for k in ("50.000000", "99.000000", "99.900000")), round(r["iops"]))'
}
reclaim_start() {
  arbor volume create big --size "${RECLAIM_SIZE:-3G}" >/dev/null
  fill big "${RECLAIM_SIZE:-3G}"
  arbor pool flush >/dev/null
  arbor destroy big >/dev/null
}
pending() {
  arbor pool status --json | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["reclaim_pending"])'
}

declare -A result noisy_rate
result[alone]=$(victim)
noisy_start; result[noisy]=$(victim); noisy_done; noisy_rate[noisy]=$(noisy_iops)
arbor volume set noisy --max-write-iops "$cap" >/dev/null
noisy_start; result[capped]=$(victim); noisy_done; noisy_rate[capped]=$(noisy_iops)
arbor volume set noisy --max-write-iops none >/dev/null
reclaim_start
result[reclaim]=$(victim); reclaim_after=$(pending)
arbor volume set noisy --max-write-iops "$cap" >/dev/null
reclaim_start
noisy_start; result[reclaim+cap]=$(victim); noisy_done; noisy_rate[reclaim+cap]=$(noisy_iops)
reclaim_after_cap=$(pending)

echo "victim: 4 KiB random reads, QD1, ${secs} s a phase; neighbour: 4 KiB random writes, QD32; cap ${cap} write IOPS"
printf '%-12s %9s %9s %9s %8s %10s %9s\n' phase p50_us p99_us p999_us iops noisy_iops p99_ratio
base=$(echo "${result[alone]}" | cut -d' ' -f2)
for phase in alone noisy capped reclaim reclaim+cap; do
  read -r p50 p99 p999 iops <<<"${result[$phase]}"
  printf '%-12s %9s %9s %9s %8s %10s %9.2f\n' "$phase" "$p50" "$p99" "$p999" "$iops" \
    "${noisy_rate[$phase]:--}" "$(echo "$p99 / $base" | bc -l)"
done
echo "reclaim still pending at the end of its phases: ${reclaim_after}, ${reclaim_after_cap} (a phase that ran without reclaim says nothing of it)"
