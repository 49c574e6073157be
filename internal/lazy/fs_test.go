package lazy_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/containerd/stargz-snapshotter/estargz"
	"golang.org/x/sys/unix"

	"github.com/berthcri/berth/internal/lazy"
	"github.com/berthcri/berth/internal/testutil/testimages"
)

// memSource serves a blob from memory, counting requests; corrupt, if
// set, flips the bytes of the blob it covers in every answer.
type memSource struct {
	blob     []byte
	requests atomic.Int64
	mu       sync.Mutex
	corrupt  [2]int64 // [start, end)
	down     bool
}

func (s *memSource) Size() int64 { return int64(len(s.blob)) }

func (s *memSource) OpenRange(ctx context.Context, start, end int64) (io.ReadCloser, error) {
	s.requests.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down {
		return nil, errors.New("registry gone")
	}
	out := bytes.Clone(s.blob[start:end])
	for i := max(start, s.corrupt[0]); i < min(end, s.corrupt[1]); i++ {
		out[i-start] ^= 0xff
	}
	return io.NopCloser(bytes.NewReader(out)), nil
}

// weights is 640 KiB that does not compress: most of the layer's blob.
var weights = func() []byte {
	b := make([]byte, 640<<10)
	rand.NewChaCha8([32]byte{1}).Read(b)
	return b
}()

// testLayer is one eStargz layer with every kind of entry the filesystem
// serves, etc/conf prioritized, in 64 KiB chunks; it returns the blob and
// its TOC digest.
func testLayer(t *testing.T) ([]byte, string) {
	t.Helper()
	return testimages.EStargzLayer(t, []testimages.File{
		{Name: "etc", Dir: true},
		{Name: "etc/conf", Data: []byte("prefetched=1\n")},
		{Name: "data", Dir: true},
		{Name: "data/weights", Data: weights},
		{Name: "data/link", Symlink: "weights"},
		{Name: "data/hard", Hardlink: "data/weights"},
		{Name: "data/.wh.gone"},
		{Name: "opq", Dir: true},
		{Name: "opq/.wh..wh..opq"},
		{Name: "opq/new", Data: []byte("new\n")},
		{Name: "bin", Dir: true},
		{Name: "bin/tool", Mode: 0o4755, Data: []byte("#!/bin/sh\n"), UID: 7, GID: 8},
	}, 64<<10, "etc/conf")
}

func requireFUSE(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting needs root")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("no /dev/fuse")
	}
}

// mounted opens src's layer and mounts it; both go at the end of t, and
// the mount is checked gone.
func mounted(t *testing.T, src lazy.Source, toc string, opts lazy.Options) (*lazy.Layer, string) {
	t.Helper()
	opts.CacheDir = filepath.Join(t.TempDir(), "cache")
	l, err := lazy.Open(context.Background(), src, toc, opts)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	dir := t.TempDir()
	m, err := lazy.Mount(dir, l)
	if err != nil {
		t.Fatalf("mount: %v", err)
	}
	t.Cleanup(func() {
		if err := m.Unmount(); err != nil {
			t.Errorf("unmount: %v", err)
		}
		if data, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(data), " "+dir+" ") {
			t.Errorf("%s still mounted", dir)
		}
	})
	return l, dir
}

