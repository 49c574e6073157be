package stats

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/berthcri/berth/internal/errdefs"
)

func TestGroupFromProcCgroup(t *testing.T) {
	for name, tc := range map[string]struct{ data, want string }{
		// systemd in a container below /berthsd, hybrid: the name=systemd
		// path wins over the memory controller's.
		"hybrid": {`13:hugetlb:/
9:name=systemd:/berthsd/berth.slice/berth-berthpod_a.slice/berth-c1.scope
4:memory:/berthsd/berth.slice/berth-berthpod_a.slice/berth-c1.scope
1:cpu:/
0::/berthsd/berth.slice/berth-berthpod_a.slice/berth-c1.scope
`, "/berthsd/berth.slice/berth-berthpod_a.slice/berth-c1.scope"},
		"v1 without name=systemd": {"4:memory:/berth/pod-a/c1\n3:cpu,cpuacct:/berth/pod-a/c1\n", "/berth/pod-a/c1"},
		"v2":                      {"0::/kubepods.slice/kubepods-pod1.slice/berth-c1.scope\n", "/kubepods.slice/kubepods-pod1.slice/berth-c1.scope"},
		"deleted":                 {"0::/a.slice/berth-c1.scope (deleted)\n", "/a.slice/berth-c1.scope"},
	} {
		got, err := GroupFromProcCgroup([]byte(tc.data))
		if err != nil || got != tc.want {
			t.Errorf("%s: got %q, %v; want %q", name, got, err, tc.want)
		}
	}
	// v1 with neither name=systemd nor memory: no usable path.
	if _, err := GroupFromProcCgroup([]byte("1:cpu:/x\n0::/\n")); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("no usable line: err %v", err)
	}
}

func TestProcessGroup(t *testing.T) {
	proc := t.TempDir()
	if err := os.MkdirAll(filepath.Join(proc, "42"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(proc, "42", "cgroup"), []byte("0::/system.slice/berth-x.scope\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := ProcessGroup(proc, 42); err != nil || got != "/system.slice/berth-x.scope" {
		t.Errorf("ProcessGroup = %q, %v", got, err)
	}
	if _, err := ProcessGroup(proc, 43); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("gone process: err %v", err)
	}
	// This very process: whatever it is in, the answer is an absolute path.
	if got, err := ProcessGroup("/proc", os.Getpid()); err != nil || got == "" || got[0] != '/' {
		t.Errorf("own cgroup: %q, %v", got, err)
	}
}
