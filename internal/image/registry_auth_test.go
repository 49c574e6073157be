package image

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berthcri/berth/internal/errdefs"
)

func TestServerAddressHost(t *testing.T) {
	for _, tc := range []struct {
		in, want string // want "" means refused
	}{
		{"registry.example.com", "registry.example.com"},
		{"Registry.Example.com:5000", "registry.example.com:5000"},
		{"https://registry.example.com/v2/", "registry.example.com"},
		{"http://127.0.0.1:5000", "127.0.0.1:5000"},
		{"https://index.docker.io/v1/", "docker.io"},
		{"docker.io", "docker.io"},
		{"registry-1.docker.io", "docker.io"},
		{"[::1]:5000", "[::1]:5000"},
		{"https://alice:s3cret@registry.example.com", ""},
		{"ftp://registry.example.com", ""},
		{"https://", ""},
		{"exa mple.com", ""},
		{"://x", ""},
	} {
		got, err := ServerAddressHost(tc.in)
		if tc.want == "" {
			if err == nil || !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("ServerAddressHost(%q) = %q, %v; want InvalidArgument", tc.in, got, err)
			}
			if err != nil && strings.Contains(err.Error(), "s3cret") {
				t.Errorf("ServerAddressHost(%q): the error shows the secret: %v", tc.in, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ServerAddressHost(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

// Which endpoint of a pull gets the pull's credentials: the registry's
// own host (the upstream, whatever hosts.toml's server says), a mirror
// only when it opts in with credential_domain for that registry, and the
// host server_address names.
func TestAuthForEndpoint(t *testing.T) {
	creds := func(server string) *Auth { return &Auth{Username: "alice", Password: "s3cret", ServerAddress: server} }
	upstream := endpoint{host: "registry.example.com", upstream: true}
	hubUpstream := endpoint{host: "registry-1.docker.io", upstream: true}
	mirror := endpoint{host: "mirror.example.com", ns: "registry.example.com"}
	optedIn := endpoint{host: "mirror.example.com", ns: "registry.example.com", credentialDomain: "registry.example.com"}
	optedInElse := endpoint{host: "mirror.example.com", ns: "registry.example.com", credentialDomain: "quay.io"}
	for _, tc := range []struct {
		name   string
		auth   *Auth
		ep     endpoint
		domain string
		want   bool
	}{
		{"upstream, no server_address", creds(""), upstream, "registry.example.com", true},
		{"upstream, its server_address", creds("https://registry.example.com"), upstream, "registry.example.com", true},
		{"upstream, another registry's server_address", creds("quay.io"), upstream, "registry.example.com", false},
		{"mirror, no server_address", creds(""), mirror, "registry.example.com", false},
		{"mirror, the image registry's server_address", creds("registry.example.com"), mirror, "registry.example.com", false},
		{"mirror opted in", creds(""), optedIn, "registry.example.com", true},
		{"mirror opted in, server_address the registry", creds("registry.example.com"), optedIn, "registry.example.com", true},
		{"mirror opted in for another registry", creds(""), optedInElse, "registry.example.com", false},
		{"mirror opted in, server_address another registry", creds("quay.io"), optedIn, "registry.example.com", false},
		{"mirror named by server_address", creds("mirror.example.com"), mirror, "registry.example.com", true},
		{"hub upstream, keyring's index.docker.io", creds("https://index.docker.io/v1/"), hubUpstream, "docker.io", true},
		{"hub upstream, no server_address", creds(""), hubUpstream, "docker.io", true},
		{"server_address that does not parse", creds("https://alice:x@registry.example.com"), upstream, "registry.example.com", false},
		{"no credentials", &Auth{ServerAddress: "registry.example.com"}, upstream, "registry.example.com", false},
	} {
		got := tc.auth.forEndpoint(tc.ep, tc.domain) != nil
		if got != tc.want {
			t.Errorf("%s: credentials sent %v, want %v", tc.name, got, tc.want)
		}
	}
	var nilAuth *Auth
	if nilAuth.forEndpoint(upstream, "registry.example.com") != nil {
		t.Error("nil auth gave credentials")
	}
}

// Plain HTTP only for a loopback host without configuration, or where
// hosts.toml says http://. go-containerregistry would also use it for RFC
// 1918 addresses and *.localhost names (issue 34, finding 8).
func TestPlainHTTPOnlyForLoopbackOrConfigured(t *testing.T) {
	for _, tc := range []struct {
		host string
		http bool
	}{
		{"127.0.0.1:5000", true},
		{"127.0.0.2:5000", true},
		{"localhost:5000", true},
		{"localhost", true},
		{"[::1]:5000", true},
		{"10.0.0.1:5000", false},
		{"10.0.0.1", false},
		{"192.168.1.10:5000", false},
		{"172.16.0.1", false},
		{"foo.local", false},
		{"foo.local:5000", false},
		{"foo.localhost:5000", false},
		{"registry.localhost.example.com", false},
		{"127.0.0.1.nip.io", false},
		{"registry.example.com", false},
	} {
		eps, err := endpoints("", tc.host)
		if err != nil || len(eps) != 1 {
			t.Fatalf("endpoints(%s): %v %v", tc.host, eps, err)
		}
		if got := eps[0].plainHTTP(); got != tc.http {
			t.Errorf("%s: plain HTTP %v, want %v (endpoint %s)", tc.host, got, tc.http, eps[0])
		}
		if !tc.http && !strings.HasPrefix(eps[0].String(), "https://") {
			t.Errorf("%s: endpoint %s, want https", tc.host, eps[0])
		}
	}
	// Configured: the scheme the file names, private address or not.
	dir := t.TempDir()
	writeHosts(t, dir, "10.0.0.1:5000", `server = "http://10.0.0.1:5000"`)
	writeHosts(t, dir, "foo.local", `server = "foo.local"`)
	writeHosts(t, dir, "127.0.0.1:6000", `server = "https://127.0.0.1:6000"`)
	for host, want := range map[string]bool{"10.0.0.1:5000": true, "foo.local": false, "127.0.0.1:6000": false} {
		eps, err := endpoints(dir, host)
		if err != nil || len(eps) != 1 {
			t.Fatalf("endpoints(%s): %v %v", host, eps, err)
		}
		if got := eps[0].plainHTTP(); got != want {
			t.Errorf("configured %s: plain HTTP %v, want %v", host, got, want)
		}
	}
}

func TestHostsCredentialDomain(t *testing.T) {
	dir := t.TempDir()
	writeHosts(t, dir, "docker.io", `server = "https://registry-1.docker.io"
[host."https://trusted.example.com"]
  capabilities = ["pull", "resolve"]
  credential_domain = "index.docker.io"
[host."https://other.example.com"]
  capabilities = ["pull", "resolve"]
`)
	eps, err := endpoints(dir, "docker.io")
	if err != nil || len(eps) != 3 {
		t.Fatalf("endpoints: %v %v", eps, err)
	}
	if eps[0].credentialDomain != "docker.io" || eps[1].credentialDomain != "" {
		t.Errorf("credential domains %q, %q; want docker.io, none", eps[0].credentialDomain, eps[1].credentialDomain)
	}
	writeHosts(t, dir, "bad.example.com", `[host."https://m.example.com"]
  credential_domain = "https://u:p@x"
`)
	if _, err := endpoints(dir, "bad.example.com"); err == nil {
		t.Fatal("credential_domain with user information accepted")
	}
}

// A hosts.toml larger than maxHostsFileSize is refused before it is
// parsed.
func TestHostsFileSizeCap(t *testing.T) {
	dir := t.TempDir()
	big := "# " + strings.Repeat("x", maxHostsFileSize) + "\n"
	if err := os.MkdirAll(filepath.Join(dir, "big.example.com"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "big.example.com", "hosts.toml"), []byte(big), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := endpoints(dir, "big.example.com"); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Fatalf("oversized hosts.toml: %v, want refused", err)
	}
}
