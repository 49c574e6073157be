// Package daemon wires berthd together: the root lock, the CRI socket, the
// gRPC server and graceful shutdown.
package daemon

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/admin"
	"github.com/berthcri/berth/internal/apparmor"
	"github.com/berthcri/berth/internal/atomicfile"
	"github.com/berthcri/berth/internal/cdi"
	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/container"
	"github.com/berthcri/berth/internal/cri"
	"github.com/berthcri/berth/internal/events"
	"github.com/berthcri/berth/internal/fault"
	"github.com/berthcri/berth/internal/image"
	"github.com/berthcri/berth/internal/liveconfig"
	"github.com/berthcri/berth/internal/metrics"
	"github.com/berthcri/berth/internal/network"
	"github.com/berthcri/berth/internal/nri"
	"github.com/berthcri/berth/internal/oci"
	"github.com/berthcri/berth/internal/sandbox"
	"github.com/berthcri/berth/internal/sigpolicy"
	"github.com/berthcri/berth/internal/specgen"
	"github.com/berthcri/berth/internal/streaming"
	"github.com/berthcri/berth/internal/systemd"
	"github.com/berthcri/berth/internal/tracing"
)

// shutdownGrace bounds how long in-flight RPCs may run after SIGTERM.
const shutdownGrace = 30 * time.Second

// Daemon is a running berthd.
type Daemon struct {
	cfg      *config.Config
	log      *slog.Logger
	version  string
	lock     *os.File
	listener net.Listener
	grpc     *grpc.Server
	stream   *streaming.Server
	metrics  *metrics.Server // nil when --metrics-address is empty
	nri      *nri.NRI
	systemd  *systemd.Units // nil unless cgroup_driver is systemd
	images   *image.Store
	// live is the configuration in effect, swapped by Reload.
	live       *liveconfig.Holder
	m          *metrics.Metrics
	sandboxes  *sandbox.Store
	containers *container.Store
	reload     reloader
	// deferred fsyncs the pod start path's records after the replies
	// (decision 1600); close waits for it.
	deferred *atomicfile.Deferred
	// tracing exports the CRI requests' spans; off unless [tracing]
	// enable (decision 2500).
	tracing *tracing.Provider
}

