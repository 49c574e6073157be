// Package shim is berth-shim's protocol, its server (the shim process: one
// per pod, holding its containers' stdio, writing CRI logs, reaping exits)
// and the client berthd uses to talk to it.
//
// Protocol: a unix socket at <state>/shims/<pod-id>/shim.sock. Each message
// is a 4-byte big-endian length and a JSON body; a connection carries any
// number of request/response pairs. An "attach" request turns its connection
// into a stream of frames (1-byte kind, 4-byte length, payload) afterwards.
package shim

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
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
	// OpShutdown asks a shim that holds no container to exit (berthd's
	// recovery uses it for a shim launched just before a crash).
	OpShutdown = "shutdown"
)

// Error kinds in Response.Kind, mapped back to errdefs by the client.
const (
	KindNotFound           = "not_found"
	KindFailedPrecondition = "failed_precondition"
	KindUnavailable        = "unavailable"
	KindInvalidArgument    = "invalid_argument"
)

// Container states the shim reports.
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

// maxMessage bounds one JSON message; requests are small.
const maxMessage = 1 << 20

// Runtime names the OCI runtime a container runs with.
type Runtime struct {
	Binary  string   `json:"binary"`
	Root    string   `json:"root"`
	Options []string `json:"options,omitempty"`
}

// CreateRequest asks the shim to `runtime create` a bundle.
type CreateRequest struct {
	Bundle    string  `json:"bundle"`
	LogPath   string  `json:"log_path,omitempty"`
	Runtime   Runtime `json:"runtime"`
	Stdin     bool    `json:"stdin,omitempty"`
	StdinOnce bool    `json:"stdin_once,omitempty"`
	Terminal  bool    `json:"terminal,omitempty"`
}

// Request is one call.
type Request struct {
	Op     string         `json:"op"`
	ID     string         `json:"id,omitempty"`
	Create *CreateRequest `json:"create,omitempty"`
	Signal int            `json:"signal,omitempty"`
	All    bool           `json:"all,omitempty"`
	// Attach: which streams the client wants.
	Stdin  bool `json:"stdin,omitempty"`
	Stdout bool `json:"stdout,omitempty"`
	Stderr bool `json:"stderr,omitempty"`
}

// Exit is a container's exit, as persisted under <shim dir>/exits/<id>.json.
type Exit struct {
	Version   int       `json:"version"`
	ID        string    `json:"id"`
	Pid       int       `json:"pid"`
	Code      int       `json:"exit_code"`
	Signal    int       `json:"signal,omitempty"`
	OOMKilled bool      `json:"oom_killed,omitempty"`
	At        time.Time `json:"exited_at"`
	// Unknown is set by berthd, never the shim, for an exit nobody saw.
	Unknown string `json:"-"`
}

// exitVersion is the version of the Exit file format.
const exitVersion = 1

// State is a container as the shim sees it.
type State struct {
	ID     string `json:"id"`
	Pid    int    `json:"pid"`
	Status string `json:"status"`
	Exit   *Exit  `json:"exit,omitempty"`
}

// Response answers a Request.
type Response struct {
	Error string `json:"error,omitempty"`
	Kind  string `json:"kind,omitempty"`
	State *State `json:"state,omitempty"`
	// IDs lists the shim's containers (ping).
	IDs []string `json:"ids,omitempty"`
}

func writeMessage(w io.Writer, v any) error {
	body, err := json.Marshal(v)
	if err != nil {
		return err
	}
	buf := make([]byte, 4+len(body))
	binary.BigEndian.PutUint32(buf, uint32(len(body)))
	copy(buf[4:], body)
	_, err = w.Write(buf)
	return err
}

func readMessage(r io.Reader, v any) error {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n > maxMessage {
		return fmt.Errorf("message of %d bytes exceeds %d", n, maxMessage)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return err
	}
	return json.Unmarshal(body, v)
}

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
	if n > maxMessage {
		return 0, nil, fmt.Errorf("frame of %d bytes exceeds %d", n, maxMessage)
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

// SocketPath is the shim's socket in its directory.
func SocketPath(dir string) string { return filepath.Join(dir, "shim.sock") }

// ExitPath is where the shim persists a container's exit.
func ExitPath(dir, id string) string { return filepath.Join(dir, "exits", id+".json") }

// ReadExit reads a persisted exit; ok is false when there is none.
func ReadExit(dir, id string) (*Exit, bool, error) {
	data, err := os.ReadFile(ExitPath(dir, id))
	if errors.Is(err, os.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	var e Exit
	if err := json.Unmarshal(data, &e); err != nil {
		return nil, false, fmt.Errorf("parse exit of %s: %w", id, err)
	}
	return &e, true, nil
}

// maxSunPath is the usable length of a unix socket path.
const maxSunPath = 107

// withShortPath calls fn with a path to the same file short enough for a
// unix socket address: when path is too long it goes through
// /proc/self/fd/<dirfd>/<name>, which the kernel resolves like the original.
func withShortPath(path string, fn func(string) error) error {
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

// listenUnix listens on path, however long.
func listenUnix(path string) (*net.UnixListener, error) {
	var ln *net.UnixListener
	err := withShortPath(path, func(p string) error {
		l, err := net.ListenUnix("unix", &net.UnixAddr{Name: p, Net: "unix"})
		ln = l
		return err
	})
	if err != nil {
		return nil, err
	}
	// The short name is not the file's: never let Close unlink it.
	ln.SetUnlinkOnClose(false)
	return ln, nil
}

// dialUnix connects to path, however long.
func dialUnix(path string) (*net.UnixConn, error) {
	var c *net.UnixConn
	err := withShortPath(path, func(p string) error {
		conn, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: p, Net: "unix"})
		c = conn
		return err
	})
	return c, err
}

// isGone reports whether a dial error means no shim is listening.
func isGone(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT)
}
