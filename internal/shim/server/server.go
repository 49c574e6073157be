// Package server is berth-shim: the process, one per pod, that creates the
// pod's containers through the OCI runtime, holds their stdio, writes their
// CRI logs, reaps them and persists their exits. It speaks the protocol of
// package shim (decision 0300) and is built to stay small (decision 0303):
// no encoding/json, net, os/exec or os/signal, no thread parked in the
// kernel, nothing allocated per log line.
package server

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/berthcri/berth/internal/atomicfile"
	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/shim/proto"
)

// drainTimeout bounds how long an exit waits for the container's output
// pipes to reach EOF (a leftover child may hold them open).
const drainTimeout = 2 * time.Second

// Server is the shim process's state: its pod's containers.
type Server struct {
	dir    string
	logf   func(format string, args ...any)
	reaper *reaper

	mu      sync.Mutex
	ctrs    map[string]*container
	ln      *os.File
	closing bool
	done    chan struct{}

	trim      *time.Timer // returns freed heap to the kernel once things settle
	trimMu    sync.Mutex
	trimmedAt uint64            // bytes allocated (ever) at the last trim
	allocs    [1]metrics.Sample // reused: reading it allocates nothing
}

// container is one container the shim holds.
type container struct {
	id        string
	rt        *ociRuntime
	bundle    string
	pid       int
	started   atomic.Bool
	stdinOnce bool

	exited chan struct{} // closed once exit is set and persisted
	exit   *exitRecord

	waitMu   sync.Mutex
	waiters  []*waiter // parked waits, answered once exited
	answered bool      // waiters were answered: later waits answer at once

	ioMu    sync.Mutex
	stdin   *os.File // write end of the container's stdin, nil when none
	console *os.File // pty master for a terminal container

	logMu   sync.Mutex
	logPath string
	logFile *os.File

	attachMu sync.Mutex
	attaches map[*attachment]struct{}

	streams   sync.WaitGroup
	memCgroup string // memory cgroup dir, to read oom_kill on exit
	oom       *oomWatch
}

type attachment struct {
	conn           *os.File
	stdout, stderr bool
	wmu            sync.Mutex
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
	return nil
}

// Serve answers connections until the pod has no containers left.
func (s *Server) Serve() {
	var t *time.Timer
	t = time.AfterFunc(housekeepingInterval, func() {
		s.reaper.reap()
		s.dropGoneWaiters()
		s.trimNow()
		t.Reset(housekeepingInterval)
	})
	defer t.Stop()
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
}

func (s *Server) serveConn(conn *os.File) {
	parked := false // a wait holds the connection now
	defer func() {
		if !parked {
			conn.Close()
		}
	}()
	for {
		body, err := readMessage(conn)
		if err != nil {
			return
		}
		req, err := decodeRequest(body)
		if err != nil {
			_ = writeResponse(conn, errResponse(fmt.Errorf("%v: %w", err, errdefs.ErrInvalidArgument)))
			return
		}
		if req.op == proto.OpAttach {
			s.attach(conn, req)
			return
		}
		if req.op == proto.OpWait {
			if parked, err = s.wait(conn, req); parked || err != nil {
				return
			}
			continue
		}
		resp, exit := s.handle(req)
		if err := writeResponse(conn, resp); err != nil {
			return
		}
		s.scheduleTrim()
		if exit {
			// Give the delete's response a moment to leave, then go.
			close(s.done)
			return
		}
	}
}

// trimDelay is how long after the last request the shim gives its free
// heap back: an idle shim should hold only what it uses (PSS is the cost
// per pod), and a burst of requests should not pay for a GC each.
const trimDelay = 500 * time.Millisecond

// trimMinGarbage is how much must have been allocated since the last trim
// for another to be worth it. A shim's first GC cycle alone makes ~0.3 MiB
// of runtime metadata resident for good (span set blocks for every size
// class in use, mark bit arenas: decision 0303), more than a pod's worth of
// garbage, so the shim collects only once real garbage piled up: a pod
// with a few containers never pays for a GC, a pod whose containers keep
// restarting is bounded at ~this much garbage.
const trimMinGarbage = 256 << 10

// housekeepingInterval is how often the shim reaps orphans (children it
// never started, reparented to it), drops waits whose clients went away
// and checks whether garbage (from attach streams) calls for a trim.
const housekeepingInterval = 5 * time.Second

