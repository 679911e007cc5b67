#!/usr/bin/env bash
# The scrub's rate on an idle pool against the device's sequential read
# rate, measured on the same file in the same run (issue 40's figure: at
# least 80 %): a pool file with a volume filled by 1 MiB writes; then,
# with the page cache dropped before each (needs root), fio reads the pool
# file sequentially (1 MiB, QD8, buffered, as the daemon reads it), and
# `arbor scrub start --wait` reads every live chunk. Prints both rates and
# their ratio.
#
#   bench/scrub.sh ARBOR_BINARY [VOLUME_SIZE]
set -euo pipefail
bin=${1:?arbor binary}
vsize=${2:-2G}
work=$(mktemp -d /var/tmp/arbor-scrub-XXXXXX)
pid=
cleanup() {
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
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
drop() { sync; echo 3 >/proc/sys/vm/drop_caches; }
drop
fio_rate=$(fio --name=seq --filename="$work/pool" --rw=read --bs=1M --iodepth=8 \
  --ioengine=libaio --direct=${FIO_DIRECT:-1} --size="$vsize" --output-format=json 2>/dev/null | sed -n '/^{/,$p' |
  /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["jobs"][0]["read"]["bw"] * 1024)')
drop
start=$(date +%s.%N)
"$bin" --data-dir "$work" scrub start --wait >/dev/null
end=$(date +%s.%N)
drop
cstart=$(date +%s.%N)
"$bin" --data-dir "$work" check >/dev/null
cend=$(date +%s.%N)
echo "arbor check alone (the scrub's metadata part): $(/usr/bin/python3 -c "print(f'{$cend - $cstart:.2f}')") s"
read_bytes=$("$bin" --data-dir "$work" scrub status --json |
  /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["bytes_read"])')
/usr/bin/python3 - "$fio_rate" "$read_bytes" "$start" "$end" <<'PY'
import sys
fio, read, start, end = float(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
rate = read / (end - start)
mib = 1 << 20
print(f"fio sequential read of the pool file: {fio / mib:.0f} MiB/s")
print(f"scrub (data and metadata): {read / mib:.0f} MiB in {end - start:.2f} s = {rate / mib:.0f} MiB/s")
print(f"scrub against fio: {rate / fio:.2f}x")
PY
