// Package nri is berth's side of the Node Resource Interface: it wraps
// github.com/containerd/nri/pkg/adaptation, turns berth's sandbox and
// container records into NRI's objects, relays lifecycle events to plugins
// and applies what they answer (spec adjustments, container updates and
// evictions). Hooks makes it the lifecycle service's lifecycle.Hooks: the
// service calls it at fixed points of each flow (docs/nri.md has the
// ordering), and the
// container store's events reach ContainerEvent through the daemon's one
// subscriber list. Every method is a no-op when NRI is off.
package nri

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/containerd/nri/pkg/adaptation"
	api "github.com/containerd/nri/pkg/api"
	nrilog "github.com/containerd/nri/pkg/log"
	nrigen "github.com/containerd/nri/pkg/runtime-tools/generate"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/cdi"
	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/container"
	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/sandbox"
	"github.com/berthcri/berth/internal/specgen"
	"github.com/berthcri/berth/internal/tracing"
)

// Options configure NRI.
type Options struct {
	Config config.NRI
	// Name and Version identify the runtime to plugins.
	Name, Version string
	Sandboxes     *sandbox.Store
	Containers    *container.Store
	// CDI resolves CDI devices plugins add; nil refuses them.
	CDI *cdi.Registry
	// Host is the host's facts probed at start: resources reach plugins
	// converted as create converts them (specgen.Resources). Required.
	Host   *specgen.Host
	Logger *slog.Logger
}

// lifecycle is how far NRI plugins were told an object got; it makes
// every event go out once (a second StopPodSandbox, a remove after an
// exit already reported) and keeps Stop before Remove.
type lifecycle int

const (
	created lifecycle = iota + 1
	// starting: StartContainer was sent, PostStartContainer not yet. An
	// exit seen now is held back until PostStartContainer, so plugins
	// never hear Stop before PostStart of a container that exits at once.
	starting
	running
	stopped
)

// tracked is a container plugins know about, with the NRI view built at
// creation (args, env, mounts … from the final spec), so later events
// need not re-read the spec and still work after the container is gone.
type tracked struct {
	state lifecycle
	ctr   *api.Container
	// exitedAs is the record of a container that exited while starting;
	// PostStartContainer sends its Stop with it.
	exitedAs *container.Container
}

// NRI relays berth's pod and container lifecycle to NRI plugins.
type NRI struct {
	opts Options
	log  *slog.Logger
	a    *adaptation.Adaptation // nil when disabled

	// mu serialises events to plugins and plugin synchronisation, as
	// containerd does: a plugin sees one runtime, one event at a time.
	mu   sync.Mutex
	pods map[string]lifecycle
	ctrs map[string]*tracked
}

// New builds NRI from the config; disabled, it returns an NRI whose
// methods do nothing.
func New(opts Options) (*NRI, error) {
	if opts.Host == nil {
		return nil, errors.New("nri.New: Options.Host (the host's probed facts) is required")
	}
	n := &NRI{opts: opts, log: opts.Logger, pods: map[string]lifecycle{}, ctrs: map[string]*tracked{}}
	if n.log == nil {
		n.log = slog.New(slog.DiscardHandler)
	}
	n.log = n.log.With("component", "nri")
	if !opts.Config.Enable {
		return n, nil
	}
	nrilog.Set(slogAdapter{n.log})
	// The library keeps its timeouts in package variables; one daemon per
	// process, so setting them here is setting them for this daemon.
	if t := time.Duration(opts.Config.PluginRegistrationTimeout); t > 0 {
		adaptation.SetPluginRegistrationTimeout(t)
	}
	if t := time.Duration(opts.Config.PluginRequestTimeout); t > 0 {
		adaptation.SetPluginRequestTimeout(t)
	}
	var aopts []adaptation.Option
	if p := opts.Config.SocketPath; p != "" {
		aopts = append(aopts, adaptation.WithSocketPath(p))
	}
	if p := opts.Config.PluginPath; p != "" {
		aopts = append(aopts, adaptation.WithPluginPath(p))
	}
	if p := opts.Config.PluginConfigPath; p != "" {
		aopts = append(aopts, adaptation.WithPluginConfigPath(p))
	}
	name := opts.Name
	if name == "" {
		name = "berth"
	}
	a, err := adaptation.New(name, opts.Version, n.synchronize, n.updateFromPlugin, aopts...)
	if err != nil {
		return nil, fmt.Errorf("create NRI adaptation: %w", err)
	}
	n.a = a
	return n, nil
}