// New takes the root lock, prepares directories and the socket, and builds
// every component. Nothing is served until Serve.
func New(ctx context.Context, cfg *config.Config, version string, log *slog.Logger) (_ *Daemon, retErr error) {
	d := &Daemon{cfg: cfg, log: log, version: version}
	defer func() {
		if retErr != nil {
			d.close()
		}
	}()
	for _, dir := range []string{cfg.Root, cfg.State} {
		if err := os.MkdirAll(dir, 0o711); err != nil {
			return nil, fmt.Errorf("create %s: %w", dir, err)
		}
	}
	lock, err := lockRoot(cfg.Root)
	if err != nil {
		return nil, err
	}
	d.lock = lock

	ln, err := listenUnix(cfg.SocketPath())
	if err != nil {
		return nil, err
	}
	d.listener = ln

	faults, err := fault.FromEnv(log)
	if err != nil {
		return nil, err
	}
	m := metrics.New()
	d.m = m
	// The first snapshot of the live configuration; its handlers' features
	// are added once the sandbox store can tell about user namespaces.
	runtimes := container.Runtimes(cfg)
	policy, err := sigpolicy.Load(cfg.SignaturePolicy)
	if err != nil {
		return nil, err
	}
	logPolicy(log, policy, cfg.SignaturePolicy)
	first := liveconfig.NewSnapshot(1, cfg, handlersOf(cfg, runtimes, nil))
	first.SignaturePolicy = policy
	d.live = liveconfig.NewHolder(first)
	d.deferred = atomicfile.NewDeferred(func(path string, err error) {
		log.Warn("background fsync failed; the file may not survive a power loss", "path", path, "err", err)
	})
	images, err := image.Open(image.Options{
		Root:         filepath.Join(cfg.Root, "images"),
		PinnedImages: cfg.PinnedImages,
		Logger:       log.With("component", "image"),
		Observer:     m,
		Faults:       faults,
		// Read by each pull as it starts (decision 2300).
		Settings: func() image.PullSettings {
			live := d.live.Load()
			return image.PullSettings{
				RegistryConfigDir: live.Config.RegistryConfigDir,
				ProgressTimeout:   live.PullProgressTimeout(),
				SignaturePolicy:   live.ImageSignaturePolicy(),
				RangeFetch:        rangeFetch(live.Config.ImageRangeFetch),
			}
		},
	})
	if err != nil {
		return nil, fmt.Errorf("open image store: %w", err)
	}
	d.images = images

	if cfg.MetricsAddress != "" {
		if d.metrics, err = m.Listen(cfg.MetricsAddress); err != nil {
			return nil, err
		}
	}

	netw := network.New(network.Options{
		ConfDir: cfg.CNIConfDir, BinDirs: cfg.CNIBinDirs,
		CacheDir:    filepath.Join(cfg.State, "cni", "cache"),
		IPAMDataDir: filepath.Join(cfg.Root, "cni", "networks"),
		Bridge:      cfg.DefaultNetwork.Bridge, Subnet: cfg.DefaultNetwork.Subnet,
		Logger: log,
	})
	if cri.CgroupDriver(cfg.CgroupDriver) == "systemd" {
		// Refused here, once, rather than on every RunPodSandbox.
		if d.systemd, err = systemd.Dial(ctx, log.With("component", "systemd")); err != nil {
			return nil, err
		}
	}
	ctrls, err := detectCgroups(cfg, log)
	if err != nil {
		return nil, err
	}
	// Set once the container store exists (it needs the sandboxes'
	// recovery first); no pod runs before.
	var ctrStore atomic.Pointer[container.Store]
	sandboxes, err := sandbox.New(sandbox.Options{
		Root: cfg.Root, State: cfg.State,
		CgroupParent: cfg.CgroupParent, CgroupDriver: cri.CgroupDriver(cfg.CgroupDriver), Systemd: d.systemd,
		Handlers: d.live,
		Network:  netw, Logger: log,
		Faults:   faults,
		Cgroups:  ctrls,
		Deferred: d.deferred,
		Warm: func(ctx context.Context, podID string) (func(), func(context.Context)) {
			c := ctrStore.Load()
			if c == nil {
				return nil, nil
			}
			wait := c.WarmShim(ctx, podID)
			return wait, func(ctx context.Context) {
				if err := c.ShutdownIdleShim(ctx, podID); err != nil {
					log.Warn("stop the shim of a pod that failed to start", "pod", podID, "err", err)
				}
			}
		},
	})
	if err != nil {
		return nil, err
	}
	d.sandboxes = sandboxes
	sandboxes.CleanOrphans(ctx)

	broker := events.NewBroker()
	publisher := cri.NewEventPublisher(broker, sandboxes)
	host, err := specgen.ProbeHost()
	if err != nil {
		return nil, fmt.Errorf("probe host: %w", err)
	}
	// Set once NRI exists (it needs the stores); until then exits seen
	// during recovery reach no plugin, and none is connected yet.
	var nriRelay atomic.Pointer[nri.NRI]
	containers, err := container.Open(ctx, container.Options{
		Dir:        filepath.Join(cfg.Root, "containers"),
		ShimDir:    filepath.Join(cfg.State, "shims"),
		ShimBinary: container.ShimBinary(),
		RuntimeFor: func(handler string) (*oci.Runtime, bool) {
			h, ok := d.live.Load().Handler(handler)
			if !ok || h.Runtime == nil {
				return nil, false
			}
			return h.Runtime, true
		},
		Images:   images,
		Logger:   log.With("component", "container"),
		OnEvent:  func(ev container.Event) { publisher.ContainerEvent(ev); nriRelay.Load().ContainerEvent(ev) },
		Faults:   faults,
		Cgroups:  ctrls,
		Deferred: d.deferred,
	})
	if err != nil {
		return nil, fmt.Errorf("open container store: %w", err)
	}
	ctrStore.Store(containers)
	d.containers = containers
	devices := cdi.New(cfg.CDISpecDirs, log.With("component", "cdi"))
	if d.nri, err = nri.New(nri.Options{
		Config: cfg.NRI, Name: "berth", Version: version,
		Sandboxes: sandboxes, Containers: containers, CDI: devices, Logger: log,
	}); err != nil {
		return nil, err
	}
	nriRelay.Store(d.nri)
	registerObjectCounts(m, sandboxes, containers)

	streamTLS, err := streamingTLS(cfg)
	if err != nil {
		return nil, err
	}
	if d.stream, err = streaming.New(cfg.StreamingAddress, streamTLS, containerStreams{containers}, podNetwork{sandboxes}, log); err != nil {
		return nil, err
	}

	features := cri.ProbeRuntimeFeatures(ctx, runtimes, sandboxes.UserNamespaceSupport(), log)
	if _, err := d.live.Swap(func(cur *liveconfig.Snapshot, _ func(string) int) (*liveconfig.Snapshot, error) {
		next := liveconfig.NewSnapshot(cur.Generation, cur.Config, handlersOf(cur.Config, runtimes, features))
		next.SignaturePolicy = cur.SignaturePolicy
		return next, nil
	}); err != nil {
		return nil, err
	}
	svc := cri.New(cri.Options{
		Config:  cfg,
		Version: version,
		Logger:  log,
		Addresses: cri.Addresses{
			Streaming: d.stream.Addr(),
			Metrics:   metricsAddr(d.metrics),
		},

		Events:     broker,
		Images:     images,
		Network:    netw,
		Sandboxes:  sandboxes,
		Streaming:  d.stream,
		Containers: containers,
		NRI:        d.nri,
		CDI:        devices,
		AppArmor:   apparmor.New(apparmor.Options{}),

		Host:    host,
		Cgroups: ctrls,
		Live:    d.live,
	})
	if d.tracing, err = tracing.New(ctx, cfg.Tracing, version); err != nil {
		return nil, err
	}
	unary := []grpc.UnaryServerInterceptor{m.UnaryInterceptor(), unaryLogger(log)}
	if d.tracing.Enabled() {
		unary = append(unary, tracing.UnaryInterceptor())
		log.Info("tracing on", "endpoint", cfg.Tracing.Endpoint, "protocol", cfg.Tracing.Protocol,
			"sampling_rate", cfg.Tracing.SamplingRate, "service_name", cfg.Tracing.ServiceName)
	}
	d.grpc = grpc.NewServer(append([]grpc.ServerOption{
		// As the kubelet's client: requests up to 16 MiB; responses may
		// carry ExecSync's two 16 MiB outputs.
		grpc.MaxRecvMsgSize(16 << 20),
		grpc.MaxSendMsgSize(40 << 20),
		grpc.ChainUnaryInterceptor(unary...),
		grpc.ChainStreamInterceptor(m.StreamInterceptor(), streamLogger(log)),
	}, d.tracing.ServerOptions()...)...)
	svc.Register(d.grpc)
	admin.New(images, log.With("component", "admin")).WithConfig(d.configInfo).Register(d.grpc)
	if err := d.nri.Start(); err != nil {
		return nil, err
	}
	if _, file, err := netw.Config(); err == nil && file == "" {
		// Last, so that a daemon that refuses to start leaves no node
		// state; before serving, so that the embedded network's first pod
		// does not wait for it. It falls back to per-pod masquerade by
		// itself.
		_ = netw.EnsureMasquerade()
	}
	return d, nil
}

