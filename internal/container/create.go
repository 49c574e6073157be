package container

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/fault"
	"github.com/berthcri/berth/internal/image"
	"github.com/berthcri/berth/internal/oci"
	"github.com/berthcri/berth/internal/shim"
)

// A container is created in two calls, so that the caller builds its spec
// in between without callbacks:
//
//	d, err := store.Prepare(ctx, req) // name, shim, image, filesystem
//	defer d.Discard(ctx)              // undoes it all unless committed
//	spec := ...                       // from d.ID, d.Image, d.Rootfs
//	c := d.Record(spec)               // what will be recorded (NRI sees it)
//	c, err = d.Commit(ctx, spec, c.Resources)
//
// Prepare needs only the pod's ID (and its user namespace), not a ready
// sandbox: it can run while the pod's network is still being set up.

// CreateRequest is what a container is created from.
type CreateRequest struct {
	PodID   string
	Runtime string // runtime handler name
	Config  *runtime.ContainerConfig
	// LogPath is the absolute log file path ("" → no log).
	LogPath string
	// LogDir is the pod's log directory, LogPath's ancestor: the monitor
	// follows no symlink below it when it opens the log.
	LogDir string
	// UserNS is the pod's own user namespace; nil for the host's.
	UserNS *UserNS
	// StopSignal is the config's stop signal by name (KEP-4960); ""
	// means the image's.
	StopSignal string
	// Restore, when set, makes a container restored from a checkpoint:
	// its rootfs gets the checkpoint's diff, and its start restores the
	// checkpointed processes instead of starting the config's.
	Restore *Restore
}

// Draft is a container being created: its name is reserved, its image
// leased, its filesystem mounted, and the pod is being added to the node's
// monitor in the background. Build its spec from ID, Image and Rootfs, then
// Commit; Discard undoes whatever was done.
type Draft struct {
	ID string
	// Image is the container's image; its config feeds the spec.
	Image  *image.Image
	Rootfs *Rootfs

	s       *Store
	req     CreateRequest
	runtime *oci.Runtime
	nameKey string
	dir     string
	log     *slog.Logger
	began   time.Time
	// leases are the image lease owners taken: the container ID, then
	// <id>.vol<n> for each image volume.
	leases  []string
	volumes []imageVolume
	shim    *pendingShim
	// created is the shim that holds the container once the runtime
	// created it.
	created   Shim
	committed bool
	discarded bool
}

// imageVolume is one image volume of a container: the index of its CRI
// mount, its lease owner, and its mount as status reports it.
type imageVolume struct {
	index int
	owner string
	mount Mount
}

// Prepare reserves the container's name, reaches (or launches) the pod's
// shim in the background, leases the image and mounts the container's
// filesystem. On error it has undone all of it.
func (s *Store) Prepare(ctx context.Context, req CreateRequest) (_ *Draft, retErr error) {
	cfg := req.Config
	if cfg.GetMetadata().GetName() == "" {
		return nil, fmt.Errorf("container config needs metadata with a name: %w", errdefs.ErrInvalidArgument)
	}
	rt, ok := s.runtime(req.Runtime)
	if !ok {
		return nil, fmt.Errorf("runtime handler %q: %w", req.Runtime, errdefs.ErrInvalidArgument)
	}
	d := &Draft{ID: newID(), s: s, req: req, runtime: rt, began: time.Now()}
	d.dir = s.dir(d.ID)
	d.log = s.log.With("pod", req.PodID, "container", d.ID, "name", cfg.GetMetadata().GetName())
	if err := s.reserveName(d); err != nil {
		return nil, err
	}
	defer func() {
		if retErr != nil {
			d.Discard(ctx)
		}
	}()
	d.shim = reachShim(ctx, s.shims, req.PodID)
	if err := d.makeDir(); err != nil {
		return nil, err
	}
	img, layers, err := d.lease(ctx, cfg.GetImage().GetImage(), d.ID)
	if err != nil {
		return nil, err
	}
	d.Image = img
	d.Rootfs = &Rootfs{dir: d.dir, mounter: s.mounts}
	if d.Rootfs.Path, err = s.mounts.Rootfs(d.dir, layers, req.UserNS); err != nil {
		return nil, err
	}
	s.opts.Faults.Hit(fault.ContainerAfterOverlayMount, "pod", req.PodID, "container", d.ID)
	if err := d.mountImageVolumes(ctx); err != nil {
		return nil, err
	}
	if d.Rootfs.IDMapped, err = s.mounts.IDMapped(d.dir, cfg.GetMounts(), req.UserNS); err != nil {
		return nil, err
	}
	if req.Restore != nil {
		if err := d.prepareRestore(); err != nil {
			return nil, err
		}
	}
	return d, nil
}

