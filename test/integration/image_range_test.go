package integration

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/leakcheck"
	"github.com/berthcri/berth/internal/testutil/testimages"
)

// smallRanges makes berthd fetch the test images' busybox layer (about
// 1 MiB) as a dozen ranges, three at a time.
func smallRanges(c *config.Config) {
	c.ImageRangeFetch = config.ImageRangeFetch{Enable: true, MinLayerSize: 64 << 10, ChunkSize: 96 << 10, Parallel: 3, Retries: 3}
}

// multiLayerRegistry starts a registry holding the standard test images
// and returns it with the MultiLayer image and the digest of its bottom
// layer (busybox's, about 1 MiB), for a test to serve that blob its way.
func multiLayerRegistry(t *testing.T) (*testimages.Registry, v1.Image, string) {
	t.Helper()
	reg := testimages.StartRegistry(t)
	reg.PushStandard(t)
	img := mustImage(t, testimages.MultiLayer)
	return reg, img, bottomLayerDigest(t, img)
}

// storeLeakScope is d's leak scope with its image store (d.Root) in it,
// and what it holds now.
func storeLeakScope(t *testing.T, d *berthdtest.Daemon) (leakcheck.Scope, leakcheck.Snapshot) {
	t.Helper()
	scope := leakcheck.ForDaemon(d)
	scope.Root = d.Root
	return scope, leakcheck.Take(t, scope)
}

// TestImagePullRangeCutMidwayResumes pulls through a real berthd in
// parallel ranges while the registry cuts several ranges' connections
// partway: each is asked for again from its last byte, the image is
// stored whole (a container runs on it), and nothing leaks.
func TestImagePullRangeCutMidwayResumes(t *testing.T) {
	t.Parallel()
	reg, img, ld := multiLayerRegistry(t)
	var mu sync.Mutex
	var asked []string
	reg.ServeBlobWith(t, ld, func(w http.ResponseWriter, req *http.Request, body []byte) {
		mu.Lock()
		asked = append(asked, req.Header.Get("Range"))
		n := len(asked)
		mu.Unlock()
		start, end, _ := testimages.RangeOf(w, req, len(body))
		if n%3 == 2 {
			// Content-Length promises the range; the connection ends
			// halfway through it.
			end = start + (end-start)/2
		}
		_, _ = w.Write(body[start:end])
	})
	d := berthdtest.Start(t, berthdtest.Options{Configure: smallRanges})
	scope, before := storeLeakScope(t, d)

	ref := reg.Ref(testimages.MultiLayerRef)
	if id := pull(t, d, ref, nil); id != configDigest(t, img) {
		t.Fatalf("pulled %s", id)
	}
	mu.Lock()
	got := append([]string(nil), asked...)
	mu.Unlock()
	resumed := 0
	for _, r := range got {
		if !strings.HasPrefix(r, "bytes=") {
			t.Fatalf("a request without a range: %q", got)
		}
		var a, b int
		if _, err := fmt.Sscanf(r, "bytes=%d-%d", &a, &b); err == nil && a%(96<<10) != 0 {
			resumed++
		}
	}
	if resumed == 0 {
		t.Fatalf("no range was resumed midway: %q", got)
	}
	if e := dirEntries(t, d, "ingest"); len(e) != 0 {
		t.Fatalf("ingest after the pull: %v", e)
	}
	// The image is whole: its bottom layer holds busybox (the digests
	// and diff IDs were checked on the way).
	found := false
	for _, chain := range dirEntries(t, d, "layers") {
		if fi, err := os.Stat(filepath.Join(d.Root, "images", "layers", chain, "diff", "bin", "busybox")); err == nil && fi.Size() > 100_000 {
			found = true
		}
	}
	if !found {
		t.Fatal("no layer holds bin/busybox")
	}
	if _, err := d.Image.RemoveImage(berthdtest.Ctx(t), &criapi.RemoveImageRequest{Image: &criapi.ImageSpec{Image: ref}}); err != nil {
		t.Fatal(err)
	}
	leakcheck.Check(t, before, leakcheck.Take(t, scope))
}

// TestImagePullStalledRangeTimesOut stalls one range while the others
// arrive: berthd counts the bytes of every range as progress, and once
// nothing moves image_pull_progress_timeout ends the pull, leaving
// nothing.
func TestImagePullStalledRangeTimesOut(t *testing.T) {
	t.Parallel()
	reg, _, ld := multiLayerRegistry(t)
	reg.ServeBlobWith(t, ld, func(w http.ResponseWriter, req *http.Request, body []byte) {
		start, end, _ := testimages.RangeOf(w, req, len(body))
		if start == 3*(96<<10) {
			_, _ = w.Write(body[start : start+10])
			w.(http.Flusher).Flush()
			<-req.Context().Done()
			return
		}
		_, _ = w.Write(body[start:end])
	})
	d := berthdtest.Start(t, berthdtest.Options{Configure: func(c *config.Config) {
		smallRanges(c)
		c.ImagePullProgressTimeout = config.Duration(time.Second)
	}})
	scope, before := storeLeakScope(t, d)
	_, err := d.Image.PullImage(context.Background(), &criapi.PullImageRequest{Image: &criapi.ImageSpec{Image: reg.Ref(testimages.MultiLayerRef)}})
	berthdtest.WantCode(t, err, codes.DeadlineExceeded)
	waitStoreEmpty(t, d)
	leakcheck.Check(t, before, leakcheck.Take(t, scope))
}