// Serve answers CRI calls until ctx is cancelled, then stops accepting,
// lets in-flight RPCs finish (bounded by shutdownGrace) and returns. It never
// touches containers: they outlive the daemon by design.
func (d *Daemon) Serve(ctx context.Context) error {
	errc := make(chan error, 1)
	go func() { errc <- d.grpc.Serve(d.listener) }()
	go func() {
		if err := d.stream.Serve(); err != nil {
			d.log.Error("streaming server failed", "error", err)
		}
	}()
	if d.metrics != nil {
		go func() {
			if err := d.metrics.Serve(); err != nil {
				d.log.Error("metrics server failed", "error", err)
			}
		}()
	}
	d.log.Info("berthd serving", "listen", d.cfg.Listen, "root", d.cfg.Root, "state", d.cfg.State,
		"streaming", d.stream.Addr(), "metrics", metricsAddr(d.metrics), "version", d.version)

	var serveErr error
	select {
	case serveErr = <-errc:
	case <-ctx.Done():
		d.log.Info("shutting down: finishing in-flight requests")
		stopped := make(chan struct{})
		go func() { d.grpc.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-time.After(shutdownGrace):
			d.log.Warn("in-flight requests did not finish in time; closing them", "grace", shutdownGrace)
			d.grpc.Stop()
		}
		serveErr = <-errc
	}
	d.close()
	if serveErr != nil && !errors.Is(serveErr, grpc.ErrServerStopped) {
		return fmt.Errorf("serve %s: %w", d.cfg.Listen, serveErr)
	}
	d.log.Info("berthd stopped")
	return nil
}

