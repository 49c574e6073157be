package cri

import (
	"context"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/container"
)

// RemoveContainer removes a container, forcing it down if it runs.
// Removing an unknown container succeeds.
func (s *Service) RemoveContainer(ctx context.Context, req *runtime.RemoveContainerRequest) (*runtime.RemoveContainerResponse, error) {
	if req.GetContainerId() == "" {
		return nil, invalidArgument("RemoveContainer: container ID is required")
	}
	c, err := s.containers.Remove(ctx, req.GetContainerId())
	if err != nil {
		return nil, toStatus(err)
	}
	if c != nil {
		s.containerRemoved(ctx, c)
	}
	return &runtime.RemoveContainerResponse{}, nil
}

// containerRemoved tells those who keep something per container that it
// is gone: the stats sampler, and NRI plugins (stop, if not reported yet,
// then remove). The container store's removals say exactly which
// containers went, so each is told once.
func (s *Service) containerRemoved(ctx context.Context, c *container.Container) {
	s.stats.Forget(c.ID)
	logNRI(s.log, s.nri.RemoveContainer(ctx, c), c.PodID, c.ID)
}
