package doctor

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berthcri/berth/internal/config"
)

// mkTree makes dirs (relative to base) with their modes, parents first.
func mkTree(t *testing.T, base string, dirs map[string]os.FileMode) {
	t.Helper()
	for _, d := range []string{"root", "state", "root/containers", "root/sandboxes", "state/sandboxes",
		"root/containers/c1", "root/sandboxes/p1", "state/sandboxes/p1", "state/netns", "state/shims", "root/images"} {
		mode, ok := dirs[d]
		if !ok {
			mode = 0o700
		}
		p := filepath.Join(base, d)
		if err := os.MkdirAll(p, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
	}
}

// TestDoctorStateTree: a tree closed as decision 3400 closes it (0700, the
// ways to rootfs and pod dirs 0711, a user namespace container's dir 0710)
// passes; what an older berthd left (0711 container dirs and pins, 0755)
// or an operator opened warns.
func TestDoctorStateTree(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the tree must be root's")
	}
	for _, tc := range []struct {
		name  string
		modes map[string]os.FileMode
		warn  string
	}{
		{"all 0700", nil, ""},
		{"decision 3400", map[string]os.FileMode{"root": 0o711, "state": 0o711, "root/containers": 0o711,
			"root/sandboxes": 0o711, "state/sandboxes": 0o711, "root/containers/c1": 0o710}, ""},
		{"older berthd", map[string]os.FileMode{"root": 0o711, "state": 0o711, "root/containers": 0o711,
			"root/containers/c1": 0o711, "state/netns": 0o711, "state/shims": 0o711}, "c1 is 0711"},
		{"root 0755", map[string]os.FileMode{"root": 0o755}, "root is 0755 (others may list"},
		{"images 0755", map[string]os.FileMode{"root/images": 0o755}, "images is 0755 (others may enter"},
		{"pod dir 0711", map[string]os.FileMode{"state/sandboxes/p1": 0o711}, "p1 is 0711"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := t.TempDir()
			mkTree(t, base, tc.modes)
			cfg := config.Default()
			cfg.Root, cfg.State = filepath.Join(base, "root"), filepath.Join(base, "state")
			r := checkStateTree(cfg)
			if tc.warn == "" {
				if r.Level != OK {
					t.Fatalf("%+v", r)
				}
				return
			}
			if r.Level != Warn || !strings.Contains(r.Message, tc.warn) || !strings.Contains(r.Hint, "decision 3400") {
				t.Fatalf("want a warning with %q: %+v", tc.warn, r)
			}
		})
	}
	cfg := config.Default()
	cfg.Root, cfg.State = filepath.Join(t.TempDir(), "none"), filepath.Join(t.TempDir(), "none")
	if r := checkStateTree(cfg); r.Level != OK || !strings.Contains(r.Message, "will be created") {
		t.Fatalf("missing tree: %+v", r)
	}
}

func TestDoctorStreaming(t *testing.T) {
	for _, tc := range []struct {
		addr, cert string
		level      Level
	}{
		{"127.0.0.1:0", "", OK},
		{"0.0.0.0:10010", "", Warn},
		{":10010", "", Warn},
		{"0.0.0.0:10010", "/etc/berth/s.crt", OK},
	} {
		cfg := config.Default()
		cfg.StreamingAddress, cfg.StreamingTLSCert = tc.addr, tc.cert
		if r := checkStreaming(cfg); r.Level != tc.level {
			t.Errorf("%s (cert %q): %+v, want %s", tc.addr, tc.cert, r, tc.level)
		}
	}
}

// TestDoctorMirrorPolicy: mirrors in certs.d with a policy that accepts
// anything (or none) warn; a policy that requires signatures for the
// mirrored registry, or no mirrors, does not.
func TestDoctorMirrorPolicy(t *testing.T) {
	const mirror = "server = \"https://registry.example.com\"\n[host.\"https://mirror.example.net\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
	const acceptAll = `{"default":[{"type":"insecureAcceptAnything"}]}`
	const reject = `{"default":[{"type":"insecureAcceptAnything"}],"transports":{"docker":{"registry.example.com":[{"type":"reject"}]}}}`
	for _, tc := range []struct {
		name          string
		hosts, policy map[string]string
		level         Level
		want          string
	}{
		{"no policy, no mirrors", nil, nil, OK, "no policy file"},
		{"no policy, mirror", map[string]string{"registry.example.com": mirror}, nil, Warn, "registry.example.com (no policy)"},
		{"accept anything, mirror", map[string]string{"registry.example.com": mirror}, map[string]string{"policy.json": acceptAll}, Warn, "registry.example.com (default)"},
		{"accept anything, _default mirror", map[string]string{"_default": mirror}, map[string]string{"policy.json": acceptAll}, Warn, "_default"},
		{"mirrored registry covered", map[string]string{"registry.example.com": mirror}, map[string]string{"policy.json": reject}, OK, "require signatures"},
		{"hosts.toml without mirrors", map[string]string{"registry.example.com": "server = \"https://registry.example.com\"\n"}, map[string]string{"policy.json": acceptAll}, OK, "using"},
		{"port spelling", map[string]string{"registry.example.com_5000_": mirror}, map[string]string{"policy.json": acceptAll}, Warn, "registry.example.com:5000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			cfg := config.Default()
			cfg.RegistryConfigDir = filepath.Join(dir, "certs.d")
			cfg.SignaturePolicy = filepath.Join(dir, "policy.json")
			for reg, content := range tc.hosts {
				if err := os.MkdirAll(filepath.Join(cfg.RegistryConfigDir, reg), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(cfg.RegistryConfigDir, reg, "hosts.toml"), []byte(content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			for name, content := range tc.policy {
				if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			r := checkMirrorPolicy(cfg)
			if r.Level != tc.level || !strings.Contains(r.Message, tc.want) {
				t.Fatalf("%+v, want %s with %q", r, tc.level, tc.want)
			}
		})
	}
}
