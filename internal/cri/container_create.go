package cri

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/container"
	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/liveconfig"
	"github.com/berthcri/berth/internal/sandbox"
	"github.com/berthcri/berth/internal/specgen"
)

// CreateContainer creates a container in a ready pod: the container store
// prepares it (name, the pod's shim, image lease, mounts), specgen builds
// its spec, NRI plugins adjust it, and the store commits it (bundle,
// runtime create, record).
func (s *Service) CreateContainer(ctx context.Context, req *runtime.CreateContainerRequest) (*runtime.CreateContainerResponse, error) {
	create := func() (*container.Container, error) { return s.createContainer(ctx, req, nil) }
	if archive := checkpointArchivePath(req.GetConfig()); archive != "" {
		create = func() (*container.Container, error) { return s.createFromCheckpoint(ctx, req, archive) }
	}
	c, err := create()
	if err != nil {
		return nil, err
	}
	return &runtime.CreateContainerResponse{ContainerId: c.ID}, nil
}

// createContainer is CreateContainer, also for RestorePod: with restore
// set, the container is restored from a checkpoint at its start and its
// spec is checked against the checkpoint's before anything runs.
func (s *Service) createContainer(ctx context.Context, req *runtime.CreateContainerRequest, restore *restoreInput) (*container.Container, error) {
	cfg := req.GetConfig()
	switch {
	case req.GetPodSandboxId() == "":
		return nil, invalidArgument("CreateContainer: pod_sandbox_id is required")
	case cfg == nil || cfg.GetMetadata() == nil || cfg.GetMetadata().GetName() == "":
		return nil, invalidArgument("CreateContainer: config with metadata.name is required")
	case cfg.GetImage().GetImage() == "":
		return nil, invalidArgument("CreateContainer: config.image is required")
	case cfg.GetLinux().GetSecurityContext().GetNamespaceOptions().GetPid() == runtime.NamespaceMode_TARGET &&
		cfg.GetLinux().GetSecurityContext().GetNamespaceOptions().GetTargetId() == "":
		return nil, invalidArgument("CreateContainer: pid namespace mode TARGET needs target_id")
	}
	stopSignal, ok := stopSignalName(cfg.GetStopSignal())
	if !ok {
		return nil, invalidArgument("CreateContainer: unknown stop_signal %d", cfg.GetStopSignal())
	}
	sb, err := s.sandboxes.Get(req.GetPodSandboxId())
	if err != nil {
		return nil, toStatus(err)
	}
	if sb.State != runtime.PodSandboxState_SANDBOX_READY {
		return nil, toStatus(fmt.Errorf("pod sandbox %s is not ready: %w", sb.ID, errdefs.ErrFailedPrecondition))
	}
	sbCfg := req.GetSandboxConfig()
	if sbCfg == nil {
		sbCfg = sb.Config
	}
	logPath, err := containerLogPath(sb.Config.GetLogDirectory(), cfg.GetLogPath())
	if err != nil {
		return nil, toStatus(err)
	}
	// One snapshot of the live configuration for the whole create.
	live := s.live.Load()
	handler := sb.RuntimeHandler
	if handler == "" {
		handler = live.Config.DefaultRuntimeHandler
	}
	// The pod's handler is in effect: a reload keeps a handler that a pod uses.
	rh, ok := live.Handler(handler)
	if !ok {
		return nil, toStatus(fmt.Errorf("runtime handler %q of pod %s is not configured: %w", handler, sb.ID, errdefs.ErrFailedPrecondition))
	}

	var podUserNS *container.UserNS
	if sb.UserNS != nil {
		podUserNS = &container.UserNS{Path: sb.UserNSPath, Mapping: *sb.UserNS}
	}
	// Name, shim, image and mounts; undone on any failure below.
	creq := container.CreateRequest{
		PodID: sb.ID, Runtime: handler, Config: cfg, LogPath: logPath, UserNS: podUserNS,
		StopSignal: stopSignal,
	}
	if restore != nil {
		creq.Restore = &restore.Restore
	}
	draft, err := s.containers.Prepare(ctx, creq)
	if err != nil {
		return nil, toStatus(err)
	}
	defer draft.Discard(ctx)
	spec, err := s.containerSpec(sb, sbCfg, rh, cfg, draft)
	if err != nil {
		return nil, toStatus(err)
	}
	if restore != nil {
		if err := restore.check(draft, spec); err != nil {
			return nil, toStatus(err)
		}
	}
	// NRI plugins see (and may adjust) the finished spec before the
	// runtime creates the container and before it is visible.
	pending := draft.Record(spec)
	block, err := s.nri.CreateContainer(ctx, sb, pending, spec)
	if err != nil {
		return nil, toStatus(err)
	}
	c, err := draft.Commit(ctx, spec, pending.Resources)
	block.Unblock()
	if err != nil {
		s.nri.UndoCreateContainer(context.WithoutCancel(ctx), sb, pending, spec)
		return nil, toStatus(err)
	}
	s.nri.PostCreateContainer(ctx, c)
	return c, nil
}

