// Package bundletest builds OCI bundles for tests of the shim and the
// container package: a busybox rootfs written from testimages.BaseFiles
// and a minimal hand-written runtime spec (test-only; real specs come from
// internal/specgen).
package bundletest

import (
	"os"
	"path/filepath"
	"sync"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/testimages"
)

// WriteRootfs writes the busybox base files into dir.
func WriteRootfs(t testing.TB, dir string) {
	t.Helper()
	files, err := testimages.BaseFiles()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		p := filepath.Join(dir, f.Name)
		switch {
		case f.Dir:
			mode := os.FileMode(f.Mode).Perm()
			if mode == 0 {
				mode = 0o755
			}
			if f.Mode&0o1000 != 0 {
				mode |= os.ModeSticky
			}
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(p, mode); err != nil {
				t.Fatal(err)
			}
			if err := os.Chown(p, f.UID, f.GID); err != nil {
				t.Fatal(err)
			}
		case f.Symlink != "":
			if err := os.Symlink(f.Symlink, p); err != nil {
				t.Fatal(err)
			}
		default:
			mode := os.FileMode(f.Mode).Perm()
			if mode == 0 {
				mode = 0o644
			}
			if err := os.WriteFile(p, f.Data, mode); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// Spec is a minimal runtime spec running args on rootfs in cgroup
// /<cgroupParent>/<id>, with its own pid, mount, ipc, uts and net namespaces.
func Spec(rootfs, cgroupParent, id string, args []string) *specs.Spec {
	caps := []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_KILL", "CAP_SETGID", "CAP_SETUID", "CAP_NET_BIND_SERVICE"}
	return &specs.Spec{
		Version: specs.Version,
		Process: &specs.Process{
			Args: args,
			Env:  []string{"PATH=/bin"},
			Cwd:  "/",
			Capabilities: &specs.LinuxCapabilities{
				Bounding: caps, Effective: caps, Permitted: caps,
			},
			NoNewPrivileges: true,
		},
		Root:     &specs.Root{Path: rootfs},
		Hostname: "bundletest",
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
		},
		Linux: &specs.Linux{
			CgroupsPath: "/" + cgroupParent + "/" + id,
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.MountNamespace}, {Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace}, {Type: specs.NetworkNamespace},
			},
		},
	}
}

var (
	shimOnce sync.Once
	shimBin  string
	shimErr  error
)

// ShimBinary returns berth-shim: $BERTH_BIN_DIR/berth-shim when set (make
// test builds it), else one built from this checkout on first use.
func ShimBinary(t testing.TB) string {
	t.Helper()
	if dir := os.Getenv("BERTH_BIN_DIR"); dir != "" {
		return filepath.Join(dir, "berth-shim")
	}
	shimOnce.Do(func() {
		dir, err := os.MkdirTemp("", "berth-shim-bin-")
		if err != nil {
			shimErr = err
			return
		}
		shimBin, shimErr = berthdtest.BuildShim(dir)
	})
	if shimErr != nil {
		t.Fatalf("build berth-shim: %v", shimErr)
	}
	return shimBin
}
