// Package keeper is berth-shim's keeper mode (decision 1701): the node's
// child subreaper and the custodian of what its containers must not lose
// when the monitor (package shim/monitor, the keeper's child) dies. It is
// the parent of every container init (each reparents to it when the
// runtime's create exits), reaps them and hands each exit to the monitor;
// it holds a duplicate of every container's stdio (the output pipes' read
// ends, the stdin write end, the pty master), so output waits in the pipes
// rather than kills its writer while no monitor runs; and it restarts a
// monitor that died, handing the new one every container it holds.
//
// It reads no container output, runs no runtime and parses only the
// monitor's small messages (proto.KeeperMsg): the code all pods share is
// kept to this file.
package keeper

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthcri/berth/internal/shim/exits"
	"github.com/berthcri/berth/internal/shim/proto"
	"github.com/berthcri/berth/internal/shim/shimfault"
	"github.com/berthcri/berth/internal/shim/textpages"
)

// The fds the processes start with. ReadyFd carries the first monitor's
// readiness byte to berthd. LinkFd is the monitor's link to its keeper.
// The launch lock (berthd's flock on <node>/launch.lock) is the keeper's
// KeeperLaunchLockFd and the first monitor's MonitorLaunchLockFd: held
// from berthd's launch until the monitor listens, so a berthd restarted
// meanwhile waits for the monitor rather than finding none (a restarted
// monitor gets /dev/null there, as for ReadyFd).
const (
	ReadyFd             = 3
	LinkFd              = 4
	KeeperLaunchLockFd  = 4
	MonitorLaunchLockFd = 5
)

// Keeper is the keeper process's state.
type Keeper struct {
	dir    string // the node dir, handed to the monitor
	binary string // berth-shim, as the monitor is (re)started from it
	logf   func(format string, args ...any)

	// mu guards everything below.
	mu        sync.Mutex
	ctrs      map[string]*entry // by container ID
	byPid     map[int]*entry    // running inits, by pid
	unclaimed exits.Unclaimed   // orphans' exits, and inits' not registered yet
	link      int               // the current monitor's link, -1 when none
	monitor   int               // the current monitor's pid, 0 when none
	// linkDone closes once the current monitor's link is read to its
	// end (serveLink returned): every message it sent is applied.
	linkDone chan struct{}

	// wmu guards the watchdog's view of the current monitor (watch.go);
	// never held across a blocking call, so a monitor that stops reading
	// its link (its buffer full, the keeper blocked in a send under mu)
	// is still found hung and killed.
	wmu   sync.Mutex
	watch watchState

	// lazy is the lazy layers' connections and their server (lazy.go);
	// guarded by mu.
	lazy lazyState
}

// entry is one container the keeper holds.
type entry struct {
	msg   proto.KeeperMsg // as registered; Running, Exited, Status kept current
	fds   []int           // its stdio, named by msg.Streams (-1 once closed)
	names []string
}

// New returns the keeper of the node dir dir, starting its monitors from
// binary.
func New(dir, binary string, logf func(string, ...any)) *Keeper {
	return &Keeper{dir: dir, binary: binary, logf: logf, ctrs: map[string]*entry{}, byPid: map[int]*entry{}, link: -1,
		watch: watchState{pidfd: -1, link: -1}, lazy: lazyState{link: -1}}
}

// HoldKeeperLock takes the node dir's keeper lock (proto.KeeperLockPath),
// close-on-exec, for the caller to keep open for its life. It fails when
// another keeper holds it: one keeper per node dir.
func HoldKeeperLock(dir string) (*os.File, error) {
	f, err := os.OpenFile(proto.KeeperLockPath(dir), os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open keeper lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("take keeper lock of %s (another keeper runs there?): %w", dir, err)
	}
	return f, nil
}

// restartBackoff bounds how fast a crashing monitor is restarted.
const (
	minRestartDelay = 50 * time.Millisecond
	maxRestartDelay = 5 * time.Second
)

