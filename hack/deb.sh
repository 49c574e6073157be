#!/usr/bin/env bash
# Builds berth's Debian package from the binaries make build put in $BIN
# (make deb; decision 3730) with dpkg-deb alone: no debhelper, no network.
#   hack/deb.sh           builds $DEB_OUT/berth_<version>_<arch>.deb, prints its path
#   hack/deb.sh version   prints the version it would give the package
# Environment:
#   BIN          the binaries (default ./bin)
#   DEB_OUT      where the .deb goes (default ./out/deb)
#   DEB_VERSION  the package version (default: from berthd version, below)
#   DEB_COMPRESS dpkg-deb's compressor (default xz; the tests use gzip and
#                the guest lane none: xz takes minutes of these 2 cores)
# The package installs what make install does with PREFIX=/usr: the four
# binaries in /usr/bin, the unit in /usr/lib/systemd/system, and
# /etc/berth/berth.toml (berthd's defaults, all commented out) as its
# conffile; its maintainer scripts (contrib/debian) write /etc/crictl.yaml
# where none exists, enable and start the unit, restart it on upgrade,
# stop only berthd on removal, and leave /var/lib/berth on purge.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
bin=${BIN:-$root/bin}
out=${DEB_OUT:-$root/out/deb}

# version maps berthd's semantic version onto a Debian one (a hyphen would
# start a Debian revision): a release (0.2.0) stays itself; a build past a
# tag (0.2.0-3-gabc1234) becomes 0.2.0+3.gabc1234, above the tag; any other
# pre-release sorts below its release, a development build also above the
# builds of earlier commits: 0.1.0-dev+<build> becomes
# 0.1.0~dev.<commits>+<build>, 0.2.0-rc.1 becomes 0.2.0~rc.1.
version() {
	local v base rest pre meta
	if [ -n "${DEB_VERSION:-}" ]; then
		echo "$DEB_VERSION"
		return
	fi
	v=$("$bin/berthd" version | awk '{print $2}')
	case $v in
	*-*)
		base=${v%%-*} rest=${v#*-}
		pre=${rest%%+*} meta=
		[ "$pre" = "$rest" ] || meta=${rest#*+}
		if [[ $pre =~ ^[0-9]+-g[0-9a-f]+$ ]]; then
			v=$base+${pre//-/.}
		else
			[ "$pre" != dev ] || pre=dev.$(git rev-list --count HEAD 2>/dev/null || echo 0)
			v=$base~${pre//-/.}
		fi
		[ -z "$meta" ] || v=$v+${meta//-/.}
		;;
	esac
	echo "$v"
}

if [ "${1:-}" = version ]; then
	version
	exit 0
fi
[ $# -eq 0 ] || { echo "usage: hack/deb.sh [version]" >&2; exit 2; }
command -v dpkg-deb >/dev/null || { echo "deb: dpkg-deb is missing (Debian's dpkg)" >&2; exit 1; }
[ -x "$bin/berthd" ] || { echo "deb: $bin/berthd is missing (make build)" >&2; exit 1; }

ver=$(version)
arch=$(dpkg --print-architecture)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
pkg=$stage/berth
BIN=$bin DESTDIR=$pkg PREFIX=/usr CRICTL_YAML=0 hack/install.sh install
install -d -m 0755 "$pkg/usr/share/doc/berth"
install -m 0644 README.md docs/operations.md "$pkg/usr/share/doc/berth/"

install -d -m 0755 "$pkg/DEBIAN"
for s in postinst prerm postrm; do
	sed -e '/^@CRICTL_YAML@$/{r contrib/crictl.yaml' -e 'd}' "contrib/debian/$s" >"$pkg/DEBIAN/$s"
	chmod 0755 "$pkg/DEBIAN/$s"
done
echo /etc/berth/berth.toml >"$pkg/DEBIAN/conffiles"
(cd "$pkg" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | sort -z | xargs -0 md5sum) >"$pkg/DEBIAN/md5sums"
size=$(du -sk --exclude=DEBIAN "$pkg" | cut -f1)
cat >"$pkg/DEBIAN/control" <<CONTROL
Package: berth
Version: $ver
Architecture: $arch
Maintainer: berth maintainers <maintainers@users.noreply.a-seed-083a0ad5.example>
Installed-Size: $size
Depends: runc | crun, containernetworking-plugins, iptables
Suggests: criu
Section: admin
Priority: optional
Homepage: https://github.com/berthcri/berth
Description: Kubernetes container runtime (CRI) on runc or crun
 berthd serves the kubelet's Container Runtime Interface on
 /run/berth/berth.sock: pod sandboxes with CNI networking, containers
 through an OCI runtime (runc or crun), images pulled from OCI registries
 onto overlayfs. The package starts berthd under systemd; stopping,
 upgrading or removing it leaves running containers alone.
CONTROL

mkdir -p "$out"
deb=$out/berth_${ver}_$arch.deb
dpkg-deb --root-owner-group -Z"${DEB_COMPRESS:-xz}" --build "$pkg" "$deb.tmp" >/dev/null
mv "$deb.tmp" "$deb"
echo "$deb"
