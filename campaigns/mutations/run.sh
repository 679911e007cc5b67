#!/usr/bin/env bash
# Shows that a campaign catches each defect here if it comes back: applies
# each patch to a scratch worktree of HEAD, builds its campaign (the
# exhaustion campaign, or the one named after `@` in the patch's name) and
# runs it until its first failure (or the budget runs out, which counts as
# NOT caught). Prints one line per mutation; exits non-zero if any was not
# caught. Results: docs/RELIABILITY.md.
#
#   campaigns/mutations/run.sh [SECONDS_PER_MUTATION [NAME_PATTERN]]
#   (default 300 seconds, every mutation; e.g. `run.sh 300 2-*` for one)
#
# 1-no-undo            a failed step keeps its changes (defect 1)
# 2-unbounded-unmap    discard unmaps chunk by chunk, unbounded, in one step (defect 2)
# 3-check-live-table   check compares the live table while writes run (defect 3)
# 4-no-end-check       writes are not checked against the size (defect 4)
# 5-copy-not-durable@origin   a copy-on-write volume's home is written before
#                      the copies it needs are committed
# 6-snapshot-no-flush@origin  a snapshot of a copy-on-write volume does not
#                      flush its external device first
# 7-move-no-copy@origin       a home in the pool that moves to grow is not
#                      copied to its new run
set -euo pipefail
cd "$(dirname "$0")/../.."
budget=${1:-300}
pattern=${2:-*}
work=$(mktemp -d /var/tmp/arbor-mutations-XXXXXX)
tree="$work/tree"
cleanup() {
  git worktree remove --force "$tree" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
git worktree add --detach "$tree" HEAD >/dev/null 2>&1
missed=0
for patch in campaigns/mutations/$pattern.patch; do
  name=$(basename "$patch" .patch)
  campaign=${name#*@}
  [ "$campaign" = "$name" ] && campaign=exhaustion
  git -C "$tree" checkout -q -- .
  git -C "$tree" apply "$PWD/$patch"
  cargo build --release -q -p arbor-campaigns --bin "$campaign" \
    --manifest-path "$tree/Cargo.toml" --target-dir "$work/target" 2>"$work/build.log" ||
    { echo "$name: does not build"; cat "$work/build.log"; exit 2; }
  log="$work/$name.log"
  start=$(date +%s)
  # The campaign prints "FAIL ..." per failure as it comes: stop at the first.
  ("$work/target/release/$campaign" --seconds "$budget" --steps 300 --seed 1000 >"$log" 2>&1 || true) &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    if grep -q '^FAIL' "$log"; then pkill -P "$pid" "$campaign" || true; break; fi
    sleep 1
  done
  wait "$pid" 2>/dev/null || true
  took=$(($(date +%s) - start))
  if first=$(grep -m1 '^FAIL' "$log"); then
    echo "$name: caught after ${took}s: ${first:0:300}"
  else
    echo "$name: NOT caught in ${budget}s"
    missed=1
  fi
done
exit $missed
