package sandbox

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func i64(v int64) *int64   { return &v }
func u64(v uint64) *uint64 { return &v }

func TestV2FilesConvertLikeRunc(t *testing.T) {
	for _, tc := range []struct {
		name string
		res  specs.LinuxResources
		want string // name=value, space separated, in write order
	}{
		{"shares to weight", specs.LinuxResources{CPU: &specs.LinuxCPU{Shares: u64(1024)}}, "cpu.weight=39"},
		{"min shares", specs.LinuxResources{CPU: &specs.LinuxCPU{Shares: u64(2)}}, "cpu.weight=1"},
		{"max shares", specs.LinuxResources{CPU: &specs.LinuxCPU{Shares: u64(262144)}}, "cpu.weight=10000"},
		{"quota and period", specs.LinuxResources{CPU: &specs.LinuxCPU{Quota: i64(50000), Period: u64(100000)}}, "cpu.max=50000 100000"},
		{"no quota", specs.LinuxResources{CPU: &specs.LinuxCPU{Quota: i64(-1), Period: u64(100000)}}, "cpu.max=max 100000"},
		{"quota alone", specs.LinuxResources{CPU: &specs.LinuxCPU{Quota: i64(20000)}}, "cpu.max=20000"},
		{"cpuset", specs.LinuxResources{CPU: &specs.LinuxCPU{Cpus: "0-1", Mems: "0"}}, "cpuset.cpus=0-1 cpuset.mems=0"},
		{"memory, no swap", specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: i64(1 << 20), Swap: i64(1 << 20)}}, "memory.swap.max=0 memory.max=1048576"},
		{"memory and swap", specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: i64(1 << 20), Swap: i64(3 << 20)}}, "memory.swap.max=2097152 memory.max=1048576"},
		{"unlimited swap", specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: i64(1 << 20), Swap: i64(-1)}}, "memory.swap.max=max memory.max=1048576"},
		{"unlimited memory", specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: i64(-1)}}, "memory.swap.max=max memory.max=max"},
		{"memory alone", specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: i64(4096)}}, "memory.max=4096"},
		{"pids", specs.LinuxResources{Pids: &specs.LinuxPids{Limit: i64(100)}}, "pids.max=100"},
		{"pids unlimited", specs.LinuxResources{Pids: &specs.LinuxPids{Limit: i64(-1)}}, "pids.max=max"},
		{"hugetlb", specs.LinuxResources{HugepageLimits: []specs.LinuxHugepageLimit{{Pagesize: "2MB", Limit: 0}, {Pagesize: "1GB", Limit: 1 << 30}}}, "hugetlb.2MB.max=0 hugetlb.1GB.max=1073741824"},
		{"unified last, sorted", specs.LinuxResources{
			Memory:  &specs.LinuxMemory{Limit: i64(1 << 20), Swap: i64(1 << 20)},
			Unified: map[string]string{"memory.swap.max": "524288", "memory.high": "900000", "memory.oom.group": "1", "hugetlb.2MB.rsvd.max": "0"},
		}, "memory.swap.max=0 memory.max=1048576 hugetlb.2MB.rsvd.max=0 memory.high=900000 memory.oom.group=1 memory.swap.max=524288"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			files, err := v2Files(&tc.res)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, f := range files {
				got = append(got, f.name+"="+f.value)
			}
			if strings.Join(got, " ") != tc.want {
				t.Fatalf("got  %s\nwant %s", strings.Join(got, " "), tc.want)
			}
		})
	}
}

func TestV2FilesRefuse(t *testing.T) {
	for _, res := range []specs.LinuxResources{
		{Memory: &specs.LinuxMemory{Limit: i64(2 << 20), Swap: i64(1 << 20)}},
		{Memory: &specs.LinuxMemory{Swap: i64(1 << 20)}},
		{Unified: map[string]string{"../memory.max": "1"}},
	} {
		if _, err := v2Files(&res); err == nil {
			t.Errorf("%+v accepted", res)
		}
	}
}

// writeV2 writes only files that exist (as in a cgroup, where a missing
// file is a missing controller), tolerating a missing memory.swap.max for
// "no swap" as runc does.
func TestWriteV2(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"memory.max", "memory.high", "cpu.weight", "cpu.max"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	res := &specs.LinuxResources{
		CPU:     &specs.LinuxCPU{Shares: u64(512), Quota: i64(-1), Period: u64(100000)},
		Memory:  &specs.LinuxMemory{Limit: i64(1 << 20), Swap: i64(1 << 20)},
		Unified: map[string]string{"memory.high": "1000"},
	}
	if err := writeV2(dir, res); err != nil {
		t.Fatalf("writeV2: %v", err)
	}
	for f, want := range map[string]string{"memory.max": "1048576", "memory.high": "1000", "cpu.weight": "20", "cpu.max": "max 100000"} {
		if b, _ := os.ReadFile(filepath.Join(dir, f)); string(b) != want {
			t.Errorf("%s = %q, want %q", f, b, want)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "memory.swap.max")); !os.IsNotExist(err) {
		t.Errorf("memory.swap.max created: %v", err)
	}
	err := writeV2(dir, &specs.LinuxResources{Pids: &specs.LinuxPids{Limit: i64(5)}})
	if err == nil || !strings.Contains(err.Error(), "pids.max") {
		t.Fatalf("a missing pids.max: %v", err)
	}
}
