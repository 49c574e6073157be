package specgen

import (
	"errors"
	"path"
	"path/filepath"
	"testing"

	ocispecv1 "github.com/opencontainers/image-spec/specs-go/v1"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/proto"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/errdefs"
)

// FuzzBuild feeds Build random ContainerConfigs and PodSandboxConfigs
// (protobuf wire bytes, so every field is reachable) and a random image
// USER: Build must never panic and must return either a valid spec or an
// error of a known kind. Seeds: testdata/fuzz/FuzzBuild.
func FuzzBuild(f *testing.F) {
	seed := func(c *runtime.ContainerConfig, p *runtime.PodSandboxConfig, user string) {
		cb, _ := proto.Marshal(c)
		pb, _ := proto.Marshal(p)
		f.Add(cb, pb, user)
	}
	seed(&runtime.ContainerConfig{Command: []string{"sh"}}, &runtime.PodSandboxConfig{}, "")
	seed(&runtime.ContainerConfig{
		Args:   []string{"id"},
		Mounts: []*runtime.Mount{{ContainerPath: "/data", HostPath: "/vol", Readonly: true}},
		Linux: &runtime.LinuxContainerConfig{SecurityContext: &runtime.LinuxContainerSecurityContext{
			RunAsUser:    &runtime.Int64Value{Value: 1000},
			Capabilities: &runtime.Capability{AddCapabilities: []string{"ALL"}, DropCapabilities: []string{"CHOWN"}},
			Seccomp:      &runtime.SecurityProfile{ProfileType: runtime.SecurityProfile_RuntimeDefault},
		}},
	}, &runtime.PodSandboxConfig{Hostname: "h"}, "berthuser:berthextra")

	hostDir := f.TempDir()
	rootfs := testRootfsAt(f, f.TempDir())
	f.Fuzz(func(t *testing.T, cfgBytes, podBytes []byte, imageUser string) {
		cfg := &runtime.ContainerConfig{}
		pod := &runtime.PodSandboxConfig{}
		if proto.Unmarshal(cfgBytes, cfg) != nil || proto.Unmarshal(podBytes, pod) != nil {
			t.Skip("not a config")
		}
		// Bind-mount sources are created when missing: keep them in a
		// temp dir, never on the real host paths the fuzzer invents.
		for _, m := range cfg.GetMounts() {
			if path.IsAbs(m.HostPath) {
				m.HostPath = filepath.Join(hostDir, m.HostPath)
			}
		}
		h := testHost()
		h.DevPath = hostDir // privileged: no walk of the real /dev
		in := Input{
			ContainerID:   "fuzz",
			Config:        cfg,
			SandboxConfig: pod,
			Image:         &ocispecv1.Image{Config: ocispecv1.ImageConfig{User: imageUser, Cmd: []string{"sh"}}},
			RootfsPath:    rootfs,
			Pod:           Pod{ID: "p", NetNSPath: "/n", IPCNSPath: "/i", UTSNSPath: "/u", PIDNSPath: "/p"},
			CgroupDriver:  "cgroupfs",
			Host:          h,
		}
		s, err := Build(in)
		if err != nil {
			if s != nil {
				t.Fatal("spec returned with an error")
			}
			if !errors.Is(err, errdefs.ErrInvalidArgument) && !errors.Is(err, errdefs.ErrFailedPrecondition) {
				t.Fatalf("error of no known kind: %v", err)
			}
			return
		}
		if err := validSpec(s); err != nil {
			t.Fatalf("invalid spec: %v", err)
		}
	})
}

// validSpec checks what runc would reject outright.
func validSpec(s *specs.Spec) error {
	switch {
	case s.Process == nil || len(s.Process.Args) == 0 || s.Process.Args[0] == "":
		return errors.New("no process args")
	case !path.IsAbs(s.Process.Cwd):
		return errors.New("cwd not absolute")
	case s.Linux == nil || s.Linux.Resources == nil:
		return errors.New("no linux section")
	case s.Process.Capabilities == nil:
		return errors.New("no capabilities")
	case s.Process.User.UID > maxID || s.Process.User.GID > maxID:
		return errors.New("id out of runc's range")
	}
	for _, m := range s.Mounts {
		if !path.IsAbs(m.Destination) {
			return errors.New("mount destination not absolute: " + m.Destination)
		}
		if m.Type == "bind" && !path.IsAbs(m.Source) {
			return errors.New("bind source not absolute: " + m.Source)
		}
	}
	seen := map[specs.LinuxNamespaceType]bool{}
	for _, n := range s.Linux.Namespaces {
		if seen[n.Type] {
			return errors.New("namespace twice: " + string(n.Type))
		}
		seen[n.Type] = true
	}
	if !seen[specs.MountNamespace] {
		return errors.New("no mount namespace")
	}
	if s.Process.OOMScoreAdj == nil || *s.Process.OOMScoreAdj < -1000 || *s.Process.OOMScoreAdj > 1000 {
		return errors.New("oom_score_adj out of range")
	}
	return nil
}
