#!/usr/bin/env bash
# The cgroup v2 lane (docs/decisions/2200-cgroup-v2-guest-lane.md): boots a
# Debian bookworm guest (systemd as PID 1, unified cgroup v2) under qemu and
# runs the integration tests that touch cgroups there, under the cgroupfs
# and the systemd driver and with crun, and the kubelet test (systemd
# driver). Prints the guest's test output as it comes and ends with one pass/fail line; exits non-zero on any failure or
# timeout.
#   BIN                   where make build put berthd, berth-shim, berth-lazy, berth-pause, berthctl
#   BERTH_GUEST_ACCEL     kvm or tcg (default: kvm where the CPU has VMX/SVM and
#                         /dev/kvm is the kernel's own, else tcg)
#   BERTH_GUEST_TIMEOUT   seconds before the guest is killed (default 3600)
#   BERTH_GUEST_KUBELET   0 leaves the kubelet pass (systemd driver) out of the
#                         default passes
#   BERTH_GUEST_PASSES    override the passes (lines "name driver runtime regex
#                         [binary [skip]]", binary integration or kubelet, skip
#                         a -test.skip regex)
#   BERTH_GUEST_KEEP      a directory to keep the run's logs in
#   BERTH_GUEST_K8S_DIR   a hack/k8s-bins.sh directory (kubelet, agnhost): the
#                         kubelet test's binary and these go into the guest too,
#                         for passes naming "kubelet" as their test binary
#                         (default: hack/k8s-bins.sh kubelet agnhost, built once,
#                         when a pass names it)
#   BERTH_GUEST_ONLY      the lane's parts to run, comma-separated (default
#                         all): passes (the test passes above), deb (the
#                         Debian package installed, upgraded over a pod and
#                         removed under the guest's systemd; decision 3730)
#   BERTH_GUEST_SOAK      the soak block (issue 35): 0 (default) leaves its two
#                         passes out, 1 adds them, only runs them alone
#                         (make soak-guest); off in make test: ~20 min of TCG
#   BERTH_GUEST_SOAK_MINUTES, BERTH_GUEST_SOAK_PODS  the guest soak's length
#                         and pods (default 2 and 3; every fault runs once
#                         whatever the minutes, 5 s apart; bounds ×4 under tcg)
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
bin=${BIN:-$root/bin}
timeout_s=${BERTH_GUEST_TIMEOUT:-3600}