// Enabled reports whether NRI is on.
func (n *NRI) Enabled() bool { return n != nil && n.a != nil }

// Start remembers what already exists (so a restarted berthd still sends
// each stop and remove once), starts pre-installed plugins and listens for
// external ones.
func (n *NRI) Start() error {
	if !n.Enabled() {
		return nil
	}
	n.mu.Lock()
	for _, sb := range n.opts.Sandboxes.List() {
		if sb.State == runtime.PodSandboxState_SANDBOX_READY {
			n.pods[sb.ID] = running
		} else {
			n.pods[sb.ID] = stopped
		}
	}
	for _, c := range n.opts.Containers.List() {
		n.ctrs[c.ID] = &tracked{state: stateOf(c), ctr: n.containerView(c)}
	}
	n.mu.Unlock()
	if err := n.a.Start(); err != nil {
		return fmt.Errorf("start NRI: %w", err)
	}
	n.log.Info("NRI started", "socket", n.opts.Config.SocketPath)
	return nil
}

// Stop disconnects every plugin and closes the socket.
func (n *NRI) Stop() {
	if n.Enabled() {
		n.a.Stop()
	}
}

// SyncBlock holds off plugin registration; see BlockPluginSync.
type SyncBlock = adaptation.PluginSyncBlock

// BlockPluginSync keeps a newly connecting plugin from being synchronised
// until Unblock, so that a plugin's Synchronize either includes a change
// or the plugin gets its event. Every event method holds it while it
// runs; RunPodSandbox and CreateContainer hand theirs to the caller, who
// unblocks once the new object is visible in its store. It is a read
// lock: never take it twice in one goroutine (a waiting sync would
// deadlock). Unblock on the nil a disabled NRI returns is fine.
func (n *NRI) BlockPluginSync() *SyncBlock {
	if !n.Enabled() {
		return nil
	}
	return n.a.BlockPluginSync()
}

func stateOf(c *container.Container) lifecycle {
	switch c.State {
	case container.StateRunning:
		return running
	case container.StateExited:
		return stopped
	}
	return created
}

// containerView builds a container's NRI view from its record and spec.
func (n *NRI) containerView(c *container.Container) *api.Container {
	spec, err := n.opts.Containers.Spec(c.ID)
	if err != nil {
		n.log.Debug("container spec unreadable; plugins get the record only", "container", c.ID, "err", err)
	}
	return containerToNRI(c, spec)
}

// pod is the NRI view of a pod by ID, a stub if it is gone.
func (n *NRI) pod(id string) *api.PodSandbox {
	sb, err := n.opts.Sandboxes.Get(id)
	if err != nil {
		return podStub(id)
	}
	return podToNRI(sb, n.opts.Host)
}

// RunPodSandbox tells plugins about a pod that is set up but not yet
// visible; an error fails RunPodSandbox. On success the caller gets the
// plugin-sync block and must Unblock it once the pod is visible (or Run
// failed).
func (n *NRI) RunPodSandbox(ctx context.Context, sb *sandbox.Sandbox) (*SyncBlock, error) {
	if !n.Enabled() {
		return nil, nil
	}
	ctx, span := tracing.Start(ctx, "nri.RunPodSandbox")
	defer span.End()
	block := n.a.BlockPluginSync()
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.a.RunPodSandbox(ctx, &api.RunPodSandboxRequest{Pod: podToNRI(sb, n.opts.Host)}); err != nil {
		block.Unblock()
		return nil, fmt.Errorf("NRI RunPodSandbox: %w", err)
	}
	n.pods[sb.ID] = running
	return block, nil
}

// StopPodSandbox tells plugins a pod stops; its containers have stopped
// and it is still there. Only the first call per pod is relayed.
func (n *NRI) StopPodSandbox(ctx context.Context, sb *sandbox.Sandbox) error {
	if !n.Enabled() {
		return nil
	}
	ctx, span := tracing.Start(ctx, "nri.StopPodSandbox")
	defer span.End()
	defer n.a.BlockPluginSync().Unblock()
	n.mu.Lock()
	defer n.mu.Unlock()
	if st, ok := n.pods[sb.ID]; !ok || st != running {
		return nil
	}
	n.pods[sb.ID] = stopped
	if err := n.a.StopPodSandbox(ctx, &api.StopPodSandboxRequest{Pod: podToNRI(sb, n.opts.Host)}); err != nil {
		return fmt.Errorf("NRI StopPodSandbox: %w", err)
	}
	return nil
}

