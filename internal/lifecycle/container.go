package lifecycle

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/container"
	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/specgen"
)

// CreateRequest is a container to create in a ready pod.
type CreateRequest struct {
	PodID  string
	Config *runtime.ContainerConfig
	// SandboxConfig is the pod's config as the caller sent it; nil: the
	// one the pod was run with.
	SandboxConfig *runtime.PodSandboxConfig
	// StopSignal is the record's stop signal name ("" for the image's).
	StopSignal string
}

// CreateContainer creates a container in a ready pod: the container store
// prepares it (name, the pod's place on the node's monitor, image lease,
// mounts), specgen builds its spec, the hooks adjust it, and the store
// commits it (bundle, runtime create, record).
func (s *Service) CreateContainer(ctx context.Context, req CreateRequest) (*container.Container, error) {
	return s.create(ctx, req, nil)
}

// checkCreate refuses a request that lacks what every create needs.
func checkCreate(req CreateRequest) error {
	cfg := req.Config
	ns := cfg.GetLinux().GetSecurityContext().GetNamespaceOptions()
	switch {
	case req.PodID == "":
		return invalid("CreateContainer: pod_sandbox_id is required")
	case cfg == nil || cfg.GetMetadata() == nil || cfg.GetMetadata().GetName() == "":
		return invalid("CreateContainer: config with metadata.name is required")
	case cfg.GetImage().GetImage() == "":
		return invalid("CreateContainer: config.image is required")
	case ns.GetPid() == runtime.NamespaceMode_TARGET && ns.GetTargetId() == "":
		return invalid("CreateContainer: pid namespace mode TARGET needs target_id")
	}
	return nil
}

// create is CreateContainer, also for restores: with restore set, the
// container is restored from a checkpoint at its start and its spec is
// checked against the checkpoint's before anything runs.
func (s *Service) create(ctx context.Context, req CreateRequest, restore *restoreInput) (*container.Container, error) {
	if err := checkCreate(req); err != nil {
		return nil, err
	}
	cfg := req.Config
	sb, err := s.sandboxes.Get(req.PodID)
	if err != nil {
		return nil, err
	}
	if sb.State != runtime.PodSandboxState_SANDBOX_READY {
		return nil, fmt.Errorf("pod sandbox %s is not ready: %w", sb.ID, errdefs.ErrFailedPrecondition)
	}
	sbCfg := req.SandboxConfig
	if sbCfg == nil {
		sbCfg = sb.Config
	}
	logPath, err := containerLogPath(sb.Config.GetLogDirectory(), cfg.GetLogPath())
	if err != nil {
		return nil, err
	}
	// One snapshot of the live configuration for the whole create.
	live := s.opts.Live.Load()
	// The pod's handler is in effect: a reload keeps a handler that a pod uses.
	handler, rh, ok := live.ResolveHandler(sb.RuntimeHandler)
	if !ok {
		return nil, fmt.Errorf("runtime handler %q of pod %s is not configured: %w", handler, sb.ID, errdefs.ErrFailedPrecondition)
	}
	var podUserNS *container.UserNS
	if sb.UserNS != nil {
		podUserNS = &container.UserNS{Path: sb.UserNSPath, Mapping: *sb.UserNS}
	}
	// Name, shim, image and mounts; undone on any failure below.
	creq := container.CreateRequest{
		PodID: sb.ID, Runtime: handler, Config: cfg, LogPath: logPath, UserNS: podUserNS,
		StopSignal: req.StopSignal,
	}
	if logPath != "" {
		creq.LogDir = sb.Config.GetLogDirectory()
	}
	if restore != nil {
		creq.Restore = &restore.Restore
	}
	draft, err := s.containers.Prepare(ctx, creq)
	if err != nil {
		return nil, err
	}
	defer draft.Discard(ctx)
	spec, err := s.containerSpec(sb, sbCfg, rh, cfg, draft)
	if err != nil {
		return nil, err
	}
	if restore != nil {
		if err := restore.check(draft, spec); err != nil {
			return nil, err
		}
	}
	// The hooks see (and may adjust) the finished spec before the runtime
	// creates the container and before it is visible.
	pending := draft.Record(spec)
	unblock, err := s.hooks.CreateContainer(ctx, sb, pending, spec)
	if err != nil {
		return nil, err
	}
	c, err := draft.Commit(ctx, spec, pending.Resources)
	if unblock != nil {
		unblock()
	}
	if err != nil {
		s.hooks.UndoCreateContainer(context.WithoutCancel(ctx), sb, pending, spec)
		return nil, err
	}
	s.hooks.PostCreateContainer(ctx, c)
	return c, nil
}

