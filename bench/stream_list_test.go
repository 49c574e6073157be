package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/testimages"
)

// BenchmarkStreamLists compares ListContainers with StreamContainers
// (KEP-5825) at 500 and 5000 containers on berth, alternating sample by
// sample, and writes stream_lists.json. Thousands of real containers
// would cost a runc process each, so one real container (created, run to
// its exit) is cloned on disk with the kubelet's labels and annotations
// while berthd is stopped; the restarted berthd loads the clones as its
// own. Listing reads records only, so their state does not change the
// cost. No reference runtime: containerd 1.6 has no Stream* RPCs.
func BenchmarkStreamLists(b *testing.B) {
	reg := testimages.StartRegistry(b)
	reg.PushStandard(b)
	image := reg.Ref(testimages.BusyboxRef)
	ep := StartBerth(b)
	d := ep.Daemon
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if _, err := ep.Image.PullImage(ctx, &criapi.PullImageRequest{Image: &criapi.ImageSpec{Image: image}}); err != nil {
		b.Fatal(err)
	}
	pc := podConfig(ep, "sl")
	pod, err := ep.Runtime.RunPodSandbox(ctx, &criapi.RunPodSandboxRequest{Config: pc})
	if err != nil {
		b.Fatal(err)
	}
	c, err := ep.Runtime.CreateContainer(ctx, &criapi.CreateContainerRequest{
		PodSandboxId: pod.PodSandboxId, Config: containerConfig(image, "true"), SandboxConfig: pc})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := ep.Runtime.StartContainer(ctx, &criapi.StartContainerRequest{ContainerId: c.ContainerId}); err != nil {
		b.Fatal(err)
	}
	for {
		st, err := ep.Runtime.ContainerStatus(ctx, &criapi.ContainerStatusRequest{ContainerId: c.ContainerId})
		if err != nil {
			b.Fatal(err)
		}
		if st.Status.State == criapi.ContainerState_CONTAINER_EXITED {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}

	// As the kubelet's client: up to 16 MiB per message.
	conn, err := grpc.NewClient("unix://"+d.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20)))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	rt := criapi.NewRuntimeServiceClient(conn)

	const samples = 30
	var series []Series
	have := 1
	for _, n := range []int{500, 5000} {
		d.Stop()
		src := filepath.Join(d.Root, "containers", c.ContainerId)
		t0 := time.Now().UTC()
		for ; have < n; have++ {
			id := fmt.Sprintf("%064x", 0x5000000+have)
			berthdtest.CloneRecord(b, src, id, "container.json", func(m map[string]any) {
				m["id"], m["name"] = id, fmt.Sprintf("clone-%d", have)
				m["created_at"] = t0.Add(time.Duration(have) * time.Microsecond)
				m["labels"] = kubeletContainerLabels(have)
				m["annotations"] = kubeletContainerAnnotations()
			}, "upper")
		}
		d.Start()
		d.WaitReady()
		list := Series{Name: fmt.Sprintf("ListContainers (%d)", n)}
		stream := Series{Name: fmt.Sprintf("StreamContainers (%d)", n)}
		for i := 0; i < warmup+samples; i++ {
			dl, err := timed(func() error {
				r, err := rt.ListContainers(ctx, &criapi.ListContainersRequest{})
				if err == nil && len(r.Containers) != n {
					err = fmt.Errorf("listed %d containers, want %d", len(r.Containers), n)
				}
				return err
			})
			if err != nil {
				b.Fatal(err)
			}
			ds, err := timed(func() error { return drainContainers(ctx, rt, n) })
			if err != nil {
				b.Fatal(err)
			}
			if i >= warmup {
				list.Samples = append(list.Samples, dl)
				stream.Samples = append(stream.Samples, ds)
			}
		}
		series = append(series, list, stream)
	}
	// The clones go as they came (a RemoveContainer each would run the
	// runtime's delete 5000 times); then the pod goes through CRI.
	d.Stop()
	for i := 1; i < have; i++ {
		if err := os.RemoveAll(filepath.Join(d.Root, "containers", fmt.Sprintf("%064x", 0x5000000+i))); err != nil {
			b.Fatal(err)
		}
	}
	d.Start()
	d.WaitReady()
	if err := removePod(ctx, ep, pod.PodSandboxId); err != nil {
		b.Error(err)
	}
	if err := Report(os.Stdout, "stream_lists", series...); err != nil {
		b.Fatal(err)
	}
}

// drainContainers receives a whole StreamContainers, as the kubelet does
// before it uses any of it.
func drainContainers(ctx context.Context, rt criapi.RuntimeServiceClient, want int) error {
	s, err := rt.StreamContainers(ctx, &criapi.StreamContainersRequest{})
	if err != nil {
		return err
	}
	got := 0
	for {
		r, err := s.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		got += len(r.Containers)
	}
	if got != want {
		return fmt.Errorf("streamed %d containers, want %d", got, want)
	}
	return nil
}

// kubeletContainerLabels and kubeletContainerAnnotations are what a
// kubelet puts on a container, so records are the size they are in a
// cluster.
func kubeletContainerLabels(i int) map[string]string {
	return map[string]string{
		"io.kubernetes.container.name": fmt.Sprintf("clone-%d", i),
		"io.kubernetes.pod.name":       fmt.Sprintf("workload-%d-7c9f8d6b5-x2k4q", i/3),
		"io.kubernetes.pod.namespace":  "default",
		"io.kubernetes.pod.uid":        fmt.Sprintf("5f1c2a4e-8b7d-4c3a-9e6f-%012d", i/3),
	}
}

func kubeletContainerAnnotations() map[string]string {
	return map[string]string{
		"io.kubernetes.container.hash":                     "8f3b2c1d",
		"io.kubernetes.container.restartCount":             "0",
		"io.kubernetes.container.terminationMessagePath":   "/dev/termination-log",
		"io.kubernetes.container.terminationMessagePolicy": "File",
		"io.kubernetes.pod.terminationGracePeriod":         "30",
	}
}
