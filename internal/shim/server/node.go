package server

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/shim/proto"
)

// Node is the monitor process: one per node (decision 1701), serving every
// pod on the pod's own socket (<shims>/<pod-id>/shim.sock, as a per-pod
// shim did) and taking new pods on its own (<shims>/.node/node.sock). It
// is the keeper's child, not a subreaper: container inits reparent to the
// keeper, which reaps them and tells the monitor (keeperLink).
type Node struct {
	dir    string
	logf   func(format string, args ...any)
	reaper *reaper
	keeper *keeperLink // nil in unit tests: no keeper
	// startedAtAdopt: containers the keeper held as created that Adopt
	// found started (the monitor before died mid-start); the keeper is
	// told once the adopt list is read.
	startedAtAdopt []string
	// adoptedPods: pods Adopt made, served once it is done.
	adoptedPods []*Server

	// mu guards pods, closing and the listener's life. Lock
	// order: Node.mu before a pod's Server.mu; a pod calls the node only
	// after releasing its own.
	mu      sync.Mutex
	pods    map[string]*Server // by pod dir
	closing bool               // no more pods: the monitor exits once they are gone
	started time.Time          // a node given no pod by idleExitAfter exits
	ln      *os.File
	done    chan struct{} // closed once closing and no pod is left

	// answering counts requests being handled and answered, in all pods:
	// the monitor exits only once each is out, so parallel deletes of a
	// pod's last containers all get their reply.
	answering atomic.Int32

	trim      *time.Timer // returns freed heap to the kernel once things settle
	trimMu    sync.Mutex
	trimmedAt uint64 // anonymous resident bytes after the last trim (0: no baseline yet)
	statm     statm  // reused: reading it allocates nothing
}

// NewNode prepares the monitor of the node dir dir; keeperFd is its link
// to the keeper (-1: none, in tests).
func NewNode(dir string, logf func(string, ...any), keeperFd int) *Node {
	n := &Node{dir: dir, logf: logf, reaper: newReaper(), pods: map[string]*Server{}, done: make(chan struct{}), started: time.Now()}
	if keeperFd >= 0 {
		n.keeper = newKeeperLink(keeperFd, n)
		n.reaper.external = true
	}
	return n
}

// Listen creates the node's socket; call it after Adopt and before telling
// berthd the monitor is ready.
func (n *Node) Listen() error {
	if err := os.MkdirAll(n.dir, 0o700); err != nil {
		return fmt.Errorf("create node dir: %w", err)
	}
	path := proto.NodeSocketPath(n.dir)
	_ = os.Remove(path)
	ln, err := listenUnix(path)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", path, err)
	}
	n.mu.Lock()
	n.ln = ln
	n.mu.Unlock()
	// The trim's baseline is the monitor before any new container.
	n.trimMu.Lock()
	n.trimmedAt, _ = n.statm.anonResident()
	n.trimMu.Unlock()
	return nil
}

// Serve takes new pods and serves the pods' sockets until the node has no
// pod left after it stopped taking new ones (or was idle for
// idleExitAfter), then waits for the last answers.
func (n *Node) Serve() {
	stop := n.startHousekeeping()
	defer stop()
	if n.keeper != nil {
		go n.keeper.serve()
	}
	n.mu.Lock()
	ln := n.ln
	n.mu.Unlock()
	go serveAccepted(ln, n.isClosing, n.logf, n.serveNodeConn)
	<-n.done
	n.waitAnswers(5 * time.Second)
}

// idleExitAfter is how long a monitor with no pod stays for one to come
// (berthd launched it, then died before adding its pod).
const idleExitAfter = 30 * time.Second

