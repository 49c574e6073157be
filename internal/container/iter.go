package container

import (
	"iter"
	"slices"
	"time"
)

// All yields every container, oldest first, as List orders them, copying
// one record at a time: a caller that streams thousands of containers
// never holds a copy of all of them. The set is the one at the call; a
// container removed meanwhile is still yielded, once.
func (s *Store) All() iter.Seq[*Container] {
	return func(yield func(*Container) bool) {
		type item struct {
			e       *entry
			created time.Time
		}
		s.mu.Lock()
		items := make([]item, 0, len(s.ctrs))
		for _, e := range s.ctrs {
			items = append(items, item{e, e.snap.Load().CreatedAt})
		}
		s.mu.Unlock()
		slices.SortFunc(items, func(a, b item) int { return a.created.Compare(b.created) })
		for _, it := range items {
			if !yield(it.e.snap.Load().clone()) {
				return
			}
		}
	}
}