// UpdatePodSandbox tells plugins about new pod-level resources
// (UpdatePodSandboxResources) before they are applied; an error fails the
// update.
func (n *NRI) UpdatePodSandbox(ctx context.Context, sb *sandbox.Sandbox, overhead, resources *runtime.LinuxContainerResources) error {
	if !n.Enabled() {
		return nil
	}
	ctx, span := tracing.Start(ctx, "nri.UpdatePodSandbox")
	defer span.End()
	defer n.a.BlockPluginSync().Unblock()
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, err := n.a.UpdatePodSandbox(ctx, &api.UpdatePodSandboxRequest{
		Pod:                    podToNRI(sb, n.opts.Host),
		OverheadLinuxResources: criResourcesToNRI(overhead, n.opts.Host),
		LinuxResources:         criResourcesToNRI(resources, n.opts.Host),
	}); err != nil {
		return fmt.Errorf("NRI UpdatePodSandbox: %w", err)
	}
	return nil
}

// PostUpdatePodSandbox reports a pod whose resources changed.
func (n *NRI) PostUpdatePodSandbox(ctx context.Context, sb *sandbox.Sandbox) {
	if !n.Enabled() {
		return
	}
	defer n.a.BlockPluginSync().Unblock()
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.a.PostUpdatePodSandbox(ctx, &api.PostUpdatePodSandboxRequest{Pod: podToNRI(sb, n.opts.Host)}); err != nil {
		n.log.Warn("NRI notification failed", "pod", sb.ID, "err", err)
	}
}

// RemovePodSandbox tells plugins a pod is gone (after a stop, which is
// sent first if it was not).
func (n *NRI) RemovePodSandbox(ctx context.Context, sb *sandbox.Sandbox) error {
	if !n.Enabled() {
		return nil
	}
	ctx, span := tracing.Start(ctx, "nri.RemovePodSandbox")
	defer span.End()
	defer n.a.BlockPluginSync().Unblock()
	n.mu.Lock()
	defer n.mu.Unlock()
	st, ok := n.pods[sb.ID]
	if !ok {
		return nil
	}
	delete(n.pods, sb.ID)
	pod := podToNRI(sb, n.opts.Host)
	if st == running {
		if err := n.a.StopPodSandbox(ctx, &api.StopPodSandboxRequest{Pod: pod}); err != nil {
			n.log.Warn("NRI StopPodSandbox before remove", "pod", sb.ID, "err", err)
		}
	}
	if err := n.a.RemovePodSandbox(ctx, &api.RemovePodSandboxRequest{Pod: pod}); err != nil {
		return fmt.Errorf("NRI RemovePodSandbox: %w", err)
	}
	return nil
}

// CreateContainer asks plugins about a container whose spec is built but
// which the OCI runtime has not created yet, and applies their adjustment
// to spec in place. c is the record to be (state created). An error fails
// the create. On success the caller gets the plugin-sync block and must
// Unblock it once the container is visible (or the create failed, then
// call UndoCreateContainer after Unblock).
func (n *NRI) CreateContainer(ctx context.Context, sb *sandbox.Sandbox, c *container.Container, spec *specs.Spec) (*SyncBlock, error) {
	if !n.Enabled() {
		return nil, nil
	}
	ctx, span := tracing.Start(ctx, "nri.CreateContainer")
	defer span.End()
	block := n.a.BlockPluginSync()
	n.mu.Lock()
	ctr := containerToNRI(c, spec)
	rsp, err := n.a.CreateContainer(ctx, &api.CreateContainerRequest{Pod: podToNRI(sb, n.opts.Host), Container: ctr})
	if err != nil {
		n.mu.Unlock()
		block.Unblock()
		return nil, fmt.Errorf("NRI CreateContainer: %w", err)
	}
	if adj := rsp.GetAdjust(); adj != nil {
		g := nrigen.SpecGenerator(&specEdit{spec: spec}, generatorOptions(n.opts.CDI)...)
		if err := g.Adjust(adj); err != nil {
			n.ctrs[c.ID] = &tracked{state: created, ctr: ctr}
			n.mu.Unlock()
			block.Unblock()
			// Plugins saw the create: tell them it is undone.
			n.UndoCreateContainer(context.WithoutCancel(ctx), sb, c, spec)
			return nil, fmt.Errorf("apply NRI adjustment to container %s: %w", c.ID, err)
		}
		if adj.GetLinux().GetResources() != nil && spec.Linux != nil {
			// Status reports what the container really got.
			c.Resources = adjustedCRIResources(c.Resources, spec)
		}
	}
	n.ctrs[c.ID] = &tracked{state: created, ctr: containerToNRI(c, spec)}
	n.mu.Unlock()
	n.applyEvictions(ctx, rsp.GetEvict())
	n.applyUpdates(ctx, rsp.GetUpdate())
	return block, nil
}

