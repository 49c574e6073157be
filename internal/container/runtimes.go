package container

import (
	"os"
	"os/exec"
	"path/filepath"

	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/oci"
)

// Runtimes builds the handler table from the config: each handler's
// runtime gets its own --root under <state>/runtime/<handler>/ unless the
// config names one.
func Runtimes(cfg *config.Config) map[string]*oci.Runtime {
	out := make(map[string]*oci.Runtime, len(cfg.RuntimeHandlers))
	for name, h := range cfg.RuntimeHandlers {
		root := h.Root
		if root == "" {
			root = filepath.Join(cfg.State, "runtime", name)
		}
		out[name] = oci.New(h.Binary, root, h.Options)
	}
	return out
}

// ShimBinary finds berth-shim: next to the running executable first (a
// release ships them together), then in PATH.
func ShimBinary() string {
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), "berth-shim")
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if p, err := exec.LookPath("berth-shim"); err == nil {
		return p
	}
	return "berth-shim"
}
