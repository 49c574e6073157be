package cri

import (
	"context"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// RemoveContainer removes a container, forcing it down if it runs.
// Removing an unknown container succeeds.
func (s *Service) RemoveContainer(ctx context.Context, req *runtime.RemoveContainerRequest) (*runtime.RemoveContainerResponse, error) {
	if req.GetContainerId() == "" {
		return nil, invalidArgument("RemoveContainer: container ID is required")
	}
	c, err := s.containers.Get(req.GetContainerId())
	if err == nil {
		defer s.stats.Forget(c.ID)
	}
	if err := s.containers.Remove(ctx, req.GetContainerId()); err != nil {
		return nil, toStatus(err)
	}
	if c != nil {
		// NRI: stop (if not reported yet), then remove.
		logNRI(s.log, s.nri.RemoveContainer(ctx, c), c.PodID, c.ID)
	}
	return &runtime.RemoveContainerResponse{}, nil
}
