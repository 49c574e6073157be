package cri

import (
	"context"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/container"
)

// UpdatePodSandboxResources applies new pod-level limits to the pod's
// cgroup, the parent of all its containers' cgroups.
func (s *Service) UpdatePodSandboxResources(ctx context.Context, req *runtime.UpdatePodSandboxResourcesRequest) (*runtime.UpdatePodSandboxResourcesResponse, error) {
	if req.GetPodSandboxId() == "" {
		return nil, invalidArgument("UpdatePodSandboxResources: pod_sandbox_id is required")
	}
	if req.GetResources() == nil {
		return nil, invalidArgument("UpdatePodSandboxResources: resources are required")
	}
	res := container.OCIResources(req.GetResources())
	if err := s.sandboxes.UpdateResources(ctx, req.GetPodSandboxId(), res, req.GetOverhead(), req.GetResources()); err != nil {
		return nil, toStatus(err)
	}
	return &runtime.UpdatePodSandboxResourcesResponse{}, nil
}
