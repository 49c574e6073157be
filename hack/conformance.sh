#!/usr/bin/env bash
# make conformance: critest (built by hack/k8s-bins.sh from the Go module
# proxy) against a private berthd, with the settings docs/conformance.md
# lists: registry mirrors to the critest stand-in registry of
# ../shared/tools/critest-registry, a private bridge, NRI socket and a 10 s
# NRI plugin request timeout. Runs the validation suite, then critest's
# benchmarks; keeps the JSON reports and logs in
# ${CONFORMANCE_OUT:-out/conformance/<UTC time>}; prints the summary; removes
# the daemon, its pods, mounts, cgroups and bridge afterwards.
#
# Extra critest flags: CRITEST_ARGS="-ginkgo.focus=Streaming" make conformance
set -euo pipefail

repo=$(cd "$(dirname "$(readlink -f "$0")")/.." && pwd)
cd "$repo"
. hack/lib/private-berthd.sh
. hack/lib/suite.sh
[ "$(id -u)" = 0 ] || { echo "conformance: run as root (berthd needs it)" >&2; exit 1; }

# The stand-in registry's sources live in shared/ beside the repository
# (beside the main checkout when this is a git worktree).
registry_src=${CRITEST_REGISTRY_SRC:-}
if [ -z "$registry_src" ]; then
	for base in "$repo/.." "$(dirname "$(git -C "$repo" rev-parse --path-format=absolute --git-common-dir 2>/dev/null || echo /nonexistent)")/.."; do
		if [ -f "$base/shared/tools/critest-registry/build.sh" ]; then
			registry_src=$(cd "$base/shared/tools/critest-registry" && pwd)
			break
		fi
	done
fi
[ -n "$registry_src" ] || { echo "conformance: shared/tools/critest-registry not found beside the repository; set CRITEST_REGISTRY_SRC" >&2; exit 1; }

bins=$(hack/k8s-bins.sh critest crictl)
make build >&2

out=${CONFORMANCE_OUT:-$repo/out/conformance/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d /tmp/berth-conformance.XXXXXX)
chmod 755 "$work"
echo "conformance: results in $out, scratch in $work" >&2

# A network slot no other run holds: bridge bcf<n>, 10.236.<n>.0/24.
take_slot conformance /run/berth-conformance bcf 10.236
bridge=bcf$slot
subnet=10.236.$slot.0/24
parent=berth-conformance-$slot

berthd_pid=
registry_pid=
cleanup() {
	set +e
	stop_berthd
	# Whatever the daemon left: processes in its cgroups or naming the
	# scratch dir, its mounts, its cgroups, its bridge.
	kill_leftovers conformance $(cat /sys/fs/cgroup/*/"$parent"/cgroup.procs /sys/fs/cgroup/*/"$parent"/*/cgroup.procs /sys/fs/cgroup/*/"$parent"/*/*/cgroup.procs 2>/dev/null) \
		$(pids_naming "$work")
	unmount_under "$work" conformance
	for h in /sys/fs/cgroup/*/ /sys/fs/cgroup/; do
		[ -d "$h$parent" ] && find "$h$parent" -depth -type d -exec rmdir {} + 2>/dev/null
	done
	remove_network conformance 10.236
	rm -rf "$work"
}
trap cleanup EXIT

# The stand-in registry on a free port.
sh "$registry_src/build.sh" "$work/registry" >/dev/null
for try in 1 2 3 4 5; do
	port=$(shuf -i 20000-40000 -n 1)
	ss -ltn "( sport = :$port )" | grep -q LISTEN && continue
	"$work/registry/testreg" -bin "$work/registry" -addr "127.0.0.1:$port" >"$out/registry.log" 2>&1 &
	registry_pid=$!
	for _ in $(seq 1 300); do
		grep -q READY "$out/registry.log" && break
		kill -0 "$registry_pid" 2>/dev/null || break
		sleep 0.1
	done
	grep -q READY "$out/registry.log" && break
	registry_pid=
done
[ -n "$registry_pid" ] || { echo "conformance: the stand-in registry did not start:" >&2; cat "$out/registry.log" >&2; exit 1; }

write_mirrors "$work/certs.d" "127.0.0.1:$port"

cat >"$work/berth.toml" <<EOF
listen = "unix://$work/berth.sock"
root = "$work/root"
state = "$work/state"
cni_conf_dir = "$work/net.d"
registry_config_dir = "$work/certs.d"
cgroup_parent = "$parent"

[default_network]
  bridge = "$bridge"
  subnet = "$subnet"

[nri]
  socket_path = "$work/nri.sock"
  plugin_path = "$work/nri-plugins"
  plugin_config_path = "$work/nri-conf.d"
  plugin_request_timeout = "10s"
EOF
cp "$work/berth.toml" "$out/berth.toml"

bin/berthd --config "$work/berth.toml" >"$out/berthd.log" 2>&1 &
berthd_pid=$!
wait_berthd conformance

cat >"$work/bench-params.yaml" <<EOF
containersNumber: 20
containersNumberParallel: 2
containerBenchmarkTimeoutSeconds: 60
podsNumber: 20
podsNumberParallel: 2
podBenchmarkTimeoutSeconds: 60
imagesNumber: 10
imagesNumberParallel: 2
imageBenchmarkTimeoutSeconds: 60
imagePullingBenchmarkImage: registry.k8s.io/e2e-test-images/busybox:1.29-2
imageListingBenchmarkImages:
  - registry.k8s.io/e2e-test-images/busybox:1.29-2
  - registry.k8s.io/pause:3.10
EOF
cp "$work/bench-params.yaml" "$out/"

endpoints=(--runtime-endpoint "unix://$work/berth.sock" --image-endpoint "unix://$work/berth.sock")
# critest releases before the NRI specs have no --nri-socket flag.
if "$bins/critest" --help 2>&1 | grep -q -- '-nri-socket'; then
	endpoints+=(--nri-socket "$work/nri.sock")
fi
"$bins/critest" --version 2>/dev/null | grep -m1 "critest version" >"$out/critest-version.txt" || true
status=0
echo "conformance: critest validation suite ($(cat "$out/critest-version.txt"))" >&2
"$bins/critest" "${endpoints[@]}" -ginkgo.json-report="$out/report.json" ${CRITEST_ARGS:-} \
	>"$out/critest.log" 2>&1 || status=1
echo "conformance: critest benchmarks" >&2
"$bins/critest" "${endpoints[@]}" -benchmark --benchmarking-params-file "$work/bench-params.yaml" \
	--benchmarking-output-dir "$out/benchmarks" -ginkgo.json-report="$out/bench-report.json" ${CRITEST_ARGS:-} \
	>"$out/critest-benchmark.log" 2>&1 || status=1

reports=()
for r in "$out/report.json" "$out/bench-report.json"; do [ -f "$r" ] && reports+=("$r"); done
if [ ${#reports[@]} -gt 0 ]; then
	(cd test/k8s/critest && go run ./summary "${reports[@]}") | tee "$out/summary.txt"
fi
echo "conformance: reports, logs and summary in $out" >&2
exit $status
