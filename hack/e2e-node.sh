#!/usr/bin/env bash
# make e2e-node: the Kubernetes node e2e suite (e2e_node.test of the
# k8s.io/kubernetes release pinned in test/k8s, built by hack/k8s-bins.sh)
# against a private berthd. The suite starts etcd and an API server in its
# own process and runs the kubelet (also from hack/k8s-bins.sh) itself;
# this script gives it:
#
#   - a private berthd (scratch dir under /tmp, bridge ben<n>, subnet
#     10.237.<n>.0/24) whose registry mirrors for registry.k8s.io, gcr.io,
#     k8s.gcr.io, docker.io and quay.io point at test/e2enode/registry, a
#     loopback registry of stand-ins for the images the suite pulls;
#   - a base kubelet config: upstream's test defaults (cgroupfs,
#     cgroupsPerQOS, cgroup root /);
#   - a mount namespace of its own (unshare), where /var/lib/kubelet (the
#     kubelet root the suite hard-codes) is a scratch directory and
#     /usr/bin/systemd-run is hidden: the suite runs the kubelet through
#     systemd-run whenever it finds it, which fails without systemd as PID 1;
#     /usr/bin/systemctl is a stand-in that stops and restarts the suite's
#     kubelet (hack/e2e-node-systemctl.sh), as the [Serial] specs ask;
#     /run/systemd/private is test/e2enode/fakesystemd's socket, a stand-in
#     for systemd's D-Bus API that runs berthd as berthd.service (a
#     [Serial] spec stops and starts the runtime's unit over D-Bus);
#   - a cgroup namespace rooted at a cgroup of the run's own, so that the
#     kubelet's cgroup root "/" (kubepods, /kubelet, /system) is private.
#
# Two passes with ginkgo's CLI: [NodeConformance] without
# [Serial]|[Slow]|[Flaky] on ${E2E_NODE_PROCS:-6} processes, then the
# [Serial] [NodeConformance] specs on one. Reports (ginkgo JSON and JUnit),
# the suite's and the kubelet's logs, berthd's log and config, and
# summary.txt go to ${E2E_NODE_OUT:-out/e2e-node/<UTC time>}.
#
#   make e2e-node
#   E2E_NODE_FOCUS='Container Runtime' make e2e-node   # narrow both passes
#   E2E_NODE_PASSES=parallel make e2e-node              # parallel|serial|both
#   E2E_NODE_ARGS='--ginkgo.v' ...                      # extra suite flags
set -euo pipefail

repo=$(cd "$(dirname "$(readlink -f "$0")")/.." && pwd)
cd "$repo"
. hack/lib/private-berthd.sh
. hack/lib/cgroups.sh
. hack/lib/suite.sh
[ "$(id -u)" = 0 ] || { echo "e2e-node: run as root (berthd and the kubelet need it)" >&2; exit 1; }

# cgroup hierarchies: "mountpoint fstype superopts" of each cgroup mount.

# Outside: build what is needed, pick a slot, make the run's cgroup (a
# child of this process's cgroup in every hierarchy), then run the rest in
# new mount and cgroup namespaces rooted at that cgroup, and clean up.
if [ -z "${BERTH_E2E_NODE_INNER:-}" ]; then
	hack/install-deps.sh e2e-node
	bins=$(hack/k8s-bins.sh e2e_node.test ginkgo agnhost kubelet crictl sample-device-plugin)
	make build >&2
	# The kubelet root the suite hard-codes must exist to be mounted over.
	mkdir -p /var/lib/kubelet

	# A slot no other run holds: bridge ben<n>, 10.237.<n>.0/24, cgroup
	# berth-e2e-node-<n>. The lock (fd 8) is inherited by the run.
	take_slot e2e-node /run/berth-e2e-node ben 10.237

	# The run's cgroup: the cgroup namespace's root, so the kubelet's "/"
	# (kubepods, /kubelet, /system) is this directory and nothing else on
	# the machine. Under this process's own cgroup in each hierarchy.
	cgname=berth-e2e-node-$slot
	mapfile -t cgdirs < <(own_cgroup_dirs "$cgname")
	for dir in "${cgdirs[@]}"; do make_cgroup "$dir"; done
	status=0
	BERTH_E2E_NODE_INNER=1 BERTH_E2E_NODE_BINS=$bins BERTH_E2E_NODE_SLOT=$slot \
		bash -c 'for d in "${@:2}"; do echo $$ >"$d/cgroup.procs"; done
			exec unshare --cgroup --mount --propagation slave -- "$1"' \
		sh "$0" "${cgdirs[@]}" || status=$?
	# Whatever the run left in its cgroup, then the cgroup.
	for d in "${cgdirs[@]}"; do
		for pid in $(find "$d" -name cgroup.procs -exec cat {} + 2>/dev/null); do
			kill -9 "$pid" 2>/dev/null && echo "e2e-node: killed leftover process $pid" >&2
		done
	done
	sleep 1
	for d in "${cgdirs[@]}"; do
		find "$d" -depth -type d -exec rmdir {} + 2>/dev/null
		[ -d "$d" ] && echo "e2e-node: cgroup $d is left" >&2
	done
	exit $status
