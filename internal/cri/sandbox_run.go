package cri

import (
	"context"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/nri"
	"github.com/berthcri/berth/internal/sandbox"
)

// RunPodSandbox creates the pod's namespaces, files, cgroup and network.
// NRI plugins hear of the pod once it is set up and before it is READY and
// visible; a plugin error fails the call and undoes everything.
func (s *Service) RunPodSandbox(ctx context.Context, req *runtime.RunPodSandboxRequest) (*runtime.RunPodSandboxResponse, error) {
	cfg := req.GetConfig()
	if cfg == nil || cfg.GetMetadata() == nil {
		return nil, invalidArgument("RunPodSandbox: config with metadata is required")
	}
	var (
		block  *nri.SyncBlock
		hooked *sandbox.Sandbox
	)
	sb, err := s.sandboxes.Run(ctx, cfg, req.GetRuntimeHandler(), func(ctx context.Context, sb *sandbox.Sandbox) error {
		b, err := s.nri.RunPodSandbox(ctx, sb)
		block, hooked = b, sb
		return err
	})
	block.Unblock()
	if err != nil {
		if block != nil {
			// Plugins saw the pod, which is gone again.
			_ = s.nri.RemovePodSandbox(context.WithoutCancel(ctx), hooked)
		}
		return nil, toStatus(err)
	}
	return &runtime.RunPodSandboxResponse{PodSandboxId: sb.ID}, nil
}
