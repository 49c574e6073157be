package nri

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	api "github.com/containerd/nri/pkg/api"
	nrigen "github.com/containerd/nri/pkg/runtime-tools/generate"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/cdi"
	"github.com/berthcri/berth/internal/container"
	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/sandbox"
	"github.com/berthcri/berth/internal/specgen"
	"github.com/berthcri/berth/internal/testutil/cditest"
)

func baseSpec() *specs.Spec {
	return &specs.Spec{
		Process: &specs.Process{Args: []string{"sleep", "1"}, Env: []string{"PATH=/bin", "KEEP=1"}},
		Mounts:  []specs.Mount{{Destination: "/proc", Type: "proc", Source: "proc"}},
		Linux:   &specs.Linux{CgroupsPath: "/pod/ctr"},
	}
}

// TestAdjustEditsSpec drives the NRI library's generator over specEdit, as
// CreateContainer does, with a plugin's typical adjustment.
func TestAdjustEditsSpec(t *testing.T) {
	spec := baseSpec()
	adj := &api.ContainerAdjustment{}
	adj.AddEnv("KEEP", "2")
	adj.AddEnv("NEW", "x")
	adj.AddAnnotation("a.example/b", "c")
	adj.AddMount(&api.Mount{Destination: "/data", Source: "/srv", Type: "bind", Options: []string{"rbind", "ro"}})
	adj.AddHooks(&api.Hooks{Poststop: []*api.Hook{{Path: "/bin/true"}}})
	adj.SetLinuxMemoryLimit(1 << 30)
	adj.SetLinuxCPUShares(512)
	adj.SetLinuxCgroupsPath("/elsewhere")
	adj.AddRlimit("RLIMIT_NOFILE", 100, 50)
	adj.AddDevice(&api.LinuxDevice{Path: "/dev/fuse", Type: "c", Major: 10, Minor: 229})
	if err := nrigen.SpecGenerator(&specEdit{spec: spec}, generatorOptions(nil)...).Adjust(adj); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(spec.Process.Env, "KEEP=2") || !slices.Contains(spec.Process.Env, "NEW=x") || slices.Contains(spec.Process.Env, "KEEP=1") {
		t.Errorf("env %v", spec.Process.Env)
	}
	if spec.Annotations["a.example/b"] != "c" {
		t.Errorf("annotations %v", spec.Annotations)
	}
	if i := slices.IndexFunc(spec.Mounts, func(m specs.Mount) bool { return m.Destination == "/data" }); i < 0 || spec.Mounts[i].Source != "/srv" {
		t.Errorf("mounts %v", spec.Mounts)
	}
	if len(spec.Hooks.Poststop) != 1 || spec.Hooks.Poststop[0].Path != "/bin/true" {
		t.Errorf("hooks %+v", spec.Hooks)
	}
	r := spec.Linux.Resources
	if r == nil || *r.Memory.Limit != 1<<30 || *r.CPU.Shares != 512 {
		t.Errorf("resources %+v", r)
	}
	if spec.Linux.CgroupsPath != "/elsewhere" {
		t.Errorf("cgroups path %q", spec.Linux.CgroupsPath)
	}
	if len(spec.Process.Rlimits) != 1 || spec.Process.Rlimits[0].Hard != 100 {
		t.Errorf("rlimits %v", spec.Process.Rlimits)
	}
	if len(spec.Linux.Devices) != 1 || spec.Linux.Devices[0].Path != "/dev/fuse" {
		t.Errorf("devices %v", spec.Linux.Devices)
	}
}

// TestAdjustRefusesWhatBerthCannotDo: CDI devices without a registry
// fail instead of being dropped.
func TestAdjustRefusesWhatBerthCannotDo(t *testing.T) {
	adj := &api.ContainerAdjustment{}
	adj.AddCDIDevice(&api.CDIDevice{Name: "vendor.com/gpu=0"})
	err := nrigen.SpecGenerator(&specEdit{spec: baseSpec()}, generatorOptions(nil)...).Adjust(adj)
	if !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("CDI adjustment: %v", err)
	}
}

