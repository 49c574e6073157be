package specgen

import (
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	ocispecv1 "github.com/opencontainers/image-spec/specs-go/v1"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/errdefs"
)

// testHost is a fixed host: v1 cgroups, no LSM, swap accounting.
func testHost() *Host {
	return &Host{
		Hostname:        "node1",
		RlimitHard:      map[string]uint64{"RLIMIT_NOFILE": 4096},
		AllCapabilities: knownCapabilities,
		SwapAccounting:  true,
		DevPath:         "/dev",
	}
}

// testRootfs writes an /etc/passwd and /etc/group like testimages' into a
// temp dir.
func testRootfs(t testing.TB) string {
	t.Helper()
	return testRootfsAt(t, t.TempDir())
}

func testRootfsAt(t testing.TB, root string) string {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(name, data string) {
		if err := os.WriteFile(filepath.Join(root, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("etc/passwd", "root:x:0:0:root:/root:/bin/sh\n"+
		"# comment\n"+
		"nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"+
		"berthuser:x:1000:1000::/home/berthuser:/bin/sh\n"+
		"broken line\n")
	write("etc/group", "root:x:0:\nnogroup:x:65534:\nberthgroup:x:1000:\n"+
		"berthextra:x:2000:berthuser\nberthuser:x:3000:berthuser\nother:x:4000:someone,berthuser\n")
	return root
}

// testInput is a minimal valid Input; mutate it per case.
func testInput(t testing.TB) Input {
	t.Helper()
	return Input{
		ContainerID: "c1",
		Config: &runtime.ContainerConfig{
			Metadata: &runtime.ContainerMetadata{Name: "app"},
			Image:    &runtime.ImageSpec{Image: "docker.io/library/busybox:latest"},
			Linux:    &runtime.LinuxContainerConfig{SecurityContext: &runtime.LinuxContainerSecurityContext{}},
		},
		SandboxConfig: &runtime.PodSandboxConfig{
			Metadata: &runtime.PodSandboxMetadata{Name: "pod", Namespace: "ns", Uid: "uid1"},
			Hostname: "podhost",
			Linux:    &runtime.LinuxPodSandboxConfig{SecurityContext: &runtime.LinuxSandboxSecurityContext{}},
		},
		Image: &ocispecv1.Image{Config: ocispecv1.ImageConfig{
			Cmd: []string{"sh"},
			Env: []string{"PATH=/bin", "IMG=1"},
		}},
		RootfsPath:   testRootfs(t),
		Pod:          Pod{ID: "p1", NetNSPath: "/run/netns/p1", IPCNSPath: "/run/ipcns/p1", UTSNSPath: "/run/utsns/p1", PIDNSPath: "/run/pidns/p1"},
		CgroupDriver: "cgroupfs",
		Host:         testHost(),
	}
}

// sc is the container security context of in.
func sc(in *Input) *runtime.LinuxContainerSecurityContext {
	return in.Config.Linux.SecurityContext
}

// wantErr checks err against a case's expectation: "" → no error,
// "invalid" → errdefs.ErrInvalidArgument, other → errors.Is that kind.
func wantErr(t *testing.T, err error, want error) {
	t.Helper()
	switch {
	case want == nil && err != nil:
		t.Fatalf("unexpected error: %v", err)
	case want != nil && err == nil:
		t.Fatalf("want error %v, got none", want)
	case want != nil && !errors.Is(err, want):
		t.Fatalf("want error kind %v, got %v", want, err)
	}
}

var errInvalid = errdefs.ErrInvalidArgument

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
