package lazy_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthcri/berth/internal/lazy"
	"github.com/berthcri/berth/internal/testutil/leakcheck"
)

// unpackedSize is the length of blob's decompressed stream, as the
// background fetch measures it.
func unpackedSize(t *testing.T, blob []byte) int64 {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(blob))
	if err != nil {
		t.Fatal(err)
	}
	n, err := io.Copy(io.Discard, zr)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// localBlob writes blob to a file and opens it, as the background fetch
// hands the layer its verified blob.
func localBlob(t *testing.T, blob []byte) *os.File {
	t.Helper()
	p := filepath.Join(t.TempDir(), "blob")
	if err := os.WriteFile(p, blob, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// openBelow are the files this process has open under dir.
func openBelow(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	for _, target := range leakcheck.OwnFDs(t) {
		if strings.HasPrefix(target, dir+"/") {
			out = append(out, target)
		}
	}
	return out
}

// cacheEntries are the names in a layer's cache dir.
func cacheEntries(t *testing.T, dir string) []string {
	t.Helper()
	return cacheEntriesWhere(t, dir, func(os.DirEntry) bool { return true })
}

// A complete layer's files, written out: reads through the mount (and
// through an overlay over it, as a container reads) return the right
// bytes with the registry gone, new opens go to the local files (passed
// through by the kernel where it takes them: then the server answers no
// read), a file already open from the chunks stays readable and does not
// keep new opens of other files off the local path, the chunk cache is
// dropped, and closing everything leaves no file descriptor behind.
func TestLazyLayerLocalFilesAfterMaterialize(t *testing.T) {
	requireFUSE(t)
	blob, toc := testLayer(t)
	src := &memSource{blob: blob}
	cache := filepath.Join(t.TempDir(), "cache")
	l, err := lazy.Open(context.Background(), src, toc, lazy.Options{CacheDir: cache})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	m, err := lazy.Mount(dir, l)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Unmount(); err != nil {
			t.Errorf("unmount: %v", err)
		}
		l.Close()
	})
	// Opened from the chunks before the layer is complete, and read.
	early, err := os.Open(filepath.Join(dir, "data/weights"))
	if err != nil {
		t.Fatal(err)
	}
	defer early.Close()
	head := make([]byte, 1000)
	if _, err := early.ReadAt(head, 0); err != nil || !bytes.Equal(head, weights[:1000]) {
		t.Fatalf("read from the chunks: %v", err)
	}
	if len(cachedChunks(t, cache)) == 0 {
		t.Fatal("no chunk cached")
	}

	l.UseLocal(localBlob(t, blob))
	if err := l.Materialize(context.Background(), unpackedSize(t, blob)); err != nil {
		t.Fatalf("materialize: %v", err)
	}
	if !l.LocalFiles() {
		t.Fatal("layer does not report its local files")
	}
	if got := cacheEntries(t, cache); len(got) != 1 || got[0] != "files" {
		t.Fatalf("cache holds %v, want only the files dir (chunks dropped)", got)
	}
	if n := l.CachedBytes(); n != 0 {
		t.Fatalf("CachedBytes %d after the chunk cache was dropped", n)
	}
	src.mu.Lock()
	src.down = true // from here on nothing may come from the registry
	src.mu.Unlock()
	requests := src.requests.Load()

	// A file that was open from the chunks reads on, from the local file.
	rest := make([]byte, len(weights)-1000)
	if _, err := early.ReadAt(rest, 1000); err != nil || !bytes.Equal(rest, weights[1000:]) {
		t.Fatalf("read on through the early open: %v", err)
	}
	// Its inode is in the kernel's cached mode: a new open of it must not
	// ask for passthrough (the kernel would fail it), and reads right.
	if got, err := os.ReadFile(filepath.Join(dir, "data/hard")); err != nil || !bytes.Equal(got, weights) {
		t.Fatalf("new open of a file open from the chunks: %d bytes, %v", len(got), err)
	}

	probe := filepath.Join(cache, "files", firstEntry(t, filepath.Join(cache, "files")))
	passthrough := m.CanPassthrough(probe)
	t.Logf("kernel takes the local files for passthrough: %v", passthrough)
	served := l.ServedReads()
	for name, want := range map[string]string{"etc/conf": "prefetched=1\n", "opq/new": "new\n", "bin/tool": "#!/bin/sh\n"} {
		if got, err := os.ReadFile(filepath.Join(dir, name)); err != nil || string(got) != want {
			t.Fatalf("%s from its local file: %q, %v", name, got, err)
		}
	}
	if n := l.ServedReads() - served; passthrough && n != 0 {
		t.Fatalf("the server answered %d reads of files opened with passthrough", n)
	}

	// Once the early open is closed (the kernel lets go of the inode's
	// cached mode), the same file opens on its local file too.
	early.Close()
	if got, err := os.ReadFile(filepath.Join(dir, "data/weights")); err != nil || !bytes.Equal(got, weights) {
		t.Fatalf("data/weights after the early open closed: %d bytes, %v", len(got), err)
	}

	// Through an overlay over the layer, as a container reads.
	merged := overlayOver(t, dir)
	for name, want := range map[string][]byte{"data/weights": weights, "etc/conf": []byte("prefetched=1\n")} {
		if got, err := os.ReadFile(filepath.Join(merged, name)); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s through overlay: %d bytes, %v", name, len(got), err)
		}
	}
	if err := unix.Unmount(merged, 0); err != nil {
		t.Fatal(err)
	}
	if n := src.requests.Load() - requests; n != 0 {
		t.Fatalf("%d requests to the registry after the files were local", n)
	}
	if l.Corrupt() {
		t.Fatal("layer marked corrupt")
	}
	// Leak check: every local file the server opened is closed (the
	// kernel sends the release of a closed file after close returns: wait
	// for it, bounded).
	for i := 0; len(openBelow(t, cache)) > 0; i++ {
		if i == 600 {
			t.Fatalf("local files still open: %v", openBelow(t, cache))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func firstEntry(t *testing.T, dir string) string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil || len(es) == 0 {
		t.Fatalf("%s: %v entries, %v", dir, len(es), err)
	}
	return es[0].Name()
}

// overlayOver mounts an overlay with lower as its only lower dir.
func overlayOver(t *testing.T, lower string) string {
	t.Helper()
	work := t.TempDir()
	upper, wd, merged := filepath.Join(work, "upper"), filepath.Join(work, "work"), filepath.Join(work, "merged")
	for _, d := range []string{upper, wd, merged} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Mount("overlay", merged, "overlay", 0, fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", lower, upper, wd)); err != nil {
		t.Fatalf("overlay over the lazy layer: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(merged, unix.MNT_DETACH) })
	return merged
}

// Materialize cut short (its context ends: the layer is being removed)
// leaves nothing; a temp dir left by a kill -9 is removed when the layer
// is opened again; a complete files dir from before is used as it is.
func TestLazyLayerMaterializeIsAllOrNothing(t *testing.T) {
	blob, toc := testLayer(t)
	cache := filepath.Join(t.TempDir(), "cache")
	open := func() *lazy.Layer {
		l := openLayer(t, &memSource{blob: blob}, toc, lazy.Options{CacheDir: cache})
		l.UseLocal(localBlob(t, blob))
		return l
	}
	l := open()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := l.Materialize(ctx, unpackedSize(t, blob)); !errors.Is(err, context.Canceled) {
		t.Fatalf("materialize with its context ended: %v", err)
	}
	if got := cacheEntries(t, cache); len(got) != 0 || l.LocalFiles() {
		t.Fatalf("cache after a cut-short materialize: %v (local files %v)", got, l.LocalFiles())
	}
	// What a kill -9 mid-way leaves.
	partial := filepath.Join(cache, "files.tmp-123")
	if err := os.MkdirAll(partial, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(partial, "half"), []byte("half a file"), 0o600); err != nil {
		t.Fatal(err)
	}
	l = open()
	if got := cacheEntries(t, cache); len(got) != 0 {
		t.Fatalf("cache after open: %v, want the partial files dir gone", got)
	}
	if err := l.Materialize(context.Background(), unpackedSize(t, blob)); err != nil {
		t.Fatal(err)
	}
	ent := lookup(t, l, "data/weights")
	p := make([]byte, len(weights))
	if n, err := l.ReadFile(context.Background(), ent, p, 0); err != nil || !bytes.Equal(p[:n], weights) {
		t.Fatalf("read from the local files: %d bytes, %v", n, err)
	}
	// Opened again (a berthd that reattaches): the complete dir is used.
	files := filepath.Join(cache, "files")
	st, err := os.Stat(files)
	if err != nil {
		t.Fatal(err)
	}
	l = open()
	if err := l.Materialize(context.Background(), unpackedSize(t, blob)); err != nil || !l.LocalFiles() {
		t.Fatalf("materialize over a complete files dir: %v", err)
	}
	if st2, err := os.Stat(files); err != nil || !os.SameFile(st, st2) {
		t.Fatalf("the complete files dir was rewritten: %v", err)
	}
}

// A local blob whose chunks do not match the TOC (the background fetch
// verifies the blob's digest, so only a TOC that lies about its own
// blob): Materialize fails, marks the layer corrupt, and leaves no
// files; reads fail as from the chunks.
func TestLazyLayerMaterializeOfACorruptBlobLeavesNothing(t *testing.T) {
	blob, toc := testLayer(t)
	var corrupt int
	cache := filepath.Join(t.TempDir(), "cache")
	l := openLayer(t, &memSource{blob: blob}, toc, lazy.Options{CacheDir: cache, OnCorrupt: func(error) { corrupt++ }})
	bad := bytes.Clone(blob)
	for i := len(bad) / 3; i < len(bad)/2; i++ {
		bad[i] ^= 0xff
	}
	l.UseLocal(localBlob(t, bad))
	if err := l.Materialize(context.Background(), unpackedSize(t, blob)); !errors.Is(err, lazy.ErrCorrupt) {
		t.Fatalf("materialize of a corrupt blob: %v, want ErrCorrupt", err)
	}
	if !l.Corrupt() || corrupt != 1 || l.LocalFiles() {
		t.Fatalf("corrupt %v (OnCorrupt %d times), local files %v", l.Corrupt(), corrupt, l.LocalFiles())
	}
	for _, name := range cacheEntries(t, cache) {
		if strings.HasPrefix(name, "files") {
			t.Fatalf("cache holds %s after a failed materialize", name)
		}
	}
}

// A TOC whose files add up to more than the layer's unpacked stream (as
// one whose chunks overlap would: each decoded from its own offset on
// through the members after it, a few compressed bytes named for file
// after file; the format's own check refuses only a reused offset) is not
// written out: nothing is left, the layer is not marked corrupt, and
// reads go on from the blob.
func TestLazyLayerMaterializeRefusesFilesBeyondTheLayer(t *testing.T) {
	blob, toc := testLayer(t)
	cache := filepath.Join(t.TempDir(), "cache")
	l := openLayer(t, &memSource{blob: blob}, toc, lazy.Options{CacheDir: cache})
	l.UseLocal(localBlob(t, blob))
	// The weights alone are 640 KiB.
	err := l.Materialize(context.Background(), 100<<10)
	if err == nil || !strings.Contains(err.Error(), "more than the layer's") {
		t.Fatalf("materialize of files beyond the layer: %v, want it refused", err)
	}
	if l.LocalFiles() || l.Corrupt() {
		t.Fatalf("local files %v, corrupt %v", l.LocalFiles(), l.Corrupt())
	}
	if got := cacheEntries(t, cache); len(got) != 0 {
		t.Fatalf("cache after a refused materialize: %v", got)
	}
	ent := lookup(t, l, "etc/conf")
	p := make([]byte, 64)
	if n, err := l.ReadFile(context.Background(), ent, p, 0); err != nil || string(p[:n]) != "prefetched=1\n" {
		t.Fatalf("read after a refused materialize: %q, %v", p[:n], err)
	}
}

// Readers fetching chunks while Materialize drops the chunk cache leave
// no chunk behind it: a store under way finishes before the drop, and
// every later one sees the files.
func TestLazyLayerMaterializeDropsChunksStoredMeanwhile(t *testing.T) {
	blob, toc := testLayer(t)
	cache := filepath.Join(t.TempDir(), "cache")
	l := openLayer(t, &memSource{blob: blob}, toc, lazy.Options{CacheDir: cache})
	l.UseLocal(localBlob(t, blob))
	ent := lookup(t, l, "data/weights")
	done := make(chan struct{})
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			p := make([]byte, 100)
			for n := 0; ; n++ {
				select {
				case <-done:
					return
				default:
				}
				off := int64((n*4+i)%10) << 16
				if _, err := l.ReadFile(context.Background(), ent, p, off); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	err := l.Materialize(context.Background(), unpackedSize(t, blob))
	close(done)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if got := cacheEntries(t, cache); len(got) != 1 || got[0] != "files" {
		t.Fatalf("cache holds %v, want only the files dir", got)
	}
}
