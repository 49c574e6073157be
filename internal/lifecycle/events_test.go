package lifecycle

import (
	"testing"

	"github.com/berthcri/berth/internal/container"
)

// Every subscriber hears every event, in the order they subscribed; one
// added later hears only what follows.
func TestSubscribersHearEventsInOrder(t *testing.T) {
	var l Subscribers
	var got []string
	l.Subscribe(func(ev container.Event) { got = append(got, "a:"+ev.Container.ID) })
	l.Publish(container.Event{Container: &container.Container{ID: "1"}})
	l.Subscribe(func(ev container.Event) { got = append(got, "b:"+ev.Container.ID) })
	l.Publish(container.Event{Container: &container.Container{ID: "2"}})
	want := []string{"a:1", "a:2", "b:2"}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
}

// A service without hooks passes resource updates through unchanged.
func TestNoHooksChangeNothing(t *testing.T) {
	s, err := New(Options{Host: testHost()})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := s.hooks.(NoHooks); !ok {
		t.Fatalf("hooks %T, want NoHooks", s.hooks)
	}
	res, err := s.hooks.UpdateContainer(t.Context(), &container.Container{ID: "c"}, nil)
	if err != nil || res != nil {
		t.Fatal(res, err)
	}
}
