package bench

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// Shape is how a remote registry looks from a node: each connection
// limited to a bandwidth, each request answered after a latency.
type Shape struct {
	// BytesPerSec is each connection's bandwidth (0: unlimited).
	BytesPerSec int64
	// Latency is added before every answer (a round trip, TLS aside).
	Latency time.Duration
}

func (s Shape) String() string {
	return fmt.Sprintf("%d MB/s per connection, %v per request", s.BytesPerSec/1_000_000, s.Latency)
}

// ShapedRegistry is a read-only OCI registry on loopback that serves
// images whose blobs are files (multi-GB layers are never in memory),
// shaped like a remote one. Blob GETs honour Range (http.ServeContent),
// as the large registries and their CDNs do.
type ShapedRegistry struct {
	Host  string
	Shape Shape

	srv *http.Server
	mu  sync.Mutex
	// manifests by "repo:tag" and "repo@digest"; blobs by digest: a
	// file path or the bytes themselves.
	manifests map[string][]byte
	mediaType map[string]string
	blobFiles map[string]string
	blobBytes map[string][]byte
}

type connKey struct{}

// connLimit is one connection's bandwidth budget: the time at which its
// next byte may be sent.
type connLimit struct {
	mu   sync.Mutex
	next time.Time
}

// StartShapedRegistry serves until Close.
func StartShapedRegistry(shape Shape) (*ShapedRegistry, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &ShapedRegistry{
		Host: ln.Addr().String(), Shape: shape,
		manifests: map[string][]byte{}, mediaType: map[string]string{},
		blobFiles: map[string]string{}, blobBytes: map[string][]byte{},
	}
	r.srv = &http.Server{
		Handler: r,
		ConnContext: func(ctx context.Context, _ net.Conn) context.Context {
			return context.WithValue(ctx, connKey{}, &connLimit{})
		},
	}
	go r.srv.Serve(ln)
	return r, nil
}

// Close stops serving.
func (r *ShapedRegistry) Close() { r.srv.Close() }

// Ref is repo:tag on this registry.
func (r *ShapedRegistry) Ref(repoTag string) string { return r.Host + "/" + repoTag }

// Add serves img as repo:tag, its layers from files (digest → path).
func (r *ShapedRegistry) Add(repoTag string, img v1.Image, layerFiles map[string]string) error {
	m, err := img.RawManifest()
	if err != nil {
		return err
	}
	d, err := img.Digest()
	if err != nil {
		return err
	}
	mt, err := img.MediaType()
	if err != nil {
		return err
	}
	cfg, err := img.RawConfigFile()
	if err != nil {
		return err
	}
	cd, err := img.ConfigName()
	if err != nil {
		return err
	}
	repo, _, _ := strings.Cut(repoTag, ":")
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, key := range []string{repoTag, repo + "@" + d.String()} {
		r.manifests[key] = m
		r.mediaType[key] = string(mt)
	}
	r.blobBytes[cd.String()] = cfg
	for dg, p := range layerFiles {
		r.blobFiles[dg] = p
	}
	return nil
}

func (r *ShapedRegistry) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if r.Shape.Latency > 0 {
		select {
		case <-time.After(r.Shape.Latency):
		case <-req.Context().Done():
			return
		}
	}
	if lim, ok := req.Context().Value(connKey{}).(*connLimit); ok && r.Shape.BytesPerSec > 0 {
		w = &shapedWriter{ResponseWriter: w, lim: lim, rate: r.Shape.BytesPerSec}
	}
	path := strings.TrimPrefix(req.URL.Path, "/v2/")
	if req.URL.Path == "/v2/" || req.URL.Path == "/v2" {
		w.WriteHeader(http.StatusOK)
		return
	}
	if i := strings.LastIndex(path, "/manifests/"); i >= 0 {
		repo, ref := path[:i], path[i+len("/manifests/"):]
		key := repo + ":" + ref
		if strings.HasPrefix(ref, "sha256:") {
			key = repo + "@" + ref
		}
		r.mu.Lock()
		m, ok := r.manifests[key]
		mt := r.mediaType[key]
		r.mu.Unlock()
		if !ok {
			http.Error(w, `{"errors":[{"code":"MANIFEST_UNKNOWN"}]}`, http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Type", mt)
		w.Header().Set("Docker-Content-Digest", sha(m).String())
		http.ServeContent(w, req, "", time.Time{}, bytes.NewReader(m))
		return
	}
	if i := strings.LastIndex(path, "/blobs/"); i >= 0 {
		dg := path[i+len("/blobs/"):]
		r.mu.Lock()
		p, isFile := r.blobFiles[dg]
		b, isBytes := r.blobBytes[dg]
		r.mu.Unlock()
		w.Header().Set("Docker-Content-Digest", dg)
		w.Header().Set("Content-Type", "application/octet-stream")
		switch {
		case isBytes:
			http.ServeContent(w, req, "", time.Time{}, bytes.NewReader(b))
		case isFile:
			f, err := os.Open(p)
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			defer f.Close()
			http.ServeContent(w, req, "", time.Time{}, f)
		default:
			http.Error(w, `{"errors":[{"code":"BLOB_UNKNOWN"}]}`, http.StatusNotFound)
		}
		return
	}
	http.NotFound(w, req)
}

// shapedWriter holds a connection's writes to its bandwidth: each write
// of n bytes waits until the connection's budget allows it (a burst of
// shapeBurst bytes at most after an idle spell).
type shapedWriter struct {
	http.ResponseWriter
	lim  *connLimit
	rate int64
}

const shapeBurst = 64 << 10

func (s *shapedWriter) Write(p []byte) (int, error) {
	written := 0
	for len(p) > 0 {
		n := min(len(p), 32<<10)
		s.lim.mu.Lock()
		now := time.Now()
		if earliest := now.Add(-time.Duration(shapeBurst) * time.Second / time.Duration(s.rate)); s.lim.next.Before(earliest) {
			s.lim.next = earliest
		}
		s.lim.next = s.lim.next.Add(time.Duration(n) * time.Second / time.Duration(s.rate))
		wait := time.Until(s.lim.next)
		s.lim.mu.Unlock()
		if wait > 0 {
			time.Sleep(wait)
		}
		m, err := s.ResponseWriter.Write(p[:n])
		written += m
		if err != nil {
			return written, err
		}
		p = p[n:]
	}
	return written, nil
}
