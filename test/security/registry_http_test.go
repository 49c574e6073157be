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

// httpProbeProxy is an HTTP proxy on loopback that stands for the network
// between berthd and registries at private addresses: it never connects
// anywhere. A CONNECT (what an https:// request through a proxy is) is
// recorded and refused; a plain http:// request is recorded and answered
// by an in-process registry, as a registry reachable over plain HTTP at
// that address would answer. So a pull of 10.0.0.1:5000/app:1 succeeds
// only over plain HTTP, and no packet goes to a private address.
type httpProbeProxy struct {
	url  string
	push string // unrecorded listener of the registry behind it

	mu       sync.Mutex
	connects []string // hosts asked for with CONNECT
	plain    []string // "host path: Authorization" of plain HTTP requests
}

func startHTTPProbeProxy(t *testing.T) *httpProbeProxy {
	t.Helper()
	inner := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	p := &httpProbeProxy{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method == http.MethodConnect {
			p.mu.Lock()
			p.connects = append(p.connects, req.Host)
			p.mu.Unlock()
			http.Error(w, "no tunnels here", http.StatusForbidden)
			return
		}
		p.mu.Lock()
		p.plain = append(p.plain, req.URL.Host+" "+req.URL.Path+": "+req.Header.Get("Authorization"))
		p.mu.Unlock()
		inner.ServeHTTP(w, req)
	}))
	t.Cleanup(srv.Close)
	pushSrv := httptest.NewServer(inner)
	t.Cleanup(pushSrv.Close)
	p.url, p.push = srv.URL, strings.TrimPrefix(pushSrv.URL, "http://")
	return p
}

// env makes a berthd send every non-loopback request through the proxy.
func (p *httpProbeProxy) env() []string {
	return []string{"HTTP_PROXY=" + p.url, "HTTPS_PROXY=" + p.url, "http_proxy=" + p.url, "https_proxy=" + p.url, "NO_PROXY=", "no_proxy="}
}

func (p *httpProbeProxy) seen(host string) (connects int, plain []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.connects {
		if c == host || strings.HasPrefix(c, host+":") {
			connects++
		}
	}
	for _, r := range p.plain {
		if strings.HasPrefix(r, host+" ") || strings.HasPrefix(r, host+":") {
			plain = append(plain, r)
		}
	}
	return connects, plain
}

// A registry at an RFC 1918 address or a *.localhost name (the issue says
// *.local; go-containerregistry v0.22's rule is *.localhost) that nothing
// configures is reached over HTTPS only (issue 34, finding 8):
// go-containerregistry's rule fell back to plain HTTP there, sending the
// pull's credentials in clear and taking whatever an on-path attacker
// serves. hosts.toml's http:// server still allows it, and an
// unconfigured loopback registry (127.0.0.2, beyond go-containerregistry's
// 127.0.0.1) keeps plain HTTP, as containerd allows for localhost.
func TestRegistryNoPlainHTTPForPrivateAddress(t *testing.T) {
	proxy := startHTTPProbeProxy(t)
	img := credsImage(t, t.Name())
	ref, err := name.ParseReference(proxy.push+"/app:1", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatalf("push: %v", err)
	}
	d := berthdtest.Start(t, berthdtest.Options{Env: proxy.env()})
	basic := base64.StdEncoding.EncodeToString([]byte(credsUser + ":" + credsPassword))

	for _, host := range []string{"10.0.0.1:5000", "192.168.77.7:5000", "172.16.9.9", "registry.local:5000", "registry.localhost:5000"} {
		t.Run("unconfigured "+host, func(t *testing.T) {
			ref := host + "/app:1"
			_, err := d.Image.PullImage(berthdtest.Ctx(t), &criapi.PullImageRequest{Image: &criapi.ImageSpec{Image: ref}, Auth: credsAuth("")})
			connects, plain := proxy.seen(strings.Split(host, ":")[0])
			if len(plain) > 0 {
				t.Errorf("%d plain HTTP requests to %s (credentials in clear: %v): %q", len(plain), host, strings.Contains(strings.Join(plain, "\n"), basic), plain)
			}
			if err == nil {
				t.Errorf("pull %s: pulled, want it to fail (HTTPS only, and the proxy refuses tunnels)", ref)
			}
			if connects == 0 {
				t.Errorf("no HTTPS attempt to %s: the test proves nothing (%v)", host, err)
			}
		})
	}

	t.Run("hosts.toml http server", func(t *testing.T) {
		host := "10.0.0.3:5000"
		writeCredsHostsToml(t, d, host, fmt.Sprintf("server = %q\n", "http://"+host))
		if _, err := d.Image.PullImage(berthdtest.Ctx(t), &criapi.PullImageRequest{Image: &criapi.ImageSpec{Image: host + "/app:1"}}); err != nil {
			t.Fatalf("pull from a registry hosts.toml configures as http://: %v", err)
		}
		if _, plain := proxy.seen("10.0.0.3"); len(plain) == 0 {
			t.Error("no plain HTTP request went to the configured http:// server")
		}
	})

	t.Run("unconfigured loopback 127.0.0.2", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.2:0")
		if err != nil {
			t.Skipf("cannot listen on 127.0.0.2: %v", err)
		}
		inner := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
		srv := httptest.NewUnstartedServer(inner)
		srv.Listener.Close()
		srv.Listener = ln
		srv.Start()
		t.Cleanup(srv.Close)
		host := ln.Addr().String()
		ref, err := name.ParseReference(host+"/app:1", name.Insecure)
		if err != nil {
			t.Fatal(err)
		}
		if err := remote.Write(ref, img); err != nil {
			t.Fatalf("push: %v", err)
		}
		if _, err := d.Image.PullImage(berthdtest.Ctx(t), &criapi.PullImageRequest{Image: &criapi.ImageSpec{Image: host + "/app:1"}}); err != nil {
			t.Fatalf("pull from an unconfigured loopback registry: %v", err)
		}
	})
}
