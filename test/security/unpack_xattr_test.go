package security

import (
	"archive/tar"
	"slices"
	"testing"

	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/testimages"
)

// TestUnpackTrustedOverlayXattrDropped (issue 34 finding 7): a layer
// whose directory carries trusted.overlay.opaque (set by the image, not
// by an OCI whiteout) must not hide what the layers below hold there, and
// trusted.overlay.redirect must not pull another directory in. On
// b407862 the xattrs were applied: overlayfs hid /data/lower.txt.
func TestUnpackTrustedOverlayXattrDropped(t *testing.T) {
	d := berthdtest.Start(t, berthdtest.Options{})
	reg := testimages.StartRegistry(t)
	lower := unpackTar(t, []*tar.Header{
		{Name: "data/", Typeflag: tar.TypeDir},
		{Name: "data/lower.txt", Typeflag: tar.TypeReg, Mode: 0o644},
	}, map[string]string{"data/lower.txt": "from-lower"})
	upper := unpackTar(t, []*tar.Header{
		{Name: "data/", Typeflag: tar.TypeDir, PAXRecords: map[string]string{"SCHILY.xattr.trusted.overlay.opaque": "y"}},
		{Name: "data/upper.txt", Typeflag: tar.TypeReg, Mode: 0o644},
		{Name: "redir/", Typeflag: tar.TypeDir, PAXRecords: map[string]string{"SCHILY.xattr.trusted.overlay.redirect": "/data"}},
	}, map[string]string{"data/upper.txt": "from-upper"})
	img := unpackImage(t, []string{"sh", "-c", "cat /data/lower.txt; echo; cat /data/upper.txt; echo; ls /redir; echo end"},
		unpackLayerOf(t, lower), unpackLayerOf(t, upper))
	reg.Push(t, "opaque:1", img)
	if err := unpackPull(t, d, reg.Ref("opaque:1")); err != nil {
		t.Fatal(err)
	}
	out := unpackRunOutput(t, d, reg.Ref("opaque:1"))
	want := []string{"from-lower", "from-upper", "end"}
	if !slices.Equal(out, want) {
		t.Fatalf("container saw %q, want %q: a layer's trusted.overlay xattrs changed what overlayfs shows", out, want)
	}
}
