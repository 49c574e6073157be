package integration

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/shim/shimfault"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
)

// readsAnswer asks every read RPC with a deadline of hungReadBound: each
// must answer (what fails is named with why).
func (n *hungNode) readsAnswer(t *testing.T, while string) {
	t.Helper()
	for _, r := range n.readRPCs() {
		ctx, cancel := context.WithTimeout(context.Background(), hungReadBound)
		start := time.Now()
		err := r.call(ctx)
		cancel()
		if err != nil {
			t.Errorf("%s %s: %v (after %v), want an answer within %v", r.name, while, err, time.Since(start).Round(time.Millisecond), hungReadBound)
		}
	}
}

// pids is each sleeper's init pid.
func (n *hungNode) pids() map[string]int {
	m := map[string]int{}
	for _, id := range n.sleepers {
		m[id] = n.e.ctrPid(id)
	}
	return m
}

// sleepersRunOn checks that the sleepers (but skip) run, with the pids
// they had.
func (n *hungNode) sleepersRunOn(t *testing.T, pids map[string]int, after string, skip ...string) {
	t.Helper()
	for _, id := range n.sleepers {
		if contains(skip, id) {
			continue
		}
		if st := n.e.status(id); st.State != criapi.ContainerState_CONTAINER_RUNNING {
			t.Errorf("sleeper %s after %s: %s (%s: %s)", id, after, st.State, st.Reason, st.Message)
		}
		if pid := n.e.ctrPid(id); pid != pids[id] {
			t.Errorf("sleeper %s runs as %d after %s, was %d: restarted", id, pid, after, pids[id])
		}
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// nodeLog is the node's shim log (keeper and monitors).
func (n *hungNode) nodeLog() string {
	b, _ := os.ReadFile(filepath.Join(n.e.d.State, "shims", ".node", "shim.log"))
	return string(b)
}

// TestHungKeeperLeavesTheNodeServing stops the node's keeper (SIGSTOP)
// for less than the monitor's bound on it (decision 3300): every read
// answers within hungReadBound, exec works, a new container is created
// and started (its register waits in the link's buffer), and a
// container that exits meanwhile, which nobody can reap, shows RUNNING
// (its last known state); once the keeper goes on (SIGCONT) its exit is
// reported with its code, nothing restarted, the same keeper and monitor
// serve, and teardown leaves nothing.
func TestHungKeeperLeavesTheNodeServing(t *testing.T) {
	t.Parallel()
	n := newHungNode(t)
	pids := n.pids()
	quitterPid := n.e.ctrPid(n.quitter)
	if err := syscall.Kill(n.keeper, syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP the keeper: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Kill(n.keeper, syscall.SIGCONT) })

	n.readsAnswer(t, "with the keeper stopped")
	if out := n.pods[1].exec(n.sleepers[1], "echo", "alive"); out != "alive" {
		t.Errorf("exec with the keeper stopped: %q", out)
	}
	late := n.pods[2].run(n.pods[2].config("late", "sleep", "3600"))
	n.pods[0].exec(n.quitter, "touch", "/quit")
	waitUntil(t, "the quitter to exit", func() bool { return !processRuns(quitterPid) })
	if st := n.e.status(n.quitter); st.State != criapi.ContainerState_CONTAINER_RUNNING {
		t.Errorf("quitter exited with the keeper stopped: %s, want RUNNING until its exit is reaped", st.State)
	}
	n.readsAnswer(t, "with the keeper stopped and an exit unreaped")

	if err := syscall.Kill(n.keeper, syscall.SIGCONT); err != nil {
		t.Fatalf("SIGCONT the keeper: %v", err)
	}
	if ex := n.pods[0].waitExited(n.quitter); ex.ExitCode != 7 {
		t.Errorf("quitter exited %d (%s: %s), want 7", ex.ExitCode, ex.Reason, ex.Message)
	}
	n.sleepersRunOn(t, pids, "the keeper went on")
	if st := n.e.status(late); st.State != criapi.ContainerState_CONTAINER_RUNNING {
		t.Errorf("container created while the keeper was stopped: %s", st.State)
	}
	if k, m := oneKeeperOneMonitor(t, n.e.d); k[0] != n.keeper || m[0] != n.monitor {
		t.Errorf("keeper %d, monitor %d after the keeper went on; were %d, %d", k[0], m[0], n.keeper, n.monitor)
	}
	if _, err := n.e.d.Runtime.StopContainer(berthdtest.Ctx(t), &criapi.StopContainerRequest{ContainerId: n.sleepers[1], Timeout: 1}); err != nil {
		t.Errorf("StopContainer after the keeper went on: %v", err)
	}
	n.teardown(t)
}

// TestHungKeeperIsKilledAsCrashed leaves the keeper stopped: the monitor
// kills a keeper that pinged before and then sent no ping for its bound
// (decision 3300: 60 s, counted in housekeeping rounds), and the node
// goes on as after a keeper's crash (decision 1701): the containers run
// on unrestarted under the orphaned monitor, the exit that happened
// meanwhile is lost (255), exec and stop work, and a new pod gets a new
// keeper and monitor; teardown leaves nothing.
func TestHungKeeperIsKilledAsCrashed(t *testing.T) {
	t.Parallel()
	n := newHungNode(t)
	pids := n.pids()
	if err := syscall.Kill(n.keeper, syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP the keeper: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Kill(n.keeper, syscall.SIGCONT) })
	n.pods[0].exec(n.quitter, "touch", "/quit")
	// The monitor's bound is 60 s (13 housekeeping rounds after the last
	// ping); 3 minutes is a hang guard for a loaded machine. Nothing else
	// kills a keeper (berthd never does); the monitor's log line goes
	// with the node's dir, which an orphaned monitor removes.
	for deadline := time.Now().Add(3 * time.Minute); processRuns(n.keeper); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the keeper %d still runs, stopped, 3 minutes on: its monitor did not kill it; node log:\n%s", n.keeper, n.nodeLog())
		}
	}
	if ex := n.pods[0].waitExited(n.quitter); ex.ExitCode != 255 {
		t.Errorf("quitter, which exited while nobody could reap it: exit %d (%s: %s), want 255 (lost)", ex.ExitCode, ex.Reason, ex.Message)
	}
	n.readsAnswer(t, "after the hung keeper was killed")
	n.sleepersRunOn(t, pids, "the hung keeper was killed")
	if out := n.pods[1].exec(n.sleepers[1], "echo", "alive"); out != "alive" {
		t.Errorf("exec after the hung keeper was killed: %q", out)
	}
	if m := berthdtest.ShimPids(n.e.d.State, "monitor"); len(m) != 1 || m[0] != n.monitor {
		t.Errorf("monitors %v after the keeper was killed, want the same one, %d", m, n.monitor)
	}
	if _, err := n.e.d.Runtime.StopContainer(berthdtest.Ctx(t), &criapi.StopContainerRequest{ContainerId: n.sleepers[1], Timeout: 1}); err != nil {
		t.Errorf("StopContainer after the hung keeper was killed: %v", err)
	}
	pe := n.e.podEnv(podConfig("after-keeper"))
	n.pods = append(n.pods, pe)
	id := pe.run(pe.config("after", "sleep", "3600"))
	if out := pe.exec(id, "echo", "alive"); out != "alive" {
		t.Errorf("exec in a new pod after the hung keeper was killed: %q", out)
	}
	if k := berthdtest.ShimPids(n.e.d.State, "keeper"); len(k) != 1 || k[0] == n.keeper {
		t.Errorf("keepers %v for the new pod, want one new one", k)
	}
	n.teardown(t)
}

