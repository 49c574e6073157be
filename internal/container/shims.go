package container

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/shim"
)

// Shim is one pod's berth-shim as the store drives it; calls fail with
// shim.ErrNoShim when none runs.
type Shim interface {
	Create(ctx context.Context, id string, cr *shim.CreateRequest) error
	Start(ctx context.Context, id string) (*shim.State, error)
	Kill(ctx context.Context, id string, sig syscall.Signal, all bool) error
	State(ctx context.Context, id string) (*shim.State, error)
	// Wait blocks until the container exits or ctx ends.
	Wait(ctx context.Context, id string) (*shim.State, error)
	// Delete removes the container from the runtime (killing it) and the
	// shim.
	Delete(ctx context.Context, id string) (*shim.State, error)
	ReopenLog(ctx context.Context, id string) error
	// List returns the IDs of the containers the shim holds.
	List(ctx context.Context) ([]string, error)
	// Shutdown makes a shim that holds nothing exit.
	Shutdown(ctx context.Context) error
	Attach(ctx context.Context, id string, stdin, stdout, stderr bool) (*shim.Stream, error)
	// Exit is the exit the shim persisted for the container, if any; it
	// is read from disk and works while the shim is down.
	Exit(id string) (*shim.Exit, bool, error)
}

// Shims reaches the pods on the node's monitor. berthShims (below) runs
// berth-shim under Options.ShimDir; unit tests put their own in
// Options.Shims.
type Shims interface {
	// Pod is the pod on the node's monitor, whether or not the monitor
	// serves it.
	Pod(podID string) Shim
	// Start returns the pod on the node's monitor, adding the pod
	// (launching keeper and monitor if none runs); two calls for one pod
	// never add it twice.
	Start(ctx context.Context, podID string) (Shim, error)
	// Pods lists the pods that have state under the shim dir (a pod the
	// monitor serves, or the directory a pod no monitor serves left).
	Pods() ([]string, error)
	// Forget removes the state a pod no monitor serves left.
	Forget(podID string) error
	// StopIdleNode stops the node's shim processes if they serve no pod
	// (launched for a pod a crash cut short before it was added).
	StopIdleNode(ctx context.Context) error
}

// berthShims is berth-shim: one keeper and monitor per node serving every
// pod (decision 1701), each pod's socket and persisted exits in
// <dir>/<pod-id>, the node's in <dir>/.node.
type berthShims struct {
	dir    string
	binary string
	log    *slog.Logger

	mu sync.Mutex
	// launches serialise adding a pod, per pod (two creates in one pod
	// must not add it twice). Pods never wait on each other's add, so a
	// hung add stalls only its own pod.
	launches map[string]*podLaunchLock
}

// podLaunchLock is one pod's add-pod lock; refs counts holders and
// waiters, so the map entry goes when nobody needs it.
type podLaunchLock struct {
	mu   sync.Mutex
	refs int
}

func newBerthShims(dir, binary string, log *slog.Logger) *berthShims {
	return &berthShims{dir: dir, binary: binary, log: log, launches: map[string]*podLaunchLock{}}
}

// berthShim is shim.Client plus the exits it persists on disk.
type berthShim struct{ *shim.Client }

func (c berthShim) Exit(id string) (*shim.Exit, bool, error) { return shim.ReadExit(c.Dir(), id) }

func (b *berthShims) Pod(podID string) Shim {
	return berthShim{shim.NewClient(filepath.Join(b.dir, podID))}
}

func (b *berthShims) Start(ctx context.Context, podID string) (Shim, error) {
	defer b.lockPod(podID)()
	c := shim.NewClient(filepath.Join(b.dir, podID))
	_, err := c.List(ctx)
	if err == nil {
		return berthShim{c}, nil
	}
	if !errors.Is(err, shim.ErrNoShim) {
		return nil, err
	}
	c, err = shim.Launch(ctx, b.binary, c.Dir(), podID)
	if err != nil {
		return nil, err
	}
	b.log.Info("shim started", "pod", podID)
	return berthShim{c}, nil
}

func (b *berthShims) Pods() ([]string, error) {
	es, err := os.ReadDir(b.dir)
	if err != nil {
		return nil, fmt.Errorf("list shim state: %w", err)
	}
	var pods []string
	for _, e := range es {
		// The node's keeper and monitor keep theirs in .node.
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
			pods = append(pods, e.Name())
		}
	}
	return pods, nil
}

func (b *berthShims) Forget(podID string) error {
	return os.RemoveAll(filepath.Join(b.dir, podID))
}

