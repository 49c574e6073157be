package monitor

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// A runtime call that outlives its context is killed with its whole
// process group (decision 3300): a shell that waits on a child sleeping
// an hour, both gone, and the call fails errRuntimeHung; a call that
// ends in time is untouched, its stderr returned.
func TestRunKillsAHungCallWithItsGroup(t *testing.T) {
	r := newReaper()
	pids := filepath.Join(t.TempDir(), "pids")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := r.run(ctx, []string{"sh", "-c", `sleep 3600 & echo $$ $! > ` + pids + `.tmp && mv ` + pids + `.tmp ` + pids + `; wait`}, nil, nil, nil, nil)
		done <- err
	}()
	var data []byte
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		var err error
		if data, err = os.ReadFile(pids); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the call never started its child")
		}
	}
	cancel() // its bound passed
	if err := <-done; !errors.Is(err, errRuntimeHung) {
		t.Fatalf("hung call: %v, want errRuntimeHung", err)
	}
	for _, f := range strings.Fields(string(data)) {
		pid, _ := strconv.Atoi(f)
		// The shell is reaped by run; its child, reparented, is at
		// most a zombie for a moment. The minute is a hang guard.
		for deadline := time.Now().Add(time.Minute); !gone(pid); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("process %d of the hung call still runs", pid)
			}
		}
	}

	out, err := r.run(context.Background(), []string{"sh", "-c", "echo said >&2"}, nil, nil, nil, nil)
	if err != nil || strings.TrimSpace(string(out)) != "said" {
		t.Fatalf("call in time: %q, %v", out, err)
	}
}

// gone tells whether pid has exited (gone, or a zombie).
func gone(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && i+2 < len(s) && s[i+2] == 'Z'
}
