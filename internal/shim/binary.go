package shim

import (
	"os"
	"os/exec"
	"path/filepath"
)

// Binary finds berth-shim: next to the running executable first (a
// release ships them together), then in PATH; the bare name when neither
// has it, so Launch's error names what is missing.
func Binary() string {
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
