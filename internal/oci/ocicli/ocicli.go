// Package ocicli drives an OCI runtime's command line (runc, crun) in the
// shape of containerd's go-runc: one Runtime with a method per subcommand
// (create, start, kill, delete, state, update, pause, resume, exec,
// checkpoint, restore, features, --version), each building its command
// line and handing it to a Runner. It is the one place berth builds the
// runtime's command lines and reads their failures: the runtime's stderr,
// and the JSON log create and restore write (decisions 2800, 3710). Its
// callers hand it the Runner: berthd (internal/oci) runs commands with
// os/exec, the monitor (internal/shim/monitor) with its reaper. Arguments
// that are JSON documents (update's resources, exec's process) come
// encoded: it imports nothing heavier than errdefs and jsonlite, for the
// monitor's memory budget counts every linked package (decision 0303).
package ocicli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/berthcri/berth/internal/errdefs"
)

// Cmd is one call of the runtime.
type Cmd struct {
	// ID is the container the call is about, for errors and traces.
	ID string
	// Args is the command line; Args[0] is the runtime's binary.
	Args []string
	// Sys, when set, are attributes of the runtime's process.
	Sys *syscall.SysProcAttr
	// Stdio of the runtime; nil means /dev/null, except a nil Stderr,
	// which the Runner captures and returns.
	Stdin, Stdout, Stderr *os.File
	// Group runs the runtime in a process group of its own, which the
	// Runner kills whole when ctx ends: the runtime's own children (CRIU)
	// must not outlive the call.
	Group bool
	// WaitDelay bounds how long the Runner waits, once the runtime has
	// exited or been killed, for its children that still hold the
	// captured stderr open (0: no bound).
	WaitDelay time.Duration
}

// Runner runs c, waits for it and returns what it wrote to stderr when
// c.Stderr is nil. It kills the runtime when ctx ends (its whole process
// group when c.Group) and honours c.WaitDelay. The monitor's runner
// waits through its reaper and is never cancelled: its calls run under
// context.Background.
type Runner func(ctx context.Context, c *Cmd) (errOut []byte, err error)

// Runtime is one OCI runtime: a binary, its state root and the handler's
// global options, and the Runner that runs its calls.
type Runtime struct {
	Binary  string
	Root    string
	Options []string
	// Run runs every call; it must be set (oci.Exec in berthd, the
	// reaper's runner in the monitor).
	Run Runner
}

// args is the command line of one call: the binary and the global
// options (the state root, the handler's options, then extra: --criu,
// --log, --log-format), then the subcommand and its arguments.
func (r *Runtime) args(extra []string, sub ...string) []string {
	a := append([]string{r.Binary, "--root", r.Root}, r.Options...)
	a = append(a, extra...)
	return append(a, sub...)
}

// call runs c in r's state root (created on first use).
func (r *Runtime) call(ctx context.Context, c *Cmd) error {
	if err := os.MkdirAll(r.Root, 0o700); err != nil {
		return fmt.Errorf("create runtime root %s: %w", r.Root, err)
	}
	return r.run(ctx, c)
}

// run runs c with r's Runner; a failure is described by Error, and says
// so when it came from ctx's end.
func (r *Runtime) run(ctx context.Context, c *Cmd) error {
	errOut, err := r.Run(ctx, c)
	if err == nil {
		return nil
	}
	if ctxErr := ctx.Err(); ctxErr != nil {
		err = fmt.Errorf("%w (%v)", ctxErr, err)
	}
	return Error(c.Args, c.ID, errOut, err)
}

// output runs c with do and returns the runtime's stdout, caught in a
// temporary file: a file needs no goroutine to drain it, and the monitor
// runs the runtime with files only.
func output(ctx context.Context, c *Cmd, do func(context.Context, *Cmd) error) ([]byte, error) {
	what := describe(c.Args, c.ID)
	out, err := os.CreateTemp("", "berth-out-")
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	defer os.Remove(out.Name())
	defer out.Close()
	c.Stdout = out
	if err := do(ctx, c); err != nil {
		return nil, err
	}
	data, err := os.ReadFile(out.Name())
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return data, nil
}

// jsonFile writes data, a JSON document the runtime reads from a file
// (update's --resources, exec's --process), to a temporary file and
// returns its path and what removes it.
func jsonFile(data []byte, what string) (string, func(), error) {
	f, err := os.CreateTemp("", "berth-"+what+"-")
	if err != nil {
		return "", nil, err
	}
	remove := func() { os.Remove(f.Name()) }
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		remove()
		return "", nil, err
	}
	return f.Name(), remove, nil
}

// orDevNull returns f, or /dev/null opened for writing when f is nil, and
// what closes it. A created container inherits the runtime's stdio: never
// hand it a pipe the caller waits on, or the caller would wait for the
// container.
func orDevNull(f *os.File) (*os.File, func(), error) {
	if f != nil {
		return f, func() {}, nil
	}
	null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		return nil, nil, err
	}
	return null, func() { null.Close() }, nil
}

// Error describes the failure of the runtime command args (args[0] is the
// binary) on container id, with the runtime's stderr errOut. A "does not
// exist" or "not found" message wraps errdefs.ErrNotFound, so callers can
// treat a vanished container as gone.
func Error(args []string, id string, errOut []byte, err error) error {
	msg := Message(strings.TrimSpace(string(errOut)))
	what := describe(args, id)
	if msg == "" {
		return fmt.Errorf("%s: %w", what, err)
	}
	if strings.Contains(msg, "does not exist") || strings.Contains(msg, "not found") {
		return fmt.Errorf("%s: %w: %s", what, errdefs.ErrNotFound, msg)
	}
	return fmt.Errorf("%s: %w: %s", what, err, msg)
}

// describe names a call in errors: "runc update c1", "crun features".
func describe(args []string, id string) string {
	what := filepath.Base(args[0]) + " " + Subcommand(args)
	if id != "" {
		what += " " + id
	}
	return what
}

// Message pulls msg="..." out of runc's logfmt stderr lines; other lines
// are kept as they are.
func Message(s string) string {
	var msgs []string
	for _, line := range strings.Split(s, "\n") {
		i := strings.Index(line, `msg="`)
		if i < 0 {
			if line = strings.TrimSpace(line); line != "" {
				msgs = append(msgs, line)
			}
			continue
		}
		rest := line[i+len(`msg="`):]
		if m, err := strconv.Unquote(`"` + rest); err == nil {
			msgs = append(msgs, m)
			continue
		}
		if j := strings.LastIndex(rest, `"`); j >= 0 {
			rest = rest[:j]
		}
		msgs = append(msgs, strings.ReplaceAll(rest, `\"`, `"`))
	}
	return strings.Join(msgs, "; ")
}

// Subcommand is the runtime subcommand args run ("?" when none is known),
// for errors and trace span names.
func Subcommand(args []string) string {
	for _, a := range args[1:] {
		switch a {
		case "create", "start", "kill", "delete", "state", "update", "exec", "checkpoint", "restore", "pause", "resume", "features":
			return a
		case "--version":
			return "version"
		}
	}
	return "?"
}
