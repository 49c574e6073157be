package kubelet

import (
	"context"
	"encoding/hex"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracev1 "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
)

// spanOf is one span received, with its resource's service.name.
type spanOf struct {
	service string
	span    *tracev1.Span
}

// collector is an OTLP/gRPC trace receiver both the kubelet and berthd
// export to.
type collector struct {
	collectortrace.UnimplementedTraceServiceServer
	mu    sync.Mutex
	spans []spanOf
}

func (c *collector) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rs := range req.ResourceSpans {
		svc := ""
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.Key == "service.name" {
				svc = kv.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				c.spans = append(c.spans, spanOf{svc, s})
			}
		}
	}
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

func (c *collector) received() []spanOf {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]spanOf(nil), c.spans...)
}

const tracedPod = `apiVersion: v1
kind: Pod
metadata:
  name: traced
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: main
    image: {{BUSYBOX}}
    command: [sleep, "3600"]
`

// TestKubeletTracingContinuesIntoBerth runs a static pod through a kubelet
// whose tracing (KubeletTracing, GA) samples everything, and a berthd
// whose own sampling is 0: berth's spans of the pod start exist only
// because the kubelet's traceparent asked for them, and each CRI RPC's
// span is a child of the kubelet's client span of that call.
func TestKubeletTracingContinuesIntoBerth(t *testing.T) {
	t.Parallel()
	berthdtest.RequireRoot(t)
	bins := k8sBins(t, "kubelet")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	col := &collector{}
	srv := grpc.NewServer()
	collectortrace.RegisterTraceServiceServer(srv, col)
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	addr := ln.Addr().String()

	e := newEnv(t, bins, envOptions{
		Berthd: berthdtest.Options{Configure: func(c *config.Config) {
			c.Tracing = config.Tracing{Enable: true, Endpoint: addr, Protocol: config.TracingProtocolGRPC,
				SamplingRate: 0, ServiceName: "berth"}
		}},
		Kubelet: kubeletOptions{ExtraConfig: fmt.Sprintf("tracing:\n  endpoint: %s\n  samplingRatePerMillion: 1000000\n", addr)},
	})
	k := e.k
	k.Apply(t, "traced", render(tracedPod, map[string]string{"BUSYBOX": busyboxImage}))
	k.WaitPod(t, "traced", "Ready", 3*time.Minute, podReady)

	// berth's server span of method m whose parent is the kubelet's client
	// span of the same call.
	linked := func(m string) bool {
		spans := col.received()
		kubelet := map[string]*tracev1.Span{}
		for _, s := range spans {
			if s.service == "kubelet" {
				kubelet[hex.EncodeToString(s.span.SpanId)] = s.span
			}
		}
		for _, s := range spans {
			if s.service != "berth" || s.span.Name != m {
				continue
			}
			p := kubelet[hex.EncodeToString(s.span.ParentSpanId)]
			if p != nil && strings.HasSuffix(p.Name, m) && string(p.TraceId) == string(s.span.TraceId) {
				return true
			}
		}
		return false
	}
	// Both sides export in batches, every 5 s.
	for _, m := range []string{"runtime.v1.RuntimeService/RunPodSandbox", "runtime.v1.ImageService/PullImage",
		"runtime.v1.RuntimeService/CreateContainer", "runtime.v1.RuntimeService/StartContainer"} {
		waitFor(t, "berth's "+m+" span under the kubelet's", time.Minute, func() bool { return linked(m) })
	}
	var names []string
	for _, s := range col.received() {
		if s.service == "berth" {
			names = append(names, s.span.Name)
		}
	}
	for _, want := range []string{"image.layer.fetch", "cni.add", "shim.create", "shim.start"} {
		found := false
		for _, n := range names {
			found = found || n == want
		}
		if !found {
			t.Errorf("no %s span from berth; got %v", want, names)
		}
	}

	k.Delete(t, "traced")
	k.WaitGone(t, "traced", 2*time.Minute)
	waitFor(t, "the kubelet to remove the sandbox", 150*time.Second, func() bool {
		sbs, err := e.d.Runtime.ListPodSandbox(context.Background(), &criapi.ListPodSandboxRequest{})
		return err == nil && len(sbs.Items) == 0
	})
}