// generatorOptions resolve the CDI devices an adjustment adds through reg
// (nil: refused), and make adjustments berth cannot honour fail the
// create instead of being dropped silently.
func generatorOptions(reg *cdi.Registry) []nrigen.GeneratorOption {
	return []nrigen.GeneratorOption{
		nrigen.WithCDIDeviceInjector(func(s *specs.Spec, devices []string) error {
			if reg == nil {
				return fmt.Errorf("NRI adjustment asks for CDI devices %v: CDI is not configured: %w", devices, errdefs.ErrInvalidArgument)
			}
			return reg.Inject(s, devices)
		}),
		unsupportedBlockIO, unsupportedRdt,
	}
}

var (
	unsupportedBlockIO = nrigen.WithBlockIOResolver(func(class string) (*specs.LinuxBlockIO, error) {
		if class == "" {
			return nil, nil
		}
		return nil, fmt.Errorf("NRI adjustment asks for block I/O class %q: not supported: %w", class, errdefs.ErrInvalidArgument)
	})
	unsupportedRdt = nrigen.WithRdtResolver(func(class string) (*specs.LinuxIntelRdt, error) {
		if class == "" {
			return nil, nil
		}
		return nil, fmt.Errorf("NRI adjustment asks for RDT class %q: not supported: %w", class, errdefs.ErrInvalidArgument)
	})
)

// UndoCreateContainer tells plugins a container they saw in
// CreateContainer will not exist after all: stop, then remove.
func (n *NRI) UndoCreateContainer(ctx context.Context, sb *sandbox.Sandbox, c *container.Container, spec *specs.Spec) {
	if !n.Enabled() {
		return
	}
	defer n.a.BlockPluginSync().Unblock()
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, ok := n.ctrs[c.ID]; !ok {
		return
	}
	delete(n.ctrs, c.ID)
	pod, ctr := podToNRI(sb, n.opts.Host), containerToNRI(c, spec)
	if _, err := n.a.StopContainer(ctx, &api.StopContainerRequest{Pod: pod, Container: ctr}); err != nil {
		n.log.Warn("NRI undo create (stop)", "container", c.ID, "err", err)
	}
	if err := n.a.RemoveContainer(ctx, &api.RemoveContainerRequest{Pod: pod, Container: ctr}); err != nil {
		n.log.Warn("NRI undo create (remove)", "container", c.ID, "err", err)
	}
}

// view returns the tracked container updated from its current record;
// nil if plugins never heard of it. Caller holds mu.
func (n *NRI) view(c *container.Container) *tracked {
	t := n.ctrs[c.ID]
	if t == nil {
		return nil
	}
	setStatus(t.ctr, c)
	return t
}

// PostCreateContainer reports a container now visible in the store.
func (n *NRI) PostCreateContainer(ctx context.Context, c *container.Container) {
	n.notify(ctx, c, func(pod *api.PodSandbox, ctr *api.Container) error {
		return n.a.PostCreateContainer(ctx, &api.PostCreateContainerRequest{Pod: pod, Container: ctr})
	})
}

