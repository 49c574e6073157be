// Package sandbox owns pod sandboxes: network, IPC and UTS namespaces pinned
// by bind mounts (no process runs for a pod until it has containers, except
// a pause holder for a shared PID namespace), pod files, the pod cgroup, the
// pod's CNI attachment and one checkpoint per sandbox.
package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/atomicfile"
	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/fault"
	"github.com/berthcri/berth/internal/idprefix"
	"github.com/berthcri/berth/internal/network"
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
	// Deferred writes RunPodSandbox's checkpoints, fsynced off the RPC's
	// path (decision 1600); nil writes them durably before going on.
	Deferred *atomicfile.Deferred
	// Warm, if set, is called by Run once the pod's ID and first
	// checkpoint exist, before its namespaces and network are made: the
	// caller starts, in the background, what the pod's first container
	// will need (its shim). Run calls the wait it returns before it
	// returns, so that work is done when RunPodSandbox answers (it has
	// had the CNI ADD to run in); undo runs instead if Run fails. Either
	// may be nil.
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

	mu    sync.Mutex
	byID  map[string]*entry
	names map[string]string // reservation key → id

	// usernsOnce probes, on first need, whether user namespace pods can
	// work here; usernsErr says why not.
	usernsOnce sync.Once
	usernsErr  error
}

// entry is one sandbox in memory: its public view plus what only this
// package needs (its checkpoint is what of it is on disk).
type entry struct {
	mu         sync.Mutex
	sb         Sandbox
	pausePID   int
	pauseStart uint64
	ports      []network.PortMapping
	attachment *network.Attachment
	removed    bool
	// view is the last published snapshot: Get and List read it without
	// taking mu, so they never wait on a sandbox busy in CNI.
	view atomic.Pointer[Sandbox]
}

// publish makes the current state visible to Get and List; call with mu
// held (or before the entry is shared).
func (r *entry) publish() { r.view.Store(r.snapshot()) }

// New loads the sandboxes checkpointed under <root>/sandboxes. A sandbox
// whose namespace pins or pause process are gone comes back NOTREADY.
func New(opts Options) (*Store, error) {
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	s := &Store{opts: opts, log: log, byID: map[string]*entry{}, names: map[string]string{}}
	for _, dir := range []string{s.sandboxesDir(), s.netnsDir(), filepath.Join(opts.State, "sandboxes")} {
		if err := os.MkdirAll(dir, 0o711); err != nil {
			return nil, fmt.Errorf("create %s: %w", dir, err)
		}
	}
	entries, err := os.ReadDir(s.sandboxesDir())
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", s.sandboxesDir(), err)
	}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		c, err := readCheckpoint(filepath.Join(s.sandboxesDir(), e.Name()))
		if os.IsNotExist(err) || errors.Is(err, errEmptyCheckpoint) {
			// A Run cut off before its first checkpoint made only these
			// two empty directories. An empty checkpoint is a first
			// write a power loss caught before its fsync: the pod's
			// pins, veth and cgroup went with the power, its pod files
			// go here and its IP with the orphans (CleanOrphans).
			log.Info("removing sandbox directory without a checkpoint", "pod", e.Name(), "checkpoint", checkpointState(err))
			os.RemoveAll(filepath.Join(s.sandboxesDir(), e.Name()))
			os.Remove(filepath.Join(opts.State, "sandboxes", e.Name()))
			continue
		}
		if err != nil {
			log.Warn("skipping sandbox without a readable checkpoint", "dir", e.Name(), "err", err)
			continue
		}
		r, err := c.toEntry()
		if err != nil {
			log.Warn("skipping sandbox with a bad checkpoint", "pod", e.Name(), "err", err)
			continue
		}
		if r.sb.State == runtime.PodSandboxState_SANDBOX_READY && !r.alive() {
			log.Info("sandbox namespaces are gone; listing it NOTREADY", "pod", r.sb.ID)
			r.sb.State = runtime.PodSandboxState_SANDBOX_NOTREADY
		}
		r.publish()
		s.byID[r.sb.ID] = r
		s.names[reservationKey(r.sb.Config.GetMetadata())] = r.sb.ID
	}
	return s, nil
}

// checkpointState names why a sandbox directory has no usable checkpoint.
func checkpointState(err error) string {
	if errors.Is(err, errEmptyCheckpoint) {
		return "empty"
	}
	return "missing"
}

