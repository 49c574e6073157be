package events

import (
	"testing"

	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func ev(id string, t criapi.ContainerEventType) *criapi.ContainerEventResponse {
	return &criapi.ContainerEventResponse{ContainerId: id, ContainerEventType: t}
}

func TestEverySubscriberGetsEveryEventInOrder(t *testing.T) {
	b := NewBroker()
	a, c := b.Subscribe(8), b.Subscribe(8)
	order := []criapi.ContainerEventType{
		criapi.ContainerEventType_CONTAINER_CREATED_EVENT,
		criapi.ContainerEventType_CONTAINER_STARTED_EVENT,
		criapi.ContainerEventType_CONTAINER_STOPPED_EVENT,
		criapi.ContainerEventType_CONTAINER_DELETED_EVENT,
	}
	for _, typ := range order {
		b.Publish(ev("c1", typ))
	}
	for _, s := range []*Subscription{a, c} {
		for i, want := range order {
			got := <-s.C
			if got.ContainerEventType != want {
				t.Fatalf("event %d: got %s, want %s", i, got.ContainerEventType, want)
			}
		}
	}
}

func TestSlowSubscriberIsDisconnectedWithoutBlockingOthers(t *testing.T) {
	b := NewBroker()
	slow, fast := b.Subscribe(2), b.Subscribe(100)
	for i := 0; i < 10; i++ {
		b.Publish(ev("c", criapi.ContainerEventType_CONTAINER_CREATED_EVENT))
	}
	n := 0
	for range slow.C { // closed after its two buffered events
		n++
	}
	if n != 2 || !slow.Overflowed() {
		t.Fatalf("slow subscriber got %d events, overflowed=%v; want 2, true", n, slow.Overflowed())
	}
	if len(fast.C) != 10 || fast.Overflowed() {
		t.Fatalf("fast subscriber has %d events, overflowed=%v", len(fast.C), fast.Overflowed())
	}
	if b.Subscribers() != 1 {
		t.Fatalf("subscribers = %d, want 1", b.Subscribers())
	}
}

func TestUnsubscribeTwiceIsSafe(t *testing.T) {
	b := NewBroker()
	s := b.Subscribe(0)
	s.Unsubscribe()
	s.Unsubscribe()
	b.Publish(ev("c", criapi.ContainerEventType_CONTAINER_CREATED_EVENT))
	if _, ok := <-s.C; ok {
		t.Fatal("event delivered after unsubscribe")
	}
}
