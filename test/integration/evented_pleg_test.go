package integration

import (
	"context"
	"slices"
	"testing"
	"time"

	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// podStatusAt is what the kubelet's evented PLEG keeps per pod: the
// newest of what a container event and PodSandboxStatus said, by their
// timestamps (created_at, timestamp).
type podStatusAt struct {
	at    int64
	state map[string]criapi.ContainerState
}

func statesOf(sts []*criapi.ContainerStatus) map[string]criapi.ContainerState {
	m := map[string]criapi.ContainerState{}
	for _, st := range sts {
		m[st.Id] = st.State
	}
	return m
}

// TestEventedPLEGPodStatus: PodSandboxStatus fills timestamp and
// containers_statuses as the kubelet's evented PLEG reads them (the pod's
// containers, as ContainerStatus reports each; the time of the status),
// and every container event carries the pod's sandbox status and its
// containers' statuses. A status asked after an event is at least as new
// as the event, both by timestamp and by what it says, so the kubelet's
// newest-wins cache never goes back in time.
func TestEventedPLEGPodStatus(t *testing.T) {
	t.Parallel()
	e := newCtrEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	stream, err := e.d.Runtime.GetContainerEvents(ctx, &criapi.GetEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // subscribed before the first event
	// Another pod's container must never show in this pod's statuses.
	other := e.podEnv(podConfig("other"))
	otherCtr := other.create(other.config("other", "sleep", "1000"))

	status := func() *criapi.PodSandboxStatusResponse {
		t.Helper()
		before := time.Now().UnixNano()
		resp, err := e.d.Runtime.PodSandboxStatus(ctx, &criapi.PodSandboxStatusRequest{PodSandboxId: e.pod})
		if err != nil {
			t.Fatal(err)
		}
		if resp.Timestamp < before || resp.Timestamp > time.Now().UnixNano() {
			t.Fatalf("timestamp %d is not the time of the call", resp.Timestamp)
		}
		for _, st := range resp.ContainersStatuses {
			if st.Id == otherCtr {
				t.Fatal("another pod's container is listed")
			}
		}
		return resp
	}
	recvEvents(t, stream, 1) // the other pod's container's creation
	if resp := status(); len(resp.ContainersStatuses) != 0 {
		t.Fatalf("a pod without containers lists %v", resp.ContainersStatuses)
	}

	cache := podStatusAt{}
	apply := func(at int64, sts []*criapi.ContainerStatus) {
		if at > cache.at {
			cache = podStatusAt{at: at, state: statesOf(sts)}
		}
	}
	// Each step's events, then a status: the status wins and agrees.
	step := func(n int, do func()) {
		t.Helper()
		do()
		for _, ev := range recvEvents(t, stream, n) {
			if ev.ContainerId == otherCtr {
				continue
			}
			if ev.PodSandboxStatus.GetId() != e.pod || ev.PodSandboxStatus.GetMetadata().GetUid() != e.podCfg.Metadata.Uid {
				t.Fatalf("event %v without this pod's sandbox status: %+v", ev.ContainerEventType, ev.PodSandboxStatus)
			}
			apply(ev.CreatedAt, ev.ContainersStatuses)
			resp := status()
			if resp.Timestamp <= ev.CreatedAt {
				t.Fatalf("a status asked after event %v is older than it: %d <= %d", ev.ContainerEventType, resp.Timestamp, ev.CreatedAt)
			}
			// The container moved on since, at most (created → running → exited).
			evState, stState := statesOf(ev.ContainersStatuses)[ev.ContainerId], statesOf(resp.ContainersStatuses)[ev.ContainerId]
			if ev.ContainerEventType != criapi.ContainerEventType_CONTAINER_DELETED_EVENT && stState < evState {
				t.Fatalf("after event %v the status says %s is %v, the event %v", ev.ContainerEventType, ev.ContainerId, stState, evState)
			}
			apply(resp.Timestamp, resp.ContainersStatuses)
		}
	}

	var c1, c2 string
	step(4, func() {
		c1 = e.run(e.config("one", "sleep", "1000"))
		c2 = e.run(e.config("two", "sh", "-c", "exit 4"))
	})
	step(1, func() { e.waitExited(c2) })
	resp := status()
	if ids := []string{resp.ContainersStatuses[0].Id, resp.ContainersStatuses[1].Id}; len(resp.ContainersStatuses) != 2 || !slices.Equal(ids, []string{c1, c2}) {
		t.Fatalf("containers_statuses lists %v, want both, oldest first", resp.ContainersStatuses)
	}
	for _, st := range resp.ContainersStatuses {
		want := e.status(st.Id)
		if st.State != want.State || st.ExitCode != want.ExitCode || st.CreatedAt != want.CreatedAt || st.StartedAt != want.StartedAt ||
			st.FinishedAt != want.FinishedAt || st.ImageRef != want.ImageRef || st.Metadata.GetName() != want.Metadata.GetName() || st.Reason != want.Reason {
			t.Fatalf("containers_statuses says %+v, ContainerStatus %+v", st, want)
		}
	}
	step(1, func() {
		if _, err := e.d.Runtime.StopContainer(ctx, &criapi.StopContainerRequest{ContainerId: c1, Timeout: 0}); err != nil {
			t.Fatal(err)
		}
	})
	step(1, func() {
		if _, err := e.d.Runtime.RemoveContainer(ctx, &criapi.RemoveContainerRequest{ContainerId: c2}); err != nil {
			t.Fatal(err)
		}
	})
	want := map[string]criapi.ContainerState{c1: criapi.ContainerState_CONTAINER_EXITED}
	if len(cache.state) != len(want) || cache.state[c1] != want[c1] {
		t.Fatalf("the kubelet's view ends as %v, want %v", cache.state, want)
	}
	stopRemove(t, e.d, e.pod)
	stopRemove(t, e.d, other.pod)
}
