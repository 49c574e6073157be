package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/containerd/cgroups/v3"
	"github.com/containerd/cgroups/v3/cgroup1"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/errdefs"
)

// UpdateResources applies new pod-level limits (res, in runtime-spec form;
// nil changes nothing) to the pod's own cgroup, which holds every
// container of the pod, and records the CRI values for the pod's view.
func (s *Store) UpdateResources(ctx context.Context, id string, res *specs.LinuxResources, overhead, resources *runtime.LinuxContainerResources) error {
	r, err := s.lookup(id)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.removed {
		return fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	if res != nil {
		if s.opts.Cgroups != nil {
			s.opts.Cgroups.Drop(res)
		}
		if err := s.updatePodCgroup(ctx, r, res); err != nil {
			return fmt.Errorf("update resources of pod %s: %w", r.sb.ID, err)
		}
	}
	if overhead != nil {
		r.sb.Overhead = overhead
	}
	if resources != nil {
		r.sb.Resources = resources
	}
	r.publish()
	s.log.Info("pod resources updated", "pod", r.sb.ID, "cgroup", r.sb.CgroupParent)
	return nil
}

// updateCgroup writes res to the cgroup at path (cgroupfs, below the
// hierarchy roots) on whichever cgroup version the host runs.
func updateCgroup(path string, res *specs.LinuxResources) error {
	if path == "" {
		return fmt.Errorf("pod has no cgroup: %w", errdefs.ErrFailedPrecondition)
	}
	if cgroups.Mode() == cgroups.Unified {
		dir := filepath.Join(cgroupRoot, path)
		if _, err := os.Stat(dir); err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("cgroup %s: %w", path, errdefs.ErrNotFound)
			}
			return fmt.Errorf("cgroup %s: %w", path, err)
		}
		// Not the cgroups library's conversion: it writes "-1" quotas
		// and negative swap limits the kernel refuses, skips a quota
		// without a period and drops the unified map (MemoryQoS's
		// memory.high, LimitedSwap's memory.swap.max).
		return writeV2(dir, res)
	}
	cg, err := cgroup1.Load(cgroup1.StaticPath(path))
	if err != nil {
		if errors.Is(err, cgroup1.ErrCgroupDeleted) || errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("cgroup %s: %w", path, errdefs.ErrNotFound)
		}
		return fmt.Errorf("load cgroup %s: %w", path, err)
	}
	return cg.Update(res)
}