# The passes, chosen by what they cover per minute of a TCG guest (about
# 30 s a test there; the lane's budget is 20 minutes with the image build):
# every test that looks at cgroups, limits, updates, stats, OOM, pod-level
# resources, shared-PID and user-namespace pods, teardown and recovery under
# the cgroupfs driver; under the guest's systemd (PID 1) the driver's own
# test and the limit, update, stats, OOM, shared-PID and userns tests; crun
# (Debian's refuses v1 hybrid hosts) as the default runtime for the
# container basics; two lazy-pull tests (FUSE lower dirs under overlayfs on
# the guest's own kernel, both drivers; decision 3600). The hang tests
# (monitor_hang_*) are not here: their one-second read bound is the
# kubelet's relist on real hardware, not a TCG guest's.
cgroupfs_tests='TestContainerOOMKilled|TestContainerOOMKilledAtOnce|TestContainerUpdateResources|TestUpdatePodSandboxResourcesSetsPodCgroup|TestStatsContainersAndPod|TestSandboxCgroupUnderConfigParent|TestSandboxSharedPIDVisibleInContainer|TestSandboxSharedPIDNamespaceHolder|TestCgroup(SharedPIDPodHolderHasOwnCgroup|UsernsPodHolderHasOwnCgroup|OldLayoutPodTearsDownClean)|TestContainerSurvivesDaemonCrash|TestSandboxCrashMidRunRecovers|TestRecoveryCleansResourcesWithoutRecords|TestUsernsPodContainerSeesMapping|TestHugepageLimitsOnAHostWithoutHugetlbHierarchy|TestBerthctlDoctorPassesOnThisNode|TestCgroupV2ContainerLimits|TestSwapLimitFollowsTheHostsSwapAccounting|TestCgroupV2OOMGroupKillsTheWholeContainer|TestCgroupV2NoSwapSeenInTheContainer|TestMonitorCrashKeepsContainersRunning|TestKeeperAndMonitorKilledLeaveNoUnseenProcess|TestRecoveryKillsContainersOfADeadShim|TestUsernsHostNetwork|TestUsernsProcMountUnmasked|TestLazyPullRunsBeforeTheLayerArrives|TestLazyPullMixedLayers'
systemd_tests='TestSystemdCgroupDriver|TestContainerOOMKilled|TestContainerOOMKilledAtOnce|TestContainerUpdateResources|TestStatsContainersAndPod|TestSandboxSharedPIDVisibleInContainer|TestCgroupSharedPIDPodHolderHasOwnCgroupSystemd|TestUsernsPodContainerSeesMapping|TestContainerSurvivesDaemonCrash|TestCgroupV2ContainerLimits|TestSwapLimitFollowsTheHostsSwapAccounting|TestCgroupV2OOMGroupKillsTheWholeContainer|TestCgroupV2NoSwapSeenInTheContainer|TestMonitorCrashKeepsContainersRunning|TestKeeperAndMonitorKilledLeaveNoUnseenProcess|TestRecoveryKillsContainersOfADeadShim|TestUsernsHostNetwork|TestUsernsProcMountUnmasked|TestLazyPullRunsBeforeTheLayerArrives|TestLazyPullMixedLayers'
# The kubelet test (test/kubelet, docs/kubelet.md): a real kubelet on its
# defaults for a v2 node, the systemd driver, static pods on berthd.
kubelet_tests='TestKubeletStaticPodsOnBerth'
crun_tests='TestContainerRunLogsExitCodesAndStatus|TestContainerUpdateResources|TestContainerOOMKilled|TestStatsContainersAndPod|TestSandboxSharedPIDVisibleInContainer|TestExecSyncOutputsExitCodesAndErrors|TestCgroupV2ContainerLimits|TestCgroupV2OOMGroupKillsTheWholeContainer|TestCgroupV2NoSwapSeenInTheContainer'
default_passes="cgroupfs cgroupfs runc ^($cgroupfs_tests)\$
systemd systemd runc ^($systemd_tests)\$
crun cgroupfs crun ^($crun_tests)\$
kubelet systemd runc ^($kubelet_tests)\$ kubelet"
# BERTH_GUEST_KUBELET=0 leaves the kubelet pass out (a quicker lane while
# working on the others).
if [ "${BERTH_GUEST_KUBELET:-1}" = 0 ]; then
  default_passes=$(grep -v '^kubelet ' <<<"$default_passes")
fi

# --- The soak block (issue 35, docs/decisions/3500-soak.md) ---
# A short soak (test/soak: a real kubelet, a few pods, a few minutes, the
# whole fault list) under each driver. BERTH_GUEST_SOAK=only runs these
# passes alone, 0 (the default) leaves them out: the two passes cost about
# 20 minutes of TCG, which make test's 60-minute budget on a fresh machine
# cannot carry (decision 3500); make soak-guest runs them.
soak_minutes=${BERTH_GUEST_SOAK_MINUTES:-2}
soak_pods=${BERTH_GUEST_SOAK_PODS:-3}
soak_passes="soak-cgroupfs cgroupfs runc ^TestSoak\$ soak
soak-systemd systemd runc ^TestSoak\$ soak"
case ${BERTH_GUEST_SOAK:-0} in
  0) ;;
  only) default_passes=$soak_passes ;;
  *) default_passes="$default_passes
$soak_passes" ;;
esac
# --- end of the soak block ---

passes=${BERTH_GUEST_PASSES:-$default_passes}

# The lane's parts (BERTH_GUEST_ONLY picks some to run alone).
only=${BERTH_GUEST_ONLY:-}
for want_part in ${only//,/ }; do
  case $want_part in
    passes|deb) ;;
    *) echo "guest lane: BERTH_GUEST_ONLY=$only: unknown part $want_part (want passes, deb)" >&2; exit 2 ;;
  esac