// lease pins an image's layers for owner and returns the layer dirs,
// topmost first.
func (d *Draft) lease(ctx context.Context, ref, owner string) (*image.Image, []string, error) {
	img, layers, err := d.s.images.Acquire(ctx, ref, owner)
	if err != nil {
		return nil, nil, fmt.Errorf("image %q: %w", ref, err)
	}
	d.leases = append(d.leases, owner)
	return img, layers, nil
}

// mountImageVolumes leases and mounts every CRI mount that names an image,
// read-only.
func (d *Draft) mountImageVolumes(ctx context.Context) error {
	d.Rootfs.Volumes = map[string]string{}
	for n, m := range d.req.Config.GetMounts() {
		if m.GetImage() == nil {
			continue
		}
		switch {
		case m.GetImage().GetImage() == "":
			return fmt.Errorf("image volume %q: image is required: %w", m.GetContainerPath(), errdefs.ErrInvalidArgument)
		case !m.GetReadonly():
			return fmt.Errorf("image volume %q: must be readonly: %w", m.GetContainerPath(), errdefs.ErrInvalidArgument)
		}
		owner := d.ID + ".vol" + strconv.Itoa(n)
		img, layers, err := d.lease(ctx, m.GetImage().GetImage(), owner)
		if err != nil {
			return fmt.Errorf("image volume %q: %w", m.GetContainerPath(), err)
		}
		src, err := d.s.mounts.ImageVolume(d.dir, n, layers, m.GetImageSubPath(), d.req.UserNS)
		if err != nil {
			return fmt.Errorf("image volume %q: %w", m.GetContainerPath(), err)
		}
		d.Rootfs.Volumes[m.GetContainerPath()] = src
		d.volumes = append(d.volumes, imageVolume{index: n, owner: owner, mount: Mount{
			ContainerPath: m.GetContainerPath(), HostPath: src, Readonly: true, Propagation: int32(m.GetPropagation()),
			Image: m.GetImage().GetImage(), ImageRef: img.ID, ImageSubPath: m.GetImageSubPath(),
		}})
	}
	if len(d.volumes) > 0 {
		d.s.opts.Faults.Hit(fault.ContainerAfterImageVolumeMount, "pod", d.req.PodID, "container", d.ID)
	}
	return nil
}

// Record is the container's record as Commit will write it, for a caller
// that shows the container to others before it exists (NRI plugins).
func (d *Draft) Record(spec *specs.Spec) *Container {
	return newRecord(d.ID, d.req, d.Image, d.volumes, spec, d.began.UTC())
}

// Commit writes the bundle, has the node's monitor create the container, and
// records and publishes it. resources are what status reports as applied:
// as the config asked, or as NRI plugins adjusted them. On error the
// draft is left for Discard.
func (d *Draft) Commit(ctx context.Context, spec *specs.Spec, resources *runtime.LinuxContainerResources) (*Container, error) {
	if d.committed || d.discarded {
		return nil, fmt.Errorf("container %s: draft already used: %w", d.ID, errdefs.ErrFailedPrecondition)
	}
	s := d.s
	rec := d.Record(spec)
	rec.Resources = resources
	if spec.Linux != nil {
		s.dropLimits(rec.ID, spec.Linux.Resources)
	}
	readonly := d.req.Config.GetLinux().GetSecurityContext().GetReadonlyRootfs()
	if err := writeBundle(d.dir, d.Rootfs.Path, readonly, spec, s.opts.Deferred.Write); err != nil {
		return nil, err
	}
	prepared := time.Now()

	sh, err := d.shim.join()
	if err != nil {
		return nil, err
	}
	shimReady := time.Now()
	s.opts.Faults.Hit(fault.ContainerAfterShimStart, "pod", rec.PodID, "container", rec.ID)
	if err := d.runtimeCreate(ctx, sh); err != nil {
		return nil, err
	}
	runtimeCreated := time.Now()
	s.opts.Faults.Hit(fault.ContainerAfterRuncCreate, "pod", rec.PodID, "container", rec.ID)
	if st, err := d.created.State(ctx, rec.ID); err == nil {
		rec.Pid = st.Pid
	}

	if err := s.saveRecordSoon(rec); err != nil {
		return nil, err
	}
	s.opts.Faults.Hit(fault.ContainerAfterRecordWrite, "pod", rec.PodID, "container", rec.ID)
	d.committed = true
	s.add(rec)
	// Where the time went: rootfs and spec, waiting for the node's monitor
	// beyond that (the pod is added meanwhile), and the OCI
	// runtime's create.
	d.log.Info("container created", "took", time.Since(d.began),
		"prepare", prepared.Sub(d.began), "shim", shimReady.Sub(prepared), "runtime_create", runtimeCreated.Sub(shimReady))
	return rec.clone(), nil
}

