package container

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/oci"
)

// ExecOptions describe one process run inside a running container.
type ExecOptions struct {
	Cmd    []string
	Stdin  io.Reader // nil: /dev/null
	Stdout io.Writer // nil: discarded
	Stderr io.Writer // nil: discarded; unused with TTY
	TTY    bool
	Resize <-chan TerminalSize
	// Timeout, when positive, kills the process once it has run that long
	// (counted from its start, not the runtime's setup) and makes Exec
	// return an error wrapping errdefs.ErrDeadlineExceeded.
	Timeout time.Duration
}

// drainTimeout bounds how long output is read after the exec'd process has
// exited: a background child that inherited the pipes must not hold the
// call (or a goroutine) forever.
const drainTimeout = 2 * time.Second

// execStartPoll is how often Exec looks for the runtime's pid file, the
// sign that the process runs and its timeout starts.
const execStartPoll = 10 * time.Millisecond

// Exec runs a process in the running container id with the container's
// own identity, environment, working directory and capabilities, and
// returns its exit code. The process is always gone when Exec returns.
func (s *Store) Exec(ctx context.Context, id string, o ExecOptions) (int, error) {
	if len(o.Cmd) == 0 {
		return -1, fmt.Errorf("exec needs a command: %w", errdefs.ErrInvalidArgument)
	}
	// The record as Get reads it: an exec (the kubelet's probes) must
	// not wait behind a stop that waits on the monitor or a stuck
	// runtime (decision 3300); runc refuses a container that is gone.
	rec, err := s.Get(id)
	if err != nil {
		return -1, err
	}
	if rec.State != StateRunning {
		return -1, fmt.Errorf("container %s is %s, not running: %w", rec.ID, rec.State, errdefs.ErrFailedPrecondition)
	}
	rt, ok := s.runtime(rec.Runtime)
	if !ok {
		return -1, fmt.Errorf("container %s: runtime handler %q is gone from the config: %w", rec.ID, rec.Runtime, errdefs.ErrFailedPrecondition)
	}
	proc, err := execProcess(s.dir(rec.ID), o)
	if err != nil {
		return -1, err
	}

	tmp, err := os.MkdirTemp(s.dir(rec.ID), "exec-")
	if err != nil {
		return -1, fmt.Errorf("exec in %s: %w", rec.ID, err)
	}
	defer os.RemoveAll(tmp)
	pidFile := filepath.Join(tmp, "pid")

	var (
		stdio execIO
		tty   *execTTY
	)
	if o.TTY {
		if tty, err = newExecTTY(pidFile); err != nil {
			return -1, err
		}
		defer tty.Close()
	} else {
		if err := stdio.open(o); err != nil {
			return -1, err
		}
		defer stdio.closeAll()
	}

	// The runtime runs under a context that the timeout does not cancel:
	// killing runc would orphan the process inside the container. On
	// timeout the process itself is killed and runc then returns.
	runCtx, cancelRun := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelRun()
	opts := oci.ExecOpts{PidFile: pidFile}
	if tty != nil {
		opts.Stdin, opts.Stdout, opts.Stderr = tty.slave, tty.slave, tty.slave
	} else {
		opts.Stdin, opts.Stdout, opts.Stderr = stdio.childIn, stdio.childOut, stdio.childErr
	}
	done := make(chan error, 1)
	go func() { done <- rt.Exec(runCtx, rec.ID, proc, opts) }()

	if tty != nil {
		tty.start(o)
	} else {
		stdio.start(o)
	}

	runErr, why := awaitExec(ctx, rec.ID, done, pidFile, o.Timeout)
	if why != nil {
		killExec(pidFile)
		select {
		case runErr = <-done:
		case <-time.After(10 * time.Second):
			cancelRun() // runc itself is stuck: kill it too
			runErr = <-done
		}
	}
	if tty != nil {
		tty.finish()
	} else {
		stdio.finish()
	}
	if why != nil {
		return -1, why
	}
	return exitCode(rec.ID, runErr)
}

