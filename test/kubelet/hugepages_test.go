package kubelet

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/berthcri/berth/internal/cgroupctrl"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
)

// nrHugepages2M is the node's pool of 2 MiB pages, what the kubelet
// reports as hugepages-2Mi capacity when it starts.
const nrHugepages2M = "/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages"

// addHugepages grows the node's 2 MiB pool by n pages until the test
// ends (by n, not to n: tests of other checkouts may do the same at once).
func addHugepages(t *testing.T, n int) {
	t.Helper()
	read := func() int {
		data, err := os.ReadFile(nrHugepages2M)
		if err != nil {
			t.Skipf("no 2 MiB hugepages on this kernel: %v", err)
		}
		v, err := strconv.Atoi(strings.TrimSpace(string(data)))
		if err != nil {
			t.Fatalf("%s: %v", nrHugepages2M, err)
		}
		return v
	}
	cur := read()
	if err := os.WriteFile(nrHugepages2M, []byte(strconv.Itoa(cur+n)), 0o644); err != nil {
		t.Fatalf("grow the hugepage pool: %v", err)
	}
	t.Cleanup(func() {
		now := read()
		_ = os.WriteFile(nrHugepages2M, []byte(strconv.Itoa(max(now-n, 0))), 0o644)
	})
	if got := read(); got < cur+n {
		t.Skipf("the kernel found only %d of %d 2 MiB pages", got-cur, n)
	}
}

// A guaranteed pod asking for 4 MiB of 2 MiB pages, with a hugetlbfs
// emptyDir.
const hugePod = `apiVersion: v1
kind: Pod
metadata:
  name: huge
spec:
  terminationGracePeriodSeconds: 2
  volumes:
  - name: hp
    emptyDir: {medium: HugePages}
  containers:
  - name: huge
    image: {{BUSYBOX}}
    command: [sleep, "3600"]
    resources:
      requests: {cpu: 100m, memory: 64Mi, hugepages-2Mi: 4Mi}
      limits: {cpu: 100m, memory: 64Mi, hugepages-2Mi: 4Mi}
    volumeMounts: [{name: hp, mountPath: /hugepages}]
`

const hugeLimitFile = "hugetlb.2MB.limit_in_bytes"

