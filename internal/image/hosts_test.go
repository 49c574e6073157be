package image

import (
	"net/http"
	"os"
	"path/filepath"
	goruntime "runtime"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/berthcri/berth/internal/errdefs"
)

func writeHosts(t *testing.T, dir, ns, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(dir, ns), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, ns, "hosts.toml"), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestEndpointsFollowHostsTomlOrder(t *testing.T) {
	dir := t.TempDir()
	writeHosts(t, dir, "docker.io", `server = "https://docker.io"

[host."https://z-mirror.example.com/v2/hub"]
  capabilities = ["pull"]
  override_path = true
  skip_verify = true
  dial_timeout = "2s"

[host."http://127.0.0.1:5000"]
  capabilities = ["pull", "resolve"]
  [host."http://127.0.0.1:5000".header]
    x-test = ["a", "b"]

[host."https://a-mirror.example.com/prefix"]
`)
	eps, err := endpoints(dir, "docker.io")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"https://z-mirror.example.com/v2/hub",
		"http://127.0.0.1:5000/v2",
		"https://a-mirror.example.com/prefix/v2",
		"https://registry-1.docker.io/v2",
	}
	if len(eps) != len(want) {
		t.Fatalf("endpoints %v", eps)
	}
	for i, ep := range eps {
		if ep.String() != want[i] {
			t.Errorf("endpoint %d = %s, want %s", i, ep, want[i])
		}
	}
	if !eps[0].pull || eps[0].resolve || !eps[0].skipVerify || eps[0].dialTimeout.Seconds() != 2 || eps[0].ns != "docker.io" {
		t.Errorf("first host: %+v", eps[0])
	}
	if !eps[1].resolve || len(eps[1].header["X-Test"]) != 2 {
		t.Errorf("second host: %+v", eps[1])
	}
	if !eps[2].pull || !eps[2].resolve || !eps[3].upstream || eps[3].ns != "" {
		t.Errorf("defaults: %+v %+v", eps[2], eps[3])
	}
}

func TestEndpointsNamespaceLookup(t *testing.T) {
	dir := t.TempDir()
	writeHosts(t, dir, "_default", `[host."http://mirror.local"]`)
	writeHosts(t, dir, "reg.example.com_5000_", `server = "http://reg.example.com:5000"`)
	eps, err := endpoints(dir, "quay.io")
	if err != nil {
		t.Fatal(err)
	}
	if len(eps) != 2 || eps[0].String() != "http://mirror.local/v2" || eps[1].String() != "https://quay.io/v2" {
		t.Fatalf("_default: %v", eps)
	}
	eps, err = endpoints(dir, "reg.example.com:5000")
	if err != nil {
		t.Fatal(err)
	}
	if len(eps) != 1 || eps[0].String() != "http://reg.example.com:5000/v2" {
		t.Fatalf("host_port_ dir: %v", eps)
	}
	eps, err = endpoints("", "docker.io")
	if err != nil || len(eps) != 1 || eps[0].host != "registry-1.docker.io" || eps[0].plainHTTP() {
		t.Fatalf("no config: %v %v", eps, err)
	}
	writeHosts(t, dir, "bad.example.com", `[host."ftp://x"]`)
	if _, err := endpoints(dir, "bad.example.com"); err == nil {
		t.Fatal("ftp scheme accepted")
	}
}

func TestPickManifest(t *testing.T) {
	native := v1.Descriptor{MediaType: types.OCIManifestSchema1, Digest: v1.Hash{Algorithm: "sha256", Hex: "aa"}, Platform: &v1.Platform{OS: "linux", Architecture: goruntime.GOARCH}}
	other := v1.Descriptor{MediaType: types.OCIManifestSchema1, Digest: v1.Hash{Algorithm: "sha256", Hex: "bb"}, Platform: &v1.Platform{OS: "linux", Architecture: "mips64le"}}
	attestation := v1.Descriptor{MediaType: types.OCIManifestSchema1, Digest: v1.Hash{Algorithm: "sha256", Hex: "cc"}, Platform: &v1.Platform{OS: "unknown", Architecture: "unknown"}}
	bare := v1.Descriptor{MediaType: types.OCIManifestSchema1, Digest: v1.Hash{Algorithm: "sha256", Hex: "dd"}}
	for name, tc := range map[string]struct {
		manifests []v1.Descriptor
		want      string // digest hex, "" for an error
	}{
		"native among others":        {[]v1.Descriptor{other, attestation, native}, "aa"},
		"only another arch":          {[]v1.Descriptor{other}, ""},
		"other arch and attestation": {[]v1.Descriptor{other, attestation}, ""},
		"only manifest, no platform": {[]v1.Descriptor{bare}, "dd"},
		"two without platform":       {[]v1.Descriptor{bare, bare}, ""},
	} {
		got, err := pickManifest(&v1.IndexManifest{Manifests: tc.manifests})
		if tc.want == "" {
			if err == nil || !errdefs.IsNotFound(err) {
				t.Errorf("%s: picked %v, %v; want NotFound", name, got.Digest, err)
			}
			continue
		}
		if err != nil || got.Digest.Hex != tc.want {
			t.Errorf("%s: picked %v, %v; want %s", name, got.Digest, err, tc.want)
		}
	}
}

type cleartextProbeRoundTripper struct{ got []string }

func (r *cleartextProbeRoundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	r.got = append(r.got, req.Method+" "+req.URL.String())
	return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody, Request: req}, nil
}

// TestEndpointTransportNoCleartextCredentials: for a registry reached
// over TLS, no request to another host (a token realm, a redirect) goes
// over plain HTTP with credentials (CVE-2019-10214); plain GETs without
// them (blob storage) and a registry configured for HTTP are left alone.
func TestEndpointTransportNoCleartextCredentials(t *testing.T) {
	for _, tc := range []struct {
		name   string
		scheme string // the endpoint's
		method string
		url    string
		auth   string
		sent   bool
	}{
		{"basic auth to an http realm", "https", http.MethodGet, "http://token.example/token", "Basic YWxpY2U6czNjcmV0", false},
		{"oauth form to an http realm", "https", http.MethodPost, "http://token.example/token", "", false},
		{"basic auth to an https realm", "https", http.MethodGet, "https://token.example/token", "Basic YWxpY2U6czNjcmV0", true},
		{"anonymous GET to http blob storage", "https", http.MethodGet, "http://cdn.example/blob", "", true},
		{"registry configured for http", "http", http.MethodGet, "http://token.example/token", "Basic YWxpY2U6czNjcmV0", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := &cleartextProbeRoundTripper{}
			tr := &endpointTransport{ep: endpoint{scheme: tc.scheme, host: "registry.example", path: "/v2"}, base: base}
			req, err := http.NewRequest(tc.method, tc.url, nil)
			if err != nil {
				t.Fatal(err)
			}
			if tc.auth != "" {
				req.Header.Set("Authorization", tc.auth)
			}
			resp, err := tr.RoundTrip(req)
			if resp != nil {
				resp.Body.Close()
			}
			if sent := len(base.got) > 0; sent != tc.sent || (err == nil) != tc.sent {
				t.Fatalf("sent %v (err %v), want sent %v", base.got, err, tc.sent)
			}
		})
	}
}
