#!/usr/bin/env bash
# The scrub's rate on an idle pool against the device's sequential read
# rate, measured on the same file in the same run (issue 40's figure: at
# least 80 %): a pool file with a volume filled by 1 MiB writes; then, in
# each of ROUNDS rounds (default 3), with the page cache dropped before
# each read (needs root): fio reads the pool file sequentially (1 MiB,
# QD8, libaio, direct unless FIO_DIRECT=0), once into its default buffers
# and once into huge pages (hugetlbfs, set up here and put back after: the
# device's best, since the scrub's own buffers are huge pages), and
# `arbor scrub start` reads every live chunk and checks the metadata. The
# scrub's time is the daemon's own, from its "scrub started" to its "scrub
# finished" log line (the CLI's wait polls five times a second). Prints
# each round and the median of the scrub against the faster fio.
#
#   [ROUNDS=N] [SERVE_ARGS="--io direct"] bench/scrub.sh ARBOR_BINARY [VOLUME_SIZE]
set -euo pipefail
bin=${1:?arbor binary}
vsize=${2:-2G}
rounds=${ROUNDS:-3}
work=$(mktemp -d /var/tmp/arbor-scrub-XXXXXX)
pid=
hugepages=$(cat /proc/sys/vm/nr_hugepages)
cleanup() {
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  if mountpoint -q "$work/huge" 2>/dev/null; then umount "$work/huge"; fi
  echo "$hugepages" >/proc/sys/vm/nr_hugepages 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
"$bin" serve ${SERVE_ARGS:-} --data-dir "$work" --pool-size 4G --initial-volume none \
  --nbd-listen none --api-listen none >/dev/null 2>"$work/log" &
pid=$!
for _ in $(seq 200); do [ -S "$work/api.sock" ] && [ -S "$work/nbd.sock" ] && break; sleep 0.05; done
"$bin" --data-dir "$work" volume create v --size "$vsize" >/dev/null
fio --name=fill --ioengine=nbd --uri="nbd+unix:///v?socket=$work/nbd.sock" --rw=write \
  --bs=1M --iodepth=8 --size="$vsize" --refill_buffers --end_fsync=1 >/dev/null 2>&1
"$bin" --data-dir "$work" pool flush >/dev/null
# Huge pages for fio's buffers: QD8 of 1 MiB, in 2 MiB pages, and spare.
huge=
mkdir "$work/huge"
if echo $((hugepages + 8)) >/proc/sys/vm/nr_hugepages 2>/dev/null &&
  mount -t hugetlbfs none "$work/huge" 2>/dev/null; then
  huge="--mem=mmaphuge:$work/huge/fio"
else
  echo "no hugetlbfs here: fio reads into its default buffers only" >&2
fi
drop() { sync; echo 3 >/proc/sys/vm/drop_caches; }
fio_rate() {
  drop
  fio --name=seq --filename="$work/pool" --rw=read --bs=1M --iodepth=8 \
    --ioengine=libaio --direct="${FIO_DIRECT:-1}" --size="$vsize" --output-format=json "$@" 2>/dev/null |
    sed -n '/^{/,$p' |
    /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["jobs"][0]["read"]["bw"] * 1024)'
}
results=()
for round in $(seq "$rounds"); do
  plain=$(fio_rate)
  if [ -n "$huge" ]; then huged=$(fio_rate "$huge"); else huged=0; fi
  drop
  "$bin" --data-dir "$work" scrub start --wait >/dev/null
  took=$(/usr/bin/python3 - "$work/log" <<'PY'
import datetime, sys
times = [datetime.datetime.strptime(l[:26], "%Y-%m-%dT%H:%M:%S.%f")
         for l in open(sys.argv[1]) if "scrub started" in l or "scrub finished" in l]
print((times[-1] - times[-2]).total_seconds())
PY
)
  read_bytes=$("$bin" --data-dir "$work" scrub status --json |
    /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["bytes_read"])')
  results+=("$plain $huged $read_bytes $took")
done
drop
cstart=$(date +%s.%N)
"$bin" --data-dir "$work" check >/dev/null
cend=$(date +%s.%N)
echo "arbor check alone (the scrub's metadata part): $(/usr/bin/python3 -c "print(f'{$cend - $cstart:.2f}')") s"
/usr/bin/python3 - "${results[@]}" <<'PY'
import statistics, sys
mib = 1 << 20
ratios = []
for i, r in enumerate(sys.argv[1:], 1):
    plain, huge, read, took = (float(x) for x in r.split())
    rate = read / took
    best = max(plain, huge)
    ratios.append(rate / best)
    print(f"round {i}: fio {plain / mib:.0f} MiB/s, fio into huge pages {huge / mib:.0f} MiB/s; "
          f"scrub {read / mib:.0f} MiB in {took:.2f} s = {rate / mib:.0f} MiB/s: "
          f"{rate / best:.2f}x of the faster fio")
print(f"scrub against the faster fio, median of {len(ratios)}: {statistics.median(ratios):.2f}x")
PY
