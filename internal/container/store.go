// Package container owns container records, their lifecycle state machine
// (created → running → exited → removed) and their rootfs mounts. Processes
// run through the pod's berth-shim; the OCI spec comes from the caller.
package container

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/moby/sys/signal"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/atomicfile"
	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/fault"
	"github.com/berthcri/berth/internal/idprefix"
	"github.com/berthcri/berth/internal/oci"
	"github.com/berthcri/berth/internal/shim"
)

// LayerReleaser frees the layers a container pinned (image.Store).
type LayerReleaser interface {
	Release(owner string) error
}

// Options configure a Store.
type Options struct {
	// Dir is <root>/containers.
	Dir string
	// ShimDir is <state>/shims; each pod's shim lives in <ShimDir>/<pod-id>.
	ShimDir string
	// ShimBinary is the berth-shim executable.
	ShimBinary string
	// Runtimes maps runtime handler names to OCI runtimes.
	Runtimes map[string]*oci.Runtime
	// Layers releases image layers on remove and failed create.
	Layers LayerReleaser
	Logger *slog.Logger
	// OnEvent, if set, hears every lifecycle transition (events.go).
	OnEvent func(Event)
	// Faults, for crash-recovery tests only, kills berthd at armed points
	// (nil in production).
	Faults *fault.Injector
	// Cgroups drops the limits of cgroup controllers the host lacks from
	// every spec and update before the runtime sees them; nil keeps all.
	Cgroups LimitDropper
}

// LimitDropper removes from r the limits the host's cgroups cannot take
// and names the controllers whose limits it removed (cgroupctrl).
type LimitDropper interface {
	Drop(r *specs.LinuxResources) []string
}

// Store holds every container.
type Store struct {
	opts Options
	log  *slog.Logger

	mu    sync.Mutex
	ctrs  map[string]*entry
	names map[string]string // pod/name/attempt → ID

	// shimLocks serialise shim launches per pod (two creates in one pod
	// must not launch two shims); guarded by mu. Pods never wait on each
	// other's shim, so a hung shim stalls only its own pod.
	shimLocks map[string]*podShimLock
}

// podShimLock is one pod's shim-launch lock; refs counts holders and
// waiters, so the map entry goes when nobody needs it.
type podShimLock struct {
	mu   sync.Mutex
	refs int
}

// entry is a container in memory; mu serialises its lifecycle operations.
type entry struct {
	mu  sync.Mutex
	rec *Container
	// snap is a copy of rec taken at every unlock. List reads it without
	// taking mu, so a StopContainer waiting out a grace period under mu
	// never stalls the kubelet's ListContainers relist.
	snap atomic.Pointer[Container]
}

func newEntry(rec *Container) *entry {
	e := &entry{rec: rec}
	e.snap.Store(rec.clone())
	return e
}

// unlock publishes the record as it is now and releases mu.
func (e *entry) unlock() {
	e.snap.Store(e.rec.clone())
	e.mu.Unlock()
}

// Open loads the records under opts.Dir and reconciles them with the shims
// (restart recovery).
func Open(ctx context.Context, opts Options) (*Store, error) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	for _, d := range []string{opts.Dir, opts.ShimDir} {
		if err := os.MkdirAll(d, 0o711); err != nil {
			return nil, fmt.Errorf("create %s: %w", d, err)
		}
	}
	s := &Store{opts: opts, log: opts.Logger, ctrs: map[string]*entry{}, names: map[string]string{}, shimLocks: map[string]*podShimLock{}}
	if err := s.recover(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Store) dir(id string) string { return filepath.Join(s.opts.Dir, id) }

func (s *Store) shimClient(podID string) *shim.Client {
	return shim.NewClient(filepath.Join(s.opts.ShimDir, podID))
}

func nameKey(podID, name string, attempt uint32) string {
	return podID + "/" + name + "/" + strconv.FormatUint(uint64(attempt), 10)
}

// AcquiredImage is what the caller's image lookup gives Create.
type AcquiredImage struct {
	ID         string   // image ID
	Name       string   // a repo tag, or what was asked
	Ref        string   // a repo digest, or the ID
	LowerDirs  []string // topmost first
	StopSignal string   // the config's, else the image config's; "" → SIGTERM
}

// CreateParams are the inputs of Create.
type CreateParams struct {
	PodID   string
	Runtime string // handler name
	Config  *runtime.ContainerConfig
	// LogPath is the absolute log file path ("" → no log).
	LogPath string
	// Acquire pins the image's layers for the new container ID.
	Acquire func(ctx context.Context, id string) (*AcquiredImage, error)
	// AcquireVolume pins the layers of an image volume's image for owner
	// (the container ID plus ".vol<n>"); needed only when a mount names an
	// image.
	AcquireVolume func(ctx context.Context, ref, owner string) (*AcquiredImage, error)
	// BuildSpec makes the OCI spec once the rootfs and the image volumes
	// are mounted; volumes maps each image volume's container path to the
	// host path to bind there, idmapped each CRI mount with ID mappings to
	// its idmapped copy.
	BuildSpec func(id, rootfs string, volumes, idmapped map[string]string) (*specs.Spec, error)
	// UserNS is the pod's own user namespace; nil for the host's.
	UserNS *UserNS
	// Adjust, if set, sees the finished spec before the OCI runtime
	// creates the container and may edit it (NRI); c is the record to be.
	// An error fails Create. The container is not visible to Get or List
	// yet.
	Adjust func(ctx context.Context, c *Container, spec *specs.Spec) error
}

