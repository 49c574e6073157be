// Package lifecycle owns berth's pod and container lifecycle flows: run,
// stop, remove and update of pods; create, start, stop, remove and update
// of containers; checkpoint and restore. Each flow drives the sandbox and
// container stores in order and tells the lifecycle hooks (NRI) at its
// fixed points, so that no caller has to remember to. The CRI layer
// (internal/cri) only translates requests into these calls and errors
// into codes; this package names no gRPC and no NRI.
package lifecycle

import (
	"context"
	"errors"
	"log/slog"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/cdi"
	"github.com/berthcri/berth/internal/checkpoint"
	"github.com/berthcri/berth/internal/container"
	"github.com/berthcri/berth/internal/hostprobe"
	"github.com/berthcri/berth/internal/liveconfig"
	"github.com/berthcri/berth/internal/sandbox"
	"github.com/berthcri/berth/internal/specgen"
)

// Hooks are told of each lifecycle step (docs/nri.md has the order);
// internal/nri implements them. Methods that return an error may refuse
// the step; the others only observe. RunPodSandbox and CreateContainer
// return an unblock function (nil when nothing was held) that the flow
// calls once the new object is visible in its store.
type Hooks interface {
	RunPodSandbox(ctx context.Context, sb *sandbox.Sandbox) (unblock func(), err error)
	StopPodSandbox(ctx context.Context, sb *sandbox.Sandbox) error
	UpdatePodSandbox(ctx context.Context, sb *sandbox.Sandbox, overhead, resources *runtime.LinuxContainerResources) error
	PostUpdatePodSandbox(ctx context.Context, sb *sandbox.Sandbox)
	RemovePodSandbox(ctx context.Context, sb *sandbox.Sandbox) error

	CreateContainer(ctx context.Context, sb *sandbox.Sandbox, c *container.Container, spec *specs.Spec) (unblock func(), err error)
	UndoCreateContainer(ctx context.Context, sb *sandbox.Sandbox, c *container.Container, spec *specs.Spec)
	PostCreateContainer(ctx context.Context, c *container.Container)
	StartContainer(ctx context.Context, c *container.Container) error
	PostStartContainer(ctx context.Context, c *container.Container)
	UpdateContainer(ctx context.Context, c *container.Container, res *specs.LinuxResources) (*specs.LinuxResources, error)
	PostUpdateContainer(ctx context.Context, c *container.Container)
	StopContainer(ctx context.Context, c *container.Container) error
	RemoveContainer(ctx context.Context, c *container.Container) error
}

// Options are what the daemon hands the lifecycle service.
type Options struct {
	Sandboxes  *sandbox.Store
	Containers *container.Store
	// Hooks hear of every step; nil: none.
	Hooks Hooks
	// Live is the configuration in effect: the default runtime handler
	// and each handler's features, loaded once per flow.
	Live *liveconfig.Holder
	// Host was probed once at start (hostprobe.Probe); required: specs
	// and every resources conversion read it, never the host again.
	Host *hostprobe.Host
	// CgroupDriver is config.Config.CgroupDriver (validated: cgroupfs or
	// systemd).
	CgroupDriver string
	// Rlimits are every container's default rlimits (default_ulimits).
	Rlimits []specs.POSIXRlimit
	// CDI resolves CDI devices; nil refuses containers that ask for any.
	CDI *cdi.Registry
	// AppArmor loads and looks up profiles; nil refuses RuntimeDefault
	// where AppArmor is on.
	AppArmor specgen.AppArmorProfiles
	// CRIU checkpoints and restores; Root holds <root>/checkpoints, where
	// checkpoints are staged.
	CRIU *checkpoint.CRIU
	Root string
	// Forget is called with the ID of each pod and container removed, for
	// those who keep something per object (the stats sampler); nil: none.
	Forget func(id string)
	Logger *slog.Logger
}

// Service runs the lifecycle flows.
type Service struct {
	opts       Options
	sandboxes  *sandbox.Store
	containers *container.Store
	hooks      Hooks
	log        *slog.Logger
}

// New builds the service. A missing Host is a programming error.
func New(opts Options) (*Service, error) {
	if opts.Host == nil || opts.Host.Spec == nil {
		return nil, errors.New("lifecycle.New: Options.Host (hostprobe.Probe) is required")
	}
	s := &Service{opts: opts, sandboxes: opts.Sandboxes, containers: opts.Containers, hooks: opts.Hooks, log: opts.Logger}
	if s.hooks == nil {
		s.hooks = NoHooks{}
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.opts.CRIU == nil {
		s.opts.CRIU = checkpoint.NewCRIU("")
	}
	if s.opts.Forget == nil {
		s.opts.Forget = func(string) {}
	}
	return s, nil
}

// logHook logs a failed hook notification that does not fail the step.
func (s *Service) logHook(err error, podID, containerID string) {
	if err != nil {
		s.log.Warn("NRI notification failed", "pod", podID, "container", containerID, "err", err)
	}
}

// NoHooks tells nobody.
type NoHooks struct{}

func (NoHooks) RunPodSandbox(context.Context, *sandbox.Sandbox) (func(), error) { return nil, nil }
func (NoHooks) StopPodSandbox(context.Context, *sandbox.Sandbox) error          { return nil }
func (NoHooks) UpdatePodSandbox(context.Context, *sandbox.Sandbox, *runtime.LinuxContainerResources, *runtime.LinuxContainerResources) error {
	return nil
}
func (NoHooks) PostUpdatePodSandbox(context.Context, *sandbox.Sandbox)      {}
func (NoHooks) RemovePodSandbox(context.Context, *sandbox.Sandbox) error    { return nil }
func (NoHooks) PostCreateContainer(context.Context, *container.Container)   {}
func (NoHooks) StartContainer(context.Context, *container.Container) error  { return nil }
func (NoHooks) PostStartContainer(context.Context, *container.Container)    {}
func (NoHooks) PostUpdateContainer(context.Context, *container.Container)   {}
func (NoHooks) StopContainer(context.Context, *container.Container) error   { return nil }
func (NoHooks) RemoveContainer(context.Context, *container.Container) error { return nil }
func (NoHooks) CreateContainer(context.Context, *sandbox.Sandbox, *container.Container, *specs.Spec) (func(), error) {
	return nil, nil
}
func (NoHooks) UndoCreateContainer(context.Context, *sandbox.Sandbox, *container.Container, *specs.Spec) {
}
func (NoHooks) UpdateContainer(_ context.Context, _ *container.Container, res *specs.LinuxResources) (*specs.LinuxResources, error) {
	return res, nil
}