done
part() { [ -z "$only" ] || [[ ",$only," == *",$1,"* ]]; }
part passes || passes=

accel=${BERTH_GUEST_ACCEL:-}
if [ -z "$accel" ]; then
  accel=tcg
  # A PVM /dev/kvm (no VMX/SVM in the CPU flags) hangs a stock kernel.
  if [ -w /dev/kvm ] && grep -qwE 'vmx|svm' /proc/cpuinfo && [ ! -d /sys/module/kvm_pvm ]; then
    accel=kvm
  fi
fi
case $accel in
  kvm) qemu_accel=(-accel kvm -cpu host) ;;
  tcg) qemu_accel=(-accel tcg,thread=multi -cpu max) ;;
  *) echo "guest lane: BERTH_GUEST_ACCEL=$accel: want kvm or tcg" >&2; exit 2 ;;
esac

for f in berthd berth-shim berth-lazy berth-pause berthctl; do
  [ -x "$bin/$f" ] || { echo "guest lane: $bin/$f is missing (make build)" >&2; exit 2; }
done

t0=$SECONDS
if [ -z "${BERTH_GUEST_K8S_DIR:-}" ] && awk '$5 == "kubelet" || $5 == "soak" {found=1} END {exit !found}' <<<"$passes"; then
  BERTH_GUEST_K8S_DIR=$(hack/k8s-bins.sh kubelet agnhost)
  echo "guest lane: kubelet and agnhost from $BERTH_GUEST_K8S_DIR, ready after $((SECONDS - t0))s"
fi
image=$(hack/guest/image.sh)
echo "guest lane: image $image ($(cat "$image/done")), ready after $((SECONDS - t0))s"

