package cri

import (
	"context"
	"time"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// StopContainer sends the stop signal, waits timeout seconds, then
// SIGKILLs. Stopping an exited or unknown container succeeds.
func (s *Service) StopContainer(ctx context.Context, req *runtime.StopContainerRequest) (*runtime.StopContainerResponse, error) {
	if req.GetContainerId() == "" {
		return nil, invalidArgument("StopContainer: container ID is required")
	}
	if req.GetTimeout() < 0 {
		return nil, invalidArgument("StopContainer: timeout %d is negative", req.GetTimeout())
	}
	if err := s.lifecycle.StopContainer(ctx, req.GetContainerId(), time.Duration(req.GetTimeout())*time.Second); err != nil {
		return nil, toStatus(err)
	}
	return &runtime.StopContainerResponse{}, nil
}
