package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/leakcheck"
)

// stuckRuntime is a runtime handler whose binary is runc behind a
// wrapper: while the flag file exists, its `kill` never returns (it
// records its pid and its child's, then waits on a child that sleeps an
// hour), as a runc stuck on a frozen cgroup or a dead disk would; every
// other call, and every call once the flag is gone, is runc's.
type stuckRuntime struct {
	binary string // the wrapper
	flag   string // exists: kill hangs
	pids   string // the hung wrapper's pid and its child's, a line each
}

func newStuckRuntime(t *testing.T) *stuckRuntime {
	t.Helper()
	runc, err := exec.LookPath("runc")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	s := &stuckRuntime{binary: filepath.Join(dir, "stuck-runc"), flag: filepath.Join(dir, "hang-kill"), pids: filepath.Join(dir, "hung-pids")}
	script := fmt.Sprintf(`#!/bin/sh
for a in "$@"; do
	if [ "$a" = kill ] && [ -e %[1]q ]; then
		sleep 3600 &
		printf '%%s\n%%s\n' "$$" "$!" > %[2]q.tmp && mv %[2]q.tmp %[2]q
		wait
	fi
done
exec %[3]q "$@"
`, s.flag, s.pids, runc)
	if err := os.WriteFile(s.binary, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return s
}

// hang makes the next kill hang; the test's end lets any go.
func (s *stuckRuntime) hang(t *testing.T) {
	t.Helper()
	if err := os.WriteFile(s.flag, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.release)
}

func (s *stuckRuntime) release() { _ = os.Remove(s.flag) }

// hungPids waits for a kill to hang and returns the wrapper's pid and its
// child's.
func (s *stuckRuntime) hungPids(t *testing.T) []int {
	t.Helper()
	var pids []int
	waitUntil(t, "the runtime's kill to hang", func() bool {
		data, err := os.ReadFile(s.pids)
		if err != nil {
			return false
		}
		pids = pids[:0]
		for _, f := range strings.Fields(string(data)) {
			if n, err := strconv.Atoi(f); err == nil {
				pids = append(pids, n)
			}
		}
		return len(pids) == 2
	})
	return pids
}

// TestStuckRuntimeCallIsBounded: the node's monitor runs a runtime call
// that never returns (issue #35: the monitor answers its keeper's pings,
// one runc hangs). While it hangs, every read answers within
// hungReadBound from the last known state, exec works (in that very
// container too), and the node's other pods are served (a stop there
// completes); the call that needs the stuck runc (a StopContainer)
// fails Unavailable, saying that the runtime did not return, once the
// monitor's bound on the call passed, and the runtime is killed with its
// process group (the wrapper and its child); the monitor is not
// replaced, the container runs on unrestarted, and once the runtime
// works again it stops as usual and teardown leaves nothing.
func TestStuckRuntimeCallIsBounded(t *testing.T) {
	t.Parallel()
	stuck := newStuckRuntime(t)
	d := berthdtest.Start(t, berthdtest.Options{Configure: func(c *config.Config) {
		c.MetricsAddress = "127.0.0.1:0"
		c.RuntimeHandlers = map[string]config.RuntimeHandler{"runc": {Binary: "runc"}, "stuck": {Binary: stuck.binary}}
	}})
	e := newCtrEnvOn(t, d)
	scope, before := nodeLeakBaseline(t, e)

	plain := e.podEnv(podConfig("plain"))
	plainSleeper := plain.run(plain.config("sleeper", "sleep", "3600"))
	sp := *e
	sp.podCfg = podConfig("stuck")
	sp.podCfg.LogDirectory = e.logDir
	resp, err := d.Runtime.RunPodSandbox(berthdtest.Ctx(t), &criapi.RunPodSandboxRequest{Config: sp.podCfg, RuntimeHandler: "stuck"})
	if err != nil {
		t.Fatalf("RunPodSandbox with the stuck handler: %v", err)
	}
	sp.pod = resp.PodSandboxId
	victim := sp.run(sp.config("victim", "sleep", "3600"))
	other := sp.run(sp.config("other", "sleep", "3600"))
	victimPid := sp.ctrPid(victim)
	_, monitors := oneKeeperOneMonitor(t, d)

	stuck.hang(t)
	stopped := make(chan error, 1)
	go func() {
		// The kubelet's runtime-request-timeout: the monitor's bound
		// on the call ends it well before.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		_, err := d.Runtime.StopContainer(ctx, &criapi.StopContainerRequest{ContainerId: victim, Timeout: 1})
		stopped <- err
	}()
	hung := stuck.hungPids(t)

	n := &hungNode{e: e, pods: []*ctrEnv{&sp}, sleepers: []string{victim}}
	n.readsAnswer(t, "with the runtime stuck")
	if st := sp.status(victim); st.State != criapi.ContainerState_CONTAINER_RUNNING {
		t.Errorf("victim with its stop stuck in the runtime: %s, want RUNNING (last known)", st.State)
	}
	if out := sp.exec(victim, "echo", "alive"); out != "alive" {
		t.Errorf("exec in the victim while its stop is stuck: %q", out)
	}
	if out := sp.exec(other, "echo", "alive"); out != "alive" {
		t.Errorf("exec beside the victim while its stop is stuck: %q", out)
	}
	// The node's other pods are served meanwhile: the monitor is not
	// stuck, one of its calls is.
	if _, err := d.Runtime.StopContainer(berthdtest.Ctx(t), &criapi.StopContainerRequest{ContainerId: plainSleeper, Timeout: 1}); err != nil {
		t.Errorf("StopContainer in another pod while a runtime call hangs: %v", err)
	}

	err = <-stopped
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "did not return") {
		t.Fatalf("StopContainer stuck in the runtime: %v, want Unavailable saying the runtime did not return", err)
	}
	t.Logf("StopContainer stuck in the runtime: %v", err)
	for _, pid := range hung {
		waitUntil(t, fmt.Sprintf("the hung runtime's process %d to be killed", pid), func() bool { return !processRuns(pid) })
	}
	if _, now := oneKeeperOneMonitor(t, d); now[0] != monitors[0] {
		t.Errorf("monitor %d, was %d: replaced for one stuck runtime call", now[0], monitors[0])
	}
	if st := sp.status(victim); st.State != criapi.ContainerState_CONTAINER_RUNNING {
		t.Errorf("victim after its stop failed: %s (%s: %s), want RUNNING", st.State, st.Reason, st.Message)
	}
	if pid := sp.ctrPid(victim); pid != victimPid {
		t.Errorf("victim runs as %d, was %d: restarted", pid, victimPid)
	}

	stuck.release()
	if _, err := d.Runtime.StopContainer(berthdtest.Ctx(t), &criapi.StopContainerRequest{ContainerId: victim, Timeout: 1}); err != nil {
		t.Fatalf("StopContainer once the runtime works again: %v", err)
	}
	if st := sp.status(victim); st.State != criapi.ContainerState_CONTAINER_EXITED {
		t.Errorf("victim after its stop: %s", st.State)
	}
	stopRemove(t, d, sp.pod)
	stopRemove(t, d, plain.pod)
	waitNodeGone(t, d)
	leakcheck.CheckSettled(t, scope, before, leakcheck.Take(t, scope))
}
