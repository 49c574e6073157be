package cri

import (
	"context"
	"fmt"

	"google.golang.org/protobuf/proto"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/container"
	"github.com/berthcri/berth/internal/errdefs"
)

// Exec returns a streaming URL for an interactive command in a running
// container; the command runs when the client connects.
func (s *Service) Exec(ctx context.Context, req *runtime.ExecRequest) (*runtime.ExecResponse, error) {
	if req.GetContainerId() == "" {
		return nil, invalidArgument("Exec: container_id is required")
	}
	if len(req.GetCmd()) == 0 {
		return nil, invalidArgument("Exec: cmd is required")
	}
	id, err := s.runningContainer(req.GetContainerId())
	if err != nil {
		return nil, err
	}
	r := proto.Clone(req).(*runtime.ExecRequest)
	r.ContainerId = id
	return s.streaming.GetExec(r)
}

// runningContainer resolves an ID (or unique prefix) to a running
// container's full ID: NotFound or FailedPrecondition otherwise.
func (s *Service) runningContainer(id string) (string, error) {
	c, err := s.containers.Get(id)
	if err != nil {
		return "", toStatus(err)
	}
	if c.State != container.StateRunning {
		return "", toStatus(fmt.Errorf("container %s is %s, not running: %w", c.ID, c.State, errdefs.ErrFailedPrecondition))
	}
	return c.ID, nil
}
