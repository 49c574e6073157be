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
	c, getErr := s.containers.Get(req.GetContainerId())
	if err := s.containers.Remove(ctx, req.GetContainerId()); err != nil {
		return nil, toStatus(err)
	}
	if getErr == nil {
		s.publishContainerEvent(c, runtime.ContainerEventType_CONTAINER_DELETED_EVENT)
	}
	return &runtime.RemoveContainerResponse{}, nil
}
