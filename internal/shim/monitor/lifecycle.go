package monitor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/oci/ocicli"
	"github.com/berthcri/berth/internal/shim/proto"
	"github.com/berthcri/berth/internal/shim/shimfault"
)

// create adds a container the runtime creates (OpCreate); its init waits
// for start.
func (p *Pod) create(req *proto.Request) (retErr error) {
	c, err := p.register(req)
	if err != nil {
		return err
	}
	if req.Create.Restore != "" {
		// Nothing runs until start restores the checkpoint.
		c.setProcess(0, phaseCreated)
		return nil
	}
	defer func() {
		if retErr != nil {
			p.unregister(c)
		}
	}()
	return p.launch(c, req.Create, createStep, phaseCreated)
}

// register checks a request that adds a container, reserves its ID (the
// container is creating) and opens its CRI log.
func (p *Pod) register(req *proto.Request) (*container, error) {
	cr := req.Create
	if req.ID == "" || cr == nil || cr.Bundle == "" || cr.Runtime.Binary == "" {
		return nil, fmt.Errorf("%s needs an id, a bundle and a runtime: %w", req.Op, errdefs.ErrInvalidArgument)
	}
	rt := p.reaper.ociRuntime(cr.Runtime)
	c := newContainer(req.ID, cr, rt, p.logf)
	if cr.Restore != "" {
		if cr.Terminal {
			return nil, fmt.Errorf("a terminal container cannot be restored: %w", errdefs.ErrInvalidArgument)
		}
		c.restore = cr
	}
	if err := p.reserve(c); err != nil {
		return nil, err
	}
	if err := c.log.open(); err != nil {
		p.forget(c.id)
		return nil, err
	}
	return c, nil
}

// unregister undoes register (and what a failed launch left open).
func (p *Pod) unregister(c *container) {
	p.forget(c.id)
	c.closeIO()
}

// launch runs step and takes the process it makes over, top to bottom:
// set up stdio, run the runtime step, learn and watch the init's pid,
// take the pty, look at the cgroups, then move the container to phase
// then (created, or running for a process that runs at once) with its
// stdio, and start its output copiers and its exit waiter. A failure
// undoes every step of launch before it; the container stays registered.
func (p *Pod) launch(c *container, cr *proto.CreateRequest, step runtimeStep, then phase) (retErr error) {
	lio, err := p.prepareIO(c, cr)
	if err != nil {
		return err
	}
	defer func() { lio.release(retErr != nil) }()

	if err := step(c.rt, c.id, lio.opts); err != nil {
		if errors.Is(err, errRuntimeHung) {
			// Killed mid-way: the runtime may hold part of it.
			_ = c.rt.Delete(context.Background(), c.id, true)
		}
		return err
	}
	// From here on the runtime holds the container: undo with delete.
	pid, err := readPidFile(lio.opts.PidFile)
	if err != nil {
		_ = c.rt.Delete(context.Background(), c.id, true)
		return err
	}
	exitCh, pidfd, err := p.reaper.watch(pid)
	if err != nil {
		_ = c.rt.Delete(context.Background(), c.id, true)
		return err
	}
	if err := lio.takeConsole(c); err != nil {
		_ = c.rt.Delete(context.Background(), c.id, true)
		if pidfd != nil {
			// The reaper still collects the init's exit.
			pidfd.Close()
		}
		return err
	}
	shimfault.Hit(shimfault.MonitorMidCreateUnheld, p.mon.dir, p.logf)
	if err := p.mon.keeper.register(p, c, cr, pid, then == phaseRunning, lio.outputs, lio.stdin, lio.console); err != nil {
		_ = c.rt.Delete(context.Background(), c.id, true)
		if pidfd != nil {
			pidfd.Close()
		}
		return err
	}
	shimfault.Hit(shimfault.MonitorMidCreate, p.mon.dir, p.logf)
	p.watchCgroups(c, pid)
	c.stdio.set(lio.stdin, lio.console)
	c.setProcess(pid, then)
	for _, o := range lio.outputs {
		c.startCopier(o, o.r != lio.console)
	}
	// The container owns them now.
	lio.outputs, lio.stdin, lio.console = nil, nil, nil
	go p.waitExit(c, exitCh, pidfd)
	return nil
}

// output is one stream of a container the monitor reads.
type output struct {
	r    *os.File
	name string
}

// launchIO is the stdio of a launch: what the runtime gets (opts), the
// ends the monitor keeps (outputs, stdin, the pty: the container's once the
// launch succeeded), and the console socket a terminal container's pty
// comes over.
type launchIO struct {
	opts    ocicli.CreateOpts
	outputs []output   // includes the pty master, once received
	theirs  []*os.File // the container's ends, closed once the runtime has them
	stdin   *os.File   // the write end of the container's stdin
	console *os.File   // the pty master, once received

	consoleLn  *os.File
	consoleCh  chan consoleResult
	consoleSoc string   // the socket's path
	consoleDir *os.File // the pod's dir, through which the runtime dials
}