// imageVolume is one image volume mounted for a container.
type imageVolume struct {
	owner  string
	mount  Mount
	source string
}

// mountImageVolumes pins and mounts every image volume of cfg. The undo
// func releases and unmounts what was done, also on error.
// In a pod with its own user namespace (nsFD ≥ 0) the volume's layers are
// idmapped as the rootfs's are, so files host root owns in the image show
// as the container root's.
func (s *Store) mountImageVolumes(ctx context.Context, p CreateParams, id, dir string, nsFD int) ([]imageVolume, func(), error) {
	var vols []imageVolume
	undo := func() {
		if err := unmountImageVolumes(dir); err != nil {
			s.log.Warn("unmount image volumes after failed create", "container", id, "err", err)
		}
		for _, v := range vols {
			if s.opts.Layers != nil {
				if err := s.opts.Layers.Release(v.owner); err != nil {
					s.log.Warn("release image volume after failed create", "container", id, "owner", v.owner, "err", err)
				}
			}
		}
	}
	for n, m := range p.Config.GetMounts() {
		if m.GetImage() == nil {
			continue
		}
		if m.GetImage().GetImage() == "" {
			undo()
			return nil, nil, fmt.Errorf("image volume %q: image is required: %w", m.GetContainerPath(), errdefs.ErrInvalidArgument)
		}
		if !m.GetReadonly() {
			undo()
			return nil, nil, fmt.Errorf("image volume %q: must be readonly: %w", m.GetContainerPath(), errdefs.ErrInvalidArgument)
		}
		if p.AcquireVolume == nil {
			undo()
			return nil, nil, fmt.Errorf("image volume %q: no image lookup configured: %w", m.GetContainerPath(), errdefs.ErrInvalidArgument)
		}
		owner := id + ".vol" + strconv.Itoa(n)
		img, err := p.AcquireVolume(ctx, m.GetImage().GetImage(), owner)
		if err != nil {
			undo()
			return nil, nil, fmt.Errorf("image volume %q: %w", m.GetContainerPath(), err)
		}
		v := imageVolume{owner: owner, mount: Mount{
			ContainerPath: m.GetContainerPath(), Readonly: true, Propagation: int32(m.GetPropagation()),
			Image: m.GetImage().GetImage(), ImageRef: img.ID, ImageSubPath: m.GetImageSubPath(),
		}}
		vols = append(vols, v)
		var src string
		if nsFD >= 0 {
			err = withIDMappedLayers(volumeIDMapDir(dir, n), img.LowerDirs, nsFD, func(mapped []string) error {
				var err error
				src, err = mountImageVolume(dir, n, mapped, m.GetImageSubPath())
				return err
			})
		} else {
			src, err = mountImageVolume(dir, n, img.LowerDirs, m.GetImageSubPath())
		}
		if err != nil {
			undo()
			return nil, nil, fmt.Errorf("image volume %q: %w", m.GetContainerPath(), err)
		}
		vols[len(vols)-1].source = src
		vols[len(vols)-1].mount.HostPath = src
	}
	return vols, undo, nil
}

