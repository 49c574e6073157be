package container

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/berthcri/berth/internal/checkpoint"
	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/network"
	"github.com/berthcri/berth/internal/oci"
)

// Dump is one container to checkpoint and the empty directory its
// checkpoint goes to, in the layout of package checkpoint.
type Dump struct {
	ID  string
	Dir string
}

// Checkpoint takes one consistent checkpoint of running containers
// (KEP-2008; CheckpointPod's contract): every container is locked and
// paused before any is captured, each is captured (CRIU images through
// the runtime's checkpoint with --leave-running, its spec, config.dump and
// its writable layer's diff) while all stay paused, and all are resumed
// before Checkpoint returns, on success, error or the end of ctx. What it
// wrote into the directories is the caller's to remove on error.
// criu is the criu binary runc runs.
func (s *Store) Checkpoint(ctx context.Context, dumps []Dump, criu string) (retErr error) {
	type held struct {
		e   *entry
		rt  *oci.Runtime
		dir string
	}
	if len(dumps) == 0 {
		return fmt.Errorf("checkpoint of no container: %w", errdefs.ErrInvalidArgument)
	}
	// Locked in ID order: two checkpoints of one pod never deadlock.
	dumps = slices.Clone(dumps)
	slices.SortFunc(dumps, func(a, b Dump) int { return strings.Compare(a.ID, b.ID) })
	var hs []held
	defer func() {
		for _, h := range hs {
			h.e.unlock()
		}
	}()
	for _, d := range dumps {
		e, err := s.lock(ctx, d.ID)
		if err != nil {
			return err
		}
		hs = append(hs, held{e: e, dir: d.Dir})
		s.foldExit(e)
		r := e.rec
		switch {
		case r.State != StateRunning:
			return fmt.Errorf("container %s is %s, not running: %w", r.ID, r.State, errdefs.ErrFailedPrecondition)
		case r.Terminal:
			return fmt.Errorf("container %s has a terminal, which CRIU cannot restore: %w", r.ID, errdefs.ErrFailedPrecondition)
		}
		rt, ok := s.runtime(r.Runtime)
		if !ok {
			return fmt.Errorf("runtime handler %q is gone from the config: %w", r.Runtime, errdefs.ErrFailedPrecondition)
		}
		hs[len(hs)-1].rt = rt
		if err := s.checkpointable(r); err != nil {
			return err
		}
	}
	defer func() {
		// A runtime killed by the deadline says "killed": say why.
		if retErr != nil && ctx.Err() != nil && !errors.Is(retErr, ctx.Err()) {
			retErr = fmt.Errorf("%w: %w", ctx.Err(), retErr)
		}
	}()

	// Pause all, capture all, resume all: the resume runs whatever
	// happened, also past ctx's deadline.
	var paused []held
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		for _, h := range paused {
			// A dump killed at the deadline may leave the container
			// thawed already (CRIU thaws once it holds the tasks).
			if err := h.rt.Resume(rctx, h.e.rec.ID); err != nil && !strings.Contains(err.Error(), "not paused") {
				s.log.Error("resume container after checkpoint", "pod", h.e.rec.PodID, "container", h.e.rec.ID, "err", err)
				retErr = errors.Join(retErr, fmt.Errorf("resume container %s: %w", h.e.rec.ID, err))
			}
		}
	}()
	for _, h := range hs {
		// Listed first: a pause cut short may have frozen it anyway. The
		// pause itself is not cut short (a runtime killed mid-pause
		// leaves a cgroup half frozen); ctx is checked between them.
		paused = append(paused, h)
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		err := h.rt.Pause(pctx, h.e.rec.ID)
		cancel()
		if err != nil {
			return fmt.Errorf("pause container %s: %w", h.e.rec.ID, err)
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("checkpoint: %w", err)
		}
	}
	began := time.Now()
	for _, h := range hs {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("checkpoint: %w", err)
		}
		if err := s.dump(ctx, h.e.rec, h.rt, h.dir, criu); err != nil {
			return err
		}
	}
	s.log.Info("containers checkpointed", "pod", hs[0].e.rec.PodID, "containers", len(hs), "took", time.Since(began))
	return nil
}

// checkpointable refuses what berth cannot restore: a container in a
// PID namespace it shares by path (the pod's, whose init is berth-pause,
// or a target container's) or in a user namespace. A restore needs the
// processes' old PIDs free in the new pod's PID namespace, and there
// berth-pause's own runtime threads take low PIDs before any restore
// runs: tried, a restore failed with "Can't fork for 7: File exists"
// about one run in three (decision 1400).
func (s *Store) checkpointable(r *Container) error {
	spec, err := readSpec(s.dir(r.ID))
	if err != nil {
		return err
	}
	if spec.Linux == nil {
		return nil
	}
	for _, ns := range spec.Linux.Namespaces {
		switch {
		case ns.Type == specs.PIDNamespace && ns.Path != "":
			return fmt.Errorf("container %s shares a PID namespace (shareProcessNamespace or pid TARGET), which berth cannot restore: %w", r.ID, errdefs.ErrFailedPrecondition)
		case ns.Type == specs.UserNamespace:
			return fmt.Errorf("container %s runs in a user namespace, which berth does not checkpoint: %w", r.ID, errdefs.ErrFailedPrecondition)
		}
	}
	return nil
}

