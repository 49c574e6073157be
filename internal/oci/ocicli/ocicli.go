// Package ocicli drives an OCI runtime's command line (runc, crun). It is
// the one place berth builds the runtime's create, start, kill, delete,
// restore and state calls and reads their failures: the runtime's stderr,
// and the JSON log create and restore write (decision 2800). Its callers
// hand it the function that runs a command: berthd (internal/oci) runs
// it with os/exec, the monitor (internal/shim/monitor) with its
// reaper-aware runner. It imports nothing heavier than errdefs: the
// monitor's memory budget counts every linked package (decision 0303).
package ocicli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

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
}

// Runner runs c, waits for it and returns what it wrote to stderr when
// c.Stderr is nil.
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

// Args is the command line of one runtime call: the binary, its state
// root, the handler's options, then the subcommand and its arguments.
func Args(binary, root string, options []string, sub ...string) []string {
	a := []string{binary, "--root", root}
	a = append(a, options...)
	return append(a, sub...)
}

func (r *Runtime) args(sub ...string) []string {
	return Args(r.Binary, r.Root, r.Options, sub...)
}

// Call runs c with r's Runner in r's state root (created on first use);
// a failure is described by Error.
func (r *Runtime) Call(ctx context.Context, c *Cmd) error {
	if err := os.MkdirAll(r.Root, 0o700); err != nil {
		return fmt.Errorf("create runtime root %s: %w", r.Root, err)
	}
	errOut, err := r.Run(ctx, c)
	if err != nil {
		return Error(c.Args, c.ID, errOut, err)
	}
	return nil
}

// CreateOpts are the arguments of Create.
type CreateOpts struct {
	Bundle  string
	PidFile string
	// ConsoleSocket receives the pty master when the spec asks for a terminal.
	ConsoleSocket string
	// Stdio of the runtime and so of the container's init (nil → /dev/null).
	Stdin, Stdout, Stderr *os.File
	// Sys, when set, are attributes of the runtime's process (the
	// monitor's create dies with it).
	Sys *syscall.SysProcAttr
}

// Create runs `create`: the container's init waits for Start. The
// runtime's stderr is the container's, so it logs its own errors as JSON
// to runtime.log in the bundle, and a failure says what they were.
func (r *Runtime) Create(ctx context.Context, id string, o CreateOpts) error {
	args, logPath := createArgs(r.args(), o.Bundle, o.PidFile, o.ConsoleSocket, id)
	_ = os.Remove(logPath)
	stderr, closeNull, err := orDevNull(o.Stderr)
	if err != nil {
		return fmt.Errorf("create %s: %w", id, err)
	}
	defer closeNull()
	c := &Cmd{ID: id, Args: args, Sys: o.Sys, Stdin: o.Stdin, Stdout: o.Stdout, Stderr: stderr}
	if err := r.Call(ctx, c); err != nil {
		return withLogError(err, logPath)
	}
	return nil
}

// createArgs completes base (from Args, without a subcommand) into a
// `create` of container id, logging as JSON to logPath, in the bundle.
func createArgs(base []string, bundle, pidFile, consoleSocket, id string) (args []string, logPath string) {
	logPath = filepath.Join(bundle, "runtime.log")
	args = append(base, "--log", logPath, "--log-format", "json", "create", "--bundle", bundle)
	if pidFile != "" {
		args = append(args, "--pid-file", pidFile)
	}
	if consoleSocket != "" {
		args = append(args, "--console-socket", consoleSocket)
	}
	return append(args, id), logPath
}

// Start lets a created container's init exec the process.
func (r *Runtime) Start(ctx context.Context, id string) error {
	return r.Call(ctx, &Cmd{ID: id, Args: r.args("start", id)})
}

// Kill sends sig to the container's init (all its processes when all).
func (r *Runtime) Kill(ctx context.Context, id string, sig syscall.Signal, all bool) error {
	args := r.args("kill")
	if all {
		args = append(args, "--all")
	}
	args = append(args, id, strconv.Itoa(int(sig)))
	return r.Call(ctx, &Cmd{ID: id, Args: args})
}

// Delete removes the container from the runtime; force kills it first.
// A container the runtime does not know is not an error.
func (r *Runtime) Delete(ctx context.Context, id string, force bool) error {
	args := r.args("delete")
	if force {
		args = append(args, "--force")
	}
	err := r.Call(ctx, &Cmd{ID: id, Args: append(args, id)})
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil
	}
	return err
}

// State returns what `state` prints: the runtime's view of the container
// as JSON (OCI runtime-spec runtime.md).
func (r *Runtime) State(ctx context.Context, id string) ([]byte, error) {
	out, err := os.CreateTemp("", "berth-state-")
	if err != nil {
		return nil, fmt.Errorf("state %s: %w", id, err)
	}
	defer os.Remove(out.Name())
	defer out.Close()
	if err := r.Call(ctx, &Cmd{ID: id, Args: r.args("state", id), Stdout: out}); err != nil {
		return nil, err
	}
	data, err := os.ReadFile(out.Name())
	if err != nil {
		return nil, fmt.Errorf("state %s: %w", id, err)
	}
	return data, nil
}

// Status is the runtime's word on the container's state (created,
// running, stopped, …), read from State's JSON without a JSON package.
func (r *Runtime) Status(ctx context.Context, id string) (string, error) {
	data, err := r.State(ctx, id)
	if err != nil {
		return "", err
	}
	return jsonString(data, "status"), nil
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
	what := filepath.Base(args[0]) + " " + Subcommand(args) + " " + id
	if msg == "" {
		return fmt.Errorf("%s: %w", what, err)
	}
	if strings.Contains(msg, "does not exist") || strings.Contains(msg, "not found") {
		return fmt.Errorf("%s: %w: %s", what, errdefs.ErrNotFound, msg)
	}
	return fmt.Errorf("%s: %v: %s", what, err, msg)
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

// Subcommand is the runtime subcommand args run ("?" when none is known).
func Subcommand(args []string) string {
	for _, a := range args[1:] {
		switch a {
		case "create", "start", "kill", "delete", "state", "update", "exec", "checkpoint", "restore", "pause", "resume":
			return a
		}
	}
	return "?"
}
