// Package oci is berthd's side of the OCI runtime (runc, crun): the
// os/exec Runner its calls run with (Exec: traced, the runtime's process
// group killed when a call's context ends), and what berthd reads and
// hands it in the runtime-spec's own types (state, features, update's
// resources, exec's process) through encoding/json, which the monitor
// does not link. Every command line is package ocicli's (decisions 2800,
// 3710); the monitor (internal/shim/monitor) drives the same ocicli with
// its reaper-aware runner.
package oci

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
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

// CLI is r's command line run with Exec: every call berthd, its tests
// and benchmarks make.
func (r *Runtime) CLI() *ocicli.Runtime {
	return &ocicli.Runtime{Binary: r.Binary, Root: r.Root, Options: r.Options, Run: Exec}
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
		return fmt.Errorf("update %s: encode resources: %w", id, err)
	}
	return r.CLI().Update(ctx, id, data)
}

// Pause freezes every process of the container (its freezer cgroup).
func (r *Runtime) Pause(ctx context.Context, id string) error {
	return r.CLI().Pause(ctx, id)
}

// Resume thaws a paused container.
func (r *Runtime) Resume(ctx context.Context, id string) error {
	return r.CLI().Resume(ctx, id)
}

// CheckpointOpts are the arguments of Checkpoint.
type CheckpointOpts = ocicli.CheckpointOpts

// Checkpoint dumps the container's processes with CRIU (ocicli's
// Checkpoint: no criu outlives ctx).
func (r *Runtime) Checkpoint(ctx context.Context, id string, o CheckpointOpts) error {
	return r.CLI().Checkpoint(ctx, id, o)
}

// ExecOpts are the arguments of Exec.
type ExecOpts = ocicli.ExecOpts

// Exec runs proc inside the container and, unless detached, waits for it.
func (r *Runtime) Exec(ctx context.Context, id string, proc *specs.Process, o ExecOpts) error {
	data, err := json.Marshal(proc)
	if err != nil {
		return fmt.Errorf("exec in %s: encode process: %w", id, err)
	}
	return r.CLI().Exec(ctx, id, data, o)
}

// Exec is the ocicli.Runner berthd runs the runtime with: os/exec, the
// runtime's stderr kept for errors, each call a trace span
// (oci.<subcommand>). When ctx ends the runtime is killed, with its
// process group when c.Group; c.WaitDelay bounds the wait for what its
// children still hold open.
func Exec(ctx context.Context, c *ocicli.Cmd) ([]byte, error) {
	ctx, span := tracing.Start(ctx, "oci."+ocicli.Subcommand(c.Args), tracing.AttrContainerID.String(c.ID))
	cmd := exec.CommandContext(ctx, c.Args[0], c.Args[1:]...)
	cmd.SysProcAttr = c.Sys
	if c.Group {
		sys := syscall.SysProcAttr{}
		if c.Sys != nil {
			sys = *c.Sys
		}
		sys.Setpgid = true
		cmd.SysProcAttr = &sys
		cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	}
	cmd.WaitDelay = c.WaitDelay
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

// Version is what `binary --version` prints, for runtimes no handler
// names yet (berthctl doctor); it takes at most 10 seconds.
func Version(ctx context.Context, binary string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	out, err := (&ocicli.Runtime{Binary: binary, Run: Exec}).Version(ctx)
	return string(out), err
}

// probeTimeout bounds the probes (features, --version): a hung runtime
// must not hold up daemon start.
const probeTimeout = 10 * time.Second