func TestLazyLayerServesTheTOCTree(t *testing.T) {
	requireFUSE(t)
	blob, toc := testLayer(t)
	src := &memSource{blob: blob}
	l, dir := mounted(t, src, toc, lazy.Options{})
	if n := src.requests.Load(); n != 2 {
		t.Fatalf("open made %d requests, want 2 (footer, TOC)", n)
	}
	if err := l.Prefetch(context.Background()); err != nil {
		t.Fatalf("prefetch: %v", err)
	}
	if n := src.requests.Load(); n != 3 {
		t.Fatalf("prefetch made %d requests, want 1", n-2)
	}
	// The prefetched file reads without another request.
	if got, err := os.ReadFile(filepath.Join(dir, "etc/conf")); err != nil || string(got) != "prefetched=1\n" {
		t.Fatalf("etc/conf: %q, %v", got, err)
	}
	if n := src.requests.Load(); n != 3 {
		t.Fatalf("reading a prefetched file made %d requests", n-3)
	}
	got, err := os.ReadFile(filepath.Join(dir, "data/weights"))
	if err != nil || !bytes.Equal(got, weights) {
		t.Fatalf("data/weights: %d bytes (want %d), %v", len(got), len(weights), err)
	}
	if n := src.requests.Load(); n < 3+10 {
		t.Fatalf("data/weights (10 chunks) came in %d requests", n-3)
	}
	if target, err := os.Readlink(filepath.Join(dir, "data/link")); err != nil || target != "weights" {
		t.Fatalf("data/link → %q, %v", target, err)
	}
	var a, b, w, o unix.Stat_t
	if err := unix.Lstat(filepath.Join(dir, "data/weights"), &a); err != nil {
		t.Fatal(err)
	}
	if err := unix.Lstat(filepath.Join(dir, "data/hard"), &b); err != nil {
		t.Fatal(err)
	}
	if a.Ino != b.Ino || a.Nlink != 2 {
		t.Fatalf("hard link: inodes %d and %d, nlink %d", a.Ino, b.Ino, a.Nlink)
	}
	if err := unix.Lstat(filepath.Join(dir, "data/gone"), &w); err != nil || w.Mode&unix.S_IFMT != unix.S_IFCHR || w.Rdev != 0 {
		t.Fatalf("whiteout data/gone: mode %o rdev %d, %v", w.Mode, w.Rdev, err)
	}
	if err := unix.Lstat(filepath.Join(dir, "bin/tool"), &o); err != nil || o.Mode != unix.S_IFREG|0o4755 || o.Uid != 7 || o.Gid != 8 {
		t.Fatalf("bin/tool: mode %o uid %d gid %d, %v", o.Mode, o.Uid, o.Gid, err)
	}
	buf := make([]byte, 8)
	if n, err := unix.Getxattr(filepath.Join(dir, "opq"), "trusted.overlay.opaque", buf); err != nil || string(buf[:n]) != "y" {
		t.Fatalf("opq opaque xattr: %q, %v", buf[:n], err)
	}
	for _, hidden := range []string{".prefetch.landmark", "stargz.index.json", "opq/.wh..wh..opq", "data/.wh.gone"} {
		if _, err := os.Lstat(filepath.Join(dir, hidden)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s: %v, want it hidden", hidden, err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "etc/conf"), []byte("x"), 0o644); err == nil {
		t.Fatal("wrote into the lazy layer")
	}
	if l.Corrupt() {
		t.Fatal("layer marked corrupt")
	}
}

// The lazy layer as overlayfs takes it: a lower dir under a plain one,
// its whiteout hiding the plain layer's file, its opaque directory
// hiding the plain one's contents.
func TestLazyLayerIsAnOverlayLowerDir(t *testing.T) {
	requireFUSE(t)
	blob, toc := testLayer(t)
	_, dir := mounted(t, &memSource{blob: blob}, toc, lazy.Options{})
	base := t.TempDir()
	for _, f := range []string{"data/gone", "opq/old", "base-only"} {
		os.MkdirAll(filepath.Join(base, filepath.Dir(f)), 0o755)
		if err := os.WriteFile(filepath.Join(base, f), []byte(f), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	work := t.TempDir()
	upper, wd, merged := filepath.Join(work, "upper"), filepath.Join(work, "work"), filepath.Join(work, "merged")
	for _, d := range []string{upper, wd, merged} {
		os.Mkdir(d, 0o755)
	}
	if err := unix.Mount("overlay", merged, "overlay", 0, fmt.Sprintf("lowerdir=%s:%s,upperdir=%s,workdir=%s", dir, base, upper, wd)); err != nil {
		t.Fatalf("overlay over the lazy layer: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(merged, unix.MNT_DETACH) })
	for f, want := range map[string]string{"base-only": "base-only", "opq/new": "new\n", "etc/conf": "prefetched=1\n"} {
		if got, err := os.ReadFile(filepath.Join(merged, f)); err != nil || string(got) != want {
			t.Fatalf("%s through overlay: %q, %v", f, got, err)
		}
	}
	for _, gone := range []string{"data/gone", "opq/old"} {
		if _, err := os.Lstat(filepath.Join(merged, gone)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s through overlay: %v, want it hidden", gone, err)
		}
	}
	if err := unix.Unmount(merged, 0); err != nil {
		t.Fatal(err)
	}
}

// A chunk whose bytes do not match its TOC digest fails the read with
// EIO, once per read, and marks the layer corrupt (OnCorrupt once).
func TestLazyLayerCorruptChunkIsEIO(t *testing.T) {
	requireFUSE(t)
	blob, toc := testLayer(t)
	src := &memSource{blob: blob}
	var corrupt atomic.Int64
	l, dir := mounted(t, src, toc, lazy.Options{OnCorrupt: func(error) { corrupt.Add(1) }})
	// Corrupt the middle of the blob: data/weights' chunks.
	src.mu.Lock()
	src.corrupt = [2]int64{int64(len(blob)) / 3, int64(len(blob)) / 2}
	src.mu.Unlock()
	for range 2 {
		_, err := os.ReadFile(filepath.Join(dir, "data/weights"))
		if !errors.Is(err, syscall.EIO) {
			t.Fatalf("read of a corrupt chunk: %v, want EIO", err)
		}
	}
	if !l.Corrupt() || corrupt.Load() != 1 {
		t.Fatalf("corrupt %v, OnCorrupt called %d times", l.Corrupt(), corrupt.Load())
	}
}

// A registry that is gone: reads retry, then fail with EIO (not hang);
// once it is back, the same read works.
func TestLazyLayerSourceGoneIsEIOThenRecovers(t *testing.T) {
	requireFUSE(t)
	blob, toc := testLayer(t)
	src := &memSource{blob: blob}
	l, dir := mounted(t, src, toc, lazy.Options{Retries: 2})
	src.mu.Lock()
	src.down = true
	src.mu.Unlock()
	before := src.requests.Load()
	if _, err := os.ReadFile(filepath.Join(dir, "opq/new")); !errors.Is(err, syscall.EIO) {
		t.Fatalf("read with the registry gone: %v, want EIO", err)
	}
	// Each read the kernel asked for (it may add a readahead) is one
	// request and two retries.
	if n := src.requests.Load() - before; n == 0 || n%3 != 0 {
		t.Fatalf("%d requests, want 3 per read (one and two retries)", n)
	}
	src.mu.Lock()
	src.down = false
	src.mu.Unlock()
	if got, err := os.ReadFile(filepath.Join(dir, "opq/new")); err != nil || string(got) != "new\n" {
		t.Fatalf("read after the registry came back: %q, %v", got, err)
	}
	if l.Corrupt() {
		t.Fatal("a gone registry marked the layer corrupt")
	}
}

func TestLazyLayerOpenRefusesBadTOC(t *testing.T) {
	blob, toc := testLayer(t)
	other := "sha256:" + strings.Repeat("0", 64)
	plain := bytes.Repeat([]byte{0}, 4096)
	for name, tc := range map[string]struct {
		blob []byte
		toc  string
	}{
		"TOC digest not the annotation's": {blob, other},
		"not eStargz":                     {plain, toc},
		"truncated":                       {blob[:len(blob)-10], toc},
		"smaller than a footer":           {blob[:20], toc},
		"annotation not a digest":         {blob, "sha256:xyz"},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := lazy.Open(context.Background(), &memSource{blob: tc.blob}, tc.toc, lazy.Options{CacheDir: t.TempDir()}); err == nil {
				t.Fatal("opened")
			}
		})
	}
}

// A hostile TOC: its tar header claims more JSON than MaxTOCJSON. Open
// refuses it from the header, before the format's parser reads it.
func TestLazyLayerOpenRefusesAHugeTOC(t *testing.T) {
	blob, toc := testLayer(t)
	footer := blob[len(blob)-estargz.FooterSize:]
	_, tocOffset, _, err := new(estargz.GzipDecompressor).ParseFooter(footer)
	if err != nil {
		t.Fatal(err)
	}
	var member bytes.Buffer
	zw := gzip.NewWriter(&member)
	tw := tar.NewWriter(zw)
	if err := tw.WriteHeader(&tar.Header{Name: estargz.TOCTarName, Typeflag: tar.TypeReg, Size: lazy.MaxTOCJSON + 1, Mode: 0o644}); err != nil {
		t.Fatal(err)
	}
	tw.Write([]byte(`{"version":1,"entries":[`))
	zw.Close()
	hostile := append(append(bytes.Clone(blob[:tocOffset]), member.Bytes()...), footer...)
	_, err = lazy.Open(context.Background(), &memSource{blob: hostile}, toc, lazy.Options{CacheDir: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "over the limit") {
		t.Fatalf("got %v, want the TOC refused as over the limit", err)
	}
}
