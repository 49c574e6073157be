package tracing

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/config"
)

func TestOffIsNoop(t *testing.T) {
	p, err := New(context.Background(), Settings(config.Default().Tracing), "test")
	if err != nil {
		t.Fatal(err)
	}
	if p.Enabled() || p.ServerOptions() != nil {
		t.Fatal("tracing off by default, yet enabled or with server options")
	}
	ctx, span := Start(context.Background(), "x", AttrPodID.String("p"))
	if span.IsRecording() || trace.SpanFromContext(ctx).SpanContext().IsValid() {
		t.Fatal("a span without a parent records")
	}
	End(span, io.EOF)
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestStartIsAChildOfTheSpanInContext(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	ctx, parent := tp.Tracer("t").Start(context.Background(), "rpc")
	_, child := Start(ctx, "cni.add", AttrPodID.String("pod1"))
	End(child, io.ErrUnexpectedEOF)
	parent.End()
	spans := rec.Ended()
	if len(spans) != 2 || spans[0].Name() != "cni.add" {
		t.Fatalf("ended spans %v", spans)
	}
	c := spans[0]
	if c.Parent().SpanID() != parent.SpanContext().SpanID() {
		t.Error("child's parent is not the span in the context")
	}
	if c.Status().Description != io.ErrUnexpectedEOF.Error() || len(c.Events()) != 1 {
		t.Errorf("error not recorded: %v %v", c.Status(), c.Events())
	}
	if len(c.Attributes()) != 1 || c.Attributes()[0].Value.AsString() != "pod1" {
		t.Errorf("attributes %v", c.Attributes())
	}
}

func TestRequestAttrs(t *testing.T) {
	got := map[string]string{}
	for _, kv := range requestAttrs(&criapi.CreateContainerRequest{PodSandboxId: "p1",
		Config: &criapi.ContainerConfig{Image: &criapi.ImageSpec{Image: "busybox"}}}) {
		got[string(kv.Key)] = kv.Value.AsString()
	}
	if got["berth.pod.id"] != "p1" || got["berth.image.ref"] != "busybox" || len(got) != 2 {
		t.Errorf("CreateContainer attributes %v", got)
	}
	got = map[string]string{}
	for _, kv := range requestAttrs(&criapi.RunPodSandboxRequest{RuntimeHandler: "crun",
		Config: &criapi.PodSandboxConfig{Metadata: &criapi.PodSandboxMetadata{Name: "n", Namespace: "ns"}}}) {
		got[string(kv.Key)] = kv.Value.AsString()
	}
	if got["berth.runtime.handler"] != "crun" || got["berth.pod.name"] != "ns/n" {
		t.Errorf("RunPodSandbox attributes %v", got)
	}
}

// OTLP/HTTP: the spans are posted as protobuf to <endpoint>/v1/traces.
func TestHTTPProtobufExport(t *testing.T) {
	var mu sync.Mutex
	var names []string
	var paths []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var req collectortrace.ExportTraceServiceRequest
		if err := proto.Unmarshal(body, &req); err != nil {
			t.Errorf("decode export: %v", err)
		}
		mu.Lock()
		paths = append(paths, r.URL.Path)
		for _, rs := range req.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					names = append(names, s.Name)
				}
			}
		}
		mu.Unlock()
		out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.Write(out)
	}))
	defer srv.Close()
	cfg := config.Tracing{Enable: true, Endpoint: srv.URL, Protocol: config.TracingProtocolHTTP, SamplingRate: 1, ServiceName: "berth"}
	p, err := New(context.Background(), Settings(cfg), "test")
	if err != nil {
		t.Fatal(err)
	}
	ctx, rpc := p.tp.Tracer("t").Start(context.Background(), "rpc")
	_, child := Start(ctx, "shim.start")
	End(child, nil)
	rpc.End()
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(names) != 2 || len(paths) == 0 || paths[0] != "/v1/traces" {
		t.Fatalf("collector got spans %v at %v", names, paths)
	}
}

func TestNewRefusesUnknownProtocol(t *testing.T) {
	cfg := config.Default().Tracing
	cfg.Enable, cfg.Protocol = true, "udp"
	if _, err := New(context.Background(), Settings(cfg), "test"); err == nil {
		t.Fatal("protocol udp accepted")
	}
}

// The config validates the protocols New takes.
func TestProtocolsAreTheConfigs(t *testing.T) {
	if ProtocolGRPC != config.TracingProtocolGRPC || ProtocolHTTP != config.TracingProtocolHTTP {
		t.Fatalf("tracing protocols %q, %q; config's %q, %q", ProtocolGRPC, ProtocolHTTP, config.TracingProtocolGRPC, config.TracingProtocolHTTP)
	}
}