fi
bins=$BERTH_E2E_NODE_BINS
slot=$BERTH_E2E_NODE_SLOT
bridge=ben$slot
subnet=10.237.$slot.0/24

out=${E2E_NODE_OUT:-$repo/out/e2e-node/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d /tmp/berth-e2e-node.XXXXXX)
chmod 755 "$work"
echo "e2e-node: results in $out, scratch in $work" >&2

# The ports the suite hard-codes (API server, kubelet) must be free.
for p in 6443 10248 10250 10255; do
	if ss -Hltn "( sport = :$p )" | grep -q .; then
		echo "e2e-node: port $p is in use (another API server or kubelet?); the node e2e suite needs it" >&2
		exit 1
	fi
done

berthd_pid=
registry_pid=
cleanup() {
	set +e
	stop_berthd
	# Processes naming the scratch dir; the cgroups go when the run's
	# cgroup goes (outside), mounts with the namespace.
	kill_leftovers e2e-node $(pids_naming "$work")
	remove_network e2e-node 10.237
	unmount_under "$work"
	rm -rf "$work"
}
trap cleanup EXIT

# The namespaces: cgroup hierarchies mounted afresh show the run's cgroup
# as their root; a scratch kubelet root; no systemd-run.
# (The kernel refuses a superblock on top of itself: unmount first; the
# propagation is slave, so the host keeps its mounts.)
while read -r mnt fstype opts; do
	umount "$mnt"
	if [ "$fstype" = cgroup2 ]; then
		mount -t cgroup2 cgroup2 "$mnt"
	else
		mount -t cgroup -o "${opts#rw,}" cgroup "$mnt"
	fi
done < <(cgroup_mounts)
mkdir -p "$work/kubelet-root"
mount --bind "$work/kubelet-root" /var/lib/kubelet
mount --make-rshared /var/lib/kubelet
if [ -e /usr/bin/systemd-run ]; then
	: >"$work/no-systemd-run"
	chmod 644 "$work/no-systemd-run"
	mount --bind "$work/no-systemd-run" /usr/bin/systemd-run
fi
# The [Serial] specs stop and restart the kubelet with systemctl: a
# stand-in acts on the suite's kubelet (hack/e2e-node-systemctl.sh).
if [ -e /usr/bin/systemctl ]; then
	{ echo '#!/usr/bin/env bash'; echo "work=$work"; cat hack/e2e-node-systemctl.sh; } >"$work/systemctl"
	chmod 755 "$work/systemctl"
	mount --bind "$work/systemctl" /usr/bin/systemctl
fi
if command -v systemd-run >/dev/null 2>&1 && [ -x "$(command -v systemd-run)" ]; then
	echo "e2e-node: systemd-run is still on PATH ($(command -v systemd-run)); the suite would run the kubelet through it" >&2
	exit 1
fi

# The stand-in images.
kmod=$(cd test/k8s && go list -m -f '{{.Dir}}' k8s.io/kubernetes)
CGO_ENABLED=0 go build -o "$work/imagetools" ./test/e2enode/imagetools
go build -o "$work/registry" ./test/e2enode/registry
go build -o "$work/fakesystemd" ./test/e2enode/fakesystemd
"$work/registry" -addr 127.0.0.1:0 -agnhost "$bins/agnhost" -imagetools "$work/imagetools" \
	-porter-dir "$kmod/test/images/agnhost/porter" -sample-device-plugin "$bins/sample-device-plugin" >"$out/registry.log" 2>&1 &
registry_pid=$!
for _ in $(seq 1 600); do
	grep -qs '^READY' "$out/registry.log" && break
	kill -0 "$registry_pid" 2>/dev/null || break
	sleep 0.1
done
grep -q '^READY' "$out/registry.log" || { echo "e2e-node: the stand-in registry did not start:" >&2; tail "$out/registry.log" >&2; exit 1; }
regaddr=$(awk '$1 == "listening" {print $2; exit}' "$out/registry.log")

write_mirrors "$work/certs.d" "$regaddr"

cat >"$work/berth.toml" <<EOF
listen = "unix://$work/berth.sock"
root = "$work/root"
state = "$work/state"
cni_conf_dir = "$work/net.d"
registry_config_dir = "$work/certs.d"
cgroup_parent = "berth"

# The PodOverhead spec's RuntimeClass names the handler test-handler; as
# containerd's node e2e config, a second handler running runc.
[runtime_handlers.test-handler]
  binary = "runc"

[default_network]
  bridge = "$bridge"
  subnet = "$subnet"
EOF
cp "$work/berth.toml" "$out/berth.toml"

