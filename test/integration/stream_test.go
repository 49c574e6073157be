package integration

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/testutil/berthdtest"
)

// collect drains a Stream* RPC: every response must hold at least one
// item; it returns the items and the number of responses.
func collect[R any, T any](t *testing.T, recv func() (R, error), items func(R) []T) ([]T, int) {
	t.Helper()
	var all []T
	n := 0
	for {
		r, err := recv()
		if errors.Is(err, io.EOF) {
			return all, n
		}
		if err != nil {
			t.Fatalf("stream: %v", err)
		}
		n++
		got := items(r)
		if len(got) == 0 {
			t.Fatalf("response %d holds no item", n)
		}
		all = append(all, got...)
	}
}

func uniqueIDs(t *testing.T, what string, ids []string) {
	t.Helper()
	seen := map[string]bool{}
	for _, id := range ids {
		if seen[id] {
			t.Fatalf("%s %s sent twice", what, id)
		}
		seen[id] = true
	}
}

func sortedIDs[T any](items []T, id func(T) string) []string {
	out := make([]string, 0, len(items))
	for _, it := range items {
		out = append(out, id(it))
	}
	slices.Sort(out)
	return out
}

// The Stream* RPCs return what their List* RPCs return, filter by filter,
// over more containers and pods than one gRPC message holds: each item
// once, in several responses of at least one item, then EOF.
func TestStreamListsMatchListsWithThousandsOfItems(t *testing.T) {
	t.Parallel()
	const nCtrs, nPods = 3000, 1500
	e := newCtrEnv(t)
	ctx := berthdtest.Ctx(t)
	running := e.run(e.config("running", "sleep", "3600"))
	exited := e.run(e.config("exited", "true"))
	e.waitExited(exited)
	stoppedCfg := podConfig("stream-stopped")
	stopped := runPod(t, e.d, stoppedCfg)
	if _, err := e.d.Runtime.StopPodSandbox(ctx, &criapi.StopPodSandboxRequest{PodSandboxId: stopped}); err != nil {
		t.Fatal(err)
	}

	e.d.Stop()
	pad := strings.Repeat("p", 2048) // 3000 × 2 KiB: more than gRPC's default 4 MiB
	ctrDir := filepath.Join(e.d.Root, "containers", exited)
	t0 := time.Now().UTC()
	for i := range nCtrs {
		id := fmt.Sprintf("%064x", 0xc0000+i)
		pod := e.pod
		if i%2 == 1 {
			pod = stopped
		}
		berthdtest.CloneRecord(t, ctrDir, id, "container.json", func(m map[string]any) {
			m["id"], m["pod_id"], m["name"] = id, pod, fmt.Sprintf("clone-%d", i)
			m["created_at"] = t0.Add(time.Duration(i) * time.Microsecond)
			m["labels"] = map[string]string{"group": fmt.Sprint(i % 3)}
			m["annotations"] = map[string]string{"pad": pad}
		}, "upper")
	}
	podDir := filepath.Join(e.d.Root, "sandboxes", stopped)
	for i := range nPods {
		id := fmt.Sprintf("%064x", 0xb0000+i)
		berthdtest.CloneRecord(t, podDir, id, "sandbox.json", func(m map[string]any) {
			cfg := m["config"].(map[string]any)
			name := fmt.Sprintf("clone-%d", i)
			cfg["metadata"] = map[string]any{"name": name, "namespace": "default", "uid": name + "-uid"}
			cfg["labels"] = map[string]string{"group": fmt.Sprint(i % 3)}
			cfg["annotations"] = map[string]string{"pad": pad + pad}
			m["id"], m["createdAt"] = id, t0.Add(time.Duration(i)*time.Microsecond)
		})
	}
	e.d.Start()
	e.d.WaitReady()

	// A client that can take the whole List answer, to compare with.
	conn, err := grpc.NewClient("unix://"+e.d.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(256<<20)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	big := criapi.NewRuntimeServiceClient(conn)

	// One List answer no longer fits a default client's message...
	_, err = e.d.Runtime.ListContainers(ctx, &criapi.ListContainersRequest{})
	berthdtest.WantCode(t, err, codes.ResourceExhausted)

	t.Run("containers", func(t *testing.T) {
		for _, f := range []*criapi.ContainerFilter{
			nil,
			{LabelSelector: map[string]string{"group": "1"}},
			{PodSandboxId: stopped},
			{State: &criapi.ContainerStateValue{State: criapi.ContainerState_CONTAINER_RUNNING}},
			{Id: running[:12]},
			{PodSandboxId: e.pod, LabelSelector: map[string]string{"group": "2"}, State: &criapi.ContainerStateValue{State: criapi.ContainerState_CONTAINER_EXITED}},
		} {
			list, err := big.ListContainers(ctx, &criapi.ListContainersRequest{Filter: f})
			if err != nil {
				t.Fatal(err)
			}
			// ...while the stream of it does, on that default client.
			stream, err := e.d.Runtime.StreamContainers(ctx, &criapi.StreamContainersRequest{Filter: f})
			if err != nil {
				t.Fatal(err)
			}
			got, responses := collect(t, stream.Recv, (*criapi.StreamContainersResponse).GetContainers)
			uniqueIDs(t, "container", sortedIDs(got, (*criapi.Container).GetId))
			if !proto.Equal(&criapi.ListContainersResponse{Containers: got}, list) {
				t.Fatalf("filter %v: stream sent %d containers, List %d; they differ", f, len(got), len(list.Containers))
			}
			if f == nil && (len(got) != nCtrs+2 || responses < 2) {
				t.Fatalf("%d containers in %d responses, want %d in several", len(got), responses, nCtrs+2)
			}
		}
	})

	t.Run("pods", func(t *testing.T) {
		for _, f := range []*criapi.PodSandboxFilter{
			nil,
			{LabelSelector: map[string]string{"group": "0"}},
			{State: &criapi.PodSandboxStateValue{State: criapi.PodSandboxState_SANDBOX_READY}},
			{Id: stopped[:12]},
		} {
			list, err := big.ListPodSandbox(ctx, &criapi.ListPodSandboxRequest{Filter: f})
			if err != nil {
				t.Fatal(err)
			}
			stream, err := e.d.Runtime.StreamPodSandboxes(ctx, &criapi.StreamPodSandboxesRequest{Filter: f})
			if err != nil {
				t.Fatal(err)
			}
			got, responses := collect(t, stream.Recv, (*criapi.StreamPodSandboxesResponse).GetPodSandboxes)
			uniqueIDs(t, "pod", sortedIDs(got, (*criapi.PodSandbox).GetId))
			if !proto.Equal(&criapi.ListPodSandboxResponse{Items: got}, list) {
				t.Fatalf("filter %v: stream sent %d pods, List %d; they differ", f, len(got), len(list.Items))
			}
			if f == nil && (len(got) != nPods+2 || responses < 2) {
				t.Fatalf("%d pods in %d responses, want %d in several", len(got), responses, nPods+2)
			}
		}
	})

	// Stats change between two calls: compare who is reported.
	t.Run("container stats", func(t *testing.T) {
		for _, f := range []*criapi.ContainerStatsFilter{nil, {PodSandboxId: e.pod, LabelSelector: map[string]string{"group": "0"}}, {Id: running}} {
			list, err := big.ListContainerStats(ctx, &criapi.ListContainerStatsRequest{Filter: f})
			if err != nil {
				t.Fatal(err)
			}
			stream, err := e.d.Runtime.StreamContainerStats(ctx, &criapi.StreamContainerStatsRequest{Filter: f})
			if err != nil {
				t.Fatal(err)
			}
			got, _ := collect(t, stream.Recv, (*criapi.StreamContainerStatsResponse).GetContainerStats)
			id := func(s *criapi.ContainerStats) string { return s.GetAttributes().GetId() }
			ids := sortedIDs(got, id)
			uniqueIDs(t, "container stats", ids)
			if want := sortedIDs(list.Stats, id); !slices.Equal(ids, want) {
				t.Fatalf("filter %v: stream reported %d containers, List %d", f, len(ids), len(want))
			}
			if f == nil && len(ids) != nCtrs+2 {
				t.Fatalf("stats of %d containers, want %d", len(ids), nCtrs+2)
			}
			if f.GetId() == running && got[0].GetCpu() == nil {
				t.Fatal("the running container's stats have no CPU")
			}
		}
	})

	t.Run("pod stats", func(t *testing.T) {
		for _, f := range []*criapi.PodSandboxStatsFilter{nil, {LabelSelector: map[string]string{"group": "1"}}, {Id: e.pod}} {
			list, err := big.ListPodSandboxStats(ctx, &criapi.ListPodSandboxStatsRequest{Filter: f})
			if err != nil {
				t.Fatal(err)
			}
			stream, err := e.d.Runtime.StreamPodSandboxStats(ctx, &criapi.StreamPodSandboxStatsRequest{Filter: f})
			if err != nil {
				t.Fatal(err)
			}
			got, _ := collect(t, stream.Recv, (*criapi.StreamPodSandboxStatsResponse).GetPodSandboxStats)
			id := func(s *criapi.PodSandboxStats) string { return s.GetAttributes().GetId() }
			ids := sortedIDs(got, id)
			uniqueIDs(t, "pod stats", ids)
			if want := sortedIDs(list.Stats, id); !slices.Equal(ids, want) {
				t.Fatalf("filter %v: stream reported %d pods, List %d", f, len(ids), len(want))
			}
			if f.GetId() == e.pod {
				if n := len(got[0].GetLinux().GetContainers()); n != nCtrs/2+2 {
					t.Fatalf("the ready pod's stats hold %d containers, want %d", n, nCtrs/2+2)
				}
			}
		}
	})

	t.Run("metrics", func(t *testing.T) {
		list, err := big.ListPodSandboxMetrics(ctx, &criapi.ListPodSandboxMetricsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		stream, err := e.d.Runtime.StreamPodSandboxMetrics(ctx, &criapi.StreamPodSandboxMetricsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		got, _ := collect(t, stream.Recv, (*criapi.StreamPodSandboxMetricsResponse).GetPodSandboxMetrics)
		id := (*criapi.PodSandboxMetrics).GetPodSandboxId
		if ids, want := sortedIDs(got, id), sortedIDs(list.PodMetrics, id); !slices.Equal(ids, want) || !slices.Equal(ids, []string{e.pod}) {
			t.Fatalf("stream reported pods %v, List %v, want only the ready pod", ids, want)
		}
		cid := (*criapi.ContainerMetrics).GetContainerId
		if ids := sortedIDs(got[0].GetContainerMetrics(), cid); !slices.Equal(ids, []string{running}) {
			t.Fatalf("container metrics of %v, want the running container only", ids)
		}
	})

	t.Run("images", func(t *testing.T) {
		img := criapi.NewImageServiceClient(conn)
		for _, f := range []*criapi.ImageFilter{nil, {Image: &criapi.ImageSpec{Image: e.reg.Ref("busybox:latest")}}, {Image: &criapi.ImageSpec{Image: "absent:1"}}} {
			list, err := img.ListImages(ctx, &criapi.ListImagesRequest{Filter: f})
			if err != nil {
				t.Fatal(err)
			}
			stream, err := e.d.Image.StreamImages(ctx, &criapi.StreamImagesRequest{Filter: f})
			if err != nil {
				t.Fatal(err)
			}
			got, _ := collect(t, stream.Recv, (*criapi.StreamImagesResponse).GetImages)
			if !proto.Equal(&criapi.ListImagesResponse{Images: got}, list) && !(len(got) == 0 && len(list.Images) == 0) {
				t.Fatalf("filter %v: stream sent %v, List %v", f, got, list.Images)
			}
		}
	})

	// A client that gives up mid-stream gets Canceled, and the daemon
	// serves the next stream in full.
	t.Run("cancel", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		stream, err := e.d.Runtime.StreamContainers(cctx, &criapi.StreamContainersRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := stream.Recv(); err != nil {
			t.Fatal(err)
		}
		cancel()
		for err == nil {
			_, err = stream.Recv()
		}
		berthdtest.WantCode(t, err, codes.Canceled)
		stream, err = e.d.Runtime.StreamContainers(ctx, &criapi.StreamContainersRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := collect(t, stream.Recv, (*criapi.StreamContainersResponse).GetContainers); len(got) != nCtrs+2 {
			t.Fatalf("after a cancelled stream: %d containers, want %d", len(got), nCtrs+2)
		}
	})
}
