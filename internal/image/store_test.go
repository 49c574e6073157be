package image

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/compression"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"golang.org/x/sys/unix"

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
	if owners, err := s.Owners(); err != nil || len(owners) != 1 || owners[0] != "ctr1" {
		t.Fatalf("owners after reopen: %v %v", owners, err)
	}
	if err := s.Release("ctr1"); err != nil {
		t.Fatal(err)
	}
	if owners, err := s.Owners(); err != nil || len(owners) != 0 {
		t.Fatalf("owners after release: %v %v", owners, err)
	}
	if err := s.Release("ctr1"); err != nil {
		t.Fatalf("second release: %v", err)
	}
	// Release frees in the background; WaitGC waits for that pass.
	s.WaitGC()
	for _, l := range lower {
		if _, err := os.Stat(l); !os.IsNotExist(err) {
			t.Fatalf("layer %s not freed after release: %v", l, err)
		}
	}
	// Freed layers go through trash/ and are deleted outside the lock.
	if es, err := os.ReadDir(filepath.Join(dir, "trash")); err != nil || len(es) != 0 {
		t.Fatalf("trash after release: %v %v", es, err)
	}
	// What a crash left in trash/ is deleted when the store opens.
	leftover := filepath.Join(dir, "trash", "abc.7", "bin")
	if err := os.MkdirAll(leftover, 0o700); err != nil {
		t.Fatal(err)
	}
	if s, err = Open(Options{Root: dir}); err != nil {
		t.Fatal(err)
	}
	if es, err := os.ReadDir(filepath.Join(dir, "trash")); err != nil || len(es) != 0 {
		t.Fatalf("trash after reopen: %v %v", es, err)
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
	// Releases free in the background; a Remove of an image already gone
	// does not wait for a pass.
	s.WaitGC()
	for _, sub := range []string{"blobs/sha256", "layers", "leases", "records"} {
		es, _ := os.ReadDir(filepath.Join(s.Dir(), sub))
		if len(es) != 0 {
			t.Fatalf("%s not empty after removing everything: %d entries", sub, len(es))
		}
	}
}

func TestPullDockerSchema2ManifestAndManifestList(t *testing.T) {
	requireRoot(t)
	reg := testimages.StartRegistry(t)
	base, err := testimages.Busybox()
	if err != nil {
		t.Fatal(err)
	}
	layers, err := base.Layers()
	if err != nil {
		t.Fatal(err)
	}
	cf, err := base.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.DockerManifestSchema2), types.DockerConfigJSON)
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			t.Fatal(err)
		}
		dl, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil },
			tarball.WithMediaType(types.DockerLayer))
		if err != nil {
			t.Fatal(err)
		}
		if img, err = mutate.AppendLayers(img, dl); err != nil {
			t.Fatal(err)
		}
	}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	if mt, _ := img.MediaType(); mt != types.DockerManifestSchema2 {
		t.Fatalf("test image media type %s", mt)
	}
	reg.Push(t, "docker:v2", img)
	list := mutate.IndexMediaType(empty.Index, types.DockerManifestList)
	list = mutate.AppendManifests(list, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{
		MediaType: types.DockerManifestSchema2,
		Platform:  &v1.Platform{OS: "linux", Architecture: goruntime.GOARCH},
	}})
	listDigest := reg.PushIndex(t, "docker:list", list)

	s, err := Open(Options{Root: filepath.Join(t.TempDir(), "images")})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	want, _ := img.ConfigName()
	for _, ref := range []string{reg.Ref("docker:v2"), reg.Ref("docker:list")} {
		got, err := s.Pull(ctx, ref, nil)
		if err != nil {
			t.Fatalf("pull %s: %v", ref, err)
		}
		if got.ID != want.String() {
			t.Fatalf("pull %s: ID %s, want %s", ref, got.ID, want)
		}
	}
	got, err := s.Get(reg.Ref("docker:list"))
	if err != nil {
		t.Fatal(err)
	}
	wantDigest := reg.Host + "/docker@" + listDigest.String()
	if !slices.Contains(got.RepoDigests, wantDigest) || len(got.RepoTags) != 2 {
		t.Fatalf("tags %v digests %v; want both tags and %s", got.RepoTags, got.RepoDigests, wantDigest)
	}
}

