package image

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/berthcri/berth/internal/atomicfile"
	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/fault"
)

// A lease pins an image's layers for one owner (a container, or one of its
// image volumes) from CreateContainer until RemoveContainer. Leases live in
// memory (Store.leases), which is what GC reads, and each is persisted in
// leases/<owner>.json so that a restarted daemon keeps the layers of the
// containers it recovers.
type lease struct {
	Version  int      `json:"version"`
	Owner    string   `json:"owner"`
	Image    string   `json:"image"`
	ChainIDs []string `json:"chainIDs"`

	// unreadable marks a lease file found at start that could not be
	// parsed: its layers are unknown, so GC keeps every layer until the
	// owner releases it.
	unreadable bool
}

const leaseVersion = 1

func validOwner(owner string) error {
	if owner == "" || strings.ContainsAny(owner, "/\x00") || owner == "." || owner == ".." {
		return fmt.Errorf("lease owner %q: %w", owner, errdefs.ErrInvalidArgument)
	}
	return nil
}

func (s *Store) leasePath(owner string) string { return s.path("leases", owner+".json") }

// loadLeases reads leases/ into memory (Open). Temp files of interrupted
// writes are removed; unreadable leases are kept, pinning every layer.
func (s *Store) loadLeases() error {
	es, err := os.ReadDir(s.path("leases"))
	if err != nil {
		return fmt.Errorf("read image leases: %w", err)
	}
	for _, e := range es {
		p := s.path("leases", e.Name())
		owner, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok {
			os.Remove(p)
			continue
		}
		l := &lease{Owner: owner}
		data, err := os.ReadFile(p)
		if err == nil {
			err = json.Unmarshal(data, l)
		}
		if err != nil || l.Owner != owner {
			s.log.Warn("image lease is unreadable; keeping every layer until its owner releases it", "path", p, "error", err)
			l = &lease{Owner: owner, unreadable: true}
		}
		s.leases[owner] = l
	}
	return nil
}

// Acquire pins the image's layers for owner (a container ID, or
// <id>.vol<n>). The lease is on disk when Acquire returns, so removing the
// image never frees layers in use, even across restarts. lowerDirs are the
// unpacked layer dirs, topmost first. Acquiring again for the same owner
// replaces its lease. Calls for one owner must not overlap (the container
// store serialises each container's create and removal).
func (s *Store) Acquire(ctx context.Context, ref, owner string) (*Image, []string, error) {
	if err := validOwner(owner); err != nil {
		return nil, nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	s.mu.Lock()
	meta, err := s.lookup(ref)
	if err != nil {
		s.mu.Unlock()
		return nil, nil, err
	}
	img := s.toImage(meta)
	l := &lease{Version: leaseVersion, Owner: owner, Image: img.ID, ChainIDs: img.ChainIDs}
	// In memory first, under the lock that GC decides under: from here on
	// no pass frees these layers. The file is written without the lock,
	// so creates do not queue behind each other's fsync.
	prev := s.leases[owner]
	s.leases[owner] = l
	s.mu.Unlock()

	if err := s.writeLease(l); err != nil {
		s.mu.Lock()
		if s.leases[owner] == l {
			if prev != nil {
				s.leases[owner] = prev
			} else {
				delete(s.leases, owner)
			}
		}
		s.mu.Unlock()
		return nil, nil, fmt.Errorf("acquire image %s for %s: %w", img.ID, owner, err)
	}
	if prev != nil {
		s.requestGC() // the replaced lease may have been the last on its layers
	}
	lower := make([]string, 0, len(img.ChainIDs))
	for i := len(img.ChainIDs) - 1; i >= 0; i-- {
		lower = append(lower, s.LayerDiffDir(img.ChainIDs[i]))
	}
	return img, lower, nil
}

func (s *Store) writeLease(l *lease) error {
	if err := s.faults.Fail(fault.ImageFailLeaseWrite); err != nil {
		return err
	}
	data, err := json.Marshal(l)
	if err != nil {
		return err
	}
	return atomicfile.Write(s.leasePath(l.Owner), data, 0o600)
}

// Release drops owner's lease; a collection pass then frees, in the
// background, the layers nothing uses any more. Releasing an owner without
// a lease is no error.
func (s *Store) Release(owner string) error {
	if err := validOwner(owner); err != nil {
		return err
	}
	s.mu.Lock()
	_, held := s.leases[owner]
	s.mu.Unlock()
	if !held {
		return nil
	}
	// The file goes first: if that fails the lease stays whole. A crash
	// after it leaves only the memory copy, which dies with the process.
	if err := os.Remove(s.leasePath(owner)); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("release image lease of %s: %w", owner, err)
	}
	s.mu.Lock()
	delete(s.leases, owner)
	s.mu.Unlock()
	s.requestGC()
	return nil
}

// Owners lists the owners holding leases, sorted, so that a restarted
// daemon can release the leases of containers that no longer exist.
func (s *Store) Owners() ([]string, error) {
	s.mu.Lock()
	out := make([]string, 0, len(s.leases))
	for owner := range s.leases {
		out = append(out, owner)
	}
	s.mu.Unlock()
	sort.Strings(out)
	return out, nil
}
