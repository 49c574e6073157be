package bench

import (
	"archive/tar"
	"context"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/berthcri/berth/internal/image/estargzconv"
)

// TestLazySpans: the floor fetches, from each eStargz layer's TOC, the
// compressed bytes of the files the container reads: all of the small
// ones, and of the weights only the chunks that hold the bytes read.
func TestLazySpans(t *testing.T) {
	const weights, read = 8 << 20, 3 << 20
	tiny := func(w io.Writer) error {
		tw := tar.NewWriter(w)
		rng := rand.NewChaCha8([32]byte{'t'})
		for _, f := range []struct {
			name string
			size int64
		}{{"bin/busybox", 1000}, {lazyProgram, 100 << 10}, {lazyWeightsPath, weights}} {
			if err := tw.WriteHeader(&tar.Header{Name: f.name, Typeflag: tar.TypeReg, Mode: 0o755, Size: f.size}); err != nil {
				return err
			}
			if _, err := io.CopyN(tw, rng, f.size); err != nil {
				return err
			}
		}
		return tw.Close()
	}
	l, err := newStreamLayer(tiny)
	if err != nil {
		t.Fatal(err)
	}
	src, err := linuxImage([]mutate.Addendum{{Layer: l, MediaType: types.OCIUncompressedLayer}}, func(*v1.ConfigFile) {})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	res, err := estargzconv.Convert(context.Background(), src, estargzconv.Options{
		Prioritized: lazyPrioritized, TempDir: dir, ChunkSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	layers, err := res.Image.Layers()
	if err != nil {
		t.Fatal(err)
	}
	li := &LazyImage{Image: res.Image, WeightsBytes: weights}
	for i, cl := range layers {
		d, _ := cl.Digest()
		rc, err := cl.Compressed()
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, d.Hex)
		f, err := os.Create(p)
		if err != nil {
			t.Fatal(err)
		}
		n, err := io.Copy(f, rc)
		rc.Close()
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		li.Layers = append(li.Layers, LayerBlob{Digest: d.String(), Path: p, Size: n})
		t.Logf("layer %d: %d bytes", i, n)
	}
	spans, err := lazySpans(li, read)
	if err != nil {
		t.Fatal(err)
	}
	if len(spans) != 3 {
		t.Fatalf("spans %+v, want one per file read (3)", spans)
	}
	// Random bytes do not compress: the weights' span is the chunks
	// holding the first 3 MiB, more than those and far less than all.
	w := spans[len(spans)-1]
	if got := w.end - w.start; got < read || got > read+(1<<20)+(64<<10) {
		t.Fatalf("weights span %d bytes, want the 3 chunks holding the first %d bytes", got, read)
	}
	for _, s := range spans[:2] {
		if s.end <= s.start || s.end > w.start {
			t.Fatalf("span %+v: want a non-empty range before the weights (prioritized)", s)
		}
	}
}

// TestLazyGoals: each goal is met, missed, or not measured (no reference
// runtime, no floor) from the run's p50s.
func TestLazyGoals(t *testing.T) {
	const ready = "ready"
	cmp := NewComparison("berth-lazy", "berth-full")
	cmp.add("lazy pull: "+ready, "berth-lazy", 3*time.Second)
	cmp.add("lazy pull: "+ready, "berth-full", 40*time.Second)
	cmp.Floors["lazy pull: "+ready] = &FloorSeries{Samples: []time.Duration{time.Second}}
	reads := []Throughput{
		{Name: "berth-lazy: read again", Bytes: 1000e6, Samples: []time.Duration{time.Second}},
		{Name: "berth-full: read again", Bytes: 1000e6, Samples: []time.Duration{time.Second / 2}},
	}
	goals := lazyGoals(cmp, ready, reads, "berth-lazy", "berth-full", "")
	want := []struct{ measured, met bool }{{false, false}, {true, false}, {true, false}, {false, false}}
	for i, g := range goals {
		if g.Measured != want[i].measured || g.Met != want[i].met {
			t.Errorf("goal %q: measured %v met %v (ratio %.2f), want %v %v", g.Goal, g.Measured, g.Met, g.Ratio, want[i].measured, want[i].met)
		}
	}
	if r := goals[1].Ratio; r != 3 {
		t.Errorf("ready/floor ratio %.2f, want 3", r)
	}
}
