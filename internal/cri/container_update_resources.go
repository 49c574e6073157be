package cri

import (
	"context"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/container"
	"github.com/berthcri/berth/internal/specgen"
)

// UpdateContainerResources changes a live container's cgroup limits
// through the runtime's update; status shows the new values.
func (s *Service) UpdateContainerResources(ctx context.Context, req *runtime.UpdateContainerResourcesRequest) (*runtime.UpdateContainerResourcesResponse, error) {
	if req.GetContainerId() == "" {
		return nil, invalidArgument("UpdateContainerResources: container ID is required")
	}
	linux := req.GetLinux()
	if linux == nil {
		return nil, invalidArgument("UpdateContainerResources: linux resources are required")
	}
	if err := specgen.CheckResources(linux); err != nil {
		return nil, toStatus(err)
	}
	c, err := s.containers.Get(req.GetContainerId())
	if err != nil {
		return nil, toStatus(err)
	}
	// NRI plugins may change the update; status then shows what was
	// applied.
	res, err := s.nri.UpdateContainer(ctx, c, container.OCIResources(linux))
	if err != nil {
		return nil, toStatus(err)
	}
	if err := s.containers.UpdateResources(ctx, c.ID, res, linux); err != nil {
		return nil, toStatus(err)
	}
	if cur, err := s.containers.Get(c.ID); err == nil {
		s.nri.PostUpdateContainer(ctx, cur)
	}
	return &runtime.UpdateContainerResourcesResponse{}, nil
}
