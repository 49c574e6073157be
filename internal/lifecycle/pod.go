package lifecycle

import (
	"context"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/sandbox"
	"github.com/berthcri/berth/internal/specgen"
)

// RunPod creates the pod's namespaces, files, cgroup and network. The
// hooks hear of the pod once it is set up and before it is READY and
// visible; a hook's error fails the run and undoes everything.
func (s *Service) RunPod(ctx context.Context, cfg *runtime.PodSandboxConfig, handler string) (*sandbox.Sandbox, error) {
	var (
		unblock func()
		hooked  *sandbox.Sandbox
	)
	sb, err := s.sandboxes.Run(ctx, cfg, handler, func(ctx context.Context, sb *sandbox.Sandbox) error {
		u, err := s.hooks.RunPodSandbox(ctx, sb)
		unblock, hooked = u, sb
		return err
	})
	if unblock != nil {
		unblock()
	}
	if err != nil {
		if unblock != nil {
			// The hooks saw the pod, which is gone again.
			_ = s.hooks.RemovePodSandbox(context.WithoutCancel(ctx), hooked)
		}
		return nil, err
	}
	return sb, nil
}

// StopPod stops the pod's containers, then tears down its network and
// namespaces. Stopping a stopped or unknown pod succeeds.
func (s *Service) StopPod(ctx context.Context, id string) error {
	// Containers first, as the kubelet expects: their grace is its
	// business, so they get the default of zero (SIGKILL) here.
	if sb, err := s.sandboxes.Get(id); err == nil {
		if err := s.containers.StopPod(ctx, sb.ID, 0); err != nil {
			return err
		}
		// A pod that never got a container needs its place on the monitor no
		// more (container.Store.WarmShim); one holding containers stays.
		if err := s.containers.ShutdownIdleShim(ctx, sb.ID); err != nil {
			return err
		}
		// Hooks: each container's stop, then the pod's, while the pod is
		// still there; the hooks relay the first StopPod only.
		s.stopPodHooks(ctx, sb)
	}
	err := s.sandboxes.Stop(ctx, id)
	if err != nil && !errdefs.IsNotFound(err) {
		return err
	}
	return nil
}

// stopPodHooks reports a pod's stop after its containers stopped: every
// container's stop first (the hooks skip those that exited on their own
// and were reported already), then the pod's. Errors are logged: a stop
// is not refused.
func (s *Service) stopPodHooks(ctx context.Context, sb *sandbox.Sandbox) {
	for _, c := range s.containers.ListPod(sb.ID) {
		s.logHook(s.hooks.StopContainer(ctx, c), sb.ID, c.ID)
	}
	if cur, err := s.sandboxes.Get(sb.ID); err == nil {
		sb = cur
	}
	s.logHook(s.hooks.StopPodSandbox(ctx, sb), sb.ID, "")
}

// RemovePod removes the pod's containers, stops the pod if it runs and
// deletes it. An unknown pod is not an error. When some containers
// cannot be removed, those that were are reported gone at once and the
// call fails; a retry removes the rest.
func (s *Service) RemovePod(ctx context.Context, id string) error {
	sb, err := s.sandboxes.Get(id)
	if err != nil {
		// Unknown, or a prefix of several: Remove answers as it should.
		return s.sandboxes.Remove(ctx, id)
	}
	removed, err := s.containers.RemovePod(ctx, sb.ID)
	for _, c := range removed {
		s.containerRemoved(ctx, c)
	}
	if err != nil {
		return err
	}
	// A pod that never got a container still has its place on the
	// monitor RunPod added it to (container.Store.WarmShim).
	if err := s.containers.ShutdownIdleShim(ctx, sb.ID); err != nil {
		return err
	}
	if err := s.sandboxes.Remove(ctx, sb.ID); err != nil {
		return err
	}
	s.opts.Forget(sb.ID)
	s.logHook(s.hooks.RemovePodSandbox(ctx, sb), sb.ID, "")
	return nil
}

// UpdatePodResources applies new pod-level limits to the pod's cgroup,
// the parent of all its containers' cgroups. The hooks hear of it first
// (and may refuse), then once applied. resources nil records only the
// overhead.
func (s *Service) UpdatePodResources(ctx context.Context, id string, overhead, resources *runtime.LinuxContainerResources) error {
	res := specgen.Resources(resources, s.opts.Host.Spec)
	sb, err := s.sandboxes.Get(id)
	if err != nil {
		return err
	}
	if err := s.hooks.UpdatePodSandbox(ctx, sb, overhead, resources); err != nil {
		return err
	}
	if err := s.sandboxes.UpdateResources(ctx, sb.ID, res, overhead, resources); err != nil {
		return err
	}
	if cur, err := s.sandboxes.Get(sb.ID); err == nil {
		s.hooks.PostUpdatePodSandbox(ctx, cur)
	}
	return nil
}
