// Package sandbox owns pod sandboxes: network, IPC and UTS namespaces pinned
// by bind mounts (no process runs for a pod until it has containers, except
// a pause holder for a shared PID namespace), pod files, the pod cgroup, the
// pod's CNI attachment and one record per sandbox (internal/objstore).
package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"iter"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/atomicfile"
	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/fault"
	"github.com/berthcri/berth/internal/network"
	"github.com/berthcri/berth/internal/objstore"
	"github.com/berthcri/berth/internal/statetree"
	"github.com/berthcri/berth/internal/systemd"
	"github.com/berthcri/berth/internal/userns"
)

// Sandbox is one pod sandbox as the rest of berth sees it.
type Sandbox struct {
	ID             string
	Config         *runtime.PodSandboxConfig
	RuntimeHandler string
	State          runtime.PodSandboxState
	CreatedAt      time.Time
	NetNSPath      string // "" when hostNetwork
	IPCNSPath      string // "" when host IPC
	UTSNSPath      string // "" when hostNetwork (UTS follows network, as in kubelet)
	PIDNSPath      string // /proc/<holder>/ns/pid when pid NamespaceMode_POD, else ""
	// UserNSPath pins the pod's own user namespace, which owns its other
	// namespaces; "" for the host's (userns NamespaceMode_NODE).
	UserNSPath string
	// UserNS is that namespace's ID mapping; nil with UserNSPath "".
	UserNS         *userns.Mapping
	CgroupParent   string // the pod's own cgroup (cgroupfs path); container cgroups go below it
	CgroupUnit     string // systemd driver: the pod's slice unit, parent of the containers' scopes
	HostnamePath   string
	HostsPath      string
	ResolvConfPath string
	ShmPath        string // per-pod tmpfs to bind-mount at /dev/shm; "" when host IPC
	IP             string
	AdditionalIPs  []string
	// Overhead and Resources are the pod-level values from
	// LinuxPodSandboxConfig, for the container side's accounting.
	Overhead  *runtime.LinuxContainerResources
	Resources *runtime.LinuxContainerResources
}

// Options configure a Store.
type Options struct {
	Root, State string
	// CgroupParent is the parent of pod cgroups whose config names none.
	CgroupParent string
	CgroupDriver string
	// Systemd, set exactly when CgroupDriver is systemd, makes pod slices.
	Systemd *systemd.Units
	// RuntimeHandlers are the accepted runtime_handler names; "" maps to
	// DefaultRuntimeHandler.
	RuntimeHandlers       []string
	DefaultRuntimeHandler string
	// Handlers, if set, admits runtime handlers instead of
	// RuntimeHandlers and DefaultRuntimeHandler: berthd's live
	// configuration, whose handlers a reload may add or remove.
	Handlers HandlerAdmitter
	Network  *network.Network
	// PauseBinary is berth-pause; empty looks next to the running
	// executable, then in PATH, when a pod first needs it.
	PauseBinary string
	Logger      *slog.Logger
	// Faults, for crash-recovery tests only, kills berthd at armed points
	// (nil in production).
	Faults *fault.Injector
	// Cgroups drops pod-level limits of cgroup controllers the host lacks
	// (UpdatePodSandboxResources); nil keeps all.
	Cgroups LimitDropper
	// Deferred writes RunPodSandbox's records, fsynced off the RPC's
	// path (decision 1600); nil writes them durably before going on.
	Deferred *atomicfile.Deferred
	// Warm, if set, is called by Run once the pod's ID and first record
	// exist, before its namespaces and network are made: the caller starts,
	// in the background, what the pod's first container will need (its place
	// on the node's monitor). Run calls the wait it returns before it
	// returns, so that work is done when RunPodSandbox answers (it has had
	// the CNI ADD to run in); undo runs instead if Run fails. Either may be
	// nil.
	Warm func(ctx context.Context, podID string) (wait func(), undo func(context.Context))
}

// LimitDropper removes from r the limits the host's cgroups cannot take
// (cgroupctrl).
type LimitDropper interface {
	Drop(r *specs.LinuxResources) []string
}

