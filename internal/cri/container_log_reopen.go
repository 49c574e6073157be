package cri

import (
	"context"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// ReopenContainerLog makes the node's monitor reopen the container's log
// file after the kubelet rotated it. The container must be running.
func (s *Service) ReopenContainerLog(ctx context.Context, req *runtime.ReopenContainerLogRequest) (*runtime.ReopenContainerLogResponse, error) {
	if req.GetContainerId() == "" {
		return nil, invalidArgument("ReopenContainerLog: container ID is required")
	}
	if err := s.containers.ReopenLog(ctx, req.GetContainerId()); err != nil {
		return nil, toStatus(err)
	}
	return &runtime.ReopenContainerLogResponse{}, nil
}