// serveNodeConn answers requests on the node's socket.
func (n *Node) serveNodeConn(conn *os.File) {
	defer conn.Close()
	for {
		req, ok := readRequest(conn)
		if !ok {
			return
		}
		var resp *proto.Response
		switch req.Op {
		case proto.OpAddPod:
			resp = &proto.Response{}
			if err := n.addPod(req.Dir); err != nil {
				resp = proto.ErrorResponse(err)
			}
		case proto.OpPing:
			// The pods served; answered only after Adopt (the socket
			// listens only then), so a pod not named was not adopted.
			resp = &proto.Response{IDs: n.podDirs()}
		case proto.OpShutdown:
			resp = &proto.Response{}
			if err := n.shutdownIfIdle(); err != nil {
				resp = proto.ErrorResponse(err)
			}
		default:
			resp = proto.ErrorResponse(fmt.Errorf("unknown node op %q: %w", req.Op, errdefs.ErrInvalidArgument))
		}
		if proto.WriteResponse(conn, resp) != nil {
			return
		}
	}
}

// addPod serves the pod whose state dir is dir (a no-op when it is
// served).
func (n *Node) addPod(dir string) error {
	if dir == "" || !filepath.IsAbs(dir) || filepath.Dir(dir) != filepath.Dir(n.dir) {
		return fmt.Errorf("pod dir %q is not beside the node's %s: %w", dir, n.dir, errdefs.ErrInvalidArgument)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closing {
		return fmt.Errorf("monitor is exiting: %w", errdefs.ErrUnavailable)
	}
	if s := n.pods[dir]; s != nil && !s.isClosing() {
		return nil
	}
	s, err := n.newPodLocked(dir)
	if err != nil {
		return err
	}
	go s.Serve()
	return nil
}

// newPodLocked makes and listens the pod of dir, not yet serving.
func (n *Node) newPodLocked(dir string) (*Server, error) {
	pod := filepath.Base(dir)
	s := newServer(dir, n, func(format string, args ...any) { n.logf("pod=%s "+format, append([]any{pod}, args...)...) })
	if err := s.Listen(); err != nil {
		return nil, err
	}
	n.pods[dir] = s
	return s, nil
}

// shutdownIfIdle stops the node if it serves no pod.
func (n *Node) shutdownIfIdle() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.pods) > 0 {
		return fmt.Errorf("the monitor serves %d pods: %w", len(n.pods), errdefs.ErrFailedPrecondition)
	}
	n.closeLocked("asked to, with no pod")
	return nil
}

// podGone drops the pod s, which closed; the node stops once it has none.
func (n *Node) podGone(s *Server) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.pods[s.dir] == s {
		delete(n.pods, s.dir)
	}
	if len(n.pods) == 0 {
		n.closeLocked("no pods left")
	}
}

// closeLocked stops taking pods: the node's directory (socket, launch
// lock, log) goes first, so berthd's dial fails from then on and it
// launches a new monitor, whose directory this removal can no longer
// touch; then the listener. Once no pod is left, done closes.
func (n *Node) closeLocked(why string) {
	if !n.closing {
		n.closing = true
		n.logf("taking no new pods: %s", why)
		if err := os.RemoveAll(n.dir); err != nil {
			n.logf("remove node dir: %v", err)
		}
		if n.ln != nil {
			n.ln.Close()
		}
	}
	if len(n.pods) == 0 {
		select {
		case <-n.done:
		default:
			close(n.done)
		}
	}
}

// keeperLost is called when the keeper's link closed: with no subreaper
// above it the monitor can start no container whose exit it would see,
// so it takes no new pods (berthd starts a new keeper and monitor for
// them) and serves the ones it has until they are gone.
func (n *Node) keeperLost() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.closeLocked("the keeper is gone")
}

func (n *Node) isClosing() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.closing
}

func (n *Node) podDirs() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Collect(maps.Keys(n.pods))
}

// eachPod calls fn for every pod, under the node's lock.
func (n *Node) eachPod(fn func(*Server)) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, s := range n.pods {
		fn(s)
	}
}

// waitAnswers waits, at most max, for the responses still being written:
// a client that stopped reading must not keep the monitor alive.
func (n *Node) waitAnswers(max time.Duration) {
	for deadline := time.Now().Add(max); n.answering.Load() > 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			n.logf("exiting with responses unsent after %v", max)
			return
		}
	}
}