// Create makes a container: reserves its name, pins and mounts the image,
// writes the bundle and has the pod's shim create it. Every failure undoes
// what was done.
func (s *Store) Create(ctx context.Context, p CreateParams) (_ *Container, retErr error) {
	cfg := p.Config
	if cfg == nil || cfg.GetMetadata() == nil || cfg.GetMetadata().GetName() == "" {
		return nil, fmt.Errorf("container config needs metadata with a name: %w", errdefs.ErrInvalidArgument)
	}
	rt, ok := s.opts.Runtimes[p.Runtime]
	if !ok {
		return nil, fmt.Errorf("runtime handler %q: %w", p.Runtime, errdefs.ErrInvalidArgument)
	}
	name, attempt := cfg.GetMetadata().GetName(), cfg.GetMetadata().GetAttempt()
	key := nameKey(p.PodID, name, attempt)
	id := newID()
	s.mu.Lock()
	if other, ok := s.names[key]; ok {
		s.mu.Unlock()
		return nil, fmt.Errorf("container name %q attempt %d in pod %s is reserved for %s: %w", name, attempt, p.PodID, other, errdefs.ErrAlreadyExists)
	}
	s.names[key] = id
	s.mu.Unlock()
	log := s.log.With("pod", p.PodID, "container", id, "name", name)
	began := time.Now()

	var undo []func()
	defer func() {
		if retErr != nil {
			for i := len(undo) - 1; i >= 0; i-- {
				undo[i]()
			}
			s.mu.Lock()
			delete(s.names, key)
			s.mu.Unlock()
		}
	}()

	// Reach (or start) the pod's shim while the rootfs and the spec are
	// prepared: starting one (fork, exec, a Go runtime's start) costs a
	// few ms on the first container of every pod.
	type shimResult struct {
		client *shim.Client
		err    error
	}
	shimCh := make(chan shimResult, 1)
	go func() {
		c, err := s.ensureShim(ctx, p.PodID)
		shimCh <- shimResult{c, err}
	}()
	shimJoined := false
	undo = append(undo, func() {
		if shimJoined {
			return
		}
		// Failed before using the shim: one started for this create alone
		// exits (a shim holding other containers refuses, as it should).
		if r := <-shimCh; r.err == nil {
			if err := r.client.Shutdown(context.WithoutCancel(ctx)); err != nil && !errors.Is(err, shim.ErrNoShim) && !errors.Is(err, errdefs.ErrFailedPrecondition) {
				log.Warn("shut the idle shim down after failed create", "err", err)
			}
		}
	})

	dir := s.dir(id)
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return nil, fmt.Errorf("create container dir: %w", err)
	}
	undo = append(undo, func() { _ = os.RemoveAll(dir) })

	img, err := p.Acquire(ctx, id)
	if err != nil {
		return nil, err
	}
	undo = append(undo, func() {
		if s.opts.Layers != nil {
			if err := s.opts.Layers.Release(id); err != nil {
				log.Warn("release image layers after failed create", "err", err)
			}
		}
	})

	nsFD := -1
	if p.UserNS != nil {
		ns, err := os.Open(p.UserNS.Path)
		if err != nil {
			return nil, fmt.Errorf("open the pod's user namespace: %w", err)
		}
		defer ns.Close()
		nsFD = int(ns.Fd())
		undo = append(undo, func() {
			if err := unmountIDMounts(dir); err != nil {
				log.Warn("unmount idmapped mounts after failed create", "err", err)
			}
		})
	}
	var rootfs string
	if p.UserNS != nil {
		rootfs, err = mountRootfsIDMapped(dir, img.LowerDirs, nsFD, p.UserNS.Mapping)
	} else {
		rootfs, err = mountRootfs(dir, img.LowerDirs)
	}
	if err != nil {
		return nil, err
	}
	undo = append(undo, func() {
		if err := unmountRootfs(dir); err != nil {
			log.Warn("unmount rootfs after failed create", "err", err)
		}
	})
	s.opts.Faults.Hit(fault.ContainerAfterOverlayMount, "pod", p.PodID, "container", id)

	vols, undoVols, err := s.mountImageVolumes(ctx, p, id, dir, nsFD)
	if err != nil {
		return nil, err
	}
	undo = append(undo, undoVols)
	volumes := map[string]string{}
	for _, v := range vols {
		volumes[v.mount.ContainerPath] = v.source
	}

	var idmapped map[string]string
	if p.UserNS != nil {
		if idmapped, err = mountIDMapped(dir, cfg.GetMounts(), nsFD, p.UserNS.Mapping); err != nil {
			return nil, err
		}
	}
	spec, err := p.BuildSpec(id, rootfs, volumes, idmapped)
	if err != nil {
		return nil, err
	}
	if spec.Root == nil {
		spec.Root = &specs.Root{}
	}
	spec.Root.Path = rootfs
	if spec.Linux != nil {
		if err := replaceMaskedSymlinks(rootfs, spec.Linux.MaskedPaths, spec.Mounts); err != nil {
			return nil, err
		}
	}
	spec.Root.Readonly = cfg.GetLinux().GetSecurityContext().GetReadonlyRootfs()
	createdAt := time.Now().UTC()
	// The resources status reports: as asked, unless a plugin (NRI)
	// changed them in the spec.
	adjustedResources := cfg.GetLinux().GetResources()
	if p.Adjust != nil {
		pending := &Container{
			ID: id, PodID: p.PodID, Name: name, Attempt: attempt,
			Image: cfg.GetImage().GetImage(), ImageID: img.ID, ImageName: img.Name, ImageRef: img.Ref,
			Labels: cfg.GetLabels(), Annotations: cfg.GetAnnotations(), Runtime: p.Runtime,
			State: StateCreated, CreatedAt: createdAt,
		}
		if err := p.Adjust(ctx, pending, spec); err != nil {
			return nil, err
		}
		if pending.Resources != nil {
			adjustedResources = pending.Resources
		}
	}
	if spec.Linux != nil {
		s.dropLimits(id, spec.Linux.Resources)
	}
	data, err := json.Marshal(spec)
	if err != nil {
		return nil, fmt.Errorf("encode spec: %w", err)
	}
	if err := atomicfile.Write(filepath.Join(dir, "config.json"), data, 0o600); err != nil {
		return nil, err
	}

	rec := &Container{
		ID: id, PodID: p.PodID, Name: name, Attempt: attempt,
		Image: cfg.GetImage().GetImage(), ImageID: img.ID, ImageName: img.Name, ImageRef: img.Ref,
		Labels: cfg.GetLabels(), Annotations: cfg.GetAnnotations(),
		LogPath: p.LogPath, Runtime: p.Runtime, StopSignal: img.StopSignal,
		Resources: adjustedResources,
		Terminal:  cfg.GetTty(), Stdin: cfg.GetStdin(), StdinOnce: cfg.GetStdinOnce(),
		State: StateCreated, CreatedAt: createdAt,
	}
	for _, v := range vols {
		rec.VolumeOwners = append(rec.VolumeOwners, v.owner)
	}
	for _, m := range cfg.GetMounts() {
		if m.GetImage() != nil {
			for _, v := range vols {
				if v.mount.ContainerPath == m.GetContainerPath() {
					rec.Mounts = append(rec.Mounts, v.mount)
				}
			}
			continue
		}
		rec.Mounts = append(rec.Mounts, Mount{
			ContainerPath: m.GetContainerPath(), HostPath: m.GetHostPath(), Readonly: m.GetReadonly(),
			SelinuxRelabel: m.GetSelinuxRelabel(), Propagation: int32(m.GetPropagation()),
		})
	}
	if spec.Process != nil {
		u := spec.Process.User
		rec.User = &User{UID: int64(u.UID), GID: int64(u.GID), Username: u.Username}
		for _, g := range u.AdditionalGids {
			rec.User.Supplemental = append(rec.User.Supplemental, int64(g))
		}
		if rec.User.Username == "" {
			rec.User.Username = cfg.GetLinux().GetSecurityContext().GetRunAsUsername()
		}
	}

	prepared := time.Now()
	r := <-shimCh
	shimJoined = true
	if r.err != nil {
		return nil, r.err
	}
	client := r.client
	shimReady := time.Now()
	s.opts.Faults.Hit(fault.ContainerAfterShimStart, "pod", p.PodID, "container", id)
	cr := &shim.CreateRequest{
		Bundle: dir, LogPath: p.LogPath,
		Runtime: shim.Runtime{Binary: rt.Binary, Root: rt.Root, Options: rt.Options},
		Stdin:   cfg.GetStdin(), StdinOnce: cfg.GetStdinOnce(), Terminal: cfg.GetTty(),
	}
	err = client.Create(ctx, id, cr)
	if errors.Is(err, errdefs.ErrUnavailable) {
		// The shim was exiting as its last container went: start another.
		if client, err = s.ensureShim(ctx, p.PodID); err == nil {
			err = client.Create(ctx, id, cr)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("create container %s: %w", id, err)
	}
	runtimeCreated := time.Now()
	s.opts.Faults.Hit(fault.ContainerAfterRuncCreate, "pod", p.PodID, "container", id)
	undo = append(undo, func() {
		if _, err := client.Delete(context.WithoutCancel(ctx), id); err != nil && !errors.Is(err, errdefs.ErrNotFound) && !errors.Is(err, shim.ErrNoShim) {
			log.Warn("delete container after failed create", "err", err)
		}
	})
	if st, err := client.State(ctx, id); err == nil {
		rec.Pid = st.Pid
	}
	if err := saveRecord(dir, rec); err != nil {
		return nil, err
	}
	s.opts.Faults.Hit(fault.ContainerAfterRecordWrite, "pod", p.PodID, "container", id)
	e := newEntry(rec)
	s.emit(EventCreated, rec)
	s.mu.Lock()
	s.ctrs[id] = e
	s.mu.Unlock()
	go s.watch(e)
	// Where the time went: rootfs and spec, waiting for the pod's shim
	// beyond that (it is reached or started meanwhile), and the OCI
	// runtime's create.
	log.Info("container created", "took", time.Since(began),
		"prepare", prepared.Sub(began), "shim", shimReady.Sub(prepared), "runtime_create", runtimeCreated.Sub(shimReady))
	return rec.clone(), nil
}