func TestRemoveMountAndEnv(t *testing.T) {
	spec := baseSpec()
	adj := &api.ContainerAdjustment{}
	adj.RemoveMount("/proc")
	adj.RemoveEnv("KEEP")
	if err := nrigen.SpecGenerator(&specEdit{spec: spec}).Adjust(adj); err != nil {
		t.Fatal(err)
	}
	if len(spec.Mounts) != 0 || slices.Contains(spec.Process.Env, "KEEP=1") {
		t.Fatalf("mounts %v env %v", spec.Mounts, spec.Process.Env)
	}
}

func TestPodToNRI(t *testing.T) {
	sb := &sandbox.Sandbox{
		ID: "p1", RuntimeHandler: "runc", CgroupParent: "/berth/pod-p1",
		NetNSPath: "/run/netns/p1-net", IPCNSPath: "/run/netns/p1-ipc", UTSNSPath: "/run/netns/p1-uts",
		IP: "10.0.0.2", AdditionalIPs: []string{"fd00::2"},
		Config: &runtime.PodSandboxConfig{
			Metadata:    &runtime.PodSandboxMetadata{Name: "web", Namespace: "ns", Uid: "u1"},
			Labels:      map[string]string{"app": "web"},
			Annotations: map[string]string{"k": "v"},
			Linux:       &runtime.LinuxPodSandboxConfig{CgroupParent: "/kubepods/pod-u1"},
		},
		Resources: &runtime.LinuxContainerResources{MemoryLimitInBytes: 1 << 20},
	}
	p := podToNRI(sb, &specgen.Host{SwapAccounting: true})
	if p.Id != "p1" || p.Name != "web" || p.Namespace != "ns" || p.Uid != "u1" || p.RuntimeHandler != "runc" {
		t.Fatalf("pod %+v", p)
	}
	if p.Labels["app"] != "web" || p.Annotations["k"] != "v" || !slices.Equal(p.Ips, []string{"10.0.0.2", "fd00::2"}) {
		t.Fatalf("labels %v annotations %v ips %v", p.Labels, p.Annotations, p.Ips)
	}
	if p.Linux.CgroupParent != "/kubepods/pod-u1" || p.Linux.CgroupsPath != "/berth/pod-p1" || len(p.Linux.Namespaces) != 3 {
		t.Fatalf("linux %+v", p.Linux)
	}
	if p.Linux.PodResources.GetMemory().GetLimit().GetValue() != 1<<20 {
		t.Fatalf("pod resources %v", p.Linux.PodResources)
	}
	if p.Pid != 0 {
		t.Fatalf("pid %d without a pause process", p.Pid)
	}
	sb.PIDNSPath = "/proc/4242/ns/pid"
	if p := podToNRI(sb, &specgen.Host{SwapAccounting: true}); p.Pid != 4242 || len(p.Linux.Namespaces) != 4 {
		t.Fatalf("shared PID namespace pod: pid %d namespaces %v", p.Pid, p.Linux.Namespaces)
	}
}

func TestContainerToNRI(t *testing.T) {
	now := time.Now()
	c := &container.Container{
		ID: "c1", PodID: "p1", Name: "app", Labels: map[string]string{"l": "1"},
		ImageName: "busybox:latest", ImageRef: "busybox@sha256:abc",
		State: container.StateExited, Pid: 42, CreatedAt: now, StartedAt: now, FinishedAt: now,
		ExitCode: 3, Reason: container.ReasonError,
	}
	spec := baseSpec()
	spec.Annotations = map[string]string{"x": "y"}
	spec.Process.User = specs.User{UID: 1000, GID: 1000}
	ctr := containerToNRI(c, spec)
	if ctr.Id != "c1" || ctr.PodSandboxId != "p1" || ctr.Name != "app" || ctr.State != api.ContainerState_CONTAINER_STOPPED {
		t.Fatalf("container %+v", ctr)
	}
	if ctr.Pid != 42 || ctr.ExitCode != 3 || ctr.StatusReason != container.ReasonError || ctr.FinishedAt != now.UnixNano() {
		t.Fatalf("status pid %d exit %d reason %q", ctr.Pid, ctr.ExitCode, ctr.StatusReason)
	}
	if !slices.Equal(ctr.Args, []string{"sleep", "1"}) || len(ctr.Mounts) != 1 || ctr.Annotations["x"] != "y" || ctr.User.Uid != 1000 {
		t.Fatalf("spec part: args %v mounts %v annotations %v user %v", ctr.Args, ctr.Mounts, ctr.Annotations, ctr.User)
	}
	if ctr.Linux.CgroupsPath != "/pod/ctr" || ctr.Image.Digest != "sha256:abc" {
		t.Fatalf("linux %v image %v", ctr.Linux, ctr.Image)
	}
	// No spec (unreadable): the record still describes it.
	if bare := containerToNRI(c, nil); bare.Name != "app" || bare.Labels["l"] != "1" {
		t.Fatalf("bare container %+v", bare)
	}
}

