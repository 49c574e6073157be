package daemon

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"google.golang.org/grpc"

	"github.com/berthcri/berth/internal/admin"
	"github.com/berthcri/berth/internal/apparmor"
	"github.com/berthcri/berth/internal/atomicfile"
	"github.com/berthcri/berth/internal/cdi"
	"github.com/berthcri/berth/internal/checkpoint"
	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/container"
	"github.com/berthcri/berth/internal/cri"
	"github.com/berthcri/berth/internal/fault"
	"github.com/berthcri/berth/internal/hostprobe"
	"github.com/berthcri/berth/internal/image"
	"github.com/berthcri/berth/internal/lifecycle"
	"github.com/berthcri/berth/internal/liveconfig"
	"github.com/berthcri/berth/internal/network"
	"github.com/berthcri/berth/internal/nri"
	"github.com/berthcri/berth/internal/oci"
	"github.com/berthcri/berth/internal/sandbox"
	"github.com/berthcri/berth/internal/shim"
	"github.com/berthcri/berth/internal/sigpolicy"
	"github.com/berthcri/berth/internal/statetree"
	"github.com/berthcri/berth/internal/stats"
	"github.com/berthcri/berth/internal/streaming"
	"github.com/berthcri/berth/internal/systemd"
	"github.com/berthcri/berth/internal/tracing"
)

// The steps of New, in its order. Each sets fields of d that later steps
// read; none reads a field a later step sets.

// openRoot creates the root and state directories, takes the root lock
// and listens on the CRI socket.
func (d *Daemon) openRoot(context.Context) error {
	// Others may traverse the two, never list them (decision 3400): a
	// user namespace pod's root passes through to its rootfs; everything
	// below is closed by the store that makes it.
	for _, dir := range []string{d.cfg.Root, d.cfg.State} {
		if err := statetree.Mkdir(dir, statetree.Traverse); err != nil {
			return err
		}
	}
	lock, err := lockRoot(d.cfg.Root)
	if err != nil {
		return err
	}
	d.lock = lock
	d.listener, err = listenUnix(d.cfg.SocketPath())
	return err
}

// loadFaults reads the fault injection points the stores honour
// (decision 0900).
func (d *Daemon) loadFaults(context.Context) (err error) {
	d.faults, err = fault.FromEnv(d.log)
	return err
}

// openLiveConfig makes the first snapshot of the live configuration; its
// handlers' features are added by probeHandlers, once the sandbox store
// can tell about user namespaces.
func (d *Daemon) openLiveConfig(context.Context) error {
	d.runtimes = liveconfig.Runtimes(d.cfg)
	policy, err := sigpolicy.Load(d.cfg.SignaturePolicy)
	if err != nil {
		return err
	}
	logPolicy(d.log, policy, d.cfg.SignaturePolicy)
	first := liveconfig.NewSnapshot(1, d.cfg, handlersOf(d.cfg, d.runtimes, nil))
	first.SignaturePolicy = policy
	d.live = liveconfig.NewHolder(first)
	d.deferred = atomicfile.NewDeferred(func(path string, err error) {
		d.log.Warn("background fsync failed; the file may not survive a power loss", "path", path, "err", err)
	})
	return nil
}

func (d *Daemon) openImages(context.Context) (err error) {
	// Read at start only, like [image_range_fetch].
	l := d.cfg.ImageLimits
	limits := image.Limits{
		MaxLayerSize: int64(l.MaxLayerSize), MaxImageSize: int64(l.MaxImageSize),
		MaxLayerEntries: l.MaxLayerEntries, MaxLayerDirs: l.MaxLayerDirs,
	}
	d.images, err = image.Open(image.Options{
		Root:         filepath.Join(d.cfg.Root, "images"),
		PinnedImages: d.cfg.PinnedImages,
		Logger:       d.log.With("component", "image"),
		Observer:     d.m,
		Faults:       d.faults,
		// Lazy layers outlive berthd in the node's keeper (decision 3600).
		LazyHolder: keeperLazyHolder{binary: shim.Binary(), shimsDir: filepath.Join(d.cfg.State, "shims")},
		LazySocket: filepath.Join(d.cfg.Root, "lazy.sock"),
		// Read by each pull as it starts (decision 2300).
		Settings: func() image.PullSettings {
			live := d.live.Load()
			return image.PullSettings{
				RegistryConfigDir:   live.Config.RegistryConfigDir,
				ProgressTimeout:     live.PullProgressTimeout(),
				SignaturePolicy:     live.ImageSignaturePolicy(),
				RangeFetch:          rangeFetch(live.Config.ImageRangeFetch),
				LazyPull:            live.Config.ImageLazyPull.Enable,
				LazyBackgroundQuiet: time.Duration(live.Config.ImageLazyPull.BackgroundFetchQuiet),
				Limits:              limits,
			}
		},
	})
	if err != nil {
		return fmt.Errorf("open image store: %w", err)
	}
	return nil
}

