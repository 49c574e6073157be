package cri

import (
	"context"
	"encoding/json"
	"strconv"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// ContainerStatus reports a container: state, times, exit code and reason,
// image, mounts, log path, resources and user. Verbose adds the record and
// the CRI log records the monitor could not write, if any.
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
		// What only the monitor knows: CRI log records it could not write.
		// Best effort: no monitor may serve an exited container's pod any
		// more.
		if st, err := s.containers.ShimState(ctx, c.ID); err == nil && st.LogWriteErrors > 0 {
			resp.Info["logWriteErrors"] = strconv.FormatUint(st.LogWriteErrors, 10)
			resp.Info["logWriteError"] = st.LogWriteError
		}
	}
	return resp, nil
}
