package cri

import (
	"context"
	"strings"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// ListPodSandbox lists sandboxes, filtered by ID prefix, state and labels.
func (s *Service) ListPodSandbox(ctx context.Context, req *runtime.ListPodSandboxRequest) (*runtime.ListPodSandboxResponse, error) {
	f := req.GetFilter()
	resp := &runtime.ListPodSandboxResponse{}
	for _, sb := range s.sandboxes.List() {
		if f.GetId() != "" && !strings.HasPrefix(sb.ID, f.GetId()) {
			continue
		}
		if f.GetState() != nil && f.GetState().GetState() != sb.State {
			continue
		}
		if !sandboxLabelsMatch(sb.Config.GetLabels(), f.GetLabelSelector()) {
			continue
		}
		resp.Items = append(resp.Items, &runtime.PodSandbox{
			Id:             sb.ID,
			Metadata:       sb.Config.GetMetadata(),
			State:          sb.State,
			CreatedAt:      sb.CreatedAt.UnixNano(),
			Labels:         sb.Config.GetLabels(),
			Annotations:    sb.Config.GetAnnotations(),
			RuntimeHandler: sb.RuntimeHandler,
		})
	}
	return resp, nil
}

// sandboxLabelsMatch reports whether every selector pair is among labels.
func sandboxLabelsMatch(labels, selector map[string]string) bool {
	for k, v := range selector {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}
