package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/shim/shimfault"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/leakcheck"
)

// nodeLeakBaseline warms the daemon up (bridge, lock files: its first pod
// run and removed) and takes the leak snapshot the test ends against,
// once the node that pod started has ended: its monitor removes the
// node's dir file by file as it goes, and a snapshot taken meanwhile
// (a slow guest, a loaded CI) holds part of it, so a later node's dir
// would read as a leak of the parts it missed (the cgroup v2 lane once
// reported a lone shim.log so).
func nodeLeakBaseline(t *testing.T, e *ctrEnv) (leakcheck.Scope, leakcheck.Snapshot) {
	t.Helper()
	scope := leakcheck.ForDaemon(e.d)
	scope.Root = e.d.Root
	stopRemove(t, e.d, e.pod)
	waitNodeGone(t, e.d)
	return scope, leakcheck.Take(t, scope)
}

// oneKeeperOneMonitor returns the node's keeper and monitor (one pid
// each), failing when there are not exactly one of each.
func oneKeeperOneMonitor(t *testing.T, d *berthdtest.Daemon) (keepers, monitors []int) {
	t.Helper()
	keepers, monitors = berthdtest.ShimPids(d.State, "keeper"), berthdtest.ShimPids(d.State, "monitor")
	if len(keepers) != 1 || len(monitors) != 1 {
		t.Fatalf("keepers %v, monitors %v: want one of each", keepers, monitors)
	}
	return keepers, monitors
}

// waitNodeGone waits for the node's keeper and monitor to exit with its
// last pod.
func waitNodeGone(t *testing.T, d *berthdtest.Daemon) {
	t.Helper()
	waitUntil(t, "keeper and monitor to exit with the last pod", func() bool {
		return len(berthdtest.ShimPids(d.State, "keeper"))+len(berthdtest.ShimPids(d.State, "monitor")) == 0
	})
}