// awaitExec waits for the exec's runtime call (done) and returns its
// result, or why it stopped waiting: the timeout or the caller's context.
// The timeout counts from the process's start, as containerd's does (its
// timer starts once the exec's Start returns): the runtime's own setup,
// seconds on a loaded node, is not the command's time, and counting it
// failed probes the command would have passed. The runtime writes the pid
// file once the process runs; until then only ctx bounds the wait.
func awaitExec(ctx context.Context, id string, done <-chan error, pidFile string, timeout time.Duration) (runErr, why error) {
	var expired, started <-chan time.Time
	if timeout > 0 {
		poll := time.NewTicker(execStartPoll)
		defer poll.Stop()
		started = poll.C
	}
	for {
		select {
		case runErr = <-done:
			return runErr, nil
		case <-started:
			if _, err := os.Stat(pidFile); err == nil {
				started = nil
				t := time.NewTimer(timeout)
				defer t.Stop()
				expired = t.C
			}
		case <-expired:
			return nil, fmt.Errorf("exec in %s: timeout %s exceeded: %w", id, timeout, errdefs.ErrDeadlineExceeded)
		case <-ctx.Done():
			return nil, fmt.Errorf("exec in %s: %w", id, ctx.Err())
		}
	}
}

// execProcess is the container's process spec with the exec's command.
func execProcess(dir string, o ExecOptions) (*specs.Process, error) {
	data, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return nil, fmt.Errorf("read bundle spec: %w", err)
	}
	var spec specs.Spec
	if err := json.Unmarshal(data, &spec); err != nil {
		return nil, fmt.Errorf("parse bundle spec: %w", err)
	}
	if spec.Process == nil {
		return nil, fmt.Errorf("bundle spec has no process: %w", errdefs.ErrFailedPrecondition)
	}
	p := *spec.Process
	p.Args = o.Cmd
	p.Terminal = o.TTY
	p.ConsoleSize = nil
	return &p, nil
}

// killExec kills the exec'd process named in the runtime's pid file.
func killExec(pidFile string) {
	for i := 0; i < 50; i++ {
		data, err := os.ReadFile(pidFile)
		if err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(data))); err == nil && pid > 0 {
				_ = unix.Kill(pid, unix.SIGKILL)
				return
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// exitCode maps the runtime's result to the process's exit status: runc
// exec exits with the process's code (128+n for a signal).
func exitCode(id string, err error) (int, error) {
	if err == nil {
		return 0, nil
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ExitCode() >= 0 {
		return ee.ExitCode(), nil
	}
	return -1, fmt.Errorf("exec in %s: %w", id, err)
}

// execIO holds the pipes of a non-TTY exec.
type execIO struct {
	childIn, childOut, childErr *os.File // the runtime's ends
	in, out, errR               *os.File // ours
	wg                          sync.WaitGroup
}

func (x *execIO) open(o ExecOptions) error {
	var err error
	if o.Stdin != nil {
		if x.childIn, x.in, err = os.Pipe(); err != nil {
			return fmt.Errorf("exec stdin pipe: %w", err)
		}
	} else if x.childIn, err = os.Open(os.DevNull); err != nil {
		return err
	}
	if x.out, x.childOut, err = os.Pipe(); err != nil {
		return fmt.Errorf("exec stdout pipe: %w", err)
	}
	if x.errR, x.childErr, err = os.Pipe(); err != nil {
		return fmt.Errorf("exec stderr pipe: %w", err)
	}
	return nil
}

func (x *execIO) start(o ExecOptions) {
	if x.in != nil {
		go func() {
			_, _ = io.Copy(x.in, o.Stdin)
			x.in.Close() // EOF to the process
		}()
	}
	copyOut := func(dst io.Writer, src *os.File) {
		defer x.wg.Done()
		if dst == nil {
			dst = io.Discard
		}
		_, _ = io.Copy(dst, src)
	}
	x.wg.Add(2)
	go copyOut(o.Stdout, x.out)
	go copyOut(o.Stderr, x.errR)
}

// finish closes the runtime's ends and drains output, cutting the drain
// short after drainTimeout (a background child may keep the pipes open).
func (x *execIO) finish() {
	for _, f := range []*os.File{x.childIn, x.childOut, x.childErr} {
		if f != nil {
			f.Close()
		}
	}
	drained := make(chan struct{})
	go func() { x.wg.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(drainTimeout):
		x.out.Close()
		x.errR.Close()
		<-drained
	}
}

func (x *execIO) closeAll() {
	for _, f := range []*os.File{x.childIn, x.childOut, x.childErr, x.in, x.out, x.errR} {
		if f != nil {
			f.Close()
		}
	}
}
