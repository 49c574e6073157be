// Package cri is berth's CRI v1 gRPC layer: one file per RPC, each of which
// validates the request, calls a domain package and maps errors to codes.
// RPCs not built yet fall through to the embedded Unimplemented servers, which
// answer codes.Unimplemented naming the method.
package cri

import (
	"log/slog"
	"sync"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/grpc"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/cdi"
	"github.com/berthcri/berth/internal/cgroupctrl"
	"github.com/berthcri/berth/internal/checkpoint"
	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/container"
	"github.com/berthcri/berth/internal/events"
	"github.com/berthcri/berth/internal/image"
	"github.com/berthcri/berth/internal/liveconfig"
	"github.com/berthcri/berth/internal/network"
	"github.com/berthcri/berth/internal/nri"
	"github.com/berthcri/berth/internal/sandbox"
	"github.com/berthcri/berth/internal/specgen"
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
	nri        *nri.NRI
	cdi        *cdi.Registry
	apparmor   specgen.AppArmorProfiles
	criu       *checkpoint.CRIU
	// host is the machine as specgen sees it, probed once at start.
	host    *specgen.Host
	cgroups *cgroupctrl.Controllers
	// live is the configuration in effect, which a reload may change
	// (runtime handlers, the keys Status shows): load it once per request.
	// cfg is what berthd started with, for the keys read only at start.
	live *liveconfig.Holder

	// rlimits are every container's default rlimits (default_ulimits).
	rlimits []specs.POSIXRlimit

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
	// NRI relays lifecycle events to NRI plugins; nil → off.
	NRI *nri.NRI
	// CDI resolves CDI devices; nil refuses containers that ask for any.
	CDI *cdi.Registry
	// AppArmor loads the RuntimeDefault profile and looks profiles up
	// where AppArmor is on; nil refuses RuntimeDefault there.
	AppArmor specgen.AppArmorProfiles
	// Host is probed once at daemon start; nil → specgen probes per call.
	Host *specgen.Host
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
		nri:        opts.NRI,
		cdi:        opts.CDI,
		apparmor:   opts.AppArmor,

		host:    opts.Host,
		cgroups: opts.Cgroups,
		live:    opts.Live,
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
	if s.cfg != nil {
		s.criu = checkpoint.NewCRIU(s.cfg.CRIU)
	} else {
		s.criu = checkpoint.NewCRIU("")
	}
	if s.cfg != nil {
		// Validated with the config; an error cannot happen here.
		s.rlimits, _ = s.cfg.Rlimits()
	}
	if s.stats == nil {
		s.stats = stats.NewCollector(stats.CollectorOptions{})
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
