package integration

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/leakcheck"
	"github.com/berthcri/berth/internal/testutil/testimages"
)

const (
	loadLifecycles = 200
	loadParallel   = 8
	loadWarmup     = 10
	// rssTolerance is the bound: RSS after the run within 10% of
	// RSS after the warm-up.
	rssTolerance = 0.10
)

// vmRSS reads a process's resident set size in KiB from /proc.
func vmRSS(t *testing.T, pid int) int64 {
	t.Helper()
	f, err := os.Open(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		t.Fatalf("read berthd status: %v", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("parse VmRSS %q: %v", rest, err)
			}
			return kb
		}
	}
	t.Fatalf("no VmRSS in /proc/%d/status", pid)
	return 0
}

// settledRSS waits for berthd's RSS to stop falling (the Go runtime
// returns freed heap to the OS in the background, over a few seconds) and
// returns the lowest value seen.
func settledRSS(t *testing.T, pid int) int64 {
	t.Helper()
	low := vmRSS(t, pid)
	for i := 0; i < 10; i++ {
		time.Sleep(time.Second)
		if r := vmRSS(t, pid); r < low {
			low = r
		}
	}
	return low
}

// podLifecycle is what the kubelet does for one short-lived pod: run the
// sandbox, create and start two containers, exec into one, stop and
// remove the pod (which removes its containers).
func podLifecycle(ctx context.Context, d *berthdtest.Daemon, image, logDir string, n int) error {
	cfg := podConfig(fmt.Sprintf("load-%d", n))
	cfg.LogDirectory = logDir
	run, err := d.Runtime.RunPodSandbox(ctx, &criapi.RunPodSandboxRequest{Config: cfg})
	if err != nil {
		return fmt.Errorf("pod %d: RunPodSandbox: %w", n, err)
	}
	pod := run.PodSandboxId
	var ctrs []string
	for _, name := range []string{"first", "second"} {
		c, err := d.Runtime.CreateContainer(ctx, &criapi.CreateContainerRequest{
			PodSandboxId:  pod,
			SandboxConfig: cfg,
			Config: &criapi.ContainerConfig{
				Metadata: &criapi.ContainerMetadata{Name: name},
				Image:    &criapi.ImageSpec{Image: image},
				Command:  []string{"sleep", "3600"},
				LogPath:  name + ".log",
				Linux: &criapi.LinuxContainerConfig{SecurityContext: &criapi.LinuxContainerSecurityContext{
					NamespaceOptions: &criapi.NamespaceOption{Pid: criapi.NamespaceMode_CONTAINER},
				}},
			},
		})
		if err != nil {
			return fmt.Errorf("pod %d: CreateContainer %s: %w", n, name, err)
		}
		if _, err := d.Runtime.StartContainer(ctx, &criapi.StartContainerRequest{ContainerId: c.ContainerId}); err != nil {
			return fmt.Errorf("pod %d: StartContainer %s: %w", n, name, err)
		}
		ctrs = append(ctrs, c.ContainerId)
	}
	want := fmt.Sprintf("pod-%d", n)
	ex, err := d.Runtime.ExecSync(ctx, &criapi.ExecSyncRequest{ContainerId: ctrs[1], Cmd: []string{"echo", want}, Timeout: 30})
	if err != nil {
		return fmt.Errorf("pod %d: ExecSync: %w", n, err)
	}
	if ex.ExitCode != 0 || strings.TrimSpace(string(ex.Stdout)) != want {
		return fmt.Errorf("pod %d: ExecSync gave exit %d, stdout %q", n, ex.ExitCode, ex.Stdout)
	}
	if _, err := d.Runtime.StopPodSandbox(ctx, &criapi.StopPodSandboxRequest{PodSandboxId: pod}); err != nil {
		return fmt.Errorf("pod %d: StopPodSandbox: %w", n, err)
	}
	if _, err := d.Runtime.RemovePodSandbox(ctx, &criapi.RemovePodSandboxRequest{PodSandboxId: pod}); err != nil {
		return fmt.Errorf("pod %d: RemovePodSandbox: %w", n, err)
	}
	return nil
}

// runLifecycles runs lifecycles [from, to) with par workers and returns
// every error.
func runLifecycles(ctx context.Context, d *berthdtest.Daemon, image, logDir string, from, to, par int) []error {
	var (
		next int64 = int64(from) - 1
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
	)
	for w := 0; w < par; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				n := int(atomic.AddInt64(&next, 1))
				if n >= to {
					return
				}
				if err := podLifecycle(ctx, d, image, logDir, n); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	return errs
}

