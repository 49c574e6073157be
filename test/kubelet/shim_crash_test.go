package kubelet

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/leakcheck"
)

// A pod whose container logs a line every 100 ms, with a marker in its
// command line so the test can count its processes, and an exec
// readiness probe.
const loggerPod = `apiVersion: v1
kind: Pod
metadata:
  name: {{NAME}}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: logger
    image: {{BUSYBOX}}
    command: [sh, -c, "trap 'exit 0' TERM; echo {{MARKER}}; while true; do echo tick; sleep 0.1; done"]
    readinessProbe:
      exec: {command: ["true"]}
      periodSeconds: 1
      timeoutSeconds: 10
`

// doomedPod is the pod TestKubeletShimCrash/monitor-hung deletes while
// the monitor hangs.
const doomedPod = "logger-doomed"

// processesWith counts the processes whose command line holds s.
func processesWith(s string) int { return len(pidsWith(s)) }

// TestKubeletShimCrash kills the node's berth-shim monitor, and in
// another kubelet its keeper, with SIGKILL under several running pods
// (decision 1701); in a third it stops the monitor with SIGSTOP and leaves
// it hung until the keeper's watchdog replaces it (decision 3300). The kubelet must restart nothing: the same container, the same
// restart count, one process per container, every pod Ready again (and,
// while the monitor hangs, throughout) and its logs growing; then the
// pods go and leave nothing.
func TestKubeletShimCrash(t *testing.T) {
	t.Parallel()
	berthdtest.RequireRoot(t)
	bins := k8sBins(t, "kubelet")
	for _, victim := range []string{"monitor", "keeper", "monitor-hung"} {
		t.Run(victim, func(t *testing.T) {
			t.Parallel()
			testKubeletShimCrash(t, bins, victim)
		})
	}
}

