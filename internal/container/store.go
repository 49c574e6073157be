// Package container owns container records, their lifecycle state machine
// (created → running → exited → removed) and their filesystems. Processes
// run through the pod's berth-shim; the OCI spec comes from the caller.
//
// Files: create.go is the create pipeline (Prepare, then Commit),
// lifecycle.go start, stop and remove, exits.go how an exit is learnt,
// recover.go and orphans.go what a restarted daemon does, shims.go and
// rootfs.go the two things a Store drives (the node's monitor and the
// mounts), record.go the record and its file, events.go what listeners
// hear.
package container

import (
	"context"
	"fmt"
	"iter"
	"log/slog"
	"strconv"
	"sync"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/berthcri/berth/internal/atomicfile"
	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/fault"
	"github.com/berthcri/berth/internal/image"
	"github.com/berthcri/berth/internal/objstore"
	"github.com/berthcri/berth/internal/oci"
	"github.com/berthcri/berth/internal/statetree"
)

// Images leases images' layers to containers (image.Store). A lease is
// named by its owner: the container ID, and <id>.vol<n> for the image
// volume of CRI mount n. Leases outlive restarts.
type Images interface {
	// Acquire leases the image's layers to owner and returns the image
	// and its layer dirs, topmost first.
	Acquire(ctx context.Context, ref, owner string) (*image.Image, []string, error)
	// Release drops owner's lease; an unknown owner is no error.
	Release(owner string) error
	// Owners lists the owners holding leases.
	Owners() ([]string, error)
}

// Options configure a Store.
type Options struct {
	// Dir is <root>/containers.
	Dir string
	// ShimDir is <state>/shims; each pod's socket and exits live in
	// <ShimDir>/<pod-id>.
	ShimDir string
	// ShimBinary is the berth-shim executable.
	ShimBinary string
	// Runtimes maps runtime handler names to OCI runtimes.
	Runtimes map[string]*oci.Runtime
	// RuntimeFor, if set, finds a handler's runtime instead of Runtimes:
	// berthd's live configuration, to which a reload may add handlers
	// (it never removes or changes one that a container uses).
	RuntimeFor func(handler string) (*oci.Runtime, bool)
	// Images leases the layers of containers' images and image volumes;
	// nil: nothing can be created.
	Images Images
	Logger *slog.Logger
	// OnEvent, if set, hears every lifecycle transition (events.go).
	OnEvent func(Event)
	// Faults, for crash-recovery tests only, kills berthd at armed points
	// (nil in production).
	Faults *fault.Injector
	// Cgroups drops the limits of cgroup controllers the host lacks from
	// every spec and update before the runtime sees them; nil keeps all.
	Cgroups LimitDropper
	// Shims and Mounter replace berth-shim under ShimDir and overlayfs
	// (unit tests); nil means those.
	Shims   Shims
	Mounter Mounter
	// Deferred writes what CreateContainer and StartContainer record (the
	// bundle's config.json, the record), fsynced off the RPC's path
	// (decision 1600); nil writes them durably before going on.
	Deferred *atomicfile.Deferred
}

// LimitDropper removes from r the limits the host's cgroups cannot take
// and names the controllers whose limits it removed (cgroupctrl).
type LimitDropper interface {
	Drop(r *specs.LinuxResources) []string
}

// Store holds every container.
type Store struct {
	opts   Options
	log    *slog.Logger
	shims  Shims
	mounts Mounter
	images Images

	// objs indexes the containers by ID, by pod and by reserved name
	// (pod/name/attempt); records keeps each one's container.json.
	objs    *objstore.Store[Container, *entry]
	records objstore.Records[Container]

	// mu guards warming.
	mu sync.Mutex
	// warming holds the pods whose shim WarmShim is launching; the channel
	// closes when the launch is over (shims.go).
	warming map[string]chan struct{}

	// events orders what OnEvent hears (events.go).
	events sync.Mutex

	// watching is the context of the exit watchers (exits.go); Close
	// cancels it and waits for them.
	watching context.Context
	stop     context.CancelFunc
	watchers sync.WaitGroup
}

// entry is a container in memory; mu serialises its lifecycle operations.
type entry struct {
	mu  entryMu
	rec *Container
	// removed is set, under mu, once Remove deleted the container: an
	// operation that looked the entry up before then finds it gone.
	removed bool
	// View is a copy of rec published at every unlock and transition.
	// List reads it without taking mu, so a StopContainer waiting out a
	// grace period under mu never stalls the kubelet's ListContainers
	// relist.
	objstore.View[Container]
}

func newEntry(rec *Container) *entry {
	e := &entry{mu: newEntryMu(), rec: rec}
	e.publish()
	return e
}

// publish makes the record as it is now what List and Get see.
func (e *entry) publish() { e.Publish(e.rec.clone()) }

// containers is the kind a Store indexes: copies are clones, grouped by
// pod.
var containers = objstore.Kind[Container]{
	Name:    "container",
	Clone:   (*Container).clone,
	Created: func(c *Container) time.Time { return c.CreatedAt },
	Group:   func(c *Container) string { return c.PodID },
}

// unlock publishes the record and releases mu.
func (e *entry) unlock() {
	e.publish()
	e.mu.Unlock()
}

