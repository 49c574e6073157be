package lifecycle

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/container"
	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/hostprobe"
	"github.com/berthcri/berth/internal/sandbox"
	"github.com/berthcri/berth/internal/specgen"
)

// recorder is Hooks that notes each call.
type recorder struct {
	NoHooks
	calls []string
}

func (r *recorder) StopPodSandbox(context.Context, *sandbox.Sandbox) error {
	r.calls = append(r.calls, "StopPodSandbox")
	return nil
}

func (r *recorder) RemovePodSandbox(context.Context, *sandbox.Sandbox) error {
	r.calls = append(r.calls, "RemovePodSandbox")
	return nil
}

func (r *recorder) StartContainer(context.Context, *container.Container) error {
	r.calls = append(r.calls, "StartContainer")
	return nil
}

func (r *recorder) StopContainer(context.Context, *container.Container) error {
	r.calls = append(r.calls, "StopContainer")
	return nil
}

func (r *recorder) RemoveContainer(context.Context, *container.Container) error {
	r.calls = append(r.calls, "RemoveContainer")
	return nil
}

func (r *recorder) UpdateContainer(_ context.Context, _ *container.Container, res *specs.LinuxResources) (*specs.LinuxResources, error) {
	r.calls = append(r.calls, "UpdateContainer")
	return res, nil
}

// Flows on objects that do not exist answer as the kubelet expects (stop
// and remove succeed, the rest is NotFound) and tell the hooks nothing:
// there is nothing they were told of.
func TestFlowsOnUnknownObjectsTellNobody(t *testing.T) {
	dir := t.TempDir()
	sandboxes, err := sandbox.New(sandbox.Options{Root: filepath.Join(dir, "root"), State: filepath.Join(dir, "state")})
	if err != nil {
		t.Fatal(err)
	}
	containers, err := container.Open(t.Context(), container.Options{Dir: filepath.Join(dir, "containers"), ShimDir: filepath.Join(dir, "shims")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(containers.Close)
	hooks := &recorder{}
	var forgot []string
	s, err := New(Options{Sandboxes: sandboxes, Containers: containers, Hooks: hooks, Host: testHost(), Root: dir, Forget: func(id string) { forgot = append(forgot, id) }})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()

	for name, err := range map[string]error{
		"StopPod":         s.StopPod(ctx, "nopod"),
		"RemovePod":       s.RemovePod(ctx, "nopod"),
		"StopContainer":   s.StopContainer(ctx, "noctr", time.Second),
		"RemoveContainer": s.RemoveContainer(ctx, "noctr"),
	} {
		if err != nil {
			t.Errorf("%s of an unknown object: %v, want success", name, err)
		}
	}
	for name, err := range map[string]error{
		"StartContainer":           s.StartContainer(ctx, "noctr"),
		"UpdateContainerResources": s.UpdateContainerResources(ctx, "noctr", &runtime.LinuxContainerResources{}),
		"UpdatePodResources":       s.UpdatePodResources(ctx, "nopod", nil, nil),
		"CheckpointContainer":      s.CheckpointContainer(ctx, "noctr", filepath.Join(dir, "c.tar")),
		"CheckpointPod":            s.CheckpointPod(ctx, "nopod", dir, []string{"noctr"}),
	} {
		if !errdefs.IsNotFound(err) {
			t.Errorf("%s of an unknown object: %v, want NotFound", name, err)
		}
	}
	if _, err := s.CreateContainer(ctx, CreateRequest{PodID: "nopod", Config: &runtime.ContainerConfig{
		Metadata: &runtime.ContainerMetadata{Name: "c"}, Image: &runtime.ImageSpec{Image: "busybox"},
	}}); !errdefs.IsNotFound(err) {
		t.Errorf("CreateContainer in an unknown pod: %v, want NotFound", err)
	}
	if len(hooks.calls) != 0 || len(forgot) != 0 {
		t.Errorf("hooks told %v, forgot %v; want nothing", hooks.calls, forgot)
	}
}

// A create without what every create needs is InvalidArgument before any
// store is asked.
func TestCreateNeedsPodNameImageAndTarget(t *testing.T) {
	ok := func() *runtime.ContainerConfig {
		return &runtime.ContainerConfig{Metadata: &runtime.ContainerMetadata{Name: "c"}, Image: &runtime.ImageSpec{Image: "busybox"}}
	}
	noName, noImage, noTarget := ok(), ok(), ok()
	noName.Metadata.Name = ""
	noImage.Image = nil
	noTarget.Linux = &runtime.LinuxContainerConfig{SecurityContext: &runtime.LinuxContainerSecurityContext{
		NamespaceOptions: &runtime.NamespaceOption{Pid: runtime.NamespaceMode_TARGET},
	}}
	for name, req := range map[string]CreateRequest{
		"no pod":    {Config: ok()},
		"no config": {PodID: "p"},
		"no name":   {PodID: "p", Config: noName},
		"no image":  {PodID: "p", Config: noImage},
		"no target": {PodID: "p", Config: noTarget},
	} {
		if err := checkCreate(req); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s: %v, want InvalidArgument", name, err)
		}
	}
	if err := checkCreate(CreateRequest{PodID: "p", Config: ok()}); err != nil {
		t.Errorf("a complete request: %v", err)
	}
}

// testHost is a cgroup v1 host with swap accounting, as the flows see it.
func testHost() *hostprobe.Host {
	return &hostprobe.Host{Spec: &specgen.Host{SwapAccounting: true}}
}
