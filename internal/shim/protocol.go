// Package shim is berth-shim's protocol and the client berthd uses to talk
// to it. The shim process itself (one per pod, holding its containers'
// stdio, writing CRI logs, reaping exits) is package shim/server, which
// speaks the same JSON with a small hand-written codec so the shim links no
// encoding/json, net or os/exec.
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
	"syscall"
	"time"

	"github.com/berthcri/berth/internal/shim/proto"
)

// Operations, error kinds, statuses and frames: see package proto.
const (
	OpCreate    = proto.OpCreate
	OpStart     = proto.OpStart
	OpKill      = proto.OpKill
	OpState     = proto.OpState
	OpWait      = proto.OpWait
	OpDelete    = proto.OpDelete
	OpReopenLog = proto.OpReopenLog
	OpAttach    = proto.OpAttach
	OpPing      = proto.OpPing
	OpShutdown  = proto.OpShutdown

	KindNotFound           = proto.KindNotFound
	KindFailedPrecondition = proto.KindFailedPrecondition
	KindUnavailable        = proto.KindUnavailable
	KindInvalidArgument    = proto.KindInvalidArgument

	StatusCreated = proto.StatusCreated
	StatusRunning = proto.StatusRunning
	StatusExited  = proto.StatusExited

	FrameStdin      = proto.FrameStdin
	FrameStdout     = proto.FrameStdout
	FrameStderr     = proto.FrameStderr
	FrameResize     = proto.FrameResize
	FrameCloseStdin = proto.FrameCloseStdin
)

// maxMessage bounds one JSON message; requests are small.
const maxMessage = proto.MaxMessage

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
	return proto.WriteFrame(w, kind, payload)
}

// ReadFrame reads one attach frame into buf (grown when too small).
func ReadFrame(r io.Reader, buf []byte) (byte, []byte, error) { return proto.ReadFrame(r, buf) }

// SocketPath is the shim's socket in its directory.
func SocketPath(dir string) string { return proto.SocketPath(dir) }

// ExitPath is where the shim persists a container's exit.
func ExitPath(dir, id string) string { return proto.ExitPath(dir, id) }

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

// isGone reports whether a dial error means no shim is listening.
func isGone(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT)
}
