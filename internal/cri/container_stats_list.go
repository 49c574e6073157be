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
	resp := &runtime.ListContainerStatsResponse{Stats: []*runtime.ContainerStats{}}
	err := s.eachContainerStats(ctx, req.GetFilter(), func(cs *runtime.ContainerStats) error {
		resp.Stats = append(resp.Stats, cs)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// eachContainerStats samples the containers matching f one by one, for
// ListContainerStats and StreamContainerStats; it stops at the first
// error of fn or of ctx.
func (s *Service) eachContainerStats(ctx context.Context, f *runtime.ContainerStatsFilter, fn func(*runtime.ContainerStats) error) error {
	for c := range s.containers.All() {
		if !strings.HasPrefix(c.ID, f.GetId()) || !strings.HasPrefix(c.PodID, f.GetPodSandboxId()) || !matchLabels(c.Labels, f.GetLabelSelector()) {
			continue
		}
		if err := ctx.Err(); err != nil {
			return toStatus(err)
		}
		cs, err := s.containerStats(c)
		if err != nil {
			s.log.Warn("container stats", "pod", c.PodID, "container", c.ID, "err", err)
			continue
		}
		if err := fn(cs); err != nil {
			return err
		}
	}
	return nil
}
