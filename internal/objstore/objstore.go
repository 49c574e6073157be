// Package objstore keeps the objects of one kind, sandboxes or
// containers, the one way berth keeps them: in memory, an index by ID
// (full or unique prefix, internal/idprefix) with the names reserved for
// them and the snapshots each object publishes, which Get, List and All
// read without waiting on an object busy in a slow step; on disk, one
// record per object, replaced atomically (internal/atomicfile).
//
// What an object is and how it changes stays with its kind: an entry
// (the kind's own type, with its lock and private state) embeds a View
// and publishes a copy of its public value T whenever that changes.
// containerd's internal/registrar, truncindex and cri/store packages
// split the same work three ways; decision 2600 says why it is one here.
package objstore

import (
	"fmt"
	"iter"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/idprefix"
)

// View is an object's published snapshot. An entry embeds it and
// publishes a fresh copy of its public value whenever that changes;
// readers load it without the entry's lock.
type View[T any] struct{ p atomic.Pointer[T] }

// Publish makes v what readers see. v must not change afterwards.
func (w *View[T]) Publish(v *T) { w.p.Store(v) }

// Published is the snapshot last published; nil before the first
// Publish and after Withdraw.
func (w *View[T]) Published() *T { return w.p.Load() }

// Withdraw hides the object from readers that still hold its entry (one
// removed while they looked it up).
func (w *View[T]) Withdraw() { w.p.Store(nil) }

// Object is what a Store holds: an entry that publishes snapshots of T
// (it embeds a *View[T] or View[T]).
type Object[T any] interface {
	Published() *T
}

// Kind describes the public value T of a Store's objects.
type Kind[T any] struct {
	// Name names the kind in errors ("sandbox", "container").
	Name string
	// Clone copies a snapshot for a caller, who may change the copy.
	Clone func(*T) *T
	// Created orders List and All, oldest first.
	Created func(*T) time.Time
	// Group, if set, files each object under a second key (a container's
	// pod) that ListGroup lists by, as of the object's Add.
	Group func(*T) string
}

// Store is the in-memory index of one kind of object: by ID, by name
// reservation and, if the kind has one, by group. Its lock guards only
// the maps and is never held while calling out.
type Store[T any, E Object[T]] struct {
	kind Kind[T]

	mu      sync.Mutex
	byID    map[string]E
	names   map[string]string       // name → ID holding it
	groups  map[string]map[string]E // group → ID → entry
	groupOf map[string]string       // ID → its group
}

// New returns an empty Store for kind.
func New[T any, E Object[T]](kind Kind[T]) *Store[T, E] {
	return &Store[T, E]{
		kind: kind, byID: map[string]E{}, names: map[string]string{},
		groups: map[string]map[string]E{}, groupOf: map[string]string{},
	}
}

// Reserve claims name for id until Release (or Delete) frees it. A name
// held by another ID is errdefs.ErrAlreadyExists. Reserving a name
// again for the ID that holds it is fine.
func (s *Store[T, E]) Reserve(name, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if other, ok := s.names[name]; ok && other != id {
		return fmt.Errorf("%s name %q is reserved by %s: %w", s.kind.Name, name, other, errdefs.ErrAlreadyExists)
	}
	s.names[name] = id
	return nil
}

// Release frees name if id holds it.
func (s *Store[T, E]) Release(name, id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.release(name, id)
}

func (s *Store[T, E]) release(name, id string) {
	if name != "" && s.names[name] == id {
		delete(s.names, name)
	}
}

// Add indexes e under id and, unless name is "", reserves name for it
// (whoever held it before: loading records on start, where the record
// is the truth). e should have published its first snapshot: its group
// is taken from it.
func (s *Store[T, E]) Add(id, name string, e E) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.byID[id] = e
	if name != "" {
		s.names[name] = id
	}
	if s.kind.Group == nil {
		return
	}
	var g string
	if v := e.Published(); v != nil {
		g = s.kind.Group(v)
	}
	if s.groups[g] == nil {
		s.groups[g] = map[string]E{}
	}
	s.groups[g][id] = e
	s.groupOf[id] = g
}

// Delete drops id from the index and frees name if id holds it.
func (s *Store[T, E]) Delete(id, name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.byID, id)
	s.release(name, id)
	if g, ok := s.groupOf[id]; ok {
		delete(s.groupOf, id)
		delete(s.groups[g], id)
		if len(s.groups[g]) == 0 {
			delete(s.groups, g)
		}
	}
}

// Lookup returns the entry of a full ID or a prefix of exactly one ID
// (idprefix: none is errdefs.ErrNotFound, several
// errdefs.ErrInvalidArgument).
func (s *Store[T, E]) Lookup(id string) (E, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return idprefix.Resolve(s.byID, s.kind.Name, id, nil)
}

// Has reports whether the full ID id is indexed.
func (s *Store[T, E]) Has(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.byID[id]
	return ok
}

// IDs lists the IDs indexed, in no order.
func (s *Store[T, E]) IDs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	ids := make([]string, 0, len(s.byID))
	for id := range s.byID {
		ids = append(ids, id)
	}
	return ids
}

// Len is the number of objects indexed.
func (s *Store[T, E]) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.byID)
}

// Get returns a copy of the published snapshot of a full ID or unique
// prefix; an object that has none (withdrawn) is errdefs.ErrNotFound.
func (s *Store[T, E]) Get(id string) (*T, error) {
	e, err := s.Lookup(id)
	if err != nil {
		return nil, err
	}
	v := e.Published()
	if v == nil {
		return nil, fmt.Errorf("%s %q: %w", s.kind.Name, id, errdefs.ErrNotFound)
	}
	return s.kind.Clone(v), nil
}

// List returns a copy of every published snapshot, oldest first.
func (s *Store[T, E]) List() []*T { return s.collect(s.entries("", false)) }

// ListGroup returns, as List, the objects filed under group g.
func (s *Store[T, E]) ListGroup(g string) []*T { return s.collect(s.entries(g, true)) }

// entries copies out the entries indexed, or those of group g.
func (s *Store[T, E]) entries(g string, inGroup bool) []E {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.byID
	if inGroup {
		m = s.groups[g]
	}
	out := make([]E, 0, len(m))
	for _, e := range m {
		out = append(out, e)
	}
	return out
}

func (s *Store[T, E]) collect(entries []E) []*T {
	out := make([]*T, 0, len(entries))
	for _, e := range entries {
		if v := e.Published(); v != nil {
			out = append(out, s.kind.Clone(v))
		}
	}
	slices.SortStableFunc(out, func(a, b *T) int { return s.kind.Created(a).Compare(s.kind.Created(b)) })
	return out
}

// All yields every object, oldest first, as List orders them, copying
// one snapshot at a time: a caller that streams thousands of objects
// never holds a copy of all of them. The set is the one at the call; an
// object removed meanwhile is yielded as it was last published, unless
// it withdrew its snapshot.
func (s *Store[T, E]) All() iter.Seq[*T] {
	return func(yield func(*T) bool) {
		type item struct {
			e       E
			created time.Time
		}
		entries := s.entries("", false)
		items := make([]item, 0, len(entries))
		for _, e := range entries {
			if v := e.Published(); v != nil {
				items = append(items, item{e, s.kind.Created(v)})
			}
		}
		slices.SortStableFunc(items, func(a, b item) int { return a.created.Compare(b.created) })
		for _, it := range items {
			if v := it.e.Published(); v != nil && !yield(s.kind.Clone(v)) {
				return
			}
		}
	}
}
