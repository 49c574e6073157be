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
	"github.com/berthcri/berth/internal/network"
	"github.com/berthcri/berth/internal/sandbox"
)

// Service implements runtime.v1.RuntimeService and runtime.v1.ImageService.
type Service struct {
	runtime.UnimplementedRuntimeServiceServer
	runtime.UnimplementedImageServiceServer

	cfg       *config.Config
	version   string
	log       *slog.Logger
	sandboxes *sandbox.Store
	network   *network.Network

	// podCIDR is what the kubelet last sent through UpdateRuntimeConfig.
	mu      sync.Mutex
	podCIDR string
}

// Options are what the daemon hands the CRI layer.
type Options struct {
	Config    *config.Config
	Version   string
	Logger    *slog.Logger
	Sandboxes *sandbox.Store
	Network   *network.Network
}

// New builds the CRI service over the daemon's components.
func New(opts Options) *Service {
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Service{cfg: opts.Config, version: opts.Version, log: log, sandboxes: opts.Sandboxes, network: opts.Network}
}

// Register attaches both CRI services to a gRPC server.
func (s *Service) Register(g *grpc.Server) {
	runtime.RegisterRuntimeServiceServer(g, s)
	runtime.RegisterImageServiceServer(g, s)
}