// StartContainer tells plugins a created container is about to start; an
// error fails the start.
func (n *NRI) StartContainer(ctx context.Context, c *container.Container) error {
	if !n.Enabled() {
		return nil
	}
	ctx, span := tracing.Start(ctx, "nri.StartContainer")
	defer span.End()
	defer n.a.BlockPluginSync().Unblock()
	n.mu.Lock()
	defer n.mu.Unlock()
	t := n.view(c)
	if t == nil {
		return nil
	}
	t.state = starting
	if err := n.a.StartContainer(ctx, &api.StartContainerRequest{Pod: n.pod(c.PodID), Container: t.ctr}); err != nil {
		return fmt.Errorf("NRI StartContainer: %w", err)
	}
	return nil
}

// PostStartContainer reports a container that started, and then its stop
// if it already exited.
func (n *NRI) PostStartContainer(ctx context.Context, c *container.Container) {
	if !n.Enabled() {
		return
	}
	defer n.a.BlockPluginSync().Unblock()
	n.mu.Lock()
	t := n.view(c)
	if t == nil || t.state != starting {
		n.mu.Unlock()
		return
	}
	t.state = running
	if err := n.a.PostStartContainer(ctx, &api.PostStartContainerRequest{Pod: n.pod(c.PodID), Container: t.ctr}); err != nil {
		n.log.Warn("NRI notification failed", "pod", c.PodID, "container", c.ID, "err", err)
	}
	var updates []*api.ContainerUpdate
	var err error
	if t.exitedAs != nil {
		updates, err = n.stopLocked(ctx, t.exitedAs)
	}
	n.mu.Unlock()
	n.applyUpdates(ctx, updates)
	if err != nil {
		n.log.Warn("NRI stop notification for an exited container", "pod", c.PodID, "container", c.ID, "err", err)
	}
}

// notify sends a post-event plugins cannot fail; errors are logged.
func (n *NRI) notify(ctx context.Context, c *container.Container, send func(*api.PodSandbox, *api.Container) error) {
	if !n.Enabled() {
		return
	}
	defer n.a.BlockPluginSync().Unblock()
	n.mu.Lock()
	defer n.mu.Unlock()
	t := n.view(c)
	if t == nil {
		return
	}
	if err := send(n.pod(c.PodID), t.ctr); err != nil {
		n.log.Warn("NRI notification failed", "pod", c.PodID, "container", c.ID, "err", err)
	}
}

// UpdateContainer asks plugins about a resource update from
// UpdateContainerResources; they may change it: the result is what to
// apply (res itself when nobody changed it).
func (n *NRI) UpdateContainer(ctx context.Context, c *container.Container, res *specs.LinuxResources) (*specs.LinuxResources, error) {
	if !n.Enabled() {
		return res, nil
	}
	ctx, span := tracing.Start(ctx, "nri.UpdateContainer")
	defer span.End()
	defer n.a.BlockPluginSync().Unblock()
	n.mu.Lock()
	t := n.view(c)
	if t == nil {
		n.mu.Unlock()
		return res, nil
	}
	rsp, err := n.a.UpdateContainer(ctx, &api.UpdateContainerRequest{
		Pod: n.pod(c.PodID), Container: t.ctr, LinuxResources: api.FromOCILinuxResources(res, nil),
	})
	n.mu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("NRI UpdateContainer: %w", err)
	}
	n.applyEvictions(ctx, rsp.GetEvict())
	updates := rsp.GetUpdate()
	// The adaptation answers with the requested update last, merged with
	// what plugins changed; the others are for other containers.
	for i := len(updates) - 1; i >= 0; i-- {
		if updates[i].GetContainerId() == c.ID {
			if r := updates[i].GetLinux().GetResources(); r != nil {
				res = r.ToOCI()
			}
			updates = append(updates[:i:i], updates[i+1:]...)
			break
		}
	}
	n.applyUpdates(ctx, updates)
	return res, nil
}

// PostUpdateContainer reports a container whose resources changed.
func (n *NRI) PostUpdateContainer(ctx context.Context, c *container.Container) {
	n.notify(ctx, c, func(pod *api.PodSandbox, ctr *api.Container) error {
		return n.a.PostUpdateContainer(ctx, &api.PostUpdateContainerRequest{Pod: pod, Container: ctr})
	})
}

