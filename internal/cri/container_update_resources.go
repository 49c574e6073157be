package cri

import (
	"context"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// UpdateContainerResources changes a live container's cgroup limits
// through the runtime's update (lifecycle checks and converts them as
// create does); status shows the new values.
func (s *Service) UpdateContainerResources(ctx context.Context, req *runtime.UpdateContainerResourcesRequest) (*runtime.UpdateContainerResourcesResponse, error) {
	if req.GetContainerId() == "" {
		return nil, invalidArgument("UpdateContainerResources: container ID is required")
	}
	linux := req.GetLinux()
	if linux == nil {
		return nil, invalidArgument("UpdateContainerResources: linux resources are required")
	}
	if err := s.lifecycle.UpdateContainerResources(ctx, req.GetContainerId(), linux); err != nil {
		return nil, toStatus(err)
	}
	return &runtime.UpdateContainerResourcesResponse{}, nil
}
