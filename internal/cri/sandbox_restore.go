package cri

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/checkpoint"
	"github.com/berthcri/berth/internal/container"
	"github.com/berthcri/berth/internal/errdefs"
)

// RestorePod makes a new pod sandbox from the request's config and, for
// each container config, a container restored from the checkpoint
// CheckpointPod wrote, matched by metadata name. Every container is
// returned CREATED with no process: its StartContainer restores the
// checkpointed processes (runc restore, in the pod's shim). The
// checkpoint is only read. On any error everything made is removed.
func (s *Service) RestorePod(ctx context.Context, req *runtime.RestorePodRequest) (resp *runtime.RestorePodResponse, retErr error) {
	path := req.GetCheckpointPath()
	switch {
	case path == "" || !filepath.IsAbs(path):
		return nil, invalidArgument("RestorePod: checkpoint_path %q must be an absolute path", path)
	case req.GetConfig() == nil || req.GetConfig().GetMetadata() == nil:
		return nil, invalidArgument("RestorePod: config with metadata is required")
	case len(req.GetContainerConfigs()) == 0:
		return nil, invalidArgument("RestorePod: container_configs must not be empty")
	}
	if err := noOptions("RestorePod", req.GetOptions()); err != nil {
		return nil, toStatus(err)
	}
	if _, ok := ctx.Deadline(); !ok {
		return nil, invalidArgument("RestorePod: the caller must set a deadline")
	}
	live := s.live.Load()
	handler := req.GetRuntimeHandler()
	if handler == "" {
		handler = live.Config.DefaultRuntimeHandler
	}
	rh, ok := live.Handler(handler)
	if !ok {
		return nil, invalidArgument("RestorePod: unknown runtime handler %q", handler)
	}
	h := rh.Config
	var m checkpoint.PodManifest
	if err := checkpoint.ReadJSON(path, checkpoint.PodDump, &m); err != nil {
		return nil, toStatus(err)
	}
	if m.Version != checkpoint.PodManifestVersion || m.Runtime != "berth" {
		return nil, invalidArgument("RestorePod: %s is not a berth pod checkpoint of version %d", path, checkpoint.PodManifestVersion)
	}
	inputs, err := s.restoreInputs(path, &m, req.GetContainerConfigs(), filepath.Base(h.Binary))
	if err != nil {
		return nil, toStatus(err)
	}
	criu, err := s.criu.Usable(ctx)
	if err != nil {
		return nil, toStatus(err)
	}

	run, err := s.RunPodSandbox(ctx, &runtime.RunPodSandboxRequest{Config: req.GetConfig(), RuntimeHandler: req.GetRuntimeHandler()})
	if err != nil {
		return nil, err
	}
	podID := run.GetPodSandboxId()
	defer func() {
		if retErr != nil {
			s.undoRestore(ctx, podID)
		}
	}()
	resp = &runtime.RestorePodResponse{PodSandboxId: podID}
	for i, cfg := range req.GetContainerConfigs() {
		in := inputs[i]
		in.CRIU = criu
		c, err := s.createContainer(ctx, &runtime.CreateContainerRequest{
			PodSandboxId: podID, Config: cfg, SandboxConfig: req.GetConfig(),
		}, in)
		if err != nil {
			return nil, err
		}
		resp.RestoredContainers = append(resp.RestoredContainers, &runtime.RestoredContainer{Name: c.Name, ContainerId: c.ID})
	}
	s.log.Info("pod restored", "pod", podID, "from", path, "containers", len(resp.RestoredContainers))
	return resp, nil
}

// undoRestore removes the pod a failed RestorePod made, with its
// containers.
func (s *Service) undoRestore(ctx context.Context, podID string) {
	ctx = context.WithoutCancel(ctx)
	if _, err := s.StopPodSandbox(ctx, &runtime.StopPodSandboxRequest{PodSandboxId: podID}); err != nil {
		s.log.Error("stop the pod of a failed restore", "pod", podID, "err", err)
	}
	if _, err := s.RemovePodSandbox(ctx, &runtime.RemovePodSandboxRequest{PodSandboxId: podID}); err != nil {
		s.log.Error("remove the pod of a failed restore", "pod", podID, "err", err)
	}
}