// dump captures one paused container into dir.
func (s *Store) dump(ctx context.Context, r *Container, rt *oci.Runtime, dir, criu string) error {
	work := filepath.Join(dir, ".criu-work")
	if err := os.MkdirAll(work, 0o700); err != nil {
		return fmt.Errorf("checkpoint container %s: %w", r.ID, err)
	}
	defer os.RemoveAll(work)
	images := filepath.Join(dir, checkpoint.ImagesDir)
	err := rt.Checkpoint(ctx, r.ID, oci.CheckpointOpts{CRIU: criu, ImagePath: images, WorkPath: work, LeaveRunning: true})
	// CRIU's log and statistics go with the checkpoint, also a failed
	// one's log to the error.
	for _, name := range []string{checkpoint.DumpLog, checkpoint.StatsDump} {
		_ = copyFile(filepath.Join(work, name), filepath.Join(dir, name))
	}
	if err != nil {
		if ctx.Err() != nil {
			s.unlockNetwork(ctx, r)
		}
		return fmt.Errorf("checkpoint container %s: %w (criu log: %s)", r.ID, err, lastLogLines(filepath.Join(work, checkpoint.DumpLog)))
	}
	if err := copyFile(filepath.Join(s.dir(r.ID), "config.json"), filepath.Join(dir, checkpoint.SpecDump)); err != nil {
		return fmt.Errorf("checkpoint container %s: %w", r.ID, err)
	}
	cfg := checkpoint.ContainerConfig{
		ID: r.ID, Name: r.Name, RootfsImage: r.Image, RootfsImageRef: r.ImageID, RootfsImageName: r.ImageName,
		OCIRuntime: filepath.Base(rt.Binary), CreatedTime: r.CreatedAt, CheckpointedAt: time.Now().UTC(),
	}
	if err := checkpoint.WriteJSON(dir, checkpoint.ConfigDump, cfg); err != nil {
		return err
	}
	if err := checkpoint.WriteRootfsDiff(filepath.Join(s.dir(r.ID), "upper"), dir); err != nil {
		return fmt.Errorf("checkpoint container %s: %w", r.ID, err)
	}
	return nil
}

// unlockNetwork removes the network lock a CRIU killed at the deadline
// left on the container's network namespace (network.RemoveCRIULock).
// ctx is the checkpoint's, already done: the removal gets a bound of its
// own. Errors are logged only: the checkpoint has failed already.
func (s *Store) unlockNetwork(ctx context.Context, r *Container) {
	spec, err := readSpec(s.dir(r.ID))
	if err != nil || spec.Linux == nil {
		return
	}
	path := ""
	for _, ns := range spec.Linux.Namespaces {
		if ns.Type == specs.NetworkNamespace {
			path = ns.Path
		}
	}
	if path == "" {
		return // the host's network: CRIU does not lock it
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), unlockTimeout)
	defer cancel()
	if err := network.RemoveCRIULock(ctx, path); err != nil {
		s.log.Warn("remove CRIU's network lock", "pod", r.PodID, "container", r.ID, "err", err)
	}
}

// unlockTimeout bounds the removal of CRIU's network lock: two saves and
// two restores, each well under a second.
const unlockTimeout = 30 * time.Second

// lastLogLines is the end of a CRIU log: the errors come last.
func lastLogLines(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return path
	}
	if len(data) > 600 {
		data = data[len(data)-600:]
	}
	return string(data)
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// copyDir copies the regular files of from (CRIU's image directory is
// flat) into a new directory to.
func copyDir(from, to string) error {
	es, err := os.ReadDir(from)
	if err != nil {
		return err
	}
	if err := os.Mkdir(to, 0o700); err != nil {
		return err
	}
	for _, e := range es {
		if !e.Type().IsRegular() {
			continue
		}
		if err := copyFile(filepath.Join(from, e.Name()), filepath.Join(to, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// Restore is what a container restored from a checkpoint is created from:
// the directory of its checkpoint (package checkpoint's layout) and the
// criu its start runs.
type Restore struct {
	Dir  string
	CRIU string
}

// restoreImages is where a restored container keeps its copy of the
// CRIU images until its start restores them.
func restoreImages(dir string) string { return filepath.Join(dir, checkpoint.ImagesDir) }

// prepareRestore replays the checkpoint's rootfs diff onto the mounted
// rootfs and copies its CRIU images into the container's directory: the
// checkpoint itself is the caller's and is never modified, and may be
// gone by the time the container starts.
func (d *Draft) prepareRestore() error {
	rs := d.req.Restore
	if err := checkpoint.ApplyRootfsDiff(d.Rootfs.Path, rs.Dir); err != nil {
		return fmt.Errorf("restore container %s: %w", d.ID, err)
	}
	if err := copyDir(filepath.Join(rs.Dir, checkpoint.ImagesDir), restoreImages(d.dir)); err != nil {
		return fmt.Errorf("restore container %s: copy checkpoint images: %w", d.ID, err)
	}
	return nil
}
