package cri

import (
	"context"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// PodSandboxStats reports a pod's CPU, memory, process count and network
// (while ready), with the stats of each of its containers.
func (s *Service) PodSandboxStats(ctx context.Context, req *runtime.PodSandboxStatsRequest) (*runtime.PodSandboxStatsResponse, error) {
	if req.GetPodSandboxId() == "" {
		return nil, invalidArgument("PodSandboxStats: pod_sandbox_id is required")
	}
	sb, err := s.sandboxes.Get(req.GetPodSandboxId())
	if err != nil {
		return nil, toStatus(err)
	}
	st, err := s.podStats(ctx, sb, s.containersByPod()[sb.ID])
	if err != nil {
		return nil, toStatus(err)
	}
	return &runtime.PodSandboxStatsResponse{Stats: st}, nil
}
