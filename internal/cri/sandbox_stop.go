package cri

import (
	"context"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// StopPodSandbox stops the pod's containers and tears down its network
// and namespaces. Stopping a stopped or unknown sandbox succeeds, as the
// kubelet expects.
func (s *Service) StopPodSandbox(ctx context.Context, req *runtime.StopPodSandboxRequest) (*runtime.StopPodSandboxResponse, error) {
	if req.GetPodSandboxId() == "" {
		return nil, invalidArgument("StopPodSandbox: pod_sandbox_id is required")
	}
	if err := s.lifecycle.StopPod(ctx, req.GetPodSandboxId()); err != nil {
		return nil, toStatus(err)
	}
	return &runtime.StopPodSandboxResponse{}, nil
}
