package berthdtest

import "testing"

// A cgroup parent that names no cgroup below the roots lists none: the
// roots would make killProcesses kill every process on the machine.
func TestCgroupDirsRefusesTheRoots(t *testing.T) {
	for _, parent := range []string{"", "/", ".", "..", "../x", "a/../..", "//"} {
		if dirs := cgroupDirs(parent); len(dirs) != 0 {
			t.Errorf("cgroupDirs(%q) = %v, want none", parent, dirs)
		}
	}
}