// TestAcquiredLayersMountAsOverlay mounts the lower dirs Acquire returns
// with overlayfs, as the container code does, and checks that whiteouts
// and opaque dirs hide what the image deleted.
func TestAcquiredLayersMountAsOverlay(t *testing.T) {
	requireRoot(t)
	reg := testimages.StartRegistry(t)
	reg.PushStandard(t)
	s, err := Open(Options{Root: filepath.Join(t.TempDir(), "images")})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ref := reg.Ref(testimages.MultiLayerRef)
	if _, err := s.Pull(ctx, ref, nil); err != nil {
		t.Fatal(err)
	}
	_, lower, err := s.Acquire(ctx, ref, "overlay-test")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	upper, work, merged := filepath.Join(dir, "upper"), filepath.Join(dir, "work"), filepath.Join(dir, "merged")
	for _, d := range []string{upper, work, merged} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	opts := "lowerdir=" + strings.Join(lower, ":") + ",upperdir=" + upper + ",workdir=" + work
	if err := unix.Mount("overlay", merged, "overlay", 0, opts); err != nil {
		t.Skipf("overlayfs not available here: %v", err)
	}
	defer unix.Unmount(merged, unix.MNT_DETACH)
	for p, want := range map[string]bool{
		"bin/busybox": true, "data/keep": true, "data/link": true, "data/hard": true,
		"data/gone": false, "opaque/old": false, "opaque/new": true,
	} {
		_, err := os.Lstat(filepath.Join(merged, p))
		if got := err == nil; got != want {
			t.Errorf("%s present = %v, want %v (%v)", p, got, want, err)
		}
	}
	if data, err := os.ReadFile(filepath.Join(merged, "data", "link")); err != nil || string(data) != "keep\n" {
		t.Errorf("data/link reads %q, %v", data, err)
	}
}

func TestPullRefusesConfigWithMalformedDiffID(t *testing.T) {
	requireRoot(t)
	reg := testimages.StartRegistry(t)
	img, err := testimages.Busybox()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := img.RawConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf, _ := img.ConfigFile()
	good := cf.RootFS.DiffIDs[0].String()
	// A config whose diff ID tries to name a path outside the store.
	evil := []byte(strings.Replace(string(raw), good, "sha256:../../../../tmp/evil", 1))
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	m = m.DeepCopy()
	sum := sha256.Sum256(evil)
	m.Config.Digest = v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(sum[:])}
	m.Config.Size = int64(len(evil))
	rawManifest, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	bad, err := partial.CompressedToImage(&evilImage{base: img, config: evil, manifest: rawManifest})
	if err != nil {
		t.Fatal(err)
	}
	reg.Push(t, "evil:latest", bad)
	s, err := Open(Options{Root: filepath.Join(t.TempDir(), "images")})
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Pull(context.Background(), reg.Ref("evil:latest"), nil)
	if err == nil || !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "diff ID") {
		t.Fatalf("pull with a malformed diff ID: %v", err)
	}
	if m, _ := filepath.Glob("/tmp/evil*"); len(m) != 0 {
		t.Fatalf("created outside the store: %v", m)
	}
}

// evilImage serves a hand-made config and manifest over a real image's layers.
type evilImage struct {
	base     v1.Image
	config   []byte
	manifest []byte
}

func (e *evilImage) RawConfigFile() ([]byte, error)      { return e.config, nil }
func (e *evilImage) MediaType() (types.MediaType, error) { return types.OCIManifestSchema1, nil }
func (e *evilImage) RawManifest() ([]byte, error)        { return e.manifest, nil }
func (e *evilImage) LayerByDigest(h v1.Hash) (partial.CompressedLayer, error) {
	return e.base.LayerByDigest(h)
}
