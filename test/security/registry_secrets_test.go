package security

import (
	"encoding/base64"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/testutil/berthdtest"
)

// Secrets in registry errors (containerd 1.7.31, #12805: registry errors
// returned over gRPC put credentials in pod events): a registry that
// echoes the request's Authorization in its error body, or sends the
// blob download to a URL whose query holds a token (a pre-signed storage
// URL), must not get the pull secret or the token into the error the
// kubelet receives, nor into berthd's log.

const (
	leakRegistryToken = "REGTOKSECRET0123"
	leakURLToken      = "URLTOKSECRET4567"
	leakURLSignature  = "URLSIGSECRET89ab"
)

// leakRegistry is a loopback registry whose behaviour the test case sets.
type leakRegistry struct {
	Host string
	push string

	mu   sync.Mutex
	mode string // "echo403", "redirectDead", "redirectEcho"
	keep string // a blob digest served as is (the config, to reach the layer fetch)
}

func startLeakRegistry(t *testing.T) *leakRegistry {
	t.Helper()
	inner := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	r := &leakRegistry{}
	// Where a redirect's token URL leads: storage that answers 403 and
	// echoes the URL it was asked for.
	storage := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		http.Error(w, "<Error><Code>AccessDenied</Code><Message>signature mismatch for "+req.URL.String()+"</Message></Error>", http.StatusForbidden)
	}))
	t.Cleanup(storage.Close)
	// A port nobody listens on.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	l.Close()
	query := "?X-Amz-Credential=AKIAEXAMPLE&X-Amz-Signature=" + leakURLSignature + "&token=" + leakURLToken
	r.Host, r.push = serveFrontedRegistry(t, inner, http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		mode, keep := r.mode, r.keep
		r.mu.Unlock()
		authz := req.Header.Get("Authorization")
		if authz == "" {
			w.Header().Set("WWW-Authenticate", `Basic realm="berth-security"`)
			http.Error(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`, http.StatusUnauthorized)
			return
		}
		decoded := ""
		if b64, ok := strings.CutPrefix(authz, "Basic "); ok {
			raw, _ := base64.StdEncoding.DecodeString(b64)
			decoded = string(raw)
		}
		isBlob := req.Method == http.MethodGet && strings.Contains(req.URL.Path, "/blobs/sha256:") &&
			(keep == "" || !strings.HasSuffix(req.URL.Path, "/"+keep))
		switch {
		case mode == "echo403" && strings.Contains(req.URL.Path, "/manifests/"):
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusForbidden)
			fmt.Fprintf(w, `{"errors":[{"code":"DENIED","message":"access denied for %s (%s)","detail":%q}]}`, authz, decoded, authz)
			return
		case mode == "redirectDead" && isBlob:
			http.Redirect(w, req, "http://"+dead+req.URL.Path+query, http.StatusTemporaryRedirect)
			return
		case mode == "redirectEcho" && isBlob:
			http.Redirect(w, req, storage.URL+req.URL.Path+query, http.StatusTemporaryRedirect)
			return
		}
		inner.ServeHTTP(w, req)
	}))
	return r
}

func TestRegistryErrorsCarryNoSecrets(t *testing.T) {
	d := berthdtest.Start(t, berthdtest.Options{})
	reg := startLeakRegistry(t)
	basic := base64.StdEncoding.EncodeToString([]byte(credsUser + ":" + credsPassword))
	secrets := []string{credsPassword, basic, leakRegistryToken, leakURLToken, leakURLSignature}
	alice := &criapi.AuthConfig{Username: credsUser, Password: credsPassword}
	for i, tc := range []struct {
		name       string
		mode       string
		auth       *criapi.AuthConfig
		layersOnly bool // the config is served; the layer fetch (berth's own) meets the redirect
	}{
		{"403 echoing basic credentials", "echo403", alice, false},
		{"403 echoing a registry token", "echo403", &criapi.AuthConfig{RegistryToken: leakRegistryToken}, false},
		{"403 echoing a kubelet auth field", "echo403", &criapi.AuthConfig{Auth: base64.StdEncoding.EncodeToString([]byte(credsUser + ":" + credsPassword))}, false},
		{"config redirect with a token URL to a dead host", "redirectDead", alice, false},
		{"config redirect with a token URL to storage echoing it", "redirectEcho", alice, false},
		{"layer redirect with a token URL to a dead host", "redirectDead", alice, true},
		{"layer redirect with a token URL to storage echoing it", "redirectEcho", alice, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			repo := fmt.Sprintf("app%d:1", i)
			ref, err := name.ParseReference(reg.push+"/"+repo, name.Insecure)
			if err != nil {
				t.Fatal(err)
			}
			img := credsImage(t, t.Name())
			if err := remote.Write(ref, img); err != nil {
				t.Fatalf("push: %v", err)
			}
			keep := ""
			if tc.layersOnly {
				cfg, err := img.ConfigName()
				if err != nil {
					t.Fatal(err)
				}
				keep = cfg.String()
			}
			reg.mu.Lock()
			reg.mode, reg.keep = tc.mode, keep
			reg.mu.Unlock()
			_, err = d.Image.PullImage(berthdtest.Ctx(t), &criapi.PullImageRequest{Image: &criapi.ImageSpec{Image: reg.Host + "/" + repo}, Auth: tc.auth})
			if err == nil {
				t.Fatal("the pull succeeded; the hostile registry should have failed it")
			}
			t.Logf("pull: %v", err)
			for _, s := range secrets {
				if strings.Contains(err.Error(), s) {
					t.Errorf("the PullImage error carries the secret %q", s)
				}
			}
		})
	}
	logs := d.Logs()
	for _, s := range secrets {
		if n := strings.Count(logs, s); n > 0 {
			i := strings.Index(logs, s)
			lo, hi := max(0, i-200), min(len(logs), i+100)
			t.Errorf("berthd's log carries the secret %q %d times, e.g. …%s…", s, n, logs[lo:hi])
		}
	}
}
