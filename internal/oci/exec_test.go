package oci_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berthcri/berth/internal/oci"
	"github.com/berthcri/berth/internal/oci/ocicli"
)

// A call in a process group of its own (Cmd.Group, checkpoint's: runc and
// its CRIU) ends whole with its context: the runtime's child does not
// outlive it, nor does it hold the call's captured stderr open. Without
// Group only the runtime itself is killed, and its child lives on.
func TestExecKillsTheProcessGroupWhenTheContextEnds(t *testing.T) {
	for _, group := range []bool{true, false} {
		t.Run("group="+strconv.FormatBool(group), func(t *testing.T) {
			pidFile := filepath.Join(t.TempDir(), "child")
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			// The "runtime" starts a child that keeps its stderr and
			// records its pid, then waits for it.
			c := &ocicli.Cmd{ID: "c1", Group: group, WaitDelay: time.Second,
				Args: []string{"/bin/sh", "-c", `sleep 1000 & echo $! > ` + pidFile + `.tmp && mv ` + pidFile + `.tmp ` + pidFile + `; wait`}}
			done := make(chan error, 1)
			go func() { _, err := oci.Exec(ctx, c); done <- err }()
			child := waitForPid(t, pidFile)
			t.Cleanup(func() { _ = syscall.Kill(child, syscall.SIGKILL) })
			cancel()
			if err := <-done; err == nil {
				t.Fatal("a killed call succeeded")
			}
			if gone := waitGone(child); gone != group {
				t.Fatalf("child %d gone: %v, want %v", child, gone, group)
			}
		})
	}
}

func waitForPid(t *testing.T, path string) int {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if data, err := os.ReadFile(path); err == nil {
			pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
			if err != nil {
				t.Fatal(err)
			}
			return pid
		}
	}
	t.Fatalf("no pid in %s", path)
	return 0
}

// waitGone reports whether pid is gone (or a zombie: killed, not yet
// reaped by whoever inherited it), waiting for it a while.
func waitGone(pid int) bool {
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			return true
		}
		if stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat"); err == nil {
			if i := strings.LastIndexByte(string(stat), ')'); i > 0 && strings.HasPrefix(string(stat[i+1:]), " Z") {
				return true
			}
		}
	}
	return false
}
