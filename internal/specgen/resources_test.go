package specgen

import (
	"encoding/json"
	"reflect"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestResources runs the create step: CheckResources, then the one
// conversion, into the spec.
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
		// Decision 3700: left out, as update always did, containerd and
		// CRI-O do, and the kubelet does without a swap controller.
		{name: "swap without accounting", host: func(h *Host) { h.SwapAccounting = false },
			r: &runtime.LinuxContainerResources{MemoryLimitInBytes: 1 << 30, MemorySwapLimitInBytes: 2 << 30},
			check: func(t *testing.T, r *specs.LinuxResources) {
				if *r.Memory.Limit != 1<<30 || r.Memory.Swap != nil {
					t.Fatalf("memory = %+v, want the limit without swap", r.Memory)
				}
			}},
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

// TestResourcesConversion pins the one CRI→OCI conversion (create,
// update, pod resources, NRI, metrics) on hosts with and without swap
// accounting: every field, and what a zero leaves unset.
func TestResourcesConversion(t *testing.T) {
	u64 := func(v uint64) *uint64 { return &v }
	i64 := func(v int64) *int64 { return &v }
	const limit, swap = 64 << 20, 128 << 20
	acct, noAcct, v2 := &Host{SwapAccounting: true}, &Host{}, &Host{CgroupV2: true, SwapAccounting: true}
	for _, tc := range []struct {
		name string
		host *Host
		r    *runtime.LinuxContainerResources
		want *specs.LinuxResources
	}{
		{name: "nil", host: acct, r: nil, want: nil},
		{name: "empty", host: acct, r: &runtime.LinuxContainerResources{}, want: &specs.LinuxResources{}},
		{name: "cpu and cpuset", host: acct,
			r:    &runtime.LinuxContainerResources{CpuShares: 512, CpuQuota: 50000, CpuPeriod: 100000, CpusetCpus: "0-1", CpusetMems: "0"},
			want: &specs.LinuxResources{CPU: &specs.LinuxCPU{Shares: u64(512), Quota: i64(50000), Period: u64(100000), Cpus: "0-1", Mems: "0"}}},
		{name: "quota -1 (unlimited)", host: acct, r: &runtime.LinuxContainerResources{CpuQuota: -1},
			want: &specs.LinuxResources{CPU: &specs.LinuxCPU{Quota: i64(-1)}}},
		{name: "cpuset only", host: acct, r: &runtime.LinuxContainerResources{CpusetCpus: "1"},
			want: &specs.LinuxResources{CPU: &specs.LinuxCPU{Cpus: "1"}}},
		{name: "limit, accounting: no swap", host: acct, r: &runtime.LinuxContainerResources{MemoryLimitInBytes: limit},
			want: &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: i64(limit), Swap: i64(limit)}}},
		{name: "limit and swap, accounting", host: acct, r: &runtime.LinuxContainerResources{MemoryLimitInBytes: limit, MemorySwapLimitInBytes: swap},
			want: &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: i64(limit), Swap: i64(swap)}}},
		{name: "swap alone, accounting", host: acct, r: &runtime.LinuxContainerResources{MemorySwapLimitInBytes: swap},
			want: &specs.LinuxResources{Memory: &specs.LinuxMemory{Swap: i64(swap)}}},
		{name: "limit and swap, v2 accounting", host: v2, r: &runtime.LinuxContainerResources{MemoryLimitInBytes: limit, MemorySwapLimitInBytes: swap},
			want: &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: i64(limit), Swap: i64(swap)}}},
		{name: "limit, no accounting", host: noAcct, r: &runtime.LinuxContainerResources{MemoryLimitInBytes: limit},
			want: &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: i64(limit)}}},
		{name: "limit and swap, no accounting: swap left out", host: noAcct, r: &runtime.LinuxContainerResources{MemoryLimitInBytes: limit, MemorySwapLimitInBytes: swap},
			want: &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: i64(limit)}}},
		{name: "swap = limit, no accounting", host: noAcct, r: &runtime.LinuxContainerResources{MemoryLimitInBytes: limit, MemorySwapLimitInBytes: limit},
			want: &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: i64(limit)}}},
		{name: "swap alone, no accounting: nothing", host: noAcct, r: &runtime.LinuxContainerResources{MemorySwapLimitInBytes: swap},
			want: &specs.LinuxResources{}},
		{name: "hugepages", host: acct, r: &runtime.LinuxContainerResources{HugepageLimits: []*runtime.HugepageLimit{{PageSize: "2MB", Limit: 0}, {PageSize: "1GB", Limit: 1 << 30}}},
			want: &specs.LinuxResources{HugepageLimits: []specs.LinuxHugepageLimit{{Pagesize: "2MB"}, {Pagesize: "1GB", Limit: 1 << 30}}}},
		{name: "unified", host: v2, r: &runtime.LinuxContainerResources{Unified: map[string]string{"memory.high": "1M", "memory.swap.max": "0"}},
			want: &specs.LinuxResources{Unified: map[string]string{"memory.high": "1M", "memory.swap.max": "0"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Resources(tc.r, tc.host)
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("Resources(%v) on %+v\n got %s\nwant %s", tc.r, *tc.host, jsonOf(t, got), jsonOf(t, tc.want))
			}
			// The create step puts the same into the spec.
			if tc.r == nil {
				return
			}
			in := testInput(t)
			in.Config.Linux.Resources, in.Host = tc.r, tc.host
			s := &specs.Spec{Linux: &specs.Linux{Resources: &specs.LinuxResources{}}}
			if err := applyResources(&in, s); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(s.Linux.Resources, tc.want) {
				t.Fatalf("create step\n got %s\nwant %s", jsonOf(t, s.Linux.Resources), jsonOf(t, tc.want))
			}
		})
	}
}

