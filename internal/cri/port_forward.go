package cri

import (
	"context"
	"fmt"

	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/errdefs"
)

// PortForward returns a streaming URL through which the client forwards
// ports into the pod's network namespace.
func (s *Service) PortForward(ctx context.Context, req *criapi.PortForwardRequest) (*criapi.PortForwardResponse, error) {
	if req.GetPodSandboxId() == "" {
		return nil, invalidArgument("pod_sandbox_id is required")
	}
	sb, err := s.sandboxes.Get(req.PodSandboxId)
	if err != nil {
		return nil, toStatus(err)
	}
	if sb.State != criapi.PodSandboxState_SANDBOX_READY {
		return nil, toStatus(fmt.Errorf("pod sandbox %s is not ready: %w", sb.ID, errdefs.ErrFailedPrecondition))
	}
	for _, p := range req.Port {
		if p <= 0 || p > 65535 {
			return nil, invalidArgument("port %d out of range", p)
		}
	}
	// The streaming server resolves the ID again per connection; hand it the
	// full ID so that a prefix cannot become ambiguous later.
	return s.streaming.GetPortForward(&criapi.PortForwardRequest{PodSandboxId: sb.ID, Port: req.Port})
}
