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
// a copy of its record right after the transition; Pod is every container
// of its pod at that moment, oldest first (a deleted one no longer among
// them), which is what the kubelet's evented PLEG takes as the pod's new
// state.
type Event struct {
	Kind      EventKind
	Container *Container
	Pod       []*Container
}

// emit publishes the transition just made to e's record (so List, and Pod
// in every later event, show it) and reports it. It runs with e's lock
// held, so one container's events reach OnEvent in the order they
// happened; s.events orders them across containers, so an event's Pod
// never shows a container older than an event already delivered. OnEvent
// must not block or call the Store.
func (s *Store) emit(kind EventKind, e *entry) {
	e.publish()
	if s.opts.OnEvent == nil {
		return
	}
	s.events.Lock()
	defer s.events.Unlock()
	s.opts.OnEvent(Event{Kind: kind, Container: e.rec.clone(), Pod: s.ListPod(e.rec.PodID)})
}
