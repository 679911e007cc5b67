#!/usr/bin/env bash
# First writes into a fresh thin volume, arbor builds against `nbdkit file`
# on a sparse file, alternating in each round so drift in the machine's
# state hits all alike: the "4K first writes QD32" job of bench.py
# (experiment 1): one 4 KiB write per 64 KiB of the volume, random order,
# each once, fio's nbd engine at queue depth 32 over a Unix socket, one
# flush at the end. Each arbor build gets a new daemon, pool and volume;
# nbdkit a new sparse file. Prints one line per system and round, with
# arbor's ratio to the nbdkit run of the same round. Figures quoted in
# docs/PERFORMANCE.md § 18 ("First writes into holes") come from it.
#
#   bench/first_writes.sh ARBOR_BINARY [ARBOR_BINARY ...]
#
# ROUNDS (3), SIZE (volume, 512M), IO (bytes written: SIZE / 16), POOL
# (2G) change the run; FSYNC=0 drops the closing flush (the writes alone);
# SERVE_ARGS adds arguments to each daemon's `serve` (e.g. "--io direct");
# JOBOPTS replaces the job's placement (default --blockalign=64k), e.g.
# JOBOPTS="--time_based --runtime=3" IO=100G for random writes over the
# fresh volume for 3 s.
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: $0 ARBOR_BINARY [ARBOR_BINARY ...]" >&2; exit 2; }
rounds=${ROUNDS:-3}
size=${SIZE:-512M}
io=${IO:-}
if [ -z "$io" ]; then
  io=$(( $(numfmt --from=iec "$size") / 16 ))
fi
work=$(mktemp -d /var/tmp/arbor-first-XXXXXX)
pid=
nbdkit_pid=
cleanup() {
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  if [ -n "$nbdkit_pid" ]; then kill "$nbdkit_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

# fio's IOPS for the job at URI (the closing flush counts in its run time).
job() {
  local -a place
  read -r -a place <<<"${JOBOPTS:---blockalign=64k}"
  fio --name=j --ioengine=nbd --uri="$1" --rw=randwrite --bs=4k --iodepth=32 \
    --size="$size" --io_size="$io" "${place[@]}" --end_fsync="${FSYNC:-1}" \
    --randseed=1 --invalidate=0 --output-format=json 2>/dev/null | sed -n '/^{/,$p' |
    /usr/bin/python3 -c 'import json, sys; print(round(json.load(sys.stdin)["jobs"][0]["write"]["iops"]))'
}

for round in $(seq "$rounds"); do
  declare -A iops=()
  n=0
  for bin in "$@"; do
    n=$((n + 1))
    d=$work/arbor; rm -rf "$d"; mkdir -p "$d"
    # shellcheck disable=SC2086
    "$bin" serve ${SERVE_ARGS:-} --data-dir "$d" --pool-size "${POOL:-2G}" --initial-volume none \
      --nbd-listen none --api-listen none >/dev/null 2>"$work/serve.log" &
    pid=$!
    for _ in $(seq 200); do [ -S "$d/api.sock" ] && [ -S "$d/nbd.sock" ] && break; sleep 0.05; done
    "$bin" --data-dir "$d" volume create v --size "$size" >/dev/null
    iops[$n]=$(job "nbd+unix:///v?socket=$d/nbd.sock")
    kill "$pid"; wait "$pid" || true; pid=
  done
  f=$work/file; rm -f "$f"; truncate -s "$size" "$f"
  nbdkit -U "$work/nbdkit.sock" -P "$work/nbdkit.pid" file "$f"
  for _ in $(seq 100); do [ -s "$work/nbdkit.pid" ] && [ -S "$work/nbdkit.sock" ] && break; sleep 0.05; done
  nbdkit_pid=$(cat "$work/nbdkit.pid")
  base=$(job "nbd+unix:///?socket=$work/nbdkit.sock")
  kill "$nbdkit_pid"; nbdkit_pid=
  for _ in $(seq 100); do [ -e "$work/nbdkit.sock" ] || break; sleep 0.05; done
  rm -f "$work/nbdkit.sock" "$work/nbdkit.pid"
  echo "round $round"
  printf '  %-40s %8s IOPS\n' "nbdkit file" "$base"
  n=0
  for bin in "$@"; do
    n=$((n + 1))
    printf '  %-40s %8s IOPS  %sx nbdkit file\n' "$bin" "${iops[$n]}" \
      "$(/usr/bin/python3 -c "print(f'{${iops[$n]} / $base:.2f}')")"
  done
  unset iops
done
