package monitor

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
	"github.com/berthcri/berth/internal/shim/textpages"
)

// Monitor is the monitor process, one per node (decision 1701): it serves
// every pod (a Pod) on the pod's own socket (<shims>/<pod-id>/shim.sock)
// and takes new pods on its own (<shims>/.node/node.sock). It is the keeper's child, not a
// subreaper: container inits reparent to the keeper, which reaps them and
// tells the monitor (keeperLink).
type Monitor struct {
	dir    string
	logf   func(format string, args ...any)
	reaper *reaper
	keeper *keeperLink // nil in unit tests: no keeper
	// startedAtAdopt: containers the keeper held as created that Adopt
	// found started (the monitor before died mid-start); the keeper is
	// told once the adopt list is read.
	startedAtAdopt []string
	// adoptedPods: pods Adopt made, served once it is done.
	adoptedPods []*Pod

	// mu guards pods, lazy, closing and the listener's life. Lock
	// order: Monitor.mu before a Pod.mu; a pod calls the monitor only
	// after releasing its own.
	mu      sync.Mutex
	pods    map[string]*Pod   // by pod dir
	lazy    map[string]string // the lazy layers the keeper holds: dir by chain ID (lazy.go)
	closing bool              // no more pods: the monitor exits once they are gone
	started time.Time         // a node given no pod by idleExitAfter exits
	ln      *os.File
	done    chan struct{} // closed once closing and no pod is left

	// answering counts requests being handled and answered, in all pods:
	// the monitor exits only once each is out, so parallel deletes of a
	// pod's last containers all get their reply.
	answering atomic.Int32

	trim      *time.Timer // returns freed heap to the kernel once things settle
	trimMu    sync.Mutex
	trimmedAt uint64 // anonymous resident bytes after the last trim (0: no baseline yet)
	collected bool   // the trim collected once: the GC's metadata is resident
	statm     statm  // reused: reading it allocates nothing
}

// New prepares the monitor of the node dir dir; keeperFd is its link
// to the keeper (-1: none, in tests).
func New(dir string, logf func(string, ...any), keeperFd int) *Monitor {
	m := &Monitor{dir: dir, logf: logf, reaper: newReaper(), pods: map[string]*Pod{}, lazy: map[string]string{}, done: make(chan struct{}), started: time.Now()}
	textpages.Find() // so that the trim's Release allocates nothing
	if keeperFd >= 0 {
		m.keeper = newKeeperLink(keeperFd, m)
		m.reaper.external = true
	}
	return m
}

// Listen creates the node's socket; call it after Adopt and before telling
// berthd the monitor is ready.
func (m *Monitor) Listen() error {
	if err := os.MkdirAll(m.dir, 0o700); err != nil {
		return fmt.Errorf("create node dir: %w", err)
	}
	path := proto.NodeSocketPath(m.dir)
	_ = os.Remove(path)
	ln, err := listenUnix(path)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", path, err)
	}
	m.mu.Lock()
	m.ln = ln
	m.mu.Unlock()
	// The trim's baseline is the monitor before any new container.
	m.trimMu.Lock()
	m.trimmedAt, _ = m.statm.anonResident()
	m.trimMu.Unlock()
	return nil
}

// Serve takes new pods and serves the pods' sockets until the node has no
// pod left after it stopped taking new ones (or was idle for
// idleExitAfter), then waits for the last answers.
func (m *Monitor) Serve() {
	stop := m.startHousekeeping()
	defer stop()
	if m.keeper != nil {
		go m.keeper.serve()
	}
	m.mu.Lock()
	ln := m.ln
	m.mu.Unlock()
	go serveAccepted(ln, m.isClosing, m.logf, m.serveNodeConn)
	<-m.done
	m.waitAnswers(5 * time.Second)
}

// idleExitAfter is how long a monitor with no pod stays for one to come
// (berthd launched it, then died before adding its pod).
const idleExitAfter = 30 * time.Second

// serveNodeConn answers requests on the node's socket. Its reads keep
// the descriptors that ride along, for lazy-hold; any other op that
// carries one is refused, and nothing received is left open.
func (m *Monitor) serveNodeConn(conn *os.File) {
	defer conn.Close()
	r := newFdReader(conn)
	defer r.close()
	for {
		req, ok := readRequest(r, conn)
		if !ok {
			return
		}
		fds, extra := r.take()
		m.answering.Add(1)
		resp := m.handleNode(req, fds, extra)
		err := proto.WriteResponse(conn, resp)
		m.answering.Add(-1)
		if err != nil {
			return
		}
	}
}

