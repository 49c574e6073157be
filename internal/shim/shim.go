// Package shim is the client berthd uses to talk to berth-shim, and how it
// launches it. berth-shim runs as two processes per node (decision 1701):
// the keeper (package shim/keeper: the subreaper every container init
// reparents to, holding a copy of each container's stdio) and its child
// the monitor (package shim/monitor: one process serving every pod on the
// pod's own socket, writing CRI logs, persisting exits). A Client talks
// to one pod the monitor serves; the protocol, its messages and their one
// codec, is package shim/proto (decision 0300).
package shim

import (
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"

	"github.com/berthcri/berth/internal/shim/proto"
)

// The messages a Client takes and returns are the protocol's own.
type (
	// Runtime names the OCI runtime a container runs with.
	Runtime = proto.Runtime
	// CreateRequest is what Create needs.
	CreateRequest = proto.CreateRequest
	// State is a container as the monitor sees it.
	State = proto.State
	// Exit is a container's exit, as the monitor persists it.
	Exit = proto.Exit
)

// A State's Status, and the frames a Stream's Recv returns.
const (
	StatusCreated = proto.StatusCreated
	StatusRunning = proto.StatusRunning
	StatusExited  = proto.StatusExited

	FrameStdout = proto.FrameStdout
	FrameStderr = proto.FrameStderr
)

// ReadExit reads the exit the monitor persisted for container id in the
// pod dir dir; ok
// is false when there is none (the container has not exited, or is gone).
func ReadExit(dir, id string) (*Exit, bool, error) {
	data, err := os.ReadFile(proto.ExitPath(dir, id))
	if errors.Is(err, os.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	e, err := proto.DecodeExit(data)
	if err != nil {
		return nil, false, fmt.Errorf("parse exit of %s: %w", id, err)
	}
	return e, true, nil
}

// dialUnix connects to path, however long.
func dialUnix(path string) (*net.UnixConn, error) {
	var c *net.UnixConn
	err := proto.WithShortPath(path, func(p string) error {
		conn, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: p, Net: "unix"})
		c = conn
		return err
	})
	return c, err
}

// isGone reports whether a dial error means no monitor is listening
// (on the pod's socket or the node's).
func isGone(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT)
}
