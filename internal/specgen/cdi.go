package specgen

import (
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/berthcri/berth/internal/cdi"
)

// applyCDI injects the container's CDI devices: their device nodes (with
// cgroup rules), mounts, env and hooks, as their specs define them.
func applyCDI(in *Input, s *specs.Spec) error {
	devices, err := cdi.Requested(in.Config)
	if err != nil || len(devices) == 0 {
		return err
	}
	if in.CDI == nil {
		return invalid("CDI devices %v requested but CDI is not configured", devices)
	}
	return in.CDI.Inject(s, devices)
}
