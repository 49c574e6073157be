// Package oci drives an OCI runtime CLI (runc, crun): create, start, kill,
// delete, state, update and exec, each with the runtime's own --root.
// berth-shim has its own smaller copy of create/start/kill/delete
// (internal/shim/server) to stay lean; both read the runtime's errors
// through internal/oci/ocicli.
package oci

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/oci/ocicli"
	"github.com/berthcri/berth/internal/tracing"
)

// Runner runs the runtime binary with args and the given stdio (nil means
// /dev/null) and returns what it wrote to stderr. berth-shim supplies its own
// because, as a subreaper, it reaps every child itself.
type Runner interface {
	Run(ctx context.Context, argv []string, stdin, stdout, stderr *os.File) (errOut []byte, err error)
}

// Runtime is one OCI runtime: a binary, its state root and global options.
type Runtime struct {
	Binary  string
	Root    string
	Options []string
	// Runner defaults to os/exec.
	Runner Runner
}

// New returns a runtime rooted at root (created on first use).
func New(binary, root string, options []string) *Runtime {
	return &Runtime{Binary: binary, Root: root, Options: options}
}

// CreateOpts are the arguments of Create.
type CreateOpts struct {
	Bundle  string
	PidFile string
	// ConsoleSocket receives the pty master when the spec asks for a terminal.
	ConsoleSocket string
	// Stdio of the runtime and so of the container's init (nil → /dev/null).
	Stdin, Stdout, Stderr *os.File
}

// State is what `runtime state` reports.
type State struct {
	ID      string    `json:"id"`
	Pid     int       `json:"pid"`
	Status  string    `json:"status"` // creating, created, running, paused, stopped
	Bundle  string    `json:"bundle"`
	Created time.Time `json:"created"`
}

func (r *Runtime) args(sub ...string) []string {
	return ocicli.Args(r.Binary, r.Root, r.Options, sub...)
}

func (r *Runtime) run(ctx context.Context, id string, args []string, stdin, stdout, stderr *os.File) error {
	if err := os.MkdirAll(r.Root, 0o700); err != nil {
		return fmt.Errorf("create runtime root %s: %w", r.Root, err)
	}
	runner := r.Runner
	if runner == nil {
		runner = execRunner{}
	}
	ctx, span := tracing.Start(ctx, "oci."+ocicli.Subcommand(args), tracing.AttrContainerID.String(id))
	errOut, err := runner.Run(ctx, args, stdin, stdout, stderr)
	tracing.End(span, err)
	if err != nil {
		return ocicli.Error(args, id, errOut, err)
	}
	return nil
}

// Create runs `create`: the container's init waits for Start.
func (r *Runtime) Create(ctx context.Context, id string, o CreateOpts) error {
	args, logPath := ocicli.CreateArgs(r.args(), o.Bundle, o.PidFile, o.ConsoleSocket, id)
	_ = os.Remove(logPath)
	stderr, closeNull, err := ocicli.OrDevNull(o.Stderr)
	if err != nil {
		return fmt.Errorf("create %s: %w", id, err)
	}
	defer closeNull()
	if err := r.run(ctx, id, args, o.Stdin, o.Stdout, stderr); err != nil {
		return ocicli.WithLogError(err, logPath)
	}
	return nil
}

// Start lets a created container's init exec the process.
func (r *Runtime) Start(ctx context.Context, id string) error {
	return r.run(ctx, id, r.args("start", id), nil, nil, nil)
}

// Kill sends sig to the container's init (all its processes when all).
func (r *Runtime) Kill(ctx context.Context, id string, sig syscall.Signal, all bool) error {
	args := r.args("kill")
	if all {
		args = append(args, "--all")
	}
	args = append(args, id, strconv.Itoa(int(sig)))
	return r.run(ctx, id, args, nil, nil, nil)
}

// Delete removes the container from the runtime; force kills it first.
// A container the runtime does not know is not an error.
func (r *Runtime) Delete(ctx context.Context, id string, force bool) error {
	args := r.args("delete")
	if force {
		args = append(args, "--force")
	}
	err := r.run(ctx, id, append(args, id), nil, nil, nil)
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil
	}
	return err
}

// State reports the runtime's view of the container.
func (r *Runtime) State(ctx context.Context, id string) (*State, error) {
	out, err := os.CreateTemp("", "berth-state-")
	if err != nil {
		return nil, fmt.Errorf("state %s: %w", id, err)
	}
	defer os.Remove(out.Name())
	defer out.Close()
	if err := r.run(ctx, id, r.args("state", id), nil, out, nil); err != nil {
		return nil, err
	}
	data, err := os.ReadFile(out.Name())
	if err != nil {
		return nil, fmt.Errorf("state %s: %w", id, err)
	}
	var st State
	if err := json.Unmarshal(data, &st); err != nil {
		return nil, fmt.Errorf("parse state of %s: %w", id, err)
	}
	return &st, nil
}

