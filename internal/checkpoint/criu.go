package checkpoint

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/berthcri/berth/internal/errdefs"
)

// checkTimeout bounds `criu check`.
const checkTimeout = 30 * time.Second

// CRIU is the node's criu, looked up as berth looks up runc: the
// configured path or name, else "criu" in PATH. Whether it works is
// asked of `criu check` once, on first use, and remembered: a node whose
// criu cannot run on its kernel fails every checkpoint and restore with
// FailedPrecondition naming the reason.
type CRIU struct {
	configured string

	once sync.Once
	path string
	err  error
}

// NewCRIU returns the criu named by configured ("" → "criu" in PATH).
func NewCRIU(configured string) *CRIU {
	if configured == "" {
		configured = "criu"
	}
	return &CRIU{configured: configured}
}

// Path is criu's resolved path, once Usable succeeded.
func (c *CRIU) Path() string { return c.path }

// Usable returns criu's path when `criu check` passes; otherwise an
// error wrapping errdefs.ErrFailedPrecondition that says why.
func (c *CRIU) Usable(ctx context.Context) (string, error) {
	c.once.Do(func() { c.path, c.err = check(context.WithoutCancel(ctx), c.configured) })
	return c.path, c.err
}

func check(ctx context.Context, name string) (string, error) {
	path, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("checkpoint/restore needs criu: %v: %w", err, errdefs.ErrFailedPrecondition)
	}
	ctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, "check").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("checkpoint/restore needs a working criu: %s check: %v: %s: %w",
			path, err, lastLines(string(out), 3), errdefs.ErrFailedPrecondition)
	}
	return path, nil
}

// lastLines keeps the end of criu's output: its verdict comes last.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "; ")
}
