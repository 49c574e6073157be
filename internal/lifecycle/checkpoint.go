package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/checkpoint"
	"github.com/berthcri/berth/internal/container"
	"github.com/berthcri/berth/internal/errdefs"
)

// CheckpointContainer writes a CRIU checkpoint of a running container,
// which keeps running, as a tar archive at location, in the layout CRI-O
// and containerd use and checkpointctl reads (KEP-2008,
// docs/checkpoint.md). The archive appears at location complete or not
// at all; ctx bounds it.
func (s *Service) CheckpointContainer(ctx context.Context, id, location string) error {
	c, err := s.containers.Get(id)
	if err != nil {
		return err
	}
	if fi, err := os.Stat(filepath.Dir(location)); err != nil || !fi.IsDir() {
		return invalid("CheckpointContainer: the directory of location %q does not exist", location)
	}
	if fi, err := os.Lstat(location); err == nil && !fi.Mode().IsRegular() {
		return invalid("CheckpointContainer: location %q exists and is not a file", location)
	}
	criu, err := s.opts.CRIU.Usable(ctx)
	if err != nil {
		return err
	}
	staging, err := s.checkpointStaging(c.ID)
	if err != nil {
		return err
	}
	defer os.RemoveAll(staging)
	if err := s.containers.Checkpoint(ctx, []container.Dump{{ID: c.ID, Dir: staging}}, criu); err != nil {
		return err
	}
	if err := checkpoint.WriteArchive(location, staging); err != nil {
		return err
	}
	s.log.Info("container checkpointed", "pod", c.PodID, "container", c.ID, "location", location)
	return nil
}

// checkpointStaging is a new directory under <root>/checkpoints where a
// container's checkpoint is put together before it is archived.
func (s *Service) checkpointStaging(id string) (string, error) {
	dir := filepath.Join(s.opts.Root, "checkpoints")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("checkpoint staging dir: %w", err)
	}
	if len(id) > 12 {
		id = id[:12]
	}
	d, err := os.MkdirTemp(dir, id+"-")
	if err != nil {
		return "", fmt.Errorf("checkpoint staging dir: %w", err)
	}
	return d, nil
}

// CheckpointPod writes one consistent checkpoint of the given running
// containers of a ready pod into out, an existing empty directory: every
// container is paused before any is captured and all are resumed before
// it returns, on success, error or deadline; nothing is written outside
// out, and what was written is removed on error. The layout
// (docs/checkpoint.md): pod.dump, and per container a directory named
// after its metadata name holding a container checkpoint.
func (s *Service) CheckpointPod(ctx context.Context, podID, out string, containerIDs []string) error {
	sb, err := s.sandboxes.Get(podID)
	if err != nil {
		return err
	}
	if sb.State != runtime.PodSandboxState_SANDBOX_READY {
		return fmt.Errorf("pod sandbox %s is not ready: %w", sb.ID, errdefs.ErrFailedPrecondition)
	}
	if err := emptyDir(out); err != nil {
		return err
	}
	manifest := checkpoint.PodManifest{
		Version: checkpoint.PodManifestVersion, Runtime: "berth",
		PodID: sb.ID, RuntimeHandler: sb.RuntimeHandler,
	}
	dumps, err := s.podDumps(sb.ID, out, containerIDs, &manifest)
	if err != nil {
		return err
	}
	criu, err := s.opts.CRIU.Usable(ctx)
	if err != nil {
		return err
	}
	began := time.Now()
	if err := s.checkpointPod(ctx, out, dumps, &manifest, sb.Config, criu); err != nil {
		return err
	}
	s.log.Info("pod checkpointed", "pod", sb.ID, "containers", len(dumps), "output", out, "took", time.Since(began))
	return nil
}

// podDumps checks the containers to checkpoint (each once, of the pod,
// running, with a name usable as a directory) and lists their dumps under
// out, adding each to the manifest.
func (s *Service) podDumps(podID, out string, ids []string, m *checkpoint.PodManifest) ([]container.Dump, error) {
	var (
		dumps []container.Dump
		seen  = map[string]bool{}
		names = map[string]bool{}
	)
	for _, id := range ids {
		c, err := s.containers.Get(id)
		if err != nil {
			return nil, err
		}
		switch {
		case seen[c.ID]:
			return nil, invalid("CheckpointPod: container %s is listed twice", c.ID)
		case c.PodID != podID:
			return nil, invalid("CheckpointPod: container %s belongs to pod %s, not %s", c.ID, c.PodID, podID)
		case c.State != container.StateRunning:
			return nil, fmt.Errorf("container %s is %s, not running: %w", c.ID, c.State, errdefs.ErrFailedPrecondition)
		case !safeName(c.Name) || names[c.Name]:
			return nil, fmt.Errorf("container %s: name %q cannot name its checkpoint: %w", c.ID, c.Name, errdefs.ErrFailedPrecondition)
		}
		seen[c.ID], names[c.Name] = true, true
		dumps = append(dumps, container.Dump{ID: c.ID, Dir: filepath.Join(out, c.Name)})
		m.Containers = append(m.Containers, checkpoint.PodContainer{Name: c.Name, ID: c.ID})
	}
	return dumps, nil
}

// checkpointPod writes the checkpoint into out, or on error removes all
// it wrote there.
func (s *Service) checkpointPod(ctx context.Context, out string, dumps []container.Dump, m *checkpoint.PodManifest, cfg *runtime.PodSandboxConfig, criu string) (retErr error) {
	var made []string
	defer func() {
		if retErr == nil {
			return
		}
		for _, p := range made {
			if err := os.RemoveAll(p); err != nil {
				retErr = errors.Join(retErr, fmt.Errorf("remove partial checkpoint %s: %w", p, err))
			}
		}
	}()
	for _, d := range dumps {
		if err := os.Mkdir(d.Dir, 0o700); err != nil {
			return fmt.Errorf("checkpoint dir: %w", err)
		}
		made = append(made, d.Dir)
	}
	if err := s.containers.Checkpoint(ctx, dumps, criu); err != nil {
		return err
	}
	if cfg != nil {
		raw, err := protojson.Marshal(cfg)
		if err != nil {
			return fmt.Errorf("encode pod config: %w", err)
		}
		m.SandboxConfig = raw
	}
	m.CheckpointedAt = time.Now().UTC()
	made = append(made, filepath.Join(out, checkpoint.PodDump))
	return checkpoint.WriteJSON(out, checkpoint.PodDump, m)
}

// emptyDir checks that path is an existing, empty directory (not a
// symlink to one).
func emptyDir(path string) error {
	fi, err := os.Lstat(path)
	if err != nil {
		return fmt.Errorf("output_path: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	if !fi.IsDir() {
		return fmt.Errorf("output_path %s is not a directory: %w", path, errdefs.ErrInvalidArgument)
	}
	es, err := os.ReadDir(path)
	if err != nil {
		return fmt.Errorf("output_path: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	if len(es) > 0 {
		return fmt.Errorf("output_path %s is not empty: %w", path, errdefs.ErrInvalidArgument)
	}
	return nil
}

// safeName is a container name usable as a directory name.
func safeName(name string) bool {
	return name != "" && name != "." && name != ".." && filepath.Base(name) == name && name[0] != '.' && name != checkpoint.PodDump
}