// Store holds every sandbox. The store lock guards only the maps; each
// sandbox has its own lock, held across its slow steps (CNI), so pods
// never wait on each other.
type Store struct {
	opts Options
	log  *slog.Logger

	// objs indexes the sandboxes by ID and reserved name; records keeps
	// each one's record, <root>/sandboxes/<id>/sandbox.json.
	objs    *objstore.Store[Sandbox, *entry]
	records objstore.Records[record]

	// usernsOnce probes, on first need, whether user namespace pods can
	// work here; usernsErr says why not.
	usernsOnce sync.Once
	usernsErr  error
}

// entry is one sandbox in memory: its public view plus what only this
// package needs (its record is what of it is on disk).
type entry struct {
	mu         sync.Mutex
	sb         Sandbox
	pausePID   int
	pauseStart uint64
	ports      []network.PortMapping
	attachment *network.Attachment
	removed    bool
	// View is the last published snapshot: Get and List read it without
	// taking mu, so they never wait on a sandbox busy in CNI.
	objstore.View[Sandbox]
}

// publish makes the current state visible to Get and List; call with mu
// held (or before the entry is shared).
func (r *entry) publish() { r.Publish(r.snapshot()) }

// sandboxes is the kind a Store indexes.
var sandboxes = objstore.Kind[Sandbox]{
	Name:    "sandbox",
	Clone:   copySandbox,
	Created: func(sb *Sandbox) time.Time { return sb.CreatedAt },
}

// New loads the sandboxes recorded under <root>/sandboxes. A sandbox
// whose namespace pins or pause process are gone comes back NOTREADY. A
// record written before decision 2600, checkpoint.json, is renamed
// sandbox.json.
func New(opts Options) (*Store, error) {
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	s := &Store{opts: opts, log: log, objs: objstore.New[Sandbox, *entry](sandboxes)}
	s.records = objstore.Records[record]{
		Dir: s.sandboxesDir(), File: recordFile, Legacy: []string{legacyRecordFile},
		Indent: true, Deferred: opts.Deferred,
		Renamed: func(id, legacy string) {
			log.Info("sandbox record renamed", "pod", id, "from", legacy, "to", recordFile)
		},
	}
	// Closed to host users (decision 3400): a user namespace pod's root
	// passes through the two sandboxes dirs to its own pod dirs; the
	// namespace pins are berthd's and the runtime's alone.
	for _, d := range []struct {
		path string
		mode fs.FileMode
	}{{s.sandboxesDir(), statetree.Traverse}, {s.stateSandboxesDir(), statetree.Traverse}, {s.netnsDir(), statetree.Private}} {
		if err := statetree.Mkdir(d.path, d.mode); err != nil {
			return nil, err
		}
	}
	ids, err := s.records.IDs()
	if err != nil {
		return nil, err
	}
	for _, id := range ids {
		r := s.load(id)
		var owner *userns.Mapping
		if r != nil {
			owner = r.sb.UserNS
		}
		if err := s.closePodDirs(id, owner); err != nil {
			log.Error("cannot close a pod's directories to other host users", "pod", id, "err", err)
		}
		if r != nil {
			r.publish()
			s.objs.Add(r.sb.ID, reservationKey(r.sb.Config.GetMetadata()), r)
		}
	}
	return s, nil
}

// load reads sandbox id's record; nil when it has none to load.
func (s *Store) load(id string) *entry {
	c, err := s.records.Load(id)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, objstore.ErrEmpty) {
		// A Run cut off before its first record made only these two
		// empty directories. An empty record is a first write a power
		// loss caught before its fsync: the pod's pins, veth and cgroup
		// went with the power, its pod files go here and its IP with
		// the orphans (CleanOrphans).
		s.log.Info("removing sandbox directory without a record", "pod", id, "record", recordState(err))
		os.RemoveAll(filepath.Join(s.sandboxesDir(), id))
		os.Remove(filepath.Join(s.stateSandboxesDir(), id))
		return nil
	}
	if err != nil {
		s.log.Warn("skipping sandbox without a readable record", "dir", id, "err", err)
		return nil
	}
	r, err := c.toEntry()
	if err != nil {
		s.log.Warn("skipping sandbox with a bad record", "pod", id, "err", err)
		return nil
	}
	if r.sb.State == runtime.PodSandboxState_SANDBOX_READY && !r.alive() {
		s.log.Info("sandbox namespaces are gone; listing it NOTREADY", "pod", r.sb.ID)
		r.sb.State = runtime.PodSandboxState_SANDBOX_NOTREADY
	}
	return r
}