// writeBundle points the spec at the container's rootfs and writes it as
// the bundle's config.json with write. Masked paths that are symlinks in
// the image become plain files first (replaceMaskedSymlinks), and so does
// a /dev that is one (replaceDevSymlink). The runtime
// reads the file at once; later only a running container's stats, exec
// and NRI views read it, and none runs after a power loss, so it needs
// no fsync before the create goes on (decision 1600).
func writeBundle(dir, rootfs string, readonly bool, spec *specs.Spec, write func(string, []byte, os.FileMode) error) error {
	if spec.Root == nil {
		spec.Root = &specs.Root{}
	}
	spec.Root.Path, spec.Root.Readonly = rootfs, readonly
	if err := replaceDevSymlink(rootfs); err != nil {
		return err
	}
	if spec.Linux != nil {
		if err := replaceMaskedSymlinks(rootfs, spec.Linux.MaskedPaths, spec.Mounts); err != nil {
			return err
		}
	}
	data, err := json.Marshal(spec)
	if err != nil {
		return fmt.Errorf("encode spec: %w", err)
	}
	return write(filepath.Join(dir, "config.json"), data, 0o600)
}

// runtimeCreate has the shim create the container from the bundle.
func (d *Draft) runtimeCreate(ctx context.Context, sh Shim) error {
	cfg := d.req.Config
	cr := &shim.CreateRequest{
		Bundle: d.dir, LogPath: d.req.LogPath, LogDir: d.req.LogDir,
		Runtime: shim.Runtime{Binary: d.runtime.Binary, Root: d.runtime.Root, Options: d.runtime.Options},
		Stdin:   cfg.GetStdin(), StdinOnce: cfg.GetStdinOnce(), Terminal: cfg.GetTty(),
	}
	if rs := d.req.Restore; rs != nil {
		cr.Restore, cr.CRIU = restoreImages(d.dir), rs.CRIU
	}
	err := sh.Create(ctx, d.ID, cr)
	if errors.Is(err, shim.ErrMonitorCut) {
		// The node's monitor died while it created the container: the
		// runtime may hold it, and the keeper too (then the next monitor
		// adopted it). Discard deletes it from both.
		d.created = sh
		return fmt.Errorf("create container %s: %w", d.ID, err)
	}
	if errors.Is(err, errdefs.ErrUnavailable) {
		// The shim was exiting as its last container went: launch another.
		if sh, err = d.s.shims.Start(ctx, d.req.PodID); err == nil {
			err = sh.Create(ctx, d.ID, cr)
		}
	}
	if err != nil {
		return fmt.Errorf("create container %s: %w", d.ID, err)
	}
	d.created = sh
	return nil
}

// Discard undoes what Prepare and a failed Commit did, last step first:
// the runtime's container, the pod added to the monitor for it, the filesystem,
// the image leases, the directory and the name. After a successful Commit
// it does nothing; a second call does nothing either.
func (d *Draft) Discard(ctx context.Context) {
	if d == nil || d.committed || d.discarded {
		return
	}
	d.discarded = true
	ctx = context.WithoutCancel(ctx)
	switch {
	case d.created != nil:
		// A shim exits by itself once its last container is deleted.
		_, err := d.created.Delete(ctx, d.ID)
		if err != nil && !errors.Is(err, errdefs.ErrNotFound) && !errors.Is(err, shim.ErrNoShim) {
			d.log.Warn("delete container after failed create", "err", err)
		}
		if err != nil && d.runtime != nil {
			// No shim holds it (a create the monitor's crash cut before
			// the keeper held it): the runtime may, with its init.
			if err := d.runtime.Delete(ctx, d.ID, true); err != nil {
				d.log.Warn("runtime delete after failed create", "err", err)
			}
		}
	case d.shim != nil:
		d.shim.abandon(ctx, d.log)
	}
	unmounted := true
	if d.Rootfs != nil {
		if err := d.Rootfs.Undo(); err != nil {
			d.log.Warn("unmount after failed create; keeping the container dir", "err", err)
			unmounted = false
		}
	}
	for _, owner := range d.leases {
		if err := d.s.images.Release(owner); err != nil {
			d.log.Warn("release image lease after failed create", "owner", owner, "err", err)
		}
	}
	if unmounted {
		if err := os.RemoveAll(d.dir); err != nil {
			d.log.Warn("remove container dir after failed create", "err", err)
		}
	}
	d.s.releaseName(d)
}