# berthd runs under fakesystemd, a stand-in for systemd's private D-Bus
# socket in this namespace (/run/systemd/private), as the unit
# berthd.service: the spec whose container runtime is down during pod
# termination stops and starts the runtime's unit over D-Bus. Both run in
# the runtime's cgroup, which the kubelet reports as the "runtime" system
# container: fakesystemd is put there before it starts berthd, so
# berthd, its restarts and the shims it starts are there from the start.
cgprocs=()
for h in /sys/fs/cgroup/*/; do
	[ -f "${h}cgroup.procs" ] || continue
	mkdir -p "${h}berthd"
	if [ -f "${h}cpuset.cpus" ]; then
		cat "${h}cpuset.cpus" >"${h}berthd/cpuset.cpus"
		cat "${h}cpuset.mems" >"${h}berthd/cpuset.mems"
	fi
	cgprocs+=("${h}berthd/cgroup.procs")
done
mkdir -p /run/systemd "$work/run-systemd"
mount --bind "$work/run-systemd" /run/systemd
bash -c 'n=$1; shift; for f in "${@:1:n}"; do echo $$ >"$f"; done; shift "$n"; exec "$@"' \
	sh ${#cgprocs[@]} "${cgprocs[@]}" "$work/fakesystemd" \
	-socket /run/systemd/private -unit berthd.service -pidfile "$work/berthd.pid" -stop-timeout 60s \
	-- bin/berthd --config "$work/berth.toml" >"$out/berthd.log" 2>&1 &
berthd_pid=$!
wait_berthd e2e-node
bin/berthd version >"$out/berthd-version.txt" 2>&1 || true

# The base kubelet config: upstream's test defaults
# (test/e2e_node/jenkins/default-kubelet-config.yaml) with the cgroup root
# private to this run; cgroup v1 allowed (failCgroupV1, true by default
# since 1.35) as this host may have it.
cat >"$work/kubelet-config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /
cgroupsPerQOS: true
podCIDR: "10.100.0.0/24"
volumeStatsAggPeriod: 10s
fileCheckFrequency: 10s
evictionPressureTransitionPeriod: 30s
evictionHard:
  memory.available: 250Mi
  nodefs.available: 10%
  nodefs.inodesFree: 5%
evictionMinimumReclaim:
  nodefs.available: 5%
  nodefs.inodesFree: 5%
serializeImagePulls: false
EOF
cp "$work/kubelet-config.yaml" "$out/"

# The suite writes its kubeconfig, kubelet config, token file and static
# pod directories beside its binary: run a link (or copy) of it in the
# scratch dir, not the shared cache. It runs the kubelet it finds beside
# itself (v1.37 has no --k8s-bin-dir): a link (or copy) of that too.
mkdir -p "$work/run"
for b in e2e_node.test kubelet; do
	ln "$bins/$b" "$work/run/$b" 2>/dev/null || cp "$bins/$b" "$work/run/$b"
done
suite_flags=(
	--container-runtime-endpoint "unix://$work/berth.sock"
	--image-service-endpoint "unix://$work/berth.sock"
	--kubelet-config-file "$work/kubelet-config.yaml"
	# The suite's defaults put the kubelet in /kubelet and the other
	# processes of (the cgroup namespace's) root cgroup in /system; the
	# runtime is berthd.
	--kubelet-flags "--runtime-cgroups=/berthd"
	--prepull-images=false
	--system-spec-name=
	# The runtime's unit is found by berthd's pid (fakesystemd above).
	--container-runtime-process-name berthd
	--container-runtime-pid-file "$work/berthd.pid"
	--node-name "$(hostname)"
	${E2E_NODE_ARGS:-}
)
# The framework's tags ([NodeConformance], [Serial], ...) are ginkgo labels
# too; E2E_NODE_FOCUS narrows by spec text.
focus=()
[ -n "${E2E_NODE_FOCUS:-}" ] && focus=(--focus="$E2E_NODE_FOCUS")

status=0
run_pass() { # name, ginkgo flags...
	local name=$1
	shift
	mkdir -p "$out/$name"
	echo "e2e-node: pass $name ($(date -u +%T))" >&2
	(cd "$work/run" && "$bins/ginkgo" --no-color --timeout=3h --output-dir="$out/$name" --json-report=report.json \
		--junit-report=junit.xml --silence-skips "$@" "$work/run/e2e_node.test" -- \
		--report-dir "$out/$name" "${suite_flags[@]}") >"$out/$name/ginkgo.log" 2>&1 || status=1
	echo "e2e-node: pass $name done ($(date -u +%T)): $(grep -aE '^(Ran |SUCCESS|FAIL)' "$out/$name/ginkgo.log" | tr '\n' ' ')" >&2
	# A kubelet the systemctl stand-in restarted outlives the suite.
	for pid in $(pgrep -x kubelet); do
		tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "unix://$work/berth.sock" && kill "$pid"
	done
	return 0
}
passes=${E2E_NODE_PASSES:-both}
if [ "$passes" = both ] || [ "$passes" = parallel ]; then
	run_pass parallel --procs="${E2E_NODE_PROCS:-6}" --label-filter='NodeConformance && !Serial && !Slow && !Flaky' "${focus[@]}"
fi
if [ "$passes" = both ] || [ "$passes" = serial ]; then
	run_pass serial --label-filter='NodeConformance && Serial && !Slow && !Flaky' "${focus[@]}"
fi

summarize_passes "$out"
echo "e2e-node: reports, logs and summary in $out" >&2
exit $status
