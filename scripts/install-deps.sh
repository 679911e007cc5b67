#!/usr/bin/env bash
# Installs, from Debian's packages, the programs the tests drive (real NBD
# clients and peers, a filesystem to mount) when any of them is missing.
# Needs root (or sudo) only when something must be installed.
set -euo pipefail

# program -> Debian package
declare -A PACKAGES=(
  [nbdinfo]=libnbd-bin [nbdcopy]=libnbd-bin [nbdfuse]=libnbd-bin
  [nbdkit]=nbdkit [qemu-img]=qemu-utils [qemu-io]=qemu-utils [qemu-nbd]=qemu-utils
  [fio]=fio [fusermount3]=fuse3 [mkfs.ext4]=e2fsprogs [e2fsck]=e2fsprogs
  [losetup]=util-linux [openssl]=openssl [ip]=iproute2 [tc]=iproute2
  [ceph-mon]=ceph-mon [ceph-osd]=ceph-osd [ceph-mgr]=ceph-mgr [ceph]=ceph-common [rbd]=ceph-common
  [radosgw]=radosgw [radosgw-admin]=ceph-common [rclone]=rclone [restic]=restic
  [chromium]=chromium [promtool]=prometheus
  [systemd-analyze]=systemd [man]=man-db [runuser]=util-linux [useradd]=passwd [strace]=strace
)
missing=()
for program in "${!PACKAGES[@]}"; do
  command -v "$program" >/dev/null 2>&1 || missing+=("${PACKAGES[$program]}")
done
# python3-libnbd: Debian's module, importable by Debian's python3.
/usr/bin/python3 -c 'import nbd' >/dev/null 2>&1 || missing+=(python3-libnbd)
[ ${#missing[@]} -eq 0 ] && exit 0

packages=$(printf '%s\n' "${missing[@]}" | sort -u | tr '\n' ' ')
echo "installing: $packages" >&2
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# shellcheck disable=SC2086 # one word per package
$SUDO apt-get install -y -qq --no-install-recommends $packages >/dev/null
