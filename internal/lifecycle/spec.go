package lifecycle

import (
	"fmt"
	"strconv"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/container"
	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/liveconfig"
	"github.com/berthcri/berth/internal/sandbox"
	"github.com/berthcri/berth/internal/specgen"
)

// containerSpec builds the OCI spec of a prepared container.
func (s *Service) containerSpec(sb *sandbox.Sandbox, sbCfg *runtime.PodSandboxConfig, handler *liveconfig.Handler, cfg *runtime.ContainerConfig, draft *container.Draft) (*specs.Spec, error) {
	in := specgen.Input{
		ContainerID:    draft.ID,
		Config:         cfg,
		SandboxConfig:  sbCfg,
		Image:          draft.Image.Config,
		RootfsPath:     draft.Rootfs.Path,
		ImageVolumes:   draft.Rootfs.Volumes,
		IDMappedMounts: draft.Rootfs.IDMapped,
		Pod: specgen.Pod{
			ID: sb.ID, NetNSPath: sb.NetNSPath, IPCNSPath: sb.IPCNSPath, UTSNSPath: sb.UTSNSPath,
			PIDNSPath: sb.PIDNSPath, CgroupParent: containerCgroupParent(sb),
			HostnamePath: sb.HostnamePath, HostsPath: sb.HostsPath, ResolvConfPath: sb.ResolvConfPath, ShmPath: sb.ShmPath,
			UserNSPath: sb.UserNSPath, UserNS: sb.UserNS,
		},
		CgroupDriver: s.opts.CgroupDriver,
		Rlimits:      s.opts.Rlimits,
		CDI:          s.opts.CDI,
		AppArmor:     s.opts.AppArmor,
		Logger:       s.log.With("pod", sb.ID, "container", draft.ID),
	}
	in.OOMScoreAdjFloor = s.opts.Host.OOMScoreAdj
	h := *s.opts.Host.Spec
	h.RecursiveReadOnly = handler.Features.RecursiveReadOnly
	in.Host = &h
	ns := cfg.GetLinux().GetSecurityContext().GetNamespaceOptions()
	if ns.GetPid() == runtime.NamespaceMode_TARGET {
		target, err := s.containers.Get(ns.GetTargetId())
		if err != nil {
			return nil, fmt.Errorf("pid namespace target: %w", err)
		}
		if target.State != container.StateRunning || target.Pid == 0 {
			return nil, fmt.Errorf("pid namespace target %s is not running: %w", target.ID, errdefs.ErrFailedPrecondition)
		}
		in.TargetPIDNSPath = "/proc/" + strconv.Itoa(target.Pid) + "/ns/pid"
	}
	spec, err := specgen.Build(in)
	if err != nil {
		return nil, err
	}
	if v := handler.Config.OCIVersion; v != "" {
		spec.Version = v
	}
	return spec, nil
}

// containerCgroupParent is what the container's cgroupsPath goes below:
// the pod slice under the systemd driver, the pod's directory otherwise.
func containerCgroupParent(sb *sandbox.Sandbox) string {
	if sb.CgroupUnit != "" {
		return sb.CgroupUnit
	}
	return sb.CgroupParent
}
