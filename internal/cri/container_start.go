package cri

import (
	"context"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// StartContainer starts a created container; any other state is
// FailedPrecondition.
func (s *Service) StartContainer(ctx context.Context, req *runtime.StartContainerRequest) (*runtime.StartContainerResponse, error) {
	if req.GetContainerId() == "" {
		return nil, invalidArgument("StartContainer: container ID is required")
	}
	if err := s.lifecycle.StartContainer(ctx, req.GetContainerId()); err != nil {
		return nil, toStatus(err)
	}
	return &runtime.StartContainerResponse{}, nil
}
