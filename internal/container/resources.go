package container

import (
	"os"
	"slices"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// swapAccounting reports whether the memory controller accounts swap
// (v1 memory.memsw.*; v2 the memory controller, whose memory.swap.max
// runc sets and skips where the kernel has no swap): then a memory limit
// also bounds memory+swap, as at create (specgen) and in containerd, so
// that raising the limit above the old memory+swap limit works. On v2 the
// kubelet's own swap setting (unified memory.swap.max) still wins: runc
// writes the unified map last.
func swapAccounting() bool {
	if b, err := os.ReadFile("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		_, serr := os.Stat("/proc/sys/vm/swappiness")
		return slices.Contains(strings.Fields(string(b)), "memory") && serr == nil
	}
	_, err := os.Stat("/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes")
	return err == nil
}

// OCIResources converts CRI resources to the runtime-spec form `runc
// update` takes. Zero fields are left unset (unchanged).
func OCIResources(r *runtime.LinuxContainerResources) *specs.LinuxResources {
	res := &specs.LinuxResources{}
	if r == nil {
		return res
	}
	cpu := &specs.LinuxCPU{Cpus: r.GetCpusetCpus(), Mems: r.GetCpusetMems()}
	if v := r.GetCpuShares(); v != 0 {
		u := uint64(v)
		cpu.Shares = &u
	}
	if v := r.GetCpuQuota(); v != 0 {
		cpu.Quota = &v
	}
	if v := r.GetCpuPeriod(); v != 0 {
		u := uint64(v)
		cpu.Period = &u
	}
	if cpu.Shares != nil || cpu.Quota != nil || cpu.Period != nil || cpu.Cpus != "" || cpu.Mems != "" {
		res.CPU = cpu
	}
	if limit := r.GetMemoryLimitInBytes(); limit != 0 {
		res.Memory = &specs.LinuxMemory{Limit: &limit}
		swap := r.GetMemorySwapLimitInBytes()
		switch {
		case swap != 0 && swapAccounting():
			res.Memory.Swap = &swap
		case swapAccounting():
			res.Memory.Swap = &limit
		}
	}
	for _, h := range r.GetHugepageLimits() {
		res.HugepageLimits = append(res.HugepageLimits, specs.LinuxHugepageLimit{Pagesize: h.GetPageSize(), Limit: h.GetLimit()})
	}
	if u := r.GetUnified(); len(u) > 0 {
		res.Unified = u
	}
	return res
}
