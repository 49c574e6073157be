package shim

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/shim/proto"
	"github.com/berthcri/berth/internal/shim/shimfault"
	"github.com/berthcri/berth/internal/tracing"
)

// Client talks to one pod the node's monitor serves, on the pod's socket.
// It dials per call, so it survives restarts of berthd (the keeper and
// the monitor outlive it). A pod's client also rides out the monitor's
// restarts (decision 1701): a call that finds no monitor, or
// loses it mid-request, while the node's keeper lives waits for the
// keeper's next monitor to serve the pod again (at most
// MonitorRestartTimeout without one) and asks again; only a request that
// is not safe to repeat (create) fails instead, with ErrMonitorCut.
type Client struct {
	dir    string
	socket string // the socket dialled: the pod's, or the node's
	// ridesRestarts: a pod's client waits for a restarted monitor; the
	// node's (add-pod, shutdown) has launch logic of its own.
	ridesRestarts bool
}

// NewClient returns a client for the pod whose shim state dir is dir
// (<shims>/<pod-id>).
func NewClient(dir string) *Client {
	return &Client{dir: dir, socket: proto.SocketPath(dir), ridesRestarts: true}
}

// nodeClient talks to the node's monitor itself (node dir nodeDir).
func nodeClient(nodeDir string) *Client {
	return &Client{dir: nodeDir, socket: proto.NodeSocketPath(nodeDir)}
}

// Dir is the pod's state directory (<shims>/<pod-id>: its socket and
// exits).
func (c *Client) Dir() string { return c.dir }

// ErrNoShim means no monitor serves the pod, and none will: no keeper
// restarts its monitor, the pod is not served any more, or the monitor
// did not come back within MonitorRestartTimeout.
var ErrNoShim = fmt.Errorf("no shim running: %w", errdefs.ErrUnavailable)

// ErrMonitorCut means the node's monitor went away while it handled a
// request that is not safe to repeat (create): what became of it is
// unknown, and the caller undoes it as any failed request.
var ErrMonitorCut = fmt.Errorf("the node's shim monitor went away mid-request: %w", errdefs.ErrUnavailable)

// MonitorRestartTimeout bounds how long a pod's call waits for the node's
// monitor to serve the pod again while its keeper lives. The keeper
// restarts a crashed monitor after 50 ms, doubling to 5 s: 60 s covers a
// crash loop's first seven restarts and ten more at the cap, and is half
// the kubelet's default runtime-request-timeout (2 min), so a CRI call
// that waited still answers in time. A variable for tests.
var MonitorRestartTimeout = 60 * time.Second

// monitorPoll is how often a waiting call looks for the monitor again.
const monitorPoll = 20 * time.Millisecond

