# Shared by hack/conformance.sh and hack/e2e-node.sh: a private berthd in a
# scratch dir, on a network slot of its own, and what its cleanup removes.
# Sourced; the caller sets `set -euo pipefail` and, before calling the
# functions below, the variables they name.

# take_slot NAME LOCKDIR BRIDGE_PREFIX NET_PREFIX: the first slot n
# (1..50) whose lock LOCKDIR/<n>.lock this shell can take (on fd 8, kept
# for the run) and whose bridge <BRIDGE_PREFIX><n> and routes to
# <NET_PREFIX>.<n>. do not exist; sets slot.
take_slot() {
	local name=$1 lockdir=$2 bridge_prefix=$3 net_prefix=$4 n
	mkdir -p "$lockdir"
	slot=
	for n in $(seq 1 50); do
		exec 8>"$lockdir/$n.lock"
		if flock -n 8 && ! ip link show "$bridge_prefix$n" >/dev/null 2>&1 && ! ip route | grep -q "^${net_prefix//./\\.}\.$n\."; then
			slot=$n
			return 0
		fi
		exec 8>&-
	done
	echo "$name: no free network slot" >&2
	exit 1
}

# wait_berthd NAME: waits until the berthd of $berthd_pid answers on
# $work/berth.sock; exits with its log's tail if it died.
wait_berthd() {
	local name=$1
	for _ in $(seq 1 300); do
		bin/berthctl --address "unix://$work/berth.sock" info >/dev/null 2>&1 && return 0
		kill -0 "$berthd_pid" 2>/dev/null || { echo "$name: berthd exited:" >&2; tail -20 "$out/berthd.log" >&2; exit 1; }
		sleep 0.1
	done
}

# stop_berthd: removes every pod through the CRI ($bins/crictl, log in
# $out/cleanup.log), then stops berthd ($berthd_pid) and the registry
# ($registry_pid), if they run.
stop_berthd() {
	if [ -n "${berthd_pid:-}" ] && kill -0 "$berthd_pid" 2>/dev/null; then
		"$bins/crictl" --runtime-endpoint "unix://$work/berth.sock" --timeout 60s rmp -a -f >"$out/cleanup.log" 2>&1
		kill -TERM "$berthd_pid"
		wait "$berthd_pid"
	fi
	[ -n "${registry_pid:-}" ] && kill "$registry_pid" 2>/dev/null && wait "$registry_pid" 2>/dev/null
	return 0
}

# kill_leftovers NAME PID...: kills (-9) each pid but this shell's, saying so.
kill_leftovers() {
	local name=$1 pid
	shift
	for pid in "$@"; do
		[ "$pid" != $$ ] && kill -9 "$pid" 2>/dev/null && echo "$name: killed leftover process $pid" >&2
	done
	return 0
}

# pids_naming DIR: the processes whose command line names DIR.
pids_naming() { grep -l -s -- "$1" /proc/[0-9]*/cmdline | cut -d/ -f3; }

# remove_network NAME NET_PREFIX: deletes $bridge and the node-level
# masquerade chain berthd keeps for its default network while the node
# runs berth (decision 1601; this berthd is gone for good), and reports
# nat rules about $subnet (NET_PREFIX.$slot.) still left.
remove_network() {
	local name=$1 net=$2.$slot.
	ip link del "$bridge" 2>/dev/null
	iptables -t nat -D POSTROUTING -s "$subnet" -m comment --comment "berth default network $bridge" -j "BERTH-MASQ-$bridge" 2>/dev/null
	iptables -t nat -F "BERTH-MASQ-$bridge" 2>/dev/null && iptables -t nat -X "BERTH-MASQ-$bridge" 2>/dev/null
	if iptables-save -t nat 2>/dev/null | grep -q "${net//./\\.}"; then
		echo "$name: iptables nat rules about $subnet are left:" >&2
		iptables-save -t nat | grep "${net//./\\.}" >&2
	fi
	return 0
}

# unmount_under DIR: lazily unmounts DIR and every mount below it,
# deepest first; prints each when VERBOSE_NAME is set.
unmount_under() {
	local dir=$1 name=${2:-}
	awk -v w="$dir" '$5 == w || index($5, w "/") == 1 {print $5}' /proc/self/mountinfo | sort -r | while read -r m; do
		umount -l "$m" && [ -n "$name" ] && echo "$name: unmounted leftover $m" >&2
	done
	return 0
}