// Open loads the records under opts.Dir and reconciles them with the shims
// (restart recovery).
func Open(ctx context.Context, opts Options) (*Store, error) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	// A user namespace container's root passes through the containers
	// dir to its rootfs; the shims' sockets are berthd's alone.
	if err := statetree.Mkdir(opts.Dir, statetree.Traverse); err != nil {
		return nil, err
	}
	if err := statetree.Mkdir(opts.ShimDir, statetree.Private); err != nil {
		return nil, err
	}
	s := &Store{
		opts: opts, log: opts.Logger, shims: opts.Shims, mounts: opts.Mounter, images: opts.Images,
		objs:    objstore.New[Container, *entry](containers),
		records: objstore.Records[Container]{Dir: opts.Dir, File: recordFile, Deferred: opts.Deferred},
		warming: map[string]chan struct{}{},
	}
	s.watching, s.stop = context.WithCancel(context.WithoutCancel(ctx))
	if s.shims == nil {
		s.shims = newBerthShims(opts.ShimDir, opts.ShimBinary, opts.Logger)
	}
	if s.mounts == nil {
		s.mounts = overlayMounter{}
	}
	if s.images == nil {
		s.images = noImages{}
	}
	if err := s.recover(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// Close stops watching for exits (the shims keep recording them, and a
// Store opened later folds them in). It changes no container.
func (s *Store) Close() {
	s.stop()
	s.watchers.Wait()
}

// noImages is the image store of a Store opened without one (tests that
// only list): nothing can be created, nothing is leased.
type noImages struct{}

func (noImages) Acquire(_ context.Context, ref, _ string) (*image.Image, []string, error) {
	return nil, nil, fmt.Errorf("image %q: no image store: %w", ref, errdefs.ErrFailedPrecondition)
}
func (noImages) Release(string) error      { return nil }
func (noImages) Owners() ([]string, error) { return nil, nil }

func (s *Store) dir(id string) string { return s.records.ObjectDir(id) }

func nameKey(podID, name string, attempt uint32) string {
	return podID + "/" + name + "/" + strconv.FormatUint(uint64(attempt), 10)
}

// reserveName claims the draft's pod/name/attempt, which stays taken until
// its container is removed or the draft discarded.
func (s *Store) reserveName(d *Draft) error {
	md := d.req.Config.GetMetadata()
	key := nameKey(d.req.PodID, md.GetName(), md.GetAttempt())
	if err := s.objs.Reserve(key, d.ID); err != nil {
		return fmt.Errorf("container name %q attempt %d in pod %s: %w", md.GetName(), md.GetAttempt(), d.req.PodID, err)
	}
	d.nameKey = key
	return nil
}

func (s *Store) releaseName(d *Draft) { s.objs.Release(d.nameKey, d.ID) }

// add makes a created container visible, tells listeners and watches
// for its exit. Its lock is held throughout, so nothing else about it is
// heard before its creation.
func (s *Store) add(rec *Container) {
	e := newEntry(rec)
	e.mu.Lock()
	s.index(e)
	s.emit(EventCreated, e)
	e.unlock()
	s.startWatch(e)
}

// index puts e in the store under its ID, pod and name.
func (s *Store) index(e *entry) {
	r := e.rec
	s.objs.Add(r.ID, nameKey(r.PodID, r.Name, r.Attempt), e)
}

// forget takes a removed container out of the store and frees its name.
func (s *Store) forget(r *Container) {
	s.objs.Delete(r.ID, nameKey(r.PodID, r.Name, r.Attempt))
}

// entry resolves a full ID or unique prefix, as crictl passes.
func (s *Store) entry(id string) (*entry, error) { return s.objs.Lookup(id) }

// lock resolves id and locks its entry, waiting at most until ctx ends;
// a container removed meanwhile is NotFound. The caller unlocks with
// e.unlock.
func (s *Store) lock(ctx context.Context, id string) (*entry, error) {
	e, err := s.entry(id)
	if err != nil {
		return nil, err
	}
	if err := e.mu.LockCtx(ctx); err != nil {
		return nil, fmt.Errorf("container %s: %w", id, err)
	}
	if e.removed {
		e.mu.Unlock()
		return nil, fmt.Errorf("container %q: %w", id, errdefs.ErrNotFound)
	}
	return e, nil
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
		return e.Published().clone(), nil
	}
	defer e.unlock()
	s.foldExit(e)
	return e.rec.clone(), nil
}

// List returns every container, oldest first.
//
// No foldExit here: every container has a watcher that records its exit
// as it happens, and ListContainers runs every second per kubelet, so
// reading each container's exit file on it would be I/O for nothing. Get
// (ContainerStatus) still folds in a persisted exit.
func (s *Store) List() []*Container { return s.objs.List() }

// ListPod returns the pod's containers, oldest first, as List sees them.
func (s *Store) ListPod(podID string) []*Container { return s.objs.ListGroup(podID) }

// All yields every container, oldest first, as List orders them, copying
// one record at a time: a caller that streams thousands of containers
// never holds a copy of all of them. The set is the one at the call; a
// container removed meanwhile is still yielded, once.
func (s *Store) All() iter.Seq[*Container] { return s.objs.All() }
