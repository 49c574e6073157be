package security

import (
	"encoding/base64"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"google.golang.org/grpc/codes"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/testimages"
)

// Registry credentials (issue 34, finding 2, and the CVE-2020-15157
// class): the pull secret goes to the registry it belongs to, never to a
// mirror that has not opted in, never across a redirect, never to a
// manifest's foreign-layer URLs.

const (
	credsUser     = "alice"
	credsPassword = "s3cret"
)

// credsRegistry is an in-process registry on loopback that records the
// Authorization header of every request it gets, optionally demanding
// basic auth. Images are pushed through a second, unrecorded listener on
// the same storage.
type credsRegistry struct {
	Host string
	push string // host of the unrecorded listener

	mu       sync.Mutex
	auths    []string // "METHOD path: Authorization" of every request
	needAuth bool
	redirect string // when set, blob GETs are redirected to this base URL
}

func startCredsRegistry(t *testing.T, needAuth bool) *credsRegistry {
	t.Helper()
	inner := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	r := &credsRegistry{needAuth: needAuth}
	r.Host, r.push = serveFrontedRegistry(t, inner, http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		r.auths = append(r.auths, req.Method+" "+req.URL.Path+": "+req.Header.Get("Authorization"))
		redirect := r.redirect
		r.mu.Unlock()
		if r.needAuth {
			u, p, ok := req.BasicAuth()
			if !ok || u != credsUser || p != credsPassword {
				w.Header().Set("WWW-Authenticate", `Basic realm="berth-security"`)
				http.Error(w, "unauthorized", http.StatusUnauthorized)
				return
			}
		}
		if redirect != "" && req.Method == http.MethodGet && strings.Contains(req.URL.Path, "/blobs/sha256:") {
			http.Redirect(w, req, redirect+req.URL.Path, http.StatusTemporaryRedirect)
			return
		}
		inner.ServeHTTP(w, req)
	}))
	return r
}

// serveFrontedRegistry serves the registry inner on two loopback
// listeners: host through front (which records, refuses or redirects
// what berthd asks, and passes the rest to inner), push unwrapped, for
// the test to store its images through. It returns both hosts.
func serveFrontedRegistry(t *testing.T, inner, front http.Handler) (host, push string) {
	t.Helper()
	srv := httptest.NewServer(front)
	t.Cleanup(srv.Close)
	pushSrv := httptest.NewServer(inner)
	t.Cleanup(pushSrv.Close)
	return strings.TrimPrefix(srv.URL, "http://"), strings.TrimPrefix(pushSrv.URL, "http://")
}

// pushImage stores img as repo:tag (through the unrecorded listener).
func (r *credsRegistry) pushImage(t *testing.T, repoTag string, img v1.Image) {
	t.Helper()
	ref, err := name.ParseReference(r.push+"/"+repoTag, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
}

// sawSecret lists the requests that carried the test's credentials (in
// any form: basic auth, or the password anywhere in the header).
func (r *credsRegistry) sawSecret() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	basic := base64.StdEncoding.EncodeToString([]byte(credsUser + ":" + credsPassword))
	var out []string
	for _, a := range r.auths {
		if strings.Contains(a, basic) || strings.Contains(a, credsPassword) {
			out = append(out, a)
		}
	}
	return out
}

func (r *credsRegistry) requests() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.auths)
}

