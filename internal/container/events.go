package container

import (
	"context"
	"errors"
	"time"

	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/shim"
)

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

// watchExit waits in the background for a running container's process to
// exit on its own, so that the exit is recorded (and EventStopped
// emitted) when it happens rather than at the next call that looks.
func (s *Store) watchExit(e *entry) {
	id, podID := e.rec.ID, e.rec.PodID
	go func() {
		for attempt := 0; ; attempt++ {
			_, err := s.shimClient(podID).Wait(context.Background(), id)
			if err == nil || errors.Is(err, errdefs.ErrNotFound) || errors.Is(err, shim.ErrNoShim) || attempt >= 5 {
				break
			}
			// A dropped connection (shim busy or restarting): ask again.
			time.Sleep(time.Duration(attempt+1) * 200 * time.Millisecond)
		}
		e.mu.Lock()
		defer e.mu.Unlock()
		s.mu.Lock()
		current := s.ctrs[id] == e
		s.mu.Unlock()
		if current {
			s.refresh(e)
		}
	}()
}
