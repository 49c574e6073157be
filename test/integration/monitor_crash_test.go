package integration

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/leakcheck"
)

// shimPids finds this daemon's berth-shim processes of one mode
// ("keeper" or "monitor").
func shimPids(d *berthdtest.Daemon, mode string) []int {
	var pids []int
	for _, pid := range berthdtest.PidsMentioning(d.State) {
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if strings.TrimSpace(string(comm)) == "berth-shim" && strings.Contains(string(cmd), "\x00"+mode+"\x00") {
			pids = append(pids, pid)
		}
	}
	return pids
}

// waitUntil polls cond until it holds, failing after a generous bound
// (the bound is a hang guard, not a timing assertion).
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// killMonitor kills the node's monitor with SIGKILL and waits for the
// keeper's next one (the keeper unchanged); it returns the new pid.
func killMonitor(t *testing.T, d *berthdtest.Daemon) int {
	t.Helper()
	keepers, monitors := shimPids(d, "keeper"), shimPids(d, "monitor")
	if len(keepers) != 1 || len(monitors) != 1 {
		t.Fatalf("keepers %v, monitors %v: want one of each", keepers, monitors)
	}
	if err := syscall.Kill(monitors[0], syscall.SIGKILL); err != nil {
		t.Fatalf("kill the monitor: %v", err)
	}
	var next int
	waitUntil(t, "the keeper's next monitor", func() bool {
		m := shimPids(d, "monitor")
		if len(m) == 1 && m[0] != monitors[0] {
			next = m[0]
			return true
		}
		return false
	})
	if k := shimPids(d, "keeper"); !slices.Equal(k, keepers) {
		t.Fatalf("keepers %v after the monitor's crash, want %v", k, keepers)
	}
	return next
}

// loggerScript logs a line every 100 ms and exits with code on SIGTERM
// (it is its PID namespace's init, which ignores signals it has no
// handler for).
func loggerScript(code int) string {
	return fmt.Sprintf(`trap 'exit %d' TERM; i=0; while true; do i=$((i+1)); echo line $i; sleep 0.1; done`, code)
}

func logSize(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatalf("stat log: %v", err)
	}
	return fi.Size()
}

// Issue #27: SIGKILL to the node's monitor (a bug in code every pod
// shares) must not mark the running containers exited. The keeper
// restarts the monitor, which adopts every container; berthd waits for it
// and sees the containers still running: inspect and list say RUNNING,
// exec works, their logs keep growing, and a later stop reports the exit
// codes the processes give.
func TestMonitorCrashKeepsContainersRunning(t *testing.T) {
	t.Parallel()
	e := newCtrEnv(t)
	scope := leakcheck.ForDaemon(e.d)
	scope.Root = e.d.Root
	stopRemove(t, e.d, e.pod) // warm up: bridge, lock files
	before := leakcheck.Take(t, scope)

	type podCtr struct {
		env  *ctrEnv
		ctr  string
		code int
	}
	var ctrs []podCtr
	for i := 0; i < 3; i++ {
		pe := e.podEnv(podConfig(fmt.Sprintf("monitor-crash-%d", i)))
		code := 10 + i
		ctrs = append(ctrs, podCtr{pe, pe.run(pe.config("logger", "sh", "-c", loggerScript(code))), code})
	}
	for _, c := range ctrs {
		path := c.env.status(c.ctr).LogPath
		waitUntil(t, "the first log lines", func() bool { return logSize(t, path) > 0 })
	}

	killMonitor(t, e.d)

	for _, c := range ctrs {
		// Exec answers once the new monitor adopted the container; at the
		// base commit the container was already exited and exec refused.
		if out := c.env.exec(c.ctr, "echo", "alive"); out != "alive" {
			t.Fatalf("exec in %s after the monitor's crash: %q", c.ctr, out)
		}
		st := c.env.status(c.ctr)
		if st.State != criapi.ContainerState_CONTAINER_RUNNING {
			t.Fatalf("container %s after the monitor's crash: %s, exit %d, %s: %s\n%s", c.ctr, st.State, st.ExitCode, st.Reason, st.Message, e.d.Logs())
		}
		size := logSize(t, st.LogPath)
		waitUntil(t, "the log to grow after the monitor's crash", func() bool { return logSize(t, st.LogPath) > size })
	}
	list, err := e.d.Runtime.ListContainers(ctxT(t), &criapi.ListContainersRequest{})
	if err != nil {
		t.Fatalf("ListContainers: %v", err)
	}
	running := 0
	for _, c := range list.Containers {
		if c.State == criapi.ContainerState_CONTAINER_RUNNING {
			running++
		} else {
			t.Errorf("listed container %s (%s) is %s", c.Id, c.Metadata.GetName(), c.State)
		}
	}
	if running != len(ctrs) {
		t.Fatalf("%d containers listed running, want %d", running, len(ctrs))
	}
	if strings.Contains(e.d.Logs(), "lost the container's shim") {
		t.Fatalf("berthd lost a container's shim:\n%s", e.d.Logs())
	}

	for _, c := range ctrs {
		if _, err := e.d.Runtime.StopContainer(ctxT(t), &criapi.StopContainerRequest{ContainerId: c.ctr, Timeout: 30}); err != nil {
			t.Fatalf("StopContainer %s: %v", c.ctr, err)
		}
		st := c.env.status(c.ctr)
		if st.State != criapi.ContainerState_CONTAINER_EXITED || st.ExitCode != int32(c.code) {
			t.Fatalf("container %s stopped: %s, exit %d (%s), want exited %d", c.ctr, st.State, st.ExitCode, st.Reason, c.code)
		}
	}
	for _, c := range ctrs {
		stopRemove(t, e.d, c.env.pod)
	}
	waitUntil(t, "keeper and monitor to exit with the last pod", func() bool {
		return len(shimPids(e.d, "keeper"))+len(shimPids(e.d, "monitor")) == 0
	})
	leakcheck.CheckSettled(t, scope, before, leakcheck.Take(t, scope))
}
