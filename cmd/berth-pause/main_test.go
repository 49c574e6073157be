package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthcri/berth/internal/userns"
)

func buildPause(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("berth-pause needs root: it pivots into an empty root and drops its privileges")
	}
	bin := filepath.Join(t.TempDir(), "berth-pause")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	return bin
}

// startPause starts bin as berthd does for a shared PID namespace.
func startPause(t *testing.T, bin string) (*exec.Cmd, chan error) {
	t.Helper()
	cmd := exec.Command(bin, "/some/pod/state")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWPID, Setpgid: true}
	if err := userns.StartPause(cmd); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
	})
	return cmd, done
}

func TestExitsCleanlyOnSIGTERMAndSIGINT(t *testing.T) {
	bin := buildPause(t)
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		cmd, done := startPause(t, bin)
		// It must keep running (a SIGCHLD-free sleep) until signalled.
		select {
		case err := <-done:
			t.Fatalf("exited before a signal: %v", err)
		case <-time.After(200 * time.Millisecond):
		}
		_ = cmd.Process.Signal(sig)
		select {
		case err := <-done:
			done <- err // for the cleanup
			if err != nil {
				t.Fatalf("%v: exit %v, want 0", sig, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("still running 5s after %v", sig)
		}
	}
}

// Once started, the holder has nothing a process that can ptrace it could
// use: an empty root, no environment, no capability, not root, no
// descriptor but stdio.
func TestHoldsNothing(t *testing.T) {
	bin := buildPause(t)
	cmd, _ := startPause(t, bin)
	proc := fmt.Sprintf("/proc/%d/", cmd.Process.Pid)
	if entries, err := os.ReadDir(proc + "root"); err != nil || len(entries) != 0 {
		t.Errorf("root: %v %v, want an empty directory", entries, err)
	}
	if entries, err := os.ReadDir(proc + "cwd"); err != nil || len(entries) != 0 {
		t.Errorf("cwd: %v %v, want an empty directory", entries, err)
	}
	if env, err := os.ReadFile(proc + "environ"); err != nil || len(env) != 0 {
		t.Errorf("environ: %q %v, want empty", env, err)
	}
	mounts, err := os.ReadFile(proc + "mountinfo")
	if err != nil || strings.Count(string(mounts), "\n") != 1 || !strings.Contains(string(mounts), " / / ro,") {
		t.Errorf("mount namespace: %v\n%s, want one read-only root", err, mounts)
	}
	status, err := os.ReadFile(proc + "status")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"Uid:\t65535\t65535\t65535\t65535", "Gid:\t65535\t65535\t65535\t65535", "Groups:\t \n",
		"CapInh:\t0000000000000000", "CapPrm:\t0000000000000000", "CapEff:\t0000000000000000",
		"CapBnd:\t0000000000000000", "CapAmb:\t0000000000000000", "NoNewPrivs:\t1",
	} {
		if !strings.Contains(string(status), want) {
			t.Errorf("status lacks %q:\n%s", want, status)
		}
	}
	// Every thread, not only the one that dropped them.
	tasks, _ := os.ReadDir(proc + "task")
	for _, task := range tasks {
		st, err := os.ReadFile(proc + "task/" + task.Name() + "/status")
		if err == nil && (!strings.Contains(string(st), "CapBnd:\t0000000000000000") || !strings.Contains(string(st), "NoNewPrivs:\t1")) {
			t.Errorf("thread %s kept privileges:\n%s", task.Name(), st)
		}
	}
	// Not dumpable: the kernel shows the /proc/<pid> files of a
	// non-dumpable process as root's, where the process is 65535's.
	var st syscall.Stat_t
	if err := syscall.Stat(proc+"environ", &st); err != nil || st.Uid != 0 {
		t.Errorf("environ owned by %d (%v): the holder is dumpable", st.Uid, err)
	}
	fds, _ := os.ReadDir(proc + "fd")
	var names []string
	for _, fd := range fds {
		names = append(names, fd.Name())
	}
	if strings.Join(names, " ") != "0 1 2" {
		t.Errorf("descriptors %v, want 0 1 2", names)
	}
}

// Started in its parent's mount namespace (not as berthd starts it), it
// refuses to pivot that namespace. The parent here is a shell in a
// throwaway mount namespace, so a broken guard could only harm that.
func TestRefusesItsParentsMountNamespace(t *testing.T) {
	bin := buildPause(t)
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("needs unshare(1)")
	}
	out, err := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c", bin+" /some/pod/state; echo exit=$?").CombinedOutput()
	if err != nil {
		t.Fatalf("unshare: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "parent's mount namespace") || !strings.Contains(string(out), "exit=1") {
		t.Fatalf("got %q, want a refusal and exit 1", out)
	}
}
