package integration

import (
	"context"
	"encoding/hex"
	"net"
	"strings"
	"sync"
	"testing"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracev1 "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/testimages"
)

// otlpCollector is an OTLP/gRPC trace receiver in the test process.
type otlpCollector struct {
	collectortrace.UnimplementedTraceServiceServer
	addr string

	mu       sync.Mutex
	exports  int
	services []string
	spans    []*tracev1.Span
}

func startCollector(t *testing.T) *otlpCollector {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &otlpCollector{addr: ln.Addr().String()}
	srv := grpc.NewServer()
	collectortrace.RegisterTraceServiceServer(srv, c)
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	return c
}

func (c *otlpCollector) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.exports++
	for _, rs := range req.ResourceSpans {
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.Key == "service.name" {
				c.services = append(c.services, kv.GetValue().GetStringValue())
			}
		}
		for _, ss := range rs.ScopeSpans {
			c.spans = append(c.spans, ss.Spans...)
		}
	}
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

func (c *otlpCollector) received() (int, []string, []*tracev1.Span) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.exports, append([]string(nil), c.services...), append([]*tracev1.Span(nil), c.spans...)
}

func spanAttr(s *tracev1.Span, key string) string {
	for _, kv := range s.Attributes {
		if kv.Key == key {
			return kv.GetValue().GetStringValue()
		}
	}
	return ""
}

// A pod start whose requests carry the kubelet's traceparent reaches the
// collector as one trace: each CRI RPC a child of the caller's span, and
// the steps below them (layers, CNI, shim, OCI runtime) children of those.
// Sampling is 0: only the caller's sampled flag makes these spans.
func TestTracingExportsPodStartUnderCallersTrace(t *testing.T) {
	t.Parallel()
	col := startCollector(t)
	d := berthdtest.Start(t, berthdtest.Options{Configure: func(c *config.Config) {
		c.Tracing = config.Tracing{Enable: true, Endpoint: col.addr, Protocol: config.TracingProtocolGRPC,
			SamplingRate: 0, ServiceName: "berth-under-test"}
	}})
	reg := testimages.StartRegistry(t)
	reg.PushStandard(t)

	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	const parentID = "00f067aa0ba902b7"
	ctx := metadata.AppendToOutgoingContext(berthdtest.Ctx(t), "traceparent", "00-"+traceID+"-"+parentID+"-01")
	ref := reg.Ref("busybox:latest")
	if _, err := d.Image.PullImage(ctx, &criapi.PullImageRequest{Image: &criapi.ImageSpec{Image: ref}}); err != nil {
		t.Fatal(err)
	}
	podCfg := podConfig("traced")
	podCfg.Linux.CgroupParent = ""
	run, err := d.Runtime.RunPodSandbox(ctx, &criapi.RunPodSandboxRequest{Config: podCfg})
	if err != nil {
		t.Fatal(err)
	}
	pod := run.PodSandboxId
	cr, err := d.Runtime.CreateContainer(ctx, &criapi.CreateContainerRequest{PodSandboxId: pod, SandboxConfig: podCfg,
		Config: &criapi.ContainerConfig{
			Metadata: &criapi.ContainerMetadata{Name: "c"},
			Image:    &criapi.ImageSpec{Image: ref},
			Command:  []string{"sleep", "3600"},
			Linux: &criapi.LinuxContainerConfig{SecurityContext: &criapi.LinuxContainerSecurityContext{
				NamespaceOptions: &criapi.NamespaceOption{Pid: criapi.NamespaceMode_CONTAINER},
			}},
		}})
	if err != nil {
		t.Fatal(err)
	}
	ctr := cr.ContainerId
	if _, err := d.Runtime.StartContainer(ctx, &criapi.StartContainerRequest{ContainerId: ctr}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Runtime.StopPodSandbox(ctx, &criapi.StopPodSandboxRequest{PodSandboxId: pod}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Runtime.RemovePodSandbox(ctx, &criapi.RemovePodSandboxRequest{PodSandboxId: pod}); err != nil {
		t.Fatal(err)
	}
	// Not traced: sampling 0 and no caller's context.
	if _, err := d.Runtime.Version(berthdtest.Ctx(t), &criapi.VersionRequest{}); err != nil {
		t.Fatal(err)
	}
	// Stopping flushes the batch: no waiting on the exporter's timer.
	d.Stop()

	_, services, spans := col.received()
	if len(spans) == 0 {
		t.Fatalf("collector received no spans; berthd logs:\n%s", d.Logs())
	}
	for _, s := range services {
		if s != "berth-under-test" {
			t.Errorf("service.name %q, want berth-under-test", s)
		}
	}
	byID := map[string]*tracev1.Span{}
	byName := map[string][]*tracev1.Span{}
	for _, s := range spans {
		if got := hex.EncodeToString(s.TraceId); got != traceID {
			t.Errorf("span %s in trace %s, want the caller's %s", s.Name, got, traceID)
		}
		byID[hex.EncodeToString(s.SpanId)] = s
		byName[s.Name] = append(byName[s.Name], s)
	}
	if len(byName["runtime.v1.RuntimeService/Version"]) != 0 {
		t.Errorf("an untraced Version call was sampled at rate 0")
	}
	// rpc is the one span of a CRI method, a child of the caller's span.
	rpc := func(method string) *tracev1.Span {
		t.Helper()
		ss := byName[method]
		if len(ss) != 1 {
			t.Fatalf("%d spans named %s; got %v", len(ss), method, names(spans))
		}
		if p := hex.EncodeToString(ss[0].ParentSpanId); p != parentID {
			t.Errorf("%s's parent is %s, want the caller's %s", method, p, parentID)
		}
		if ss[0].Kind != tracev1.Span_SPAN_KIND_SERVER {
			t.Errorf("%s is a %s span, want server", method, ss[0].Kind)
		}
		return ss[0]
	}
	pull := rpc("runtime.v1.ImageService/PullImage")
	runPod := rpc("runtime.v1.RuntimeService/RunPodSandbox")
	create := rpc("runtime.v1.RuntimeService/CreateContainer")
	start := rpc("runtime.v1.RuntimeService/StartContainer")
	stop := rpc("runtime.v1.RuntimeService/StopPodSandbox")
	rpc("runtime.v1.RuntimeService/RemovePodSandbox")

	if got := spanAttr(pull, "berth.image.ref"); got != ref {
		t.Errorf("PullImage's berth.image.ref %q, want %q", got, ref)
	}
	if got := spanAttr(create, "berth.pod.id"); got != pod {
		t.Errorf("CreateContainer's berth.pod.id %q, want %q", got, pod)
	}
	if got := spanAttr(start, "berth.container.id"); got != ctr {
		t.Errorf("StartContainer's berth.container.id %q, want %q", got, ctr)
	}
	if got := spanAttr(runPod, "berth.pod.name"); got != "default/traced" {
		t.Errorf("RunPodSandbox's berth.pod.name %q", got)
	}

	// under tells whether s descends from anc.
	under := func(s, anc *tracev1.Span) bool {
		for p := s; p != nil; p = byID[hex.EncodeToString(p.ParentSpanId)] {
			if p == anc {
				return true
			}
		}
		return false
	}
	want := func(name string, anc *tracev1.Span) {
		t.Helper()
		for _, s := range byName[name] {
			if under(s, anc) {
				return
			}
		}
		t.Errorf("no %s span under %s; got %v", name, anc.Name, names(spans))
	}
	// busybox is one layer: fetched and unpacked once.
	want("image.layer.fetch", pull)
	want("image.layer.unpack", pull)
	for _, s := range byName["image.layer.fetch"] {
		if !strings.HasPrefix(spanAttr(s, "berth.layer.digest"), "sha256:") {
			t.Errorf("layer span without its digest: %v", s.Attributes)
		}
	}
	want("cni.add", runPod)
	want("cni.del", stop)
	want("shim.create", create)
	want("shim.start", start)
}

func names(spans []*tracev1.Span) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name)
	}
	return out
}

