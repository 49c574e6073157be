package cri

import (
	"context"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// ContainerStats reports one container's CPU, memory and writable layer.
func (s *Service) ContainerStats(ctx context.Context, req *runtime.ContainerStatsRequest) (*runtime.ContainerStatsResponse, error) {
	if req.GetContainerId() == "" {
		return nil, invalidArgument("ContainerStats: container_id is required")
	}
	c, err := s.containers.Get(req.GetContainerId())
	if err != nil {
		return nil, toStatus(err)
	}
	cs, err := s.containerStats(c)
	if err != nil {
		return nil, toStatus(err)
	}
	return &runtime.ContainerStatsResponse{Stats: cs}, nil
}
