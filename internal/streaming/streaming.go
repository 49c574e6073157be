// Package streaming serves exec, attach and port-forward for the kubelet's
// streaming protocol (SPDY and websocket) with k8s.io/cri-streaming, the
// server containerd and CRI-O use. CRI RPCs return URLs from this server;
// clients then connect to it directly.
package streaming

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-streaming/pkg/streaming"
	remotecommandserver "k8s.io/cri-streaming/pkg/streaming/remotecommand"

	"github.com/berthcri/berth/internal/config"
)

// TerminalSize is a TTY resize event.
type TerminalSize = remotecommandserver.TerminalSize

// Containers runs processes in containers for exec and attach.
type Containers interface {
	Exec(ctx context.Context, containerID string, cmd []string, in io.Reader, out, errOut io.WriteCloser, tty bool, resize <-chan TerminalSize) error
	Attach(ctx context.Context, containerID string, in io.Reader, out, errOut io.WriteCloser, tty bool, resize <-chan TerminalSize) error
}

// PodNetwork finds a pod's network namespace for port-forward: "" means
// the pod uses the host's network.
type PodNetwork interface {
	NetNSPath(podSandboxID string) (string, error)
}

// Server is berth's streaming server.
type Server struct {
	lib  streaming.Server
	http *http.Server
	ln   net.Listener
	log  *slog.Logger
}

// New listens on addr (host:port, port 0 picks one) and prepares the server.
func New(addr string, tlsConfig *tls.Config, containers Containers, pods PodNetwork, log *slog.Logger) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen for streaming on %s: %w", addr, err)
	}
	if tlsConfig == nil && config.BeyondLoopback(ln.Addr().String()) {
		// The kubelet's default is loopback (127.0.0.1:0); an address
		// beyond it without TLS hands exec and attach to the network.
		log.Warn("the streaming server listens beyond loopback without TLS: anyone who reaches it with a URL's token gets exec, attach and port-forward; set streaming_tls_cert and streaming_tls_key, or listen on 127.0.0.1",
			"address", ln.Addr().String())
	}
	cfg := streaming.DefaultConfig
	cfg.Addr = ln.Addr().String()
	cfg.TLSConfig = tlsConfig
	scheme := "http"
	if tlsConfig != nil {
		scheme = "https"
	}
	// Set the base URL from the real listener so port 0 resolves before
	// any URL is handed out (the library only fixes it up inside Start).
	cfg.BaseURL = &url.URL{Scheme: scheme, Host: ln.Addr().String()}
	lib, err := streaming.NewServer(cfg, &runtime{containers: containers, pods: pods, log: log})
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("create streaming server: %w", err)
	}
	return &Server{
		lib:  lib,
		http: &http.Server{Handler: withTunnels(withSPDYGuard(lib)), TLSConfig: tlsConfig, ReadHeaderTimeout: 30 * time.Second},
		ln:   ln,
		log:  log,
	}, nil
}

// withTunnels serves SPDY-over-websocket port-forward tunnels in front of
// the library's handler.
func withTunnels(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p := tunnelProtocol(r); p != "" && strings.Contains(r.URL.Path, "/portforward/") {
			serveTunnel(w, r, p, next)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// Addr is the address the server listens on.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Serve serves until Close.
func (s *Server) Serve() error {
	var err error
	if s.http.TLSConfig != nil {
		err = s.http.ServeTLS(s.ln, "", "")
	} else {
		err = s.http.Serve(s.ln)
	}
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Close stops the server and its open streams.
func (s *Server) Close() error { return s.http.Close() }

// GetExec returns the URL a client streams an exec session from.
func (s *Server) GetExec(req *criapi.ExecRequest) (*criapi.ExecResponse, error) {
	return s.lib.GetExec(req)
}

// GetAttach returns the URL a client attaches from.
func (s *Server) GetAttach(req *criapi.AttachRequest) (*criapi.AttachResponse, error) {
	return s.lib.GetAttach(req)
}

// GetPortForward returns the URL a client port-forwards through.
func (s *Server) GetPortForward(req *criapi.PortForwardRequest) (*criapi.PortForwardResponse, error) {
	return s.lib.GetPortForward(req)
}

// runtime adapts berth's components to the library's Runtime interface.
type runtime struct {
	containers Containers
	pods       PodNetwork
	log        *slog.Logger
}

// errNotAvailable answers streams whose backing component is not wired.
var errNotAvailable = errors.New("not available: this berthd has no container or pod backend for streaming")

func (r *runtime) Exec(ctx context.Context, containerID string, cmd []string, in io.Reader, out, errOut io.WriteCloser, tty bool, resize <-chan TerminalSize) error {
	if r.containers == nil {
		return errNotAvailable
	}
	return r.containers.Exec(ctx, containerID, cmd, in, out, errOut, tty, resize)
}

func (r *runtime) Attach(ctx context.Context, containerID string, in io.Reader, out, errOut io.WriteCloser, tty bool, resize <-chan TerminalSize) error {
	if r.containers == nil {
		return errNotAvailable
	}
	return r.containers.Attach(ctx, containerID, in, out, errOut, tty, resize)
}

func (r *runtime) PortForward(ctx context.Context, podSandboxID string, port int32, stream io.ReadWriteCloser) error {
	if r.pods == nil {
		return errNotAvailable
	}
	path, err := r.pods.NetNSPath(podSandboxID)
	if err != nil {
		return fmt.Errorf("port-forward to pod %s: %w", podSandboxID, err)
	}
	r.log.Debug("port-forward", "pod", podSandboxID, "port", port)
	return PortForward(ctx, path, port, stream)
}

// ExitCode is the error an exec backend returns for a command that exited
// non-zero: the library recognises its methods (k8s.io/utils/exec's
// ExitError) and sends the client the code instead of an internal error.
type ExitCode int

func (e ExitCode) Error() string   { return fmt.Sprintf("command terminated with exit code %d", int(e)) }
func (e ExitCode) String() string  { return e.Error() }
func (e ExitCode) Exited() bool    { return true }
func (e ExitCode) ExitStatus() int { return int(e) }
