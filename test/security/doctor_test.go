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

// doctorBerthctl is the berthctl binary: BERTH_BIN_DIR's, or one built
// for the test.
func doctorBerthctl(t *testing.T) string {
	t.Helper()
	if dir := os.Getenv("BERTH_BIN_DIR"); dir != "" {
		return filepath.Join(dir, "berthctl")
	}
	p, err := berthdtest.BuildCommand(t.TempDir(), "berthctl")
	if err != nil {
		t.Fatalf("build berthctl: %v", err)
	}
	return p
}

// TestDoctorWarnsAboutAnInsecureSetup runs a berthd the way an operator
// should not: the streaming server on every interface without TLS, and a
// registry mirror in certs.d with no signature policy (a mirror can then
// serve any image under the registry's name). berthd warns about the
// first at start; berthctl doctor warns about both, and still exits 0
// (they are warnings: berthd works).
func TestDoctorWarnsAboutAnInsecureSetup(t *testing.T) {
	d := berthdtest.Start(t, berthdtest.Options{Configure: func(c *config.Config) {
		c.StreamingAddress = "0.0.0.0:0"
	}})
	mirror := filepath.Join(d.Config.RegistryConfigDir, "registry.example.com")
	if err := os.MkdirAll(mirror, 0o755); err != nil {
		t.Fatal(err)
	}
	hosts := "server = \"https://registry.example.com\"\n[host.\"https://mirror.example.net\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
	if err := os.WriteFile(filepath.Join(mirror, "hosts.toml"), []byte(hosts), 0o644); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(d.Logs(), "beyond loopback without TLS") {
		t.Errorf("berthd did not warn about its streaming server on 0.0.0.0 without TLS")
	}
	out, err := exec.Command(doctorBerthctl(t), "--config", d.ConfigPath, "doctor").CombinedOutput()
	t.Logf("doctor:\n%s", out)
	if err != nil {
		t.Errorf("doctor: %v", err)
	}
	for _, want := range []string{"warn  streaming", "0.0.0.0:0 listens beyond loopback without TLS",
		"warn  signature policy", "registry.example.com (no policy)", "state tree"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("doctor output lacks %q", want)
		}
	}
}