func (s *Server) scheduleTrim() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.trim == nil {
		s.trim = time.AfterFunc(trimDelay, s.trimNow)
		return
	}
	s.trim.Reset(trimDelay)
}

// trimNow collects and returns free memory when enough garbage piled up.
// It reads the allocation counter through runtime/metrics, never
// runtime.ReadMemStats: that flushes every cached span into the central
// span sets, which allocates their blocks for each size class in use
// (~0.3 MiB that stay resident), the very cost a GC has.
func (s *Server) trimNow() {
	s.trimMu.Lock()
	defer s.trimMu.Unlock()
	allocs := s.allocs[:]
	allocs[0].Name = "/gc/heap/allocs:bytes"
	metrics.Read(allocs)
	if n := allocs[0].Value.Uint64(); n-s.trimmedAt >= trimMinGarbage {
		debug.FreeOSMemory()
		metrics.Read(allocs)
		s.trimmedAt = allocs[0].Value.Uint64()
	}
	if os.Getenv("BERTH_SHIM_MEMSTATS") == "" {
		return
	}
	// A debugging aid for the memory budget (decision 0303).
	names := []string{"/gc/heap/allocs:bytes", "/memory/classes/heap/objects:bytes", "/memory/classes/heap/stacks:bytes",
		"/memory/classes/metadata/other:bytes", "/memory/classes/total:bytes", "/gc/cycles/total:gc-cycles", "/sched/goroutines:goroutines"}
	samples := make([]metrics.Sample, len(names))
	for i, n := range names {
		samples[i].Name = n
	}
	metrics.Read(samples)
	var b strings.Builder
	b.WriteString("memstats")
	for _, sm := range samples {
		if sm.Value.Kind() == metrics.KindUint64 {
			b.WriteString(" " + sm.Name + "=" + strconv.FormatUint(sm.Value.Uint64(), 10))
		}
	}
	task, _ := os.ReadDir("/proc/self/task")
	s.logf("%s threads=%d", b.String(), len(task))
}

func errResponse(err error) *response {
	r := &response{err: err.Error()}
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		r.kind = proto.KindNotFound
	case errors.Is(err, errdefs.ErrFailedPrecondition):
		r.kind = proto.KindFailedPrecondition
	case errors.Is(err, errdefs.ErrUnavailable):
		r.kind = proto.KindUnavailable
	case errors.Is(err, errdefs.ErrInvalidArgument):
		r.kind = proto.KindInvalidArgument
	}
	return r
}

// handle runs one request; exit is true when the shim should now exit.
func (s *Server) handle(req *request) (*response, bool) {
	if req.op == proto.OpPing {
		s.mu.Lock()
		defer s.mu.Unlock()
		ids := make([]string, 0, len(s.ctrs))
		for id := range s.ctrs {
			ids = append(ids, id)
		}
		return &response{ids: ids}, false
	}
	if req.op == proto.OpShutdown {
		if !s.exitIfEmpty() {
			return errResponse(fmt.Errorf("shim holds containers: %w", errdefs.ErrFailedPrecondition)), false
		}
		return &response{}, true
	}
	if req.op == proto.OpCreate {
		err := s.create(req)
		if err != nil {
			return errResponse(err), s.exitIfEmpty()
		}
		return &response{}, false
	}
	c, err := s.get(req.id)
	if err != nil {
		return errResponse(err), false
	}
	switch req.op {
	case proto.OpStart:
		err = s.start(c)
	case proto.OpKill:
		err = s.kill(c, syscall.Signal(req.signal), req.all)
	case proto.OpState:
		return &response{state: c.state()}, false
	case proto.OpReopenLog:
		err = c.reopenLog()
	case proto.OpDelete:
		if err = s.delete(c); err == nil {
			return &response{state: c.state()}, s.exitIfEmpty()
		}
	default:
		err = fmt.Errorf("unknown op %q: %w", req.op, errdefs.ErrInvalidArgument)
	}
	if err != nil {
		return errResponse(err), false
	}
	return &response{state: c.state()}, false
}

// waiter is a connection waiting for a container's exit. No goroutine
// holds it (each would keep a stack for as long as the container runs):
// waitExit answers it, and the housekeeping drops it once its client went
// away (a killed berthd's), so waits do not pile up in the shim.
type waiter struct {
	conn  *os.File
	rc    syscall.RawConn
	probe [1]byte
	gone  bool
	peek  func(fd uintptr) bool
}

