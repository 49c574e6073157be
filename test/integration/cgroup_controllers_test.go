package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/cgroupctrl"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/leakcheck"
)

// hugePageSizes lists the node's hugepage sizes as the CRI spells them
// ("2MB"), as the kubelet finds them (/sys/kernel/mm/hugepages), smallest
// first.
func hugePageSizes(t *testing.T) []string {
	t.Helper()
	entries, err := os.ReadDir("/sys/kernel/mm/hugepages")
	if err != nil {
		t.Skipf("no hugepages on this kernel: %v", err)
	}
	var kbs []int
	for _, e := range entries {
		kb, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(e.Name(), "hugepages-"), "kB"))
		if err == nil {
			kbs = append(kbs, kb)
		}
	}
	slices.Sort(kbs)
	var sizes []string
	for _, kb := range kbs {
		switch {
		case kb >= 1<<20:
			sizes = append(sizes, fmt.Sprintf("%dGB", kb>>20))
		case kb >= 1<<10:
			sizes = append(sizes, fmt.Sprintf("%dMB", kb>>10))
		default:
			sizes = append(sizes, fmt.Sprintf("%dKB", kb))
		}
	}
	if len(sizes) == 0 {
		t.Skip("no hugepage sizes on this kernel")
	}
	return sizes
}

// kubeletHugepages is what the kubelet puts in every container: a limit
// for each of the node's page sizes, 0 unless the pod asks for hugepages
// (here: 4 MiB of the smallest size; the kernel rounds a limit down to
// whole pages, so 4 MiB of 1 GiB pages would read back 0).
func kubeletHugepages(sizes []string) *criapi.LinuxContainerResources {
	r := &criapi.LinuxContainerResources{CpuShares: 2, MemoryLimitInBytes: 64 << 20}
	for i, s := range sizes {
		var limit uint64
		if i == 0 {
			limit = 4 << 20
		}
		r.HugepageLimits = append(r.HugepageLimits, &criapi.HugepageLimit{PageSize: s, Limit: limit})
	}
	return r
}

// TestHugepageLimitsOnAHostWithoutHugetlbHierarchy: containers the way
// the kubelet sends them (a hugepage limit per page size) run on a node
// whose hugetlb controller is not mounted, as this development machine's
// is not; berthd says once, at start, that it drops those limits, and
// berthctl info shows the controller missing. Where the host does mount
// hugetlb, the limit lands in the container's cgroup instead.
func TestHugepageLimitsOnAHostWithoutHugetlbHierarchy(t *testing.T) {
	t.Parallel()
	sizes := hugePageSizes(t)
	host, err := cgroupctrl.Detect(cgroupctrl.Options{Parent: "/"})
	if err != nil {
		t.Fatal(err)
	}
	e := newCtrEnv(t)
	scope := leakcheck.ForDaemon(e.d)
	scope.Root = e.d.Root
	before := leakcheck.Take(t, scope)

	var ids []string
	for i := range 2 {
		cfg := e.config(fmt.Sprintf("huge%d", i), "sleep", "3600")
		cfg.Linux.Resources = kubeletHugepages(sizes)
		id := e.run(cfg)
		ids = append(ids, id)
		if st := e.status(id); st.State != criapi.ContainerState_CONTAINER_RUNNING {
			t.Fatalf("container with hugepage limits is %s", st.State)
		}
		// Status reports what the kubelet asked.
		if got := e.status(id).GetResources().GetLinux().GetHugepageLimits(); len(got) != len(sizes) {
			t.Fatalf("status hugepage limits = %v", got)
		}
	}
	// Updates carry hugepage limits too.
	if _, err := e.d.Runtime.UpdateContainerResources(berthdtest.Ctx(t), &criapi.UpdateContainerResourcesRequest{
		ContainerId: ids[0], Linux: kubeletHugepages(sizes),
	}); err != nil {
		t.Fatalf("UpdateContainerResources with hugepage limits: %v", err)
	}

	limitFile := fmt.Sprintf("hugetlb.%s.limit_in_bytes", sizes[0])
	if cgroupV2() {
		limitFile = fmt.Sprintf("hugetlb.%s.max", sizes[0])
	}
	if host.Has("hugetlb") {
		cg := cgroupOf(t, containerPid(t, e.d, ids[0]), "hugetlb")
		data, err := os.ReadFile(filepath.Join(cgroupDir("hugetlb", cg), limitFile))
		if err != nil || strings.TrimSpace(string(data)) != strconv.Itoa(4<<20) {
			t.Fatalf("hugetlb mounted here, but %s = %q (%v)", limitFile, data, err)
		}
	} else {
		const line = "cgroup controllers missing: their limits are dropped from every container"
		if n := strings.Count(e.d.Logs(), line); n != 1 {
			t.Fatalf("berthd logged %q %d times, want once:\n%s", line, n, e.d.Logs())
		}
		out, code := runBerthctl(t, "--address", "unix://"+e.d.Socket, "info")
		if code != 0 || !strings.Contains(out, "missing:    hugetlb (hugepage limits dropped)") || !strings.Contains(out, "controllers: v1") && !strings.Contains(out, "controllers: v2") {
			t.Fatalf("berthctl info (exit %d) does not show hugetlb missing:\n%s", code, out)
		}
	}

	for _, id := range ids {
		if _, err := e.d.Runtime.StopContainer(berthdtest.Ctx(t), &criapi.StopContainerRequest{ContainerId: id}); err != nil {
			t.Fatal(err)
		}
		if _, err := e.d.Runtime.RemoveContainer(berthdtest.Ctx(t), &criapi.RemoveContainerRequest{ContainerId: id}); err != nil {
			t.Fatal(err)
		}
	}
	leakcheck.CheckSettled(t, scope, before, leakcheck.Take(t, scope))
}