func (c *Client) dial(ctx context.Context) (*net.UnixConn, error) {
	conn, err := dialUnix(c.socket)
	if err != nil {
		if isGone(err) {
			return nil, ErrNoShim
		}
		return nil, fmt.Errorf("dial shim %s: %w", c.dir, err)
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	return conn, nil
}

// dialServed dials the pod's socket, waiting for a restarted monitor
// when none answers (waitServed).
func (c *Client) dialServed(ctx context.Context) (*net.UnixConn, error) {
	var since time.Time
	for {
		conn, err := c.dial(ctx)
		if !c.ridesRestarts || !errors.Is(err, ErrNoShim) {
			return conn, err
		}
		if since.IsZero() {
			since = time.Now()
		}
		if err := c.waitServed(ctx, since); err != nil {
			return nil, err
		}
	}
}

// idempotent tells the ops a pod's client asks again after the monitor
// died handling them: each leaves the same state done twice (a second
// delete finds the container gone, a second signal finds it signalled
// or gone), and a wait or a state only looks. Create is not among them;
// start is made safe by asking the state first (Start).
func idempotent(op string) bool {
	switch op {
	case proto.OpState, proto.OpWait, proto.OpKill, proto.OpDelete, proto.OpReopenLog, proto.OpPing, proto.OpShutdown:
		return true
	}
	return false
}

// call sends req and returns the answer. A pod's client whose monitor
// goes away (refused, or the connection cut before the answer) while the
// keeper lives waits for the next monitor and asks again: at once when
// the request was never delivered or is idempotent, otherwise not at all
// (ErrMonitorCut).
func (c *Client) call(ctx context.Context, req *proto.Request) (_ *proto.Response, retErr error) {
	ctx, span := tracing.Start(ctx, "shim."+req.Op, tracing.AttrContainerID.String(req.ID))
	if req.Create != nil && req.Create.Restore != "" {
		// A create from a checkpoint: runc restore runs CRIU.
		span.SetName("shim.create.restore")
	}
	defer func() { tracing.End(span, retErr) }()
	var since time.Time
	for {
		resp, err := c.callOnce(ctx, req)
		if !c.ridesRestarts || !monitorGone(err) || ctx.Err() != nil {
			return resp, err
		}
		if since.IsZero() {
			since = time.Now()
		}
		if !errors.Is(err, ErrNoShim) && !idempotent(req.Op) {
			// Delivered, then cut: wait for the monitor anyway, so the
			// caller's undo comes after this monitor's end was reaped
			// (the runtime's create died with it) and finds the next
			// (or learns that none comes back). Cut it stays, however
			// the wait ended: the caller must undo.
			if werr := c.waitServed(ctx, since); werr != nil && !errors.Is(werr, ErrNoShim) {
				return nil, fmt.Errorf("shim %s %s: %w (%v; then %v)", req.Op, req.ID, ErrMonitorCut, err, werr)
			}
			return nil, fmt.Errorf("shim %s %s: %w (%v)", req.Op, req.ID, ErrMonitorCut, err)
		}
		if werr := c.waitServed(ctx, since); werr != nil {
			return nil, werr
		}
		// The monitor is back: a new outage is timed afresh.
		since = time.Time{}
	}
}

// monitorGone tells the errors a monitor's death leaves on a call: no
// one listens, or the connection ended before the answer.
func monitorGone(err error) bool {
	return errors.Is(err, ErrNoShim) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, syscall.EAGAIN) // the pod's backlog full while the monitor adopts
}

// waitServed waits, polling, until the pod's socket answers again (nil:
// ask again). It returns ErrNoShim (wrapped, saying why) as soon as no
// monitor will serve the pod: its directory is gone (the pod ended), the
// node's monitor answers that it does not serve the pod (podServed), no
// keeper lives to restart one, or MonitorRestartTimeout passed without a
// live monitor. A monitor that is there but slow (its node socket's
// backlog full, or no answer yet) is waited for, not given up on: no
// timing decides that a pod is not served.
func (c *Client) waitServed(ctx context.Context, since time.Time) error {
	nodeDir := proto.NodeDir(filepath.Dir(c.dir))
	pod := filepath.Base(c.dir)
	for {
		if _, err := os.Stat(c.dir); errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("pod %s: %w", pod, ErrNoShim)
		}
		switch served, err := c.podServed(ctx, nodeDir); {
		case err == nil && served:
			// The pod's socket listens (the monitor listened on it
			// before it answered): ask it. Until it answers, poll: a
			// full backlog or a monitor that died since is waited for.
			since = time.Now()
			if conn, err := dialUnix(c.socket); err == nil {
				conn.Close()
				return nil
			}
		case err == nil:
			return fmt.Errorf("pod %s: the node's monitor, having adopted every container its keeper holds, does not serve it: %w", pod, ErrNoShim)
		case errors.Is(err, errMonitorBusy):
			since = time.Now() // a monitor lives: it is not gone
		case errors.Is(err, ErrNoShim) && !keeperMayLive(nodeDir):
			return fmt.Errorf("pod %s: the node's monitor and keeper are gone: %w", pod, ErrNoShim)
		}
		if time.Since(since) > MonitorRestartTimeout {
			return fmt.Errorf("pod %s: the keeper's monitor did not come back in %v: %w", pod, MonitorRestartTimeout, ErrNoShim)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for the node's monitor to come back: %w", ctx.Err())
		case <-time.After(monitorPoll):
		}
	}
}

// errMonitorBusy: the node's monitor lives (its socket listens) but did
// not answer yet.
var errMonitorBusy = errors.New("the node's monitor is busy")

// nodePingTimeout bounds one ask of the node's monitor while waiting; a
// monitor that takes longer is busy, and asked again.
const nodePingTimeout = 5 * time.Second