// ensureShim returns a client for the pod's shim, launching one if none
// listens.
func (s *Store) ensureShim(ctx context.Context, podID string) (*shim.Client, error) {
	defer s.lockPodShim(podID)()
	c := s.shimClient(podID)
	_, err := c.List(ctx)
	if err == nil {
		return c, nil
	}
	if !errors.Is(err, shim.ErrNoShim) {
		return nil, err
	}
	c, err = shim.Launch(ctx, s.opts.ShimBinary, c.Dir(), podID)
	if err != nil {
		return nil, err
	}
	s.log.Info("shim started", "pod", podID)
	return c, nil
}

// lockPodShim takes the pod's shim-launch lock and returns its unlock.
func (s *Store) lockPodShim(podID string) func() {
	s.mu.Lock()
	l := s.shimLocks[podID]
	if l == nil {
		l = &podShimLock{}
		s.shimLocks[podID] = l
	}
	l.refs++
	s.mu.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		s.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(s.shimLocks, podID)
		}
		s.mu.Unlock()
	}
}

func (s *Store) entry(id string) (*entry, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	// Full ID or unique prefix, as crictl passes.
	return idprefix.Resolve(s.ctrs, "container", id, nil)
}

// refresh folds a persisted exit into the record. Caller holds e.mu.
func (s *Store) refresh(e *entry) {
	r := e.rec
	if r.State == StateExited {
		return
	}
	ex, ok, err := shim.ReadExit(s.shimClient(r.PodID).Dir(), r.ID)
	if err != nil {
		s.log.Warn("read exit", "container", r.ID, "err", err)
		return
	}
	if !ok {
		return
	}
	s.setExited(e, ex)
}