// handleNode runs one node op; it owns fds.
func (m *Monitor) handleNode(req *proto.Request, fds []int, extra bool) *proto.Response {
	if req.Op == proto.OpLazyHold {
		return errResponse(m.lazyHold(req.ID, req.Dir, fds, extra))
	}
	if len(fds) > 0 || extra {
		proto.CloseFds(fds)
		return proto.ErrorResponse(fmt.Errorf("node op %q carries an fd, which only %s may: %w", req.Op, proto.OpLazyHold, errdefs.ErrInvalidArgument))
	}
	switch req.Op {
	case proto.OpAddPod:
		return errResponse(m.addPod(req.Dir))
	case proto.OpPing:
		// The pods served; answered only after Adopt (the socket
		// listens only then), so a pod not named was not adopted.
		return &proto.Response{IDs: m.podDirs()}
	case proto.OpShutdown:
		return errResponse(m.shutdownIfIdle())
	case proto.OpLazyDrop:
		return errResponse(m.lazyDrop(req.ID))
	case proto.OpLazyList:
		return &proto.Response{IDs: m.lazyIDs()}
	}
	return proto.ErrorResponse(fmt.Errorf("unknown node op %q: %w", req.Op, errdefs.ErrInvalidArgument))
}

// errResponse answers an op that returns only an error.
func errResponse(err error) *proto.Response {
	if err != nil {
		return proto.ErrorResponse(err)
	}
	return &proto.Response{}
}

// addPod serves the pod whose state dir is dir (a no-op when it is
// served).
func (m *Monitor) addPod(dir string) error {
	if dir == "" || !filepath.IsAbs(dir) || filepath.Dir(dir) != filepath.Dir(m.dir) {
		return fmt.Errorf("pod dir %q is not beside the node's %s: %w", dir, m.dir, errdefs.ErrInvalidArgument)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closing {
		return fmt.Errorf("monitor is exiting: %w", errdefs.ErrUnavailable)
	}
	if p := m.pods[dir]; p != nil && !p.isClosing() {
		return nil
	}
	p, err := m.newPodLocked(dir)
	if err != nil {
		return err
	}
	go p.Serve()
	return nil
}

// newPodLocked makes and listens the pod of dir, not yet serving.
func (m *Monitor) newPodLocked(dir string) (*Pod, error) {
	pod := filepath.Base(dir)
	p := newPod(dir, m, func(format string, args ...any) { m.logf("pod=%s "+format, append([]any{pod}, args...)...) })
	if err := p.Listen(); err != nil {
		return nil, err
	}
	m.pods[dir] = p
	return p, nil
}

// shutdownIfIdle stops the node if it serves no pod and holds no lazy
// layer.
func (m *Monitor) shutdownIfIdle() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.pods) > 0 {
		return fmt.Errorf("the monitor serves %d pods: %w", len(m.pods), errdefs.ErrFailedPrecondition)
	}
	if len(m.lazy) > 0 {
		return fmt.Errorf("the node holds %d lazy layers: %w", len(m.lazy), errdefs.ErrFailedPrecondition)
	}
	m.closeLocked("asked to, with no pod")
	return nil
}

// podGone drops the pod s, which closed; the node stops once it has none
// and holds no lazy layer.
func (m *Monitor) podGone(p *Pod) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.pods[p.dir] == p {
		delete(m.pods, p.dir)
	}
	if m.idleLocked() {
		m.closeLocked("no pods left")
	}
}

// closeLocked stops taking pods: the node's directory (socket, launch
// lock, log) goes first, so berthd's dial fails from then on and it
// launches a new monitor, whose directory this removal can no longer
// touch; then the listener. Once no pod is left, done closes.
func (m *Monitor) closeLocked(why string) {
	if !m.closing {
		m.closing = true
		m.logf("taking no new pods: %s", why)
		if err := os.RemoveAll(m.dir); err != nil {
			m.logf("remove node dir: %v", err)
		}
		if m.ln != nil {
			m.ln.Close()
		}
	}
	if len(m.pods) == 0 {
		select {
		case <-m.done:
		default:
			close(m.done)
		}
	}
}

// keeperLost is called when the keeper's link closed: with no subreaper
// above it the monitor can start no container whose exit it would see,
// so it takes no new pods (berthd starts a new keeper and monitor for
// them) and serves the ones it has until they are gone.
func (m *Monitor) keeperLost() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closeLocked("the keeper is gone")
}

func (m *Monitor) isClosing() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.closing
}

func (m *Monitor) podDirs() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Collect(maps.Keys(m.pods))
}

// eachPod calls fn for every pod, under the node's lock.
func (m *Monitor) eachPod(fn func(*Pod)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, p := range m.pods {
		fn(p)
	}
}

// waitAnswers waits, at most max, for the responses still being written:
// a client that stopped reading must not keep the monitor alive.
func (m *Monitor) waitAnswers(max time.Duration) {
	for deadline := time.Now().Add(max); m.answering.Load() > 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			m.logf("exiting with responses unsent after %v", max)
			return
		}
	}
}
