package monitor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/shim/proto"
	"github.com/berthcri/berth/internal/shim/shimfault"
)

// keeperLink is the monitor's end of its link to the keeper (decision
// 1701): it registers each container's init and stdio with the keeper,
// and delivers the exits the keeper reaps. Its methods are no-ops on a nil
// link (unit tests run a Monitor without a keeper).
type keeperLink struct {
	fd     int
	r      *proto.KeeperReader // used by Adopt, then by serve
	mon    *Monitor
	isLost atomic.Bool

	// The keeper's liveness (decision 3300): pidfd is the keeper's (-1:
	// none), taken at the start while it is surely our parent; pinged
	// says it pings (a keeper older than its pings never does, and is
	// never timed); silent counts housekeeping rounds since its last
	// ping; killed once it was killed as hung.
	pidfd  int
	pinged atomic.Bool
	silent atomic.Int32
	killed atomic.Bool
}

func newKeeperLink(fd int, m *Monitor) *keeperLink {
	k := &keeperLink{fd: fd, r: proto.NewKeeperReader(fd), mon: m, pidfd: -1}
	if ppid := os.Getppid(); ppid > 1 {
		// Our parent is the keeper unless it died already, and then
		// the link is at its end: a keeper that never pings is never
		// killed.
		if pidfd, err := unix.PidfdOpen(ppid, 0); err == nil {
			k.pidfd = pidfd
		}
	}
	return k
}

// keeperHungRounds is how many housekeeping rounds (5 s) a keeper that
// pinged before may leave without a ping (it pings every 5 s) before the
// monitor kills it as hung: 60 s. Counted in rounds, not read off the
// clock: a monitor that was stopped itself must not, on waking, find its
// keeper silent for as long.
const keeperHungRounds = int32(60 * time.Second / housekeepingInterval)

// checkAlive is the monitor's side of the watchdog, once a housekeeping
// round: a keeper that stopped pinging (stopped, deadlocked) reaps no
// exit and restarts no monitor for as long as it lasts, so the node's
// exits would go unreported for good; killed, it is a keeper that
// crashed (decision 1701: the containers run on, their exits lost,
// 255; new pods get a new keeper and monitor), which berthd and the
// kubelet handle. It allocates nothing until it kills.
func (k *keeperLink) checkAlive() {
	if k == nil || k.lost() || !k.pinged.Load() || k.pidfd < 0 || k.killed.Load() {
		return
	}
	if k.silent.Add(1) <= keeperHungRounds {
		return
	}
	k.killed.Store(true)
	k.mon.logf("the keeper sent no ping for %d housekeeping rounds: killing it as hung; running containers' exits will be unknown", keeperHungRounds)
	if err := unix.PidfdSendSignal(k.pidfd, unix.SIGKILL, nil, 0); err != nil {
		k.mon.logf("kill the hung keeper: %v", err)
	}
}

// lost reports whether the keeper is gone.
func (k *keeperLink) lost() bool { return k != nil && k.isLost.Load() }

func (k *keeperLink) send(m *proto.KeeperMsg, fds []int) error {
	if k == nil {
		return nil
	}
	if k.lost() {
		return fmt.Errorf("the node's keeper is gone: %w", errdefs.ErrUnavailable)
	}
	return proto.SendKeeperMsg(k.fd, m, fds)
}

// register hands the keeper c's init (pid) and a copy of its stdio: the
// output pipes' read ends, the stdin write end, or the pty master.
func (k *keeperLink) register(p *Pod, c *container, cr *proto.CreateRequest, pid int, running bool, outputs []output, stdin, console *os.File) error {
	if k == nil {
		return nil
	}
	m := &proto.KeeperMsg{Op: proto.KeeperRegister, ID: c.id, Dir: p.dir, Pid: pid, Running: running,
		Create: string(proto.AppendRequest(nil, &proto.Request{Op: proto.OpCreate, ID: c.id, Create: cr}))}
	var fds []int
	defer func() { proto.CloseFds(fds) }()
	var names string
	var dupErr error
	// Duplicates, sent and closed: File.Fd would put the monitor's own
	// ends in blocking mode, parking a thread per read.
	add := func(name string, f *os.File) {
		if names != "" {
			names += ","
		}
		names += name
		rc, err := f.SyscallConn()
		if err == nil {
			err = rc.Control(func(fd uintptr) {
				var dup int
				if dup, err = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0); err == nil {
					fds = append(fds, dup)
				}
			})
		}
		if err != nil && dupErr == nil {
			dupErr = err
		}
	}
	if console != nil {
		add("pty", console)
	} else {
		for _, o := range outputs {
			add(o.name, o.r)
		}
		if stdin != nil {
			add("stdin", stdin)
		}
	}
	m.Streams = names
	if dupErr != nil {
		return fmt.Errorf("register container %s with the keeper: duplicate its stdio: %w", c.id, dupErr)
	}
	if err := k.send(m, fds); err != nil {
		return fmt.Errorf("register container %s with the keeper: %w", c.id, err)
	}
	return nil
}

