// Package cri is berth's CRI v1 gRPC layer: one file per RPC, each of which
// validates the request, translates it into a call of a domain package
// (lifecycle flows through internal/lifecycle, reads straight from the
// stores) and maps errors to codes (errors.go). RPCs of a newer CRI than
// berth serves fall through to the embedded Unimplemented servers, which
// answer codes.Unimplemented naming the method.
package cri

import (
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"

	"google.golang.org/grpc"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/cgroupctrl"
	"github.com/berthcri/berth/internal/container"
	"github.com/berthcri/berth/internal/events"
	"github.com/berthcri/berth/internal/image"
	"github.com/berthcri/berth/internal/lifecycle"
	"github.com/berthcri/berth/internal/liveconfig"
	"github.com/berthcri/berth/internal/network"
	"github.com/berthcri/berth/internal/sandbox"
	"github.com/berthcri/berth/internal/specgen"
	"github.com/berthcri/berth/internal/stats"
	"github.com/berthcri/berth/internal/streaming"
)

// Service implements runtime.v1.RuntimeService and runtime.v1.ImageService.
type Service struct {
	runtime.UnimplementedRuntimeServiceServer
	runtime.UnimplementedImageServiceServer

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
	host       *specgen.Host
	// live is the configuration in effect, the only one the layer reads:
	// a reload may change its handlers and the keys Status shows; the
	// keys read only at start (root, cgroup driver) keep there the value
	// berthd started with. Load it once per request.
	live *liveconfig.Holder

	// podCIDR is what the kubelet last sent through UpdateRuntimeConfig.
	mu      sync.Mutex
	podCIDR string
}

// Options are what the daemon hands the CRI layer: every component is
// required (New refuses a nil one).
type Options struct {
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
	// Stats samples cgroups for the stats RPCs.
	Stats *stats.Collector
	// Lifecycle runs the pod and container flows (and tells NRI).
	Lifecycle *lifecycle.Service
	// Cgroups are the host's usable cgroup controllers, detected once at
	// start (Status shows them).
	Cgroups *cgroupctrl.Controllers
	// Host is the host's facts probed at start; the metrics convert
	// resources with them as create did (specgen.Resources).
	Host *specgen.Host
	// Live is berthd's live configuration.
	Live *liveconfig.Holder
}

// Addresses of berthd's side servers, resolved (port 0 replaced).
type Addresses struct {
	Streaming string
	Metrics   string // "" when off
}

// New builds the CRI service over the daemon's components. A missing one
// is a programming error, refused here rather than worked around: a
// stand-in (a lifecycle without NRI's hooks, a second configuration) would
// serve requests quietly wrong (decision 3700).
func New(opts Options) (*Service, error) {
	var missing []string
	for name, nilv := range map[string]bool{
		"Logger": opts.Logger == nil, "Events": opts.Events == nil, "Images": opts.Images == nil,
		"Network": opts.Network == nil, "Sandboxes": opts.Sandboxes == nil, "Streaming": opts.Streaming == nil,
		"Containers": opts.Containers == nil, "Stats": opts.Stats == nil, "Lifecycle": opts.Lifecycle == nil,
		"Cgroups": opts.Cgroups == nil, "Host": opts.Host == nil, "Live": opts.Live == nil,
	} {
		if nilv {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		return nil, fmt.Errorf("cri.New: Options %s not set", strings.Join(missing, ", "))
	}
	return &Service{
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
		host:       opts.Host,
		live:       opts.Live,
	}, nil
}

// Register attaches both CRI services to a gRPC server.
func (s *Service) Register(g *grpc.Server) {
	runtime.RegisterRuntimeServiceServer(g, s)
	runtime.RegisterImageServiceServer(g, s)
}
