package leakcheck

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// ParentPid is pid's parent from /proc/PID/stat (0 if it is gone).
func ParentPid(pid int) int {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command name, in parentheses, may hold spaces: the fields
	// after its closing one are the state, then the parent.
	s := string(data)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}

// Children is the processes whose parent is this process.
func Children(t testing.TB) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ParentPid(pid) == os.Getpid() {
			out = append(out, pid)
		}
	}
	return out
}

// OwnFDs maps this process's open fds to what they name. The runtime's
// poller is started first, so that its fds, opened on first use, are
// not counted as a leak of what the test does next.
func OwnFDs(t testing.TB) map[string]string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
	w.Close()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, e := range ents {
		if target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err == nil {
			out[e.Name()] = target
		}
	}
	return out
}

// NewFDs is the fds of after that before did not have, or had naming
// something else ("fd → target"), leaving out those naming /proc
// (ReadDir's own).
func NewFDs(before, after map[string]string) []string {
	var out []string
	for fd, target := range after {
		if before[fd] != target && !strings.HasPrefix(target, "/proc/") {
			out = append(out, fd+" → "+target)
		}
	}
	return out
}
