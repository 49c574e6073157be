package sandbox

import (
	"iter"
	"slices"
	"time"
)

// All yields every sandbox, oldest first, as List orders them, copying one
// at a time: a caller that streams thousands of pods never holds a copy of
// all of them. The set is the one at the call; a sandbox removed meanwhile
// is still yielded, once (as it was last published).
func (s *Store) All() iter.Seq[*Sandbox] {
	return func(yield func(*Sandbox) bool) {
		type item struct {
			r       *entry
			created time.Time
		}
		s.mu.Lock()
		items := make([]item, 0, len(s.byID))
		for _, r := range s.byID {
			if v := r.view.Load(); v != nil {
				items = append(items, item{r, v.CreatedAt})
			}
		}
		s.mu.Unlock()
		slices.SortFunc(items, func(a, b item) int { return a.created.Compare(b.created) })
		for _, it := range items {
			if v := it.r.view.Load(); v != nil && !yield(copySandbox(v)) {
				return
			}
		}
	}
}
