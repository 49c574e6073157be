package cri

import (
	"context"
	"os"
	"path/filepath"
	"strings"

	"google.golang.org/protobuf/proto"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/checkpoint"
	"github.com/berthcri/berth/internal/container"
)

// checkpointArchivePath is the config's image when it names a local
// file, which CreateContainer then takes for a CheckpointContainer
// archive to restore (CRI-O's rule for KEP-2008's restore through
// CreateContainer); "" for an ordinary image reference.
func checkpointArchivePath(cfg *runtime.ContainerConfig) string {
	img := cfg.GetImage().GetImage()
	if !filepath.IsAbs(img) {
		return ""
	}
	if fi, err := os.Stat(img); err != nil || !fi.Mode().IsRegular() {
		return ""
	}
	return img
}

// createFromCheckpoint is CreateContainer restoring one container from a
// CheckpointContainer archive: the archive is unpacked into a private
// directory, its image, command, working directory, environment and user
// replace the request's, and the container is created as RestorePod
// creates each of its containers, so StartContainer runs runc restore.
// The unpacked directory goes when this returns (the container keeps its
// own copy of the CRIU images); a failed create undoes itself.
func (s *Service) createFromCheckpoint(ctx context.Context, req *runtime.CreateContainerRequest, archive string) (*container.Container, error) {
	cfg := req.GetConfig()
	switch {
	case req.GetPodSandboxId() == "":
		return nil, invalidArgument("CreateContainer: pod_sandbox_id is required")
	case cfg.GetMetadata().GetName() == "":
		return nil, invalidArgument("CreateContainer: config with metadata.name is required")
	case cfg.GetTty():
		return nil, invalidArgument("CreateContainer: a container restored from checkpoint %s cannot have a terminal", archive)
	}
	if !checkpoint.IsArchive(archive) {
		return nil, invalidArgument("CreateContainer: image %q is a file but not a container checkpoint archive (a tar with %s and %s)",
			archive, checkpoint.ConfigDump, checkpoint.SpecDump)
	}
	sb, err := s.sandboxes.Get(req.GetPodSandboxId())
	if err != nil {
		return nil, toStatus(err)
	}
	live := s.live.Load()
	handler := sb.RuntimeHandler
	if handler == "" {
		handler = live.Config.DefaultRuntimeHandler
	}
	rh, ok := live.Handler(handler)
	if !ok {
		return nil, invalidArgument("CreateContainer: unknown runtime handler %q", handler)
	}
	dir, err := s.checkpointStaging("restore")
	if err != nil {
		return nil, toStatus(err)
	}
	defer os.RemoveAll(dir)
	if err := checkpoint.ExtractArchive(archive, dir); err != nil {
		return nil, toStatus(err)
	}
	in, err := loadRestoreInput(dir, filepath.Base(rh.Config.Binary))
	if err != nil {
		return nil, toStatus(err)
	}
	restored, err := restoredConfig(cfg, in)
	if err != nil {
		return nil, toStatus(err)
	}
	if in.CRIU, err = s.criu.Usable(ctx); err != nil {
		return nil, toStatus(err)
	}
	c, err := s.createContainer(ctx, &runtime.CreateContainerRequest{
		PodSandboxId: req.GetPodSandboxId(), Config: restored, SandboxConfig: req.GetSandboxConfig(),
	}, in)
	if err != nil {
		return nil, err
	}
	s.log.Info("container restored from checkpoint archive", "pod", c.PodID, "container", c.ID, "archive", archive)
	return c, nil
}

// restoredConfig is the request's container config with what the
// checkpoint fixes taken from the checkpoint: the image (by ID), the
// process's arguments, working directory, environment and user.
// Metadata, labels, mounts, resources and the rest stay the request's;
// restoreInput.check then compares the built spec with the checkpoint's.
func restoredConfig(cfg *runtime.ContainerConfig, in *restoreInput) (*runtime.ContainerConfig, error) {
	p := in.spec.Process
	if p == nil || len(p.Args) == 0 {
		return nil, invalidArgument("CreateContainer: checkpoint %q has no process", in.config.Name)
	}
	ref := in.config.RootfsImageRef
	if ref == "" {
		ref = in.config.RootfsImageName
	}
	if ref == "" {
		ref = in.config.RootfsImage
	}
	if ref == "" {
		return nil, invalidArgument("CreateContainer: checkpoint %q does not name its image", in.config.Name)
	}
	out := proto.Clone(cfg).(*runtime.ContainerConfig)
	out.Image = &runtime.ImageSpec{Image: ref}
	out.Command, out.Args = append([]string{}, p.Args...), nil
	out.WorkingDir = p.Cwd
	out.Envs = nil
	for _, kv := range p.Env {
		k, v, _ := strings.Cut(kv, "=")
		out.Envs = append(out.Envs, &runtime.KeyValue{Key: k, Value: []byte(v)})
	}
	if out.Linux == nil {
		out.Linux = &runtime.LinuxContainerConfig{}
	}
	if out.Linux.SecurityContext == nil {
		out.Linux.SecurityContext = &runtime.LinuxContainerSecurityContext{}
	}
	sc := out.Linux.SecurityContext
	sc.RunAsUsername = ""
	sc.RunAsUser = &runtime.Int64Value{Value: int64(p.User.UID)}
	sc.RunAsGroup = &runtime.Int64Value{Value: int64(p.User.GID)}
	return out, nil
}
