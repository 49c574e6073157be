package monitor

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// procCgroups are the cgroup paths of one process that the monitor needs,
// parsed from one read of /proc/<pid>/cgroup.
type procCgroups struct {
	memory  string // v1 memory hierarchy path
	named   string // v1 name=systemd path
	devices string // v1 devices path
	unified string // the v2 (unified) path
}

// readProcCgroups reads and parses /proc/<pid>/cgroup. It allocates only
// the paths it returns: the monitor runs no GC until garbage piles up, so
// every create's garbage stays resident until then (decision 0303).
func readProcCgroups(pid int) (procCgroups, error) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		return procCgroups{}, err
	}
	defer f.Close()
	var buf [4096]byte
	n := 0
	for n < len(buf) {
		m, err := f.Read(buf[n:])
		n += m
		if err != nil || m == 0 {
			break
		}
	}
	return parseProcCgroups(buf[:n]), nil
}

func parseProcCgroups(data []byte) procCgroups {
	var pc procCgroups
	for len(data) > 0 {
		line := data
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			line, data = data[:i], data[i+1:]
		} else {
			data = nil
		}
		// hierarchy-ID:controller-list:path
		i := bytes.IndexByte(line, ':')
		if i < 0 {
			continue
		}
		j := bytes.IndexByte(line[i+1:], ':')
		if j < 0 {
			continue
		}
		id, ctls, path := line[:i], line[i+1:i+1+j], line[i+2+j:]
		if string(id) == "0" && len(ctls) == 0 {
			pc.unified = string(path)
			continue
		}
		for len(ctls) > 0 {
			c := ctls
			if k := bytes.IndexByte(ctls, ','); k >= 0 {
				c, ctls = ctls[:k], ctls[k+1:]
			} else {
				ctls = nil
			}
			switch string(c) {
			case "memory":
				pc.memory = string(path)
			case "name=systemd":
				pc.named = string(path)
			case "devices":
				pc.devices = string(path)
			}
		}
	}
	return pc
}

// memoryDir is the process's memory cgroup directory: the v1 memory
// hierarchy's, or the unified one on v2.
func (pc procCgroups) memoryDir() string {
	if pc.memory != "" {
		return filepath.Join("/sys/fs/cgroup/memory", pc.memory)
	}
	if pc.unified != "" {
		return filepath.Join("/sys/fs/cgroup", pc.unified)
	}
	return ""
}

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
func keepDevicesCgroup(pid int, pc procCgroups) (moved bool, err error) {
	target, ok := devicesTarget(pc)
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

// devicesTarget is the devices cgroup a process should be in and is not:
// its name=systemd scope, when its devices cgroup is an ancestor of that
// scope.
func devicesTarget(pc procCgroups) (string, bool) {
	named, devices := pc.named, pc.devices
	if named == "" || devices == "" || named == devices || !strings.HasSuffix(named, ".scope") {
		return "", false
	}
	// Only a move down into the process's own scope, never elsewhere.
	if !strings.HasPrefix(named, strings.TrimSuffix(devices, "/")+"/") {
		return "", false
	}
	return named, true
}
