package security

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/testimages"
)

// miscPod is a daemon with busybox pulled and one pod whose log
// directory is logDir.
type miscPod struct {
	t      *testing.T
	d      *berthdtest.Daemon
	reg    *testimages.Registry
	pod    string
	podCfg *criapi.PodSandboxConfig
	logDir string
}

func newMiscPod(t *testing.T, edit func(*criapi.PodSandboxConfig)) *miscPod {
	t.Helper()
	d := berthdtest.Start(t, berthdtest.Options{})
	reg := testimages.StartRegistry(t)
	reg.PushStandard(t)
	if _, err := d.Image.PullImage(berthdtest.Ctx(t), &criapi.PullImageRequest{Image: &criapi.ImageSpec{Image: reg.Ref("busybox:latest")}}); err != nil {
		t.Fatalf("pull busybox: %v", err)
	}
	p := &miscPod{t: t, d: d, reg: reg, logDir: filepath.Join(d.Dir, "podlogs")}
	name := strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-"))
	p.podCfg = &criapi.PodSandboxConfig{
		Metadata:     &criapi.PodSandboxMetadata{Name: name, Namespace: "security", Uid: name + "-uid"},
		Hostname:     "misc",
		LogDirectory: p.logDir,
		Linux: &criapi.LinuxPodSandboxConfig{SecurityContext: &criapi.LinuxSandboxSecurityContext{
			NamespaceOptions: &criapi.NamespaceOption{Pid: criapi.NamespaceMode_CONTAINER},
		}},
	}
	if edit != nil {
		edit(p.podCfg)
	}
	resp, err := d.Runtime.RunPodSandbox(berthdtest.Ctx(t), &criapi.RunPodSandboxRequest{Config: p.podCfg})
	if err != nil {
		t.Fatalf("RunPodSandbox: %v", err)
	}
	p.pod = resp.PodSandboxId
	return p
}

// config is busybox running args, its CRI log at logPath.
func (p *miscPod) config(name, logPath string, args ...string) *criapi.ContainerConfig {
	return &criapi.ContainerConfig{
		Metadata: &criapi.ContainerMetadata{Name: name},
		Image:    &criapi.ImageSpec{Image: p.reg.Ref("busybox:latest")},
		Command:  args,
		LogPath:  logPath,
		Linux: &criapi.LinuxContainerConfig{SecurityContext: &criapi.LinuxContainerSecurityContext{
			NamespaceOptions: &criapi.NamespaceOption{Pid: criapi.NamespaceMode_CONTAINER},
		}},
	}
}

func (p *miscPod) create(cfg *criapi.ContainerConfig) (string, error) {
	resp, err := p.d.Runtime.CreateContainer(berthdtest.Ctx(p.t), &criapi.CreateContainerRequest{PodSandboxId: p.pod, Config: cfg, SandboxConfig: p.podCfg})
	if err != nil {
		return "", err
	}
	return resp.ContainerId, nil
}

func (p *miscPod) start(id string) {
	p.t.Helper()
	if _, err := p.d.Runtime.StartContainer(berthdtest.Ctx(p.t), &criapi.StartContainerRequest{ContainerId: id}); err != nil {
		p.t.Fatalf("StartContainer: %v", err)
	}
}

// waitExited waits for the container to exit (the kubelet's poll).
func (p *miscPod) waitExited(id string) {
	p.t.Helper()
	for ctx := berthdtest.Ctx(p.t); ctx.Err() == nil; time.Sleep(50 * time.Millisecond) {
		resp, err := p.d.Runtime.ContainerStatus(ctx, &criapi.ContainerStatusRequest{ContainerId: id})
		if err != nil {
			p.t.Fatalf("ContainerStatus: %v", err)
		}
		if resp.Status.State == criapi.ContainerState_CONTAINER_EXITED {
			return
		}
	}
	p.t.Fatalf("container %s did not exit", id)
}

// waitFileHas waits until the file at path holds want.
func waitFileHas(t *testing.T, path string, want []byte) {
	t.Helper()
	for ctx := berthdtest.Ctx(t); ctx.Err() == nil; time.Sleep(50 * time.Millisecond) {
		if b, _ := os.ReadFile(path); bytes.Contains(b, want) {
			return
		}
	}
	b, _ := os.ReadFile(path)
	t.Fatalf("%s never held %q: %q", path, want, b)
}

