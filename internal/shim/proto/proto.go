// Package proto is the berth-shim protocol (decision 0300): its messages,
// their one codec, and what else berth-shim and its client (package shim)
// must agree on: operation names, error kinds, statuses, attach frames and
// file paths. Both sides build on it, so the two cannot drift apart. It
// imports nothing heavy (no net, no encoding/json) because the berth-shim
// binary does (decision 0303: every package's init and data cost the
// node's keeper and monitor memory, shared by every pod).
package proto

import (
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
)

// Operations.
const (
	OpCreate    = "create"
	OpStart     = "start"
	OpKill      = "kill"
	OpState     = "state"
	OpWait      = "wait"
	OpDelete    = "delete"
	OpReopenLog = "reopen-log"
	OpAttach    = "attach"
	OpPing      = "ping"
	// OpShutdown, on a pod's socket, ends a pod that holds no container;
	// on the node's, stops a monitor that serves no pod (berthd's
	// recovery uses both for what a launch just before a crash left).
	OpShutdown = "shutdown"
	// OpAddPod, on the node's socket, makes the monitor serve the pod
	// whose state dir is the request's dir on that dir's own socket
	// (decision 1701).
	OpAddPod = "add-pod"
	// OpLazyHold, on the node's socket: the keeper is to hold a lazy
	// layer's FUSE connection (decision 3600, S4): ID the chain ID, Dir
	// the layer dir, the connection's /dev/fuse fd riding along as
	// SCM_RIGHTS (the only request that carries one). A second hold of
	// one ID replaces the first.
	OpLazyHold = "lazy-hold"
	// OpLazyDrop, on the node's socket: the layer ID is gone (unmounted);
	// the keeper closes its fd. Dropping a layer not held is no error.
	OpLazyDrop = "lazy-drop"
	// OpLazyList, on the node's socket: the chain IDs held, in IDs.
	OpLazyList = "lazy-list"
)

// Error kinds in a response's "kind"; ErrorResponse and Response.Err map
// them to and from errdefs.
const (
	KindNotFound           = "not_found"
	KindAlreadyExists      = "already_exists"
	KindFailedPrecondition = "failed_precondition"
	KindUnavailable        = "unavailable"
	KindInvalidArgument    = "invalid_argument"
)

// Container states the monitor reports.
const (
	StatusCreated = "created"
	StatusRunning = "running"
	StatusExited  = "exited"
)

// Attach frame kinds.
const (
	FrameStdin      byte = 0
	FrameStdout     byte = 1
	FrameStderr     byte = 2
	FrameResize     byte = 3 // payload: width, height as two big-endian uint16
	FrameCloseStdin byte = 4
)

// MaxMessage bounds one JSON message and one frame; requests are small.
const MaxMessage = 1 << 20

// ExitVersion is the version of the exit file format.
const ExitVersion = 1

// NodeDir is the node monitor's directory beside the pods' (shims is
// berthd's shim state dir); the dot keeps it out of the pod listing.
func NodeDir(shims string) string { return filepath.Join(shims, ".node") }

// NodeSocketPath is the node monitor's own socket (add-pod, ping,
// shutdown) in the node dir.
func NodeSocketPath(nodeDir string) string { return filepath.Join(nodeDir, "node.sock") }

// LaunchLockPath is the node dir's launch lock (flock): one launch of a
// keeper and monitor at a time, held from berthd's launch until the first
// monitor listens.
func LaunchLockPath(nodeDir string) string { return filepath.Join(nodeDir, "launch.lock") }

// KeeperLockPath is the file the node's keeper holds a flock on for its
// whole life: while it is held, a keeper lives on the node dir (restarting
// its monitor, maybe), and a launch waits for that monitor rather than
// starting a second keeper there.
func KeeperLockPath(nodeDir string) string { return filepath.Join(nodeDir, "keeper.lock") }

// SocketPath is a pod's socket in the pod's dir (<shims>/<pod-id>), on
// which the node's monitor serves it.
func SocketPath(dir string) string { return filepath.Join(dir, "shim.sock") }

// ExitPath is where the monitor persists a container's exit, in its
// pod's dir.
func ExitPath(dir, id string) string { return filepath.Join(dir, "exits", id+".json") }

// WriteFrame writes one attach frame.
func WriteFrame(w io.Writer, kind byte, payload []byte) error {
	buf := make([]byte, 5+len(payload))
	buf[0] = kind
	binary.BigEndian.PutUint32(buf[1:], uint32(len(payload)))
	copy(buf[5:], payload)
	_, err := w.Write(buf)
	return err
}

// ReadFrame reads one attach frame into buf (grown when too small).
func ReadFrame(r io.Reader, buf []byte) (byte, []byte, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n > MaxMessage {
		return 0, nil, fmt.Errorf("frame of %d bytes exceeds %d", n, MaxMessage)
	}
	if int(n) > cap(buf) {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	if _, err := io.ReadFull(r, buf); err != nil {
		return 0, nil, err
	}
	return hdr[0], buf, nil
}

// maxSunPath is the usable length of a unix socket path.
const maxSunPath = 107

// WithShortPath calls fn with a path to the same file short enough for a
// unix socket address: when path is too long it goes through
// /proc/self/fd/<dirfd>/<name>, which the kernel resolves like the original.
func WithShortPath(path string, fn func(string) error) error {
	if len(path) <= maxSunPath {
		return fn(path)
	}
	dir, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer dir.Close()
	return fn("/proc/self/fd/" + strconv.Itoa(int(dir.Fd())) + "/" + filepath.Base(path))
}
