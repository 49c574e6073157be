package monitor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthcri/berth/internal/shim/exits"
)

// reaper collects every child of the monitor and hands each exit status
// to whoever waits for that pid. Nothing else in the monitor may call
// wait, so the runtime CLI runs through reaper.run (the monitor's
// ocicli.Runner, runtime.go) instead of os/exec.
//
// It learns of exits from pidfds in the runtime's poller, not from SIGCHLD:
// os/signal parks a thread in the kernel for good (two threads more, each
// with its stacks, in the monitor). Children nobody waits for (orphans
// reparented to the monitor when no keeper runs it, such as the leftovers of a host-PID container)
// are reaped whenever a watched child exits and on the monitor's periodic
// housekeeping.
//
// Under a keeper (decision 1701, external set) the container inits are the
// keeper's children, not the monitor's: their exits come from the keeper
// (deliver), and wait4 here collects only the monitor's own children, the
// runtime CLI. If the keeper goes, gone closes and an init's exit is
// known only to have happened (waitInit).
type reaper struct {
	external bool
	gone     chan struct{}

	mu      sync.Mutex
	waiters map[int]chan unix.WaitStatus
	// unclaimed holds exits nobody waited for yet (a pid read from a pid
	// file after its process died).
	unclaimed exits.Unclaimed
}

func newReaper() *reaper {
	return &reaper{waiters: map[int]chan unix.WaitStatus{}, gone: make(chan struct{})}
}

func (r *reaper) reap() {
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if err == unix.EINTR {
			continue
		}
		if pid <= 0 || err != nil {
			return
		}
		r.deliver(pid, ws)
	}
}

// deliver hands pid's exit to its waiter, or keeps it for one to come.
func (r *reaper) deliver(pid int, ws unix.WaitStatus) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c, ok := r.waiters[pid]; ok {
		delete(r.waiters, pid)
		c <- ws
		return
	}
	r.unclaimed.Add(pid, ws, time.Now())
}

// keeperGone tells the waits for inits that no exit status will come.
func (r *reaper) keeperGone() {
	r.mu.Lock()
	defer r.mu.Unlock()
	select {
	case <-r.gone:
	default:
		close(r.gone)
	}
}

// unknownExit is the status of an init whose exit nobody could reap (its
// keeper died first): exited 255, as berthd shows an exit nobody saw.
const unknownExit = unix.WaitStatus(255 << 8)

// waitInit is wait for a container's init. Under a keeper, once the init
// is gone (its pidfd readable) and the keeper with it, the status is lost:
// unknownExit.
func (r *reaper) waitInit(c <-chan unix.WaitStatus, pidfd *os.File) unix.WaitStatus {
	if !r.external {
		return r.wait(c, pidfd)
	}
	if pidfd != nil {
		pollPidfd(pidfd)
		pidfd.Close()
	}
	select {
	case ws := <-c:
		return ws
	case <-r.gone:
		select {
		case ws := <-c:
			return ws
		default:
			return unknownExit
		}
	}
}

// pollPidfd parks until pidfd is readable: its process exited.
func pollPidfd(pidfd *os.File) {
	if rc, err := pidfd.SyscallConn(); err == nil {
		_ = rc.Read(func(fd uintptr) bool {
			fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			n, err := unix.Poll(fds, 0)
			return err != nil && err != unix.EINTR || n > 0
		})
	}
}

// watchLocked registers a waiter for pid, a child of the monitor (or,
// under a keeper, an init the keeper reaps), and returns
// its channel and a pidfd that becomes readable when pid exits (nil when
// the exit is already in the channel). r.mu must be held, so pid cannot be
// reaped before its pidfd exists.
func (r *reaper) watchLocked(pid int) (<-chan unix.WaitStatus, *os.File, error) {
	c := make(chan unix.WaitStatus, 1)
	if ws, ok := r.unclaimed.Take(pid); ok {
		c <- ws
		return c, nil, nil
	}
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err == unix.EINVAL {
		// Before Linux 5.10 there is no PIDFD_NONBLOCK; the flag only
		// matters to os.NewFile, which puts non-blocking fds in the poller.
		if fd, err = unix.PidfdOpen(pid, 0); err == nil {
			if err = unix.SetNonblock(fd, true); err != nil {
				unix.Close(fd)
			}
		}
	}
	switch {
	case err == unix.ESRCH && r.external:
		// An init the keeper reaped already: its exit is on its way.
		r.waiters[pid] = c
		return c, nil, nil
	case err == unix.ENOSYS:
		// Before Linux 5.3: wait polls the exit (see wait).
		r.waiters[pid] = c
		return c, nil, nil
	case err != nil:
		return nil, nil, fmt.Errorf("watch pid %d: %w", pid, os.NewSyscallError("pidfd_open", err))
	}
	r.waiters[pid] = c
	return c, os.NewFile(uintptr(fd), "pidfd"), nil
}

// wait blocks until pid (watched with watchLocked) exits and returns its
// status. It parks in the poller, not in a blocking syscall; without a
// pidfd (kernels before 5.3) it polls every 100 ms.
func (r *reaper) wait(c <-chan unix.WaitStatus, pidfd *os.File) unix.WaitStatus {
	ws, _ := r.waitOrGiveUp(c, pidfd, nil)
	return ws
}

