#!/usr/bin/env bash
# Installs the Debian packages berth needs when they are missing.
#   hack/install-deps.sh run    what berthd needs: runc, CNI plugins, iptables
#   hack/install-deps.sh test   also what the tests need: busybox-static,
#                               apparmor (apparmor_parser compiles the default profile),
#                               the libraries of ../shared/tools/criu when it is there
#                               (checkpoint/restore tests; its README lists them)
#   hack/install-deps.sh bench  also the reference runtimes: containerd, and
#                               CRI-O's conmon (BenchmarkShimMemory's conmon rows)
#   hack/install-deps.sh conformance  also a static C toolchain (the critest
#                               stand-in registry's helpers)
#   hack/install-deps.sh e2e-node     also sudo (node e2e specs call it)
#   hack/install-deps.sh e2e-cluster  also openssl (the cluster's certificates),
#                               curl, nsenter and unshare (util-linux)
#   hack/install-deps.sh guest  the cgroup v2 lane's host side: mmdebstrap
#                               (builds the guest image), qemu, qemu-img, mkfs.ext4
# Nothing is installed when everything is present, so it is cheap to call.
set -euo pipefail

want=(runc:runc iptables:iptables ip:iproute2)
cni_plugins=containernetworking-plugins
case "${1:-run}" in
  test) want+=(busybox:busybox-static apparmor_parser:apparmor) ;;
  bench) want+=(busybox:busybox-static containerd:containerd conmon:conmon) ;;
  conformance) want+=(busybox:busybox-static gcc:gcc) ;;
  e2e-node) want+=(busybox:busybox-static sudo:sudo) ;;
  e2e-cluster) want+=(busybox:busybox-static openssl:openssl curl:curl nsenter:util-linux unshare:util-linux) ;;
  guest) want=(mmdebstrap:mmdebstrap qemu-system-x86_64:qemu-system-x86 qemu-img:qemu-utils mkfs.ext4:e2fsprogs) ;;
esac

missing=()
for pair in "${want[@]}"; do
  bin=${pair%%:*} pkg=${pair#*:}
  command -v "$bin" >/dev/null 2>&1 || missing+=("$pkg")
done
if [ "${1:-run}" != run ] && [ "${1:-run}" != guest ] && [ ! -x /bin/busybox ]; then
  missing+=(busybox-static)
fi
if [ "${1:-run}" = conformance ] && [ -z "$(find /usr/lib -name libc.a -print -quit 2>/dev/null)" ]; then
  missing+=(libc6-dev)
fi
# The criu provided beside the checkout links these (its README says so).
criu_dir="$(cd "$(dirname "$0")/.." && pwd)/../shared/tools/criu"
if [ "${1:-run}" = test ] || [ "${1:-run}" = bench ]; then
  if [ -x "$criu_dir/criu" ]; then
    for pkg in libprotobuf-c1 libnl-3-200 libnet1 libnftables1 libbsd0 libgnutls30; do
      dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
    done
  fi
fi
if [ "${1:-run}" != guest ] && [ ! -x /usr/lib/cni/bridge ] && [ ! -x /opt/cni/bin/bridge ]; then
  missing+=("$cni_plugins")
fi
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
  echo "berth needs these Debian packages: ${missing[*]}; run as root or install them" >&2
  exit 1
fi
echo "installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
