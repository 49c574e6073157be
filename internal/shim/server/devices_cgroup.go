package server

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// keepDevicesCgroup moves a container's init back into its own v1 devices
// cgroup when systemd moved it up to the parent slice's. systemd (seen
// with 252 on a v1 hybrid host, runc --systemd-cgroup) does that to the
// first scope with a device policy below a slice whose parent had none:
// realising the devices controller up the tree migrates the slice's
// processes into the slice's devices cgroup, where no device rules apply
// and where runc kill --all no longer finds them. The scope's devices
// cgroup, with runc's rules, is where the process belongs: the scope's
// name=systemd cgroup names it. Nothing happens on v2 (no devices
// hierarchy) or when the paths already agree.
func keepDevicesCgroup(pid int) (moved bool, err error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		return false, err
	}
	target, ok := devicesTarget(data)
	if !ok {
		return false, nil
	}
	dir := filepath.Join("/sys/fs/cgroup/devices", target)
	if _, err := os.Stat(dir); err != nil {
		return false, nil
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
		return false, err
	}
	return true, nil
}

// devicesTarget is the devices cgroup a process listed by data should
// be in and is not: its name=systemd scope, when its devices cgroup is an
// ancestor of that scope.
func devicesTarget(data []byte) (string, bool) {
	named, devices := v1Paths(data)
	if named == "" || devices == "" || named == devices || !strings.HasSuffix(named, ".scope") {
		return "", false
	}
	// Only a move down into the process's own scope, never elsewhere.
	if !strings.HasPrefix(named, strings.TrimSuffix(devices, "/")+"/") {
		return "", false
	}
	return named, true
}

// v1Paths returns the name=systemd and devices paths of a
// /proc/<pid>/cgroup listing.
func v1Paths(data []byte) (named, devices string) {
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			switch c {
			case "name=systemd":
				named = parts[2]
			case "devices":
				devices = parts[2]
			}
		}
	}
	return named, devices
}
