package testimages

import (
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// Registry is an in-process OCI registry on 127.0.0.1 that counts blob
// fetches, optionally behind HTTP basic auth.
type Registry struct {
	// Host is "127.0.0.1:PORT", the registry part of image references.
	Host string

	srv      *httptest.Server
	user     string
	password string
	tls      bool
	// Token auth: Bearer registryToken on every request; POST /token with
	// refresh_token=identityToken (the OAuth2 flow) hands it out.
	identityToken string
	registryToken string

	mu         sync.Mutex
	blobFetchs map[string]int // digest → GET count
	holds      map[string]*BlobHold
	serveBlob  map[string]BlobServer
}

// BlobServer answers a GET of one blob in its own way: body is the blob
// and w already carries the registry's headers (Content-Length included).
type BlobServer func(w http.ResponseWriter, req *http.Request, body []byte)

// RangeOf answers the Range header ("bytes=a-b") of req for a blob of size
// bytes: it sets 206, Content-Range and Content-Length on w and returns
// the bytes [start, end) to write. Without a Range header it returns the
// whole blob and ranged false (w answers 200 on the first write).
func RangeOf(w http.ResponseWriter, req *http.Request, size int) (start, end int, ranged bool) {
	var a, b int
	if _, err := fmt.Sscanf(req.Header.Get("Range"), "bytes=%d-%d", &a, &b); err != nil || a > b || b >= size {
		return 0, size, false
	}
	w.Header().Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", a, b, size))
	w.Header().Set("Content-Length", fmt.Sprint(b-a+1))
	w.WriteHeader(http.StatusPartialContent)
	return a, b + 1, true
}

// ServeBlobWith makes fn answer every GET of the blob with this digest
// (truncated, corrupted, trickled streams), until the test ends or
// ServeBlobWith(t, digest, nil).
func (r *Registry) ServeBlobWith(t testing.TB, digest string, fn BlobServer) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if fn == nil {
		delete(r.serveBlob, digest)
		return
	}
	r.serveBlob[digest] = fn
	t.Cleanup(func() { r.ServeBlobWith(t, digest, nil) })
}

// BlobHold stalls downloads of one blob: the registry sends the first half
// of the blob, then waits until Release (or the client goes away).
type BlobHold struct {
	// Arrived is closed when the first request for the blob is stalled.
	Arrived chan struct{}
	release chan struct{}
	once    sync.Once
	relOnce sync.Once
}

// Release lets stalled and future downloads of the blob finish.
func (h *BlobHold) Release() { h.relOnce.Do(func() { close(h.release) }) }

// HoldBlob stalls every download of the blob with this digest halfway until
// the returned hold is released (at the latest when the test ends).
func (r *Registry) HoldBlob(t testing.TB, digest string) *BlobHold {
	h := &BlobHold{Arrived: make(chan struct{}), release: make(chan struct{})}
	r.mu.Lock()
	r.holds[digest] = h
	r.mu.Unlock()
	t.Cleanup(h.Release)
	return h
}

func (r *Registry) serveHeld(h *BlobHold, inner http.Handler, w http.ResponseWriter, req *http.Request) {
	rec := httptest.NewRecorder()
	inner.ServeHTTP(rec, req)
	body := rec.Body.Bytes()
	for k, v := range rec.Header() {
		w.Header()[k] = v
	}
	w.WriteHeader(rec.Code)
	half := len(body) / 2
	_, _ = w.Write(body[:half])
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
	h.once.Do(func() { close(h.Arrived) })
	select {
	case <-h.release:
		_, _ = w.Write(body[half:])
	case <-req.Context().Done():
	}
}

// WholeHold answers the GETs of lazy layers' blobs the way a test of lazy
// pulling wants them: a range GET (a read of the mounted layer) at once,
// a whole GET (the layer's background fetch) only after Release or the
// test's end, so the layer stays lazy as long as the test needs.
type WholeHold struct {
	hold  chan struct{}
	once  sync.Once
	mu    sync.Mutex
	whole int
}

// NewWholeHold is a hold released at the latest when t ends.
func NewWholeHold(t testing.TB) *WholeHold {
	h := &WholeHold{hold: make(chan struct{})}
	t.Cleanup(h.Release)
	return h
}

