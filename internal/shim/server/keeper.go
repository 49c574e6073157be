package server

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
// link (unit tests run a Node without a keeper).
type keeperLink struct {
	fd     int
	r      *proto.KeeperReader // used by Adopt, then by serve
	node   *Node
	isLost atomic.Bool
}

func newKeeperLink(fd int, n *Node) *keeperLink {
	return &keeperLink{fd: fd, r: proto.NewKeeperReader(fd), node: n}
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
func (k *keeperLink) register(s *Server, c *container, cr *proto.CreateRequest, pid int, running bool, outputs []output, stdin, console *os.File) error {
	if k == nil {
		return nil
	}
	m := &proto.KeeperMsg{Op: proto.KeeperRegister, ID: c.id, Dir: s.dir, Pid: pid, Running: running,
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
		k.node.logf("tell the keeper %s %s: %v", op, id, err)
	}
}

// serve delivers the keeper's exits until the link closes.
func (k *keeperLink) serve() {
	for {
		m, fds, err := k.r.Recv()
		proto.CloseFds(fds)
		if err != nil {
			if !errors.Is(err, io.EOF) {
				k.node.logf("keeper link: %v", err)
			}
			k.node.logf("the keeper is gone: exits of running containers will be unknown")
			k.isLost.Store(true)
			k.node.reaper.keeperGone()
			k.node.keeperLost()
			return
		}
		if m.Op == proto.KeeperExit {
			k.node.reaper.deliver(m.Pid, unix.WaitStatus(m.Status))
			continue
		}
		k.node.logf("unexpected keeper message %q", m.Op)
	}
}

// Adopt takes over the containers the keeper holds (a monitor restarted
// after a crash or an upgrade): each pod is served again on its socket,
// each container with its stdio, its exit watched or recorded. It reads
// the keeper's adopt list up to its end.
func (n *Node) Adopt() error {
	if n.keeper == nil {
		return nil
	}
	count := 0
	for {
		m, fds, err := n.keeper.r.Recv()
		if err != nil {
			return fmt.Errorf("read the keeper's adopt list: %w", err)
		}
		switch m.Op {
		case proto.KeeperAdopted:
			proto.CloseFds(fds)
			// Told once the keeper's list is read: the link's buffers
			// are not filled from both ends at once.
			for _, id := range n.startedAtAdopt {
				n.keeper.note(proto.KeeperStarted, id)
			}
			n.startedAtAdopt = nil
			for _, s := range n.adoptedPods {
				go s.Serve()
			}
			n.adoptedPods = nil
			if count > 0 {
				n.logf("adopted %d containers from the keeper", count)
			}
			return nil
		case proto.KeeperExit:
			proto.CloseFds(fds)
			n.reaper.deliver(m.Pid, unix.WaitStatus(m.Status))
		case proto.KeeperAdopt:
			if err := n.adopt(m, fds); err != nil {
				n.logf("adopt container %s: %v", m.ID, err)
				continue
			}
			count++
			shimfault.Hit(shimfault.MonitorMidAdopt, n.dir, n.logf)
		default:
			proto.CloseFds(fds)
		}
	}
}

// adopt rebuilds one container from the keeper's entry and serves its pod.
func (n *Node) adopt(m *proto.KeeperMsg, fds []int) error {
	names := m.StreamNames()
	if len(names) != len(fds) {
		proto.CloseFds(fds)
		return fmt.Errorf("%d fds for streams %q", len(fds), m.Streams)
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
	req, err := proto.DecodeRequest([]byte(m.Create))
	if err != nil || req.Create == nil || req.ID != m.ID {
		closeFiles()
		return fmt.Errorf("bad create request %q: %v", m.Create, err)
	}
	n.mu.Lock()
	s := n.pods[m.Dir]
	if s == nil {
		if s, err = n.newPodLocked(m.Dir); err != nil {
			n.mu.Unlock()
			closeFiles()
			return err
		}
		// Listening, but served once every container is adopted: a
		// request for a container adopted later must not find it
		// missing (berthd's client, waiting for this monitor, dials
		// as soon as the socket listens).
		n.adoptedPods = append(n.adoptedPods, s)
	}
	n.mu.Unlock()

	cr := req.Create
	rt := n.reaper.ociRuntime(cr.Runtime)
	c := newContainer(m.ID, cr, rt, s.logf)
	if cr.Restore != "" {
		c.restore = cr
	}
	if err := c.log.open(); err != nil {
		s.logf("container %s: reopen its log: %v", c.id, err)
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
	if m.Running {
		ph = phaseRunning
	} else if m.Pid > 0 && !m.Exited {
		// The monitor before may have died between the runtime's start
		// and telling the keeper: the runtime knows.
		if st, err := rt.Status(context.Background(), c.id); err == nil && st != "created" {
			ph = phaseRunning
			n.startedAtAdopt = append(n.startedAtAdopt, c.id)
		}
	}
	c.setProcess(m.Pid, ph)
	s.mu.Lock()
	s.ctrs[c.id] = c
	s.mu.Unlock()
	for _, o := range outputs {
		c.startCopier(o, o.r != console)
	}
	if m.Pid == 0 {
		// A restored container not started yet: nothing runs.
		return nil
	}
	if m.Exited {
		if data, err := os.ReadFile(proto.ExitPath(s.dir, c.id)); err == nil {
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
		ch <- unix.WaitStatus(m.Status)
		go s.waitExit(c, ch, nil)
		return nil
	}
	exitCh, pidfd, err := n.reaper.watch(m.Pid)
	if err != nil {
		return err
	}
	s.watchCgroups(c, m.Pid)
	go s.waitExit(c, exitCh, pidfd)
	return nil
}

// HandOver prepares the monitor's exit for a successor (an upgrade: the
// keeper starts the binary now at its path): every output copier stops
// reading and writes the line it holds as a P record, so what the
// containers wrote is either in their logs or still in their pipes, for
// the next monitor. Attaches and requests in flight are cut.
func (n *Node) HandOver(timeout time.Duration) {
	n.mu.Lock()
	n.closing = true // no new pods; the socket stays for the successor to replace
	var ctrs []*container
	for _, s := range n.pods {
		s.each(func(c *container) { ctrs = append(ctrs, c) })
	}
	n.mu.Unlock()
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
			n.logf("container %s: output copiers still running at hand-over", c.id)
		}
	}
	n.logf("handed over %d containers", len(ctrs))
}