// recordState names why a sandbox directory has no usable record.
func recordState(err error) string {
	if errors.Is(err, objstore.ErrEmpty) {
		return "empty"
	}
	return "missing"
}

func (s *Store) sandboxesDir() string { return filepath.Join(s.opts.Root, "sandboxes") }
func (s *Store) netnsDir() string     { return filepath.Join(s.opts.State, "netns") }
func (s *Store) stateSandboxesDir() string {
	return filepath.Join(s.opts.State, "sandboxes")
}

// closePodDirs closes pod id's two dirs to host users (decision 3400),
// as an older berthd did not: Private, or, for a user namespace pod
// (owner set), open to the group of its root, which may pass through to
// the pod's files and /dev/shm as the container's root does to its
// rootfs. A dir that is missing is no error.
func (s *Store) closePodDirs(id string, owner *userns.Mapping) error {
	var errs []error
	for _, dir := range []string{filepath.Join(s.sandboxesDir(), id), filepath.Join(s.stateSandboxesDir(), id)} {
		if owner == nil {
			errs = append(errs, statetree.Tighten(dir, statetree.Private))
		} else if _, err := os.Lstat(dir); err == nil {
			errs = append(errs, statetree.OpenToMappedRoot(dir, owner.GID.HostID))
		}
	}
	return errors.Join(errs...)
}

// alive reports whether every namespace the sandbox owns still exists.
func (r *entry) alive() bool {
	for _, p := range []string{r.sb.NetNSPath, r.sb.IPCNSPath, r.sb.UTSNSPath, r.sb.UserNSPath} {
		if p != "" && !pinAlive(p) {
			return false
		}
	}
	if r.pausePID > 0 {
		st, ok := procStartTime(r.pausePID)
		if !ok || st != r.pauseStart {
			return false
		}
	}
	return true
}

func (r *entry) fillFromAttachment() {
	r.sb.IP, r.sb.AdditionalIPs = "", nil
	if r.attachment != nil && len(r.attachment.IPs) > 0 {
		r.sb.IP = r.attachment.IPs[0]
		r.sb.AdditionalIPs = append([]string(nil), r.attachment.IPs[1:]...)
	}
	if l := r.sb.Config.GetLinux(); l != nil {
		r.sb.Overhead, r.sb.Resources = l.Overhead, l.Resources
	}
}

func reservationKey(md *runtime.PodSandboxMetadata) string {
	return fmt.Sprintf("%s_%s_%s_%d", md.GetName(), md.GetNamespace(), md.GetUid(), md.GetAttempt())
}

// snapshot copies the public view under the entry's lock.
func (r *entry) snapshot() *Sandbox {
	sb := r.sb
	sb.AdditionalIPs = append([]string(nil), r.sb.AdditionalIPs...)
	return &sb
}

// lookup resolves a full ID or unique prefix.
func (s *Store) lookup(id string) (*entry, error) { return s.objs.Lookup(id) }

// Get returns a sandbox by full ID or unique prefix.
func (s *Store) Get(id string) (*Sandbox, error) { return s.objs.Get(id) }

func copySandbox(v *Sandbox) *Sandbox {
	sb := *v
	sb.AdditionalIPs = append([]string(nil), v.AdditionalIPs...)
	if v.UserNS != nil {
		m := *v.UserNS
		sb.UserNS = &m
	}
	return &sb
}

// List returns every sandbox, oldest first, from the published snapshots.
func (s *Store) List() []*Sandbox { return s.objs.List() }

