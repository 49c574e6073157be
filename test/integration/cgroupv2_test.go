package integration

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The tests that look into cgroups run on both versions: cgroup v1 (and
// hybrid) on the development machines, the unified v2 hierarchy in the
// guest lane (hack/guest, docs/decisions/2200-cgroup-v2-guest-lane.md).

// cgroupV2 reports whether the node runs the unified hierarchy alone.
func cgroupV2() bool {
	_, err := os.Stat("/sys/fs/cgroup/cgroup.controllers")
	return err == nil
}

// cgroupDir is group's directory for controller: in that controller's v1
// hierarchy, or in the unified hierarchy on v2.
func cgroupDir(controller, group string) string {
	if cgroupV2() {
		return filepath.Join("/sys/fs/cgroup", group)
	}
	return filepath.Join("/sys/fs/cgroup", controller, group)
}

// cgroupLimits are the values of a group's memory and CPU limits, read
// from whichever version's files the node has, in v1's units.
type cgroupLimits struct {
	Memory    string // bytes; "max" when unlimited on v2
	CPUShares string // v1 cpu.shares; on v2 the cpu.weight as read
	CPUQuota  string // microseconds per period; "max" when unlimited on v2
}

func readCgroupLimits(t *testing.T, group string) cgroupLimits {
	t.Helper()
	read := func(controller, file string) string {
		t.Helper()
		data, err := os.ReadFile(filepath.Join(cgroupDir(controller, group), file))
		if err != nil {
			t.Fatalf("read %s of cgroup %s: %v", file, group, err)
		}
		return strings.TrimSpace(string(data))
	}
	if cgroupV2() {
		quota, _, _ := strings.Cut(read("cpu", "cpu.max"), " ")
		return cgroupLimits{Memory: read("memory", "memory.max"), CPUShares: read("cpu", "cpu.weight"), CPUQuota: quota}
	}
	return cgroupLimits{
		Memory:    read("memory", "memory.limit_in_bytes"),
		CPUShares: read("cpu", "cpu.shares"),
		CPUQuota:  read("cpu", "cpu.cfs_quota_us"),
	}
}

// wantShares is what the cgroup shows for CPU shares: the shares on v1,
// the weight the runtimes convert them to on v2.
func wantShares(shares uint64) string {
	if cgroupV2() {
		return strconv.FormatUint(1+((shares-2)*9999)/262142, 10)
	}
	return strconv.FormatUint(shares, 10)
}

// memoryLimitFile is the file of a cgroup's memory limit.
func memoryLimitFile() string {
	if cgroupV2() {
		return "memory.max"
	}
	return "memory.limit_in_bytes"
}
