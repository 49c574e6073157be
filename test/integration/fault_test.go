package integration

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/fault"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/leakcheck"
	"github.com/berthcri/berth/internal/testutil/testimages"
)

// faultEnv is one daemon of the fault matrix: an unrelated pod with a
// running container, started before any fault was armed, and the target
// pod and container (if the case prepared them).
type faultEnv struct {
	t         *testing.T
	d         *berthdtest.Daemon
	reg       *testimages.Registry
	logDir    string
	keepPod   string
	keepCtr   string
	keepPid   uint32
	pod       string
	podCfg    *criapi.PodSandboxConfig
	ctr       string
	imageUsed string // an image the case pulls, removed in cleanup
}

func (e *faultEnv) newPodConfig(name string) *criapi.PodSandboxConfig {
	cfg := podConfig(name)
	cfg.LogDirectory = e.logDir
	return cfg
}

func (e *faultEnv) ctrConfig(name string, args ...string) *criapi.ContainerConfig {
	return &criapi.ContainerConfig{
		Metadata: &criapi.ContainerMetadata{Name: name},
		Image:    &criapi.ImageSpec{Image: e.reg.Ref("busybox:latest")},
		Command:  args,
		LogPath:  name + ".log",
		Linux: &criapi.LinuxContainerConfig{SecurityContext: &criapi.LinuxContainerSecurityContext{
			NamespaceOptions: &criapi.NamespaceOption{Pid: criapi.NamespaceMode_CONTAINER},
		}},
	}
}

func (e *faultEnv) createCtr(ctx context.Context, pod string, podCfg *criapi.PodSandboxConfig, name string) (string, error) {
	resp, err := e.d.Runtime.CreateContainer(ctx, &criapi.CreateContainerRequest{
		PodSandboxId: pod, Config: e.ctrConfig(name, "sleep", "3600"), SandboxConfig: podCfg,
	})
	if err != nil {
		return "", err
	}
	return resp.ContainerId, nil
}

func (e *faultEnv) mustCreate(pod string, podCfg *criapi.PodSandboxConfig, name string) string {
	e.t.Helper()
	id, err := e.createCtr(berthdtest.Ctx(e.t), pod, podCfg, name)
	if err != nil {
		e.t.Fatalf("CreateContainer %s: %v", name, err)
	}
	return id
}

func (e *faultEnv) mustStart(id string) {
	e.t.Helper()
	if _, err := e.d.Runtime.StartContainer(berthdtest.Ctx(e.t), &criapi.StartContainerRequest{ContainerId: id}); err != nil {
		e.t.Fatalf("StartContainer: %v", err)
	}
}

func (e *faultEnv) targetPod() {
	e.podCfg = e.newPodConfig("target")
	e.pod = runPod(e.t, e.d, e.podCfg)
}

// faultCase is one kill point: prepare runs on the unarmed daemon, op
// runs on the armed one and must kill it.
type faultCase struct {
	point   fault.Point
	prepare func(e *faultEnv)
	op      func(ctx context.Context, e *faultEnv) error
	// afterRestart, if set, checks the recovered state before cleanup.
	afterRestart func(e *faultEnv)
}

