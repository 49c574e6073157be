package cri

import (
	"context"

	"google.golang.org/protobuf/proto"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Attach returns a streaming URL attached to a running container's stdio.
func (s *Service) Attach(ctx context.Context, req *runtime.AttachRequest) (*runtime.AttachResponse, error) {
	if req.GetContainerId() == "" {
		return nil, invalidArgument("Attach: container_id is required")
	}
	id, err := s.runningContainer(req.GetContainerId())
	if err != nil {
		return nil, err
	}
	r := proto.Clone(req).(*runtime.AttachRequest)
	r.ContainerId = id
	return s.streaming.GetAttach(r)
}
