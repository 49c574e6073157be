package cri

import (
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// StreamContainerStats sends what ListContainerStats returns for the same
// filter, in responses of at least one container's stats each (KEP-5825).
func (s *Service) StreamContainerStats(req *runtime.StreamContainerStatsRequest, stream runtime.RuntimeService_StreamContainerStatsServer) error {
	b := newBatcher(stream.Context(), func(items []*runtime.ContainerStats) error {
		return stream.Send(&runtime.StreamContainerStatsResponse{ContainerStats: items})
	})
	if err := s.eachContainerStats(stream.Context(), req.GetFilter(), b.add); err != nil {
		return err
	}
	return b.flush()
}
