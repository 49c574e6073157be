package server

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/oci/ocicli"
)

// ociRuntime drives the OCI runtime CLI (runc, crun) for the shim: create,
// start, kill and delete. It mirrors internal/oci (which berthd uses) but
// runs everything through the shim's reaper and needs no encoding/json,
// os/exec or runtime-spec types.
type ociRuntime struct {
	binary  string
	root    string
	options []string
	reaper  *reaper
}

func (r *ociRuntime) args(sub ...string) []string {
	return ocicli.Args(r.binary, r.root, r.options, sub...)
}

func (r *ociRuntime) run(id string, args []string, stdin, stdout, stderr *os.File) error {
	return r.runWith(id, args, nil, stdin, stdout, stderr)
}

// runWith is run with process attributes for the runtime's process.
func (r *ociRuntime) runWith(id string, args []string, sys *syscall.SysProcAttr, stdin, stdout, stderr *os.File) error {
	if err := os.MkdirAll(r.root, 0o700); err != nil {
		return fmt.Errorf("create runtime root %s: %w", r.root, err)
	}
	errOut, err := r.reaper.run(args, sys, stdin, stdout, stderr)
	if err != nil {
		return ocicli.Error(args, id, errOut, err)
	}
	return nil
}

// createOpts are the arguments of create.
type createOpts struct {
	bundle, pidFile, consoleSocket string
	// Stdio of the runtime and so of the container's init (nil → /dev/null).
	stdin, stdout, stderr *os.File
}

// create runs `create`: the container's init waits for start.
func (r *ociRuntime) create(id string, o createOpts) error {
	args, logPath := ocicli.CreateArgs(r.args(), o.bundle, o.pidFile, o.consoleSocket, id)
	_ = os.Remove(logPath)
	stderr, closeNull, err := ocicli.OrDevNull(o.stderr)
	if err != nil {
		return fmt.Errorf("create %s: %w", id, err)
	}
	defer closeNull()
	if err := r.runWith(id, args, diesWithMonitor(), o.stdin, o.stdout, stderr); err != nil {
		return ocicli.WithLogError(err, logPath)
	}
	return nil
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

// restore runs a detached `restore` of a checkpoint: the restored init
// runs at once, with o's stdio standing in for the checkpointed pipes.
func (r *ociRuntime) restore(id string, o createOpts, imagePath, criu string) error {
	work := filepath.Join(o.bundle, "restore-work")
	if err := os.MkdirAll(work, 0o700); err != nil {
		return fmt.Errorf("restore %s: %w", id, err)
	}
	args, logPath := ocicli.RestoreArgs(r.args(), criu, o.bundle, imagePath, work, o.pidFile, id)
	_ = os.Remove(logPath)
	stderr, closeNull, err := ocicli.OrDevNull(o.stderr)
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
	if err := r.runWith(id, args, private, o.stdin, o.stdout, stderr); err != nil {
		return fmt.Errorf("%w (criu log %s: %s)", ocicli.WithLogError(err, logPath), filepath.Join(work, "restore.log"), criuErrors(filepath.Join(work, "restore.log")))
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

// status is the runtime's word on the container's state (created,
// running, stopped, …), read from `state`'s JSON without a JSON package
// (the shim stays lean, decision 1700).
func (r *ociRuntime) status(id string) (string, error) {
	f, err := os.CreateTemp("", "berth-shim-state-")
	if err != nil {
		return "", fmt.Errorf("state %s: %w", id, err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	if err := r.run(id, r.args("state", id), nil, f, nil); err != nil {
		return "", err
	}
	data, err := os.ReadFile(f.Name())
	if err != nil {
		return "", fmt.Errorf("state %s: %w", id, err)
	}
	return jsonString(data, "status"), nil
}

// jsonString finds the string value of key in a flat JSON object ("" if
// none): enough for the runtime's state, whose values hold no quotes.
func jsonString(data []byte, key string) string {
	i := bytes.Index(data, []byte(`"`+key+`"`))
	if i < 0 {
		return ""
	}
	rest := data[i+len(key)+2:]
	colon := bytes.IndexByte(rest, ':')
	if colon < 0 {
		return ""
	}
	rest = bytes.TrimLeft(rest[colon+1:], " \t\r\n")
	if len(rest) == 0 || rest[0] != '"' {
		return ""
	}
	end := bytes.IndexByte(rest[1:], '"')
	if end < 0 {
		return ""
	}
	return string(rest[1 : 1+end])
}

// start lets a created container's init exec the process.
func (r *ociRuntime) start(id string) error {
	return r.run(id, r.args("start", id), nil, nil, nil)
}

// kill sends sig to the container's init (all its processes when all).
func (r *ociRuntime) kill(id string, sig syscall.Signal, all bool) error {
	args := r.args("kill")
	if all {
		args = append(args, "--all")
	}
	args = append(args, id, strconv.Itoa(int(sig)))
	return r.run(id, args, nil, nil, nil)
}

// delete removes the container from the runtime; force kills it first.
// A container the runtime does not know is not an error.
func (r *ociRuntime) delete(id string, force bool) error {
	args := r.args("delete")
	if force {
		args = append(args, "--force")
	}
	err := r.run(id, append(args, id), nil, nil, nil)
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil
	}
	return err
}