func (b *berthShims) StopIdleNode(ctx context.Context) error {
	return shim.StopIdleNode(ctx, b.dir)
}

// lockPod takes the pod's add-pod lock and returns its unlock.
func (b *berthShims) lockPod(podID string) func() {
	b.mu.Lock()
	l := b.launches[podID]
	if l == nil {
		l = &podLaunchLock{}
		b.launches[podID] = l
	}
	l.refs++
	b.mu.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		b.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(b.launches, podID)
		}
		b.mu.Unlock()
	}
}

// pendingShim is the pod being added to the node's monitor (keeper and
// monitor launched first if none runs) in the background while a create
// mounts the rootfs and builds the spec: that costs a few ms on the first
// container of every pod.
type pendingShim struct {
	done chan struct{}
	shim Shim
	err  error
}

func reachShim(ctx context.Context, shims Shims, podID string) *pendingShim {
	p := &pendingShim{done: make(chan struct{})}
	go func() {
		defer close(p.done)
		p.shim, p.err = shims.Start(ctx, podID)
	}()
	return p
}

// join waits for the pod to be on the monitor.
func (p *pendingShim) join() (Shim, error) {
	<-p.done
	return p.shim, p.err
}

// abandon is the undo of a create whose container the monitor does not
// hold: a pod added for this create alone ends (one holding other
// containers refuses, as it should).
func (p *pendingShim) abandon(ctx context.Context, log *slog.Logger) {
	sh, err := p.join()
	if err != nil {
		return
	}
	if err := sh.Shutdown(ctx); err != nil && !errors.Is(err, shim.ErrNoShim) && !errors.Is(err, errdefs.ErrFailedPrecondition) {
		log.Warn("end the idle pod after failed create", "err", err)
	}
}

// WarmShim adds the pod to the node's monitor in the background
// (launching keeper and monitor if none runs), ahead of its first
// CreateContainer: RunPodSandbox calls it before the pod's CNI ADD, which
// mostly waits on the plugins' processes, so the add (and any launch:
// fork, exec, a Go runtime's start, several ms on a busy node) is off the
// create's path. The create finds the pod through Shims.Start's per-pod
// lock, added or still being added. wait blocks until the add is over
// (RunPodSandbox returns only then, so what it made is all there when it
// answers). A pod removed without ever getting a container is ended,
// idle, on the monitor by ShutdownIdleShim; berthd restarted meanwhile
// ends it at start (reapOrphans).
func (s *Store) WarmShim(ctx context.Context, podID string) (wait func()) {
	done := make(chan struct{})
	s.mu.Lock()
	if other, ok := s.warming[podID]; ok {
		s.mu.Unlock()
		return func() { <-other }
	}
	s.warming[podID] = done
	s.mu.Unlock()
	go func() {
		defer func() {
			s.mu.Lock()
			delete(s.warming, podID)
			s.mu.Unlock()
			close(done)
		}()
		if _, err := s.shims.Start(context.WithoutCancel(ctx), podID); err != nil {
			// The pod's first create launches it again, and says why.
			s.log.Warn("add the pod to the monitor ahead of its first container", "pod", podID, "err", err)
		}
	}()
	return func() { <-done }
}

// ShutdownIdleShim ends the pod on the node's monitor if it holds no
// container (one WarmShim added for a pod that never got one), after
// waiting for an add in progress. A pod holding containers refuses, and
// none served is fine (its directory goes once the pod has no container).
func (s *Store) ShutdownIdleShim(ctx context.Context, podID string) error {
	s.mu.Lock()
	done := s.warming[podID]
	s.mu.Unlock()
	if done != nil {
		<-done
	}
	err := s.shims.Pod(podID).Shutdown(ctx)
	if errors.Is(err, shim.ErrNoShim) && len(s.ListPod(podID)) == 0 {
		// None serves the pod, and none will (its keeper and monitor
		// died): the directory they left holds nothing any container
		// still needs, the exits were folded into the records.
		if ferr := s.shims.Forget(podID); ferr != nil {
			s.log.Warn("remove the directory of a pod no monitor serves", "pod", podID, "err", ferr)
		}
		// And the node's, if its keeper died too (a living keeper's, or
		// a monitor serving other pods, stays).
		if ferr := s.shims.StopIdleNode(ctx); ferr != nil {
			s.log.Warn("stop the node's idle monitor", "err", ferr)
		}
		return nil
	}
	if err == nil || errors.Is(err, shim.ErrNoShim) || errors.Is(err, errdefs.ErrFailedPrecondition) {
		return nil
	}
	return fmt.Errorf("end the idle pod %s on the monitor: %w", podID, err)
}
