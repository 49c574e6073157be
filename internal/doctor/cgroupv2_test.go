package doctor

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fixtureV2 writes a unified hierarchy: files maps "group/file" to content.
func fixtureV2(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for f, data := range files {
		p := filepath.Join(root, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestCgroupV2Report(t *testing.T) {
	all := "cpuset cpu io memory hugetlb pids rdma misc\n"
	booted := t.TempDir()
	absent := filepath.Join(booted, "absent")
	for _, tc := range []struct {
		name   string
		driver string
		files  map[string]string
		booted string
		want   Level
		says   []string
	}{
		{"fresh host, no parent yet", "", map[string]string{"cgroup.controllers": all, "cgroup.subtree_control": ""}, absent, OK,
			[]string{"root offers: cpuset cpu io memory", "root enables: (none)", "systemd running: no (driver cgroupfs)", "pod parent /berth not yet created", "delegation: no process"}},
		{"parent exists", "cgroupfs", map[string]string{"cgroup.controllers": all, "cgroup.subtree_control": "cpu memory pids\n", "berth/cgroup.controllers": "cpu memory pids\n", "berth/cgroup.procs": ""}, absent, OK,
			[]string{"root enables: cpu memory pids", "pod parent /berth offers: cpu memory pids"}},
		{"process in the pod parent", "cgroupfs", map[string]string{"cgroup.controllers": all, "berth/cgroup.controllers": "", "berth/cgroup.procs": "42\n"}, absent, Fail,
			[]string{"cgroups holding processes on the way to the pods: /berth (1 processes)"}},
		{"systemd slice without memory yet", "systemd", map[string]string{"cgroup.controllers": all, "berth.slice/cgroup.controllers": "cpu pids\n"}, booted, Warn,
			[]string{"systemd running: yes (driver systemd)", "pod parent /berth.slice offers: cpu pids"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.CgroupDriver, cfg.CgroupParent = tc.driver, "berth"
			r := cgroupV2Result(fixtureV2(t, tc.files), cfg, tc.booted)
			if r.Level != tc.want {
				t.Errorf("level %s, want %s: %s", r.Level, tc.want, r.Message)
			}
			for _, s := range tc.says {
				if !strings.Contains(r.Message, s) {
					t.Errorf("message lacks %q:\n%s", s, r.Message)
				}
			}
			if r.Level != OK && r.Hint == "" {
				t.Errorf("no hint for %+v", r)
			}
		})
	}
	// A kubelet-style nested parent: a process two levels up fails too.
	cfg := testConfig(t)
	cfg.CgroupDriver, cfg.CgroupParent = "cgroupfs", "/a/b"
	r := cgroupV2Result(fixtureV2(t, map[string]string{"cgroup.controllers": all, "a/cgroup.procs": "1\n2\n", "a/b/cgroup.controllers": "cpu\n"}), cfg, absent)
	if r.Level != Fail || !strings.Contains(r.Message, "/a (2 processes)") {
		t.Errorf("nested: %+v", r)
	}
}
