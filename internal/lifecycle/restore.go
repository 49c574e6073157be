package lifecycle

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/proto"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/checkpoint"
	"github.com/berthcri/berth/internal/container"
	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/sandbox"
)

// RestorePodRequest is a pod to make again from a CheckpointPod
// checkpoint.
type RestorePodRequest struct {
	// Path is the checkpoint's directory; it is only read.
	Path           string
	Config         *runtime.PodSandboxConfig
	RuntimeHandler string
	// Containers are matched with the checkpoint's by metadata name;
	// their PodID is the new pod's.
	Containers []CreateRequest
}

// RestorePod makes a new pod from the request's config and, for each
// container, a container restored from the checkpoint, matched by
// metadata name. Every container is returned CREATED with no process:
// its start restores the checkpointed processes (runc restore, in the
// pod's place on the node's monitor). On any error everything made is removed.
func (s *Service) RestorePod(ctx context.Context, req RestorePodRequest) (_ *sandbox.Sandbox, _ []*container.Container, retErr error) {
	live := s.opts.Live.Load()
	handler, rh, ok := live.ResolveHandler(req.RuntimeHandler)
	if !ok {
		return nil, nil, invalid("RestorePod: unknown runtime handler %q", handler)
	}
	var m checkpoint.PodManifest
	if err := checkpoint.ReadJSON(req.Path, checkpoint.PodDump, &m); err != nil {
		return nil, nil, err
	}
	if m.Version != checkpoint.PodManifestVersion || m.Runtime != "berth" {
		return nil, nil, invalid("RestorePod: %s is not a berth pod checkpoint of version %d", req.Path, checkpoint.PodManifestVersion)
	}
	inputs, err := restoreInputs(req.Path, &m, req.Containers, filepath.Base(rh.Config.Binary))
	if err != nil {
		return nil, nil, err
	}
	criu, err := s.opts.CRIU.Usable(ctx)
	if err != nil {
		return nil, nil, err
	}
	sb, err := s.RunPod(ctx, req.Config, req.RuntimeHandler)
	if err != nil {
		return nil, nil, err
	}
	defer func() {
		if retErr != nil {
			s.undoRestore(ctx, sb.ID)
		}
	}()
	var restored []*container.Container
	for i, cr := range req.Containers {
		in := inputs[i]
		in.CRIU = criu
		cr.PodID, cr.SandboxConfig = sb.ID, req.Config
		c, err := s.create(ctx, cr, in)
		if err != nil {
			return nil, nil, err
		}
		restored = append(restored, c)
	}
	s.log.Info("pod restored", "pod", sb.ID, "from", req.Path, "containers", len(restored))
	return sb, restored, nil
}

// undoRestore removes the pod a failed RestorePod made, with its
// containers.
func (s *Service) undoRestore(ctx context.Context, podID string) {
	ctx = context.WithoutCancel(ctx)
	if err := s.StopPod(ctx, podID); err != nil {
		s.log.Error("stop the pod of a failed restore", "pod", podID, "err", err)
	}
	if err := s.RemovePod(ctx, podID); err != nil {
		s.log.Error("remove the pod of a failed restore", "pod", podID, "err", err)
	}
}

// restoreInputs matches the container configs with the checkpoint's
// containers by metadata name: the names must be unique and exactly the
// checkpoint's. The handler's runtime must be the one that checkpointed.
func restoreInputs(path string, m *checkpoint.PodManifest, reqs []CreateRequest, runtimeName string) ([]*restoreInput, error) {
	want := map[string]bool{}
	for _, c := range m.Containers {
		want[c.Name] = true
	}
	got := map[string]bool{}
	var inputs []*restoreInput
	for _, r := range reqs {
		cfg := r.Config
		name := cfg.GetMetadata().GetName()
		switch {
		case name == "":
			return nil, invalid("RestorePod: every container config needs a metadata name")
		case got[name]:
			return nil, invalid("RestorePod: container name %q is given twice", name)
		case !want[name]:
			return nil, invalid("RestorePod: the checkpoint has no container %q", name)
		case cfg.GetTty():
			return nil, invalid("RestorePod: container %q asks for a terminal, which a checkpoint cannot have", name)
		}
		got[name] = true
		in, err := loadRestoreInput(filepath.Join(path, name), runtimeName)
		if err != nil {
			return nil, fmt.Errorf("RestorePod: %w", err)
		}
		inputs = append(inputs, in)
	}
	if len(got) != len(want) {
		var missing []string
		for n := range want {
			if !got[n] {
				missing = append(missing, n)
			}
		}
		slices.Sort(missing)
		return nil, invalid("RestorePod: no container config for checkpointed containers %q", missing)
	}
	return inputs, nil
}

