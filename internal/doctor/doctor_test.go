package doctor

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berthcri/berth/internal/cgroupctrl"
	"github.com/berthcri/berth/internal/config"
)

func testConfig(t *testing.T) *config.Config {
	t.Helper()
	cfg := config.Default()
	dir := t.TempDir()
	cfg.Root, cfg.State = dir+"/root", dir+"/state"
	cfg.Listen = "unix://" + dir + "/berth.sock"
	cfg.CNIConfDir = dir + "/net.d"
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

func find(t *testing.T, rs []Result, name string) Result {
	t.Helper()
	for _, r := range rs {
		if r.Name == name {
			return r
		}
	}
	t.Fatalf("no %q check in %+v", name, rs)
	return Result{}
}

func TestDoctorPassesOnThisNode(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the node checks expect root")
	}
	rs := Run(context.Background(), testConfig(t))
	var buf bytes.Buffer
	Print(&buf, rs)
	if Failed(rs) {
		t.Fatalf("doctor fails on the test node:\n%s", buf.String())
	}
	if !strings.Contains(buf.String(), "embedded default") {
		t.Fatalf("empty conf dir not explained:\n%s", buf.String())
	}
}

func TestDoctorFailsWithAHintWhenTheRuntimeIsMissing(t *testing.T) {
	cfg := testConfig(t)
	cfg.RuntimeHandlers["runc"] = config.RuntimeHandler{Binary: "/nonexistent/runc"}
	r := find(t, Run(context.Background(), cfg), "runtime runc")
	if r.Level != Fail || !strings.Contains(r.Message, "/nonexistent/runc") || !strings.Contains(r.Hint, "apt-get install runc") {
		t.Fatalf("missing runtime: %+v", r)
	}
}

func TestDoctorFailsWithAHintWhenCNIPluginsAreMissing(t *testing.T) {
	cfg := testConfig(t)
	cfg.CNIBinDirs = []string{t.TempDir()}
	rs := Run(context.Background(), cfg)
	r := find(t, rs, "cni plugins")
	if r.Level != Fail || !strings.Contains(r.Message, "bridge") || !strings.Contains(r.Hint, "containernetworking-plugins") {
		t.Fatalf("missing plugins: %+v", r)
	}
	if !Failed(rs) {
		t.Fatal("Failed() false with a failing check")
	}
}

func TestDoctorNamesTheCNIConfigInUse(t *testing.T) {
	cfg := testConfig(t)
	os.MkdirAll(cfg.CNIConfDir, 0o755)
	os.WriteFile(cfg.CNIConfDir+"/20-b.conflist", []byte("{}"), 0o644)
	os.WriteFile(cfg.CNIConfDir+"/10-a.conf", []byte("{}"), 0o644)
	r := find(t, Run(context.Background(), cfg), "cni config")
	if !strings.Contains(r.Message, "10-a.conf") {
		t.Fatalf("cni config: %+v", r)
	}
}

func TestCheckCgroupDriver(t *testing.T) {
	booted := t.TempDir()
	absent := booted + "/absent"
	for _, tc := range []struct {
		driver, dir string
		want        Level
	}{
		{"systemd", booted, OK},
		{"systemd", absent, Fail},
		{"cgroupfs", booted, Warn},
		{"", booted, Warn},
		{"cgroupfs", absent, OK},
	} {
		r := checkCgroupDriver(tc.driver, tc.dir)
		if r.Level != tc.want {
			t.Errorf("driver %q, systemd dir %s: %s (%s), want %s", tc.driver, tc.dir, r.Level, r.Message, tc.want)
		}
		if r.Level == Fail && (!strings.Contains(r.Message, "not running") || r.Hint == "") {
			t.Errorf("failure does not name the problem: %+v", r)
		}
	}
}

// The cgroup check reads the mounts: a host shaped like the development
// machine (no hugetlb hierarchy mounted) warns and says hugepage limits
// are dropped; with the hierarchy mounted it is ok; without memory it
// fails.
func TestCheckCgroupsFromMounts(t *testing.T) {
	cfg := testConfig(t)
	fixtures := "../cgroupctrl/testdata/"
	r := cgroupResult(cgroupctrl.Options{MountInfo: fixtures + "mountinfo-v1-no-hugetlb"}, cfg)
	if r.Level != Warn || !strings.Contains(r.Message, "hugetlb (hugepage limits)") || !strings.Contains(r.Hint, "mount -t cgroup -o hugetlb") {
		t.Errorf("without hugetlb: %+v", r)
	}
	r = cgroupResult(cgroupctrl.Options{MountInfo: fixtures + "mountinfo-v1-hugetlb"}, cfg)
	if r.Level != OK || !strings.Contains(r.Message, "hugetlb") || strings.Contains(r.Message, "missing") && strings.Contains(r.Message, "hugetlb (") {
		t.Errorf("with hugetlb: %+v", r)
	}
	noMemory := filepath.Join(t.TempDir(), "mountinfo")
	data, err := os.ReadFile(fixtures + "mountinfo-v1-hugetlb")
	if err != nil {
		t.Fatal(err)
	}
	var kept []string
	for _, l := range strings.Split(string(data), "\n") {
		if !strings.HasSuffix(l, ",memory") {
			kept = append(kept, l)
		}
	}
	if err := os.WriteFile(noMemory, []byte(strings.Join(kept, "\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	r = cgroupResult(cgroupctrl.Options{MountInfo: noMemory}, cfg)
	if r.Level != Fail || !strings.Contains(r.Message, "memory") || r.Hint == "" {
		t.Errorf("without memory: %+v", r)
	}
}

func TestDoctorWarnsAboutABrokenCRIU(t *testing.T) {
	cfg := testConfig(t)
	cfg.CRIU = filepath.Join(t.TempDir(), "no-criu")
	r := checkCRIU(context.Background(), cfg)
	if r.Level != Warn || !strings.Contains(r.Message, "CheckpointPod") || r.Hint == "" {
		t.Fatalf("criu check = %+v", r)
	}
}

func TestOverlayVerdict(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	listed := write("listed/filesystems", "nodev\tsysfs\nnodev\toverlay\n")
	unlisted := write("unlisted/filesystems", "nodev\tsysfs\n\text4\n")
	write("mods/modules.dep", "kernel/fs/ext4/ext4.ko.xz: kernel/fs/jbd2/jbd2.ko.xz\nkernel/fs/overlayfs/overlay.ko.xz:\n")
	write("builtin/modules.builtin", "kernel/fs/overlayfs/overlay.ko\n")
	write("none/modules.dep", "kernel/fs/ext4/ext4.ko:\n")
	loaded := filepath.Join(dir, "sys-module-overlay")
	if err := os.Mkdir(loaded, 0o755); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "absent")
	for _, tc := range []struct {
		name                   string
		fs, module, modulesDir string
		want                   Level
	}{
		{"listed", listed, missing, missing, OK},
		{"module loaded", unlisted, loaded, missing, OK},
		// A freshly booted node: not listed, not loaded, but loadable.
		{"loadable module", unlisted, missing, filepath.Join(dir, "mods"), OK},
		{"built in", unlisted, missing, filepath.Join(dir, "builtin"), OK},
		{"no overlay at all", unlisted, missing, filepath.Join(dir, "none"), Fail},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := overlayVerdict(tc.fs, tc.module, tc.modulesDir)
			if r.Level != tc.want {
				t.Fatalf("overlayVerdict = %s (%s), want %s", r.Level, r.Message, tc.want)
			}
			if r.Level == Fail && r.Hint == "" {
				t.Fatal("a failure without a hint")
			}
		})
	}
}