func (s *Store) sandboxesDir() string { return filepath.Join(s.opts.Root, "sandboxes") }
func (s *Store) netnsDir() string     { return filepath.Join(s.opts.State, "netns") }

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
func (s *Store) lookup(id string) (*entry, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return idprefix.Resolve(s.byID, "sandbox", id, nil)
}

// Get returns a sandbox by full ID or unique prefix.
func (s *Store) Get(id string) (*Sandbox, error) {
	r, err := s.lookup(id)
	if err != nil {
		return nil, err
	}
	v := r.view.Load()
	if v == nil {
		return nil, fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	return copySandbox(v), nil
}

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
func (s *Store) List() []*Sandbox {
	s.mu.Lock()
	entries := make([]*entry, 0, len(s.byID))
	for _, r := range s.byID {
		entries = append(entries, r)
	}
	s.mu.Unlock()
	out := make([]*Sandbox, 0, len(entries))
	for _, r := range entries {
		if v := r.view.Load(); v != nil {
			out = append(out, copySandbox(v))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CreatedAt.Before(out[j].CreatedAt) })
	return out
}

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

// Run creates a sandbox. Every step already done is undone when a later
// one fails, so a failed Run leaves nothing behind.
func (s *Store) Run(ctx context.Context, cfg *runtime.PodSandboxConfig, handler string, hooks ...ReadyHook) (_ *Sandbox, retErr error) {
	start := time.Now()
	md := cfg.GetMetadata()
	if md.GetName() == "" || md.GetNamespace() == "" || md.GetUid() == "" {
		return nil, fmt.Errorf("sandbox metadata needs name, namespace and uid: %w", errdefs.ErrInvalidArgument)
	}
	if dir := cfg.GetLogDirectory(); dir != "" && !filepath.IsAbs(dir) {
		return nil, fmt.Errorf("log_directory %q is not absolute: %w", dir, errdefs.ErrInvalidArgument)
	}
	if s.opts.Handlers != nil {
		resolved, release, err := s.opts.Handlers.AdmitHandler(handler)
		if err != nil {
			return nil, err
		}
		defer release()
		handler = resolved
	} else {
		if handler == "" {
			handler = s.opts.DefaultRuntimeHandler
		}
		if !contains(s.opts.RuntimeHandlers, handler) {
			return nil, fmt.Errorf("runtime handler %q is not configured (runtime_handlers has %v): %w", handler, s.opts.RuntimeHandlers, errdefs.ErrInvalidArgument)
		}
	}
	if s.opts.CgroupDriver == "systemd" && s.opts.Systemd == nil {
		return nil, fmt.Errorf("the systemd cgroup driver has no connection to systemd: %w", errdefs.ErrFailedPrecondition)
	}
	nsOpts := cfg.GetLinux().GetSecurityContext().GetNamespaceOptions()
	hostNet := nsOpts.GetNetwork() == runtime.NamespaceMode_NODE
	hostIPC := nsOpts.GetIpc() == runtime.NamespaceMode_NODE
	podPID := nsOpts.GetPid() == runtime.NamespaceMode_POD
	mapping, err := userns.FromCRI(nsOpts.GetUsernsOptions())
	if err != nil {
		return nil, err
	}
	if mapping != nil {
		// As the kubelet's validation: a pod with its own user namespace
		// shares neither the host's IPC nor PID namespace, whose owner it
		// could not use (the container's mqueue and /proc mounts would
		// fail). The host's network is allowed (KEP-5607): the container
		// gets the host's /sys bound read-only instead of a sysfs of its
		// own (specgen), and holds no capability over the host's network.
		if hostIPC || nsOpts.GetPid() == runtime.NamespaceMode_NODE {
			return nil, fmt.Errorf("a pod with its own user namespace cannot use the host's IPC or PID namespace (host network is allowed): %w", errdefs.ErrInvalidArgument)
		}
		if err := s.UserNamespaceSupport(); err != nil {
			return nil, fmt.Errorf("user namespace pod: %w: %w", err, errdefs.ErrFailedPrecondition)
		}
	}
	sysctls, err := validateSysctls(cfg.GetLinux().GetSysctls(), hostNet, hostIPC)
	if err != nil {
		return nil, err
	}
	var ports []network.PortMapping
	for _, pm := range cfg.GetPortMappings() {
		_, knownProto := runtime.Protocol_name[int32(pm.GetProtocol())]
		if !knownProto || pm.GetHostPort() < 0 || (pm.GetHostIp() != "" && net.ParseIP(pm.GetHostIp()) == nil) {
			return nil, fmt.Errorf("port mapping %v: %w", pm, errdefs.ErrInvalidArgument)
		}
		if pm.GetHostPort() == 0 {
			continue // only host ports need forwarding, as in kubelet
		}
		if pm.GetContainerPort() <= 0 || pm.GetContainerPort() > 65535 || pm.GetHostPort() > 65535 {
			return nil, fmt.Errorf("port mapping %v: %w", pm, errdefs.ErrInvalidArgument)
		}
		ports = append(ports, network.PortMapping{
			HostPort: pm.GetHostPort(), ContainerPort: pm.GetContainerPort(),
			Protocol: strings.ToLower(pm.GetProtocol().String()), HostIP: pm.GetHostIp(),
		})
	}
	hostname := cfg.GetHostname()
	if hostname == "" {
		// The kubelet always sets one; others get the pod name, cut to
		// the kernel's limit as the kubelet does.
		hostname = strings.TrimRight(truncate(md.GetName(), 63), "-.")
	}
	if len(hostname) > 64 {
		return nil, fmt.Errorf("hostname %q is longer than 64 bytes: %w", hostname, errdefs.ErrInvalidArgument)
	}
	var pauseBin string
	if podPID || mapping != nil {
		if pauseBin, err = s.pauseBinary(); err != nil {
			return nil, err
		}
	}

	id := newID()
	key := reservationKey(md)
	s.mu.Lock()
	if other, ok := s.names[key]; ok {
		s.mu.Unlock()
		return nil, fmt.Errorf("sandbox name %q is reserved by %s: %w", key, other, errdefs.ErrAlreadyExists)
	}
	s.names[key] = id
	s.mu.Unlock()
	defer func() {
		if retErr != nil {
			s.mu.Lock()
			delete(s.names, key)
			s.mu.Unlock()
		}
	}()

	cgroupUnit, cgroup, err := s.podCgroupName(cfg.GetLinux().GetCgroupParent(), id)
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(s.sandboxesDir(), id)
	stateDir := filepath.Join(s.opts.State, "sandboxes", id)
	r := &entry{
		sb: Sandbox{
			ID: id, Config: proto.Clone(cfg).(*runtime.PodSandboxConfig), RuntimeHandler: handler,
			State: runtime.PodSandboxState_SANDBOX_NOTREADY, CreatedAt: time.Now(),
			CgroupParent: cgroup, CgroupUnit: cgroupUnit,
			HostnamePath: filepath.Join(dir, "hostname"), HostsPath: filepath.Join(dir, "hosts"),
			ResolvConfPath: filepath.Join(dir, "resolv.conf"),
		},
		ports: ports,
	}
	if !hostNet {
		r.sb.NetNSPath = filepath.Join(s.netnsDir(), id+"-net")
		r.sb.UTSNSPath = filepath.Join(s.netnsDir(), id+"-uts")
	}
	if !hostIPC {
		r.sb.IPCNSPath = filepath.Join(s.netnsDir(), id+"-ipc")
		r.sb.ShmPath = filepath.Join(stateDir, "shm")
	}
	if mapping != nil {
		r.sb.UserNSPath = filepath.Join(s.netnsDir(), id+"-user")
		r.sb.UserNS = mapping
	}
	if !hostNet {
		// Chosen (and checkpointed below) up front: from here on, DEL
		// runs in every teardown, with this config.
		if r.attachment, err = s.opts.Network.Prepare(len(ports) > 0); err != nil {
			return nil, err
		}
	}
	r.fillFromAttachment()
	log := s.log.With("pod", id, "name", md.GetName(), "namespace", md.GetNamespace())

	// From here on, teardown knows every path and removes whatever exists.
	defer func() {
		if retErr != nil {
			if err := s.teardown(context.WithoutCancel(ctx), r, true); err != nil {
				log.Error("undo failed sandbox", "err", err)
			}
			if err := os.RemoveAll(dir); err != nil {
				log.Error("undo failed sandbox", "err", err)
			}
			if err := s.removePodCgroup(context.WithoutCancel(ctx), r.sb.CgroupUnit, r.sb.CgroupParent); err != nil {
				log.Error("undo failed sandbox", "err", err)
			}
			os.RemoveAll(stateDir)
		}
	}()
	for _, d := range []string{dir, stateDir} {
		if err := os.Mkdir(d, 0o711); err != nil {
			return nil, fmt.Errorf("create %s: %w", d, err)
		}
	}
	// Written first, NOTREADY: a daemon crash from here on still leaves a
	// sandbox that can be listed, stopped and removed.
	if err := s.persistSoon(r); err != nil {
		return nil, err
	}
	if s.opts.Warm != nil {
		wait, undo := s.opts.Warm(ctx, id)
		defer func() {
			switch {
			case retErr != nil && undo != nil:
				undo(context.WithoutCancel(ctx))
			case retErr == nil && wait != nil:
				wait()
			}
		}()
	}

	req := nsRequest{netPin: r.sb.NetNSPath, ipcPin: r.sb.IPCNSPath, utsPin: r.sb.UTSNSPath, hostname: hostname, sysctls: sysctls}
	if podPID {
		req.pause = &pauseRequest{binary: pauseBin, arg: stateDir}
	}
	if mapping != nil {
		req.userns, req.userPin = mapping, r.sb.UserNSPath
		req.holder = &pauseRequest{binary: pauseBin, arg: stateDir}
	}
	pid, err := createNamespaces(req)
	if pid > 0 {
		r.pausePID = pid
		r.pauseStart, _ = procStartTime(pid)
		r.sb.PIDNSPath = fmt.Sprintf("/proc/%d/ns/pid", pid)
	}
	if err != nil {
		return nil, fmt.Errorf("create pod namespaces: %w", err)
	}
	s.opts.Faults.Hit(fault.SandboxAfterNetnsCreate, "pod", id)
	// CNI ADD needs only the network namespace: it runs (mostly waiting on
	// the plugins' processes) while the pod's files, /dev/shm and cgroup
	// are made. On any failure below the undo waits for it first, so DEL
	// never races ADD.
	var cniTime time.Duration
	cniDone := make(chan error, 1)
	if r.attachment != nil {
		pod, att := s.netPod(r), r.attachment
		go func() {
			cniStart := time.Now()
			err := s.opts.Network.Attach(ctx, pod, att)
			cniTime = time.Since(cniStart)
			cniDone <- err
		}()
	} else {
		cniDone <- nil
	}
	cniWaited := false
	waitCNI := func() error {
		cniWaited = true
		return <-cniDone
	}
	defer func() {
		if !cniWaited {
			_ = waitCNI()
		}
	}()
	if err := s.makePodFilesAndCgroup(ctx, r, hostNet, hostname, mapping, pid); err != nil {
		return nil, err
	}
	if err := waitCNI(); err != nil {
		return nil, err
	}
	r.fillFromAttachment()
	s.opts.Faults.Hit(fault.SandboxAfterCNIAdd, "pod", id)
	for _, hook := range hooks {
		if err := hook(ctx, r.snapshot()); err != nil {
			return nil, err
		}
	}
	r.sb.State = runtime.PodSandboxState_SANDBOX_READY
	if err := s.persistSoon(r); err != nil {
		return nil, err
	}
	s.opts.Faults.Hit(fault.SandboxAfterCheckpointWrite, "pod", id)
	r.publish()
	s.mu.Lock()
	s.byID[id] = r
	s.mu.Unlock()
	log.Info("sandbox ready", "ip", r.sb.IP, "handler", handler, "cgroup", r.sb.CgroupParent, "unit", r.sb.CgroupUnit, "took", time.Since(start), "cni_add", cniTime)
	return r.snapshot(), nil
}

// makePodFilesAndCgroup writes the pod's hostname, hosts and resolv.conf
// files, mounts its /dev/shm and makes its cgroup, moving the pause
// holder (pid, if any) into a cgroup of its own below it.
func (s *Store) makePodFilesAndCgroup(ctx context.Context, r *entry, hostNet bool, hostname string, mapping *userns.Mapping, pid int) error {
	var err error
	if hostNet {
		if hostname, err = os.Hostname(); err != nil {
			return fmt.Errorf("read host name: %w", err)
		}
	}
	hosts, err := hostsContent(hostNet)
	if err != nil {
		return err
	}
	resolv, err := resolvConfContent(r.sb.Config.GetDnsConfig())
	if err != nil {
		return err
	}
	for path, data := range map[string][]byte{r.sb.HostnamePath: []byte(hostname + "\n"), r.sb.HostsPath: hosts, r.sb.ResolvConfPath: resolv} {
		if err := os.WriteFile(path, data, 0o644); err != nil {
			return fmt.Errorf("write %s: %w", path, err)
		}
		if mapping != nil {
			// The pod's root owns its files, as in CRI-O: the container
			// sees them as its root's, like the rest of its rootfs.
			if err := os.Chown(path, int(mapping.UID.HostID), int(mapping.GID.HostID)); err != nil {
				return fmt.Errorf("chown %s to the pod's root: %w", path, err)
			}
		}
	}
	if r.sb.ShmPath != "" {
		if err := os.Mkdir(r.sb.ShmPath, 0o755); err != nil {
			return fmt.Errorf("create %s: %w", r.sb.ShmPath, err)
		}
		shmOpts := fmt.Sprintf("mode=1777,size=%d", shmSize)
		if mapping != nil {
			shmOpts += fmt.Sprintf(",uid=%d,gid=%d", mapping.UID.HostID, mapping.GID.HostID)
		}
		if err := unix.Mount("shm", r.sb.ShmPath, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, shmOpts); err != nil {
			return fmt.Errorf("mount pod /dev/shm at %s: %w", r.sb.ShmPath, err)
		}
	}
	if err := s.createPodCgroup(ctx, r, pid > 0); err != nil {
		return err
	}
	if pid > 0 {
		return s.joinPodCgroup(ctx, r, pid)
	}
	return nil
}

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

// persist writes the sandbox's checkpoint durably.
func (s *Store) persist(r *entry) error {
	return s.writeCheckpoint(r, atomicfile.Write)
}

// persistSoon writes the checkpoint at once and has it made durable right
// after, off the caller's path (Options.Deferred; decision 1600): what
// RunPodSandbox writes. Recovery needs no fsync from it: a restarted
// berthd reads the page cache, and after a power loss, which takes every
// pin, veth, rule and cgroup with it, an older, missing or empty
// checkpoint leaves only files under root and IP reservations, which
// recovery releases without it (docs/reliability.md).
func (s *Store) persistSoon(r *entry) error {
	return s.writeCheckpoint(r, s.opts.Deferred.Write)
}

func (s *Store) writeCheckpoint(r *entry, write func(string, []byte, os.FileMode) error) error {
	c, err := r.toCheckpoint()
	if err != nil {
		return err
	}
	return writeCheckpoint(filepath.Join(s.sandboxesDir(), r.sb.ID), c, write)
}

// teardown releases what a sandbox holds on the node, except its cgroup,
// files and checkpoint: CNI attachment, pause process, namespace pins and
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
		// A crash between starting the holder and checkpointing its pid
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
	if perr := s.persist(r); perr != nil {
		err = errors.Join(err, perr)
	}
	if err != nil {
		return fmt.Errorf("stop sandbox %s: %w", r.sb.ID, err)
	}
	log.Info("sandbox stopped", "took", time.Since(start))
	return nil
}

// Remove stops the sandbox if needed, then deletes its cgroup, files and
// checkpoint. A sandbox that does not exist is not an error.
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
	// The checkpoint goes last: until then a retry can finish the job.
	if err := os.RemoveAll(filepath.Join(s.sandboxesDir(), r.sb.ID)); err != nil {
		return fmt.Errorf("remove sandbox %s: %w", r.sb.ID, err)
	}
	r.removed = true
	r.view.Store(nil)
	s.mu.Lock()
	delete(s.byID, r.sb.ID)
	if s.names[reservationKey(r.sb.Config.GetMetadata())] == r.sb.ID {
		delete(s.names, reservationKey(r.sb.Config.GetMetadata()))
	}
	s.mu.Unlock()
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
// rootfs is built on idmapped image layers), and --root and --state must
// be searchable by others (the container's root, an unprivileged host
// user, reaches its rootfs and pod files through them).
func (s *Store) UserNamespaceSupport() error {
	s.usernsOnce.Do(func() {
		bin, err := s.pauseBinary()
		if err == nil {
			err = userns.ProbeIDMap(s.opts.Root, bin)
		}
		for _, d := range []string{s.opts.Root, s.opts.State} {
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
