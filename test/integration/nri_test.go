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
	"sync"
	"testing"
	"time"

	api "github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/grpc/codes"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/leakcheck"
)

// nriEvent is one event a test plugin saw.
type nriEvent struct {
	kind string
	pod  *api.PodSandbox
	ctr  *api.Container
}

// nriPlugin is a real NRI plugin (containerd's stub) that records every
// event; the on* hooks, set before start or while no event is in flight,
// block or fail events.
type nriPlugin struct {
	mu       sync.Mutex
	events   []nriEvent
	syncPods []string
	syncCtrs []string
	podRes   *api.LinuxResources // last UpdatePodSandbox's resources
	ready    chan struct{}
	once     sync.Once

	onSync     func(ctx context.Context) error
	onRunPod   func(ctx context.Context, pod *api.PodSandbox) error
	onStopPod  func(ctx context.Context, pod *api.PodSandbox) error
	onCreate   func(ctx context.Context, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, error)
	onUpdate   func(ctx context.Context, ctr *api.Container, res *api.LinuxResources) ([]*api.ContainerUpdate, error)
	stub       stub.Stub
	cancelStub context.CancelFunc
	stubDone   chan struct{}
}

func (p *nriPlugin) record(kind string, pod *api.PodSandbox, ctr *api.Container) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.events = append(p.events, nriEvent{kind: kind, pod: pod, ctr: ctr})
}

func (p *nriPlugin) Synchronize(ctx context.Context, pods []*api.PodSandbox, ctrs []*api.Container) ([]*api.ContainerUpdate, error) {
	p.mu.Lock()
	p.syncPods, p.syncCtrs = nil, nil
	for _, pod := range pods {
		p.syncPods = append(p.syncPods, pod.GetId())
	}
	for _, c := range ctrs {
		p.syncCtrs = append(p.syncCtrs, c.GetId())
	}
	p.mu.Unlock()
	if p.onSync != nil {
		if err := p.onSync(ctx); err != nil {
			return nil, err
		}
	}
	p.once.Do(func() { close(p.ready) })
	return nil, nil
}

func (p *nriPlugin) RunPodSandbox(ctx context.Context, pod *api.PodSandbox) error {
	p.record("RunPodSandbox", pod, nil)
	if p.onRunPod != nil {
		return p.onRunPod(ctx, pod)
	}
	return nil
}

func (p *nriPlugin) UpdatePodSandbox(_ context.Context, pod *api.PodSandbox, _, res *api.LinuxResources) error {
	p.record("UpdatePodSandbox", pod, nil)
	p.mu.Lock()
	p.podRes = res
	p.mu.Unlock()
	return nil
}

func (p *nriPlugin) PostUpdatePodSandbox(_ context.Context, pod *api.PodSandbox) error {
	p.record("PostUpdatePodSandbox", pod, nil)
	return nil
}

func (p *nriPlugin) StopPodSandbox(ctx context.Context, pod *api.PodSandbox) error {
	p.record("StopPodSandbox", pod, nil)
	if p.onStopPod != nil {
		return p.onStopPod(ctx, pod)
	}
	return nil
}

func (p *nriPlugin) RemovePodSandbox(_ context.Context, pod *api.PodSandbox) error {
	p.record("RemovePodSandbox", pod, nil)
	return nil
}

func (p *nriPlugin) CreateContainer(ctx context.Context, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	p.record("CreateContainer", pod, ctr)
	if p.onCreate != nil {
		adj, err := p.onCreate(ctx, pod, ctr)
		return adj, nil, err
	}
	return nil, nil, nil
}

func (p *nriPlugin) PostCreateContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) error {
	p.record("PostCreateContainer", pod, ctr)
	return nil
}

func (p *nriPlugin) StartContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) error {
	p.record("StartContainer", pod, ctr)
	return nil
}

func (p *nriPlugin) PostStartContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) error {
	p.record("PostStartContainer", pod, ctr)
	return nil
}

func (p *nriPlugin) UpdateContainer(ctx context.Context, pod *api.PodSandbox, ctr *api.Container, res *api.LinuxResources) ([]*api.ContainerUpdate, error) {
	p.record("UpdateContainer", pod, ctr)
	if p.onUpdate != nil {
		return p.onUpdate(ctx, ctr, res)
	}
	return nil, nil
}

func (p *nriPlugin) PostUpdateContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) error {
	p.record("PostUpdateContainer", pod, ctr)
	return nil
}

func (p *nriPlugin) StopContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) ([]*api.ContainerUpdate, error) {
	p.record("StopContainer", pod, ctr)
	return nil, nil
}

func (p *nriPlugin) RemoveContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) error {
	p.record("RemoveContainer", pod, ctr)
	return nil
}

// eventsFor returns the kinds of the events about pod (and, if ctr is not
// empty, only those about that container).
func (p *nriPlugin) eventsFor(pod, ctr string) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for _, e := range p.events {
		if e.pod.GetId() != pod || (ctr != "" && e.ctr.GetId() != ctr) {
			continue
		}
		out = append(out, e.kind)
	}
	return out
}

