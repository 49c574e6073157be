package cri

import (
	"context"
	"encoding/json"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// ContainerStatus reports a container: state, times, exit code and reason,
// image, mounts, log path, resources and user. Verbose adds the record.
func (s *Service) ContainerStatus(ctx context.Context, req *runtime.ContainerStatusRequest) (*runtime.ContainerStatusResponse, error) {
	if req.GetContainerId() == "" {
		return nil, invalidArgument("ContainerStatus: container ID is required")
	}
	c, err := s.containers.Get(req.GetContainerId())
	if err != nil {
		return nil, toStatus(err)
	}
	resp := &runtime.ContainerStatusResponse{Status: criContainerStatus(c)}
	if req.GetVerbose() {
		info, _ := json.Marshal(c)
		resp.Info = map[string]string{"info": string(info)}
	}
	return resp, nil
}
