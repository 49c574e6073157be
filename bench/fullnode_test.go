package bench

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/testutil/testimages"
)

// BenchmarkKubeletFullNode gives a real kubelet (hack/k8s-bins.sh's) a full
// node: 110 static pods at once, on berth and then on the reference
// runtime, each with a kubelet of its own; it writes
// kubelet_fullnode.json (fullnode.go says what is measured). Selected by
// $BENCH_WORKLOADS containing "kubelet full node" (or empty).
func BenchmarkKubeletFullNode(b *testing.B) {
	if !selected(os.Getenv("BENCH_WORKLOADS"), "kubelet full node") {
		b.Skip("kubelet full node not selected")
	}
	bins := KubeletBinDir(b)
	b.Logf("kubelet from %s", bins)
	reg := testimages.StartRegistry(b)
	bb, err := testimages.Busybox()
	reg.Push(b, "busybox:1.36", testimages.Must(b, bb, err))
	httpd, err := testimages.HTTPD()
	reg.Push(b, "busybox-httpd:1.0", testimages.Must(b, httpd, err))
	reg.Push(b, "pause:latest", pauseImage(b))
	images := []string{reg.Ref("busybox-httpd:1.0"), reg.Ref("busybox:1.36")}
	pods := FullNodePods
	if v := os.Getenv("BENCH_FULLNODE_PODS"); v != "" { // fewer, for a quick try
		if pods, err = strconv.Atoi(v); err != nil || pods < 1 {
			b.Fatalf("BENCH_FULLNODE_PODS=%q: want a positive number", v)
		}
	}

	var results []FullNodeResult
	run := func(b *testing.B, start func(b *testing.B) *Endpoint, pull ...string) {
		ep := start(b)
		if ep == nil {
			b.Skip("no reference runtime")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
		defer cancel()
		for _, img := range pull {
			if _, err := ep.Image.PullImage(ctx, &criapi.PullImageRequest{Image: &criapi.ImageSpec{Image: img}}); err != nil {
				b.Fatalf("%s: pull %s: %v", ep.Name, img, err)
			}
		}
		k := StartKubelet(b, ep, FullNodeKubeletConfig)
		res, err := FullNode(ctx, b, ep, k, pods, images[0], images[1])
		if err != nil {
			b.Fatalf("%s: %v", ep.Name, err)
		}
		b.Logf("%s: all %d Ready in %.1f s, stopped in %.1f s, removed in %.1f s", ep.Name, res.Pods, res.AllReadyS, res.AllStoppedS, res.AllRemovedS)
		results = append(results, res)
	}
	// Each runtime in a sub-benchmark of its own: its kubelet, pods and
	// daemon are gone before the next one starts.
	b.Run("berth", func(b *testing.B) {
		run(b, func(b *testing.B) *Endpoint {
			// info, berthd's default: what a node runs (the other
			// benchmarks log at debug).
			return StartBerthWith(b, "berth", func(c *config.Config) { c.LogLevel = config.DefaultLogLevel })
		}, images...)
	})
	if os.Getenv("BENCH_NO_REF") == "" {
		b.Run("reference", func(b *testing.B) {
			run(b, func(b *testing.B) *Endpoint { return StartReference(b, reg.Host) },
				append([]string{reg.Ref("pause:latest")}, images...)...)
		})
	}
	if err := WriteFullNode(os.Stdout, os.Getenv("BENCH_OUT"), results); err != nil {
		b.Fatal(err)
	}
}