// HoldWhole serves the blobs with these digests through a new WholeHold.
func (r *Registry) HoldWhole(t testing.TB, digests ...string) *WholeHold {
	h := NewWholeHold(t)
	for _, dg := range digests {
		r.ServeBlobWith(t, dg, h.Serve)
	}
	return h
}

// Release lets held and future whole GETs go on.
func (h *WholeHold) Release() { h.once.Do(func() { close(h.hold) }) }

// WholeGets is how many whole GETs have come so far.
func (h *WholeHold) WholeGets() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.whole
}

// Wait counts req if it is a whole GET and holds it until Release; false
// means the client went away first and nothing is to be written.
func (h *WholeHold) Wait(req *http.Request) bool {
	if req.Header.Get("Range") != "" {
		return true
	}
	h.mu.Lock()
	h.whole++
	h.mu.Unlock()
	select {
	case <-h.hold:
		return true
	case <-req.Context().Done():
		return false
	}
}

// Serve is a BlobServer: Wait, then the range asked for or the whole blob.
func (h *WholeHold) Serve(w http.ResponseWriter, req *http.Request, body []byte) {
	if !h.Wait(req) {
		return
	}
	start, end, _ := RangeOf(w, req, len(body))
	_, _ = w.Write(body[start:end])
}

// Option configures a Registry.
type Option func(*Registry)

// WithBasicAuth makes the registry refuse requests without these credentials.
func WithBasicAuth(user, password string) Option {
	return func(r *Registry) { r.user, r.password = user, password }
}

// WithTokenAuth makes the registry demand "Authorization: Bearer
// registryToken", announcing a token realm at /token that exchanges
// identityToken (grant_type=refresh_token) for it.
func WithTokenAuth(identityToken, registryToken string) Option {
	return func(r *Registry) { r.identityToken, r.registryToken = identityToken, registryToken }
}