// credsImage is a one-layer image of its own (label makes its content,
// and so its digests, unique to the test case).
func credsImage(t *testing.T, label string) v1.Image {
	t.Helper()
	l, err := testimages.Layer([]testimages.File{{Name: "label", Mode: 0o644, Data: []byte(label + "\n")}})
	if err != nil {
		t.Fatal(err)
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	if img, err = mutate.AppendLayers(img, l); err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Config.Cmd = []string{"/label"}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// writeCredsHostsToml writes certs.d/<host>/hosts.toml for d.
func writeCredsHostsToml(t *testing.T, d *berthdtest.Daemon, host, content string) {
	t.Helper()
	dir := filepath.Join(d.Config.RegistryConfigDir, host)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "hosts.toml"), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func credsAuth(server string) *criapi.AuthConfig {
	return &criapi.AuthConfig{Username: credsUser, Password: credsPassword, ServerAddress: server}
}

// With hosts.toml naming a mirror for the upstream, `crictl pull --creds`
// (no server_address) and the kubelet (server_address: the keyring's
// registry) must not hand the upstream's credentials to the mirror; the
// upstream still gets them when the mirror lacks the image; a mirror gets
// them only with credential_domain naming the upstream; credentials for
// another registry go nowhere; a server_address that cannot be told is
// refused.
func TestRegistryCredsNotSentToMirror(t *testing.T) {
	d := berthdtest.Start(t, berthdtest.Options{})
	for _, tc := range []struct {
		name        string
		mirrorHas   bool   // the mirror serves the image
		optIn       string // credential_domain line of the mirror, "" none
		server      string // server_address; "UP" is the upstream's host
		wantMirror  bool   // the mirror sees the credentials
		wantUp      bool   // the upstream sees them
		wantPulled  bool
		wantRefused codes.Code // with wantPulled false: the code, OK for any failure
	}{
		{name: "crictl --creds, mirror serves", mirrorHas: true, wantPulled: true},
		{name: "kubelet server_address, mirror serves", mirrorHas: true, server: "UP", wantPulled: true},
		{name: "kubelet https server_address, mirror serves", mirrorHas: true, server: "https://UP", wantPulled: true},
		{name: "mirror lacks the image, upstream gets them", server: "UP", wantUp: true, wantPulled: true},
		{name: "mirror opted in", mirrorHas: true, optIn: "UP", wantMirror: true, wantPulled: true},
		{name: "mirror opted in for another registry", mirrorHas: true, optIn: "quay.io", wantPulled: true},
		{name: "credentials for another registry", server: "quay.io", wantRefused: codes.OK},
		{name: "server_address with user information", mirrorHas: true, server: "https://alice:s3cret@UP", wantRefused: codes.InvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := startCredsRegistry(t, true)
			mirror := startCredsRegistry(t, false)
			img := credsImage(t, t.Name())
			up.pushImage(t, "app:1", img)
			if tc.mirrorHas {
				mirror.pushImage(t, "app:1", img)
			}
			hosts := fmt.Sprintf("server = %q\n\n[host.%q]\n  capabilities = [\"pull\", \"resolve\"]\n", "http://"+up.Host, "http://"+mirror.Host)
			if tc.optIn != "" {
				hosts += fmt.Sprintf("  credential_domain = %q\n", strings.ReplaceAll(tc.optIn, "UP", up.Host))
			}
			writeCredsHostsToml(t, d, up.Host, hosts)
			ref := up.Host + "/app:1"
			_, err := d.Image.PullImage(berthdtest.Ctx(t), &criapi.PullImageRequest{
				Image: &criapi.ImageSpec{Image: ref},
				Auth:  credsAuth(strings.ReplaceAll(tc.server, "UP", up.Host)),
			})
			if got := mirror.sawSecret(); (len(got) > 0) != tc.wantMirror {
				t.Errorf("mirror saw the credentials in %d requests %q; want them sent to it: %v", len(got), got, tc.wantMirror)
			}
			if got := up.sawSecret(); (len(got) > 0) != tc.wantUp {
				t.Errorf("upstream saw the credentials in %d requests; want them sent to it: %v", len(got), tc.wantUp)
			}
			switch {
			case tc.wantPulled && err != nil:
				t.Errorf("pull %s: %v", ref, err)
			case !tc.wantPulled && err == nil:
				t.Errorf("pull %s: pulled, want it refused", ref)
			case !tc.wantPulled && tc.wantRefused != codes.OK:
				berthdtest.WantCode(t, err, tc.wantRefused)
			}
			if tc.wantRefused == codes.InvalidArgument && (mirror.requests() > 0 || up.requests() > 0) {
				t.Errorf("a refused server_address still reached the registries (mirror %d, upstream %d requests)", mirror.requests(), up.requests())
			}
			if err != nil && strings.Contains(err.Error(), credsPassword) {
				t.Errorf("the error shows the password: %v", err)
			}
		})
	}
	if strings.Contains(d.Logs(), credsPassword) {
		t.Error("berthd's log shows the password")
	}
}

// A registry that redirects blob downloads to another host (blob storage,
// a CDN) gets the credentials; the other host does not, for the layer
// blobs berth streams itself and for the config go-containerregistry
// reads. Not a finding (go-containerregistry adds Authorization per
// request, for the registry's host only): the test keeps it so.
func TestRegistryCredsNotForwardedOnRedirect(t *testing.T) {
	d := berthdtest.Start(t, berthdtest.Options{})
	up := startCredsRegistry(t, true)
	storage := startCredsRegistry(t, false)
	img := credsImage(t, t.Name())
	up.pushImage(t, "app:1", img)
	storage.pushImage(t, "app:1", img)
	up.mu.Lock()
	up.redirect = "http://" + storage.Host
	up.mu.Unlock()
	ref := up.Host + "/app:1"
	if _, err := d.Image.PullImage(berthdtest.Ctx(t), &criapi.PullImageRequest{Image: &criapi.ImageSpec{Image: ref}, Auth: credsAuth(up.Host)}); err != nil {
		t.Fatalf("pull %s: %v", ref, err)
	}
	if storage.requests() == 0 {
		t.Fatal("the blob storage got no request: the redirect was not followed, the test proves nothing")
	}
	if got := storage.sawSecret(); len(got) > 0 {
		t.Errorf("the host redirected to saw the credentials: %q", got)
	}
	if len(up.sawSecret()) == 0 {
		t.Error("the registry never saw the credentials")
	}
}

// CVE-2020-15157 (containerd): a manifest's layer `urls` made containerd
// fetch the layer from any URL, with the registry's credentials. berth
// fetches every blob by digest from the registry it pulls from and never
// reads `urls`: a hostile manifest's URL gets no request at all.
func TestRegistryForeignLayerURLsNotFetched(t *testing.T) {
	d := berthdtest.Start(t, berthdtest.Options{})
	up := startCredsRegistry(t, true)
	sink := startCredsRegistry(t, false)
	l, err := testimages.Layer([]testimages.File{{Name: "label", Mode: 0o644, Data: []byte(t.Name() + "\n")}})
	if err != nil {
		t.Fatal(err)
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{Layer: l, URLs: []string{"http://" + sink.Host + "/layer", "http://" + sink.Host + "/v2/app/blobs/x"}})
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	m, err := img.Manifest()
	if err != nil || len(m.Layers) != 1 || len(m.Layers[0].URLs) != 2 {
		t.Fatalf("the hostile manifest has no layer urls: %v %v", m, err)
	}
	up.pushImage(t, "app:1", img)
	ref := up.Host + "/app:1"
	if _, err := d.Image.PullImage(berthdtest.Ctx(t), &criapi.PullImageRequest{Image: &criapi.ImageSpec{Image: ref}, Auth: credsAuth(up.Host)}); err != nil {
		t.Fatalf("pull %s: %v", ref, err)
	}
	if n := sink.requests(); n != 0 {
		t.Errorf("the layer's foreign URL got %d requests (%d with the credentials), want none", n, len(sink.sawSecret()))
	}
}