// The converted map is a copy: an NRI plugin's or runc's edit of it
// cannot reach the container's record.
func TestResourcesConversionCopiesUnified(t *testing.T) {
	r := &runtime.LinuxContainerResources{Unified: map[string]string{"memory.high": "1M"}}
	Resources(r, &Host{CgroupV2: true}).Unified["memory.high"] = "2M"
	if r.Unified["memory.high"] != "1M" {
		t.Fatalf("the CRI map changed: %v", r.Unified)
	}
}

// TestCheckResources: every refusal, on the host kinds where it differs.
func TestCheckResources(t *testing.T) {
	v1, v2 := &Host{SwapAccounting: true}, &Host{CgroupV2: true}
	for _, tc := range []struct {
		name string
		host *Host
		r    *runtime.LinuxContainerResources
		ok   bool
	}{
		{name: "nil", host: v1, r: nil, ok: true},
		{name: "kubelet's shape", host: v1, r: &runtime.LinuxContainerResources{CpuShares: 2, CpuQuota: -1, CpuPeriod: 100000, MemoryLimitInBytes: 1 << 20, MemorySwapLimitInBytes: 1 << 20, OomScoreAdj: 1000}, ok: true},
		{name: "swap above limit without accounting", host: &Host{}, r: &runtime.LinuxContainerResources{MemoryLimitInBytes: 1 << 20, MemorySwapLimitInBytes: 2 << 20}, ok: true},
		{name: "shares 1", host: v1, r: &runtime.LinuxContainerResources{CpuShares: 1}},
		{name: "shares too high", host: v1, r: &runtime.LinuxContainerResources{CpuShares: 262145}},
		{name: "period too high", host: v1, r: &runtime.LinuxContainerResources{CpuPeriod: 1000001}},
		{name: "quota 999", host: v1, r: &runtime.LinuxContainerResources{CpuQuota: 999}},
		{name: "quota -2", host: v1, r: &runtime.LinuxContainerResources{CpuQuota: -2}},
		{name: "negative swap", host: v1, r: &runtime.LinuxContainerResources{MemorySwapLimitInBytes: -1}},
		{name: "swap below limit", host: v1, r: &runtime.LinuxContainerResources{MemoryLimitInBytes: 2 << 20, MemorySwapLimitInBytes: 1 << 20}},
		{name: "oom_score_adj", host: v1, r: &runtime.LinuxContainerResources{OomScoreAdj: -1001}},
		{name: "hugepage size", host: v1, r: &runtime.LinuxContainerResources{HugepageLimits: []*runtime.HugepageLimit{{PageSize: "2XB"}}}},
		{name: "unified on v1", host: v1, r: &runtime.LinuxContainerResources{Unified: map[string]string{"memory.high": "1"}}},
		{name: "unified on v2", host: v2, r: &runtime.LinuxContainerResources{Unified: map[string]string{"memory.high": "1"}}, ok: true},
		{name: "unified key with a slash", host: v2, r: &runtime.LinuxContainerResources{Unified: map[string]string{"a/b": "1"}}},
		{name: "unified key dot-dot", host: v2, r: &runtime.LinuxContainerResources{Unified: map[string]string{"..": "1"}}},
		{name: "unified key empty", host: v2, r: &runtime.LinuxContainerResources{Unified: map[string]string{"": "1"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckResources(tc.r, tc.host)
			if tc.ok {
				wantErr(t, err, nil)
			} else {
				wantErr(t, err, errInvalid)
			}
		})
	}
}

func jsonOf(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
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
