# A stand-in for systemctl inside make e2e-node's mount namespace
# (hack/e2e-node.sh writes it to <scratch>/systemctl with `work=<scratch>`
# on its first line and bind-mounts it on /usr/bin/systemctl). There is no
# systemd here; the [Serial] specs that stop and restart the kubelet do it
# with `sudo systemctl list-units|reset-failed|kill|stop|start|restart|
# is-active kubelet-...`. This acts on the kubelet the suite started (the
# one whose command line names this run's berth socket) as the unit
# kubelet-berth.service: kill and stop end it and remember its command
# line, working directory and log; start and restart run it again the
# same way. Anything else fails, as it would without systemd.

unit=kubelet-berth.service
state=$work/kubelet-unit
mkdir -p "$state"

kubelet_pid() {
	local p
	for p in $(pgrep -x kubelet); do
		if tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -q -- "unix://$work/berth.sock"; then
			echo "$p"
			return 0
		fi
	done
	return 1
}

stop() {
	local pid sig=${1:-TERM}
	pid=$(kubelet_pid) || return 0
	cp "/proc/$pid/cmdline" "$state/cmdline"
	readlink "/proc/$pid/cwd" >"$state/cwd"
	readlink "/proc/$pid/fd/2" >"$state/log"
	kill "-$sig" "$pid"
	for _ in $(seq 1 100); do
		kill -0 "$pid" 2>/dev/null || return 0
		sleep 0.1
	done
	kill -KILL "$pid" 2>/dev/null
	return 0
}

start() {
	kubelet_pid >/dev/null && return 0
	[ -f "$state/cmdline" ] || { echo "systemctl (e2e-node stand-in): $unit was never stopped here, nothing to start" >&2; return 1; }
	local log
	log=$(cat "$state/log")
	case $log in /*) ;; *) log=$state/kubelet.log ;; esac
	(
		cd "$(cat "$state/cwd")" || exit 1
		xargs -0 -a "$state/cmdline" setsid >>"$log" 2>&1 </dev/null &
	)
	return 0
}

cmd=
args=()
signal=TERM
for a in "$@"; do
	case $a in
	--signal=*) signal=${a#--signal=}; signal=${signal#SIG} ;;
	-*) ;;
	*) if [ -z "$cmd" ]; then cmd=$a; else args+=("$a"); fi ;;
	esac
done

case $cmd in
list-units)
	echo "  UNIT LOAD ACTIVE SUB DESCRIPTION"
	if kubelet_pid >/dev/null; then
		echo "  $unit loaded active running kubelet (make e2e-node)"
	elif ! printf '%s\n' "$@" | grep -q -- '--state=running'; then
		echo "  $unit loaded inactive dead kubelet (make e2e-node)"
	fi
	;;
reset-failed | daemon-reload) ;;
kill) stop "$signal" ;;
stop) stop TERM ;;
start) start ;;
restart) stop TERM && start ;;
is-active)
	if kubelet_pid >/dev/null; then echo active; else echo inactive; exit 3; fi
	;;
*)
	echo "systemctl (e2e-node stand-in): $cmd ${args[*]}: not supported without systemd" >&2
	exit 1
	;;
esac
