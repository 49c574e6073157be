package cri

import (
	"context"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/container"
	"github.com/berthcri/berth/internal/lifecycle"
)

// CreateContainer creates a container in a ready pod
// (lifecycle.Service.CreateContainer: prepare, spec, NRI, commit). An
// image that names a local file is a CheckpointContainer archive to
// restore (lifecycle.CheckpointArchive).
func (s *Service) CreateContainer(ctx context.Context, req *runtime.CreateContainerRequest) (*runtime.CreateContainerResponse, error) {
	creq, err := createRequest(req.GetPodSandboxId(), req.GetConfig(), req.GetSandboxConfig())
	if err != nil {
		return nil, err
	}
	var c *container.Container
	if archive := lifecycle.CheckpointArchive(req.GetConfig()); archive != "" {
		c, err = s.lifecycle.CreateFromArchive(ctx, creq, archive)
	} else {
		c, err = s.lifecycle.CreateContainer(ctx, creq)
	}
	if err != nil {
		return nil, toStatus(err)
	}
	return &runtime.CreateContainerResponse{ContainerId: c.ID}, nil
}

// createRequest translates one container of a CreateContainer or
// RestorePod; the lifecycle service checks the rest.
func createRequest(podID string, cfg *runtime.ContainerConfig, sbCfg *runtime.PodSandboxConfig) (lifecycle.CreateRequest, error) {
	stopSignal, ok := stopSignalName(cfg.GetStopSignal())
	if !ok {
		return lifecycle.CreateRequest{}, invalidArgument("CreateContainer: unknown stop_signal %d", cfg.GetStopSignal())
	}
	return lifecycle.CreateRequest{PodID: podID, Config: cfg, SandboxConfig: sbCfg, StopSignal: stopSignal}, nil
}
