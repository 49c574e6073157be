package container

// EventKind is a container lifecycle transition.
type EventKind string

// Event kinds, one per transition of the state machine.
const (
	EventCreated EventKind = "created"
	EventStarted EventKind = "started"
	EventStopped EventKind = "stopped"
	EventDeleted EventKind = "deleted"
)

// Event tells Options.OnEvent that a container changed state. Container is
// a copy of the record right after the transition.
type Event struct {
	Kind      EventKind
	Container *Container
}

// emit reports a transition. It runs with the container's lock held (or
// before the container is visible), so one container's events reach OnEvent
// in the order they happened; OnEvent must not block or call the Store.
func (s *Store) emit(kind EventKind, r *Container) {
	if s.opts.OnEvent != nil {
		s.opts.OnEvent(Event{Kind: kind, Container: r.clone()})
	}
}
