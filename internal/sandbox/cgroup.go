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

	"github.com/containerd/cgroups/v3"
	"golang.org/x/sys/unix"

	"github.com/berthcri/berth/internal/cgroupctrl"
	"github.com/berthcri/berth/internal/cgroupplan"
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

// cgroupfsPlan is the cgroupfs driver's plan for pod id, whose cgroup is
// pod, on this host: which cgroups berth makes, where the holder sits and,
// on cgroup v2, which controllers are enabled on the way down (every one
// the root offers, as runc does).
func cgroupfsPlan(id, pod string, holder bool) cgroupplan.Plan {
	in := cgroupplan.Input{V2: cgroups.Mode() == cgroups.Unified, PodID: id, Pod: pod, Holder: holder}
	if in.V2 {
		b, _ := os.ReadFile(filepath.Join(cgroupRoot, "cgroup.controllers"))
		in.Controllers = strings.Fields(string(b))
	}
	return cgroupplan.Pod(in)
}

// createCgroups makes the cgroups plan says berth makes (the pod cgroup,
// the holder's) in every hierarchy. v1: cpuset needs its cpus and mems
// filled at every new level before anything can join. v2: the controllers
// are enabled in cgroup.subtree_control from the root down to the pod
// cgroup, so the pod cgroup has its limit and stat files before any
// container exists (runc does the same for a container's ancestors).
func (s *Store) createCgroups(plan cgroupplan.Plan) error {
	if err := plan.Check(); err != nil {
		return fmt.Errorf("pod cgroup layout: %w", err)
	}
	for _, h := range cgroupHierarchies() {
		for _, c := range plan.Made() {
			if err := os.MkdirAll(filepath.Join(h.Path, c.Path), 0o755); err != nil {
				return fmt.Errorf("create cgroup %s in %s: %w", c.Path, h.Path, err)
			}
			if slices.Contains(h.Controllers, "cpuset") {
				if err := fillCpuset(h.Path, c.Path); err != nil {
					return err
				}
			}
		}
		if !plan.V2 {
			continue
		}
		for _, c := range plan.Cgroups {
			if len(c.Enable) == 0 {
				continue
			}
			err := cgroupctrl.EnableControllers(filepath.Join(h.Path, c.Path), c.Enable)
			switch {
			case err != nil && c.MadeBy == cgroupplan.Berth:
				return err
			case err != nil:
				// A level above the pod that berth does not own (a
				// kubelet parent, a delegated subtree): runc tries it
				// too and ignores failure; what is missing shows in the
				// pod cgroup's cgroup.controllers.
				s.log.Warn("enable cgroup controllers", "cgroup", c.Path, "err", err)
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

// joinCgroup moves pid into the cgroup at path in every hierarchy.
func joinCgroup(path string, pid int) error {
	for _, h := range cgroupHierarchies() {
		f := filepath.Join(h.Path, path, "cgroup.procs")
		if err := os.WriteFile(f, []byte(strconv.Itoa(pid)), 0o644); err != nil {
			return fmt.Errorf("join %s: %w", f, err)
		}
	}
	return nil
}

// removeCgroup removes the pod cgroup and everything below it (the
// holder's cgroup, containers' cgroups runc left) from every hierarchy,
// children first; absent is fine. A pod made by an older berthd, with its
// holder in the pod cgroup itself, goes the same way. EBUSY is retried briefly: exiting
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