// podServed asks the node's monitor (ping on node.sock: the dirs of the
// pods it serves) whether it serves the pod. The answer is definite: a
// monitor listens on node.sock only after Adopt, once every container its
// keeper holds is adopted and each such container's pod listens on its
// socket (cmd/berth-shim runMonitor: Adopt, then Listen), so a pod it
// does not name is one it did not adopt and will not serve. Errors:
// ErrNoShim when no monitor listens on the node's socket, errMonitorBusy
// when one listens but gave no answer (its backlog full, slow), any other
// when the answer was cut (it died meanwhile) or is an error.
func (c *Client) podServed(ctx context.Context, nodeDir string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, nodePingTimeout)
	defer cancel()
	resp, err := nodeClient(nodeDir).callOnce(ctx, &proto.Request{Op: proto.OpPing})
	switch {
	case err == nil:
		// By name: the monitor serves only pods beside its node dir,
		// the one whose socket answered, and berthd may spell that
		// dir differently from when it added the pod.
		pod := filepath.Base(c.dir)
		return slices.ContainsFunc(resp.IDs, func(dir string) bool { return filepath.Base(dir) == pod }), nil
	case errors.Is(err, ErrNoShim):
		return false, err
	case errors.Is(err, syscall.EAGAIN) || errors.Is(err, context.DeadlineExceeded) && ctx.Err() != nil:
		return false, fmt.Errorf("%w: %v", errMonitorBusy, err)
	}
	return false, err
}

// keeperMayLive tells, without waiting, whether a keeper may restart the
// node's monitor: one holds the keeper lock, or a launch holds the launch
// lock (a keeper starting, or a launch waiting for a restarting monitor).
// The keeper probe runs under the launch lock, as keeperLives wants.
func keeperMayLive(nodeDir string) bool {
	f, err := os.OpenFile(proto.LaunchLockPath(nodeDir), os.O_RDWR|syscall.O_CLOEXEC, 0)
	if err != nil {
		return false // no node dir: its monitor and keeper ended
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return true // held: a launch or a starting monitor
	}
	return keeperLives(nodeDir)
}