func (d *Daemon) close() {
	d.nri.Stop()
	if d.stream != nil {
		d.stream.Close()
	}
	if d.metrics != nil {
		d.metrics.Close()
	}
	if d.listener != nil {
		d.listener.Close()
		os.Remove(d.cfg.SocketPath())
	}
	if d.systemd != nil {
		d.systemd.Close()
	}
	if d.images != nil {
		// A collection pass must not outlive the root lock.
		d.images.Close()
	}
	// Before the lock goes: the next daemon finds every record durable.
	d.deferred.Flush()
	if d.tracing != nil {
		// Bounded: a collector that is gone must not hold the exit.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := d.tracing.Shutdown(ctx); err != nil {
			d.log.Warn("spans not exported at exit", "err", err)
		}
		cancel()
	}
	if d.lock != nil {
		d.lock.Close()
	}
}

// lockWait is how long lockRoot waits for a held lock. A berthd killed
// while forking leaves children that hold the lock's file (close-on-exec
// closes it only when they exec) for a moment after its death: a restart
// right then (systemd, a test) must wait for them, not fail.
const lockWait = 2 * time.Second

// lockRoot takes an exclusive flock on <root>/berthd.lock so that two
// daemons never share one root. The kernel drops the lock when we die.
func lockRoot(root string) (*os.File, error) {
	path := filepath.Join(root, "berthd.lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open lock %s: %w", path, err)
	}
	deadline := time.Now().Add(lockWait)
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if !errors.Is(err, unix.EWOULDBLOCK) || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			holder, _ := os.ReadFile(path)
			return nil, fmt.Errorf("another berthd (pid %s) is already using root %s; stop it or pick another --root", trimPID(holder), root)
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	if err := f.Truncate(0); err == nil {
		fmt.Fprintf(f, "%d\n", os.Getpid())
	}
	return f, nil
}