// Run starts the monitor (handing it ready, berthd's readiness pipe, and
// launchLock, berthd's launch lock, which the monitor lets go once it
// listens) and reaps until the monitor exits cleanly with no container
// held; it returns the process's exit code.
func (k *Keeper) Run(ready, launchLock *os.File) int {
	textpages.Find()
	err := k.startMonitor(ready, launchLock)
	ready.Close()
	launchLock.Close() // if startMonitor failed before it could
	if err != nil {
		k.logf("start monitor: %v", err)
		return 1
	}
	delay := minRestartDelay
	startedAt := time.Now()
	stopWatch := k.startWatchdog()
	defer stopWatch()
	for {
		// Asleep until a child dies: map only what it runs from here on
		// (decision 3100).
		textpages.Release()
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, 0, nil)
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			// ECHILD cannot last: a monitor is always our child but
			// while one is restarted, which happens on this goroutine.
			k.logf("wait: %v", err)
			time.Sleep(time.Second)
			continue
		}
		k.mu.Lock()
		if pid == k.lazy.pid {
			k.lazyReapedLocked(ws)
			k.mu.Unlock()
			continue
		}
		if pid != k.monitor {
			k.reapedLocked(pid, ws)
			k.mu.Unlock()
			continue
		}
		k.monitor = 0
		drained := k.linkDone
		k.mu.Unlock()
		k.monitorReaped()
		// What the monitor said before it died is applied first: its
		// last message is often the forget of the node's last container,
		// sent just before a clean exit, and read on another goroutine
		// that wait4 may well beat; counted before it, the container
		// still looks held and the clean exit like a crash (decision 3300).
		k.awaitDrained(drained)
		k.mu.Lock()
		// A lazy layer's connection is held like a container.
		held := len(k.ctrs) + len(k.lazy.holds)
		k.mu.Unlock()
		if ws.Exited() && ws.ExitStatus() == 0 && held == 0 {
			k.logf("monitor exited; nothing held, exiting")
			return 0
		}
		k.logf("monitor %d ended (%s) holding %d containers; restarting it", pid, describe(ws), held)
		if time.Since(startedAt) > 10*time.Second {
			delay = minRestartDelay
		}
		handedOver := ws.Exited() && ws.ExitStatus() == proto.MonitorHandedOver
		for {
			if !handedOver {
				time.Sleep(delay)
			}
			handedOver = false
			delay = min(2*delay, maxRestartDelay)
			if err := k.startMonitor(nil, nil); err != nil {
				k.logf("restart monitor: %v", err)
				continue
			}
			break
		}
		startedAt = time.Now()
	}
}

// linkDrainTimeout bounds the wait for a dead monitor's link to end. The
// monitor's end closes with it (close-on-exec: none of its children
// holds it), so the end is only the keeper reading what is left; the
// bound is for a process that somehow kept a copy.
const linkDrainTimeout = 5 * time.Second

// awaitDrained waits until the link whose serveLink closes done has been
// read to its end, at most linkDrainTimeout.
func (k *Keeper) awaitDrained(done chan struct{}) {
	if done == nil {
		return
	}
	t := time.NewTimer(linkDrainTimeout)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		k.logf("the dead monitor's link did not end in %v; deciding on what it said so far", linkDrainTimeout)
	}
}

func describe(ws unix.WaitStatus) string {
	if ws.Signaled() {
		return "signal " + ws.Signal().String()
	}
	return "exit status " + strconv.Itoa(ws.ExitStatus())
}

// startMonitor starts a monitor with a fresh link, hands it every
// container held and serves its messages. It runs on Run's goroutine, the
// only one that waits, so the monitor's pid is known before it can be
// reaped.
func (k *Keeper) startMonitor(ready, launchLock *os.File) error {
	sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return os.NewSyscallError("socketpair", err)
	}
	mine, theirs := sp[0], sp[1]
	null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		unix.Close(mine)
		unix.Close(theirs)
		return err
	}
	defer null.Close()
	readyFd, lockFd := null.Fd(), null.Fd()
	if ready != nil {
		readyFd = ready.Fd()
	}
	if launchLock != nil {
		lockFd = launchLock.Fd()
	}
	files := []uintptr{null.Fd(), null.Fd(), null.Fd(), readyFd, uintptr(theirs), lockFd}
	argv := []string{k.binary, "monitor", "--dir", k.dir}
	pid, err := syscall.ForkExec(k.binary, argv, &syscall.ProcAttr{Dir: "/", Env: os.Environ(), Files: files})
	unix.Close(theirs)
	if launchLock != nil {
		// The monitor holds it now; ours goes before the adopt list, so
		// before the monitor can listen and let go of its own.
		launchLock.Close()
	}
	if err != nil {
		unix.Close(mine)
		return err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	done := make(chan struct{})
	k.monitor, k.link, k.linkDone = pid, mine, done
	// The adopt list goes out under the lock, so an exit reaped meanwhile
	// is either in an entry or sent after the list.
	for _, e := range k.ctrs {
		m := e.msg
		m.Op = proto.KeeperAdopt
		var fds []int
		var names []string
		for i, fd := range e.fds {
			if fd >= 0 {
				fds = append(fds, fd)
				names = append(names, e.names[i])
			}
		}
		m.Streams = strings.Join(names, ",")
		if err := proto.SendKeeperMsg(mine, &m, fds); err != nil {
			k.logf("hand container %s to the monitor: %v", e.msg.ID, err)
		}
	}
	// The lazy layers held, named without their fds: the monitor counts
	// them for its idle exit and lists them to berthd (decision 3600).
	for id, h := range k.lazy.holds {
		if err := proto.SendKeeperMsg(mine, &proto.KeeperMsg{Op: proto.KeeperLazyHold, ID: id, Dir: h.dir}, nil); err != nil {
			k.logf("name lazy layer %s to the monitor: %v", id, err)
		}
	}
	if err := proto.SendKeeperMsg(mine, &proto.KeeperMsg{Op: proto.KeeperAdopted}, nil); err != nil {
		k.logf("end the adopt list: %v", err)
	}
	// Watched from now on: its pings come after the adopt list. The
	// first goes at once: the monitor learns that its keeper pings (and
	// times it, decision 3300) however soon after this the keeper hangs,
	// and its adoption is timed from here.
	k.watchMonitor(pid, mine)
	k.checkMonitor(time.Now())
	k.logf("monitor %d started with %d containers", pid, len(k.ctrs))
	go k.serveLink(mine, done)
	return nil
}

