package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/leakcheck"
)

// hungReadBound is what every read RPC answers within while the node's
// monitor hangs (docs/reliability.md): the kubelet's relist expects its
// reads to be cheap, and PLEG stalls the whole node when one is not.
// Each read is made with a deadline of the bound: it must not fail with
// DeadlineExceeded. A correctness bound, not a speed assertion.
const hungReadBound = time.Second

// hungNode is a node of three pods, each with a sleeper, the first with a
// quitter too (it exits 7 once /quit exists), whose monitor the test
// stops.
type hungNode struct {
	e        *ctrEnv
	pods     []*ctrEnv
	sleepers []string
	quitter  string
	scope    leakcheck.Scope
	before   leakcheck.Snapshot
	keeper   int
	monitor  int
}

func newHungNode(t *testing.T) *hungNode {
	t.Helper()
	return newHungNodeWith(t, berthdtest.Options{})
}

// newHungNodeWith is newHungNode on a berthd started with opts (its
// metrics listening, whatever opts says).
func newHungNodeWith(t *testing.T, opts berthdtest.Options) *hungNode {
	t.Helper()
	// Metrics for its goroutine count.
	configure := opts.Configure
	opts.Configure = func(c *config.Config) {
		if configure != nil {
			configure(c)
		}
		c.MetricsAddress = "127.0.0.1:0"
	}
	d := berthdtest.Start(t, opts)
	e := newCtrEnvOn(t, d)
	n := &hungNode{e: e}
	n.scope, n.before = nodeLeakBaseline(t, e)
	waitNodeGone(t, d)
	for i := range 3 {
		pe := e.podEnv(podConfig(fmt.Sprintf("hung%d", i)))
		n.pods = append(n.pods, pe)
		n.sleepers = append(n.sleepers, pe.run(pe.config("sleeper", "sleep", "3600")))
	}
	n.quitter = n.pods[0].run(n.pods[0].config("quitter", "sh", "-c", "while [ ! -e /quit ]; do sleep 0.1; done; exit 7"))
	keepers, monitors := oneKeeperOneMonitor(t, d)
	n.keeper, n.monitor = keepers[0], monitors[0]
	return n
}

// stop stops the node's monitor, as a monitor stuck in the kernel or a
// debugger would be; the test's end lets it go on if it still runs.
func (n *hungNode) stop(t *testing.T) {
	t.Helper()
	if err := syscall.Kill(n.monitor, syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP the monitor: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Kill(n.monitor, syscall.SIGCONT) })
}

// teardown removes the pods and checks that the node left nothing.
func (n *hungNode) teardown(t *testing.T) {
	t.Helper()
	for _, pe := range n.pods {
		stopRemove(t, n.e.d, pe.pod)
	}
	waitNodeGone(t, n.e.d)
	leakcheck.CheckSettled(t, n.scope, n.before, leakcheck.Take(t, n.scope))
}

// errOnly keeps a CRI call's error, for readRPCs, which check only that
// each read answers.
func errOnly[T any](_ T, err error) error { return err }

// readRPCs are the CRI's reads, each asked about the node's first pod
// and its sleeper.
func (n *hungNode) readRPCs() []struct {
	name string
	call func(ctx context.Context) error
} {
	rt, img, pod, ctr := n.e.d.Runtime, n.e.d.Image, n.pods[0].pod, n.sleepers[0]
	return []struct {
		name string
		call func(ctx context.Context) error
	}{
		{"Version", func(ctx context.Context) error { return errOnly(rt.Version(ctx, &criapi.VersionRequest{})) }},
		{"Status", func(ctx context.Context) error {
			return errOnly(rt.Status(ctx, &criapi.StatusRequest{Verbose: true}))
		}},
		{"ListContainers", func(ctx context.Context) error {
			return errOnly(rt.ListContainers(ctx, &criapi.ListContainersRequest{}))
		}},
		{"ListPodSandbox", func(ctx context.Context) error {
			return errOnly(rt.ListPodSandbox(ctx, &criapi.ListPodSandboxRequest{}))
		}},
		{"ContainerStatus", func(ctx context.Context) error {
			return errOnly(rt.ContainerStatus(ctx, &criapi.ContainerStatusRequest{ContainerId: ctr}))
		}},
		// crictl inspect's: verbose asks the monitor for what only it
		// knows (log write errors), best effort.
		{"ContainerStatus verbose", func(ctx context.Context) error {
			return errOnly(rt.ContainerStatus(ctx, &criapi.ContainerStatusRequest{ContainerId: ctr, Verbose: true}))
		}},
		{"PodSandboxStatus verbose", func(ctx context.Context) error {
			return errOnly(rt.PodSandboxStatus(ctx, &criapi.PodSandboxStatusRequest{PodSandboxId: pod, Verbose: true}))
		}},
		{"ContainerStats", func(ctx context.Context) error {
			return errOnly(rt.ContainerStats(ctx, &criapi.ContainerStatsRequest{ContainerId: ctr}))
		}},
		{"ListContainerStats", func(ctx context.Context) error {
			return errOnly(rt.ListContainerStats(ctx, &criapi.ListContainerStatsRequest{}))
		}},
		{"PodSandboxStats", func(ctx context.Context) error {
			return errOnly(rt.PodSandboxStats(ctx, &criapi.PodSandboxStatsRequest{PodSandboxId: pod}))
		}},
		{"ListPodSandboxStats", func(ctx context.Context) error {
			return errOnly(rt.ListPodSandboxStats(ctx, &criapi.ListPodSandboxStatsRequest{}))
		}},
		{"ListPodSandboxMetrics", func(ctx context.Context) error {
			return errOnly(rt.ListPodSandboxMetrics(ctx, &criapi.ListPodSandboxMetricsRequest{}))
		}},
		{"ImageFsInfo", func(ctx context.Context) error {
			return errOnly(img.ImageFsInfo(ctx, &criapi.ImageFsInfoRequest{}))
		}},
	}
}

