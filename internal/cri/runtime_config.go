package cri

import (
	"context"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// RuntimeConfig tells the kubelet which cgroup driver berth uses, so both
// agree on how pod cgroup parents are spelled.
func (s *Service) RuntimeConfig(ctx context.Context, req *runtime.RuntimeConfigRequest) (*runtime.RuntimeConfigResponse, error) {
	driver := runtime.CgroupDriver_CGROUPFS
	if CgroupDriver(s.cfg.CgroupDriver) == "systemd" {
		driver = runtime.CgroupDriver_SYSTEMD
	}
	return &runtime.RuntimeConfigResponse{
		Linux: &runtime.LinuxRuntimeConfiguration{CgroupDriver: driver},
	}, nil
}

// CgroupDriver resolves the configured driver: an explicit choice wins;
// otherwise cgroupfs. Detecting systemd and switching by itself would
// change how pod cgroup parents must be spelled under a kubelet set up for
// cgroupfs; the kubelet reads the driver through RuntimeConfig.
func CgroupDriver(configured string) string {
	if configured != "" {
		return configured
	}
	return "cgroupfs"
}