// containerLogPath joins the pod's log directory and the container's
// relative log path; a path that leaves the directory is InvalidArgument.
// Either one empty means no log, as in containerd.
func containerLogPath(dir, rel string) (string, error) {
	if dir == "" || rel == "" {
		return "", nil
	}
	if !filepath.IsAbs(dir) || filepath.Clean(dir) != dir {
		return "", fmt.Errorf("log_directory %q is not an absolute clean path: %w", dir, errdefs.ErrInvalidArgument)
	}
	if filepath.IsAbs(rel) {
		return "", fmt.Errorf("log_path %q must be relative to the pod's log directory: %w", rel, errdefs.ErrInvalidArgument)
	}
	p := filepath.Join(dir, rel)
	r, err := filepath.Rel(dir, p)
	if err != nil || r == ".." || strings.HasPrefix(r, "../") || r == "." {
		return "", fmt.Errorf("log_path %q escapes the pod's log directory: %w", rel, errdefs.ErrInvalidArgument)
	}
	return p, nil
}

// StartContainer starts a created container; any other state is
// FailedPrecondition. The hooks hear of it just before the process starts
// (a hook's error fails the start) and again once it runs.
func (s *Service) StartContainer(ctx context.Context, id string) error {
	c, err := s.containers.Get(id)
	if err != nil {
		return err
	}
	if c.State != container.StateCreated {
		return fmt.Errorf("container %s is %s, not created: %w", c.ID, c.State, errdefs.ErrFailedPrecondition)
	}
	if err := s.hooks.StartContainer(ctx, c); err != nil {
		s.logHook(s.hooks.StopContainer(context.WithoutCancel(ctx), c), c.PodID, c.ID)
		return err
	}
	started, err := s.containers.Start(ctx, c.ID)
	if err != nil {
		if cur, gerr := s.containers.Get(c.ID); gerr == nil {
			c = cur
		}
		s.logHook(s.hooks.StopContainer(context.WithoutCancel(ctx), c), c.PodID, c.ID)
		return err
	}
	s.hooks.PostStartContainer(ctx, started)
	return nil
}

// StopContainer sends the stop signal, waits timeout, then SIGKILLs.
// Stopping an exited or unknown container succeeds.
func (s *Service) StopContainer(ctx context.Context, id string, timeout time.Duration) error {
	if err := s.containers.Stop(ctx, id, timeout); err != nil {
		return err
	}
	// Hooks: told once, whether here or when the exit was seen.
	if c, err := s.containers.Get(id); err == nil {
		s.logHook(s.hooks.StopContainer(ctx, c), c.PodID, c.ID)
	}
	return nil
}

// RemoveContainer removes a container, forcing it down if it runs.
// Removing an unknown container succeeds.
func (s *Service) RemoveContainer(ctx context.Context, id string) error {
	c, err := s.containers.Remove(ctx, id)
	if err != nil {
		return err
	}
	if c != nil {
		s.containerRemoved(ctx, c)
	}
	return nil
}

// containerRemoved tells those who keep something per container that it
// is gone: Forget (the stats sampler), and the hooks (stop, if not told
// yet, then remove). The container store's removals say exactly which
// containers went, so each is told once.
func (s *Service) containerRemoved(ctx context.Context, c *container.Container) {
	s.opts.Forget(c.ID)
	s.logHook(s.hooks.RemoveContainer(ctx, c), c.PodID, c.ID)
}

// UpdateContainerResources changes a live container's cgroup limits
// through the runtime's update; the values are checked and converted as
// at create (specgen), the hooks may change the update, and status then
// shows what was applied.
func (s *Service) UpdateContainerResources(ctx context.Context, id string, linux *runtime.LinuxContainerResources) error {
	host := s.opts.Host.Spec
	if err := specgen.CheckResources(linux, host); err != nil {
		return err
	}
	c, err := s.containers.Get(id)
	if err != nil {
		return err
	}
	res, err := s.hooks.UpdateContainer(ctx, c, specgen.Resources(linux, host))
	if err != nil {
		return err
	}
	if err := s.containers.UpdateResources(ctx, c.ID, res, linux); err != nil {
		return err
	}
	if cur, err := s.containers.Get(c.ID); err == nil {
		s.hooks.PostUpdateContainer(ctx, cur)
	}
	return nil
}

// invalid is an InvalidArgument error with a formatted message.
func invalid(format string, args ...any) error {
	return fmt.Errorf(format+": %w", append(args, errdefs.ErrInvalidArgument)...)
}
