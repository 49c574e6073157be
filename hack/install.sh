#!/usr/bin/env bash
# Installs berth on a node, or removes what it installed (make install,
# make uninstall; docs/operations.md, decision 3730).
#   hack/install.sh install     the four binaries into $PREFIX/bin, the
#                               systemd unit into $PREFIX/lib/systemd/system
#                               (its ExecStart pointing at $PREFIX/bin),
#                               /etc/berth/berth.toml and /etc/crictl.yaml
#                               each only where none exists
#   hack/install.sh uninstall   the binaries and the unit; berth.toml and
#                               crictl.yaml only when unchanged from what
#                               install writes; never /var/lib/berth or
#                               /run/berth, never a running berthd or pod
#   hack/install.sh config      the default berth.toml on stdout
# Environment:
#   BIN       where make build put the binaries (default ./bin)
#   DESTDIR   a staging root that every path goes under (default: none)
#   PREFIX    default /usr/local (the Debian package: /usr)
#   SYSCONFDIR  default /etc: berthd reads /etc/berth/berth.toml whatever
#             the prefix, so the config stays there
#   CRICTL_YAML  0 leaves /etc/crictl.yaml out (the package writes it from
#             its postinst instead, so that it is no conffile another
#             package's could clash with)
# It does not run systemctl: make install can run into a DESTDIR, on a
# node without systemd, or before the operator has edited berth.toml.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
bin=${BIN:-$root/bin}
destdir=${DESTDIR:-}
prefix=${PREFIX:-/usr/local}
sysconfdir=${SYSCONFDIR:-/etc}
bindir=$destdir$prefix/bin
unitdir=$destdir$prefix/lib/systemd/system
confdir=$destdir$sysconfdir/berth
crictl_conf=$destdir$sysconfdir/crictl.yaml
binaries=(berthd berth-shim berth-lazy berth-pause berthctl)

# default_config prints the berth.toml install writes: berthd's embedded
# defaults as `berthd config` prints them with no file, every line
# commented out, so that the file changes nothing until a key is
# uncommented. berthd is the one being installed, so the defaults shown
# are that build's.
default_config() {
	local berthd=$1 absent
	absent=$(mktemp -d)
	# A path that does not exist: berthd config then reads no file at all.
	if ! "$berthd" config --config "$absent/none.toml" >"$absent/defaults.toml"; then
		rm -rf "$absent"
		echo "install: $berthd config failed" >&2
		return 1
	fi
	cat <<'HEAD'
# berthd's configuration (docs/configuration.md). berthd runs on its
# embedded defaults; every key below is commented out and shows that
# default, as `berthd config` printed it when berth was installed, so this
# file changes nothing as it stands. To change a key, uncomment it (and the
# [table] line above it, for a key in a table) and edit it. `berthd config`
# prints the effective configuration, `systemctl reload berthd` applies
# what can change live and `systemctl restart berthd` the rest (pods keep
# running). Unknown keys make berthd refuse to start.
#
HEAD
	sed -e 's/^\(.\)/# \1/' "$absent/defaults.toml"
	rm -rf "$absent"
}

# unit prints contrib/berthd.service for this prefix.
unit() {
	sed -e "s|/usr/local/bin/|$prefix/bin/|g" contrib/berthd.service
}

install_all() {
	local f
	for f in "${binaries[@]}"; do
		[ -x "$bin/$f" ] || { echo "install: $bin/$f is missing (make build)" >&2; exit 1; }
	done
	install -d -m 0755 "$bindir" "$unitdir"
	for f in "${binaries[@]}"; do
		install -m 0755 "$bin/$f" "$bindir/$f"
	done
	unit >"$unitdir/berthd.service.tmp"
	chmod 0644 "$unitdir/berthd.service.tmp"
	mv "$unitdir/berthd.service.tmp" "$unitdir/berthd.service"
	install -d -m 0755 "$confdir"
	if [ -e "$confdir/berth.toml" ] || [ -L "$confdir/berth.toml" ]; then
		echo "install: kept $confdir/berth.toml (it exists)"
	else
		default_config "$bin/berthd" >"$confdir/berth.toml.tmp"
		chmod 0644 "$confdir/berth.toml.tmp"
		mv "$confdir/berth.toml.tmp" "$confdir/berth.toml"
	fi
	if [ "${CRICTL_YAML:-1}" != 0 ]; then
		if [ -e "$crictl_conf" ] || [ -L "$crictl_conf" ]; then
			echo "install: kept $crictl_conf (it exists)"
		else
			install -m 0644 contrib/crictl.yaml "$crictl_conf"
		fi
	fi
	if [ -z "$destdir" ]; then
		echo "install: done; start berthd with: systemctl daemon-reload && systemctl enable --now berthd"
	fi
}

# remove_if_ours removes $1 when its content is $2's, and says so either way.
remove_if_ours() {
	local path=$1 ours=$2
	[ -e "$path" ] || return 0
	if cmp -s "$path" "$ours"; then
		rm -f "$path"
	else
		echo "uninstall: kept $path (changed since install)"
	fi
}

uninstall_all() {
	local f berthd tmp
	tmp=$(mktemp -d)
	# The default berth.toml of the berthd that was installed, before it goes.
	berthd=$bindir/berthd
	[ -x "$berthd" ] || berthd=$bin/berthd
	if [ -e "$confdir/berth.toml" ]; then
		if [ -x "$berthd" ] && default_config "$berthd" >"$tmp/berth.toml"; then
			remove_if_ours "$confdir/berth.toml" "$tmp/berth.toml"
		else
			echo "uninstall: kept $confdir/berth.toml (no berthd to compare it with)"
		fi
	fi
	rm -rf "$tmp"
	rmdir "$confdir" 2>/dev/null || true
	if [ "${CRICTL_YAML:-1}" != 0 ]; then
		remove_if_ours "$crictl_conf" contrib/crictl.yaml
	fi
	rm -f "$unitdir/berthd.service"
	for f in "${binaries[@]}"; do
		rm -f "$bindir/$f"
	done
	if [ -z "$destdir" ]; then
		echo "uninstall: done; a berthd still running and the pods stay; /var/lib/berth stays (decision 3730)"
	fi
}

case "${1:-}" in
install) install_all ;;
uninstall) uninstall_all ;;
config) default_config "$bin/berthd" ;;
*) echo "usage: hack/install.sh install|uninstall|config" >&2; exit 2 ;;
esac
