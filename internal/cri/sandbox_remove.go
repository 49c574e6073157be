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
	sb, err := s.sandboxes.Get(req.GetPodSandboxId())
	if err != nil {
		// Unknown, or a prefix of several: Remove answers as it should.
		if err := s.sandboxes.Remove(ctx, req.GetPodSandboxId()); err != nil {
			return nil, toStatus(err)
		}
		return &runtime.RemovePodSandboxResponse{}, nil
	}
	removed, err := s.containers.RemovePod(ctx, sb.ID)
	for _, c := range removed {
		s.containerRemoved(ctx, c)
	}
	if err != nil {
		return nil, toStatus(err)
	}
	// A pod that never got a container still has the shim RunPodSandbox
	// launched for it (container.Store.WarmShim).
	if err := s.containers.ShutdownIdleShim(ctx, sb.ID); err != nil {
		return nil, toStatus(err)
	}
	if err := s.sandboxes.Remove(ctx, sb.ID); err != nil {
		return nil, toStatus(err)
	}
	s.stats.Forget(sb.ID)
	logNRI(s.log, s.nri.RemovePodSandbox(ctx, sb), sb.ID, "")
	return &runtime.RemovePodSandboxResponse{}, nil
}
