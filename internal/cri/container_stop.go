package cri

import (
	"context"
	"time"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/container"
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
	before, getErr := s.containers.Get(req.GetContainerId())
	if err := s.containers.Stop(ctx, req.GetContainerId(), time.Duration(req.GetTimeout())*time.Second); err != nil {
		return nil, toStatus(err)
	}
	if getErr == nil && before.State != container.StateExited {
		if c, err := s.containers.Get(before.ID); err == nil {
			s.publishContainerEvent(c, runtime.ContainerEventType_CONTAINER_STOPPED_EVENT)
		}
	}
	return &runtime.StopContainerResponse{}, nil
}
