package cri

import (
	"context"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/errdefs"
)

// StopPodSandbox tears down the pod's network and namespaces. Stopping a
// stopped or unknown sandbox succeeds, as the kubelet expects.
func (s *Service) StopPodSandbox(ctx context.Context, req *runtime.StopPodSandboxRequest) (*runtime.StopPodSandboxResponse, error) {
	if req.GetPodSandboxId() == "" {
		return nil, invalidArgument("StopPodSandbox: pod_sandbox_id is required")
	}
	// Containers first, as the kubelet expects: their grace is its business,
	// so they get the default of zero (SIGKILL) here.
	if sb, err := s.sandboxes.Get(req.GetPodSandboxId()); err == nil {
		if err := s.containers.StopPod(ctx, sb.ID, 0); err != nil {
			return nil, toStatus(err)
		}
		// A pod that never got a container needs its shim no more
		// (container.Store.WarmShim); one holding containers stays.
		if err := s.containers.ShutdownIdleShim(ctx, sb.ID); err != nil {
			return nil, toStatus(err)
		}
		// NRI: each container's stop, then the pod's, while the pod is
		// still there; the first StopPodSandbox only.
		s.nriStopPod(ctx, sb)
	}
	err := s.sandboxes.Stop(ctx, req.GetPodSandboxId())
	if err != nil && !errdefs.IsNotFound(err) {
		return nil, toStatus(err)
	}
	return &runtime.StopPodSandboxResponse{}, nil
}
