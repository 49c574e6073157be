package integration

import (
	"archive/tar"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/testimages"
)

// tarDir packs a directory (an OCI layout) into a tarball.
func tarDir(t *testing.T, dir, out string) {
	t.Helper()
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if err := tw.WriteHeader(&tar.Header{Name: rel, Mode: 0o644, Size: fi.Size(), Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		src, err := os.Open(p)
		if err != nil {
			return err
		}
		defer src.Close()
		_, err = io.Copy(tw, src)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestImageImportDockerArchive(t *testing.T) {
	t.Parallel()
	d := berthdtest.Start(t, berthdtest.Options{})
	img := mustImage(t, testimages.HTTPD)
	tag, err := name.NewTag("example.com/offline/httpd:v1")
	if err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(t.TempDir(), "httpd.tar")
	if err := tarball.WriteToFile(archive, tag, img); err != nil {
		t.Fatal(err)
	}
	out, err := runCtl(t, d, "image", "import", archive)
	if err != nil {
		t.Fatalf("berthctl image import: %v\n%s", err, out)
	}
	id := configDigest(t, img)
	if !strings.Contains(out, id) {
		t.Fatalf("import output %q does not name %s", out, id)
	}
	st := imageStatus(t, d, "example.com/offline/httpd:v1")
	if st == nil || st.Id != id || !slices.Equal(st.RepoTags, []string{"example.com/offline/httpd:v1"}) {
		t.Fatalf("imported image status: %+v", st)
	}
}

func TestImageImportOCILayoutWithIndex(t *testing.T) {
	t.Parallel()
	d := berthdtest.Start(t, berthdtest.Options{})
	tmp := t.TempDir()
	lp, err := layout.Write(filepath.Join(tmp, "layout"), empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	single := mustImage(t, testimages.BusyboxUID)
	if err := lp.AppendImage(single, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": "example.com/offline/uid:v2"})); err != nil {
		t.Fatal(err)
	}
	idx, native, err := testimages.MultiArch()
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendIndex(idx, layout.WithAnnotations(map[string]string{"io.containerd.image.name": "example.com/offline/multi:v3"})); err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(tmp, "oci.tar")
	tarDir(t, filepath.Join(tmp, "layout"), archive)
	if out, err := runCtl(t, d, "image", "import", archive); err != nil {
		t.Fatalf("berthctl image import: %v\n%s", err, out)
	}
	if st := imageStatus(t, d, "example.com/offline/uid:v2"); st == nil || st.Id != configDigest(t, single) || st.Uid.GetValue() != testimages.TestUID {
		t.Fatalf("OCI layout image: %+v", st)
	}
	if st := imageStatus(t, d, "example.com/offline/multi:v3"); st == nil || st.Id != configDigest(t, native) {
		t.Fatalf("OCI layout index image: %+v (want native %s)", st, configDigest(t, native))
	}
}

func TestImageExportThenImportRoundTrips(t *testing.T) {
	t.Parallel()
	reg := testimages.StartRegistry(t)
	reg.PushStandard(t)
	d := berthdtest.Start(t, berthdtest.Options{})
	ref := reg.Ref(testimages.MultiLayerRef)
	id := pull(t, d, ref, nil)
	archive := filepath.Join(t.TempDir(), "export.tar")
	if out, err := runCtl(t, d, "image", "export", ref, archive); err != nil {
		t.Fatalf("berthctl image export: %v\n%s", err, out)
	}
	// It is a docker-archive go-containerregistry (and docker load) reads.
	exported, err := tarball.ImageFromPath(archive, nil)
	if err != nil {
		t.Fatalf("exported archive is not a docker-archive: %v", err)
	}
	if cn, _ := exported.ConfigName(); cn.String() != id {
		t.Fatalf("exported config %s, want %s", cn, id)
	}
	if _, err := d.Image.RemoveImage(berthdtest.Ctx(t), &criapi.RemoveImageRequest{Image: &criapi.ImageSpec{Image: id}}); err != nil {
		t.Fatal(err)
	}
	if out, err := runCtl(t, d, "image", "import", archive); err != nil {
		t.Fatalf("re-import: %v\n%s", err, out)
	}
	st := imageStatus(t, d, ref)
	if st == nil || st.Id != id || !slices.Equal(st.RepoTags, []string{ref}) {
		t.Fatalf("re-imported image: %+v", st)
	}
	if out, err := runCtl(t, d, "image", "export", reg.Ref("absent:1"), filepath.Join(t.TempDir(), "x.tar")); err == nil || !strings.Contains(out, "NotFound") {
		t.Fatalf("export of an absent image: %v %s", err, out)
	}
}

func TestImageImportRefusesGarbage(t *testing.T) {
	t.Parallel()
	d := berthdtest.Start(t, berthdtest.Options{})
	bad := filepath.Join(t.TempDir(), "bad.tar")
	if err := os.WriteFile(bad, []byte(strings.Repeat("not a tar ", 100)), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := runCtl(t, d, "image", "import", bad)
	if err == nil || !strings.Contains(out, "InvalidArgument") {
		t.Fatalf("garbage import: %v %s", err, out)
	}
	if imgs := listImages(t, d); len(imgs) != 0 {
		t.Fatalf("garbage import stored %v", imgs)
	}
	if left := dirEntries(t, d, "ingest"); len(left) != 0 {
		t.Fatalf("ingest left: %v", left)
	}
}

// TestImageImportLegacyDockerSave imports the classic `docker save` shape:
// <id>/layer.tar uncompressed, <config>.json, manifest.json.
func TestImageImportLegacyDockerSave(t *testing.T) {
	t.Parallel()
	d := berthdtest.Start(t, berthdtest.Options{})
	img := mustImage(t, testimages.BusyboxUser)
	cfg, err := img.RawConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	layerTar, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		t.Fatal(err)
	}
	id := configDigest(t, img)
	hexID := strings.TrimPrefix(id, "sha256:")
	manifest := fmt.Sprintf(`[{"Config":"%s.json","RepoTags":["legacy/app:old"],"Layers":["abc123/layer.tar"]}]`, hexID)
	archive := filepath.Join(t.TempDir(), "legacy.tar")
	f, err := os.Create(archive)
	if err != nil {
		t.Fatal(err)
	}
	tw := tar.NewWriter(f)
	for _, e := range []struct {
		name string
		data []byte
	}{{hexID + ".json", cfg}, {"abc123/layer.tar", layerTar}, {"manifest.json", []byte(manifest)}} {
		if err := tw.WriteHeader(&tar.Header{Name: e.name, Mode: 0o644, Size: int64(len(e.data)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(e.data); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if out, err := runCtl(t, d, "image", "import", archive); err != nil {
		t.Fatalf("import: %v\n%s", err, out)
	}
	st := imageStatus(t, d, "legacy/app:old")
	if st == nil || st.Id != id || !slices.Equal(st.RepoTags, []string{"docker.io/legacy/app:old"}) || st.Username != testimages.TestUser {
		t.Fatalf("legacy import: %+v", st)
	}
}
