package sandbox

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/fault"
	"github.com/berthcri/berth/internal/statetree"
)

// Run creates a sandbox: it plans the pod (planPod), then makes it
// through a draft whose every step done is undone, last first, when a
// later one fails, so a failed Run leaves nothing behind.
func (s *Store) Run(ctx context.Context, cfg *runtime.PodSandboxConfig, handler string, hooks ...ReadyHook) (*Sandbox, error) {
	start := time.Now()
	handler, release, err := s.admitHandler(handler)
	if err != nil {
		return nil, err
	}
	defer release()
	p, err := planPod(s.planHost(), cfg, handler)
	if err != nil {
		return nil, err
	}
	d := s.newDraft(p)
	defer d.discard(ctx)
	if err := d.prepare(ctx); err != nil {
		return nil, err
	}
	if err := d.build(ctx); err != nil {
		return nil, err
	}
	return d.commit(ctx, hooks, start)
}

// admitHandler resolves the pod's runtime handler ("" is the default) and
// holds it, through Options.Handlers, until release is called.
func (s *Store) admitHandler(handler string) (resolved string, release func(), err error) {
	if s.opts.Handlers != nil {
		return s.opts.Handlers.AdmitHandler(handler)
	}
	if handler == "" {
		handler = s.opts.DefaultRuntimeHandler
	}
	if !contains(s.opts.RuntimeHandlers, handler) {
		return "", nil, fmt.Errorf("runtime handler %q is not configured (runtime_handlers has %v): %w", handler, s.opts.RuntimeHandlers, errdefs.ErrInvalidArgument)
	}
	return handler, func() {}, nil
}

// planHost is what planPod reads: this Store's configuration and the
// node.
func (s *Store) planHost() *planHost {
	return &planHost{
		sandboxes: s.sandboxesDir(), netns: s.netnsDir(), state: filepath.Join(s.opts.State, "sandboxes"),
		noSystemd:     s.opts.CgroupDriver == "systemd" && s.opts.Systemd == nil,
		cgroupName:    s.podCgroupName,
		cgroupfsPlan:  cgroupfsPlan,
		newID:         newID,
		now:           time.Now,
		hostname:      os.Hostname,
		readFile:      os.ReadFile,
		pauseBinary:   s.pauseBinary,
		usernsSupport: s.UserNamespaceSupport,
	}
}

// podDraft is a pod being made from its plan: the entry it will be, and
// the undo of every step done so far.
type podDraft struct {
	s   *Store
	p   *podPlan
	r   *entry
	log *slog.Logger
	// undo holds each step's undo, in the order the steps were done.
	undo []func(context.Context)
	// cni delivers CNI ADD's outcome once it runs; cniErr keeps it.
	cni     chan error
	cniErr  error
	cniTime time.Duration
	// warmed waits for Options.Warm's work (on success).
	warmed    func()
	committed bool
}

func (s *Store) newDraft(p *podPlan) *podDraft {
	md := p.sb.Config.GetMetadata()
	return &podDraft{
		s: s, p: p,
		r:   &entry{sb: p.sb, ports: p.ports},
		log: s.log.With("pod", p.sb.ID, "name", md.GetName(), "namespace", md.GetNamespace()),
	}
}

// done records a step's undo.
func (d *podDraft) done(undo func(context.Context)) { d.undo = append(d.undo, undo) }

// discard undoes every step done, last first, unless the draft was
// committed.
func (d *podDraft) discard(ctx context.Context) {
	if d.committed {
		return
	}
	ctx = context.WithoutCancel(ctx)
	for i := len(d.undo) - 1; i >= 0; i-- {
		d.undo[i](ctx)
	}
	d.undo = nil
}

// prepare reserves the pod's name, chooses its network configuration,
// makes its directories and writes its first record, NOTREADY: a daemon
// crash from there on still leaves a sandbox that can be listed, stopped
// and removed. Then the caller's Warm starts.
func (d *podDraft) prepare(ctx context.Context) error {
	s, p, r := d.s, d.p, d.r
	if err := s.objs.Reserve(p.name, p.sb.ID); err != nil {
		return err
	}
	d.done(func(context.Context) { s.objs.Release(p.name, p.sb.ID) })
	if p.attach {
		// Chosen (and recorded below) up front: from here on, DEL runs
		// in every teardown, with this config.
		att, err := s.opts.Network.Prepare(len(p.ports) > 0)
		if err != nil {
			return err
		}
		r.attachment = att
	}
	r.fillFromAttachment()
	// From here on, teardown knows every path and removes whatever exists.
	d.done(d.removeAll)
	// Closed to host users (decision 3400); a user namespace pod's root
	// passes through them to its files and /dev/shm.
	for _, dir := range []string{p.dir, p.stateDir} {
		if err := os.Mkdir(dir, statetree.Private); err != nil {
			return fmt.Errorf("create %s: %w", dir, err)
		}
		if owner := p.sb.UserNS; owner != nil {
			if err := statetree.OpenToMappedRoot(dir, owner.GID.HostID); err != nil {
				return err
			}
		}
	}
	if err := s.saveSoon(r); err != nil {
		return err
	}
	if s.opts.Warm != nil {
		wait, undo := s.opts.Warm(ctx, p.sb.ID)
		d.warmed = wait
		if undo != nil {
			d.done(undo)
		}
	}
	return nil
}

