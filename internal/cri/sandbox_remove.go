package cri

import (
	"context"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// RemovePodSandbox stops the sandbox if it runs and deletes it. An unknown
// sandbox is not an error.
func (s *Service) RemovePodSandbox(ctx context.Context, req *runtime.RemovePodSandboxRequest) (*runtime.RemovePodSandboxResponse, error) {
	if req.GetPodSandboxId() == "" {
		return nil, invalidArgument("RemovePodSandbox: pod_sandbox_id is required")
	}
	if sb, err := s.sandboxes.Get(req.GetPodSandboxId()); err == nil {
		for _, c := range s.containers.List() {
			if c.PodID == sb.ID {
				s.stats.Forget(c.ID)
			}
		}
		s.stats.Forget(sb.ID)
		pod := s.containers.List()
		if err := s.containers.RemovePod(ctx, sb.ID); err != nil {
			return nil, toStatus(err)
		}
		for _, c := range pod {
			if c.PodID == sb.ID {
				logNRI(s.log, s.nri.RemoveContainer(ctx, c), sb.ID, c.ID)
			}
		}
		if err := s.sandboxes.Remove(ctx, req.GetPodSandboxId()); err != nil {
			return nil, toStatus(err)
		}
		logNRI(s.log, s.nri.RemovePodSandbox(ctx, sb), sb.ID, "")
		return &runtime.RemovePodSandboxResponse{}, nil
	}
	if err := s.sandboxes.Remove(ctx, req.GetPodSandboxId()); err != nil {
		return nil, toStatus(err)
	}
	return &runtime.RemovePodSandboxResponse{}, nil
}
