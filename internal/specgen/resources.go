package specgen

import (
	"fmt"
	"maps"
	"path"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// CheckResources refuses resource values this host cannot take
// (out-of-range CPU settings, negative memory limits, bad hugepage sizes,
// unified settings on cgroup v1 or with keys that name no file), so that
// CreateContainer and UpdateContainerResources both answer
// InvalidArgument before runc sees them.
func CheckResources(r *runtime.LinuxContainerResources, h *Host) error {
	if v := r.GetCpuShares(); v != 0 && (v < 2 || v > 262144) {
		return invalid("cpu_shares %d outside [2, 262144]", v)
	}
	if v := r.GetCpuPeriod(); v != 0 && (v < 1000 || v > 1000000) {
		return invalid("cpu_period %d outside [1000, 1000000] µs", v)
	}
	if v := r.GetCpuQuota(); v != 0 && v < 1000 && v != -1 {
		return invalid("cpu_quota %d below 1000 µs", v)
	}
	limit, swap := r.GetMemoryLimitInBytes(), r.GetMemorySwapLimitInBytes()
	if limit < 0 || swap < 0 {
		return invalid("negative memory limit")
	}
	if swap != 0 && swap < limit {
		return invalid("memory_swap_limit_in_bytes %d below memory_limit_in_bytes %d", swap, limit)
	}
	if v := r.GetOomScoreAdj(); v < -1000 || v > 1000 {
		return invalid("oom_score_adj %d outside [-1000, 1000]", v)
	}
	for _, l := range r.GetHugepageLimits() {
		if !validPageSize(l.GetPageSize()) {
			return invalid("hugepage size %q (want e.g. 2MB, 1GB)", l.GetPageSize())
		}
	}
	if u := r.GetUnified(); len(u) > 0 {
		if !h.CgroupV2 {
			return invalid("unified cgroup settings need cgroup v2; this host runs v1")
		}
		for k := range u {
			if k == "" || strings.ContainsAny(k, "/\x00") || k == "." || k == ".." {
				return invalid("unified key %q", k)
			}
		}
	}
	return nil
}

// Resources converts CRI resources to their runtime-spec form: the one
// conversion of create, UpdateContainerResources, UpdatePodSandboxResources,
// NRI and the spec metrics (as containerd's WithResources), so a field
// means one thing everywhere. Zero fields stay unset (an update leaves
// them as they are); nil converts to nil. It does not check: callers that
// take new values call CheckResources first.
//
// Swap follows the host's swap accounting, probed once at start
// (Host.SwapAccounting, decision 3700). With it, a memory limit without a
// swap limit also bounds memory+swap (no swap, as containerd), so that
// raising the limit later is not refused by an older memory+swap limit;
// without it every swap limit is left out, as containerd and CRI-O do and
// as the kubelet itself does when it finds no swap controller: runc would
// fail the container on the missing memory.memsw file.
func Resources(r *runtime.LinuxContainerResources, h *Host) *specs.LinuxResources {
	if r == nil {
		return nil
	}
	res := &specs.LinuxResources{}
	cpu := &specs.LinuxCPU{Cpus: r.GetCpusetCpus(), Mems: r.GetCpusetMems()}
	if v := r.GetCpuShares(); v != 0 {
		u := uint64(v)
		cpu.Shares = &u
	}
	if v := r.GetCpuPeriod(); v != 0 {
		u := uint64(v)
		cpu.Period = &u
	}
	if v := r.GetCpuQuota(); v != 0 {
		cpu.Quota = &v
	}
	if *cpu != (specs.LinuxCPU{}) {
		res.CPU = cpu
	}
	res.Memory = memory(r.GetMemoryLimitInBytes(), r.GetMemorySwapLimitInBytes(), h.SwapAccounting)
	for _, l := range r.GetHugepageLimits() {
		res.HugepageLimits = append(res.HugepageLimits, specs.LinuxHugepageLimit{Pagesize: l.GetPageSize(), Limit: l.GetLimit()})
	}
	if u := r.GetUnified(); len(u) > 0 {
		res.Unified = maps.Clone(u)
	}
	return res
}

// memory is the runtime-spec memory of a CRI memory and memory+swap
// limit (0: unset); nil when neither is set or kept.
func memory(limit, swap int64, swapAccounting bool) *specs.LinuxMemory {
	if swap == 0 && swapAccounting {
		swap = limit
	}
	if !swapAccounting {
		swap = 0
	}
	if limit == 0 && swap == 0 {
		return nil
	}
	m := &specs.LinuxMemory{}
	if limit != 0 {
		m.Limit = &limit
	}
	if swap != 0 {
		m.Swap = &swap
	}
	return m
}

// applyResources checks and sets CPU, cpuset, memory, hugepages and
// unified limits. The pids limit is the pod's (kubelet sets it on the pod
// cgroup). Hugepage limits go in as asked: where the host has no hugetlb
// controller the container store drops them (internal/cgroupctrl), after
// NRI plugins, which may add some too, had their say.
func applyResources(in *Input, s *specs.Spec) error {
	r := in.Config.GetLinux().GetResources()
	if r == nil {
		return nil
	}
	if err := CheckResources(r, in.Host); err != nil {
		return err
	}
	conv, res := Resources(r, in.Host), s.Linux.Resources
	res.CPU, res.Memory, res.HugepageLimits, res.Unified = conv.CPU, conv.Memory, conv.HugepageLimits, conv.Unified
	return nil
}

// validPageSize accepts the kernel's hugepage names: digits then KB/MB/GB.
func validPageSize(s string) bool {
	n := strings.TrimRight(s, "KMGB")
	unit := s[len(n):]
	if n == "" || (unit != "KB" && unit != "MB" && unit != "GB") {
		return false
	}
	for _, c := range n {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// applyCgroupsPath puts the container below the pod's cgroup:
// <parent>/<id> for cgroupfs, <slice>:berth:<id> for systemd.
func applyCgroupsPath(in *Input, s *specs.Spec) error {
	p, err := cgroupsPath(in.CgroupDriver, in.Pod.CgroupParent, in.SandboxConfig.GetLinux().GetCgroupParent(), in.ContainerID)
	if err != nil {
		return err
	}
	s.Linux.CgroupsPath = p
	return nil
}

func cgroupsPath(driver, podParent, configParent, id string) (string, error) {
	if strings.ContainsAny(id, "/:\x00") || id == "." || id == ".." {
		return "", invalid("container ID %q cannot name a cgroup", id)
	}
	parent := podParent
	if parent == "" {
		parent = configParent
	}
	switch driver {
	case "", "cgroupfs":
		if parent == "" {
			parent = "/berth"
		}
		if !path.IsAbs(parent) {
			return "", invalid("cgroup parent %q is not an absolute path (cgroupfs driver)", parent)
		}
		return path.Join(parent, id), nil
	case "systemd":
		if parent == "" {
			parent = "system.slice"
		}
		// "slice:prefix:name" names the pod's unit; the container's scope
		// goes into the same slice (a scope cannot hold children).
		slice, _, _ := strings.Cut(parent, ":")
		if !strings.HasSuffix(slice, ".slice") || strings.Contains(slice, "/") {
			return "", invalid("cgroup parent %q is not a systemd slice", parent)
		}
		return fmt.Sprintf("%s:berth:%s", slice, id), nil
	}
	return "", invalid("unknown cgroup driver %q", driver)
}

// applyAnnotations adds containerd's io.kubernetes.cri.* annotations, so
// that OCI hooks and tools written for containerd find them.
func applyAnnotations(in *Input, s *specs.Spec) error {
	md := in.SandboxConfig.GetMetadata()
	image := in.Config.GetImage().GetUserSpecifiedImage()
	if image == "" {
		image = in.Config.GetImage().GetImage()
	}
	s.Annotations = map[string]string{
		"io.kubernetes.cri.container-type":    "container",
		"io.kubernetes.cri.sandbox-id":        in.Pod.ID,
		"io.kubernetes.cri.sandbox-name":      md.GetName(),
		"io.kubernetes.cri.sandbox-namespace": md.GetNamespace(),
		"io.kubernetes.cri.sandbox-uid":       md.GetUid(),
		"io.kubernetes.cri.container-name":    in.Config.GetMetadata().GetName(),
		"io.kubernetes.cri.image-name":        image,
	}
	return nil
}
