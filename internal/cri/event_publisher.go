package cri

import (
	"time"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/container"
	"github.com/berthcri/berth/internal/events"
	"github.com/berthcri/berth/internal/sandbox"
)

// EventPublisher turns the container store's lifecycle transitions into
// GetContainerEvents responses. As in containerd, each event carries the
// pod sandbox's status and the statuses of all of the pod's containers,
// which the kubelet's evented PLEG uses as the pod's new state: the store
// hands over the pod's containers with each event (container.Event.Pod),
// and sandbox statuses come from the sandbox store's lock-free snapshots.
type EventPublisher struct {
	broker    *events.Broker
	sandboxes *sandbox.Store
}

// NewEventPublisher publishes to broker.
func NewEventPublisher(broker *events.Broker, sandboxes *sandbox.Store) *EventPublisher {
	return &EventPublisher{broker: broker, sandboxes: sandboxes}
}

// ContainerEvent is container.Options.OnEvent. It never blocks: the broker
// drops subscribers that fall behind. The store calls it in the order
// transitions happened, so the timestamps it takes here grow with it.
func (p *EventPublisher) ContainerEvent(ev container.Event) {
	c := ev.Container
	resp := &runtime.ContainerEventResponse{
		ContainerId:        c.ID,
		ContainerEventType: criEventType(ev.Kind),
		CreatedAt:          time.Now().UnixNano(),
		ContainersStatuses: make([]*runtime.ContainerStatus, 0, len(ev.Pod)),
	}
	if p.sandboxes != nil {
		if sb, err := p.sandboxes.Get(c.PodID); err == nil {
			resp.PodSandboxStatus = podSandboxStatus(sb)
		}
	}
	for _, other := range ev.Pod {
		resp.ContainersStatuses = append(resp.ContainersStatuses, criContainerStatus(other))
	}
	p.broker.Publish(resp)
}

func criEventType(k container.EventKind) runtime.ContainerEventType {
	switch k {
	case container.EventCreated:
		return runtime.ContainerEventType_CONTAINER_CREATED_EVENT
	case container.EventStarted:
		return runtime.ContainerEventType_CONTAINER_STARTED_EVENT
	case container.EventStopped:
		return runtime.ContainerEventType_CONTAINER_STOPPED_EVENT
	default:
		return runtime.ContainerEventType_CONTAINER_DELETED_EVENT
	}
}