// TestHungMonitorLeavesReadsAnswering stops the node's monitor (SIGSTOP)
// with three pods running: a call that needs the monitor (stop, create)
// fails when its caller's deadline ends, every read answers within
// hungReadBound from the last known state (while a stop waiting on the
// monitor holds the container read about), exec works, and once the monitor goes on (SIGCONT)
// the node converges: the container that exited meanwhile shows EXITED
// with its code, nothing restarted, teardown leaves nothing (decision
// 3300).
func TestHungMonitorLeavesReadsAnswering(t *testing.T) {
	t.Parallel()
	n := newHungNode(t)
	rt := n.e.d.Runtime
	pids := map[string]int{}
	for _, id := range n.sleepers {
		pids[id] = n.e.ctrPid(id)
	}
	n.stop(t)

	// A stop waiting on the monitor holds the container's lock, as the
	// kubelet's would: the reads below ask about that container.
	waiting := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 7*time.Second)
		defer cancel()
		_, err := rt.StopContainer(ctx, &criapi.StopContainerRequest{ContainerId: n.sleepers[0], Timeout: 1})
		waiting <- err
	}()
	// First, while the keeper surely has not given up on the monitor:
	// a stop waits on the monitor and fails with its caller's deadline.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	_, err := rt.StopContainer(ctx, &criapi.StopContainerRequest{ContainerId: n.sleepers[1], Timeout: 1})
	cancel()
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("StopContainer with the monitor stopped: %v, want DeadlineExceeded", err)
	}
	// A create too; it is undone (the teardown's leak check finds any
	// piece of it left).
	ctx, cancel = context.WithTimeout(context.Background(), 2*time.Second)
	_, err = rt.CreateContainer(ctx, &criapi.CreateContainerRequest{PodSandboxId: n.pods[2].pod, Config: n.pods[2].config("late", "sleep", "3600"), SandboxConfig: n.pods[2].podCfg})
	cancel()
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("CreateContainer with the monitor stopped: %v, want DeadlineExceeded", err)
	}

	for _, r := range n.readRPCs() {
		ctx, cancel := context.WithTimeout(context.Background(), hungReadBound)
		start := time.Now()
		err := r.call(ctx)
		cancel()
		if err != nil {
			t.Errorf("%s with the monitor stopped: %v (after %v), want an answer within %v", r.name, err, time.Since(start).Round(time.Millisecond), hungReadBound)
		}
	}
	// Calls queued behind the waiting stop (the kubelet retries its stop)
	// leave at their own deadlines: nothing piles up in berthd while the
	// monitor hangs.
	g0 := goroutines(t, n.e.d)
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			_, err := rt.StopContainer(ctx, &criapi.StopContainerRequest{ContainerId: n.sleepers[0], Timeout: 1})
			if status.Code(err) != codes.DeadlineExceeded {
				t.Errorf("a StopContainer queued behind one waiting on the stopped monitor: %v, want DeadlineExceeded", err)
			}
		}()
	}
	wg.Wait()
	if g1 := goroutines(t, n.e.d); g1 > g0+10 {
		t.Errorf("berthd's goroutines grew with calls given up on the stopped monitor: %d → %d", g0, g1)
	}
	st, err := rt.ContainerStatus(berthdtest.Ctx(t), &criapi.ContainerStatusRequest{ContainerId: n.quitter})
	if err != nil || st.Status.State != criapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("quitter with the monitor stopped: %v, %v; want RUNNING (last known)", st, err)
	}
	// Exec needs no monitor; the quitter exits while nobody reports it.
	n.pods[0].exec(n.quitter, "touch", "/quit")
	if err := <-waiting; status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("StopContainer waiting on the stopped monitor: %v, want DeadlineExceeded", err)
	}

	if err := syscall.Kill(n.monitor, syscall.SIGCONT); err != nil {
		t.Fatalf("SIGCONT the monitor: %v", err)
	}
	ex := n.pods[0].waitExited(n.quitter)
	if ex.ExitCode != 7 {
		t.Errorf("quitter exited %d (%s: %s), want 7", ex.ExitCode, ex.Reason, ex.Message)
	}
	if !processRuns(n.monitor) {
		// Either way the node converges; this one took the other path.
		t.Logf("the keeper replaced the stopped monitor before SIGCONT came")
	}
	for _, id := range n.sleepers {
		if st := n.e.status(id); st.State != criapi.ContainerState_CONTAINER_RUNNING {
			t.Errorf("sleeper %s after the monitor went on: %s (%s: %s)", id, st.State, st.Reason, st.Message)
		}
		if pid := n.e.ctrPid(id); pid != pids[id] {
			t.Errorf("sleeper %s runs as %d, was %d: restarted", id, pid, pids[id])
		}
	}
	if _, err := rt.StopContainer(berthdtest.Ctx(t), &criapi.StopContainerRequest{ContainerId: n.sleepers[1], Timeout: 1}); err != nil {
		t.Errorf("StopContainer after the monitor went on: %v", err)
	}
	if ls := listed(t, n.e.d); len(ls) != len(n.sleepers)+1 {
		t.Errorf("containers after the monitor went on: %v, want the sleepers and the quitter", ls)
	}
	n.pods[2].run(n.pods[2].config("after", "true"))
	n.teardown(t)
}

