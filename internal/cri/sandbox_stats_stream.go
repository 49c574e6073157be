package cri

import (
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// StreamPodSandboxStats sends what ListPodSandboxStats returns for the same
// filter, in responses of at least one pod's stats each (KEP-5825).
func (s *Service) StreamPodSandboxStats(req *runtime.StreamPodSandboxStatsRequest, stream runtime.RuntimeService_StreamPodSandboxStatsServer) error {
	b := newBatcher(stream.Context(), func(items []*runtime.PodSandboxStats) error {
		return stream.Send(&runtime.StreamPodSandboxStatsResponse{PodSandboxStats: items})
	})
	if err := s.eachPodStats(stream.Context(), req.GetFilter(), b.add); err != nil {
		return err
	}
	return b.flush()
}
