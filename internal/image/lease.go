package image

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"github.com/berthcri/berth/internal/atomicfile"
	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/fault"
)

// A lease pins an image's layers for one owner (a container, or one of its
// image volumes) from CreateContainer until RemoveContainer. Leases live in
// memory (references.leases), which is what GC reads, and each is persisted
// in leases/<owner>.json so that a restarted daemon keeps the layers of the
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

// references are what the collector must keep besides the images' own
// content: the leases containers hold on layers, and the digests and chain
// IDs that pulls, imports and exports are working on (in memory only).
// containerd's leases and its GC's in-flight references, in one type
// because the collector reads both in one decision.
//
// Lock order: imageIndex.mu before mu.
type references struct {
	dir    string // leases/
	faults *fault.Injector
	log    *slog.Logger

	// mu guards inUse and leases (the maps, not the lease files, which
	// are written without it so that creates do not queue behind each
	// other's fsync).
	mu     sync.Mutex
	inUse  map[string]int    // digests and chain IDs a pull, import or export is using (mark)
	leases map[string]*lease // by owner; each also on disk
}

func validOwner(owner string) error {
	if owner == "" || strings.ContainsAny(owner, "/\x00") || owner == "." || owner == ".." {
		return fmt.Errorf("lease owner %q: %w", owner, errdefs.ErrInvalidArgument)
	}
	return nil
}

func (r *references) leasePath(owner string) string { return filepath.Join(r.dir, owner+".json") }

// load reads leases/ into memory (Open). Temp files of interrupted writes
// are removed; unreadable leases are kept, pinning every layer.
func (r *references) load() error {
	es, err := os.ReadDir(r.dir)
	if err != nil {
		return fmt.Errorf("read image leases: %w", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range es {
		p := filepath.Join(r.dir, e.Name())
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
			r.log.Warn("image lease is unreadable; keeping every layer until its owner releases it", "path", p, "error", err)
			l = &lease{Owner: owner, unreadable: true}
		}
		r.leases[owner] = l
	}
	return nil
}

// mark adds delta to the use count of digests and chain IDs that a pull,
// import or export is working on; the collector keeps whatever has a
// count.
func (r *references) mark(keys []string, delta int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, k := range keys {
		r.inUse[k] += delta
		if r.inUse[k] <= 0 {
			delete(r.inUse, k)
		}
	}
}

// swap puts l in memory as its owner's lease and returns the one it
// replaced.
func (r *references) swap(l *lease) (prev *lease) {
	r.mu.Lock()
	defer r.mu.Unlock()
	prev = r.leases[l.Owner]
	r.leases[l.Owner] = l
	return prev
}

// undo puts back prev (nil: none) where swap put l, unless l was
// replaced since.
func (r *references) undo(l, prev *lease) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.leases[l.Owner] != l {
		return
	}
	if prev != nil {
		r.leases[l.Owner] = prev
	} else {
		delete(r.leases, l.Owner)
	}
}

func (r *references) write(l *lease) error {
	if err := r.faults.Fail(fault.ImageFailLeaseWrite); err != nil {
		return err
	}
	data, err := json.Marshal(l)
	if err != nil {
		return err
	}
	return atomicfile.Write(r.leasePath(l.Owner), data, 0o600)
}

// drop removes owner's lease, its file first: if that fails the lease
// stays whole. A crash after it leaves only the memory copy, which dies
// with the process. held is false when owner had none.
func (r *references) drop(owner string) (held bool, _ error) {
	r.mu.Lock()
	_, held = r.leases[owner]
	r.mu.Unlock()
	if !held {
		return false, nil
	}
	if err := os.Remove(r.leasePath(owner)); err != nil && !os.IsNotExist(err) {
		return true, fmt.Errorf("release image lease of %s: %w", owner, err)
	}
	r.mu.Lock()
	delete(r.leases, owner)
	r.mu.Unlock()
	return true, nil
}

// owners lists the owners holding leases, sorted.
func (r *references) owners() []string {
	r.mu.Lock()
	out := make([]string, 0, len(r.leases))
	for owner := range r.leases {
		out = append(out, owner)
	}
	r.mu.Unlock()
	sort.Strings(out)
	return out
}

// view calls fn with the in-use counts and the leases, holding mu (the
// collector's decision).
func (r *references) view(fn func(inUse map[string]int, leases map[string]*lease)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	fn(r.inUse, r.leases)
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
	var img *Image
	var l, prev *lease
	err := s.index.withImage(ref, func(meta *imageMeta) error {
		img = s.index.toImage(meta)
		l = &lease{Version: leaseVersion, Owner: owner, Image: img.ID, ChainIDs: img.ChainIDs}
		// In memory first, while the image cannot be removed: from here
		// on no pass frees these layers. The file is written without the
		// locks.
		prev = s.refs.swap(l)
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	if err := s.refs.write(l); err != nil {
		s.refs.undo(l, prev)
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

// Release drops owner's lease; a collection pass then frees, in the
// background, the layers nothing uses any more. Releasing an owner without
// a lease is no error.
func (s *Store) Release(owner string) error {
	if err := validOwner(owner); err != nil {
		return err
	}
	held, err := s.refs.drop(owner)
	if err != nil || !held {
		return err
	}
	s.requestGC()
	return nil
}

// Owners lists the owners holding leases, sorted, so that a restarted
// daemon can release the leases of containers that no longer exist.
func (s *Store) Owners() ([]string, error) {
	return s.refs.owners(), nil
}