func (d *Daemon) listenMetrics(context.Context) (err error) {
	if d.cfg.MetricsAddress != "" {
		d.metrics, err = d.m.Listen(d.cfg.MetricsAddress)
	}
	return err
}

// probeNode asks the node, once, what every later request relies on: the
// systemd connection (the systemd driver is refused here rather than on
// every RunPodSandbox), the usable cgroup controllers, the CDI specs, the
// host's facts for specs; and sets up pod networking.
func (d *Daemon) probeNode(ctx context.Context) (err error) {
	cfg := d.cfg
	// The CNI plugins' IP leases and caches name every pod: berthd's
	// alone (decision 3400); the plugins make the dirs below 0755.
	for _, dir := range []string{filepath.Join(cfg.Root, "cni"), filepath.Join(cfg.State, "cni")} {
		if err := statetree.Mkdir(dir, statetree.Private); err != nil {
			return err
		}
	}
	d.network = network.New(network.Options{
		ConfDir: cfg.CNIConfDir, BinDirs: cfg.CNIBinDirs,
		CacheDir:    filepath.Join(cfg.State, "cni", "cache"),
		IPAMDataDir: filepath.Join(cfg.Root, "cni", "networks"),
		Bridge:      cfg.DefaultNetwork.Bridge, Subnet: cfg.DefaultNetwork.Subnet,
		Logger: d.log,
	})
	if cfg.CgroupDriver == config.CgroupDriverSystemd {
		if d.systemd, err = systemd.Dial(ctx, d.log.With("component", "systemd")); err != nil {
			return err
		}
	}
	if d.cgroups, err = detectCgroups(cfg, d.log); err != nil {
		return err
	}
	// One CDI registry, for specgen and NRI.
	d.devices = cdi.New(cfg.CDISpecDirs, d.log.With("component", "cdi"))
	if d.host, err = hostprobe.Probe(d.faults); err != nil {
		return err
	}
	if !d.host.Spec.SwapAccounting {
		// As containerd and CRI-O: the limit cannot be kept, so it is
		// left out rather than failing every container (decision 3700).
		d.log.Warn("the host has no swap accounting: swap limits (memory_swap_limit_in_bytes) are not applied")
	}
	return nil
}

// openContainers recovers the container store. Its events go to d.events,
// whose subscribers later steps add.
func (d *Daemon) openContainers(ctx context.Context) (err error) {
	d.containers, err = container.Open(ctx, container.Options{
		Dir:        filepath.Join(d.cfg.Root, "containers"),
		ShimDir:    filepath.Join(d.cfg.State, "shims"),
		ShimBinary: shim.Binary(),
		RuntimeFor: func(handler string) (*oci.Runtime, bool) {
			h, ok := d.live.Load().Handler(handler)
			if !ok || h.Runtime == nil {
				return nil, false
			}
			return h.Runtime, true
		},
		Images:   d.images,
		Logger:   d.log.With("component", "container"),
		OnEvent:  d.events.Publish,
		Faults:   d.faults,
		Cgroups:  d.cgroups,
		Deferred: d.deferred,
	})
	if err != nil {
		return fmt.Errorf("open container store: %w", err)
	}
	return nil
}

// openSandboxes recovers the sandbox store and releases what pods left
// without a record. A starting pod is added to the node's monitor through
// the container store (decisions 1602, 1701).
func (d *Daemon) openSandboxes(ctx context.Context) (err error) {
	cfg, containers := d.cfg, d.containers
	d.sandboxes, err = sandbox.New(sandbox.Options{
		Root: cfg.Root, State: cfg.State,
		CgroupParent: cfg.CgroupParent, CgroupDriver: cfg.CgroupDriver, Systemd: d.systemd,
		Handlers: d.live,
		Network:  d.network, Logger: d.log,
		Faults:   d.faults,
		Cgroups:  d.cgroups,
		Deferred: d.deferred,
		Warm: func(ctx context.Context, podID string) (func(), func(context.Context)) {
			wait := containers.WarmShim(ctx, podID)
			return wait, func(ctx context.Context) {
				if err := containers.ShutdownIdleShim(ctx, podID); err != nil {
					d.log.Warn("end, on the monitor, a pod that failed to start", "pod", podID, "err", err)
				}
			}
		},
	})
	if err != nil {
		return err
	}
	d.sandboxes.CleanOrphans(ctx)
	// GetContainerEvents: each event with its pod's status.
	d.events.Subscribe(cri.NewEventPublisher(d.broker, d.sandboxes).ContainerEvent)
	registerObjectCounts(d.m, d.sandboxes, d.containers)
	registerLazyCounts(d.m, d.images)
	return nil
}