// killMonitor kills the node's monitor with SIGKILL and waits for the
// keeper's next one (the keeper unchanged); it returns the new pid.
func killMonitor(t *testing.T, d *berthdtest.Daemon) int {
	t.Helper()
	keepers, monitors := oneKeeperOneMonitor(t, d)
	if err := syscall.Kill(monitors[0], syscall.SIGKILL); err != nil {
		t.Fatalf("kill the monitor: %v", err)
	}
	var next int
	waitUntil(t, "the keeper's next monitor", func() bool {
		m := berthdtest.ShimPids(d.State, "monitor")
		if len(m) == 1 && m[0] != monitors[0] {
			next = m[0]
			return true
		}
		return false
	})
	if k := berthdtest.ShimPids(d.State, "keeper"); !slices.Equal(k, keepers) {
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
	scope, before := nodeLeakBaseline(t, e)

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
		// At the base commit the container was exited by now, exec refused.
		st := c.env.status(c.ctr)
		if st.State != criapi.ContainerState_CONTAINER_RUNNING {
			shimLog, _ := os.ReadFile(filepath.Join(e.d.State, "shims", ".node", "shim.log"))
			t.Fatalf("container %s after the monitor's crash: %s, exit %d, %s: %s\nshim.log:\n%s", c.ctr, st.State, st.ExitCode, st.Reason, st.Message, shimLog)
		}
		if out := c.env.exec(c.ctr, "echo", "alive"); out != "alive" {
			t.Fatalf("exec in %s after the monitor's crash: %q", c.ctr, out)
		}
		size := logSize(t, st.LogPath)
		waitUntil(t, "the log to grow after the monitor's crash", func() bool { return logSize(t, st.LogPath) > size })
	}
	list, err := e.d.Runtime.ListContainers(berthdtest.Ctx(t), &criapi.ListContainersRequest{})
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
		if _, err := e.d.Runtime.StopContainer(berthdtest.Ctx(t), &criapi.StopContainerRequest{ContainerId: c.ctr, Timeout: 30}); err != nil {
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
	waitNodeGone(t, e.d)
	leakcheck.CheckSettled(t, scope, before, leakcheck.Take(t, scope))
}

// ctrPid is the container's init pid as berthd recorded it.
func (e *ctrEnv) ctrPid(id string) int {
	e.t.Helper()
	resp, err := e.d.Runtime.ContainerStatus(berthdtest.Ctx(e.t), &criapi.ContainerStatusRequest{ContainerId: id, Verbose: true})
	if err != nil {
		e.t.Fatalf("ContainerStatus: %v", err)
	}
	var rec struct {
		Pid int `json:"pid"`
	}
	if err := json.Unmarshal([]byte(resp.Info["info"]), &rec); err != nil || rec.Pid == 0 {
		e.t.Fatalf("no pid in %q: %v", resp.Info["info"], err)
	}
	return rec.Pid
}

// processRuns tells whether pid runs (exists and is no zombie).
func processRuns(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && i+2 < len(s) && s[i+2] != 'Z'
}

// runtimeIDs lists the containers berthd's runc knows.
func runtimeIDs(t *testing.T, d *berthdtest.Daemon) []string {
	t.Helper()
	out, err := exec.Command("runc", "--root", filepath.Join(d.State, "runtime", "runc"), "list", "-q").CombinedOutput()
	if err != nil {
		t.Fatalf("runc list: %v: %s", err, out)
	}
	return strings.Fields(string(out))
}

// listed maps berthd's containers to their states.
func listed(t *testing.T, d *berthdtest.Daemon) map[string]criapi.ContainerState {
	t.Helper()
	list, err := d.Runtime.ListContainers(berthdtest.Ctx(t), &criapi.ListContainersRequest{})
	if err != nil {
		t.Fatalf("ListContainers: %v", err)
	}
	m := map[string]criapi.ContainerState{}
	for _, c := range list.Containers {
		m[c.Id] = c.State
	}
	return m
}

// checkAgrees checks that berthd's view of the containers matches their
// processes: a container listed running has its init running, one listed
// exited has none, and runc knows no container berthd does not list.
func (e *ctrEnv) checkAgrees() {
	e.t.Helper()
	ls := listed(e.t, e.d)
	for id, st := range ls {
		if st != criapi.ContainerState_CONTAINER_RUNNING {
			continue
		}
		if pid := e.ctrPid(id); !processRuns(pid) {
			e.t.Errorf("container %s is running for berthd, its init %d is not", id, pid)
		}
	}
	for _, id := range runtimeIDs(e.t, e.d) {
		if _, ok := ls[id]; !ok {
			e.t.Errorf("runc holds container %s, which berthd does not list", id)
		}
	}
}

// A kill -9 of the monitor while containers run, exit and are created:
// afterwards berthd's view (status, list, events) matches the processes.
// Each create either succeeded, its container created and then started,
// or failed and left nothing; the container that exited meanwhile shows
// its own exit code; the others run on.
func TestMonitorCrashAmidCreatesAndExits(t *testing.T) {
	t.Parallel()
	e := newCtrEnv(t)
	scope, before := nodeLeakBaseline(t, e)
	pe := e.podEnv(podConfig("amid"))

	evCtx, stopEvents := context.WithCancel(context.Background())
	defer stopEvents()
	events, err := e.d.Runtime.GetContainerEvents(evCtx, &criapi.GetEventsRequest{})
	if err != nil {
		t.Fatalf("GetContainerEvents: %v", err)
	}
	var (
		evMu    sync.Mutex
		stopped = map[string]int{}
	)
	evDone := make(chan struct{})
	go func() {
		defer close(evDone)
		for {
			ev, err := events.Recv()
			if err != nil {
				return
			}
			if ev.ContainerEventType == criapi.ContainerEventType_CONTAINER_STOPPED_EVENT {
				evMu.Lock()
				stopped[ev.ContainerId]++
				evMu.Unlock()
			}
		}
	}()

	logger := pe.run(pe.config("logger", "sh", "-c", loggerScript(21)))
	quitter := pe.run(pe.config("quitter", "sh", "-c", "sleep 0.3; exit 3"))

	// Creates and starts in a loop, the monitor killed in their midst.
	created := make(chan string, 64)
	stopCreating := make(chan struct{})
	creating := make(chan struct{})
	go func() {
		defer close(creating)
		for i := 0; ; i++ {
			select {
			case <-stopCreating:
				return
			default:
			}
			cfg := pe.config(fmt.Sprintf("new-%d", i), "sleep", "3600")
			resp, err := e.d.Runtime.CreateContainer(berthdtest.Ctx(t), &criapi.CreateContainerRequest{PodSandboxId: pe.pod, Config: cfg, SandboxConfig: pe.podCfg})
			if err != nil {
				t.Logf("create new-%d: %v", i, err)
				continue
			}
			if _, err := e.d.Runtime.StartContainer(berthdtest.Ctx(t), &criapi.StartContainerRequest{ContainerId: resp.ContainerId}); err != nil {
				t.Logf("start new-%d: %v", i, err)
			}
			created <- resp.ContainerId
		}
	}()
	waitUntil(t, "a first create", func() bool { return len(created) > 0 })
	time.Sleep(150 * time.Millisecond) // into quitter's last moments: not an assertion
	killMonitor(t, e.d)
	waitUntil(t, "creates after the monitor's restart", func() bool { return len(created) > 3 })
	close(stopCreating)
	<-creating
	close(created)

	if st := pe.waitExited(quitter); st.ExitCode != 3 || st.Reason != "Error" {
		t.Fatalf("quitter: exit %d (%s: %s), want 3", st.ExitCode, st.Reason, st.Message)
	}
	if st := pe.status(logger); st.State != criapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("logger after the monitor's crash: %s (%s: %s)", st.State, st.Reason, st.Message)
	}
	pe.exec(logger, "true")
	for id := range created {
		if st := pe.status(id); st.State != criapi.ContainerState_CONTAINER_RUNNING {
			// A start cut by the crash was answered by the next monitor.
			t.Errorf("created and started %s: %s (%s: %s)", id, st.State, st.Reason, st.Message)
		}
	}
	pe.checkAgrees()

	if _, err := e.d.Runtime.StopContainer(berthdtest.Ctx(t), &criapi.StopContainerRequest{ContainerId: logger, Timeout: 30}); err != nil {
		t.Fatalf("StopContainer: %v", err)
	}
	if st := pe.status(logger); st.ExitCode != 21 {
		t.Fatalf("logger stopped: exit %d (%s), want 21", st.ExitCode, st.Reason)
	}
	stopRemove(t, e.d, pe.pod)
	waitNodeGone(t, e.d)
	stopEvents()
	<-evDone
	evMu.Lock()
	for id, n := range stopped {
		if n != 1 {
			t.Errorf("container %s: %d stopped events, want 1", id, n)
		}
	}
	if stopped[quitter] != 1 || stopped[logger] != 1 {
		t.Errorf("stopped events: %v; want one for quitter %s and logger %s", stopped, quitter, logger)
	}
	evMu.Unlock()
	leakcheck.CheckSettled(t, scope, before, leakcheck.Take(t, scope))
}