// TestMonitorHungWhileAdoptingIsReplaced: a monitor restarted after a
// crash hangs while it adopts the keeper's containers (the pause point
// monitor-hang-adopt: not listening, serving no pod). The keeper's
// watchdog times a monitor that has not said it serves too, with a
// longer bound (decision 3300: 30 s), kills it and starts the next: a
// stop asked during the hang completes through it, the container that
// exited meanwhile shows its code, the others run on unrestarted, reads
// answer throughout; teardown leaves nothing.
func TestMonitorHungWhileAdoptingIsReplaced(t *testing.T) {
	t.Parallel()
	faults := filepath.Join(t.TempDir(), "shim-faults")
	n := newHungNodeWith(t, berthdtest.Options{Env: []string{shimfault.EnvVar + "=" + faults}})
	pids := n.pids()
	if err := shimfault.Arm(faults, shimfault.MonitorHangAdopt); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(faults) })
	if err := syscall.Kill(n.monitor, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var hung int
	waitUntil(t, "the next monitor to hang in adoption", func() bool {
		m := berthdtest.ShimPids(n.e.d.State, "monitor")
		if len(m) != 1 || m[0] == n.monitor {
			return false
		}
		hung = m[0]
		return strings.Contains(n.nodeLog(), "test fault "+string(shimfault.MonitorHangAdopt))
	})
	n.readsAnswer(t, "with the monitor hung in adoption")
	n.pods[0].exec(n.quitter, "touch", "/quit")
	stopped := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		_, err := n.e.d.Runtime.StopContainer(ctx, &criapi.StopContainerRequest{ContainerId: n.sleepers[1], Timeout: 1})
		stopped <- err
	}()
	waitUntil(t, "the keeper to kill the monitor hung in adoption", func() bool { return !processRuns(hung) })
	if err := os.Remove(faults); err != nil {
		t.Fatal(err)
	}
	if err := <-stopped; err != nil {
		t.Fatalf("StopContainer asked while the monitor hung in adoption: %v; node log:\n%s", err, n.nodeLog())
	}
	if st := n.e.status(n.sleepers[1]); st.State != criapi.ContainerState_CONTAINER_EXITED {
		t.Errorf("stopped sleeper: %s", st.State)
	}
	if ex := n.pods[0].waitExited(n.quitter); ex.ExitCode != 7 {
		t.Errorf("quitter exited %d (%s: %s), want 7", ex.ExitCode, ex.Reason, ex.Message)
	}
	n.sleepersRunOn(t, pids, "the monitor hung in adoption was replaced", n.sleepers[1])
	if k, _ := oneKeeperOneMonitor(t, n.e.d); k[0] != n.keeper {
		t.Errorf("keeper %d, was %d", k[0], n.keeper)
	}
	n.teardown(t)
}