// openNRI builds NRI over both stores; it hears exits through d.events
// and the lifecycle flows through lifecycle.Hooks (openLifecycle).
func (d *Daemon) openNRI(context.Context) (err error) {
	d.nri, err = nri.New(nri.Options{
		Config: d.cfg.NRI, Name: "berth", Version: d.version,
		Sandboxes: d.sandboxes, Containers: d.containers, CDI: d.devices, Host: d.host.Spec, Logger: d.log,
	})
	if err != nil {
		return err
	}
	d.events.Subscribe(d.nri.ContainerEvent)
	return nil
}

func (d *Daemon) openStreaming(context.Context) error {
	tlsCfg, err := streamingTLS(d.cfg)
	if err != nil {
		return err
	}
	d.stream, err = streaming.New(d.cfg.StreamingAddress, tlsCfg, containerStreams{d.containers}, podNetwork{d.sandboxes}, d.log)
	return err
}

// probeHandlers asks each handler's runtime for its features and puts
// them in the live configuration.
func (d *Daemon) probeHandlers(ctx context.Context) error {
	features := hostprobe.RuntimeFeatures(ctx, d.runtimes, d.sandboxes.UserNamespaceSupport(), d.log)
	// The runtime's own CVEs are closed only by the host's runtime: say
	// so once, at start (berthctl doctor says it too).
	hostprobe.WarnRuntimeVersions(ctx, d.runtimes, d.log)
	_, err := d.live.Swap(func(cur *liveconfig.Snapshot, _ func(string) int) (*liveconfig.Snapshot, error) {
		next := liveconfig.NewSnapshot(cur.Generation, cur.Config, handlersOf(cur.Config, d.runtimes, features))
		next.SignaturePolicy = cur.SignaturePolicy
		return next, nil
	})
	return err
}

// openLifecycle builds the lifecycle flows over both stores, telling NRI.
func (d *Daemon) openLifecycle(context.Context) error {
	rlimits, err := d.cfg.Rlimits()
	if err != nil {
		return err
	}
	d.stats = stats.NewCollector(stats.CollectorOptions{})
	d.lifecycle, err = lifecycle.New(lifecycle.Options{
		Sandboxes: d.sandboxes, Containers: d.containers, Hooks: d.nri.Hooks(), Live: d.live,
		Host: d.host, CgroupDriver: d.cfg.CgroupDriver, Rlimits: rlimits,
		CDI: d.devices, AppArmor: apparmor.New(apparmor.Options{}),
		CRIU: checkpoint.NewCRIU(d.cfg.CRIU), Root: d.cfg.Root,
		Forget: d.stats.Forget,
		Logger: d.log,
	})
	return err
}

// buildGRPC makes the gRPC server with the CRI and admin services.
func (d *Daemon) buildGRPC(ctx context.Context) (err error) {
	svc, err := cri.New(cri.Options{
		Version: d.version,
		Logger:  d.log,
		Addresses: cri.Addresses{
			Streaming: d.stream.Addr(),
			Metrics:   metricsAddr(d.metrics),
		},
		Events:     d.broker,
		Images:     d.images,
		Network:    d.network,
		Sandboxes:  d.sandboxes,
		Streaming:  d.stream,
		Containers: d.containers,
		Stats:      d.stats,
		Lifecycle:  d.lifecycle,
		Cgroups:    d.cgroups,
		Host:       d.host.Spec,
		Live:       d.live,
	})
	if err != nil {
		return err
	}
	if d.tracing, err = tracing.New(ctx, tracing.Settings(d.cfg.Tracing), d.version); err != nil {
		return err
	}
	unary := []grpc.UnaryServerInterceptor{d.m.UnaryInterceptor(), unaryLogger(d.log)}
	if d.tracing.Enabled() {
		unary = append(unary, tracing.UnaryInterceptor())
		t := d.cfg.Tracing
		d.log.Info("tracing on", "endpoint", t.Endpoint, "protocol", t.Protocol, "sampling_rate", t.SamplingRate, "service_name", t.ServiceName)
	}
	d.grpc = grpc.NewServer(append([]grpc.ServerOption{
		// As the kubelet's client: requests up to 16 MiB; responses may
		// carry ExecSync's two 16 MiB outputs.
		grpc.MaxRecvMsgSize(16 << 20),
		grpc.MaxSendMsgSize(40 << 20),
		grpc.ChainUnaryInterceptor(unary...),
		grpc.ChainStreamInterceptor(d.m.StreamInterceptor(), streamLogger(d.log)),
	}, d.tracing.ServerOptions()...)...)
	svc.Register(d.grpc)
	admin.New(d.images, d.log.With("component", "admin")).WithConfig(d.configInfo).Register(d.grpc)
	return nil
}

// rangeFetch is the image store's form of [image_range_fetch]. It is not a
// live key: a reload keeps the values berthd started with.
func rangeFetch(c config.ImageRangeFetch) image.RangeFetch {
	if !c.Enable {
		return image.RangeFetch{}
	}
	return image.RangeFetch{
		MinSize: int64(c.MinLayerSize), ChunkSize: int64(c.ChunkSize),
		Parallel: c.Parallel, Retries: c.Retries,
	}
}
