#!/usr/bin/env bash
# Builds (once per machine) the Debian bookworm guest of the cgroup v2 lane
# (docs/decisions/2200-cgroup-v2-guest-lane.md) and prints its directory:
#   rootfs.img  ext4 root filesystem (raw; runs use a qcow2 overlay on it)
#   vmlinuz     the guest's own kernel (linux-image-amd64), booted with -kernel
#   initrd.img  its initramfs (virtio and ext4 modules)
# The image is cached under ${BERTH_GUEST_CACHE:-/var/cache/berth-guest}/<key>,
# key = a hash of this script (the package list and the hooks live here), so
# it is rebuilt only when this file changes. Needs root and mmdebstrap.
set -euo pipefail

cache=${BERTH_GUEST_CACHE:-/var/cache/berth-guest}
mirror=${BERTH_GUEST_MIRROR:-http://deb.debian.org/debian}
size=${BERTH_GUEST_ROOT_SIZE:-6G}

# What berthd and the lane's tests need inside, and systemd as init.
packages=(
  systemd-sysv udev dbus kmod linux-image-amd64 initramfs-tools
  runc crun containernetworking-plugins iptables iproute2 busybox-static
  apparmor e2fsprogs procps util-linux mount
)

key=$(cat "$0" | sha256sum | cut -c1-16)
dir=$cache/$key
if [ -f "$dir/done" ]; then
  echo "$dir"
  exit 0
fi
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9
if [ -f "$dir/done" ]; then
  echo "$dir"
  exit 0
fi
[ "$(id -u)" -eq 0 ] || { echo "guest image: building it needs root" >&2; exit 1; }
command -v mmdebstrap >/dev/null || { echo "guest image: mmdebstrap is missing (hack/install-deps.sh guest)" >&2; exit 1; }

work=$(mktemp -d "$cache/.build-XXXXXX")
trap 'rm -rf "$work"' EXIT
start=$SECONDS
echo "guest image: building $dir (mmdebstrap bookworm; a few minutes)" >&2

# The unit that runs the lane: mount the payload disk (vdb), run its
# run.sh with its output on the second serial port, then power off.
# run.sh writes the result line itself; a missing line is a failure.
hooks=$work/hooks
mkdir -p "$hooks"
cat >"$hooks/berth-guest.service" <<'UNIT'
[Unit]
Description=berth guest lane: run the payload, then power off
After=multi-user.target dbus.service
Wants=dbus.service

[Service]
Type=oneshot
ExecStartPre=/bin/mkdir -p /payload
ExecStartPre=/bin/mount -o ro /dev/vdb /payload
ExecStart=/bin/sh -c 'exec /payload/run.sh >/dev/ttyS1 2>&1'
ExecStopPost=/bin/sh -c 'sync; systemctl --no-block poweroff'
TimeoutStartSec=infinity
StandardOutput=journal+console

[Install]
WantedBy=multi-user.target
UNIT

mmdebstrap --variant=apt --mode=root --format=directory \
  --include="$(IFS=,; echo "${packages[*]}")" \
  --customize-hook='echo berth-guest >"$1/etc/hostname"' \
  --customize-hook='printf "/dev/vda / ext4 rw,relatime 0 1\n" >"$1/etc/fstab"' \
  --customize-hook="cp $hooks/berth-guest.service \"\$1/etc/systemd/system/\"" \
  --customize-hook='chroot "$1" systemctl enable berth-guest.service' \
  --customize-hook='chroot "$1" systemctl mask apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer e2scrub_reap.service fstrim.timer getty@tty1.service serial-getty@ttyS0.service systemd-timesyncd.service man-db.timer dpkg-db-backup.timer 2>/dev/null || true' \
  --customize-hook='passwd --root "$1" -d root' \
  bookworm "$work/root" "$mirror" >&2

cp "$work"/root/boot/vmlinuz-* "$work/vmlinuz"
cp "$work"/root/boot/initrd.img-* "$work/initrd.img"
rm -rf "$work"/root/var/cache/apt/archives/*.deb "$work"/root/var/lib/apt/lists/*
truncate -s "$size" "$work/rootfs.img"
mkfs.ext4 -q -F -L berth-guest -d "$work/root" "$work/rootfs.img"
rm -rf "$work/root" "$hooks"
mv "$work" "$dir.tmp"
trap - EXIT
rm -rf "$dir"
mv "$dir.tmp" "$dir"
echo "built in $((SECONDS - start))s" >"$dir/done"
echo "guest image: built in $((SECONDS - start))s" >&2
echo "$dir"
