package estargzconv_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/stargz-snapshotter/estargz"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
	digest "github.com/opencontainers/go-digest"

	"github.com/berthcri/berth/internal/image/estargzconv"
	"github.com/berthcri/berth/internal/testutil/testimages"
)

// smallImage is two layers of a few files, no busybox needed.
func smallImage(t *testing.T) v1.Image {
	t.Helper()
	big := bytes.Repeat([]byte("0123456789abcdef"), 40<<10) // 640 KiB: several chunks
	layers := [][]testimages.File{
		{{Name: "bin", Dir: true}, {Name: "bin/tool", Mode: 0o755, Data: []byte("#!/bin/sh\necho tool\n")}, {Name: "etc", Dir: true}, {Name: "etc/conf", Data: []byte("a=1\n")}},
		{{Name: "data", Dir: true}, {Name: "data/weights", Data: big}, {Name: "data/link", Symlink: "weights"}},
	}
	var ls []v1.Layer
	for _, files := range layers {
		l, err := testimages.Layer(files)
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
	}
	img, err := mutate.AppendLayers(mutate.MediaType(empty.Image, types.OCIManifestSchema1), ls...)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config = v1.Config{Cmd: []string{"/bin/tool"}, Env: []string{"A=1"}}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	return img
}

func TestConvertMakesVerifiedEStargzLayers(t *testing.T) {
	src := smallImage(t)
	res, err := estargzconv.Convert(context.Background(), src, estargzconv.Options{
		Prioritized: []string{"bin/tool", "/data/weights", "not/there"},
		ChunkSize:   64 << 10,
		TempDir:     t.TempDir(),
	})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.MissedPrioritized, []string{"not/there"}) {
		t.Fatalf("missed %q, want [not/there]", res.MissedPrioritized)
	}
	img := res.Image
	mf, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if mf.MediaType != types.OCIManifestSchema1 {
		t.Fatalf("manifest media type %s", mf.MediaType)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	scf, err := src.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cf.Config.Cmd, scf.Config.Cmd) || !slices.Equal(cf.Config.Env, scf.Config.Env) || len(cf.History) != len(scf.History) {
		t.Fatalf("config not kept: %+v, source %+v", cf.Config, scf.Config)
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	for i, l := range layers {
		desc := mf.Layers[i]
		rc, err := l.Compressed()
		if err != nil {
			t.Fatal(err)
		}
		blob, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			t.Fatal(err)
		}
		// The descriptor's digest and size are the blob's.
		sum := sha256.Sum256(blob)
		if desc.Digest.Hex != hex.EncodeToString(sum[:]) || desc.Size != int64(len(blob)) {
			t.Fatalf("layer %d: descriptor %s/%d, blob sha256:%x/%d", i, desc.Digest, desc.Size, sum, len(blob))
		}
		// The TOC is the one the annotation names, and every chunk
		// matches its digest.
		r, err := estargz.Open(io.NewSectionReader(bytes.NewReader(blob), 0, int64(len(blob))))
		if err != nil {
			t.Fatalf("layer %d: open eStargz: %v", i, err)
		}
		tocDigest, err := digest.Parse(desc.Annotations[estargzconv.TOCDigestAnnotation])
		if err != nil {
			t.Fatalf("layer %d: annotation: %v", i, err)
		}
		v, err := r.VerifyTOC(tocDigest)
		if err != nil {
			t.Fatalf("layer %d: verify TOC: %v", i, err)
		}
		// The diff ID is the decompressed stream's, in the config too.
		zr, err := gzip.NewReader(bytes.NewReader(blob))
		if err != nil {
			t.Fatal(err)
		}
		h := sha256.New()
		var names []string
		tr := tar.NewReader(io.TeeReader(zr, h))
		for {
			hdr, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("layer %d: tar: %v", i, err)
			}
			names = append(names, strings.TrimPrefix(hdr.Name, "./"))
		}
		if _, err := io.Copy(io.Discard, io.TeeReader(zr, h)); err != nil {
			t.Fatal(err)
		}
		if diff := "sha256:" + hex.EncodeToString(h.Sum(nil)); diff != cf.RootFS.DiffIDs[i].String() {
			t.Fatalf("layer %d: diff ID %s, config says %s", i, diff, cf.RootFS.DiffIDs[i])
		}
		// The prioritized file of this layer comes before the landmark.
		want := map[int]string{0: "bin/tool", 1: "data/weights"}[i]
		pi, li := slices.Index(names, want), slices.Index(names, estargz.PrefetchLandmark)
		if pi < 0 || li < 0 || pi > li {
			t.Fatalf("layer %d: %s at %d, landmark at %d: %q", i, want, pi, li, names)
		}
		// Files read back through the TOC, chunk by verified chunk.
		f, err := r.OpenFile(want)
		if err != nil {
			t.Fatalf("layer %d: open %s: %v", i, want, err)
		}
		got, err := io.ReadAll(io.NewSectionReader(f, 0, f.Size()))
		if err != nil {
			t.Fatal(err)
		}
		ent, ok := r.Lookup(want)
		if !ok {
			t.Fatalf("layer %d: %s not in the TOC", i, want)
		}
		chunks := 0
		for off := int64(0); off < ent.Size; {
			ce, ok := r.ChunkEntryForOffset(want, off)
			if !ok {
				t.Fatalf("%s: no chunk at %d", want, off)
			}
			vr, err := v.Verifier(ce)
			if err != nil {
				t.Fatal(err)
			}
			vr.Write(got[ce.ChunkOffset : ce.ChunkOffset+ce.ChunkSize])
			if !vr.Verified() {
				t.Fatalf("%s: chunk at %d does not verify", want, off)
			}
			off += ce.ChunkSize
			chunks++
		}
		if i == 1 && chunks < 10 {
			t.Fatalf("data/weights in %d chunks, want 10 of 64 KiB", chunks)
		}
	}
}

func TestConvertKeepsEStargzLayersAndIsStable(t *testing.T) {
	first, err := estargzconv.Convert(context.Background(), smallImage(t), estargzconv.Options{TempDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	again, err := estargzconv.Convert(context.Background(), first.Image, estargzconv.Options{TempDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	a, err := first.Image.Digest()
	if err != nil {
		t.Fatal(err)
	}
	b, err := again.Image.Digest()
	if err != nil {
		t.Fatal(err)
	}
	if a != b {
		t.Fatalf("converting an eStargz image again changed it: %s → %s", a, b)
	}
}

// A hostile source: a layer larger than the bound is refused before
// more than the bound is written, and nothing stays in TempDir.
func TestConvertRefusesALayerOverTheLimit(t *testing.T) {
	dir := t.TempDir()
	_, err := estargzconv.Convert(context.Background(), smallImage(t), estargzconv.Options{TempDir: dir, MaxLayerSize: 64 << 10})
	if !errors.Is(err, estargzconv.ErrLayerTooLarge) {
		t.Fatalf("got %v, want ErrLayerTooLarge", err)
	}
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range es {
		if strings.HasSuffix(e.Name(), ".tar") {
			t.Fatalf("left %s in the temp dir", e.Name())
		}
	}
}

func TestConvertStopsWithItsContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := estargzconv.Convert(ctx, smallImage(t), estargzconv.Options{TempDir: t.TempDir()}); !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
}
