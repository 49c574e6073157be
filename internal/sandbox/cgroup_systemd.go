package sandbox

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/containerd/cgroups/v3"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/berthcri/berth/internal/cgroupplan"
	"github.com/berthcri/berth/internal/systemd"
)

// The pod cgroup under either driver. cgroupfs: a directory pod-<id> below
// the parent in every hierarchy, made and removed by berth. systemd: a
// transient slice unit <parent>-berthpod_<id>.slice that systemd makes and
// removes; berth asks over D-Bus and records the cgroup systemd chose
// (Sandbox.CgroupParent) next to the unit name (Sandbox.CgroupUnit).

// podCgroupName names pod id's cgroup for the configured driver before
// anything exists: the unit (systemd) or the cgroupfs path.
func (s *Store) podCgroupName(configParent, id string) (unit, path string, err error) {
	if s.opts.Systemd == nil {
		path, err = podCgroupPath(configParent, s.opts.CgroupParent, id)
		return "", path, err
	}
	if configParent == "" {
		configParent = s.opts.CgroupParent
	}
	unit, err = systemd.PodSlice(configParent, id)
	return unit, "", err
}

// createPodCgroup makes the pod cgroup r names: as plan says under
// cgroupfs (the pod cgroup and, when the pod runs berth-pause, the
// holder's cgroup below it: cgroupplan); under systemd the pod slice,
// recording the cgroup path systemd gave it.
func (s *Store) createPodCgroup(ctx context.Context, r *entry, plan *cgroupplan.Plan) error {
	if r.sb.CgroupUnit == "" {
		return s.createCgroups(*plan)
	}
	v2 := cgroups.Mode() == cgroups.Unified
	if err := s.opts.Systemd.StartSlice(ctx, r.sb.CgroupUnit, systemd.PodSliceProperties(r.sb.ID, v2)); err != nil {
		return fmt.Errorf("create pod slice: %w", err)
	}
	path, err := s.opts.Systemd.ControlGroup(ctx, r.sb.CgroupUnit, "Slice")
	if err != nil {
		return fmt.Errorf("create pod slice: %w", err)
	}
	r.sb.CgroupParent = path
	return nil
}

// joinPodCgroup moves the pod's pause holder into its own cgroup below the
// pod cgroup (never the pod cgroup itself: on cgroup v2 a cgroup with a
// process cannot have containers below it): plan's holder cgroup,
// <pod>/berth-pause, under cgroupfs, the scope berth-pause-<id>.scope in
// the pod slice under systemd.
func (s *Store) joinPodCgroup(ctx context.Context, r *entry, plan *cgroupplan.Plan, pid int) error {
	if r.sb.CgroupUnit == "" {
		h, ok := plan.Holder()
		if !ok {
			return fmt.Errorf("pod cgroup plan has no holder cgroup:\n%s", plan)
		}
		return joinCgroup(h.Path, pid)
	}
	if err := s.opts.Systemd.StartScope(ctx, cgroupplan.HolderScope(r.sb.ID), r.sb.CgroupUnit, pid); err != nil {
		return fmt.Errorf("move pause process into the pod slice: %w", err)
	}
	return nil
}

// removePodCgroup removes the pod cgroup; stopping a slice stops every
// scope in it. What is already gone is fine.
func (s *Store) removePodCgroup(ctx context.Context, unit, path string) error {
	if unit == "" {
		return removeCgroup(path)
	}
	if s.opts.Systemd == nil {
		return fmt.Errorf("pod slice %s was made by the systemd cgroup driver; berth now runs with cgroupfs and cannot stop it", unit)
	}
	if err := s.opts.Systemd.Stop(ctx, unit); err != nil {
		return err
	}
	// On cgroup v1 systemd removes the slice only from the hierarchies it
	// manages; runc made the slice's directory in the others (cpuset,
	// freezer, net_cls …) as the parent of its scopes. Those go here, as
	// the kubelet's own systemd cgroup manager removes them.
	return removeCgroup(path)
}

// updatePodCgroup applies pod-level limits: as slice properties under
// systemd (writing the files behind systemd's back would be undone on its
// next reload), straight to the cgroup files under cgroupfs.
func (s *Store) updatePodCgroup(ctx context.Context, r *entry, res *specs.LinuxResources) error {
	if r.sb.CgroupUnit == "" {
		return updateCgroup(r.sb.CgroupParent, res)
	}
	if s.opts.Systemd == nil {
		return fmt.Errorf("pod slice %s was made by the systemd cgroup driver; berth now runs with cgroupfs", r.sb.CgroupUnit)
	}
	props, left, err := systemd.ResourceProperties(res, cgroups.Mode() == cgroups.Unified)
	if err != nil {
		return err
	}
	if len(left) > 0 {
		s.log.Warn("pod limits without a systemd property are not applied to the pod slice", "pod", r.sb.ID, "unit", r.sb.CgroupUnit, "limits", strings.Join(left, ", "))
	}
	return s.opts.Systemd.SetProperties(ctx, r.sb.CgroupUnit, props)
}

// cleanOrphanSlices stops the pod slices below the default parent that
// no sandbox owns, unless a process still runs in one.
func (s *Store) cleanOrphanSlices(ctx context.Context, known map[string]bool) {
	parent, err := systemd.ParentSlice(s.opts.CgroupParent)
	if err != nil {
		return
	}
	prefix := strings.TrimSuffix(parent, ".slice") + "-" + systemd.PodSlicePrefix
	if parent == "-.slice" {
		prefix = systemd.PodSlicePrefix
	}
	units, err := s.opts.Systemd.List(ctx, []string{prefix + "*.slice"})
	if err != nil {
		s.log.Warn("list pod slices", "err", err)
		return
	}
	for _, unit := range units {
		id, ok := systemd.PodFromSlice(parent, unit)
		if !ok || known[id] {
			continue
		}
		path, err := s.opts.Systemd.ControlGroup(ctx, unit, "Slice")
		if err == nil {
			busy := false
			for _, h := range cgroupHierarchies() {
				busy = busy || cgroupHasProcesses(filepath.Join(h.Path, path))
			}
			if busy {
				s.log.Warn("a pod slice without a sandbox still has processes; leaving it", "pod", id, "unit", unit)
				continue
			}
		}
		s.log.Warn("stopping a pod slice without a sandbox", "pod", id, "unit", unit)
		if err := s.removePodCgroup(ctx, unit, path); err != nil {
			s.log.Warn("stop orphan pod slice", "pod", id, "unit", unit, "err", err)
		}
	}
}