func newWaiter(conn *os.File) (*waiter, error) {
	rc, err := conn.SyscallConn()
	if err != nil {
		return nil, err
	}
	w := &waiter{conn: conn, rc: rc}
	w.peek = func(fd uintptr) bool {
		// Nothing may arrive while waiting: data (n > 0), EOF (n == 0)
		// and errors other than "nothing yet" all mean the client gave
		// up. Peeking allocates nothing, so an idle shim makes no garbage.
		_, _, errno := unix.Syscall6(unix.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&w.probe[0])), 1, unix.MSG_PEEK|unix.MSG_DONTWAIT, 0, 0)
		w.gone = errno != unix.EAGAIN && errno != unix.EINTR
		return true
	}
	return w, nil
}

func (w *waiter) clientGone() bool { return w.rc.Read(w.peek) != nil || w.gone }

// wait answers at once when the container has exited, or parks conn on
// it (parked: the container now owns conn).
func (s *Server) wait(conn *os.File, req *request) (parked bool, err error) {
	c, err := s.get(req.id)
	if err != nil {
		return false, writeResponse(conn, errResponse(err))
	}
	w, err := newWaiter(conn)
	if err != nil {
		return false, err
	}
	c.waitMu.Lock()
	if !c.answered {
		c.waiters = append(c.waiters, w)
		c.waitMu.Unlock()
		return true, nil
	}
	c.waitMu.Unlock()
	return false, writeResponse(conn, &response{state: c.state()})
}

// answerWaiters tells every parked wait of c that it exited and serves
// their connections on.
func (s *Server) answerWaiters(c *container) {
	c.waitMu.Lock()
	ws := c.waiters
	c.waiters, c.answered = nil, true
	c.waitMu.Unlock()
	for _, w := range ws {
		// A stuck client must not hold up the others.
		_ = w.conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
		if writeResponse(w.conn, &response{state: c.state()}) != nil {
			w.conn.Close()
			continue
		}
		_ = w.conn.SetWriteDeadline(time.Time{})
		go s.serveConn(w.conn)
	}
}

// dropGoneWaiters closes the parked waits whose clients went away.
func (s *Server) dropGoneWaiters() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.ctrs {
		c.waitMu.Lock()
		kept := c.waiters[:0]
		for _, w := range c.waiters {
			if w.clientGone() {
				w.conn.Close()
				continue
			}
			kept = append(kept, w)
		}
		clear(c.waiters[len(kept):])
		c.waiters = kept
		c.waitMu.Unlock()
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
	defer s.mu.Unlock()
	return s.closing
}

func (s *Server) get(id string) (*container, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.ctrs[id]
	if !ok {
		return nil, fmt.Errorf("container %s: %w", id, errdefs.ErrNotFound)
	}
	return c, nil
}

func (c *container) state() *state {
	st := &state{id: c.id, pid: c.pid, status: proto.StatusCreated}
	select {
	case <-c.exited:
		st.status, st.exit = proto.StatusExited, c.exit
	default:
		if c.started.Load() {
			st.status = proto.StatusRunning
		}
	}
	return st
}

// output is one stream of a container the shim reads.
type output struct {
	r    *os.File
	name string
}

