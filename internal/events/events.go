// Package events fans container lifecycle events out to GetContainerEvents
// subscribers (the kubelet's evented PLEG, crictl events).
//
// Drop policy: every subscriber has a bounded buffer. Publishing never
// blocks the runtime; a subscriber whose buffer is full is disconnected
// (its stream ends with ResourceExhausted) rather than silently losing
// events, so the client knows to relist and subscribe again, which is what
// the kubelet does when its event stream breaks.
package events

import (
	"sync"

	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// DefaultBuffer is how many events a subscriber may fall behind.
const DefaultBuffer = 1024

// Broker distributes events to subscribers.
type Broker struct {
	mu   sync.Mutex
	subs map[*Subscription]struct{}
}

// NewBroker returns a broker with no subscribers.
func NewBroker() *Broker {
	return &Broker{subs: map[*Subscription]struct{}{}}
}

// Subscription receives events on C until it is closed by Unsubscribe or
// because it fell behind (Overflowed then reports true).
type Subscription struct {
	C          <-chan *criapi.ContainerEventResponse
	ch         chan *criapi.ContainerEventResponse
	overflowed bool // guarded by Broker.mu
	broker     *Broker
}

// Subscribe registers a subscriber with a buffer of n events (n ≤ 0 means
// DefaultBuffer).
func (b *Broker) Subscribe(n int) *Subscription {
	if n <= 0 {
		n = DefaultBuffer
	}
	ch := make(chan *criapi.ContainerEventResponse, n)
	s := &Subscription{C: ch, ch: ch, broker: b}
	b.mu.Lock()
	b.subs[s] = struct{}{}
	b.mu.Unlock()
	return s
}

// Unsubscribe stops delivery and closes C. Safe to call twice.
func (s *Subscription) Unsubscribe() {
	b := s.broker
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.subs[s]; ok {
		delete(b.subs, s)
		close(s.ch)
	}
}

// Overflowed reports whether the subscription was closed for falling behind.
func (s *Subscription) Overflowed() bool {
	s.broker.mu.Lock()
	defer s.broker.mu.Unlock()
	return s.overflowed
}

// Publish delivers ev to every subscriber without blocking.
func (b *Broker) Publish(ev *criapi.ContainerEventResponse) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for s := range b.subs {
		select {
		case s.ch <- ev:
		default:
			s.overflowed = true
			delete(b.subs, s)
			close(s.ch)
		}
	}
}

// Subscribers is the number of live subscriptions.
func (b *Broker) Subscribers() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.subs)
}