// watch waits, through the shim, for the container to exit and records
// it at once, so status and events do not wait for someone to look. If
// the shim goes away instead, the container is lost.
func (s *Store) watch(e *entry) {
	e.mu.Lock()
	id, pod := e.rec.ID, e.rec.PodID
	e.unlock()
	st, err := s.shimClient(pod).Wait(context.Background(), id)
	e.mu.Lock()
	defer e.unlock()
	s.mu.Lock()
	current := s.ctrs[id] == e
	s.mu.Unlock()
	if !current || e.rec.State == StateExited {
		return
	}
	switch {
	case err == nil && st.Exit != nil:
		s.setExited(e, st.Exit)
	case errors.Is(err, errdefs.ErrNotFound):
		// Deleted from the shim (remove in progress): Remove records it.
		return
	default:
		s.refresh(e)
		if e.rec.State != StateExited {
			s.log.Warn("lost the container's shim", "pod", pod, "container", id, "err", err)
			_ = s.lost(e, shim.ErrNoShim)
		}
	}
}

func (s *Store) setExited(e *entry, ex *shim.Exit) {
	r := e.rec
	if r.State == StateExited {
		return
	}
	r.State = StateExited
	r.FinishedAt = ex.At
	r.ExitCode = int32(ex.Code)
	switch {
	case ex.Unknown != "":
		r.Reason, r.Message = ReasonUnknown, ex.Unknown
	case ex.OOMKilled:
		r.Reason = ReasonOOMKilled
	case ex.Code == 0:
		r.Reason = ReasonCompleted
	default:
		r.Reason = ReasonError
	}
	if err := saveRecord(s.dir(r.ID), r); err != nil {
		s.log.Warn("save exited record", "container", r.ID, "err", err)
	}
	s.emit(EventStopped, r)
}

// Get returns a copy of the container's current record. While another
// operation holds the container (a stop waiting out its grace period), it
// returns the record as that operation found it rather than wait.
func (s *Store) Get(id string) (*Container, error) {
	e, err := s.entry(id)
	if err != nil {
		return nil, err
	}
	if !e.mu.TryLock() {
		return e.snap.Load().clone(), nil
	}
	defer e.unlock()
	s.refresh(e)
	return e.rec.clone(), nil
}

// List returns every container, oldest first.
func (s *Store) List() []*Container {
	s.mu.Lock()
	entries := make([]*entry, 0, len(s.ctrs))
	for _, e := range s.ctrs {
		entries = append(entries, e)
	}
	s.mu.Unlock()
	// No refresh here: every container has a watcher that records its
	// exit as it happens, and ListContainers runs every second per kubelet,
	// so reading each container's exit file on it would be I/O for nothing.
	// Get (ContainerStatus) still folds in a persisted exit directly.
	out := make([]*Container, 0, len(entries))
	for _, e := range entries {
		out = append(out, e.snap.Load().clone())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CreatedAt.Before(out[j].CreatedAt) })
	return out
}

// Start runs a created container; any other state is FailedPrecondition.
func (s *Store) Start(ctx context.Context, id string) (*Container, error) {
	e, err := s.entry(id)
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	defer e.unlock()
	s.refresh(e)
	r := e.rec
	if r.State != StateCreated {
		return nil, fmt.Errorf("container %s is %s, not created: %w", r.ID, r.State, errdefs.ErrFailedPrecondition)
	}
	// Taken before the start: a quick process can finish before it returns.
	startedAt := time.Now().UTC()
	s.opts.Faults.Hit(fault.ContainerBeforeRuncStart, "pod", r.PodID, "container", r.ID)
	if _, err := s.shimClient(r.PodID).Start(ctx, r.ID); err != nil {
		// A failed start leaves the container exited, as in containerd.
		r.State, r.FinishedAt, r.ExitCode, r.Reason, r.Message = StateExited, time.Now().UTC(), 128, ReasonStart, err.Error()
		_ = saveRecord(s.dir(r.ID), r)
		s.emit(EventStopped, r)
		return nil, fmt.Errorf("start container %s: %w", r.ID, err)
	}
	s.opts.Faults.Hit(fault.ContainerAfterRuncStart, "pod", r.PodID, "container", r.ID)
	r.State, r.StartedAt = StateRunning, startedAt
	s.emit(EventStarted, r)
	s.refresh(e) // it may be done already; else the watcher sees the exit
	if err := saveRecord(s.dir(r.ID), r); err != nil {
		return nil, err
	}
	s.log.Info("container started", "pod", r.PodID, "container", r.ID)
	return r.clone(), nil
}

