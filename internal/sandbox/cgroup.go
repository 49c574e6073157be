package sandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthcri/berth/internal/cgroupctrl"
	"github.com/berthcri/berth/internal/errdefs"
)

const cgroupRoot = "/sys/fs/cgroup"

// podCgroupPath is the pod's own cgroupfs path: a child named after the pod
// under the config's parent, or under berth's default parent. A systemd
// slice spelling ("kubepods-burstable-pod1.slice") is expanded into the
// cgroupfs path systemd itself would use.
func podCgroupPath(parent, defaultParent, id string) (string, error) {
	if parent == "" {
		parent = defaultParent
	}
	if strings.HasSuffix(parent, ".slice") && !strings.Contains(parent, "/") {
		expanded, err := expandSlice(parent)
		if err != nil {
			return "", err
		}
		parent = expanded
	}
	parent = filepath.Clean("/" + parent)
	if strings.Contains(parent, "..") {
		return "", fmt.Errorf("cgroup parent %q: %w", parent, errdefs.ErrInvalidArgument)
	}
	return filepath.Join(parent, "pod-"+id), nil
}

// expandSlice turns "a-b-c.slice" into "/a.slice/a-b.slice/a-b-c.slice".
func expandSlice(slice string) (string, error) {
	name := strings.TrimSuffix(slice, ".slice")
	if name == "" || strings.HasPrefix(name, "-") || strings.HasSuffix(name, "-") || strings.Contains(name, "--") {
		return "", fmt.Errorf("cgroup parent %q is not a valid systemd slice: %w", slice, errdefs.ErrInvalidArgument)
	}
	if name == "-" {
		return "/", nil
	}
	var path, prefix string
	for _, part := range strings.Split(name, "-") {
		prefix += part
		path += "/" + prefix + ".slice"
		prefix += "-"
	}
	return path, nil
}

// cgroupHierarchies lists the mounted hierarchies (from mountinfo, not
// from directory names): the unified root on cgroup v2, every v1
// controller (and named) hierarchy otherwise.
func cgroupHierarchies() []cgroupctrl.Hierarchy {
	hs, err := cgroupctrl.Hierarchies("", cgroupRoot)
	if err != nil {
		return nil
	}
	return hs
}

// createCgroup makes the pod cgroup in every hierarchy. cpuset needs its
// cpus and mems filled at every new level before anything can join.
func createCgroup(path string) error {
	for _, h := range cgroupHierarchies() {
		if err := os.MkdirAll(filepath.Join(h.Path, path), 0o755); err != nil {
			return fmt.Errorf("create cgroup %s in %s: %w", path, h.Path, err)
		}
		if slices.Contains(h.Controllers, "cpuset") {
			if err := fillCpuset(h.Path, path); err != nil {
				return err
			}
		}
	}
	return nil
}

func fillCpuset(root, path string) error {
	dir := root
	for _, part := range strings.Split(strings.Trim(path, "/"), "/") {
		parent := dir
		dir = filepath.Join(dir, part)
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			cur, err := os.ReadFile(filepath.Join(dir, f))
			if err != nil {
				return fmt.Errorf("read %s: %w", filepath.Join(dir, f), err)
			}
			if strings.TrimSpace(string(cur)) != "" {
				continue
			}
			val, err := os.ReadFile(filepath.Join(parent, f))
			if err != nil {
				return fmt.Errorf("read %s: %w", filepath.Join(parent, f), err)
			}
			if err := os.WriteFile(filepath.Join(dir, f), val, 0o644); err != nil {
				return fmt.Errorf("fill %s: %w", filepath.Join(dir, f), err)
			}
		}
	}
	return nil
}

// joinCgroup moves pid into the pod cgroup in every hierarchy.
func joinCgroup(path string, pid int) error {
	for _, h := range cgroupHierarchies() {
		f := filepath.Join(h.Path, path, "cgroup.procs")
		if err := os.WriteFile(f, []byte(strconv.Itoa(pid)), 0o644); err != nil {
			return fmt.Errorf("join %s: %w", f, err)
		}
	}
	return nil
}

// removeCgroup removes the pod cgroup (and anything left below it) from
// every hierarchy; absent is fine. EBUSY is retried briefly: exiting
// processes leave their cgroup a moment after they die.
func removeCgroup(path string) error {
	if path == "" || path == "/" {
		return nil
	}
	var errs []error
	for _, h := range cgroupHierarchies() {
		top := filepath.Join(h.Path, path)
		var dirs []string
		_ = filepath.WalkDir(top, func(p string, e os.DirEntry, err error) error {
			if err == nil && e.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			var err error
			for try := 0; try < 50; try++ {
				if err = unix.Rmdir(dirs[i]); err == nil || errors.Is(err, unix.ENOENT) {
					err = nil
					break
				}
				if !errors.Is(err, unix.EBUSY) {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("remove cgroup %s: %w", dirs[i], err))
			}
		}
	}
	return errors.Join(errs...)
}
