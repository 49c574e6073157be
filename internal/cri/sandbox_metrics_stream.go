package cri

import (
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// StreamPodSandboxMetrics sends what ListPodSandboxMetrics returns, in
// responses of at least one pod's metrics each (KEP-5825).
func (s *Service) StreamPodSandboxMetrics(req *runtime.StreamPodSandboxMetricsRequest, stream runtime.RuntimeService_StreamPodSandboxMetricsServer) error {
	b := newBatcher(stream.Context(), func(items []*runtime.PodSandboxMetrics) error {
		return stream.Send(&runtime.StreamPodSandboxMetricsResponse{PodSandboxMetrics: items})
	})
	if err := s.eachPodMetrics(stream.Context(), b.add); err != nil {
		return err
	}
	return b.flush()
}
