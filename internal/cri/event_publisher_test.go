package cri

import (
	"testing"
	"time"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/container"
	"github.com/berthcri/berth/internal/events"
)

// Every event lists all of the pod's containers as last seen (seeded ones
// included), never another pod's, and a deleted container drops out.
func TestEventPublisherListsThePodsContainers(t *testing.T) {
	b := events.NewBroker()
	sub := b.Subscribe(16)
	p := NewEventPublisher(b, nil)
	t0 := time.Unix(1000, 0)
	old := &container.Container{ID: "old", PodID: "p1", Name: "old", State: container.StateExited, CreatedAt: t0}
	other := &container.Container{ID: "x", PodID: "p2", Name: "x", State: container.StateRunning, CreatedAt: t0}
	p.Seed([]*container.Container{old, other})

	c := &container.Container{ID: "new", PodID: "p1", Name: "new", State: container.StateCreated, CreatedAt: t0.Add(time.Second)}
	p.ContainerEvent(container.Event{Kind: container.EventCreated, Container: c})
	running := *c
	running.State = container.StateRunning
	p.ContainerEvent(container.Event{Kind: container.EventStarted, Container: &running})
	p.ContainerEvent(container.Event{Kind: container.EventDeleted, Container: old})

	want := []struct {
		kind  runtime.ContainerEventType
		ids   []string
		state runtime.ContainerState
	}{
		{runtime.ContainerEventType_CONTAINER_CREATED_EVENT, []string{"old", "new"}, runtime.ContainerState_CONTAINER_CREATED},
		{runtime.ContainerEventType_CONTAINER_STARTED_EVENT, []string{"old", "new"}, runtime.ContainerState_CONTAINER_RUNNING},
		{runtime.ContainerEventType_CONTAINER_DELETED_EVENT, []string{"new"}, runtime.ContainerState_CONTAINER_RUNNING},
	}
	for i, w := range want {
		ev := <-sub.C
		if ev.ContainerEventType != w.kind {
			t.Fatalf("event %d: %v, want %v", i, ev.ContainerEventType, w.kind)
		}
		var ids []string
		for _, st := range ev.ContainersStatuses {
			ids = append(ids, st.Id)
			if st.Id == "new" && st.State != w.state {
				t.Fatalf("event %d: new is %v, want %v", i, st.State, w.state)
			}
		}
		if len(ids) != len(w.ids) || (len(ids) > 0 && ids[len(ids)-1] != w.ids[len(w.ids)-1]) || (len(ids) == 2 && ids[0] != w.ids[0]) {
			t.Fatalf("event %d lists %v, want %v (oldest first)", i, ids, w.ids)
		}
	}
}
