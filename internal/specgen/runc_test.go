package specgen

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	ocispecv1 "github.com/opencontainers/image-spec/specs-go/v1"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/oci"
	"github.com/berthcri/berth/internal/testutil/testimages"
)

// writeBaseRootfs writes testimages.BaseFiles (busybox, /etc/passwd with
// berthuser) into dir.
func writeBaseRootfs(t *testing.T, dir string) {
	t.Helper()
	files, err := testimages.BaseFiles()
	if err != nil {
		t.Skip(err)
	}
	for _, f := range files {
		p := filepath.Join(dir, f.Name)
		switch {
		case f.Dir:
			mode := os.FileMode(f.Mode)
			if mode == 0 {
				mode = 0o755
			}
			err = os.MkdirAll(p, mode)
			if err == nil {
				err = os.Chmod(p, mode) // MkdirAll obeys the umask; 1777 needs chmod
			}
		case f.Symlink != "":
			err = os.Symlink(f.Symlink, p)
		case f.Hardlink != "":
			err = os.Link(filepath.Join(dir, f.Hardlink), p)
		default:
			mode := os.FileMode(f.Mode)
			if mode == 0 {
				mode = 0o644
			}
			err = os.WriteFile(p, f.Data, mode)
		}
		if err == nil {
			err = os.Lchown(p, f.UID, f.GID)
		}
		if err != nil {
			t.Fatalf("write rootfs %s: %v", f.Name, err)
		}
	}
}

// capMask is the /proc/<pid>/status hex of a capability list.
func capMask(caps []string) string {
	var m uint64
	for _, c := range caps {
		for i, k := range knownCapabilities {
			if k == c {
				m |= 1 << i
			}
		}
	}
	return fmt.Sprintf("%016x", m)
}

