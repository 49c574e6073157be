package cri

import (
	"context"
	"strings"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// ListContainers lists containers, filtered by ID (prefix), pod, state and
// labels (all must match).
func (s *Service) ListContainers(ctx context.Context, req *runtime.ListContainersRequest) (*runtime.ListContainersResponse, error) {
	f := req.GetFilter()
	resp := &runtime.ListContainersResponse{}
	for _, c := range s.containers.List() {
		if f != nil {
			if f.GetId() != "" && !strings.HasPrefix(c.ID, f.GetId()) {
				continue
			}
			if f.GetPodSandboxId() != "" && !strings.HasPrefix(c.PodID, f.GetPodSandboxId()) {
				continue
			}
			if f.GetState() != nil && f.GetState().GetState() != criContainerState(c.State) {
				continue
			}
			if !labelsMatch(c.Labels, f.GetLabelSelector()) {
				continue
			}
		}
		resp.Containers = append(resp.Containers, criContainer(c))
	}
	return resp, nil
}

func labelsMatch(labels, selector map[string]string) bool {
	for k, v := range selector {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}