// note sends a message about container id; a failure is logged: the
// keeper's view is then behind, which costs only a restarted monitor's
// view of that container.
func (k *keeperLink) note(op, id string) {
	if err := k.send(&proto.KeeperMsg{Op: op, ID: id}, nil); err != nil && k != nil {
		k.mon.logf("tell the keeper %s %s: %v", op, id, err)
	}
}

// serve delivers the keeper's exits and answers its pings until the
// link closes. Its first pong goes unasked: the monitor serves from now
// on, and the keeper times its answers from then (decision 3300).
func (k *keeperLink) serve() {
	k.note(proto.KeeperPong, "")
	for {
		m, fds, err := k.r.Recv()
		proto.CloseFds(fds)
		if err != nil {
			if !errors.Is(err, io.EOF) {
				k.mon.logf("keeper link: %v", err)
			}
			k.mon.logf("the keeper is gone: exits of running containers will be unknown")
			k.isLost.Store(true)
			k.mon.reaper.keeperGone()
			k.mon.keeperLost()
			return
		}
		switch m.Op {
		case proto.KeeperExit:
			k.mon.reaper.deliver(m.Pid, unix.WaitStatus(m.Status))
			continue
		case proto.KeeperLazyDrop:
			// The keeper gave the layer up (its server's crash loop).
			k.mon.forgetLazy(m.ID, "given up by the keeper")
			continue
		case proto.KeeperPing:
			k.pinged.Store(true)
			k.silent.Store(0)
			// Answered once the monitor's locks can be taken: a
			// monitor wedged on one is as hung as a stopped one, and
			// the keeper replaces it (decision 3300).
			k.mon.eachPod(probeLock)
			k.note(proto.KeeperPong, "")
			continue
		}
		k.mon.logf("unexpected keeper message %q", m.Op)
	}
}

// Adopt takes over the containers the keeper holds (a monitor restarted
// after a crash or an upgrade): each pod is served again on its socket,
// each container with its stdio, its exit watched or recorded. It reads
// the keeper's adopt list up to its end.
func (m *Monitor) Adopt() error {
	if m.keeper == nil {
		return nil
	}
	count := 0
	for {
		msg, fds, err := m.keeper.r.Recv()
		if err != nil {
			return fmt.Errorf("read the keeper's adopt list: %w", err)
		}
		switch msg.Op {
		case proto.KeeperAdopted:
			proto.CloseFds(fds)
			// Told once the keeper's list is read: the link's buffers
			// are not filled from both ends at once.
			for _, id := range m.startedAtAdopt {
				m.keeper.note(proto.KeeperStarted, id)
			}
			m.startedAtAdopt = nil
			for _, p := range m.adoptedPods {
				go p.Serve()
			}
			m.adoptedPods = nil
			if count > 0 {
				m.logf("adopted %d containers from the keeper", count)
			}
			return nil
		case proto.KeeperExit:
			proto.CloseFds(fds)
			m.reaper.deliver(msg.Pid, unix.WaitStatus(msg.Status))
		case proto.KeeperLazyHold:
			proto.CloseFds(fds) // named, not handed: the keeper keeps the fd
			m.adoptLazy(msg)
		case proto.KeeperAdopt:
			if err := m.adopt(msg, fds); err != nil {
				m.logf("adopt container %s: %v", msg.ID, err)
				continue
			}
			count++
			shimfault.Hit(shimfault.MonitorMidAdopt, m.dir, m.logf)
			shimfault.Hold(shimfault.MonitorHangAdopt, m.logf)
		default:
			proto.CloseFds(fds)
		}
	}
}

