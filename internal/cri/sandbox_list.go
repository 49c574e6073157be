package cri

import (
	"context"
	"strings"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/sandbox"
)

// ListPodSandbox lists sandboxes, filtered by ID prefix, state and labels.
func (s *Service) ListPodSandbox(ctx context.Context, req *runtime.ListPodSandboxRequest) (*runtime.ListPodSandboxResponse, error) {
	resp := &runtime.ListPodSandboxResponse{}
	for sb := range s.sandboxes.All() {
		if sandboxMatches(req.GetFilter(), sb) {
			resp.Items = append(resp.Items, criPodSandbox(sb))
		}
	}
	return resp, nil
}

// sandboxMatches is ListPodSandbox's and StreamPodSandboxes' filter.
func sandboxMatches(f *runtime.PodSandboxFilter, sb *sandbox.Sandbox) bool {
	switch {
	case f.GetId() != "" && !strings.HasPrefix(sb.ID, f.GetId()),
		f.GetState() != nil && f.GetState().GetState() != sb.State:
		return false
	}
	return matchLabels(sb.Config.GetLabels(), f.GetLabelSelector())
}

func criPodSandbox(sb *sandbox.Sandbox) *runtime.PodSandbox {
	return &runtime.PodSandbox{
		Id:             sb.ID,
		Metadata:       sb.Config.GetMetadata(),
		State:          sb.State,
		CreatedAt:      sb.CreatedAt.UnixNano(),
		Labels:         sb.Config.GetLabels(),
		Annotations:    sb.Config.GetAnnotations(),
		RuntimeHandler: sb.RuntimeHandler,
	}
}