// StopContainer tells plugins a container stopped (by StopContainer or
// its own exit); only the first report per container goes out.
func (n *NRI) StopContainer(ctx context.Context, c *container.Container) error {
	if !n.Enabled() {
		return nil
	}
	ctx, span := tracing.Start(ctx, "nri.StopContainer")
	defer span.End()
	defer n.a.BlockPluginSync().Unblock()
	n.mu.Lock()
	updates, err := n.stopLocked(ctx, c)
	n.mu.Unlock()
	n.applyUpdates(ctx, updates)
	return err
}

func (n *NRI) stopLocked(ctx context.Context, c *container.Container) ([]*api.ContainerUpdate, error) {
	t := n.view(c)
	if t == nil || t.state == stopped {
		return nil, nil
	}
	t.state = stopped
	rsp, err := n.a.StopContainer(ctx, &api.StopContainerRequest{Pod: n.pod(c.PodID), Container: t.ctr})
	if err != nil {
		return nil, fmt.Errorf("NRI StopContainer: %w", err)
	}
	return rsp.GetUpdate(), nil
}

// ContainerExited reports, in the background, a container that exited on
// its own. It runs from the container store's event hook, which holds the
// container's lock, so it must not wait for plugins there.
func (n *NRI) ContainerExited(c *container.Container) {
	if !n.Enabled() {
		return
	}
	go func() {
		ctx := context.Background()
		defer n.a.BlockPluginSync().Unblock()
		n.mu.Lock()
		if t := n.ctrs[c.ID]; t != nil && t.state == starting {
			t.exitedAs = c // PostStartContainer sends the stop
			n.mu.Unlock()
			return
		}
		updates, err := n.stopLocked(ctx, c)
		n.mu.Unlock()
		n.applyUpdates(ctx, updates)
		if err != nil {
			n.log.Warn("NRI stop notification for an exited container", "pod", c.PodID, "container", c.ID, "err", err)
		}
	}()
}

// RemoveContainer tells plugins a container is gone (stopping it first
// for them if that was not reported yet).
func (n *NRI) RemoveContainer(ctx context.Context, c *container.Container) error {
	if !n.Enabled() {
		return nil
	}
	ctx, span := tracing.Start(ctx, "nri.RemoveContainer")
	defer span.End()
	defer n.a.BlockPluginSync().Unblock()
	n.mu.Lock()
	updates, err := n.stopLocked(ctx, c)
	if err != nil {
		n.log.Warn("NRI stop before remove", "container", c.ID, "err", err)
	}
	t := n.view(c)
	if t == nil {
		n.mu.Unlock()
		return nil
	}
	delete(n.ctrs, c.ID)
	err = n.a.RemoveContainer(ctx, &api.RemoveContainerRequest{Pod: n.pod(c.PodID), Container: t.ctr})
	n.mu.Unlock()
	n.applyUpdates(ctx, updates)
	if err != nil {
		return fmt.Errorf("NRI RemoveContainer: %w", err)
	}
	return nil
}

// synchronize hands a newly connected plugin every pod and container. It
// runs with plugin sync blocked for RPCs (see BlockPluginSync), so nothing
// is created between this listing and the plugin joining the event flow.
func (n *NRI) synchronize(ctx context.Context, cb adaptation.SyncCB) error {
	n.mu.Lock()
	var pods []*api.PodSandbox
	for _, sb := range n.opts.Sandboxes.List() {
		pods = append(pods, podToNRI(sb, n.opts.Host))
	}
	var ctrs []*api.Container
	for _, c := range n.opts.Containers.List() {
		t := n.view(c)
		if t == nil {
			// Created before NRI started or while it was off.
			t = &tracked{state: stateOf(c), ctr: n.containerView(c)}
			n.ctrs[c.ID] = t
		}
		ctrs = append(ctrs, t.ctr)
	}
	n.log.Info("synchronizing NRI plugin", "pods", len(pods), "containers", len(ctrs))
	updates, err := cb(ctx, pods, ctrs)
	n.mu.Unlock()
	if err != nil {
		return err
	}
	n.applyUpdates(ctx, updates)
	return nil
}

// updateFromPlugin applies updates a plugin asks for on its own.
func (n *NRI) updateFromPlugin(ctx context.Context, updates []*api.ContainerUpdate) ([]*api.ContainerUpdate, error) {
	return n.applyUpdates(ctx, updates), nil
}

