package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/berthcri/berth/internal/testutil/berthdtest"
)

func TestBerthctlInfoReportsTheDaemon(t *testing.T) {
	t.Parallel()
	d := berthdtest.Start(t, berthdtest.Options{})
	runPod(t, d, podConfig("info"))
	out, code := runBerthctl(t, "--address", "unix://"+d.Socket, "info")
	if code != 0 {
		t.Fatalf("berthctl info exited %d:\n%s", code, out)
	}
	for _, want := range []string{"runtime:    berth", "streaming:  127.0.0.1:", "cgroups:    cgroupfs driver", "controllers: v", "pods:", "pods ready:", "images:", `"root": "` + d.Root + `"`, "handler:    runc recursive_read_only_mounts=true user_namespaces="} {
		if !strings.Contains(out, want) {
			t.Errorf("info lacks %q:\n%s", want, out)
		}
	}
}

func TestBerthctlAddressFromEnvironment(t *testing.T) {
	t.Parallel()
	d := berthdtest.Start(t, berthdtest.Options{})
	cmd := exec.Command(berthctl(t), "info")
	cmd.Env = append(os.Environ(), "BERTH_ADDRESS=unix://"+d.Socket)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "runtime:    berth") {
		t.Fatalf("berthctl info with BERTH_ADDRESS: %v\n%s", err, out)
	}
}

func TestBerthctlDoctorPassesOnThisNode(t *testing.T) {
	t.Parallel()
	cfg := filepath.Join(t.TempDir(), "berth.toml")
	dir := t.TempDir()
	os.WriteFile(cfg, []byte("root = \""+dir+"/root\"\nstate = \""+dir+"/state\"\nlisten = \"unix://"+dir+"/s.sock\"\ncni_conf_dir = \""+dir+"/net.d\"\n"), 0o644)
	out, code := runBerthctl(t, "--config", cfg, "doctor")
	if code != 0 {
		t.Fatalf("doctor fails on the test node (exit %d):\n%s", code, out)
	}
	if !strings.Contains(out, "ok    runtime runc") || !strings.Contains(out, "ok    cni plugins") {
		t.Fatalf("doctor output:\n%s", out)
	}
	// On a cgroup v2 node (the guest lane) doctor says what it found there.
	var fs syscall.Statfs_t
	if syscall.Statfs("/sys/fs/cgroup", &fs) == nil && fs.Type == unix.CGROUP2_SUPER_MAGIC {
		if !strings.Contains(out, "cgroup v2") || !strings.Contains(out, "unified hierarchy at /sys/fs/cgroup") {
			t.Fatalf("doctor on a cgroup v2 node does not report the unified hierarchy:\n%s", out)
		}
	}
	t.Logf("doctor:\n%s", out)
}

func TestBerthctlDoctorFailsWithHintsOnABadConfig(t *testing.T) {
	t.Parallel()
	cfg := filepath.Join(t.TempDir(), "berth.toml")
	empty := t.TempDir()
	os.WriteFile(cfg, []byte("runtime = \"/nonexistent/runc\"\ncni_bin_dirs = [\""+empty+"\"]\n"), 0o644)
	out, code := runBerthctl(t, "--config", cfg, "doctor")
	if code == 0 {
		t.Fatalf("doctor passed with a missing runtime and plugins:\n%s", out)
	}
	for _, want := range []string{"fail  runtime runc", "/nonexistent/runc", "fix: install it", "fail  cni plugins", "containernetworking-plugins"} {
		if !strings.Contains(out, want) {
			t.Errorf("doctor output lacks %q:\n%s", want, out)
		}
	}
}