func TestOCIToCRI(t *testing.T) {
	limit, shares, quota, period := int64(1<<30), uint64(512), int64(50000), uint64(100000)
	got := ociToCRI(&specs.LinuxResources{
		Memory: &specs.LinuxMemory{Limit: &limit},
		CPU:    &specs.LinuxCPU{Shares: &shares, Quota: &quota, Period: &period, Cpus: "0-1"},
	})
	if got.MemoryLimitInBytes != limit || got.CpuShares != 512 || got.CpuQuota != quota || got.CpuPeriod != 100000 || got.CpusetCpus != "0-1" {
		t.Fatalf("%+v", got)
	}
}

// TestDisabledIsNoop: with NRI off every call succeeds and does nothing,
// also on a nil *NRI.
func TestDisabledIsNoop(t *testing.T) {
	n, err := New(Options{Host: &specgen.Host{}})
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range []*NRI{n, nil} {
		if x.Enabled() {
			t.Fatal("enabled")
		}
		if err := x.Start(); err != nil {
			t.Fatal(err)
		}
		b, err := x.RunPodSandbox(t.Context(), &sandbox.Sandbox{ID: "p"})
		if err != nil || b != nil {
			t.Fatal(b, err)
		}
		b.Unblock()
		spec := baseSpec()
		if _, err := x.CreateContainer(t.Context(), &sandbox.Sandbox{ID: "p"}, &container.Container{ID: "c"}, spec); err != nil {
			t.Fatal(err)
		}
		if res, err := x.UpdateContainer(t.Context(), &container.Container{ID: "c"}, &specs.LinuxResources{}); err != nil || res == nil {
			t.Fatal(res, err)
		}
		x.ContainerEvent(container.Event{Kind: container.EventStopped, Container: &container.Container{ID: "c"}})
		x.Stop()
	}
}

// An adjustment adding a CDI device gets it from berth's CDI registry.
func TestAdjustInjectsCDIDevices(t *testing.T) {
	dir := t.TempDir()
	info := filepath.Join(dir, "info")
	if err := os.WriteFile(info, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "fake.json"), []byte(cditest.FakeSpec(info, filepath.Join(dir, "hook.log"))), 0o644); err != nil {
		t.Fatal(err)
	}
	spec := baseSpec()
	adj := &api.ContainerAdjustment{}
	adj.AddCDIDevice(&api.CDIDevice{Name: "berth.test/fake=dev1"})
	if err := nrigen.SpecGenerator(&specEdit{spec: spec}, generatorOptions(cdi.New([]string{dir}, nil))...).Adjust(adj); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(spec.Process.Env, "FAKE_DEVICE1=yes") || !slices.ContainsFunc(spec.Linux.Devices, func(d specs.LinuxDevice) bool { return d.Path == "/dev/berth-fake1" }) {
		t.Fatalf("env %v devices %v", spec.Process.Env, spec.Linux.Devices)
	}
	adj = &api.ContainerAdjustment{}
	adj.AddCDIDevice(&api.CDIDevice{Name: "berth.test/fake=absent"})
	err := nrigen.SpecGenerator(&specEdit{spec: baseSpec()}, generatorOptions(cdi.New([]string{dir}, nil))...).Adjust(adj)
	if !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("unknown CDI device: %v, want NotFound", err)
	}
}
