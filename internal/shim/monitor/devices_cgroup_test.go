package monitor

import "testing"

func TestDevicesTarget(t *testing.T) {
	for name, tc := range map[string]struct {
		data, want string
		ok         bool
	}{
		"moved up to the pod slice":  {"9:name=systemd:/r/p.slice/berth-c.scope\n5:devices:/r/p.slice\n4:memory:/r/p.slice/berth-c.scope\n", "/r/p.slice/berth-c.scope", true},
		"already in its scope":       {"9:name=systemd:/r/p.slice/berth-c.scope\n5:devices:/r/p.slice/berth-c.scope\n", "", false},
		"elsewhere, not an ancestor": {"9:name=systemd:/r/p.slice/berth-c.scope\n5:devices:/other\n", "", false},
		"not a scope (cgroupfs)":     {"9:name=systemd:/berth/pod-a/c\n5:devices:/berth/pod-a\n", "", false},
		"v2":                         {"0::/p.slice/berth-c.scope\n", "", false},
		"prefix but not a parent":    {"9:name=systemd:/r/p.slice2/berth-c.scope\n5:devices:/r/p.slice\n", "", false},
	} {
		got, ok := devicesTarget(parseProcCgroups([]byte(tc.data)))
		if got != tc.want || ok != tc.ok {
			t.Errorf("%s: got %q, %v; want %q, %v", name, got, ok, tc.want, tc.ok)
		}
	}
}

func TestParseProcCgroups(t *testing.T) {
	pc := parseProcCgroups([]byte("12:cpu,cpuacct:/a\n9:name=systemd:/r/p.slice/c.scope\n5:devices:/r/p.slice\n4:memory:/berth/pod-a/c\n0::/u\n"))
	if pc.memory != "/berth/pod-a/c" || pc.named != "/r/p.slice/c.scope" || pc.devices != "/r/p.slice" || pc.unified != "/u" {
		t.Fatalf("parsed %+v", pc)
	}
	if d := pc.memoryDir(); d != "/sys/fs/cgroup/memory/berth/pod-a/c" {
		t.Fatalf("memoryDir %q", d)
	}
	if d := parseProcCgroups([]byte("0::/p.slice/c.scope\n")).memoryDir(); d != "/sys/fs/cgroup/p.slice/c.scope" {
		t.Fatalf("v2 memoryDir %q", d)
	}
	if got := testing.AllocsPerRun(10, func() { _ = parseProcCgroups([]byte("4:memory:/x\n")) }); got > 2 {
		t.Fatalf("parse allocates %v times", got)
	}
}
