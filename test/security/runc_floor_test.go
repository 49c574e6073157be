package security

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
)

// TestRuncVersionFloorWarns runs berthd on a runc that says it is 1.1.11
// (a wrapper that passes every other command to the node's runtime): the
// runtime's own CVEs (CVE-2024-21626 "Leaky Vessels", fixed in 1.1.12,
// and the later ones) are closed only by the host's runc, so berthd warns
// at start and berthctl doctor warns naming them — a warning, doctor
// still exits 0. The same wrapper saying 1.5.1 gets no warning.
func TestRuncVersionFloorWarns(t *testing.T) {
	dir := t.TempDir()
	version := filepath.Join(dir, "version")
	setVersion := func(v string) {
		t.Helper()
		if err := os.WriteFile(version, []byte("runc version "+v+"\ncommit: v"+v+"-0-gdeadbee\nspec: 1.0.2-dev\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	setVersion("1.1.11")
	wrapper := filepath.Join(dir, "runc")
	var handler string
	d := berthdtest.Start(t, berthdtest.Options{Configure: func(c *config.Config) {
		handler = c.DefaultRuntimeHandler
		if handler == "" {
			handler = config.DefaultRuntimeHandler
		}
		binary := c.Runtime // the lane's runtime, else the default
		if h, ok := c.RuntimeHandlers[handler]; ok && h.Binary != "" {
			binary = h.Binary
		}
		real, err := exec.LookPath(binary)
		if err != nil {
			t.Fatalf("the node's runtime: %v", err)
		}
		script := "#!/bin/sh\nif [ \"$1\" = --version ]; then exec cat '" + version + "'; fi\nexec '" + real + "' \"$@\"\n"
		if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
		h := c.RuntimeHandlers[handler] // keeps the lane's oci_version
		h.Binary = wrapper
		c.RuntimeHandlers[handler] = h
		c.DefaultRuntimeHandler, c.Runtime = handler, wrapper
	}})
	if logs := d.Logs(); !strings.Contains(logs, "CVE-2024-21626") || !strings.Contains(logs, "runc 1.1.11") {
		t.Errorf("berthd did not warn at start that runc 1.1.11 predates the CVE-2024-21626 fix")
	}

	doctor := func() string {
		t.Helper()
		out, err := exec.Command(doctorBerthctl(t), "--config", d.ConfigPath, "doctor").CombinedOutput()
		t.Logf("doctor:\n%s", out)
		if err != nil {
			t.Errorf("doctor: %v (a runtime version warning must not fail it)", err)
		}
		return string(out)
	}
	out := doctor()
	line := "warn  runtime " + handler + " version"
	for _, want := range []string{line, "runc 1.1.11", "CVE-2024-21626", "1.1.12", "CVE-2025-31133", "CVE-2025-52565", "CVE-2025-52881", "CVE-2026-41579"} {
		if !strings.Contains(out, want) {
			t.Errorf("doctor with runc 1.1.11 lacks %q", want)
		}
	}

	setVersion("1.5.1")
	out = doctor()
	if strings.Contains(out, line) || strings.Contains(out, "CVE-2024-21626") {
		t.Errorf("doctor warns about runc 1.5.1, which has every fix")
	}
	if !strings.Contains(out, "ok    runtime "+handler) {
		t.Errorf("doctor does not show the runtime line for runc 1.5.1")
	}
}
