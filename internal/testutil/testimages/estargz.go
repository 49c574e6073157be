package testimages

import (
	"context"
	"io"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/berthcri/berth/internal/image/estargzconv"
)

// EStargz is img with every layer rewritten into eStargz (decision 3600),
// the prioritized files first, exactly as `berthctl image convert
// --estargz` makes it. The converted layers live in a temporary directory
// of t until the test ends.
func EStargz(t testing.TB, img v1.Image, prioritized ...string) v1.Image {
	t.Helper()
	return convertEStargz(t, img, estargzconv.Options{Prioritized: prioritized})
}

// EStargzLayer is files as one eStargz layer in chunks of at most
// chunkSize bytes (0: the converter's default), the prioritized files
// first: its blob and the TOC digest its manifest names, for tests of
// the lazy filesystem below the image store.
func EStargzLayer(t testing.TB, files []File, chunkSize int, prioritized ...string) (blob []byte, tocDigest string) {
	t.Helper()
	l, err := Layer(files)
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(mutate.MediaType(empty.Image, types.OCIManifestSchema1), l)
	if err != nil {
		t.Fatal(err)
	}
	img = convertEStargz(t, img, estargzconv.Options{Prioritized: prioritized, ChunkSize: chunkSize})
	blob, _, annotations := LayerBlob(t, img, 0)
	return blob, annotations[estargzconv.TOCDigestAnnotation]
}

// LayerBlob is img's layer i as a registry serves it: its compressed
// blob, its digest and its descriptor's annotations.
func LayerBlob(t testing.TB, img v1.Image, i int) (blob []byte, digest string, annotations map[string]string) {
	t.Helper()
	mf, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	rc, err := layers[i].Compressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if blob, err = io.ReadAll(rc); err != nil {
		t.Fatal(err)
	}
	return blob, mf.Layers[i].Digest.String(), mf.Layers[i].Annotations
}

func convertEStargz(t testing.TB, img v1.Image, opts estargzconv.Options) v1.Image {
	t.Helper()
	opts.TempDir = t.TempDir()
	res, err := estargzconv.Convert(context.Background(), img, opts)
	if err != nil {
		t.Fatalf("convert test image to eStargz: %v", err)
	}
	if len(res.MissedPrioritized) > 0 {
		t.Fatalf("convert test image to eStargz: prioritized files in no layer: %q", res.MissedPrioritized)
	}
	return res.Image
}
