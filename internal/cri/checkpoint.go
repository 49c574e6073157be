package cri

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/lifecycle"
)

// CheckpointContainer writes a CRIU checkpoint of a running container,
// which keeps running, as a tar archive at the request's location
// (lifecycle.Service.CheckpointContainer, docs/checkpoint.md). A timeout
// > 0 bounds it.
func (s *Service) CheckpointContainer(ctx context.Context, req *runtime.CheckpointContainerRequest) (*runtime.CheckpointContainerResponse, error) {
	loc := req.GetLocation()
	switch {
	case req.GetContainerId() == "":
		return nil, invalidArgument("CheckpointContainer: container_id is required")
	case loc == "" || !filepath.IsAbs(loc):
		return nil, invalidArgument("CheckpointContainer: location %q must be an absolute path", loc)
	case req.GetTimeout() < 0:
		return nil, invalidArgument("CheckpointContainer: timeout %d is negative", req.GetTimeout())
	}
	if req.GetTimeout() > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(req.GetTimeout())*time.Second)
		defer cancel()
	}
	if err := s.lifecycle.CheckpointContainer(ctx, req.GetContainerId(), loc); err != nil {
		return nil, toStatus(err)
	}
	return &runtime.CheckpointContainerResponse{}, nil
}

// CheckpointPod writes one consistent checkpoint of the selected running
// containers of a pod into output_path, exactly as the proto says
// (lifecycle.Service.CheckpointPod): all paused, captured and resumed
// before the call returns; nothing left behind on error.
func (s *Service) CheckpointPod(ctx context.Context, req *runtime.CheckpointPodRequest) (*runtime.CheckpointPodResponse, error) {
	out := req.GetOutputPath()
	switch {
	case req.GetPodSandboxId() == "":
		return nil, invalidArgument("CheckpointPod: pod_sandbox_id is required")
	case out == "" || !filepath.IsAbs(out):
		return nil, invalidArgument("CheckpointPod: output_path %q must be an absolute path", out)
	case len(req.GetContainerIds()) == 0:
		return nil, invalidArgument("CheckpointPod: container_ids must not be empty")
	}
	if err := noOptions("CheckpointPod", req.GetOptions()); err != nil {
		return nil, toStatus(err)
	}
	if _, ok := ctx.Deadline(); !ok {
		return nil, invalidArgument("CheckpointPod: the caller must set a deadline")
	}
	if err := s.lifecycle.CheckpointPod(ctx, req.GetPodSandboxId(), out, req.GetContainerIds()); err != nil {
		return nil, toStatus(err)
	}
	return &runtime.CheckpointPodResponse{}, nil
}

// RestorePod makes a new pod sandbox from the request's config and, for
// each container config, a container restored from the checkpoint
// CheckpointPod wrote, matched by metadata name
// (lifecycle.Service.RestorePod). Every container is returned CREATED:
// its StartContainer restores the checkpointed processes.
func (s *Service) RestorePod(ctx context.Context, req *runtime.RestorePodRequest) (*runtime.RestorePodResponse, error) {
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
	restore := lifecycle.RestorePodRequest{Path: path, Config: req.GetConfig(), RuntimeHandler: req.GetRuntimeHandler()}
	for _, cfg := range req.GetContainerConfigs() {
		creq, err := createRequest("", cfg, req.GetConfig())
		if err != nil {
			return nil, err
		}
		restore.Containers = append(restore.Containers, creq)
	}
	sb, restored, err := s.lifecycle.RestorePod(ctx, restore)
	if err != nil {
		return nil, toStatus(err)
	}
	resp := &runtime.RestorePodResponse{PodSandboxId: sb.ID}
	for _, c := range restored {
		resp.RestoredContainers = append(resp.RestoredContainers, &runtime.RestoredContainer{Name: c.Name, ContainerId: c.ID})
	}
	return resp, nil
}

// noOptions refuses every key of a checkpoint or restore options map:
// berth defines none, and the proto forbids ignoring one silently.
func noOptions(rpc string, opts map[string]string) error {
	for k := range opts {
		return fmt.Errorf("%s: unsupported option %q (berth supports none): %w", rpc, k, errdefs.ErrInvalidArgument)
	}
	return nil
}
