package cri

import (
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// StreamPodSandboxes sends what ListPodSandbox returns for the same filter,
// in responses of at least one sandbox each (KEP-5825).
func (s *Service) StreamPodSandboxes(req *runtime.StreamPodSandboxesRequest, stream runtime.RuntimeService_StreamPodSandboxesServer) error {
	b := newBatcher(stream.Context(), func(items []*runtime.PodSandbox) error {
		return stream.Send(&runtime.StreamPodSandboxesResponse{PodSandboxes: items})
	})
	for sb := range s.sandboxes.All() {
		if !sandboxMatches(req.GetFilter(), sb) {
			continue
		}
		if err := b.add(criPodSandbox(sb)); err != nil {
			return err
		}
	}
	return b.flush()
}
