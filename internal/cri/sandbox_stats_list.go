package cri

import (
	"context"
	"strings"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// ListPodSandboxStats reports every pod matching the filter (ID or prefix,
// labels). A pod that vanishes while being sampled is left out.
func (s *Service) ListPodSandboxStats(ctx context.Context, req *runtime.ListPodSandboxStatsRequest) (*runtime.ListPodSandboxStatsResponse, error) {
	resp := &runtime.ListPodSandboxStatsResponse{Stats: []*runtime.PodSandboxStats{}}
	err := s.eachPodStats(ctx, req.GetFilter(), func(st *runtime.PodSandboxStats) error {
		resp.Stats = append(resp.Stats, st)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// eachPodStats samples the pods matching f one by one, for
// ListPodSandboxStats and StreamPodSandboxStats; it stops at the first
// error of fn or of ctx.
func (s *Service) eachPodStats(ctx context.Context, f *runtime.PodSandboxStatsFilter, fn func(*runtime.PodSandboxStats) error) error {
	ctrs := s.containersByPod()
	for sb := range s.sandboxes.All() {
		if !strings.HasPrefix(sb.ID, f.GetId()) || !matchLabels(sb.Config.GetLabels(), f.GetLabelSelector()) {
			continue
		}
		st, err := s.podStats(ctx, sb, ctrs[sb.ID])
		if err != nil {
			if ctx.Err() != nil {
				return toStatus(ctx.Err())
			}
			s.log.Warn("pod stats", "pod", sb.ID, "err", err)
			continue
		}
		if err := fn(st); err != nil {
			return err
		}
	}
	return nil
}
