#!/usr/bin/env bash
# The project's test command (see README): installs what the tests need if
# anything is missing, checks formatting and lints, runs every test, then
# the end-to-end tests with real NBD clients and a real ext4 (as root).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --workspace --locked
# The binary the e2e suites run: `cargo test` built it already (for the
# binary crate's integration tests) with the same profile and features; this
# only confirms it. `cargo build -p arbor` would resolve features apart from
# the tests' and compile a second copy of many dependencies.
cargo build --workspace --tests --locked
ARBOR_BIN="$PWD/target/debug/arbor" tests/e2e/run.sh
