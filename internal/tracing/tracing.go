// Package tracing exports OpenTelemetry traces of CRI requests over OTLP
// (docs/tracing.md, decision 2500).
//
// The daemon builds one Provider from the [tracing] config and hands its
// gRPC server option to the CRI server. Every CRI RPC then gets a span
// that continues the caller's W3C trace context (the kubelet sends a
// traceparent in the gRPC metadata), and the expensive steps below it
// start child spans with Start, which takes the TracerProvider from the
// span already in the context: no global is set and nothing is plumbed
// through the packages. With tracing off there is no span in the
// context, so Start gets OpenTelemetry's noop tracer and costs a few
// nanoseconds.
package tracing

import (
	"context"
	"fmt"
	"net/url"
	"strings"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// ScopeName is the instrumentation scope of berth's own spans.
const ScopeName = "github.com/berthcri/berth"

// Attribute keys of berth's spans.
const (
	AttrPodID       = attribute.Key("berth.pod.id")
	AttrContainerID = attribute.Key("berth.container.id")
	AttrImage       = attribute.Key("berth.image.ref")
	AttrHandler     = attribute.Key("berth.runtime.handler")
	AttrPodName     = attribute.Key("berth.pod.name")
	AttrLayer       = attribute.Key("berth.layer.digest")
	AttrOp          = attribute.Key("berth.op")
)

// Settings are the [tracing] config keys (config.Tracing converts to it:
// the fields are the same). Its own type keeps config out of the imports
// of every package that starts a span.
type Settings struct {
	Enable       bool
	Endpoint     string
	Protocol     string
	SamplingRate float64
	ServiceName  string
}

// The export protocols, as config.Tracing names them.
const (
	ProtocolGRPC = "grpc"
	ProtocolHTTP = "http/protobuf"
)

// Provider is the daemon's tracer provider, or nothing when tracing is off.
type Provider struct {
	tp *sdktrace.TracerProvider // nil: off
}

// New builds the provider cfg asks for. With tracing off it returns a
// Provider whose ServerOptions are empty. The exporter connects lazily:
// a collector that is not there yet costs dropped spans, not a start.
func New(ctx context.Context, cfg Settings, version string) (*Provider, error) {
	if !cfg.Enable {
		return &Provider{}, nil
	}
	exp, err := exporter(ctx, cfg)
	if err != nil {
		return nil, err
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(
		attribute.String("service.name", cfg.ServiceName), attribute.String("service.version", version)))
	if err != nil {
		return nil, fmt.Errorf("tracing resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(cfg.SamplingRate))),
	)
	return &Provider{tp: tp}, nil
}

func exporter(ctx context.Context, cfg Settings) (*otlptrace.Exporter, error) {
	ep := cfg.Endpoint
	isURL := strings.Contains(ep, "://")
	if isURL {
		u, err := url.Parse(ep)
		if err != nil {
			return nil, fmt.Errorf("tracing.endpoint %q: %w", ep, err)
		}
		if cfg.Protocol == ProtocolHTTP && strings.Trim(u.Path, "/") == "" {
			// As OTEL_EXPORTER_OTLP_ENDPOINT: a base URL gets the
			// signal's path (the exporter would post to "/").
			u.Path = "/v1/traces"
			ep = u.String()
		}
	}
	switch cfg.Protocol {
	case ProtocolGRPC:
		opts := []otlptracegrpc.Option{}
		if isURL {
			opts = append(opts, otlptracegrpc.WithEndpointURL(ep))
		} else {
			opts = append(opts, otlptracegrpc.WithEndpoint(ep), otlptracegrpc.WithInsecure())
		}
		exp, err := otlptracegrpc.New(ctx, opts...)
		if err != nil {
			return nil, fmt.Errorf("OTLP gRPC exporter to %s: %w", ep, err)
		}
		return exp, nil
	case ProtocolHTTP:
		opts := []otlptracehttp.Option{}
		if isURL {
			opts = append(opts, otlptracehttp.WithEndpointURL(ep))
		} else {
			opts = append(opts, otlptracehttp.WithEndpoint(ep), otlptracehttp.WithInsecure())
		}
		exp, err := otlptracehttp.New(ctx, opts...)
		if err != nil {
			return nil, fmt.Errorf("OTLP HTTP exporter to %s: %w", ep, err)
		}
		return exp, nil
	}
	return nil, fmt.Errorf("tracing.protocol %q: want %s or %s", cfg.Protocol, ProtocolGRPC, ProtocolHTTP)
}

// Enabled tells whether spans are exported.
func (p *Provider) Enabled() bool { return p != nil && p.tp != nil }

// ServerOptions are the CRI server's: a stats handler that starts a span
// per RPC from the caller's traceparent, and an interceptor that names the
// pod, container, image and handler on it. None when tracing is off.
func (p *Provider) ServerOptions() []grpc.ServerOption {
	if !p.Enabled() {
		return nil
	}
	return []grpc.ServerOption{
		grpc.StatsHandler(otelgrpc.NewServerHandler(
			otelgrpc.WithTracerProvider(p.tp),
			otelgrpc.WithPropagators(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})),
			otelgrpc.WithMeterProvider(metricnoop.NewMeterProvider()),
		)),
	}
}