// parseSignal accepts "SIGTERM", "TERM", "15" or "SIGRTMIN+3" (moby's
// names, as containerd); "" is SIGTERM.
func parseSignal(name string) (syscall.Signal, error) {
	if name == "" {
		return syscall.SIGTERM, nil
	}
	sig, err := signal.ParseSignal(name)
	if err != nil || !signal.ValidSignalForPlatform(sig) {
		return 0, fmt.Errorf("unknown stop signal %q: %w", name, errdefs.ErrInvalidArgument)
	}
	return sig, nil
}

// Stop sends the stop signal, waits up to timeout, then SIGKILLs and waits
// for the exit. Exited containers and unknown IDs are no-ops.
func (s *Store) Stop(ctx context.Context, id string, timeout time.Duration) error {
	e, err := s.entry(id)
	if errdefs.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	e.mu.Lock()
	defer e.unlock()
	return s.stopLocked(ctx, e, timeout)
}

func (s *Store) stopLocked(ctx context.Context, e *entry, timeout time.Duration) error {
	s.refresh(e)
	r := e.rec
	if r.State == StateExited {
		return nil
	}
	client := s.shimClient(r.PodID)
	if timeout > 0 {
		sig, err := parseSignal(r.StopSignal)
		if err != nil {
			s.log.Warn("bad stop signal; using SIGTERM", "container", r.ID, "signal", r.StopSignal)
			sig = syscall.SIGTERM
		}
		if err := client.Kill(ctx, r.ID, sig, false); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			return s.lost(e, fmt.Errorf("signal container %s: %w", r.ID, err))
		}
		wctx, cancel := context.WithTimeout(ctx, timeout)
		st, err := client.Wait(wctx, r.ID)
		cancel()
		if err == nil && st.Exit != nil {
			s.setExited(e, st.Exit)
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("stop container %s: %w", r.ID, ctx.Err())
		}
	}
	if err := client.Kill(ctx, r.ID, syscall.SIGKILL, true); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return s.lost(e, fmt.Errorf("kill container %s: %w", r.ID, err))
	}
	// runc kill --all finds the processes through one v1 hierarchy
	// (devices); under --systemd-cgroup the init can sit in the pod slice's
	// cgroup there instead of its scope's, and then gets nothing. The init
	// itself is always reachable.
	_ = client.Kill(ctx, r.ID, syscall.SIGKILL, false)
	st, err := client.Wait(ctx, r.ID)
	if err != nil {
		return s.lost(e, fmt.Errorf("wait for container %s: %w", r.ID, err))
	}
	if st.Exit != nil {
		s.setExited(e, st.Exit)
	}
	s.log.Info("container stopped", "pod", r.PodID, "container", r.ID, "exit_code", r.ExitCode)
	return nil
}

// lost turns "the shim is gone" into an exited record (its processes died
// with it or cannot be reached); other errors pass through.
func (s *Store) lost(e *entry, err error) error {
	if !errors.Is(err, shim.ErrNoShim) {
		return err
	}
	s.refresh(e)
	if e.rec.State != StateExited {
		s.setExited(e, &shim.Exit{Code: 255, At: time.Now().UTC(), Unknown: "the pod's shim is gone"})
	}
	return nil
}