// TestHungMonitorWaitsHoldNoGoroutines: with the node's monitor stopped
// (until the keeper replaces it) a client asks, round after round,
// ContainerStatus and ExecSync of one container and a StopContainer of
// another with a short deadline (it waits on the monitor): the reads and
// exec answer every round, and berthd's goroutine count at the last
// round is that after the first rounds, within a small slack: nothing
// piles up per call while the monitor hangs. Counted in rounds, not
// timed.
func TestHungMonitorWaitsHoldNoGoroutines(t *testing.T) {
	t.Parallel()
	n := newHungNode(t)
	rt := n.e.d.Runtime
	n.stop(t)
	const rounds, warm = 40, 3
	var counts []int
	for round := range rounds {
		ctx, cancel := context.WithTimeout(context.Background(), hungReadBound)
		_, err := rt.ContainerStatus(ctx, &criapi.ContainerStatusRequest{ContainerId: n.sleepers[0]})
		cancel()
		if err != nil {
			t.Fatalf("round %d: ContainerStatus with the monitor stopped: %v", round, err)
		}
		if out := n.pods[0].exec(n.sleepers[0], "echo", "alive"); out != "alive" {
			t.Fatalf("round %d: exec with the monitor stopped: %q", round, out)
		}
		ctx, cancel = context.WithTimeout(context.Background(), 500*time.Millisecond)
		_, err = rt.StopContainer(ctx, &criapi.StopContainerRequest{ContainerId: n.sleepers[1], Timeout: 1})
		cancel()
		// DeadlineExceeded while the monitor hangs; done once the
		// keeper's next monitor serves.
		if err != nil && status.Code(err) != codes.DeadlineExceeded {
			t.Fatalf("round %d: StopContainer with the monitor stopped: %v", round, err)
		}
		counts = append(counts, goroutines(t, n.e.d))
	}
	t.Logf("berthd's goroutines by round: %v", counts)
	if base, last := counts[warm-1], counts[rounds-1]; last > base+10 {
		t.Errorf("berthd's goroutines grew from %d (round %d) to %d (round %d) while the monitor hung: %v", base, warm, last, rounds, counts)
	}
	n.teardown(t)
}
