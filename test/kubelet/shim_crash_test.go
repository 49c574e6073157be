package kubelet

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

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

// processesWith counts the processes whose command line holds s.
func processesWith(s string) int {
	n := 0
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		if cmd, err := os.ReadFile(p); err == nil && strings.Contains(string(cmd), s) {
			n++
		}
	}
	return n
}

// TestKubeletShimCrash kills the node's berth-shim monitor, and in
// another kubelet its keeper, with SIGKILL under several running pods
// (issue #27). The kubelet must restart nothing: the same container, the
// same restart count, one process per container, every pod Ready again
// and its logs growing; then the pods go and leave nothing.
func TestKubeletShimCrash(t *testing.T) {
	t.Parallel()
	berthdtest.RequireRoot(t)
	bins := k8sBins(t, "kubelet")
	for _, victim := range []string{"monitor", "keeper"} {
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
	was := map[string]ctrInstance{}
	for _, name := range names {
		p := k.WaitPod(t, name, "Ready", 3*time.Minute, podReady)
		was[name] = instances(p)["logger"]
		if n := processesWith(marker(name)); n != 1 {
			t.Fatalf("pod %s: %d processes of its container before the crash, want 1", name, n)
		}
	}

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
	// Several of the kubelet's relists (1 s each) and probes: a container
	// berthd wrongly called exited would be restarted meanwhile. A soak,
	// not a timing assertion.
	time.Sleep(5 * time.Second)
	for _, name := range names {
		p := k.WaitPod(t, name, "Ready after the "+victim+"'s crash", 2*time.Minute, podReady)
		if now := instances(p)["logger"]; now != was[name] {
			t.Errorf("pod %s: container %+v after the %s's crash, was %+v (restarted)", name, now, victim, was[name])
		}
		if n := processesWith(marker(name)); n != 1 {
			t.Errorf("pod %s: %d processes of its container after the %s's crash, want 1", name, n, victim)
		}
		if out := k.MustRun(t, name, "logger", "echo", "alive"); strings.TrimSpace(out) != "alive" {
			t.Errorf("pod %s: exec after the %s's crash: %q", name, victim, out)
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
	for _, c := range ctrs.Containers {
		if c.State != criapi.ContainerState_CONTAINER_RUNNING {
			t.Errorf("container %s (%s) is %s after the %s's crash", c.Id, c.Metadata.GetName(), c.State, victim)
		}
	}
	if len(ctrs.Containers) != len(names) {
		t.Errorf("%d containers after the %s's crash, want %d", len(ctrs.Containers), victim, len(names))
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
		for _, name := range names {
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
