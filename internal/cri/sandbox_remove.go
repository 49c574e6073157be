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
	// containers: remove them first (the container package's remove-all for the pod).
	if err := s.sandboxes.Remove(ctx, req.GetPodSandboxId()); err != nil {
		return nil, toStatus(err)
	}
	return &runtime.RemovePodSandboxResponse{}, nil
}