// find returns the first event of kind about id (pod or container).
func (p *nriPlugin) find(kind, id string) *nriEvent {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, e := range p.events {
		if e.kind == kind && (e.pod.GetId() == id || e.ctr.GetId() == id) {
			return &p.events[i]
		}
	}
	return nil
}

// seen reports whether the plugin knows container id, from Synchronize or
// a CreateContainer event.
func (p *nriPlugin) seen(id string) bool {
	p.mu.Lock()
	inSync := slices.Contains(p.syncCtrs, id)
	p.mu.Unlock()
	return inSync || p.find("CreateContainer", id) != nil
}

// nriDaemon starts berthd with NRI on its private socket; hooks that block
// need more than the 2 s default request timeout.
func nriDaemon(t *testing.T) *berthdtest.Daemon {
	return berthdtest.Start(t, berthdtest.Options{Configure: func(c *config.Config) {
		c.NRI.PluginRequestTimeout = config.Duration(20 * time.Second)
	}})
}

// startPlugin connects a plugin (configured by setup before it connects)
// and returns once its Synchronize ran.
func startPlugin(t *testing.T, d *berthdtest.Daemon, name, idx string, setup func(*nriPlugin)) *nriPlugin {
	t.Helper()
	p := startPluginAsync(t, d, name, idx, setup)
	select {
	case <-p.ready:
	case <-p.stubDone:
		t.Fatalf("plugin %s exited before it was synchronized", name)
	case <-time.After(20 * time.Second):
		t.Fatalf("plugin %s not synchronized in 20s", name)
	}
	return p
}

