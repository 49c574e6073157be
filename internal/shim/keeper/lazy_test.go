package keeper

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthcri/berth/internal/shim/proto"
)

// The keeper starts the lazy-layer server when it is handed a layer's
// connection, hands it the connection on its link, starts it again when
// it dies, and after a crash loop closes the connection it held (so the
// kernel aborts it: readers get ENOTCONN, not a hang). A pipe stands in
// for the connection: its read end sees EOF once the keeper's copy of the
// write end, the last, is closed; a script stands in for berth-lazy.
func TestLazyServerRestartedThenGivenUp(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, LazyBinary)
	mode := filepath.Join(dir, "mode")
	starts := filepath.Join(dir, "starts")
	// Runs until killed while mode says "run"; else dies at once.
	body := fmt.Sprintf("#!/bin/sh\necho $$ >> %s\n[ \"$(cat %s)\" = run ] && exec sleep 600\nexit 3\n", starts, mode)
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(mode, []byte("run"), 0o600); err != nil {
		t.Fatal(err)
	}
	k := New(dir, filepath.Join(dir, "berth-shim"), t.Logf)

	// Run's part: reap, and hand the server's death to the keeper.
	reaped, stop := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(reaped)
		for {
			var ws unix.WaitStatus
			pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
			if err == nil && pid == 0 || err == unix.ECHILD {
				select {
				case <-stop:
					return
				case <-time.After(10 * time.Millisecond):
				}
				continue
			}
			if err != nil {
				continue // EINTR
			}
			k.mu.Lock()
			if pid == k.lazy.pid {
				k.lazyReapedLocked(ws)
			}
			k.mu.Unlock()
		}
	}()

	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	// Close-on-exec, as a received fd is (MSG_CMSG_CLOEXEC).
	held, err := unix.FcntlInt(w.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	k.mu.Lock()
	k.applyLocked(&proto.KeeperMsg{Op: proto.KeeperLazyHold, ID: "sha256:l", Dir: "/nowhere"}, []int{held})
	first := k.lazy.pid
	k.mu.Unlock()
	if first == 0 {
		t.Fatal("no server started on the first hold")
	}
	// The server's fd 3 is its link (a socket).
	waitFor(t, "the server's start", func() bool { return strings.Contains(readFile(starts), fmt.Sprint(first)) })
	if target, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/3", first)); err != nil || !strings.HasPrefix(target, "socket:") {
		t.Fatalf("the server's fd 3: %q, %v", target, err)
	}

	// Killed: started again, the connection still held.
	if err := syscall.Kill(first, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var second int
	waitFor(t, "a second server", func() bool {
		k.mu.Lock()
		defer k.mu.Unlock()
		second = k.lazy.pid
		return second != 0 && second != first
	})
	waitFor(t, "the second server's start", func() bool { return strings.Contains(readFile(starts), fmt.Sprint(second)) })
	if !stillOpen(t, r) {
		t.Fatal("the connection was closed at the server's first death")
	}

	// A crash loop: the keeper gives the connection up.
	if err := os.WriteFile(mode, []byte("die"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(second, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1)
	if n, err := r.Read(buf); n != 0 || err == nil {
		t.Fatalf("read of the given-up connection: %d, %v (want EOF)", n, err)
	}
	k.mu.Lock()
	holds, pending := len(k.lazy.holds), k.lazy.pending
	k.mu.Unlock()
	if holds != 0 || pending {
		t.Fatalf("after the crash loop: %d layers held, restart pending %v", holds, pending)
	}
	// Every death counted, the first kill's too (none lived 10 s).
	if n := strings.Count(readFile(starts), "\n"); n != lazyCrashLoop {
		t.Fatalf("%d server starts, want %d", n, lazyCrashLoop)
	}
	close(stop)
	<-reaped
}

func readFile(path string) string {
	data, _ := os.ReadFile(path)
	return string(data)
}

// stillOpen reports whether the pipe's write end lives somewhere: a read
// would block (no data, no EOF).
func stillOpen(t *testing.T, r *os.File) bool {
	t.Helper()
	fds := []unix.PollFd{{Fd: int32(r.Fd()), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, 0)
	if err != nil {
		t.Fatal(err)
	}
	return n == 0
}

// waitFor polls cond until it holds; the test's timeout bounds it.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		time.Sleep(10 * time.Millisecond)
	}
	_ = what
}