func (r *Registry) serveToken(w http.ResponseWriter, req *http.Request) {
	if err := req.ParseForm(); err != nil || req.Method != http.MethodPost ||
		req.PostForm.Get("grant_type") != "refresh_token" || req.PostForm.Get("refresh_token") != r.identityToken {
		http.Error(w, "bad token request", http.StatusUnauthorized)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"access_token": %q, "expires_in": 300}`, r.registryToken)
}

// WithTLS serves HTTPS with a self-signed certificate (see CACertPEM).
func WithTLS() Option {
	return func(r *Registry) { r.tls = true }
}

// CACertPEM is the PEM certificate a WithTLS registry serves, to trust it.
func (r *Registry) CACertPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: r.srv.Certificate().Raw})
}

// StartRegistry serves an empty registry until the test ends.
func StartRegistry(t testing.TB, opts ...Option) *Registry {
	t.Helper()
	r := &Registry{blobFetchs: map[string]int{}, holds: map[string]*BlobHold{}, serveBlob: map[string]BlobServer{}}
	for _, o := range opts {
		o(r)
	}
	inner := registry.New(registry.Logger(discardLogger()))
	r.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if r.registryToken != "" {
			if req.URL.Path == "/token" {
				r.serveToken(w, req)
				return
			}
			if req.Header.Get("Authorization") != "Bearer "+r.registryToken {
				scheme := "http"
				if r.tls {
					scheme = "https"
				}
				w.Header().Set("WWW-Authenticate", fmt.Sprintf(`Bearer realm="%s://%s/token",service="berth-test"`, scheme, req.Host))
				http.Error(w, "unauthorized", http.StatusUnauthorized)
				return
			}
		}
		if r.user != "" {
			u, p, ok := req.BasicAuth()
			if !ok || u != r.user || p != r.password {
				w.Header().Set("WWW-Authenticate", `Basic realm="berth-test"`)
				http.Error(w, "unauthorized", http.StatusUnauthorized)
				return
			}
		}
		if req.Method == http.MethodGet && strings.Contains(req.URL.Path, "/blobs/sha256:") {
			dgst := req.URL.Path[strings.LastIndex(req.URL.Path, "/")+1:]
			r.mu.Lock()
			r.blobFetchs[dgst]++
			h := r.holds[dgst]
			fn := r.serveBlob[dgst]
			r.mu.Unlock()
			if h != nil {
				r.serveHeld(h, inner, w, req)
				return
			}
			if fn != nil {
				// fn gets the whole blob, whatever range was asked for
				// (RangeOf answers a Range header).
				whole := req.Clone(req.Context())
				whole.Header.Del("Range")
				rec := httptest.NewRecorder()
				inner.ServeHTTP(rec, whole)
				for k, v := range rec.Header() {
					w.Header()[k] = v
				}
				if rec.Code != http.StatusOK {
					w.WriteHeader(rec.Code)
					_, _ = w.Write(rec.Body.Bytes())
					return
				}
				fn(w, req, rec.Body.Bytes())
				return
			}
		}
		inner.ServeHTTP(w, req)
	}))
	if r.tls {
		r.srv.StartTLS()
	} else {
		r.srv.Start()
	}
	t.Cleanup(r.srv.Close)
	r.Host = strings.TrimPrefix(strings.TrimPrefix(r.srv.URL, "http://"), "https://")
	return r
}

// Ref is the full reference of repo[:tag] in this registry.
func (r *Registry) Ref(repoTag string) string { return r.Host + "/" + repoTag }

// Push uploads img under ref (repo:tag, relative to this registry) and
// returns its manifest digest.
func (r *Registry) Push(t testing.TB, repoTag string, img v1.Image) v1.Hash {
	t.Helper()
	ref, err := name.ParseReference(r.Ref(repoTag), name.Insecure)
	if err != nil {
		t.Fatalf("parse %s: %v", repoTag, err)
	}
	if err := remote.Write(ref, img, r.remoteOptions()...); err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatalf("digest %s: %v", ref, err)
	}
	return d
}

// PushIndex uploads an image index under repoTag and returns its digest.
func (r *Registry) PushIndex(t testing.TB, repoTag string, idx v1.ImageIndex) v1.Hash {
	t.Helper()
	ref, err := name.ParseReference(r.Ref(repoTag), name.Insecure)
	if err != nil {
		t.Fatalf("parse %s: %v", repoTag, err)
	}
	if err := remote.WriteIndex(ref, idx, r.remoteOptions()...); err != nil {
		t.Fatalf("push index %s: %v", ref, err)
	}
	d, err := idx.Digest()
	if err != nil {
		t.Fatalf("digest %s: %v", ref, err)
	}
	return d
}

func (r *Registry) remoteOptions() []remote.Option {
	var opts []remote.Option
	if r.tls {
		opts = append(opts, remote.WithTransport(r.srv.Client().Transport))
	}
	if r.user != "" {
		opts = append(opts, remote.WithAuth(&authn.Basic{Username: r.user, Password: r.password}))
	}
	if r.registryToken != "" {
		opts = append(opts, remote.WithAuth(&authn.Bearer{Token: r.registryToken}))
	}
	return opts
}

// BlobFetches is how many times the blob with this digest was downloaded.
func (r *Registry) BlobFetches(digest string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.blobFetchs[digest]
}

// Standard image names PushStandard uploads.
const (
	BusyboxRef    = "busybox:latest"
	BusyboxAltRef = "busybox:1.36" // same image, second tag
	UserRef       = "busybox-user:latest"
	UIDRef        = "busybox-uid:latest"
	HTTPDRef      = "busybox-httpd:latest"
	MultiLayerRef = "busybox-multilayer:latest"
)

// PushStandard uploads the standard test images and returns their manifest
// digests by reference.
func (r *Registry) PushStandard(t testing.TB) map[string]v1.Hash {
	t.Helper()
	digests := map[string]v1.Hash{}
	for _, e := range []struct {
		refs  []string
		build func() (v1.Image, error)
	}{
		{[]string{BusyboxRef, BusyboxAltRef}, Busybox},
		{[]string{UserRef}, BusyboxUser},
		{[]string{UIDRef}, BusyboxUID},
		{[]string{HTTPDRef}, HTTPD},
		{[]string{MultiLayerRef}, MultiLayer},
	} {
		img, err := e.build()
		img = Must(t, img, err)
		for _, ref := range e.refs {
			digests[ref] = r.Push(t, ref, img)
		}
	}
	return digests
}
