#!/usr/bin/env bash
# A/B of two arbor builds on the data path, alternating runs so drift in the
# machine's state hits both alike: for each build, a 512 MiB volume filled
# with 1 MiB writes, then fio's nbd engine over the Unix socket, 5 s per job:
# one connection (queue depth 1, then deeper), then four at once (fio --numjobs=4, QD8 each), for changes
# to how connections share the daemon's threads.
# Prints one line per build, job and round. Figures quoted in
# docs/PERFORMANCE.md ("What changed") come from this script.
#
#   bench/ab.sh OLD_BINARY NEW_BINARY [ROUNDS]
#
# OLD_SERVE_ARGS and NEW_SERVE_ARGS add arguments to each build's `serve`,
# for an A/B of a setting with one binary, e.g. polling off against on:
#   printf 'nbd_poll = "0s"\n' > /tmp/nopoll.toml
#   OLD_SERVE_ARGS="--config /tmp/nopoll.toml" bench/ab.sh B B
#
# SNAPSHOT=1 snapshots the volume before each job, so its writes land in
# chunks a snapshot shares (the first write to each makes a partial extent,
# later ones extend it). JOBS replaces the job list: entries of "rw bs qd
# connections" separated by ";", e.g. JOBS="randwrite 4k 32 1".
#
# OLD_FORMAT and NEW_FORMAT create each build's pool at that format
# version first (`pool create --format-version`), for an A/B of a format
# feature with one binary, e.g. data checksums (version 10) against none:
#   OLD_FORMAT=9 bench/ab.sh B B
#
# LAYOUT=cow creates the volume as a copy-on-write volume with its home in
# the pool (`volume create --layout cow`), for an A/B of that write path,
# e.g. its checksums against none: LAYOUT=cow OLD_FORMAT=9 bench/ab.sh B B
#
# POOL sets the pool's size (default 2G): jobs that write much under
# SNAPSHOT=1 need more, each snapshot pinning what the next job rewrites.
#
# Build the old one from another worktree, e.g.
#   git worktree add /tmp/old HEAD~1 && cargo build --release -p arbor --manifest-path /tmp/old/Cargo.toml
set -euo pipefail
old=${1:?old arbor binary}
new=${2:?new arbor binary}
rounds=${3:-2}
# rw, block size, queue depth, connections
jobs=("randread 4k 1 1" "randwrite 4k 1 1" "randread 4k 32 1" "randwrite 4k 32 1"
  "read 1m 8 1" "write 1m 8 1" "randread 4k 8 4" "randwrite 4k 8 4")
if [ -n "${JOBS:-}" ]; then IFS=';' read -r -a jobs <<<"$JOBS"; fi
work=$(mktemp -d /var/tmp/arbor-ab-XXXXXX)
pid=
cleanup() {
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

run_one() { # label binary serve-arguments format-version
  local label=$1 bin=$2 dir="$work/$1"
  local -a extra
  read -r -a extra <<<"$3"
  rm -rf "$dir"
  if [ -n "$4" ]; then
    mkdir -p "$dir"
    "$bin" pool create "$dir/pool" --size "${POOL:-2G}" --format-version "$4" >/dev/null
  fi
  "$bin" serve "${extra[@]}" --data-dir "$dir" --pool-size "${POOL:-2G}" --initial-volume none \
    --nbd-listen none --api-listen none >/dev/null 2>"$work/$label.log" &
  pid=$!
  for _ in $(seq 200); do [ -S "$dir/api.sock" ] && [ -S "$dir/nbd.sock" ] && break; sleep 0.05; done
  local -a layout=()
  if [ -n "${LAYOUT:-}" ]; then layout=(--layout "$LAYOUT"); fi
  "$bin" --data-dir "$dir" volume create v --size 512M "${layout[@]}" >/dev/null
  local uri="nbd+unix:///v?socket=$dir/nbd.sock"
  fio --name=fill --ioengine=nbd --uri="$uri" --rw=write --bs=1M --iodepth=8 \
    --size=512M --end_fsync=1 >/dev/null 2>&1
  local n=0
  for job in "${jobs[@]}"; do
    read -r rw bs qd conns <<<"$job"
    n=$((n + 1))
    if [ -n "${SNAPSHOT:-}" ]; then
      "$bin" --data-dir "$dir" snapshot create "v@j$n" >/dev/null
    fi
    fio --name=j --ioengine=nbd --uri="$uri" --rw="$rw" --bs="$bs" --iodepth="$qd" \
      --numjobs="$conns" --group_reporting \
      --size=512M --time_based --runtime=5 --randrepeat=1 --end_fsync=1 \
      --output-format=json 2>/dev/null | sed -n '/^{/,$p' |
      /usr/bin/python3 -c '
import json, sys
j = json.load(sys.stdin)["jobs"][0]
iops = j["read"]["iops"] + j["write"]["iops"]
mib = (j["read"]["bw"] + j["write"]["bw"]) / 1024
print(f"{sys.argv[1]:4} {sys.argv[2]:10} {sys.argv[3]:3} QD{sys.argv[4]:3} x{sys.argv[5]} {iops:10.0f} IOPS {mib:8.0f} MiB/s")
' "$label" "$rw" "$bs" "$qd" "$conns"
  done
  kill "$pid"; wait "$pid" || true; pid=
}

for round in $(seq "$rounds"); do
  echo "round $round"
  run_one old "$old" "${OLD_SERVE_ARGS:-}" "${OLD_FORMAT:-}"
  run_one new "$new" "${NEW_SERVE_ARGS:-}" "${NEW_FORMAT:-}"
done