// TestRuncRunsBuiltSpec builds specs with Build and runs them with the real
// runc: the process must see the uid, gid, groups and capabilities the spec
// says, with seccomp and no_new_privs in force.
func TestRuncRunsBuiltSpec(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("runc needs root")
	}
	runc, err := exec.LookPath("runc")
	if err != nil {
		t.Skip("runc not installed")
	}
	host, err := ProbeHost()
	if err != nil {
		t.Fatal(err)
	}
	floor := 0
	if b, err := os.ReadFile("/proc/self/oom_score_adj"); err == nil {
		floor, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	}

	for _, tc := range []struct {
		name     string
		security *runtime.LinuxContainerSecurityContext
		wantID   string
		// root keeps its effective set; a non-root exec without ambient
		// caps ends with none.
		effective bool
		// extra runs after the status dump; wantLines must appear in the output.
		extra      string
		mounts     func(dir string) []*runtime.Mount
		devices    []*runtime.Device
		privileged bool
		wantLines  []string
	}{
		{
			name: "image user with groups and default seccomp",
			security: &runtime.LinuxContainerSecurityContext{
				RunAsUsername:      testimages.TestUser,
				SupplementalGroups: []int64{4321},
				NoNewPrivs:         true,
				Capabilities:       &runtime.Capability{DropCapabilities: []string{"KILL", "CAP_CHOWN"}},
				Seccomp:            &runtime.SecurityProfile{ProfileType: runtime.SecurityProfile_RuntimeDefault},
				NamespaceOptions:   &runtime.NamespaceOption{Network: runtime.NamespaceMode_NODE, Ipc: runtime.NamespaceMode_NODE, Pid: runtime.NamespaceMode_CONTAINER},
			},
			wantID: fmt.Sprintf("uid=%d(%s) gid=%d(%s) groups=%d(%s),%d(berthextra),4321",
				testimages.TestUID, testimages.TestUser, testimages.TestGID, testimages.TestGroup,
				testimages.TestGID, testimages.TestGroup, testimages.ExtraGID),
		},
		{
			name: "root with added capability",
			security: &runtime.LinuxContainerSecurityContext{
				RunAsUser:        &runtime.Int64Value{Value: 0},
				RunAsGroup:       &runtime.Int64Value{Value: 0},
				Capabilities:     &runtime.Capability{AddCapabilities: []string{"SYS_ADMIN"}, DropCapabilities: []string{"NET_RAW"}},
				NamespaceOptions: &runtime.NamespaceOption{Network: runtime.NamespaceMode_NODE, Ipc: runtime.NamespaceMode_NODE, Pid: runtime.NamespaceMode_CONTAINER},
			},
			wantID:    "uid=0(root) gid=0(root) groups=0(root)",
			effective: true,
		},
		{
			name: "privileged with read-only bind mount and device",
			security: &runtime.LinuxContainerSecurityContext{
				Privileged:       true,
				NamespaceOptions: &runtime.NamespaceOption{Network: runtime.NamespaceMode_NODE, Ipc: runtime.NamespaceMode_NODE, Pid: runtime.NamespaceMode_CONTAINER},
			},
			mounts: func(dir string) []*runtime.Mount {
				return []*runtime.Mount{{ContainerPath: "/data", HostPath: filepath.Join(dir, "vol"), Readonly: true}}
			},
			devices:    []*runtime.Device{{HostPath: "/dev/null", ContainerPath: "/dev/mynull", Permissions: "rw"}},
			privileged: true,
			extra:      `test -c /dev/mynull && echo DEV-OK; test -d /data && (touch /data/f 2>/dev/null || echo RO-OK)`,
			wantID:     "uid=0(root) gid=0(root) groups=0(root)",
			effective:  true,
			wantLines:  []string{"DEV-OK", "RO-OK"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tmp := t.TempDir()
			rootfs := filepath.Join(tmp, "bundle", "rootfs")
			if err := os.MkdirAll(rootfs, 0o755); err != nil {
				t.Fatal(err)
			}
			writeBaseRootfs(t, rootfs)

			suffix := make([]byte, 6)
			_, _ = rand.Read(suffix)
			id := "specgen-" + hex.EncodeToString(suffix)
			parent := "/berth-specgen-test-" + hex.EncodeToString(suffix)
			t.Cleanup(func() { removeCgroup(parent) })

			in := Input{
				ContainerID: id,
				Config: &runtime.ContainerConfig{
					Metadata: &runtime.ContainerMetadata{Name: "runc"},
					Command:  []string{"/bin/sh", "-c", "id; cat /proc/self/status; " + tc.extra},
					Linux:    &runtime.LinuxContainerConfig{SecurityContext: tc.security},
					Devices:  tc.devices,
				},
				SandboxConfig: &runtime.PodSandboxConfig{
					Metadata: &runtime.PodSandboxMetadata{Name: "pod"},
					Linux: &runtime.LinuxPodSandboxConfig{SecurityContext: &runtime.LinuxSandboxSecurityContext{
						Privileged:       tc.privileged,
						NamespaceOptions: &runtime.NamespaceOption{Network: runtime.NamespaceMode_NODE, Ipc: runtime.NamespaceMode_NODE},
					}},
				},
				Image:            &ocispecv1.Image{Config: ocispecv1.ImageConfig{Env: []string{"PATH=/bin"}}},
				RootfsPath:       rootfs,
				Pod:              Pod{ID: "pod", CgroupParent: parent},
				CgroupDriver:     "cgroupfs",
				OOMScoreAdjFloor: floor,
				Rlimits:          []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Soft: 1 << 40, Hard: 1 << 40}},
				Host:             host,
			}
			if tc.mounts != nil {
				in.Config.Mounts = tc.mounts(tmp)
			}
			s, err := Build(in)
			if err != nil {
				t.Fatal(err)
			}
			s.Root.Path = "rootfs"
			b, err := json.Marshal(s)
			if err != nil {
				t.Fatal(err)
			}
			bundle := filepath.Dir(rootfs)
			if err := os.WriteFile(filepath.Join(bundle, "config.json"), b, 0o644); err != nil {
				t.Fatal(err)
			}
			state := filepath.Join(tmp, "runc-root")
			t.Cleanup(func() {
				_ = oci.New(runc, state, nil).Delete(context.Background(), id, true)
			})

			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			var stdout, stderr bytes.Buffer
			cmd := exec.CommandContext(ctx, runc, "--root", state, "run", "--bundle", bundle, id)
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Run(); err != nil {
				t.Fatalf("runc run: %v\nstdout: %s\nstderr: %s", err, stdout.String(), stderr.String())
			}
			out := stdout.String()

			if first, _, _ := strings.Cut(out, "\n"); first != tc.wantID {
				t.Errorf("id = %q, want %q", first, tc.wantID)
			}
			field := func(name string) string {
				m := regexp.MustCompile(`(?m)^` + name + `:\s+(.*)$`).FindStringSubmatch(out)
				if m == nil {
					t.Fatalf("no %s in status:\n%s", name, out)
				}
				return m[1]
			}
			if got, want := field("CapBnd"), capMask(s.Process.Capabilities.Bounding); got != want {
				t.Errorf("CapBnd = %s, want %s (%q)", got, want, s.Process.Capabilities.Bounding)
			}
			wantEff := capMask(nil)
			if tc.effective {
				wantEff = capMask(s.Process.Capabilities.Effective)
			}
			if got := field("CapEff"); got != wantEff {
				t.Errorf("CapEff = %s, want %s", got, wantEff)
			}
			u := s.Process.User
			if got, want := field("Uid"), fmt.Sprintf("%d\t%d\t%d\t%d", u.UID, u.UID, u.UID, u.UID); got != want {
				t.Errorf("Uid = %q, want %q", got, want)
			}
			if got, want := field("Gid"), fmt.Sprintf("%d\t%d\t%d\t%d", u.GID, u.GID, u.GID, u.GID); got != want {
				t.Errorf("Gid = %q, want %q", got, want)
			}
			wantSeccomp, wantNNP := "0", "0"
			if s.Linux.Seccomp != nil {
				wantSeccomp = "2"
			}
			if s.Process.NoNewPrivileges {
				wantNNP = "1"
			}
			if got := field("Seccomp"); got != wantSeccomp {
				t.Errorf("Seccomp = %s, want %s", got, wantSeccomp)
			}
			if got := field("NoNewPrivs"); got != wantNNP {
				t.Errorf("NoNewPrivs = %s, want %s", got, wantNNP)
			}
			for _, l := range tc.wantLines {
				if !strings.Contains(out, "\n"+l+"\n") {
					t.Errorf("no line %q in output:\n%s", l, out)
				}
			}
		})
	}
}

// removeCgroup removes the test's cgroup parent from every v1 hierarchy
// (and the unified one); runc removed the container's own cgroup.
func removeCgroup(parent string) {
	dirs, _ := filepath.Glob("/sys/fs/cgroup/*" + parent)
	dirs = append(dirs, "/sys/fs/cgroup"+parent)
	for _, d := range dirs {
		_ = os.Remove(d)
	}
}
