package cri

import (
	"context"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// UpdatePodSandboxResources applies new pod-level limits to the pod's
// cgroup, the parent of all its containers' cgroups.
func (s *Service) UpdatePodSandboxResources(ctx context.Context, req *runtime.UpdatePodSandboxResourcesRequest) (*runtime.UpdatePodSandboxResourcesResponse, error) {
	if req.GetPodSandboxId() == "" {
		return nil, invalidArgument("UpdatePodSandboxResources: pod_sandbox_id is required")
	}
	if err := s.lifecycle.UpdatePodResources(ctx, req.GetPodSandboxId(), req.GetOverhead(), req.GetResources()); err != nil {
		return nil, toStatus(err)
	}
	return &runtime.UpdatePodSandboxResourcesResponse{}, nil
}
