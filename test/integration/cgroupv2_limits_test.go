package integration

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/cgroupplan"
)

// A container as a current kubelet on a cgroup v2 node shapes it: shares,
// quota, a memory limit with LimitedSwap's swap, MemoryQoS's memory.high and
// singleProcessOOMKill=false's memory.oom.group through the unified map, a
// cpuset and a zero hugepage limit. Each lands in the container's own v2
// file (cpu.weight by the kubelet's shares conversion), the container sees
// its cgroup as the root of a cgroup namespace, stats carry PSI, and
// UpdateContainerResources (in-place resize) rewrites the files. Runs in the
// guest lane under both drivers and with crun (docs/cgroups.md).
func TestCgroupV2ContainerLimits(t *testing.T) {
	if !cgroupV2() {
		t.Skip("cgroup v2 only: the v1 files are covered by TestContainerUpdateResources and the sandbox tests")
	}
	t.Parallel()
	e := newCtrEnv(t)
	ctx := ctxT(t)
	cfg := e.config("limits", "sleep", "3600")
	cfg.Linux.Resources = &criapi.LinuxContainerResources{
		CpuShares:              512,
		CpuQuota:               50000,
		CpuPeriod:              100000,
		MemoryLimitInBytes:     64 << 20,
		MemorySwapLimitInBytes: 96 << 20,
		CpusetCpus:             "0",
		CpusetMems:             "0",
		HugepageLimits:         []*criapi.HugepageLimit{{PageSize: "2MB", Limit: 0}},
		Unified: map[string]string{
			"memory.high":      strconv.Itoa(48 << 20),
			"memory.oom.group": "1",
		},
	}
	id := e.run(cfg)
	pid := containerPid(t, e.d, id)
	cg := procCgroup(t, hostProc(pid), "")
	dir := filepath.Join("/sys/fs/cgroup", cg)
	want := map[string]string{
		"cpu.weight":       strconv.FormatUint(cgroupplan.CPUWeightFromShares(512), 10),
		"cpu.max":          "50000 100000",
		"memory.max":       strconv.Itoa(64 << 20),
		"memory.swap.max":  strconv.Itoa(32 << 20), // the CRI's limit is memory+swap
		"memory.high":      strconv.Itoa(48 << 20),
		"memory.oom.group": "1",
		"cpuset.cpus":      "0",
		"cpuset.mems":      "0",
	}
	if _, err := os.Stat(filepath.Join(dir, "hugetlb.2MB.max")); err == nil {
		want["hugetlb.2MB.max"] = "0"
	}
	checkCgroupFiles(t, dir, want)

	// The container's own view: its cgroup is the root of its namespace.
	if got := e.exec(id, "cat", "/proc/self/cgroup"); got != "0::/" {
		t.Errorf("/proc/self/cgroup in the container = %q, want 0::/ (a cgroup namespace of its own)", got)
	}

	// Stats from the v2 files, with pressure where the kernel keeps it.
	resp, err := e.d.Runtime.ContainerStats(ctx, &criapi.ContainerStatsRequest{ContainerId: id})
	if err != nil {
		t.Fatal(err)
	}
	st := resp.GetStats()
	if st.GetMemory().GetWorkingSetBytes().GetValue() == 0 || st.GetCpu().GetUsageCoreNanoSeconds().GetValue() == 0 {
		t.Errorf("stats lack memory working set or CPU usage: %v", st)
	}
	if _, err := os.Stat(filepath.Join(dir, "cpu.pressure")); err == nil {
		if st.GetCpu().GetPsi().GetSome() == nil || st.GetMemory().GetPsi().GetFull() == nil || st.GetIo().GetPsi().GetSome() == nil {
			t.Errorf("the kernel keeps pressure for %s, stats carry none: cpu %v memory %v io %v", cg, st.GetCpu().GetPsi(), st.GetMemory().GetPsi(), st.GetIo())
		}
	}

	// In-place resize.
	upd := &criapi.LinuxContainerResources{
		CpuShares:              1024,
		CpuQuota:               80000,
		CpuPeriod:              100000,
		MemoryLimitInBytes:     128 << 20,
		MemorySwapLimitInBytes: 192 << 20,
		Unified:                map[string]string{"memory.high": strconv.Itoa(96 << 20), "memory.oom.group": "1"},
	}
	if _, err := e.d.Runtime.UpdateContainerResources(ctx, &criapi.UpdateContainerResourcesRequest{ContainerId: id, Linux: upd}); err != nil {
		t.Fatalf("UpdateContainerResources: %v", err)
	}
	checkCgroupFiles(t, dir, map[string]string{
		"cpu.weight":      strconv.FormatUint(cgroupplan.CPUWeightFromShares(1024), 10),
		"cpu.max":         "80000 100000",
		"memory.max":      strconv.Itoa(128 << 20),
		"memory.swap.max": strconv.Itoa(64 << 20),
		"memory.high":     strconv.Itoa(96 << 20),
	})
	stopRemove(t, e.d, e.pod)
	if _, err := os.Stat(dir); err == nil {
		t.Errorf("container cgroup %s left after the pod went", cg)
	}
}

// checkCgroupFiles compares each file of dir with its wanted content.
func checkCgroupFiles(t *testing.T, dir string, want map[string]string) {
	t.Helper()
	for file, w := range want {
		data, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil {
			t.Errorf("%s: %v", file, err)
			continue
		}
		if got := strings.TrimSpace(string(data)); got != w {
			t.Errorf("%s of %s = %q, want %q", file, dir, got, w)
		}
	}
}
