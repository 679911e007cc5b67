#!/usr/bin/env bash
# Builds arbor's Debian package, target/debian/arbor_VERSION_ARCH.deb
# (docs/SERVICE.md): the binary, the systemd unit (packaging/arbor.service),
# the configuration /etc/arbor/arbor.toml (the built-in defaults, with the
# pool in /var/lib/arbor and no initial volume), man pages (`arbor
# manpages`), shell completions, the docs, and the Prometheus rules and
# Grafana dashboard. Installs cargo-deb first if it is missing.
#
#   scripts/build-deb.sh               the release build
#   PROFILE=dev scripts/build-deb.sh   the debug build (what the tests use;
#                                      NO_BUILD=1: as it is, not rebuilt)
set -euo pipefail
cd "$(dirname "$0")/.."
profile=${PROFILE:-release}
command -v cargo-deb >/dev/null 2>&1 || cargo install cargo-deb --locked --version 3.8.0
case "$profile" in
  release) bin=target/release/arbor ;;
  dev) bin=target/debug/arbor ;;
  *) echo "PROFILE must be release or dev" >&2; exit 2 ;;
esac
if [ -z "${NO_BUILD:-}" ]; then
  cargo build --locked -p arbor --profile "$profile"
fi
out=packaging/build
rm -rf "$out"
mkdir -p "$out/man" "$out/completions"
"$bin" manpages "$out/man" >/dev/null
"$bin" completions bash >"$out/completions/arbor.bash"
"$bin" completions zsh >"$out/completions/_arbor"
"$bin" completions fish >"$out/completions/arbor.fish"
sed -e 's|^data_dir = "arbor-data"$|data_dir = "/var/lib/arbor"|' \
    -e 's|^initial_volume = "disk0"$|initial_volume = ""|' \
    crates/arbor-daemon/src/default-config.toml >"$out/arbor.toml"
# The two lines changed as meant (the defaults' file still has them).
grep -qx 'data_dir = "/var/lib/arbor"' "$out/arbor.toml"
grep -qx 'initial_volume = ""' "$out/arbor.toml"
cargo deb -p arbor --no-build --profile "$profile" --fast
