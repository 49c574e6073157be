// Package cri is berth's CRI v1 gRPC layer: one file per RPC, each of which
// validates the request, translates it into a call of a domain package
// (lifecycle flows through internal/lifecycle, reads straight from the
// stores) and maps errors to codes (errors.go). RPCs of a newer CRI than
// berth serves fall through to the embedded Unimplemented servers, which
// answer codes.Unimplemented naming the method.
package cri

import (
	"log/slog"
	"sync"

	"google.golang.org/grpc"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/cgroupctrl"
	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/container"
	"github.com/berthcri/berth/internal/events"
	"github.com/berthcri/berth/internal/image"
	"github.com/berthcri/berth/internal/lifecycle"
	"github.com/berthcri/berth/internal/liveconfig"
	"github.com/berthcri/berth/internal/network"
	"github.com/berthcri/berth/internal/sandbox"
	"github.com/berthcri/berth/internal/stats"
	"github.com/berthcri/berth/internal/streaming"
)

// Service implements runtime.v1.RuntimeService and runtime.v1.ImageService.
type Service struct {
	runtime.UnimplementedRuntimeServiceServer
	runtime.UnimplementedImageServiceServer

	cfg     *config.Config
	version string
	log     *slog.Logger
	addrs   Addresses

	// Components, one per line so that branches adding one merge cleanly.
	events     *events.Broker
	images     *image.Store
	network    *network.Network
	sandboxes  *sandbox.Store
	streaming  *streaming.Server
	containers *container.Store
	stats      *stats.Collector
	lifecycle  *lifecycle.Service
	cgroups    *cgroupctrl.Controllers
	// live is the configuration in effect, which a reload may change
	// (runtime handlers, the keys Status shows): load it once per request.
	// cfg is what berthd started with, for the keys read only at start.
	live *liveconfig.Holder

	// podCIDR is what the kubelet last sent through UpdateRuntimeConfig.
	mu      sync.Mutex
	podCIDR string
}

// Options are what the daemon hands the CRI layer.
type Options struct {
	Config  *config.Config
	Version string
	Logger  *slog.Logger
	// Addresses are where the side servers actually listen.
	Addresses Addresses

	Events     *events.Broker
	Images     *image.Store
	Network    *network.Network
	Sandboxes  *sandbox.Store
	Streaming  *streaming.Server
	Containers *container.Store
	// Stats samples cgroups for the stats RPCs; nil → the host's.
	Stats *stats.Collector
	// Lifecycle runs the pod and container flows (and tells NRI); nil →
	// one over Sandboxes and Containers with no hooks.
	Lifecycle *lifecycle.Service
	// Cgroups are the host's usable cgroup controllers, detected once at
	// start (Status shows them); nil → not reported.
	Cgroups *cgroupctrl.Controllers
	// HandlerFeatures maps runtime handler names to what they support,
	// used only when Live is nil.
	HandlerFeatures map[string]HandlerFeatures
	// Live is berthd's live configuration; nil serves Config as it is,
	// with HandlerFeatures.
	Live *liveconfig.Holder
}

// Addresses of berthd's side servers, resolved (port 0 replaced).
type Addresses struct {
	Streaming string
	Metrics   string // "" when off
}

// New builds the CRI service over the daemon's components.
func New(opts Options) *Service {
	s := &Service{
		cfg:     opts.Config,
		version: opts.Version,
		log:     opts.Logger,
		addrs:   opts.Addresses,

		events:     opts.Events,
		images:     opts.Images,
		network:    opts.Network,
		sandboxes:  opts.Sandboxes,
		streaming:  opts.Streaming,
		containers: opts.Containers,
		stats:      opts.Stats,
		lifecycle:  opts.Lifecycle,
		cgroups:    opts.Cgroups,
		live:       opts.Live,
	}
	if s.live == nil && s.cfg != nil {
		handlers := map[string]*liveconfig.Handler{}
		for name, h := range s.cfg.RuntimeHandlers {
			handlers[name] = &liveconfig.Handler{Name: name, Config: h, Features: opts.HandlerFeatures[name]}
		}
		s.live = liveconfig.NewHolder(liveconfig.NewSnapshot(1, s.cfg, handlers))
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.stats == nil {
		s.stats = stats.NewCollector(stats.CollectorOptions{})
	}
	if s.lifecycle == nil {
		s.lifecycle = lifecycle.New(lifecycle.Options{
			Sandboxes: s.sandboxes, Containers: s.containers, Live: s.live, Forget: s.stats.Forget, Logger: s.log,
		})
	}
	if s.events == nil {
		s.events = events.NewBroker()
	}
	return s
}

// Register attaches both CRI services to a gRPC server.
func (s *Service) Register(g *grpc.Server) {
	runtime.RegisterRuntimeServiceServer(g, s)
	runtime.RegisterImageServiceServer(g, s)
}
