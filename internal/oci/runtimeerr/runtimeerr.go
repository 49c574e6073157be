// Package runtimeerr turns a failed OCI runtime command (runc, crun) into
// an error carrying the runtime's own message. It is shared by berthd's
// runtime wrapper (internal/oci) and berth-shim, so it imports nothing
// heavier than errdefs: the shim's memory budget counts every linked
// package (decision 0303).
package runtimeerr

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/berthcri/berth/internal/errdefs"
)

// New describes the failure of the runtime command args (args[0] is the
// binary) on container id, with the runtime's stderr errOut. A "does not
// exist" or "not found" message wraps errdefs.ErrNotFound, so callers can
// treat a vanished container as gone.
func New(args []string, id string, errOut []byte, err error) error {
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

func subcommand(args []string) string {
	for _, a := range args[1:] {
		switch a {
		case "create", "start", "kill", "delete", "state", "update", "exec":
			return a
		}
	}
	return "?"
}
