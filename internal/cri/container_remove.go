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
	if err := s.lifecycle.RemoveContainer(ctx, req.GetContainerId()); err != nil {
		return nil, toStatus(err)
	}
	return &runtime.RemoveContainerResponse{}, nil
}