func (s *Server) create(req *request) (retErr error) {
	cr := req.create
	if req.id == "" || cr == nil || cr.bundle == "" || cr.binary == "" {
		return fmt.Errorf("create needs an id, a bundle and a runtime: %w", errdefs.ErrInvalidArgument)
	}
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		return fmt.Errorf("shim is exiting: %w", errdefs.ErrUnavailable)
	}
	if _, ok := s.ctrs[req.id]; ok {
		s.mu.Unlock()
		return fmt.Errorf("container %s: %w", req.id, errdefs.ErrAlreadyExists)
	}
	// Reserve the ID so the shim does not exit while the create runs.
	c := &container{
		id:        req.id,
		rt:        &ociRuntime{binary: cr.binary, root: cr.root, options: cr.options, reaper: s.reaper},
		bundle:    cr.bundle,
		stdinOnce: cr.stdinOnce,
		exited:    make(chan struct{}),
		logPath:   cr.logPath,
		attaches:  map[*attachment]struct{}{},
	}
	s.ctrs[req.id] = c
	s.mu.Unlock()
	defer func() {
		if retErr != nil {
			s.mu.Lock()
			delete(s.ctrs, req.id)
			s.mu.Unlock()
			c.closeIO()
		}
	}()

	if c.logPath != "" {
		if err := c.openLog(); err != nil {
			return err
		}
	}
	opts := createOpts{bundle: cr.bundle, pidFile: filepath.Join(cr.bundle, "init.pid")}
	var closeAfter []*os.File // the container's ends, closed once runc has them
	defer func() {
		for _, f := range closeAfter {
			f.Close()
		}
	}()
	var outputs []output
	var consoleLn *os.File
	var consoleCh chan consoleResult
	if cr.terminal {
		sock := filepath.Join(s.dir, "console-"+shortID(req.id)+".sock")
		_ = os.Remove(sock)
		ln, err := listenUnix(sock)
		if err != nil {
			return fmt.Errorf("console socket: %w", err)
		}
		consoleLn = ln
		defer func() { ln.Close(); os.Remove(sock) }()
		consoleCh = make(chan consoleResult, 1)
		go func() { consoleCh <- receiveConsole(ln) }()
		// The runtime dials this path itself: keep it short through our
		// /proc fd link to the directory.
		d, err := os.Open(s.dir)
		if err != nil {
			return fmt.Errorf("console socket: %w", err)
		}
		defer d.Close()
		opts.consoleSocket = "/proc/" + strconv.Itoa(os.Getpid()) + "/fd/" + strconv.Itoa(int(d.Fd())) + "/" + filepath.Base(sock)
	} else {
		for _, name := range []string{"stdout", "stderr"} {
			r, w, err := os.Pipe()
			if err != nil {
				return fmt.Errorf("create %s pipe: %w", name, err)
			}
			closeAfter = append(closeAfter, w)
			outputs = append(outputs, output{r, name})
			if name == "stdout" {
				opts.stdout = w
			} else {
				opts.stderr = w
			}
		}
		defer func() {
			if retErr != nil {
				for _, o := range outputs {
					o.r.Close()
				}
			}
		}()
		if cr.stdin {
			r, w, err := os.Pipe()
			if err != nil {
				return fmt.Errorf("create stdin pipe: %w", err)
			}
			closeAfter = append(closeAfter, r)
			opts.stdin = r
			c.stdin = w
		}
	}
	if err := c.rt.create(req.id, opts); err != nil {
		return err
	}
	pid, err := readPidFile(opts.pidFile)
	if err != nil {
		_ = c.rt.delete(req.id, true)
		return err
	}
	c.pid = pid
	exitCh, pidfd, err := s.reaper.watch(pid)
	if err != nil {
		_ = c.rt.delete(req.id, true)
		return err
	}
	if consoleLn != nil {
		_ = consoleLn.SetDeadline(time.Now().Add(10 * time.Second))
		res := <-consoleCh
		if res.err != nil {
			_ = c.rt.delete(req.id, true)
			if pidfd != nil {
				// The reaper still collects the init's exit.
				pidfd.Close()
			}
			return fmt.Errorf("receive console of %s: %w", req.id, res.err)
		}
		c.console = res.f
		c.stdin = nil
		outputs = append(outputs, output{res.f, "stdout"})
	}
	if pc, err := readProcCgroups(pid); err != nil {
		s.logf("container %s: read cgroups: %v", req.id, err)
	} else {
		if moved, err := keepDevicesCgroup(pid, pc); err != nil {
			s.logf("container %s: keep devices cgroup: %v", req.id, err)
		} else if moved {
			s.logf("container %s: moved init back into its scope's devices cgroup", req.id)
		}
		c.memCgroup = pc.memoryDir()
		c.oom = watchOOM(c.memCgroup)
	}
	for _, o := range outputs {
		c.streams.Add(1)
		go c.copyOutput(o.r, o.name, o.r != c.console)
	}
	go s.waitExit(c, exitCh, pidfd)
	return nil
}

func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

func readPidFile(path string) (int, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("read pid file: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("bad pid file %s: %q", path, data)
	}
	return pid, nil
}

// oomKills reads the cgroup's OOM kill counter (v1 memory.oom_control,
// v2 memory.events).
func oomKills(dir string) int {
	if dir == "" {
		return 0
	}
	for _, name := range []string{"memory.oom_control", "memory.events"} {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n") {
			if f := strings.Fields(line); len(f) == 2 && f[0] == "oom_kill" {
				n, _ := strconv.Atoi(f[1])
				return n
			}
		}
	}
	return 0
}

