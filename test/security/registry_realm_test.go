package security

import (
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/testutil/berthdtest"
)

// TestRegistryTokenRealmOverCleartextRefused is the CVE-2019-10214
// class (containers/image sent credentials to a token server without
// TLS): a registry served over TLS (trusted through hosts.toml `ca`)
// answers every request with a Bearer challenge whose realm is a plain
// HTTP token server, directly or through a redirect from an https realm
// on the registry itself. berthd must not send that token server the
// pull's credentials — it gets no request at all — and the pull fails
// saying why.
func TestRegistryTokenRealmOverCleartextRefused(t *testing.T) {
	d := berthdtest.Start(t, berthdtest.Options{})

	var mu sync.Mutex
	var tokenReqs []string // "path: Authorization" of every request the cleartext token server got
	tokenSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		mu.Lock()
		tokenReqs = append(tokenReqs, req.URL.RequestURI()+": "+req.Header.Get("Authorization"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"token":"cleartext-token","access_token":"cleartext-token"}`)
	}))
	t.Cleanup(tokenSrv.Close)
	tokenPort := tokenSrv.Listener.Addr().(*net.TCPAddr).Port

	var realm string // the challenge's realm, per case
	reg := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		mu.Lock()
		r := realm
		mu.Unlock()
		if req.URL.Path == "/token" {
			// The registry's own https realm sends the client on to the
			// cleartext token server.
			http.Redirect(w, req, fmt.Sprintf("http://localhost:%d/token?%s", tokenPort, req.URL.RawQuery), http.StatusTemporaryRedirect)
			return
		}
		if req.Header.Get("Authorization") == "Bearer cleartext-token" {
			http.Error(w, "a token from the cleartext server was used", http.StatusTeapot)
			return
		}
		w.Header().Set("WWW-Authenticate", fmt.Sprintf(`Bearer realm=%q,service="berth-security",scope="repository:app:pull"`, r))
		http.Error(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`, http.StatusUnauthorized)
	}))
	t.Cleanup(reg.Close)
	host := strings.TrimPrefix(reg.URL, "https://")
	dir := filepath.Join(d.Config.RegistryConfigDir, host)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: reg.Certificate().Raw})
	if err := os.WriteFile(filepath.Join(dir, "ca.pem"), ca, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "hosts.toml"), []byte(fmt.Sprintf("server = %q\nca = \"ca.pem\"\n", "https://"+host)), 0o644); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct{ name, realm string }{
		{"realm on a loopback address over http", fmt.Sprintf("http://127.0.0.1:%d/token", tokenPort)},
		{"realm named localhost over http", fmt.Sprintf("http://localhost:%d/token", tokenPort)},
		{"https realm redirecting to http", "https://" + host + "/token"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mu.Lock()
			realm, tokenReqs = tc.realm, nil
			mu.Unlock()
			_, err := d.Image.PullImage(berthdtest.Ctx(t), &criapi.PullImageRequest{
				Image: &criapi.ImageSpec{Image: host + "/app:1"},
				Auth:  &criapi.AuthConfig{Username: credsUser, Password: credsPassword, ServerAddress: host},
			})
			mu.Lock()
			got := append([]string(nil), tokenReqs...)
			mu.Unlock()
			if len(got) > 0 {
				t.Errorf("the cleartext token server got %d requests: %q", len(got), got)
			}
			if err == nil {
				t.Fatalf("pull through a cleartext token realm succeeded")
			}
			t.Logf("pull: %v", err)
			if !strings.Contains(err.Error(), "realm") && !strings.Contains(err.Error(), "redirect") {
				t.Errorf("the pull's error does not say the token realm was refused: %v", err)
			}
		})
	}
}
