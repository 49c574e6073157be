package lazy_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/containerd/stargz-snapshotter/estargz"

	"github.com/berthcri/berth/internal/lazy"
)

// openLayer opens src's layer (no mount), closed when the test ends; with
// a cache of its own unless opts names one.
func openLayer(t *testing.T, src lazy.Source, toc string, opts lazy.Options) *lazy.Layer {
	t.Helper()
	if opts.CacheDir == "" {
		opts.CacheDir = filepath.Join(t.TempDir(), "cache")
	}
	l, err := lazy.Open(context.Background(), src, toc, opts)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(l.Close)
	return l
}

func lookup(t *testing.T, l *lazy.Layer, name string) *estargz.TOCEntry {
	t.Helper()
	ent, ok := l.Lookup(name)
	if !ok {
		t.Fatalf("%s not in the TOC", name)
	}
	return ent
}

// cachedChunks are the chunk files in the layer's cache (no temp files,
// no directories).
func cachedChunks(t *testing.T, dir string) []string {
	t.Helper()
	return cacheEntriesWhere(t, dir, func(e os.DirEntry) bool {
		return e.Type().IsRegular() && !strings.Contains(e.Name(), ".tmp")
	})
}

// cacheEntriesWhere are the names in a layer's cache dir that keep says
// to keep.
func cacheEntriesWhere(t *testing.T, dir string, keep func(os.DirEntry) bool) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		if keep(e) {
			out = append(out, e.Name())
		}
	}
	return out
}

// Reads of every shape return the file's bytes, fetched (cold) and then
// from the chunk cache (warm), each chunk fetched once.
func TestLayerReadFileRanges(t *testing.T) {
	blob, toc := testLayer(t)
	src := &memSource{blob: blob}
	l := openLayer(t, src, toc, lazy.Options{})
	ent := lookup(t, l, "data/weights")
	const chunk = 64 << 10
	size := int64(len(weights))
	cases := []struct {
		name    string
		off, n  int64
		wantLen int64
	}{
		{"start of a chunk", 0, 4096, 4096},
		{"inside a chunk", chunk + 100, 1000, 1000},
		{"across a boundary", 2*chunk - 10, 20, 20},
		{"three chunks", 3*chunk - 1, chunk + 2, chunk + 2},
		{"a whole chunk", 5 * chunk, chunk, chunk},
		{"the last bytes", size - 7, 7, 7},
		{"past the end", size - 7, 100, 7},
		{"at the end", size, 10, 0},
		{"the whole file", 0, size, size},
	}
	for _, pass := range []string{"cold", "warm"} {
		for _, tc := range cases {
			t.Run(pass+"/"+tc.name, func(t *testing.T) {
				p := make([]byte, tc.n)
				got, err := l.ReadFile(context.Background(), ent, p, tc.off)
				if err != nil || int64(got) != tc.wantLen {
					t.Fatalf("read %d at %d: %d bytes, %v; want %d", tc.n, tc.off, got, err, tc.wantLen)
				}
				if !bytes.Equal(p[:got], weights[tc.off:tc.off+int64(got)]) {
					t.Fatalf("read %d at %d: wrong bytes", tc.n, tc.off)
				}
			})
		}
		if pass == "cold" {
			// Every chunk of the file fetched once, the footer and TOC
			// before them.
			if n := src.requests.Load(); n != 2+size/chunk {
				t.Fatalf("%d requests for %d chunks, want one each", n-2, size/chunk)
			}
		}
	}
	if n := src.requests.Load(); n != 2+size/chunk {
		t.Fatalf("warm reads made %d more requests", n-2-size/chunk)
	}
	if l.Corrupt() {
		t.Fatal("layer marked corrupt")
	}
}

// Many readers waiting for the same chunk share one fetch.
func TestLayerOneFetchPerChunk(t *testing.T) {
	blob, toc := testLayer(t)
	src := &memSource{blob: blob}
	l := openLayer(t, src, toc, lazy.Options{})
	ent := lookup(t, l, "data/weights")
	before := src.requests.Load()
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for i := range 32 {
		wg.Go(func() {
			off := int64(3<<16) + int64(i)*100
			p := make([]byte, 100)
			if _, err := l.ReadFile(context.Background(), ent, p, off); err != nil {
				errs <- err
			} else if !bytes.Equal(p, weights[off:off+100]) {
				errs <- errors.New("wrong bytes")
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n := src.requests.Load() - before; n != 1 {
		t.Fatalf("32 readers of one chunk made %d requests, want 1", n)
	}
}

// A chunk file in the cache that is not the chunk's size (a write cut
// short outside berthd's own temp-and-rename) is not read: the chunk is
// fetched and verified again.
func TestLayerCachedChunkOfTheWrongSizeIsFetchedAgain(t *testing.T) {
	blob, toc := testLayer(t)
	src := &memSource{blob: blob}
	dir := filepath.Join(t.TempDir(), "cache")
	l := openLayer(t, src, toc, lazy.Options{CacheDir: dir})
	ent := lookup(t, l, "data/weights")
	p := make([]byte, 64<<10)
	if _, err := l.ReadFile(context.Background(), ent, p, 0); err != nil {
		t.Fatal(err)
	}
	files := cachedChunks(t, dir)
	if len(files) != 1 {
		t.Fatalf("cache holds %v, want one chunk", files)
	}
	if err := os.Truncate(filepath.Join(dir, files[0]), 100); err != nil {
		t.Fatal(err)
	}
	before := src.requests.Load()
	clear(p)
	if n, err := l.ReadFile(context.Background(), ent, p, 0); err != nil || !bytes.Equal(p[:n], weights[:64<<10]) {
		t.Fatalf("read after the cache file was cut: %d bytes, %v", n, err)
	}
	if n := src.requests.Load() - before; n != 1 {
		t.Fatalf("%d requests, want the chunk fetched again", n)
	}
}

// A corrupt chunk fails the read with ErrCorrupt, marks the layer, and
// leaves nothing in the cache: only verified chunks are written there.
func TestLayerCorruptChunkIsNotCached(t *testing.T) {
	blob, toc := testLayer(t)
	src := &memSource{blob: blob}
	dir := filepath.Join(t.TempDir(), "cache")
	l := openLayer(t, src, toc, lazy.Options{CacheDir: dir})
	src.mu.Lock()
	src.corrupt = [2]int64{int64(len(blob)) / 3, int64(len(blob)) / 2}
	src.mu.Unlock()
	ent := lookup(t, l, "data/weights")
	p := make([]byte, len(weights))
	if _, err := l.ReadFile(context.Background(), ent, p, 0); !errors.Is(err, lazy.ErrCorrupt) {
		t.Fatalf("read across corrupt chunks: %v, want ErrCorrupt", err)
	}
	if !l.Corrupt() {
		t.Fatal("layer not marked corrupt")
	}
	// The chunks before the corrupt range were verified and may be
	// cached; each file there is a whole chunk that matches its digest.
	for _, name := range cachedChunks(t, dir) {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(weights, data) {
			t.Fatalf("cache file %s is not a chunk of the file", name)
		}
	}
}
