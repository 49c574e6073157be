package cri

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/checkpoint"
	"github.com/berthcri/berth/internal/container"
	"github.com/berthcri/berth/internal/errdefs"
)

// CheckpointContainer writes a CRIU checkpoint of a running container,
// which keeps running, as a tar archive at the request's location, in the
// layout CRI-O and containerd use and checkpointctl reads (KEP-2008,
// docs/checkpoint.md). A timeout > 0 bounds it; the archive appears at
// the location complete or not at all.
func (s *Service) CheckpointContainer(ctx context.Context, req *runtime.CheckpointContainerRequest) (*runtime.CheckpointContainerResponse, error) {
	loc := req.GetLocation()
	switch {
	case req.GetContainerId() == "":
		return nil, invalidArgument("CheckpointContainer: container_id is required")
	case loc == "" || !filepath.IsAbs(loc):
		return nil, invalidArgument("CheckpointContainer: location %q must be an absolute path", loc)
	case req.GetTimeout() < 0:
		return nil, invalidArgument("CheckpointContainer: timeout %d is negative", req.GetTimeout())
	}
	if req.GetTimeout() > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(req.GetTimeout())*time.Second)
		defer cancel()
	}
	c, err := s.containers.Get(req.GetContainerId())
	if err != nil {
		return nil, toStatus(err)
	}
	if fi, err := os.Stat(filepath.Dir(loc)); err != nil || !fi.IsDir() {
		return nil, invalidArgument("CheckpointContainer: the directory of location %q does not exist", loc)
	}
	if fi, err := os.Lstat(loc); err == nil && !fi.Mode().IsRegular() {
		return nil, invalidArgument("CheckpointContainer: location %q exists and is not a file", loc)
	}
	criu, err := s.criu.Usable(ctx)
	if err != nil {
		return nil, toStatus(err)
	}
	staging, err := s.checkpointStaging(c.ID)
	if err != nil {
		return nil, toStatus(err)
	}
	defer os.RemoveAll(staging)
	if err := s.containers.Checkpoint(ctx, []container.Dump{{ID: c.ID, Dir: staging}}, criu); err != nil {
		return nil, toStatus(err)
	}
	if err := checkpoint.WriteArchive(loc, staging); err != nil {
		return nil, toStatus(err)
	}
	s.log.Info("container checkpointed", "pod", c.PodID, "container", c.ID, "location", loc)
	return &runtime.CheckpointContainerResponse{}, nil
}

// checkpointStaging is a new directory under <root>/checkpoints where a
// container's checkpoint is put together before it is archived.
func (s *Service) checkpointStaging(id string) (string, error) {
	dir := filepath.Join(s.cfg.Root, "checkpoints")
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

// noOptions refuses every key of a checkpoint or restore options map:
// berth defines none, and the proto forbids ignoring one silently.
func noOptions(rpc string, opts map[string]string) error {
	for k := range opts {
		return fmt.Errorf("%s: unsupported option %q (berth supports none): %w", rpc, k, errdefs.ErrInvalidArgument)
	}
	return nil
}