func (s *Server) waitExit(c *container, exitCh <-chan unix.WaitStatus, pidfd *os.File) {
	ws := s.reaper.wait(exitCh, pidfd)
	at := time.Now().UTC()
	e := &exitRecord{id: c.id, pid: c.pid, at: at}
	switch {
	case ws.Exited():
		e.code = ws.ExitStatus()
	case ws.Signaled():
		e.signal = int(ws.Signal())
		e.code = 128 + e.signal
	}
	// Under cgroupfs the cgroup outlives its processes until the runtime
	// deletes it; under systemd it may be gone already, and the watch has
	// seen the kill.
	if oomKills(c.memCgroup) > 0 {
		e.oomKilled = true
	}
	drained := make(chan struct{})
	go func() { c.streams.Wait(); close(drained) }()
	t := time.NewTimer(drainTimeout)
	select {
	case <-drained:
	case <-t.C:
		s.logf("container %s: output not drained after %s", c.id, drainTimeout)
	}
	t.Stop()
	if c.oom.killed() {
		e.oomKilled = true
	}
	c.oom.stop()
	if err := writeExit(s.dir, e); err != nil {
		s.logf("container %s: persist exit: %v", c.id, err)
	}
	c.exit = e
	close(c.exited)
	s.answerWaiters(c)
	c.attachMu.Lock()
	for a := range c.attaches {
		a.conn.Close()
	}
	c.attachMu.Unlock()
}

// writeExit persists e atomically: temp file, fsync, rename, fsync dir.
func writeExit(dir string, e *exitRecord) error {
	return atomicfile.Write(proto.ExitPath(dir, e.id), appendExit(nil, e), 0o600)
}

func (s *Server) start(c *container) error {
	select {
	case <-c.exited:
		return fmt.Errorf("container %s has exited: %w", c.id, errdefs.ErrFailedPrecondition)
	default:
	}
	if c.started.Load() {
		return fmt.Errorf("container %s already started: %w", c.id, errdefs.ErrFailedPrecondition)
	}
	if err := c.rt.start(c.id); err != nil {
		return err
	}
	c.started.Store(true)
	return nil
}

func (s *Server) kill(c *container, sig syscall.Signal, all bool) error {
	select {
	case <-c.exited:
		return nil
	default:
	}
	if sig == 0 {
		sig = syscall.SIGTERM
	}
	err := c.rt.kill(c.id, sig, all)
	if err != nil {
		// It may have exited meanwhile: that is what was asked.
		t := time.NewTimer(100 * time.Millisecond)
		defer t.Stop()
		select {
		case <-c.exited:
			return nil
		case <-t.C:
		}
		if errors.Is(err, errdefs.ErrNotFound) {
			return nil
		}
	}
	return err
}

func (s *Server) delete(c *container) error {
	if err := c.rt.delete(c.id, true); err != nil {
		return err
	}
	t := time.NewTimer(10 * time.Second)
	defer t.Stop()
	select {
	case <-c.exited:
	case <-t.C:
		return fmt.Errorf("container %s did not exit after delete --force", c.id)
	}
	c.closeIO()
	s.mu.Lock()
	delete(s.ctrs, c.id)
	s.mu.Unlock()
	_ = os.Remove(proto.ExitPath(s.dir, c.id))
	return nil
}

func (c *container) closeIO() {
	c.ioMu.Lock()
	if c.stdin != nil {
		c.stdin.Close()
		c.stdin = nil
	}
	if c.console != nil {
		c.console.Close()
		c.console = nil
	}
	c.ioMu.Unlock()
	c.logMu.Lock()
	if c.logFile != nil {
		c.logFile.Close()
		c.logFile = nil
	}
	c.logMu.Unlock()
}

func (c *container) openLog() error {
	if err := os.MkdirAll(filepath.Dir(c.logPath), 0o755); err != nil {
		return fmt.Errorf("create log dir: %w", err)
	}
	f, err := os.OpenFile(c.logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND|unix.O_CLOEXEC, 0o640)
	if err != nil {
		return fmt.Errorf("open log %s: %w", c.logPath, err)
	}
	c.logMu.Lock()
	old := c.logFile
	c.logFile = f
	c.logMu.Unlock()
	if old != nil {
		old.Close()
	}
	return nil
}