// UnaryInterceptor sets the request's IDs on the RPC's span; it does
// nothing (and allocates nothing) when that span does not record.
func UnaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if span := trace.SpanFromContext(ctx); span.IsRecording() {
			span.SetAttributes(requestAttrs(req)...)
		}
		return handler(ctx, req)
	}
}

// The getters CRI requests share.
type (
	podIDer       interface{ GetPodSandboxId() string }
	containerIDer interface{ GetContainerId() string }
	handlerer     interface{ GetRuntimeHandler() string }
)

func requestAttrs(req any) []attribute.KeyValue {
	var out []attribute.KeyValue
	if r, ok := req.(podIDer); ok && r.GetPodSandboxId() != "" {
		out = append(out, AttrPodID.String(r.GetPodSandboxId()))
	}
	if r, ok := req.(containerIDer); ok && r.GetContainerId() != "" {
		out = append(out, AttrContainerID.String(r.GetContainerId()))
	}
	if r, ok := req.(handlerer); ok && r.GetRuntimeHandler() != "" {
		out = append(out, AttrHandler.String(r.GetRuntimeHandler()))
	}
	if r, ok := req.(*criapi.RunPodSandboxRequest); ok {
		if md := r.GetConfig().GetMetadata(); md != nil {
			out = append(out, AttrPodName.String(md.GetNamespace()+"/"+md.GetName()))
		}
	}
	if ref := imageRef(req); ref != "" {
		out = append(out, AttrImage.String(ref))
	}
	return out
}

// Shutdown flushes the spans still queued; ctx bounds it.
func (p *Provider) Shutdown(ctx context.Context) error {
	if !p.Enabled() {
		return nil
	}
	if err := p.tp.Shutdown(ctx); err != nil {
		return fmt.Errorf("flush traces: %w", err)
	}
	return nil
}

// Start starts a child span of the one in ctx, from that span's provider:
// a noop span when ctx carries none (tracing off, or a background job).
func Start(ctx context.Context, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	parent := trace.SpanFromContext(ctx)
	if !parent.IsRecording() {
		// Off, or not sampled: no attributes to build, no span to start.
		return ctx, parent
	}
	return parent.TracerProvider().Tracer(ScopeName).Start(ctx, name, trace.WithAttributes(attrs...))
}

// End records err (if any) on span and ends it.
func End(span trace.Span, err error) {
	if err != nil && span.IsRecording() {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// imageRef is the image a request names.
func imageRef(req any) string {
	switch r := req.(type) {
	case *criapi.PullImageRequest:
		return r.GetImage().GetImage()
	case *criapi.ImageStatusRequest:
		return r.GetImage().GetImage()
	case *criapi.RemoveImageRequest:
		return r.GetImage().GetImage()
	case *criapi.CreateContainerRequest:
		return r.GetConfig().GetImage().GetImage()
	}
	return ""
}