// TestKubeletHugePages runs a pod asking for hugepages through the
// kubelet on a node that has them, once with the hugetlb controller as
// this host has it (on the development machine: missing, so berth drops
// the limits the kubelet sends) and once with a hugetlb hierarchy mounted
// in a mount namespace berthd and the kubelet share (the limit lands in
// the container's and the pod's cgroup).
func TestKubeletHugePages(t *testing.T) {
	t.Parallel()
	berthdtest.RequireRoot(t)
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		t.Skip("cgroup v2 host: covered by the v1 cases only")
	}
	bins := k8sBins(t, "kubelet")
	// Two kubelets, 4 MiB each, and room.
	addHugepages(t, 8)

	t.Run("hostController", func(t *testing.T) {
		t.Parallel()
		host, err := cgroupctrl.Detect(cgroupctrl.Options{Parent: "/"})
		if err != nil {
			t.Fatal(err)
		}
		e := newEnv(t, bins, envOptions{})
		p := runHugePod(t, e)
		mounts := e.k.MustRun(t, "huge", "huge", "cat", "/proc/mounts")
		if !strings.Contains(mounts, " /hugepages hugetlbfs ") {
			t.Fatalf("no hugetlbfs on /hugepages:\n%s", mounts)
		}
		limit, err := e.k.Run("huge", "huge", "cat", "/sys/fs/cgroup/hugetlb/"+hugeLimitFile)
		if host.Has("hugetlb") {
			if err != nil || strings.TrimSpace(limit) != strconv.Itoa(4<<20) {
				t.Fatalf("hugetlb mounted on the node, but the container's limit is %q (%v)", limit, err)
			}
		} else {
			if err == nil {
				t.Fatalf("no hugetlb controller on the node, yet the container has a limit: %q", limit)
			}
			const line = "cgroup controllers missing: their limits are dropped from every container"
			if n := strings.Count(e.d.Logs(), line); n != 1 {
				t.Fatalf("berthd logged %q %d times, want once", line, n)
			}
		}
		deleteHugePod(t, e, p, "")
	})

	t.Run("mountedController", func(t *testing.T) {
		t.Parallel()
		if ok, why := berthdtest.CanMountHugetlb(); !ok {
			t.Skipf("a hugetlb hierarchy cannot be mounted here: %s", why)
		}
		e := newEnv(t, bins, envOptions{
			Berthd:            berthdtest.Options{StartProcess: berthdtest.StartWithPrivateHugetlb(t.TempDir())},
			KubeletInDaemonNS: true,
		})
		hugetlb := filepath.Join(e.k.Opts.CgroupFS, "hugetlb")
		if _, err := os.Stat(filepath.Join(hugetlb, "cgroup.procs")); err != nil {
			t.Fatalf("no hugetlb hierarchy in berthd's mount namespace: %v", err)
		}
		// The hierarchy outlives the namespace while it has cgroups: the
		// kubelet's go with it (its cleanup), berthd's own parent here.
		t.Cleanup(func() {
			if err := berthdtest.RemoveCgroupTree(filepath.Join(hugetlb, e.d.Config.CgroupParent)); err != nil {
				t.Errorf("remove berthd's cgroups from the hugetlb hierarchy: %v", err)
			}
		})
		if strings.Contains(e.d.Logs(), "hugepage limits") {
			t.Fatalf("berthd reports hugetlb missing with it mounted:\n%s", e.d.Logs())
		}

		p := runHugePod(t, e)
		if got := strings.TrimSpace(e.k.MustRun(t, "huge", "huge", "cat", "/sys/fs/cgroup/hugetlb/"+hugeLimitFile)); got != strconv.Itoa(4<<20) {
			t.Fatalf("container's %s = %q, want %d", hugeLimitFile, got, 4<<20)
		}
		// Every other page size the node has is limited to 0.
		sizes, _ := filepath.Glob(filepath.Join(hugetlb, "hugetlb.*.limit_in_bytes"))
		for _, s := range sizes {
			name := filepath.Base(s)
			if name == hugeLimitFile || strings.Contains(name, ".rsvd.") {
				continue
			}
			if got := strings.TrimSpace(e.k.MustRun(t, "huge", "huge", "cat", "/sys/fs/cgroup/hugetlb/"+name)); got != "0" {
				t.Errorf("container's %s = %q, want 0", name, got)
			}
		}
		// The kubelet limits the pod's cgroup too (guaranteed QoS: right
		// under kubepods).
		podCg := filepath.Join(hugetlb, e.k.CgroupRoot, "kubepods", "pod"+string(p.UID))
		data, err := os.ReadFile(filepath.Join(podCg, hugeLimitFile))
		if err != nil || strings.TrimSpace(string(data)) != strconv.Itoa(4<<20) {
			t.Fatalf("pod cgroup %s: %q (%v)", podCg, data, err)
		}
		deleteHugePod(t, e, p, podCg)
	})
}

// runHugePod starts hugePod and waits for it to run.
func runHugePod(t *testing.T, e *env) *corev1.Pod {
	t.Helper()
	e.k.Apply(t, "huge", render(hugePod, map[string]string{"BUSYBOX": busyboxImage}))
	p := e.k.WaitPod(t, "huge", "running", 3*time.Minute, func(p *corev1.Pod) bool {
		s := ctrStatus(p, "huge")
		return p.Status.Phase == corev1.PodFailed || (s != nil && s.State.Running != nil)
	})
	if p.Status.Phase == corev1.PodFailed {
		t.Fatalf("pod failed: %s: %s", p.Status.Reason, p.Status.Message)
	}
	if p.Status.QOSClass != corev1.PodQOSGuaranteed {
		t.Fatalf("QoS class %s, want Guaranteed", p.Status.QOSClass)
	}
	return p
}

// deleteHugePod removes the pod's manifest and waits until berth stopped
// its sandbox and the kubelet removed the pod's cgroup (podCg, if set).
func deleteHugePod(t *testing.T, e *env, p *corev1.Pod, podCg string) {
	t.Helper()
	e.k.Delete(t, "huge")
	e.k.WaitGone(t, "huge", time.Minute)
	waitFor(t, "the pod's cgroups to go", 90*time.Second, func() bool {
		if podCg != "" {
			if _, err := os.Stat(podCg); err == nil {
				return false
			}
		}
		for _, d := range e.k.CgroupDirs() {
			if strings.Contains(d, "pod"+string(p.UID)) {
				return false
			}
		}
		return true
	})
}
