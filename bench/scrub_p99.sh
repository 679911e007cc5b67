#!/usr/bin/env bash
# Foreground latency while a scrub runs (issue 40's figure: p99 within
# 1.2x of an idle pool): a pool file with a volume filled by 1 MiB writes;
# then fio's 4 KiB random reads and writes at QD1 through NBD (libnbd
# engine), each for SECONDS, idle, while `arbor scrub start` runs at its
# busy pace (`scrub_busy_rate`, 32 MiB/s by default), and idle again.
# Prints each phase's p50/p99/p99.9 completion latency and the scrub
# phase's p99 against the mean of the two idle ones.
#
# ROUNDS=N (default 1) alternates N scrub phases with N + 1 idle ones
# (the scrub stopped in between: it goes on from where it stood), so that
# drift in the machine's state hits both alike; each scrub phase is set
# against the idle phases on either side of it, and the median ratio of
# the rounds is printed too, with the scrub's rate in each scrub phase.
#
#   bench/scrub_p99.sh ARBOR_BINARY [VOLUME_SIZE (6G)] [SECONDS (30)]
#   SERVE_ARGS="--io direct" bench/scrub_p99.sh ...   (the daemon on O_DIRECT)
#   POOL_SIZE (default 8G) must hold the volume. The scrub must still be
#   running when the scrub phase ends (at 32 MiB/s, 2 x SECONDS x 32 MiB of
#   data at least): the script says if it was not.
set -euo pipefail
bin=${1:?arbor binary}
vsize=${2:-6G}
secs=${3:-30}
work=$(mktemp -d /var/tmp/arbor-scrub-p99-XXXXXX)
pid=
cleanup() {
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
"$bin" serve ${SERVE_ARGS:-} --data-dir "$work" --pool-size "${POOL_SIZE:-8G}" --initial-volume none \
  --nbd-listen none --api-listen none >/dev/null 2>"$work/log" &
pid=$!
for _ in $(seq 200); do [ -S "$work/api.sock" ] && [ -S "$work/nbd.sock" ] && break; sleep 0.05; done
arbor() { "$bin" --data-dir "$work" "$@"; }
arbor volume create v --size "$vsize" >/dev/null
uri="nbd+unix:///v?socket=$work/nbd.sock"
fio --name=fill --ioengine=nbd --uri="$uri" --rw=write --bs=1M --iodepth=8 --size="$vsize" \
  --refill_buffers --end_fsync=1 >/dev/null 2>&1
arbor pool flush >/dev/null
# One phase: random reads, then random writes, each for $secs; prints
# "rw p50 p99 p999" (microseconds) per job.
phase() {
  for rw in randread randwrite; do
    fio --name="$rw" --ioengine=nbd --uri="$uri" --rw="$rw" --bs=4k --iodepth=1 \
      --time_based --runtime="$secs" --size="$vsize" --randrepeat=0 \
      --percentile_list=50:99:99.9 --output-format=json 2>/dev/null | sed -n '/^{/,$p' |
      /usr/bin/python3 -c '
import json, sys
job = json.load(sys.stdin)["jobs"][0]
side = job["read"] if job["read"]["io_bytes"] else job["write"]
p = side["clat_ns"]["percentile"]
print(sys.argv[1], *(f"{p[k] / 1000:.1f}" for k in ("50.000000", "99.000000", "99.900000")))
' "$rw"
  done
}
rounds=${ROUNDS:-1}
phases=("$(phase)")
states=()
scrub_read() {
  arbor scrub status --json | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin).get("bytes_read", 0))'
}
rates=()
for _ in $(seq "$rounds"); do
  arbor scrub start >/dev/null
  t0=$(date +%s.%N)
  b0=$(scrub_read)
  phases+=("$(phase)")
  states+=("$(arbor scrub status --json | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["state"])')")
  rates+=("$(echo "($(scrub_read) - $b0) / ($(date +%s.%N) - $t0) / 1048576" | bc -l)")
  arbor scrub stop >/dev/null 2>&1 || true
  phases+=("$(phase)")
done
/usr/bin/python3 - "${states[*]}" "${rates[*]}" "${phases[@]}" <<'PY'
import statistics, sys
def parse(text):
    return {f[0]: [float(x) for x in f[1:]] for f in (l.split() for l in text.splitlines())}
states = sys.argv[1].split()
rates = [float(r) for r in sys.argv[2].split()]
phases = [parse(t) for t in sys.argv[3:]]
print("completion latency, microseconds: p50 / p99 / p99.9")
ratios = {"randread": [], "randwrite": []}
for rw in ("randread", "randwrite"):
    for i, d in enumerate(phases):
        name = "scrub running" if i % 2 else "idle"
        print(f"  {rw:9} {name:14} {' / '.join(f'{x:.1f}' for x in d[rw])}")
    for i in range(1, len(phases), 2):
        base = (phases[i - 1][rw][1] + phases[i + 1][rw][1]) / 2
        ratios[rw].append(phases[i][rw][1] / base)
    print(f"  {rw:9} p99 with the scrub against the idle phases around it: "
          + ", ".join(f"{r:.2f}x" for r in ratios[rw])
          + (f" (median {statistics.median(ratios[rw]):.2f}x)" if len(ratios[rw]) > 1 else ""))
print("the scrub's rate during the scrub phases: " + ", ".join(f"{r:.1f}" for r in rates) + " MiB/s")
late = [s for s in states if s != "running"]
print("the scrub was running at the end of every scrub phase" if not late else
      f"the scrub was {', '.join(states)} at the ends of the scrub phases (it ended early: use a larger volume)")
PY
