// Package metrics exposes berthd's own Prometheus metrics on
// --metrics-address: CRI request latencies and errors by method, image pull
// bytes and durations, and object counts collected at scrape time.
package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

// Metrics holds berthd's collectors in a private registry (no global state).
type Metrics struct {
	Registry *prometheus.Registry

	rpcDuration *prometheus.HistogramVec
	rpcErrors   *prometheus.CounterVec
	// PullBytes counts bytes downloaded from registries.
	PullBytes prometheus.Counter
	// PullDuration observes whole PullImage calls that fetched something.
	PullDuration prometheus.Histogram
	// ConfigReloads counts SIGHUP reloads by result: success (every
	// change applied), partial (some kept, each logged) or failure (the
	// file did not load or validate; nothing changed).
	ConfigReloads *prometheus.CounterVec
}

// Results of a configuration reload (ConfigReloads' label).
const (
	ReloadSuccess = "success"
	ReloadPartial = "partial"
	ReloadFailure = "failure"
)

// New builds the collectors, with Go runtime and process metrics included.
func New() *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		rpcDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "berth", Subsystem: "cri", Name: "request_duration_seconds",
			Help:    "Latency of CRI requests by method.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 18),
		}, []string{"method"}),
		rpcErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "berth", Subsystem: "cri", Name: "request_errors_total",
			Help: "CRI requests that failed, by method and gRPC code.",
		}, []string{"method", "code"}),
		PullBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "berth", Subsystem: "image", Name: "pull_bytes_total",
			Help: "Bytes downloaded from registries.",
		}),
		PullDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "berth", Subsystem: "image", Name: "pull_duration_seconds",
			Help:    "Duration of image pulls.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 16),
		}),
		ConfigReloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "berth", Subsystem: "config", Name: "reloads_total",
			Help: "Configuration reloads (SIGHUP) by result: success, partial (some changed keys need a restart or are in use), failure (refused whole).",
		}, []string{"result"}),
	}
	for _, r := range []string{ReloadSuccess, ReloadPartial, ReloadFailure} {
		m.ConfigReloads.WithLabelValues(r)
	}
	m.Registry.MustRegister(m.rpcDuration, m.rpcErrors, m.PullBytes, m.PullDuration, m.ConfigReloads,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// CountFunc registers a gauge family computed at scrape time: fn returns
// a value per label value (e.g. pods by state).
func (m *Metrics) CountFunc(name, help, label string, fn func() map[string]float64) {
	m.Registry.MustRegister(&funcCollector{
		desc:  prometheus.NewDesc(name, help, []string{label}, nil),
		fn:    fn,
		vtype: prometheus.GaugeValue,
	})
}

// CounterFunc registers a counter family read at scrape time: fn returns
// each label value's total so far (e.g. per-container error counts kept
// elsewhere).
func (m *Metrics) CounterFunc(name, help, label string, fn func() map[string]float64) {
	m.Registry.MustRegister(&funcCollector{
		desc:  prometheus.NewDesc(name, help, []string{label}, nil),
		fn:    fn,
		vtype: prometheus.CounterValue,
	})
}

type funcCollector struct {
	desc  *prometheus.Desc
	fn    func() map[string]float64
	vtype prometheus.ValueType
}

func (c *funcCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *funcCollector) Collect(ch chan<- prometheus.Metric) {
	for label, v := range c.fn() {
		ch <- prometheus.MustNewConstMetric(c.desc, c.vtype, v, label)
	}
}

func (m *Metrics) observe(method string, start time.Time, err error) {
	m.rpcDuration.WithLabelValues(method).Observe(time.Since(start).Seconds())
	if err != nil {
		m.rpcErrors.WithLabelValues(method, status.Code(err).String()).Inc()
	}
}

// UnaryInterceptor records every unary CRI call.
func (m *Metrics) UnaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		start := time.Now()
		resp, err := handler(ctx, req)
		m.observe(info.FullMethod, start, err)
		return resp, err
	}
}

// StreamInterceptor records every streaming CRI call.
func (m *Metrics) StreamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		start := time.Now()
		err := handler(srv, ss)
		m.observe(info.FullMethod, start, err)
		return err
	}
}

// Server serves /metrics.
type Server struct {
	http *http.Server
	ln   net.Listener
}

// Listen binds addr for the metrics endpoint.
func (m *Metrics) Listen(addr string) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen for metrics on %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{}))
	return &Server{http: &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}, ln: ln}, nil
}

// Addr is the bound address.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Serve serves until Close.
func (s *Server) Serve() error {
	if err := s.http.Serve(s.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// Close stops serving.
func (s *Server) Close() error { return s.http.Close() }

// PulledBytes counts bytes downloaded by image pulls (image.PullObserver).
func (m *Metrics) PulledBytes(n int64) {
	if n > 0 {
		m.PullBytes.Add(float64(n))
	}
}

// PullDone observes a successful pull's duration (image.PullObserver).
func (m *Metrics) PullDone(took time.Duration) { m.PullDuration.Observe(took.Seconds()) }
