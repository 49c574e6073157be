package cri

import (
	"context"
	"strings"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/container"
)

// ListContainers lists containers, filtered by ID (prefix), pod, state and
// labels (all must match).
func (s *Service) ListContainers(ctx context.Context, req *runtime.ListContainersRequest) (*runtime.ListContainersResponse, error) {
	resp := &runtime.ListContainersResponse{}
	for c := range s.containers.All() {
		if containerMatches(req.GetFilter(), c) {
			resp.Containers = append(resp.Containers, criContainer(c))
		}
	}
	return resp, nil
}

// containerMatches is ListContainers' and StreamContainers' filter.
func containerMatches(f *runtime.ContainerFilter, c *container.Container) bool {
	if f == nil {
		return true
	}
	switch {
	case f.GetId() != "" && !strings.HasPrefix(c.ID, f.GetId()),
		f.GetPodSandboxId() != "" && !strings.HasPrefix(c.PodID, f.GetPodSandboxId()),
		f.GetState() != nil && f.GetState().GetState() != criContainerState(c.State):
		return false
	}
	return matchLabels(c.Labels, f.GetLabelSelector())
}