func testKubeletShimCrash(t *testing.T, bins, victim string) {
	e := newEnv(t, bins, envOptions{})
	k := e.k
	scope := e.leakScope()
	before := leakcheck.Take(t, scope)
	names := []string{"logger-a", "logger-b", "logger-c"}
	marker := func(name string) string { return "berth-shim-crash-" + k.NodeName + "-" + name }
	for _, name := range names {
		k.Apply(t, name, render(loggerPod, map[string]string{"NAME": name, "BUSYBOX": busyboxImage, "MARKER": marker(name)}))
	}
	// The hung case has one more pod, deleted while the monitor hangs:
	// the kubelet's stop of its container then waits on the monitor.
	hung := victim == "monitor-hung"
	if hung {
		k.Apply(t, doomedPod, render(loggerPod, map[string]string{"NAME": doomedPod, "BUSYBOX": busyboxImage, "MARKER": marker(doomedPod)}))
		k.WaitPod(t, doomedPod, "Ready", 3*time.Minute, podReady)
	}
	was := map[string]ctrInstance{}
	for _, name := range names {
		p := k.WaitPod(t, name, "Ready", 3*time.Minute, podReady)
		was[name] = instances(p)["logger"]
		if n := processesWith(marker(name)); n != 1 {
			t.Fatalf("pod %s: %d processes of its container before the crash, want 1", name, n)
		}
	}

	event := "the " + victim + "'s crash"
	if hung {
		event = "the monitor's hang"
		hangMonitor(t, e, names, was)
		k.WaitGone(t, doomedPod, 2*time.Minute)
	} else {
		pids := berthdtest.ShimPids(e.d.State, victim)
		if len(pids) != 1 {
			t.Fatalf("%d berth-shim %s processes, want 1", len(pids), victim)
		}
		if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		if victim == "monitor" {
			waitFor(t, "the keeper's next monitor", time.Minute, func() bool {
				m := berthdtest.ShimPids(e.d.State, "monitor")
				return len(m) == 1 && m[0] != pids[0]
			})
		}
	}
	// Several of the kubelet's relists (1 s each) and probes: a container
	// berthd wrongly called exited would be restarted meanwhile. A soak,
	// not a timing assertion.
	time.Sleep(5 * time.Second)
	for _, name := range names {
		p := k.WaitPod(t, name, "Ready after "+event, 2*time.Minute, podReady)
		if now := instances(p)["logger"]; now != was[name] {
			t.Errorf("pod %s: container %+v after %s, was %+v (restarted)", name, now, event, was[name])
		}
		if n := processesWith(marker(name)); n != 1 {
			t.Errorf("pod %s: %d processes of its container after %s, want 1", name, n, event)
		}
		if out := k.MustRun(t, name, "logger", "echo", "alive"); strings.TrimSpace(out) != "alive" {
			t.Errorf("pod %s: exec after %s: %q", name, event, out)
		}
		logs := func() int {
			s, err := k.Logs(name, "logger", nil)
			if err != nil {
				t.Logf("pod %s's log: %v", name, err)
			}
			return strings.Count(s, "tick")
		}
		n := logs()
		waitFor(t, "pod "+name+"'s log to grow", time.Minute, func() bool { return logs() > n })
	}
	ctrs, err := e.d.Runtime.ListContainers(context.Background(), &criapi.ListContainersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	running := 0
	for _, c := range ctrs.Containers {
		if c.Labels["io.kubernetes.pod.name"] == k.PodName(doomedPod) {
			// Stopped, and the kubelet's container GC removes it later.
			continue
		}
		running++
		if c.State != criapi.ContainerState_CONTAINER_RUNNING {
			t.Errorf("container %s (%s) is %s after %s", c.Id, c.Metadata.GetName(), c.State, event)
		}
	}
	if running != len(names) {
		t.Errorf("%d containers after %s, want %d", running, event, len(names))
	}
	if hung {
		// Converged: a container that dies now is restarted by the
		// kubelet as usual, through the keeper's next monitor.
		restartAfterHang(t, k, names[0], marker(names[0]), was[names[0]])
	}

	for _, name := range names {
		k.Delete(t, name)
	}
	for _, name := range names {
		k.WaitGone(t, name, 2*time.Minute)
	}
	waitFor(t, "the kubelet to remove every sandbox and container", 150*time.Second, func() bool {
		sbs, err1 := e.d.Runtime.ListPodSandbox(context.Background(), &criapi.ListPodSandboxRequest{})
		ctrs, err2 := e.d.Runtime.ListContainers(context.Background(), &criapi.ListContainersRequest{})
		return err1 == nil && err2 == nil && len(sbs.Items) == 0 && len(ctrs.Containers) == 0
	})
	var left []string
	deadline := time.Now().Add(time.Minute)
	for {
		left = e.leaks(before)
		for _, name := range append(names, doomedPod) {
			if processesWith(marker(name)) > 0 {
				left = append(left, "process of pod "+name)
			}
		}
		if len(berthdtest.ShimPids(e.d.State, "keeper"))+len(berthdtest.ShimPids(e.d.State, "monitor")) > 0 {
			left = append(left, "berth-shim processes")
		}
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("left a minute after the pods went:\n%s", strings.Join(left, "\n"))
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// hangMonitor stops the node's monitor with SIGSTOP, deletes doomedPod
// (the kubelet's stop of its container waits on the monitor, holding the
// container's lock in berthd), and watches the kubelet until the
// keeper's watchdog has killed the hung monitor and started the next
// (decision 3300: 10 s unanswered, pinged every 5 s). Meanwhile every
// pod of names stays Running and Ready with the same container (the
// exec readiness probes go on answering), their logs read through the
// kubelet, and the kubelet's PLEG goes on relisting: its relist count
// grows while the monitor is stopped. A relist stuck behind the monitor
// would freeze that count and, after 3 minutes, turn the node NotReady
// ("PLEG is not healthy"); that line must not appear in its log.
func hangMonitor(t *testing.T, e *env, names []string, was map[string]ctrInstance) {
	t.Helper()
	k := e.k
	pids := berthdtest.ShimPids(e.d.State, "monitor")
	if len(pids) != 1 {
		t.Fatalf("%d berth-shim monitor processes, want 1", len(pids))
	}
	hungPid := pids[0]
	logMark := len(k.Log())
	relistsBefore := plegRelists(t, k)
	if err := syscall.Kill(hungPid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// A failure below must not leave the monitor stopped for the
	// teardown (the watchdog would replace it anyway, 15 s later).
	t.Cleanup(func() {
		if procState(hungPid) == 'T' {
			_ = syscall.Kill(hungPid, syscall.SIGCONT)
		}
	})
	waitFor(t, "the monitor to stop", 10*time.Second, func() bool { return procState(hungPid) == 'T' })
	start := time.Now()
	k.Delete(t, doomedPod)

	// While it hangs: the same pid, stopped, and no other monitor.
	stillHung := func() bool {
		m := berthdtest.ShimPids(e.d.State, "monitor")
		return len(m) == 1 && m[0] == hungPid && procState(hungPid) == 'T'
	}
	var relistsHung int
	polls := 0
	for stillHung() {
		// The watchdog's bound is 15 s and a restart (decision 3300);
		// a minute is its failure, not a slow machine.
		if time.Since(start) > time.Minute {
			t.Fatalf("the monitor %d still hangs %s after it stopped: no watchdog replaced it", hungPid, time.Since(start).Round(time.Second))
		}
		polls++
		for _, name := range names {
			p := k.Pod(t, name)
			if p == nil || p.Status.Phase != corev1.PodRunning || !podReady(p) {
				st := "gone"
				if p != nil {
					st = fmt.Sprintf("%s, ready %v", p.Status.Phase, podReady(p))
				}
				t.Fatalf("pod %s is %s %s into the monitor's hang", name, st, time.Since(start).Round(time.Millisecond))
			}
			if now := instances(p)["logger"]; now != was[name] {
				t.Fatalf("pod %s: container %+v while the monitor hangs, was %+v (restarted)", name, now, was[name])
			}
			if polls%4 == 1 {
				if s, err := k.Logs(name, "logger", url.Values{"tailLines": {"1"}}); err != nil || !strings.Contains(s, "tick") {
					t.Fatalf("pod %s's log through the kubelet while the monitor hangs: %q, %v", name, s, err)
				}
			}
		}
		if polls == 2 {
			// The kubelet's stats (eviction manager, /stats/summary)
			// read through berth's stats RPCs, which must not wait either.
			summaryHasPods(t, k, names)
		}
		if stillHung() {
			// Counted only while the same monitor is still stopped.
			relistsHung = plegRelists(t, k) - relistsBefore
		}
		time.Sleep(300 * time.Millisecond)
	}
	hungFor := time.Since(start)
	var next []int
	waitFor(t, "the keeper's next monitor", time.Minute, func() bool {
		next = berthdtest.ShimPids(e.d.State, "monitor")
		return len(next) == 1 && next[0] != hungPid
	})
	if err := syscall.Kill(hungPid, 0); err == nil && procState(hungPid) != 'Z' {
		t.Errorf("the hung monitor %d is still alive beside the next one %d", hungPid, next[0])
	}
	t.Logf("monitor %d hung %s (replaced by %d); the kubelet's PLEG relisted %d times meanwhile; %d polls of /pods",
		hungPid, hungFor.Round(time.Millisecond), next[0], relistsHung, polls)
	// Before the SIGSTOP at most one relist was in flight: more than two
	// ended after the monitor had stopped.
	if relistsHung < 3 {
		t.Errorf("the kubelet's PLEG relisted %d times while the monitor hung for %s: stalled behind it", relistsHung, hungFor.Round(time.Millisecond))
	}
	if log := k.Log()[logMark:]; strings.Contains(log, "PLEG is not healthy") {
		t.Errorf("the kubelet found PLEG unhealthy during the monitor's hang:\n%s", k.LogTail(100))
	}
	hc := &http.Client{Timeout: 5 * time.Second}
	resp, err := hc.Get(fmt.Sprintf("http://127.0.0.1:%d/healthz", k.HealthzPort))
	if err != nil {
		t.Fatalf("kubelet healthz after the monitor's hang: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("kubelet healthz after the monitor's hang: %d %s", resp.StatusCode, body)
	}
}

// restartAfterHang kills pod's container with SIGKILL once the hung
// monitor has been replaced: the kubelet sees it exit and starts the
// next instance (restart count one more, a new ID), which runs, is
// Ready and execs.
func restartAfterHang(t *testing.T, k *kubelet, pod, marker string, was ctrInstance) {
	t.Helper()
	pids := pidsWith(marker)
	if len(pids) != 1 {
		t.Fatalf("pod %s: %d processes of its container, want 1", pod, len(pids))
	}
	if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	p := k.WaitPod(t, pod, "restarted and Ready after its container was killed", 2*time.Minute, func(p *corev1.Pod) bool {
		now := instances(p)["logger"]
		return podReady(p) && now.restarts == was.restarts+1 && now.id != was.id
	})
	if now := instances(p)["logger"]; now.restarts != was.restarts+1 {
		t.Errorf("pod %s: restart count %d after one kill, was %d", pod, now.restarts, was.restarts)
	}
	if s := terminated(p, "logger"); s != nil {
		t.Errorf("pod %s: container terminated after its restart: %+v", pod, s)
	}
	if st := ctrStatus(p, "logger"); st == nil || st.LastTerminationState.Terminated == nil || st.LastTerminationState.Terminated.ExitCode != 137 {
		t.Errorf("pod %s: last termination after a SIGKILL: %+v, want exit code 137", pod, st)
	}
	waitFor(t, "one process of pod "+pod+"'s restarted container", time.Minute, func() bool { return processesWith(marker) == 1 })
	if out := k.MustRun(t, pod, "logger", "echo", "alive"); strings.TrimSpace(out) != "alive" {
		t.Errorf("pod %s: exec after its restart: %q", pod, out)
	}
}

// pidsWith lists the processes whose command line holds s.
//
// A child the process forked and has not exec'd yet (the logger's
// `sleep 0.1`, ten times a second) still shows its parent's command line:
// a process whose parent holds s too is that, not another instance, and
// is not counted (monitor-hung once saw "2 processes of its container").
func pidsWith(s string) []int {
	holds := func(pid int) bool {
		cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		return err == nil && strings.Contains(string(cmd), s)
	}
	var pids []int
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		pid, err := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		if err != nil || !holds(pid) {
			continue
		}
		if ppid := leakcheck.ParentPid(pid); ppid > 0 && holds(ppid) {
			continue
		}
		pids = append(pids, pid)
	}
	return pids
}

// procState is a process's state letter from /proc/PID/stat (T:
// stopped, Z: a zombie), 0 if it is gone.
func procState(pid int) byte {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command name, in parentheses, may hold spaces: the state
	// follows its closing one.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 || i+2 >= len(data) {
		return 0
	}
	return data[i+2]
}

// plegRelists is how many relists the kubelet's PLEG has finished: the
// count of its kubelet_pleg_relist_duration_seconds histogram.
func plegRelists(t *testing.T, k *kubelet) int {
	t.Helper()
	body, err := k.Get(k.APIURL("/metrics", nil))
	if err != nil {
		t.Fatalf("kubelet /metrics: %v", err)
	}
	for _, l := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(l, "kubelet_pleg_relist_duration_seconds_count "); ok {
			n, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				t.Fatalf("kubelet /metrics: %q: %v", l, err)
			}
			return int(n)
		}
	}
	t.Fatalf("kubelet /metrics has no kubelet_pleg_relist_duration_seconds_count")
	return 0
}

// summaryHasPods reads the kubelet's /stats/summary and checks that it
// holds each pod of names with its container.
func summaryHasPods(t *testing.T, k *kubelet, names []string) {
	t.Helper()
	body, err := k.Get(k.APIURL("/stats/summary", nil))
	if err != nil {
		t.Fatalf("kubelet /stats/summary while the monitor hangs: %v", err)
	}
	var sum struct {
		Pods []struct {
			PodRef struct {
				Name string `json:"name"`
			} `json:"podRef"`
			Containers []struct {
				Name string `json:"name"`
			} `json:"containers"`
		} `json:"pods"`
	}
	if err := json.Unmarshal(body, &sum); err != nil {
		t.Fatalf("decode /stats/summary: %v", err)
	}
	for _, name := range names {
		found := false
		for _, p := range sum.Pods {
			found = found || (p.PodRef.Name == k.PodName(name) && len(p.Containers) == 1 && p.Containers[0].Name == "logger")
		}
		if !found {
			t.Errorf("pod %s not in the kubelet's /stats/summary while the monitor hangs:\n%s", name, body)
		}
	}
}
