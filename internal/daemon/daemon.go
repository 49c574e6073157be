// Package daemon wires berthd together: the root lock, the CRI socket, the
// gRPC server and graceful shutdown.
package daemon

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"

	"github.com/berthcri/berth/internal/atomicfile"
	"github.com/berthcri/berth/internal/cdi"
	"github.com/berthcri/berth/internal/cgroupctrl"
	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/container"
	"github.com/berthcri/berth/internal/events"
	"github.com/berthcri/berth/internal/fault"
	"github.com/berthcri/berth/internal/hostprobe"
	"github.com/berthcri/berth/internal/image"
	"github.com/berthcri/berth/internal/lifecycle"
	"github.com/berthcri/berth/internal/liveconfig"
	"github.com/berthcri/berth/internal/metrics"
	"github.com/berthcri/berth/internal/network"
	"github.com/berthcri/berth/internal/nri"
	"github.com/berthcri/berth/internal/oci"
	"github.com/berthcri/berth/internal/sandbox"
	"github.com/berthcri/berth/internal/sockbind"
	"github.com/berthcri/berth/internal/stats"
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
	m        *metrics.Metrics
	// tracing exports the CRI requests' spans; off unless [tracing]
	// enable (decision 2500).
	tracing *tracing.Provider
	// deferred fsyncs the pod start path's records after the replies
	// (decision 1600); close waits for it.
	deferred *atomicfile.Deferred
	// live is the configuration in effect, swapped by Reload.
	live   *liveconfig.Holder
	reload reloader

	// faults are the test-only fault points the stores honour.
	faults *fault.Injector
	// runtimes are the configured handlers' runtimes at start.
	runtimes map[string]*oci.Runtime

	// What the node offers, asked once at start (wire.go: probeNode).
	systemd *systemd.Units // nil unless cgroup_driver is systemd
	cgroups *cgroupctrl.Controllers
	devices *cdi.Registry
	host    *hostprobe.Host
	network *network.Network

	// The domain, built in this order (wire.go).
	images     *image.Store
	containers *container.Store
	sandboxes  *sandbox.Store
	nri        *nri.NRI
	lifecycle  *lifecycle.Service
	stats      *stats.Collector
	// events is the one list of the container store's event subscribers
	// (the CRI event publisher, then NRI); broker serves
	// GetContainerEvents.
	events lifecycle.Subscribers
	broker *events.Broker
}

// New takes the root lock, prepares directories and the socket, and builds
// every component, each from those built before it (wire.go), so that no
// component refers to one built later. Nothing is served until Serve.
func New(ctx context.Context, cfg *config.Config, version string, log *slog.Logger) (_ *Daemon, retErr error) {
	d := &Daemon{cfg: cfg, log: log, version: version, m: metrics.New(), broker: events.NewBroker()}
	defer func() {
		if retErr != nil {
			d.close()
		}
	}()
	// In dependency order: each step uses only what the steps above it built.
	for _, step := range []func(context.Context) error{
		d.openRoot,       // directories, root lock, CRI socket
		d.loadFaults,     // fault points, for the stores
		d.openLiveConfig, // signature policy, live snapshot, deferred fsyncs
		d.openImages,     // image store
		d.listenMetrics,  // metrics server
		d.probeNode,      // systemd, cgroup controllers, CDI, host facts, CNI
		d.openContainers, // container store, publishing to d.events
		d.openSandboxes,  // sandbox store, adding each starting pod to the monitor
		d.openNRI,        // NRI over both stores, subscribed to d.events
		d.openStreaming,  // exec/attach/port-forward over both stores
		d.probeHandlers,  // runtime features, now that user namespaces are known
		d.openLifecycle,  // the lifecycle flows, telling NRI
		d.buildGRPC,      // CRI and admin services, interceptors, tracing
	} {
		if err := step(ctx); err != nil {
			return nil, err
		}
	}
	if err := d.nri.Start(); err != nil {
		return nil, err
	}
	if _, file, err := d.network.Config(); err == nil && file == "" {
		// Last, so that a daemon that refuses to start leaves no node
		// state; before serving, so that the embedded network's first pod
		// does not wait for it. It falls back to per-pod masquerade by
		// itself.
		_ = d.network.EnsureMasquerade()
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

// listenUnix creates the socket's parent directory and listens at path
// (0660), replacing a stale socket, and a stale private dir, left by a
// crashed daemon (safe: we hold the root lock). sockbind binds it so that
// it never exists at path with a wider mode: a host user connecting then
// would keep a root-equivalent connection.
func listenUnix(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o711); err != nil {
		return nil, fmt.Errorf("create socket dir %s: %w", filepath.Dir(path), err)
	}
	ln, err := sockbind.Listen(path, 0o660)
	if err != nil {
		return nil, err // not a typed nil in the interface: close checks it
	}
	return ln, nil
}
