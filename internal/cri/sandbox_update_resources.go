package cri

import (
	"context"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/container"
)

// UpdatePodSandboxResources applies new pod-level limits to the pod's
// cgroup, the parent of all its containers' cgroups.
func (s *Service) UpdatePodSandboxResources(ctx context.Context, req *runtime.UpdatePodSandboxResourcesRequest) (*runtime.UpdatePodSandboxResourcesResponse, error) {
	if req.GetPodSandboxId() == "" {
		return nil, invalidArgument("UpdatePodSandboxResources: pod_sandbox_id is required")
	}
	var res *specs.LinuxResources // none sent: only the overhead is recorded
	if req.GetResources() != nil {
		res = container.OCIResources(req.GetResources())
	}
	if err := s.sandboxes.UpdateResources(ctx, req.GetPodSandboxId(), res, req.GetOverhead(), req.GetResources()); err != nil {
		return nil, toStatus(err)
	}
	return &runtime.UpdatePodSandboxResourcesResponse{}, nil
}
