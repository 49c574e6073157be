package shim

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// reaper collects every child of the shim (a subreaper: container inits
// reparent to it) and hands each exit status to whoever waits for that pid.
// Nothing else in the shim may call wait, so the runtime CLI runs through
// reaper.Run instead of os/exec.
type reaper struct {
	mu      sync.Mutex
	waiters map[int]chan unix.WaitStatus
	// unclaimed holds exits nobody waited for yet (a pid read from a pid
	// file after its process died), pruned after a minute.
	unclaimed map[int]unclaimedExit
}

type unclaimedExit struct {
	status unix.WaitStatus
	at     time.Time
}

func newReaper() *reaper {
	r := &reaper{waiters: map[int]chan unix.WaitStatus{}, unclaimed: map[int]unclaimedExit{}}
	ch := make(chan os.Signal, 8)
	signal.Notify(ch, syscall.SIGCHLD)
	go func() {
		for range ch {
			r.reap()
		}
	}()
	return r
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
		r.mu.Lock()
		if c, ok := r.waiters[pid]; ok {
			delete(r.waiters, pid)
			c <- ws
		} else {
			now := time.Now()
			for p, u := range r.unclaimed {
				if now.Sub(u.at) > time.Minute {
					delete(r.unclaimed, p)
				}
			}
			r.unclaimed[pid] = unclaimedExit{status: ws, at: now}
		}
		r.mu.Unlock()
	}
}

// wait returns a channel that receives pid's exit status.
func (r *reaper) wait(pid int) <-chan unix.WaitStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.waitLocked(pid)
}

func (r *reaper) waitLocked(pid int) <-chan unix.WaitStatus {
	c := make(chan unix.WaitStatus, 1)
	if u, ok := r.unclaimed[pid]; ok {
		delete(r.unclaimed, pid)
		c <- u.status
		return c
	}
	r.waiters[pid] = c
	return c
}

// Run implements oci.Runner: it starts argv while holding the lock, so the
// exit cannot be reaped before the waiter is registered.
func (r *reaper) Run(ctx context.Context, argv []string, stdin, stdout, stderr *os.File) ([]byte, error) {
	bin, err := exec.LookPath(argv[0])
	if err != nil {
		return nil, err
	}
	null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	defer null.Close()
	or := func(f *os.File) *os.File {
		if f == nil {
			return null
		}
		return f
	}
	var errR, errW *os.File
	if stderr == nil {
		if errR, errW, err = os.Pipe(); err != nil {
			return nil, err
		}
		defer errR.Close()
		stderr = errW
	}
	r.mu.Lock()
	p, err := os.StartProcess(bin, argv, &os.ProcAttr{Files: []*os.File{or(stdin), or(stdout), or(stderr)}})
	var done <-chan unix.WaitStatus
	if err == nil {
		done = r.waitLocked(p.Pid)
	}
	r.mu.Unlock()
	if errW != nil {
		errW.Close()
	}
	if err != nil {
		return nil, err
	}
	var errOut []byte
	if errR != nil {
		errOut, _ = io.ReadAll(io.LimitReader(errR, 64<<10))
	}
	var ws unix.WaitStatus
	select {
	case ws = <-done:
	case <-ctx.Done():
		_ = p.Kill()
		ws = <-done
	}
	if ws.Exited() && ws.ExitStatus() == 0 {
		return errOut, nil
	}
	if ws.Signaled() {
		return errOut, fmt.Errorf("killed by signal %d", ws.Signal())
	}
	return errOut, fmt.Errorf("exit status %d", ws.ExitStatus())
}
