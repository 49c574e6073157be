package stats

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/berthcri/berth/internal/errdefs"
)

// ProcessGroup is the cgroup process pid is in, read from
// <procRoot>/<pid>/cgroup, as a path below the hierarchy roots. It is how a
// systemd scope's real place is found: systemd may run below the root of
// the hierarchy (in a container), where expanding slice names guesses
// wrong.
func ProcessGroup(procRoot string, pid int) (string, error) {
	data, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "cgroup"))
	if err != nil {
		if os.IsNotExist(err) {
			return "", fmt.Errorf("process %d: %w", pid, errdefs.ErrNotFound)
		}
		return "", fmt.Errorf("read cgroup of process %d: %w", pid, err)
	}
	return GroupFromProcCgroup(data)
}

// GroupFromProcCgroup picks one path from a /proc/<pid>/cgroup listing:
// on cgroup v1 (and hybrid) the name=systemd hierarchy's, which systemd
// mirrors in every controller it manages, else the memory controller's;
// on v2 the unified one ("0::/path").
func GroupFromProcCgroup(data []byte) (string, error) {
	var named, memory, unified string
	v1 := false
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case parts[0] == "0" && parts[1] == "":
			unified = parts[2]
		case parts[1] == "name=systemd":
			v1, named = true, parts[2]
		default:
			v1 = true
			for _, c := range strings.Split(parts[1], ",") {
				if c == "memory" {
					memory = parts[2]
				}
			}
		}
	}
	var p string
	switch {
	case named != "":
		p = named
	case memory != "":
		p = memory
	case !v1:
		p = unified
	}
	if p == "" || !strings.HasPrefix(p, "/") {
		return "", fmt.Errorf("no usable cgroup in %q: %w", data, errdefs.ErrNotFound)
	}
	// A cgroup whose last process left shows as "/path (deleted)".
	p = strings.TrimSuffix(p, " (deleted)")
	return filepath.Clean(p), nil
}

// initRoots maps each v1 hierarchy named in a /proc/<pid>/cgroup listing
// (controllers, and "systemd" for name=systemd) to the process's path in
// it, with systemd's own "/init.scope" removed: read for PID 1, that is
// where systemd roots its units in each hierarchy.
func initRoots(data []byte) map[string]string {
	roots := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 || parts[1] == "" {
			continue
		}
		p := strings.TrimSuffix(filepath.Clean(parts[2]), "/init.scope")
		if p == "" {
			p = "/"
		}
		for _, c := range strings.Split(parts[1], ",") {
			roots[strings.TrimPrefix(c, "name=")] = p
		}
	}
	return roots
}

// systemdV1Path is where group, a cgroup systemd made as it names it (its
// path in the name=systemd hierarchy), lives in v1 hierarchy controller.
// systemd puts a unit at the same path below its root in every hierarchy,
// and its roots differ when it runs in a container that placed it
// differently per controller. ok is false when group is not below
// systemd's root.
func systemdV1Path(group, controller string, roots map[string]string) (string, bool) {
	base, ok := roots["systemd"]
	root, ok2 := roots[controller]
	if !ok || !ok2 {
		return "", false
	}
	rel, ok := strings.CutPrefix(group, base)
	if base == "/" {
		rel, ok = group, true
	}
	if !ok || (rel != "" && !strings.HasPrefix(rel, "/")) {
		return "", false
	}
	return filepath.Join(root, rel), true
}
