package cri

import (
	"context"
	"strings"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// ListPodSandboxStats reports every pod matching the filter (ID or prefix,
// labels). A pod that vanishes while being sampled is left out.
func (s *Service) ListPodSandboxStats(ctx context.Context, req *runtime.ListPodSandboxStatsRequest) (*runtime.ListPodSandboxStatsResponse, error) {
	f := req.GetFilter()
	resp := &runtime.ListPodSandboxStatsResponse{Stats: []*runtime.PodSandboxStats{}}
	for _, sb := range s.sandboxes.List() {
		if !strings.HasPrefix(sb.ID, f.GetId()) || !matchLabels(sb.Config.GetLabels(), f.GetLabelSelector()) {
			continue
		}
		st, err := s.podStats(ctx, sb)
		if err != nil {
			if ctx.Err() != nil {
				return nil, toStatus(ctx.Err())
			}
			s.log.Warn("pod stats", "pod", sb.ID, "err", err)
			continue
		}
		resp.Stats = append(resp.Stats, st)
	}
	return resp, nil
}
