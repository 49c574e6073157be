package cri

import (
	"context"
	"net/netip"
	"strings"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// UpdateRuntimeConfig records the pod CIDR the kubelet assigns to this node.
// An empty CIDR is a no-op, as in containerd.
func (s *Service) UpdateRuntimeConfig(ctx context.Context, req *runtime.UpdateRuntimeConfigRequest) (*runtime.UpdateRuntimeConfigResponse, error) {
	cidr := req.GetRuntimeConfig().GetNetworkConfig().GetPodCidr()
	if cidr == "" {
		return &runtime.UpdateRuntimeConfigResponse{}, nil
	}
	// The kubelet may send a comma-separated dual-stack pair.
	for _, part := range strings.Split(cidr, ",") {
		if _, err := netip.ParsePrefix(strings.TrimSpace(part)); err != nil {
			return nil, invalidArgument("pod CIDR %q: %v", cidr, err)
		}
	}
	s.mu.Lock()
	s.podCIDR = cidr
	s.mu.Unlock()
	s.log.Info("pod CIDR updated", "podCIDR", cidr)
	return &runtime.UpdateRuntimeConfigResponse{}, nil
}
