package bench

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/testutil/testimages"
)

// BenchmarkStatsRPCs measures what the kubelet polls every few seconds
// (ListPodSandboxStats, ListContainerStats, ListPodSandboxMetrics) with 4
// pods of 5 running containers, on berth and, when present, the reference
// runtime, and writes stats_rpcs.json.
func BenchmarkStatsRPCs(b *testing.B) {
	reg := testimages.StartRegistry(b)
	reg.PushStandard(b)
	reg.Push(b, "pause:latest", pauseImage(b))
	image := reg.Ref(testimages.BusyboxRef)
	eps := []*Endpoint{StartBerth(b)}
	if ref := StartReference(b, reg.Host); ref != nil && os.Getenv("BENCH_NO_REF") == "" {
		eps = append(eps, ref)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	const pods, perPod, samples = 4, 5, 30
	var series []Series
	for _, ep := range eps {
		if _, err := ep.Image.PullImage(ctx, &criapi.PullImageRequest{Image: &criapi.ImageSpec{Image: image}}); err != nil {
			b.Logf("%s: pull: %v; skipped", ep.Name, err)
			continue
		}
		var ids []string
		ok := true
		for p := 0; p < pods && ok; p++ {
			pc := podConfig(ep, "st")
			r, err := ep.Runtime.RunPodSandbox(ctx, &criapi.RunPodSandboxRequest{Config: pc})
			if err != nil {
				b.Logf("%s: run pod: %v; skipped", ep.Name, err)
				ok = false
				break
			}
			ids = append(ids, r.PodSandboxId)
			for c := 0; c < perPod; c++ {
				cr, err := ep.Runtime.CreateContainer(ctx, &criapi.CreateContainerRequest{
					PodSandboxId: r.PodSandboxId, Config: containerConfig(image, "sleep", "3600"), SandboxConfig: pc})
				if err == nil {
					_, err = ep.Runtime.StartContainer(ctx, &criapi.StartContainerRequest{ContainerId: cr.ContainerId})
				}
				if err != nil {
					b.Logf("%s: container: %v; skipped", ep.Name, err)
					ok = false
					break
				}
			}
		}
		if ok {
			podStats := Series{Name: fmt.Sprintf("%s ListPodSandboxStats (%d pods)", ep.Name, pods)}
			ctrStats := Series{Name: fmt.Sprintf("%s ListContainerStats (%d containers)", ep.Name, pods*perPod)}
			metrics := Series{Name: fmt.Sprintf("%s ListPodSandboxMetrics", ep.Name)}
			for i := 0; i < samples; i++ {
				for _, s := range []struct {
					series *Series
					call   func() error
				}{
					{&podStats, func() error {
						r, err := ep.Runtime.ListPodSandboxStats(ctx, &criapi.ListPodSandboxStatsRequest{})
						if err == nil && len(r.Stats) < pods {
							err = fmt.Errorf("%d pod stats", len(r.Stats))
						}
						return err
					}},
					{&ctrStats, func() error {
						r, err := ep.Runtime.ListContainerStats(ctx, &criapi.ListContainerStatsRequest{})
						if err == nil && len(r.Stats) < pods*perPod {
							err = fmt.Errorf("%d container stats", len(r.Stats))
						}
						return err
					}},
					{&metrics, func() error {
						_, err := ep.Runtime.ListPodSandboxMetrics(ctx, &criapi.ListPodSandboxMetricsRequest{})
						return err
					}},
				} {
					d, err := timed(s.call)
					if err != nil {
						if i == 0 {
							b.Logf("%s: %v (left out of the table)", s.series.Name, err)
						}
						continue
					}
					s.series.Samples = append(s.series.Samples, d)
				}
			}
			for _, s := range []Series{podStats, ctrStats, metrics} {
				if len(s.Samples) > 0 {
					series = append(series, s)
				}
			}
		}
		for _, id := range ids {
			if err := removePod(ctx, ep, id); err != nil {
				b.Errorf("%s: remove pod: %v", ep.Name, err)
			}
		}
	}
	if err := Report(os.Stdout, "stats_rpcs", series...); err != nil {
		b.Fatal(err)
	}
}