// CheckpointArchive is the config's image when it names a local file,
// which CreateContainer then takes for a CheckpointContainer archive to
// restore (CRI-O's rule for KEP-2008's restore through CreateContainer);
// "" for an ordinary image reference.
func CheckpointArchive(cfg *runtime.ContainerConfig) string {
	img := cfg.GetImage().GetImage()
	if !filepath.IsAbs(img) {
		return ""
	}
	if fi, err := os.Stat(img); err != nil || !fi.Mode().IsRegular() {
		return ""
	}
	return img
}

// CreateFromArchive is CreateContainer restoring one container from a
// CheckpointContainer archive: the archive is unpacked into a private
// directory, its image, command, working directory, environment and user
// replace the request's, and the container is created as RestorePod
// creates each of its containers, so its start runs runc restore. The
// unpacked directory goes when this returns (the container keeps its own
// copy of the CRIU images); a failed create undoes itself.
func (s *Service) CreateFromArchive(ctx context.Context, req CreateRequest, archive string) (*container.Container, error) {
	cfg := req.Config
	switch {
	case req.PodID == "":
		return nil, invalid("CreateContainer: pod_sandbox_id is required")
	case cfg.GetMetadata().GetName() == "":
		return nil, invalid("CreateContainer: config with metadata.name is required")
	case cfg.GetTty():
		return nil, invalid("CreateContainer: a container restored from checkpoint %s cannot have a terminal", archive)
	}
	if !checkpoint.IsArchive(archive) {
		return nil, invalid("CreateContainer: image %q is a file but not a container checkpoint archive (a tar with %s and %s)",
			archive, checkpoint.ConfigDump, checkpoint.SpecDump)
	}
	sb, err := s.sandboxes.Get(req.PodID)
	if err != nil {
		return nil, err
	}
	live := s.opts.Live.Load()
	handler, rh, ok := live.ResolveHandler(sb.RuntimeHandler)
	if !ok {
		return nil, invalid("CreateContainer: unknown runtime handler %q", handler)
	}
	dir, err := s.checkpointStaging("restore")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	if err := checkpoint.ExtractArchive(archive, dir); err != nil {
		return nil, err
	}
	in, err := loadRestoreInput(dir, filepath.Base(rh.Config.Binary))
	if err != nil {
		return nil, err
	}
	if req.Config, err = restoredConfig(cfg, in); err != nil {
		return nil, err
	}
	if in.CRIU, err = s.opts.CRIU.Usable(ctx); err != nil {
		return nil, err
	}
	c, err := s.create(ctx, req, in)
	if err != nil {
		return nil, err
	}
	s.log.Info("container restored from checkpoint archive", "pod", c.PodID, "container", c.ID, "archive", archive)
	return c, nil
}

