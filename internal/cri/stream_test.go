package cri

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/container"
)

// storeWithContainers opens a real container.Store over n exited
// container records written as berthd writes them (no shim, no root
// needed: exited records are loaded as they are). Each has a 1 KiB
// annotation, so n in the thousands is more than one gRPC message holds.
func storeWithContainers(t *testing.T, n int) *container.Store {
	t.Helper()
	dir := t.TempDir()
	t0 := time.Unix(1_700_000_000, 0).UTC()
	pad := strings.Repeat("x", 1024)
	for i := range n {
		c := container.Container{
			Version: 1, ID: fmt.Sprintf("%064x", i+1), PodID: fmt.Sprintf("pod%d", i%3), Name: fmt.Sprintf("c%d", i),
			Image: "busybox", ImageID: "sha256:aa", State: container.StateExited, CreatedAt: t0.Add(time.Duration(i) * time.Millisecond),
			Labels: map[string]string{"group": fmt.Sprint(i % 2)}, Annotations: map[string]string{"pad": pad},
		}
		data, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		d := filepath.Join(dir, "containers", c.ID)
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "container.json"), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	s, err := container.Open(context.Background(), container.Options{Dir: filepath.Join(dir, "containers"), ShimDir: filepath.Join(dir, "shims")})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// fakeStream is a StreamContainers server stream that keeps what is sent
// and can cancel its context after some sends.
type fakeStream struct {
	grpc.ServerStream
	ctx         context.Context
	cancel      context.CancelFunc
	cancelAfter int
	sent        []*runtime.StreamContainersResponse
}

func (f *fakeStream) Context() context.Context { return f.ctx }

func (f *fakeStream) Send(r *runtime.StreamContainersResponse) error {
	// Copy: the batcher reuses its slice once Send returns, as gRPC
	// encodes before returning.
	f.sent = append(f.sent, proto.Clone(r).(*runtime.StreamContainersResponse))
	if len(f.sent) == f.cancelAfter {
		f.cancel()
	}
	return nil
}

func newFakeStream(cancelAfter int) *fakeStream {
	ctx, cancel := context.WithCancel(context.Background())
	return &fakeStream{ctx: ctx, cancel: cancel, cancelAfter: cancelAfter}
}

func TestStreamContainersSendsListInBoundedBatches(t *testing.T) {
	const n = 5000
	s := &Service{containers: storeWithContainers(t, n), log: slog.New(slog.DiscardHandler)}
	for _, f := range []*runtime.ContainerFilter{
		nil,
		{LabelSelector: map[string]string{"group": "1"}},
		{PodSandboxId: "pod2"},
		{Id: fmt.Sprintf("%063x", 1)}, // the first 16 IDs share this prefix
		{State: &runtime.ContainerStateValue{State: runtime.ContainerState_CONTAINER_RUNNING}},
	} {
		t.Run(fmt.Sprint(f), func(t *testing.T) {
			list, err := s.ListContainers(context.Background(), &runtime.ListContainersRequest{Filter: f})
			if err != nil {
				t.Fatal(err)
			}
			st := newFakeStream(-1)
			if err := s.StreamContainers(&runtime.StreamContainersRequest{Filter: f}, st); err != nil {
				t.Fatal(err)
			}
			var got []*runtime.Container
			for _, r := range st.sent {
				if len(r.Containers) == 0 {
					t.Fatal("a response without containers")
				}
				if size := proto.Size(r); size > maxStreamBatchBytes && len(r.Containers) > 1 {
					t.Fatalf("a response of %d bytes", size)
				}
				got = append(got, r.Containers...)
			}
			if !proto.Equal(&runtime.ListContainersResponse{Containers: got}, list) {
				t.Fatalf("stream sent %d containers in %d responses, List returned %d; they differ", len(got), len(st.sent), len(list.Containers))
			}
			if f == nil && (len(got) != n || len(st.sent) < 4) {
				t.Fatalf("%d containers in %d responses; want %d in several", len(got), len(st.sent), n)
			}
		})
	}
}

// A stream whose client goes away stops at once: no response is built or
// sent after the cancel.
func TestStreamContainersStopsWhenCancelled(t *testing.T) {
	s := &Service{containers: storeWithContainers(t, 3000), log: slog.New(slog.DiscardHandler)}
	st := newFakeStream(1)
	err := s.StreamContainers(&runtime.StreamContainersRequest{}, st)
	if status.Code(err) != codes.Canceled {
		t.Fatalf("err %v, want Canceled", err)
	}
	if len(st.sent) != 1 {
		t.Fatalf("%d responses sent, want 1 (the one before the cancel)", len(st.sent))
	}

	expired, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	st = &fakeStream{ctx: expired, cancel: cancel, cancelAfter: -1}
	if err := s.StreamContainers(&runtime.StreamContainersRequest{}, st); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("err %v, want DeadlineExceeded", err)
	}
	if len(st.sent) != 0 {
		t.Fatalf("%d responses sent past the deadline", len(st.sent))
	}
}

// An empty result is no response at all (each holds at least one item),
// then EOF.
func TestStreamContainersEmptyIsJustEOF(t *testing.T) {
	s := &Service{containers: storeWithContainers(t, 0), log: slog.New(slog.DiscardHandler)}
	st := newFakeStream(-1)
	if err := s.StreamContainers(&runtime.StreamContainersRequest{}, st); err != nil {
		t.Fatal(err)
	}
	if len(st.sent) != 0 {
		t.Fatalf("%d responses for no containers", len(st.sent))
	}
}