func (c *Client) callOnce(ctx context.Context, req *proto.Request) (*proto.Response, error) {
	conn, err := c.dial(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	// Unblock a call waiting on the monitor when ctx is cancelled.
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if err := proto.WriteRequest(conn, req); err != nil {
		return nil, fmt.Errorf("shim %s %s: %w", req.Op, req.ID, ctxEnded(ctx, err))
	}
	resp, err := proto.ReadResponse(conn)
	if err != nil {
		return nil, fmt.Errorf("shim %s %s: %w", req.Op, req.ID, ctxEnded(ctx, err))
	}
	return resp, resp.Err()
}

// ctxEnded is the error of an I/O on a conn whose deadline is ctx's:
// ctx's own error once ctx ended, and DeadlineExceeded for a timeout
// (the conn's deadline may fire a hair before ctx does, on the write as
// on the read: a stop's last call then failed Unknown, "i/o timeout").
func ctxEnded(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	var ne net.Error
	if _, ok := ctx.Deadline(); ok && errors.As(err, &ne) && ne.Timeout() {
		return context.DeadlineExceeded
	}
	return err
}

// Create asks the monitor to create container id from a bundle in the pod.
func (c *Client) Create(ctx context.Context, id string, cr *CreateRequest) error {
	_, err := c.call(ctx, &proto.Request{Op: proto.OpCreate, ID: id, Create: cr})
	return err
}

// Start starts a created container. A start the monitor's crash cut
// asks the next monitor for the container's state: started (or already
// exited), that is the answer; still created, it starts it again.
func (c *Client) Start(ctx context.Context, id string) (*State, error) {
	for {
		r, err := c.call(ctx, &proto.Request{Op: proto.OpStart, ID: id})
		if err == nil {
			return r.State, nil
		}
		if !errors.Is(err, ErrMonitorCut) {
			return nil, err
		}
		st, serr := c.State(ctx, id)
		if serr != nil {
			return nil, fmt.Errorf("%w; then state: %w", err, serr)
		}
		if st.Status != StatusCreated {
			return st, nil
		}
	}
}

// Kill signals the container's init (every process with all).
func (c *Client) Kill(ctx context.Context, id string, sig syscall.Signal, all bool) error {
	_, err := c.call(ctx, &proto.Request{Op: proto.OpKill, ID: id, Signal: int(sig), All: all})
	return err
}

// State reports the container.
func (c *Client) State(ctx context.Context, id string) (*State, error) {
	r, err := c.call(ctx, &proto.Request{Op: proto.OpState, ID: id})
	if err != nil {
		return nil, err
	}
	return r.State, nil
}

// Wait blocks until the container exits or ctx ends.
func (c *Client) Wait(ctx context.Context, id string) (*State, error) {
	r, err := c.call(ctx, &proto.Request{Op: proto.OpWait, ID: id})
	if err != nil {
		return nil, err
	}
	return r.State, nil
}

// Delete removes the container from the runtime (killing it) and the pod.
func (c *Client) Delete(ctx context.Context, id string) (*State, error) {
	r, err := c.call(ctx, &proto.Request{Op: proto.OpDelete, ID: id})
	if err != nil {
		return nil, err
	}
	return r.State, nil
}

// ReopenLog closes and reopens the container's log file.
func (c *Client) ReopenLog(ctx context.Context, id string) error {
	_, err := c.call(ctx, &proto.Request{Op: proto.OpReopenLog, ID: id})
	return err
}

// List returns the IDs of the containers the pod holds.
func (c *Client) List(ctx context.Context) ([]string, error) {
	r, err := c.call(ctx, &proto.Request{Op: proto.OpPing})
	if err != nil {
		return nil, err
	}
	return r.IDs, nil
}

// Shutdown ends a pod that holds no container (the monitor stops serving
// it, removing its socket and dir); one that holds containers refuses
// (FailedPrecondition).
func (c *Client) Shutdown(ctx context.Context) error {
	_, err := c.call(ctx, &proto.Request{Op: proto.OpShutdown})
	return err
}

// Attach opens an attach stream; the caller reads stdout/stderr frames
// from it and writes stdin, close-stdin and resize frames.
func (c *Client) Attach(ctx context.Context, id string, stdin, stdout, stderr bool) (*Stream, error) {
	conn, err := c.dialServed(ctx)
	if err != nil {
		return nil, err
	}
	if err := proto.WriteRequest(conn, &proto.Request{Op: proto.OpAttach, ID: id, Stdin: stdin, Stdout: stdout, Stderr: stderr}); err != nil {
		conn.Close()
		return nil, fmt.Errorf("attach %s: %w", id, err)
	}
	resp, err := proto.ReadResponse(conn)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("attach %s: %w", id, err)
	}
	if err := resp.Err(); err != nil {
		conn.Close()
		return nil, err
	}
	_ = conn.SetDeadline(time.Time{})
	return &Stream{conn: conn}, nil
}

// Stream is an attach connection.
type Stream struct {
	conn *net.UnixConn
	buf  []byte
}

// Recv returns the next output frame (FrameStdout or FrameStderr).
func (s *Stream) Recv() (byte, []byte, error) {
	kind, p, err := proto.ReadFrame(s.conn, s.buf)
	if err == nil && cap(p) > cap(s.buf) {
		s.buf = p[:0]
	}
	return kind, p, err
}

// Stdin sends input to the container.
func (s *Stream) Stdin(p []byte) error { return proto.WriteFrame(s.conn, proto.FrameStdin, p) }

// CloseStdin closes the container's stdin.
func (s *Stream) CloseStdin() error { return proto.WriteFrame(s.conn, proto.FrameCloseStdin, nil) }

// Resize sets the terminal size.
func (s *Stream) Resize(width, height uint16) error {
	var p [4]byte
	binary.BigEndian.PutUint16(p[:], width)
	binary.BigEndian.PutUint16(p[2:], height)
	return proto.WriteFrame(s.conn, proto.FrameResize, p[:])
}

// Close ends the attach.
func (s *Stream) Close() error { return s.conn.Close() }

// readyTimeout bounds how long a new keeper and monitor may take to listen.
const readyTimeout = 10 * time.Second

