package cri

import (
	"testing"
	"time"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/container"
	"github.com/berthcri/berth/internal/events"
)

// An event carries the statuses of exactly the pod's containers the store
// handed over with it, in its order, and timestamps that grow. (Which
// containers those are is the store's part: container's
// TestUnitEventsListThePodsContainers.)
func TestEventPublisherSendsThePodAsTheStoreSawIt(t *testing.T) {
	b := events.NewBroker()
	sub := b.Subscribe(16)
	p := NewEventPublisher(b, nil)
	t0 := time.Unix(1000, 0)
	old := &container.Container{ID: "old", PodID: "p1", Name: "old", State: container.StateExited, CreatedAt: t0}
	c := &container.Container{ID: "new", PodID: "p1", Name: "new", State: container.StateCreated, CreatedAt: t0.Add(time.Second)}
	running := *c
	running.State = container.StateRunning
	p.ContainerEvent(container.Event{Kind: container.EventCreated, Container: c, Pod: []*container.Container{old, c}})
	p.ContainerEvent(container.Event{Kind: container.EventStarted, Container: &running, Pod: []*container.Container{old, &running}})
	p.ContainerEvent(container.Event{Kind: container.EventDeleted, Container: old, Pod: []*container.Container{&running}})

	want := []struct {
		kind  runtime.ContainerEventType
		id    string
		ids   []string
		state runtime.ContainerState
	}{
		{runtime.ContainerEventType_CONTAINER_CREATED_EVENT, "new", []string{"old", "new"}, runtime.ContainerState_CONTAINER_CREATED},
		{runtime.ContainerEventType_CONTAINER_STARTED_EVENT, "new", []string{"old", "new"}, runtime.ContainerState_CONTAINER_RUNNING},
		{runtime.ContainerEventType_CONTAINER_DELETED_EVENT, "old", []string{"new"}, runtime.ContainerState_CONTAINER_RUNNING},
	}
	var last int64
	for i, w := range want {
		ev := <-sub.C
		if ev.ContainerEventType != w.kind || ev.ContainerId != w.id {
			t.Fatalf("event %d: %v for %s, want %v for %s", i, ev.ContainerEventType, ev.ContainerId, w.kind, w.id)
		}
		if ev.CreatedAt < last {
			t.Fatalf("event %d: timestamp %d before %d", i, ev.CreatedAt, last)
		}
		last = ev.CreatedAt
		var ids []string
		for _, st := range ev.ContainersStatuses {
			ids = append(ids, st.Id)
			if st.Id == "new" && st.State != w.state {
				t.Fatalf("event %d: new is %v, want %v", i, st.State, w.state)
			}
		}
		if len(ids) != len(w.ids) || ids[0] != w.ids[0] || ids[len(ids)-1] != w.ids[len(w.ids)-1] {
			t.Fatalf("event %d lists %v, want %v", i, ids, w.ids)
		}
	}
}
