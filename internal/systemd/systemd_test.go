package systemd

import (
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/berthcri/berth/internal/cgroupplan"
	"github.com/berthcri/berth/internal/errdefs"
)

func TestCheckRunning(t *testing.T) {
	dir := t.TempDir()
	if err := checkRunning(dir); err != nil {
		t.Fatalf("booted dir present: %v", err)
	}
	err := checkRunning(dir + "/absent")
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "systemd is not running") {
		t.Fatalf("no booted dir: err %v, want FailedPrecondition naming the problem", err)
	}
}

func TestParentSlice(t *testing.T) {
	for in, want := range map[string]string{
		"berth":                         "berth.slice",
		"berth.slice":                   "berth.slice",
		"kubepods-burstable-pod1.slice": "kubepods-burstable-pod1.slice",
		"kubepods-besteffort-pod1_2_3":  "kubepods-besteffort-pod1_2_3.slice",
		"-.slice":                       "-.slice",
	} {
		got, err := ParentSlice(in)
		if err != nil || got != want {
			t.Errorf("ParentSlice(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	// The kubelet's systemd driver sends a slice's path: its name.
	for in, want := range map[string]string{
		"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1_2.slice": "kubepods-burstable-pod1_2.slice",
		"/kubepods.slice": "kubepods.slice",
		"/berthkt_1a.slice/berthkt_1a-kubepods.slice/berthkt_1a-kubepods-besteffort.slice": "berthkt_1a-kubepods-besteffort.slice",
	} {
		if got, err := ParentSlice(in); err != nil || got != want {
			t.Errorf("ParentSlice(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "/kubepods/burstable/pod1", "kubepods/x.slice", "/x.slice/kubepods-burstable.slice",
		"/kubepods.slice/kubepods-burstable.slice/other.slice", "/kubepods/pod1.slice", "-a.slice", "a--b.slice", "a-.slice", "a b.slice", "a@b"} {
		if _, err := ParentSlice(bad); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("ParentSlice(%q): err %v, want InvalidArgument", bad, err)
		}
	}
	if _, err := ParentSlice("/kubepods/pod1"); err == nil || !strings.Contains(err.Error(), "cgroupDriver") {
		t.Errorf("a cgroupfs parent should point at the kubelet's driver setting: %v", err)
	}
}

func TestPodSliceRoundTrip(t *testing.T) {
	for parent, want := range map[string]string{
		"kubepods-burstable-pod1_2.slice": "kubepods-burstable-pod1_2-berthpod_abc123.slice",
		"berth":                           "berth-berthpod_abc123.slice",
		"-.slice":                         "berthpod_abc123.slice",
	} {
		got, err := PodSlice(parent, "abc123")
		if err != nil || got != want {
			t.Errorf("PodSlice(%q) = %q, %v; want %q", parent, got, err, want)
			continue
		}
		p, _ := ParentSlice(parent)
		if id, ok := PodFromSlice(p, got); !ok || id != "abc123" {
			t.Errorf("PodFromSlice(%q, %q) = %q, %v", p, got, id, ok)
		}
	}
	for _, other := range []string{"berth.slice", "berth-other.slice", "berth-berthpod_a-b.slice", "berth-berthpod_.slice", "kube-berthpod_a.slice", "berth-berthpod_a.scope"} {
		if id, ok := PodFromSlice("berth.slice", other); ok {
			t.Errorf("PodFromSlice(berth.slice, %q) = %q; want no pod", other, id)
		}
	}
	for _, bad := range []string{"", "a-b", "a/b", "a.b"} {
		if _, err := PodSlice("berth", bad); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("PodSlice(id %q): err %v, want InvalidArgument", bad, err)
		}
	}
	// A 64-hex pod ID below a kubelet pod slice stays within systemd's
	// 255-byte unit names.
	long, err := PodSlice("kubepods-besteffort-pod0b5e2f1a_4c3d_4e5f_8a9b_0c1d2e3f4a5b.slice", strings.Repeat("f", 64))
	if err != nil || len(long) > 255 {
		t.Errorf("kubelet-shaped slice: %q (%d bytes), %v", long, len(long), err)
	}
}

func TestExpandSlice(t *testing.T) {
	for in, want := range map[string]string{
		"-.slice":     "/",
		"berth.slice": "/berth.slice",
		"kubepods-burstable-pod1-berthpod_a.slice": "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice/kubepods-burstable-pod1-berthpod_a.slice",
	} {
		got, err := ExpandSlice(in)
		if err != nil || got != want {
			t.Errorf("ExpandSlice(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}

func props(t *testing.T, ps []sddbus.Property) map[string]any {
	t.Helper()
	out := map[string]any{}
	for _, p := range ps {
		if _, dup := out[p.Name]; dup {
			t.Fatalf("property %s set twice", p.Name)
		}
		out[p.Name] = p.Value.Value()
	}
	return out
}

func TestPodSliceProperties(t *testing.T) {
	v1 := props(t, PodSliceProperties("abc", false))
	for _, k := range []string{"CPUAccounting", "MemoryAccounting", "TasksAccounting", "BlockIOAccounting"} {
		if v1[k] != true {
			t.Errorf("v1 slice: %s = %v, want true", k, v1[k])
		}
	}
	if v1["DefaultDependencies"] != false || !strings.Contains(v1["Description"].(string), "abc") {
		t.Errorf("v1 slice properties %v", v1)
	}
	if v2 := props(t, PodSliceProperties("abc", true)); v2["IOAccounting"] != true || v2["BlockIOAccounting"] != nil {
		t.Errorf("v2 slice properties %v", v2)
	}
}

func TestResourceProperties(t *testing.T) {
	u := func(v uint64) *uint64 { return &v }
	i := func(v int64) *int64 { return &v }
	res := &specs.LinuxResources{
		CPU:            &specs.LinuxCPU{Shares: u(1024), Quota: i(50000), Period: u(100000), Cpus: "0-2,5", Mems: "0"},
		Memory:         &specs.LinuxMemory{Limit: i(256 << 20), Swap: i(512 << 20)},
		Pids:           &specs.LinuxPids{Limit: i(100)},
		HugepageLimits: []specs.LinuxHugepageLimit{{Pagesize: "2MB", Limit: 0}},
	}
	ps, left, err := ResourceProperties(res, false)
	if err != nil {
		t.Fatal(err)
	}
	v1 := props(t, ps)
	want := map[string]any{
		"CPUShares": uint64(1024), "CPUQuotaPeriodUSec": uint64(100000), "CPUQuotaPerSecUSec": uint64(500000),
		"MemoryLimit": uint64(256 << 20), "TasksMax": uint64(100),
	}
	if !reflect.DeepEqual(v1, want) {
		t.Errorf("v1 properties %v, want %v", v1, want)
	}
	if !reflect.DeepEqual(left, []string{"cpuset", "memory swap", "hugepages"}) {
		t.Errorf("v1 leftovers %v", left)
	}

	ps, left, err = ResourceProperties(res, true)
	if err != nil {
		t.Fatal(err)
	}
	v2 := props(t, ps)
	want = map[string]any{
		"CPUWeight": uint64(39), "CPUQuotaPeriodUSec": uint64(100000), "CPUQuotaPerSecUSec": uint64(500000),
		"AllowedCPUs": []byte{0x27}, "AllowedMemoryNodes": []byte{0x01},
		"MemoryMax": uint64(256 << 20), "MemorySwapMax": uint64(256 << 20), "TasksMax": uint64(100),
	}
	if !reflect.DeepEqual(v2, want) {
		t.Errorf("v2 properties %v, want %v", v2, want)
	}
	if !reflect.DeepEqual(left, []string{"hugepages"}) {
		t.Errorf("v2 leftovers %v", left)
	}

	// -1 is "no limit": systemd's infinity.
	ps, _, _ = ResourceProperties(&specs.LinuxResources{
		CPU: &specs.LinuxCPU{Quota: i(-1)}, Memory: &specs.LinuxMemory{Limit: i(-1)}, Pids: &specs.LinuxPids{Limit: i(-1)},
	}, true)
	for k, v := range props(t, ps) {
		if v != uint64(math.MaxUint64) {
			t.Errorf("unlimited %s = %v, want infinity", k, v)
		}
	}
	if ps, left, err := ResourceProperties(nil, true); ps != nil || left != nil || err != nil {
		t.Errorf("nil resources: %v %v %v", ps, left, err)
	}
	if _, _, err := ResourceProperties(&specs.LinuxResources{CPU: &specs.LinuxCPU{Cpus: "3-1"}}, true); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("bad cpuset list: err %v", err)
	}
}

func TestQuotaAndWeight(t *testing.T) {
	for _, tc := range []struct {
		quota  int64
		period uint64
		want   uint64
	}{
		{50000, 100000, 500000},
		{1000, 100000, 10000}, // 1% rounds to systemd's 10 ms step
		{1500, 100000, 20000}, // rounds up, never below the limit
		{200000, 100000, 2000000},
		{12345, 50000, 250000},
		{-1, 100000, math.MaxUint64},
	} {
		if got := quotaPerSec(tc.quota, tc.period); got != tc.want {
			t.Errorf("quotaPerSec(%d, %d) = %d, want %d", tc.quota, tc.period, got, tc.want)
		}
	}
	for shares, want := range map[uint64]uint64{2: 1, 1024: 39, 262144: 10000, 0: 1, 1 << 30: 10000} {
		if got := cgroupplan.CPUWeightFromShares(shares); got != want {
			t.Errorf("CPUWeightFromShares(%d) = %d, want %d", shares, got, want)
		}
	}
	if m, err := listToMask("0,9-10"); err != nil || !reflect.DeepEqual(m, []byte{0x01, 0x06}) {
		t.Errorf("listToMask(0,9-10) = %v, %v", m, err)
	}
}
