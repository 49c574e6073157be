package shim_test

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/shim"
	"github.com/berthcri/berth/internal/testutil/bundletest"
)

// counterArgs prints 0..n-1, one line every 10 ms, then exits with code.
func counterArgs(n, code int) []string {
	return []string{"sh", "-c", "i=0; while [ $i -lt " + strconv.Itoa(n) + " ]; do echo $i; i=$((i+1)); sleep 0.01; done; exit " + strconv.Itoa(code)}
}

// checkCount checks that the log holds exactly the lines 0..n-1, in order.
func checkCount(t *testing.T, logPath string, n int) {
	t.Helper()
	recs := readLog(t, logPath)
	got := make([]string, 0, len(recs))
	for _, r := range recs {
		got = append(got, r.m)
	}
	want := make([]string, n)
	for i := range want {
		want[i] = strconv.Itoa(i)
	}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("log %s: %d records, want 0..%d in order:\n%s", logPath, len(got), n-1, strings.Join(got, ","))
	}
}

// waitFor polls cond for up to 15 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(15 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// The monitor serves every pod of the node (decision 1701). Killed with
// SIGKILL while containers log, it is restarted by the keeper and takes
// every container back: no log record lost, the exit codes kept, stdin
// and attach working again, the other pod untouched. Once the last pod is
// gone, keeper and monitor exit.
func TestNodeMonitorCrashLosesNothing(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	other, err := shim.Launch(ctx, bundletest.ShimBinary(t), filepath.Join(f.dir, "shims", strings.Repeat("q", 64)), "pod2")
	if err != nil {
		t.Fatal(err)
	}
	keeper, monitor := f.shimPid("keeper"), f.shimPid("monitor")
	if n := len(f.shimPids()); n != 2 {
		t.Fatalf("%d berth-shim processes for two pods, want a keeper and a monitor", n)
	}

	counterLog := f.run("counter", counterArgs(300, 7), nil)
	catLog := filepath.Join(f.dir, "logs", "cat.log")
	if err := f.client.Create(ctx, "cat", &shim.CreateRequest{Bundle: f.bundle("cat", []string{"cat"}, nil), LogPath: catLog, Runtime: f.rt, Stdin: true, StdinOnce: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.client.Start(ctx, "cat"); err != nil {
		t.Fatal(err)
	}
	if err := other.Create(ctx, "sleeper", &shim.CreateRequest{Bundle: f.bundle("sleeper", []string{"sleep", "1000"}, nil), Runtime: f.rt}); err != nil {
		t.Fatal(err)
	}
	sleeper, err := other.Start(ctx, "sleeper")
	if err != nil {
		t.Fatal(err)
	}
	// A container that exits while no monitor runs.
	f.run("quick", counterArgs(50, 3), nil)

	time.Sleep(700 * time.Millisecond)
	if err := syscall.Kill(monitor, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a new monitor", func() bool {
		pids := f.shimPids()
		return len(pids) == 2 && pids[0] != monitor && pids[1] != monitor
	})
	waitFor(t, "the pod served again", func() bool { _, err := f.client.State(ctx, "counter"); return err == nil })
	if k := f.shimPid("keeper"); k != keeper {
		t.Fatalf("keeper changed: %d, then %d", keeper, k)
	}

	if st := f.wait("counter"); st.Exit.Code != 7 {
		t.Fatalf("counter's exit after the monitor's restart: %+v", st.Exit)
	}
	checkCount(t, counterLog, 300)
	if st := f.wait("quick"); st.Exit.Code != 3 {
		t.Fatalf("quick's exit, which happened with no monitor or just before: %+v", st.Exit)
	}
	st, err := other.State(ctx, "sleeper")
	if err != nil || st.Status != shim.StatusRunning || st.Pid != sleeper.Pid {
		t.Fatalf("the other pod's container: %+v, %v (was pid %d)", st, err, sleeper.Pid)
	}
	s, err := f.client.Attach(ctx, "cat", true, true, true)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Stdin([]byte("after restart\n")); err != nil {
		t.Fatal(err)
	}
	if kind, p, err := s.Recv(); err != nil || kind != shim.FrameStdout || string(p) != "after restart\n" {
		t.Fatalf("recv = %d %q %v", kind, p, err)
	}
	// stdin_once: the attach's end closes the container's stdin, the
	// keeper's copy too, so cat sees EOF.
	if err := s.CloseStdin(); err != nil {
		t.Fatal(err)
	}
	if st := f.wait("cat"); st.Exit.Code != 0 {
		t.Fatalf("cat: %+v", st.Exit)
	}
	s.Close()
	if r := readLog(t, catLog); len(r) != 1 || r[0].m != "after restart" {
		t.Fatalf("cat's log %+v", r)
	}

	for _, id := range []string{"counter", "quick", "cat"} {
		if _, err := f.client.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := other.Delete(ctx, "sleeper"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "keeper and monitor to exit", func() bool { return len(f.shimPids()) == 0 })
}

// A keeper killed with SIGKILL costs the exit codes of the containers
// running then (shown as 255) and nothing else: their output goes on into
// their logs, and the monitor refuses new containers (berthd starts a new
// keeper and monitor for new pods) and exits with its last pod.
func TestNodeKeeperCrashLosesOnlyExitCodes(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	logPath := f.run("counter", counterArgs(150, 9), nil)
	time.Sleep(300 * time.Millisecond)
	if err := syscall.Kill(f.shimPid("keeper"), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	st := f.wait("counter")
	if st.Exit.Code != 255 {
		t.Fatalf("exit with no keeper: %+v, want 255", st.Exit)
	}
	checkCount(t, logPath, 150)
	err := f.client.Create(ctx, "late", &shim.CreateRequest{Bundle: f.bundle("late", []string{"true"}, nil), Runtime: f.rt})
	if !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("create with no keeper: %v, want unavailable", err)
	}
	if _, err := f.client.Delete(ctx, "counter"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the monitor to exit", func() bool { return len(f.shimPids()) == 0 })
}

// SIGTERM to the monitor is a hand-over (an upgrade, decision 1701): each
// copier writes the line it holds as a P record and the keeper starts the
// next monitor at once, which goes on from what is left in the pipes.
// Nothing is lost, not even the part of a line read before the signal.
func TestNodeMonitorHandOverLosesNothing(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	counterLog := f.run("counter", counterArgs(200, 0), nil)
	halfLog := f.run("half", []string{"sh", "-c", "printf 'first half '; sleep 1; echo 'second half'"}, nil)
	time.Sleep(500 * time.Millisecond)
	monitor := f.shimPid("monitor")
	if err := syscall.Kill(monitor, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the next monitor", func() bool {
		_, err := f.client.State(ctx, "counter")
		next := f.findShim("monitor")
		return err == nil && next != 0 && next != monitor
	})
	if st := f.wait("counter"); st.Exit.Code != 0 {
		t.Fatalf("counter: %+v", st.Exit)
	}
	checkCount(t, counterLog, 200)
	f.wait("half")
	recs := readLog(t, halfLog)
	if len(recs) != 2 || recs[0].tag != "P" || recs[0].m != "first half " || recs[1].tag != "F" || recs[1].m != "second half" {
		t.Fatalf("the line held at the hand-over: %+v", recs)
	}
	for _, id := range []string{"counter", "half"} {
		if _, err := f.client.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
}

// A launch while the keeper restarts its crashed monitor (it waits 50 ms
// first) finds no monitor answering and the launch lock free. It must
// wait for that monitor, not start a second keeper on the node dir that
// would fight it for the node's socket.
func TestNodeLaunchDuringMonitorRestartJoinsTheKeeper(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	keeper, monitor := f.shimPid("keeper"), f.shimPid("monitor")
	if err := syscall.Kill(monitor, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// Launch once the node's socket stops answering: inside the restart
	// delay.
	nodeSock := filepath.Join(f.nodeDir(), "node.sock")
	waitFor(t, "the killed monitor's socket to refuse", func() bool {
		c, err := net.Dial("unix", nodeSock)
		if err == nil {
			c.Close()
		}
		return err != nil
	})
	other, err := shim.Launch(ctx, bundletest.ShimBinary(t), filepath.Join(f.dir, "shims", strings.Repeat("q", 64)), "pod2")
	if err != nil {
		t.Fatal(err)
	}
	if ids, err := other.List(ctx); err != nil || len(ids) != 0 {
		t.Fatalf("the launched pod's containers: %v, %v", ids, err)
	}
	if k, pids := f.shimPid("keeper"), f.shimPids(); k != keeper || len(pids) != 2 {
		t.Fatalf("keeper %d (was %d), berth-shim processes %v: want the one keeper and its new monitor", k, keeper, pids)
	}
}