// containerSpec builds the OCI spec of a prepared container.
func (s *Service) containerSpec(sb *sandbox.Sandbox, sbCfg *runtime.PodSandboxConfig, handler *liveconfig.Handler, cfg *runtime.ContainerConfig, draft *container.Draft) (*specs.Spec, error) {
	in := specgen.Input{
		ContainerID:    draft.ID,
		Config:         cfg,
		SandboxConfig:  sbCfg,
		Image:          draft.Image.Config,
		RootfsPath:     draft.Rootfs.Path,
		ImageVolumes:   draft.Rootfs.Volumes,
		IDMappedMounts: draft.Rootfs.IDMapped,
		Pod: specgen.Pod{
			ID: sb.ID, NetNSPath: sb.NetNSPath, IPCNSPath: sb.IPCNSPath, UTSNSPath: sb.UTSNSPath,
			PIDNSPath: sb.PIDNSPath, CgroupParent: containerCgroupParent(sb),
			HostnamePath: sb.HostnamePath, HostsPath: sb.HostsPath, ResolvConfPath: sb.ResolvConfPath, ShmPath: sb.ShmPath,
			UserNSPath: sb.UserNSPath, UserNS: sb.UserNS,
		},
		CgroupDriver:     CgroupDriver(s.cfg.CgroupDriver),
		OOMScoreAdjFloor: ownOOMScoreAdj(),
		Rlimits:          s.rlimits,
		CDI:              s.cdi,
		AppArmor:         s.apparmor,
		Logger:           s.log.With("pod", sb.ID, "container", draft.ID),
	}
	if s.host != nil {
		h := *s.host
		h.RecursiveReadOnly = handler.Features.RecursiveReadOnly
		in.Host = &h
	}
	if cfg.GetLinux().GetSecurityContext().GetNamespaceOptions().GetPid() == runtime.NamespaceMode_TARGET {
		target, err := s.containers.Get(cfg.GetLinux().GetSecurityContext().GetNamespaceOptions().GetTargetId())
		if err != nil {
			return nil, fmt.Errorf("pid namespace target: %w", err)
		}
		if target.State != container.StateRunning || target.Pid == 0 {
			return nil, fmt.Errorf("pid namespace target %s is not running: %w", target.ID, errdefs.ErrFailedPrecondition)
		}
		in.TargetPIDNSPath = "/proc/" + strconv.Itoa(target.Pid) + "/ns/pid"
	}
	spec, err := specgen.Build(in)
	if err != nil {
		return nil, err
	}
	if v := handler.Config.OCIVersion; v != "" {
		spec.Version = v
	}
	return spec, nil
}

// containerLogPath joins the pod's log directory and the container's
// relative log path; a path that leaves the directory is InvalidArgument.
// Either one empty means no log, as in containerd.
func containerLogPath(dir, rel string) (string, error) {
	if dir == "" || rel == "" {
		return "", nil
	}
	if !filepath.IsAbs(dir) {
		return "", fmt.Errorf("log_directory %q is not absolute: %w", dir, errdefs.ErrInvalidArgument)
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

// ownOOMScoreAdj is the daemon's own oom_score_adj: without
// CAP_SYS_RESOURCE the kernel refuses lower values for its children.
func ownOOMScoreAdj() int {
	data, err := os.ReadFile("/proc/self/oom_score_adj")
	if err != nil {
		return 0
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		return 0
	}
	return n
}

// containerCgroupParent is what the container's cgroupsPath goes below:
// the pod slice under the systemd driver, the pod's directory otherwise.
func containerCgroupParent(sb *sandbox.Sandbox) string {
	if sb.CgroupUnit != "" {
		return sb.CgroupUnit
	}
	return sb.CgroupParent
}
