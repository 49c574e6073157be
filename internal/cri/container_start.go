package cri

import (
	"context"
	"fmt"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/container"
	"github.com/berthcri/berth/internal/errdefs"
)

// StartContainer starts a created container; any other state is
// FailedPrecondition. NRI plugins hear of it just before the process
// starts (a plugin error fails the start) and again once it runs.
func (s *Service) StartContainer(ctx context.Context, req *runtime.StartContainerRequest) (*runtime.StartContainerResponse, error) {
	if req.GetContainerId() == "" {
		return nil, invalidArgument("StartContainer: container ID is required")
	}
	c, err := s.containers.Get(req.GetContainerId())
	if err != nil {
		return nil, toStatus(err)
	}
	if c.State != container.StateCreated {
		return nil, toStatus(fmt.Errorf("container %s is %s, not created: %w", c.ID, c.State, errdefs.ErrFailedPrecondition))
	}
	if err := s.nri.StartContainer(ctx, c); err != nil {
		logNRI(s.log, s.nri.StopContainer(context.WithoutCancel(ctx), c), c.PodID, c.ID)
		return nil, toStatus(err)
	}
	started, err := s.containers.Start(ctx, c.ID)
	if err != nil {
		if cur, gerr := s.containers.Get(c.ID); gerr == nil {
			c = cur
		}
		logNRI(s.log, s.nri.StopContainer(context.WithoutCancel(ctx), c), c.PodID, c.ID)
		return nil, toStatus(err)
	}
	s.nri.PostStartContainer(ctx, started)
	return &runtime.StartContainerResponse{}, nil
}