func (c *container) reopenLog() error {
	select {
	case <-c.exited:
		return fmt.Errorf("container %s is not running: %w", c.id, errdefs.ErrFailedPrecondition)
	default:
	}
	if c.logPath == "" {
		return nil
	}
	return c.openLog()
}

// maxLogLine is the longest log record; longer lines become P records.
const maxLogLine = 16 << 10

// copyOutput reads one stream of the container, writes CRI log records and
// feeds attached clients. One goroutine and one 16 KiB buffer per stream.
func (c *container) copyOutput(r *os.File, name string, closeAtEnd bool) {
	defer c.streams.Done()
	if closeAtEnd {
		defer r.Close()
	}
	frame := proto.FrameStdout
	if name == "stderr" {
		frame = proto.FrameStderr
	}
	lines := newLineSplitter(func(tag string, msg []byte) { c.writeLog(name, tag, msg) })
	// Logged first (inside readOnce), then attached clients: whoever saw a
	// line can rely on it being in the log.
	fan := func(chunk []byte) { c.fanout(frame, chunk) }
	for {
		if err := lines.readOnce(r, fan); err != nil {
			lines.Flush()
			return
		}
	}
}

// lineSplitter turns a byte stream into CRI log records: every complete
// line is an F record; a line longer than maxLogLine is cut into P records
// ending with an F record; what is left at the end of the stream is P.
type lineSplitter struct {
	buf     []byte
	n       int
	partial bool // the last record was P: the line is still open
	emit    func(tag string, msg []byte)
}

func newLineSplitter(emit func(tag string, msg []byte)) *lineSplitter {
	return &lineSplitter{buf: make([]byte, maxLogLine), emit: emit}
}

// readOnce does one read from r into the buffer, emits the records it
// completes, then passes the bytes read to fan. Nothing is allocated: the
// chunk is handed over before the buffer is compacted.
func (l *lineSplitter) readOnce(r io.Reader, fan func([]byte)) error {
	m, err := r.Read(l.buf[l.n:])
	if m > 0 {
		from := l.n
		done := l.consume(m)
		fan(l.buf[from : from+m])
		l.compact(done)
	}
	return err
}

// Write feeds p through the splitter (used by tests and the fuzz target).
func (l *lineSplitter) Write(p []byte) (int, error) {
	total := len(p)
	for len(p) > 0 {
		m := copy(l.buf[l.n:], p)
		p = p[m:]
		l.compact(l.consume(m))
	}
	return total, nil
}

// consume accounts for m new bytes at buf[n:], emits the records they
// complete and returns how many bytes at the buffer's start are done with.
func (l *lineSplitter) consume(m int) int {
	l.n += m
	start := 0
	for {
		i := indexNewline(l.buf[start:l.n])
		if i < 0 {
			break
		}
		l.emit("F", l.buf[start:start+i])
		l.partial = false
		start += i + 1
	}
	if start == 0 && l.n == len(l.buf) {
		l.emit("P", l.buf[:l.n])
		l.partial = true
		start = l.n
	}
	return start
}

// compact drops the first done bytes of the buffer.
func (l *lineSplitter) compact(done int) {
	copy(l.buf, l.buf[done:l.n])
	l.n -= done
}

// Flush ends the stream: an unterminated last line becomes P, as in
// containerd, because the kubelet gives an F record's content a newline
// ("echo -n DONE" would read back as "DONE\n", in FallbackToLogsOnError
// termination messages too); nothing is added after a line already cut
// into P records.
func (l *lineSplitter) Flush() {
	if l.n > 0 {
		l.emit("P", l.buf[:l.n])
	}
	l.n, l.partial = 0, false
}

func indexNewline(b []byte) int {
	for i, x := range b {
		if x == '\n' {
			return i
		}
	}
	return -1
}

// writeLog appends one record `<RFC3339Nano> <stream> <F|P> <msg>\n` with
// a single writev, so records from stdout and stderr never interleave. It
// allocates nothing: the header and the iovecs live on the stack.
func (c *container) writeLog(stream, tag string, msg []byte) {
	var hdr [64]byte
	h := time.Now().UTC().AppendFormat(hdr[:0], time.RFC3339Nano)
	h = append(h, ' ')
	h = append(h, stream...)
	h = append(h, ' ')
	h = append(h, tag...)
	h = append(h, ' ')
	nl := [1]byte{'\n'}
	var iov [3]unix.Iovec
	iov[0].Base = &h[0]
	iov[0].SetLen(len(h))
	n := 1
	if len(msg) > 0 {
		iov[n].Base = &msg[0]
		iov[n].SetLen(len(msg))
		n++
	}
	iov[n].Base = &nl[0]
	iov[n].SetLen(1)
	n++
	c.logMu.Lock()
	defer c.logMu.Unlock()
	if c.logFile == nil {
		return
	}
	_, _, _ = unix.Syscall(unix.SYS_WRITEV, c.logFile.Fd(), uintptr(unsafe.Pointer(&iov[0])), uintptr(n))
}