// shimFaultCase is one shim crash point (package shimfault), armed once
// a pod with a running logger exists; op meets it, check says what the
// node looks like after.
type shimFaultCase struct {
	point shimfault.Point
	times int
	op    func(e *ctrEnv, logger string) (created string)
	// keeperGone: the point kills the keeper, so the running logger's
	// exit code is lost (decision 1701: 255).
	keeperGone bool
}

var shimFaultCases = []shimFaultCase{
	// A crash loop: the monitor killed, and its next three die while they
	// adopt. The fourth adopts everything; nothing was lost meanwhile.
	{point: shimfault.MonitorMidAdopt, times: 3, op: func(e *ctrEnv, logger string) string {
		killMonitor(e.t, e.d)
		return ""
	}},
	// A create cut after the keeper holds the container, and one cut
	// before: either way the create fails and is undone (the next
	// monitor adopted it, or nobody holds it but runc).
	{point: shimfault.MonitorMidCreate, times: 1, op: createCut},
	{point: shimfault.MonitorMidCreateUnheld, times: 1, op: createCut},
	// A start cut after the runtime started the process, before the
	// keeper heard: the next monitor asks the runtime, the cut start is
	// answered by it (running), and nothing starts twice.
	{point: shimfault.MonitorMidStart, times: 1, op: func(e *ctrEnv, logger string) string {
		id := e.create(e.config("target", "sleep", "3600"))
		e.start(id)
		return id
	}},
	// The keeper dies as a create registers with it: the monitor runs on
	// orphaned (its containers' exit codes lost), the create answers as
	// the monitor saw it, and a new keeper and monitor take new pods.
	{point: shimfault.KeeperMidCreate, times: 1, keeperGone: true, op: func(e *ctrEnv, logger string) string {
		resp, err := e.d.Runtime.CreateContainer(berthdtest.Ctx(e.t), &criapi.CreateContainerRequest{PodSandboxId: e.pod, Config: e.config("target", "sleep", "3600"), SandboxConfig: e.podCfg})
		if err != nil {
			e.t.Logf("create with the keeper dying: %v", err)
			return ""
		}
		if _, err := e.d.Runtime.StartContainer(berthdtest.Ctx(e.t), &criapi.StartContainerRequest{ContainerId: resp.ContainerId}); err != nil {
			e.t.Logf("start with the keeper gone: %v", err)
		}
		return resp.ContainerId
	}},
}

