package shim_test

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berthcri/berth/internal/shim"
	"github.com/berthcri/berth/internal/shim/proto"
	"github.com/berthcri/berth/internal/testutil/bundletest"
)

// A pod's client rides out the monitor's crash (decision 1701): a wait
// parked when the monitor dies, and calls made while the keeper restarts
// it, wait for the next monitor and get its answers, not ErrNoShim or EOF.
func TestPodClientRidesOutAMonitorCrash(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	f.run("counter", counterArgs(100, 7), nil)
	waited := make(chan error, 1)
	var exit *shim.Exit
	go func() {
		st, err := f.client.Wait(ctx, "counter")
		if err == nil {
			exit = st.Exit
		}
		waited <- err
	}()
	time.Sleep(50 * time.Millisecond) // let the wait park: not an assertion
	monitor := f.shimPid("monitor")
	if err := syscall.Kill(monitor, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// At once, while the keeper has not restarted it yet.
	st, err := f.client.State(ctx, "counter")
	if err != nil {
		t.Fatalf("state with the monitor restarting: %v", err)
	}
	if st.Status != shim.StatusRunning && st.Status != shim.StatusExited {
		t.Fatalf("state with the monitor restarting: %+v", st)
	}
	if next := f.shimPid("monitor"); next == monitor {
		t.Fatalf("the state came from the killed monitor %d", monitor)
	}
	if err := <-waited; err != nil {
		t.Fatalf("wait across the monitor's crash: %v", err)
	}
	if exit == nil || exit.Code != 7 {
		t.Fatalf("exit through the wait across the crash: %+v, want 7", exit)
	}
	if _, err := f.client.Delete(ctx, "counter"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "keeper and monitor to exit", func() bool { return len(f.shimPids()) == 0 })
}

// A crash loop: each new monitor killed as soon as it shows, five times.
// A call made meanwhile waits through all of them.
func TestPodClientRidesOutAMonitorCrashLoop(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	f.run("sleeper", []string{"sleep", "3600"}, nil)
	killed := map[int]bool{}
	for len(killed) < 5 {
		pid := f.findShim("monitor")
		if pid == 0 || killed[pid] {
			time.Sleep(time.Millisecond)
			continue
		}
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		killed[pid] = true
	}
	st, err := f.client.State(ctx, "sleeper")
	if err != nil || st.Status != shim.StatusRunning {
		t.Fatalf("state after a crash loop: %+v, %v", st, err)
	}
	if _, err := f.client.Delete(ctx, "sleeper"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "keeper and monitor to exit", func() bool { return len(f.shimPids()) == 0 })
}

// With the keeper gone too nobody restarts the monitor: a call fails at
// once with ErrNoShim, without waiting out MonitorRestartTimeout.
func TestPodClientGivesUpWithoutAKeeper(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.run("sleeper", []string{"sleep", "3600"}, nil)
	for _, mode := range []string{"keeper", "monitor"} {
		if err := syscall.Kill(f.shimPid(mode), syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "keeper and monitor to go", func() bool { return len(f.shimPids()) == 0 })
	// A deadline far below MonitorRestartTimeout: a call that waited for a
	// monitor would end with it instead.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := f.client.State(ctx, "sleeper"); !errors.Is(err, shim.ErrNoShim) {
		t.Fatalf("state with no keeper and no monitor: %v, want ErrNoShim", err)
	}
	// The container's init runs on, orphaned; the fixture's cleanup kills it.
}

// A keeper that lives but restarts no monitor (stopped here): a call
// waits MonitorRestartTimeout, then fails with ErrNoShim. Not parallel:
// it shortens the package's bound.
func TestPodClientWaitsBoundedForAMonitor(t *testing.T) {
	f := newFixture(t)
	f.run("sleeper", []string{"sleep", "3600"}, nil)
	defer func(d time.Duration) { shim.MonitorRestartTimeout = d }(shim.MonitorRestartTimeout)
	shim.MonitorRestartTimeout = 500 * time.Millisecond
	keeper := f.shimPid("keeper")
	if err := syscall.Kill(keeper, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(f.shimPid("monitor"), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_, err := f.client.State(context.Background(), "sleeper")
	if err := syscall.Kill(keeper, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(err, shim.ErrNoShim) {
		t.Fatalf("state with no monitor coming back: %v, want ErrNoShim", err)
	}
	// Continued, the keeper restarts it, and the next call gets through.
	st, err := f.client.State(context.Background(), "sleeper")
	if err != nil || st.Status != shim.StatusRunning {
		t.Fatalf("state after the keeper went on: %+v, %v", st, err)
	}
	if _, err := f.client.Delete(context.Background(), "sleeper"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "keeper and monitor to exit", func() bool { return len(f.shimPids()) == 0 })
}

// Whether the node's monitor serves a pod is its own answer, given only
// once it adopted what its keeper holds: a pod it did not adopt (added,
// no container held) is lost at once and definitely; a pod it adopted is
// never given up on, however long the monitor takes to answer (stopped
// here with the pod's backlog full: the case a timing rule misread).
func TestPodClientAsksTheMonitorWhetherItServesThePod(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	f.run("sleeper", []string{"sleep", "3600"}, nil)
	empty, err := shim.Launch(ctx, bundletest.ShimBinary(t), filepath.Join(f.dir, "shims", strings.Repeat("q", 64)), "pod2")
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(f.shimPid("monitor"), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if _, err := empty.List(ctx); !errors.Is(err, shim.ErrNoShim) || !strings.Contains(err.Error(), "does not serve it") {
		t.Fatalf("list of a pod the next monitor did not adopt: %v, want ErrNoShim: does not serve it", err)
	}
	if st, err := f.client.State(ctx, "sleeper"); err != nil || st.Status != shim.StatusRunning {
		t.Fatalf("state of the adopted container: %+v, %v", st, err)
	}

	// Stop the monitor, fill the pod's backlog, and ask.
	monitor := f.shimPid("monitor")
	if err := syscall.Kill(monitor, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := true
	defer func() {
		if stopped {
			_ = syscall.Kill(monitor, syscall.SIGCONT)
		}
	}()
	var backlog []net.Conn
	defer func() {
		for _, c := range backlog {
			c.Close()
		}
	}()
	for {
		var c net.Conn
		err := proto.WithShortPath(proto.SocketPath(f.client.Dir()), func(p string) (err error) {
			c, err = net.Dial("unix", p)
			return err
		})
		if err != nil {
			if !errors.Is(err, syscall.EAGAIN) {
				t.Fatalf("fill the pod's backlog: %v", err)
			}
			break
		}
		backlog = append(backlog, c)
	}
	asked := make(chan error, 1)
	go func() {
		_, err := f.client.State(ctx, "sleeper")
		asked <- err
	}()
	time.Sleep(2 * time.Second) // longer than any grace a timing rule gave: a stimulus, not an assertion
	for _, c := range backlog {
		c.Close()
	}
	backlog = nil
	if err := syscall.Kill(monitor, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	stopped = false
	if err := <-asked; err != nil {
		t.Fatalf("state while the monitor was stopped with the pod's backlog full: %v", err)
	}
	if _, err := f.client.Delete(ctx, "sleeper"); err != nil {
		t.Fatal(err)
	}
}
