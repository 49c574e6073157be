package liveconfig

import (
	"path/filepath"
	"slices"

	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/oci"
)

// Runtimes builds the handler table from the config: each handler's
// runtime gets its own --root under <state>/runtime/<handler>/ unless the
// config names one. Under the systemd cgroup driver every handler also
// gets --systemd-cgroup: the pod slice and the containers' cgroupsPath
// (slice:berth:<id>) follow the daemon's driver, so a handler on the
// other driver could not place its containers in the pod.
func Runtimes(cfg *config.Config) map[string]*oci.Runtime {
	out := make(map[string]*oci.Runtime, len(cfg.RuntimeHandlers))
	for name, h := range cfg.RuntimeHandlers {
		out[name] = NewRuntime(cfg, name, h)
	}
	return out
}

// NewRuntime is the OCI runtime of one handler under cfg's state dir and
// cgroup driver (a handler a reload adds gets it too).
func NewRuntime(cfg *config.Config, name string, h config.RuntimeHandler) *oci.Runtime {
	root := h.Root
	if root == "" {
		root = filepath.Join(cfg.State, "runtime", name)
	}
	return oci.New(h.Binary, root, RuntimeOptions(cfg.CgroupDriver, h.Options))
}

// RuntimeOptions are a handler's global runtime arguments under the given
// cgroup driver: --systemd-cgroup is added for systemd (runc and crun both
// take it) unless the handler already lists it.
func RuntimeOptions(driver string, options []string) []string {
	out := append([]string(nil), options...)
	if driver != "systemd" || slices.Contains(out, "--systemd-cgroup") {
		return out
	}
	return append(out, "--systemd-cgroup")
}
