package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/testimages"
)

// pull pulls ref (with auth, when given) and returns the image ref
// PullImage answers.
func pull(t *testing.T, d *berthdtest.Daemon, ref string, auth *criapi.AuthConfig) string {
	t.Helper()
	resp, err := d.Image.PullImage(berthdtest.Ctx(t), &criapi.PullImageRequest{Image: &criapi.ImageSpec{Image: ref}, Auth: auth})
	if err != nil {
		t.Fatalf("pull %s: %v", ref, err)
	}
	if !strings.HasPrefix(resp.ImageRef, "sha256:") || len(resp.ImageRef) != 71 {
		t.Fatalf("pull %s: image ref %q is not a sha256 ID", ref, resp.ImageRef)
	}
	return resp.ImageRef
}

// imageStatus is ref's ImageStatus image, nil when berthd does not have it.
func imageStatus(t *testing.T, d *berthdtest.Daemon, ref string) *criapi.Image {
	t.Helper()
	resp, err := d.Image.ImageStatus(berthdtest.Ctx(t), &criapi.ImageStatusRequest{Image: &criapi.ImageSpec{Image: ref}})
	if err != nil {
		t.Fatalf("image status %s: %v", ref, err)
	}
	return resp.Image
}

// listImages is ListImages' answer.
func listImages(t *testing.T, d *berthdtest.Daemon) []*criapi.Image {
	t.Helper()
	resp, err := d.Image.ListImages(berthdtest.Ctx(t), &criapi.ListImagesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return resp.Images
}

// dirEntries lists a store subdirectory (blobs/sha256, layers, ingest).
func dirEntries(t *testing.T, d *berthdtest.Daemon, sub string) []string {
	t.Helper()
	es, err := os.ReadDir(filepath.Join(d.Root, "images", sub))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	return names
}

// mustImage returns what build makes, failing the test on its error.
func mustImage(t *testing.T, build func() (v1.Image, error)) v1.Image {
	t.Helper()
	img, err := build()
	return testimages.Must(t, img, err)
}

// configDigest is img's config digest.
func configDigest(t *testing.T, img v1.Image) string {
	t.Helper()
	h, err := img.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	return h.String()
}

// bottomLayerDigest is the digest of img's first layer.
func bottomLayerDigest(t *testing.T, img v1.Image) string {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	ld, err := layers[0].Digest()
	if err != nil {
		t.Fatal(err)
	}
	return ld.String()
}
