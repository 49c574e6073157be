package bench

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/testimages"
)

// spanSink is an OTLP/gRPC trace receiver that counts and drops spans.
type spanSink struct {
	collectortrace.UnimplementedTraceServiceServer
	spans atomic.Int64
}

func (s *spanSink) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	for _, rs := range req.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			s.spans.Add(int64(len(ss.Spans)))
		}
	}
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

// startBerthNamed starts a berthd named name for the comparison, its
// config changed by configure.
func startBerthNamed(tb testing.TB, name string, configure func(*config.Config)) *Endpoint {
	d := berthdtest.Start(tb, berthdtest.Options{Configure: configure})
	return &Endpoint{Name: name, Runtime: d.Runtime, Image: d.Image, Dir: d.Dir, Daemon: d,
		Pids: func() []int { return []int{d.Pid()} }}
}

// BenchmarkTracing measures pod start end to end with tracing off (the
// default) and on (every span sampled and exported over OTLP/gRPC to a
// sink in this process), alternating sample by sample, plus the berthd
// of $BENCH_REF_BERTHD when set (the build before tracing existed). It
// writes tracing/compare.{md,json,png} under $BENCH_OUT.
func BenchmarkTracing(b *testing.B) {
	reg := testimages.StartRegistry(b)
	reg.PushStandard(b)
	image := reg.Ref(testimages.BusyboxRef)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	sink := &spanSink{}
	srv := grpc.NewServer()
	collectortrace.RegisterTraceServiceServer(srv, sink)
	go srv.Serve(ln)
	defer srv.Stop()

	eps := []*Endpoint{
		startBerthNamed(b, "tracing off", nil),
		startBerthNamed(b, "tracing on", func(c *config.Config) {
			c.Tracing = config.Tracing{Enable: true, Endpoint: ln.Addr().String(), Protocol: config.TracingProtocolGRPC,
				SamplingRate: 1, ServiceName: "berth-bench"}
		}),
	}
	if bin := os.Getenv("BENCH_REF_BERTHD"); bin != "" {
		ref := startOtherBerthd(b, bin)
		ref.Name = "before"
		eps = append(eps, ref)
	}
	names := make([]string, len(eps))
	for i, ep := range eps {
		names[i] = ep.Name
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	cmp := NewComparison(names...)
	for _, ep := range eps {
		if _, err := ep.Image.PullImage(ctx, &criapi.PullImageRequest{Image: &criapi.ImageSpec{Image: image}}); err != nil {
			b.Fatalf("%s: pull %s: %v", ep.Name, image, err)
		}
	}
	cmp.Run(ctx, Workload{
		Name: "pod start end to end", Samples: 30,
		Sample: podStartSample(image, "RunPodSandbox+CreateContainer+StartContainer"),
	}, eps...)
	dir := os.Getenv("BENCH_OUT")
	if dir != "" {
		dir = filepath.Join(dir, "tracing")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			b.Fatal(err)
		}
	}
	if err := cmp.Write(os.Stdout, dir); err != nil {
		b.Fatal(err)
	}
	// Spans still batched are flushed at stop; those counted here came
	// out during the run.
	b.Logf("spans exported during the run: %d", sink.spans.Load())
}
