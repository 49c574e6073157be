package cri

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

// CheckpointPod writes one consistent checkpoint of the selected running
// containers of a pod into output_path, exactly as the proto says: every
// container is paused before any is captured and all are resumed before
// the call returns, on success, error or deadline; nothing is written
// outside output_path, and what was written is removed on error. The
// layout (docs/checkpoint.md): pod.dump, and per container a directory
// named after its metadata name holding a container checkpoint.
func (s *Service) CheckpointPod(ctx context.Context, req *runtime.CheckpointPodRequest) (*runtime.CheckpointPodResponse, error) {
	out := req.GetOutputPath()
	switch {
	case req.GetPodSandboxId() == "":
		return nil, invalidArgument("CheckpointPod: pod_sandbox_id is required")
	case out == "" || !filepath.IsAbs(out):
		return nil, invalidArgument("CheckpointPod: output_path %q must be an absolute path", out)
	case len(req.GetContainerIds()) == 0:
		return nil, invalidArgument("CheckpointPod: container_ids must not be empty")
	}
	if err := noOptions("CheckpointPod", req.GetOptions()); err != nil {
		return nil, toStatus(err)
	}
	if _, ok := ctx.Deadline(); !ok {
		return nil, invalidArgument("CheckpointPod: the caller must set a deadline")
	}
	sb, err := s.sandboxes.Get(req.GetPodSandboxId())
	if err != nil {
		return nil, toStatus(err)
	}
	if sb.State != runtime.PodSandboxState_SANDBOX_READY {
		return nil, toStatus(fmt.Errorf("pod sandbox %s is not ready: %w", sb.ID, errdefs.ErrFailedPrecondition))
	}
	if err := emptyDir(out); err != nil {
		return nil, toStatus(err)
	}
	var (
		dumps    []container.Dump
		manifest = checkpoint.PodManifest{
			Version: checkpoint.PodManifestVersion, Runtime: "berth",
			PodID: sb.ID, RuntimeHandler: sb.RuntimeHandler,
		}
		seen  = map[string]bool{}
		names = map[string]bool{}
	)
	for _, id := range req.GetContainerIds() {
		c, err := s.containers.Get(id)
		if err != nil {
			return nil, toStatus(err)
		}
		switch {
		case seen[c.ID]:
			return nil, invalidArgument("CheckpointPod: container %s is listed twice", c.ID)
		case c.PodID != sb.ID:
			return nil, invalidArgument("CheckpointPod: container %s belongs to pod %s, not %s", c.ID, c.PodID, sb.ID)
		case c.State != container.StateRunning:
			return nil, toStatus(fmt.Errorf("container %s is %s, not running: %w", c.ID, c.State, errdefs.ErrFailedPrecondition))
		case !safeName(c.Name) || names[c.Name]:
			return nil, toStatus(fmt.Errorf("container %s: name %q cannot name its checkpoint: %w", c.ID, c.Name, errdefs.ErrFailedPrecondition))
		}
		seen[c.ID], names[c.Name] = true, true
		dumps = append(dumps, container.Dump{ID: c.ID, Dir: filepath.Join(out, c.Name)})
		manifest.Containers = append(manifest.Containers, checkpoint.PodContainer{Name: c.Name, ID: c.ID})
	}
	criu, err := s.criu.Usable(ctx)
	if err != nil {
		return nil, toStatus(err)
	}
	began := time.Now()
	if err := s.checkpointPod(ctx, out, dumps, &manifest, sb.Config, criu); err != nil {
		return nil, toStatus(err)
	}
	s.log.Info("pod checkpointed", "pod", sb.ID, "containers", len(dumps), "output", out, "took", time.Since(began))
	return &runtime.CheckpointPodResponse{}, nil
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