var faultCases = []faultCase{
	{point: fault.SandboxAfterNetnsCreate, op: runTargetPod},
	{point: fault.SandboxAfterCNIAdd, op: runTargetPod},
	{point: fault.SandboxAfterCheckpointWrite, op: runTargetPod},
	{point: fault.SandboxMidStop, prepare: (*faultEnv).targetPod,
		op: func(ctx context.Context, e *faultEnv) error {
			_, err := e.d.Runtime.StopPodSandbox(ctx, &criapi.StopPodSandboxRequest{PodSandboxId: e.pod})
			return err
		}},
	{point: fault.SandboxMidRemove, prepare: (*faultEnv).targetPod,
		op: func(ctx context.Context, e *faultEnv) error {
			// Straight to remove, without a stop first: remove's own stop
			// does CNI DEL, then berthd dies.
			_, err := e.d.Runtime.RemovePodSandbox(ctx, &criapi.RemovePodSandboxRequest{PodSandboxId: e.pod})
			return err
		}},
	{point: fault.ContainerAfterOverlayMount, prepare: (*faultEnv).targetPod, op: createTarget},
	{point: fault.ContainerAfterImageVolumeMount,
		prepare: func(e *faultEnv) {
			e.targetPod()
			e.imageUsed = e.reg.Ref(testimages.HTTPDRef)
			pull(e.t, e.d, e.imageUsed, nil)
		},
		// Dies with the image volume mounted and its image leased: the
		// restarted daemon unmounts it and releases the lease, so the
		// image's layers go with RemoveImage in the cleanup.
		op: func(ctx context.Context, e *faultEnv) error {
			cfg := e.ctrConfig("target", "sleep", "3600")
			cfg.Mounts = []*criapi.Mount{{ContainerPath: "/vol", Readonly: true, Image: &criapi.ImageSpec{Image: e.imageUsed}}}
			_, err := e.d.Runtime.CreateContainer(ctx, &criapi.CreateContainerRequest{PodSandboxId: e.pod, Config: cfg, SandboxConfig: e.podCfg})
			return err
		}},
	{point: fault.ContainerAfterShimStart, prepare: (*faultEnv).targetPod, op: createTarget},
	{point: fault.ContainerAfterRuncCreate, prepare: (*faultEnv).targetPod, op: createTarget},
	{point: fault.ContainerAfterRecordWrite, prepare: (*faultEnv).targetPod, op: createTarget},
	{point: fault.ContainerBeforeRuncStart,
		prepare: func(e *faultEnv) { e.targetPod(); e.ctr = e.mustCreate(e.pod, e.podCfg, "target") },
		op: func(ctx context.Context, e *faultEnv) error {
			_, err := e.d.Runtime.StartContainer(ctx, &criapi.StartContainerRequest{ContainerId: e.ctr})
			return err
		}},
	{point: fault.ContainerAfterRuncStart,
		prepare: func(e *faultEnv) { e.targetPod(); e.ctr = e.mustCreate(e.pod, e.podCfg, "target") },
		op: func(ctx context.Context, e *faultEnv) error {
			_, err := e.d.Runtime.StartContainer(ctx, &criapi.StartContainerRequest{ContainerId: e.ctr})
			return err
		},
		// Rolled forward: the process runs, so the container is running.
		afterRestart: func(e *faultEnv) {
			st, err := e.d.Runtime.ContainerStatus(berthdtest.Ctx(e.t), &criapi.ContainerStatusRequest{ContainerId: e.ctr})
			if err != nil {
				e.t.Fatal(err)
			}
			if st.Status.State != criapi.ContainerState_CONTAINER_RUNNING {
				e.t.Fatalf("a container started just before the crash is %v after restart, want running", st.Status.State)
			}
			if started := time.Unix(0, st.Status.StartedAt); time.Since(started) < 0 || time.Since(started) > time.Minute {
				e.t.Fatalf("started at %v, want the process's start time", started)
			}
		}},
	{point: fault.ContainerMidRemove,
		prepare: func(e *faultEnv) {
			e.targetPod()
			e.ctr = e.mustCreate(e.pod, e.podCfg, "target")
			e.mustStart(e.ctr)
		},
		op: func(ctx context.Context, e *faultEnv) error {
			_, err := e.d.Runtime.RemoveContainer(ctx, &criapi.RemoveContainerRequest{ContainerId: e.ctr})
			return err
		}},
	{point: fault.ImageAfterBlobWrite, op: pullTargetImage},
	{point: fault.ImageMidUnpack, op: pullTargetImage},
	{point: fault.ImageMidRemove,
		prepare: func(e *faultEnv) {
			e.imageUsed = e.reg.Ref(testimages.MultiLayerRef)
			pull(e.t, e.d, e.imageUsed, nil)
		},
		op: func(ctx context.Context, e *faultEnv) error {
			_, err := e.d.Image.RemoveImage(ctx, &criapi.RemoveImageRequest{Image: &criapi.ImageSpec{Image: e.imageUsed}})
			return err
		}},
	// A background collection pass (which RemoveImage waits for) dies
	// with the unused layers renamed into trash/: the restarted daemon
	// empties trash/ and keeps the layers the unrelated container uses.
	{point: fault.ImageMidGC,
		prepare: func(e *faultEnv) {
			e.imageUsed = e.reg.Ref(testimages.MultiLayerRef)
			pull(e.t, e.d, e.imageUsed, nil)
		},
		op: func(ctx context.Context, e *faultEnv) error {
			_, err := e.d.Image.RemoveImage(ctx, &criapi.RemoveImageRequest{Image: &criapi.ImageSpec{Image: e.imageUsed}})
			return err
		},
		afterRestart: func(e *faultEnv) {
			if trash, _ := os.ReadDir(filepath.Join(e.d.Root, "images", "trash")); len(trash) != 0 {
				e.t.Fatalf("trash/ not emptied at start: %d entries", len(trash))
			}
			if img := imageStatus(e.t, e.d, e.imageUsed); img != nil {
				e.t.Fatalf("the removed image is back: %v", img.Id)
			}
		}},
}

