package specgen

import (
	"fmt"
	"maps"
	"path"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// CheckResources refuses resource values no host accepts (out-of-range
// CPU settings, negative memory limits, bad hugepage sizes), so that
// CreateContainer and UpdateContainerResources both answer InvalidArgument
// before runc sees them.
func CheckResources(r *runtime.LinuxContainerResources) error {
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
	for _, h := range r.GetHugepageLimits() {
		if !validPageSize(h.GetPageSize()) {
			return invalid("hugepage size %q (want e.g. 2MB, 1GB)", h.GetPageSize())
		}
	}
	return nil
}

// applyResources sets CPU, cpuset, memory, hugepages and unified limits.
// The pids limit is the pod's (kubelet sets it on the pod cgroup).
// Hugepage limits go in as asked: where the host has no hugetlb
// controller the container store drops them (internal/cgroupctrl), after
// NRI plugins, which may add some too, had their say.
func applyResources(in *Input, s *specs.Spec) error {
	r := in.Config.GetLinux().GetResources()
	if r == nil {
		return nil
	}
	if err := CheckResources(r); err != nil {
		return err
	}
	res := s.Linux.Resources
	cpu := &specs.LinuxCPU{Cpus: r.GetCpusetCpus(), Mems: r.GetCpusetMems()}
	if v := r.GetCpuShares(); v != 0 {
		if v < 2 || v > 262144 {
			return invalid("cpu_shares %d outside [2, 262144]", v)
		}
		u := uint64(v)
		cpu.Shares = &u
	}
	if v := r.GetCpuPeriod(); v != 0 {
		if v < 1000 || v > 1000000 {
			return invalid("cpu_period %d outside [1000, 1000000] µs", v)
		}
		u := uint64(v)
		cpu.Period = &u
	}
	if v := r.GetCpuQuota(); v != 0 {
		if v < 1000 && v != -1 {
			return invalid("cpu_quota %d below 1000 µs", v)
		}
		cpu.Quota = &v
	}
	if *cpu != (specs.LinuxCPU{}) {
		res.CPU = cpu
	}

	limit, swap := r.GetMemoryLimitInBytes(), r.GetMemorySwapLimitInBytes()
	if limit < 0 || swap < 0 {
		return invalid("negative memory limit")
	}
	if limit != 0 || swap != 0 {
		res.Memory = &specs.LinuxMemory{}
	}
	if limit != 0 {
		res.Memory.Limit = &limit
		// swap = limit keeps the container from swapping, as containerd.
		if swap == 0 && in.Host.SwapAccounting {
			res.Memory.Swap = &limit
		}
	}
	if swap != 0 {
		if swap < limit {
			return invalid("memory_swap_limit_in_bytes %d below memory_limit_in_bytes %d", swap, limit)
		}
		switch {
		case in.Host.SwapAccounting:
			res.Memory.Swap = &swap
		case swap != limit:
			// swap == limit means "no swap", which holds without accounting too.
			return invalid("memory_swap_limit_in_bytes set but the host has no swap accounting")
		}
	}

	for _, h := range r.GetHugepageLimits() {
		if !validPageSize(h.GetPageSize()) {
			return invalid("hugepage size %q (want e.g. 2MB, 1GB)", h.GetPageSize())
		}
		res.HugepageLimits = append(res.HugepageLimits, specs.LinuxHugepageLimit{Pagesize: h.GetPageSize(), Limit: h.GetLimit()})
	}

	if u := r.GetUnified(); len(u) > 0 {
		if !in.Host.CgroupV2 {
			return invalid("unified cgroup settings need cgroup v2; this host runs v1")
		}
		for k := range u {
			if k == "" || strings.ContainsAny(k, "/\x00") || k == "." || k == ".." {
				return invalid("unified key %q", k)
			}
		}
		res.Unified = maps.Clone(u)
	}
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
