#!/usr/bin/env bash
# Runs inside the cgroup v2 guest (copied to the payload disk as run.sh;
# berth-guest.service starts it with its output on the second serial port).
# Runs each pass of lane.env's PASSES, then prints the result line the host
# looks for. Never exits early: a pass that fails is reported, the others run.
set -uo pipefail

# Plain newlines on the serial port (no \r for the host to strip).
stty -onlcr </dev/ttyS1 2>/dev/null || true
cd /payload
mount -o remount,rw /payload
# shellcheck source=/dev/null
. ./lane.env
export PATH=/payload/bin:$PATH BERTHD_BIN=/payload/bin/berthd BERTH_BIN_DIR=/payload/bin
export HOME=/root

echo "=== guest: kernel $(uname -r), /sys/fs/cgroup is $(stat -fc %T /sys/fs/cgroup)," \
  "controllers: $(cat /sys/fs/cgroup/cgroup.controllers 2>/dev/null)"
echo "=== guest: PID 1 is $(cat /proc/1/comm), runc $(runc --version | head -1 | cut -d' ' -f3), crun $(crun --version | head -1 | cut -d' ' -f3), $(nproc) CPUs"
echo "=== guest: booted in $(cut -d' ' -f1 /proc/uptime)s"

failed=()
# The kubelet wants a default route (its node IP); the guest has no uplink.
if [ -d /payload/k8s ] && ! ip route show default | grep -q .; then
  ip link add berth-uplink type dummy && ip addr add 10.254.254.1/24 dev berth-uplink &&
    ip link set berth-uplink up && ip route add default via 10.254.254.254 dev berth-uplink
  export BERTH_K8S_BIN_DIR=/payload/k8s
fi

# PASSES: one line each, "name driver runtime regex [test binary [skip]]";
# the binary is integration (default) or kubelet; skip, a -test.skip
# regex, leaves out tests or subtests the run regex matches.
while read -r name driver runtime regex suite skip; do
  [ -n "$name" ] || continue
  suite=${suite:-integration}
  echo "=== pass $name: cgroup driver $driver, runtime $runtime, $suite.test -run '$regex'${skip:+ -skip '$skip'}"
  start=$SECONDS
  oci_version=
  [ "$runtime" = crun ] && oci_version=1.0.2 # crun 1.8.1 knows no later ociVersion
  (cd "$suite" && BERTH_TEST_CGROUP_DRIVER=$driver BERTH_TEST_RUNTIME=$runtime BERTH_TEST_OCI_VERSION=$oci_version \
    "./$suite.test" -test.v -test.count=1 -test.timeout "${PASS_TIMEOUT:-20m}" \
    -test.parallel "${PARALLEL:-2}" -test.run "$regex" ${skip:+-test.skip "$skip"})
  rc=$?
  echo "=== pass $name: exit $rc in $((SECONDS - start))s"
  [ "$rc" -eq 0 ] || failed+=("$name")
done <<<"$PASSES"

# --- The package part (lane.sh puts deb/ on the payload when it runs;
# decision 3730): last, since it installs berth system-wide.
if [ -x /payload/deb/run.sh ]; then
  echo "=== part deb: the Debian package under systemd"
  start=$SECONDS
  /payload/deb/run.sh
  rc=$?
  echo "=== part deb: exit $rc in $((SECONDS - start))s"
  [ "$rc" -eq 0 ] || failed+=(deb)
fi
# --- end of the package part

if [ ${#failed[@]} -eq 0 ]; then
  echo "BERTH-GUEST-RESULT rc=0 passes ok"
else
  echo "BERTH-GUEST-RESULT rc=1 failed passes: ${failed[*]}"
fi
sync
# The result is out and the disks are thrown away: power off now rather
# than wait for systemd to stop what a failed test left running.
echo o >/proc/sysrq-trigger
