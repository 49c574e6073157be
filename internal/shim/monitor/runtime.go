package monitor

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/oci/ocicli"
	"github.com/berthcri/berth/internal/shim/proto"
)

// ociRuntime is the OCI runtime (runc, crun) a create request names: the
// command line is package ocicli's, the one berthd also drives (decision
// 2800); every call runs through the node's reaper.
func (r *reaper) ociRuntime(rt proto.Runtime) *ocicli.Runtime {
	return &ocicli.Runtime{Binary: rt.Binary, Root: rt.Root, Options: rt.Options, Run: r.runCmd}
}

// The bounds on one runtime call (decision 3300). A runtime that never
// returns (stuck on a frozen cgroup, a hook, a lock, a disk) must not
// hold a request of the node's monitor for ever: once its bound passes
// the call is killed with its process group and fails Unavailable,
// saying so. Start, kill, delete and state take milliseconds, seconds on
// a loaded node; create runs the image's hooks and the kubelet gives up
// after 2 minutes; restore runs CRIU over a whole checkpoint.
const (
	runtimeCallTimeout    = 30 * time.Second
	runtimeCreateTimeout  = 2 * time.Minute
	runtimeRestoreTimeout = 5 * time.Minute
)

// runtimeTimeout is the bound of the runtime call args.
func runtimeTimeout(args []string) time.Duration {
	switch ocicli.Subcommand(args) {
	case "create":
		return runtimeCreateTimeout
	case "restore":
		return runtimeRestoreTimeout
	}
	return runtimeCallTimeout
}

// runCmd is the ocicli.Runner of the monitor: fork and exec, and wait
// through the reaper (never os/exec, which the monitor does not link),
// within the call's bound.
func (r *reaper) runCmd(ctx context.Context, c *ocicli.Cmd) ([]byte, error) {
	d := runtimeTimeout(c.Args)
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	errOut, err := r.run(ctx, c.Args, c.Sys, c.Stdin, c.Stdout, c.Stderr)
	if errors.Is(err, errRuntimeHung) {
		return nil, fmt.Errorf("%w (bound %v): %w", err, d, errdefs.ErrUnavailable)
	}
	return errOut, err
}

// runtimeStep runs the OCI runtime to make a container's init process:
// `create` (createStep), or at the start of a container restored from a
// checkpoint `restore --detach` (restoreStep). The runtime forks the init
// with o's stdio (or hands its pty to o.ConsoleSocket) and writes its pid
// to o.PidFile.
type runtimeStep func(rt *ocicli.Runtime, id string, o ocicli.CreateOpts) error

// createStep runs `create`; the runtime dies with the monitor.
func createStep(rt *ocicli.Runtime, id string, o ocicli.CreateOpts) error {
	o.Sys = diesWithMonitor()
	return rt.Create(context.Background(), id, o)
}

// restoreStep restores the checkpoint cr names with `restore --detach`.
func restoreStep(cr *proto.CreateRequest) runtimeStep {
	return func(rt *ocicli.Runtime, id string, o ocicli.CreateOpts) error {
		return rt.Restore(context.Background(), id, ocicli.RestoreOpts{
			Bundle: o.Bundle, PidFile: o.PidFile, ImagePath: cr.Restore, CRIU: cr.CRIU,
			Stdin: o.Stdin, Stdout: o.Stdout, Stderr: o.Stderr,
		})
	}
}

// diesWithMonitor makes the runtime's create die with the monitor
// (SIGKILL as the monitor's exit reparents it), so a create the
// monitor's crash cut cannot finish later: by the time berthd undoes it
// (after the keeper reaped this monitor: the next one answers, or says it
// does not serve the pod), the runtime either holds the container, its
// state saved before its init may run (runc saves state.json before it
// lets the init go on, runc#2575), or never will; the undo's
// `delete --force` then finds what there is to find. The signal comes
// with the death of the thread that forked, and the monitor's threads end
// only with it (it locks no goroutine to a thread). Not for start, kill
// or delete: those are asked again, and a start cut is read back from the
// runtime's state; nor (yet) for restore, whose CRIU outlives runc. The
// container's init, the runtime's child, does not inherit the setting
// (fork clears it).
func diesWithMonitor() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