// prepareIO makes pipes for the container's stdio, or for a terminal a
// console socket its runtime sends the pty master over.
func (p *Pod) prepareIO(c *container, cr *proto.CreateRequest) (_ *launchIO, retErr error) {
	l := &launchIO{opts: ocicli.CreateOpts{Bundle: cr.Bundle, PidFile: filepath.Join(cr.Bundle, "init.pid")}}
	defer func() {
		if retErr != nil {
			l.release(true)
		}
	}()
	if cr.Terminal {
		sock := filepath.Join(p.dir, "console-"+shortID(c.id)+".sock")
		_ = os.Remove(sock)
		ln, err := listenUnix(sock)
		if err != nil {
			return nil, fmt.Errorf("console socket: %w", err)
		}
		l.consoleLn, l.consoleSoc = ln, sock
		l.consoleCh = make(chan consoleResult, 1)
		go func() { l.consoleCh <- receiveConsole(ln) }()
		// The runtime dials this path itself: keep it short through our
		// /proc fd link to the directory.
		if l.consoleDir, err = os.Open(p.dir); err != nil {
			return nil, fmt.Errorf("console socket: %w", err)
		}
		l.opts.ConsoleSocket = "/proc/" + strconv.Itoa(os.Getpid()) + "/fd/" + strconv.Itoa(int(l.consoleDir.Fd())) + "/" + filepath.Base(sock)
		return l, nil
	}
	for _, name := range []string{"stdout", "stderr"} {
		r, w, err := os.Pipe()
		if err != nil {
			return nil, fmt.Errorf("create %s pipe: %w", name, err)
		}
		l.theirs = append(l.theirs, w)
		l.outputs = append(l.outputs, output{r, name})
		if name == "stdout" {
			l.opts.Stdout = w
		} else {
			l.opts.Stderr = w
		}
	}
	if cr.Stdin {
		r, w, err := os.Pipe()
		if err != nil {
			return nil, fmt.Errorf("create stdin pipe: %w", err)
		}
		l.theirs = append(l.theirs, r)
		l.opts.Stdin = r
		l.stdin = w
	}
	return l, nil
}

// takeConsole receives a terminal container's pty master (no-op for
// pipes): it becomes the container's stdin and its one output.
func (l *launchIO) takeConsole(c *container) error {
	if l.consoleLn == nil {
		return nil
	}
	_ = l.consoleLn.SetDeadline(time.Now().Add(10 * time.Second))
	res := <-l.consoleCh
	if res.err != nil {
		return fmt.Errorf("receive console of %s: %w", c.id, res.err)
	}
	l.console = res.f
	l.outputs = append(l.outputs, output{res.f, "stdout"})
	return nil
}

// release closes the container's ends and the console socket; after a
// failed launch also the monitor's ends (a successful one handed them on).
func (l *launchIO) release(failed bool) {
	for _, f := range l.theirs {
		f.Close()
	}
	l.theirs = nil
	if l.consoleLn != nil {
		l.consoleLn.Close()
		os.Remove(l.consoleSoc)
		l.consoleLn = nil
	}
	if l.consoleDir != nil {
		l.consoleDir.Close()
		l.consoleDir = nil
	}
	if failed {
		for _, o := range l.outputs {
			o.r.Close() // the pty master too
		}
		if l.stdin != nil {
			l.stdin.Close()
		}
		l.outputs, l.stdin, l.console = nil, nil, nil
	}
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

// watchCgroups finds the init's memory cgroup (for OOM kills) and, under
// the systemd driver, keeps it in its scope's devices cgroup. Failures
// are logged: the container runs either way.
func (p *Pod) watchCgroups(c *container, pid int) {
	pc, err := readProcCgroups(pid)
	if err != nil {
		p.logf("container %s: read cgroups: %v", c.id, err)
		return
	}
	if moved, err := keepDevicesCgroup(pid, pc); err != nil {
		p.logf("container %s: keep devices cgroup: %v", c.id, err)
	} else if moved {
		p.logf("container %s: moved init back into its scope's devices cgroup", c.id)
	}
	c.memCgroup = pc.memoryDir()
	c.oom = watchOOM(c.memCgroup)
}

// start lets a created container's init run its process.
func (p *Pod) start(c *container) error {
	switch c.currentPhase() {
	case phaseExited:
		return fmt.Errorf("container %s has exited: %w", c.id, errdefs.ErrFailedPrecondition)
	case phaseRunning:
		return fmt.Errorf("container %s already started: %w", c.id, errdefs.ErrFailedPrecondition)
	}
	if c.awaitsRestore() {
		return p.launch(c, c.restore, restoreStep(c.restore), phaseRunning)
	}
	if err := c.rt.Start(context.Background(), c.id); err != nil {
		return err
	}
	shimfault.Hit(shimfault.MonitorMidStart, p.mon.dir, p.logf)
	c.started()
	p.mon.keeper.note(proto.KeeperStarted, c.id)
	return nil
}

// exitUnrestored records the exit of a restored container that never
// ran (killed or deleted before its start): there is no process to reap.
func (p *Pod) exitUnrestored(c *container, sig syscall.Signal) {
	e := &proto.Exit{Version: proto.ExitVersion, ID: c.id, At: time.Now().UTC()}
	if sig != 0 {
		e.Signal, e.Code = int(sig), 128+int(sig)
	}
	p.recordExit(c, e)
}

// kill signals the container's init (every process with all); an exited
// container is not an error.
func (p *Pod) kill(c *container, sig syscall.Signal, all bool) error {
	if c.hasExited() {
		return nil
	}
	if sig == 0 {
		sig = syscall.SIGTERM
	}
	if c.awaitsRestore() {
		p.exitUnrestored(c, sig)
		return nil
	}
	err := c.rt.Kill(context.Background(), c.id, sig, all)
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

// delete removes the container from the runtime (killing it), waits for
// its exit, and forgets it with its exit file.
func (p *Pod) delete(c *container) error {
	if c.awaitsRestore() {
		p.exitUnrestored(c, 0)
	}
	if err := c.rt.Delete(context.Background(), c.id, true); err != nil {
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
	p.forget(c.id)
	p.mon.keeper.note(proto.KeeperForget, c.id)
	_ = os.Remove(proto.ExitPath(p.dir, c.id))
	return nil
}
