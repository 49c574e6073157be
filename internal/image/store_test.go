package image

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/compression"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/testutil/testimages"
)

func TestParseReferenceNormalizes(t *testing.T) {
	for in, want := range map[string]string{
		"busybox":                         "docker.io/library/busybox:latest",
		"busybox:1.36":                    "docker.io/library/busybox:1.36",
		"library/busybox":                 "docker.io/library/busybox:latest",
		"index.docker.io/library/busybox": "docker.io/library/busybox:latest",
		"user/app:v1":                     "docker.io/user/app:v1",
		"localhost/app":                   "localhost/app:latest",
		"127.0.0.1:5000/a/b:c":            "127.0.0.1:5000/a/b:c",
		"registry.k8s.io/pause:3.10":      "registry.k8s.io/pause:3.10",
		"gcr.io/x@sha256:" + strings.Repeat("a", 64): "gcr.io/x@sha256:" + strings.Repeat("a", 64),
	} {
		n, err := ParseReference(in)
		if err != nil || n.String() != want {
			t.Errorf("ParseReference(%q) = %q, %v; want %q", in, n.String(), err, want)
		}
	}
	for _, bad := range []string{"", "UPPER/case", "a@sha256:short", "a:b:c/d", "host/"} {
		if _, err := ParseReference(bad); err == nil {
			t.Errorf("ParseReference(%q) accepted", bad)
		}
	}
}

func TestAcquireKeepsLayersUntilReleaseAcrossReopen(t *testing.T) {
	requireRoot(t)
	reg := testimages.StartRegistry(t)
	reg.PushStandard(t)
	dir := filepath.Join(t.TempDir(), "images")
	s, err := Open(Options{Root: dir})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ref := reg.Ref(testimages.MultiLayerRef)
	img, err := s.Pull(ctx, ref, nil)
	if err != nil {
		t.Fatal(err)
	}
	got, lower, err := s.Acquire(ctx, ref, "ctr1")
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != img.ID || len(lower) != 4 || len(got.ChainIDs) != 4 {
		t.Fatalf("acquire: %+v %v", got, lower)
	}
	// Topmost first: the last chain ID is the first lower dir.
	if lower[0] != s.LayerDiffDir(got.ChainIDs[3]) || lower[3] != s.LayerDiffDir(got.ChainIDs[0]) {
		t.Fatalf("lower dirs not topmost first: %v", lower)
	}
	if _, err := os.Stat(filepath.Join(lower[3], "bin", "busybox")); err != nil {
		t.Fatalf("bottom layer lacks busybox: %v", err)
	}
	if err := s.Remove(ref); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ref); !errdefs.IsNotFound(err) {
		t.Fatalf("get after remove: %v", err)
	}
	// Reopen, as after a restart: the lease still keeps the layers.
	s, err = Open(Options{Root: dir})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range lower {
		if _, err := os.Stat(l); err != nil {
			t.Fatalf("layer in use freed: %v", err)
		}
	}
	if err := s.Release("ctr1"); err != nil {
		t.Fatal(err)
	}
	if err := s.Release("ctr1"); err != nil {
		t.Fatalf("second release: %v", err)
	}
	for _, l := range lower {
		if _, err := os.Stat(l); !os.IsNotExist(err) {
			t.Fatalf("layer %s not freed after release: %v", l, err)
		}
	}
	if _, _, err := s.Acquire(ctx, ref, "ctr2"); !errdefs.IsNotFound(err) {
		t.Fatalf("acquire of a removed image: %v", err)
	}
	if _, _, err := s.Acquire(ctx, img.ID, "../x"); err == nil {
		t.Fatal("owner with a slash accepted")
	}
}

func TestPullZstdAndUncompressedLayers(t *testing.T) {
	requireRoot(t)
	reg := testimages.StartRegistry(t)
	base, err := testimages.BaseFiles()
	if err != nil {
		t.Fatal(err)
	}
	gz, err := testimages.Layer(base)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := gz.Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		t.Fatal(err)
	}
	// Stored as is: an uncompressed tar blob in the registry.
	plain := static.NewLayer(raw, types.OCIUncompressedLayer)
	zstdLayer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		l, err := testimages.Layer([]testimages.File{{Name: "zstd-file", Data: []byte("zstd\n")}})
		if err != nil {
			return nil, err
		}
		return l.Uncompressed()
	}, tarball.WithCompression(compression.ZStd), tarball.WithMediaType(types.OCILayerZStd))
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(mutate.MediaType(empty.Image, types.OCIManifestSchema1), plain, zstdLayer)
	if err != nil {
		t.Fatal(err)
	}
	reg.Push(t, "zstd:latest", img)
	s, err := Open(Options{Root: filepath.Join(t.TempDir(), "images")})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := s.Pull(ctx, reg.Ref("zstd:latest"), nil); err != nil {
		t.Fatal(err)
	}
	_, lower, err := s.Acquire(ctx, reg.Ref("zstd:latest"), "c")
	if err != nil {
		t.Fatal(err)
	}
	if data, err := os.ReadFile(filepath.Join(lower[0], "zstd-file")); err != nil || string(data) != "zstd\n" {
		t.Fatalf("zstd layer content %q %v", data, err)
	}
	if _, err := os.Stat(filepath.Join(lower[1], "bin", "busybox")); err != nil {
		t.Fatalf("uncompressed layer: %v", err)
	}
}

func TestConcurrentPullsRemovesAndLeases(t *testing.T) {
	requireRoot(t)
	reg := testimages.StartRegistry(t)
	reg.PushStandard(t)
	s, err := Open(Options{Root: filepath.Join(t.TempDir(), "images")})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	refs := []string{reg.Ref(testimages.BusyboxRef), reg.Ref(testimages.UserRef), reg.Ref(testimages.MultiLayerRef)}
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	for i := 0; i < 30; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ref := refs[i%len(refs)]
			switch i % 5 {
			case 3:
				errs <- s.Remove(ref)
			case 4:
				owner := "c" + strconv.Itoa(i)
				if _, _, err := s.Acquire(ctx, ref, owner); err == nil {
					errs <- s.Release(owner)
				}
			default:
				_, err := s.Pull(ctx, ref, nil)
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	// Whatever survived is complete: every image's layers are on disk.
	for _, img := range s.List() {
		for _, c := range img.ChainIDs {
			if _, err := os.Stat(s.LayerDiffDir(c)); err != nil {
				t.Fatalf("image %s lost layer %s: %v", img.ID, c, err)
			}
		}
	}
	for _, ref := range refs {
		if err := s.Remove(ref); err != nil {
			t.Fatal(err)
		}
	}
	for _, sub := range []string{"blobs/sha256", "layers", "leases", "records"} {
		es, _ := os.ReadDir(filepath.Join(s.Dir(), sub))
		if len(es) != 0 {
			t.Fatalf("%s not empty after removing everything: %d entries", sub, len(es))
		}
	}
}
