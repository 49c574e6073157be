// Package cri is berth's CRI v1 gRPC layer: one file per RPC, each of which
// validates the request, calls a domain package and maps errors to codes.
// RPCs not built yet fall through to the embedded Unimplemented servers, which
// answer codes.Unimplemented naming the method.
package cri

import (
	"log/slog"
	"sync"

	"google.golang.org/grpc"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/container"
	"github.com/berthcri/berth/internal/events"
	"github.com/berthcri/berth/internal/image"
)

// Service implements runtime.v1.RuntimeService and runtime.v1.ImageService.
type Service struct {
	runtime.UnimplementedRuntimeServiceServer
	runtime.UnimplementedImageServiceServer

	cfg     *config.Config
	version string
	log     *slog.Logger
	events  *events.Broker
	addrs   Addresses
	images  *image.Store
	// containers: records, lifecycle, shims.
	containers *container.Store

	// podCIDR is what the kubelet last sent through UpdateRuntimeConfig.
	mu      sync.Mutex
	podCIDR string
}

// Options are what the daemon hands the CRI layer.
type Options struct {
	Config  *config.Config
	Version string
	Logger  *slog.Logger
	Events  *events.Broker
	Images  *image.Store
	// Containers is the container store.
	Containers *container.Store
	// Addresses are where the side servers actually listen.
	Addresses Addresses
}

// Addresses of berthd's side servers, resolved (port 0 replaced).
type Addresses struct {
	Streaming string
	Metrics   string // "" when off
}

// New builds the CRI service over the daemon's components.
func New(opts Options) *Service {
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	ev := opts.Events
	if ev == nil {
		ev = events.NewBroker()
	}
	return &Service{cfg: opts.Config, version: opts.Version, log: log, events: ev, addrs: opts.Addresses, images: opts.Images, containers: opts.Containers}
}

// Register attaches both CRI services to a gRPC server.
func (s *Service) Register(g *grpc.Server) {
	runtime.RegisterRuntimeServiceServer(g, s)
	runtime.RegisterImageServiceServer(g, s)
}
