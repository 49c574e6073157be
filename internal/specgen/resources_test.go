package specgen

import (
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func TestResources(t *testing.T) {
	u64 := func(v uint64) *uint64 { return &v }
	i64 := func(v int64) *int64 { return &v }
	for _, tc := range []struct {
		name  string
		r     *runtime.LinuxContainerResources
		host  func(h *Host)
		check func(t *testing.T, r *specs.LinuxResources)
		err   error
	}{
		{name: "none", check: func(t *testing.T, r *specs.LinuxResources) {
			if r.CPU != nil || r.Memory != nil {
				t.Fatalf("limits set: %+v", r)
			}
		}},
		{name: "cpu", r: &runtime.LinuxContainerResources{CpuShares: 512, CpuQuota: 50000, CpuPeriod: 100000, CpusetCpus: "0", CpusetMems: "0"},
			check: func(t *testing.T, r *specs.LinuxResources) {
				want := specs.LinuxCPU{Shares: u64(512), Quota: i64(50000), Period: u64(100000), Cpus: "0", Mems: "0"}
				if r.CPU == nil || *r.CPU.Shares != *want.Shares || *r.CPU.Quota != *want.Quota || *r.CPU.Period != *want.Period || r.CPU.Cpus != "0" || r.CPU.Mems != "0" {
					t.Fatalf("cpu = %+v", r.CPU)
				}
			}},
		{name: "memory sets swap = limit", r: &runtime.LinuxContainerResources{MemoryLimitInBytes: 1 << 30},
			check: func(t *testing.T, r *specs.LinuxResources) {
				if *r.Memory.Limit != 1<<30 || r.Memory.Swap == nil || *r.Memory.Swap != 1<<30 {
					t.Fatalf("memory = %+v", r.Memory)
				}
			}},
		{name: "memory without swap accounting", host: func(h *Host) { h.SwapAccounting = false },
			r: &runtime.LinuxContainerResources{MemoryLimitInBytes: 1 << 30},
			check: func(t *testing.T, r *specs.LinuxResources) {
				if r.Memory.Swap != nil {
					t.Fatalf("swap set without accounting: %+v", r.Memory)
				}
			}},
		{name: "explicit swap", r: &runtime.LinuxContainerResources{MemoryLimitInBytes: 1 << 30, MemorySwapLimitInBytes: 2 << 30},
			check: func(t *testing.T, r *specs.LinuxResources) {
				if *r.Memory.Swap != 2<<30 {
					t.Fatalf("memory = %+v", r.Memory)
				}
			}},
		{name: "swap below limit", r: &runtime.LinuxContainerResources{MemoryLimitInBytes: 2 << 30, MemorySwapLimitInBytes: 1 << 30}, err: errInvalid},
		{name: "swap without accounting", host: func(h *Host) { h.SwapAccounting = false },
			r: &runtime.LinuxContainerResources{MemoryLimitInBytes: 1 << 30, MemorySwapLimitInBytes: 2 << 30}, err: errInvalid},
		{name: "negative memory", r: &runtime.LinuxContainerResources{MemoryLimitInBytes: -1}, err: errInvalid},
		{name: "shares too low", r: &runtime.LinuxContainerResources{CpuShares: 1}, err: errInvalid},
		{name: "period too low", r: &runtime.LinuxContainerResources{CpuPeriod: 10}, err: errInvalid},
		{name: "quota too low", r: &runtime.LinuxContainerResources{CpuQuota: 10}, err: errInvalid},
		{name: "hugepages", r: &runtime.LinuxContainerResources{HugepageLimits: []*runtime.HugepageLimit{{PageSize: "2MB", Limit: 4 << 20}}},
			check: func(t *testing.T, r *specs.LinuxResources) {
				if len(r.HugepageLimits) != 1 || r.HugepageLimits[0].Pagesize != "2MB" || r.HugepageLimits[0].Limit != 4<<20 {
					t.Fatalf("hugepages = %+v", r.HugepageLimits)
				}
			}},
		{name: "hugepages bad size", r: &runtime.LinuxContainerResources{HugepageLimits: []*runtime.HugepageLimit{{PageSize: "2M"}}}, err: errInvalid},
		{name: "unified on v1", r: &runtime.LinuxContainerResources{Unified: map[string]string{"memory.high": "1M"}}, err: errInvalid},
		{name: "unified on v2", host: func(h *Host) { h.CgroupV2 = true },
			r: &runtime.LinuxContainerResources{Unified: map[string]string{"memory.high": "1M"}},
			check: func(t *testing.T, r *specs.LinuxResources) {
				if r.Unified["memory.high"] != "1M" {
					t.Fatalf("unified = %v", r.Unified)
				}
			}},
		{name: "unified bad key", host: func(h *Host) { h.CgroupV2 = true },
			r: &runtime.LinuxContainerResources{Unified: map[string]string{"../x": "1"}}, err: errInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := testInput(t)
			in.Config.Linux.Resources = tc.r
			if tc.host != nil {
				tc.host(in.Host)
			}
			s := &specs.Spec{Linux: &specs.Linux{Resources: &specs.LinuxResources{}}}
			err := applyResources(&in, s)
			wantErr(t, err, tc.err)
			if tc.check != nil && err == nil {
				tc.check(t, s.Linux.Resources)
			}
		})
	}
}

func TestCgroupsPath(t *testing.T) {
	for _, tc := range []struct {
		name, driver, pod, config, id, want string
		err                                 error
	}{
		{name: "cgroupfs", driver: "cgroupfs", pod: "/kubepods/pod1", id: "c1", want: "/kubepods/pod1/c1"},
		{name: "cgroupfs from sandbox config", driver: "cgroupfs", config: "/kp/pod2", id: "c1", want: "/kp/pod2/c1"},
		{name: "cgroupfs default", id: "c1", want: "/berth/c1"},
		{name: "cgroupfs relative", driver: "cgroupfs", pod: "kubepods", id: "c1", err: errInvalid},
		{name: "systemd slice", driver: "systemd", pod: "kubepods-pod1.slice", id: "c1", want: "kubepods-pod1.slice:berth:c1"},
		{name: "systemd triple", driver: "systemd", pod: "kubepods-pod1.slice:berth:pod1", id: "c1", want: "kubepods-pod1.slice:berth:c1"},
		{name: "systemd not a slice", driver: "systemd", pod: "/kubepods", id: "c1", err: errInvalid},
		{name: "unknown driver", driver: "lxc", id: "c1", err: errInvalid},
		{name: "bad id", id: "../x", err: errInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := cgroupsPath(tc.driver, tc.pod, tc.config, tc.id)
			wantErr(t, err, tc.err)
			if got != tc.want {
				t.Fatalf("cgroups path %q, want %q", got, tc.want)
			}
		})
	}
}