work=$(mktemp -d /var/tmp/berth-guest-XXXXXX)
qemu_pid=
tail_pid=
cleanup() {
  [ -n "$tail_pid" ] && kill "$tail_pid" 2>/dev/null || true
  if [ -n "$qemu_pid" ] && kill -0 "$qemu_pid" 2>/dev/null; then
    kill "$qemu_pid" 2>/dev/null || true
    wait "$qemu_pid" 2>/dev/null || true
  fi
  if [ -n "${BERTH_GUEST_KEEP:-}" ]; then
    mkdir -p "$BERTH_GUEST_KEEP" && cp "$work"/*.log "$BERTH_GUEST_KEEP"/ 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The payload disk: the binaries, the test binary with its testdata, the
# runner and the passes.
p=$work/payload
mkdir -p "$p/bin" "$p/integration"
cp "$bin"/berthd "$bin"/berth-shim "$bin"/berth-lazy "$bin"/berth-pause "$bin"/berthctl "$p/bin/"
if [ -n "$passes" ]; then
  go test -c -o "$p/integration/integration.test" ./test/integration
  cp -r test/integration/testdata "$p/integration/"
fi
if [ -n "${BERTH_GUEST_K8S_DIR:-}" ]; then
  mkdir -p "$p/kubelet" "$p/k8s"
  go test -c -o "$p/kubelet/kubelet.test" ./test/kubelet
  cp "$BERTH_GUEST_K8S_DIR"/kubelet "$BERTH_GUEST_K8S_DIR"/agnhost "$p/k8s/"
fi
# --- The package part (issue 37, decision 3730): two .debs of this build,
# the second one version higher for the upgrade (uncompressed: a TCG guest
# is slow to inflate them), crictl and the script
# that installs, upgrades, removes and purges them in the guest
# (payload-deb.sh, run after the passes).
if part deb; then
  mkdir -p "$p/deb"
  cp "$(hack/k8s-bins.sh crictl)/crictl" "$p/deb/"
  deb_v1=$(BIN=$bin hack/deb.sh version)
  deb1=$(BIN=$bin DEB_OUT="$p/deb" DEB_VERSION="$deb_v1" DEB_COMPRESS=none hack/deb.sh)
  deb2=$(BIN=$bin DEB_OUT="$p/deb" DEB_VERSION="$deb_v1+upgrade" DEB_COMPRESS=none hack/deb.sh)
  echo "$deb_v1" >"$p/deb/v1"
  echo "$deb_v1+upgrade" >"$p/deb/v2"
  basename "$deb1" >"$p/deb/deb1"
  basename "$deb2" >"$p/deb/deb2"
  cp hack/guest/payload-deb.sh "$p/deb/run.sh"
fi
# --- end of the package part
# The soak block's test binary and its length (payload-run.sh exports
# lane.env's SOAK_ variables to every pass; only TestSoak reads them).
if awk '$5 == "soak" {found=1} END {exit !found}' <<<"$passes"; then
  mkdir -p "$p/soak"
  go test -c -o "$p/soak/soak.test" ./test/soak
fi
cp hack/guest/payload-run.sh "$p/run.sh"
{
  printf 'PASSES=%q\n' "$passes"
  printf 'PASS_TIMEOUT=%q\n' "${BERTH_GUEST_PASS_TIMEOUT:-20m}"
  printf 'PARALLEL=%q\n' "${BERTH_GUEST_PARALLEL:-3}"
  printf 'export SOAK_MINUTES=%q SOAK_PODS=%q SOAK_FAULT_GAP=5 SOAK_BOUND_SCALE=%q SOAK_OUT=/tmp/soak\n' \
    "$soak_minutes" "$soak_pods" "$([ "$accel" = tcg ] && echo 4 || echo 1)"
} >"$p/lane.env"
size_mb=$(( $(du -sm "$p" | cut -f1) + 128 ))
truncate -s "${size_mb}M" "$work/payload.img"
mkfs.ext4 -q -F -L payload -d "$p" "$work/payload.img"
rm -rf "$p"
# Runs write to an overlay: the cached image stays clean.
qemu-img create -q -f qcow2 -b "$image/rootfs.img" -F raw "$work/root.qcow2"
: >"$work/results.log"

echo "guest lane: booting ($accel), payload ready after $((SECONDS - t0))s"
qemu-system-x86_64 "${qemu_accel[@]}" -smp 2 -m 4G \
  -kernel "$image/vmlinuz" -initrd "$image/initrd.img" \
  -append "root=/dev/vda rw console=ttyS0 panic=-1 systemd.unified_cgroup_hierarchy=1 systemd.show_status=0" \
  -drive "file=$work/root.qcow2,if=virtio,format=qcow2" \
  -drive "file=$work/payload.img,if=virtio,format=raw" \
  -nic none -display none -monitor none -no-reboot \
  -serial "file:$work/console.log" -serial "file:$work/results.log" &
qemu_pid=$!
tail -n +1 -f --pid="$qemu_pid" "$work/results.log" &
tail_pid=$!

deadline=$((SECONDS + timeout_s))
while kill -0 "$qemu_pid" 2>/dev/null; do
  if [ "$SECONDS" -ge "$deadline" ]; then
    echo "guest lane: FAIL: the guest did not finish in ${timeout_s}s; its console's tail:" >&2
    tail -n 60 "$work/console.log" >&2 || true
    exit 1
  fi
  sleep 2
done
wait "$qemu_pid" || true
qemu_pid=
wait "$tail_pid" 2>/dev/null || true
tail_pid=

result=$(grep -a '^BERTH-GUEST-RESULT' "$work/results.log" | tail -1 || true)
if [ -z "$result" ]; then
  echo "guest lane: FAIL: the guest powered off without a result; its console's tail:" >&2
  tail -n 60 "$work/console.log" >&2 || true
  exit 1
fi
if [ "${result#BERTH-GUEST-RESULT rc=0}" = "$result" ]; then
  echo "guest lane: FAIL after $((SECONDS - t0))s: ${result#BERTH-GUEST-RESULT }"
  exit 1
fi
echo "guest lane: PASS after $((SECONDS - t0))s (cgroup v2 guest, $accel)"