// applyUpdates changes container resources through the OCI runtime's
// update, returning the updates that failed. Never called with mu held: an
// update takes the container's lock, which a lifecycle RPC may hold while
// it waits for mu.
func (n *NRI) applyUpdates(ctx context.Context, updates []*api.ContainerUpdate) []*api.ContainerUpdate {
	var failed []*api.ContainerUpdate
	for _, u := range updates {
		res := u.GetLinux().GetResources()
		if res == nil {
			continue
		}
		err := n.opts.Containers.UpdateResources(ctx, u.GetContainerId(), res.ToOCI(), ociToCRI(res.ToOCI()))
		if err != nil && !errdefs.IsNotFound(err) {
			n.log.Warn("NRI container update failed", "container", u.GetContainerId(), "err", err)
			if !u.GetIgnoreFailure() {
				failed = append(failed, u)
			}
			continue
		}
		n.log.Info("NRI plugin updated container resources", "container", u.GetContainerId())
	}
	return failed
}

// applyEvictions stops the containers plugins want gone.
func (n *NRI) applyEvictions(ctx context.Context, evictions []*api.ContainerEviction) {
	for _, e := range evictions {
		n.log.Info("NRI plugin evicts container", "container", e.GetContainerId(), "reason", e.GetReason())
		if err := n.opts.Containers.Stop(ctx, e.GetContainerId(), 0); err != nil {
			n.log.Warn("NRI eviction failed", "container", e.GetContainerId(), "err", err)
		}
	}
}

// ociToCRI is the CRI form of OCI resources, for the container record
// (status reports it).
func ociToCRI(r *specs.LinuxResources) *runtime.LinuxContainerResources {
	out := &runtime.LinuxContainerResources{}
	if r == nil {
		return out
	}
	if c := r.CPU; c != nil {
		if c.Shares != nil {
			out.CpuShares = int64(*c.Shares)
		}
		if c.Quota != nil {
			out.CpuQuota = *c.Quota
		}
		if c.Period != nil {
			out.CpuPeriod = int64(*c.Period)
		}
		out.CpusetCpus, out.CpusetMems = c.Cpus, c.Mems
	}
	if m := r.Memory; m != nil {
		if m.Limit != nil {
			out.MemoryLimitInBytes = *m.Limit
		}
		if m.Swap != nil {
			out.MemorySwapLimitInBytes = *m.Swap
		}
	}
	for _, h := range r.HugepageLimits {
		out.HugepageLimits = append(out.HugepageLimits, &runtime.HugepageLimit{PageSize: h.Pagesize, Limit: h.Limit})
	}
	out.Unified = r.Unified
	return out
}

// adjustedCRIResources is the CRI resources of a container after a plugin
// changed its spec: the spec's limits, with the CRI-only fields (OOM score
// adjustment, swap as the CRI asked) kept from the request.
func adjustedCRIResources(asked *runtime.LinuxContainerResources, spec *specs.Spec) *runtime.LinuxContainerResources {
	out := ociToCRI(spec.Linux.Resources)
	out.OomScoreAdj = asked.GetOomScoreAdj()
	if spec.Process != nil && spec.Process.OOMScoreAdj != nil {
		out.OomScoreAdj = int64(*spec.Process.OOMScoreAdj)
	}
	return out
}

// slogAdapter sends the NRI library's log lines to berthd's logger.
type slogAdapter struct{ l *slog.Logger }

func (s slogAdapter) Debugf(ctx context.Context, f string, a ...any) {
	s.l.DebugContext(ctx, fmt.Sprintf(f, a...))
}
func (s slogAdapter) Infof(ctx context.Context, f string, a ...any) {
	s.l.InfoContext(ctx, fmt.Sprintf(f, a...))
}
func (s slogAdapter) Warnf(ctx context.Context, f string, a ...any) {
	s.l.WarnContext(ctx, fmt.Sprintf(f, a...))
}
func (s slogAdapter) Errorf(ctx context.Context, f string, a ...any) {
	s.l.ErrorContext(ctx, fmt.Sprintf(f, a...))
}

// ContainerEvent is meant for container.Options.OnEvent (next to the CRI
// event publisher): a container that stopped, on its own or otherwise, is
// reported to plugins in the background.
func (n *NRI) ContainerEvent(ev container.Event) {
	if ev.Kind == container.EventStopped {
		n.ContainerExited(ev.Container)
	}
}
