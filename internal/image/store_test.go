package image

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

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