// Update applies new cgroup limits to a running container.
func (r *Runtime) Update(ctx context.Context, id string, res *specs.LinuxResources) error {
	data, err := json.Marshal(res)
	if err != nil {
		return fmt.Errorf("encode resources: %w", err)
	}
	in, err := os.CreateTemp("", "berth-resources-")
	if err != nil {
		return fmt.Errorf("update %s: %w", id, err)
	}
	defer os.Remove(in.Name())
	defer in.Close()
	if _, err := in.Write(data); err != nil {
		return fmt.Errorf("update %s: %w", id, err)
	}
	return r.run(ctx, id, r.args("update", "--resources", in.Name(), id), nil, nil, nil)
}

// Pause freezes every process of the container (its freezer cgroup).
func (r *Runtime) Pause(ctx context.Context, id string) error {
	return r.run(ctx, id, r.args("pause", id), nil, nil, nil)
}

// Resume thaws a paused container.
func (r *Runtime) Resume(ctx context.Context, id string) error {
	return r.run(ctx, id, r.args("resume", id), nil, nil, nil)
}

// CheckpointOpts are the arguments of Checkpoint.
type CheckpointOpts struct {
	// CRIU is the criu binary ("" → the runtime's default).
	CRIU string
	// ImagePath receives CRIU's images; WorkPath its log (dump.log) and
	// statistics.
	ImagePath, WorkPath string
	// LeaveRunning keeps the container running after the dump (else CRIU
	// kills it).
	LeaveRunning bool
}

// Checkpoint dumps the container's processes with CRIU. A paused
// container stays paused (CRIU restores the freezer state it found).
// The runtime and its criu run in a process group of their own, killed
// whole when ctx ends, so no criu outlives a deadline.
func (r *Runtime) Checkpoint(ctx context.Context, id string, o CheckpointOpts) error {
	opts := append([]string(nil), r.Options...)
	if o.CRIU != "" {
		opts = append(opts, "--criu", o.CRIU)
	}
	args := ocicli.Args(r.Binary, r.Root, opts, "checkpoint", "--image-path", o.ImagePath, "--work-path", o.WorkPath)
	if o.LeaveRunning {
		args = append(args, "--leave-running")
	}
	args = append(args, id)
	ctx, span := tracing.Start(ctx, "criu.checkpoint", tracing.AttrContainerID.String(id))
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	var errBuf bytes.Buffer
	cmd.Stderr = &errBuf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	tracing.End(span, err)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("checkpoint %s: %w", id, ctx.Err())
		}
		return ocicli.Error(args, id, errBuf.Bytes(), err)
	}
	return nil
}

// ExecOpts are the arguments of Exec.
type ExecOpts struct {
	Detach                bool
	PidFile               string
	ConsoleSocket         string
	Stdin, Stdout, Stderr *os.File
}

// Exec runs proc inside the container and, unless detached, waits for it.
func (r *Runtime) Exec(ctx context.Context, id string, proc *specs.Process, o ExecOpts) error {
	data, err := json.Marshal(proc)
	if err != nil {
		return fmt.Errorf("encode process: %w", err)
	}
	pf, err := os.CreateTemp("", "berth-process-")
	if err != nil {
		return fmt.Errorf("exec in %s: %w", id, err)
	}
	defer os.Remove(pf.Name())
	defer pf.Close()
	if _, err := pf.Write(data); err != nil {
		return fmt.Errorf("exec in %s: %w", id, err)
	}
	args := r.args("exec", "--process", pf.Name())
	if o.Detach {
		args = append(args, "--detach")
	}
	if o.PidFile != "" {
		args = append(args, "--pid-file", o.PidFile)
	}
	if o.ConsoleSocket != "" {
		args = append(args, "--console-socket", o.ConsoleSocket)
	}
	return r.run(ctx, id, append(args, id), o.Stdin, o.Stdout, o.Stderr)
}

// execRunner runs the runtime with os/exec, keeping stderr for errors.
type execRunner struct{}

func (execRunner) Run(ctx context.Context, argv []string, stdin, stdout, stderr *os.File) ([]byte, error) {
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	var errBuf bytes.Buffer
	if stdin != nil {
		cmd.Stdin = stdin
	}
	if stdout != nil {
		cmd.Stdout = stdout
	}
	if stderr != nil {
		cmd.Stderr = stderr
	} else {
		cmd.Stderr = &errBuf
	}
	err := cmd.Run()
	return errBuf.Bytes(), err
}
