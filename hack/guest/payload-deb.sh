#!/usr/bin/env bash
# The guest lane's package part (issue 37, decision 3730), run inside the
# systemd guest after the passes (payload-run.sh runs it as deb/run.sh).
# lane.sh put two builds of berth's .deb here, the second a higher
# version, with crictl. It installs the first through dpkg, starts berthd
# through the installed unit, runs a pod with crictl, upgrades the package
# over the running pod, removes it, purges it, installs it again, and
# checks at each step what decision 3730 says: the unit enabled and
# berthd running after install and upgrade, the container's process the
# same one throughout (the unit's KillMode=process and the keeper),
# /etc/berth kept on remove and gone on purge, /var/lib/berth kept on
# purge, and the pod taken back by the reinstalled berthd. Exits non-zero
# at the first failed check, with berthd's journal and the shim log.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# The system's own programs, not the payload's bin/ the passes use: the
# package's berthd and berthctl are under test.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export DEBIAN_FRONTEND=noninteractive
crictl=$here/crictl
v1=$(cat "$here/v1")
v2=$(cat "$here/v2")
deb1=$here/$(cat "$here/deb1")
deb2=$here/$(cat "$here/deb2")
work=$(mktemp -d)

step() { echo "=== deb: [${SECONDS}s] $*"; }
fail() {
	echo "=== deb: FAIL: $*"
	echo "--- berthd's journal (tail)"
	journalctl -u berthd --no-pager -n 60 2>&1 || true
	echo "--- shim.log (tail)"
	tail -n 30 /run/berth/shims/.node/shim.log 2>&1 || true
	exit 1
}
want() { # want DESC COMMAND...: the command must succeed
	local desc=$1
	shift
	"$@" || fail "$desc"
}
# status prints dpkg's status and version of berth, "not-installed" once
# dpkg forgot it (a purge).
status() {
	local s
	s=$(dpkg-query -W -f='${Status} ${Version}' berth 2>/dev/null) || s=not-installed
	case $s in *not-installed*) s=not-installed ;; esac
	echo "$s"
}
# wait_cri waits (up to 3 minutes: a TCG guest is slow) until berthd answers crictl.
wait_cri() {
	local i
	for i in $(seq 1 180); do
		"$crictl" version >/dev/null 2>&1 && return 0
		sleep 1
	done
	fail "berthd did not answer crictl within 180 s (systemctl: $(systemctl is-active berthd))"
}
# running CTR: crictl shows the container running.
running() { [ -n "$("$crictl" ps -q --state running --id "$1" 2>/dev/null)" ]; }
main_pid() { systemctl show -p MainPID --value berthd; }
monitor_pid() { pgrep -f '^/usr/bin/berth-shim monitor --dir /run/berth/shims/\.node$'; }

# An image without a registry: busybox in one layer, as a docker-archive
# for berthctl image import (the guest has no network).
image() {
	local d=$work/image a
	mkdir -p "$d/rootfs/bin"
	cp /bin/busybox "$d/rootfs/bin/busybox"
	for a in sh sleep echo cat; do ln -s busybox "$d/rootfs/bin/$a"; done
	tar -C "$d/rootfs" --numeric-owner --owner=0 --group=0 -cf "$d/layer.tar" bin
	printf '{"architecture":"amd64","os":"linux","config":{"Cmd":["/bin/sh"],"Env":["PATH=/bin"]},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
		"$(sha256sum "$d/layer.tar" | cut -d' ' -f1)" >"$d/config.json"
	printf '[{"Config":"config.json","RepoTags":["berth.test/deb-busybox:1"],"Layers":["layer.tar"]}]' >"$d/manifest.json"
	tar -C "$d" -cf "$work/image.tar" manifest.json config.json layer.tar
}

cat >"$work/pod.json" <<'JSON'
{"metadata": {"name": "deb", "namespace": "default", "uid": "deb-uid"},
 "log_directory": "/var/log/berth-deb", "linux": {}}
JSON
cat >"$work/ctr.json" <<'JSON'
{"metadata": {"name": "sleeper"}, "image": {"image": "berth.test/deb-busybox:1"},
 "command": ["/bin/sleep", "86413"], "log_path": "sleeper.log", "linux": {}}
JSON

mkdir -p /var/log/berth-deb