// TestHugepageLimitLandsWithTheHugetlbHierarchyMounted gives this test's
// berthd a hugetlb hierarchy at /sys/fs/cgroup/hugetlb in a mount
// namespace of its own (the node and other tests' daemons keep theirs):
// berthd detects the controller from the mount, keeps the limits, runc
// sets them, and the pod's cgroup in that hierarchy goes with the pod.
func TestHugepageLimitLandsWithTheHugetlbHierarchyMounted(t *testing.T) {
	t.Parallel()
	sizes := hugePageSizes(t)
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		t.Skip("cgroup v2: no v1 hugetlb hierarchy to mount")
	}
	if ok, why := berthdtest.CanMountHugetlb(); !ok {
		t.Skipf("a hugetlb hierarchy cannot be mounted here: %s", why)
	}
	d := berthdtest.Start(t, berthdtest.Options{StartProcess: berthdtest.StartWithPrivateHugetlb(t.TempDir())})
	// What berthd sees, through its root in its mount namespace.
	hugetlb := fmt.Sprintf("/proc/%d/root/sys/fs/cgroup/hugetlb", d.Pid())
	if _, err := os.Stat(filepath.Join(hugetlb, "cgroup.procs")); err != nil {
		t.Fatalf("hugetlb hierarchy not mounted in berthd's namespace: %v", err)
	}
	// The hierarchy outlives the mount (the kernel keeps it while it has
	// cgroups): remove the daemon's parent from it before berthd goes.
	t.Cleanup(func() {
		if err := berthdtest.RemoveCgroupTree(filepath.Join(hugetlb, d.Config.CgroupParent)); err != nil {
			t.Errorf("remove test cgroups from the hugetlb hierarchy: %v", err)
		}
	})
	if strings.Contains(d.Logs(), "hugepage limits") {
		t.Fatalf("berthd reports hugetlb missing with it mounted:\n%s", d.Logs())
	}
	out, code := runBerthctl(t, "--address", "unix://"+d.Socket, "info")
	if code != 0 || !strings.Contains(out, "hugetlb") || strings.Contains(out, "missing:    hugetlb") {
		t.Fatalf("berthctl info (exit %d):\n%s", code, out)
	}

	e := newCtrEnvOn(t, d)
	cfg := e.config("huge", "sleep", "3600")
	cfg.Linux.Resources = kubeletHugepages(sizes)
	id := e.run(cfg)
	cg := cgroupOf(t, containerPid(t, d, id), "hugetlb")
	if !strings.HasPrefix(cg, "/"+d.Config.CgroupParent+"/") {
		t.Fatalf("container's hugetlb cgroup %s is not below the pod's", cg)
	}
	for i, s := range sizes {
		want := "0"
		if i == 0 {
			want = strconv.Itoa(4 << 20)
		}
		data, err := os.ReadFile(filepath.Join(hugetlb, cg, "hugetlb."+s+".limit_in_bytes"))
		if err != nil || strings.TrimSpace(string(data)) != want {
			t.Fatalf("hugetlb.%s.limit_in_bytes = %q (%v), want %s", s, data, err, want)
		}
	}
	// The container sees its limit too (runc mounts the hierarchy).
	r, err := execSync(t, d, id, 10, "cat", "/sys/fs/cgroup/hugetlb/hugetlb."+sizes[0]+".limit_in_bytes")
	if err != nil || strings.TrimSpace(string(r.Stdout)) != strconv.Itoa(4<<20) {
		t.Fatalf("inside the container: %+v, %v", r, err)
	}

	stopRemove(t, d, e.pod)
	entries, _ := os.ReadDir(filepath.Join(hugetlb, d.Config.CgroupParent))
	for _, e := range entries {
		if e.IsDir() {
			t.Fatalf("pod cgroup left in the hugetlb hierarchy: %s", e.Name())
		}
	}
}
