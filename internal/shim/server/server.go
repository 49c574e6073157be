// Package server is berth-shim's monitor: the process, one per node
// (decision 1701), that creates every pod's containers through the OCI
// runtime, copies their output into CRI logs and persists their exits.
// Its parent, the keeper (package shim/keeper), reaps the containers and
// keeps a copy of their stdio, and restarts the monitor if it dies. It speaks the protocol of
// package shim/proto (decision 0300) and is built to stay small (decision
// 0303): no encoding/json, net, os/exec or os/signal, no thread parked in
// the kernel, nothing allocated per log line.
//
// Files by concern: node.go the process and its pods, keeper.go the link
// to the keeper and adoption, server.go a pod and its registry of containers,
// dispatch.go the connections and ops, container.go a container's state,
// lifecycle.go create/start/kill/delete, exit.go reaping and persisting an
// exit, wait.go parked waits, logs.go CRI logs, attach.go attach streams and
// stdio, housekeeping.go the periodic chores and memory trimming.
package server

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/shim/proto"
)

// Server is one pod the monitor serves: its containers, its socket and
// its directory (exits, console sockets).
type Server struct {
	dir    string
	logf   func(format string, args ...any)
	node   *Node
	reaper *reaper // the node's

	// mu guards the registry: ctrs and closing. Lock order: s.mu before a
	// container's mu.
	mu      sync.Mutex
	ctrs    map[string]*container
	closing bool // the pod is going: no more creates

	ln *os.File
}

// newServer prepares the pod whose state dir is dir.
func newServer(dir string, n *Node, logf func(string, ...any)) *Server {
	return &Server{dir: dir, logf: logf, node: n, reaper: n.reaper, ctrs: map[string]*container{}}
}

// Listen creates the pod's socket; berthd reaches the pod there once
// OpAddPod answered.
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
	return nil
}

// Serve answers the pod's connections until the pod has no containers
// left.
func (s *Server) Serve() {
	serveAccepted(s.ln, s.isClosing, s.logf, s.serveConn)
}

// exitIfEmpty ends the pod when it holds no containers: it removes its
// socket and directory first, under the lock, so a create racing with
// it is refused and berthd adds the pod afresh. The node learns of it
// after the pod's lock is released (lock order).
func (s *Server) exitIfEmpty() bool {
	s.mu.Lock()
	if len(s.ctrs) > 0 || s.closing {
		s.mu.Unlock()
		return false
	}
	s.closing = true
	// Directory (and socket file) first: from then on berthd's dial fails
	// with ENOENT and it adds the pod again, with a directory this
	// removal can no longer touch. Closing the listener first would open
	// a window where the new directory is deleted under it.
	if err := os.RemoveAll(s.dir); err != nil {
		s.logf("remove shim dir: %v", err)
	}
	s.ln.Close()
	s.mu.Unlock()
	s.node.podGone(s)
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
		return fmt.Errorf("pod's shim is exiting: %w", errdefs.ErrUnavailable)
	}
	if s.node.keeper.lost() {
		return fmt.Errorf("the node's keeper is gone, no container can be started here: %w", errdefs.ErrUnavailable)
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
	return slices.Collect(maps.Keys(s.ctrs))
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