// serveLink applies the monitor's messages until its link closes, then
// closes done.
func (k *Keeper) serveLink(fd int, done chan struct{}) {
	defer close(done)
	r := proto.NewKeeperReader(fd)
	for {
		m, fds, err := r.Recv()
		if err != nil {
			if !errors.Is(err, io.EOF) {
				k.logf("monitor link: %v", err)
			}
			k.mu.Lock()
			if k.link == fd {
				k.link = -1
			}
			k.mu.Unlock()
			k.closeLink(fd)
			return
		}
		shimfault.Pause(shimfault.KeeperSlowLink, time.Second, k.logf)
		k.mu.Lock()
		k.applyLocked(m, fds)
		k.mu.Unlock()
		textpages.Release()
	}
}

// applyLocked applies one monitor message; it owns fds.
func (k *Keeper) applyLocked(m *proto.KeeperMsg, fds []int) {
	e := k.ctrs[m.ID]
	switch m.Op {
	case proto.KeeperRegister:
		if e == nil {
			shimfault.Hit(shimfault.KeeperMidCreate, k.dir, k.logf)
		}
		names := m.StreamNames()
		if len(names) != len(fds) || m.ID == "" {
			k.logf("register of %q: %d fds for streams %q; refused", m.ID, len(fds), m.Streams)
			proto.CloseFds(fds)
			return
		}
		if e != nil {
			k.forgetLocked(e)
		}
		e = &entry{msg: *m, fds: fds, names: names}
		e.msg.Op = ""
		k.ctrs[m.ID] = e
		if m.Pid > 0 && !m.Exited {
			if ws, ok := k.unclaimed.Take(m.Pid); ok {
				// It died before it was registered.
				k.exitedLocked(e, ws)
			} else {
				k.byPid[m.Pid] = e
			}
		}
		return
	case proto.KeeperStarted:
		if e != nil {
			e.msg.Running = true
		}
	case proto.KeeperCloseStdin:
		if e != nil {
			for i, n := range e.names {
				if n == "stdin" && e.fds[i] >= 0 {
					unix.Close(e.fds[i])
					e.fds[i] = -1
				}
			}
		}
	case proto.KeeperForget:
		if e != nil {
			k.forgetLocked(e)
		}
	case proto.KeeperPong:
		k.ponged()
	case proto.KeeperLazyHold, proto.KeeperLazyDrop:
		k.lazyMsgLocked(m, fds)
		return
	default:
		k.logf("unknown message %q from the monitor", m.Op)
	}
	proto.CloseFds(fds)
}

func (k *Keeper) forgetLocked(e *entry) {
	proto.CloseFds(e.fds)
	e.fds = nil
	if k.byPid[e.msg.Pid] == e {
		delete(k.byPid, e.msg.Pid)
	}
	if k.ctrs[e.msg.ID] == e {
		delete(k.ctrs, e.msg.ID)
	}
}

// reapedLocked records the exit of a child other than the monitor: a
// container's init, or an orphan (kept a minute in case its register is
// still on the way, then dropped).
func (k *Keeper) reapedLocked(pid int, ws unix.WaitStatus) {
	if e := k.byPid[pid]; e != nil {
		delete(k.byPid, pid)
		k.exitedLocked(e, ws)
		return
	}
	k.unclaimed.Add(pid, ws, time.Now())
}

// exitedLocked keeps e's exit (for a monitor started later) and tells the
// current monitor.
func (k *Keeper) exitedLocked(e *entry, ws unix.WaitStatus) {
	e.msg.Exited, e.msg.Status = true, int(ws)
	if k.link < 0 {
		return
	}
	if err := proto.SendKeeperMsg(k.link, &proto.KeeperMsg{Op: proto.KeeperExit, ID: e.msg.ID, Pid: e.msg.Pid, Exited: true, Status: int(ws)}, nil); err != nil {
		k.logf("tell the monitor of %s's exit: %v", e.msg.ID, err)
	}
}
