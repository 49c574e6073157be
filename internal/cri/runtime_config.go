package cri

import (
	"context"
	"os"

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

// CgroupDriver resolves the configured driver: an explicit choice wins,
// otherwise systemd when systemd is PID 1 (it creates /run/systemd/system),
// cgroupfs elsewhere.
func CgroupDriver(configured string) string {
	if configured != "" {
		return configured
	}
	if fi, err := os.Stat("/run/systemd/system"); err == nil && fi.IsDir() {
		return "systemd"
	}
	return "cgroupfs"
}