// With tracing off (the default) nothing is exported, even to a collector
// that listens where the endpoint points and for a sampled caller.
func TestTracingOffExportsNothing(t *testing.T) {
	t.Parallel()
	col := startCollector(t)
	d := berthdtest.Start(t, berthdtest.Options{Configure: func(c *config.Config) {
		c.Tracing.Endpoint = col.addr
	}})
	reg := testimages.StartRegistry(t)
	reg.PushStandard(t)
	ctx := metadata.AppendToOutgoingContext(berthdtest.Ctx(t), "traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	if _, err := d.Image.PullImage(ctx, &criapi.PullImageRequest{Image: &criapi.ImageSpec{Image: reg.Ref("busybox:latest")}}); err != nil {
		t.Fatal(err)
	}
	podCfg := podConfig("untraced")
	podCfg.Linux.CgroupParent = ""
	run, err := d.Runtime.RunPodSandbox(ctx, &criapi.RunPodSandboxRequest{Config: podCfg})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Runtime.RemovePodSandbox(ctx, &criapi.RemovePodSandboxRequest{PodSandboxId: run.PodSandboxId}); err != nil {
		t.Fatal(err)
	}
	d.Stop()
	if n, _, spans := col.received(); n != 0 || len(spans) != 0 {
		t.Fatalf("tracing off: %d exports with %d spans reached the collector", n, len(spans))
	}
}
