package image

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/berthcri/berth/internal/fault"
)

// Garbage collection of blobs and layers nothing refers to any more
// (docs/decisions/1500-image-leases-in-memory-and-background-gc.md).
//
// Container creates and removals (Acquire, Release) never collect: they
// change the in-memory leases and ask for a pass. One goroutine runs the
// passes, one at a time; the requests made while a pass runs are served
// together by the next one. A pass reads the directories without s.mu,
// decides and renames under s.mu (map lookups and renames, no reads of
// lease or image files), and deletes the layer trees after releasing it.

// gcState is the pass scheduler. Guarded by Store.gcMu.
type gcState struct {
	running bool
	// next is closed when the pass that starts after the running one
	// ends; nil while nobody waits for such a pass.
	next   chan struct{}
	closed bool
	done   chan struct{} // closed when the goroutine has exited
}

// requestGC asks for a collection pass that starts after this call and
// returns a channel closed when that pass has ended (its unused layers
// deleted). Callers on the hot path do not wait for it.
func (s *Store) requestGC() <-chan struct{} {
	s.gcMu.Lock()
	defer s.gcMu.Unlock()
	g := &s.gc
	if g.closed {
		c := make(chan struct{})
		close(c)
		return c
	}
	if g.running {
		// The running pass may have looked at the store before the
		// change this request is about: the next one covers it.
		if g.next == nil {
			g.next = make(chan struct{})
		}
		return g.next
	}
	g.running = true
	current := make(chan struct{})
	g.done = make(chan struct{})
	go s.gcLoop(current, g.done)
	return current
}

func (s *Store) gcLoop(current, done chan struct{}) {
	defer close(done)
	for {
		if err := s.collect(); err != nil {
			// Keeping garbage is safe; the next request retries.
			s.log.Warn("collect unused image content", "error", err)
		}
		s.gcMu.Lock()
		close(current)
		g := &s.gc
		if g.next == nil || g.closed {
			if g.next != nil {
				close(g.next)
				g.next = nil
			}
			g.running = false
			s.gcMu.Unlock()
			return
		}
		current, g.next = g.next, nil
		s.gcMu.Unlock()
	}
}

// WaitGC runs a collection pass and waits for it: what no image, lease or
// pull uses is gone from disk when it returns. Tests and RemoveImage use
// it; container removal does not wait.
func (s *Store) WaitGC() { <-s.requestGC() }

// Close stops background collection, waiting for a running pass. The
// store must not be used afterwards.
func (s *Store) Close() {
	s.gcMu.Lock()
	s.gc.closed = true
	done := s.gc.done
	s.gcMu.Unlock()
	if done != nil {
		<-done
	}
}

// collect is one pass: it removes blobs and layers that no image, lease or
// running pull refers to.
func (s *Store) collect() error {
	blobs, err := os.ReadDir(s.path("blobs", "sha256"))
	if err != nil {
		return fmt.Errorf("read image blobs: %w", err)
	}
	layers, err := os.ReadDir(s.path("layers"))
	if err != nil {
		return fmt.Errorf("read image layers: %w", err)
	}
	if s.gcListed != nil {
		s.gcListed()
	}
	freed, err := s.unlinkUnused(blobs, layers)
	if freed > 0 {
		s.faults.Hit(fault.ImageMidGC, "layers", freed)
		s.emptyTrash()
	}
	return err
}

// unlinkUnused decides, under s.mu, which of the listed blobs and layers
// nothing uses, removes those blobs and renames those layers into trash/.
// Deciding under the lock is what makes it safe against a pull: a pull
// marks its digests and chain IDs (markInUse) before it looks for them on
// disk, so either the mark comes first and the entry stays, or the entry
// is already gone when the pull looks and the pull fetches it again. The
// listing itself may be stale: an entry created after it is simply not a
// candidate in this pass.
func (s *Store) unlinkUnused(blobs, layers []os.DirEntry) (freedLayers int, _ error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	keepBlobs, keepLayers, keepAllLayers := s.referenced()
	var errs []error
	changed := false
	for _, e := range blobs {
		if keepBlobs[e.Name()] {
			continue
		}
		if err := os.Remove(s.path("blobs", "sha256", e.Name())); err != nil && !os.IsNotExist(err) {
			errs = append(errs, err)
			continue
		}
		changed = true
	}
	if !keepAllLayers {
		for _, e := range layers {
			if keepLayers[e.Name()] {
				continue
			}
			s.log.Debug("freeing layer", "chainID", e.Name())
			trashed := s.path("trash", e.Name()+"."+randomHex())
			if err := os.Rename(s.path("layers", e.Name()), trashed); err != nil {
				if !os.IsNotExist(err) {
					errs = append(errs, err)
				}
				continue
			}
			changed = true
			freedLayers++
		}
	}
	if changed {
		s.gen++
	}
	if err := errors.Join(errs...); err != nil {
		return freedLayers, fmt.Errorf("collect unused image content: %w", err)
	}
	return freedLayers, nil
}

// referenced is what must stay: blobs (by hex) of every image and running
// pull, layers (by hex) of every image, lease and running pull. keepAll is
// true while a lease could not be read at start: its layers are unknown.
// Caller holds s.mu.
func (s *Store) referenced() (blobs, layers map[string]bool, keepAll bool) {
	blobs, layers = map[string]bool{}, map[string]bool{}
	for k := range s.inUse {
		k = strings.TrimPrefix(k, "sha256:")
		blobs[k], layers[k] = true, true
	}
	for _, meta := range s.images {
		blobs[strings.TrimPrefix(meta.ManifestDigest, "sha256:")] = true
		blobs[strings.TrimPrefix(meta.ConfigDigest, "sha256:")] = true
		for _, l := range meta.Layers {
			blobs[strings.TrimPrefix(l.Digest, "sha256:")] = true
			layers[strings.TrimPrefix(l.ChainID, "sha256:")] = true
		}
	}
	for _, l := range s.leases {
		if l.unreadable {
			keepAll = true
		}
		for _, c := range l.ChainIDs {
			layers[strings.TrimPrefix(c, "sha256:")] = true
		}
	}
	return blobs, layers, keepAll
}

// emptyTrash deletes the layer trees collect moved to trash/. It runs
// without s.mu; what it leaves (a crash midway) Open deletes.
func (s *Store) emptyTrash() {
	es, err := os.ReadDir(s.path("trash"))
	if err != nil {
		s.log.Warn("read image trash", "error", err)
		return
	}
	for _, e := range es {
		if err := os.RemoveAll(s.path("trash", e.Name())); err != nil {
			s.log.Warn("delete unused layer", "path", e.Name(), "error", err)
		}
	}
}

// collectAtStart is Open's pass, before the store is shared: what an
// interrupted pull, removal or pass left behind goes.
func (s *Store) collectAtStart() error {
	blobs, err := os.ReadDir(s.path("blobs", "sha256"))
	if err != nil {
		return fmt.Errorf("read image blobs: %w", err)
	}
	layers, err := os.ReadDir(s.path("layers"))
	if err != nil {
		return fmt.Errorf("read image layers: %w", err)
	}
	_, err = s.unlinkUnused(blobs, layers)
	s.emptyTrash()
	return err
}
