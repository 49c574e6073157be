package sandbox

import (
	"context"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/berthcri/berth/internal/network"
)

// CleanOrphans releases, and logs, what sandboxes left on the node without
// a record to own it: namespace pins (with their CNI attachment),
// per-pod state dirs and /dev/shm mounts, addresses in the embedded
// network's IPAM store, and pod cgroups under the default parent. berth's
// own ordering (record first, removed last) never makes these; a lost
// or unreadable record does. Call it once on start, before serving.
func (s *Store) CleanOrphans(ctx context.Context) {
	known := map[string]bool{}
	for _, id := range s.objs.IDs() {
		known[id] = true
	}
	// A sandbox dir whose record could not be read was skipped with a
	// warning: what it owns is left alone, not guessed at.
	if dirs, err := os.ReadDir(s.sandboxesDir()); err == nil {
		for _, d := range dirs {
			known[d.Name()] = true
		}
	}
	detached := map[string]bool{}
	detach := func(id, netns string) {
		if s.opts.Network == nil || detached[id] {
			return
		}
		detached[id] = true
		// No record means no recorded config: DEL with the current one,
		// which is the config any pod this daemon version attached used,
		// unless the operator changed it since.
		if err := s.opts.Network.Detach(ctx, network.Pod{ID: id, NetNSPath: netns}, nil); err != nil {
			s.log.Warn("CNI DEL for a pod without a sandbox", "pod", id, "err", err)
		}
	}

	pins, _ := os.ReadDir(s.netnsDir())
	for _, e := range pins {
		i := strings.LastIndexByte(e.Name(), '-')
		if i <= 0 {
			continue
		}
		id, kind := e.Name()[:i], e.Name()[i+1:]
		if known[id] {
			continue
		}
		path := filepath.Join(s.netnsDir(), e.Name())
		s.log.Warn("removing a namespace pin without a sandbox", "pod", id, "path", path)
		if kind == "net" {
			detach(id, path)
		}
		if err := unpin(path); err != nil {
			s.log.Warn("remove orphan namespace pin", "pod", id, "err", err)
		}
	}

	stateDirs, _ := os.ReadDir(filepath.Join(s.opts.State, "sandboxes"))
	for _, e := range stateDirs {
		if known[e.Name()] {
			continue
		}
		dir := filepath.Join(s.opts.State, "sandboxes", e.Name())
		s.log.Warn("removing pod state without a sandbox", "pod", e.Name(), "dir", dir)
		_ = unix.Unmount(filepath.Join(dir, "shm"), unix.MNT_DETACH)
		if err := os.RemoveAll(dir); err != nil {
			s.log.Warn("remove orphan pod state", "pod", e.Name(), "err", err)
		}
	}

	if s.opts.Network != nil {
		for _, id := range s.opts.Network.ReservedIDs() {
			if known[id] || detached[id] {
				continue
			}
			s.log.Warn("releasing a pod address without a sandbox", "pod", id)
			// A pin path that no longer exists: DEL then also drops the
			// pod's leftover NAT rules.
			detach(id, filepath.Join(s.netnsDir(), id+"-net"))
		}
	}

	if s.opts.Systemd != nil {
		s.cleanOrphanSlices(ctx, known)
	} else if s.opts.CgroupParent != "" {
		parent, err := podCgroupPath("", s.opts.CgroupParent, "x")
		if err != nil {
			return
		}
		parent = filepath.Dir(parent)
		seen := map[string]bool{}
		for _, h := range cgroupHierarchies() {
			dirs, _ := os.ReadDir(filepath.Join(h.Path, parent))
			for _, d := range dirs {
				id, ok := strings.CutPrefix(d.Name(), "pod-")
				if !ok || !d.IsDir() || known[id] || seen[id] {
					continue
				}
				seen[id] = true
				path := filepath.Join(parent, d.Name())
				if cgroupHasProcesses(filepath.Join(h.Path, path)) {
					s.log.Warn("a pod cgroup without a sandbox still has processes; leaving it", "pod", id)
					continue
				}
				s.log.Warn("removing a pod cgroup without a sandbox", "pod", id)
				if err := removeCgroup(path); err != nil {
					s.log.Warn("remove orphan pod cgroup", "pod", id, "err", err)
				}
			}
		}
	}
}

// cgroupHasProcesses reports whether any cgroup at or below dir holds a
// process.
func cgroupHasProcesses(dir string) bool {
	found := false
	_ = filepath.WalkDir(dir, func(p string, e os.DirEntry, err error) error {
		if err != nil || found || !e.IsDir() {
			return nil
		}
		if data, err := os.ReadFile(filepath.Join(p, "cgroup.procs")); err == nil && len(strings.TrimSpace(string(data))) > 0 {
			found = true
			return filepath.SkipAll
		}
		return nil
	})
	return found
}