func runTargetPod(ctx context.Context, e *faultEnv) error {
	_, err := e.d.Runtime.RunPodSandbox(ctx, &criapi.RunPodSandboxRequest{Config: e.newPodConfig("target")})
	return err
}

func createTarget(ctx context.Context, e *faultEnv) error {
	_, err := e.createCtr(ctx, e.pod, e.podCfg, "target")
	return err
}

func pullTargetImage(ctx context.Context, e *faultEnv) error {
	e.imageUsed = e.reg.Ref(testimages.MultiLayerRef)
	_, err := e.d.Image.PullImage(ctx, &criapi.PullImageRequest{Image: &criapi.ImageSpec{Image: e.imageUsed}})
	return err
}

// TestFaultMatrix kills berthd at every fault point, restarts it, does
// what the kubelet would (stop and remove everything it did not mean to
// keep), and asserts that nothing leaked and that a pod started before
// the crash kept running.
func TestFaultMatrix(t *testing.T) {
	t.Parallel()
	if len(faultCases) != len(fault.Points) {
		t.Fatalf("the matrix has %d cases for %d fault points", len(faultCases), len(fault.Points))
	}
	reg := testimages.StartRegistry(t)
	reg.PushStandard(t)
	for _, c := range faultCases {
		t.Run(string(c.point), func(t *testing.T) {
			t.Parallel()
			runFaultCase(t, reg, c)
		})
	}
}

func runFaultCase(t *testing.T, reg *testimages.Registry, c faultCase) {
	d := berthdtest.Start(t, berthdtest.Options{})
	e := &faultEnv{t: t, d: d, reg: reg, logDir: filepath.Join(d.Dir, "podlogs")}
	pull(t, d, reg.Ref("busybox:latest"), nil)

	// The unrelated pod, started before anything is armed.
	keepCfg := e.newPodConfig("unrelated")
	e.keepPod = runPod(t, d, keepCfg)
	e.keepCtr = e.mustCreate(e.keepPod, keepCfg, "unrelated")
	e.mustStart(e.keepCtr)
	e.keepPid = uint32(containerPid(t, d, e.keepCtr))

	scope := leakcheck.ForDaemon(d)
	scope.Root = d.Root
	before := leakcheck.Take(t, scope)

	if c.prepare != nil {
		c.prepare(e)
	}
	d.Kill()
	d.SetEnv(fault.EnvVar + "=" + string(c.point))
	d.Start()
	d.WaitReady()

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	opErr := c.op(ctx, e)
	cancel()
	if opErr == nil {
		t.Fatalf("the operation succeeded though berthd was to die at %s", c.point)
	}
	select {
	case <-d.Exited():
	case <-time.After(30 * time.Second):
		t.Fatalf("berthd did not die at %s (op error: %v)", c.point, opErr)
	}
	var exitErr *exec.ExitError
	if err := d.ExitErr(); !errors.As(err, &exitErr) || exitErr.ExitCode() != fault.ExitCode {
		t.Fatalf("berthd exited with %v, want exit code %d", err, fault.ExitCode)
	}
	if !strings.Contains(d.Logs(), "test fault: exiting abruptly") {
		t.Fatalf("berthd died without reaching the fault point")
	}

	d.SetEnv()
	d.Start()
	d.WaitReady()
	if c.afterRestart != nil {
		c.afterRestart(e)
	}
	kubeletCleanup(t, e)

	leakcheck.CheckSettled(t, scope, before, leakcheck.Take(t, scope))
	st, err := d.Runtime.ContainerStatus(berthdtest.Ctx(t), &criapi.ContainerStatusRequest{ContainerId: e.keepCtr})
	if err != nil {
		t.Fatalf("status of the unrelated container: %v", err)
	}
	if st.Status.State != criapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("the unrelated container is %v, want running", st.Status.State)
	}
	if pid := containerPid(t, d, e.keepCtr); uint32(pid) != e.keepPid {
		t.Fatalf("the unrelated container's pid changed: %d, was %d", pid, e.keepPid)
	}
	if ps, _ := podStatus(t, d, e.keepPod); ps.State != criapi.PodSandboxState_SANDBOX_READY {
		t.Fatalf("the unrelated pod is %v, want ready", ps.State)
	}
}

