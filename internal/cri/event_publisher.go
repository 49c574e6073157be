package cri

import (
	"sort"
	"sync"
	"time"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/container"
	"github.com/berthcri/berth/internal/events"
	"github.com/berthcri/berth/internal/sandbox"
)

// EventPublisher turns the container store's lifecycle transitions into
// GetContainerEvents responses. As in containerd, each event carries the
// pod sandbox's status and the statuses of all of the pod's containers,
// which the kubelet's evented PLEG uses as the pod's new state.
//
// The store calls ContainerEvent with the container's lock held, so the
// publisher must not call back into it: it keeps the last record of every
// container it has heard of instead (seeded from the store at startup).
// Sandbox statuses come from the sandbox store's lock-free snapshots.
type EventPublisher struct {
	broker    *events.Broker
	sandboxes *sandbox.Store

	mu   sync.Mutex
	pods map[string]map[string]*container.Container // pod → container ID → last record
}

// NewEventPublisher publishes to broker.
func NewEventPublisher(broker *events.Broker, sandboxes *sandbox.Store) *EventPublisher {
	return &EventPublisher{broker: broker, sandboxes: sandboxes, pods: map[string]map[string]*container.Container{}}
}

// Seed records containers loaded from disk. A container already heard of
// keeps its record: an event is never older than the store's listing.
func (p *EventPublisher) Seed(ctrs []*container.Container) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range ctrs {
		if _, ok := p.pods[c.PodID][c.ID]; !ok {
			p.remember(c)
		}
	}
}

func (p *EventPublisher) remember(c *container.Container) {
	m := p.pods[c.PodID]
	if m == nil {
		m = map[string]*container.Container{}
		p.pods[c.PodID] = m
	}
	m[c.ID] = c
}

// ContainerEvent is container.Options.OnEvent. It never blocks: the broker
// drops subscribers that fall behind.
func (p *EventPublisher) ContainerEvent(ev container.Event) {
	c := ev.Container
	p.mu.Lock()
	if ev.Kind == container.EventDeleted {
		delete(p.pods[c.PodID], c.ID)
		if len(p.pods[c.PodID]) == 0 {
			delete(p.pods, c.PodID)
		}
	} else {
		p.remember(c)
	}
	ctrs := make([]*container.Container, 0, len(p.pods[c.PodID]))
	for _, other := range p.pods[c.PodID] {
		ctrs = append(ctrs, other)
	}
	p.mu.Unlock()
	sort.Slice(ctrs, func(i, j int) bool { return ctrs[i].CreatedAt.Before(ctrs[j].CreatedAt) })

	resp := &runtime.ContainerEventResponse{
		ContainerId:        c.ID,
		ContainerEventType: criEventType(ev.Kind),
		CreatedAt:          time.Now().UnixNano(),
		ContainersStatuses: make([]*runtime.ContainerStatus, 0, len(ctrs)),
	}
	if p.sandboxes != nil {
		if sb, err := p.sandboxes.Get(c.PodID); err == nil {
			resp.PodSandboxStatus = podSandboxStatus(sb)
		}
	}
	for _, other := range ctrs {
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
