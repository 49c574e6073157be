// Package server is berth-shim: the process, one per pod, that creates the
// pod's containers through the OCI runtime, holds their stdio, writes their
// CRI logs, reaps them and persists their exits. It speaks the protocol of
// package shim/proto (decision 0300) and is built to stay small (decision
// 0303): no encoding/json, net, os/exec or os/signal, no thread parked in
// the kernel, nothing allocated per log line.
//
// Files by concern: server.go the process and its registry of containers,
// dispatch.go the connections and ops, container.go a container's state,
// lifecycle.go create/start/kill/delete, exit.go reaping and persisting an
// exit, wait.go parked waits, logs.go CRI logs, attach.go attach streams and
// stdio, housekeeping.go the periodic chores and memory trimming.
package server

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/shim/proto"
)

// Server is the shim process's state: its pod's containers.
type Server struct {
	dir    string
	logf   func(format string, args ...any)
	reaper *reaper

	// mu guards the registry: ctrs and closing. Lock order: s.mu before a
	// container's mu.
	mu      sync.Mutex
	ctrs    map[string]*container
	closing bool // the shim is exiting: no more creates

	ln   *os.File
	done chan struct{} // closed once the last response before exiting is out
	// answering counts requests being handled and answered: the shim
	// exits only once each is out, so parallel deletes of a pod's last
	// containers all get their reply, not only the one that emptied it.
	answering atomic.Int32

	trim      *time.Timer // returns freed heap to the kernel once things settle
	trimMu    sync.Mutex
	trimmedAt uint64 // anonymous resident bytes after the last trim (0: no baseline yet)
	statm     statm  // reused: reading it allocates nothing
}

// NewServer prepares a shim serving the pod whose state dir is dir.
func NewServer(dir string, logf func(string, ...any)) *Server {
	return &Server{dir: dir, logf: logf, reaper: newReaper(), ctrs: map[string]*container{}, done: make(chan struct{})}
}

// Listen creates the socket; call it before telling berthd the shim is ready.
func (s *Server) Listen() error {
	if err := os.MkdirAll(filepath.Join(s.dir, "exits"), 0o700); err != nil {
		return fmt.Errorf("create shim dir: %w", err)
	}
	_ = os.Remove(proto.SocketPath(s.dir))
	ln, err := listenUnix(proto.SocketPath(s.dir))
	if err != nil {
		return fmt.Errorf("listen on %s: %w", proto.SocketPath(s.dir), err)
	}
	s.ln = ln
	// The trim's baseline is the shim before any container (trimNow).
	s.trimMu.Lock()
	s.trimmedAt, _ = s.statm.anonResident()
	s.trimMu.Unlock()
	return nil
}

// Serve answers connections until the pod has no containers left.
func (s *Server) Serve() {
	stop := s.startHousekeeping()
	defer stop()
	// Accept here rather than in a goroutine of its own: one stack less.
	for {
		conn, err := accept(s.ln)
		if err != nil {
			if s.isClosing() {
				break
			}
			// Out of fds or memory: back off rather than spin.
			s.logf("accept: %v", err)
			time.Sleep(100 * time.Millisecond)
			continue
		}
		go s.serveConn(conn)
	}
	// exitIfEmpty closed the listener; the last response is on its way.
	<-s.done
	s.waitAnswers(5 * time.Second)
}

// waitAnswers waits, at most max, for the responses still being written:
// a client that stopped reading must not keep the shim alive.
func (s *Server) waitAnswers(max time.Duration) {
	for deadline := time.Now().Add(max); s.answering.Load() > 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			s.logf("exiting with responses unsent after %v", max)
			return
		}
	}
}

// exitIfEmpty shuts the shim down when it holds no containers: it removes
// its socket and directory first, under the lock, so a create racing with
// it is refused and berthd starts a fresh shim.
func (s *Server) exitIfEmpty() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.ctrs) > 0 || s.closing {
		return false
	}
	s.closing = true
	// Directory (and socket file) first: from then on berthd's dial fails
	// with ENOENT and it launches a new shim, whose directory this removal
	// can no longer touch. Closing the listener first would open a window
	// where a new shim's fresh directory is deleted under it.
	if err := os.RemoveAll(s.dir); err != nil {
		s.logf("remove shim dir: %v", err)
	}
	s.ln.Close()
	return true
}

func (s *Server) isClosing() bool {
	s.mu.Lock()
	v := s.closing
	s.mu.Unlock()
	return v
}

// reserve publishes c, still being created, under its ID: the ID is
// taken and the shim does not exit while the create runs, but no other op
// sees c until it is created (get).
func (s *Server) reserve(c *container) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return fmt.Errorf("shim is exiting: %w", errdefs.ErrUnavailable)
	}
	if _, ok := s.ctrs[c.id]; ok {
		return fmt.Errorf("container %s: %w", c.id, errdefs.ErrAlreadyExists)
	}
	s.ctrs[c.id] = c
	return nil
}

// forget removes container id from the registry.
func (s *Server) forget(id string) {
	s.mu.Lock()
	delete(s.ctrs, id)
	s.mu.Unlock()
}

// get returns a created container. One still being created is not there
// yet for other ops: berthd serialises calls per container, so only a
// confused client asks.
func (s *Server) get(id string) (*container, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.ctrs[id]
	if !ok {
		return nil, fmt.Errorf("container %s: %w", id, errdefs.ErrNotFound)
	}
	if c.currentPhase() == phaseCreating {
		return nil, fmt.Errorf("container %s is being created: %w", id, errdefs.ErrFailedPrecondition)
	}
	return c, nil
}

// ids lists the containers the shim holds, also those being created.
func (s *Server) ids() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	ids := make([]string, 0, len(s.ctrs))
	for id := range s.ctrs {
		ids = append(ids, id)
	}
	return ids
}

// each calls fn for every container, under the registry lock (fn may
// take the container's lock, never the registry's).
func (s *Server) each(fn func(*container)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.ctrs {
		fn(c)
	}
}
