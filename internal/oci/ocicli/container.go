package ocicli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/berthcri/berth/internal/errdefs"
)

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
	logPath := filepath.Join(o.Bundle, "runtime.log")
	args := r.args(jsonLog(logPath), "create", "--bundle", o.Bundle)
	if o.PidFile != "" {
		args = append(args, "--pid-file", o.PidFile)
	}
	if o.ConsoleSocket != "" {
		args = append(args, "--console-socket", o.ConsoleSocket)
	}
	_ = os.Remove(logPath)
	stderr, closeNull, err := orDevNull(o.Stderr)
	if err != nil {
		return fmt.Errorf("create %s: %w", id, err)
	}
	defer closeNull()
	c := &Cmd{ID: id, Args: append(args, id), Sys: o.Sys, Stdin: o.Stdin, Stdout: o.Stdout, Stderr: stderr}
	if err := r.call(ctx, c); err != nil {
		return withLogError(err, logPath)
	}
	return nil
}

// jsonLog are the global options that make the runtime log its errors as
// JSON to path, where a failure's cause is read back (runc's stderr may
// be the container's).
func jsonLog(path string) []string {
	return []string{"--log", path, "--log-format", "json"}
}

// Start lets a created container's init exec the process.
func (r *Runtime) Start(ctx context.Context, id string) error {
	return r.call(ctx, &Cmd{ID: id, Args: r.args(nil, "start", id)})
}

// Kill sends sig to the container's init (all its processes when all).
func (r *Runtime) Kill(ctx context.Context, id string, sig syscall.Signal, all bool) error {
	args := r.args(nil, "kill")
	if all {
		args = append(args, "--all")
	}
	args = append(args, id, strconv.Itoa(int(sig)))
	return r.call(ctx, &Cmd{ID: id, Args: args})
}

// Delete removes the container from the runtime; force kills it first.
// A container the runtime does not know is not an error.
func (r *Runtime) Delete(ctx context.Context, id string, force bool) error {
	args := r.args(nil, "delete")
	if force {
		args = append(args, "--force")
	}
	err := r.call(ctx, &Cmd{ID: id, Args: append(args, id)})
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil
	}
	return err
}

// State returns what `state` prints: the runtime's view of the container
// as JSON (OCI runtime-spec runtime.md).
func (r *Runtime) State(ctx context.Context, id string) ([]byte, error) {
	return output(ctx, &Cmd{ID: id, Args: r.args(nil, "state", id)}, r.call)
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

// Pause freezes every process of the container (its freezer cgroup).
func (r *Runtime) Pause(ctx context.Context, id string) error {
	return r.call(ctx, &Cmd{ID: id, Args: r.args(nil, "pause", id)})
}

// Resume thaws a paused container.
func (r *Runtime) Resume(ctx context.Context, id string) error {
	return r.call(ctx, &Cmd{ID: id, Args: r.args(nil, "resume", id)})
}

// Update applies new cgroup limits to a running container: resources is
// an OCI LinuxResources as JSON, handed to the runtime in a file.
func (r *Runtime) Update(ctx context.Context, id string, resources []byte) error {
	path, remove, err := jsonFile(resources, "resources")
	if err != nil {
		return fmt.Errorf("update %s: %w", id, err)
	}
	defer remove()
	return r.call(ctx, &Cmd{ID: id, Args: r.args(nil, "update", "--resources", path, id)})
}

// ExecOpts are the arguments of Exec.
type ExecOpts struct {
	Detach        bool
	PidFile       string
	ConsoleSocket string
	// Stdio of the runtime and so of the process (nil → /dev/null; a nil
	// Stderr is the runtime's own, captured for its errors).
	Stdin, Stdout, Stderr *os.File
}

// Exec runs process (an OCI Process as JSON, handed to the runtime in a
// file) inside the container and, unless detached, waits for it.
func (r *Runtime) Exec(ctx context.Context, id string, process []byte, o ExecOpts) error {
	path, remove, err := jsonFile(process, "process")
	if err != nil {
		return fmt.Errorf("exec in %s: %w", id, err)
	}
	defer remove()
	args := r.args(nil, "exec", "--process", path)
	if o.Detach {
		args = append(args, "--detach")
	}
	if o.PidFile != "" {
		args = append(args, "--pid-file", o.PidFile)
	}
	if o.ConsoleSocket != "" {
		args = append(args, "--console-socket", o.ConsoleSocket)
	}
	return r.call(ctx, &Cmd{ID: id, Args: append(args, id), Stdin: o.Stdin, Stdout: o.Stdout, Stderr: o.Stderr})
}
