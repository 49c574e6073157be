package lifecycle

import (
	"sync"

	"github.com/berthcri/berth/internal/container"
)

// Subscribers is the one list of those who hear the container store's
// events (container.Options.OnEvent is its Publish): the CRI event
// publisher, NRI (exits). Each is added once, at wiring, in dependency
// order; events before a subscriber is added do not reach it (none is
// served before the daemon serves).
type Subscribers struct {
	mu   sync.RWMutex
	subs []func(container.Event)
}

// Subscribe adds fn; it is called in the store's order, and must not block.
func (l *Subscribers) Subscribe(fn func(container.Event)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.subs = append(l.subs, fn)
}

// Publish hands ev to every subscriber, in the order they subscribed.
func (l *Subscribers) Publish(ev container.Event) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	for _, fn := range l.subs {
		fn(ev)
	}
}