// createCut creates a container with the monitor dying mid-create: the
// create must fail, and leave no container, runtime container or
// process behind; a create after works.
func createCut(e *ctrEnv, logger string) string {
	e.t.Helper()
	_, err := e.d.Runtime.CreateContainer(berthdtest.Ctx(e.t), &criapi.CreateContainerRequest{PodSandboxId: e.pod, Config: e.config("target", "sleep", "3600"), SandboxConfig: e.podCfg})
	if err == nil {
		e.t.Fatalf("a create cut by the monitor's crash succeeded")
	}
	if status.Code(err) != codes.Unavailable {
		e.t.Errorf("cut create: %v, want Unavailable", err)
	}
	if ls := listed(e.t, e.d); len(ls) != 1 {
		e.t.Fatalf("containers after a cut create: %v, want the logger only", ls)
	}
	if ids := runtimeIDs(e.t, e.d); !slices.Equal(ids, []string{logger}) {
		e.t.Fatalf("runc holds %v after a cut create, want the logger only", ids)
	}
	return e.run(e.config("after", "sleep", "3600"))
}

// TestShimFaultMatrix kills the node's monitor or keeper at each shim
// crash point while a pod's container logs; berthd's view must match the
// processes after, the running container must go on (and keep its exit
// code unless the keeper died), and teardown must leave nothing.
func TestShimFaultMatrix(t *testing.T) {
	t.Parallel()
	if len(shimFaultCases) != len(shimfault.Points) {
		t.Fatalf("the matrix has %d cases for %d shim crash points", len(shimFaultCases), len(shimfault.Points))
	}
	for _, c := range shimFaultCases {
		t.Run(string(c.point), func(t *testing.T) {
			t.Parallel()
			faults := filepath.Join(t.TempDir(), "shim-faults")
			d := berthdtest.Start(t, berthdtest.Options{Env: []string{shimfault.EnvVar + "=" + faults}})
			e := newCtrEnvOn(t, d)
			scope, before := nodeLeakBaseline(t, e)
			pe := e.podEnv(podConfig("shim-fault"))
			logger := pe.run(pe.config("logger", "sh", "-c", loggerScript(31)))
			logPath := pe.status(logger).LogPath
			waitUntil(t, "the first log lines", func() bool { return logSize(t, logPath) > 0 })

			if err := shimfault.Arm(faults, c.point, c.times); err != nil {
				t.Fatal(err)
			}
			created := c.op(pe, logger)
			waitUntil(t, "the point to fire", func() bool {
				b, _ := os.ReadFile(filepath.Join(e.d.State, "shims", ".node", "fault-"+string(c.point)+".count"))
				return strings.TrimSpace(string(b)) == fmt.Sprint(c.times) || c.keeperGone
			})

			if st := pe.status(logger); st.State != criapi.ContainerState_CONTAINER_RUNNING {
				t.Fatalf("logger after %s: %s (%s: %s)\n%s", c.point, st.State, st.Reason, st.Message, e.d.Logs())
			}
			pe.exec(logger, "true")
			size := logSize(t, logPath)
			waitUntil(t, "the log to grow", func() bool { return logSize(t, logPath) > size })
			if created != "" {
				if st := pe.status(created); st.State != criapi.ContainerState_CONTAINER_RUNNING {
					t.Errorf("created %s: %s (%s: %s)", created, st.State, st.Reason, st.Message)
				}
			}
			pe.checkAgrees()

			pid := pe.ctrPid(logger)
			if _, err := e.d.Runtime.StopContainer(berthdtest.Ctx(t), &criapi.StopContainerRequest{ContainerId: logger, Timeout: 30}); err != nil {
				t.Fatalf("StopContainer: %v", err)
			}
			want := int32(31)
			if c.keeperGone {
				want = 255
			}
			if st := pe.status(logger); st.State != criapi.ContainerState_CONTAINER_EXITED || st.ExitCode != want {
				t.Fatalf("logger stopped: %s, exit %d (%s), want %d", st.State, st.ExitCode, st.Reason, want)
			}
			if processRuns(pid) {
				t.Fatalf("logger's init %d runs on, exited for berthd", pid)
			}
			stopRemove(t, e.d, pe.pod)
			waitNodeGone(t, e.d)
			leakcheck.CheckSettled(t, scope, before, leakcheck.Take(t, scope))
		})
	}
}