// kubeletCleanup stops and removes every container and pod but the
// unrelated ones, as the kubelet does for pods it does not want, and
// removes the image a pull case pulled.
func kubeletCleanup(t *testing.T, e *faultEnv) {
	t.Helper()
	ctx := berthdtest.Ctx(t)
	cs, err := e.d.Runtime.ListContainers(ctx, &criapi.ListContainersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cs.Containers {
		if c.Id == e.keepCtr {
			continue
		}
		if _, err := e.d.Runtime.StopContainer(ctx, &criapi.StopContainerRequest{ContainerId: c.Id, Timeout: 1}); err != nil {
			t.Fatalf("StopContainer %s: %v", c.Id, err)
		}
		if _, err := e.d.Runtime.RemoveContainer(ctx, &criapi.RemoveContainerRequest{ContainerId: c.Id}); err != nil {
			t.Fatalf("RemoveContainer %s: %v", c.Id, err)
		}
	}
	ps, err := e.d.Runtime.ListPodSandbox(ctx, &criapi.ListPodSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps.Items {
		if p.Id != e.keepPod {
			stopRemove(t, e.d, p.Id)
		}
	}
	if e.imageUsed != "" {
		if _, err := e.d.Image.RemoveImage(ctx, &criapi.RemoveImageRequest{Image: &criapi.ImageSpec{Image: e.imageUsed}}); err != nil {
			t.Fatalf("RemoveImage %s: %v", e.imageUsed, err)
		}
	}
}

// TestRecoveryCleansResourcesWithoutRecords loses a running pod's
// checkpoint while berthd is down (berth's own ordering never does; a
// damaged disk can), empties another's (a power loss before the deferred
// fsync, decision 1600) and checks that the restarted daemon releases what
// the pods held: namespace pins, veth, address, NAT rules, /dev/shm, state
// dir, cgroup.
func TestRecoveryCleansResourcesWithoutRecords(t *testing.T) {
	t.Parallel()
	d := berthdtest.Start(t, berthdtest.Options{})
	scope := leakcheck.ForDaemon(d)
	scope.Root = d.Root
	stopRemove(t, d, runPod(t, d, podConfig("warm"))) // bridge, lock files
	before := leakcheck.Take(t, scope)

	id := runPod(t, d, podConfig("orphan"))
	// The second loses its state dir too, as after a reboot (state is a
	// tmpfs): only its address, NAT rules, CNI cache and cgroup remain.
	rebooted := runPod(t, d, podConfig("orphan-rebooted"))
	// The third's record is empty: what a power loss leaves of a first
	// write whose fsync had not run (decision 1600).
	emptied := runPod(t, d, podConfig("orphan-empty-checkpoint"))
	d.Kill()
	for _, p := range []string{id, rebooted} {
		if err := os.RemoveAll(filepath.Join(d.Root, "sandboxes", p)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(d.Root, "sandboxes", emptied, "sandbox.json"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, kind := range []string{"net", "ipc", "uts"} {
		pin := filepath.Join(d.State, "netns", rebooted+"-"+kind)
		if err := exec.Command("umount", pin).Run(); err != nil {
			t.Fatalf("umount %s: %v", pin, err)
		}
		os.Remove(pin)
	}
	shm := filepath.Join(d.State, "sandboxes", rebooted, "shm")
	if err := exec.Command("umount", shm).Run(); err != nil {
		t.Fatalf("umount %s: %v", shm, err)
	}
	os.RemoveAll(filepath.Join(d.State, "sandboxes", rebooted))
	d.Start()
	d.WaitReady()
	resp, err := d.Runtime.ListPodSandbox(berthdtest.Ctx(t), &criapi.ListPodSandboxRequest{})
	if err != nil || len(resp.Items) != 0 {
		t.Fatalf("list after restart: %v, %v", resp.GetItems(), err)
	}
	leakcheck.CheckSettled(t, scope, before, leakcheck.Take(t, scope))
	for _, msg := range []string{"removing a namespace pin without a sandbox", "removing pod state without a sandbox", "removing a pod cgroup without a sandbox", "releasing a pod address without a sandbox", "record=empty"} {
		if !strings.Contains(d.Logs(), msg) {
			t.Errorf("berthd did not log %q", msg)
		}
	}
}

// TestStartWhoseRecordFailsStopsTheContainer: StartContainer's write of
// the running record fails (an armed failure point) after the process
// started. The call fails, and everything then tells the same story: the
// container is exited (StartError) in status and after a restart, its
// process is gone, event subscribers heard it stop but never start, and
// NRI plugins heard StartContainer and StopContainer, never
// PostStartContainer.
func TestStartWhoseRecordFailsStopsTheContainer(t *testing.T) {
	t.Parallel()
	d := berthdtest.Start(t, berthdtest.Options{Env: []string{fault.EnvVar + "=" + string(fault.ContainerFailStartRecordWrite)}})
	p := startPlugin(t, d, "startfail", "00", nil)
	e := newCtrEnvOn(t, d)
	ctx := berthdtest.Ctx(t)
	evCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := d.Runtime.GetContainerEvents(evCtx, &criapi.GetEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // subscribed before the first event

	id := e.create(e.config("victim", "sleep", "1000"))
	if _, err := d.Runtime.StartContainer(ctx, &criapi.StartContainerRequest{ContainerId: id}); err == nil {
		t.Fatal("StartContainer succeeded though its record could not be written")
	}
	check := func(when string) {
		st := e.status(id)
		if st.State != criapi.ContainerState_CONTAINER_EXITED || st.Reason != "StartError" || st.StartedAt != 0 {
			t.Fatalf("%s: %v reason %q started at %d, want exited, StartError, never started", when, st.State, st.Reason, st.StartedAt)
		}
	}
	check("after the failed start")
	out, err := exec.Command("runc", "--root", filepath.Join(d.State, "runtime", "runc"), "state", id).CombinedOutput()
	var rs struct{ Status string }
	if err != nil || json.Unmarshal(out, &rs) != nil || rs.Status != "stopped" {
		t.Fatalf("runc state: %s, %v; want stopped", out, err)
	}
	evs := recvEvents(t, stream, 2)
	if evs[0].ContainerEventType != criapi.ContainerEventType_CONTAINER_CREATED_EVENT ||
		evs[1].ContainerEventType != criapi.ContainerEventType_CONTAINER_STOPPED_EVENT {
		t.Fatalf("events %v, %v; want created, stopped", evs[0].ContainerEventType, evs[1].ContainerEventType)
	}
	waitUntil(t, "NRI's StopContainer of the container", func() bool { return slices.Contains(p.eventsFor(e.pod, id), "StopContainer") })
	if got := p.eventsFor(e.pod, id); !slices.Equal(got, []string{"CreateContainer", "PostCreateContainer", "StartContainer", "StopContainer"}) {
		t.Fatalf("NRI events %v", got)
	}

	d.SetEnv()
	d.Restart()
	check("after a restart")
	stopRemove(t, d, e.pod)
}

// TestCreateWhoseLeaseWriteFailsLeavesNothing: CreateContainer's image
// lease cannot be written (an armed failure point, after the lease is
// held in memory). The create fails and undoes everything; the image is
// not pinned by the lease that never reached the disk: removing it frees
// its layers.
func TestCreateWhoseLeaseWriteFailsLeavesNothing(t *testing.T) {
	t.Parallel()
	d := berthdtest.Start(t, berthdtest.Options{Env: []string{fault.EnvVar + "=" + string(fault.ImageFailLeaseWrite)}})
	e := newCtrEnvOn(t, d)
	scope := leakcheck.ForDaemon(d)
	scope.Root = d.Root
	before := leakcheck.Take(t, scope)
	ctx := berthdtest.Ctx(t)
	if _, err := d.Runtime.CreateContainer(ctx, &criapi.CreateContainerRequest{PodSandboxId: e.pod, Config: e.config("victim", "sleep", "100"), SandboxConfig: e.podCfg}); err == nil {
		t.Fatal("CreateContainer succeeded though its image lease could not be written")
	}
	if es, _ := os.ReadDir(filepath.Join(d.Root, "images", "leases")); len(es) != 0 {
		t.Fatalf("leases left by the failed create: %d", len(es))
	}
	leakcheck.CheckSettled(t, scope, before, leakcheck.Take(t, scope))
	if _, err := d.Image.RemoveImage(ctx, &criapi.RemoveImageRequest{Image: &criapi.ImageSpec{Image: e.reg.Ref("busybox:latest")}}); err != nil {
		t.Fatal(err)
	}
	if ls, _ := os.ReadDir(filepath.Join(d.Root, "images", "layers")); len(ls) != 0 {
		t.Fatalf("%d layers pinned after the image was removed", len(ls))
	}
	stopRemove(t, d, e.pod)
}