func startPluginAsync(t *testing.T, d *berthdtest.Daemon, name, idx string, setup func(*nriPlugin)) *nriPlugin {
	t.Helper()
	p := &nriPlugin{ready: make(chan struct{}), stubDone: make(chan struct{})}
	if setup != nil {
		setup(p)
	}
	s, err := stub.New(p, stub.WithPluginName(name), stub.WithPluginIdx(idx), stub.WithSocketPath(d.Config.NRI.SocketPath))
	if err != nil {
		t.Fatalf("create NRI stub: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p.stub, p.cancelStub = s, cancel
	go func() {
		defer close(p.stubDone)
		_ = s.Run(ctx)
	}()
	t.Cleanup(p.stop)
	return p
}

func (p *nriPlugin) stop() {
	p.cancelStub()
	select {
	case <-p.stubDone:
	case <-time.After(5 * time.Second):
	}
}

// TestNRILifecycleEvents runs a pod and a container through every CRI
// lifecycle call and checks that a plugin sees each event once, in
// order, with berth's metadata.
func TestNRILifecycleEvents(t *testing.T) {
	t.Parallel()
	d := nriDaemon(t)
	p := startPlugin(t, d, "lifecycle", "00", nil)
	e := newCtrEnvOn(t, d)
	ctx := berthdtest.Ctx(t)

	run := p.find("RunPodSandbox", e.pod)
	if run == nil {
		t.Fatal("no RunPodSandbox event")
	}
	md := e.podCfg.Metadata
	if run.pod.Name != md.Name || run.pod.Namespace != md.Namespace || run.pod.Uid != md.Uid {
		t.Fatalf("pod metadata %s/%s/%s, want %s/%s/%s", run.pod.Namespace, run.pod.Name, run.pod.Uid, md.Namespace, md.Name, md.Uid)
	}
	if run.pod.Labels["app"] != e.podCfg.Labels["app"] || run.pod.RuntimeHandler != "runc" {
		t.Fatalf("pod labels %v handler %q", run.pod.Labels, run.pod.RuntimeHandler)
	}
	if len(run.pod.Ips) == 0 || !strings.HasPrefix(run.pod.Ips[0], strings.TrimSuffix(d.Config.DefaultNetwork.Subnet, "0/24")) {
		t.Fatalf("pod IPs %v not in %s", run.pod.Ips, d.Config.DefaultNetwork.Subnet)
	}
	var netns string
	for _, ns := range run.pod.GetLinux().GetNamespaces() {
		if ns.Type == "network" {
			netns = ns.Path
		}
	}
	if _, info := podStatus(t, d, e.pod); netns == "" || netns != info.NetNSPath {
		t.Fatalf("pod network namespace %q, status says %q", netns, info.NetNSPath)
	}
	if run.pod.GetLinux().GetCgroupsPath() == "" {
		t.Fatal("pod has no cgroups path")
	}

	cfg := e.config("life", "sleep", "1000")
	cfg.Envs = []*criapi.KeyValue{{Key: "FOO", Value: []byte("bar")}}
	id := e.run(cfg)
	mem := int64(64 << 20)
	if _, err := d.Runtime.UpdateContainerResources(ctx, &criapi.UpdateContainerResourcesRequest{
		ContainerId: id, Linux: &criapi.LinuxContainerResources{MemoryLimitInBytes: mem},
	}); err != nil {
		t.Fatalf("UpdateContainerResources: %v", err)
	}
	if _, err := d.Runtime.UpdatePodSandboxResources(ctx, &criapi.UpdatePodSandboxResourcesRequest{
		PodSandboxId: e.pod, Resources: &criapi.LinuxContainerResources{MemoryLimitInBytes: 512 << 20},
	}); err != nil {
		t.Fatalf("UpdatePodSandboxResources: %v", err)
	}
	p.mu.Lock()
	podMem := p.podRes.GetMemory().GetLimit().GetValue()
	p.mu.Unlock()
	if podMem != 512<<20 {
		t.Fatalf("UpdatePodSandbox memory limit %d", podMem)
	}
	if _, err := d.Runtime.StopContainer(ctx, &criapi.StopContainerRequest{ContainerId: id, Timeout: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Runtime.RemoveContainer(ctx, &criapi.RemoveContainerRequest{ContainerId: id}); err != nil {
		t.Fatal(err)
	}
	stopRemove(t, d, e.pod)
	// A second stop of a stopped pod (and of a removed one) is no event.
	if _, err := d.Runtime.StopPodSandbox(ctx, &criapi.StopPodSandboxRequest{PodSandboxId: e.pod}); err != nil {
		t.Fatal(err)
	}

	want := []string{"RunPodSandbox", "CreateContainer", "PostCreateContainer", "StartContainer", "PostStartContainer",
		"UpdateContainer", "PostUpdateContainer", "UpdatePodSandbox", "PostUpdatePodSandbox", "StopContainer", "RemoveContainer", "StopPodSandbox", "RemovePodSandbox"}
	var got []string
	waitUntil(t, "the pod's NRI events", func() bool { got = p.eventsFor(e.pod, ""); return len(got) >= len(want) })
	time.Sleep(300 * time.Millisecond) // a late duplicate would show now
	if got = p.eventsFor(e.pod, ""); !slices.Equal(got, want) {
		t.Fatalf("events\n got %v\nwant %v", got, want)
	}

	create := p.find("CreateContainer", id)
	c := create.ctr
	if c.Name != "life" || c.PodSandboxId != e.pod || c.State != api.ContainerState_CONTAINER_CREATED || c.Labels["name"] != "life" {
		t.Fatalf("created container %s/%s state %s labels %v", c.PodSandboxId, c.Name, c.State, c.Labels)
	}
	if !slices.Equal(c.Args, []string{"sleep", "1000"}) || !slices.Contains(c.Env, "FOO=bar") {
		t.Fatalf("container args %v env %v", c.Args, c.Env)
	}
	if c.GetLinux().GetCgroupsPath() == "" || len(c.Mounts) == 0 || c.GetLinux().GetResources() == nil {
		t.Fatalf("container linux %v mounts %d", c.GetLinux(), len(c.Mounts))
	}
	if start := p.find("PostStartContainer", id).ctr; start.State != api.ContainerState_CONTAINER_RUNNING || start.Pid == 0 {
		t.Fatalf("post-start container state %s pid %d", start.State, start.Pid)
	}
	if stop := p.find("StopContainer", id).ctr; stop.State != api.ContainerState_CONTAINER_STOPPED || stop.Name != "life" {
		t.Fatalf("stopped container %q state %s", stop.Name, stop.State)
	}
	if rm := p.find("RemoveContainer", id).ctr; rm.Name != "life" {
		t.Fatalf("removed container name %q", rm.Name)
	}
	if stop := p.find("StopPodSandbox", e.pod).pod; stop.Name != md.Name {
		t.Fatalf("stopped pod %q", stop.Name)
	}
}

// TestNRIExitedContainerIsStopped checks that a container that exits on
// its own is reported stopped without a StopContainer call, once, and
// before its removal.
func TestNRIExitedContainerIsStopped(t *testing.T) {
	t.Parallel()
	d := nriDaemon(t)
	p := startPlugin(t, d, "exits", "00", nil)
	e := newCtrEnvOn(t, d)
	id := e.run(e.config("fail", "sh", "-c", "exit 1"))
	if st := e.waitExited(id); st.ExitCode != 1 {
		t.Fatalf("exit code %d", st.ExitCode)
	}
	waitUntil(t, "NRI's StopContainer", func() bool { return p.find("StopContainer", id) != nil })
	if stop := p.find("StopContainer", id).ctr; stop.ExitCode != 1 || stop.State != api.ContainerState_CONTAINER_STOPPED {
		t.Fatalf("stop event: exit code %d state %s", stop.ExitCode, stop.State)
	}
	// An explicit stop of the exited container adds nothing.
	if _, err := d.Runtime.StopContainer(berthdtest.Ctx(t), &criapi.StopContainerRequest{ContainerId: id}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Runtime.RemoveContainer(berthdtest.Ctx(t), &criapi.RemoveContainerRequest{ContainerId: id}); err != nil {
		t.Fatal(err)
	}
	want := []string{"CreateContainer", "PostCreateContainer", "StartContainer", "PostStartContainer", "StopContainer", "RemoveContainer"}
	waitUntil(t, "the container's NRI events", func() bool { return len(p.eventsFor(e.pod, id)) >= len(want) })
	if got := p.eventsFor(e.pod, id); !slices.Equal(got, want) {
		t.Fatalf("events\n got %v\nwant %v", got, want)
	}
}

// TestNRICreateAdjustment has a plugin add an environment variable, an
// annotation and a bind mount at creation: all three reach the container.
func TestNRICreateAdjustment(t *testing.T) {
	t.Parallel()
	d := nriDaemon(t)
	hostDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(hostDir, "hello"), []byte("from-nri\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	startPlugin(t, d, "adjust", "00", func(p *nriPlugin) {
		p.onCreate = func(_ context.Context, _ *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, error) {
			adj := &api.ContainerAdjustment{}
			adj.AddEnv("NRI_INJECTED", "yes-"+ctr.Name)
			adj.AddAnnotation("example.com/nri", "adjusted")
			adj.AddMount(&api.Mount{Destination: "/nri", Source: hostDir, Type: "bind", Options: []string{"rbind", "ro"}})
			adj.SetLinuxMemoryLimit(96 << 20)
			return adj, nil
		}
	})
	e := newCtrEnvOn(t, d)
	id := e.run(e.config("adjusted", "sleep", "1000"))
	resp, err := execSync(t, d, id, 10, "sh", "-c", "echo $NRI_INJECTED; cat /nri/hello")
	if err != nil || resp.ExitCode != 0 {
		t.Fatalf("exec: %v %v %s", err, resp.GetExitCode(), resp.GetStderr())
	}
	if got := string(resp.Stdout); got != "yes-adjusted\nfrom-nri\n" {
		t.Fatalf("inside the container: %q", got)
	}
	data, err := os.ReadFile(filepath.Join(d.Root, "containers", id, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var spec specs.Spec
	if err := json.Unmarshal(data, &spec); err != nil {
		t.Fatal(err)
	}
	if spec.Annotations["example.com/nri"] != "adjusted" {
		t.Fatalf("spec annotations %v", spec.Annotations)
	}
	// The plugin's memory limit is what the container got and what its
	// status reports.
	if spec.Linux.Resources.Memory == nil || spec.Linux.Resources.Memory.Limit == nil || *spec.Linux.Resources.Memory.Limit != 96<<20 {
		t.Fatalf("spec memory %+v", spec.Linux.Resources.Memory)
	}
	if st := e.status(id); st.GetResources().GetLinux().GetMemoryLimitInBytes() != 96<<20 {
		t.Fatalf("status resources %+v", st.GetResources().GetLinux())
	}
	stopRemove(t, d, e.pod)
}

// TestNRIRunPodSandboxHook: while the hook runs the pod is invisible and
// takes no containers; a failing hook fails RunPodSandbox, leaks nothing,
// and a retry with the same config works.
func TestNRIRunPodSandboxHook(t *testing.T) {
	t.Parallel()
	d := nriDaemon(t)
	e := newCtrEnvOn(t, d)
	stopRemove(t, d, e.pod)
	ctx := berthdtest.Ctx(t)

	reached, release := make(chan string, 1), make(chan struct{})
	var fail sync.Once
	failNext := true
	startPlugin(t, d, "runpod", "00", func(p *nriPlugin) {
		p.onRunPod = func(ctx context.Context, pod *api.PodSandbox) error {
			if pod.Name == "blocked" {
				reached <- pod.Id
				select {
				case <-release:
				case <-ctx.Done():
				}
				return nil
			}
			var err error
			if failNext {
				fail.Do(func() { err = errors.New("induced RunPodSandbox failure") })
			}
			return err
		}
	})

	// Blocked hook.
	cfg := podConfig("blocked")
	type result struct {
		id  string
		err error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := d.Runtime.RunPodSandbox(ctx, &criapi.RunPodSandboxRequest{Config: cfg})
		done <- result{resp.GetPodSandboxId(), err}
	}()
	var hookID string
	select {
	case hookID = <-reached:
	case <-time.After(30 * time.Second):
		t.Fatal("RunPodSandbox hook not reached")
	}
	list, err := d.Runtime.ListPodSandbox(ctx, &criapi.ListPodSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range list.Items {
		if s.Id == hookID {
			t.Fatal("pod listed while its RunPodSandbox hook runs")
		}
	}
	_, err = d.Runtime.PodSandboxStatus(ctx, &criapi.PodSandboxStatusRequest{PodSandboxId: hookID})
	berthdtest.WantCode(t, err, codes.NotFound)
	_, err = d.Runtime.CreateContainer(ctx, &criapi.CreateContainerRequest{PodSandboxId: hookID, Config: e.config("early", "true"), SandboxConfig: cfg})
	if err == nil {
		t.Fatal("CreateContainer in a pod whose RunPodSandbox hook runs succeeded")
	}
	close(release)
	r := <-done
	if r.err != nil || r.id != hookID {
		t.Fatalf("RunPodSandbox after the hook: %q %v (hook saw %q)", r.id, r.err, hookID)
	}
	if st, _ := podStatus(t, d, r.id); st.State != criapi.PodSandboxState_SANDBOX_READY {
		t.Fatalf("pod %s after the hook", st.State)
	}
	e.pod = r.id
	e.waitExited(e.run(e.config("after", "true")))
	stopRemove(t, d, r.id)

	// Failing hook: nothing left, then a retry works.
	scope := leakcheck.ForDaemon(d)
	before := leakcheck.Take(t, scope)
	cfg = podConfig("fails-once")
	_, err = d.Runtime.RunPodSandbox(ctx, &criapi.RunPodSandboxRequest{Config: cfg})
	if err == nil || !strings.Contains(err.Error(), "induced RunPodSandbox failure") {
		t.Fatalf("RunPodSandbox with a failing hook: %v", err)
	}
	list, err = d.Runtime.ListPodSandbox(ctx, &criapi.ListPodSandboxRequest{})
	if err != nil || len(list.Items) != 0 {
		t.Fatalf("pods after a failed RunPodSandbox: %v %v", list.GetItems(), err)
	}
	leakcheck.CheckSettled(t, scope, before, leakcheck.Take(t, scope))
	if entries, _ := os.ReadDir(filepath.Join(d.Root, "sandboxes")); len(entries) != 0 {
		t.Fatalf("%d sandbox dirs left", len(entries))
	}
	id := runPod(t, d, cfg)
	if st, _ := podStatus(t, d, id); st.State != criapi.PodSandboxState_SANDBOX_READY {
		t.Fatalf("retried pod %s", st.State)
	}
	stopRemove(t, d, id)
}

// TestNRICreateContainerHook: while the hook runs the container is
// invisible; a failing hook fails CreateContainer, leaks nothing, starts
// nothing, and a retry with the same name works.
func TestNRICreateContainerHook(t *testing.T) {
	t.Parallel()
	d := nriDaemon(t)
	reached, release := make(chan string, 1), make(chan struct{})
	var fail sync.Once
	p := startPlugin(t, d, "create", "00", func(p *nriPlugin) {
		p.onCreate = func(ctx context.Context, _ *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, error) {
			switch ctr.Name {
			case "blocked":
				reached <- ctr.Id
				select {
				case <-release:
				case <-ctx.Done():
				}
			case "fails-once":
				var err error
				fail.Do(func() { err = errors.New("induced CreateContainer failure") })
				return nil, err
			}
			return nil, nil
		}
	})
	e := newCtrEnvOn(t, d)
	ctx := berthdtest.Ctx(t)

	done := make(chan error, 1)
	var created string
	go func() {
		resp, err := d.Runtime.CreateContainer(ctx, &criapi.CreateContainerRequest{PodSandboxId: e.pod, Config: e.config("blocked", "sleep", "1000"), SandboxConfig: e.podCfg})
		created = resp.GetContainerId()
		done <- err
	}()
	var hookID string
	select {
	case hookID = <-reached:
	case <-time.After(30 * time.Second):
		t.Fatal("CreateContainer hook not reached")
	}
	list, err := d.Runtime.ListContainers(ctx, &criapi.ListContainersRequest{})
	if err != nil || len(list.Containers) != 0 {
		t.Fatalf("containers listed while the CreateContainer hook runs: %v %v", list.GetContainers(), err)
	}
	_, err = d.Runtime.ContainerStatus(ctx, &criapi.ContainerStatusRequest{ContainerId: hookID})
	berthdtest.WantCode(t, err, codes.NotFound)
	close(release)
	if err := <-done; err != nil || created != hookID {
		t.Fatalf("CreateContainer after the hook: %q %v (hook saw %q)", created, err, hookID)
	}
	if st := e.status(created); st.State != criapi.ContainerState_CONTAINER_CREATED {
		t.Fatalf("container %s after the hook", st.State)
	}
	if _, err := d.Runtime.RemoveContainer(ctx, &criapi.RemoveContainerRequest{ContainerId: created}); err != nil {
		t.Fatal(err)
	}

	scope := leakcheck.ForDaemon(d)
	scope.Root = d.Root
	before := leakcheck.Take(t, scope)
	_, err = d.Runtime.CreateContainer(ctx, &criapi.CreateContainerRequest{PodSandboxId: e.pod, Config: e.config("fails-once", "sleep", "1000"), SandboxConfig: e.podCfg})
	if err == nil || !strings.Contains(err.Error(), "induced CreateContainer failure") {
		t.Fatalf("CreateContainer with a failing hook: %v", err)
	}
	list, err = d.Runtime.ListContainers(ctx, &criapi.ListContainersRequest{})
	if err != nil || len(list.Containers) != 0 {
		t.Fatalf("containers after a failed create: %v %v", list.GetContainers(), err)
	}
	leakcheck.CheckSettled(t, scope, before, leakcheck.Take(t, scope))
	if entries, _ := os.ReadDir(filepath.Join(d.Root, "containers")); len(entries) != 0 {
		t.Fatalf("%d container dirs left", len(entries))
	}
	id := e.run(e.config("fails-once", "sleep", "1000"))
	if _, err := d.Runtime.StopContainer(ctx, &criapi.StopContainerRequest{ContainerId: id}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Runtime.RemoveContainer(ctx, &criapi.RemoveContainerRequest{ContainerId: id}); err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	var starts []string
	for _, ev := range p.events {
		if ev.kind == "StartContainer" {
			starts = append(starts, ev.ctr.Id)
		}
	}
	p.mu.Unlock()
	if !slices.Equal(starts, []string{id}) {
		t.Fatalf("StartContainer events for %v, want only the retry %s", starts, id)
	}
	stopRemove(t, d, e.pod)
}

// TestNRIStopPodSandboxHook: the pod's containers are stopped and the pod
// is still there while the hook runs; the hook runs once however often
// StopPodSandbox is called, and a stopped pod takes no new container (and
// plugins hear of no create).
func TestNRIStopPodSandboxHook(t *testing.T) {
	t.Parallel()
	d := nriDaemon(t)
	reached, release := make(chan struct{}), make(chan struct{})
	p := startPlugin(t, d, "stoppod", "00", func(p *nriPlugin) {
		p.onStopPod = func(ctx context.Context, _ *api.PodSandbox) error {
			close(reached)
			select {
			case <-release:
			case <-ctx.Done():
			}
			return nil
		}
	})
	e := newCtrEnvOn(t, d)
	ctx := berthdtest.Ctx(t)
	id := e.run(e.config("work", "sleep", "1000"))
	done := make(chan error, 1)
	go func() {
		_, err := d.Runtime.StopPodSandbox(ctx, &criapi.StopPodSandboxRequest{PodSandboxId: e.pod})
		done <- err
	}()
	select {
	case <-reached:
	case <-time.After(30 * time.Second):
		t.Fatal("StopPodSandbox hook not reached")
	}
	if st := e.status(id); st.State != criapi.ContainerState_CONTAINER_EXITED {
		t.Fatalf("container %s while the StopPodSandbox hook runs", st.State)
	}
	if st, _ := podStatus(t, d, e.pod); st.Id != e.pod {
		t.Fatalf("pod status during the hook: %v", st)
	}
	if p.find("StopContainer", id) == nil {
		t.Fatal("no StopContainer event before StopPodSandbox")
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if _, err := d.Runtime.StopPodSandbox(ctx, &criapi.StopPodSandboxRequest{PodSandboxId: e.pod}); err != nil {
			t.Fatal(err)
		}
	}
	_, err := d.Runtime.CreateContainer(ctx, &criapi.CreateContainerRequest{PodSandboxId: e.pod, Config: e.config("late", "true"), SandboxConfig: e.podCfg})
	berthdtest.WantCode(t, err, codes.FailedPrecondition)
	time.Sleep(300 * time.Millisecond)
	count := func(kind string) int {
		n := 0
		for _, k := range p.eventsFor(e.pod, "") {
			if k == kind {
				n++
			}
		}
		return n
	}
	if n := count("StopPodSandbox"); n != 1 {
		t.Fatalf("%d StopPodSandbox events, want 1", n)
	}
	if n := count("CreateContainer"); n != 1 {
		t.Fatalf("%d CreateContainer events, want 1 (none for the stopped pod)", n)
	}
	if _, err := d.Runtime.RemovePodSandbox(ctx, &criapi.RemovePodSandboxRequest{PodSandboxId: e.pod}); err != nil {
		t.Fatal(err)
	}
}

// TestNRISynchronize: a plugin connecting late gets the existing pod and
// containers; containers created while its Synchronize runs, and after,
// are not lost to it.
func TestNRISynchronize(t *testing.T) {
	t.Parallel()
	d := nriDaemon(t)
	startPlugin(t, d, "first", "00", nil)
	e := newCtrEnvOn(t, d)
	before := e.run(e.config("before", "sleep", "1000"))

	inSync, release := make(chan struct{}), make(chan struct{})
	late := startPluginAsync(t, d, "late", "10", func(p *nriPlugin) {
		p.onSync = func(ctx context.Context) error {
			close(inSync)
			select {
			case <-release:
			case <-ctx.Done():
			}
			return nil
		}
	})
	select {
	case <-inSync:
	case <-time.After(30 * time.Second):
		t.Fatal("late plugin's Synchronize not reached")
	}
	var (
		mu     sync.Mutex
		during []string
		wg     sync.WaitGroup
	)
	for i := 0; i < 3; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := d.Runtime.CreateContainer(berthdtest.Ctx(t), &criapi.CreateContainerRequest{PodSandboxId: e.pod, Config: e.config("during-"+string(rune('a'+i)), "sleep", "1000"), SandboxConfig: e.podCfg})
			if err != nil {
				t.Errorf("create during Synchronize: %v", err)
				return
			}
			mu.Lock()
			during = append(during, resp.ContainerId)
			mu.Unlock()
		}()
	}
	time.Sleep(time.Second)
	close(release)
	select {
	case <-late.ready:
	case <-time.After(30 * time.Second):
		t.Fatal("late plugin not ready")
	}
	wg.Wait()
	after := e.create(e.config("after", "sleep", "1000"))

	late.mu.Lock()
	pods := slices.Clone(late.syncPods)
	late.mu.Unlock()
	if !slices.Contains(pods, e.pod) {
		t.Fatalf("Synchronize pods %v lack %s", pods, e.pod)
	}
	all := append(append([]string{before}, during...), after)
	if len(all) != 5 {
		t.Fatalf("created %d containers", len(all))
	}
	waitUntil(t, "the late plugin to see every container", func() bool {
		for _, id := range all {
			if !late.seen(id) {
				return false
			}
		}
		return true
	})
	late.mu.Lock()
	inSyncSet := slices.Contains(late.syncCtrs, before)
	late.mu.Unlock()
	if !inSyncSet {
		t.Fatalf("container %s created before the plugin came is not in its Synchronize", before)
	}
	stopRemove(t, d, e.pod)
}

// TestNRIPluginUpdatesContainer: a plugin's unsolicited update goes
// through the OCI runtime to the container's cgroup and shows in status.
func TestNRIPluginUpdatesContainer(t *testing.T) {
	t.Parallel()
	d := nriDaemon(t)
	p := startPlugin(t, d, "updater", "00", nil)
	e := newCtrEnvOn(t, d)
	id := e.run(e.config("target", "sleep", "1000"))
	limit := int64(48 << 20)
	u := &api.ContainerUpdate{ContainerId: id}
	u.SetLinuxMemoryLimit(limit)
	failed, err := p.stub.UpdateContainers([]*api.ContainerUpdate{u})
	if err != nil || len(failed) != 0 {
		t.Fatalf("UpdateContainers: failed %v, %v", failed, err)
	}
	pid := containerPid(t, d, id)
	got, err := memoryLimitOf(t, pid)
	if err != nil {
		t.Fatal(err)
	}
	if got != "50331648" {
		t.Fatalf("memory limit %s after the plugin's update, want %d", got, limit)
	}
	if got := e.status(id).GetResources().GetLinux().GetMemoryLimitInBytes(); got != limit {
		t.Fatalf("status memory limit %d, want %d", got, limit)
	}

	// A plugin rewriting an UpdateContainerResources: its value wins.
	override := int64(40 << 20)
	p.mu.Lock()
	p.onUpdate = func(_ context.Context, ctr *api.Container, _ *api.LinuxResources) ([]*api.ContainerUpdate, error) {
		u := &api.ContainerUpdate{ContainerId: ctr.Id}
		u.SetLinuxMemoryLimit(override)
		return []*api.ContainerUpdate{u}, nil
	}
	p.mu.Unlock()
	if _, err := d.Runtime.UpdateContainerResources(berthdtest.Ctx(t), &criapi.UpdateContainerResourcesRequest{
		ContainerId: id, Linux: &criapi.LinuxContainerResources{MemoryLimitInBytes: 96 << 20},
	}); err != nil {
		t.Fatalf("UpdateContainerResources: %v", err)
	}
	got, err = memoryLimitOf(t, pid)
	if err != nil {
		t.Fatal(err)
	}
	if got != "41943040" {
		t.Fatalf("memory limit %s after a plugin rewrote the update, want %d", got, override)
	}
	stopRemove(t, d, e.pod)
}

// TestNRIAfterRestart: a restarted berthd synchronizes plugins with what
// it recovered and still reports each stop and remove once.
func TestNRIAfterRestart(t *testing.T) {
	t.Parallel()
	d := nriDaemon(t)
	e := newCtrEnvOn(t, d)
	id := e.run(e.config("survivor", "sleep", "1000"))
	exited := e.run(e.config("done", "true"))
	e.waitExited(exited)
	d.Restart()
	p := startPlugin(t, d, "after-restart", "00", nil)
	p.mu.Lock()
	pods, ctrs := slices.Clone(p.syncPods), slices.Clone(p.syncCtrs)
	p.mu.Unlock()
	if !slices.Contains(pods, e.pod) || !slices.Contains(ctrs, id) || !slices.Contains(ctrs, exited) {
		t.Fatalf("Synchronize after restart: pods %v containers %v", pods, ctrs)
	}
	stopRemove(t, d, e.pod)
	// The exited container's stop was before the restart: not again.
	want := []string{"StopContainer", "StopPodSandbox", "RemoveContainer", "RemoveContainer", "RemovePodSandbox"}
	waitUntil(t, "the pod's NRI events after the restart", func() bool { return len(p.eventsFor(e.pod, "")) >= len(want) })
	time.Sleep(300 * time.Millisecond)
	if got := p.eventsFor(e.pod, ""); !slices.Equal(got, want) {
		t.Fatalf("events after restart\n got %v\nwant %v", got, want)
	}
	if got := p.eventsFor(e.pod, id); !slices.Equal(got, []string{"StopContainer", "RemoveContainer"}) {
		t.Fatalf("events of the running container: %v", got)
	}
}

// TestNRIDisabled: with nri.enable = false no socket appears and pods and
// containers work as before.
func TestNRIDisabled(t *testing.T) {
	t.Parallel()
	d := berthdtest.Start(t, berthdtest.Options{Configure: func(c *config.Config) { c.NRI.Enable = false }})
	e := newCtrEnvOn(t, d)
	e.waitExited(e.run(e.config("plain", "true")))
	if _, err := os.Stat(d.Config.NRI.SocketPath); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("NRI socket with NRI disabled: %v", err)
	}
	stopRemove(t, d, e.pod)
}

// TestNRIPreinstalledPlugin: berthd starts the plugins in nri.plugin_path
// with their configuration from nri.plugin_config_path, and they get events.
func TestNRIPreinstalledPlugin(t *testing.T) {
	t.Parallel()
	pluginDir, confDir := t.TempDir(), t.TempDir()
	out := filepath.Join(t.TempDir(), "events")
	build := exec.Command("go", "build", "-o", filepath.Join(pluginDir, "10-recorder"), "./testdata/nri-recorder")
	if msg, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the test plugin: %v\n%s", err, msg)
	}
	if err := os.WriteFile(filepath.Join(confDir, "10-recorder.conf"), []byte(out+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	d := berthdtest.Start(t, berthdtest.Options{Configure: func(c *config.Config) {
		c.NRI.PluginPath, c.NRI.PluginConfigPath = pluginDir, confDir
	}})
	id := runPod(t, d, podConfig("preinstalled"))
	stopRemove(t, d, id)
	var lines []string
	waitUntil(t, "the preinstalled plugin's three lines", func() bool {
		data, _ := os.ReadFile(out)
		lines = strings.Split(strings.TrimSpace(string(data)), "\n")
		return len(lines) >= 3
	})
	want := []string{"Configure berth", "RunPodSandbox preinstalled", "RemovePodSandbox preinstalled"}
	if !slices.Equal(lines, want) {
		t.Fatalf("plugin saw\n%v\nwant\n%v", lines, want)
	}
}

// TestNRIPodRemovalPartialFailure: RemovePodSandbox cannot remove one of
// the pod's containers (something is mounted inside its directory). The
// call fails, yet the container it did remove is reported to NRI plugins
// (and to event subscribers) at once; the retry, once the mount is gone,
// reports the other. Each container's RemoveContainer goes out exactly
// once, before the pod's RemovePodSandbox.
func TestNRIPodRemovalPartialFailure(t *testing.T) {
	t.Parallel()
	d := nriDaemon(t)
	p := startPlugin(t, d, "partial", "00", nil)
	e := newCtrEnvOn(t, d)
	ctx := berthdtest.Ctx(t)
	evCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := d.Runtime.GetContainerEvents(evCtx, &criapi.GetEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	deleted := make(chan string, 16)
	go func() {
		for {
			ev, err := stream.Recv()
			if err != nil {
				return
			}
			if ev.ContainerEventType == criapi.ContainerEventType_CONTAINER_DELETED_EVENT {
				deleted <- ev.ContainerId
			}
		}
	}()
	time.Sleep(200 * time.Millisecond) // subscribed before the first event

	a := e.run(e.config("a", "sleep", "1000"))
	b := e.create(e.config("b", "sleep", "1000"))
	if _, err := d.Runtime.StopPodSandbox(ctx, &criapi.StopPodSandboxRequest{PodSandboxId: e.pod}); err != nil {
		t.Fatal(err)
	}
	blocker := filepath.Join(d.Root, "containers", b, "blocker")
	if err := os.Mkdir(blocker, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "blocker", blocker).CombinedOutput(); err != nil {
		t.Fatalf("mount: %v: %s", err, out)
	}
	unmounted := false
	unmount := func() {
		if !unmounted {
			unmounted = true
			if out, err := exec.Command("umount", blocker).CombinedOutput(); err != nil {
				t.Errorf("umount: %v: %s", err, out)
			}
		}
	}
	t.Cleanup(unmount)

	if _, err := d.Runtime.RemovePodSandbox(ctx, &criapi.RemovePodSandboxRequest{PodSandboxId: e.pod}); err == nil {
		t.Fatal("RemovePodSandbox succeeded with a container it could not remove")
	}
	if got := p.eventsFor(e.pod, a); !slices.Contains(got, "RemoveContainer") {
		t.Fatalf("the removed container's events %v: no RemoveContainer after the failed call", got)
	}
	if got := p.eventsFor(e.pod, b); slices.Contains(got, "RemoveContainer") {
		t.Fatalf("the container still there was reported removed: %v", got)
	}
	if got := p.eventsFor(e.pod, ""); slices.Contains(got, "RemovePodSandbox") {
		t.Fatalf("the pod was reported removed: %v", got)
	}
	resp, err := d.Runtime.ListContainers(ctx, &criapi.ListContainersRequest{Filter: &criapi.ContainerFilter{PodSandboxId: e.pod}})
	if err != nil || len(resp.Containers) != 1 || resp.Containers[0].Id != b {
		t.Fatalf("listed after the failed call: %v, %v; want b alone", resp.GetContainers(), err)
	}

	unmount()
	if _, err := d.Runtime.RemovePodSandbox(ctx, &criapi.RemovePodSandboxRequest{PodSandboxId: e.pod}); err != nil {
		t.Fatalf("retry: %v", err)
	}
	time.Sleep(300 * time.Millisecond) // a late duplicate would show now
	var order []string
	p.mu.Lock()
	for _, ev := range p.events {
		switch {
		case ev.kind == "RemoveContainer" && (ev.ctr.GetId() == a || ev.ctr.GetId() == b):
			order = append(order, ev.ctr.GetId())
		case ev.kind == "RemovePodSandbox" && ev.pod.GetId() == e.pod:
			order = append(order, "pod")
		}
	}
	p.mu.Unlock()
	if !slices.Equal(order, []string{a, b, "pod"}) {
		t.Fatalf("removals heard by the plugin: %v, want a, b, then the pod, once each", order)
	}
	var gone []string
	for len(gone) < 2 {
		select {
		case id := <-deleted:
			gone = append(gone, id)
		case <-time.After(10 * time.Second):
			t.Fatalf("deleted events: %v", gone)
		}
	}
	select {
	case id := <-deleted:
		t.Fatalf("a second deleted event for %s", id)
	case <-time.After(200 * time.Millisecond):
	}
	if !slices.Equal(gone, []string{a, b}) {
		t.Fatalf("deleted events %v, want a then b", gone)
	}
}
