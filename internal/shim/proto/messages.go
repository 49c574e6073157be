package proto

import (
	"errors"
	"fmt"
	"time"

	"github.com/berthcri/berth/internal/errdefs"
)

// The protocol's messages, one definition for berthd's client and
// berth-shim. Each is encoded as a JSON object by this package's codec
// (codec.go); the JSON key of each field is given beside it. A key that is
// absent decodes as the zero value and a zero value is left out when it
// does not mean something (omitempty), so either side may be older than
// the other: the keeper and monitor outlive the berthd that started
// them.

// Runtime names the OCI runtime a container runs with.
type Runtime struct {
	Binary  string   // "binary"
	Root    string   // "root"
	Options []string // "options", omitted when empty
}

// CreateRequest is what OpCreate needs: a bundle the runtime creates, the
// CRI log file and the container's stdio.
type CreateRequest struct {
	Bundle  string // "bundle"
	LogPath string // "log_path", omitted when empty (no CRI log)
	// LogDir is the pod's log directory (CRI log_directory), LogPath's
	// ancestor: the monitor opens the log file beneath it without
	// following a symlink. Omitted when empty (an older berthd: the
	// monitor takes LogPath's own directory).
	LogDir    string  // "log_dir"
	Runtime   Runtime // "runtime"
	Stdin     bool    // "stdin"
	StdinOnce bool    // "stdin_once"
	Terminal  bool    // "terminal"
	// Restore is a CRIU image directory (runc checkpoint --image-path):
	// the container is registered created with no process, and its start
	// restores the checkpointed process tree from it (runc restore
	// --detach) instead of starting the created init. Omitted when empty.
	Restore string // "restore"
	// CRIU is the criu binary a restore uses (runc --criu); empty: the
	// runtime's default (criu in PATH). Omitted when empty.
	CRIU string // "criu"
}

// Request is one call.
type Request struct {
	Op     string         // "op"
	ID     string         // "id": the container, for per-container ops
	Dir    string         // "dir": OpAddPod's pod state dir (<shims>/<pod-id>)
	Create *CreateRequest // "create": OpCreate's arguments
	Signal int            // "signal": OpKill's signal (0: SIGTERM)
	All    bool           // "all": OpKill every process, not just the init
	// OpAttach: the streams the client wants.
	Stdin  bool // "stdin"
	Stdout bool // "stdout"
	Stderr bool // "stderr"
}

// Exit is a container's exit, as the monitor persists it under
// <pod dir>/exits/<id>.json (decision 0301) and reports it in a State.
type Exit struct {
	Version   int       // "version": ExitVersion when written
	ID        string    // "id"
	Pid       int       // "pid"
	Code      int       // "exit_code": 128+signal for a signal death
	Signal    int       // "signal"
	OOMKilled bool      // "oom_killed"
	At        time.Time // "exited_at", RFC 3339 with nanoseconds
	// Unknown is set by berthd, never the monitor, for an exit nobody saw;
	// it is never encoded.
	Unknown string
}

// State is a container as the monitor sees it.
type State struct {
	ID     string // "id"
	Pid    int    // "pid"
	Status string // "status": StatusCreated, StatusRunning or StatusExited
	Exit   *Exit  // "exit", once exited
	// LogWriteErrors counts the CRI log records the monitor failed to write
	// (in full) since the container was created: a full or failing disk.
	LogWriteErrors uint64 // "log_write_errors"
	// LogWriteError is the last such failure.
	LogWriteError string // "log_write_error"
}

// Response answers a Request.
type Response struct {
	Error string   // "error": what failed, empty on success
	Kind  string   // "kind": the error's kind (Kind* constants)
	State *State   // "state": the container after the op
	IDs   []string // "ids": the pod's containers (OpPing); on node.sock, the dirs of the pods served
}

// ErrorResponse is the response to a failed op: its message and kind.
func ErrorResponse(err error) *Response {
	r := &Response{Error: err.Error()}
	for _, k := range kinds {
		if errors.Is(err, k.err) {
			r.Kind = k.kind
			break
		}
	}
	return r
}

// Err is the error a response carries, wrapping its kind's errdefs error;
// nil when the op succeeded.
func (r *Response) Err() error {
	if r.Error == "" {
		return nil
	}
	for _, k := range kinds {
		if r.Kind == k.kind {
			return fmt.Errorf("%s: %w", r.Error, k.err)
		}
	}
	return errors.New(r.Error)
}

// kinds is the one table between error kinds on the wire and errdefs.
var kinds = [...]struct {
	kind string
	err  error
}{
	{KindNotFound, errdefs.ErrNotFound},
	{KindAlreadyExists, errdefs.ErrAlreadyExists},
	{KindFailedPrecondition, errdefs.ErrFailedPrecondition},
	{KindUnavailable, errdefs.ErrUnavailable},
	{KindInvalidArgument, errdefs.ErrInvalidArgument},
}
