package integration

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/fault"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
)

// One conversion, one probe, one behaviour (decision 3700): a swap limit
// is applied where the host accounts swap and left out where it does not,
// at CreateContainer and UpdateContainerResources alike, so the container
// runs on both hosts and its cgroup shows what was applied; the spec
// metrics say the same. The host without swap accounting is this one with
// the start-time probe's answer injected (fault.HostFailSwapAccounting);
// the one with it is skipped where the kernel has none. A swap limit below
// the memory limit is refused at create and update alike. Runs in the
// cgroup v2 guest lane too (hack/guest/lane.sh).
func TestSwapLimitFollowsTheHostsSwapAccounting(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		env        []string
		accounting bool
	}{
		{name: "with accounting", accounting: true},
		{name: "without accounting", env: []string{fault.EnvVar + "=" + string(fault.HostFailSwapAccounting)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if tc.accounting && !kernelSwapAccounting() {
				t.Skip("the kernel accounts no swap here (swapaccount=0?): only the injected case applies")
			}
			e := newCtrEnvOn(t, berthdtest.Start(t, berthdtest.Options{Env: tc.env}))
			ctx := berthdtest.Ctx(t)

			cfg := e.config("swap", "sleep", "3600")
			cfg.Linux.Resources = &criapi.LinuxContainerResources{MemoryLimitInBytes: 64 << 20, MemorySwapLimitInBytes: 96 << 20}
			id := e.run(cfg)
			pid := containerPid(t, e.d, id)
			checkSwap(t, e, id, pid, 64<<20, 96<<20, tc.accounting)

			upd := &criapi.LinuxContainerResources{MemoryLimitInBytes: 128 << 20, MemorySwapLimitInBytes: 192 << 20}
			if _, err := e.d.Runtime.UpdateContainerResources(ctx, &criapi.UpdateContainerResourcesRequest{ContainerId: id, Linux: upd}); err != nil {
				t.Fatalf("UpdateContainerResources: %v", err)
			}
			checkSwap(t, e, id, pid, 128<<20, 192<<20, tc.accounting)

			// Below the memory limit: refused by both, the container as it was.
			bad := &criapi.LinuxContainerResources{MemoryLimitInBytes: 64 << 20, MemorySwapLimitInBytes: 32 << 20}
			_, err := e.d.Runtime.UpdateContainerResources(ctx, &criapi.UpdateContainerResourcesRequest{ContainerId: id, Linux: bad})
			berthdtest.WantCode(t, err, codes.InvalidArgument)
			badCfg := e.config("badswap", "sleep", "3600")
			badCfg.Linux.Resources = bad
			_, err = e.d.Runtime.CreateContainer(ctx, &criapi.CreateContainerRequest{PodSandboxId: e.pod, Config: badCfg, SandboxConfig: e.podCfg})
			berthdtest.WantCode(t, err, codes.InvalidArgument)
			checkSwap(t, e, id, pid, 128<<20, 192<<20, tc.accounting)
		})
	}
}

// checkSwap compares the container's memory cgroup and its spec metric
// with a memory limit and a CRI swap limit (memory+swap), applied or,
// without accounting, left out.
func checkSwap(t *testing.T, e *ctrEnv, id string, pid int, limit, swap int64, accounting bool) {
	t.Helper()
	if got, err := memoryLimitOf(t, pid); err != nil || got != strconv.FormatInt(limit, 10) {
		t.Fatalf("memory limit %q, %v; want %d", got, err, limit)
	}
	dir := memoryCgroupDir(cgroupOf(t, pid, "memory"))
	file, want := "memory.memsw.limit_in_bytes", strconv.FormatInt(swap, 10)
	if cgroupV2() {
		// v2 limits swap alone; the CRI's limit is memory+swap.
		file, want = "memory.swap.max", strconv.FormatInt(swap-limit, 10)
	}
	data, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	got := strings.TrimSpace(string(data))
	switch {
	case accounting && got != want:
		t.Errorf("%s = %s, want %s", file, got, want)
	case !accounting && !unlimited(got):
		t.Errorf("%s = %s without swap accounting: a swap limit was written", file, got)
	}
	wantMetric := uint64(swap)
	if !accounting {
		wantMetric = 0
	}
	_, ctr := podMetricsOf(t, e.d, e.pod, id)
	if m := ctr["container_spec_memory_swap_limit_bytes"]; len(m) != 1 || m[0].GetValue().GetValue() != wantMetric {
		t.Errorf("container_spec_memory_swap_limit_bytes %v, want %d", m, wantMetric)
	}
	// Status has the memory limit (its swap is the spec's after a create
	// with NRI on, the request's after an update: not pinned here).
	if r := e.status(id).GetResources().GetLinux(); r.GetMemoryLimitInBytes() != limit {
		t.Errorf("status resources %v, want memory limit %d", r, limit)
	}
}

// unlimited is a cgroup limit file's "no limit": "max" on v2, the page
// counter's maximum (over 2^62) on v1.
func unlimited(v string) bool {
	if v == "max" {
		return true
	}
	n, err := strconv.ParseUint(v, 10, 64)
	return err == nil && n > 1<<62
}

// kernelSwapAccounting reports whether the kernel accounts swap in memory
// cgroups, read as the kubelet does (memsw files on v1; memory.swap.max
// in a child cgroup on v2, here the test's own).
func kernelSwapAccounting() bool {
	if !cgroupV2() {
		_, err := os.Stat("/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes")
		return err == nil
	}
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return false
	}
	own := strings.TrimPrefix(strings.TrimSpace(string(data)), "0::")
	_, err = os.Stat(filepath.Join("/sys/fs/cgroup", own, "memory.swap.max"))
	return err == nil
}
