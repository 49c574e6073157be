package shim

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/oci"
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
	ln      *net.UnixListener
	closing bool
	done    chan struct{}

	trim *time.Timer // returns freed heap to the kernel once things settle
}

// container is one container the shim holds.
type container struct {
	id        string
	rt        *oci.Runtime
	bundle    string
	pid       int
	started   atomic.Bool
	stdinOnce bool

	exited chan struct{} // closed once exit is set and persisted
	exit   *Exit

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
	conn           net.Conn
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
	_ = os.Remove(SocketPath(s.dir))
	ln, err := listenUnix(SocketPath(s.dir))
	if err != nil {
		return fmt.Errorf("listen on %s: %w", SocketPath(s.dir), err)
	}
	s.ln = ln
	return nil
}

// Serve answers connections until the pod has no containers left.
func (s *Server) Serve() {
	go func() {
		for {
			conn, err := s.ln.Accept()
			if err != nil {
				return
			}
			go s.serveConn(conn)
		}
	}()
	<-s.done
}

func (s *Server) serveConn(conn net.Conn) {
	defer conn.Close()
	for {
		var req Request
		if err := readMessage(conn, &req); err != nil {
			return
		}
		if req.Op == OpAttach {
			s.attach(conn, &req)
			return
		}
		if req.Op == OpWait {
			if !s.wait(conn, &req) {
				return
			}
			continue
		}
		resp, exit := s.handle(&req)
		if err := writeMessage(conn, resp); err != nil {
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

func (s *Server) scheduleTrim() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.trim == nil {
		s.trim = time.AfterFunc(trimDelay, debug.FreeOSMemory)
		return
	}
	s.trim.Reset(trimDelay)
}

func errResponse(err error) *Response {
	r := &Response{Error: err.Error()}
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		r.Kind = KindNotFound
	case errors.Is(err, errdefs.ErrFailedPrecondition):
		r.Kind = KindFailedPrecondition
	case errors.Is(err, errdefs.ErrUnavailable):
		r.Kind = KindUnavailable
	case errors.Is(err, errdefs.ErrInvalidArgument):
		r.Kind = KindInvalidArgument
	}
	return r
}

// handle runs one request; exit is true when the shim should now exit.
func (s *Server) handle(req *Request) (*Response, bool) {
	if req.Op == OpPing {
		s.mu.Lock()
		defer s.mu.Unlock()
		ids := make([]string, 0, len(s.ctrs))
		for id := range s.ctrs {
			ids = append(ids, id)
		}
		return &Response{IDs: ids}, false
	}
	if req.Op == OpShutdown {
		if !s.exitIfEmpty() {
			return errResponse(fmt.Errorf("shim holds containers: %w", errdefs.ErrFailedPrecondition)), false
		}
		return &Response{}, true
	}
	if req.Op == OpCreate {
		err := s.create(req)
		if err != nil {
			return errResponse(err), s.exitIfEmpty()
		}
		return &Response{}, false
	}
	c, err := s.get(req.ID)
	if err != nil {
		return errResponse(err), false
	}
	ctx := context.Background()
	switch req.Op {
	case OpStart:
		err = s.start(ctx, c)
	case OpKill:
		err = s.kill(ctx, c, syscall.Signal(req.Signal), req.All)
	case OpState:
		return &Response{State: c.state()}, false
	case OpReopenLog:
		err = c.reopenLog()
	case OpDelete:
		if err = s.delete(ctx, c); err == nil {
			return &Response{State: c.state()}, s.exitIfEmpty()
		}
	default:
		err = fmt.Errorf("unknown op %q: %w", req.Op, errdefs.ErrInvalidArgument)
	}
	if err != nil {
		return errResponse(err), false
	}
	return &Response{State: c.state()}, false
}

// waitPoll is how often a waiting connection is checked for a client that
// went away (berthd restarted), so waits do not pile up in the shim.
const waitPoll = 5 * time.Second

// wait answers once the container exits; false means the client is gone.
func (s *Server) wait(conn net.Conn, req *Request) bool {
	c, err := s.get(req.ID)
	if err != nil {
		return writeMessage(conn, errResponse(err)) == nil
	}
	t := time.NewTimer(waitPoll)
	defer t.Stop()
	var probe [1]byte
	for {
		select {
		case <-c.exited:
			return writeMessage(conn, &Response{State: c.state()}) == nil
		case <-t.C:
			// Nothing may arrive while waiting: data or EOF means the
			// client gave up.
			_ = conn.SetReadDeadline(time.Now().Add(time.Millisecond))
			_, err := conn.Read(probe[:])
			var ne net.Error
			if err == nil || !errors.As(err, &ne) || !ne.Timeout() {
				return false
			}
			_ = conn.SetReadDeadline(time.Time{})
			t.Reset(waitPoll)
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

func (s *Server) get(id string) (*container, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.ctrs[id]
	if !ok {
		return nil, fmt.Errorf("container %s: %w", id, errdefs.ErrNotFound)
	}
	return c, nil
}

func (c *container) state() *State {
	st := &State{ID: c.id, Pid: c.pid, Status: StatusCreated}
	select {
	case <-c.exited:
		st.Status, st.Exit = StatusExited, c.exit
	default:
		if c.started.Load() {
			st.Status = StatusRunning
		}
	}
	return st
}

func (s *Server) create(req *Request) (retErr error) {
	cr := req.Create
	if req.ID == "" || cr == nil || cr.Bundle == "" || cr.Runtime.Binary == "" {
		return fmt.Errorf("create needs an id, a bundle and a runtime: %w", errdefs.ErrInvalidArgument)
	}
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		return fmt.Errorf("shim is exiting: %w", errdefs.ErrUnavailable)
	}
	if _, ok := s.ctrs[req.ID]; ok {
		s.mu.Unlock()
		return fmt.Errorf("container %s: %w", req.ID, errdefs.ErrAlreadyExists)
	}
	// Reserve the ID so the shim does not exit while the create runs.
	c := &container{
		id:        req.ID,
		rt:        &oci.Runtime{Binary: cr.Runtime.Binary, Root: cr.Runtime.Root, Options: cr.Runtime.Options, Runner: s.reaper},
		bundle:    cr.Bundle,
		stdinOnce: cr.StdinOnce,
		exited:    make(chan struct{}),
		logPath:   cr.LogPath,
		attaches:  map[*attachment]struct{}{},
	}
	s.ctrs[req.ID] = c
	s.mu.Unlock()
	defer func() {
		if retErr != nil {
			s.mu.Lock()
			delete(s.ctrs, req.ID)
			s.mu.Unlock()
			c.closeIO()
		}
	}()

	if c.logPath != "" {
		if err := c.openLog(); err != nil {
			return err
		}
	}
	opts := oci.CreateOpts{Bundle: cr.Bundle, PidFile: filepath.Join(cr.Bundle, "init.pid")}
	var closeAfter []*os.File // the container's ends, closed once runc has them
	defer func() {
		for _, f := range closeAfter {
			f.Close()
		}
	}()
	var outputs []struct {
		r    *os.File
		name string
	}
	var consoleLn *net.UnixListener
	var consoleCh chan consoleResult
	if cr.Terminal {
		sock := filepath.Join(s.dir, "console-"+shortID(req.ID)+".sock")
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
		opts.ConsoleSocket = fmt.Sprintf("/proc/%d/fd/%d/%s", os.Getpid(), d.Fd(), filepath.Base(sock))
	} else {
		for _, name := range []string{"stdout", "stderr"} {
			r, w, err := os.Pipe()
			if err != nil {
				return fmt.Errorf("create %s pipe: %w", name, err)
			}
			closeAfter = append(closeAfter, w)
			outputs = append(outputs, struct {
				r    *os.File
				name string
			}{r, name})
			if name == "stdout" {
				opts.Stdout = w
			} else {
				opts.Stderr = w
			}
		}
		defer func() {
			if retErr != nil {
				for _, o := range outputs {
					o.r.Close()
				}
			}
		}()
		if cr.Stdin {
			r, w, err := os.Pipe()
			if err != nil {
				return fmt.Errorf("create stdin pipe: %w", err)
			}
			closeAfter = append(closeAfter, r)
			opts.Stdin = r
			c.stdin = w
		}
	}
	if err := c.rt.Create(context.Background(), req.ID, opts); err != nil {
		return err
	}
	pid, err := readPidFile(opts.PidFile)
	if err != nil {
		_ = c.rt.Delete(context.Background(), req.ID, true)
		return err
	}
	c.pid = pid
	exitCh := s.reaper.wait(pid)
	if consoleLn != nil {
		consoleLn.SetDeadline(time.Now().Add(10 * time.Second))
		res := <-consoleCh
		if res.err != nil {
			_ = c.rt.Delete(context.Background(), req.ID, true)
			return fmt.Errorf("receive console of %s: %w", req.ID, res.err)
		}
		c.console = res.f
		c.stdin = nil
		outputs = append(outputs, struct {
			r    *os.File
			name string
		}{res.f, "stdout"})
	}
	if moved, err := keepDevicesCgroup(pid); err != nil {
		s.logf("container %s: keep devices cgroup: %v", req.ID, err)
	} else if moved {
		s.logf("container %s: moved init back into its scope's devices cgroup", req.ID)
	}
	c.memCgroup = memoryCgroup(pid)
	c.oom = watchOOM(c.memCgroup)
	for _, o := range outputs {
		c.streams.Add(1)
		go c.copyOutput(o.r, o.name, o.r != c.console)
	}
	go s.waitExit(c, exitCh)
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

// memoryCgroup finds pid's v1 memory cgroup (or the v2 unified one).
func memoryCgroup(pid int) string {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	unified := ""
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, ctl := range strings.Split(parts[1], ",") {
			if ctl == "memory" {
				return filepath.Join("/sys/fs/cgroup/memory", parts[2])
			}
		}
		if parts[0] == "0" && parts[1] == "" {
			unified = filepath.Join("/sys/fs/cgroup", parts[2])
		}
	}
	return unified
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

func (s *Server) waitExit(c *container, exitCh <-chan unix.WaitStatus) {
	ws := <-exitCh
	at := time.Now().UTC()
	e := &Exit{Version: exitVersion, ID: c.id, Pid: c.pid, At: at}
	switch {
	case ws.Exited():
		e.Code = ws.ExitStatus()
	case ws.Signaled():
		e.Signal = int(ws.Signal())
		e.Code = 128 + e.Signal
	}
	// Under cgroupfs the cgroup outlives its processes until the runtime
	// deletes it; under systemd it may be gone already, and the watch has
	// seen the kill.
	if oomKills(c.memCgroup) > 0 {
		e.OOMKilled = true
	}
	drained := make(chan struct{})
	go func() { c.streams.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(drainTimeout):
		s.logf("container %s: output not drained after %s", c.id, drainTimeout)
	}
	if c.oom.killed() {
		e.OOMKilled = true
	}
	c.oom.stop()
	if err := writeExit(s.dir, e); err != nil {
		s.logf("container %s: persist exit: %v", c.id, err)
	}
	c.exit = e
	close(c.exited)
	c.attachMu.Lock()
	for a := range c.attaches {
		a.conn.Close()
	}
	c.attachMu.Unlock()
}

// writeExit persists e atomically: temp file, fsync, rename, fsync dir.
func writeExit(dir string, e *Exit) error {
	data, err := json.Marshal(e)
	if err != nil {
		return err
	}
	path := ExitPath(dir, e.ID)
	tmp, err := os.CreateTemp(filepath.Dir(path), ".exit-")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}

func (s *Server) start(ctx context.Context, c *container) error {
	select {
	case <-c.exited:
		return fmt.Errorf("container %s has exited: %w", c.id, errdefs.ErrFailedPrecondition)
	default:
	}
	if c.started.Load() {
		return fmt.Errorf("container %s already started: %w", c.id, errdefs.ErrFailedPrecondition)
	}
	if err := c.rt.Start(ctx, c.id); err != nil {
		return err
	}
	c.started.Store(true)
	return nil
}

func (s *Server) kill(ctx context.Context, c *container, sig syscall.Signal, all bool) error {
	select {
	case <-c.exited:
		return nil
	default:
	}
	if sig == 0 {
		sig = syscall.SIGTERM
	}
	err := c.rt.Kill(ctx, c.id, sig, all)
	if err != nil {
		// It may have exited meanwhile: that is what was asked.
		select {
		case <-c.exited:
			return nil
		case <-time.After(100 * time.Millisecond):
		}
		if errors.Is(err, errdefs.ErrNotFound) {
			return nil
		}
	}
	return err
}

func (s *Server) delete(ctx context.Context, c *container) error {
	if err := c.rt.Delete(ctx, c.id, true); err != nil {
		return err
	}
	select {
	case <-c.exited:
	case <-time.After(10 * time.Second):
		return fmt.Errorf("container %s did not exit after delete --force", c.id)
	}
	c.closeIO()
	s.mu.Lock()
	delete(s.ctrs, c.id)
	s.mu.Unlock()
	_ = os.Remove(ExitPath(s.dir, c.id))
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
	frame := FrameStdout
	if name == "stderr" {
		frame = FrameStderr
	}
	lines := newLineSplitter(func(tag string, msg []byte) { c.writeLog(name, tag, msg) })
	for {
		chunk, err := lines.readOnce(r)
		if len(chunk) > 0 {
			// Logged first (inside readOnce), then attached clients:
			// whoever saw a line can rely on it being in the log.
			c.fanout(frame, chunk)
		}
		if err != nil {
			lines.Flush()
			return
		}
	}
}

// lineSplitter turns a byte stream into CRI log records: every complete
// line is an F record; a line longer than maxLogLine is cut into P records
// ending with an F record; what is left at the end of the stream is F.
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
// completes and returns the bytes read (valid until the next call).
func (l *lineSplitter) readOnce(r io.Reader) ([]byte, error) {
	m, err := r.Read(l.buf[l.n:])
	chunk := l.buf[l.n : l.n+m]
	if m > 0 {
		// Copy out before the buffer is compacted below.
		out := append([]byte(nil), chunk...)
		l.consume(m)
		return out, err
	}
	return nil, err
}

// Write feeds p through the splitter (used by tests and the fuzz target).
func (l *lineSplitter) Write(p []byte) (int, error) {
	total := len(p)
	for len(p) > 0 {
		m := copy(l.buf[l.n:], p)
		p = p[m:]
		l.consume(m)
	}
	return total, nil
}

// consume accounts for m new bytes at buf[n:] and emits what they complete.
func (l *lineSplitter) consume(m int) {
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
	copy(l.buf, l.buf[start:l.n])
	l.n -= start
	if l.n == len(l.buf) {
		l.emit("P", l.buf[:l.n])
		l.partial = true
		l.n = 0
	}
}

// Flush ends the stream: an unterminated last line becomes F, and a line
// cut into P records at exactly the buffer size is closed with an empty F,
// so readers never wait for the rest of a line that will not come.
func (l *lineSplitter) Flush() {
	if l.n > 0 || l.partial {
		l.emit("F", l.buf[:l.n])
		l.n, l.partial = 0, false
	}
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
// a single writev, so records from stdout and stderr never interleave.
func (c *container) writeLog(stream, tag string, msg []byte) {
	var hdr [64]byte
	h := time.Now().UTC().AppendFormat(hdr[:0], time.RFC3339Nano)
	h = append(h, ' ')
	h = append(h, stream...)
	h = append(h, ' ')
	h = append(h, tag...)
	h = append(h, ' ')
	c.logMu.Lock()
	defer c.logMu.Unlock()
	if c.logFile == nil {
		return
	}
	iov := [][]byte{h, msg, {'\n'}}
	if len(msg) == 0 {
		iov = [][]byte{h, {'\n'}}
	}
	_, _ = unix.Writev(int(c.logFile.Fd()), iov)
}

func (c *container) fanout(kind byte, data []byte) {
	c.attachMu.Lock()
	defer c.attachMu.Unlock()
	for a := range c.attaches {
		if (kind == FrameStdout && !a.stdout) || (kind == FrameStderr && !a.stderr) {
			continue
		}
		a.wmu.Lock()
		// A stuck client must not stall the log.
		_ = a.conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
		err := WriteFrame(a.conn, kind, data)
		a.wmu.Unlock()
		if err != nil {
			a.conn.Close()
			delete(c.attaches, a)
		}
	}
}

// attach serves one attach connection: it answers the request, then relays
// output frames to the client and its stdin/resize frames to the container.
func (s *Server) attach(conn net.Conn, req *Request) {
	c, err := s.get(req.ID)
	if err != nil {
		_ = writeMessage(conn, errResponse(err))
		return
	}
	select {
	case <-c.exited:
		_ = writeMessage(conn, errResponse(fmt.Errorf("container %s is not running: %w", c.id, errdefs.ErrFailedPrecondition)))
		return
	default:
	}
	a := &attachment{conn: conn, stdout: req.Stdout, stderr: req.Stderr}
	a.wmu.Lock()
	err = writeMessage(conn, &Response{State: c.state()})
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
		if req.Stdin && c.stdinOnce {
			c.closeStdin()
		}
	}()
	buf := make([]byte, 0, 4096)
	for {
		kind, payload, err := ReadFrame(conn, buf)
		if err != nil {
			return
		}
		switch kind {
		case FrameStdin:
			if req.Stdin {
				c.writeStdin(payload)
			}
		case FrameCloseStdin:
			// The client's input ended: that ends the container's stdin
			// only for stdin_once containers (as in containerd).
			if req.Stdin && c.stdinOnce {
				c.closeStdin()
			}
		case FrameResize:
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
	_ = unix.IoctlSetWinsize(int(c.console.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Col: width, Row: height})
}

type consoleResult struct {
	f   *os.File
	err error
}

// receiveConsole accepts the runtime's connection on the console socket and
// takes the pty master it sends with SCM_RIGHTS.
func receiveConsole(ln *net.UnixListener) consoleResult {
	conn, err := ln.AcceptUnix()
	if err != nil {
		return consoleResult{err: err}
	}
	defer conn.Close()
	name := make([]byte, 256)
	oob := make([]byte, unix.CmsgSpace(4))
	_, oobn, _, _, err := conn.ReadMsgUnix(name, oob)
	if err != nil {
		return consoleResult{err: err}
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		return consoleResult{err: fmt.Errorf("bad console message: %v", err)}
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != 1 {
		return consoleResult{err: fmt.Errorf("bad console rights: %v", err)}
	}
	return consoleResult{f: os.NewFile(uintptr(fds[0]), "pty-master")}
}
