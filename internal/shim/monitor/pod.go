package monitor

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

// Pod is one pod the monitor serves: its containers, its socket and
// its directory (exits, console sockets).
type Pod struct {
	dir    string
	logf   func(format string, args ...any)
	mon    *Monitor
	reaper *reaper // the node's

	// mu guards the registry: ctrs and closing. Lock order: s.mu before a
	// container's mu.
	mu      sync.Mutex
	ctrs    map[string]*container
	closing bool // the pod is going: no more creates

	ln *os.File
}

// newPod prepares the pod whose state dir is dir.
func newPod(dir string, m *Monitor, logf func(string, ...any)) *Pod {
	return &Pod{dir: dir, logf: logf, mon: m, reaper: m.reaper, ctrs: map[string]*container{}}
}

// Listen creates the pod's socket; berthd reaches the pod there once
// OpAddPod answered.
func (p *Pod) Listen() error {
	if err := os.MkdirAll(filepath.Join(p.dir, "exits"), 0o700); err != nil {
		return fmt.Errorf("create pod dir: %w", err)
	}
	_ = os.Remove(proto.SocketPath(p.dir))
	ln, err := listenUnix(proto.SocketPath(p.dir))
	if err != nil {
		return fmt.Errorf("listen on %s: %w", proto.SocketPath(p.dir), err)
	}
	p.ln = ln
	return nil
}

// Serve answers the pod's connections until the pod has no containers
// left.
func (p *Pod) Serve() {
	serveAccepted(p.ln, p.isClosing, p.logf, p.serveConn)
}

// exitIfEmpty ends the pod when it holds no containers: it removes its
// socket and directory first, under the lock, so a create racing with
// it is refused and berthd adds the pod afresh. The node learns of it
// after the pod's lock is released (lock order).
func (p *Pod) exitIfEmpty() bool {
	p.mu.Lock()
	if len(p.ctrs) > 0 || p.closing {
		p.mu.Unlock()
		return false
	}
	p.closing = true
	// Directory (and socket file) first: from then on berthd's dial fails
	// with ENOENT and it adds the pod again, with a directory this
	// removal can no longer touch. Closing the listener first would open
	// a window where the new directory is deleted under it.
	if err := os.RemoveAll(p.dir); err != nil {
		p.logf("remove pod dir: %v", err)
	}
	p.ln.Close()
	p.mu.Unlock()
	p.mon.podGone(p)
	return true
}

func (p *Pod) isClosing() bool {
	p.mu.Lock()
	v := p.closing
	p.mu.Unlock()
	return v
}

// reserve publishes c, still being created, under its ID: the ID is
// taken and the pod does not end while the create runs, but no other op
// sees c until it is created (get).
func (p *Pod) reserve(c *container) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closing {
		return fmt.Errorf("the pod is ending: %w", errdefs.ErrUnavailable)
	}
	if p.mon.keeper.lost() {
		return fmt.Errorf("the node's keeper is gone, no container can be started here: %w", errdefs.ErrUnavailable)
	}
	if _, ok := p.ctrs[c.id]; ok {
		return fmt.Errorf("container %s: %w", c.id, errdefs.ErrAlreadyExists)
	}
	p.ctrs[c.id] = c
	return nil
}

// forget removes container id from the registry.
func (p *Pod) forget(id string) {
	p.mu.Lock()
	delete(p.ctrs, id)
	p.mu.Unlock()
}

// get returns a created container. One still being created is not there
// yet for other ops: berthd serialises calls per container, so only a
// confused client asks.
func (p *Pod) get(id string) (*container, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	c, ok := p.ctrs[id]
	if !ok {
		return nil, fmt.Errorf("container %s: %w", id, errdefs.ErrNotFound)
	}
	if c.currentPhase() == phaseCreating {
		return nil, fmt.Errorf("container %s is being created: %w", id, errdefs.ErrFailedPrecondition)
	}
	return c, nil
}

// ids lists the containers the pod holds, also those being created.
func (p *Pod) ids() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Collect(maps.Keys(p.ctrs))
}

// each calls fn for every container, under the registry lock (fn may
// take the container's lock, never the registry's).
func (p *Pod) each(fn func(*container)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.ctrs {
		fn(c)
	}
}