// TestLoad200PodLifecyclesAt8InParallel runs 200 pod lifecycles (pod, two
// containers started, one exec, stop and remove) 8 at a time against one
// daemon, and checks there was no error, nothing leaked, and berthd's RSS
// came back to within 10% of where it was after a warm-up.
func TestLoad200PodLifecyclesAt8InParallel(t *testing.T) {
	if testing.Short() {
		t.Skip("load test: skipped with -short")
	}
	t.Parallel()
	d := berthdtest.Start(t, berthdtest.Options{})
	reg := testimages.StartRegistry(t)
	reg.PushStandard(t)
	image := reg.Ref("busybox:latest")
	pull(t, d, image, nil)
	logDir := filepath.Join(d.Dir, "podlogs")
	scope := leakcheck.ForDaemon(d)
	scope.Root = d.Root
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()

	// Warm-up: the bridge, IPAM lock files, the shim binary's page cache,
	// gRPC connections and the Go heap reach their working size.
	if errs := runLifecycles(ctx, d, image, logDir, 0, loadWarmup, loadParallel); len(errs) > 0 {
		t.Fatalf("warm-up: %d errors, first: %v", len(errs), errs[0])
	}
	before := leakcheck.Take(t, scope)
	pid := d.Pid()
	startRSS := settledRSS(t, pid)

	start := time.Now()
	errs := runLifecycles(ctx, d, image, logDir, loadWarmup, loadWarmup+loadLifecycles, loadParallel)
	elapsed := time.Since(start)
	t.Logf("%d pod lifecycles at %d in parallel took %v (%.2f lifecycles/s)",
		loadLifecycles, loadParallel, elapsed.Round(time.Millisecond), float64(loadLifecycles)/elapsed.Seconds())
	if len(errs) > 0 {
		for i, err := range errs {
			if i == 10 {
				t.Errorf("... and %d more", len(errs)-10)
				break
			}
			t.Error(err)
		}
		t.Fatalf("%d of %d lifecycles failed", len(errs), loadLifecycles)
	}

	// Nothing is listed any more, and nothing is left on the node.
	pods, err := d.Runtime.ListPodSandbox(ctx, &criapi.ListPodSandboxRequest{})
	if err != nil || len(pods.Items) != 0 {
		t.Fatalf("after the run: %d pods listed, %v", len(pods.GetItems()), err)
	}
	ctrs, err := d.Runtime.ListContainers(ctx, &criapi.ListContainersRequest{})
	if err != nil || len(ctrs.Containers) != 0 {
		t.Fatalf("after the run: %d containers listed, %v", len(ctrs.GetContainers()), err)
	}
	leakcheck.CheckSettled(t, scope, before, leakcheck.Take(t, scope))

	if d.Pid() != pid {
		t.Fatalf("berthd restarted during the run (pid %d, was %d)", d.Pid(), pid)
	}
	endRSS := settledRSS(t, pid)
	growth := float64(endRSS-startRSS) / float64(startRSS)
	t.Logf("berthd VmRSS: %d KiB after warm-up, %d KiB after the run (%+.1f%%)", startRSS, endRSS, 100*growth)
	if growth > rssTolerance {
		t.Fatalf("berthd RSS grew from %d KiB to %d KiB (%+.1f%%), more than %.0f%%",
			startRSS, endRSS, 100*growth, 100*rssTolerance)
	}
}

// shimMonitors counts the berth-shim monitors serving this daemon's pods
// (one per node, decision 1701).
func shimMonitors(d *berthdtest.Daemon) int {
	n := 0
	for _, pid := range berthdtest.PidsMentioning(d.State) {
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if strings.TrimSpace(string(comm)) == "berth-shim" && strings.Contains(string(cmd), "\x00monitor\x00") {
			n++
		}
	}
	return n
}

// TestLoadConcurrentRPCsOnOnePod sends many RPCs at once to the same pod:
// 8 containers created and started together in a pod that has no shim
// yet, while status, list and exec calls run beside them. Every call must
// succeed, the pod must end up with exactly one shim, and stop and remove
// must leave nothing behind.
func TestLoadConcurrentRPCsOnOnePod(t *testing.T) {
	t.Parallel()
	e := newCtrEnv(t)
	scope := leakcheck.ForDaemon(e.d)
	scope.Root = e.d.Root
	stopRemove(t, e.d, e.pod) // warm up: bridge, lock files
	before := leakcheck.Take(t, scope)
	e.podCfg = podConfig("same-pod")
	e.podCfg.LogDirectory = e.logDir
	e.pod = runPod(t, e.d, e.podCfg)
	ctx := berthdtest.Ctx(t)

	const creators = 8
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
		ids  []string
	)
	fail := func(err error) {
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
	}
	for i := 0; i < creators; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cfg := e.config(fmt.Sprintf("c%d", i), "sleep", "3600")
			c, err := e.d.Runtime.CreateContainer(ctx, &criapi.CreateContainerRequest{PodSandboxId: e.pod, Config: cfg, SandboxConfig: e.podCfg})
			if err != nil {
				fail(fmt.Errorf("create c%d: %w", i, err))
				return
			}
			if _, err := e.d.Runtime.StartContainer(ctx, &criapi.StartContainerRequest{ContainerId: c.ContainerId}); err != nil {
				fail(fmt.Errorf("start c%d: %w", i, err))
				return
			}
			// Exec and status on this container while others are created.
			ex, err := e.d.Runtime.ExecSync(ctx, &criapi.ExecSyncRequest{ContainerId: c.ContainerId, Cmd: []string{"true"}, Timeout: 30})
			if err != nil || ex.ExitCode != 0 {
				fail(fmt.Errorf("exec in c%d: %v, %v", i, ex, err))
				return
			}
			mu.Lock()
			ids = append(ids, c.ContainerId)
			mu.Unlock()
		}()
	}
	for i := 0; i < 2; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 20; j++ {
				if _, err := e.d.Runtime.PodSandboxStatus(ctx, &criapi.PodSandboxStatusRequest{PodSandboxId: e.pod}); err != nil {
					fail(fmt.Errorf("pod status: %w", err))
				}
				if _, err := e.d.Runtime.ListContainers(ctx, &criapi.ListContainersRequest{Filter: &criapi.ContainerFilter{PodSandboxId: e.pod}}); err != nil {
					fail(fmt.Errorf("list: %w", err))
				}
			}
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d concurrent calls failed, first: %v", len(errs), errs[0])
	}
	for _, id := range ids {
		if st := e.status(id); st.State != criapi.ContainerState_CONTAINER_RUNNING {
			t.Fatalf("container %s is %v, want running", id, st.State)
		}
	}
	if n := shimMonitors(e.d); n != 1 {
		t.Fatalf("the node has %d shim monitors after concurrent creates, want 1", n)
	}
	stopRemove(t, e.d, e.pod)
	leakcheck.CheckSettled(t, scope, before, leakcheck.Take(t, scope))
}
