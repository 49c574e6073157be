package ocicli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// RestoreOpts are the arguments of Restore.
type RestoreOpts struct {
	Bundle, PidFile string
	// ImagePath holds the checkpoint's CRIU images.
	ImagePath string
	// CRIU, when set, is the criu binary (runc's global --criu).
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
	args, logPath := restoreArgs(r.args(), o.CRIU, o.Bundle, o.ImagePath, work, o.PidFile, id)
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
	if err := r.Call(ctx, c); err != nil {
		criuLog := filepath.Join(work, "restore.log")
		return fmt.Errorf("%w (criu log %s: %s)", withLogError(err, logPath), criuLog, criuErrors(criuLog))
	}
	return nil
}

// restoreArgs completes base (from Args, without a subcommand) into a
// detached `restore` of container id from the CRIU images in imagePath.
func restoreArgs(base []string, criu, bundle, imagePath, workPath, pidFile, id string) (args []string, logPath string) {
	logPath = filepath.Join(bundle, "runtime.log")
	if criu != "" {
		base = append(base, "--criu", criu)
	}
	args = append(base, "--log", logPath, "--log-format", "json", "restore", "--detach",
		"--bundle", bundle, "--image-path", imagePath, "--work-path", workPath, "--pid-file", pidFile)
	return append(args, id), logPath
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
