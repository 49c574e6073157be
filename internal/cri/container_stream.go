package cri

import (
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// StreamContainers sends what ListContainers returns for the same filter,
// in responses of at least one container each (KEP-5825).
func (s *Service) StreamContainers(req *runtime.StreamContainersRequest, stream runtime.RuntimeService_StreamContainersServer) error {
	b := newBatcher(stream.Context(), func(items []*runtime.Container) error {
		return stream.Send(&runtime.StreamContainersResponse{Containers: items})
	})
	for c := range s.containers.All() {
		if !containerMatches(req.GetFilter(), c) {
			continue
		}
		if err := b.add(criContainer(c)); err != nil {
			return err
		}
	}
	return b.flush()
}
