package server

import (
	"errors"
	"fmt"
	"os"
	"strconv"
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
	if err := os.MkdirAll(r.root, 0o700); err != nil {
		return fmt.Errorf("create runtime root %s: %w", r.root, err)
	}
	errOut, err := r.reaper.run(args, stdin, stdout, stderr)
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
	if err := r.run(id, args, o.stdin, o.stdout, stderr); err != nil {
		return ocicli.WithLogError(err, logPath)
	}
	return nil
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