// Launch makes the node's monitor serve the pod whose state dir is dir
// (<shims>/<pod-id>), starting the node's keeper and monitor first when
// none runs (decision 1701), and returns the pod's client once the pod's
// socket listens.
func Launch(ctx context.Context, binary, dir, podID string) (*Client, error) {
	nodeDir := proto.NodeDir(filepath.Dir(dir))
	add := func(ctx context.Context) error { return addPod(ctx, nodeDir, dir) }
	if err := onNode(ctx, binary, nodeDir, "add pod "+podID, add); err != nil {
		return nil, err
	}
	return NewClient(dir), nil
}

// onNode runs op, a request to the node's monitor (add-pod, lazy-hold),
// starting the node's keeper and monitor first when none runs, so also
// for a node with no pod (a lazy layer's hold). what names op in errors.
// op may run more than once: it must be safe to repeat.
func onNode(ctx context.Context, binary, nodeDir, what string, op func(context.Context) error) error {
	err := op(ctx)
	if err == nil || !errors.Is(err, errdefs.ErrUnavailable) { // ErrNoShim among them
		return err
	}
	// One launch at a time on the node, across berthd's goroutines and
	// processes: the lock is a file's, taken by whoever found no monitor.
	lock, err := lockNode(nodeDir, true)
	if err != nil {
		return err
	}
	defer lock.Close()
	if done, err := unlessNoKeeper(ctx, nodeDir, op); done || err != nil {
		if err != nil {
			return fmt.Errorf("%s on the node's monitor: %w", what, err)
		}
		return nil
	}
	if err := launchNode(binary, nodeDir, lock); err != nil {
		return fmt.Errorf("start the shim to %s: %w", what, err)
	}
	if err := op(ctx); err != nil {
		return fmt.Errorf("%s on the new monitor: %w", what, err)
	}
	return nil
}

// StopIdleNode makes the node's monitor (and with it its keeper) exit if
// it serves no pod; shims is the pods' dir, as Launch's dir's parent. It
// takes the launch lock first: a keeper launched by a berthd that died
// before its monitor listened holds it until the monitor does, and is
// stopped then rather than missed. A launch cut short before its keeper
// started leaves the node dir with its lock and no socket, a keeper and
// monitor that both died leave it with a dead socket: with no keeper
// holding it, that dir goes.
func StopIdleNode(ctx context.Context, shims string) error {
	nodeDir := proto.NodeDir(shims)
	lock, err := lockNode(nodeDir, false)
	if err != nil {
		return err
	}
	if lock == nil {
		// No lock, no monitor: at most a dir left empty by a launch cut
		// short before it made its lock (rmdir leaves any other alone).
		_ = os.Remove(nodeDir)
		return nil
	}
	defer lock.Close()
	_, err = nodeClient(nodeDir).call(ctx, &proto.Request{Op: proto.OpShutdown})
	if errors.Is(err, ErrNoShim) {
		// With the lock held no monitor is starting; with no keeper none
		// will: either none ever listened here (a launch cut short), or
		// keeper and monitor both died and left their dir. (A crashed
		// monitor whose keeper lives is restarted: both are left alone.)
		if !keeperLives(nodeDir) {
			if rerr := os.RemoveAll(nodeDir); rerr != nil {
				return fmt.Errorf("remove the node dir of a dead or cut short launch: %w", rerr)
			}
		}
		return nil
	}
	if err == nil || errors.Is(err, errdefs.ErrFailedPrecondition) {
		return nil
	}
	return err
}

// keeperLives tells whether a keeper holds the node dir's keeper lock.
// Call it with the launch lock held: keepers start only under it, so the
// probe's brief hold of the lock cannot make a starting keeper fail.
func keeperLives(nodeDir string) bool {
	f, err := os.OpenFile(proto.KeeperLockPath(nodeDir), os.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return false // none ever started here (or the dir went with its node)
	}
	defer f.Close()
	return syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB) == syscall.EWOULDBLOCK
}