// Remove deletes a container, forcing it down if it runs; unknown IDs are
// not an error. The log file stays (kubelet owns it).
func (s *Store) Remove(ctx context.Context, id string) error {
	e, err := s.entry(id)
	if errdefs.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	e.mu.Lock()
	defer e.unlock()
	r := e.rec
	st, err := s.shimClient(r.PodID).Delete(ctx, r.ID)
	switch {
	case err == nil:
		if st != nil && st.Exit != nil && r.State == StateRunning {
			s.setExited(e, st.Exit) // removed while running: it stopped first
		}
	case errors.Is(err, errdefs.ErrNotFound), errors.Is(err, shim.ErrNoShim):
		// No shim holds it (it died, or a crash cut a remove short): make
		// sure the runtime forgets it too.
		if rt, ok := s.opts.Runtimes[r.Runtime]; ok {
			if err := rt.Delete(ctx, r.ID, true); err != nil {
				s.log.Warn("runtime delete", "container", r.ID, "err", err)
			}
		}
	default:
		return fmt.Errorf("remove container %s: %w", r.ID, err)
	}
	s.opts.Faults.Hit(fault.ContainerMidRemove, "pod", r.PodID, "container", r.ID)
	dir := s.dir(r.ID)
	if err := unmountImageVolumes(dir); err != nil {
		return fmt.Errorf("remove container %s: %w", r.ID, err)
	}
	if err := unmountIDMounts(dir); err != nil {
		return fmt.Errorf("remove container %s: %w", r.ID, err)
	}
	if err := unmountRootfs(dir); err != nil {
		return fmt.Errorf("remove container %s: %w", r.ID, err)
	}
	if s.opts.Layers != nil {
		for _, owner := range append([]string{r.ID}, r.VolumeOwners...) {
			if err := s.opts.Layers.Release(owner); err != nil {
				return fmt.Errorf("remove container %s: release image: %w", r.ID, err)
			}
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove container %s: %w", r.ID, err)
	}
	s.mu.Lock()
	delete(s.ctrs, r.ID)
	if s.names[nameKey(r.PodID, r.Name, r.Attempt)] == r.ID {
		delete(s.names, nameKey(r.PodID, r.Name, r.Attempt))
	}
	s.mu.Unlock()
	s.emit(EventDeleted, r)
	s.log.Info("container removed", "pod", r.PodID, "container", r.ID)
	return nil
}

// StopPod stops every container of a pod.
func (s *Store) StopPod(ctx context.Context, podID string, timeout time.Duration) error {
	var errs []error
	for _, c := range s.List() {
		if c.PodID == podID {
			if err := s.Stop(ctx, c.ID, timeout); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// RemovePod removes every container of a pod.
func (s *Store) RemovePod(ctx context.Context, podID string) error {
	var errs []error
	for _, c := range s.List() {
		if c.PodID == podID {
			if err := s.Remove(ctx, c.ID); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// UpdateResources applies new limits to a created or running container
// and records them for status.
func (s *Store) UpdateResources(ctx context.Context, id string, res *specs.LinuxResources, cri *runtime.LinuxContainerResources) error {
	e, err := s.entry(id)
	if err != nil {
		return err
	}
	e.mu.Lock()
	defer e.unlock()
	s.refresh(e)
	r := e.rec
	if r.State == StateExited {
		return fmt.Errorf("container %s has exited: %w", r.ID, errdefs.ErrFailedPrecondition)
	}
	rt, ok := s.opts.Runtimes[r.Runtime]
	if !ok {
		return fmt.Errorf("runtime handler %q is gone from the config: %w", r.Runtime, errdefs.ErrFailedPrecondition)
	}
	s.dropLimits(r.ID, res)
	if err := rt.Update(ctx, r.ID, res); err != nil {
		return fmt.Errorf("update container %s: %w", r.ID, err)
	}
	r.Resources = cri
	return saveRecord(s.dir(r.ID), r)
}

// dropLimits removes limits of missing cgroup controllers from res. The
// daemon said once at start which ones go; here only debug.
func (s *Store) dropLimits(id string, res *specs.LinuxResources) {
	if s.opts.Cgroups == nil || res == nil {
		return
	}
	if dropped := s.opts.Cgroups.Drop(res); len(dropped) > 0 {
		s.log.Debug("limits of missing cgroup controllers dropped", "container", id, "controllers", dropped)
	}
}

// ReopenLog makes the shim reopen the container's log file (after the
// kubelet rotated it). The container must be running.
func (s *Store) ReopenLog(ctx context.Context, id string) error {
	e, err := s.entry(id)
	if err != nil {
		return err
	}
	e.mu.Lock()
	defer e.unlock()
	s.refresh(e)
	if e.rec.State != StateRunning {
		return fmt.Errorf("container %s is %s, not running: %w", e.rec.ID, e.rec.State, errdefs.ErrFailedPrecondition)
	}
	if err := s.shimClient(e.rec.PodID).ReopenLog(ctx, e.rec.ID); err != nil {
		return fmt.Errorf("reopen log of %s: %w", e.rec.ID, err)
	}
	return nil
}

// recover loads every record and reconciles it with its pod's shim: exits
// persisted while berthd was down are folded in; a container whose shim is
// gone without an exit is marked exited (unknown).
func (s *Store) recover(ctx context.Context) error {
	dirs, err := os.ReadDir(s.opts.Dir)
	if err != nil {
		return fmt.Errorf("read %s: %w", s.opts.Dir, err)
	}
	live := map[string]map[string]bool{} // pod → container IDs its shim holds
	for _, d := range dirs {
		if !d.IsDir() {
			continue
		}
		dir := filepath.Join(s.opts.Dir, d.Name())
		rec, err := loadRecord(dir)
		if err != nil {
			// A create that died before its record: undo what it left.
			s.log.Warn("container dir without a valid record; removing", "dir", dir, "err", err)
			_ = unmountRootfs(dir)
			if s.opts.Layers != nil {
				_ = s.opts.Layers.Release(d.Name())
			}
			if err := unmountIDMounts(dir); err != nil {
				// Never remove through an attached copy of a host path.
				s.log.Warn("container dir keeps idmapped mounts; not removed", "dir", dir, "err", err)
				continue
			}
			_ = os.RemoveAll(dir)
			continue
		}
		e := newEntry(rec)
		s.ctrs[rec.ID] = e
		s.names[nameKey(rec.PodID, rec.Name, rec.Attempt)] = rec.ID
		s.refresh(e)
		if rec.State == StateExited {
			continue
		}
		ids, ok := live[rec.PodID]
		if !ok {
			list, err := s.shimClient(rec.PodID).List(ctx)
			ids = map[string]bool{}
			for _, id := range list {
				ids[id] = true
			}
			if err != nil && !errors.Is(err, shim.ErrNoShim) {
				s.log.Warn("ask shim for its containers", "pod", rec.PodID, "err", err)
				continue
			}
			live[rec.PodID] = ids
		}
		if !ids[rec.ID] {
			s.setExited(e, &shim.Exit{Code: 255, At: time.Now().UTC(), Unknown: "container lost while berthd was down"})
			continue
		}
		if rec.State == StateCreated {
			s.rollForwardStart(ctx, e)
		}
		go s.watch(e)
	}
	s.reapOrphans(ctx)
	s.log.Info("containers recovered", "count", len(s.ctrs))
	return nil
}

// rollForwardStart finishes a StartContainer cut short after the shim
// started the process but before the record said so: the shim's word wins.
func (s *Store) rollForwardStart(ctx context.Context, e *entry) {
	r := e.rec
	st, err := s.shimClient(r.PodID).State(ctx, r.ID)
	if err != nil || st.Status == shim.StatusCreated {
		return
	}
	r.State, r.StartedAt = StateRunning, processStart(st.Pid)
	if st.Pid > 0 {
		r.Pid = st.Pid
	}
	s.log.Warn("container was started just before berthd stopped; recording it running", "pod", r.PodID, "container", r.ID)
	s.emit(EventStarted, r)
	if err := saveRecord(s.dir(r.ID), r); err != nil {
		s.log.Warn("save started record", "container", r.ID, "err", err)
	}
	// Exited since: fold the exit in too.
	s.refresh(e)
}

// processStart is when pid started (from /proc), or now if that is
// unknown.
func processStart(pid int) time.Time {
	now := time.Now().UTC()
	if pid <= 0 {
		return now
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return now
	}
	// Fields after the command (which may hold spaces) start at ")".
	i := strings.LastIndexByte(string(stat), ')')
	if i < 0 {
		return now
	}
	f := strings.Fields(string(stat)[i+1:])
	if len(f) < 20 {
		return now
	}
	ticks, err := strconv.ParseUint(f[19], 10, 64) // field 22: starttime
	if err != nil {
		return now
	}
	var info unix.Sysinfo_t
	if err := unix.Sysinfo(&info); err != nil {
		return now
	}
	const clockTicks = 100 // USER_HZ on every Linux berth runs on
	boot := now.Add(-time.Duration(info.Uptime) * time.Second)
	return boot.Add(time.Duration(ticks) * time.Second / clockTicks)
}

// reapOrphans deletes, from every live shim, containers berthd has no
// record of (a create cut short by a crash before its record was written),
// and removes the directories of dead shims (their exits are folded in).
func (s *Store) reapOrphans(ctx context.Context) {
	pods, err := os.ReadDir(s.opts.ShimDir)
	if err != nil {
		return
	}
	for _, p := range pods {
		client := s.shimClient(p.Name())
		ids, err := client.List(ctx)
		if errors.Is(err, shim.ErrNoShim) {
			s.log.Info("removing the directory of a dead shim", "pod", p.Name())
			_ = os.RemoveAll(client.Dir())
			continue
		}
		if err != nil {
			s.log.Warn("ask shim for its containers", "pod", p.Name(), "err", err)
			continue
		}
		for _, id := range ids {
			if _, ok := s.ctrs[id]; ok {
				continue
			}
			s.log.Warn("deleting a container without a record from its shim", "pod", p.Name(), "container", id)
			if _, err := client.Delete(ctx, id); err != nil {
				s.log.Warn("delete orphan container", "container", id, "err", err)
			}
		}
		if len(ids) == 0 {
			// Launched for a create that a crash cut short before the
			// shim held anything: nothing would ever make it exit. (A
			// shim emptied by the deletes above exits by itself.)
			s.log.Warn("stopping a shim that holds no container", "pod", p.Name())
			if err := client.Shutdown(ctx); err != nil && !errors.Is(err, shim.ErrNoShim) {
				s.log.Warn("stop idle shim", "pod", p.Name(), "err", err)
			}
		}
	}
}
