#!/usr/bin/env bash
# Coverage-guided fuzzing with libFuzzer on the pinned stable toolchain (no
# nightly, no cargo-fuzz needed): the instrumentation cargo-fuzz would add,
# minus AddressSanitizer (whose flag needs nightly; with nightly use
# `cargo +nightly fuzz run TARGET` instead).
#
#   fuzz/run.sh TARGET SECONDS [libFuzzer options...]
#
# TARGET: decode_blocks | open_pool | decode_stream | decode_session | decode_policy | decode_backup | decode_key_record (this directory) | handshake | request
# (crates/arbor-nbd/fuzz). Seeds come from `arbor-campaigns --bin fuzz-seeds`;
# the corpus grows in <fuzz dir>/corpus/TARGET, crashes land in
# <fuzz dir>/artifacts/TARGET: copy each to fuzz/regressions/TARGET/ so the
# CI test (campaigns/tests/hostile.rs) replays it forever.
set -euo pipefail
target=${1:?target}
seconds=${2:?seconds}
shift 2
root="$(cd "$(dirname "$0")/.." && pwd)"
case "$target" in
  decode_blocks|open_pool|decode_stream|decode_session|decode_policy|decode_backup|decode_key_record) dir="$root/fuzz" ;;
  handshake|request) dir="$root/crates/arbor-nbd/fuzz" ;;
  *) echo "unknown target $target" >&2; exit 2 ;;
esac
cargo run --quiet --release --manifest-path "$root/Cargo.toml" -p arbor-campaigns --bin fuzz-seeds -- "$target" "$dir/corpus/$target"
export RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions -Coverflow-checks"
# An explicit --target keeps the flags off build scripts and proc macros.
triple=$(rustc -vV | sed -n 's/^host: //p')
cargo build --release --manifest-path "$dir/Cargo.toml" --target "$triple" --bin "$target"
mkdir -p "$dir/artifacts/$target"
# -rss_limit_mb bounds memory (a pool's check needs ~4 bytes per block of the device).
exec "$dir/target/$triple/release/$target" "$dir/corpus/$target" \
  -artifact_prefix="$dir/artifacts/$target/" -max_total_time="$seconds" \
  -rss_limit_mb=2048 -timeout=10 -max_len=1048576 -print_final_stats=1 "$@"
