package container

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"

	"github.com/berthcri/berth/internal/shim"
)

// What a restarted berthd finds without a record: a create cut short by
// a crash leaves a container directory (with its mounts), image leases,
// and maybe a container in the pod on the node's monitor, or a pod there
// holding nothing.

// removeUnrecorded undoes what a create that died before its record left
// in dir: every mount, then the directory. It reports whether dir is gone;
// it is kept when a mount would not come off.
func (s *Store) removeUnrecorded(dir string, cause error) bool {
	s.log.Warn("container dir without a valid record; removing", "dir", dir, "err", cause)
	if err := s.mounts.Unmount(dir); err != nil {
		// Never remove through an attached copy of a host path.
		s.log.Warn("container dir keeps mounts; not removed", "dir", dir, "err", err)
		return false
	}
	if err := os.RemoveAll(dir); err != nil {
		s.log.Warn("remove container dir without a record", "dir", dir, "err", err)
		return false
	}
	return true
}

// releaseOrphanLeases releases the image leases of containers that have
// no directory (kept lists those that do): a create cut short leased its
// image and its image volumes' images before it wrote its record.
func (s *Store) releaseOrphanLeases(kept map[string]bool) {
	owners, err := s.images.Owners()
	if err != nil {
		s.log.Warn("list image leases", "err", err)
		return
	}
	for _, owner := range owners {
		id, ok := leaseContainer(owner)
		if !ok || kept[id] {
			continue
		}
		s.log.Warn("releasing an image lease without a container", "container", id, "owner", owner)
		if err := s.images.Release(owner); err != nil {
			s.log.Warn("release image lease", "owner", owner, "err", err)
		}
	}
}

// leaseContainer is the container a lease owner names (<id> or
// <id>.vol<n>); ok is false for an owner that is not a container's.
func leaseContainer(owner string) (id string, ok bool) {
	id, vol, isVol := strings.Cut(owner, ".vol")
	if len(id) != 64 || strings.Trim(id, "0123456789abcdef") != "" {
		return "", false
	}
	if isVol {
		if _, err := strconv.Atoi(vol); err != nil {
			return "", false
		}
	}
	return id, true
}

// reapOrphans deletes, from every pod the monitor serves, containers
// berthd has no record of (a create cut short by a crash before its
// record was written), and removes the directories of pods no monitor
// serves (their exits are folded in).
func (s *Store) reapOrphans(ctx context.Context) {
	pods, err := s.shims.Pods()
	if err != nil {
		s.log.Warn("list shims", "err", err)
		return
	}
	for _, pod := range pods {
		sh := s.shims.Pod(pod)
		ids, err := sh.List(ctx)
		if errors.Is(err, shim.ErrNoShim) {
			s.log.Info("removing the directory of a pod no monitor serves", "pod", pod)
			if err := s.shims.Forget(pod); err != nil {
				s.log.Warn("remove the directory of a pod no monitor serves", "pod", pod, "err", err)
			}
			continue
		}
		if err != nil {
			s.log.Warn("ask shim for its containers", "pod", pod, "err", err)
			continue
		}
		for _, id := range ids {
			if s.objs.Has(id) {
				continue
			}
			s.log.Warn("deleting a container without a record from the monitor", "pod", pod, "container", id)
			if _, err := sh.Delete(ctx, id); err != nil {
				s.log.Warn("delete orphan container", "container", id, "err", err)
			}
		}
		if len(ids) == 0 {
			// Added for a create that a crash cut short before the
			// monitor held anything for the pod: nothing would ever end
			// it. (A pod emptied by the deletes above ends by itself.)
			s.log.Warn("ending a pod that holds no container", "pod", pod)
			if err := sh.Shutdown(ctx); err != nil && !errors.Is(err, shim.ErrNoShim) {
				s.log.Warn("end the idle pod", "pod", pod, "err", err)
			}
		}
	}
	// A keeper and monitor launched for a pod that a crash cut short
	// before it was added serve nothing (they would leave by themselves
	// after a while).
	if err := s.shims.StopIdleNode(ctx); err != nil {
		s.log.Warn("stop the node's idle monitor", "err", err)
	}
}