// adopt rebuilds one container from the keeper's entry and serves its pod.
func (m *Monitor) adopt(msg *proto.KeeperMsg, fds []int) error {
	names := msg.StreamNames()
	if len(names) != len(fds) {
		proto.CloseFds(fds)
		return fmt.Errorf("%d fds for streams %q", len(fds), msg.Streams)
	}
	files := make([]*os.File, len(fds))
	for i, fd := range fds {
		// Non-blocking, so reads and writes park in the poller.
		_ = unix.SetNonblock(fd, true)
		files[i] = os.NewFile(uintptr(fd), names[i])
	}
	closeFiles := func() {
		for _, f := range files {
			f.Close()
		}
	}
	req, err := proto.DecodeRequest([]byte(msg.Create))
	if err != nil || req.Create == nil || req.ID != msg.ID {
		closeFiles()
		return fmt.Errorf("bad create request %q: %v", msg.Create, err)
	}
	m.mu.Lock()
	p := m.pods[msg.Dir]
	if p == nil {
		if p, err = m.newPodLocked(msg.Dir); err != nil {
			m.mu.Unlock()
			closeFiles()
			return err
		}
		// Listening, but served once every container is adopted: a
		// request for a container adopted later must not find it
		// missing (berthd's client, waiting for this monitor, dials
		// as soon as the socket listens).
		m.adoptedPods = append(m.adoptedPods, p)
	}
	m.mu.Unlock()

	cr := req.Create
	rt := m.reaper.ociRuntime(cr.Runtime)
	c := newContainer(msg.ID, cr, rt, p.logf)
	if cr.Restore != "" {
		c.restore = cr
	}
	if err := c.log.open(); err != nil {
		p.logf("container %s: reopen its log: %v", c.id, err)
	}
	var outputs []output
	var stdin, console *os.File
	for i, name := range names {
		switch name {
		case "pty":
			console = files[i]
			outputs = append(outputs, output{files[i], "stdout"})
		case "stdin":
			stdin = files[i]
		default:
			outputs = append(outputs, output{files[i], name})
		}
	}
	c.stdio.set(stdin, console)
	ph := phaseCreated
	if msg.Running {
		ph = phaseRunning
	} else if msg.Pid > 0 && !msg.Exited {
		// The monitor before may have died between the runtime's start
		// and telling the keeper: the runtime knows.
		if st, err := rt.Status(context.Background(), c.id); err == nil && st != "created" {
			ph = phaseRunning
			m.startedAtAdopt = append(m.startedAtAdopt, c.id)
		}
	}
	c.setProcess(msg.Pid, ph)
	p.mu.Lock()
	p.ctrs[c.id] = c
	p.mu.Unlock()
	for _, o := range outputs {
		c.startCopier(o, o.r != console)
	}
	if msg.Pid == 0 {
		// A restored container not started yet: nothing runs.
		return nil
	}
	if msg.Exited {
		if data, err := os.ReadFile(proto.ExitPath(p.dir, c.id)); err == nil {
			if e, err := proto.DecodeExit(data); err == nil {
				// The monitor before recorded it.
				c.mu.Lock()
				c.exit, c.phase = e, phaseExited
				c.mu.Unlock()
				close(c.exited)
				return nil
			}
		}
		ch := make(chan unix.WaitStatus, 1)
		ch <- unix.WaitStatus(msg.Status)
		go p.waitExit(c, ch, nil)
		return nil
	}
	exitCh, pidfd, err := m.reaper.watch(msg.Pid)
	if err != nil {
		return err
	}
	p.watchCgroups(c, msg.Pid)
	go p.waitExit(c, exitCh, pidfd)
	return nil
}

// HandOver prepares the monitor's exit for a successor (an upgrade: the
// keeper starts the binary now at its path): every output copier stops
// reading and writes the line it holds as a P record, so what the
// containers wrote is either in their logs or still in their pipes, for
// the next monitor. Attaches and requests in flight are cut.
func (m *Monitor) HandOver(timeout time.Duration) {
	m.mu.Lock()
	m.closing = true // no new pods; the socket stays for the successor to replace
	var ctrs []*container
	for _, p := range m.pods {
		p.each(func(c *container) { ctrs = append(ctrs, c) })
	}
	m.mu.Unlock()
	for _, c := range ctrs {
		c.stopCopiers()
	}
	deadline := time.Now().Add(timeout)
	for _, c := range ctrs {
		done := make(chan struct{})
		go func() { c.streams.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(time.Until(deadline)):
			m.logf("container %s: output copiers still running at hand-over", c.id)
		}
	}
	m.logf("handed over %d containers", len(ctrs))
}

// probeLock takes and lets go of the pod's lock: whether it can be taken
// is the answer to the keeper's ping.
func probeLock(p *Pod) {
	p.mu.Lock()
	//lint:ignore SA2001 an empty critical section: the lock's availability is what is probed
	p.mu.Unlock()
}
