// Package oci is berthd's OCI runtime (runc, crun): the calls berthd
// itself runs (state, delete, update, pause, resume, checkpoint, exec,
// features), each with the runtime's own --root and os/exec. The
// runtime's command line is package ocicli's, the one place that builds
// create, start, kill, delete, restore and state (decision 2800); the
// monitor (internal/shim/monitor) drives the same ocicli with its own
// reaper-aware runner.
package oci

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/berthcri/berth/internal/oci/ocicli"
	"github.com/berthcri/berth/internal/tracing"
)

// Runtime is one OCI runtime: a binary, its state root and global options.
type Runtime struct {
	Binary  string
	Root    string
	Options []string
}

// New returns a runtime rooted at root (created on first use).
func New(binary, root string, options []string) *Runtime {
	return &Runtime{Binary: binary, Root: root, Options: options}
}

// State is what `runtime state` reports.
type State struct {
	ID      string    `json:"id"`
	Pid     int       `json:"pid"`
	Status  string    `json:"status"` // creating, created, running, paused, stopped
	Bundle  string    `json:"bundle"`
	Created time.Time `json:"created"`
}

// CLI is r's command line run with os/exec, each call traced: what
// berthd's calls go through, and what tests and benchmarks create, start
// and kill containers with.
func (r *Runtime) CLI() *ocicli.Runtime {
	return &ocicli.Runtime{Binary: r.Binary, Root: r.Root, Options: r.Options, Run: Exec}
}

func (r *Runtime) args(sub ...string) []string {
	return ocicli.Args(r.Binary, r.Root, r.Options, sub...)
}

func (r *Runtime) run(ctx context.Context, id string, args []string, stdin, stdout, stderr *os.File) error {
	return r.CLI().Call(ctx, &ocicli.Cmd{ID: id, Args: args, Stdin: stdin, Stdout: stdout, Stderr: stderr})
}

// Delete removes the container from the runtime; force kills it first.
// A container the runtime does not know is not an error.
func (r *Runtime) Delete(ctx context.Context, id string, force bool) error {
	return r.CLI().Delete(ctx, id, force)
}

// State reports the runtime's view of the container.
func (r *Runtime) State(ctx context.Context, id string) (*State, error) {
	data, err := r.CLI().State(ctx, id)
	if err != nil {
		return nil, err
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

// Exec is the ocicli.Runner berthd runs the runtime with: os/exec, the
// runtime's stderr kept for errors, each call a trace span.
func Exec(ctx context.Context, c *ocicli.Cmd) ([]byte, error) {
	ctx, span := tracing.Start(ctx, "oci."+ocicli.Subcommand(c.Args), tracing.AttrContainerID.String(c.ID))
	cmd := exec.CommandContext(ctx, c.Args[0], c.Args[1:]...)
	cmd.SysProcAttr = c.Sys
	var errBuf bytes.Buffer
	if c.Stdin != nil {
		cmd.Stdin = c.Stdin
	}
	if c.Stdout != nil {
		cmd.Stdout = c.Stdout
	}
	if c.Stderr != nil {
		cmd.Stderr = c.Stderr
	} else {
		cmd.Stderr = &errBuf
	}
	err := cmd.Run()
	tracing.End(span, err)
	return errBuf.Bytes(), err
}