// Both the keeper and the monitor killed: nobody can report the running
// containers' exits any more. berthd records them exited (255, Unknown)
// after killing their processes, so none runs on unseen while the
// kubelet starts a replacement; a new pod gets a new keeper and monitor;
// teardown leaves nothing.
func TestKeeperAndMonitorKilledLeaveNoUnseenProcess(t *testing.T) {
	t.Parallel()
	e := newCtrEnv(t)
	scope, before := nodeLeakBaseline(t, e)
	var pods []*ctrEnv
	var ctrs []string
	var pids []int
	for i := 0; i < 2; i++ {
		pe := e.podEnv(podConfig(fmt.Sprintf("both-%d", i)))
		id := pe.run(pe.config("logger", "sh", "-c", loggerScript(41)))
		pods, ctrs, pids = append(pods, pe), append(ctrs, id), append(pids, pe.ctrPid(id))
	}
	keepers, monitors := oneKeeperOneMonitor(t, e.d)
	// The keeper first, so that it cannot restart the monitor.
	for _, pid := range []int{keepers[0], monitors[0]} {
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
	}
	for i, id := range ctrs {
		st := pods[i].waitExited(id)
		if st.ExitCode != 255 || st.Reason != "Unknown" {
			t.Errorf("container %s with no keeper and no monitor: exit %d (%s: %s), want 255 Unknown", id, st.ExitCode, st.Reason, st.Message)
		}
		if processRuns(pids[i]) {
			t.Errorf("container %s is exited for berthd, its init %d runs on", id, pids[i])
		}
	}
	pods[0].checkAgrees()
	// A new pod starts a new keeper and monitor.
	pe := e.podEnv(podConfig("both-after"))
	id := pe.run(pe.config("after", "sh", "-c", loggerScript(42)))
	pe.exec(id, "true")
	pods = append(pods, pe)
	for _, p := range pods {
		stopRemove(t, e.d, p.pod)
	}
	waitNodeGone(t, e.d)
	leakcheck.CheckSettled(t, scope, before, leakcheck.Take(t, scope))
}

// berthd down while the node's keeper and monitor both die: on its
// restart nobody serves the pod, so the running container is recorded
// exited 255 Unknown, and its process, still running, is killed first.
func TestRecoveryKillsContainersOfADeadShim(t *testing.T) {
	t.Parallel()
	e := newCtrEnv(t)
	scope, before := nodeLeakBaseline(t, e)
	pe := e.podEnv(podConfig("dead-shim"))
	id := pe.run(pe.config("logger", "sh", "-c", loggerScript(51)))
	pid := pe.ctrPid(id)
	e.d.Kill()
	keepers, monitors := oneKeeperOneMonitor(t, e.d)
	for _, p := range []int{keepers[0], monitors[0]} {
		if err := syscall.Kill(p, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
	}
	// Gone means dead to the kernel, not only nameless: a process being
	// killed loses its command line before it lets go of its descriptors,
	// and a keeper lock still held then makes the restarted berthd leave
	// the node's dir to a keeper it takes for alive.
	waitUntil(t, "keeper and monitor to go", func() bool {
		return !processRuns(keepers[0]) && !processRuns(monitors[0]) &&
			len(berthdtest.ShimPids(e.d.State, "keeper"))+len(berthdtest.ShimPids(e.d.State, "monitor")) == 0
	})
	if !processRuns(pid) {
		t.Fatalf("the container's init %d died with its shim", pid)
	}
	e.d.Start()
	e.d.WaitReady()
	st := pe.status(id)
	if st.State != criapi.ContainerState_CONTAINER_EXITED || st.ExitCode != 255 || st.Reason != "Unknown" {
		t.Fatalf("container of a dead shim after berthd's restart: %s, exit %d (%s: %s), want exited 255 Unknown", st.State, st.ExitCode, st.Reason, st.Message)
	}
	if processRuns(pid) {
		t.Fatalf("container %s is exited for berthd, its init %d runs on", id, pid)
	}
	pe.checkAgrees()
	stopRemove(t, e.d, pe.pod)
	leakcheck.CheckSettled(t, scope, before, leakcheck.Take(t, scope))
}
