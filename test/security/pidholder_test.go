package security

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/testimages"
)

// pidHolderSecret is put in berthd's environment: the shared-PID holder
// must not carry it where the pod's containers can read it.
const pidHolderSecret = "BERTH_TEST_PIDHOLDER_SECRET=s3cret-of-berthd"

// The holder of a shared PID namespace (berth-pause) is pid 1 of every
// container of a shareProcessNamespace pod. A container granted
// CAP_SYS_PTRACE and no AppArmor confinement passes the kernel's ptrace
// access check on it, so /proc/1/root, /proc/1/cwd and /proc/1/environ
// must show nothing of the host: no host file system, no berthd
// environment, and the holder itself holds no privilege to borrow. Run
// for a pod in the host's user namespace and for one with its own.
func TestSharedPIDHolderExposesNothingOfTheHost(t *testing.T) {
	// A host file that a process in the host's mount namespace reaches
	// by path, readable by anyone (a user namespace's root is "others").
	dir, err := os.MkdirTemp("", "berth-pidholder-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	marker := filepath.Join(dir, "marker")
	if err := os.WriteFile(marker, []byte("host-marker-content\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name   string
		userns *criapi.UserNamespace
	}{
		{"host user namespace", nil},
		{"pod user namespace", &criapi.UserNamespace{Mode: criapi.NamespaceMode_POD,
			Uids: []*criapi.IDMapping{{ContainerId: 0, HostId: 1000, Length: 100000}},
			Gids: []*criapi.IDMapping{{ContainerId: 0, HostId: 1000, Length: 100000}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := startPhEnv(t, berthdtest.Options{
				Env: []string{pidHolderSecret},
				Configure: func(c *config.Config) {
					// A user namespace's root must reach its rootfs
					// below the scratch dir (as test/integration/userns).
					if tc.userns != nil {
						if err := os.Chmod(filepath.Dir(c.Root), 0o711); err != nil {
							t.Fatal(err)
						}
					}
				},
			})
			nsOpts := &criapi.NamespaceOption{Pid: criapi.NamespaceMode_POD, UsernsOptions: tc.userns}
			pod, podID := e.runPod(t, "pidholder-"+strings.ReplaceAll(tc.name, " ", "-"), nsOpts)
			ctr := e.container("tracer", nsOpts)
			ctr.Linux.SecurityContext.Capabilities = &criapi.Capability{AddCapabilities: []string{"SYS_PTRACE"}}
			ctr.Linux.SecurityContext.Apparmor = &criapi.SecurityProfile{ProfileType: criapi.SecurityProfile_Unconfined}
			id := e.runContainer(t, podID, pod, ctr)
			sh := func(script string) (string, int32) { t.Helper(); return e.sh(t, id, script) }

			// The container did get what the attacker needs: pid 1 is
			// the holder, and CAP_SYS_PTRACE (bit 19) is effective.
			if out, _ := sh("cat /proc/1/cmdline | tr '\\0' ' '"); !strings.Contains(out, "berth-pause") {
				t.Fatalf("pid 1 of the pod is not berth-pause: %q", out)
			}
			if out, _ := sh("grep CapEff /proc/self/status"); !hasCapBit(t, out, 19) {
				t.Fatalf("container lacks CAP_SYS_PTRACE: %q", out)
			}

			if out, code := sh("cat /proc/1/root" + marker); code == 0 || strings.Contains(out, "host-marker-content") {
				t.Errorf("a container read the host file %s through /proc/1/root (exit %d): %q", marker, code, out)
			}
			if out, code := sh("cat /proc/1/cwd" + marker); code == 0 || strings.Contains(out, "host-marker-content") {
				t.Errorf("a container read the host file %s through /proc/1/cwd (exit %d): %q", marker, code, out)
			}
			if out, _ := sh("ls -A /proc/1/root/ 2>&1"); strings.Contains(out, "etc") || strings.Contains(out, "proc") {
				t.Errorf("/proc/1/root shows a file system: %q", out)
			}
			if out, _ := sh("tr '\\0' '\\n' < /proc/1/environ"); strings.Contains(out, "s3cret-of-berthd") || strings.Contains(out, "PATH=") {
				t.Errorf("/proc/1/environ carries berthd's environment: %q", out)
			}
			// Nothing to borrow either: no capability in any set, no
			// root, no way to gain privileges by exec, and no descriptor
			// but the ones it was started with.
			status, _ := sh("cat /proc/1/status")
			for _, want := range []string{"CapInh:\t0000000000000000", "CapPrm:\t0000000000000000", "CapEff:\t0000000000000000", "CapBnd:\t0000000000000000", "CapAmb:\t0000000000000000", "NoNewPrivs:\t1"} {
				if !strings.Contains(status, want) {
					t.Errorf("holder status lacks %q:\n%s", want, status)
				}
			}
			for _, line := range strings.Split(status, "\n") {
				if f := strings.Fields(line); len(f) == 5 && (f[0] == "Uid:" || f[0] == "Gid:") && f[1] == "0" {
					t.Errorf("holder runs as root: %q", line)
				}
			}
			if out, _ := sh("ls /proc/1/fd 2>&1 | tr '\\n' ' '"); strings.TrimSpace(out) != "0 1 2" {
				t.Errorf("holder holds descriptors beyond stdio: %q", out)
			}
		})
	}
}

// hasCapBit reports whether the hex mask on a "CapEff:\t…" line has bit.
func hasCapBit(t *testing.T, line string, bit uint) bool {
	t.Helper()
	var mask uint64
	if _, err := fmt.Sscanf(strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "CapEff:")), "%x", &mask); err != nil {
		t.Fatalf("parse %q: %v", line, err)
	}
	return mask&(1<<bit) != 0
}

// phEnv is a berthd with busybox pulled, for the tests of this file and
// of sockets_test.go and fdleak_test.go.
type phEnv struct {
	d   *berthdtest.Daemon
	reg *testimages.Registry
	img string
}

func startPhEnv(t *testing.T, opts berthdtest.Options) *phEnv {
	t.Helper()
	d := berthdtest.Start(t, opts)
	reg := testimages.StartRegistry(t)
	reg.PushStandard(t)
	img := reg.Ref("busybox:latest")
	if _, err := d.Image.PullImage(berthdtest.Ctx(t), &criapi.PullImageRequest{Image: &criapi.ImageSpec{Image: img}}); err != nil {
		t.Fatalf("pull: %v", err)
	}
	return &phEnv{d: d, reg: reg, img: img}
}

// runPod runs a pod with namespace options ns; it is removed at the end.
func (e *phEnv) runPod(t *testing.T, name string, ns *criapi.NamespaceOption) (*criapi.PodSandboxConfig, string) {
	t.Helper()
	pod := &criapi.PodSandboxConfig{
		Metadata:     &criapi.PodSandboxMetadata{Name: name, Namespace: "default", Uid: name + "-uid"},
		Hostname:     name,
		LogDirectory: filepath.Join(e.d.Dir, "podlogs"),
		Linux: &criapi.LinuxPodSandboxConfig{SecurityContext: &criapi.LinuxSandboxSecurityContext{
			NamespaceOptions: ns,
		}},
	}
	run, err := e.d.Runtime.RunPodSandbox(berthdtest.Ctx(t), &criapi.RunPodSandboxRequest{Config: pod})
	if err != nil {
		t.Fatalf("RunPodSandbox %s: %v", name, err)
	}
	t.Cleanup(func() {
		_, _ = e.d.Runtime.StopPodSandbox(berthdtest.Ctx(t), &criapi.StopPodSandboxRequest{PodSandboxId: run.PodSandboxId})
		_, _ = e.d.Runtime.RemovePodSandbox(berthdtest.Ctx(t), &criapi.RemovePodSandboxRequest{PodSandboxId: run.PodSandboxId})
	})
	return pod, run.PodSandboxId
}

// container is a busybox container sleeping, with namespace options ns.
func (e *phEnv) container(name string, ns *criapi.NamespaceOption) *criapi.ContainerConfig {
	return &criapi.ContainerConfig{
		Metadata: &criapi.ContainerMetadata{Name: name},
		Image:    &criapi.ImageSpec{Image: e.img},
		Command:  []string{"sleep", "600"},
		LogPath:  name + ".log",
		Linux: &criapi.LinuxContainerConfig{SecurityContext: &criapi.LinuxContainerSecurityContext{
			NamespaceOptions: ns,
		}},
	}
}

func (e *phEnv) runContainer(t *testing.T, podID string, pod *criapi.PodSandboxConfig, ctr *criapi.ContainerConfig) string {
	t.Helper()
	ctx := berthdtest.Ctx(t)
	cr, err := e.d.Runtime.CreateContainer(ctx, &criapi.CreateContainerRequest{PodSandboxId: podID, Config: ctr, SandboxConfig: pod})
	if err != nil {
		t.Fatalf("CreateContainer %s: %v", ctr.Metadata.Name, err)
	}
	if _, err := e.d.Runtime.StartContainer(ctx, &criapi.StartContainerRequest{ContainerId: cr.ContainerId}); err != nil {
		t.Fatalf("StartContainer %s: %v", ctr.Metadata.Name, err)
	}
	return cr.ContainerId
}

// sh runs script in the container (ExecSync) and returns its stdout and
// stderr together, and its exit code.
func (e *phEnv) sh(t *testing.T, id, script string) (string, int32) {
	t.Helper()
	r, err := e.d.Runtime.ExecSync(berthdtest.Ctx(t), &criapi.ExecSyncRequest{ContainerId: id, Cmd: []string{"sh", "-c", script}, Timeout: 30})
	if err != nil {
		t.Fatalf("exec %q: %v", script, err)
	}
	return string(r.Stdout) + string(r.Stderr), r.ExitCode
}