// unlessNoKeeper runs op on the node's monitor, with the launch lock
// held: on one that listens (another launch won), or on the one a living
// keeper restarts (it crashed or handed over), waited for at most
// readyTimeout, since a second keeper here would fight it for the node's
// socket. done false and no error: no monitor and no keeper, a launch is
// due.
func unlessNoKeeper(ctx context.Context, nodeDir string, op func(context.Context) error) (done bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	for {
		err := op(ctx)
		switch {
		case err == nil:
			return true, nil
		case !errors.Is(err, errdefs.ErrUnavailable): // ErrNoShim among them
			return false, err
		case !keeperLives(nodeDir):
			return false, nil
		}
		select {
		case <-ctx.Done():
			return false, fmt.Errorf("the keeper's monitor did not listen again: %w", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// addPod asks the node's monitor to serve the pod of dir.
func addPod(ctx context.Context, nodeDir, dir string) error {
	_, err := nodeClient(nodeDir).call(ctx, &proto.Request{Op: proto.OpAddPod, Dir: dir})
	return err
}

// lockNode takes the node's launch lock (flock, so also against another
// berthd on the same state dir); closing the file lets it go. With create
// false it makes no node dir: (nil, nil) when there is none.
func lockNode(nodeDir string, create bool) (*os.File, error) {
	path := proto.LaunchLockPath(nodeDir)
	flags := os.O_RDWR | syscall.O_CLOEXEC
	if create {
		flags |= os.O_CREATE
	}
	for {
		f, err := os.OpenFile(path, flags, 0o600)
		if errors.Is(err, os.ErrNotExist) {
			if !create {
				return nil, nil
			}
			// No node dir yet, or it went in between (its monitor
			// exited, or recovery removed a launch cut short).
			if err := os.MkdirAll(nodeDir, 0o700); err != nil {
				return nil, fmt.Errorf("create shim node dir: %w", err)
			}
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("open shim launch lock: %w", err)
		}
		for {
			err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
			if err != syscall.EINTR {
				break
			}
		}
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("take shim launch lock: %w", err)
		}
		// A monitor that exits removes its directory, lock included: a
		// lock taken on a removed file locks nothing, take the new one.
		var held, now syscall.Stat_t
		if syscall.Fstat(int(f.Fd()), &held) == nil && syscall.Stat(path, &now) == nil && held.Ino == now.Ino && held.Dev == now.Dev {
			return f, nil
		}
		f.Close()
	}
}

// launchNode starts the node's keeper, which starts its monitor, and waits
// until the monitor listens. The keeper runs in its own session and
// process group so it outlives berthd; berthd reaps it only while it is
// its parent. lock, the launch lock held, goes to the keeper and on to the
// monitor, which lets go of it once it listens (keeper.ReadyFd).
func launchNode(binary, nodeDir string, lock *os.File) error {
	cmd, r, err := startKeeper(binary, nodeDir, lock)
	if err != nil {
		return err
	}
	defer r.Close()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	_ = r.SetReadDeadline(time.Now().Add(readyTimeout))
	var b [1]byte
	if _, err := r.Read(b[:]); err != nil {
		_ = cmd.Process.Kill()
		select {
		case werr := <-exited:
			return fmt.Errorf("shim keeper did not start (%v): %w", werr, err)
		case <-time.After(time.Second):
			return fmt.Errorf("shim keeper did not start: %w", err)
		}
	}
	return nil
}

// startKeeper starts the node's keeper and returns it with the read end of
// its monitor's readiness pipe.
func startKeeper(binary, nodeDir string, lock *os.File) (*exec.Cmd, *os.File, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, nil, fmt.Errorf("start shim: %w", err)
	}
	cmd := exec.Command(binary, "keeper", "--dir", nodeDir)
	cmd.ExtraFiles = []*os.File{w, lock} // keeper.ReadyFd, keeper.KeeperLaunchLockFd
	cmd.Env = []string{"GOMAXPROCS=1", "GOTRACEBACK=single", "PATH=" + os.Getenv("PATH")}
	// A debugging aid: the monitor logs its memory stats after each trim.
	if v := os.Getenv("BERTH_SHIM_MEMSTATS"); v != "" {
		cmd.Env = append(cmd.Env, "BERTH_SHIM_MEMSTATS="+v)
	}
	// Recovery tests' crash points (package shimfault); unset in production.
	if v := os.Getenv(shimfault.EnvVar); v != "" {
		cmd.Env = append(cmd.Env, shimfault.EnvVar+"="+v)
	}
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = cmd.Start()
	w.Close()
	if err != nil {
		r.Close()
		return nil, nil, fmt.Errorf("start shim %s: %w", binary, err)
	}
	return cmd, r, nil
}
