package main

import (
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

func TestExitsCleanlyOnSIGTERMAndSIGINT(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "berth-pause")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		cmd := exec.Command(bin, "/some/pod/state")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		// It must keep running (a SIGCHLD-free sleep) until signalled.
		select {
		case err := <-done:
			t.Fatalf("exited before a signal: %v", err)
		case <-time.After(200 * time.Millisecond):
		}
		_ = cmd.Process.Signal(sig)
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("%v: exit %v, want 0", sig, err)
			}
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			t.Fatalf("still running 5s after %v", sig)
		}
	}
}
