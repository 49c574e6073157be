// Package ocicli is what berthd's OCI runtime wrapper (internal/oci) and
// berth-shim share about an OCI runtime's command line (runc, crun): the
// arguments of a call and the error of a failed one. It imports nothing
// heavier than errdefs: the shim's memory budget counts every linked
// package (decision 0303).
package ocicli

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/shim/proto"
)

// Args is the command line of one runtime call: the binary, its state
// root, the handler's options, then the subcommand and its arguments.
func Args(binary, root string, options []string, sub ...string) []string {
	a := []string{binary, "--root", root}
	a = append(a, options...)
	return append(a, sub...)
}

// CreateArgs completes base (from Args, without a subcommand) into a
// `create` of container id. The runtime's stderr is the container's, so
// the runtime logs its own errors as JSON to logPath, in the bundle.
func CreateArgs(base []string, bundle, pidFile, consoleSocket, id string) (args []string, logPath string) {
	logPath = filepath.Join(bundle, "runtime.log")
	args = append(base, "--log", logPath, "--log-format", "json", "create", "--bundle", bundle)
	if pidFile != "" {
		args = append(args, "--pid-file", pidFile)
	}
	if consoleSocket != "" {
		args = append(args, "--console-socket", consoleSocket)
	}
	return append(args, id), logPath
}

// RestoreArgs completes base (from Args, without a subcommand) into a
// detached `restore` of container id from the CRIU images in imagePath
// (KEP-2008): the restored process tree is reparented to the caller's
// subreaper, like a created init. CRIU's own files go to workPath; the
// runtime logs its errors as JSON to logPath, in the bundle, as create
// does. criu, when set, is the criu binary (runc's global --criu).
func RestoreArgs(base []string, criu, bundle, imagePath, workPath, pidFile, id string) (args []string, logPath string) {
	logPath = filepath.Join(bundle, "runtime.log")
	if criu != "" {
		base = append(base, "--criu", criu)
	}
	args = append(base, "--log", logPath, "--log-format", "json", "restore", "--detach",
		"--bundle", bundle, "--image-path", imagePath, "--work-path", workPath, "--pid-file", pidFile)
	return append(args, id), logPath
}

// OrDevNull returns f, or /dev/null opened for writing when f is nil, and
// what closes it. A created container inherits the runtime's stdio: never
// hand it a pipe the caller waits on, or the caller would wait for the
// container.
func OrDevNull(f *os.File) (*os.File, func(), error) {
	if f != nil {
		return f, func() {}, nil
	}
	null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		return nil, nil, err
	}
	return null, func() { null.Close() }, nil
}

// Error describes the failure of the runtime command args (args[0] is the
// binary) on container id, with the runtime's stderr errOut. A "does not
// exist" or "not found" message wraps errdefs.ErrNotFound, so callers can
// treat a vanished container as gone.
func Error(args []string, id string, errOut []byte, err error) error {
	msg := Message(strings.TrimSpace(string(errOut)))
	what := filepath.Base(args[0]) + " " + subcommand(args) + " " + id
	if msg == "" {
		return fmt.Errorf("%s: %w", what, err)
	}
	if strings.Contains(msg, "does not exist") || strings.Contains(msg, "not found") {
		return fmt.Errorf("%s: %w: %s", what, errdefs.ErrNotFound, msg)
	}
	return fmt.Errorf("%s: %v: %s", what, err, msg)
}

// Message pulls msg="..." out of runc's logfmt stderr lines; other lines
// are kept as they are.
func Message(s string) string {
	var msgs []string
	for _, line := range strings.Split(s, "\n") {
		i := strings.Index(line, `msg="`)
		if i < 0 {
			if line = strings.TrimSpace(line); line != "" {
				msgs = append(msgs, line)
			}
			continue
		}
		rest := line[i+len(`msg="`):]
		if m, err := strconv.Unquote(`"` + rest); err == nil {
			msgs = append(msgs, m)
			continue
		}
		if j := strings.LastIndex(rest, `"`); j >= 0 {
			rest = rest[:j]
		}
		msgs = append(msgs, strings.ReplaceAll(rest, `\"`, `"`))
	}
	return strings.Join(msgs, "; ")
}

// Subcommand is the runtime subcommand args run ("?" when none is known).
func Subcommand(args []string) string { return subcommand(args) }

func subcommand(args []string) string {
	for _, a := range args[1:] {
		switch a {
		case "create", "start", "kill", "delete", "state", "update", "exec", "checkpoint", "restore", "pause", "resume":
			return a
		}
	}
	return "?"
}

// WithLogError adds to err, the failure of a runtime call that logged to
// logPath (CreateArgs), the error messages the runtime wrote there, unless
// err already says them: runc's exit status alone names no cause.
func WithLogError(err error, logPath string) error {
	if msg := LastLogError(logPath); msg != "" && !strings.Contains(err.Error(), msg) {
		return fmt.Errorf("%w: %s", err, msg)
	}
	return err
}

// LastLogError returns the error and fatal messages a runtime wrote to its
// JSON log, joined by "; ". It parses with the shim protocol's codec, not
// encoding/json, which the shim does not link.
func LastLogError(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	var msgs []string
	for _, line := range bytes.Split(data, []byte("\n")) {
		var level, msg string
		err := proto.StringFields(line, func(key, value string) {
			switch key {
			case "level":
				level = value
			case "msg":
				msg = value
			}
		})
		if err == nil && (level == "error" || level == "fatal") {
			msgs = append(msgs, msg)
		}
	}
	return strings.Join(msgs, "; ")
}
