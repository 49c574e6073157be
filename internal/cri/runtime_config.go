package cri

import (
	"context"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// RuntimeConfig tells the kubelet which cgroup driver berth uses, so both
// agree on how pod cgroup parents are spelled. The driver is the
// config's, which validation made explicit (an empty cgroup_driver is
// cgroupfs: detecting systemd and switching by itself would change how pod
// cgroup parents must be spelled under a kubelet set up for cgroupfs).
func (s *Service) RuntimeConfig(ctx context.Context, req *runtime.RuntimeConfigRequest) (*runtime.RuntimeConfigResponse, error) {
	driver := runtime.CgroupDriver_CGROUPFS
	if s.live.Load().Config.CgroupDriver == "systemd" {
		driver = runtime.CgroupDriver_SYSTEMD
	}
	return &runtime.RuntimeConfigResponse{
		Linux: &runtime.LinuxRuntimeConfiguration{CgroupDriver: driver},
	}, nil
}