// restoreInputs matches the container configs with the checkpoint's
// containers by metadata name: the names must be unique and exactly the
// checkpoint's. The handler's runtime must be the one that checkpointed.
func (s *Service) restoreInputs(path string, m *checkpoint.PodManifest, cfgs []*runtime.ContainerConfig, runtimeName string) ([]*restoreInput, error) {
	want := map[string]bool{}
	for _, c := range m.Containers {
		want[c.Name] = true
	}
	got := map[string]bool{}
	var inputs []*restoreInput
	for _, cfg := range cfgs {
		name := cfg.GetMetadata().GetName()
		switch {
		case name == "":
			return nil, fmt.Errorf("RestorePod: every container config needs a metadata name: %w", errdefs.ErrInvalidArgument)
		case got[name]:
			return nil, fmt.Errorf("RestorePod: container name %q is given twice: %w", name, errdefs.ErrInvalidArgument)
		case !want[name]:
			return nil, fmt.Errorf("RestorePod: the checkpoint has no container %q: %w", name, errdefs.ErrInvalidArgument)
		case cfg.GetTty():
			return nil, fmt.Errorf("RestorePod: container %q asks for a terminal, which a checkpoint cannot have: %w", name, errdefs.ErrInvalidArgument)
		}
		got[name] = true
		in, err := loadRestoreInput(filepath.Join(path, name), runtimeName)
		if err != nil {
			return nil, fmt.Errorf("RestorePod: %w", err)
		}
		inputs = append(inputs, in)
	}
	if len(got) != len(want) {
		var missing []string
		for n := range want {
			if !got[n] {
				missing = append(missing, n)
			}
		}
		slices.Sort(missing)
		return nil, fmt.Errorf("RestorePod: no container config for checkpointed containers %q: %w", missing, errdefs.ErrInvalidArgument)
	}
	return inputs, nil
}

// loadRestoreInput reads one container checkpoint directory (config.dump
// and spec.dump); the handler's runtime must be the one that
// checkpointed.
func loadRestoreInput(dir, runtimeName string) (*restoreInput, error) {
	in := &restoreInput{Restore: container.Restore{Dir: dir}}
	if err := checkpoint.ReadJSON(in.Dir, checkpoint.ConfigDump, &in.config); err != nil {
		return nil, err
	}
	if err := checkpoint.ReadJSON(in.Dir, checkpoint.SpecDump, &in.spec); err != nil {
		return nil, err
	}
	if in.config.OCIRuntime != "" && in.config.OCIRuntime != runtimeName {
		return nil, fmt.Errorf("container %q was checkpointed by %s, the handler runs %s: %w",
			in.config.Name, in.config.OCIRuntime, runtimeName, errdefs.ErrFailedPrecondition)
	}
	return in, nil
}

// restoreInput is one container of a RestorePod: its checkpoint and what
// the checkpoint says it was.
type restoreInput struct {
	container.Restore
	config checkpoint.ContainerConfig
	spec   specs.Spec
}

// check compares the restore-time container with the checkpointed one:
// the same image, the same process (arguments, working directory,
// environment, credentials), and the same mount points, which CRIU needs
// to find again. Anything else the restore-time config may change.
func (in *restoreInput) check(d *container.Draft, spec *specs.Spec) error {
	name := in.config.Name
	if in.config.RootfsImageRef != "" && d.Image.ID != in.config.RootfsImageRef {
		return fmt.Errorf("container %q: image %s is not the checkpointed image %s: %w", name, d.Image.ID, in.config.RootfsImageRef, errdefs.ErrInvalidArgument)
	}
	was, is := in.spec.Process, spec.Process
	if was == nil || is == nil {
		return fmt.Errorf("container %q: checkpoint without a process: %w", name, errdefs.ErrInvalidArgument)
	}
	switch {
	case !slices.Equal(was.Args, is.Args):
		return fmt.Errorf("container %q: command %q is not the checkpointed %q: %w", name, is.Args, was.Args, errdefs.ErrInvalidArgument)
	case was.Cwd != is.Cwd:
		return fmt.Errorf("container %q: working directory %q is not the checkpointed %q: %w", name, is.Cwd, was.Cwd, errdefs.ErrInvalidArgument)
	case !slices.Equal(was.Env, is.Env):
		return fmt.Errorf("container %q: environment differs from the checkpointed one (%q, not %q): %w",
			name, envDiff(is.Env, was.Env), envDiff(was.Env, is.Env), errdefs.ErrInvalidArgument)
	case was.User.UID != is.User.UID || was.User.GID != is.User.GID || !slices.Equal(was.User.AdditionalGids, is.User.AdditionalGids):
		return fmt.Errorf("container %q: user %d:%d is not the checkpointed %d:%d: %w", name, is.User.UID, is.User.GID, was.User.UID, was.User.GID, errdefs.ErrInvalidArgument)
	}
	if w, i := mountPoints(&in.spec), mountPoints(spec); !slices.Equal(w, i) {
		return fmt.Errorf("container %q: mount points %q are not the checkpointed %q: %w", name, i, w, errdefs.ErrFailedPrecondition)
	}
	return nil
}

func mountPoints(spec *specs.Spec) []string {
	var out []string
	for _, m := range spec.Mounts {
		out = append(out, m.Destination)
	}
	slices.Sort(out)
	return out
}

// envDiff lists the entries of a missing from b.
func envDiff(a, b []string) []string {
	var out []string
	for _, v := range a {
		if !slices.Contains(b, v) {
			out = append(out, v)
		}
	}
	return out
}