step "install $v1"
want "dpkg -i $deb1" dpkg -i "$deb1"
[ "$(status)" = "install ok installed $v1" ] || fail "dpkg status after install: $(status)"
[ "$(systemctl is-enabled berthd)" = enabled ] || fail "berthd.service not enabled after install: $(systemctl is-enabled berthd)"
want "/etc/crictl.yaml written" grep -q 'unix:///run/berth/berth.sock' /etc/crictl.yaml
want "systemctl start berthd" systemctl start berthd
wait_cri
[ "$(systemctl is-active berthd)" = active ] || fail "berthd not active"
# The installed berth.toml is all comments: the same effective
# configuration as no file.
/usr/bin/berthd config >"$work/installed.toml" || fail "berthd config with the installed berth.toml"
/usr/bin/berthd config --config "$work/none.toml" >"$work/defaults.toml" || fail "berthd config without a file"
want "the installed berth.toml changes nothing" cmp "$work/installed.toml" "$work/defaults.toml"

step "a pod through the installed unit"
image
want "berthctl image import" /usr/bin/berthctl image import "$work/image.tar"
pod=$("$crictl" runp "$work/pod.json") || fail "crictl runp"
ctr=$("$crictl" create "$pod" "$work/ctr.json" "$work/pod.json") || fail "crictl create"
want "crictl start" "$crictl" start "$ctr"
want "the container runs" running "$ctr"
[ "$("$crictl" exec "$ctr" /bin/echo hello)" = hello ] || fail "crictl exec before the upgrade"
pid=$(pgrep -f '^/bin/sleep 86413$') || fail "no container process"
step "pod $pod, container $ctr, its process $pid; berthd $(main_pid)"

step "upgrade to $v2 over the running pod"
before=$(main_pid)
monitor=$(monitor_pid) || fail "no node monitor before the upgrade"
want "dpkg -i $deb2" dpkg -i "$deb2"
[ "$(status)" = "install ok installed $v2" ] || fail "dpkg status after upgrade: $(status)"
wait_cri
after=$(main_pid)
[ "$after" != "$before" ] && [ "$after" != 0 ] || fail "berthd was not restarted by the upgrade (MainPID $before, then $after)"
[ "$(systemctl is-enabled berthd)" = enabled ] || fail "berthd.service not enabled after upgrade"
# The monitor was handed over: the keeper started the new berth-shim.
for _ in $(seq 1 60); do
	m=$(monitor_pid) && [ "$m" != "$monitor" ] && break
	sleep 1
done
[ -n "${m:-}" ] && [ "$m" != "$monitor" ] || fail "the node monitor $monitor was not handed over by the upgrade"
case $(readlink "/proc/$m/exe") in *deleted*) fail "the new monitor runs the old, deleted berth-shim" ;; esac
step "berthd $after, monitor $m after the upgrade"
want "the container still runs after the upgrade" running "$ctr"
[ "$(pgrep -f '^/bin/sleep 86413$')" = "$pid" ] || fail "the container's process changed across the upgrade"
[ "$("$crictl" exec "$ctr" /bin/echo hello)" = hello ] || fail "crictl exec after the upgrade"

step "remove"
want "dpkg -r berth" dpkg -r berth
[ "$(status)" = "deinstall ok config-files $v2" ] || fail "dpkg status after remove: $(status)"
systemctl is-active --quiet berthd && fail "berthd still active after remove"
[ ! -e /usr/bin/berthd ] || fail "/usr/bin/berthd left after remove"
want "the container's process outlives the removal" kill -0 "$pid"
want "/etc/berth/berth.toml kept on remove" test -f /etc/berth/berth.toml

step "purge"
want "dpkg -P berth" dpkg -P berth
[ "$(status)" = not-installed ] || fail "dpkg status after purge: $(status)"
[ ! -e /etc/berth ] || fail "/etc/berth left after purge: $(ls -la /etc/berth)"
[ ! -e /etc/crictl.yaml ] || fail "/etc/crictl.yaml left after purge"
want "/var/lib/berth kept on purge" test -d /var/lib/berth
want "the container's process outlives the purge" kill -0 "$pid"

step "install $v2 again: berthd takes the pod back"
want "dpkg -i $deb2 again" dpkg -i "$deb2"
wait_cri
want "the container runs under the reinstalled berthd" running "$ctr"
[ "$(pgrep -f '^/bin/sleep 86413$')" = "$pid" ] || fail "the container's process changed across remove and reinstall"
[ "$("$crictl" exec "$ctr" /bin/echo hello)" = hello ] || fail "crictl exec after the reinstall"
want "crictl stopp" "$crictl" stopp "$pod"
want "crictl rmp" "$crictl" rmp "$pod"
# StopPodSandbox returns once the monitor reaped the process; a little
# slack for /proc on a slow guest.
for _ in $(seq 1 10); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
kill -0 "$pid" 2>/dev/null && fail "the container's process outlived stopp"
want "dpkg -P berth at the end" dpkg -P berth
rm -rf /var/lib/berth "$work"
step "ok"
