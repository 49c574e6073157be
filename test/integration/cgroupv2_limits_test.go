package integration

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/cgroupplan"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
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
	ctx := berthdtest.Ctx(t)
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

// The node e2e's v2-only OOMKiller specs, berth's side: in a container of
// several processes where one outgrows the limit, memory.oom.group=1 (what
// the kubelet sends through the unified map unless singleProcessOOMKill)
// kills the whole container, reported OOMKilled; without it only the
// greedy process dies and the container keeps running.
func TestCgroupV2OOMGroupKillsTheWholeContainer(t *testing.T) {
	if !cgroupV2() {
		t.Skip("cgroup v2 only: memory.oom.group")
	}
	t.Parallel()
	e := newCtrEnv(t)
	multi := func(name string, unified map[string]string) *criapi.ContainerConfig {
		// The init sleeps; a child asks for more than the limit at once.
		cfg := e.config(name, "sh", "-c", "sleep 3600 & sleep 1; dd if=/dev/zero of=/dev/null bs=128M count=1; wait")
		cfg.Linux.Resources = &criapi.LinuxContainerResources{MemoryLimitInBytes: 32 << 20, MemorySwapLimitInBytes: 32 << 20, Unified: unified}
		return cfg
	}
	group := e.run(multi("oom-group", map[string]string{"memory.oom.group": "1"}))
	single := e.run(multi("oom-single", nil))

	if st := e.waitExited(group); st.Reason != "OOMKilled" || st.ExitCode != 137 {
		t.Errorf("with memory.oom.group=1: reason %q exit %d, want OOMKilled 137", st.Reason, st.ExitCode)
	}
	dir := filepath.Join("/sys/fs/cgroup", procCgroup(t, hostProc(containerPid(t, e.d, single)), ""))
	waitUntil(t, "the single-process kill in "+dir, func() bool {
		data, _ := os.ReadFile(filepath.Join(dir, "memory.events"))
		for _, l := range strings.Split(string(data), "\n") {
			if f := strings.Fields(l); len(f) == 2 && f[0] == "oom_kill" && f[1] != "0" {
				return true
			}
		}
		return false
	})
	if st := e.status(single); st.State != criapi.ContainerState_CONTAINER_RUNNING {
		t.Errorf("without memory.oom.group the container is %s (reason %q), want it running with only dd killed", st.State, st.Reason)
	}
}

// The node e2e's Swap [NodeConformance] specs, berth's side: with the
// kubelet's default NoSwap on v2 a container without a memory limit gets
// memory.swap.max=0 through the unified map, and reads it in its own
// /sys/fs/cgroup (the spec reads it from inside the container).
func TestCgroupV2NoSwapSeenInTheContainer(t *testing.T) {
	if !cgroupV2() {
		t.Skip("cgroup v2 only: memory.swap.max")
	}
	t.Parallel()
	e := newCtrEnv(t)
	cfg := e.config("noswap", "sleep", "3600")
	cfg.Linux.Resources = &criapi.LinuxContainerResources{Unified: map[string]string{"memory.swap.max": "0"}}
	id := e.run(cfg)
	if got := e.exec(id, "cat", "/sys/fs/cgroup/memory.swap.max"); got != "0" {
		t.Errorf("memory.swap.max in the container = %q, want 0", got)
	}
	// Burstable with a limit: the kubelet sends swap = limit, so none.
	cfg = e.config("noswap-limit", "sleep", "3600")
	cfg.Linux.Resources = &criapi.LinuxContainerResources{MemoryLimitInBytes: 64 << 20, MemorySwapLimitInBytes: 64 << 20, Unified: map[string]string{"memory.swap.max": "0"}}
	id = e.run(cfg)
	if got := e.exec(id, "cat", "/sys/fs/cgroup/memory.swap.max", "/sys/fs/cgroup/memory.max"); got != "0\n"+strconv.Itoa(64<<20) {
		t.Errorf("memory.swap.max and memory.max in the container = %q", got)
	}
}