// All yields every sandbox, oldest first, as List orders them, copying one
// at a time: a caller that streams thousands of pods never holds a copy of
// all of them. The set is the one at the call; a sandbox removed meanwhile
// is still yielded, once (as it was last published), unless its removal
// finished first.
func (s *Store) All() iter.Seq[*Sandbox] { return s.objs.All() }

func newID() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// HandlerAdmitter resolves a pod's runtime handler ("" is the default)
// and keeps it from being removed or changed until release is called (by
// then the pod is recorded, and so uses it, or gone). An unknown handler
// is an InvalidArgument error.
type HandlerAdmitter interface {
	AdmitHandler(name string) (resolved string, release func(), err error)
}

// ReadyHook runs once a sandbox is fully set up, before it is READY and
// visible to Get and List (NRI's RunPodSandbox); an error fails Run.
type ReadyHook func(ctx context.Context, sb *Sandbox) error

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func (s *Store) netPod(r *entry) network.Pod {
	md := r.sb.Config.GetMetadata()
	return network.Pod{
		ID: r.sb.ID, Name: md.GetName(), Namespace: md.GetNamespace(), UID: md.GetUid(),
		NetNSPath: r.sb.NetNSPath, PortMappings: r.ports,
	}
}

// save writes the sandbox's record durably.
func (s *Store) save(r *entry) error { return s.saveWith(r, s.records.Save) }

// saveSoon writes the record at once and has it made durable right after,
// off the caller's path (Options.Deferred; decision 1600): what
// RunPodSandbox writes. Recovery needs no fsync from it: a restarted
// berthd reads the page cache, and after a power loss, which takes every
// pin, veth, rule and cgroup with it, an older, missing or empty record
// leaves only files under root and IP reservations, which recovery
// releases without it (docs/reliability.md).
func (s *Store) saveSoon(r *entry) error { return s.saveWith(r, s.records.SaveSoon) }

func (s *Store) saveWith(r *entry, save func(string, *record) error) error {
	c, err := r.toRecord()
	if err != nil {
		return err
	}
	return save(r.sb.ID, c)
}

// teardown releases what a sandbox holds on the node, except its cgroup,
// files and record: CNI attachment, pause process, namespace pins and
// /dev/shm. Every step tolerates already-undone state. When CNI DEL fails
// it stops there (keeping the netns so a retry can finish DEL), unless
// force is set: a failed Run must not keep anything.
func (s *Store) teardown(ctx context.Context, r *entry, force bool) error {
	var errs []error
	if r.attachment != nil {
		if err := s.opts.Network.Detach(ctx, s.netPod(r), r.attachment); err != nil {
			if !force {
				return err
			}
			errs = append(errs, err)
		} else {
			s.opts.Faults.Hit(fault.SandboxMidStop, "pod", r.sb.ID)
			r.attachment = nil
			r.fillFromAttachment()
		}
	}
	stopPause(r.pausePID, r.pauseStart)
	if r.pausePID == 0 && mayHaveHolder(r.sb.Config) {
		// A crash between starting the holder and recording its pid
		// leaves one nobody recorded; it names the pod's state dir.
		stopHolders(filepath.Join(s.opts.State, "sandboxes", r.sb.ID))
	}
	// The user namespace pin goes last: it owns the others.
	for _, p := range []string{r.sb.NetNSPath, r.sb.IPCNSPath, r.sb.UTSNSPath, r.sb.UserNSPath} {
		if err := unpin(p); err != nil {
			errs = append(errs, err)
		}
	}
	if r.sb.ShmPath != "" {
		if err := unix.Unmount(r.sb.ShmPath, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", r.sb.ShmPath, err))
		}
	}
	return errors.Join(errs...)
}

