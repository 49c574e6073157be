package ocicli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

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

// checkpointWaitDelay bounds the wait for CRIU's children that still hold
// the runtime's stderr once the runtime is gone.
const checkpointWaitDelay = 5 * time.Second

// Checkpoint dumps the container's processes with CRIU. A paused
// container stays paused (CRIU restores the freezer state it found). The
// runtime and its criu run in a process group of their own, killed whole
// when ctx ends, so no criu outlives a deadline.
func (r *Runtime) Checkpoint(ctx context.Context, id string, o CheckpointOpts) error {
	args := r.args(r.criu(o.CRIU), "checkpoint", "--image-path", o.ImagePath, "--work-path", o.WorkPath)
	if o.LeaveRunning {
		args = append(args, "--leave-running")
	}
	return r.call(ctx, &Cmd{ID: id, Args: append(args, id), Group: true, WaitDelay: checkpointWaitDelay})
}

// criu is the global option naming the criu binary: runc's --criu (which
// runc 1.2 and later ignore, with a warning: they take criu from PATH).
// crun has no such option (it links libcriu) and refuses it, so it gets
// none.
func (r *Runtime) criu(path string) []string {
	if path == "" || strings.HasPrefix(filepath.Base(r.Binary), "crun") {
		return nil
	}
	return []string{"--criu", path}
}

// RestoreOpts are the arguments of Restore.
type RestoreOpts struct {
	Bundle, PidFile string
	// ImagePath holds the checkpoint's CRIU images.
	ImagePath string
	// CRIU, when set, is the criu binary (see Runtime.criu).
	CRIU string
	// Stdio standing in for the checkpointed pipes (nil → /dev/null).
	Stdin, Stdout, Stderr *os.File
}

// Restore runs a detached `restore` of a checkpoint (KEP-2008): the
// restored init runs at once, reparented to the caller's subreaper like a
// created one. CRIU's own files go to restore-work in the bundle; the
// runtime logs its errors as JSON to runtime.log there, as Create does,
// and a failure says what they and CRIU's log were.
func (r *Runtime) Restore(ctx context.Context, id string, o RestoreOpts) error {
	work := filepath.Join(o.Bundle, "restore-work")
	if err := os.MkdirAll(work, 0o700); err != nil {
		return fmt.Errorf("restore %s: %w", id, err)
	}
	logPath := filepath.Join(o.Bundle, "runtime.log")
	args := r.args(append(r.criu(o.CRIU), jsonLog(logPath)...), "restore", "--detach",
		"--bundle", o.Bundle, "--image-path", o.ImagePath, "--work-path", work, "--pid-file", o.PidFile, id)
	_ = os.Remove(logPath)
	stderr, closeNull, err := orDevNull(o.Stderr)
	if err != nil {
		return fmt.Errorf("restore %s: %w", id, err)
	}
	defer closeNull()
	// CRIU mounts a "cgroup yard" of every controller (hugetlb too, which
	// this node may not mount) under the work path while it restores. In
	// the node's mount namespace other runtimes' runc and kubelets would
	// see those mounts and create cgroups in them: so runc and CRIU run in
	// a private copy of it (Go makes / rprivate in the child).
	private := &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	c := &Cmd{ID: id, Args: args, Sys: private, Stdin: o.Stdin, Stdout: o.Stdout, Stderr: stderr}
	if err := r.call(ctx, c); err != nil {
		criuLog := filepath.Join(work, "restore.log")
		return fmt.Errorf("%w (criu log %s: %s)", withLogError(err, logPath), criuLog, criuErrors(criuLog))
	}
	return nil
}

// criuErrors is what a CRIU log says went wrong: its "Error" lines (the
// last few), else its end.
func criuErrors(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	var errs []string
	for _, line := range strings.Split(string(data), "\n") {
		if strings.Contains(line, "Error") {
			errs = append(errs, strings.TrimSpace(line))
		}
	}
	if len(errs) > 4 {
		errs = errs[len(errs)-4:]
	}
	if len(errs) > 0 {
		return strings.Join(errs, "; ")
	}
	if len(data) > 400 {
		data = data[len(data)-400:]
	}
	return string(data)
}