// streamingTLS loads the streaming server's certificate when configured.
func streamingTLS(cfg *config.Config) (*tls.Config, error) {
	if cfg.StreamingTLSCert == "" {
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(cfg.StreamingTLSCert, cfg.StreamingTLSKey)
	if err != nil {
		return nil, fmt.Errorf("load streaming TLS certificate: %w", err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}

// containerStreams runs exec and attach sessions for the streaming server.
type containerStreams struct{ containers *container.Store }

func (c containerStreams) Exec(ctx context.Context, id string, cmd []string, in io.Reader, out, errOut io.WriteCloser, tty bool, resize <-chan streaming.TerminalSize) error {
	code, err := c.containers.Exec(ctx, id, container.ExecOptions{
		Cmd: cmd, Stdin: readerOrNil(in), Stdout: writerOrNil(out), Stderr: writerOrNil(errOut), TTY: tty, Resize: sizes(ctx, resize),
	})
	if err != nil {
		return err
	}
	if code != 0 {
		// The streaming library reports this to the client as the exit code.
		return streaming.ExitCode(code)
	}
	return nil
}

func (c containerStreams) Attach(ctx context.Context, id string, in io.Reader, out, errOut io.WriteCloser, tty bool, resize <-chan streaming.TerminalSize) error {
	return c.containers.Attach(ctx, id, readerOrNil(in), writerOrNil(out), writerOrNil(errOut), sizes(ctx, resize))
}

// writerOrNil keeps a nil interface nil: the library passes typed nils for
// streams the client did not ask for.
func writerOrNil(w io.WriteCloser) io.Writer {
	if isNil(w) {
		return nil
	}
	return w
}

func readerOrNil(r io.Reader) io.Reader {
	if isNil(r) {
		return nil
	}
	return r
}

// isNil reports a nil interface or an interface holding a nil pointer.
func isNil(v any) bool {
	if v == nil {
		return true
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Pointer, reflect.Interface, reflect.Map, reflect.Chan, reflect.Func, reflect.Slice:
		return rv.IsNil()
	}
	return false
}

// sizes converts the library's resize events until ctx ends.
func sizes(ctx context.Context, in <-chan streaming.TerminalSize) <-chan container.TerminalSize {
	if in == nil {
		return nil
	}
	out := make(chan container.TerminalSize)
	go func() {
		defer close(out)
		for {
			select {
			case sz, ok := <-in:
				if !ok {
					return
				}
				select {
				case out <- container.TerminalSize{Width: sz.Width, Height: sz.Height}:
				case <-ctx.Done():
					return
				}
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}

// podNetwork finds a ready pod's network namespace for port-forward.
type podNetwork struct{ sandboxes *sandbox.Store }

func (p podNetwork) NetNSPath(id string) (string, error) {
	sb, err := p.sandboxes.Get(id)
	if err != nil {
		return "", err
	}
	if sb.State != criapi.PodSandboxState_SANDBOX_READY {
		return "", fmt.Errorf("pod sandbox %s is not ready", id)
	}
	return sb.NetNSPath, nil
}

func metricsAddr(s *metrics.Server) string {
	if s == nil {
		return ""
	}
	return s.Addr()
}

func trimPID(b []byte) string {
	s := string(b)
	for len(s) > 0 && (s[len(s)-1] == '\n' || s[len(s)-1] == ' ') {
		s = s[:len(s)-1]
	}
	if s == "" {
		return "unknown"
	}
	return s
}

// listenUnix creates the socket's parent directory, replaces a stale socket
// left by a crashed daemon (safe: we hold the root lock) and sets mode 0660.
func listenUnix(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o711); err != nil {
		return nil, fmt.Errorf("create socket dir %s: %w", filepath.Dir(path), err)
	}
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		return nil, fmt.Errorf("remove stale socket %s: %w", path, err)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o660); err != nil {
		ln.Close()
		return nil, fmt.Errorf("chmod socket %s: %w", path, err)
	}
	return ln, nil
}

// rangeFetch is the image store's form of [image_range_fetch] (read at
// start only: a reload keeps the values berthd started with).
func rangeFetch(c config.ImageRangeFetch) image.RangeFetch {
	if !c.Enable {
		return image.RangeFetch{}
	}
	return image.RangeFetch{
		MinSize: int64(c.MinLayerSize), ChunkSize: int64(c.ChunkSize),
		Parallel: c.Parallel, Retries: c.Retries,
	}
}
