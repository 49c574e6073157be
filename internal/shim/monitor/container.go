package monitor

import (
	"os"
	"sync"
	"time"

	"github.com/berthcri/berth/internal/oci/ocicli"
	"github.com/berthcri/berth/internal/shim/proto"
)

// phase is where a container is in its life, as the monitor sees it.
type phase uint8

const (
	// phaseCreating: reserved by a create still running; other ops do
	// not see it yet (Pod.get).
	phaseCreating phase = iota
	// phaseCreated: the runtime created it, its pid is known, its init
	// waits for start; or it is restored at its start (restore set) and
	// has no process yet, pid 0.
	phaseCreated
	// phaseRunning: started.
	phaseRunning
	// phaseExited: its init was reaped and the exit persisted.
	phaseExited
)

func (p phase) status() string {
	switch p {
	case phaseRunning:
		return proto.StatusRunning
	case phaseExited:
		return proto.StatusExited
	default:
		return proto.StatusCreated
	}
}

// container is one container a pod holds. Who owns what:
//   - the fields before mu are set before the container is published and
//     never change;
//   - mu guards its life: phase, pid, exit and the parked waits; phase
//     only moves forward (creating, created, running, exited);
//   - log, stdio and attaches lock themselves, apart from mu and from
//     each other: a log write must not wait behind a state read, nor a
//     state read behind a stdin write to a container that does not read;
//   - memCgroup and oom belong to the create until it starts waitExit,
//     then to waitExit.
//
// Lock order: Pod.mu, then mu, then log's, stdio's or attaches' own.
type container struct {
	id        string
	bundle    string
	rt        *ocicli.Runtime
	stdinOnce bool
	logf      func(format string, args ...any)
	exited    chan struct{} // closed when phase becomes exited
	// restore is the create request of a container restored from a
	// checkpoint at its start (nil for others): what start launches.
	restore *proto.CreateRequest

	mu      sync.Mutex
	phase   phase
	pid     int
	exit    *proto.Exit
	waiters []*waiter // parked waits, answered once exited

	log      logSink
	stdio    stdio
	outputs  []*os.File // the streams its copiers read (HandOver stops them), under mu
	attaches attachSet
	streams  sync.WaitGroup // the output copiers, done at EOF

	memCgroup string // memory cgroup dir, to read oom_kill on exit
	oom       *oomWatch
}

func newContainer(id string, cr *proto.CreateRequest, rt *ocicli.Runtime, logf func(string, ...any)) *container {
	return &container{
		id:        id,
		bundle:    cr.Bundle,
		rt:        rt,
		stdinOnce: cr.StdinOnce,
		logf:      logf,
		exited:    make(chan struct{}),
		log:       logSink{path: cr.LogPath, dir: cr.LogDir},
		attaches:  attachSet{m: map[*attachment]struct{}{}},
	}
}

// awaitsRestore reports whether c is a restored container whose process
// has not been restored yet.
func (c *container) awaitsRestore() bool {
	if c.restore == nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.phase == phaseCreated && c.pid == 0
}

func (c *container) currentPhase() phase {
	c.mu.Lock()
	v := c.phase
	c.mu.Unlock()
	return v
}

// setProcess records the container's init and its phase (created, or
// running): other ops may see the container now.
func (c *container) setProcess(pid int, p phase) {
	c.mu.Lock()
	c.pid, c.phase = pid, p
	c.mu.Unlock()
}

// started records a successful start, unless the container exited
// meanwhile (its phase stays exited).
func (c *container) started() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.phase == phaseCreated {
		c.phase = phaseRunning
	}
}

// state reports the container.
func (c *container) state() *proto.State {
	c.mu.Lock()
	st := &proto.State{ID: c.id, Pid: c.pid, Status: c.phase.status(), Exit: c.exit}
	c.mu.Unlock()
	st.LogWriteErrors, st.LogWriteError = c.log.writeErrors()
	return st
}

// hasExited reports whether the exit is recorded.
func (c *container) hasExited() bool {
	select {
	case <-c.exited:
		return true
	default:
		return false
	}
}

// closeIO closes what the monitor holds open for the container: its stdin,
// its pty and its log file.
func (c *container) closeIO() {
	c.stdio.close()
	c.log.close()
}

// startCopier starts the copier of one output stream (closeAtEnd: the
// copier closes it at its end).
func (c *container) startCopier(o output, closeAtEnd bool) {
	c.mu.Lock()
	c.outputs = append(c.outputs, o.r)
	c.mu.Unlock()
	c.streams.Add(1)
	go c.copyOutput(o.r, o.name, closeAtEnd)
}

// stopCopiers makes every copier's next read fail at once, so each writes
// what it holds and ends.
func (c *container) stopCopiers() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, f := range c.outputs {
		_ = f.SetReadDeadline(time.Unix(1, 0))
	}
}