// waitOrGiveUp is wait that gives up (ok false) once giveUp closes; the
// closer also sets pidfd's read deadline, so the poll returns. The exit,
// when it comes, goes to c, which nobody reads any more.
func (r *reaper) waitOrGiveUp(c <-chan unix.WaitStatus, pidfd *os.File, giveUp <-chan struct{}) (ws unix.WaitStatus, ok bool) {
	if pidfd != nil {
		defer pidfd.Close()
		pollPidfd(pidfd)
	}
	for {
		r.reap()
		select {
		case ws := <-c:
			return ws, true
		case <-giveUp:
			return 0, false
		case <-time.After(100 * time.Millisecond):
			// No pidfd, or a readable one whose exit another reap is
			// delivering right now.
		}
	}
}

// watch is watchLocked for a pid the caller learnt after the fact (a
// container's init, read from the runtime's pid file).
func (r *reaper) watch(pid int) (<-chan unix.WaitStatus, *os.File, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.watchLocked(pid)
}

// lookPath finds bin in PATH unless it names a path already. It runs for
// every runtime call, so it stats into a stack Stat_t rather than through
// os.Stat and walks PATH without splitting it: each os.Stat result is a
// 208-byte object, and a lookup through a long PATH made enough of them to
// keep a span of that size class resident in the monitor (decision 1700).
func lookPath(bin string) (string, error) {
	if strings.Contains(bin, "/") {
		return bin, nil
	}
	path := os.Getenv("PATH")
	for path != "" {
		dir := path
		if i := strings.IndexByte(path, ':'); i >= 0 {
			dir, path = path[:i], path[i+1:]
		} else {
			path = ""
		}
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, bin)
		var st unix.Stat_t
		if unix.Stat(p, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFREG && st.Mode&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s: executable not found in $PATH", bin)
}

// errRuntimeHung is the error of a runtime call that outlived its
// context: it was killed with its process group (runCmd says how long it
// had).
var errRuntimeHung = errors.New("did not return in time; killed with every process it started")

// runtimeKillGrace is how long a runtime call killed for its hang has to
// be gone before run answers without its exit (a process stuck in the
// kernel dies only once it leaves it).
const runtimeKillGrace = 5 * time.Second

// run starts argv with the given stdio (nil means /dev/null) and process
// attributes (nil: none), waits for it and returns what it wrote to stderr
// (when stderr is nil). It forks while holding the lock, so the exit
// cannot be reaped before it is watched.
//
// The process leads a process group of its own; once ctx ends (its
// bound, runCmd) the whole group is killed with SIGKILL, so a runtime
// stuck in a call, and whatever it started (a hook, a wrapper's child),
// goes, and the call fails with errRuntimeHung, at most runtimeKillGrace
// later even if the group does not die (decision 3300). A container's
// init leaves the group (the runtime makes it a session of its own).
func (r *reaper) run(ctx context.Context, argv []string, sys *syscall.SysProcAttr, stdin, stdout, stderr *os.File) ([]byte, error) {
	bin, err := lookPath(argv[0])
	if err != nil {
		return nil, err
	}
	null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	defer null.Close()
	// Fd puts a file in blocking mode, as the child expects.
	fd := func(f *os.File) uintptr {
		if f == nil {
			return null.Fd()
		}
		return f.Fd()
	}
	var errR, errW *os.File
	if stderr == nil {
		if errR, errW, err = os.Pipe(); err != nil {
			return nil, err
		}
		defer errR.Close()
		stderr = errW
	}
	own := syscall.SysProcAttr{}
	if sys != nil {
		own = *sys
	}
	own.Setpgid, own.Pgid = true, 0
	attr := &syscall.ProcAttr{Env: os.Environ(), Files: []uintptr{fd(stdin), fd(stdout), fd(stderr)}, Sys: &own}
	r.mu.Lock()
	var done <-chan unix.WaitStatus
	var pidfd *os.File
	pid, err := syscall.ForkExec(bin, argv, attr)
	if err == nil {
		done, pidfd, err = r.watchLocked(pid)
	}
	r.mu.Unlock()
	if errW != nil {
		errW.Close()
	}
	if err != nil {
		return nil, err
	}
	giveUp := make(chan struct{})
	hung := context.AfterFunc(ctx, func() {
		_ = unix.Kill(-pid, unix.SIGKILL)
		grace := time.Now().Add(runtimeKillGrace)
		if errR != nil {
			_ = errR.SetReadDeadline(grace)
		}
		if pidfd != nil {
			_ = pidfd.SetReadDeadline(grace)
		}
		time.AfterFunc(runtimeKillGrace, func() { close(giveUp) })
	})
	defer hung()
	var errOut []byte
	if errR != nil {
		errOut, _ = io.ReadAll(io.LimitReader(errR, 64<<10))
	}
	ws, exited := r.waitOrGiveUp(done, pidfd, giveUp)
	switch {
	case exited && ws.Exited() && ws.ExitStatus() == 0:
		return errOut, nil
	case !exited || ctx.Err() != nil:
		// Killed (or given up on): what it said is not why it failed.
		return nil, errRuntimeHung
	case ws.Signaled():
		return errOut, fmt.Errorf("killed by signal %d", ws.Signal())
	}
	return errOut, errors.New("exit status " + fmt.Sprint(ws.ExitStatus()))
}
