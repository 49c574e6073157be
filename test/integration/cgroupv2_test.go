package integration

import "path/filepath"

// cgroupDir is group's directory for controller: in that controller's v1
// hierarchy, or in the unified hierarchy on v2 (the guest lane,
// docs/decisions/2200-cgroup-v2-guest-lane.md).
func cgroupDir(controller, group string) string {
	if cgroupV2() {
		return filepath.Join("/sys/fs/cgroup", group)
	}
	return filepath.Join("/sys/fs/cgroup", controller, group)
}