// Stop releases the sandbox's network, namespaces and pause process and
// marks it NOTREADY. Stopping a stopped sandbox does nothing.
func (s *Store) Stop(ctx context.Context, id string) error {
	r, err := s.lookup(id)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.removed {
		return fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	return s.stopLocked(ctx, r)
}

func (s *Store) stopLocked(ctx context.Context, r *entry) error {
	log := s.log.With("pod", r.sb.ID)
	start := time.Now()
	err := s.teardown(ctx, r, false)
	// Whatever got released is recorded, even on partial failure.
	if err == nil {
		r.sb.State = runtime.PodSandboxState_SANDBOX_NOTREADY
	}
	r.publish()
	if perr := s.save(r); perr != nil {
		err = errors.Join(err, perr)
	}
	if err != nil {
		return fmt.Errorf("stop sandbox %s: %w", r.sb.ID, err)
	}
	log.Info("sandbox stopped", "took", time.Since(start))
	return nil
}

// Remove stops the sandbox if needed, then deletes its cgroup, files and
// record. A sandbox that does not exist is not an error.
func (s *Store) Remove(ctx context.Context, id string) error {
	r, err := s.lookup(id)
	if errdefs.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.removed {
		return nil
	}
	if err := s.stopLocked(ctx, r); err != nil {
		return err
	}
	s.opts.Faults.Hit(fault.SandboxMidRemove, "pod", r.sb.ID)
	if err := s.removePodCgroup(ctx, r.sb.CgroupUnit, r.sb.CgroupParent); err != nil {
		return fmt.Errorf("remove sandbox %s: %w", r.sb.ID, err)
	}
	if err := os.RemoveAll(filepath.Join(s.opts.State, "sandboxes", r.sb.ID)); err != nil {
		return fmt.Errorf("remove sandbox %s: %w", r.sb.ID, err)
	}
	// The record goes last: until then a retry can finish the job.
	if err := os.RemoveAll(filepath.Join(s.sandboxesDir(), r.sb.ID)); err != nil {
		return fmt.Errorf("remove sandbox %s: %w", r.sb.ID, err)
	}
	r.removed = true
	r.Withdraw()
	s.objs.Delete(r.sb.ID, reservationKey(r.sb.Config.GetMetadata()))
	s.log.Info("sandbox removed", "pod", r.sb.ID)
	return nil
}

// pauseBinary finds berth-pause next to the running executable, then in
// PATH.
func (s *Store) pauseBinary() (string, error) {
	if s.opts.PauseBinary != "" {
		return s.opts.PauseBinary, nil
	}
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), "berth-pause")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	p, err := exec.LookPath("berth-pause")
	if err != nil {
		return "", fmt.Errorf("a shared PID namespace needs berth-pause next to berthd or in PATH: %w", errdefs.ErrFailedPrecondition)
	}
	return p, nil
}

// UserNamespaceSupport reports, probed once, why pods with their own user
// namespace cannot work on this node, or nil when they can: berth-pause
// must be found (it holds the namespace while berthd pins it), the
// filesystem of --root must take idmapped mounts (every such pod's
// rootfs is built on idmapped image layers), and --root, --state and
// their containers and sandboxes dirs must be searchable by others (the
// container's root, an unprivileged host user, reaches its rootfs and pod
// files through them).
func (s *Store) UserNamespaceSupport() error {
	s.usernsOnce.Do(func() {
		bin, err := s.pauseBinary()
		if err == nil {
			err = userns.ProbeIDMap(s.opts.Root, bin)
		}
		// The dirs below them that a pod's root passes through (decision
		// 3400); the container store has made <root>/containers by now.
		for _, d := range []string{filepath.Join(s.opts.Root, "containers"), s.sandboxesDir(), s.stateSandboxesDir()} {
			if err == nil {
				err = searchableByOthers(d)
			}
		}
		s.usernsErr = err
		if err != nil {
			s.log.Warn("pods with their own user namespace are not supported here", "err", err)
		}
	})
	return s.usernsErr
}

// searchableByOthers fails unless every directory from / to dir lets
// others through (the x bit for others).
func searchableByOthers(dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	for p := abs; ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return fmt.Errorf("stat %s: %w", p, err)
		}
		if fi.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("%s (mode %v) is not searchable by others, so a user namespace's root cannot reach %s", p, fi.Mode().Perm(), dir)
		}
		if p == "/" {
			return nil
		}
	}
}