// removeAll undoes what the pod holds on the node, its cgroup and its
// directories, whatever of them exists.
func (d *podDraft) removeAll(ctx context.Context) {
	s, r := d.s, d.r
	if err := s.teardown(ctx, r, true); err != nil {
		d.log.Error("undo failed sandbox", "err", err)
	}
	if err := os.RemoveAll(d.p.dir); err != nil {
		d.log.Error("undo failed sandbox", "err", err)
	}
	if err := s.removePodCgroup(ctx, r.sb.CgroupUnit, r.sb.CgroupParent); err != nil {
		d.log.Error("undo failed sandbox", "err", err)
	}
	os.RemoveAll(d.p.stateDir)
}

// build makes the pod's namespaces (and holder), then runs CNI ADD, which
// needs only the network namespace and mostly waits on the plugins'
// processes, while the pod's files, /dev/shm and cgroup are made.
func (d *podDraft) build(ctx context.Context) error {
	s, r, id := d.s, d.r, d.p.sb.ID
	pid, err := createNamespaces(d.p.ns)
	if pid > 0 {
		r.pausePID = pid
		r.pauseStart, _ = procStartTime(pid)
		r.sb.PIDNSPath = fmt.Sprintf("/proc/%d/ns/pid", pid)
	}
	if err != nil {
		return fmt.Errorf("create pod namespaces: %w", err)
	}
	s.opts.Faults.Hit(fault.SandboxAfterNetnsCreate, "pod", id)
	d.startCNI(ctx)
	if err := d.makeFilesAndCgroup(ctx); err != nil {
		return err
	}
	if err := d.waitCNI(); err != nil {
		return err
	}
	r.fillFromAttachment()
	s.opts.Faults.Hit(fault.SandboxAfterCNIAdd, "pod", id)
	return nil
}

// startCNI runs CNI ADD in the background, if the pod has a network of
// its own. Its undo waits for it, so DEL never races ADD.
func (d *podDraft) startCNI(ctx context.Context) {
	d.cni = make(chan error, 1)
	d.done(func(context.Context) { _ = d.waitCNI() })
	if d.r.attachment == nil {
		d.cni <- nil
		return
	}
	pod, att := d.s.netPod(d.r), d.r.attachment
	go func() {
		start := time.Now()
		err := d.s.opts.Network.Attach(ctx, pod, att)
		d.cniTime = time.Since(start)
		d.cni <- err
	}()
}

// waitCNI waits for CNI ADD, once, and returns its outcome.
func (d *podDraft) waitCNI() error {
	if d.cni != nil {
		d.cniErr = <-d.cni
		d.cni = nil
	}
	return d.cniErr
}

// makeFilesAndCgroup writes the pod's hostname, hosts and resolv.conf
// files, mounts its /dev/shm and makes its cgroup, moving the holder (if
// any) into a cgroup of its own below it.
func (d *podDraft) makeFilesAndCgroup(ctx context.Context) error {
	p, r := d.p, d.r
	owner := r.sb.UserNS
	for _, f := range p.files {
		if err := os.WriteFile(f.path, f.data, 0o644); err != nil {
			return fmt.Errorf("write %s: %w", f.path, err)
		}
		if owner != nil {
			// The pod's root owns its files, as in CRI-O: the container
			// sees them as its root's, like the rest of its rootfs.
			if err := os.Chown(f.path, int(owner.UID.HostID), int(owner.GID.HostID)); err != nil {
				return fmt.Errorf("chown %s to the pod's root: %w", f.path, err)
			}
		}
	}
	if shm := r.sb.ShmPath; shm != "" {
		if err := os.Mkdir(shm, 0o755); err != nil {
			return fmt.Errorf("create %s: %w", shm, err)
		}
		if err := unix.Mount("shm", shm, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, p.shmOptions); err != nil {
			return fmt.Errorf("mount pod /dev/shm at %s: %w", shm, err)
		}
	}
	if err := d.s.createPodCgroup(ctx, r, p.cgroups); err != nil {
		return err
	}
	if r.pausePID > 0 {
		return d.s.joinPodCgroup(ctx, r, p.cgroups, r.pausePID)
	}
	return nil
}

// commit runs the ready hooks, records the sandbox READY and publishes it.
// On error the draft is left for discard.
func (d *podDraft) commit(ctx context.Context, hooks []ReadyHook, start time.Time) (*Sandbox, error) {
	s, r, id := d.s, d.r, d.p.sb.ID
	for _, hook := range hooks {
		if err := hook(ctx, r.snapshot()); err != nil {
			return nil, err
		}
	}
	r.sb.State = runtime.PodSandboxState_SANDBOX_READY
	if err := s.saveSoon(r); err != nil {
		return nil, err
	}
	s.opts.Faults.Hit(fault.SandboxAfterCheckpointWrite, "pod", id)
	r.publish()
	s.objs.Add(id, d.p.name, r)
	d.committed = true
	d.log.Info("sandbox ready", "ip", r.sb.IP, "handler", r.sb.RuntimeHandler, "cgroup", r.sb.CgroupParent, "unit", r.sb.CgroupUnit, "took", time.Since(start), "cni_add", d.cniTime)
	sb := r.snapshot()
	if d.warmed != nil {
		// What Warm started is done when RunPodSandbox answers.
		d.warmed()
	}
	return sb, nil
}