// TestHungMonitorIsReplaced: a monitor that stays stopped is killed by
// its keeper once it has left a ping unanswered for the keeper's bound,
// and replaced as after a crash: a stop that waited on it completes
// through the next monitor, the container that exited meanwhile shows
// EXITED with its code, the others run on, unrestarted (decision 3300).
func TestHungMonitorIsReplaced(t *testing.T) {
	t.Parallel()
	n := newHungNode(t)
	rt := n.e.d.Runtime
	pids := map[string]int{}
	for _, id := range n.sleepers {
		pids[id] = n.e.ctrPid(id)
	}
	n.stop(t)
	n.pods[0].exec(n.quitter, "touch", "/quit")

	// The keeper kills a monitor within 15 s of its last answer (a ping
	// every 5 s, 10 s to answer it): a minute is a hang guard.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	start := time.Now()
	_, err := rt.StopContainer(ctx, &criapi.StopContainerRequest{ContainerId: n.sleepers[1], Timeout: 1})
	cancel()
	if err != nil {
		log, _ := os.ReadFile(filepath.Join(n.e.d.State, "shims", ".node", "shim.log"))
		t.Fatalf("StopContainer with the monitor stopped for good: %v (after %v), want it done through the next monitor; shim log:\n%s", err, time.Since(start).Round(time.Millisecond), log)
	}
	t.Logf("StopContainer with the monitor stopped took %v", time.Since(start).Round(time.Millisecond))
	if processRuns(n.monitor) {
		t.Fatalf("the stopped monitor %d still runs", n.monitor)
	}
	keepers, _ := oneKeeperOneMonitor(t, n.e.d)
	if keepers[0] != n.keeper {
		t.Fatalf("keeper %d, was %d", keepers[0], n.keeper)
	}
	if st := n.e.status(n.sleepers[1]); st.State != criapi.ContainerState_CONTAINER_EXITED {
		t.Errorf("stopped sleeper: %s", st.State)
	}
	ex := n.pods[0].waitExited(n.quitter)
	if ex.ExitCode != 7 {
		t.Errorf("quitter exited %d (%s: %s), want 7", ex.ExitCode, ex.Reason, ex.Message)
	}
	for _, id := range []string{n.sleepers[0], n.sleepers[2]} {
		if st := n.e.status(id); st.State != criapi.ContainerState_CONTAINER_RUNNING {
			t.Errorf("sleeper %s after the monitor's replacement: %s (%s: %s)", id, st.State, st.Reason, st.Message)
		}
		if pid := n.e.ctrPid(id); pid != pids[id] {
			t.Errorf("sleeper %s runs as %d, was %d: restarted", id, pid, pids[id])
		}
	}
	n.teardown(t)
}
