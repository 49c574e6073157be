package cri

import (
	"context"
	"strings"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// ListContainerStats reports every container matching the filter (ID or
// ID prefix, pod ID or prefix, labels). A container that vanishes while
// being sampled is left out.
func (s *Service) ListContainerStats(ctx context.Context, req *runtime.ListContainerStatsRequest) (*runtime.ListContainerStatsResponse, error) {
	f := req.GetFilter()
	resp := &runtime.ListContainerStatsResponse{Stats: []*runtime.ContainerStats{}}
	for _, c := range s.containers.List() {
		if !strings.HasPrefix(c.ID, f.GetId()) || !strings.HasPrefix(c.PodID, f.GetPodSandboxId()) || !matchLabels(c.Labels, f.GetLabelSelector()) {
			continue
		}
		if err := ctx.Err(); err != nil {
			return nil, toStatus(err)
		}
		cs, err := s.containerStats(c)
		if err != nil {
			s.log.Warn("container stats", "pod", c.PodID, "container", c.ID, "err", err)
			continue
		}
		resp.Stats = append(resp.Stats, cs)
	}
	return resp, nil
}
