package cri

import (
	"context"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// RunPodSandbox creates the pod's namespaces, files, cgroup and network
// (lifecycle.Service.RunPod, which also tells NRI).
func (s *Service) RunPodSandbox(ctx context.Context, req *runtime.RunPodSandboxRequest) (*runtime.RunPodSandboxResponse, error) {
	cfg := req.GetConfig()
	if cfg == nil || cfg.GetMetadata() == nil {
		return nil, invalidArgument("RunPodSandbox: config with metadata is required")
	}
	sb, err := s.lifecycle.RunPod(ctx, cfg, req.GetRuntimeHandler())
	if err != nil {
		return nil, toStatus(err)
	}
	return &runtime.RunPodSandboxResponse{PodSandboxId: sb.ID}, nil
}
