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

func TestSystemdV1Path(t *testing.T) {
	// systemd in a container: its own cgroup is /c/init.scope in
	// name=systemd and cpu, but /m in memory (a runtime placed it there).
	roots := initRoots([]byte("9:name=systemd:/c/init.scope\n4:memory:/m\n3:cpu,cpuacct:/c/init.scope\n1:pids:/\n0::/c/init.scope\n"))
	want := map[string]string{"systemd": "/c", "memory": "/m", "cpu": "/c", "cpuacct": "/c", "pids": "/"}
	for k, v := range want {
		if roots[k] != v {
			t.Errorf("root of %s = %q, want %q (all %v)", k, roots[k], v, roots)
		}
	}
	for _, tc := range []struct {
		group, ctl, want string
		ok               bool
	}{
		{"/c/a.slice/berth-x.scope", "memory", "/m/a.slice/berth-x.scope", true},
		{"/c/a.slice/berth-x.scope", "cpu", "/c/a.slice/berth-x.scope", true},
		{"/c/a.slice/berth-x.scope", "pids", "/a.slice/berth-x.scope", true},
		{"/other/x", "memory", "", false}, // not below systemd's root
		{"/cc/x", "memory", "", false},    // a sibling sharing the prefix
		{"/c/x", "blkio", "", false},      // unknown hierarchy
	} {
		got, ok := systemdV1Path(tc.group, tc.ctl, roots)
		if got != tc.want || ok != tc.ok {
			t.Errorf("systemdV1Path(%s, %s) = %q, %v; want %q, %v", tc.group, tc.ctl, got, ok, tc.want, tc.ok)
		}
	}
	// systemd at the root of every hierarchy (a normal host): no change.
	host := initRoots([]byte("9:name=systemd:/init.scope\n4:memory:/init.scope\n"))
	if got, ok := systemdV1Path("/a.slice/b.scope", "memory", host); !ok || got != "/a.slice/b.scope" {
		t.Errorf("host layout: %q, %v", got, ok)
	}
}
