package image

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"

	"github.com/berthcri/berth/internal/fault"
)

// Garbage collection of blobs and layers nothing refers to any more
// (docs/decisions/1500-image-leases-in-memory-and-background-gc.md).
//
// Container creates and removals (Acquire, Release) never collect: they
// change the in-memory leases and ask for a pass. One goroutine runs the
// passes, one at a time; the requests made while a pass runs are served
// together by the next one. A pass lists the directories without a lock,
// decides and unlinks or renames holding the index's and the references'
// locks (map lookups and renames, no reads of lease or image files), and
// deletes the layer trees after releasing them.

// collector schedules collection passes; pass is one of them.
type collector struct {
	pass func() error
	log  *slog.Logger

	// mu guards the fields below.
	mu      sync.Mutex
	running bool
	// next is closed when the pass that starts after the running one
	// ends; nil while nobody waits for such a pass.
	next   chan struct{}
	closed bool
	done   chan struct{} // closed when the goroutine has exited

	// listed, tests only, runs in each pass between listing and deciding
	// (set before the pass is requested).
	listed func()
}

// request asks for a collection pass that starts after this call and
// returns a channel closed when that pass has ended (its unused layers
// deleted). Callers on the hot path do not wait for it.
func (g *collector) request() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
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
	go g.loop(current, g.done)
	return current
}

func (g *collector) loop(current, done chan struct{}) {
	defer close(done)
	for {
		if err := g.pass(); err != nil {
			// Keeping garbage is safe; the next request retries.
			g.log.Warn("collect unused image content", "error", err)
		}
		g.mu.Lock()
		close(current)
		if g.next == nil || g.closed {
			if g.next != nil {
				close(g.next)
				g.next = nil
			}
			g.running = false
			g.mu.Unlock()
			return
		}
		current, g.next = g.next, nil
		g.mu.Unlock()
	}
}

// close stops background collection, waiting for a running pass.
func (g *collector) close() {
	g.mu.Lock()
	g.closed = true
	done := g.done
	g.mu.Unlock()
	if done != nil {
		<-done
	}
}

// requestGC asks the collector for a pass (collector.request).
func (s *Store) requestGC() <-chan struct{} { return s.gc.request() }

// WaitGC runs a collection pass and waits for it: what no image, lease or
// pull uses is gone from disk when it returns. Tests and RemoveImage use
// it; container removal does not wait.
func (s *Store) WaitGC() { <-s.requestGC() }

// Close stops background collection, waiting for a running pass, stops
// the lazy layers' background fetches and the range socket. The lazy
// layers stay mounted and served by the node's keeper (decision 3600,
// S4): the next berthd takes them up. The store must not be used
// afterwards.
func (s *Store) Close() {
	s.gc.close()
	s.lazy.stopAll()
	s.closeRanges()
}

// collect is one pass: it removes blobs and layers that no image, lease or
// running pull refers to.
func (s *Store) collect() error {
	blobs, err := s.content.list()
	if err != nil {
		return err
	}
	layers, err := s.layers.list()
	if err != nil {
		return err
	}
	if s.gc.listed != nil {
		s.gc.listed()
	}
	lazyBefore := s.lazy.count()
	freed, err := s.unlinkUnused(blobs, layers)
	if err == nil && s.lazy.count() < lazyBefore {
		// A lazy layer's background fetch, stopped just now, may have
		// stored its blob after the listing: list the blobs again.
		if blobs, err = s.content.list(); err != nil {
			return err
		}
		var more int
		more, err = s.unlinkUnused(blobs, nil)
		freed += more
	}
	if freed > 0 {
		s.faults.Hit(fault.ImageMidGC, "layers", freed)
		s.layers.emptyTrash(s.log)
	}
	return err
}

// unlinkUnused decides, holding the index's and the references' locks,
// which of the listed blobs and layers nothing uses, removes those blobs
// and moves those layers into trash/. Deciding under the locks is what
// makes it safe against a pull: a pull marks its digests and chain IDs
// (references.mark) before it looks for them on disk, and unmarks them
// only once its record is in the index, so either the mark or the record
// is seen and the entry stays, or the entry is already gone when the pull
// looks and the pull fetches it again. The listing itself may be stale:
// an entry created after it is simply not a candidate in this pass.
func (s *Store) unlinkUnused(blobs, layers []os.DirEntry) (freedLayers int, err error) {
	s.index.view(func(images map[string]*imageMeta) {
		s.refs.view(func(inUse map[string]int, leases map[string]*lease) {
			keepBlobs, keepLayers, keepAll := referenced(images, inUse, leases)
			freedLayers, err = s.sweep(blobs, layers, keepBlobs, keepLayers, keepAll)
		})
	})
	return freedLayers, err
}

// sweep removes the listed blobs and layers that are not kept. Caller
// holds the index's and the references' locks.
func (s *Store) sweep(blobs, layers []os.DirEntry, keepBlobs, keepLayers map[string]bool, keepAllLayers bool) (freedLayers int, _ error) {
	var errs []error
	changed := false
	for _, e := range blobs {
		if keepBlobs[e.Name()] {
			continue
		}
		if err := s.content.remove(e.Name()); err != nil {
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
			if err := s.lazy.unmount("sha256:" + e.Name()); err != nil {
				errs = append(errs, err)
				continue
			}
			if err := s.layers.trash(e.Name()); err != nil {
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
		s.usage.changed()
	}
	if err := errors.Join(errs...); err != nil {
		return freedLayers, fmt.Errorf("collect unused image content: %w", err)
	}
	return freedLayers, nil
}

// referenced is what must stay: blobs (by hex) of every image and running
// pull, layers (by hex) of every image, lease and running pull. keepAll is
// true while a lease could not be read at start: its layers are unknown.
func referenced(images map[string]*imageMeta, inUse map[string]int, leases map[string]*lease) (blobs, layers map[string]bool, keepAll bool) {
	blobs, layers = map[string]bool{}, map[string]bool{}
	for k := range inUse {
		k = strings.TrimPrefix(k, "sha256:")
		blobs[k], layers[k] = true, true
	}
	for _, meta := range images {
		blobs[strings.TrimPrefix(meta.ManifestDigest, "sha256:")] = true
		blobs[strings.TrimPrefix(meta.ConfigDigest, "sha256:")] = true
		for _, l := range meta.Layers {
			blobs[strings.TrimPrefix(l.Digest, "sha256:")] = true
			layers[strings.TrimPrefix(l.ChainID, "sha256:")] = true
		}
	}
	for _, l := range leases {
		if l.unreadable {
			keepAll = true
		}
		for _, c := range l.ChainIDs {
			layers[strings.TrimPrefix(c, "sha256:")] = true
		}
	}
	return blobs, layers, keepAll
}

// collectAtStart is Open's pass, before the store is shared: what an
// interrupted pull, removal or pass left behind goes.
func (s *Store) collectAtStart() error {
	blobs, err := s.content.list()
	if err != nil {
		return err
	}
	layers, err := s.layers.list()
	if err != nil {
		return err
	}
	_, err = s.unlinkUnused(blobs, layers)
	s.layers.emptyTrash(s.log)
	return err
}
