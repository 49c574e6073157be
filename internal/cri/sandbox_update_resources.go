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
	sb, err := s.sandboxes.Get(req.GetPodSandboxId())
	if err != nil {
		return nil, toStatus(err)
	}
	// NRI plugins hear of it first (and may refuse), then once applied.
	if err := s.nri.UpdatePodSandbox(ctx, sb, req.GetOverhead(), req.GetResources()); err != nil {
		return nil, toStatus(err)
	}
	if err := s.sandboxes.UpdateResources(ctx, sb.ID, res, req.GetOverhead(), req.GetResources()); err != nil {
		return nil, toStatus(err)
	}
	if cur, err := s.sandboxes.Get(sb.ID); err == nil {
		s.nri.PostUpdatePodSandbox(ctx, cur)
	}
	return &runtime.UpdatePodSandboxResourcesResponse{}, nil
}