// TestLogSymlinkInPodLogDirIsNotFollowed plants, in the pod's log
// directory, what a container that can write there (a log collector's
// hostPath of /var/log/pods) would plant: a symlink or hard link at a
// container's log file, or a symlink at its directory, pointing at a host
// file. The monitor, root, must not append the container's output to the
// host file: the create fails cleanly instead (issue 34, finding 6).
func TestLogSymlinkInPodLogDirIsNotFollowed(t *testing.T) {
	p := newMiscPod(t, nil)
	host := t.TempDir()
	hostFile := filepath.Join(host, "shadow")
	const precious = "root:precious:0:0\n"
	for _, tc := range []struct {
		name, logPath string
		plant         func(t *testing.T, logFile string)
	}{
		{"file symlink", "evil/0.log", func(t *testing.T, logFile string) {
			if err := os.MkdirAll(filepath.Dir(logFile), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(hostFile, logFile); err != nil {
				t.Fatal(err)
			}
		}},
		{"dir symlink", "evildir/shadow", func(t *testing.T, logFile string) {
			if err := os.Symlink(host, filepath.Dir(logFile)); err != nil {
				t.Fatal(err)
			}
		}},
		{"hard link", "hard.log", func(t *testing.T, logFile string) {
			if err := os.Link(hostFile, logFile); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := os.WriteFile(hostFile, []byte(precious), 0o644); err != nil {
				t.Fatal(err)
			}
			logFile := filepath.Join(p.logDir, tc.logPath)
			if err := os.MkdirAll(p.logDir, 0o755); err != nil {
				t.Fatal(err)
			}
			tc.plant(t, logFile)
			name := strings.ReplaceAll(tc.name, " ", "-")
			id, err := p.create(p.config(name, tc.logPath, "echo", "pwned::0:0"))
			if err == nil {
				p.start(id)
				p.waitExited(id)
			} else {
				t.Logf("create refused: %v", err)
			}
			if b, _ := os.ReadFile(hostFile); string(b) != precious {
				t.Fatalf("the host file behind the planted %s now holds %q", tc.name, b)
			}
			if err == nil {
				t.Fatalf("CreateContainer with a planted %s at its log succeeded", tc.name)
			}
		})
	}
}

// TestLogSymlinkPlantedBeforeReopenIsNotFollowed rotates a running
// container's log as the kubelet does (rename, then ReopenContainerLog)
// but plants a symlink to a host file at the log's path in between: the
// reopen must fail and the output keep going to the rotated file.
func TestLogSymlinkPlantedBeforeReopenIsNotFollowed(t *testing.T) {
	p := newMiscPod(t, nil)
	hostFile := filepath.Join(t.TempDir(), "shadow")
	const precious = "root:precious:0:0\n"
	if err := os.WriteFile(hostFile, []byte(precious), 0o644); err != nil {
		t.Fatal(err)
	}
	id, err := p.create(p.config("ticker", "ticker/0.log", "sh", "-c", "i=0; while :; do i=$((i+1)); echo tick$i; sleep 0.1; done"))
	if err != nil {
		t.Fatalf("CreateContainer: %v", err)
	}
	p.start(id)
	logFile := filepath.Join(p.logDir, "ticker", "0.log")
	waitFileHas(t, logFile, []byte("tick2\n"))
	if err := os.Rename(logFile, logFile+".1"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(hostFile, logFile); err != nil {
		t.Fatal(err)
	}
	_, err = p.d.Runtime.ReopenContainerLog(berthdtest.Ctx(t), &criapi.ReopenContainerLogRequest{ContainerId: id})
	if err == nil {
		// Give the container's next lines the time to land where the
		// monitor now writes before looking at the host file.
		waitFileHas(t, hostFile, []byte("tick"))
		b, _ := os.ReadFile(hostFile)
		t.Fatalf("ReopenContainerLog followed the planted symlink: the host file now holds %q", b)
	}
	t.Logf("reopen refused: %v", err)
	// The output goes on into the rotated file, never the host file.
	rotated, _ := os.ReadFile(logFile + ".1")
	n, _ := strconv.Atoi(strings.TrimPrefix(lastTick(rotated), "tick"))
	waitFileHas(t, logFile+".1", []byte("tick"+strconv.Itoa(n+3)+"\n"))
	if b, _ := os.ReadFile(hostFile); string(b) != precious {
		t.Fatalf("the host file now holds %q", b)
	}
}

// lastTick is the last "tickN" in a CRI log.
func lastTick(b []byte) string {
	i := bytes.LastIndex(b, []byte("tick"))
	if i < 0 {
		return ""
	}
	end := bytes.IndexByte(b[i:], '\n')
	if end < 0 {
		return string(b[i:])
	}
	return string(b[i : i+end])
}