func (c *container) fanout(kind byte, data []byte) {
	c.attachMu.Lock()
	defer c.attachMu.Unlock()
	for a := range c.attaches {
		if (kind == proto.FrameStdout && !a.stdout) || (kind == proto.FrameStderr && !a.stderr) {
			continue
		}
		a.wmu.Lock()
		// A stuck client must not stall the log.
		_ = a.conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
		err := proto.WriteFrame(a.conn, kind, data)
		a.wmu.Unlock()
		if err != nil {
			a.conn.Close()
			delete(c.attaches, a)
		}
	}
}

// attach serves one attach connection: it answers the request, then relays
// output frames to the client and its stdin/resize frames to the container.
func (s *Server) attach(conn *os.File, req *request) {
	c, err := s.get(req.id)
	if err != nil {
		_ = writeResponse(conn, errResponse(err))
		return
	}
	select {
	case <-c.exited:
		_ = writeResponse(conn, errResponse(fmt.Errorf("container %s is not running: %w", c.id, errdefs.ErrFailedPrecondition)))
		return
	default:
	}
	a := &attachment{conn: conn, stdout: req.stdout, stderr: req.stderr}
	a.wmu.Lock()
	err = writeResponse(conn, &response{state: c.state()})
	a.wmu.Unlock()
	if err != nil {
		return
	}
	c.attachMu.Lock()
	c.attaches[a] = struct{}{}
	c.attachMu.Unlock()
	defer func() {
		c.attachMu.Lock()
		delete(c.attaches, a)
		c.attachMu.Unlock()
		if req.stdin && c.stdinOnce {
			c.closeStdin()
		}
	}()
	buf := make([]byte, 0, 4096)
	for {
		kind, payload, err := proto.ReadFrame(conn, buf)
		if err != nil {
			return
		}
		switch kind {
		case proto.FrameStdin:
			if req.stdin {
				c.writeStdin(payload)
			}
		case proto.FrameCloseStdin:
			// The client's input ended: that ends the container's stdin
			// only for stdin_once containers (as in containerd).
			if req.stdin && c.stdinOnce {
				c.closeStdin()
			}
		case proto.FrameResize:
			if len(payload) == 4 {
				c.resize(binary.BigEndian.Uint16(payload), binary.BigEndian.Uint16(payload[2:]))
			}
		}
	}
}

func (c *container) writeStdin(p []byte) {
	c.ioMu.Lock()
	defer c.ioMu.Unlock()
	switch {
	case c.console != nil:
		_, _ = c.console.Write(p)
	case c.stdin != nil:
		_, _ = c.stdin.Write(p)
	}
}

func (c *container) closeStdin() {
	c.ioMu.Lock()
	defer c.ioMu.Unlock()
	if c.stdin != nil {
		c.stdin.Close()
		c.stdin = nil
	}
}

func (c *container) resize(width, height uint16) {
	c.ioMu.Lock()
	defer c.ioMu.Unlock()
	if c.console == nil {
		return
	}
	rc, err := c.console.SyscallConn()
	if err != nil {
		return
	}
	_ = rc.Control(func(fd uintptr) {
		_ = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Col: width, Row: height})
	})
}

type consoleResult struct {
	f   *os.File
	err error
}

var errBadConsole = errors.New("bad console message")

// receiveConsole accepts the runtime's connection on the console socket and
// takes the pty master it sends with SCM_RIGHTS. The master is made
// non-blocking so its reads park in the poller rather than hold a thread.
func receiveConsole(ln *os.File) consoleResult {
	conn, err := accept(ln)
	if err != nil {
		return consoleResult{err: err}
	}
	defer conn.Close()
	fd, err := recvFd(conn)
	if err != nil {
		return consoleResult{err: err}
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return consoleResult{err: err}
	}
	return consoleResult{f: os.NewFile(uintptr(fd), "pty-master")}
}
