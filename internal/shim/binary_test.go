package shim_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/berthcri/berth/internal/shim"
)

// The test binary has no berth-shim beside it, so Binary falls back to
// PATH, then to the bare name.
func TestBinaryBesideTheExecutableThenPath(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(exe), "berth-shim")); err == nil {
		t.Skip("a berth-shim lies beside the test binary")
	}
	dir := t.TempDir()
	t.Setenv("PATH", dir)
	if got := shim.Binary(); got != "berth-shim" {
		t.Fatalf("Binary() with none installed = %q, want the bare name", got)
	}
	p := filepath.Join(dir, "berth-shim")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got := shim.Binary(); got != p {
		t.Fatalf("Binary() = %q, want %q from PATH", got, p)
	}
}
