package cri

import (
	"context"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// RemovePodSandbox removes the pod's containers, stops the sandbox if it
// runs and deletes it. An unknown sandbox is not an error. When some
// containers cannot be removed, those that were are reported gone at once
// and the call fails; the kubelet's retry removes the rest.
func (s *Service) RemovePodSandbox(ctx context.Context, req *runtime.RemovePodSandboxRequest) (*runtime.RemovePodSandboxResponse, error) {
	if req.GetPodSandboxId() == "" {
		return nil, invalidArgument("RemovePodSandbox: pod_sandbox_id is required")
	}
	if err := s.lifecycle.RemovePod(ctx, req.GetPodSandboxId()); err != nil {
		return nil, toStatus(err)
	}
	return &runtime.RemovePodSandboxResponse{}, nil
}