// restoredConfig is the request's container config with what the
// checkpoint fixes taken from the checkpoint: the image (by ID), the
// process's arguments, working directory and environment — which CRIU
// restores from its images anyway, whatever the spec says — as CRI-O's
// restore does. The identity is the request's (issue 34, finding 9): the
// kubelet (runAsNonRoot) and admission (the pod security standards)
// decided on the request's RunAsUser and RunAsGroup, so an archive whose
// process runs as another user or group is refused; only a field the
// request leaves unset is taken from the archive. Metadata, labels, mounts, resources and
// the rest stay the request's; restoreInput.check then compares the built
// spec with the checkpoint's.
func restoredConfig(cfg *runtime.ContainerConfig, in *restoreInput) (*runtime.ContainerConfig, error) {
	p := in.spec.Process
	if p == nil || len(p.Args) == 0 {
		return nil, invalid("CreateContainer: checkpoint %q has no process", in.config.Name)
	}
	ref := in.config.RootfsImageRef
	if ref == "" {
		ref = in.config.RootfsImageName
	}
	if ref == "" {
		ref = in.config.RootfsImage
	}
	if ref == "" {
		return nil, invalid("CreateContainer: checkpoint %q does not name its image", in.config.Name)
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
	uid, gid := int64(p.User.UID), int64(p.User.GID)
	switch {
	case sc.RunAsUser != nil && sc.RunAsUser.Value != uid:
		return nil, invalid("CreateContainer: checkpoint %q runs as uid %d, the request's runAsUser is %d", in.config.Name, uid, sc.RunAsUser.Value)
	case sc.RunAsGroup != nil && sc.RunAsGroup.Value != gid:
		return nil, invalid("CreateContainer: checkpoint %q runs as gid %d, the request's runAsGroup is %d", in.config.Name, gid, sc.RunAsGroup.Value)
	}
	if sc.RunAsUsername == "" {
		// A user name is resolved in the image when the spec is built;
		// restoreInput.check then holds the uid to the checkpoint's.
		sc.RunAsUser = &runtime.Int64Value{Value: uid}
	}
	if sc.RunAsGroup == nil {
		sc.RunAsGroup = &runtime.Int64Value{Value: gid}
	}
	return out, nil
}

// loadRestoreInput reads one container checkpoint directory (config.dump
// and spec.dump); the handler's runtime must be the one that
// checkpointed.
func loadRestoreInput(dir, runtimeName string) (*restoreInput, error) {
	in := &restoreInput{Restore: container.Restore{Dir: dir}}
	if err := checkpoint.ReadJSON(in.Dir, checkpoint.ConfigDump, &in.config); err != nil {
		return nil, err
	}
	if err := checkpoint.ReadJSON(in.Dir, checkpoint.SpecDump, &in.spec); err != nil {
		return nil, err
	}
	if in.config.OCIRuntime != "" && in.config.OCIRuntime != runtimeName {
		return nil, fmt.Errorf("container %q was checkpointed by %s, the handler runs %s: %w",
			in.config.Name, in.config.OCIRuntime, runtimeName, errdefs.ErrFailedPrecondition)
	}
	return in, nil
}

// restoreInput is one restored container: its checkpoint and what the
// checkpoint says it was.
type restoreInput struct {
	container.Restore
	config checkpoint.ContainerConfig
	spec   specs.Spec
}

// check compares the restore-time container with the checkpointed one:
// the same image, the same process (arguments, working directory,
// environment, credentials), and the same mount points, which CRIU needs
// to find again. Anything else the restore-time config may change.
func (in *restoreInput) check(d *container.Draft, spec *specs.Spec) error {
	name := in.config.Name
	if in.config.RootfsImageRef != "" && d.Image.ID != in.config.RootfsImageRef {
		return fmt.Errorf("container %q: image %s is not the checkpointed image %s: %w", name, d.Image.ID, in.config.RootfsImageRef, errdefs.ErrInvalidArgument)
	}
	was, is := in.spec.Process, spec.Process
	if was == nil || is == nil {
		return fmt.Errorf("container %q: checkpoint without a process: %w", name, errdefs.ErrInvalidArgument)
	}
	switch {
	case !slices.Equal(was.Args, is.Args):
		return fmt.Errorf("container %q: command %q is not the checkpointed %q: %w", name, is.Args, was.Args, errdefs.ErrInvalidArgument)
	case was.Cwd != is.Cwd:
		return fmt.Errorf("container %q: working directory %q is not the checkpointed %q: %w", name, is.Cwd, was.Cwd, errdefs.ErrInvalidArgument)
	case !slices.Equal(was.Env, is.Env):
		return fmt.Errorf("container %q: environment differs from the checkpointed one (%q, not %q): %w",
			name, envDiff(is.Env, was.Env), envDiff(was.Env, is.Env), errdefs.ErrInvalidArgument)
	case was.User.UID != is.User.UID || was.User.GID != is.User.GID || !slices.Equal(was.User.AdditionalGids, is.User.AdditionalGids):
		return fmt.Errorf("container %q: user %d:%d is not the checkpointed %d:%d: %w", name, is.User.UID, is.User.GID, was.User.UID, was.User.GID, errdefs.ErrInvalidArgument)
	}
	if w, i := mountPoints(&in.spec), mountPoints(spec); !slices.Equal(w, i) {
		return fmt.Errorf("container %q: mount points %q are not the checkpointed %q: %w", name, i, w, errdefs.ErrFailedPrecondition)
	}
	return nil
}

func mountPoints(spec *specs.Spec) []string {
	var out []string
	for _, m := range spec.Mounts {
		out = append(out, m.Destination)
	}
	slices.Sort(out)
	return out
}

// envDiff lists the entries of a missing from b.
func envDiff(a, b []string) []string {
	var out []string
	for _, v := range a {
		if !slices.Contains(b, v) {
			out = append(out, v)
		}
	}
	return out
}
